//! The bootstrap root: serves one communicator. Ranks connect and authenticate
//! ([`super::auth`]: a `Challenge`, the root's proof, the rank's proof in its `Hello`), then
//! the root checks `nranks` and the rank; once all joined, each gets the `Welcome` with the
//! session and everyone's join information; then the root serves all-gathers (`Contribute` →
//! `Gathered`) and tells the survivors when a rank's connection is lost (`PeerLost`). It ends
//! when every rank left or was lost, or when the ranks did not all join in time (the ones that
//! did get an `Error`).
//!
//! One thread accepts; one thread per connection reads it. A connection that misbehaves
//! (silence, garbage, a wrong proof, an oversized frame) is closed; the others are not
//! disturbed. Before a connection's proof checked, the root sends it nothing but its own proof.

use super::auth::{self, Role, Transcript};
use super::wire::{self, Frame, FrameReader};
use crate::error::Result;
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a connection may take from its accept to its `Hello` (the whole handshake).
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound of every write to a rank.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most connections that have not yet joined (or been refused) at once; more are closed at
/// once, so that a flood of silent connections costs a bounded number of threads.
const MAX_UNJOINED: usize = 2 * wire::MAX_RANKS as usize + 16;

/// A running root.
pub struct RootHandle {
    address: SocketAddr,
    state: Arc<Shared>,
}

impl RootHandle {
    /// The address ranks connect to.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `true` once the root has ended.
    pub fn is_finished(&self) -> bool {
        self.state.finished.load(Ordering::Acquire)
    }
}

/// A joined rank's connection, for writing (dropped, which closes it, once the rank left or
/// was lost).
struct Member {
    writer: Mutex<TcpStream>,
    info: Vec<u8>,
}

#[derive(Default)]
struct State {
    nranks: Option<u32>,
    members: Vec<Option<Member>>,
    welcomed: bool,
    /// All-gathers in progress: tag → contributions by rank.
    gathers: HashMap<u64, Vec<Option<Vec<u8>>>>,
}

struct Shared {
    secret: [u8; 32],
    /// The communicator's session, sent to every rank in the `Welcome`.
    session: [u8; 32],
    /// Connections between accept and the end of their `Hello` handling.
    unjoined: std::sync::atomic::AtomicUsize,
    join_deadline: Instant,
    finished: AtomicBool,
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Start a root listening on `listen` (port 0: any free port) for the communicator whose
/// secret is `secret`; the ranks must all join within `join_timeout`.
pub fn start(listen: SocketAddr, secret: [u8; 32], join_timeout: Duration) -> Result<RootHandle> {
    let listener =
        TcpListener::bind(listen).map_err(|e| wire::io_error(&format!("binding {listen}"), e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| wire::io_error("setting the listener non-blocking", e))?;
    let address = listener
        .local_addr()
        .map_err(|e| wire::io_error("reading the listener address", e))?;
    let session = super::random_secret()?;
    let shared = Arc::new(Shared {
        secret,
        session,
        unjoined: std::sync::atomic::AtomicUsize::new(0),
        join_deadline: Instant::now() + join_timeout,
        finished: AtomicBool::new(false),
        state: Mutex::new(State::default()),
    });
    let accepting = shared.clone();
    std::thread::Builder::new()
        .name("symm-bootstrap-root".into())
        .spawn(move || accept_loop(listener, accepting))
        .map_err(|e| wire::io_error("starting the bootstrap root", e))?;
    Ok(RootHandle {
        address,
        state: shared,
    })
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while !shared.finished.load(Ordering::Acquire) {
        let welcomed = shared.lock().welcomed;
        if !welcomed && Instant::now() >= shared.join_deadline {
            fail_join(&shared);
            return;
        }
        match listener.accept() {
            Ok((stream, _)) => {
                if shared.unjoined.fetch_add(1, Ordering::AcqRel) >= MAX_UNJOINED {
                    shared.unjoined.fetch_sub(1, Ordering::AcqRel);
                    drop(stream);
                    continue;
                }
                let serving = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name("symm-bootstrap-conn".into())
                    .spawn(move || serve(stream, serving));
                if spawned.is_err() {
                    shared.unjoined.fetch_sub(1, Ordering::AcqRel);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
        // Once everyone joined, nobody else may: keep accepting only to refuse.
    }
}

/// The ranks did not all join in time: tell those that did, and end.
fn fail_join(shared: &Shared) {
    let mut state = shared.lock();
    let missing: Vec<usize> = state
        .members
        .iter()
        .enumerate()
        .filter(|(_, m)| m.is_none())
        .map(|(r, _)| r)
        .collect();
    let message = format!("ranks {missing:?} did not join in time");
    for member in state.members.iter_mut().flatten() {
        let mut writer = member.writer.lock().unwrap_or_else(|e| e.into_inner());
        let _ = wire::send(
            &mut writer,
            &Frame::Error {
                message: message.clone(),
            },
            WRITE_TIMEOUT,
        );
        let _ = writer.shutdown(std::net::Shutdown::Both);
    }
    state.members.clear();
    shared.finished.store(true, Ordering::Release);
}

fn refuse(stream: &mut TcpStream, message: String) {
    let _ = wire::send(stream, &Frame::Error { message }, WRITE_TIMEOUT);
}

/// Serve one connection: its `Hello`, then its frames until it leaves or is lost.
fn serve(stream: TcpStream, shared: Arc<Shared>) {
    let joined = join(stream, &shared);
    shared.unjoined.fetch_sub(1, Ordering::AcqRel);
    if let Some((reader, rank)) = joined {
        serve_member(reader, rank, &shared);
    }
}

/// Authenticate a connection and read its `Hello`: its `Challenge` must come first, then its
/// `Hello` with a proof that checks, both within [`HELLO_TIMEOUT`] of the accept. The joined
/// rank and its reader, or `None` (connection closed).
fn join(stream: TcpStream, shared: &Shared) -> Option<(FrameReader, usize)> {
    let deadline = Instant::now() + HELLO_TIMEOUT;
    let _ = stream.set_nodelay(true);
    let mut writer = stream.try_clone().ok()?;
    let mut reader = FrameReader::new(stream);
    let challenge = reader.next_of(deadline, Some(&[wire::CHALLENGE]));
    let Ok(Some(Frame::Challenge {
        version,
        nonce: rank_nonce,
        nranks,
        rank,
    })) = challenge
    else {
        return None; // silence, garbage or another frame first: close
    };
    if version != wire::PROTOCOL_VERSION {
        return None; // another protocol: nothing to say that it could check
    }
    let transcript = Transcript {
        version,
        nranks,
        rank,
        rank_nonce,
        root_nonce: super::random_secret().ok()?,
    };
    let answer = Frame::RootProof {
        nonce: transcript.root_nonce,
        proof: auth::proof(&shared.secret, Role::Root, &transcript),
    };
    wire::send(&mut writer, &answer, WRITE_TIMEOUT).ok()?;
    let Ok(Some(Frame::Hello { proof, info })) = reader.next_of(deadline, Some(&[wire::HELLO]))
    else {
        return None;
    };
    if !auth::verify_proof(&shared.secret, Role::Rank, &transcript, &proof) {
        return None; // not one of ours: close without a word
    }
    let rank = {
        let mut state = shared.lock();
        if state.welcomed {
            refuse(
                &mut writer,
                format!("rank {rank}: every rank of this communicator already joined"),
            );
            return None;
        }
        if nranks == 0 || nranks > wire::MAX_RANKS {
            refuse(&mut writer, format!("nranks = {nranks} is out of range"));
            return None;
        }
        if let Some(expected) = state.nranks
            && expected != nranks
        {
            refuse(
                &mut writer,
                format!(
                    "nranks = {nranks}, but the ranks that joined first use nranks = {expected}"
                ),
            );
            return None;
        }
        if rank >= nranks {
            refuse(
                &mut writer,
                format!("rank = {rank}: must be in [0, {nranks})"),
            );
            return None;
        }
        if state.nranks.is_none() {
            state.nranks = Some(nranks);
            state.members = (0..nranks).map(|_| None).collect();
        }
        if state.members[rank as usize].is_some() {
            refuse(
                &mut writer,
                format!("rank {rank} already joined this communicator"),
            );
            return None;
        }
        let Ok(clone) = writer.try_clone() else {
            return None;
        };
        state.members[rank as usize] = Some(Member {
            writer: Mutex::new(clone),
            info,
        });
        if state.members.iter().all(Option::is_some) {
            state.welcomed = true;
            let infos: Vec<Vec<u8>> = state
                .members
                .iter()
                .flatten()
                .map(|m| m.info.clone())
                .collect();
            let welcome = Frame::Welcome {
                session: shared.session,
                infos,
            };
            broadcast(&state, &welcome, None);
        }
        rank as usize
    };
    drop(writer);
    Some((reader, rank))
}

/// Serve a joined rank's frames (only `Contribute`, `Fail` and `Leave`) until it leaves or is
/// lost.
fn serve_member(mut reader: FrameReader, rank: usize, shared: &Shared) {
    let allowed = [wire::CONTRIBUTE, wire::FAIL, wire::LEAVE];
    loop {
        if shared.finished.load(Ordering::Acquire) {
            return;
        }
        let deadline = Instant::now() + Duration::from_millis(200);
        let frame = match reader.next_of(deadline, Some(&allowed)) {
            Ok(None) => continue,
            Ok(Some(frame)) => frame,
            Err(_) => {
                lost(shared, rank);
                return;
            }
        };
        match frame {
            Frame::Contribute { tag, payload } => {
                if !contribute(shared, rank, tag, payload) {
                    lost(shared, rank);
                    return;
                }
            }
            Frame::Fail { message } => {
                let state = shared.lock();
                if !state.welcomed {
                    drop(state);
                    lost(shared, rank);
                    return;
                }
                let error = Frame::Error {
                    message: format!("rank {rank} failed: {message}"),
                };
                broadcast(&state, &error, Some(rank));
            }
            Frame::Leave => {
                leave(shared, rank);
                return;
            }
            _ => {
                lost(shared, rank);
                return;
            }
        }
    }
}

/// Send `frame` to every member still there (but `except`).
fn broadcast(state: &State, frame: &Frame, except: Option<usize>) {
    for (r, member) in state.members.iter().enumerate() {
        if let Some(member) = member
            && Some(r) != except
        {
            let mut writer = member.writer.lock().unwrap_or_else(|e| e.into_inner());
            let _ = wire::send(&mut writer, frame, WRITE_TIMEOUT);
        }
    }
}

/// Record `rank`'s contribution; `false` when it is a protocol violation.
fn contribute(shared: &Shared, rank: usize, tag: u64, payload: Vec<u8>) -> bool {
    let mut state = shared.lock();
    if !state.welcomed {
        return false;
    }
    let nranks = state.members.len();
    let entry = state
        .gathers
        .entry(tag)
        .or_insert_with(|| vec![None; nranks]);
    if entry[rank].is_some() {
        if let Some(member) = &state.members[rank] {
            let mut writer = member.writer.lock().unwrap_or_else(|e| e.into_inner());
            let _ = wire::send(
                &mut writer,
                &Frame::Error {
                    message: format!("rank {rank} contributed twice to all-gather {tag}"),
                },
                WRITE_TIMEOUT,
            );
        }
        return false;
    }
    entry[rank] = Some(payload);
    if entry.iter().all(Option::is_some) {
        let payloads: Vec<Vec<u8>> = state
            .gathers
            .remove(&tag)
            .unwrap_or_default()
            .into_iter()
            .flatten()
            .collect();
        broadcast(&state, &Frame::Gathered { tag, payloads }, None);
    }
    true
}

/// `rank` left (its communicator was destroyed): no later all-gather can complete, so the
/// others are told (they only read it when they next need the root, or poll it).
fn leave(shared: &Shared, rank: usize) {
    gone(shared, rank, Frame::PeerLeft { rank: rank as u32 });
}

/// `rank`'s connection failed: tell the others (before everyone joined, free its place).
fn lost(shared: &Shared, rank: usize) {
    gone(shared, rank, Frame::PeerLost { rank: rank as u32 });
}

/// `rank` is gone: tell the others with `news` (before everyone joined, free its place).
fn gone(shared: &Shared, rank: usize, news: Frame) {
    let mut state = shared.lock();
    if !state.welcomed {
        state.members[rank] = None;
        return;
    }
    // Its connection is closed now, not when the root's last handle goes (the process may
    // never make another root).
    state.members[rank] = None;
    broadcast(&state, &news, Some(rank));
    if state.members.iter().all(Option::is_none) {
        shared.finished.store(true, Ordering::Release);
    }
}
