//! A rank's connection to the bootstrap root. The rank authenticates the root before it sends
//! anything but its challenge, then proves itself ([`super::auth`]).

use super::UniqueId;
use super::auth::{self, Role, Transcript};
use super::wire::{self, Frame, FrameReader};
use crate::abi::symmResult_t;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Bound of every write to the root.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the reader side has seen.
struct Inbox {
    reader: FrameReader,
    /// Completed all-gathers not yet asked for, by tag.
    gathered: HashMap<u64, Vec<Vec<u8>>>,
    /// Set once the root reported a lost rank or an error, or the connection failed.
    failure: Option<Error>,
    /// A rank that left (destroyed its communicator), as [`Client::poll`] read it: no
    /// all-gather not yet complete can complete.
    left: Option<u32>,
    /// The connection to the root closed, as [`Client::poll`] saw it: the next all-gather not
    /// yet complete fails with it (the root's process may just have ended after its rank's
    /// teardown, which is no failure of the ranks still finishing).
    root_lost: Option<Error>,
}

/// A joined rank's connection (usable from several threads).
pub struct Client {
    rank: u32,
    nranks: u32,
    session: [u8; 32],
    writer: Mutex<TcpStream>,
    inbox: Mutex<Inbox>,
}

impl Client {
    /// The address of this end of the connection to the root: an interface the root's
    /// machine reaches.
    pub fn local_ip(&self) -> Option<std::net::IpAddr> {
        let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        writer.local_addr().ok().map(|a| a.ip())
    }

    /// Join the communicator `id` as `rank` of `nranks` with join information `info`; returns
    /// the client and every rank's information, by rank, once all joined. Retries refused
    /// connections until the deadline (the root may start later); `symmTimeout` when the
    /// ranks did not all join within `timeout`.
    ///
    /// The handshake ([`super::auth`]): this rank sends a fresh nonce, checks the root's proof
    /// of knowing the id's secret, and only then sends its own proof and `info`. A root that
    /// does not prove it (a process squatting on its address, or a root whose secret differs
    /// from the id's) is refused with `symmSystemError` naming the address.
    pub fn connect(
        id: &UniqueId,
        nranks: u32,
        rank: u32,
        info: &[u8],
        timeout: Duration,
    ) -> Result<(Client, Vec<Vec<u8>>)> {
        let deadline = Instant::now() + timeout;
        let timed_out = |what: &str| {
            Error::new(
                symmResult_t::symmTimeout,
                format!(
                    "rank {rank}: {what} within {} ms (bootstrap root {})",
                    timeout.as_millis(),
                    id.address()
                ),
            )
        };
        let stream = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out("could not reach the bootstrap root"));
            }
            match TcpStream::connect_timeout(&id.address(), left.min(Duration::from_secs(1))) {
                Ok(stream) => break stream,
                Err(_) => std::thread::sleep(Duration::from_millis(20).min(left)),
            }
        };
        let _ = stream.set_nodelay(true);
        let mut writer = stream
            .try_clone()
            .map_err(|e| wire::io_error("cloning the bootstrap connection", e))?;
        let mut reader = FrameReader::new(stream);
        let rank_nonce = super::random_secret()?;
        let challenge = Frame::Challenge {
            version: wire::PROTOCOL_VERSION,
            nonce: rank_nonce,
            nranks,
            rank,
        };
        let not_root = |why: &str| {
            Error::new(
                symmResult_t::symmSystemError,
                format!(
                    "rank {rank}: refusing the bootstrap root {}: it did not prove it knows the \
                     communicator's secret ({why}). Another process may be listening on the \
                     root's address, or the id's secret differs from the root's (a wrong commId \
                     secret is refused this way); neither this rank's proof nor its join \
                     information was sent",
                    id.address()
                ),
            )
        };
        wire::send(&mut writer, &challenge, WRITE_TIMEOUT).map_err(|e| not_root(&e.message))?;
        // The root proves itself first: nothing but the challenge goes out before its proof
        // checks, and nothing but its proof is accepted.
        let transcript = match reader.next_of(deadline, Some(&[wire::ROOT_PROOF])) {
            Ok(Some(Frame::RootProof { nonce, proof })) => {
                let transcript = Transcript {
                    version: wire::PROTOCOL_VERSION,
                    nranks,
                    rank,
                    rank_nonce,
                    root_nonce: nonce,
                };
                if !auth::verify_proof(id.secret(), Role::Root, &transcript, &proof) {
                    return Err(not_root("its proof is wrong"));
                }
                transcript
            }
            Ok(Some(_)) => return Err(not_root("it sent another message")),
            Ok(None) => return Err(timed_out("the bootstrap root did not answer the handshake")),
            Err(e) => return Err(not_root(&e.message)),
        };
        let hello = Frame::Hello {
            proof: auth::proof(id.secret(), Role::Rank, &transcript),
            info: info.to_vec(),
        };
        wire::send(&mut writer, &hello, WRITE_TIMEOUT)?;
        let allowed = [wire::WELCOME, wire::ERROR];
        let (session, infos) = match reader.next_of(deadline, Some(&allowed)) {
            Ok(Some(Frame::Welcome { session, infos })) if infos.len() == nranks as usize => {
                (session, infos)
            }
            Ok(Some(Frame::Error { message })) => {
                return Err(Error::invalid_argument(format!("rank {rank}: {message}")));
            }
            Ok(Some(_)) => {
                return Err(Error::new(
                    symmResult_t::symmSystemError,
                    format!("rank {rank}: unexpected message from the bootstrap root"),
                ));
            }
            Ok(None) => return Err(timed_out("not every rank joined")),
            Err(e) => {
                return Err(Error::new(
                    e.code,
                    format!(
                        "rank {rank}: joining through the bootstrap root {}: {}",
                        id.address(),
                        e.message
                    ),
                ));
            }
        };
        Ok((
            Client {
                rank,
                nranks,
                session,
                writer: Mutex::new(writer),
                inbox: Mutex::new(Inbox {
                    reader,
                    gathered: HashMap::new(),
                    failure: None,
                    left: None,
                    root_lost: None,
                }),
            },
            infos,
        ))
    }

    /// The communicator's session: a random value the root gave every rank at `Welcome`.
    pub fn session(&self) -> &[u8; 32] {
        &self.session
    }

    /// Send this rank's contribution to the all-gather `tag`; does not wait for the others.
    pub fn contribute(&self, tag: u64, payload: &[u8]) -> Result<()> {
        if payload.len() > wire::MAX_CONTRIBUTION_BYTES {
            return Err(Error::internal("all-gather contribution too large"));
        }
        let mut writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let frame = Frame::Contribute {
            tag,
            payload: payload.to_vec(),
        };
        wire::send(&mut writer, &frame, WRITE_TIMEOUT)
    }

    /// Every rank's contribution to `tag`, by rank; `symmTimeout` after `timeout`, and an
    /// error at once when a rank's connection was lost or the root failed.
    pub fn gathered(&self, tag: u64, timeout: Duration) -> Result<Vec<Vec<u8>>> {
        let deadline = Instant::now() + timeout;
        let mut inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(payloads) = inbox.gathered.remove(&tag) {
                return Ok(payloads);
            }
            if let Some(failure) = &inbox.failure {
                return Err(failure.clone());
            }
            if let Some(rank) = inbox.left {
                inbox.failure = Some(self.failure_of(Frame::PeerLeft { rank }));
                continue;
            }
            if let Some(lost) = inbox.root_lost.take() {
                inbox.failure = Some(lost);
                continue;
            }
            match inbox.reader.next(deadline) {
                Ok(Some(Frame::Gathered { tag: t, payloads }))
                    if payloads.len() == self.nranks as usize =>
                {
                    inbox.gathered.insert(t, payloads);
                }
                Ok(Some(frame)) => inbox.failure = Some(self.failure_of(frame)),
                Ok(None) => {
                    return Err(Error::new(
                        symmResult_t::symmTimeout,
                        format!(
                            "rank {}: not every rank took part within {} ms",
                            self.rank,
                            timeout.as_millis()
                        ),
                    ));
                }
                Err(e) => inbox.failure = Some(self.lost_root(e)),
            }
        }
    }

    /// Tell every other rank, through the root, that this rank's communicator failed with
    /// `message`: their next wait on the root (or [`Client::poll`]) fails at once with it.
    pub fn fail(&self, message: &str) -> Result<()> {
        let mut writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let frame = Frame::Fail {
            message: message.to_string(),
        };
        wire::send(&mut writer, &frame, WRITE_TIMEOUT)
    }

    /// Read what the root sent within `wait`, unless another thread is reading (it then sees
    /// the same): the failure the root reported (a lost rank, another rank's failure, the
    /// failure), if any. Completed all-gathers are kept for [`Client::gathered`]; a rank that
    /// left, or the root's closed connection, is no failure here (teardown), but fails the next
    /// all-gather that waits.
    pub fn poll(&self, wait: Duration) -> Option<Error> {
        let mut inbox = match self.inbox.try_lock() {
            Ok(inbox) => inbox,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        let deadline = Instant::now() + wait;
        while inbox.failure.is_none() && inbox.root_lost.is_none() {
            match inbox.reader.next(deadline) {
                Ok(Some(Frame::Gathered { tag, payloads }))
                    if payloads.len() == self.nranks as usize =>
                {
                    inbox.gathered.insert(tag, payloads);
                }
                Ok(None) => break,
                Ok(Some(Frame::PeerLeft { rank })) => inbox.left = Some(rank),
                Ok(Some(frame)) => inbox.failure = Some(self.failure_of(frame)),
                Err(e) => inbox.root_lost = Some(self.lost_root(e)),
            }
        }
        inbox.failure.clone()
    }

    /// The failure a frame other than a complete all-gather reports.
    fn failure_of(&self, frame: Frame) -> Error {
        match frame {
            Frame::PeerLost { rank } => Error::new(
                symmResult_t::symmRemoteError,
                format!(
                    "rank {}: rank {rank} left the communicator (its process exited, or its \
                     connection was lost)",
                    self.rank
                ),
            ),
            Frame::PeerLeft { rank } => Error::new(
                symmResult_t::symmRemoteError,
                format!(
                    "rank {}: rank {rank} left the communicator (destroyed it) while this rank \
                     waited for it",
                    self.rank
                ),
            ),
            Frame::Error { message } => Error::new(
                symmResult_t::symmRemoteError,
                format!("rank {}: bootstrap root: {message}", self.rank),
            ),
            _ => Error::new(
                symmResult_t::symmSystemError,
                format!("rank {}: unexpected message from the root", self.rank),
            ),
        }
    }

    /// The failure of a lost connection to the root.
    fn lost_root(&self, e: Error) -> Error {
        Error::new(
            e.code,
            format!("rank {}: lost the bootstrap root: {}", self.rank, e.message),
        )
    }

    /// Close the connection at once, without a `Leave`: what the root sees when this rank's
    /// process dies (tests).
    #[cfg(test)]
    pub fn vanish(&self) {
        let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writer.shutdown(std::net::Shutdown::Both);
    }

    /// Leave the communicator (tells the root; the connection closes when dropped).
    pub fn leave(&self) {
        let mut writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let _ = wire::send(&mut writer, &Frame::Leave, Duration::from_secs(1));
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.leave();
    }
}
