//! Bootstrap tests: ranks as threads of this process, hostile connections, and fake roots.

use super::auth::{Role, Transcript};
use super::wire::{Frame, FrameReader, HEADER_BYTES, MAGIC};
use super::*;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread::JoinHandle;
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
    // Its id's secret differs from the root's: the root's proof does not check for it, so it
    // refuses the root before sending its own proof.
    let e = intruder.join().unwrap().unwrap_err();
    assert_eq!(e.code, symmResult_t::symmSystemError, "{}", e.message);
    assert!(e.message.contains("secret is refused"), "{}", e.message);
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

/// `true` when the 32 bytes of `secret` occur anywhere in `bytes`.
fn contains_secret(bytes: &[u8], secret: &[u8; 32]) -> bool {
    bytes.windows(secret.len()).any(|w| w == secret)
}

/// Everything readable from `stream` until it closes or `deadline` (bytes so far).
fn read_until_closed(stream: &mut TcpStream, deadline: Instant, into: &mut Vec<u8>) {
    let mut chunk = [0u8; 4096];
    while Instant::now() < deadline {
        stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => into.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}
/// A fake root on a fresh loopback port that does not know any secret: it accepts one
/// connection, reads the client's first frame, writes `answer(that frame)`, and records every
/// byte the client writes until it closes the connection. The address, and the recording.
fn fake_root(
    answer: impl FnOnce(&[u8]) -> Vec<u8> + Send + 'static,
) -> (std::net::SocketAddr, JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let recorder = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let deadline = Instant::now() + TIMEOUT;
        let mut written = Vec::new();
        let mut chunk = [0u8; 4096];
        // The client's first frame, by its header's length.
        let first_len = loop {
            if written.len() >= HEADER_BYTES {
                let len = u32::from_le_bytes(written[8..12].try_into().unwrap()) as usize;
                let len = HEADER_BYTES + len.min(1 << 16);
                if written.len() >= len {
                    break len;
                }
            }
            assert!(Instant::now() < deadline, "the client sent no whole frame");
            stream
                .set_read_timeout(Some(Duration::from_millis(50)))
                .unwrap();
            match stream.read(&mut chunk) {
                Ok(0) => break written.len(),
                Ok(n) => written.extend_from_slice(&chunk[..n]),
                Err(_) => {}
            }
        };
        let _ = stream.write_all(&answer(&written[..first_len]));
        read_until_closed(&mut stream, deadline, &mut written);
        written
    });
    (address, recorder)
}

/// A process squatting on the root's address, knowing nothing of the protocol, answers the
/// client's first message with random bytes: the client fails, and the secret was never among
/// the bytes it wrote.
#[test]
fn a_squatter_on_the_root_address_never_receives_the_secret() {
    let secret = random_secret().unwrap();
    let (address, recorder) = fake_root(|_| random_secret().unwrap().repeat(4));
    let id = UniqueId::new(address, secret);
    let result = Client::connect(&id, 2, 0, b"join information", TIMEOUT).map(|_| ());
    let written = recorder.join().unwrap();
    assert!(!written.is_empty(), "the client wrote its first message");
    assert!(
        !contains_secret(&written, &secret),
        "the client sent the secret to a process that does not know it: {written:02x?}"
    );
    let e = result.unwrap_err();
    assert_eq!(e.code, symmResult_t::symmSystemError, "{}", e.message);
    assert!(e.message.contains(&address.to_string()), "{}", e.message);
}

/// A fake root that plays the protocol without knowing the secret is refused by the client,
/// which sends it nothing but its challenge: not its proof, not its join information.
#[test]
fn a_fake_root_without_the_secret_is_refused_by_the_client() {
    type Answer = fn(&Frame) -> Frame;
    let answers: [(&str, Answer); 4] = [
        ("random proof", |_| Frame::RootProof {
            nonce: random_secret().unwrap(),
            proof: random_secret().unwrap(),
        }),
        // Reflects what the client sent: its nonce as the root's nonce and as the proof.
        ("reflected challenge", |challenge| {
            let Frame::Challenge { nonce, .. } = challenge else {
                panic!("first frame {challenge:?}")
            };
            Frame::RootProof {
                nonce: *nonce,
                proof: *nonce,
            }
        }),
        // A proof made with another secret (the right form, the wrong key).
        ("proof under another secret", |challenge| {
            let Frame::Challenge {
                version,
                nonce,
                nranks,
                rank,
            } = *challenge
            else {
                panic!("first frame {challenge:?}")
            };
            let t = Transcript {
                version,
                nranks,
                rank,
                rank_nonce: nonce,
                root_nonce: [5; 32],
            };
            Frame::RootProof {
                nonce: t.root_nonce,
                proof: auth::proof(&[0x55; 32], Role::Root, &t),
            }
        }),
        // No proof at all: a Welcome at once.
        ("welcome without a proof", |_| Frame::Welcome {
            session: [0; 32],
            infos: vec![b"a".to_vec(), b"b".to_vec()],
        }),
    ];
    for (what, answer) in answers {
        let secret = random_secret().unwrap();
        let (address, recorder) = fake_root(move |first| {
            let (kind, len) =
                Frame::check_header(first[..HEADER_BYTES].try_into().unwrap()).expect("a frame");
            let challenge = Frame::decode(kind, &first[HEADER_BYTES..HEADER_BYTES + len]).unwrap();
            answer(&challenge).encode()
        });
        let id = UniqueId::new(address, secret);
        let start = Instant::now();
        let result = Client::connect(&id, 2, 1, b"join information", TIMEOUT).map(|_| ());
        let written = recorder.join().unwrap();
        let e = result.expect_err(what);
        assert_eq!(
            e.code,
            symmResult_t::symmSystemError,
            "{what}: {}",
            e.message
        );
        assert!(
            e.message.contains(&format!("bootstrap root {address}"))
                && e.message
                    .contains("did not prove it knows the communicator's secret"),
            "{what}: {}",
            e.message
        );
        assert!(
            start.elapsed() < TIMEOUT,
            "{what}: at once, not at the deadline"
        );
        assert!(
            !contains_secret(&written, &secret),
            "{what}: the secret was sent"
        );
        // Exactly one frame went out: the challenge.
        let frames = parse_frames(&written);
        assert!(
            matches!(
                frames.as_slice(),
                [Frame::Challenge {
                    nranks: 2,
                    rank: 1,
                    ..
                }]
            ),
            "{what}: the client sent {frames:?}"
        );
    }
}

/// The whole frames in `bytes` (panics on a malformed or partial one).
fn parse_frames(mut bytes: &[u8]) -> Vec<Frame> {
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        let header: [u8; HEADER_BYTES] = bytes[..HEADER_BYTES].try_into().unwrap();
        let (kind, len) = Frame::check_header(&header).unwrap();
        frames.push(Frame::decode(kind, &bytes[HEADER_BYTES..HEADER_BYTES + len]).unwrap());
        bytes = &bytes[HEADER_BYTES + len..];
    }
    frames
}

/// A silent process on the root's address: the client gives up at its deadline.
#[test]
fn a_silent_squatter_times_out_within_the_bound() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let id = UniqueId::new(listener.local_addr().unwrap(), [1; 32]);
    let bound = Duration::from_millis(400);
    let start = Instant::now();
    let e = Client::connect(&id, 1, 0, b"a", bound).err().unwrap();
    assert_eq!(e.code, symmResult_t::symmTimeout, "{}", e.message);
    assert!(e.message.contains("handshake"), "{}", e.message);
    assert!(start.elapsed() < bound + Duration::from_millis(700));
    drop(listener);
}

/// Play the rank's side of the handshake by hand up to the root's proof: the connection, the
/// reader, the transcript and the root's proof.
fn raw_challenge(
    id: &UniqueId,
    nranks: u32,
    rank: u32,
) -> (TcpStream, FrameReader, Transcript, [u8; 32]) {
    let mut stream = TcpStream::connect(id.address()).unwrap();
    let rank_nonce = random_secret().unwrap();
    let challenge = Frame::Challenge {
        version: wire::PROTOCOL_VERSION,
        nonce: rank_nonce,
        nranks,
        rank,
    };
    stream.write_all(&challenge.encode()).unwrap();
    let mut reader = FrameReader::new(stream.try_clone().unwrap());
    let Some(Frame::RootProof { nonce, proof }) = reader.next(Instant::now() + TIMEOUT).unwrap()
    else {
        panic!("the root answers a challenge with its proof")
    };
    let t = Transcript {
        version: wire::PROTOCOL_VERSION,
        nranks,
        rank,
        rank_nonce,
        root_nonce: nonce,
    };
    assert!(auth::verify_proof(id.secret(), Role::Root, &t, &proof));
    (stream, reader, t, proof)
}

/// `true` when the root closed `stream` (within the bound) without a word: nothing of a
/// `Welcome` or an `Error` arrived.
fn closed_without_a_word(reader: &mut FrameReader) -> bool {
    match reader.next(Instant::now() + TIMEOUT) {
        Err(e) => e.message.contains("closed"),
        Ok(_) => false,
    }
}

/// A rank whose proof is made with the wrong secret (it ignores that the root's proof does not
/// check for it) is refused by the root, which closes the connection; its rank stays free for
/// the right one.
#[test]
fn a_rank_with_a_wrong_proof_is_refused_by_the_root() {
    let (_root, id) = root();
    let (mut stream, mut reader, t, _) = raw_challenge(&id, 2, 0);
    let mut wrong = *id.secret();
    wrong[7] ^= 0x10;
    let hello = Frame::Hello {
        proof: auth::proof(&wrong, Role::Rank, &t),
        info: b"intruder".to_vec(),
    };
    stream.write_all(&hello.encode()).unwrap();
    assert!(
        closed_without_a_word(&mut reader),
        "the root refuses a wrong proof"
    );
    let clients = join_all(id, 2);
    assert_eq!(
        clients[1].1[0],
        b"info-0".to_vec(),
        "rank 0 is the right one"
    );
}

/// A reflection: the root's own proof sent back as the rank's. The role is bound into the
/// proofs, so it does not check; the root closes the connection and the rank stays free.
#[test]
fn the_roots_proof_reflected_as_a_ranks_is_refused() {
    let (_root, id) = root();
    let (mut stream, mut reader, _, root_proof) = raw_challenge(&id, 2, 0);
    let hello = Frame::Hello {
        proof: root_proof,
        info: b"reflector".to_vec(),
    };
    stream.write_all(&hello.encode()).unwrap();
    assert!(
        closed_without_a_word(&mut reader),
        "the root refuses its own proof"
    );
    let clients = join_all(id, 2);
    assert_eq!(
        clients[1].1[0],
        b"info-0".to_vec(),
        "rank 0 is the right one"
    );
}

/// A connection that sends a `Hello` (or anything but a `Challenge`) first, or a challenge of
/// another protocol version, gets nothing from the root: not even its proof.
#[test]
fn the_root_answers_only_a_challenge_of_its_version() {
    let (_root, id) = root();
    let firsts = [
        Frame::Hello {
            proof: [0; 32],
            info: vec![],
        },
        Frame::Challenge {
            version: wire::PROTOCOL_VERSION + 1,
            nonce: [1; 32],
            nranks: 1,
            rank: 0,
        },
        Frame::Challenge {
            version: 1,
            nonce: [1; 32],
            nranks: 1,
            rank: 0,
        },
    ];
    for first in firsts {
        let mut stream = TcpStream::connect(id.address()).unwrap();
        stream.write_all(&first.encode()).unwrap();
        let mut reader = FrameReader::new(stream);
        assert!(closed_without_a_word(&mut reader), "{first:?}");
    }
}

/// Ranks joining through a relay that records both directions: the join and an all-gather
/// work, and the secret never crossed the wire either way.
#[test]
fn the_secret_never_crosses_the_wire_of_a_successful_join() {
    let (_root, id) = root();
    let relay = TcpListener::bind("127.0.0.1:0").unwrap();
    let relay_id = UniqueId::new(relay.local_addr().unwrap(), *id.secret());
    let nranks = 2u32;
    let root_address = id.address();
    let recordings: std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>> = Default::default();
    let recorded = recordings.clone();
    let relaying = std::thread::spawn(move || {
        let mut pumps = Vec::new();
        for _ in 0..nranks {
            let (rank_side, _) = relay.accept().unwrap();
            let root_side = TcpStream::connect(root_address).unwrap();
            for (mut from, mut to) in [
                (
                    rank_side.try_clone().unwrap(),
                    root_side.try_clone().unwrap(),
                ),
                (root_side, rank_side),
            ] {
                let recorded = recorded.clone();
                pumps.push(std::thread::spawn(move || {
                    let mut seen = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        match from.read(&mut chunk) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                seen.extend_from_slice(&chunk[..n]);
                                if to.write_all(&chunk[..n]).is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    let _ = to.shutdown(std::net::Shutdown::Write);
                    recorded.lock().unwrap().push(seen);
                }));
            }
        }
        for pump in pumps {
            pump.join().unwrap();
        }
    });
    let clients = join_all(relay_id, nranks);
    for (rank, (client, _)) in clients.iter().enumerate() {
        client.contribute(3, &[rank as u8]).unwrap();
    }
    for (client, _) in &clients {
        assert_eq!(client.gathered(3, TIMEOUT).unwrap().len(), nranks as usize);
    }
    drop(clients);
    relaying.join().unwrap();
    let recordings = recordings.lock().unwrap();
    assert_eq!(recordings.len(), 2 * nranks as usize);
    for (i, bytes) in recordings.iter().enumerate() {
        assert!(!bytes.is_empty(), "direction {i} carried the join");
        assert!(
            !contains_secret(bytes, id.secret()),
            "direction {i} carried the secret"
        );
    }
}
