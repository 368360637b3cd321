//! Passing file descriptors between processes on one node.
//!
//! Each process binds an [`FdListener`]: a Unix stream socket in the Linux abstract namespace
//! under a random name, which it publishes to its peers (for example through the bootstrap
//! exchange). A peer hands over fds with [`send_fds`]: it connects, sends one message and
//! closes. The listener takes it with [`FdListener::receive`].
//!
//! A message on the wire is a 12-byte prefix — the magic `SyFd`, the number of fds and the
//! header length, both `u32` little-endian — followed by the header bytes. The fds travel as
//! `SCM_RIGHTS` with the first bytes. At most [`MAX_FDS`] fds and [`MAX_HEADER_BYTES`] header
//! bytes per message.
//!
//! Sending does not wait for the receiver: the kernel queues a connection and its data in the
//! listener's backlog until it is accepted, so one thread may send to several peers before any
//! of them receives. The receiver trusts nothing it reads: a malformed, truncated or silent
//! connection is an error for that call only, never a hang past the deadline, a panic, or an
//! allocation beyond [`MAX_HEADER_BYTES`]; every fd that arrives is owned and closed on every
//! error path. Peers running as another user are refused.

use crate::abi::symmResult_t;
use crate::error::{Error, Result};
use std::io;
use std::mem::{offset_of, size_of, size_of_val};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// Most fds one message carries.
pub const MAX_FDS: usize = 16;

/// Most header bytes one message carries.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Longest listener name accepted by [`send_fds`] (bytes).
pub const MAX_NAME_BYTES: usize = 100;

/// Backlog asked of `listen`; the kernel clamps it to `net.core.somaxconn`.
const BACKLOG: libc::c_int = 4096;

/// First bytes of every message.
const MAGIC: [u8; 4] = *b"SyFd";

/// Magic, fd count, header length.
const PREFIX_BYTES: usize = 12;

/// Bytes of control data for [`MAX_FDS`] fds.
// SAFETY: CMSG_SPACE is pure arithmetic on its argument.
const CONTROL_BYTES: usize =
    unsafe { libc::CMSG_SPACE((MAX_FDS * size_of::<libc::c_int>()) as libc::c_uint) } as usize;

/// Longest pause between connection attempts while the peer is not listening yet.
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(20);

/// A control-message buffer aligned for `cmsghdr`.
#[repr(C, align(8))]
struct ControlBuffer([u8; CONTROL_BYTES]);

/// What one [`FdListener::receive`] got.
#[derive(Debug)]
pub struct ReceivedFds {
    /// The header the sender passed to [`send_fds`].
    pub header: Vec<u8>,
    /// The fds, in the order the sender passed them; owned by the receiver now.
    pub fds: Vec<OwnedFd>,
    /// Process id of the sender, from `SO_PEERCRED`.
    pub peer_pid: u32,
    /// User id of the sender, from `SO_PEERCRED` (always ours).
    pub peer_uid: u32,
}

/// A listening Unix stream socket in the abstract namespace, under a random name. Closed on
/// drop; connections still queued then are dropped with the fds they carry.
#[derive(Debug)]
pub struct FdListener {
    /// The listening socket (non-blocking, close-on-exec).
    fd: OwnedFd,
    /// The abstract name, without the leading NUL.
    name: Vec<u8>,
}

impl FdListener {
    /// Binds a listener under a fresh random name `symm-<pid>-<16 hex digits>` and listens
    /// with a backlog of 4096 connections (clamped by the kernel to `net.core.somaxconn`).
    ///
    /// Errors: `symmSystemError` when a socket call or `getrandom` fails.
    pub fn bind() -> Result<FdListener> {
        const ATTEMPTS: usize = 8;
        for attempt in 1..=ATTEMPTS {
            let name = random_name()?;
            let fd = unix_socket()?;
            let (addr, addr_len) = abstract_addr(&name)?;
            // SAFETY: `addr` is a valid sockaddr_un of which `addr_len` bytes are used; `fd`
            // is an open socket.
            let rc = unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&raw const addr).cast::<libc::sockaddr>(),
                    addr_len,
                )
            };
            if rc != 0 {
                let err = io::Error::last_os_error();
                if err.raw_os_error() == Some(libc::EADDRINUSE) && attempt < ATTEMPTS {
                    continue;
                }
                return Err(system_error(format!(
                    "bind(abstract socket {}) failed: {err}",
                    show(&name)
                )));
            }
            // SAFETY: listen on a bound socket we own; no memory is passed.
            if unsafe { libc::listen(fd.as_raw_fd(), BACKLOG) } != 0 {
                return Err(system_error(format!(
                    "listen(abstract socket {}) failed: {}",
                    show(&name),
                    io::Error::last_os_error()
                )));
            }
            return Ok(FdListener { fd, name });
        }
        unreachable!("the last attempt returns")
    }

    /// The listener's abstract name (without the leading NUL byte), at most
    /// [`MAX_NAME_BYTES`] bytes: what peers pass to [`send_fds`].
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// Takes one message: accepts one connection, checks that the peer runs as our user, and
    /// reads its header and fds, all before `timeout` runs out.
    ///
    /// A bad connection (a peer of another user, a malformed or truncated message, more fds
    /// than announced or than [`MAX_FDS`]) is an error for this call only: the connection is
    /// closed with every fd it carried, and the listener stays usable.
    ///
    /// Errors: `symmTimeout` when no connection arrives, or the one accepted does not deliver
    /// its whole message, before the deadline; `symmSystemError` for a bad connection or a
    /// failing socket call.
    pub fn receive(&self, timeout: Duration) -> Result<ReceivedFds> {
        let deadline = deadline_after(timeout);
        let context = |e: Error| {
            Error::new(
                e.code,
                format!("receiving fds on {}: {}", show(&self.name), e.message),
            )
        };
        let conn = self.accept(deadline, timeout).map_err(context)?;
        let cred = peer_credentials(&conn).map_err(context)?;
        let context = |e: Error| {
            Error::new(
                e.code,
                format!(
                    "receiving fds on {} from pid {}: {}",
                    show(&self.name),
                    cred.pid,
                    e.message
                ),
            )
        };
        // SAFETY: getuid has no preconditions and cannot fail.
        let our_uid = unsafe { libc::getuid() };
        if cred.uid != our_uid {
            return Err(context(system_error(format!(
                "peer runs as uid {}, not as our uid {our_uid}",
                cred.uid
            ))));
        }
        let (header, fds) = read_message(conn.as_fd(), deadline, timeout).map_err(context)?;
        Ok(ReceivedFds {
            header,
            fds,
            peer_pid: cred.pid as u32,
            peer_uid: cred.uid,
        })
    }

    /// Accepts one connection (non-blocking, close-on-exec) before `deadline`.
    fn accept(&self, deadline: Instant, timeout: Duration) -> Result<OwnedFd> {
        loop {
            wait_for(self.fd.as_fd(), libc::POLLIN, deadline, || {
                format!("no peer connected within {timeout:?}")
            })?;
            // SAFETY: accept4 on our listening socket; null address pointers are allowed.
            let raw = unsafe {
                libc::accept4(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                )
            };
            if raw >= 0 {
                // SAFETY: accept4 returned a new fd that nothing else owns.
                return Ok(unsafe { OwnedFd::from_raw_fd(raw) });
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                // Another thread took it, or the peer gave up: wait for the next one.
                Some(libc::EAGAIN | libc::EINTR | libc::ECONNABORTED) => continue,
                _ => return Err(system_error(format!("accept4 failed: {err}"))),
            }
        }
    }
}

impl AsFd for FdListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Sends `header` and `fds` to the [`FdListener`] named `peer_name`, in one message, before
/// `timeout` runs out.
///
/// Connection attempts are repeated while the listener does not exist yet or its backlog is
/// full. The call returns once the message is queued on the connection; it does not wait for
/// the peer to [`receive`](FdListener::receive) it. The fds stay open in the caller.
///
/// Errors: `symmInvalidArgument` for an empty or over-long name, more than [`MAX_FDS`] fds or
/// a header over [`MAX_HEADER_BYTES`]; `symmTimeout` when the peer could not be reached or the
/// message not sent in time; `symmSystemError` when a socket call fails.
pub fn send_fds(
    peer_name: &[u8],
    header: &[u8],
    fds: &[BorrowedFd<'_>],
    timeout: Duration,
) -> Result<()> {
    let context = |e: Error| {
        Error::new(
            e.code,
            format!("sending fds to {}: {}", show(peer_name), e.message),
        )
    };
    if fds.len() > MAX_FDS {
        return Err(context(Error::invalid_argument(format!(
            "{} fds, more than the {MAX_FDS} one message carries",
            fds.len()
        ))));
    }
    if header.len() > MAX_HEADER_BYTES {
        return Err(context(Error::invalid_argument(format!(
            "header of {} bytes, more than {MAX_HEADER_BYTES}",
            header.len()
        ))));
    }
    let deadline = deadline_after(timeout);
    let conn = connect(peer_name, deadline, timeout).map_err(context)?;

    let mut message = Vec::with_capacity(PREFIX_BYTES + header.len());
    message.extend_from_slice(&MAGIC);
    message.extend_from_slice(&(fds.len() as u32).to_le_bytes());
    message.extend_from_slice(&(header.len() as u32).to_le_bytes());
    message.extend_from_slice(header);
    let raw_fds: Vec<libc::c_int> = fds.iter().map(|fd| fd.as_raw_fd()).collect();

    let mut sent = 0;
    while sent < message.len() {
        // The fds go with the first bytes; once any byte is sent, they have gone.
        let with_fds = sent == 0 && !raw_fds.is_empty();
        match send_some(
            conn.as_fd(),
            &message[sent..],
            with_fds.then_some(&raw_fds[..]),
        ) {
            Ok(n) => sent += n,
            Err(err) if err.raw_os_error() == Some(libc::EINTR) => {}
            Err(err) if err.raw_os_error() == Some(libc::EAGAIN) => {
                wait_for(conn.as_fd(), libc::POLLOUT, deadline, || {
                    format!(
                        "message not sent within {timeout:?} ({sent} of {} bytes)",
                        message.len()
                    )
                })
                .map_err(context)?;
            }
            Err(err) => return Err(context(system_error(format!("sendmsg failed: {err}")))),
        }
    }
    Ok(())
}

/// One `sendmsg` of `bytes`, with `fds` attached as `SCM_RIGHTS` when given.
fn send_some(conn: BorrowedFd<'_>, bytes: &[u8], fds: Option<&[libc::c_int]>) -> io::Result<usize> {
    let mut control = ControlBuffer([0; CONTROL_BYTES]);
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is plain old data; all-zero (no name, no control) is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    if let Some(fds) = fds {
        assert!(fds.len() <= MAX_FDS, "checked by send_fds");
        let data_len = size_of_val(fds) as libc::c_uint;
        msg.msg_control = control.0.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE is pure arithmetic; the result is at most CONTROL_BYTES.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(data_len) } as _;
        // SAFETY: msg_control points to `control`, aligned for cmsghdr and holding
        // msg_controllen >= CMSG_SPACE(0) bytes, so CMSG_FIRSTHDR returns a non-null pointer
        // to its start, and the header plus `data_len` bytes of data fit in it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(data_len) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(cmsg).cast::<libc::c_int>(),
                fds.len(),
            );
        }
    }
    // SAFETY: `msg` points to one iovec over `bytes` (only read by sendmsg) and, when set, to
    // `control`, both alive for the call; `conn` is an open socket.
    let n = unsafe { libc::sendmsg(conn.as_raw_fd(), &raw const msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Connects a non-blocking socket to the listener named `name`, retrying while it does not
/// exist yet or its backlog is full, until `deadline`.
fn connect(name: &[u8], deadline: Instant, timeout: Duration) -> Result<OwnedFd> {
    let (addr, addr_len) = abstract_addr(name)?;
    let mut pause = Duration::from_millis(1);
    loop {
        let fd = unix_socket()?;
        // SAFETY: `addr` is a valid sockaddr_un of which `addr_len` bytes are used; `fd` is an
        // open socket.
        let rc = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&raw const addr).cast::<libc::sockaddr>(),
                addr_len,
            )
        };
        if rc == 0 {
            return Ok(fd);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::ECONNREFUSED | libc::ENOENT | libc::EAGAIN | libc::EINTR) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Error::new(
                        symmResult_t::symmTimeout,
                        format!("could not connect within {timeout:?} (last attempt: {err})"),
                    ));
                }
                std::thread::sleep(pause.min(left));
                pause = (pause * 2).min(MAX_RETRY_PAUSE);
            }
            _ => return Err(system_error(format!("connect failed: {err}"))),
        }
    }
}

/// Reads one message from `conn` before `deadline`: the prefix, then the header; collects the
/// fds that arrive with any of it.
fn read_message(
    conn: BorrowedFd<'_>,
    deadline: Instant,
    timeout: Duration,
) -> Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut reader = Reader {
        conn,
        deadline,
        timeout,
        fds: Vec::new(),
    };
    let mut prefix = [0u8; PREFIX_BYTES];
    reader.read_exact(&mut prefix, "message prefix")?;
    if prefix[..4] != MAGIC {
        return Err(system_error(format!(
            "not an fd-passing message (first bytes {:02x?})",
            &prefix[..4]
        )));
    }
    let word = |i: usize| u32::from_le_bytes(prefix[i..i + 4].try_into().expect("4 bytes"));
    let (fd_count, header_len) = (word(4) as usize, word(8) as usize);
    if fd_count > MAX_FDS {
        return Err(system_error(format!(
            "message announces {fd_count} fds, more than {MAX_FDS}"
        )));
    }
    if header_len > MAX_HEADER_BYTES {
        return Err(system_error(format!(
            "message announces a header of {header_len} bytes, more than {MAX_HEADER_BYTES}"
        )));
    }
    let mut header = vec![0u8; header_len];
    reader.read_exact(&mut header, "header")?;
    if reader.fds.len() != fd_count {
        return Err(system_error(format!(
            "message announces {fd_count} fds but carried {}",
            reader.fds.len()
        )));
    }
    Ok((header, reader.fds))
}

/// Reads from one accepted connection, owning every fd that arrives.
struct Reader<'a> {
    /// The connection (non-blocking).
    conn: BorrowedFd<'a>,
    /// When reading gives up.
    deadline: Instant,
    /// The timeout `deadline` came from, for messages.
    timeout: Duration,
    /// Every fd received so far.
    fds: Vec<OwnedFd>,
}

impl Reader<'_> {
    /// Fills `buf`; end of stream before that is an error.
    fn read_exact(&mut self, buf: &mut [u8], what: &str) -> Result<()> {
        let (total, timeout) = (buf.len(), self.timeout);
        let mut done = 0;
        while done < total {
            let n = self.read_some(&mut buf[done..], || {
                format!("peer sent {done} of the {total} bytes of the {what} within {timeout:?}")
            })?;
            if n == 0 {
                return Err(system_error(format!(
                    "peer closed the connection after {done} of the {total} bytes of the {what}"
                )));
            }
            done += n;
        }
        Ok(())
    }

    /// One `recvmsg` into `buf` (waiting for data until the deadline), taking the fds that
    /// come with it; 0 at the end of the stream.
    fn read_some(&mut self, buf: &mut [u8], on_timeout: impl Fn() -> String) -> Result<usize> {
        loop {
            let mut control = ControlBuffer([0; CONTROL_BYTES]);
            let mut iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            // SAFETY: msghdr is plain old data; all-zero is a valid value.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &raw mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.0.as_mut_ptr().cast();
            msg.msg_controllen = CONTROL_BYTES as _;
            // SAFETY: `msg` points to one iovec over `buf` and to `control`, both writable and
            // alive for the call; `conn` is an open socket.
            let n = unsafe {
                libc::recvmsg(self.conn.as_raw_fd(), &raw mut msg, libc::MSG_CMSG_CLOEXEC)
            };
            if n < 0 {
                let err = io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EAGAIN) => {
                        wait_for(self.conn, libc::POLLIN, self.deadline, &on_timeout)?;
                        continue;
                    }
                    _ => return Err(system_error(format!("recvmsg failed: {err}"))),
                }
            }
            // Own every fd that arrived before judging anything else.
            self.take_fds(&msg);
            if msg.msg_flags & libc::MSG_CTRUNC != 0 {
                return Err(system_error(format!(
                    "control data truncated: the peer sent more than {MAX_FDS} fds in one \
                     message, and some were lost"
                )));
            }
            if self.fds.len() > MAX_FDS {
                return Err(system_error(format!(
                    "peer sent {} fds, more than {MAX_FDS}",
                    self.fds.len()
                )));
            }
            return Ok(n as usize);
        }
    }

    /// Wraps every fd in the `SCM_RIGHTS` messages of `msg`, just filled by `recvmsg`, in an
    /// [`OwnedFd`].
    fn take_fds(&mut self, msg: &libc::msghdr) {
        let base = msg.msg_control as usize;
        // msg_controllen is a size_t with glibc but a socklen_t with musl.
        #[allow(clippy::unnecessary_cast)]
        let used = (msg.msg_controllen as usize).min(CONTROL_BYTES);
        // SAFETY: `msg` was filled by recvmsg: msg_control points to a live ControlBuffer and
        // msg_controllen is the length of the control data the kernel wrote there, so
        // CMSG_FIRSTHDR returns null or a header inside that data.
        let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(msg) };
        while !cmsg.is_null() {
            // SAFETY: `cmsg` is non-null and inside the control data (see above and below);
            // the buffer is aligned for cmsghdr and the kernel aligns each header.
            let header = unsafe { std::ptr::read(cmsg) };
            if header.cmsg_level == libc::SOL_SOCKET && header.cmsg_type == libc::SCM_RIGHTS {
                // SAFETY: CMSG_DATA is pointer arithmetic within the same message.
                let data = unsafe { libc::CMSG_DATA(cmsg) }.cast_const();
                // SAFETY: CMSG_LEN is pure arithmetic.
                let header_len = unsafe { libc::CMSG_LEN(0) } as usize;
                let data_len = (header.cmsg_len as usize)
                    .saturating_sub(header_len)
                    .min((base + used).saturating_sub(data as usize));
                for i in 0..data_len / size_of::<libc::c_int>() {
                    // SAFETY: fd `i` lies within this message's data, inside the control data
                    // (its length is clamped to the end of what the kernel wrote);
                    // read_unaligned needs no alignment.
                    let raw = unsafe {
                        std::ptr::read_unaligned(
                            data.add(i * size_of::<libc::c_int>()).cast::<libc::c_int>(),
                        )
                    };
                    // SAFETY: the kernel installed this fd in our table for this message only;
                    // nothing else owns it.
                    self.fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
                }
            }
            // SAFETY: as for CMSG_FIRSTHDR; CMSG_NXTHDR returns null past the control data.
            cmsg = unsafe { libc::CMSG_NXTHDR(msg, cmsg) };
        }
    }
}

/// Waits until `fd` is ready for `events` (or has an error or hang-up, which the next call
/// reports); `symmTimeout` with `on_timeout()` at the deadline.
fn wait_for(
    fd: BorrowedFd<'_>,
    events: libc::c_short,
    deadline: Instant,
    on_timeout: impl Fn() -> String,
) -> Result<()> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::new(symmResult_t::symmTimeout, on_timeout()));
        }
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: one valid pollfd, alive for the call.
        let n = unsafe { libc::poll(&raw mut pfd, 1, ms) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(system_error(format!("poll failed: {err}")));
        }
        if n > 0 && pfd.revents != 0 {
            return Ok(());
        }
    }
}

/// `SO_PEERCRED` of a connected socket.
fn peer_credentials(conn: &OwnedFd) -> Result<libc::ucred> {
    // SAFETY: ucred is plain old data; all-zero is a valid value.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is writable and `len` is its size; `conn` is an open socket.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if rc != 0 || len as usize != size_of::<libc::ucred>() {
        return Err(system_error(format!(
            "getsockopt(SO_PEERCRED) failed: {}",
            io::Error::last_os_error()
        )));
    }
    Ok(cred)
}

/// A new non-blocking, close-on-exec Unix stream socket.
fn unix_socket() -> Result<OwnedFd> {
    // SAFETY: socket has no memory arguments.
    let raw = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if raw < 0 {
        return Err(system_error(format!(
            "socket(AF_UNIX, SOCK_STREAM) failed: {}",
            io::Error::last_os_error()
        )));
    }
    // SAFETY: socket returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// The address of the abstract socket `name` and its length.
fn abstract_addr(name: &[u8]) -> Result<(libc::sockaddr_un, libc::socklen_t)> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(Error::invalid_argument(format!(
            "socket name of {} bytes; it must have 1 to {MAX_NAME_BYTES}",
            name.len()
        )));
    }
    // SAFETY: sockaddr_un is plain old data; all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // sun_path[0] stays 0: the abstract namespace. MAX_NAME_BYTES < 107 leaves room.
    for (slot, &byte) in addr.sun_path[1..].iter_mut().zip(name) {
        *slot = byte as libc::c_char;
    }
    let len = offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len();
    Ok((addr, len as libc::socklen_t))
}

/// `symm-<pid>-<16 random hex digits>`.
fn random_name() -> Result<Vec<u8>> {
    let random = crate::transport::bootstrap::random_secret()?;
    let bits = u64::from_ne_bytes(random[..8].try_into().expect("8 bytes"));
    Ok(format!("symm-{}-{bits:016x}", std::process::id()).into_bytes())
}

/// `now + timeout`, saturating far in the future.
fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}

/// `symmSystemError`.
fn system_error(message: String) -> Error {
    Error::new(symmResult_t::symmSystemError, message)
}

/// A socket name for messages: `@name`, non-printable bytes escaped.
fn show(name: &[u8]) -> String {
    format!("@{}", name.escape_ascii())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::shm::SharedMemory;
    use crate::transport::shm::tests::{open_fds, run_alone};
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::process::{Command, Stdio};

    const LONG: Duration = Duration::from_secs(20);

    /// A one-page memory file whose first bytes are `pattern`.
    fn memfd_with(pattern: &[u8]) -> SharedMemory {
        let mem = SharedMemory::create(pattern.len(), "symm-fdpass-test").unwrap();
        // SAFETY: the mapping holds at least `pattern.len()` bytes; the test owns it.
        unsafe { std::ptr::copy_nonoverlapping(pattern.as_ptr(), mem.as_ptr(), pattern.len()) };
        mem
    }

    fn bytes_at(mem: &SharedMemory, len: usize) -> Vec<u8> {
        assert!(len <= mem.len());
        // SAFETY: in bounds of the mapping; no concurrent writer.
        unsafe { std::slice::from_raw_parts(mem.as_ptr(), len).to_vec() }
    }

    /// Sends `n` memory files and checks that the receiver maps the same bytes.
    fn round_trip(listener: &FdListener, n: usize) {
        let mems: Vec<SharedMemory> = (0..n)
            .map(|i| memfd_with(format!("file {i} of {n}").as_bytes()))
            .collect();
        let fds: Vec<BorrowedFd<'_>> = mems.iter().map(|m| m.fd()).collect();
        let header = vec![n as u8; 1000 * n];
        send_fds(listener.name(), &header, &fds, LONG).unwrap();
        let got = listener.receive(LONG).unwrap();
        assert_eq!(got.header, header);
        assert_eq!(got.fds.len(), n);
        assert_eq!(got.peer_pid, std::process::id());
        // SAFETY: getuid has no preconditions.
        assert_eq!(got.peer_uid, unsafe { libc::getuid() });
        for (i, (fd, mem)) in got.fds.into_iter().zip(&mems).enumerate() {
            // SAFETY: fcntl on an open fd.
            let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
            assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
            let pattern = format!("file {i} of {n}");
            let peer = SharedMemory::import(fd, mem.len()).unwrap();
            assert_eq!(bytes_at(&peer, pattern.len()), pattern.as_bytes());
            // SAFETY: in bounds; the test owns the mapping.
            unsafe { std::ptr::copy_nonoverlapping(b"back".as_ptr(), peer.as_ptr(), 4) };
            assert_eq!(bytes_at(mem, 4), b"back");
        }
    }

    #[test]
    fn sends_0_to_16_fds_with_a_header() {
        let listener = FdListener::bind().unwrap();
        let name = std::str::from_utf8(listener.name()).unwrap();
        assert!(
            name.starts_with(&format!("symm-{}-", std::process::id())),
            "{name}"
        );
        assert!(listener.name().len() <= MAX_NAME_BYTES);
        for n in [0, 1, 2, 5, 15, 16] {
            round_trip(&listener, n);
        }
        // The largest header.
        let header: Vec<u8> = (0..MAX_HEADER_BYTES).map(|i| (i % 251) as u8).collect();
        send_fds(listener.name(), &header, &[], LONG).unwrap();
        assert_eq!(listener.receive(LONG).unwrap().header, header);
    }

    #[test]
    fn names_are_distinct() {
        let a = FdListener::bind().unwrap();
        let b = FdListener::bind().unwrap();
        assert_ne!(a.name(), b.name());
    }

    #[test]
    fn sends_queue_in_the_backlog_before_any_receive() {
        let listener = FdListener::bind().unwrap();
        let mems: Vec<SharedMemory> = (0..4).map(|i| memfd_with(&[i as u8 + 1; 8])).collect();
        for (i, mem) in mems.iter().enumerate() {
            send_fds(listener.name(), &[i as u8], &[mem.fd()], LONG).unwrap();
        }
        let mut seen = Vec::new();
        for _ in 0..4 {
            let got = listener.receive(LONG).unwrap();
            let i = got.header[0];
            let peer = SharedMemory::import(got.fds.into_iter().next().unwrap(), 8).unwrap();
            assert_eq!(bytes_at(&peer, 8), [i + 1; 8]);
            seen.push(i);
        }
        seen.sort_unstable();
        assert_eq!(seen, [0, 1, 2, 3]);

        // The backlog holds at least 256 connections (where the kernel allows that many).
        let somaxconn: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(128);
        let count = somaxconn.min(256);
        for i in 0..count {
            send_fds(listener.name(), &(i as u32).to_le_bytes(), &[], LONG).unwrap();
        }
        for _ in 0..count {
            listener.receive(LONG).unwrap();
        }
    }

    #[test]
    fn receive_times_out_without_a_peer() {
        let listener = FdListener::bind().unwrap();
        let start = Instant::now();
        let e = listener.receive(Duration::from_millis(150)).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmTimeout, "{}", e.message);
        assert!(start.elapsed() >= Duration::from_millis(150));
        assert!(e.message.contains("no peer connected"), "{}", e.message);
    }

    /// A peer that connects and sends nothing: the receive fails at its deadline.
    fn silent_peer(listener: &FdListener) {
        let conn = connect(listener.name(), deadline_after(LONG), LONG).unwrap();
        let timeout = Duration::from_millis(300);
        let start = Instant::now();
        let e = listener.receive(timeout).unwrap_err();
        let elapsed = start.elapsed();
        assert_eq!(e.code, symmResult_t::symmTimeout, "{}", e.message);
        assert!(e.message.contains("message prefix"), "{}", e.message);
        assert!(elapsed >= timeout, "{elapsed:?}");
        assert!(elapsed < timeout + Duration::from_secs(2), "{elapsed:?}");
        drop(conn);
    }

    /// A peer that sends half a message and then waits: the receive fails at its deadline.
    fn stalled_peer(listener: &FdListener) {
        let mut conn = raw_peer(listener);
        conn.write_all(&message(1, 100)[..20]).unwrap();
        let e = listener.receive(Duration::from_millis(200)).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmTimeout, "{}", e.message);
        assert!(
            e.message.contains("8 of the 100 bytes of the header"),
            "{}",
            e.message
        );
    }

    /// A blocking connection to `listener`.
    fn raw_peer(listener: &FdListener) -> UnixStream {
        let conn = UnixStream::from(connect(listener.name(), deadline_after(LONG), LONG).unwrap());
        conn.set_nonblocking(false).unwrap();
        conn
    }

    /// A prefix announcing `fds` fds and `header_len` header bytes, then that many bytes.
    fn message(fds: u32, header_len: u32) -> Vec<u8> {
        let mut m = MAGIC.to_vec();
        m.extend_from_slice(&fds.to_le_bytes());
        m.extend_from_slice(&header_len.to_le_bytes());
        m.resize(m.len() + header_len.min(1 << 20) as usize, 7);
        m
    }

    /// Sends `bytes` with `fds` attached (raw, bypassing the checks of `send_fds`).
    fn send_raw(conn: &UnixStream, bytes: &[u8], fds: &[i32]) {
        let space = (fds.len() * 4 + 64).next_multiple_of(8);
        let mut control = vec![0u64; space / 8];
        let mut iov = libc::iovec {
            iov_base: bytes.as_ptr().cast_mut().cast(),
            iov_len: bytes.len(),
        };
        // SAFETY: plain old data.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        // SAFETY: the buffer is 8-aligned and holds the header and the fds; CMSG_* are
        // pointer arithmetic on it.
        unsafe {
            let data_len = (fds.len() * 4) as u32;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(data_len) as _;
            let cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(data_len) as _;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast(), fds.len());
        }
        // SAFETY: `msg` points to live buffers.
        let n = unsafe { libc::sendmsg(conn.as_raw_fd(), &raw const msg, libc::MSG_NOSIGNAL) };
        assert_eq!(n, bytes.len() as isize, "{}", io::Error::last_os_error());
    }

    /// Each bad peer makes one receive fail (quickly, with an error naming the problem), and
    /// the listener works afterwards.
    fn bad_peers(listener: &FdListener) {
        let mem = memfd_with(b"x");
        type Peer = Box<dyn Fn(&mut UnixStream)>;
        let fd = mem.fd().as_raw_fd();
        let cases: Vec<(&str, Peer)> = vec![
            ("closed the connection after 0 of the 12", Box::new(|_| {})),
            (
                "after 3 of the 12 bytes of the message prefix",
                Box::new(|c| c.write_all(&MAGIC[..3]).unwrap()),
            ),
            (
                "not an fd-passing message",
                Box::new(|c| c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap()),
            ),
            (
                "header of 1048576 bytes, more than 65536",
                Box::new(|c| c.write_all(&message(0, 1 << 20)[..12]).unwrap()),
            ),
            (
                "header of 4294967295 bytes",
                Box::new(|c| c.write_all(&message(0, u32::MAX)[..12]).unwrap()),
            ),
            (
                "announces 17 fds",
                Box::new(|c| c.write_all(&message(17, 0)).unwrap()),
            ),
            (
                "after 10 of the 100 bytes of the header",
                Box::new(|c| c.write_all(&message(0, 100)[..22]).unwrap()),
            ),
            (
                "announces 2 fds but carried 0",
                Box::new(|c| c.write_all(&message(2, 3)).unwrap()),
            ),
            (
                "announces 0 fds but carried 1",
                Box::new(move |c| send_raw(c, &message(0, 3), &[fd])),
            ),
            (
                "announces 1 fds but carried 3",
                Box::new(move |c| send_raw(c, &message(1, 3), &[fd, fd, fd])),
            ),
            (
                "control data truncated",
                Box::new(move |c| send_raw(c, &message(16, 3), &[fd; 20])),
            ),
            (
                // Fds that come after the first bytes are still taken (and counted).
                "announces 1 fds but carried 2",
                Box::new(move |c| {
                    let m = message(1, 3);
                    send_raw(c, &m[..5], &[fd]);
                    send_raw(c, &m[5..], &[fd]);
                }),
            ),
        ];
        for (expected, peer) in cases {
            let mut conn = raw_peer(listener);
            peer(&mut conn);
            drop(conn);
            let start = Instant::now();
            let e = listener.receive(LONG).unwrap_err();
            assert_eq!(e.code, symmResult_t::symmSystemError, "{}", e.message);
            assert!(
                e.message.contains(expected),
                "{expected:?} not in {:?}",
                e.message
            );
            assert!(e.message.contains(&format!("pid {}", std::process::id())));
            assert!(start.elapsed() < Duration::from_secs(5));
            round_trip(listener, 1);
        }
        // A well-formed message sent in pieces is fine.
        let mut conn = raw_peer(listener);
        let m = message(1, 40);
        send_raw(&conn, &m[..1], &[fd]);
        conn.write_all(&m[1..7]).unwrap();
        conn.write_all(&m[7..]).unwrap();
        drop(conn);
        let got = listener.receive(LONG).unwrap();
        assert_eq!((got.header.len(), got.fds.len()), (40, 1));
    }

    #[test]
    fn silent_stalled_and_bad_peers_fail_only_their_receive() {
        let listener = FdListener::bind().unwrap();
        silent_peer(&listener);
        round_trip(&listener, 2);
        stalled_peer(&listener);
        round_trip(&listener, 2);
        bad_peers(&listener);
    }

    /// Sender-side argument checks and timeouts.
    fn sender_errors() {
        let mems: Vec<SharedMemory> = (0..17).map(|_| memfd_with(b"x")).collect();
        let fds: Vec<BorrowedFd<'_>> = mems.iter().map(|m| m.fd()).collect();
        let listener = FdListener::bind().unwrap();
        let e = send_fds(listener.name(), b"", &fds, LONG).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmInvalidArgument);
        assert!(e.message.contains("17 fds"), "{}", e.message);
        let big = vec![0; MAX_HEADER_BYTES + 1];
        let e = send_fds(listener.name(), &big, &[], LONG).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmInvalidArgument);
        for name in [&b""[..], &[b'a'; MAX_NAME_BYTES + 1]] {
            let e = send_fds(name, b"", &[], LONG).unwrap_err();
            assert_eq!(e.code, symmResult_t::symmInvalidArgument);
        }
        // Nothing was queued by the failed sends.
        let e = listener.receive(Duration::from_millis(20)).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmTimeout);

        // Nobody listens under this name: connection attempts until the deadline.
        let name = listener.name().to_vec();
        drop(listener);
        let start = Instant::now();
        let e = send_fds(&name, b"", &fds[..1], Duration::from_millis(200)).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmTimeout, "{}", e.message);
        assert!(e.message.contains("Connection refused"), "{}", e.message);
        let elapsed = start.elapsed();
        assert!(elapsed >= Duration::from_millis(200), "{elapsed:?}");
        assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    }

    #[test]
    fn sender_rejects_bad_arguments_and_times_out() {
        sender_errors();
    }

    #[test]
    fn sender_waits_for_a_late_listener() {
        // A name nobody listens under yet: that of a listener already closed.
        let name = FdListener::bind().unwrap().name().to_vec();
        let name2 = name.clone();
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            let fd = unix_socket().unwrap();
            let (addr, len) = abstract_addr(&name2).unwrap();
            // SAFETY: a valid address for an open socket.
            let bound = unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), len) };
            assert_eq!(bound, 0, "{}", io::Error::last_os_error());
            // SAFETY: listen on our bound socket.
            assert_eq!(unsafe { libc::listen(fd.as_raw_fd(), 16) }, 0);
            FdListener { fd, name: name2 }.receive(LONG).unwrap()
        });
        let mem = memfd_with(b"late");
        send_fds(&name, b"hdr", &[mem.fd()], LONG).unwrap();
        let got = late.join().unwrap();
        assert_eq!(got.header, b"hdr");
        assert_eq!(got.fds.len(), 1);
    }

    /// The variable that makes [`leak_check_child`] run.
    const LEAK_CHILD: &str = "SYMM_FDPASS_TEST_LEAK_CHILD";

    #[test]
    fn no_fd_leaks() {
        run_alone("transport::fdpass::tests::leak_check_child", LEAK_CHILD);
    }

    /// Runs alone in a child process (see [`no_fd_leaks`]); does nothing otherwise.
    #[test]
    fn leak_check_child() {
        if std::env::var_os(LEAK_CHILD).is_none() {
            return;
        }
        let before = open_fds();
        {
            let listener = FdListener::bind().unwrap();
            for n in [0, 1, 16] {
                round_trip(&listener, n);
            }
            silent_peer(&listener);
            stalled_peer(&listener);
            bad_peers(&listener);
            let _ = listener.receive(Duration::from_millis(10)).unwrap_err();
            // Messages still queued when the listener closes.
            let mem = memfd_with(b"q");
            for _ in 0..3 {
                send_fds(listener.name(), b"", &[mem.fd(); 16], LONG).unwrap();
            }
        }
        sender_errors();
        assert_eq!(open_fds(), before, "fds leaked");
        println!("leak check passed");
    }

    /// The variables that make [`cross_process_child`] run: the parent's listener name.
    const PEER_VAR: &str = "SYMM_FDPASS_TEST_PEER";

    /// The parent binds a listener and starts a child process; the child sends a memory file
    /// with a pattern and the name of its own listener; the parent maps it, checks the pattern,
    /// writes a reply into it and acknowledges; the child checks the reply.
    #[test]
    fn cross_process() {
        let listener = FdListener::bind().unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "transport::fdpass::tests::cross_process_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(PEER_VAR, std::str::from_utf8(listener.name()).unwrap())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let start = Instant::now();
        let got = loop {
            match listener.receive(Duration::from_millis(200)) {
                Ok(got) => break got,
                Err(e) if e.code == symmResult_t::symmTimeout => {
                    if let Some(status) = child.try_wait().unwrap() {
                        let out = child.wait_with_output().unwrap();
                        panic!(
                            "child exited with {status} before sending:\n{}\n{}",
                            String::from_utf8_lossy(&out.stdout),
                            String::from_utf8_lossy(&out.stderr)
                        );
                    }
                    assert!(
                        start.elapsed() < Duration::from_secs(120),
                        "child never sent"
                    );
                }
                Err(e) => panic!("{}", e.message),
            }
        };
        assert_eq!(got.peer_pid, child.id());
        let mut fds = got.fds.into_iter();
        let mem = SharedMemory::import(fds.next().unwrap(), 1 << 16).unwrap();
        assert!(fds.next().is_none());
        let expected: Vec<u8> = (0..1 << 16).map(|i: u32| (i * 7 % 256) as u8).collect();
        assert_eq!(bytes_at(&mem, 1 << 16), expected);
        // SAFETY: in bounds; the child does not write while it waits for the acknowledgement.
        unsafe { std::ptr::write_bytes(mem.as_ptr().add(100), 0xAB, 50) };
        send_fds(&got.header, b"ack", &[], LONG).unwrap();
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "child failed: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The sending side of [`cross_process`]; does nothing outside it.
    #[test]
    fn cross_process_child() {
        let Some(peer) = std::env::var_os(PEER_VAR) else {
            return;
        };
        let pattern: Vec<u8> = (0..1 << 16).map(|i: u32| (i * 7 % 256) as u8).collect();
        let mem = memfd_with(&pattern);
        let own = FdListener::bind().unwrap();
        send_fds(peer.as_encoded_bytes(), own.name(), &[mem.fd()], LONG).unwrap();
        let ack = own.receive(Duration::from_secs(60)).unwrap();
        assert_eq!(ack.header, b"ack");
        // SAFETY: getppid has no preconditions.
        assert_eq!(ack.peer_pid, unsafe { libc::getppid() } as u32);
        let mut expected = pattern;
        expected[100..150].fill(0xAB);
        assert_eq!(bytes_at(&mem, 1 << 16), expected);
        println!("cross-process child passed");
    }
}
