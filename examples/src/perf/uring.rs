//! The io_uring baseline: `uring:null` (IORING_OP_NOP, the kernel path with
//! no device behind it) and `uring:<path>` (a file or block device, O_DIRECT
//! where the file system allows, fixed files and registered buffers like
//! fio's `t/io_uring -B1 -F1`).
//!
//! Each job builds its own ring on its own thread (SINGLE_ISSUER and
//! DEFER_TASKRUN when the kernel has them), and [`UringQueue::submit`] is a
//! single `io_uring_enter` that submits the batch and, when I/Os are in
//! flight and none has completed yet, waits for one — t/io_uring's loop.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use io_uring::{opcode, squeue, types, IoUring};

use crate::queue::{Failure, IoReq, IoStatus, JobQueue, PushError, QueueError};
use crate::workload::Op;

/// Bytes written per call when laying out a file.
const LAYOUT_CHUNK: usize = 1 << 20;
/// Default logical block size for files (O_DIRECT-safe on 4Kn and 512e devices).
pub const DEFAULT_FILE_LBADS: u32 = 4096;
/// Blocks `uring:null` pretends to have (LBAs are generated, never used).
pub const NULL_BLOCKS: u64 = 1 << 28;

/// A block device's logical block size (`BLKSSZGET`), checked to be a
/// power of two from 512 B to 64 KiB.
fn logical_block_size(dev: &std::fs::File) -> std::io::Result<u32> {
    let mut size: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one `int` through the pointer, which points
    // at `size`, alive for the call; `dev` is an open descriptor.
    let r = unsafe { libc::ioctl(dev.as_raw_fd(), libc::BLKSSZGET, &mut size) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    u32::try_from(size)
        .ok()
        .filter(|s| s.is_power_of_two() && (512..=65536).contains(s))
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("the device reports a logical block of {size} bytes"),
            )
        })
}

/// Why an io_uring target could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum UringError {
    /// The kernel refused io_uring.
    #[error("io_uring setup failed ({0}); check /proc/sys/kernel/io_uring_disabled and seccomp/container limits")]
    Setup(std::io::Error),
    /// The file could not be opened or created.
    #[error("cannot open {path}: {source}")]
    Open {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is too small or unusable.
    #[error("{0}")]
    File(String),
    /// Buffer memory could not be mapped.
    #[error("cannot allocate {len} bytes of I/O buffers: {source}")]
    Buffers {
        /// Bytes asked for.
        len: usize,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Page-aligned anonymous memory for I/O buffers, unmapped on drop.
///
/// The mapping is `memmap2`'s; the kernel reads and writes it during I/O, so
/// no Rust reference (`&[u8]`/`&mut [u8]`) is ever formed over it: the
/// pointer is taken once, at creation, and only raw pointers are handed out.
#[derive(Debug)]
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    /// Owns the mapping (unmapped when dropped). Never dereferenced.
    _map: memmap2::MmapMut,
}

// SAFETY: the owner hands out only raw pointers; access through them is the
// job's (single thread) business, so moving the owner between threads is fine.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// Map `len` bytes (rounded up to 4 KiB), populated and zeroed.
    pub fn new(len: usize) -> Result<Self, UringError> {
        let len = len.max(1).div_ceil(4096) * 4096;
        let mut map = memmap2::MmapOptions::new()
            .len(len)
            .populate()
            .map_anon()
            .map_err(|source| UringError::Buffers { len, source })?;
        // `as_mut_ptr` reads the mapping's address without forming a slice.
        let ptr = NonNull::new(map.as_mut_ptr()).ok_or_else(|| UringError::Buffers {
            len,
            source: std::io::Error::other("anonymous mapping at address 0"),
        })?;
        Ok(AlignedBuf { ptr, _map: map })
    }

    /// Start of the memory.
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }
}

/// What a uring target talks to.
#[derive(Debug)]
enum Backing {
    Null,
    File { file: File },
}

/// A `uring:` device, shared by all jobs (each job makes its own ring).
#[derive(Debug)]
pub struct UringTarget {
    backing: Backing,
    lbads: u32,
    blocks: u64,
    direct: bool,
    notes: Vec<String>,
}

/// Write zeros over `[from, to)` of `f` and flush them, as fio lays out a
/// file before a run: reads then measure the device, not holes.
fn lay_out(f: &File, from: u64, to: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let zeros = vec![0u8; LAYOUT_CHUNK];
    let mut at = from;
    while at < to {
        let n = (to - at).min(LAYOUT_CHUNK as u64) as usize;
        f.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    f.sync_data()
}

fn is_mounted(path: &Path) -> bool {
    let Ok(canon) = std::fs::canonicalize(path) else {
        return false;
    };
    let Ok(mounts) = std::fs::read_to_string("/proc/mounts") else {
        return false;
    };
    let dev = canon.to_string_lossy().to_string();
    mounts.lines().any(|l| {
        l.split_whitespace().next().is_some_and(|src| {
            src == dev
                || (src.starts_with(&dev)
                    && src[dev.len()..]
                        .chars()
                        .all(|c| c.is_ascii_digit() || c == 'p'))
        })
    })
}

impl UringTarget {
    /// `uring:null`.
    pub fn null() -> Self {
        UringTarget {
            backing: Backing::Null,
            lbads: 512,
            blocks: NULL_BLOCKS,
            direct: false,
            notes: vec!["uring:null submits IORING_OP_NOP: no device, no data; the kernel submission/completion path only".into()],
        }
    }

    /// `uring:<path>`: open (or create) a file or block device.
    pub fn open(
        path: &Path,
        lbads: Option<u32>,
        size: Option<u64>,
        direct: Option<bool>,
        writes: bool,
    ) -> Result<Self, UringError> {
        let mut notes = Vec::new();
        let open_err = |source| UringError::Open {
            path: path.into(),
            source,
        };
        let mut meta = std::fs::metadata(path).ok();
        match (&meta, size) {
            (Some(m), _) if m.is_dir() => {
                return Err(UringError::File(format!(
                    "{} is a directory; give a file or a block device (uring:{}/test.img,size=64M creates a file)",
                    path.display(),
                    path.display()
                )))
            }
            (Some(m), _) if !m.is_file() && !m.file_type().is_block_device() => {
                return Err(UringError::File(format!(
                    "{} is neither a regular file nor a block device",
                    path.display()
                )))
            }
            (Some(_), _) => {}
            // A typo must not create a file: only `size=` asks for one.
            (None, None) => {
                return Err(UringError::File(format!(
                    "{} does not exist; check the path, or add size= to create and lay out a file (uring:{},size=64M)",
                    path.display(),
                    path.display()
                )))
            }
            (None, Some(want)) => {
                let f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(path)
                    .map_err(open_err)?;
                lay_out(&f, 0, want).map_err(open_err)?;
                notes.push(format!(
                    "{}: created and laid out {want} bytes (written, not sparse)",
                    path.display()
                ));
                meta = std::fs::metadata(path).ok();
            }
        }
        let is_blk = meta
            .as_ref()
            .is_some_and(|m| m.file_type().is_block_device());
        if is_blk && writes && is_mounted(path) {
            return Err(UringError::File(format!(
                "{} (or one of its partitions) is mounted; refusing to write to it",
                path.display()
            )));
        }
        let want_direct = direct.unwrap_or(true);
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            // Read-only workloads open read-only: never ask for write access
            // to a device or file the run will not write.
            o.read(true).write(writes);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(path)
        };
        let (mut file, mut direct) = match open(want_direct) {
            Ok(f) => (f, want_direct),
            Err(e) if want_direct && e.raw_os_error() == Some(libc::EINVAL) => {
                notes.push(format!("{}: the file system refuses O_DIRECT; using buffered I/O (the page cache is measured, not a device)", path.display()));
                (open(false).map_err(open_err)?, false)
            }
            Err(e) => return Err(open_err(e)),
        };
        // A block device is addressed in its own logical blocks; a file in
        // 4 KiB, which O_DIRECT accepts on 512 B and 4 KiB devices alike.
        let lbads = match lbads {
            Some(l) => l,
            None if is_blk => logical_block_size(&file).map_err(open_err)?,
            None => DEFAULT_FILE_LBADS,
        };
        let mut len = file.seek(SeekFrom::End(0)).map_err(open_err)?;
        if !is_blk {
            let want = size.unwrap_or(len);
            if len < want && !writes {
                return Err(UringError::File(format!(
                    "{} holds {len} bytes but {want} were asked for; a read-only run does not extend files",
                    path.display()
                )));
            }
            if len < want {
                // Through a buffered handle: the tail need not be aligned.
                let f = OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(open_err)?;
                lay_out(&f, len, want).map_err(open_err)?;
                notes.push(format!(
                    "{}: extended from {len} to {want} bytes and laid out (written, not sparse)",
                    path.display()
                ));
                len = want;
            }
        } else if let Some(s) = size {
            len = len.min(s);
        }
        let blocks = len / lbads as u64;
        if blocks == 0 {
            return Err(UringError::File(format!(
                "{} holds {len} bytes, less than one {lbads}-byte block; give it a size (uring:{},size=64M)",
                path.display(),
                path.display()
            )));
        }
        if direct {
            // Probe: some file systems accept O_DIRECT at open and fail the I/O.
            let buf = AlignedBuf::new(lbads as usize)?;
            // SAFETY: buf is `lbads` writable bytes owned here.
            let r = unsafe {
                libc::pread(
                    file.as_raw_fd(),
                    buf.ptr().as_ptr().cast(),
                    lbads as usize,
                    0,
                )
            };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                notes.push(format!("{}: O_DIRECT read of {lbads} bytes failed ({e}); using buffered I/O (lbads may be below the device's logical block size)", path.display()));
                file = open(false).map_err(open_err)?;
                direct = false;
            }
        }
        Ok(UringTarget {
            backing: Backing::File { file },
            lbads,
            blocks,
            direct,
            notes,
        })
    }

    /// Logical block size in bytes.
    pub fn lbads(&self) -> u32 {
        self.lbads
    }

    /// Blocks available.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Remarks for the report.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// A one-line description of the backend.
    pub fn describe(&self) -> String {
        match &self.backing {
            Backing::Null => "io_uring IORING_OP_NOP".into(),
            Backing::File { .. } => format!(
                "io_uring read/write{}, fixed file + registered buffers",
                if self.direct {
                    " O_DIRECT"
                } else {
                    " (buffered)"
                }
            ),
        }
    }

    /// Build one job's ring with `depth` slots of `buf_len` bytes.
    pub fn queue(self: &Arc<Self>, depth: usize, buf_len: usize) -> Result<UringQueue, UringError> {
        let entries = (depth.max(1) as u32).next_power_of_two();
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_coop_taskrun()
            .build(entries)
            .or_else(|_| IoUring::builder().build(entries))
            .map_err(UringError::Setup)?;
        let bufs = AlignedBuf::new(depth * buf_len)?;
        let mut fixed_buffers = false;
        if let Backing::File { file } = &self.backing {
            ring.submitter()
                .register_files(&[file.as_raw_fd()])
                .map_err(UringError::Setup)?;
            let iov: Vec<libc::iovec> = (0..depth)
                .map(|i| libc::iovec {
                    // SAFETY: i * buf_len < depth * buf_len = the mapping's length.
                    iov_base: unsafe { bufs.ptr().as_ptr().add(i * buf_len) }.cast(),
                    iov_len: buf_len,
                })
                .collect();
            // SAFETY: the iovecs cover `bufs`, which the queue owns and drops
            // after the ring (field order), so they stay valid while registered.
            fixed_buffers = depth <= u16::MAX as usize
                && unsafe { ring.submitter().register_buffers(&iov) }.is_ok();
        }
        Ok(UringQueue {
            ring,
            bufs,
            target: Arc::clone(self),
            depth,
            buf_len,
            fixed_buffers,
            pending: 0,
            expect: vec![0; depth],
        })
    }
}

/// One job's ring.
pub struct UringQueue {
    // Field order: the ring (which may reference `bufs`) drops first.
    ring: IoUring,
    bufs: AlignedBuf,
    target: Arc<UringTarget>,
    depth: usize,
    buf_len: usize,
    fixed_buffers: bool,
    /// SQEs pushed since the last enter.
    pending: u32,
    /// Expected result (bytes) per slot.
    expect: Vec<u32>,
}

impl JobQueue for UringQueue {
    fn depth(&self) -> usize {
        self.depth
    }

    fn buffer_len(&self) -> usize {
        self.buf_len
    }

    #[inline]
    fn buffer(&self, slot: usize) -> NonNull<u8> {
        debug_assert!(slot < self.depth);
        // SAFETY: slot < depth, so the offset is inside the mapping.
        unsafe { self.bufs.ptr().add(slot * self.buf_len) }
    }

    #[inline]
    fn push(&mut self, slot: usize, req: IoReq) -> Result<(), PushError> {
        let entry = match &self.target.backing {
            Backing::Null => {
                self.expect[slot] = 0;
                opcode::Nop::new().build()
            }
            Backing::File { .. } => {
                let len = req.nlb * self.target.lbads;
                debug_assert!(len as usize <= self.buf_len);
                self.expect[slot] = len;
                let off = req.slba * self.target.lbads as u64;
                let buf = self.buffer(slot).as_ptr();
                let fd = types::Fixed(0);
                match (req.op, self.fixed_buffers) {
                    (Op::Read, true) => opcode::ReadFixed::new(fd, buf, len, slot as u16)
                        .offset(off)
                        .build(),
                    (Op::Write, true) => opcode::WriteFixed::new(fd, buf, len, slot as u16)
                        .offset(off)
                        .build(),
                    (Op::Read, false) => opcode::Read::new(fd, buf, len).offset(off).build(),
                    (Op::Write, false) => opcode::Write::new(fd, buf, len).offset(off).build(),
                }
            }
        };
        let entry: squeue::Entry = entry.user_data(slot as u64);
        // SAFETY: the buffer is this slot's, owned by the queue and not in
        // flight (the job's contract); it outlives the ring (field order).
        unsafe { self.ring.submission().push(&entry) }.map_err(|_| PushError::Full)?;
        self.pending += 1;
        Ok(())
    }

    #[inline]
    fn submit(&mut self, inflight: usize) -> Result<(), QueueError> {
        let ready = !self.ring.completion().is_empty();
        if self.pending == 0 && (ready || inflight == 0) {
            return Ok(());
        }
        let want = usize::from(!ready && inflight > 0);
        loop {
            match self.ring.submitter().submit_and_wait(want) {
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e)
                    if e.raw_os_error() == Some(libc::EBUSY)
                        || e.raw_os_error() == Some(libc::EAGAIN) =>
                {
                    break
                }
                Err(e) => return Err(QueueError(format!("io_uring_enter failed: {e}"))),
            }
        }
        self.pending = 0;
        Ok(())
    }

    #[inline]
    fn reap<F: FnMut(usize, IoStatus)>(&mut self, mut done: F) -> Result<usize, QueueError> {
        let mut n = 0;
        for cqe in self.ring.completion() {
            let slot = cqe.user_data() as usize;
            let res = cqe.result();
            let want = self.expect[slot];
            let status = if res < 0 {
                IoStatus::Failed(Failure::Errno(-res))
            } else if res as u32 != want {
                IoStatus::Failed(Failure::Short {
                    got: res as u32,
                    want,
                })
            } else {
                IoStatus::Ok
            };
            done(slot, status);
            n += 1;
        }
        Ok(n)
    }
}
