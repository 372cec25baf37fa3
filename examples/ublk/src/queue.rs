//! One ublk queue as the server sees it: the seam ([`UblkQueue`]) and the
//! kernel's queue behind it ([`KernelQueue`]: `/dev/ublkcN`, its
//! descriptor array, and an io_uring of FETCH / COMMIT_AND_FETCH
//! commands).
//!
//! The server ([`crate::server`]) is written against the trait only, so
//! `cargo test` drives it with [`crate::fake::FakeQueue`], which plays the
//! kernel's side of the protocol and checks it, without a ublk driver.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use io_uring::{opcode, types, IoUring};

use crate::sys::{self, IoCmd, IoDesc};

/// What [`UblkQueue::submit`] may wait for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Hand the queued commands over and return at once (this also runs
    /// the kernel's pending task work, which is how new requests arrive).
    No,
    /// Block until one command completes or the time passes.
    One(Duration),
}

/// The kernel side of one ublk queue, as a server uses it.
///
/// The protocol (the driver's, which [`crate::fake::FakeQueue`] enforces):
/// every tag gets one [`fetch`](Self::fetch) at start; a completion with
/// [`sys::IO_RES_OK`] hands the tag a request (its descriptor is then
/// valid); the server answers it with exactly one
/// [`commit`](Self::commit), which also fetches the tag's next request; a
/// completion with [`sys::IO_RES_ABORT`] means the tag is gone for good.
pub trait UblkQueue {
    /// The queue id.
    fn qid(&self) -> u16;
    /// Tags of this queue.
    fn depth(&self) -> u16;
    /// Whether data moves through [`copy_in`](Self::copy_in) /
    /// [`copy_out`](Self::copy_out) (USER_COPY) instead of the address
    /// given with each command.
    fn user_copy(&self) -> bool;
    /// The request a tag holds (valid between its OK completion and its
    /// commit).
    fn desc(&self, tag: u16) -> IoDesc;
    /// Queue the first FETCH of `tag`, with its buffer at `addr`.
    fn fetch(&mut self, tag: u16, addr: u64) -> io::Result<()>;
    /// Queue the answer to `tag`'s request (bytes done, 0, or a negative
    /// errno) and the fetch of its next one into the buffer at `addr`.
    fn commit(&mut self, tag: u16, result: i32, addr: u64) -> io::Result<()>;
    /// Hand everything queued to the kernel: one `io_uring_enter`.
    /// Returns whether a [`Wait::One`] ran out its time with nothing
    /// completed.
    fn submit(&mut self, wait: Wait) -> io::Result<bool>;
    /// Deliver completed commands as `(tag, result)`, without a system
    /// call; returns how many. The completion of a [`watch`](Self::watch)
    /// is not delivered: it is kept for [`take_woken`](Self::take_woken).
    fn reap(&mut self, f: &mut dyn FnMut(u16, i32)) -> usize;
    /// Make the next [`Wait::One`] end also when `fd` (the engine queue's
    /// interrupt: an eventfd, or an NVMe/TCP queue's epoll set) is
    /// readable: a one-shot poll on the same ring, queued unless one is
    /// still pending. A signal before this call leaves the descriptor
    /// readable, so it ends the wait at once.
    fn watch(&mut self, fd: RawFd) -> io::Result<()>;
    /// Whether a watched fd became readable since the last call.
    fn take_woken(&mut self) -> bool;
    /// USER_COPY: read a WRITE request's data into `dst`.
    fn copy_in(&mut self, tag: u16, dst: &mut [u8]) -> io::Result<()>;
    /// USER_COPY: hand a READ request's data from `src` to the kernel.
    fn copy_out(&mut self, tag: u16, src: &[u8]) -> io::Result<()>;
}

/// The read-only mapping of one queue's descriptor array.
struct DescMap {
    ptr: NonNull<IoDesc>,
    len: usize,
}

impl DescMap {
    fn map(fd: RawFd, qid: u16, depth: u16) -> io::Result<DescMap> {
        // SAFETY: sysconf has no memory effects.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let len = (usize::from(depth) * std::mem::size_of::<IoDesc>()).div_ceil(page) * page;
        let off = sys::CMD_BUF_OFFSET as usize + usize::from(qid) * sys::cmd_buf_stride(page);
        // SAFETY: a fresh shared read-only mapping of the driver's
        // descriptor array (the kernel picks the address); nothing else in
        // this process is at that address, and it is unmapped in Drop.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                off as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(DescMap {
            ptr: NonNull::new(p.cast()).expect("mmap returned a non-null mapping"),
            len,
        })
    }

    fn get(&self, tag: u16) -> IoDesc {
        assert!(usize::from(tag) * std::mem::size_of::<IoDesc>() < self.len);
        // SAFETY: in bounds (checked above) of a live mapping; the driver
        // writes a tag's descriptor before completing its fetch, which we
        // have reaped (the CQE's acquire orders it), and a volatile read
        // never lets the compiler assume the memory is ours.
        unsafe { self.ptr.as_ptr().add(usize::from(tag)).read_volatile() }
    }
}

impl Drop for DescMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no reference
        // into it outlives `self` (`get` returns copies).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A queue of a live `/dev/ublkcN`: its descriptors and its ring.
///
/// Must be created on, and used only from, the thread that serves the
/// queue: the driver binds a queue to the task that issued its FETCHes.
pub struct KernelQueue {
    cdev: Arc<OwnedFd>,
    ring: IoUring,
    descs: DescMap,
    qid: u16,
    depth: u16,
    user_copy: bool,
    queued: usize,
    /// A poll of a watched fd is with the kernel.
    watching: bool,
    /// It completed since [`UblkQueue::take_woken`] last looked.
    woken: bool,
    /// USER_COPY's reads and writes are skipped (`--null nocopy`).
    skip_copies: bool,
}

/// user_data of a COMMIT_AND_FETCH (a FETCH's is the bare tag).
const UD_COMMIT: u64 = 1 << 16;
/// user_data of the poll of a watched fd (the engine's interrupt).
const UD_WATCH: u64 = 1 << 17;

impl KernelQueue {
    /// Map queue `qid`'s descriptors from the open character device and
    /// set up its ring (the device file registered as fixed file 0).
    pub fn new(cdev: Arc<OwnedFd>, qid: u16, depth: u16, user_copy: bool) -> io::Result<Self> {
        let descs = DescMap::map(cdev.as_raw_fd(), qid, depth)?;
        // Each tag has at most one command in the kernel, and the watch
        // one poll: depth + 1 entries never overflow the SQ, and the CQ
        // (twice as large) never drops.
        let ring = IoUring::builder().build((u32::from(depth) + 1).next_power_of_two())?;
        ring.submitter().register_files(&[cdev.as_raw_fd()])?;
        Ok(KernelQueue {
            cdev,
            ring,
            descs,
            qid,
            depth,
            user_copy,
            queued: 0,
            watching: false,
            woken: false,
            skip_copies: false,
        })
    }

    /// Diagnostics only (`--null nocopy`): with USER_COPY, move no data
    /// at all — a READ is answered with whatever its pages held.
    pub fn skip_user_copies(&mut self) {
        self.skip_copies = true;
    }

    fn push(&mut self, op: u32, cmd: IoCmd, user_data: u64) -> io::Result<()> {
        let sqe = opcode::UringCmd16::new(types::Fixed(0), op)
            .cmd(cmd.to_bytes())
            .build()
            .user_data(user_data);
        self.push_sqe(&sqe)
    }

    fn push_sqe(&mut self, sqe: &io_uring::squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: a ublk command carries no pointer the kernel reads
            // later except `addr`, the tag's buffer, which the server keeps
            // alive and does not hand to the device while the kernel may
            // copy into or out of it (the tag's state machine); a poll
            // carries only a file descriptor, whose file the kernel holds
            // a reference to while the poll is pending.
            let pushed = unsafe { self.ring.submission().push(sqe) }.is_ok();
            if pushed {
                self.queued += 1;
                return Ok(());
            }
            self.submit(Wait::No)?;
        }
    }
}

impl UblkQueue for KernelQueue {
    fn qid(&self) -> u16 {
        self.qid
    }
    fn depth(&self) -> u16 {
        self.depth
    }
    fn user_copy(&self) -> bool {
        self.user_copy
    }
    fn desc(&self, tag: u16) -> IoDesc {
        self.descs.get(tag)
    }

    fn fetch(&mut self, tag: u16, addr: u64) -> io::Result<()> {
        let cmd = IoCmd {
            q_id: self.qid,
            tag,
            result: 0,
            addr,
        };
        self.push(sys::IO_FETCH_REQ, cmd, u64::from(tag))
    }

    fn commit(&mut self, tag: u16, result: i32, addr: u64) -> io::Result<()> {
        let cmd = IoCmd {
            q_id: self.qid,
            tag,
            result,
            addr,
        };
        self.push(
            sys::IO_COMMIT_AND_FETCH_REQ,
            cmd,
            UD_COMMIT | u64::from(tag),
        )
    }

    fn submit(&mut self, wait: Wait) -> io::Result<bool> {
        let r = match wait {
            Wait::No => self.ring.submit(),
            Wait::One(t) => {
                let ts = types::Timespec::new()
                    .sec(t.as_secs())
                    .nsec(t.subsec_nanos());
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
        };
        match r {
            Ok(_) => {
                self.queued = 0;
                Ok(false)
            }
            // The wait ran out (or a signal ended it): not an error.
            Err(e) if e.raw_os_error() == Some(libc::ETIME) => {
                self.queued = 0;
                Ok(true)
            }
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                self.queued = 0;
                Ok(false)
            }
            // The kernel could not take everything now: what it took is
            // gone from the SQ, the rest goes with the next call.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn reap(&mut self, f: &mut dyn FnMut(u16, i32)) -> usize {
        let mut n = 0;
        for cqe in self.ring.completion() {
            if cqe.user_data() == UD_WATCH {
                self.watching = false;
                self.woken = true;
                continue;
            }
            f((cqe.user_data() & 0xffff) as u16, cqe.result());
            n += 1;
        }
        n
    }

    fn watch(&mut self, fd: RawFd) -> io::Result<()> {
        if self.watching {
            return Ok(());
        }
        let sqe = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
            .build()
            .user_data(UD_WATCH);
        self.push_sqe(&sqe)?;
        self.watching = true;
        Ok(())
    }

    fn take_woken(&mut self) -> bool {
        std::mem::take(&mut self.woken)
    }

    fn copy_in(&mut self, tag: u16, dst: &mut [u8]) -> io::Result<()> {
        if !self.user_copy || self.skip_copies {
            return Ok(()); // the driver copied into the buffer before the fetch completed
        }
        let pos = sys::user_copy_pos(self.qid, tag, 0);
        // SAFETY: `dst` is a live, writable buffer of `dst.len()` bytes.
        let n = unsafe {
            libc::pread(
                self.cdev.as_raw_fd(),
                dst.as_mut_ptr().cast(),
                dst.len(),
                pos as libc::off_t,
            )
        };
        full(n, dst.len())
    }

    fn copy_out(&mut self, tag: u16, src: &[u8]) -> io::Result<()> {
        if !self.user_copy || self.skip_copies {
            return Ok(()); // the driver copies out of the buffer on commit
        }
        let pos = sys::user_copy_pos(self.qid, tag, 0);
        // SAFETY: `src` is a live buffer of `src.len()` bytes.
        let n = unsafe {
            libc::pwrite(
                self.cdev.as_raw_fd(),
                src.as_ptr().cast(),
                src.len(),
                pos as libc::off_t,
            )
        };
        full(n, src.len())
    }
}

fn full(n: isize, want: usize) -> io::Result<()> {
    if n < 0 {
        Err(io::Error::last_os_error())
    } else if n as usize != want {
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("user copy moved {n} of {want} bytes"),
        ))
    } else {
        Ok(())
    }
}
