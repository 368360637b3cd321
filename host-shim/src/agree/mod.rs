//! Call agreement: what the `k`-th collective of every rank must agree on ([`Signature`],
//! [`Call`]), and where the ranks' calls are compared — between the ranks of this process
//! ([`CallLog`]) and with the ranks of other processes of this machine ([`records`]). Pure
//! bookkeeping on numbers: numbering a rank's calls and failing its communicator on a
//! disagreement is the caller's part (`collective`).

#[cfg(target_os = "linux")]
pub mod records;

use crate::error::{Error, Result};
use crate::mutation::{self, Mutation};
use crate::plan::staging::ChunkOf;
use crate::plan::{Collective, KernelId};
use std::collections::BTreeMap;
use symm_device::symmetric::Algorithm;
use symm_device::symmetric::batch::MAX_TASKS;
use symm_device::{DataType, RedOp};

/// Where a rank's kernel has peers access one of its buffers: the window registration (the
/// same number on every rank) and the offset in it. Peers compute the address from their own
/// view of the window, so every rank that uses a buffer must name the same place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferAt {
    /// The window's registration number ([`crate::window::Window::seq`]).
    pub window: u64,
    /// Bytes from the window's base.
    pub offset: u64,
}

/// An all-to-all-v's count table as every rank's call must name it: its window registration
/// and offset, and the send capacity it is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CountsAt {
    /// The table's window registration number.
    pub window: u64,
    /// Bytes from the window's base.
    pub offset: u64,
    /// Elements of the send buffer.
    pub send_count: u64,
}

/// What the `k`-th collective of every rank of a communicator must agree on: checked between
/// the ranks of this process (one thread per rank, or a group driving some of them) and with
/// the ranks of other processes, before a launch, so that a rank that calls another collective,
/// type, operator, count, broadcast root or buffer place than its peers is refused instead of
/// exchanging data with them under wrong assumptions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    /// The collective.
    pub collective: Collective,
    /// The kernel (algorithm, type, operator).
    pub kernel: KernelId,
    /// Elements (all-reduce: total; the others: per rank).
    pub count: u64,
    /// Blocks per rank.
    pub grid: u32,
    /// The broadcast's root (0 for the other collectives).
    pub root: u32,
    /// The call's place in its launch: the `batch_index`-th of `batch_size` calls of the rank
    /// fused into one kernel (0 of 1 unfused). A fused launch pairs only with the same fused
    /// launch on every rank (its barriers and LL calls are the batch's): a peer that makes
    /// these calls one by one, or fuses them otherwise, disagrees here instead of pairing.
    pub batch_index: u16,
    /// Calls of the rank in the call's launch (1 unfused).
    pub batch_size: u16,
    /// The send buffer, where peers' kernels access it at the offset they were given (`None`
    /// where no peer does: an all-gather, a broadcast, a call of count 0).
    pub send: Option<BufferAt>,
    /// The receive buffer, where peers' kernels access it at the offset they were given
    /// (`None` where no peer does: a reduce-scatter, an all-reduce but the two-shot out of
    /// place, a call of count 0).
    pub recv: Option<BufferAt>,
    /// The call is in place on this rank (compared only where the algorithm needs every rank
    /// alike: the two-shot all-reduce).
    pub in_place: bool,
    /// All-to-all-v: where the count table is (peers read it there) and the send buffer's
    /// capacity (peers check every rank's counts against it).
    pub counts: Option<CountsAt>,
    /// A chunk of a call staged through the communicator's staging window (its buffers lie
    /// outside every registered window; see `collective::route`): the call's elements per
    /// segment and the chunk's first element. A staged rank pairs only with staged ranks, on
    /// the same chunk of the same call.
    pub staged: Option<ChunkOf>,
}

impl std::fmt::Display for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.collective {
            Collective::AllReduce => "symmAllReduce",
            Collective::Reduce => "symmReduce",
            Collective::AllGather => "symmAllGather",
            Collective::ReduceScatter => "symmReduceScatter",
            Collective::Broadcast => "symmBroadcast",
            Collective::AllToAll => "symmAlltoAll",
            Collective::Gather => "symmGather",
            Collective::Scatter => "symmScatter",
            Collective::AllToAllV => "symmAlltoAllvDevice",
        };
        match self.counts {
            Some(counts) => write!(
                f,
                "{name} of {:?} (sendcount {}, recvcount {})",
                self.kernel.dtype, counts.send_count, self.count
            )?,
            None => write!(f, "{name} of {} x {:?}", self.count, self.kernel.dtype)?,
        }
        match self.collective {
            Collective::AllReduce | Collective::ReduceScatter => {
                write!(f, " {:?}", self.kernel.op)?
            }
            Collective::Reduce => write!(f, " {:?} to root {}", self.kernel.op, self.root)?,
            Collective::Broadcast | Collective::Scatter => write!(f, " from root {}", self.root)?,
            Collective::Gather => write!(f, " to root {}", self.root)?,
            Collective::AllGather | Collective::AllToAll | Collective::AllToAllV => {}
        }
        write!(
            f,
            " ({}, {} blocks",
            self.kernel.algorithm.name(),
            self.grid
        )?;
        if self.batch_size > 1 {
            write!(
                f,
                ", call {} of {} fused into one launch in a group",
                self.batch_index + 1,
                self.batch_size
            )?;
        }
        if let Some(chunk) = self.staged {
            write!(
                f,
                ", elements {} to {} of a call of {} staged through the staging window",
                chunk.first,
                chunk.first + self.count,
                chunk.count
            )?;
        }
        write!(f, ")")
    }
}

/// [`Signature::to_words`]'s encoding of a buffer not used by peers.
pub(crate) const NO_BUFFER: u64 = u64::MAX;

impl Signature {
    /// Words of [`Signature::to_words`].
    pub(crate) const WORDS: usize = 13;

    /// `self` as the `index`-th of `size` calls fused into one launch.
    pub fn in_batch(self, index: usize, size: usize) -> Signature {
        Signature {
            batch_index: index as u16,
            batch_size: size as u16,
            ..self
        }
    }

    /// `true` when the two ranks' calls pair up: the same collective, kernel, count, grid,
    /// root and place in the launch; every buffer that both ranks' kernels take as the peers'
    /// at the same place; alike in place where the algorithm needs it.
    pub fn agrees_with(&self, other: &Signature) -> bool {
        self.differences(other).is_empty()
    }

    /// What differs between two ranks' calls, in words (empty when they pair up: see
    /// [`Signature::agrees_with`]).
    pub fn differences(&self, other: &Signature) -> Vec<String> {
        let (a, b) = (self, other);
        let mut differences = Vec::new();
        if a.collective != b.collective {
            differences.push(format!(
                "collective {} vs {}",
                a.collective.name(),
                b.collective.name()
            ));
            return differences;
        }
        if a.staged.is_some() != b.staged.is_some() {
            let order = if a.staged.is_some() {
                "staged vs in windows"
            } else {
                "in windows vs staged"
            };
            differences.push(format!(
                "{order} (a staged call's buffers lie outside every registered window, and it \
                 runs through the communicator's staging window: every rank's buffers must lie \
                 in windows, or none's)"
            ));
            return differences;
        }
        if let (Some(x), Some(y)) = (a.staged, b.staged)
            && x != y
        {
            differences.push(format!(
                "staged call of {} vs {} elements (chunk from element {} vs {})",
                x.count, y.count, x.first, y.first
            ));
        }
        if a.kernel != b.kernel {
            differences.push(format!(
                "kernel {} vs {} (datatype, operator or algorithm)",
                a.kernel.ptx_name(),
                b.kernel.ptx_name()
            ));
        }
        if a.count != b.count {
            // An all-to-all-v's count is its receive capacity (`recvcount`).
            let name = if a.collective == Collective::AllToAllV {
                "recvcount"
            } else {
                "count"
            };
            differences.push(format!("{name} {} vs {}", a.count, b.count));
        }
        if a.root != b.root {
            differences.push(format!("root {} vs {}", a.root, b.root));
        }
        if a.grid != b.grid {
            differences.push(format!("grid of {} vs {} blocks", a.grid, b.grid));
        }
        if (a.batch_index, a.batch_size) != (b.batch_index, b.batch_size) {
            differences.push(format!(
                "call {} of {} vs {} of {} in its launch (fused alike or not at all)",
                a.batch_index + 1,
                a.batch_size,
                b.batch_index + 1,
                b.batch_size
            ));
        }
        // Two-shot stores each rank's shard into every peer's receive buffer where the storing
        // rank believes it is: every rank must be in place, or none.
        let two_shot =
            [a.kernel.algorithm, b.kernel.algorithm].contains(&Algorithm::TwoShotAllReduce);
        if two_shot && a.in_place != b.in_place {
            differences.push(
                "in place vs out of place (the two-shot all-reduce needs every rank in place or \
                 none)"
                    .to_string(),
            );
        }
        for (name, a_at, b_at) in [("send", a.send, b.send), ("receive", a.recv, b.recv)] {
            let (Some(a_at), Some(b_at)) = (a_at, b_at) else {
                continue;
            };
            if a_at.window != b_at.window {
                differences.push(format!(
                    "{name} buffer in window registration #{} vs #{}",
                    a_at.window, b_at.window
                ));
            } else if a_at.offset != b_at.offset {
                differences.push(format!(
                    "{name} buffer at window offset {} vs {} (offsets must be symmetric)",
                    a_at.offset, b_at.offset
                ));
            }
        }
        match (a.counts, b.counts) {
            (Some(x), Some(y)) if x.window != y.window => differences.push(format!(
                "count table in window registration #{} vs #{}",
                x.window, y.window
            )),
            (Some(x), Some(y)) if x.offset != y.offset => differences.push(format!(
                "count table at window offset {} vs {} (offsets must be symmetric)",
                x.offset, y.offset
            )),
            (Some(x), Some(y)) if x.send_count != y.send_count => differences.push(format!(
                "sendcount {} vs {} (the send capacity must be the same on every rank)",
                x.send_count, y.send_count
            )),
            (x, y) if x.is_some() != y.is_some() => {
                differences.push("a count table vs none".to_string())
            }
            _ => {}
        }
        differences
    }

    /// The signature as plain words, for ranks of other processes to read
    /// ([`records`]): collective, algorithm, type, operator and grid; the count; the root and
    /// the place in the launch; the send and receive buffers' windows and offsets
    /// ([`NO_BUFFER`] for a buffer not used by peers); in place; the count table's window ([`NO_BUFFER`] for
    /// none), offset and send capacity.
    pub(crate) fn to_words(&self) -> [u64; Self::WORDS] {
        let collective = Collective::ALL
            .iter()
            .position(|c| *c == self.collective)
            .unwrap_or(0) as u64;
        let algorithm = Algorithm::ALL
            .iter()
            .position(|a| *a == self.kernel.algorithm)
            .unwrap_or(0) as u64;
        let buffer = |at: Option<BufferAt>| at.map_or((NO_BUFFER, 0), |at| (at.window, at.offset));
        let (send_window, send_offset) = buffer(self.send);
        let (recv_window, recv_offset) = buffer(self.recv);
        [
            collective
                | algorithm << 8
                | (self.kernel.dtype as u64) << 16
                | (self.kernel.op as u64) << 24
                | (self.grid as u64) << 32,
            self.count,
            self.root as u64 | (self.batch_index as u64) << 32 | (self.batch_size as u64) << 48,
            send_window,
            send_offset,
            recv_window,
            recv_offset,
            self.in_place as u64 | (self.staged.is_some() as u64) << 1,
            self.counts.map_or(NO_BUFFER, |c| c.window),
            self.counts.map_or(0, |c| c.offset),
            self.counts.map_or(0, |c| c.send_count),
            self.staged.map_or(0, |c| c.count),
            self.staged.map_or(0, |c| c.first),
        ]
    }

    /// The signature of [`Signature::to_words`]'s `words`, if they name one.
    pub(crate) fn from_words(words: [u64; Self::WORDS]) -> Option<Signature> {
        let field = |shift: u32| ((words[0] >> shift) & 0xFF) as usize;
        let batch_index = (words[2] >> 32) as u16;
        let batch_size = (words[2] >> 48) as u16;
        if batch_size == 0 || batch_index >= batch_size || batch_size as usize > MAX_TASKS {
            return None;
        }
        let buffer =
            |window: u64, offset: u64| (window != NO_BUFFER).then_some(BufferAt { window, offset });
        if words[7] > 3 {
            return None;
        }
        Some(Signature {
            collective: *Collective::ALL.get(field(0))?,
            kernel: KernelId {
                algorithm: *Algorithm::ALL.get(field(8))?,
                dtype: DataType::from_raw(field(16) as u32)?,
                op: RedOp::from_raw(field(24) as u32)?,
            },
            count: words[1],
            grid: (words[0] >> 32) as u32,
            root: words[2] as u32,
            batch_index,
            batch_size,
            send: buffer(words[3], words[4]),
            recv: buffer(words[5], words[6]),
            in_place: words[7] & 1 == 1,
            staged: (words[7] & 2 == 2).then_some(ChunkOf {
                count: words[11],
                first: words[12],
            }),
            counts: (words[8] != NO_BUFFER).then_some(CountsAt {
                window: words[8],
                offset: words[9],
                send_count: words[10],
            }),
        })
    }
}

/// A rank's `k`-th collective as its peers compare it: a call it made (launched, or of
/// count 0), or a call it refused after it reached the communicator (bad arguments, a
/// mismatch inside a group). A refused call still counts: ranks that all refused their `k`-th
/// call agree and go on; a rank that refused a call its peers made fails the communicator
/// (see `comm::failure`), so that its next call never pairs with their `k`-th.
#[derive(Clone, Debug)]
pub enum Call {
    /// A call made, with what every rank's kernel assumes.
    Made(Signature),
    /// A refused call, and why (empty when read from another process).
    Refused(String),
}

impl Call {
    /// `true` when two ranks' `k`-th calls are the same collective (any two refusals agree).
    pub fn agrees_with(&self, other: &Call) -> bool {
        match (self, other) {
            (Call::Made(a), Call::Made(b)) => a.agrees_with(b),
            (Call::Refused(_), Call::Refused(_)) => true,
            _ => false,
        }
    }

    /// "is symmAllReduce of …" or "was refused (…)".
    fn phrase(&self) -> String {
        match self {
            Call::Made(signature) => format!("is {signature}"),
            Call::Refused(reason) if reason.is_empty() => "was refused".to_string(),
            Call::Refused(reason) => format!("was refused ({reason})"),
        }
    }

    /// The call as plain words, for ranks of other processes ([`records`]): a
    /// refusal is a word no signature has.
    pub(crate) fn to_words(&self) -> [u64; Signature::WORDS] {
        match self {
            Call::Made(signature) => signature.to_words(),
            Call::Refused(_) => {
                let mut words = [0; Signature::WORDS];
                words[0] = u64::MAX;
                words
            }
        }
    }

    /// The call of [`Call::to_words`]'s `words`, if they name one.
    pub(crate) fn from_words(words: [u64; Signature::WORDS]) -> Option<Call> {
        if words[0] == u64::MAX {
            return Some(Call::Refused(String::new()));
        }
        Signature::from_words(words).map(Call::Made)
    }
}

/// The calls in flight of a clique's ranks in this process, by call number.
#[derive(Default)]
pub struct CallLog {
    calls: BTreeMap<u64, Vec<Option<Call>>>,
    /// Call numbers below this were dropped before every rank of this process made them
    /// (see [`CALL_LOG_ENTRIES`]): such a call can no longer be compared.
    dropped_below: u64,
}

/// Most call numbers kept waiting for a rank of this process that has not made them yet (one
/// that left, or lags far behind: calls of count 0 and refused calls launch nothing, and cuda
/// launches do not block, so a rank can run far ahead). A lagging rank that reaches a dropped
/// number cannot be compared any more and fails the communicator, never pairs unchecked.
const CALL_LOG_ENTRIES: usize = 4096;

impl CallLog {
    /// Whether every rank of this process has made its collective number `seq` (its entry is
    /// gone once they all have).
    pub fn settled(&self, seq: u64) -> bool {
        !self.calls.contains_key(&seq)
    }

    /// Record that `rank`'s collective number `seq` is `call`, among `nranks` ranks of which
    /// `remote(r)` are in other processes (compared through [`records`], never here); an error
    /// naming both calls when a rank of this process made another call under that number. The
    /// entry of `seq` is dropped once every rank of this process made its call.
    pub fn record(
        &mut self,
        seq: u64,
        rank: usize,
        call: &Call,
        nranks: usize,
        remote: impl Fn(usize) -> bool,
    ) -> Result<()> {
        if seq < self.dropped_below {
            return Err(Error::invalid_usage(format!(
                "rank {rank}'s collective #{seq} can no longer be compared with its peers' (they \
                 are more than {CALL_LOG_ENTRIES} collectives ahead); the communicator is failed \
                 on every rank"
            )));
        }
        let entry = self.calls.entry(seq).or_insert_with(|| vec![None; nranks]);
        let conflict = entry.iter().enumerate().find_map(|(r, theirs)| {
            theirs
                .as_ref()
                .filter(|theirs| r != rank && !theirs.agrees_with(call))
                .map(|theirs| (r, theirs.clone()))
        });
        let conflict = conflict.filter(|_| !mutation::active(Mutation::SkipCallAgreement));
        if let Some((other, theirs)) = conflict {
            return Err(disagreement(seq, rank, call, other, &theirs, false));
        }
        entry[rank] = Some(call.clone());
        let complete = entry
            .iter()
            .enumerate()
            .all(|(r, call)| call.is_some() || remote(r));
        if complete {
            self.calls.remove(&seq);
        }
        while self.calls.len() > CALL_LOG_ENTRIES {
            if let Some((dropped, _)) = self.calls.pop_first() {
                self.dropped_below = self.dropped_below.max(dropped + 1);
            }
        }
        Ok(())
    }
}

/// "rank A's collective #k is X, but rank B's is Y: ...": two ranks' different calls under
/// one number (this process's ranks here, ranks of other processes in [`records`]).
pub(crate) fn mismatch_message(
    seq: u64,
    rank: usize,
    own: &Call,
    peer: usize,
    theirs: &Call,
) -> String {
    let differences = match (own, theirs) {
        (Call::Made(a), Call::Made(b)) => {
            format!(" (they differ in: {})", a.differences(b).join(", "))
        }
        _ => String::new(),
    };
    format!(
        "rank {rank}'s collective #{seq} {}, but rank {peer}'s {}{differences}: every rank must \
         make the same collective calls, with the same count and buffers at the same offsets of \
         the same windows, in the same order (and group them alike)",
        own.phrase(),
        theirs.phrase()
    )
}

/// The error of `rank`, whose collective number `seq` is `own` while `peer`'s is `theirs`
/// (`peer_elsewhere`: the peer runs in another process): the same for a disagreement found in
/// this process ([`CallLog`]) or through the call records ([`records`]).
pub(crate) fn disagreement(
    seq: u64,
    rank: usize,
    own: &Call,
    peer: usize,
    theirs: &Call,
    peer_elsewhere: bool,
) -> Error {
    let elsewhere = if peer_elsewhere {
        format!(" (rank {peer} runs in another process)")
    } else {
        String::new()
    };
    Error::invalid_usage(format!(
        "{}{elsewhere}; nothing of rank {rank}'s call was exchanged, and the communicator is \
         failed on every rank",
        mismatch_message(seq, rank, own, peer, theirs)
    ))
}
