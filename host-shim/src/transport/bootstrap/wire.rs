//! Bootstrap frames: `magic u32 | kind u8 | 3 zero bytes | length u32 | payload` (little
//! endian). Every kind has a maximum payload length, checked before anything is allocated;
//! every payload is decoded strictly (exact lengths, bounded counts).
//!
//! A connection starts with the handshake of [`super::auth`]: `Challenge` (rank → root),
//! `RootProof` (root → rank), `Hello` (rank → root, with the rank's proof); only then
//! `Welcome` or `Error`, and the all-gathers.

use crate::abi::symmResult_t;
use crate::error::{Error, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// First four bytes of every frame.
pub const MAGIC: u32 = 0x424d_5953; // "SYMB"
/// Version of the bootstrap protocol, in every `Challenge` and bound into both proofs. 3:
/// `Fail` and `PeerLeft`; 2: the challenge–response handshake (1: the rank sent the secret in
/// its `Hello`).
pub(crate) const PROTOCOL_VERSION: u32 = 3;
/// Header bytes of a frame.
pub const HEADER_BYTES: usize = 12;
/// Most ranks of a communicator (`symm_device::sync::signal_pad::MAX_RANKS`).
pub const MAX_RANKS: u32 = symm_device::sync::signal_pad::MAX_RANKS as u32;
/// Largest per-rank join information.
pub const MAX_INFO_BYTES: usize = 4096;
/// Largest contribution to one all-gather.
pub const MAX_CONTRIBUTION_BYTES: usize = 1 << 20;
/// Largest error message.
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// One bootstrap message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Rank → root, first: the handshake's start.
    Challenge {
        /// [`PROTOCOL_VERSION`].
        version: u32,
        /// The rank's fresh random nonce.
        nonce: [u8; 32],
        /// Ranks of the communicator.
        nranks: u32,
        /// The joining rank.
        rank: u32,
    },
    /// Root → rank, the answer to `Challenge`: the root's nonce and its proof of knowing the
    /// secret ([`super::auth::proof`] with [`super::auth::Role::Root`]).
    RootProof {
        /// The root's fresh random nonce.
        nonce: [u8; 32],
        /// The root's proof.
        proof: [u8; 32],
    },
    /// Rank → root, once the root's proof checked: join.
    Hello {
        /// The rank's proof of knowing the secret ([`super::auth::Role::Rank`]).
        proof: [u8; 32],
        /// Opaque join information.
        info: Vec<u8>,
    },
    /// Root → rank: everyone joined; every rank's information, by rank.
    Welcome {
        /// The communicator's session: random, chosen by the root, the same for every rank.
        session: [u8; 32],
        /// Join information by rank.
        infos: Vec<Vec<u8>>,
    },
    /// Root → rank: the connection is refused or the communicator failed.
    Error {
        /// Why.
        message: String,
    },
    /// Rank → root: a contribution to the all-gather `tag`.
    Contribute {
        /// All-gather tag.
        tag: u64,
        /// The rank's bytes.
        payload: Vec<u8>,
    },
    /// Root → rank: every rank's contribution to `tag`, by rank.
    Gathered {
        /// All-gather tag.
        tag: u64,
        /// Contributions by rank.
        payloads: Vec<Vec<u8>>,
    },
    /// Root → rank: `rank`'s connection was lost.
    PeerLost {
        /// The lost rank.
        rank: u32,
    },
    /// Rank → root: leaving (communicator destroyed).
    Leave,
    /// Root → rank: `rank` left (destroyed its communicator): no later all-gather completes.
    PeerLeft {
        /// The rank that left.
        rank: u32,
    },
    /// Rank → root: this rank's communicator failed, with the cause; the root tells every
    /// other rank at once (an `Error` naming the rank).
    Fail {
        /// Why.
        message: String,
    },
}

pub(crate) const HELLO: u8 = 1;
pub(crate) const WELCOME: u8 = 2;
pub(crate) const ERROR: u8 = 3;
pub(crate) const CONTRIBUTE: u8 = 4;
pub(crate) const GATHERED: u8 = 5;
pub(crate) const PEER_LOST: u8 = 6;
pub(crate) const LEAVE: u8 = 7;
pub(crate) const CHALLENGE: u8 = 8;
pub(crate) const ROOT_PROOF: u8 = 9;
pub(crate) const FAIL: u8 = 10;
pub(crate) const PEER_LEFT: u8 = 11;

/// Largest payload of a frame of `kind` (`None`: unknown kind).
fn max_payload(kind: u8) -> Option<usize> {
    let lists = |item: usize| 4 + MAX_RANKS as usize * (4 + item);
    Some(match kind {
        CHALLENGE => 4 + 32 + 4 + 4,
        ROOT_PROOF => 32 + 32,
        HELLO => 32 + 4 + MAX_INFO_BYTES,
        WELCOME => 32 + lists(MAX_INFO_BYTES),
        ERROR => MAX_MESSAGE_BYTES,
        CONTRIBUTE => 8 + MAX_CONTRIBUTION_BYTES,
        GATHERED => 8 + lists(MAX_CONTRIBUTION_BYTES),
        PEER_LOST => 4,
        LEAVE => 0,
        FAIL => MAX_MESSAGE_BYTES,
        PEER_LEFT => 4,
        _ => return None,
    })
}

fn put_list(out: &mut Vec<u8>, items: &[Vec<u8>]) {
    out.extend_from_slice(&(items.len() as u32).to_le_bytes());
    for item in items {
        out.extend_from_slice(&(item.len() as u32).to_le_bytes());
        out.extend_from_slice(item);
    }
}

impl Frame {
    /// The frame's bytes, header included.
    pub fn encode(&self) -> Vec<u8> {
        let mut payload = Vec::new();
        let kind = match self {
            Frame::Challenge {
                version,
                nonce,
                nranks,
                rank,
            } => {
                payload.extend_from_slice(&version.to_le_bytes());
                payload.extend_from_slice(nonce);
                payload.extend_from_slice(&nranks.to_le_bytes());
                payload.extend_from_slice(&rank.to_le_bytes());
                CHALLENGE
            }
            Frame::RootProof { nonce, proof } => {
                payload.extend_from_slice(nonce);
                payload.extend_from_slice(proof);
                ROOT_PROOF
            }
            Frame::Hello { proof, info } => {
                payload.extend_from_slice(proof);
                payload.extend_from_slice(&(info.len() as u32).to_le_bytes());
                payload.extend_from_slice(info);
                HELLO
            }
            Frame::Welcome { session, infos } => {
                payload.extend_from_slice(session);
                put_list(&mut payload, infos);
                WELCOME
            }
            Frame::Error { message } => {
                let bytes = message.as_bytes();
                payload.extend_from_slice(&bytes[..bytes.len().min(MAX_MESSAGE_BYTES)]);
                ERROR
            }
            Frame::Contribute { tag, payload: p } => {
                payload.extend_from_slice(&tag.to_le_bytes());
                payload.extend_from_slice(p);
                CONTRIBUTE
            }
            Frame::Gathered { tag, payloads } => {
                payload.extend_from_slice(&tag.to_le_bytes());
                put_list(&mut payload, payloads);
                GATHERED
            }
            Frame::PeerLost { rank } => {
                payload.extend_from_slice(&rank.to_le_bytes());
                PEER_LOST
            }
            Frame::Leave => LEAVE,
            Frame::PeerLeft { rank } => {
                payload.extend_from_slice(&rank.to_le_bytes());
                PEER_LEFT
            }
            Frame::Fail { message } => {
                let bytes = message.as_bytes();
                payload.extend_from_slice(&bytes[..bytes.len().min(MAX_MESSAGE_BYTES)]);
                FAIL
            }
        };
        let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&[kind, 0, 0, 0]);
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&payload);
        out
    }

    /// Check a header: the kind and payload length, before the payload is read.
    pub fn check_header(header: &[u8; HEADER_BYTES]) -> Result<(u8, usize)> {
        let magic = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
        if magic != MAGIC || header[5..8] != [0, 0, 0] {
            return Err(malformed("not a symm bootstrap frame"));
        }
        let kind = header[4];
        let len = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes")) as usize;
        let max = max_payload(kind).ok_or_else(|| malformed("unknown frame kind"))?;
        if len > max {
            return Err(malformed("frame longer than its kind allows"));
        }
        Ok((kind, len))
    }

    /// Decode the payload of a frame of `kind` (from [`Frame::check_header`]).
    pub fn decode(kind: u8, payload: &[u8]) -> Result<Frame> {
        let mut r = Cursor { bytes: payload };
        let frame = match kind {
            CHALLENGE => Frame::Challenge {
                version: r.u32()?,
                nonce: r.array::<32>()?,
                nranks: r.u32()?,
                rank: r.u32()?,
            },
            ROOT_PROOF => Frame::RootProof {
                nonce: r.array::<32>()?,
                proof: r.array::<32>()?,
            },
            HELLO => {
                let proof = r.array::<32>()?;
                let len = r.u32()? as usize;
                if len > MAX_INFO_BYTES {
                    return Err(malformed("join information too long"));
                }
                Frame::Hello {
                    proof,
                    info: r.take(len)?.to_vec(),
                }
            }
            WELCOME => Frame::Welcome {
                session: r.array::<32>()?,
                infos: r.list(MAX_INFO_BYTES)?,
            },
            ERROR => Frame::Error {
                message: String::from_utf8_lossy(r.take(payload.len())?).into_owned(),
            },
            CONTRIBUTE => {
                let tag = r.u64()?;
                Frame::Contribute {
                    tag,
                    payload: r.take(payload.len() - 8)?.to_vec(),
                }
            }
            GATHERED => {
                let tag = r.u64()?;
                Frame::Gathered {
                    tag,
                    payloads: r.list(MAX_CONTRIBUTION_BYTES)?,
                }
            }
            PEER_LOST => Frame::PeerLost { rank: r.u32()? },
            LEAVE => Frame::Leave,
            PEER_LEFT => Frame::PeerLeft { rank: r.u32()? },
            FAIL => Frame::Fail {
                message: String::from_utf8_lossy(r.take(payload.len())?).into_owned(),
            },
            _ => return Err(malformed("unknown frame kind")),
        };
        if !r.bytes.is_empty() {
            return Err(malformed("trailing bytes in a frame"));
        }
        Ok(frame)
    }
}

fn malformed(what: &str) -> Error {
    Error::new(
        symmResult_t::symmSystemError,
        format!("malformed bootstrap message: {what}"),
    )
}

/// Bounded reader over a payload.
struct Cursor<'a> {
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.bytes.len() < n {
            return Err(malformed("truncated frame"));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array::<4>()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array::<8>()?))
    }
    fn list(&mut self, max_item: usize) -> Result<Vec<Vec<u8>>> {
        let count = self.u32()?;
        if count == 0 || count > MAX_RANKS {
            return Err(malformed("bad rank count"));
        }
        (0..count)
            .map(|_| {
                let len = self.u32()? as usize;
                if len > max_item {
                    return Err(malformed("list item too long"));
                }
                Ok(self.take(len)?.to_vec())
            })
            .collect()
    }
}

/// Reads whole frames from a stream with deadlines, keeping partial input between calls (a
/// deadline never loses bytes of a frame in flight).
pub struct FrameReader {
    stream: TcpStream,
    buffer: Vec<u8>,
}

impl FrameReader {
    /// A reader over `stream`.
    pub fn new(stream: TcpStream) -> Self {
        FrameReader {
            stream,
            buffer: Vec::new(),
        }
    }

    /// The next frame, or `Ok(None)` when `deadline` passes first. A closed connection or a
    /// malformed frame is an error.
    pub fn next(&mut self, deadline: Instant) -> Result<Option<Frame>> {
        self.next_of(deadline, None)
    }

    /// As [`FrameReader::next`], but a frame whose kind is not in `allowed` is an error as
    /// soon as its header arrives (before its payload is read): what an unauthenticated
    /// connection may send is bounded by the allowed kinds' limits.
    pub fn next_of(&mut self, deadline: Instant, allowed: Option<&[u8]>) -> Result<Option<Frame>> {
        loop {
            if self.buffer.len() >= HEADER_BYTES {
                let header: [u8; HEADER_BYTES] =
                    self.buffer[..HEADER_BYTES].try_into().expect("header");
                let (kind, len) = Frame::check_header(&header)?;
                if allowed.is_some_and(|kinds| !kinds.contains(&kind)) {
                    return Err(malformed("a frame of a kind not allowed here"));
                }
                if self.buffer.len() >= HEADER_BYTES + len {
                    let frame = Frame::decode(kind, &self.buffer[HEADER_BYTES..HEADER_BYTES + len]);
                    self.buffer.drain(..HEADER_BYTES + len);
                    return frame.map(Some);
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let wait = (deadline - now).clamp(Duration::from_millis(1), Duration::from_millis(200));
            self.stream
                .set_read_timeout(Some(wait))
                .map_err(|e| io_error("setting a read timeout", e))?;
            let mut chunk = [0u8; 16384];
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    return Err(Error::new(
                        symmResult_t::symmSystemError,
                        "bootstrap connection closed",
                    ));
                }
                Ok(n) => self.buffer.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error("reading from a bootstrap connection", e)),
            }
        }
    }
}

/// Write `frame` to `stream`, bounded by `timeout`.
pub fn send(stream: &mut TcpStream, frame: &Frame, timeout: Duration) -> Result<()> {
    stream
        .set_write_timeout(Some(timeout.max(Duration::from_millis(1))))
        .map_err(|e| io_error("setting a write timeout", e))?;
    stream
        .write_all(&frame.encode())
        .map_err(|e| io_error("writing to a bootstrap connection", e))
}

/// A `symmSystemError` for a failed socket operation.
pub fn io_error(what: &str, e: std::io::Error) -> Error {
    Error::new(symmResult_t::symmSystemError, format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Frame> {
        vec![
            Frame::Challenge {
                version: PROTOCOL_VERSION,
                nonce: [1; 32],
                nranks: 4,
                rank: 2,
            },
            Frame::RootProof {
                nonce: [2; 32],
                proof: [3; 32],
            },
            Frame::Hello {
                proof: [3; 32],
                info: b"info".to_vec(),
            },
            Frame::Welcome {
                session: [4; 32],
                infos: vec![b"a".to_vec(), vec![], b"ccc".to_vec()],
            },
            Frame::Error {
                message: "rank 1 already joined".into(),
            },
            Frame::Contribute {
                tag: 9,
                payload: vec![1, 2, 3],
            },
            Frame::Gathered {
                tag: u64::MAX,
                payloads: vec![vec![1], vec![2, 2]],
            },
            Frame::PeerLost { rank: 5 },
            Frame::Leave,
            Frame::PeerLeft { rank: 2 },
            Frame::Fail {
                message: "rank 3 timed out".into(),
            },
        ]
    }

    fn parse(bytes: &[u8]) -> Result<Frame> {
        let header: [u8; HEADER_BYTES] = bytes
            .get(..HEADER_BYTES)
            .ok_or_else(|| malformed("short"))?
            .try_into()
            .unwrap();
        let (kind, len) = Frame::check_header(&header)?;
        let payload = bytes
            .get(HEADER_BYTES..HEADER_BYTES + len)
            .ok_or_else(|| malformed("short"))?;
        if bytes.len() != HEADER_BYTES + len {
            return Err(malformed("long"));
        }
        Frame::decode(kind, payload)
    }

    #[test]
    fn every_kind_round_trips_and_every_truncation_fails() {
        for frame in samples() {
            let bytes = frame.encode();
            assert_eq!(parse(&bytes).unwrap(), frame);
            for cut in 0..bytes.len() {
                assert!(parse(&bytes[..cut]).is_err(), "{frame:?} cut at {cut}");
            }
        }
    }

    #[test]
    fn oversized_and_unknown_headers_are_refused_before_reading() {
        let mut header = [0u8; HEADER_BYTES];
        header[..4].copy_from_slice(&MAGIC.to_le_bytes());
        header[4] = CONTRIBUTE;
        header[8..].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Frame::check_header(&header).is_err());
        header[4] = 99;
        header[8..].copy_from_slice(&0u32.to_le_bytes());
        assert!(Frame::check_header(&header).is_err());
        header[4] = LEAVE;
        header[0] ^= 1;
        assert!(Frame::check_header(&header).is_err());
    }

    #[test]
    fn lists_with_bad_counts_or_lengths_are_refused() {
        // A Welcome's list follows its 32-byte session.
        let mut payload = vec![0u8; 32];
        payload.extend_from_slice(&(MAX_RANKS + 1).to_le_bytes());
        assert!(Frame::decode(WELCOME, &payload).is_err());
        let mut payload = vec![0u8; 32];
        payload.extend_from_slice(&1u32.to_le_bytes());
        payload.extend_from_slice(&(MAX_INFO_BYTES as u32 + 1).to_le_bytes());
        assert!(Frame::decode(WELCOME, &payload).is_err());
        let mut payload = vec![0u8; 32];
        payload.extend_from_slice(&1u32.to_le_bytes());
        payload.extend_from_slice(&0u32.to_le_bytes());
        assert!(
            Frame::decode(WELCOME, &payload).is_ok(),
            "the same, well formed"
        );
        assert!(Frame::decode(CHALLENGE, &[0; 43]).is_err());
        assert!(Frame::decode(CHALLENGE, &[0; 45]).is_err());
        assert!(Frame::decode(ROOT_PROOF, &[0; 63]).is_err());
        assert!(Frame::decode(PEER_LOST, &[0; 5]).is_err());
        assert!(Frame::decode(LEAVE, &[0]).is_err());
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20_000 {
            let kind = (next() % 11) as u8;
            let len = (next() % 64) as usize;
            let payload: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let _ = Frame::decode(kind, &payload);
            let samples = samples();
            let mut frame = samples[(next() as usize) % samples.len()].encode();
            let at = (next() as usize) % frame.len();
            frame[at] ^= 1 << (next() % 8);
            let _ = parse(&frame);
        }
    }
}
