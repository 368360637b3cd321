//! A rank's link to the other ranks of a communicator made by `symmCommInitRank`: its
//! bootstrap connection (all-gathers through the root), its Unix socket for receiving file
//! descriptors from ranks in other processes, and what every rank told about itself when it
//! joined ([`PeerInfo`]).
//!
//! Window registration on such a communicator ([`crate::window`]) is an all-gather of
//! [`WindowDeposit`]s; a rank in another process also sends, over the fd socket, the file
//! descriptors of its window's memory and signal pad ([`FdHeader`]), which the receiver maps.
//! Ranks in the same process use each other's addresses directly.

use crate::abi::symmResult_t;
use crate::error::{Error, Result};
use crate::transport::bootstrap::{Client, UniqueId, auth};
use crate::transport::fdpass::{FdListener, ReceivedFds};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Version byte of [`PeerInfo`] and the other messages of this module: processes of different
/// builds must not join. 5: a [`PeerInfo`] carries its PID namespace (3: an [`FdHeader`]
/// carries a tag instead of the communicator's secret; 2: the call records count all-gathers
/// in elements; 1: bytes).
const VERSION: u8 = 6;
/// Longest fd-socket name accepted from a peer.
const MAX_SOCKET_NAME: usize = 107;
/// All-gather tag of the init exchange (block caps); registration `seq` tags are below it.
pub const INIT_TAG: u64 = u64::MAX;

/// What a rank tells the others when it joins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// Its process id (for messages; PID namespaces make it ambiguous).
    pub pid: u32,
    /// Its PID namespace ([`pid_namespace`]; 0 when unknown): `pid` names its process here
    /// only when this is this process's namespace too.
    pub pid_namespace: u64,
    /// A random identity of its process ([`process_identity`]): ranks with equal identities
    /// share an address space.
    pub process: [u8; 16],
    /// Identity of its machine (the kernel's boot id): ranks with equal ids share a node.
    pub node: [u8; 16],
    /// Its backend (`BackendKind` as a byte: 0 host, 1 cuda, 2 model).
    pub backend: u8,
    /// Its device ordinal, in its own process.
    pub device: i32,
    /// Its GPU's UUID (`cuDeviceGetUuid`): equal on two ranks of one node when they share a
    /// physical GPU, whatever their processes call it. All zeros when there is no GPU (host
    /// and model backends).
    pub gpu: [u8; 16],
    /// Abstract name of its fd socket.
    pub socket: Vec<u8>,
}

impl PeerInfo {
    /// Wire form: version, pid, PID namespace, process, node, backend, device, GPU UUID, name
    /// length, name.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(67 + self.socket.len());
        out.push(VERSION);
        out.extend_from_slice(&self.pid.to_le_bytes());
        out.extend_from_slice(&self.pid_namespace.to_le_bytes());
        out.extend_from_slice(&self.process);
        out.extend_from_slice(&self.node);
        out.push(self.backend);
        out.extend_from_slice(&self.device.to_le_bytes());
        out.extend_from_slice(&self.gpu);
        out.push(self.socket.len() as u8);
        out.extend_from_slice(&self.socket);
        out
    }

    /// Parse and check a peer's info (`rank` names it in errors).
    pub fn decode(bytes: &[u8], rank: usize) -> Result<PeerInfo> {
        let bad = |what: &str| {
            Error::internal(format!(
                "rank {rank} sent malformed join information ({what})"
            ))
        };
        let mut r = Reader::new(bytes);
        if r.u8().ok_or_else(|| bad("empty"))? != VERSION {
            return Err(bad("version"));
        }
        let pid = r.u32().ok_or_else(|| bad("pid"))?;
        let pid_namespace = r.u64().ok_or_else(|| bad("pid namespace"))?;
        let process = r.array::<16>().ok_or_else(|| bad("process"))?;
        let node = r.array::<16>().ok_or_else(|| bad("node"))?;
        let backend = r.u8().ok_or_else(|| bad("backend"))?;
        if backend > 2 {
            return Err(bad("backend"));
        }
        let device = r.u32().ok_or_else(|| bad("device"))? as i32;
        let gpu = r.array::<16>().ok_or_else(|| bad("gpu"))?;
        let len = r.u8().ok_or_else(|| bad("socket name"))? as usize;
        if len == 0 || len > MAX_SOCKET_NAME {
            return Err(bad("socket name length"));
        }
        let socket = r.bytes(len).ok_or_else(|| bad("socket name"))?.to_vec();
        if !r.done() {
            return Err(bad("trailing bytes"));
        }
        Ok(PeerInfo {
            pid,
            pid_namespace,
            process,
            node,
            backend,
            device,
            gpu,
            socket,
        })
    }

    /// `true` when this rank and `other` run on one physical GPU: the same machine and GPU
    /// UUID, or (with no UUID known) the same process and device ordinal.
    pub fn shares_gpu_with(&self, other: &PeerInfo) -> bool {
        if self.node != other.node {
            return false;
        }
        if self.gpu != [0; 16] && other.gpu != [0; 16] {
            return self.gpu == other.gpu;
        }
        self.process == other.process && self.device == other.device
    }
}

/// The ranks of `peers` on the physical GPU of rank `rank` (itself included), in rank order.
pub fn ranks_on_same_gpu(peers: &[PeerInfo], rank: usize) -> Vec<usize> {
    (0..peers.len())
        .filter(|&r| peers[rank].shares_gpu_with(&peers[r]))
        .collect()
}

/// The most ranks of `peers` on one physical GPU (at least 1): what every rank computes alike
/// from the peers it was told at bootstrap, so that every rank plans alike.
pub fn most_ranks_on_one_gpu(peers: &[PeerInfo]) -> u32 {
    (0..peers.len())
        .map(|r| ranks_on_same_gpu(peers, r).len() as u32)
        .max()
        .unwrap_or(1)
        .max(1)
}

/// One rank's part of a window registration, all-gathered under the registration's number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowDeposit {
    /// Window base in the rank's own address space (used by ranks of the same process).
    pub base: u64,
    /// Window size in bytes.
    pub size: u64,
    /// Signal pad address in the rank's own address space.
    pub signal_pad: u64,
    /// Who owns the window's memory (`window::owner::OwnerKind`'s code), and where the window
    /// lies in it.
    pub owner: (u8, u64),
    /// The rank refused its description of the registration: every rank's fails.
    pub refused: bool,
    /// How ranks of other processes map the window ([`crate::transport::shareable`]; empty when every
    /// rank is in one process).
    pub window_export: Vec<u8>,
    /// How they map the signal pad.
    pub pad_export: Vec<u8>,
}

impl WindowDeposit {
    /// Wire form: version, base, size, signal pad, owner code, owner offset, then each export
    /// as `u16` length + bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(35 + 4 + self.window_export.len() + self.pad_export.len());
        out.push(VERSION);
        for v in [self.base, self.size, self.signal_pad] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.push(self.owner.0);
        out.extend_from_slice(&self.owner.1.to_le_bytes());
        out.push(self.refused as u8);
        for export in [&self.window_export, &self.pad_export] {
            out.extend_from_slice(&(export.len() as u16).to_le_bytes());
            out.extend_from_slice(export);
        }
        out
    }

    /// Parse a rank's deposit.
    pub fn decode(bytes: &[u8], rank: usize) -> Result<WindowDeposit> {
        let bad = || Error::internal(format!("rank {rank} sent a malformed window registration"));
        let mut r = Reader::new(bytes);
        if r.u8().ok_or_else(bad)? != VERSION {
            return Err(bad());
        }
        let base = r.u64().ok_or_else(bad)?;
        let size = r.u64().ok_or_else(bad)?;
        let signal_pad = r.u64().ok_or_else(bad)?;
        let owner = (r.u8().ok_or_else(bad)?, r.u64().ok_or_else(bad)?);
        let refused = match r.u8().ok_or_else(bad)? {
            0 => false,
            1 => true,
            _ => return Err(bad()),
        };
        let mut export = || -> Result<Vec<u8>> {
            let len = u16::from_le_bytes(r.array::<2>().ok_or_else(bad)?) as usize;
            if len > crate::transport::shareable::MAX_EXPORT_BYTES {
                return Err(bad());
            }
            Ok(r.bytes(len).ok_or_else(bad)?.to_vec())
        };
        let window_export = export()?;
        let pad_export = export()?;
        if !r.done() {
            return Err(bad());
        }
        Ok(WindowDeposit {
            base,
            size,
            signal_pad,
            owner,
            refused,
            window_export,
            pad_export,
        })
    }
}

/// Header of the message that carries a window's file descriptors (its allocation, then its
/// signal pad) to a rank in another process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdHeader {
    /// Registration number.
    pub seq: u64,
    /// Sending rank.
    pub source: u32,
    /// [`crate::transport::bootstrap::auth::fd_tag`] of the communicator's secret and session,
    /// `seq`, `source` and the receiving rank: the receiver drops a message whose tag does not
    /// check. (Not the secret: it never leaves the process.)
    pub tag: [u8; 32],
}

impl FdHeader {
    const BYTES: usize = 1 + 8 + 4 + 32;

    /// Wire form.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::BYTES);
        out.push(VERSION);
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.source.to_le_bytes());
        out.extend_from_slice(&self.tag);
        out
    }

    /// Parse a header.
    pub fn decode(bytes: &[u8]) -> Option<FdHeader> {
        if bytes.len() != Self::BYTES || bytes[0] != VERSION {
            return None;
        }
        let mut r = Reader::new(&bytes[1..]);
        Some(FdHeader {
            seq: r.u64()?,
            source: r.u32()?,
            tag: r.array::<32>()?,
        })
    }
}

/// Bounded little-endian reader over untrusted bytes.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Some(head)
    }
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.bytes(N)?.try_into().ok()
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.bytes(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.array::<4>()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.array::<8>()?))
    }
    fn done(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// A random identity of this process, the same for all its ranks: unlike the pid, it tells
/// processes apart across PID namespaces (containers on one machine). A child made by `fork`
/// draws its own (its pid differs from the one the identity was drawn in), so that ranks in
/// two children of one parent never take each other for ranks of one process.
pub fn process_identity() -> Result<[u8; 16]> {
    static IDENTITY: std::sync::Mutex<Option<(u32, [u8; 16])>> = std::sync::Mutex::new(None);
    let pid = std::process::id();
    let mut identity = IDENTITY.lock().unwrap_or_else(|e| e.into_inner());
    match *identity {
        Some((drawn_in, id)) if drawn_in == pid => Ok(id),
        _ => {
            let random = crate::transport::bootstrap::random_secret()?;
            let id: [u8; 16] = random[..16].try_into().expect("16 bytes");
            *identity = Some((pid, id));
            Ok(id)
        }
    }
}

/// This process's PID namespace: the inode of `/proc/self/ns/pid` (0 when it cannot be read).
/// Two processes whose namespaces are equal name each other by the same pid.
pub fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// The identity of this machine: the kernel's boot id (random per boot), so that ranks can
/// tell whether they share a node; with `SYMM_HOST_ID` set, the first 16 bytes of its SHA-256
/// instead (processes of one machine then play several machines, for tests).
pub fn node_id() -> [u8; 16] {
    if let Some(host) = crate::config::host_id() {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(host.as_bytes());
        let mut id = [0u8; 16];
        id.copy_from_slice(&digest[..16]);
        return id;
    }
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let hex: Vec<u8> = text
        .bytes()
        .filter(u8::is_ascii_hexdigit)
        .map(|c| (c as char).to_digit(16).unwrap_or(0) as u8)
        .collect();
    let mut id = [0u8; 16];
    for (i, pair) in hex.chunks(2).take(16).enumerate() {
        id[i] = pair[0] << 4 | pair.get(1).copied().unwrap_or(0);
    }
    id
}

/// File descriptors received for registrations, by (registration, source rank).
type Stash = HashMap<(u64, u32), Vec<OwnedFd>>;

/// One rank's link (see the module docs).
pub struct RankLink {
    /// This rank.
    pub rank: u32,
    /// The communicator's unique id.
    pub id: UniqueId,
    /// Every rank's join information, by rank.
    pub peers: Vec<PeerInfo>,
    /// The communicator's session ([`Client::session`]).
    session: [u8; 32],
    client: Client,
    listener: FdListener,
    stash: Mutex<Stash>,
}

impl RankLink {
    /// A link over a joined bootstrap `client` and this rank's fd `listener`.
    pub fn new(
        rank: u32,
        id: UniqueId,
        peers: Vec<PeerInfo>,
        client: Client,
        listener: FdListener,
    ) -> Self {
        RankLink {
            rank,
            id,
            peers,
            session: *client.session(),
            client,
            listener,
            stash: Mutex::new(HashMap::new()),
        }
    }

    /// The communicator's session ([`Client::session`]): random for every communicator.
    pub fn session(&self) -> &[u8; 32] {
        &self.session
    }

    /// `true` when rank `peer` runs in this process.
    pub fn is_local(&self, peer: usize) -> bool {
        self.peers[peer].process == self.peers[self.rank as usize].process
    }

    /// `true` when some rank runs in another process.
    pub fn has_remote_peers(&self) -> bool {
        (0..self.peers.len()).any(|p| !self.is_local(p))
    }

    /// How this rank hands memory to ranks of other processes: file descriptors when they all
    /// run on this machine, else CUDA fabric handles (multi-node NVLink domains).
    pub fn export_kind(&self) -> crate::transport::shareable::ExportKind {
        let own = &self.peers[self.rank as usize].node;
        if self.peers.iter().all(|p| &p.node == own) {
            crate::transport::shareable::ExportKind::FileDescriptor
        } else {
            crate::transport::shareable::ExportKind::Fabric
        }
    }

    /// The address of this rank's end of its connection to the root (an interface the
    /// root's machine reaches).
    pub fn local_ip(&self) -> Option<std::net::IpAddr> {
        self.client.local_ip()
    }

    /// Contribute `payload` to the all-gather `tag` (returns at once).
    pub fn contribute(&self, tag: u64, payload: &[u8]) -> Result<()> {
        self.client.contribute(tag, payload)
    }

    /// Every rank's contribution to `tag`, by rank.
    pub fn gathered(&self, tag: u64, timeout: Duration) -> Result<Vec<Vec<u8>>> {
        self.client.gathered(tag, timeout)
    }

    /// The bootstrap connection to the root (for what only the root relays: see
    /// [`Client::fail`] and [`Client::poll`]).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Send `fds` of registration `seq` to every rank in another process.
    pub fn send_fds(
        &self,
        seq: u64,
        fds: &[std::os::fd::BorrowedFd<'_>],
        timeout: Duration,
    ) -> Result<()> {
        for (peer, info) in self.peers.iter().enumerate() {
            if !self.is_local(peer) {
                let header = FdHeader {
                    seq,
                    source: self.rank,
                    tag: auth::fd_tag(self.id.secret(), &self.session, seq, self.rank, peer as u32),
                }
                .encode();
                crate::transport::fdpass::send_fds(&info.socket, &header, fds, timeout).map_err(
                    |e| {
                        Error::new(
                            e.code,
                            format!(
                                "rank {}: sending window memory to rank {peer}: {}",
                                self.rank, e.message
                            ),
                        )
                    },
                )?;
            }
        }
        Ok(())
    }

    /// The `count` file descriptors that rank `source` (in another process) sent for
    /// registration `seq`. Messages for other registrations are kept for later; messages that
    /// do not come from a rank of this communicator are dropped.
    pub fn receive_fds(
        &self,
        seq: u64,
        source: u32,
        count: usize,
        deadline: Instant,
    ) -> Result<Vec<OwnedFd>> {
        loop {
            if let Some(fds) = self.lock_stash().remove(&(seq, source)) {
                if fds.len() != count {
                    return Err(Error::internal(format!(
                        "rank {source} sent {} file descriptors for window #{seq}, not {count}",
                        fds.len()
                    )));
                }
                return Ok(fds);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::new(
                    symmResult_t::symmTimeout,
                    format!(
                        "rank {}: rank {source} did not send its window #{seq} memory in time",
                        self.rank
                    ),
                ));
            }
            match self.listener.receive(deadline - now) {
                Ok(received) => self.accept(received),
                Err(e) if e.code == symmResult_t::symmTimeout => {}
                // A malformed connection is that connection's problem: keep listening.
                Err(_) => {}
            }
        }
    }

    /// Send `bytes` under number `seq` to rank `peer` of another process of this machine (in
    /// a memory file whose descriptor goes as [`RankLink::send_fds`] sends window memory, so
    /// authenticated the same way).
    pub fn send_bytes(&self, seq: u64, peer: usize, bytes: &[u8], timeout: Duration) -> Result<()> {
        let file = memory_file_with(bytes)?;
        let header = FdHeader {
            seq,
            source: self.rank,
            tag: auth::fd_tag(self.id.secret(), &self.session, seq, self.rank, peer as u32),
        }
        .encode();
        use std::os::fd::AsFd;
        crate::transport::fdpass::send_fds(
            &self.peers[peer].socket,
            &header,
            &[file.as_fd()],
            timeout,
        )
    }

    /// The bytes rank `source` (of another process) sent under number `seq` with
    /// [`RankLink::send_bytes`], waiting until `deadline`.
    pub fn receive_bytes(&self, seq: u64, source: u32, deadline: Instant) -> Result<Vec<u8>> {
        let fd = self
            .receive_fds(seq, source, 1, deadline)?
            .pop()
            .expect("one descriptor");
        let mut file = std::fs::File::from(fd);
        let mut bytes = Vec::new();
        use std::io::{Read, Seek};
        file.seek(std::io::SeekFrom::Start(0))
            .and_then(|_| file.take(1 << 16).read_to_end(&mut bytes))
            .map_err(|e| {
                Error::new(
                    symmResult_t::symmSystemError,
                    format!("reading what rank {source} sent: {e}"),
                )
            })?;
        Ok(bytes)
    }

    /// Keep `received` if it comes from a rank of this communicator, else drop it (closing
    /// its descriptors).
    fn accept(&self, received: ReceivedFds) {
        let Some(header) = FdHeader::decode(&received.header) else {
            return;
        };
        // The tag authenticates the sender (and the fd socket admits only our uid); the pid
        // is not compared, since PID namespaces make it ambiguous.
        let known_sender =
            (header.source as usize) < self.peers.len() && !self.is_local(header.source as usize);
        if known_sender
            && auth::verify_fd_tag(
                self.id.secret(),
                &self.session,
                header.seq,
                header.source,
                self.rank,
                &header.tag,
            )
        {
            self.lock_stash()
                .insert((header.seq, header.source), received.fds);
        }
    }

    /// Drop (close) the descriptors received for registrations up to `seq` that nobody took
    /// (a registration that failed part-way).
    pub fn forget_fds_up_to(&self, seq: u64) {
        self.lock_stash().retain(|(s, _), _| *s > seq);
    }

    fn lock_stash(&self) -> std::sync::MutexGuard<'_, Stash> {
        self.stash.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Leave the bootstrap (at destroy).
    pub fn leave(self) {
        self.client.leave();
    }
}

/// A memory file (`memfd_create`) holding `bytes`.
fn memory_file_with(bytes: &[u8]) -> Result<OwnedFd> {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    // SAFETY: a NUL-terminated name; the flags are valid.
    let fd = unsafe { libc::memfd_create(c"symm-bytes".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(Error::new(
            symmResult_t::symmSystemError,
            format!("memfd_create failed: {}", std::io::Error::last_os_error()),
        ));
    }
    // SAFETY: a descriptor just created, owned by nobody else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(owned);
    file.write_all(bytes).map_err(|e| {
        Error::new(
            symmResult_t::symmSystemError,
            format!("writing a memory file: {e}"),
        )
    })?;
    Ok(OwnedFd::from(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> PeerInfo {
        PeerInfo {
            pid: 4242,
            pid_namespace: 4026531836,
            process: [5; 16],
            node: [7; 16],
            backend: 0,
            device: 3,
            gpu: [9; 16],
            socket: b"symm-4242-0123456789abcdef".to_vec(),
        }
    }

    #[test]
    fn ranks_of_other_processes_on_the_same_gpu_are_counted() {
        let rank = |process: u8, node: u8, device: i32, gpu: u8| PeerInfo {
            process: [process; 16],
            node: [node; 16],
            device,
            gpu: [gpu; 16],
            ..info()
        };
        // Ranks 0 and 1: two processes on GPU 9 (device 0 in each); rank 2: another GPU of
        // that node; rank 3: GPU 9's UUID on another machine (cannot be the same GPU); rank
        // 4: a third process on GPU 9, which it calls device 1.
        let peers = [
            rank(1, 1, 0, 9),
            rank(2, 1, 0, 9),
            rank(2, 1, 1, 8),
            rank(3, 2, 0, 9),
            rank(4, 1, 1, 9),
        ];
        assert_eq!(ranks_on_same_gpu(&peers, 0), [0, 1, 4]);
        assert_eq!(ranks_on_same_gpu(&peers, 2), [2]);
        assert_eq!(ranks_on_same_gpu(&peers, 3), [3]);
        assert_eq!(most_ranks_on_one_gpu(&peers), 3);
        assert_eq!(most_ranks_on_one_gpu(&peers[2..4]), 1);
        assert_eq!(most_ranks_on_one_gpu(&[]), 1);
        // Without UUIDs (host backend): only the ranks of one process on one ordinal.
        let peers = [
            rank(1, 1, 0, 0),
            rank(1, 1, 0, 0),
            rank(2, 1, 0, 0),
            rank(1, 1, 1, 0),
        ];
        assert_eq!(ranks_on_same_gpu(&peers, 0), [0, 1]);
        assert_eq!(most_ranks_on_one_gpu(&peers), 2);
    }

    #[test]
    fn peer_info_round_trips_and_rejects_every_truncation() {
        let bytes = info().encode();
        assert_eq!(PeerInfo::decode(&bytes, 1).unwrap(), info());
        for cut in 0..bytes.len() {
            assert!(PeerInfo::decode(&bytes[..cut], 1).is_err(), "cut {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(PeerInfo::decode(&long, 1).is_err());
        let mut bad_backend = bytes.clone();
        bad_backend[45] = 9;
        assert!(PeerInfo::decode(&bad_backend, 1).is_err());
        let mut bad_version = bytes;
        bad_version[0] = 0;
        let e = PeerInfo::decode(&bad_version, 5).unwrap_err();
        assert!(e.message.contains("rank 5"), "{}", e.message);
    }

    #[test]
    fn window_deposit_round_trips_and_checks_lengths() {
        let d = WindowDeposit {
            base: 0x7000_0000,
            size: 4096,
            signal_pad: 0x8000_0000,
            owner: (2, 4096),
            refused: false,
            window_export: vec![1; 17],
            pad_export: vec![2; 17],
        };
        assert_eq!(WindowDeposit::decode(&d.encode(), 0).unwrap(), d);
        let local = WindowDeposit {
            window_export: Vec::new(),
            pad_export: Vec::new(),
            ..d.clone()
        };
        assert_eq!(WindowDeposit::decode(&local.encode(), 0).unwrap(), local);
        let long = WindowDeposit {
            window_export: vec![0; crate::transport::shareable::MAX_EXPORT_BYTES + 1],
            ..d.clone()
        };
        assert!(WindowDeposit::decode(&long.encode(), 0).is_err());
        let bytes = d.encode();
        for cut in 0..bytes.len() {
            assert!(WindowDeposit::decode(&bytes[..cut], 0).is_err());
        }
        let mut trailing = bytes;
        trailing.push(0);
        assert!(WindowDeposit::decode(&trailing, 0).is_err());
    }

    #[test]
    fn fd_header_round_trips() {
        let h = FdHeader {
            seq: 77,
            source: 3,
            tag: [9; 32],
        };
        assert_eq!(FdHeader::decode(&h.encode()), Some(h));
        let bytes = h.encode();
        for cut in 0..bytes.len() {
            assert_eq!(FdHeader::decode(&bytes[..cut]), None);
        }
    }

    #[test]
    fn node_id_is_stable_and_not_empty() {
        assert_eq!(node_id(), node_id());
        assert_ne!(node_id(), [0; 16]);
    }
}
