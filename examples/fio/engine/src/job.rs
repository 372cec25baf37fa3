//! One fio job: its files (NVMe namespaces or UFS logical units), its queue
//! pair and its I/O buffers.
//!
//! fio calls `setup` (from its main thread, before the job threads start),
//! then on the job's own thread `init`, `iomem_alloc`, and the I/O calls
//! `queue`/`commit`/`getevents`/`event`, and finally `iomem_free` and
//! `cleanup`. The queue pair is created in `init`, on the thread that uses
//! it; nothing on the I/O path locks, allocates or makes a system call.
//!
//! The queue pair is NVMe's, UFS's or NVMe/TCP's, chosen once in `init` by the device's
//! transport (`Qp`); each I/O call matches on it once and runs code that
//! is generic over [`BlockQueue`], monomorphised per transport (no dynamic
//! dispatch per I/O).

use std::sync::Arc;
use std::time::{Duration, Instant};

use mcqio::core::block::BlockQueue;
use mcqio::nvme::tcp::TcpQueuePair;
use mcqio::ufs::{UfsQpairOptions, UfsQueuePair};
use mcqio::{
    DmaSlice, IoBuf, IoError, IoSeg, QpairOptions, QueuePair, SubmitErrorKind, TimeoutPolicy,
};
use mcqio_vfio::{DmaDir, DmaRegion, DmaSpace, Iova};

use crate::device::{Ctrl, Device};
use crate::spec::{parse_filename, DeviceOptions, Target, Unit};
use crate::EngineError;

/// What fio asks a command to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Read into the buffer.
    Read,
    /// Write from the buffer.
    Write,
    /// Deallocate the range (no buffer).
    Trim,
    /// Flush the volatile write cache (no buffer, no range).
    Flush,
}

/// A finished command as `getevents` reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Event {
    /// The tag given to [`Job::queue`] (fio's `io_u` pointer).
    pub tag: u64,
    /// 0, or a positive errno.
    pub errno: i32,
}

/// What [`Job::queue`] did with a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queued {
    /// In the submission queue; it completes through `getevents`.
    Queued,
    /// The queue is full: fio must reap completions and retry.
    Busy,
    /// Not submitted; it completes at once with this errno.
    Failed(i32),
}

/// A file of the job: a namespace (NVMe) or logical unit (UFS) of the
/// job's controller, as fio sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileInfo {
    /// Namespace id (NVMe) or LUN (UFS).
    pub unit: u32,
    /// log2 of the block size.
    pub lba_shift: u32,
    /// Capacity in bytes.
    pub size: u64,
}

impl FileInfo {
    /// The cookie fio keeps in `fio_file::engine_pos`: the namespace id
    /// (or LUN) and block shift, so `queue` needs no lookup.
    pub fn cookie(&self) -> u64 {
        (u64::from(self.unit) << 8) | u64::from(self.lba_shift)
    }

    fn from_cookie(c: u64) -> (u32, u32) {
        ((c >> 8) as u32, (c & 0xff) as u32)
    }
}

/// A view into the job's DMA region: fio's `xfer_buf` for one command (the
/// engine's [`DmaSlice`]).
///
/// Only created by [`Job::queue`], from a range checked to lie inside the
/// job's region; the only place it lives after that is the job's queue
/// pair, which is closed before the region is freed ([`Job::free_buffers`],
/// also run by `Job`'s `Drop`). A read or write that ends without its
/// buffer (the device may still access it: a failed controller that could
/// not be disabled, a withdrawal the controller did not confirm) poisons
/// the region: it is then leaked, never unmapped or reused (the
/// [`DmaSlice::new`] contract), and counted ([`Device::leaked_bytes`]).
type FioBuf = DmaSlice;

/// fio's buffer for an NVMe/TCP queue pair: the [`FioBuf`] and the host
/// address of the same bytes, which the wire copies from (writes) and
/// into (reads) — a socket reaches no memory by IOVA
/// ([`IoBuf::segment_host`]). Two more words than a `FioBuf`, built per
/// I/O on the stack; nothing is allocated.
#[derive(Clone, Copy, Debug)]
struct TcpBuf {
    slice: FioBuf,
    /// Host address of the slice's first byte (an integer, so the buffer
    /// stays `Send` as the slice is).
    host: usize,
}

// SAFETY: the IOVA side is the slice's, under the `DmaSlice::new` contract
// `Job::queue` upholds (mapped in the controller's space, allocated while
// the queue pair may touch it, no Rust reference meanwhile). `host` is the
// job region's host address plus the same offset the slice's IOVA has
// from the region's IOVA (`Job::queue` builds both from one `start`), so it
// addresses the same `len` bytes, inside the region, for as long as the
// slice's memory stays allocated. All answers come from fields that never
// change.
unsafe impl IoBuf for TcpBuf {
    #[inline]
    fn segment_count(&self) -> usize {
        1
    }
    #[inline]
    fn segment(&self, i: usize) -> IoSeg {
        self.slice.segment(i)
    }
    #[inline]
    fn dir(&self) -> DmaDir {
        self.slice.dir()
    }
    #[inline]
    fn segment_host(&self, _i: usize) -> Option<std::ptr::NonNull<u8>> {
        std::ptr::NonNull::new(self.host as *mut u8)
    }
    #[inline]
    fn is_mapped_in(&self, space: &DmaSpace) -> bool {
        self.slice.is_mapped_in(space)
    }
    #[inline]
    fn total_len(&self) -> usize {
        self.slice.len()
    }
}

/// fio's buffers: one region, and where it starts in the host and device
/// address spaces.
struct Buffers {
    region: DmaRegion,
    base: usize,
    len: usize,
    iova: Iova,
    space: Arc<DmaSpace>,
}

/// Empty polls between two looks at the clock while `getevents` waits.
const CLOCK_EVERY: u32 = 1024;

/// The job's queue pair, of the device's transport.
// One per job, held in place for the job's life: boxing the larger variant
// would save a few hundred bytes once and cost a pointer chase per I/O.
#[allow(clippy::large_enum_variant)]
enum Qp {
    /// NVMe: commands address a namespace id.
    Nvme(QueuePair<FioBuf>),
    /// UFS: commands address a logical unit.
    Ufs(UfsQueuePair<FioBuf>),
    /// NVMe/TCP: commands address a namespace id; the job's own
    /// connection.
    Tcp(TcpQueuePair<TcpBuf>),
}

impl Qp {
    fn outstanding(&self) -> usize {
        match self {
            Qp::Nvme(q) => q.outstanding(),
            Qp::Ufs(q) => q.outstanding(),
            Qp::Tcp(q) => q.outstanding(),
        }
    }

    /// Close: every command still in flight ends here, those that carried
    /// a buffer and got it back are counted off `bufs`.
    fn close(self, bufs: &mut BufsOut) -> mcqio::Result<()> {
        match self {
            Qp::Nvme(q) => BlockQueue::close(q, |c| bufs.returned(c.buf.is_some())),
            Qp::Ufs(q) => BlockQueue::close(q, |c| bufs.returned(c.buf.is_some())),
            Qp::Tcp(q) => BlockQueue::close(q, |c| bufs.returned(c.buf.is_some())),
        }
    }
}

/// Which of the job's buffers the device may still access.
///
/// A completion names no command kind, and a trim or flush comes back
/// without a buffer as a leaked read or write does; so the job counts the
/// reads and writes whose buffer has not come back. More of them than
/// commands outstanding means one ended without its buffer (seen at the
/// latest when the queue is idle or closed): the region is poisoned.
#[derive(Debug, Default)]
struct BufsOut {
    /// Reads and writes submitted whose buffer has not come back.
    out: usize,
    /// One of them ended without it: the device may still access the
    /// region, which must never be freed or handed to the device again.
    poisoned: bool,
}

impl BufsOut {
    #[inline]
    fn submitted(&mut self) {
        self.out += 1;
    }

    /// A completion; `buf` says whether it brought a buffer back.
    #[inline]
    fn returned(&mut self, buf: bool) {
        if buf {
            // Every buffer handed back was counted when it was submitted.
            self.out = self.out.saturating_sub(1);
        }
    }

    /// Compare with the commands still outstanding.
    #[inline]
    fn check(&mut self, outstanding: usize) {
        if self.out > outstanding {
            self.poisoned = true;
        }
    }
}

/// Submit one command on `qp` (no doorbell). `buf` is `Some` for reads and
/// writes.
#[inline]
fn submit<Q: BlockQueue>(
    qp: &mut Q,
    at: Q::Addr,
    op: Op,
    lba: u64,
    blocks: u32,
    buf: Option<Q::Buf>,
    tag: u64,
) -> Result<(), SubmitErrorKind> {
    match (op, buf) {
        (Op::Read, Some(b)) => qp.read(at, lba, blocks, b, tag).map_err(|e| e.kind),
        (Op::Write, Some(b)) => qp.write(at, lba, blocks, b, tag).map_err(|e| e.kind),
        (Op::Trim, _) => qp.deallocate(at, lba, blocks, tag).map_err(|e| e.kind),
        (Op::Flush, _) => qp.flush(at, tag).map_err(|e| e.kind),
        // A read or write without a buffer is never built by `Job::queue`.
        (Op::Read | Op::Write, None) => Err(SubmitErrorKind::ZeroLength),
    }
}

/// Poll `qp` until at least `min` (at most `max`) completions are in
/// `events`, or `timeout` passed.
#[inline]
fn reap<Q: BlockQueue>(
    qp: &mut Q,
    bufs: &mut BufsOut,
    events: &mut [Event],
    min: usize,
    max: usize,
    timeout: Option<Duration>,
) -> Result<usize, EngineError> {
    let max = max.min(events.len());
    let min = min.min(max);
    let mut n = 0;
    let mut idle = 0u32;
    let mut deadline = None;
    loop {
        let r = qp.poll(max - n, |c| {
            bufs.returned(c.buf.is_some());
            let errno = errno_of(&c.result);
            // poll delivers at most `max - n` completions.
            if let Some(e) = events.get_mut(n) {
                *e = Event { tag: c.tag, errno };
                n += 1;
            }
        });
        bufs.check(qp.outstanding());
        if let Err(e) = r {
            if n > 0 {
                return Ok(n);
            }
            return Err(EngineError::Controller(e.to_string()));
        }
        if n >= min {
            return Ok(n);
        }
        if let Some(t) = timeout {
            idle = idle.wrapping_add(1);
            if idle % CLOCK_EVERY == 0 {
                let now = Instant::now();
                let end = *deadline.get_or_insert(now + t);
                if now >= end {
                    return Ok(n);
                }
            }
        }
        std::hint::spin_loop();
    }
}

/// fio's errno for a command's result.
#[inline(always)]
fn errno_of(r: &Result<(), IoError>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(IoError::TimedOut) => libc::ETIMEDOUT,
        Err(_) => libc::EIO,
    }
}

/// [`reap`] for a queue pair that waits on its interrupt (`wait=irq` or
/// `hybrid`): each round sleeps in the queue pair's `wait`, as its policy
/// says, instead of spinning. A queue with nothing in flight returns from
/// `wait` at once, so `min` beyond what is in flight runs to `timeout` as
/// in `reap`.
#[cold]
#[inline(never)]
fn reap_waiting<Q: BlockQueue>(
    qp: &mut Q,
    bufs: &mut BufsOut,
    events: &mut [Event],
    min: usize,
    max: usize,
    timeout: Option<Duration>,
) -> Result<usize, EngineError> {
    let max = max.min(events.len());
    if max == 0 {
        // No room for an event: the queue pair's wait refuses to wait for
        // at most 0 completions.
        return Ok(0);
    }
    let min = min.min(max);
    let mut n = 0;
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let r = qp.wait(max - n, left, |c| {
            bufs.returned(c.buf.is_some());
            let errno = errno_of(&c.result);
            // wait delivers at most `max - n` completions.
            if let Some(e) = events.get_mut(n) {
                *e = Event { tag: c.tag, errno };
                n += 1;
            }
        });
        bufs.check(qp.outstanding());
        if let Err(e) = r {
            if n > 0 {
                return Ok(n);
            }
            return Err(EngineError::Controller(e.to_string()));
        }
        if n >= min || deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(n);
        }
        if qp.outstanding() == 0 {
            std::hint::spin_loop();
        }
    }
}

/// One job's engine state.
pub struct Job {
    // `Drop` closes the queue pair (which may hold FioBufs) before it frees
    // the buffers they point into (or leaks them), and both go before the
    // device.
    qp: Option<Qp>,
    bufs: Option<Buffers>,
    out: BufsOut,
    events: Vec<Event>,
    files: Vec<FileInfo>,
    dev: Arc<Device>,
    /// `wait=irq|hybrid`: `getevents` sleeps in the queue pair's `wait`.
    waits: bool,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("device", &self.dev.key())
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl Job {
    /// Open (or share) the controller the job's files name and look up
    /// their namespaces. All files of a job must be on one controller.
    pub fn setup(
        names: &[&str],
        opts: &DeviceOptions,
        max_io: u64,
    ) -> Result<(Job, Vec<FileInfo>), EngineError> {
        if names.is_empty() {
            return Err(EngineError::NoFile);
        }
        let targets = names
            .iter()
            .map(|n| parse_filename(n))
            .collect::<Result<Vec<_>, _>>()?;
        let kind = &targets[0].device;
        if let Some(t) = targets.iter().find(|t| t.device != *kind) {
            return Err(EngineError::TwoControllers {
                first: kind.label(),
                other: t.device.label(),
            });
        }
        let dev = Device::get(kind, opts, max_io)?;
        Job::on_device(dev, &targets, names, max_io)
    }

    /// The job of `targets` (parsed from `names`) on `dev`.
    fn on_device(
        dev: Arc<Device>,
        targets: &[Target],
        names: &[&str],
        max_io: u64,
    ) -> Result<(Job, Vec<FileInfo>), EngineError> {
        let first = names.first().copied().unwrap_or_default();
        if dev.max_transfer() < max_io {
            return Err(EngineError::TooLarge {
                bs: max_io,
                max: dev.max_transfer(),
                file: first.to_string(),
            });
        }
        let mut files = Vec::with_capacity(targets.len());
        for (t, name) in targets.iter().zip(names) {
            files.push(file_info(&dev, t.unit, name)?);
        }
        let job = Job {
            qp: None,
            bufs: None,
            out: BufsOut::default(),
            events: Vec::new(),
            files: files.clone(),
            waits: dev.options().wait != mcqio::WaitPolicy::Poll,
            dev,
        };
        Ok((job, files))
    }

    /// Create the job's queue pair (on the calling thread, the job's), for
    /// a job fio may answer busy (see [`Job::init_with`]).
    pub fn init(&mut self, depth: u32) -> Result<(), EngineError> {
        self.init_with(depth, false)
    }

    /// Create the job's queue pair. `ordered_verify`: fio checks this
    /// job's reads against write seeds it replays in the order it logged
    /// the writes (a mixed `rw` with `verify`, no `verify_backlog`). fio
    /// logs a write before it queues it, and on a busy answer unlogs it and
    /// logs it again when it requeues it, now at the end: every seed after
    /// that point is then replayed against the wrong block, and verify
    /// reports "bad header rand_seed" although the data is right (seen on
    /// the fake UFS with 8-slot queues at iodepth 32; the same job with
    /// `verify_backlog`, or split into a write and a verify job, passes
    /// through the same busy answers). Such a job is refused an iodepth
    /// the queue pair cannot hold rather than run into that.
    pub fn init_with(&mut self, depth: u32, ordered_verify: bool) -> Result<(), EngineError> {
        let depth = u16::try_from(depth)
            .ok()
            .filter(|d| (1..=4096).contains(d))
            .ok_or(EngineError::Depth(depth))?;
        let o = self.dev.options();
        let qerr = |e: mcqio::Error| EngineError::Qpair {
            why: e.to_string(),
            granted: self.dev.granted_queues(),
        };
        let qp = match self.dev.ctrl() {
            // The job's own connection. Its depth is capped to the
            // target's queues (CAP.MQES; Linux's nvmet-tcp and the fake
            // offer 128 entries): a deeper iodepth gets `Busy` when the
            // queue is full, as on UFS.
            Ctrl::Tcp(ctrl) => {
                let most =
                    (ctrl.cap().max_queue_entries().saturating_sub(1)).clamp(1, 4096) as usize;
                if ordered_verify && usize::from(depth) > most {
                    return Err(EngineError::TcpDepth {
                        iodepth: u32::from(depth),
                        depth: most,
                    });
                }
                let qopts = QpairOptions {
                    // `most` is at most 4096.
                    depth: depth.min(most as u16),
                    io_timeout: o.io_timeout,
                    timeout_policy: TimeoutPolicy::Abort,
                    wait: o.wait,
                    ..QpairOptions::default()
                };
                Qp::Tcp(ctrl.create_qpair_for::<TcpBuf>(qopts).map_err(qerr)?)
            }
            Ctrl::Nvme(ctrl) => {
                let qopts = QpairOptions {
                    depth,
                    io_timeout: o.io_timeout,
                    timeout_policy: TimeoutPolicy::Abort,
                    wait: o.wait,
                    ..QpairOptions::default()
                };
                Qp::Nvme(ctrl.create_qpair_for::<FioBuf>(qopts).map_err(qerr)?)
            }
            // The UFS queue depth is the controller's (set when it was
            // opened); a deeper iodepth gets `Busy` when the queue is full.
            Ctrl::Ufs(ctrl) => {
                let qopts = UfsQpairOptions {
                    io_timeout: o.io_timeout,
                    timeout_policy: TimeoutPolicy::Abort,
                    wait: o.wait,
                    ..Default::default()
                };
                let q = ctrl.create_qpair_for::<FioBuf>(qopts).map_err(qerr)?;
                // fio queues up to iodepth commands; above the queue's
                // depth the engine answers busy, which fio handles, except
                // in the verify of an ordered-verify job (see `init_with`).
                if ordered_verify && usize::from(depth) > q.depth() {
                    return Err(EngineError::UfsDepth {
                        iodepth: u32::from(depth),
                        depth: q.depth(),
                    });
                }
                Qp::Ufs(q)
            }
        };
        self.events = vec![Event::default(); usize::from(depth)];
        self.qp = Some(qp);
        Ok(())
    }

    /// Allocate fio's I/O buffers: one DMA region of `len` bytes, mapped
    /// for the device once. Returns its host address.
    pub fn alloc_buffers(&mut self, len: usize) -> Result<*mut u8, EngineError> {
        self.free_buffers();
        let space = self.dev.dma();
        let region = space
            .alloc(len.max(1), DmaDir::Bidirectional)
            .map_err(|e| EngineError::Memory {
                len,
                why: e.to_string(),
            })?;
        let ptr = region.as_ptr().as_ptr();
        self.bufs = Some(Buffers {
            base: ptr as usize,
            len: region.len(),
            iova: region.iova(),
            space: Arc::clone(space),
            region,
        });
        Ok(ptr)
    }

    /// Free fio's buffers. If commands are still in flight (fio frees its
    /// buffers before it cleans up the engine) the queue pair is closed
    /// first, so the device cannot reach the memory any more. If a read or
    /// write came back without its buffer the device may still access the
    /// region: it is leaked instead (never unmapped, never reused) and
    /// counted at the device ([`Device::leaked_bytes`]).
    pub fn free_buffers(&mut self) {
        if self.bufs.is_none() {
            return;
        }
        if self.qp.as_ref().is_some_and(|q| q.outstanding() > 0) {
            if let Some(qp) = self.qp.take() {
                let _ = qp.close(&mut self.out);
            }
        }
        let outstanding = self.qp.as_ref().map_or(0, Qp::outstanding);
        self.out.check(outstanding);
        if let Some(b) = self.bufs.take() {
            if self.out.poisoned {
                let len = b.region.len() as u64;
                eprintln!(
                    "mcqio fio engine ({}): the device may still access this job's buffers; leaking {len} bytes",
                    self.dev.key()
                );
                self.dev.note_leak(len);
                // The device may still write it: never unmapped, never
                // freed (the DmaSlice contract).
                std::mem::forget(b.region);
            } else {
                drop(b.region);
            }
        }
        // Nothing of the next region is in flight.
        self.out = BufsOut::default();
    }

    /// Queue one command (the doorbell rings in [`Job::commit`]).
    #[inline]
    pub fn queue(
        &mut self,
        cookie: u64,
        op: Op,
        offset: u64,
        buf: *const u8,
        len: u64,
        tag: u64,
    ) -> Queued {
        let Some(qp) = self.qp.as_mut() else {
            return Queued::Failed(libc::EIO);
        };
        let (unit, shift) = FileInfo::from_cookie(cookie);
        let Some(mask) = 1u64.checked_shl(shift).map(|bs| bs - 1) else {
            return Queued::Failed(libc::EINVAL);
        };
        if op != Op::Flush && (offset | len) & mask != 0 {
            return Queued::Failed(libc::EINVAL);
        }
        let slba = offset >> shift;
        let Ok(nlb) = u32::try_from(len >> shift) else {
            return Queued::Failed(libc::EINVAL);
        };
        let slice = match op {
            Op::Read | Op::Write => {
                let Some(b) = self.bufs.as_ref() else {
                    return Queued::Failed(libc::EFAULT);
                };
                // The device may still access some buffer of the region:
                // none of it goes to the device again.
                if self.out.poisoned {
                    return Queued::Failed(libc::EIO);
                }
                // The buffer must lie inside the region fio got from us.
                let start = (buf as usize).wrapping_sub(b.base);
                let inside = (buf as usize) >= b.base
                    && usize::try_from(len)
                        .ok()
                        .and_then(|l| start.checked_add(l))
                        .is_some_and(|end| end <= b.len);
                if !inside {
                    return Queued::Failed(libc::EFAULT);
                }
                // SAFETY: the range lies inside the job's region (checked
                // above), mapped Bidirectional in `b.space` for the region's
                // whole life; the region outlives every slice (the queue
                // pair is closed before it is freed: see `FioBuf`). No Rust
                // reference to that memory exists: it is only handed to fio
                // as a raw pointer, and fio does not touch an io_u's buffer
                // between `queue` and the `event` that returns it.
                Some(unsafe {
                    DmaSlice::new(
                        &b.space,
                        b.iova.add(start as u64),
                        len as usize,
                        DmaDir::Bidirectional,
                    )
                })
            }
            Op::Trim | Op::Flush => None,
        };
        let r = match qp {
            Qp::Nvme(q) => submit(q, unit, op, slba, nlb, slice, tag),
            // The slice's host address: the region's, plus the same offset
            // its IOVA has (checked inside the region above).
            Qp::Tcp(q) => {
                let host = buf as usize;
                let b = slice.map(|slice| TcpBuf { slice, host });
                submit(q, unit, op, slba, nlb, b, tag)
            }
            Qp::Ufs(q) => match u8::try_from(unit) {
                Ok(lun) => submit(q, lun, op, slba, nlb, slice, tag),
                Err(_) => return Queued::Failed(libc::EINVAL),
            },
        };
        match r {
            Ok(()) => {
                if matches!(op, Op::Read | Op::Write) {
                    self.out.submitted();
                }
                Queued::Queued
            }
            Err(SubmitErrorKind::QueueFull) => Queued::Busy,
            Err(SubmitErrorKind::ControllerFailed) => Queued::Failed(libc::EIO),
            Err(SubmitErrorKind::Unsupported(_)) => Queued::Failed(libc::EOPNOTSUPP),
            Err(_) => Queued::Failed(libc::EINVAL),
        }
    }

    /// Ring the doorbell once for everything queued since the last commit.
    #[inline]
    pub fn commit(&mut self) {
        match self.qp.as_mut() {
            Some(Qp::Nvme(q)) => {
                q.submit();
            }
            Some(Qp::Ufs(q)) => {
                q.submit();
            }
            Some(Qp::Tcp(q)) => {
                q.submit();
            }
            None => {}
        }
    }

    /// Poll until at least `min` (at most `max`) commands completed, or
    /// `timeout` passed. Returns how many; they are read with [`Job::event`].
    /// `Err` when the controller failed and nothing completed.
    #[inline]
    pub fn getevents(
        &mut self,
        min: usize,
        max: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, EngineError> {
        if self.waits {
            return match self.qp.as_mut() {
                Some(Qp::Nvme(q)) => {
                    reap_waiting(q, &mut self.out, &mut self.events, min, max, timeout)
                }
                Some(Qp::Ufs(q)) => {
                    reap_waiting(q, &mut self.out, &mut self.events, min, max, timeout)
                }
                Some(Qp::Tcp(q)) => {
                    reap_waiting(q, &mut self.out, &mut self.events, min, max, timeout)
                }
                None => Err(EngineError::NotInitialised),
            };
        }
        match self.qp.as_mut() {
            Some(Qp::Nvme(q)) => reap(q, &mut self.out, &mut self.events, min, max, timeout),
            Some(Qp::Ufs(q)) => reap(q, &mut self.out, &mut self.events, min, max, timeout),
            Some(Qp::Tcp(q)) => reap(q, &mut self.out, &mut self.events, min, max, timeout),
            None => Err(EngineError::NotInitialised),
        }
    }

    /// Completion `i` of the last [`Job::getevents`].
    #[inline]
    pub fn event(&self, i: usize) -> Option<Event> {
        self.events.get(i).copied()
    }

    /// Close the queue pair (every command still in flight completes as
    /// aborted) and free the buffers (or leak them: see
    /// [`Job::free_buffers`]).
    pub fn close(mut self) -> Result<(), EngineError> {
        let r = match self.qp.take() {
            Some(qp) => qp
                .close(&mut self.out)
                .map_err(|e| EngineError::Controller(e.to_string())),
            None => Ok(()),
        };
        self.free_buffers();
        r
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // A job dropped without `close` (or unwinding): the queue pair must
        // still end before the region is freed, and a region the device may
        // still access must still be leaked.
        if let Some(qp) = self.qp.take() {
            let _ = qp.close(&mut self.out);
        }
        self.free_buffers();
    }
}

/// What fio needs to know of the file `name`: the unit `unit` selects on
/// the device's controller.
/// Refuse a job whose block sizes (`min_bs`, `max_bs`; 0: unknown) are
/// not whole logical blocks of every file, with the engine's own message
/// instead of fio's bare `err=22` at the first I/O (issue 29 item 7).
pub fn check_block_sizes(
    files: &[FileInfo],
    names: &[&str],
    min_bs: u64,
    max_bs: u64,
) -> Result<(), EngineError> {
    for (f, name) in files.iter().zip(names) {
        let lbs = 1u64 << f.lba_shift;
        for bs in [min_bs, max_bs] {
            if bs != 0 && bs % lbs != 0 {
                return Err(EngineError::Unaligned {
                    bs,
                    lbs,
                    file: name.to_string(),
                    hint: if name.starts_with("fake") && !name.starts_with("fake-ufs") {
                        " (or the fake's fake_lbs=)"
                    } else {
                        ""
                    },
                });
            }
        }
    }
    Ok(())
}

fn file_info(dev: &Device, unit: Unit, name: &str) -> Result<FileInfo, EngineError> {
    let wrong = |want: &'static str| EngineError::WrongSelector {
        file: name.to_string(),
        device: dev.key().to_string(),
        want,
    };
    match dev.ctrl() {
        Ctrl::Tcp(ctrl) => {
            let nsid = match unit {
                Unit::Default => 1,
                Unit::Ns(n) => n,
                Unit::Lun(_) => {
                    return Err(wrong("an NVMe/TCP target: select a namespace with ns=<N>"))
                }
            };
            let Some(ns) = ctrl.namespace(nsid) else {
                return Err(EngineError::NoNamespace {
                    file: name.to_string(),
                    nsid,
                    have: ctrl.namespaces().iter().map(|n| n.id).collect(),
                });
            };
            Ok(FileInfo {
                unit: ns.id,
                lba_shift: ns.lba_shift,
                size: ns.size_bytes(),
            })
        }
        Ctrl::Nvme(ctrl) => {
            let nsid = match unit {
                Unit::Default => 1,
                Unit::Ns(n) => n,
                Unit::Lun(_) => {
                    return Err(wrong("an NVMe controller: select a namespace with ns=<N>"))
                }
            };
            let Some(ns) = ctrl.namespace(nsid) else {
                return Err(EngineError::NoNamespace {
                    file: name.to_string(),
                    nsid,
                    have: ctrl.namespaces().iter().map(|n| n.id).collect(),
                });
            };
            Ok(FileInfo {
                unit: ns.id,
                lba_shift: ns.lba_shift,
                size: ns.size_bytes(),
            })
        }
        Ctrl::Ufs(ctrl) => {
            let lun = match unit {
                Unit::Default => 0,
                Unit::Lun(n) => n,
                Unit::Ns(_) => {
                    return Err(wrong(
                        "a UFS host controller: select a logical unit with lun=<N>",
                    ))
                }
            };
            let have = || ctrl.logical_units().iter().map(|l| l.lun).collect();
            let Some(lu) = ctrl.logical_unit(lun) else {
                return Err(EngineError::NoLogicalUnit {
                    file: name.to_string(),
                    lun,
                    have: have(),
                });
            };
            let size = lu
                .blocks
                .checked_mul(u64::from(lu.block_len))
                .ok_or_else(|| {
                    EngineError::Controller(format!(
                        "LU {lun}: {} blocks of {} bytes overflow 64 bits",
                        lu.blocks, lu.block_len
                    ))
                })?;
            Ok(FileInfo {
                unit: u32::from(lun),
                lba_shift: lu.block_shift(),
                size,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::FakeExec;

    /// Issue 29 item 7: a bs the device cannot do is refused at setup with
    /// the engine's reason (fio only said err=22 at the first I/O).
    #[test]
    fn block_sizes_must_be_whole_logical_blocks() {
        let f = FileInfo {
            unit: 1,
            lba_shift: 12,
            size: 1 << 20,
        };
        assert!(check_block_sizes(&[f], &["fake"], 4096, 65536).is_ok());
        assert!(check_block_sizes(&[f], &["fake"], 0, 0).is_ok());
        for (min, max, bad) in [(1024, 4096, 1024), (4096, 6144, 6144)] {
            let e = check_block_sizes(&[f], &["fake"], min, max)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!(
                    "bs {bad} is not a multiple of the device's 4096-byte"
                )) && e.contains("fake_lbs="),
                "{e}"
            );
        }
    }
    use mcqio_fixtures::ufs::{FakeUfs, Sense, UfsFault};
    use mcqio_vfio::HugePages;

    fn opts() -> DeviceOptions {
        DeviceOptions {
            huge_pages: HugePages::Never,
            dma_budget: 0,
            qpairs: 4,
            mcq: true,
            shadow_doorbells: false,
            io_timeout: None,
            fake_size: 1 << 20,
            fake_lbs: 512,
            fake_namespaces: 2,
            fake_exec: FakeExec::Sync,
            fake_latency: Duration::ZERO,
            fake_core: None,
            wait: mcqio::WaitPolicy::Poll,
        }
    }

    fn wait(job: &mut Job, want: usize) -> Vec<Event> {
        let n = job.getevents(want, want, None).unwrap();
        (0..n).map(|i| job.event(i).unwrap()).collect()
    }

    #[test]
    fn write_read_trim_through_the_views() {
        // Tests run in parallel and share the process's fake (same key and
        // options); this one alone uses namespace 2.
        let (mut job, files) = Job::setup(&["fake,ns=2"], &opts(), 4096).unwrap();
        assert_eq!(files[0].unit, 2);
        assert_eq!(files[0].size, 1 << 20);
        assert_eq!(files[0].lba_shift, 9);
        job.init(4).unwrap();
        let base = job.alloc_buffers(8192).unwrap();
        // SAFETY: base points to 8192 bytes of the job's region; nothing is in flight.
        unsafe { std::ptr::write_bytes(base, 0xa5, 4096) };
        let c = files[0].cookie();
        assert_eq!(
            job.queue(c, Op::Write, 4096, base, 4096, 11),
            Queued::Queued
        );
        job.commit();
        assert_eq!(wait(&mut job, 1), vec![Event { tag: 11, errno: 0 }]);
        // SAFETY: as above; the read lands in the second half.
        let back = unsafe { base.add(4096) };
        assert_eq!(job.queue(c, Op::Read, 4096, back, 4096, 12), Queued::Queued);
        job.commit();
        assert_eq!(wait(&mut job, 1), vec![Event { tag: 12, errno: 0 }]);
        // SAFETY: the read completed; 4096 bytes at `back` are ours.
        let data = unsafe { std::slice::from_raw_parts(back, 4096) };
        assert!(data.iter().all(|&b| b == 0xa5));
        assert_eq!(
            job.queue(c, Op::Trim, 0, std::ptr::null(), 8192, 13),
            Queued::Queued
        );
        assert_eq!(
            job.queue(c, Op::Flush, 0, std::ptr::null(), 0, 14),
            Queued::Queued
        );
        job.commit();
        let mut ev = wait(&mut job, 2);
        ev.sort_by_key(|e| e.tag);
        assert_eq!(
            ev,
            vec![Event { tag: 13, errno: 0 }, Event { tag: 14, errno: 0 }]
        );
        job.close().unwrap();
    }

    #[test]
    fn bad_requests_fail_without_reaching_the_device() {
        let (mut job, files) = Job::setup(&["fake"], &opts(), 4096).unwrap();
        let c = files[0].cookie();
        // Not initialised yet.
        assert_eq!(
            job.queue(c, Op::Read, 0, std::ptr::null(), 512, 1),
            Queued::Failed(libc::EIO)
        );
        job.init(2).unwrap();
        let base = job.alloc_buffers(4096).unwrap();
        // Misaligned offset and length.
        assert_eq!(
            job.queue(c, Op::Read, 100, base, 512, 1),
            Queued::Failed(libc::EINVAL)
        );
        assert_eq!(
            job.queue(c, Op::Read, 0, base, 100, 1),
            Queued::Failed(libc::EINVAL)
        );
        // A buffer outside fio's region is refused, not handed to the device.
        let mut other = [0u8; 512];
        assert_eq!(
            job.queue(c, Op::Read, 0, other.as_mut_ptr(), 512, 1),
            Queued::Failed(libc::EFAULT)
        );
        // SAFETY: pointer arithmetic only; the result is checked, never dereferenced.
        let tail = unsafe { base.add(3584) };
        assert_eq!(
            job.queue(c, Op::Read, 0, tail, 1024, 1),
            Queued::Failed(libc::EFAULT)
        );
        // A cookie setup never made (block shift 200).
        assert_eq!(
            job.queue(200, Op::Read, 0, base, 512, 1),
            Queued::Failed(libc::EINVAL)
        );
        // Past the end of the namespace.
        assert_eq!(
            job.queue(c, Op::Read, 1 << 20, base, 512, 1),
            Queued::Failed(libc::EINVAL)
        );
        // The queue fills at its depth: busy, not an error.
        assert_eq!(job.queue(c, Op::Read, 0, base, 512, 1), Queued::Queued);
        assert_eq!(job.queue(c, Op::Read, 512, base, 512, 2), Queued::Queued);
        assert_eq!(job.queue(c, Op::Read, 1024, base, 512, 3), Queued::Busy);
        job.commit();
        assert_eq!(wait(&mut job, 2).len(), 2);
        // getevents with min 0 returns at once.
        assert_eq!(job.getevents(0, 2, None).unwrap(), 0);
        job.close().unwrap();
    }

    #[test]
    fn freeing_buffers_with_commands_in_flight_closes_the_queue_first() {
        let (mut job, files) = Job::setup(&["fake,ns=1"], &opts(), 4096).unwrap();
        job.init(2).unwrap();
        let base = job.alloc_buffers(4096).unwrap();
        let c = files[0].cookie();
        assert_eq!(job.queue(c, Op::Read, 0, base, 512, 1), Queued::Queued);
        job.free_buffers();
        assert!(job.qp.is_none() && job.bufs.is_none());
        assert!(job.getevents(1, 1, None).is_err());
        job.close().unwrap();
    }

    #[test]
    fn jobs_share_a_controller_and_refuse_other_options() {
        let (a, _) = Job::setup(&["fake"], &opts(), 4096).unwrap();
        let (b, _) = Job::setup(&["fake,ns=2"], &opts(), 4096).unwrap();
        assert!(Arc::ptr_eq(&a.dev, &b.dev));
        let other = DeviceOptions {
            fake_lbs: 4096,
            ..opts()
        };
        assert!(matches!(
            Job::setup(&["fake"], &other, 4096),
            Err(EngineError::OptionsDiffer { .. })
        ));
        assert!(matches!(
            Job::setup(&["fake,ns=3"], &opts(), 4096),
            Err(EngineError::NoNamespace { nsid: 3, .. })
        ));
        assert!(matches!(
            Job::setup(&["fake", "vfio-00.01.0"], &opts(), 4096),
            Err(EngineError::TwoControllers { .. })
        ));
        a.close().unwrap();
        b.close().unwrap();
    }

    /// Options of every `fake-ufs` test (they share the process's fake UFS,
    /// so all must be equal): two 1 MiB LUs in 4 KiB blocks, MCQ, four
    /// queues, the device side running synchronously.
    fn ufs_opts() -> DeviceOptions {
        DeviceOptions {
            fake_lbs: 4096,
            ..opts()
        }
    }

    fn fill(p: *mut u8, v: u8, n: usize) {
        // SAFETY: callers pass a range of the job's region with nothing in flight.
        unsafe { std::ptr::write_bytes(p, v, n) };
    }

    fn bytes(p: *const u8, n: usize) -> Vec<u8> {
        // SAFETY: callers pass a range of the job's region whose commands completed.
        unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
    }

    #[test]
    fn ufs_job_writes_reads_trims_and_flushes() {
        // This test alone uses LU 1 of the shared fake UFS.
        let (mut job, files) = Job::setup(&["fake-ufs,lun=1"], &ufs_opts(), 8192).unwrap();
        assert!(matches!(job.dev.ctrl(), Ctrl::Ufs(_)));
        assert_eq!(
            files,
            vec![FileInfo {
                unit: 1,
                lba_shift: 12,
                size: 1 << 20
            }]
        );
        job.init(4).unwrap();
        assert!(matches!(job.qp, Some(Qp::Ufs(_))));
        let base = job.alloc_buffers(16384).unwrap();
        // SAFETY: pointer arithmetic inside the 16 KiB region.
        let back = unsafe { base.add(8192) };
        let c = files[0].cookie();
        fill(base, 0xa5, 8192);
        assert_eq!(
            job.queue(c, Op::Write, 8192, base, 8192, 21),
            Queued::Queued
        );
        job.commit();
        assert_eq!(wait(&mut job, 1), vec![Event { tag: 21, errno: 0 }]);
        fill(back, 0, 8192);
        assert_eq!(job.queue(c, Op::Read, 8192, back, 8192, 22), Queued::Queued);
        job.commit();
        assert_eq!(wait(&mut job, 1), vec![Event { tag: 22, errno: 0 }]);
        assert!(bytes(back, 8192).iter().all(|&b| b == 0xa5));
        // UNMAP the first of the two blocks and SYNCHRONIZE CACHE, in one
        // batch; the unmapped block then reads as zeroes (LBPRZ), the other
        // keeps its data.
        assert_eq!(
            job.queue(c, Op::Trim, 8192, std::ptr::null(), 4096, 23),
            Queued::Queued
        );
        assert_eq!(
            job.queue(c, Op::Flush, 0, std::ptr::null(), 0, 24),
            Queued::Queued
        );
        job.commit();
        let mut ev = wait(&mut job, 2);
        ev.sort_by_key(|e| e.tag);
        assert_eq!(
            ev,
            vec![Event { tag: 23, errno: 0 }, Event { tag: 24, errno: 0 }]
        );
        fill(back, 0x11, 8192);
        assert_eq!(job.queue(c, Op::Read, 8192, back, 8192, 25), Queued::Queued);
        job.commit();
        assert_eq!(wait(&mut job, 1), vec![Event { tag: 25, errno: 0 }]);
        let data = bytes(back, 8192);
        assert!(data[..4096].iter().all(|&b| b == 0), "trimmed block");
        assert!(data[4096..].iter().all(|&b| b == 0xa5), "untouched block");
        job.close().unwrap();
    }

    #[test]
    fn ufs_job_limits_are_typed_and_timeouts_return() {
        // No selector: LU 0.
        let (mut job, files) = Job::setup(&["fake-ufs"], &ufs_opts(), 4096).unwrap();
        assert_eq!(files[0].unit, 0);
        let c = files[0].cookie();
        assert!(matches!(
            job.getevents(1, 1, Some(Duration::from_millis(1))),
            Err(EngineError::NotInitialised)
        ));
        job.init(2).unwrap();
        let base = job.alloc_buffers(8192).unwrap();
        // Nothing in flight: getevents waits for its timeout and returns none.
        assert_eq!(
            job.getevents(1, 2, Some(Duration::from_millis(1))).unwrap(),
            0
        );
        // Blocks are 4 KiB: 512-byte I/O is misaligned.
        assert_eq!(
            job.queue(c, Op::Read, 512, base, 4096, 1),
            Queued::Failed(libc::EINVAL)
        );
        assert_eq!(
            job.queue(c, Op::Read, 0, base, 512, 1),
            Queued::Failed(libc::EINVAL)
        );
        // A cookie naming a unit no LUN can be (256): refused, not truncated.
        let far = FileInfo {
            unit: 256,
            ..files[0]
        };
        assert_eq!(
            job.queue(far.cookie(), Op::Read, 0, base, 4096, 1),
            Queued::Failed(libc::EINVAL)
        );
        // Past the end of the LU: the queue pair refuses it.
        assert_eq!(
            job.queue(c, Op::Read, 1 << 20, base, 4096, 1),
            Queued::Failed(libc::EINVAL)
        );
        // A LUN the device does not have: refused before reaching it.
        let nolu = FileInfo {
            unit: 9,
            ..files[0]
        };
        assert!(matches!(
            job.queue(nolu.cookie(), Op::Flush, 0, std::ptr::null(), 0, 1),
            Queued::Failed(_)
        ));
        // A buffer outside fio's region.
        let mut other = [0u8; 4096];
        assert_eq!(
            job.queue(c, Op::Write, 0, other.as_mut_ptr(), 4096, 1),
            Queued::Failed(libc::EFAULT)
        );
        // Two in flight, then the completions; getevents with min 0 returns at once.
        assert_eq!(job.queue(c, Op::Read, 0, base, 4096, 1), Queued::Queued);
        // SAFETY: pointer arithmetic inside the 8 KiB region.
        let second = unsafe { base.add(4096) };
        assert_eq!(
            job.queue(c, Op::Read, 4096, second, 4096, 2),
            Queued::Queued
        );
        job.commit();
        let mut ev = wait(&mut job, 2);
        ev.sort_by_key(|e| e.tag);
        assert_eq!(
            ev,
            vec![Event { tag: 1, errno: 0 }, Event { tag: 2, errno: 0 }]
        );
        assert_eq!(job.getevents(0, 2, None).unwrap(), 0);
        // Freeing the buffers with a command in flight closes the queue first.
        assert_eq!(job.queue(c, Op::Read, 0, base, 4096, 3), Queued::Queued);
        job.free_buffers();
        assert!(job.qp.is_none() && job.bufs.is_none());
        job.close().unwrap();
    }

    /// A job on a private fake UFS (its own options, its fault injector).
    fn private_ufs_job(o: &DeviceOptions, depth: u32) -> (Job, u64, Arc<FakeUfs>) {
        let (dev, fake) = Device::private_fake_ufs(o);
        let name = "fake-ufs,lun=0";
        let (mut job, files) =
            Job::on_device(dev, &[Target::parse(name).unwrap()], &[name], 4096).unwrap();
        job.init(depth).unwrap();
        (job, files[0].cookie(), fake)
    }

    /// `wait=irq` (issue 26): getevents sleeps on the queue's interrupt
    /// (the fake's device thread raises it) instead of spinning; every
    /// block's data still comes back.
    #[test]
    fn wait_irq_getevents_sleeps_on_the_interrupt_and_keeps_the_data() {
        let o = DeviceOptions {
            wait: mcqio::WaitPolicy::Interrupt,
            fake_exec: FakeExec::Thread,
            ..ufs_opts()
        };
        let (mut job, c, _fake) = private_ufs_job(&o, 8);
        assert!(job.waits);
        const BS: usize = 4096;
        let base = job.alloc_buffers(16 * BS).unwrap();
        // SAFETY: pointer arithmetic inside the job's 64 KiB region.
        let at = |i: usize| unsafe { base.add(i * BS) };
        for round in 0..2u8 {
            for i in 0..8 {
                fill(at(i), round * 16 + i as u8, BS);
                let off = (i * BS) as u64;
                assert_eq!(
                    job.queue(c, Op::Write, off, at(i), BS as u64, i as u64),
                    Queued::Queued
                );
            }
            job.commit();
            assert_eq!(wait(&mut job, 8).len(), 8);
            for i in 0..8 {
                let off = (i * BS) as u64;
                let back = at(8 + i);
                assert_eq!(
                    job.queue(c, Op::Read, off, back, BS as u64, 100 + i as u64),
                    Queued::Queued
                );
            }
            job.commit();
            let ev = wait(&mut job, 8);
            assert!(ev.iter().all(|e| e.errno == 0), "{ev:?}");
            for i in 0..8 {
                // SAFETY: the reads completed; each 4 KiB is ours.
                let got = unsafe { std::slice::from_raw_parts(at(8 + i), BS) };
                assert!(got.iter().all(|&b| b == round * 16 + i as u8), "block {i}");
            }
        }
        let Some(Qp::Ufs(q)) = job.qp.as_ref() else {
            panic!("a UFS queue pair")
        };
        assert!(q.counters().interrupt_sleeps > 0, "{:?}", q.counters());
        job.close().unwrap();
    }

    #[test]
    fn ufs_device_errors_and_timeouts_reach_fio_as_errnos() {
        let o = DeviceOptions {
            io_timeout: Some(Duration::from_millis(20)),
            ..ufs_opts()
        };
        let (mut job, c, fake) = private_ufs_job(&o, 4);
        let base = job.alloc_buffers(4096).unwrap();
        // An OCS error (transport) and a CHECK CONDITION (SCSI): EIO.
        fake.faults().inject_next(None, None, UfsFault::Ocs(0x02)); // OCS INVALID_PRDT_ATTR
        assert_eq!(job.queue(c, Op::Read, 0, base, 4096, 1), Queued::Queued);
        job.commit();
        assert_eq!(
            wait(&mut job, 1),
            vec![Event {
                tag: 1,
                errno: libc::EIO
            }]
        );
        fake.faults().inject_next(
            None,
            None,
            UfsFault::CheckCondition(Sense::UNRECOVERED_READ),
        );
        assert_eq!(job.queue(c, Op::Write, 0, base, 4096, 2), Queued::Queued);
        job.commit();
        assert_eq!(
            wait(&mut job, 1),
            vec![Event {
                tag: 2,
                errno: libc::EIO
            }]
        );
        // A command the device never completes: aborted after io_timeout,
        // ETIMEDOUT (getevents without a timeout waits for it).
        fake.faults()
            .inject_next(None, None, UfsFault::DropCompletion);
        assert_eq!(job.queue(c, Op::Read, 0, base, 4096, 3), Queued::Queued);
        job.commit();
        assert_eq!(
            wait(&mut job, 1),
            vec![Event {
                tag: 3,
                errno: libc::ETIMEDOUT
            }]
        );
        // The queue pair still works afterwards.
        assert_eq!(job.queue(c, Op::Read, 0, base, 4096, 4), Queued::Queued);
        job.commit();
        assert_eq!(wait(&mut job, 1), vec![Event { tag: 4, errno: 0 }]);
        job.close().unwrap();
    }

    /// Issue 27 item 5: a read the device still holds when the controller
    /// fails and cannot be disabled comes back without its buffer; the job's
    /// region must then stay mapped (never unmapped or reused) and be
    /// counted as leaked, on close and on drop alike.
    #[test]
    fn a_buffer_the_device_may_still_write_keeps_the_region_mapped() {
        for close in [true, false] {
            let (mut job, c, fake) = private_ufs_job(&ufs_opts(), 4);
            let dev = Arc::clone(&job.dev);
            let base = job.alloc_buffers(8192).unwrap();
            let (iova, len) = job.bufs.as_ref().map(|b| (b.iova, b.len)).unwrap();
            fake.set_ignore_disable(true);
            fake.faults().inject_next(None, None, UfsFault::HostFatal);
            assert_eq!(job.queue(c, Op::Read, 0, base, 4096, 7), Queued::Queued);
            job.commit();
            let ev = wait(&mut job, 1);
            assert_eq!(
                ev,
                vec![Event {
                    tag: 7,
                    errno: libc::EIO
                }]
            );
            // The region is poisoned: no other buffer of it reaches the device.
            // SAFETY: pointer arithmetic inside the 8 KiB region.
            let second = unsafe { base.add(4096) };
            assert_eq!(
                job.queue(c, Op::Write, 4096, second, 4096, 8),
                Queued::Failed(libc::EIO)
            );
            if close {
                let _ = job.close();
            } else {
                drop(job);
            }
            assert!(
                fake.iommu().is_mapped(iova, len as u64),
                "close={close}: the region was unmapped while the device may write it"
            );
            assert_eq!(dev.leaked_bytes(), len as u64, "close={close}");
        }
    }

    /// Issue 27 item 5, NVMe: the controller refuses to delete the queue, so
    /// the command in flight is withdrawn unconfirmed (no buffer): the
    /// region stays mapped and is counted.
    #[test]
    fn refused_queue_deletion_keeps_the_region_mapped() {
        use mcqio::nvme::spec::opcodes::admin::DELETE_IO_SQ;
        use mcqio_fixtures::Fault;
        let (dev, fake) = Device::private_fake_nvme(&opts());
        let name = "fake,ns=1";
        let (mut job, files) = Job::on_device(
            Arc::clone(&dev),
            &[Target::parse(name).unwrap()],
            &[name],
            4096,
        )
        .unwrap();
        job.init(4).unwrap();
        let c = files[0].cookie();
        let base = job.alloc_buffers(8192).unwrap();
        let (iova, len) = job.bufs.as_ref().map(|b| (b.iova, b.len)).unwrap();
        fake.faults()
            .inject_next(None, None, Fault::Delay(Duration::from_secs(3600)));
        assert_eq!(job.queue(c, Op::Read, 0, base, 4096, 1), Queued::Queued);
        job.commit();
        assert_eq!(job.getevents(0, 1, None).unwrap(), 0);
        fake.faults().inject_next(
            Some(0),
            Some(DELETE_IO_SQ),
            Fault::Status {
                sct: 1,
                sc: 0x01,
                dnr: true,
            },
        );
        assert!(job.close().is_err(), "the deletion failed");
        assert!(
            fake.iommu().is_mapped(iova, len as u64),
            "the region was unmapped while the device may write it"
        );
        assert_eq!(dev.leaked_bytes(), len as u64);
    }

    #[test]
    fn ufs_legacy_list_job() {
        let o = DeviceOptions {
            mcq: false,
            ..ufs_opts()
        };
        let (mut job, c, _fake) = private_ufs_job(&o, 8);
        let base = job.alloc_buffers(8192).unwrap();
        // SAFETY: pointer arithmetic inside the 8 KiB region.
        let back = unsafe { base.add(4096) };
        fill(base, 0x3c, 4096);
        assert_eq!(
            job.queue(c, Op::Write, 40960, base, 4096, 1),
            Queued::Queued
        );
        assert_eq!(
            job.queue(c, Op::Flush, 0, std::ptr::null(), 0, 2),
            Queued::Queued
        );
        job.commit();
        assert_eq!(wait(&mut job, 2).len(), 2);
        assert_eq!(job.queue(c, Op::Read, 40960, back, 4096, 3), Queued::Queued);
        job.commit();
        assert_eq!(wait(&mut job, 1), vec![Event { tag: 3, errno: 0 }]);
        assert!(bytes(back, 4096).iter().all(|&b| b == 0x3c));
        // Legacy mode has one queue pair: a second job cannot get one.
        let mut second = Job {
            qp: None,
            bufs: None,
            out: BufsOut::default(),
            events: Vec::new(),
            files: Vec::new(),
            dev: job.dev.clone(),
            waits: false,
        };
        assert!(matches!(
            second.init(1),
            Err(EngineError::Qpair { granted: 1, .. })
        ));
        job.close().unwrap();
    }

    /// An iodepth above the UFS queue pair's slots: a job fio may answer
    /// busy gets it (and busy answers once the queue is full); a job whose
    /// verify replays write seeds in log order is refused, since fio
    /// reorders that log on a busy answer (see `Job::init_with`).
    #[test]
    fn only_an_ordered_verify_job_is_refused_an_iodepth_deeper_than_the_ufs_queue() {
        let (mut job, _) = Job::setup(&["fake-ufs"], &ufs_opts(), 4096).unwrap();
        let depth = match job.init_with(4096, true) {
            Err(EngineError::UfsDepth { iodepth, depth }) => {
                assert_eq!(iodepth, 4096);
                assert!((1..4096).contains(&depth), "depth {depth}");
                depth
            }
            r => panic!("expected UfsDepth, got {r:?}"),
        };
        let over = u32::try_from(depth + 1).unwrap();
        assert!(matches!(
            job.init_with(over, true),
            Err(EngineError::UfsDepth { .. })
        ));
        // The queue's own depth works for it.
        job.init_with(u32::try_from(depth).unwrap(), true).unwrap();
        job.close().unwrap();
        // Any other job may go deeper than the queue.
        let (mut job, _) = Job::setup(&["fake-ufs"], &ufs_opts(), 4096).unwrap();
        job.init_with(over, false).unwrap();
        job.close().unwrap();
    }

    /// The busy path keeps every block's data: three queues' worth of
    /// writes of distinct data, each busy one queued again after a reap
    /// (as fio requeues it), then every block read back the same way.
    #[test]
    fn busy_answers_and_requeues_keep_every_blocks_data() {
        // A fake of its own (other options, other key): no other test
        // writes these blocks.
        let o = DeviceOptions {
            fake_size: 2 << 20,
            qpairs: 8,
            ..ufs_opts()
        };
        let (mut job, files) = Job::setup(&["fake-ufs"], &o, 4096).unwrap();
        let c = files[0].cookie();
        job.init(255).unwrap();
        const BS: usize = 4096;
        let blocks = (2 << 20) / BS;
        let base = job.alloc_buffers(blocks * BS).unwrap();
        let buf = |i: usize| {
            // SAFETY: pointer arithmetic inside the job's region.
            unsafe { base.add(i * BS) }
        };
        let pattern = |i: usize| -> Vec<u8> {
            (0..BS)
                .map(|k| (i as u8) ^ (k as u8).wrapping_mul(31) ^ 0x5A)
                .collect()
        };
        // Run every block through `op`, answering busy as fio does: keep
        // the refused ones and queue them again after a reap.
        let run_all = |job: &mut Job, op: Op| -> usize {
            let mut pending: Vec<usize> = (0..blocks).rev().collect();
            let mut outstanding = 0usize;
            let mut busy = 0usize;
            while !pending.is_empty() || outstanding > 0 {
                while let Some(i) = pending.pop() {
                    match job.queue(c, op, (i * BS) as u64, buf(i), BS as u64, i as u64) {
                        Queued::Queued => outstanding += 1,
                        Queued::Busy => {
                            busy += 1;
                            pending.push(i);
                            break;
                        }
                        Queued::Failed(e) => panic!("block {i}: errno {e}"),
                    }
                }
                job.commit();
                let n = job.getevents(1, 255, None).unwrap();
                for k in 0..n {
                    let e = job.event(k).unwrap();
                    assert_eq!(e.errno, 0, "block {}", e.tag);
                }
                outstanding -= n;
            }
            busy
        };
        for i in 0..blocks {
            let p = pattern(i);
            // SAFETY: the block's buffer, nothing in flight.
            unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), buf(i), BS) };
        }
        let busy_w = run_all(&mut job, Op::Write);
        fill(base, 0, blocks * BS);
        let busy_r = run_all(&mut job, Op::Read);
        assert!(
            busy_w > 0 && busy_r > 0,
            "the queue never filled: {busy_w} {busy_r}"
        );
        for i in 0..blocks {
            assert!(
                bytes(buf(i), BS) == pattern(i),
                "block {i} holds other data"
            );
        }
        job.close().unwrap();
    }

    #[test]
    fn bad_lun_and_wrong_selector_are_typed_errors() {
        let (job, _) = Job::setup(&["fake-ufs,lun=0"], &ufs_opts(), 4096).unwrap();
        match Job::setup(&["fake-ufs,lun=0", "fake-ufs,lun=5"], &ufs_opts(), 4096) {
            Err(EngineError::NoLogicalUnit { file, lun, have }) => {
                assert_eq!((file.as_str(), lun), ("fake-ufs,lun=5", 5));
                assert_eq!(have, vec![0, 1]);
            }
            r => panic!("expected NoLogicalUnit, got {r:?}"),
        }
        // A namespace selector on a UFS controller (a vfio- device's
        // filename may carry either; the controller decides).
        assert!(matches!(
            file_info(&job.dev, Unit::Ns(1), "vfio-01.00.0,ns=1"),
            Err(EngineError::WrongSelector { .. })
        ));
        let (nvme, _) = Job::setup(&["fake"], &opts(), 4096).unwrap();
        assert!(matches!(
            file_info(&nvme.dev, Unit::Lun(0), "vfio-01.00.0,lun=0"),
            Err(EngineError::WrongSelector { .. })
        ));
        // NVMe and UFS files in one job are two controllers.
        assert!(matches!(
            Job::setup(&["fake-ufs", "fake"], &ufs_opts(), 4096),
            Err(EngineError::TwoControllers { .. })
        ));
        // A block size above what the shared controller was opened for.
        assert!(matches!(
            Job::setup(&["fake-ufs"], &ufs_opts(), 64 << 20),
            Err(EngineError::TooLarge { .. })
        ));
        job.close().unwrap();
        nvme.close().unwrap();
    }

    /// A fake NVMe/TCP target of this test's own: namespace 1 RAM in
    /// 512-byte blocks, 1 MiB; namespace 2 RAM in 4 KiB blocks. 8 KiB in
    /// a capsule, MAXH2CDATA 32 KiB (the engine's bound per command), R2Ts
    /// of 16 KiB, C2HData of 4 KiB: a 32 KiB write takes two R2Ts, a read
    /// many C2HData.
    fn tcp_target() -> mcqio_fixtures::tcp::FakeTcpTarget {
        use mcqio_fixtures::tcp::{FakeTcpTarget, TcpBacking, TcpNamespace, TcpTargetConfig};
        FakeTcpTarget::start(TcpTargetConfig {
            namespaces: vec![
                TcpNamespace {
                    blocks: 2048,
                    lba_shift: 9,
                    backing: TcpBacking::Ram,
                },
                TcpNamespace {
                    blocks: 256,
                    lba_shift: 12,
                    backing: TcpBacking::Ram,
                },
            ],
            maxh2cdata: 32 << 10,
            ..TcpTargetConfig::default()
        })
        .expect("fake target")
    }

    /// Write every size class (in the capsule, one R2T, several R2Ts)
    /// from fio's region, read it back into another part of it (one and
    /// many C2HData), and check the bytes; with and without digests.
    #[test]
    fn tcp_job_writes_and_reads_back_every_size_class() {
        use mcqio_fixtures::tcp::TcpTargetStats;
        for digests in ["", ",hdgst,ddgst"] {
            let t = tcp_target();
            let name = format!("tcp:{}/{}{digests},ns=2", t.addr(), t.subnqn());
            let (mut job, files) = Job::setup(&[&name], &opts(), 32 << 10).unwrap();
            assert_eq!(files[0].unit, 2);
            assert_eq!(files[0].lba_shift, 12);
            assert_eq!(files[0].size, 256 * 4096);
            job.init(8).unwrap();
            const HALF: usize = 128 << 10;
            let base = job.alloc_buffers(2 * HALF).unwrap();
            let c = files[0].cookie();
            // (offset in the buffer and on the device, length)
            let ios = [(0usize, 4096usize), (4096, 12288), (16384, 32768)];
            let pattern: Vec<u8> = (0..HALF)
                .map(|k| (k as u8).wrapping_mul(13) ^ (k >> 12) as u8 ^ digests.len() as u8)
                .collect();
            // SAFETY: the first half of the job's region; nothing in flight.
            unsafe { std::ptr::copy_nonoverlapping(pattern.as_ptr(), base, HALF) };
            for (i, &(at, len)) in ios.iter().enumerate() {
                // SAFETY: pointer arithmetic inside the job's region.
                let b = unsafe { base.add(at) };
                let q = job.queue(c, Op::Write, at as u64, b, len as u64, i as u64);
                assert_eq!(q, Queued::Queued, "write {i}");
            }
            job.commit();
            let ev = wait(&mut job, ios.len());
            assert!(ev.iter().all(|e| e.errno == 0), "{ev:?}");
            fill(base, 0, HALF);
            for (i, &(at, len)) in ios.iter().enumerate() {
                // SAFETY: pointer arithmetic inside the job's region.
                let b = unsafe { base.add(HALF + at) };
                let q = job.queue(c, Op::Read, at as u64, b, len as u64, 10 + i as u64);
                assert_eq!(q, Queued::Queued, "read {i}");
            }
            assert_eq!(
                job.queue(c, Op::Flush, 0, std::ptr::null(), 0, 20),
                Queued::Queued
            );
            job.commit();
            let mut ev = wait(&mut job, ios.len() + 1);
            ev.sort_by_key(|e| e.tag);
            assert!(ev.iter().all(|e| e.errno == 0), "{ev:?}");
            assert_eq!(ev.last().map(|e| e.tag), Some(20));
            // SAFETY: pointer arithmetic inside the job's region.
            let back = unsafe { base.add(HALF) };
            assert!(
                bytes(back, 49152) == pattern[..49152],
                "{digests}: the data read back differs from what was written"
            );
            let s = t.stats();
            assert!(TcpTargetStats::get(&s.in_capsule_writes) >= 1);
            assert!(TcpTargetStats::get(&s.r2ts) >= 3, "{digests}");
            assert!(TcpTargetStats::get(&s.c2h_data) >= 12, "{digests}");
            assert_eq!(TcpTargetStats::get(&s.io_connects), 1);
            job.close().unwrap();
        }
    }

    /// The job's queue pair holds what the target's queues do (CAP.MQES):
    /// a deeper iodepth is answered busy and every block keeps its data;
    /// an ordered-verify job is refused that iodepth, typed.
    #[test]
    fn tcp_job_deeper_than_the_target_queue_is_answered_busy() {
        let t = tcp_target();
        let name = format!("tcp:{}/{},ns=1", t.addr(), t.subnqn());
        let (mut deep, _) = Job::setup(&[&name], &opts(), 4096).unwrap();
        assert!(matches!(
            deep.init_with(200, true),
            Err(EngineError::TcpDepth { iodepth: 200, .. })
        ));
        let (mut job, files) = Job::setup(&[&name], &opts(), 4096).unwrap();
        let c = files[0].cookie();
        job.init(200).unwrap();
        const BS: usize = 512;
        let blocks = 2048;
        let base = job.alloc_buffers(blocks * BS).unwrap();
        let buf = |i: usize| {
            // SAFETY: pointer arithmetic inside the job's region.
            unsafe { base.add(i * BS) }
        };
        let run_all = |job: &mut Job, op: Op| -> usize {
            let mut pending: Vec<usize> = (0..blocks).rev().collect();
            let (mut outstanding, mut busy) = (0usize, 0usize);
            while !pending.is_empty() || outstanding > 0 {
                while let Some(i) = pending.pop() {
                    match job.queue(c, op, (i * BS) as u64, buf(i), BS as u64, i as u64) {
                        Queued::Queued => outstanding += 1,
                        Queued::Busy => {
                            busy += 1;
                            pending.push(i);
                            break;
                        }
                        Queued::Failed(e) => panic!("block {i}: errno {e}"),
                    }
                }
                job.commit();
                let n = job.getevents(1, 200, None).unwrap();
                for k in 0..n {
                    let e = job.event(k).unwrap();
                    assert_eq!(e.errno, 0, "block {}", e.tag);
                }
                outstanding -= n;
            }
            busy
        };
        for i in 0..blocks {
            fill(buf(i), (i as u8) ^ 0x3C, BS);
        }
        let busy_w = run_all(&mut job, Op::Write);
        fill(base, 0, blocks * BS);
        let busy_r = run_all(&mut job, Op::Read);
        assert!(busy_w > 0 && busy_r > 0, "never full: {busy_w} {busy_r}");
        for i in 0..blocks {
            assert!(
                bytes(buf(i), BS).iter().all(|&b| b == (i as u8) ^ 0x3C),
                "block {i} holds other data"
            );
        }
        job.close().unwrap();
        drop(deep);
    }

    /// `tcp:` filenames: the selector and the device options are told
    /// apart; jobs on one target must agree on its options.
    #[test]
    fn tcp_filenames_and_shared_targets() {
        let t = tcp_target();
        let plain = format!("tcp:{}/{}", t.addr(), t.subnqn());
        let (a, fa) = Job::setup(&[&plain], &opts(), 4096).unwrap();
        let (b, fb) = Job::setup(&[&format!("{plain},ns=2")], &opts(), 4096).unwrap();
        assert!(Arc::ptr_eq(&a.dev, &b.dev));
        assert_eq!((fa[0].unit, fb[0].unit), (1, 2));
        assert!(matches!(
            Job::setup(&[&format!("{plain},hdgst")], &opts(), 4096),
            Err(EngineError::OptionsDiffer { .. })
        ));
        assert!(matches!(
            Job::setup(&[&format!("{plain},ns=3")], &opts(), 4096),
            Err(EngineError::NoNamespace { nsid: 3, .. })
        ));
        for bad in [",lun=0", ",ns=0", ",lbs=4k"] {
            let r = Job::setup(&[&format!("{plain}{bad}")], &opts(), 4096);
            assert!(matches!(r, Err(EngineError::Spec(_))), "{bad}: {r:?}");
        }
        a.close().unwrap();
        b.close().unwrap();
    }
}
