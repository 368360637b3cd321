//! Bootstrap tests: ranks as threads of this process, and hostile connections.

use super::wire::{Frame, HEADER_BYTES, MAGIC};
use super::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(3);

fn root() -> (RootHandle, UniqueId) {
    let secret = random_secret().unwrap();
    let root = start_root(parse_listen_address(None).unwrap(), secret, TIMEOUT * 4).unwrap();
    let id = UniqueId::new(root.address(), secret);
    (root, id)
}

/// Join `nranks` ranks as threads; each rank's client and the infos it got.
fn join_all(id: UniqueId, nranks: u32) -> Vec<(Client, Vec<Vec<u8>>)> {
    let threads: Vec<_> = (0..nranks)
        .map(|rank| {
            std::thread::spawn(move || {
                Client::connect(
                    &id,
                    nranks,
                    rank,
                    format!("info-{rank}").as_bytes(),
                    TIMEOUT,
                )
                .unwrap()
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn ranks_join_and_all_gather_with_interleaved_tags() {
    for nranks in [1u32, 2, 4, 8] {
        let (root, id) = root();
        let clients = join_all(id, nranks);
        for (client, infos) in &clients {
            let want: Vec<Vec<u8>> = (0..nranks)
                .map(|r| format!("info-{r}").into_bytes())
                .collect();
            assert_eq!(infos, &want);
            let _ = client;
        }
        // Two tags outstanding at once, contributed in opposite orders.
        for (rank, (client, _)) in clients.iter().enumerate() {
            let tags = if rank % 2 == 0 { [1, 2] } else { [2, 1] };
            for tag in tags {
                client.contribute(tag, &[rank as u8, tag as u8]).unwrap();
            }
        }
        for (client, _) in &clients {
            for tag in [2u64, 1] {
                let got = client.gathered(tag, TIMEOUT).unwrap();
                let want: Vec<Vec<u8>> = (0..nranks).map(|r| vec![r as u8, tag as u8]).collect();
                assert_eq!(got, want, "tag {tag}");
            }
        }
        drop(clients);
        let deadline = Instant::now() + TIMEOUT;
        while !root.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(root.is_finished(), "the root ends once every rank left");
    }
}

#[test]
fn one_thread_contributes_for_several_ranks_before_gathering() {
    let (_root, id) = root();
    let clients = join_all(id, 4);
    for (rank, (client, _)) in clients.iter().enumerate() {
        client.contribute(7, &[rank as u8; 3]).unwrap();
    }
    for (client, _) in &clients {
        assert_eq!(client.gathered(7, TIMEOUT).unwrap().len(), 4);
    }
}

#[test]
fn a_wrong_secret_is_refused_and_the_right_ranks_still_join() {
    let (_root, id) = root();
    let mut secret = *id.secret();
    secret[0] ^= 1;
    let forged = UniqueId::new(id.address(), secret);
    let intruder = std::thread::spawn(move || {
        Client::connect(&forged, 2, 0, b"x", Duration::from_millis(500)).map(|_| ())
    });
    let clients = join_all(id, 2);
    assert_eq!(clients.len(), 2);
    let e = intruder.join().unwrap().unwrap_err();
    assert_ne!(e.code, symmResult_t::symmSuccess);
}

#[test]
fn mismatched_nranks_duplicate_and_out_of_range_ranks_get_clear_errors() {
    let (_root, id) = root();
    let first = std::thread::spawn(move || Client::connect(&id, 2, 0, b"a", TIMEOUT));
    std::thread::sleep(Duration::from_millis(200));
    let e = Client::connect(&id, 3, 1, b"b", TIMEOUT).err().unwrap();
    assert!(e.message.contains("nranks = 3"), "{}", e.message);
    let e = Client::connect(&id, 2, 0, b"b", TIMEOUT).err().unwrap();
    assert!(e.message.contains("already joined"), "{}", e.message);
    let e = Client::connect(&id, 2, 5, b"b", TIMEOUT).err().unwrap();
    assert!(e.message.contains("rank = 5"), "{}", e.message);
    let second = Client::connect(&id, 2, 1, b"b", TIMEOUT).unwrap();
    let first = first.join().unwrap().unwrap();
    assert_eq!(first.1, second.1);
}

#[test]
fn a_missing_rank_times_out_within_the_bound() {
    let (_root, id) = root();
    let bound = Duration::from_millis(400);
    let start = Instant::now();
    let e = Client::connect(&id, 2, 0, b"a", bound).err().unwrap();
    assert_eq!(e.code, symmResult_t::symmTimeout, "{}", e.message);
    assert!(start.elapsed() < bound + Duration::from_millis(700));
}

#[test]
fn an_unreachable_root_times_out() {
    // A port nobody listens on (bound, then closed).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let id = UniqueId::new(port, [1; 32]);
    let start = Instant::now();
    let e = Client::connect(&id, 1, 0, b"a", Duration::from_millis(300))
        .err()
        .unwrap();
    assert_eq!(e.code, symmResult_t::symmTimeout);
    assert!(start.elapsed() < Duration::from_secs(2));
}

#[test]
fn hostile_connections_do_not_disturb_the_root() {
    let (_root, id) = root();
    let address = id.address();
    let mut attackers = Vec::new();
    // Silence; garbage; a truncated header; a header announcing 4 GiB; a Leave first.
    attackers.push(TcpStream::connect(address).unwrap());
    let mut garbage = TcpStream::connect(address).unwrap();
    garbage.write_all(&[0xAB; 100]).unwrap();
    attackers.push(garbage);
    let mut truncated = TcpStream::connect(address).unwrap();
    truncated.write_all(&MAGIC.to_le_bytes()).unwrap();
    attackers.push(truncated);
    let mut huge = TcpStream::connect(address).unwrap();
    let mut header = [0u8; HEADER_BYTES];
    header[..4].copy_from_slice(&MAGIC.to_le_bytes());
    header[4] = 1;
    header[8..].copy_from_slice(&u32::MAX.to_le_bytes());
    huge.write_all(&header).unwrap();
    attackers.push(huge);
    let mut leave_first = TcpStream::connect(address).unwrap();
    leave_first.write_all(&Frame::Leave.encode()).unwrap();
    attackers.push(leave_first);
    let clients = join_all(id, 3);
    for (rank, (client, _)) in clients.iter().enumerate() {
        client.contribute(1, &[rank as u8]).unwrap();
    }
    for (client, _) in &clients {
        assert_eq!(client.gathered(1, TIMEOUT).unwrap().len(), 3);
    }
    // The oversized one was closed (EOF), not read into memory.
    let mut buf = [0u8; 16];
    let huge = &mut attackers[3];
    huge.set_read_timeout(Some(TIMEOUT)).unwrap();
    assert_eq!(huge.read(&mut buf).unwrap_or(0), 0);
}

#[test]
fn a_lost_rank_fails_the_others_pending_all_gather_promptly() {
    let (_root, id) = root();
    let mut clients = join_all(id, 3);
    let (dying, _) = clients.pop().unwrap();
    let start = Instant::now();
    // The rank's process vanishes: its connection closes without a `Leave`.
    dying.vanish();
    let (survivor, _) = &clients[0];
    survivor.contribute(9, b"x").unwrap();
    let e = survivor.gathered(9, Duration::from_secs(20)).unwrap_err();
    assert_eq!(e.code, symmResult_t::symmRemoteError, "{}", e.message);
    assert!(e.message.contains("rank 2"), "{}", e.message);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "promptly, not after the bound"
    );
}

#[test]
fn ids_round_trip_and_bad_ids_are_refused() {
    for text in ["127.0.0.1:4000", "[::1]:5000", "10.1.2.3:65535"] {
        let id = parse_comm_id(text, None).unwrap();
        assert_eq!(UniqueId::decode(&id.encode()).unwrap(), id);
        assert_eq!(id.address(), text.parse().unwrap());
    }
    let a = parse_comm_id("127.0.0.1:4000", Some("s3cret")).unwrap();
    let b = parse_comm_id("127.0.0.1:4000", Some("other")).unwrap();
    let c = parse_comm_id("127.0.0.1:4000", None).unwrap();
    assert_ne!(a.secret(), b.secret());
    assert_ne!(a.secret(), c.secret());
    assert_eq!(
        a,
        parse_comm_id(" 127.0.0.1:4000 ", Some("s3cret")).unwrap()
    );
    for bad in ["", "localhost", "1.2.3.4", "1.2.3.4:0", "no such host!:5"] {
        assert!(parse_comm_id(bad, None).is_err(), "{bad:?}");
    }
    let good = a.encode();
    let mut bad_magic = good;
    bad_magic[0] ^= 1;
    assert!(UniqueId::decode(&bad_magic).is_err());
    let mut bad_family = good;
    bad_family[9] = 5;
    assert!(UniqueId::decode(&bad_family).is_err());
    let mut bad_padding = good;
    bad_padding[100] = 1;
    assert!(UniqueId::decode(&bad_padding).is_err());
    let e = UniqueId::decode(&[0; 128]).unwrap_err();
    assert_eq!(e.code, symmResult_t::symmInvalidArgument);
    assert!(e.message.contains("commId"));
}

#[test]
fn listen_addresses() {
    assert_eq!(
        parse_listen_address(None).unwrap(),
        "127.0.0.1:0".parse().unwrap()
    );
    assert_eq!(
        parse_listen_address(Some("192.168.1.7")).unwrap(),
        "192.168.1.7:0".parse().unwrap()
    );
    assert!(parse_listen_address(Some("0.0.0.0")).is_err());
    assert!(parse_listen_address(Some("[::]:29500")).is_err());
    assert_eq!(
        parse_listen_address(Some("::1")).unwrap(),
        "[::1]:0".parse().unwrap()
    );
    assert_eq!(
        parse_listen_address(Some("10.0.0.1:29500")).unwrap(),
        "10.0.0.1:29500".parse().unwrap()
    );
    assert!(parse_listen_address(Some("eth0")).is_err());
}

#[test]
fn secrets_compare_exactly() {
    let a = [7u8; 32];
    let mut b = a;
    assert!(secrets_equal(&a, &b));
    b[31] ^= 0x80;
    assert!(!secrets_equal(&a, &b));
}

#[test]
fn a_port_that_answers_garbage_is_an_error_not_a_hang() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        for _ in 0..2 {
            let (mut stream, _) = listener.accept().unwrap();
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
            // A header announcing more than any frame may hold.
            let mut huge = [0u8; HEADER_BYTES];
            huge[..4].copy_from_slice(&MAGIC.to_le_bytes());
            huge[4] = 2;
            huge[8..].copy_from_slice(&u32::MAX.to_le_bytes());
            let _ = stream.write_all(&huge);
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let id = UniqueId::new(address, [4; 32]);
    for _ in 0..2 {
        let start = Instant::now();
        let e = Client::connect(&id, 2, 0, b"a", TIMEOUT).err().unwrap();
        assert_eq!(e.code, symmResult_t::symmSystemError, "{}", e.message);
        assert!(e.message.contains("malformed"), "{}", e.message);
        assert!(
            start.elapsed() < TIMEOUT,
            "an error at once, not at the deadline"
        );
    }
    server.join().unwrap();
}
