//! Call records: how ranks in *different processes* of one machine check that they make the
//! same collective calls, as the ranks of one process do through the clique's
//! [`super::CallLog`].
//!
//! Each rank of a communicator made by `symmCommInitRank` whose ranks all run on this machine
//! (some in other processes) owns a small shared memory file, a ring of [`RECORD_SLOTS`]
//! records, and maps the files of the ranks in the other processes (passed at initialization
//! like window memory: over the ranks' Unix sockets, authenticated by the communicator's
//! secret). Before it launches its collective number `k`, a rank writes the call's
//! [`Signature`] into slot `k mod RECORD_SLOTS` of its own ring, then reads slot `k` of every
//! peer's ring: a peer that already made its call `k` and made another one gets this rank's
//! call refused with a message naming both (nothing is launched, so nothing is exchanged), and
//! the peer, which launched, times out and names both in its timeout message
//! ([`CallRecords::recent_conflict`]).
//!
//! **Why one of two disagreeing ranks always sees it.** Each rank writes its own record, then
//! (after a sequentially consistent fence) reads the others'. Of two ranks making their call
//! `k`, at least one reads the other's record: both fences are in the single total order of
//! SC fences, and the rank whose fence comes second sees the other's write (the store-buffering
//! pattern that SC fences forbid). So a mismatch is never launched by both; the rank that
//! launched waits for a peer that never comes, and gets `symmTimeout` naming both calls.
//!
//! **A slot is reused only after every peer checked the call it held.** Launches are
//! asynchronous (a rank may queue many calls its peers have not made yet), so a rank could
//! otherwise overwrite its record of call `k` with call `k + RECORD_SLOTS` before a slow peer
//! compared its own call `k` with it, and both would launch a mismatch. Each ring therefore
//! ends with a word counting the calls its owner has checked (stored with release after each
//! check, refused or not), and a rank writes call `k >= RECORD_SLOTS` only once every peer has
//! checked call `k - RECORD_SLOTS`, waiting for that at most the communicator's timeout, then
//! failing with `symmTimeout`. Each slot is also a small seqlock, so a record read while its
//! owner rewrites it is never taken: the call number is cleared, the signature written, the
//! number written last with release; a reader takes the record only when it reads the same,
//! expected number before and after the signature. A call number is never written twice.
//!
//! **The abort words.** The ring also holds its owner's abort word: every window of the rank
//! points its kernels at it ([`CallRecords::abort_flag`]; on the cuda backend the ring is
//! page-locked and mapped for the device), so that a rank that fails the communicator raises
//! the abort words of the ranks in other processes through their rings
//! ([`CallRecords::raise_peers`]), after it wrote its failure record: their pending kernels
//! give up at their next look, and their hosts then read the cause from the record.
//!
//! Not covered: ranks on other machines (their memory is not shared with this one; a mismatch
//! with them ends in a timeout without the peer's call named).

use super::{Call, Signature, disagreement, mismatch_message};
use crate::abi::symmResult_t;
use crate::backend::{Backend, Flag};
use crate::error::{Error, Result};
use crate::transport::link::RankLink;
use crate::transport::shm::SharedMemory;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

/// Records in each rank's ring.
pub(crate) const RECORD_SLOTS: usize = 1024;

/// Words of one record: the call number plus one (0: empty or being written), then the
/// signature.
const SLOT_WORDS: usize = 1 + Signature::WORDS;

/// Index of the word after the slots that counts the calls the ring's owner has checked.
const CHECKED_WORD: usize = RECORD_SLOTS * SLOT_WORDS;

/// Index of the word that says the ring's owner failed the communicator (see
/// [`crate::comm::failure`]): 0 while it works, [`FAILURE_WRITING`] while the owner writes its
/// message, else the error code plus one.
const FAILURE_WORD: usize = CHECKED_WORD + 1;

/// [`FAILURE_WORD`] while the message is being written.
const FAILURE_WRITING: u64 = u64::MAX;

/// Words of the failure message (UTF-8, cut to fit, zero-padded), after [`FAILURE_WORD`].
const FAILURE_TEXT_WORDS: usize = 96;

/// Index of the word whose low four bytes are the owner's abort word (a `u32` that kernels
/// read at system scope; see `symm_device::sync::abort`).
const ABORT_WORD: usize = FAILURE_WORD + 1 + FAILURE_TEXT_WORDS;

/// Index of the word its owner sets when it destroys its communicator: its process may then
/// exit without failing the communicator (see `comm::watch`).
const LEFT_WORD: usize = ABORT_WORD + 1;

/// Words of a ring.
const RING_WORDS: usize = LEFT_WORD + 1;

/// Bytes of a rank's ring: the slots, the checked-calls word, the failure record, the abort
/// word and the left word.
pub(crate) const RECORDS_BYTES: usize = RING_WORDS * 8;

/// The fd-passing sequence number of the rings (window registrations count up from 0, so
/// they never reach it).
const RECORDS_FD_SEQ: u64 = u64::MAX;

/// Most recent calls [`CallRecords::recent_conflict`] looks at.
const RECENT_CALLS: u64 = 64;

/// This rank's ring and those of the ranks in other processes of this machine.
pub struct CallRecords {
    /// This rank.
    rank: usize,
    /// The communicator's bound of every wait on a peer.
    timeout: Duration,
    /// The ring's registration for kernels (`None`: the backend's kernels cannot see it, and
    /// windows keep abort words of their own). Dropped before `own` (fields drop in order).
    device_view: Option<DeviceView>,
    /// This rank's ring.
    own: SharedMemory,
    /// Every rank's ring, by rank: `None` for this rank and the ranks of this process (whose
    /// calls the clique's call log compares).
    peers: Vec<Option<SharedMemory>>,
}

/// A ring made visible to the kernels of a device ([`Backend::register_host`]); dropping it
/// undoes that (the memory stays mapped).
struct DeviceView {
    backend: Arc<Backend>,
    device: i32,
    /// The ring's host address.
    host: u64,
    /// The ring's device address.
    address: u64,
}

impl DeviceView {
    /// Register `memory` for the kernels of `device`; `None` (windows then keep flags of their
    /// own, which peers cannot raise) when the backend's kernels cannot see host memory or the
    /// driver refuses it.
    fn register(
        backend: &Arc<Backend>,
        device: i32,
        memory: &SharedMemory,
        rank: usize,
    ) -> Option<DeviceView> {
        match backend.register_host(device, memory.address(), memory.len()) {
            Ok(address) => address.map(|address| DeviceView {
                backend: backend.clone(),
                device,
                host: memory.address(),
                address,
            }),
            Err(e) => {
                crate::log!(
                    crate::log::Level::Warn,
                    crate::log::Subsys::Init,
                    Some(rank),
                    "the call records cannot be mapped for the device ({}): a failure reaches \
                     the kernels of other processes at their timeout",
                    e.message
                );
                None
            }
        }
    }
}

impl Drop for DeviceView {
    fn drop(&mut self) {
        let _ = self.backend.unregister_host(self.device, self.host);
    }
}

impl CallRecords {
    /// Create this rank's ring and exchange rings with the ranks of other processes; `None`
    /// when every rank runs in this process or some rank runs on another machine (see the
    /// module documentation). Every rank of the communicator calls it at initialization.
    pub fn exchange(
        link: &RankLink,
        timeout: Duration,
        backend: &Arc<Backend>,
        device: i32,
    ) -> Result<Option<CallRecords>> {
        if !link.has_remote_peers()
            || link.export_kind() != crate::transport::shareable::ExportKind::FileDescriptor
        {
            return Ok(None);
        }
        let rank = link.rank as usize;
        let own = SharedMemory::create(RECORDS_BYTES, "symm-call-records")?;
        // Unregistered again if the exchange below fails (dropped before `own`).
        let device_view = DeviceView::register(backend, device, &own, rank);
        link.send_fds(RECORDS_FD_SEQ, &[own.fd()], timeout)?;
        let deadline = Instant::now() + timeout;
        let mut peers = Vec::with_capacity(link.peers.len());
        for peer in 0..link.peers.len() {
            if link.is_local(peer) {
                peers.push(None);
                continue;
            }
            let mut fds = link.receive_fds(RECORDS_FD_SEQ, peer as u32, 1, deadline)?;
            let fd = fds
                .pop()
                .ok_or_else(|| Error::internal(format!("rank {peer} sent no call records")))?;
            peers.push(Some(SharedMemory::import(fd, RECORDS_BYTES)?));
        }
        Ok(Some(CallRecords {
            rank,
            timeout,
            device_view,
            own,
            peers,
        }))
    }

    /// This rank's abort word in its ring, for its windows' kernels, when the backend's
    /// kernels can see the ring (see the module documentation).
    pub fn abort_flag(&self) -> Option<Flag> {
        let offset = (ABORT_WORD * 8) as u64;
        self.device_view.as_ref().map(|view| Flag {
            host: self.own.address() + offset,
            device: view.address + offset,
        })
    }

    /// Raise the abort word of every rank of another process to `value`, unless it is raised
    /// already (their kernels give up at their next look; a kernel's own report is kept).
    /// Call it after [`CallRecords::publish_failure`], so that a rank that sees its word raised
    /// finds the cause on record.
    pub fn raise_peers(&self, value: u32) {
        for memory in self.peers.iter().flatten() {
            Self::abort_word(memory).raise(value);
        }
    }

    /// Say that this rank leaves the communicator (`symmCommDestroy`): its process's exit from
    /// now on is no failure.
    pub fn leave(&self) {
        Self::words(&self.own)[LEFT_WORD].store(1, Ordering::Release);
    }

    /// Whether rank `peer`, of another process, has left the communicator ([`Self::leave`]);
    /// `false` for a rank of this process.
    pub fn peer_left(&self, peer: usize) -> bool {
        self.peers
            .get(peer)
            .and_then(Option::as_ref)
            .is_some_and(|memory| Self::words(memory)[LEFT_WORD].load(Ordering::Acquire) != 0)
    }

    /// The abort word in `memory`'s ring, as a flag of this process (host side only).
    fn abort_word(memory: &SharedMemory) -> Flag {
        let host = memory.address() + (ABORT_WORD * 8) as u64;
        Flag { host, device: host }
    }

    /// The words of `memory`'s ring.
    fn words(memory: &SharedMemory) -> &[AtomicU64] {
        // SAFETY: the mapping holds RECORDS_BYTES (checked at creation and import), page
        // aligned, so its RING_WORDS words are inside it and 8-byte aligned; the words
        // are only ever accessed atomically, by every process that maps them, and live as
        // long as `memory`.
        unsafe { std::slice::from_raw_parts(memory.as_ptr() as *const AtomicU64, RING_WORDS) }
    }

    /// The words of `memory`'s slot for call `seq`.
    fn slot(memory: &SharedMemory, seq: u64) -> &[AtomicU64] {
        let index = (seq % RECORD_SLOTS as u64) as usize;
        &Self::words(memory)[index * SLOT_WORDS..(index + 1) * SLOT_WORDS]
    }

    /// The word counting the calls `memory`'s owner has checked.
    fn checked(memory: &SharedMemory) -> &AtomicU64 {
        &Self::words(memory)[CHECKED_WORD]
    }

    /// Wait (at most the timeout) until every peer has checked call `seq - RECORD_SLOTS`, whose
    /// slot call `seq` reuses.
    fn wait_for_slot(&self, seq: u64) -> Result<()> {
        let Some(reused) = seq.checked_sub(RECORD_SLOTS as u64) else {
            return Ok(());
        };
        let deadline = Instant::now() + self.timeout;
        for (peer, memory) in self.peers.iter().enumerate() {
            let Some(memory) = memory else { continue };
            let mut spins = 0u32;
            while Self::checked(memory).load(Ordering::Acquire) <= reused {
                // A peer that failed the communicator never checks another call: its failure,
                // not the timeout, is the answer.
                if spins % 64 == 63
                    && let Some((rank, _, message)) = self.peer_failure()
                {
                    return Err(Error::new(
                        crate::abi::symmResult_t::symmRemoteError,
                        format!(
                            "rank {}: the communicator failed on rank {rank}: {message}",
                            self.rank
                        ),
                    ));
                }
                if Instant::now() >= deadline {
                    return Err(Error::new(
                        crate::abi::symmResult_t::symmTimeout,
                        format!(
                            "rank {}: collective #{seq} waited {} ms for rank {peer} (in another \
                             process) to make its collective #{reused}: ranks may be at most \
                             {RECORD_SLOTS} collectives apart",
                            self.rank,
                            self.timeout.as_millis()
                        ),
                    ));
                }
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        }
        Ok(())
    }

    /// Write `call` as this rank's call `seq`.
    fn publish(&self, seq: u64, call: &Call) {
        let slot = Self::slot(&self.own, seq);
        slot[0].store(0, Ordering::Relaxed);
        // Readers that see a signature word of this write also see the cleared number.
        fence(Ordering::Release);
        for (word, value) in slot[1..].iter().zip(call.to_words()) {
            word.store(value, Ordering::Relaxed);
        }
        slot[0].store(seq + 1, Ordering::Release);
    }

    /// The record of call `seq` in `memory`, when it is there and was not being rewritten.
    fn read(memory: &SharedMemory, seq: u64) -> Option<Call> {
        let slot = Self::slot(memory, seq);
        if slot[0].load(Ordering::Acquire) != seq + 1 {
            return None;
        }
        let mut words = [0u64; Signature::WORDS];
        for (value, word) in words.iter_mut().zip(&slot[1..]) {
            *value = word.load(Ordering::Relaxed);
        }
        fence(Ordering::Acquire);
        if slot[0].load(Ordering::Relaxed) != seq + 1 {
            return None;
        }
        Call::from_words(words)
    }

    /// The first peer whose call `seq` is on record and differs from `call`.
    fn conflict(&self, seq: u64, call: &Call) -> Option<(usize, Call)> {
        self.peers.iter().enumerate().find_map(|(peer, memory)| {
            let theirs = Self::read(memory.as_ref()?, seq)?;
            (!theirs.agrees_with(call)).then_some((peer, theirs))
        })
    }

    /// Record this rank's call `seq` and compare it with the peers' calls `seq` on record: an
    /// error naming both when one differs (the call must then not be launched, and the
    /// communicator is failed).
    pub fn agree(&self, seq: u64, call: &Call) -> Result<()> {
        // A rank that destroyed its communicator completed every call it made (its destroy
        // waited for them): no call of this rank can pair with it any more. When its call
        // `seq` is on record and differs from this one (a refusal, say), that difference is
        // the cause, and this rank names it.
        if let Some(peer) = (0..self.peers.len()).find(|peer| self.peer_left(*peer)) {
            if let Some((peer, theirs)) = self.conflict(seq, call) {
                return Err(disagreement(seq, self.rank, call, peer, &theirs, true));
            }
            return Err(Error::new(
                symmResult_t::symmRemoteError,
                format!(
                    "rank {}'s collective #{seq} cannot be made: rank {peer} (in another \
                     process) destroyed its communicator; the communicator is failed on every \
                     rank",
                    self.rank
                ),
            ));
        }
        self.wait_for_slot(seq)?;
        self.publish(seq, call);
        // Between the write above and the reads below: see the module documentation.
        fence(Ordering::SeqCst);
        let conflict = self.conflict(seq, call);
        // Checked (refused or not): the peers may reuse the slots of calls up to `seq`.
        Self::checked(&self.own).store(seq + 1, Ordering::Release);
        match conflict {
            None => Ok(()),
            Some((peer, theirs)) => Err(disagreement(seq, self.rank, call, peer, &theirs, true)),
        }
    }

    /// Whether every peer has checked its call `seq` against the calls on record (then a call
    /// of this rank under that number that differs from a peer's has been found by one side).
    pub fn peers_checked(&self, seq: u64) -> bool {
        self.peers
            .iter()
            .flatten()
            .all(|memory| Self::checked(memory).load(Ordering::Acquire) > seq)
    }

    /// Tell the ranks of other processes that this rank failed the communicator with `code`
    /// and `message` (see [`crate::comm::failure`]); only the first failure is written.
    pub fn publish_failure(&self, code: symmResult_t, message: &str) {
        let words = Self::words(&self.own);
        if let Err(state) = words[FAILURE_WORD].compare_exchange(
            0,
            FAILURE_WRITING,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // Another thread of this rank writes its failure: return once it is on record, so
            // that the caller's raise of the peers' words comes after it (at most a second:
            // the writer stores a few hundred bytes).
            let deadline = Instant::now() + Duration::from_secs(1);
            let mut state = state;
            while state == FAILURE_WRITING && Instant::now() < deadline {
                std::thread::yield_now();
                state = words[FAILURE_WORD].load(Ordering::Acquire);
            }
            return;
        }
        let mut text = [0u8; FAILURE_TEXT_WORDS * 8];
        let mut length = message.len().min(text.len());
        while !message.is_char_boundary(length) {
            length -= 1;
        }
        text[..length].copy_from_slice(&message.as_bytes()[..length]);
        for (word, chunk) in words[FAILURE_WORD + 1..].iter().zip(text.chunks_exact(8)) {
            let value = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
            word.store(value, Ordering::Relaxed);
        }
        words[FAILURE_WORD].store(code as u64 + 1, Ordering::Release);
    }

    /// The first rank of another process that failed the communicator, with its error code
    /// and message. A rank caught writing its message is waited for (a few microseconds of
    /// stores); one still writing after a millisecond is passed over this time.
    pub fn peer_failure(&self) -> Option<(usize, symmResult_t, String)> {
        self.peers.iter().enumerate().find_map(|(peer, memory)| {
            let words = Self::words(memory.as_ref()?);
            let deadline = Instant::now() + Duration::from_millis(1);
            let mut state = words[FAILURE_WORD].load(Ordering::Acquire);
            while state == FAILURE_WRITING && Instant::now() < deadline {
                std::hint::spin_loop();
                state = words[FAILURE_WORD].load(Ordering::Acquire);
            }
            if state == 0 || state == FAILURE_WRITING {
                return None;
            }
            let mut text = Vec::with_capacity(FAILURE_TEXT_WORDS * 8);
            for word in &words[FAILURE_WORD + 1..FAILURE_WORD + 1 + FAILURE_TEXT_WORDS] {
                text.extend_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
            }
            let end = text.iter().position(|b| *b == 0).unwrap_or(text.len());
            let message = String::from_utf8_lossy(&text[..end]).into_owned();
            let code =
                symmResult_t::from_raw((state - 1) as i32).unwrap_or(symmResult_t::symmRemoteError);
            Some((
                peer,
                code,
                format!("{message} (rank {peer} runs in another process)"),
            ))
        })
    }

    /// A description of the latest disagreement among this rank's calls before `next_seq`
    /// (the last [`RECENT_CALLS`] of them) and the peers' records: what a timed-out rank
    /// names.
    pub fn recent_conflict(&self, next_seq: u64) -> Option<String> {
        (next_seq.saturating_sub(RECENT_CALLS)..next_seq)
            .rev()
            .find_map(|seq| {
                let own = Self::read(&self.own, seq)?;
                let (peer, theirs) = self.conflict(seq, &own)?;
                Some(mismatch_message(seq, self.rank, &own, peer, &theirs))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agree::{BufferAt, NO_BUFFER};
    use crate::plan::Collective;
    use symm_device::symmetric::Algorithm;
    use symm_device::{DataType, RedOp};

    /// Two ranks "in two processes": each maps the other's ring through a duplicate of its fd.
    fn pair() -> (CallRecords, CallRecords) {
        let a = SharedMemory::create(RECORDS_BYTES, "test-records-a").unwrap();
        let b = SharedMemory::create(RECORDS_BYTES, "test-records-b").unwrap();
        let a_seen = SharedMemory::import(a.fd().try_clone_to_owned().unwrap(), RECORDS_BYTES);
        let b_seen = SharedMemory::import(b.fd().try_clone_to_owned().unwrap(), RECORDS_BYTES);
        (
            CallRecords {
                rank: 0,
                timeout: Duration::from_millis(200),
                device_view: None,
                own: a,
                peers: vec![None, Some(b_seen.unwrap())],
            },
            CallRecords {
                rank: 1,
                timeout: Duration::from_millis(200),
                device_view: None,
                own: b,
                peers: vec![Some(a_seen.unwrap()), None],
            },
        )
    }

    /// A signature from its parts (through the words, as a peer reads it).
    fn signature(collective: usize, algorithm: usize, count: u64) -> Signature {
        let word = collective as u64
            | (algorithm as u64) << 8
            | (DataType::Float32 as u64) << 16
            | (RedOp::Sum as u64) << 24
            | 4u64 << 32;
        Signature::from_words(words([word, count, 1 << 48])).unwrap()
    }

    /// The words of a signature whose first three are `first` and whose buffers are unused.
    fn words(first: [u64; 3]) -> [u64; Signature::WORDS] {
        [
            first[0], first[1], first[2], NO_BUFFER, 0, NO_BUFFER, 0, 0, NO_BUFFER, 0, 0, 0, 0,
        ]
    }

    /// A made call of [`signature`].
    fn made(collective: usize, algorithm: usize, count: u64) -> Call {
        Call::Made(signature(collective, algorithm, count))
    }

    /// `true` when `read` is `expected` (a made call with that signature).
    fn is_made(read: Option<Call>, expected: Signature) -> bool {
        matches!(read, Some(Call::Made(s)) if s == expected)
    }

    #[test]
    fn signatures_survive_their_words() {
        for c in 0..Collective::ALL.len() {
            for a in 0..Algorithm::ALL.len() {
                let s = signature(c, a, 12345);
                assert_eq!(Signature::from_words(s.to_words()), Some(s));
            }
        }
        // The root travels too (a broadcast's).
        let rooted = Signature {
            root: 7,
            ..signature(Collective::ALL.len() - 1, Algorithm::ALL.len() - 1, 9)
        };
        assert_eq!(
            Signature::from_words(rooted.to_words()),
            Some(rooted.clone())
        );
        // So does the place in a fused launch.
        let fused = rooted.clone().in_batch(2, 5);
        assert_eq!(Signature::from_words(fused.to_words()), Some(fused.clone()));
        assert_ne!(fused, rooted.in_batch(1, 5));
        // So do the buffers' places and in place.
        let placed = Signature {
            send: Some(BufferAt {
                window: 3,
                offset: 64,
            }),
            recv: Some(BufferAt {
                window: 0,
                offset: 0,
            }),
            in_place: true,
            staged: Some(crate::plan::staging::ChunkOf {
                count: 5000,
                first: 992,
            }),
            ..fused.clone()
        };
        assert_eq!(
            Signature::from_words(placed.to_words()),
            Some(placed.clone())
        );
        // So does an all-to-all-v's count table.
        let counted = Signature {
            counts: Some(crate::agree::CountsAt {
                window: 5,
                offset: 4096,
                send_count: 77,
            }),
            ..placed
        };
        assert_eq!(
            Signature::from_words(counted.to_words()),
            Some(counted.clone())
        );
        // A place outside its launch is not one.
        assert_eq!(Signature::from_words(words([0, 1, 0])), None);
        assert_eq!(
            Signature::from_words(words([0, 1, 3 << 32 | 3 << 48])),
            None
        );
        // Words that name nothing are not a signature.
        assert_eq!(Signature::from_words(words([0xFF, 1, 0])), None);
        assert_eq!(Signature::from_words(words([0xFF << 8, 1, 0])), None);
        assert_eq!(Signature::from_words(words([0, 1, u64::MAX])), None);
    }

    #[test]
    fn agreeing_calls_pass_and_a_disagreement_is_named_by_both_ranks() {
        let (a, b) = pair();
        for seq in 0..5 {
            a.agree(seq, &made(0, 0, 64)).unwrap();
            b.agree(seq, &made(0, 0, 64)).unwrap();
        }
        assert_eq!(a.recent_conflict(5), None);
        // Rank 0 calls first (and would launch); rank 1 makes another call: refused.
        a.agree(5, &made(0, 0, 64)).unwrap();
        let refused = b.agree(5, &made(0, 0, 128)).unwrap_err();
        assert!(
            refused.message.contains("rank 1's collective #5")
                && refused.message.contains("rank 0's is"),
            "{}",
            refused.message
        );
        // Rank 0's timeout names both calls.
        let named = a.recent_conflict(6).unwrap();
        assert!(
            named.contains("of 64") && named.contains("of 128"),
            "{named}"
        );
    }

    /// Calls whose buffers lie at different offsets, or in different windows, disagree
    /// across processes too, and the refusal names the difference.
    #[test]
    fn calls_at_different_window_offsets_disagree() {
        let (a, b) = pair();
        let at = |window, offset| {
            Call::Made(Signature {
                send: Some(BufferAt { window, offset }),
                ..signature(0, 0, 64)
            })
        };
        a.agree(0, &at(1, 256)).unwrap();
        b.agree(0, &at(1, 256)).unwrap();
        a.agree(1, &at(1, 0)).unwrap();
        let refused = b.agree(1, &at(1, 4)).unwrap_err();
        assert!(
            refused
                .message
                .contains("send buffer at window offset 4 vs 0"),
            "{}",
            refused.message
        );
        a.agree(2, &at(1, 0)).unwrap();
        let refused = b.agree(2, &at(2, 0)).unwrap_err();
        assert!(
            refused
                .message
                .contains("send buffer in window registration #2 vs #1"),
            "{}",
            refused.message
        );
    }

    /// A rank a ring's length ahead waits for its peer before it reuses a slot the peer has
    /// not checked against (else both could launch a mismatch), and times out when the peer
    /// does not get there.
    #[test]
    fn a_slot_is_reused_only_after_the_peer_checked_it() {
        let (a, b) = pair();
        let slots = RECORD_SLOTS as u64;
        for seq in 0..slots {
            a.agree(seq, &made(0, 0, 8)).unwrap();
        }
        // Rank 1 has checked nothing: rank 0 may not overwrite its record of call 0.
        let early = a.agree(slots, &made(0, 0, 8)).unwrap_err();
        assert_eq!(early.code, crate::abi::symmResult_t::symmTimeout);
        assert!(early.message.contains("rank 1"), "{}", early.message);
        // Rank 1's call 0 differs: still caught, since the record is still there.
        assert!(b.agree(0, &made(1, 4, 8)).is_err());
        // Rank 1 has checked call 0: rank 0 goes on, and slot 0 now holds its call `slots`.
        a.agree(slots, &made(0, 0, 8)).unwrap();
        assert!(CallRecords::read(&a.own, 0).is_none());
        assert!(is_made(
            CallRecords::read(&a.own, slots),
            signature(0, 0, 8)
        ));
    }

    /// A refused call is a call: refusals agree with each other and disagree with a made
    /// call, in both orders.
    #[test]
    fn a_refused_call_agrees_only_with_a_refusal() {
        let (a, b) = pair();
        a.agree(0, &Call::Refused("bad sendbuff".into())).unwrap();
        b.agree(0, &Call::Refused(String::new())).unwrap();
        a.agree(1, &made(0, 0, 64)).unwrap();
        let refused = b
            .agree(1, &Call::Refused("count too large".into()))
            .unwrap_err();
        assert!(
            refused
                .message
                .contains("rank 1's collective #1 was refused (count too large)")
                && refused.message.contains("rank 0's is symmAllReduce"),
            "{}",
            refused.message
        );
        b.agree(2, &Call::Refused(String::new())).unwrap();
        let made_late = a.agree(2, &made(0, 0, 64)).unwrap_err();
        assert!(
            made_late.message.contains("rank 1's was refused"),
            "{}",
            made_late.message
        );
    }

    /// A peer that refused its call and then left: the next rank to make that call names the
    /// refusal, not only the departure; a call past the peer's last names its departure.
    #[test]
    fn a_departed_peer_s_refusal_is_named() {
        let (a, b) = pair();
        b.agree(0, &Call::Refused("recvbuff is NULL".into()))
            .unwrap();
        b.leave();
        let refused = a.agree(0, &made(0, 0, 64)).unwrap_err();
        assert!(
            refused.message.contains("rank 1's was refused"),
            "{}",
            refused.message
        );
        let left = a.agree(1, &made(0, 0, 64)).unwrap_err();
        assert!(
            left.message.contains("destroyed its communicator"),
            "{}",
            left.message
        );
    }

    /// A failing rank raises the abort word in its peer's ring (which the peer's windows
    /// point their kernels at), after its failure record; a word raised already keeps its
    /// first cause. A rank waiting to reuse a slot the failed peer will never check gets the
    /// peer's failure, not a timeout.
    #[test]
    fn a_failing_rank_raises_the_peers_abort_word() {
        let (a, b) = pair();
        let word = |r: &CallRecords| CallRecords::abort_word(&r.own).read();
        assert_eq!((word(&a), word(&b)), (0, 0));
        a.publish_failure(symmResult_t::symmInvalidUsage, "rank 0: a mismatch");
        a.raise_peers(symm_device::symmetric::ABORT_PEER_FAILED);
        assert_eq!(word(&b), symm_device::symmetric::ABORT_PEER_FAILED);
        assert_eq!(
            word(&a),
            0,
            "a rank's own word is raised by its clique, not here"
        );
        assert!(b.peer_failure().is_some());
        // A word raised already (a kernel's timeout) keeps its cause.
        let (c, d) = pair();
        CallRecords::abort_word(&d.own).raise(1);
        c.raise_peers(symm_device::symmetric::ABORT_PEER_FAILED);
        assert_eq!(word(&d), 1);
        // Rank 1 waits for rank 0 to check call 0 before reusing its slot; rank 0 failed.
        let (e, f) = pair();
        for seq in 0..RECORD_SLOTS as u64 {
            f.agree(seq, &made(0, 0, 8)).unwrap();
        }
        e.publish_failure(symmResult_t::symmTimeout, "rank 0: rank 2 did not arrive");
        let started = Instant::now();
        let failed = f.agree(RECORD_SLOTS as u64, &made(0, 0, 8)).unwrap_err();
        assert_eq!(failed.code, symmResult_t::symmRemoteError);
        assert!(
            failed
                .message
                .contains("failed on rank 0: rank 0: rank 2 did not arrive"),
            "{}",
            failed.message
        );
        assert!(
            started.elapsed() < Duration::from_millis(150),
            "{:?}",
            started.elapsed()
        );
    }

    /// A failure is written once and read by the peer with its code and message.
    #[test]
    fn a_failure_record_reaches_the_peer() {
        let (a, b) = pair();
        assert_eq!(b.peer_failure(), None);
        a.publish_failure(symmResult_t::symmTimeout, "rank 0: rank 1 did not arrive");
        a.publish_failure(
            symmResult_t::symmInvalidUsage,
            "a second failure is not kept",
        );
        let (rank, code, message) = b.peer_failure().unwrap();
        assert_eq!((rank, code), (0, symmResult_t::symmTimeout));
        assert!(
            message.starts_with("rank 0: rank 1 did not arrive"),
            "{message}"
        );
        // A rank's own record is not a peer's failure.
        assert_eq!(a.peer_failure(), None);
        // A message longer than the record is cut at a character boundary.
        let (c, d) = pair();
        c.publish_failure(symmResult_t::symmRemoteError, &"é".repeat(1000));
        let (_, _, long) = d.peer_failure().unwrap();
        assert!(
            long.starts_with("éé") && long.len() < 1000,
            "{}",
            long.len()
        );
    }
}
