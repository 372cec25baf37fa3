//! One fio job: its files (NVMe namespaces or UFS logical units), its queue
//! pair and its I/O buffers.
//!
//! fio calls `setup` (from its main thread, before the job threads start),
//! then on the job's own thread `init`, `iomem_alloc`, and the I/O calls
//! `queue`/`commit`/`getevents`/`event`, and finally `iomem_free` and
//! `cleanup`. The queue pair is created in `init`, on the thread that uses
//! it; nothing on the I/O path locks, allocates or makes a system call.
//!
//! The queue pair is NVMe's, UFS's or NVMe/TCP's, chosen once in `init` by
//! the device's wire: the opener's one queue type ([`mcqio_open::Queue`]),
//! whose [`BlockQueue`] calls match on the wire once and run its own code
//! (no dynamic dispatch per I/O).

mod buffers;
mod files;
mod qpair;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use mcqio::core::block::BlockQueue;
use mcqio::{DmaSlice, QpairOptions, SubmitErrorKind, TimeoutPolicy};
use mcqio_vfio::DmaDir;

use crate::device::{Ctrl, Device};
use crate::spec::{DeviceOptions, SpecError, Target};
use crate::EngineError;

use buffers::{Buffers, BufsOut, FioBuf};
use files::file_info;
pub use files::{check_block_sizes, FileInfo};
use qpair::{close, reap, reap_waiting, submit, Qp};

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
            .map(|n| Target::parse(n).map_err(SpecError::from))
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
        let qopts = QpairOptions {
            depth,
            io_timeout: o.io_timeout,
            timeout_policy: TimeoutPolicy::Abort,
            wait: o.wait,
            ..QpairOptions::default()
        };
        // The NVMe/TCP depth is capped to the target's queues (CAP.MQES;
        // Linux's nvmet-tcp and the fake offer 128 entries), the UFS depth
        // is the controller's (set when it was opened): a deeper iodepth
        // gets `Busy` when the queue is full, which fio handles, except in
        // the verify of an ordered-verify job (see above).
        let qp = self
            .dev
            .ctrl()
            .create_queue::<FioBuf>(qopts)
            .map_err(qerr)?;
        if ordered_verify && usize::from(depth) > qp.depth() {
            let (iodepth, depth) = (u32::from(depth), qp.depth());
            match self.dev.ctrl() {
                Ctrl::Ufs(_) => return Err(EngineError::UfsDepth { iodepth, depth }),
                Ctrl::Tcp(_) => return Err(EngineError::TcpDepth { iodepth, depth }),
                // The depth asked for, or the queue pair was refused.
                Ctrl::Nvme(_) => {}
            }
        }
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
                let _ = close(qp, &mut self.out);
            }
        }
        let outstanding = self.qp.as_ref().map_or(0, |q| q.outstanding());
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
        // The buffer's host address: the region's, plus the same offset its
        // IOVA has (checked inside the region above).
        let host = buf as usize;
        let b = slice.map(|slice| FioBuf { slice, host });
        let r = submit(qp, unit, op, slba, nlb, b, tag);
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
        if let Some(q) = self.qp.as_mut() {
            q.submit();
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
        match self.qp.as_mut() {
            Some(q) if self.waits => {
                reap_waiting(q, &mut self.out, &mut self.events, min, max, timeout)
            }
            Some(q) => reap(q, &mut self.out, &mut self.events, min, max, timeout),
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
            Some(qp) => {
                close(qp, &mut self.out).map_err(|e| EngineError::Controller(e.to_string()))
            }
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
            let _ = close(qp, &mut self.out);
        }
        self.free_buffers();
    }
}
