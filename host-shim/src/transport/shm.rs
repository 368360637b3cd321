//! Shared memory for the host backend when ranks live in separate processes.
//!
//! A [`SharedMemory`] is an anonymous memory file (`memfd_create`) mapped `MAP_SHARED`. The
//! process that allocates a symmetric buffer calls [`SharedMemory::create`] and passes
//! [`SharedMemory::fd`] to its peers (see [`crate::transport::fdpass`]); each peer maps it with
//! [`SharedMemory::import`]. Every mapping of one memory file shows the same bytes, so a peer's
//! buffer is ordinary memory at a different address in each process.
//!
//! The file is sealed against shrinking right after it is sized, and an import refuses a file
//! that could still shrink: a mapping whose file shrank under it raises `SIGBUS` on access,
//! and a peer could otherwise send a file that it truncates later.

use crate::abi::symmResult_t;
use crate::error::{Error, Result};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// Seals every [`SharedMemory::create`] places on its file: the size is fixed and no further
/// seal may be added or removed.
const CREATE_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// Longest name `memfd_create` accepts (bytes, without the terminating NUL).
const MAX_NAME_BYTES: usize = 249;

/// The page size of this machine.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions; _SC_PAGESIZE is always supported on Linux.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 { size as usize } else { 4096 }
}

/// `bytes` rounded up to a whole number of pages, at least one page; `None` on overflow or
/// beyond what a mapping (`isize::MAX`) or a file size (`off_t`) can hold.
fn mapping_len(bytes: usize) -> Option<usize> {
    let page = page_size();
    let len = bytes.max(1).checked_next_multiple_of(page)?;
    (len <= isize::MAX as usize && libc::off_t::try_from(len).is_ok()).then_some(len)
}

/// "`call` failed: <errno text>" for the calling thread's last OS error.
fn os_error(code: symmResult_t, call: &str) -> Error {
    Error::new(
        code,
        format!("{call} failed: {}", io::Error::last_os_error()),
    )
}

/// A memory file mapped read-write and shared; unmapped and closed on drop.
///
/// The mapping is plain memory: reads and writes through [`address`](Self::address) are the
/// caller's business (as for device memory behind a `CUdeviceptr`). Other processes that map
/// the same file see every write.
#[derive(Debug)]
pub struct SharedMemory {
    /// Start of the mapping.
    ptr: NonNull<libc::c_void>,
    /// Length of the mapping, a multiple of the page size.
    len: usize,
    /// The memory file; kept open so that it can be passed to further peers.
    fd: OwnedFd,
}

// SAFETY: a SharedMemory owns its mapping and its fd; neither is tied to the creating thread.
// The struct never reads or writes the mapped bytes itself, so sharing it between threads
// creates no data race of its own: accesses through `address` are the caller's to order, as
// for any raw buffer address.
unsafe impl Send for SharedMemory {}
// SAFETY: see `Send`; every `&self` method only reads the immutable fields.
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    /// A fresh memory file of `bytes` rounded up to whole pages (at least one page), named
    /// `name` (visible in `/proc/<pid>/fd`, for debugging), mapped read-write and shared. The
    /// memory is zero.
    ///
    /// Errors: `symmInvalidArgument` for a name with a NUL byte or over 249 bytes or a size
    /// that cannot be mapped; `symmSystemError` when `memfd_create` or sealing fails;
    /// `symmOutOfMemory` when sizing or mapping the file fails.
    pub fn create(bytes: usize, name: &str) -> Result<SharedMemory> {
        let c_name = CString::new(name).map_err(|_| {
            Error::invalid_argument(format!("shared memory name {name:?} contains a NUL byte"))
        })?;
        if name.len() > MAX_NAME_BYTES {
            return Err(Error::invalid_argument(format!(
                "shared memory name is {} bytes, longer than {MAX_NAME_BYTES}",
                name.len()
            )));
        }
        let len = mapping_len(bytes).ok_or_else(|| {
            Error::new(
                symmResult_t::symmOutOfMemory,
                format!("shared memory of {bytes} bytes is too large to map"),
            )
        })?;

        // SAFETY: `c_name` is a valid NUL-terminated string that outlives the call.
        let raw = unsafe {
            libc::memfd_create(c_name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(os_error(
                symmResult_t::symmSystemError,
                &format!("memfd_create({name:?})"),
            ));
        }
        // SAFETY: memfd_create returned a new fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        // `len` fits off_t: checked by `mapping_len`.
        // SAFETY: ftruncate on an fd we own; no memory is passed.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(os_error(
                symmResult_t::symmOutOfMemory,
                &format!("ftruncate(memfd {name:?}, {len})"),
            ));
        }
        // SAFETY: fcntl(F_ADD_SEALS) on an fd we own; the argument is an int.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, CREATE_SEALS) } != 0 {
            return Err(os_error(
                symmResult_t::symmSystemError,
                &format!("fcntl(memfd {name:?}, F_ADD_SEALS)"),
            ));
        }
        let ptr = map(&fd, len)?;
        Ok(SharedMemory { ptr, len, fd })
    }

    /// Maps a memory file received from a peer, taking ownership of `fd`. The mapping covers
    /// `expected_len` bytes rounded up to whole pages (a length of 0 counts as 1).
    ///
    /// The fd is checked before it is mapped, since a peer may send anything: it must be a
    /// regular file (a memfd), sealed against shrinking (the seal is added here when the file
    /// still allows it), and at least `expected_len` bytes long. A mapping therefore never
    /// extends a whole page beyond the end of the file and no access to it can raise `SIGBUS`.
    /// Importing the same file twice in one process gives two addresses showing the same bytes.
    ///
    /// Errors: `symmInvalidArgument` when the fd is not a regular file, cannot be sealed, or is
    /// too short; `symmSystemError` when `fstat` fails; `symmOutOfMemory` when mapping fails.
    pub fn import(fd: OwnedFd, expected_len: usize) -> Result<SharedMemory> {
        let raw = fd.as_raw_fd();
        let wanted = expected_len.max(1);
        let len = mapping_len(expected_len).ok_or_else(|| {
            Error::invalid_argument(format!(
                "shared memory import: length {expected_len} is too large to map"
            ))
        })?;

        let stat = fstat(&fd)?;
        if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Error::invalid_argument(format!(
                "shared memory import: fd {raw} is not a memory file (file type {})",
                file_type_name(stat.st_mode)
            )));
        }
        // Seal, then read the size: once F_SEAL_SHRINK is set the size cannot drop.
        seal_against_shrinking(&fd)?;
        let stat = fstat(&fd)?;
        let size = u64::try_from(stat.st_size).unwrap_or(0);
        if size < wanted as u64 {
            return Err(Error::invalid_argument(format!(
                "shared memory import: fd {raw} holds {size} bytes, fewer than the expected \
                 {expected_len}"
            )));
        }
        let ptr = map(&fd, len)?;
        Ok(SharedMemory { ptr, len, fd })
    }

    /// Address of the first byte of the mapping.
    pub fn address(&self) -> u64 {
        self.ptr.as_ptr() as usize as u64
    }

    /// Pointer to the first byte of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr().cast()
    }

    /// Length of the mapping in bytes: a multiple of the page size, at least the size asked
    /// for.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: every mapping holds at least one page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memory file, to pass to peers. It stays owned by `self`.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsFd for SharedMemory {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd()
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe a mapping this struct made and nothing else unmaps;
        // after drop no safe code can reach it. The fd is closed by OwnedFd's drop.
        unsafe {
            libc::munmap(self.ptr.as_ptr(), self.len);
        }
    }
}

/// `fstat(fd)`.
fn fstat(fd: &OwnedFd) -> Result<libc::stat> {
    // SAFETY: `stat` is plain old data; all-zero is a valid value.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `stat` is a valid, writable libc::stat.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
        return Err(os_error(
            symmResult_t::symmSystemError,
            &format!("shared memory import: fstat(fd {})", fd.as_raw_fd()),
        ));
    }
    Ok(stat)
}

/// Makes sure the file behind `fd` can no longer shrink, adding `F_SEAL_SHRINK` if needed.
fn seal_against_shrinking(fd: &OwnedFd) -> Result<()> {
    let raw = fd.as_raw_fd();
    // SAFETY: fcntl(F_GET_SEALS) on an open fd; no memory is passed.
    let seals = unsafe { libc::fcntl(raw, libc::F_GET_SEALS) };
    if seals < 0 {
        return Err(Error::invalid_argument(format!(
            "shared memory import: fd {raw} is not a sealable memory file (fcntl F_GET_SEALS: {})",
            io::Error::last_os_error()
        )));
    }
    if seals & libc::F_SEAL_SHRINK != 0 {
        return Ok(());
    }
    // SAFETY: fcntl(F_ADD_SEALS) on an open fd; the argument is an int.
    if unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) } != 0 {
        return Err(Error::invalid_argument(format!(
            "shared memory import: fd {raw} may shrink and cannot be sealed (fcntl F_ADD_SEALS: \
             {})",
            io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// Maps `len` bytes of `fd` read-write and shared.
fn map(fd: &OwnedFd, len: usize) -> Result<NonNull<libc::c_void>> {
    // SAFETY: a fresh mapping chosen by the kernel (null hint, no MAP_FIXED) cannot overlap
    // memory Rust owns; `fd` is open and `len` is a non-zero multiple of the page size.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(os_error(
            symmResult_t::symmOutOfMemory,
            &format!("mmap(fd {}, {len} bytes, MAP_SHARED)", fd.as_raw_fd()),
        ));
    }
    NonNull::new(ptr).ok_or_else(|| Error::internal("mmap returned a null mapping"))
}

/// A readable name for the file type in `mode`.
fn file_type_name(mode: libc::mode_t) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFSOCK => "socket",
        libc::S_IFIFO => "pipe",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        libc::S_IFDIR => "directory",
        libc::S_IFLNK => "symbolic link",
        libc::S_IFREG => "regular file",
        _ => "unknown",
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::process::Command;

    /// The fds open in this process.
    pub(crate) fn open_fds() -> Vec<i32> {
        let mut fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
            .expect("/proc/self/fd")
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        fds.sort_unstable();
        fds
    }

    /// Runs the test named `test` (exact name) of this binary in a child process with
    /// `role_var=1`, so that it runs alone and can count the process's fds, and checks that it
    /// passed.
    pub(crate) fn run_alone(test: &str, role_var: &str) {
        let out = Command::new(std::env::current_exe().expect("current_exe"))
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(role_var, "1")
            .output()
            .expect("spawn the test binary");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "child {test} failed: {}\n{stdout}\n{stderr}",
            out.status
        );
        assert!(
            stdout.contains("1 passed"),
            "child did not run {test}:\n{stdout}\n{stderr}"
        );
    }

    fn dup(fd: BorrowedFd<'_>) -> OwnedFd {
        fd.try_clone_to_owned().expect("dup")
    }

    fn raw_memfd(len: i64, flags: libc::c_uint) -> OwnedFd {
        // SAFETY: a static NUL-terminated name.
        let raw = unsafe { libc::memfd_create(c"symm-test".as_ptr(), libc::MFD_CLOEXEC | flags) };
        assert!(raw >= 0, "memfd_create: {}", io::Error::last_os_error());
        // SAFETY: a new fd nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on our fd.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), len) }, 0);
        fd
    }

    fn write(mem: &SharedMemory, offset: usize, bytes: &[u8]) {
        assert!(offset + bytes.len() <= mem.len());
        // SAFETY: in bounds of the mapping (checked above); the test owns it.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), mem.as_ptr().add(offset), bytes.len())
        };
    }

    fn read(mem: &SharedMemory, offset: usize, len: usize) -> Vec<u8> {
        assert!(offset + len <= mem.len());
        // SAFETY: in bounds of the mapping (checked above); no concurrent writer.
        unsafe { std::slice::from_raw_parts(mem.as_ptr().add(offset), len).to_vec() }
    }

    #[test]
    fn create_is_zeroed_and_page_rounded() {
        let page = page_size();
        for (asked, expected) in [
            (0, page),
            (1, page),
            (page, page),
            (page + 1, 2 * page),
            (3 * page - 7, 3 * page),
        ] {
            let mem = SharedMemory::create(asked, "symm-test").unwrap();
            assert_eq!(mem.len(), expected, "asked {asked}");
            assert!(!mem.is_empty());
            assert_eq!(mem.address() % page as u64, 0);
            assert!(read(&mem, 0, mem.len()).iter().all(|&b| b == 0));
            // The file size matches the mapping and is sealed.
            let stat = fstat(&mem.fd).unwrap();
            assert_eq!(stat.st_size as usize, expected);
            // SAFETY: fcntl on an open fd.
            let seals = unsafe { libc::fcntl(mem.fd().as_raw_fd(), libc::F_GET_SEALS) };
            assert_eq!(seals & CREATE_SEALS, CREATE_SEALS);
        }
    }

    #[test]
    fn create_rejects_bad_arguments() {
        let e = SharedMemory::create(4096, "a\0b").unwrap_err();
        assert_eq!(e.code, symmResult_t::symmInvalidArgument);
        let e = SharedMemory::create(4096, &"x".repeat(300)).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmInvalidArgument);
        let e = SharedMemory::create(usize::MAX - 5, "symm-test").unwrap_err();
        assert_eq!(e.code, symmResult_t::symmOutOfMemory);
        assert!(e.message.contains("too large"), "{}", e.message);
    }

    #[test]
    fn import_shares_bytes_both_ways() {
        let page = page_size();
        let a = SharedMemory::create(3 * page, "symm-test").unwrap();
        write(&a, 0, b"hello");
        write(&a, 3 * page - 3, b"end");
        let b = SharedMemory::import(dup(a.fd()), a.len()).unwrap();
        assert_ne!(a.address(), b.address());
        assert_eq!(b.len(), a.len());
        assert_eq!(read(&b, 0, 5), b"hello");
        assert_eq!(read(&b, 3 * page - 3, 3), b"end");
        write(&b, page, b"reply");
        assert_eq!(read(&a, page, 5), b"reply");

        // A shorter import maps a prefix; a third mapping of the same file also works.
        let c = SharedMemory::import(dup(b.fd()), page + 1).unwrap();
        assert_eq!(c.len(), 2 * page);
        assert_eq!(read(&c, page, 5), b"reply");
        drop(a);
        drop(b);
        write(&c, 0, b"still");
        assert_eq!(read(&c, 0, 5), b"still");
    }

    #[test]
    fn import_rejects_short_files() {
        let page = page_size();
        let a = SharedMemory::create(page, "symm-test").unwrap();
        let e = SharedMemory::import(dup(a.fd()), page + 1).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmInvalidArgument);
        assert!(e.message.contains("fewer than"), "{}", e.message);
        let e = SharedMemory::import(dup(a.fd()), usize::MAX).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmInvalidArgument);

        // An empty memfd, even for a 0-byte import (which maps one page).
        let empty = raw_memfd(0, libc::MFD_ALLOW_SEALING);
        let e = SharedMemory::import(empty, 0).unwrap_err();
        assert!(e.message.contains("fewer than"), "{}", e.message);

        // A file that is not page-sized: fine up to its size, and then sealed.
        let odd = raw_memfd(5000, libc::MFD_ALLOW_SEALING);
        let odd2 = dup(odd.as_fd());
        let m = SharedMemory::import(odd, 5000).unwrap();
        assert_eq!(m.len(), 8192.max(page).next_multiple_of(page));
        // SAFETY: ftruncate on our fd; it must be refused by the shrink seal.
        assert_ne!(unsafe { libc::ftruncate(odd2.as_raw_fd(), 10) }, 0);
        let e = SharedMemory::import(odd2, 5001).unwrap_err();
        assert!(e.message.contains("fewer than"), "{}", e.message);
    }

    #[test]
    fn import_rejects_unsealable_files() {
        // Without MFD_ALLOW_SEALING a memfd is born with F_SEAL_SEAL and could shrink.
        let fd = raw_memfd(4096, 0);
        let e = SharedMemory::import(fd, 4096).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmInvalidArgument);
        assert!(e.message.contains("cannot be sealed"), "{}", e.message);
    }

    #[test]
    fn import_rejects_sockets_and_pipes() {
        let (s1, _s2) = std::os::unix::net::UnixStream::pair().unwrap();
        let e = SharedMemory::import(OwnedFd::from(s1), 1).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmInvalidArgument);
        assert!(e.message.contains("socket"), "{}", e.message);

        let mut fds = [0; 2];
        // SAFETY: `fds` has room for two fds.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: pipe2 returned two new fds that nothing else owns.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let e = SharedMemory::import(r, 1).unwrap_err();
        assert!(e.message.contains("pipe"), "{}", e.message);
        let e = SharedMemory::import(w, 1).unwrap_err();
        assert!(e.message.contains("pipe"), "{}", e.message);

        let dir = std::fs::File::open("/proc/self").unwrap();
        let e = SharedMemory::import(OwnedFd::from(dir), 1).unwrap_err();
        assert!(e.message.contains("directory"), "{}", e.message);
    }

    /// The variable that makes [`leak_check_child`] run.
    const LEAK_CHILD: &str = "SYMM_SHM_TEST_LEAK_CHILD";

    #[test]
    fn no_fd_or_mapping_leaks() {
        run_alone("transport::shm::tests::leak_check_child", LEAK_CHILD);
    }

    /// Runs alone in a child process (see [`no_fd_or_mapping_leaks`]); does nothing otherwise.
    #[test]
    fn leak_check_child() {
        if std::env::var_os(LEAK_CHILD).is_none() {
            return;
        }
        let maps = || {
            std::fs::read_to_string("/proc/self/maps")
                .unwrap()
                .lines()
                .filter(|l| l.contains("memfd:symm-leak"))
                .count()
        };
        let before = open_fds();
        for _ in 0..3 {
            let a = SharedMemory::create(1 << 20, "symm-leak").unwrap();
            let b = SharedMemory::import(dup(a.fd()), a.len()).unwrap();
            let _ = SharedMemory::import(dup(a.fd()), a.len() + 1).unwrap_err();
            let _ = SharedMemory::create(1, "bad\0name").unwrap_err();
            let (s, _t) = std::os::unix::net::UnixStream::pair().unwrap();
            let _ = SharedMemory::import(OwnedFd::from(s), 1).unwrap_err();
            let _ = SharedMemory::import(raw_memfd(4096, 0), 4096).unwrap_err();
            assert!(open_fds().len() > before.len());
            assert_eq!(maps(), 2);
            drop((a, b));
        }
        assert_eq!(open_fds(), before, "fds leaked");
        assert_eq!(maps(), 0, "mappings leaked");
        println!("leak check passed");
    }
}
