//! `mcqio_qpair`: one queue pair of any wire (the opener's [`Queue`]),
//! with a slot per command in flight that holds the caller's tag and
//! buffer, and completions delivered to a C callback or into an array.
//!
//! The engine's tag of a command is its slot's index; a slot records the
//! user tag and the buffer cell, so a completion that comes back without
//! its buffer still names the cell to mark lost. Slots, their free list
//! and the callback batch are allocated when the queue pair is created:
//! the I/O path allocates nothing and takes no lock.

use std::ffi::{c_int, c_void};
use std::time::Duration;

use engine::core::block::BlockQueue;
use engine::{Completion, DmaBuf, QpairOptions, WaitPolicy};
use mcqio_open::Queue;

use crate::buf::{cell, McqioBuf};
use crate::device::{device, McqioDevice};
use crate::status::{
    engine_status, fail, guard, guard_count, io_status, new_handle, submit_status, Status,
};

/// `mcqio_qpair_opts.wait`: spin on the completion queue (the default).
pub const MCQIO_WAIT_POLL: u32 = 0;
/// `mcqio_qpair_opts.wait`: sleep on the queue's interrupt (NVMe MSI-X,
/// UFS INTx, the NVMe/TCP socket) as soon as a poll finds nothing.
pub const MCQIO_WAIT_IRQ: u32 = 1;
/// `mcqio_qpair_opts.wait`: spin for `hybrid_spin_ns` after the last
/// completion, then sleep on the interrupt.
pub const MCQIO_WAIT_HYBRID: u32 = 2;

/// `mcqio_cpl.flags`: the command ended without the device being provably
/// done with its buffer (a failed controller that could not be disabled,
/// an abort the device did not confirm). The buffer is lost: leaked,
/// never reused, and only `mcqio_buf_free()`
/// is left for its handle.
pub const MCQIO_CPL_BUF_LOST: u32 = 1;

/// Queue pair options. A zeroed struct, or NULL, means every default.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct McqioQpairOpts {
    /// Commands in flight at once, 1 to 4096 (0: 256). NVMe/TCP caps it
    /// to the target's queue size; UFS uses the controller's depth.
    /// `mcqio_qpair_depth` says what was granted.
    pub depth: u32,
    /// How `mcqio_wait()` waits: `MCQIO_WAIT_POLL` (0), `MCQIO_WAIT_IRQ`
    /// or `MCQIO_WAIT_HYBRID`.
    pub wait: u32,
    /// `MCQIO_WAIT_HYBRID`: nanoseconds to spin before sleeping (0: 50 µs).
    pub hybrid_spin_ns: u64,
    /// Per-command timeout in nanoseconds (0: 30 s; `UINT64_MAX`: never).
    /// A command older than that is aborted while the queue pair is
    /// polled and completes with `MCQIO_STATUS_TIMED_OUT`.
    pub io_timeout_ns: u64,
}

/// A finished command, as `mcqio_poll()` and its siblings deliver it.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct McqioCpl {
    /// The `user_tag` given at submission.
    pub user_tag: u64,
    /// The buffer of a read or write, handed back: idle again, its bytes
    /// the application's (NULL for flush and deallocate). With
    /// `MCQIO_CPL_BUF_LOST` in `flags` it is lost instead.
    pub buf: *mut McqioBuf,
    /// `MCQIO_STATUS_OK`, or how the command failed: `MCQIO_STATUS_IO` (see `detail`),
    /// `MCQIO_STATUS_TIMED_OUT`, `MCQIO_STATUS_ABORTED`, `MCQIO_STATUS_CONN_LOST`,
    /// `MCQIO_STATUS_FAILED`.
    pub status: Status,
    /// With `MCQIO_STATUS_IO`: NVMe `(SCT << 8) | SC`; UFS the SCSI status byte
    /// (0 for a transport or response error). With `MCQIO_STATUS_ABORTED`:
    /// the NVMe status if the device aborted it (SQ deletion), else 0.
    /// Otherwise 0.
    pub detail: u32,
    /// Command-specific result dword 0 of the completion.
    pub dw0: u32,
    /// `MCQIO_CPL_BUF_LOST`, or 0.
    pub flags: u32,
}

/// A completion callback: `cpl` is valid only during the call (copy what
/// you keep); `ctx` is the pointer given to the poll. It may submit on the
/// queue pair (resubmit the buffer, say), read and free the buffer, and use
/// other queue pairs; polling, waiting on or destroying this queue pair
/// from it is refused with `MCQIO_STATUS_BUSY`. It must return normally: no
/// `longjmp` out of it, and a C++ exception thrown through it terminates
/// the program.
pub type McqioCplFn = Option<unsafe extern "C" fn(cpl: *const McqioCpl, ctx: *mut c_void)>;

#[derive(Copy, Clone)]
struct Slot {
    user_tag: u64,
    /// Null for a command without a buffer.
    buf: *const McqioBuf,
}

/// A queue pair. Opaque to C.
pub struct McqioQpair {
    queue: Queue<DmaBuf>,
    /// Indexed by the engine's tag.
    slots: Box<[Slot]>,
    /// Free slot indices (a stack).
    free: Vec<u32>,
    /// Completions of one poll, before the callback sees them; moved out
    /// while the callback runs.
    batch: Vec<McqioCpl>,
    /// Commands queued since the last doorbell.
    queued: bool,
    /// Inside one of its callbacks.
    in_callback: bool,
}

/// The handle behind a pointer C passes, or [`Status::Invalid`].
///
/// # Safety
/// `qp` is null or a handle from `mcqio_qpair_create()` not yet
/// destroyed, which no other thread uses meanwhile, and no reference from
/// an earlier call of this module is used after this one is made.
unsafe fn qpair<'a>(qp: *mut McqioQpair) -> Result<&'a mut McqioQpair, Status> {
    // SAFETY: null or a live handle used by this thread alone (contract).
    unsafe { qp.as_mut() }.ok_or_else(|| fail(Status::Invalid, "the queue pair is NULL"))
}

/// [`qpair`], refused from inside one of its callbacks.
///
/// # Safety
/// As [`qpair`].
unsafe fn qpair_outside_callback<'a>(qp: *mut McqioQpair) -> Result<&'a mut McqioQpair, Status> {
    // SAFETY: forwarded caller contract.
    let h = unsafe { qpair(qp) }?;
    if h.in_callback {
        return Err(fail(
            Status::Busy,
            "the queue pair is in one of its callbacks: poll, wait and destroy it after they return",
        ));
    }
    Ok(h)
}

/// A completion as C sees it; its slot freed, its buffer handed back to
/// its cell (or the cell marked lost).
fn finish(slots: &[Slot], free: &mut Vec<u32>, c: Completion<DmaBuf>) -> McqioCpl {
    let slot = slots[c.tag as usize];
    free.push(c.tag as u32);
    let (status, detail) = io_status(&c.result);
    let mut flags = 0;
    // SAFETY: the slot's cell was in flight from its submission until
    // now, and a cell in flight is never freed (`mcqio_buf_free` refuses
    // it), so it is live.
    if let Some(cell) = unsafe { slot.buf.as_ref() } {
        match c.buf {
            Some(b) => cell.put(b),
            None => {
                cell.lose();
                flags = MCQIO_CPL_BUF_LOST;
            }
        }
    }
    McqioCpl {
        user_tag: slot.user_tag,
        buf: slot.buf.cast_mut(),
        status,
        detail,
        dw0: c.dw0,
        flags,
    }
}

/// How to reap.
#[derive(Copy, Clone)]
enum Reap {
    Poll,
    /// Wait as the queue pair's policy says, for at most this long.
    Wait(Option<Duration>),
}

/// Ring what is queued, then reap up to `max` completions into `sink`;
/// how many. An error after some completions is reported by the next
/// call (it lasts: a failed controller stays failed).
fn reap(
    h: &mut McqioQpair,
    max: usize,
    how: Reap,
    mut sink: impl FnMut(McqioCpl),
) -> Result<usize, Status> {
    if std::mem::take(&mut h.queued) {
        h.queue.submit();
    }
    let McqioQpair {
        queue, slots, free, ..
    } = h;
    let mut n = 0;
    let r = {
        let mut f = |c| {
            sink(finish(slots, free, c));
            n += 1;
        };
        match how {
            Reap::Poll => queue.poll(max, &mut f),
            Reap::Wait(t) => queue.wait(max, t, &mut f),
        }
    };
    match r {
        Ok(_) => Ok(n),
        Err(_) if n > 0 => Ok(n),
        Err(e) => Err(engine_status(e)),
    }
}

/// [`reap`] into the caller's callback, a batch at a time, with the queue
/// pair marked in its callback while the batch is delivered.
///
/// # Safety
/// `qp` as for [`qpair`]; `cb` and `ctx` as the callers' contracts say.
unsafe fn reap_to_callback(
    qp: *mut McqioQpair,
    max: usize,
    mut how: Reap,
    cb: McqioCplFn,
    ctx: *mut c_void,
) -> Result<usize, Status> {
    let cb = cb.ok_or_else(|| fail(Status::Invalid, "the callback is NULL"))?;
    let mut total = 0;
    loop {
        // SAFETY: forwarded caller contract; the reference is not used
        // after the callbacks below start.
        let h = unsafe { qpair_outside_callback(qp) }?;
        let mut batch = std::mem::take(&mut h.batch);
        let room = (max - total).min(batch.capacity());
        let r = reap(h, room, how, |c| batch.push(c));
        h.in_callback = true;
        for c in &batch {
            // SAFETY: the callback's contract is the caller's; `c` lives
            // in `batch`, owned here, for the whole call. The callback
            // may re-enter this module with `qp`, which makes its own
            // reference: none is held here meanwhile.
            unsafe { cb(c, ctx) };
        }
        // SAFETY: as above; the callbacks have returned.
        let h = unsafe { qpair(qp) }?;
        h.in_callback = false;
        let got = batch.len();
        batch.clear();
        h.batch = batch;
        let got = r.map(|_| got)?;
        total += got;
        if got < room || total >= max || room == 0 {
            return Ok(total);
        }
        // The batch was full: poll for the rest, without waiting again.
        how = Reap::Poll;
    }
}

/// `timeout_ns` of the wait calls: negative waits without limit.
fn timeout(ns: i64) -> Option<Duration> {
    u64::try_from(ns).ok().map(Duration::from_nanos)
}

/// Create a queue pair of `dev` on the calling thread (`opts` NULL: the
/// defaults). Create one per thread that does I/O, up to the device's
/// `queues` (`mcqio_device_info()`):
/// a queue pair is never locked, so one thread at a time may call
/// functions on it; it may move to another thread between calls. It keeps
/// the controller up after the device handle is closed.
///
/// # Safety
/// `dev` is NULL or a live device handle; `opts` is NULL or points to the
/// struct; `out` is NULL or valid for one pointer write.
#[no_mangle]
pub unsafe extern "C" fn mcqio_qpair_create(
    dev: *const McqioDevice,
    opts: *const McqioQpairOpts,
    out: *mut *mut McqioQpair,
) -> Status {
    guard("mcqio_qpair_create", || {
        // SAFETY: `out` is NULL or valid for one write (caller contract).
        unsafe { new_handle(out, || McqioQpair::new(dev, opts)) }
    })
}

impl McqioQpair {
    /// A queue pair of `dev` with `opts`, its slots and batch allocated.
    ///
    /// # Safety
    /// `dev` is NULL or a live device handle; `opts` is NULL or points to
    /// the struct.
    unsafe fn new(
        dev: *const McqioDevice,
        opts: *const McqioQpairOpts,
    ) -> Result<Box<Self>, Status> {
        // SAFETY: forwarded caller contract.
        let d = unsafe { device(dev) }?;
        // SAFETY: NULL or a readable struct (caller contract).
        let o = unsafe { opts.as_ref() }.copied().unwrap_or_default();
        let queue = d
            .device
            .create_queue::<DmaBuf>(qpair_options(&o)?)
            .map_err(engine_status)?;
        let depth = BlockQueue::depth(&queue).max(1);
        let idle = Slot {
            user_tag: 0,
            buf: std::ptr::null(),
        };
        Ok(Box::new(McqioQpair {
            queue,
            slots: vec![idle; depth].into_boxed_slice(),
            free: (0..depth as u32).rev().collect(),
            batch: Vec::with_capacity(depth.min(256)),
            queued: false,
            in_callback: false,
        }))
    }
}

/// The engine's options for `o`.
fn qpair_options(o: &McqioQpairOpts) -> Result<QpairOptions, Status> {
    let d = QpairOptions::default();
    let depth = match o.depth {
        0 => d.depth,
        n => u16::try_from(n)
            .ok()
            .filter(|n| (1..=4096).contains(n))
            .ok_or_else(|| fail(Status::Invalid, format_args!("depth {n}: use 1 to 4096")))?,
    };
    let wait = match o.wait {
        MCQIO_WAIT_POLL => WaitPolicy::Poll,
        MCQIO_WAIT_IRQ => WaitPolicy::Interrupt,
        MCQIO_WAIT_HYBRID => WaitPolicy::Hybrid {
            spin: match o.hybrid_spin_ns {
                0 => Duration::from_micros(50),
                ns => Duration::from_nanos(ns),
            },
        },
        w => {
            return Err(fail(
                Status::Invalid,
                format_args!("wait {w}: use MCQIO_WAIT_POLL, MCQIO_WAIT_IRQ or MCQIO_WAIT_HYBRID"),
            ))
        }
    };
    let io_timeout = match o.io_timeout_ns {
        0 => d.io_timeout,
        u64::MAX => None,
        ns => Some(Duration::from_nanos(ns)),
    };
    Ok(QpairOptions {
        depth,
        wait,
        io_timeout,
        ..d
    })
}

/// Destroy a queue pair (NULL: nothing to do). Every command still in
/// flight ends here, exactly once: those the device completed meanwhile
/// with their status, the others with `MCQIO_STATUS_ABORTED`. Each is passed to
/// `cb` (NULL: not reported) after the queue pair is gone, with its buffer
/// handed back idle, or lost as a completion says; the callback may free
/// the buffers. Returns a failure of the teardown itself (the handle is
/// gone either way), or `MCQIO_STATUS_BUSY`, the queue pair untouched, when
/// called from one of its own callbacks.
///
/// # Safety
/// `qp` is NULL or a live queue pair handle, used by no other thread
/// meanwhile and by nobody after; `cb` and `ctx` as `mcqio_cpl_fn` says.
#[no_mangle]
pub unsafe extern "C" fn mcqio_qpair_destroy(
    qp: *mut McqioQpair,
    cb: McqioCplFn,
    ctx: *mut c_void,
) -> Status {
    guard("mcqio_qpair_destroy", || {
        if qp.is_null() {
            return Ok(());
        }
        // SAFETY: forwarded caller contract.
        unsafe { qpair_outside_callback(qp) }?;
        // SAFETY: a live handle made by Box::into_raw, given up by the
        // caller (contract), not in a callback.
        let h = unsafe { Box::from_raw(qp) };
        let McqioQpair {
            mut queue,
            slots,
            mut free,
            queued,
            ..
        } = *h;
        if queued {
            queue.submit();
        }
        // Teardown allocates: it is not the I/O path.
        let mut ended = Vec::new();
        let r = BlockQueue::close(queue, |c| ended.push(finish(&slots, &mut free, c)));
        if let Some(cb) = cb {
            for c in &ended {
                // SAFETY: the callback's contract is the caller's; `c`
                // lives in `ended` for the call.
                unsafe { cb(c, ctx) };
            }
        }
        r.map_err(engine_status)
    })
}

/// Queue one command: a slot, the buffer moved out of its cell, the
/// engine's submission; on refusal everything put back.
///
/// # Safety
/// `qp` as for [`qpair`]; `buf` is NULL or a live buffer handle.
unsafe fn queue_data(
    qp: *mut McqioQpair,
    write: bool,
    unit: u32,
    lba: u64,
    nblocks: u32,
    buf: *mut McqioBuf,
    user_tag: u64,
) -> Result<(), Status> {
    // SAFETY: forwarded caller contract.
    let h = unsafe { qpair(qp) }?;
    // SAFETY: forwarded caller contract.
    let cell = unsafe { cell(buf) }?;
    let Some(slot) = h.free.pop() else {
        return Err(crate::status::fail_fixed(Status::QueueFull));
    };
    let b = cell.take().inspect_err(|_| h.free.push(slot))?;
    h.slots[slot as usize] = Slot { user_tag, buf };
    let tag = u64::from(slot);
    let r = if write {
        h.queue.write(unit, lba, nblocks, b, tag)
    } else {
        h.queue.read(unit, lba, nblocks, b, tag)
    };
    match r {
        Ok(()) => {
            h.queued = true;
            Ok(())
        }
        Err(e) => {
            cell.put(e.buf);
            h.free.push(slot);
            Err(submit_status(e.kind))
        }
    }
}

/// Queue a command without a buffer.
///
/// # Safety
/// `qp` as for [`qpair`].
unsafe fn queue_bufferless(
    qp: *mut McqioQpair,
    user_tag: u64,
    submit: impl FnOnce(&mut Queue<DmaBuf>, u64) -> Result<(), engine::SubmitError<()>>,
) -> Result<(), Status> {
    // SAFETY: forwarded caller contract.
    let h = unsafe { qpair(qp) }?;
    let Some(slot) = h.free.pop() else {
        return Err(crate::status::fail_fixed(Status::QueueFull));
    };
    h.slots[slot as usize] = Slot {
        user_tag,
        buf: std::ptr::null(),
    };
    match submit(&mut h.queue, u64::from(slot)) {
        Ok(()) => {
            h.queued = true;
            Ok(())
        }
        Err(e) => {
            h.free.push(slot);
            Err(submit_status(e.kind))
        }
    }
}

/// Queue a read of `nblocks` blocks at `lba` of unit `unit` into `buf`
/// (at least `nblocks` × the unit's block size bytes). The doorbell is rung
/// by the next poll or wait, or by `mcqio_qpair_ring()`. On `MCQIO_STATUS_OK` the
/// buffer is the queue pair's until its completion is delivered: do not
/// touch its bytes, and do not free it (refused with `MCQIO_STATUS_BUSY`).
/// Refused (any other status), nothing was sent and the buffer is still
/// the caller's.
///
/// # Safety
/// `qp` is NULL or a live queue pair handle, used by no other thread
/// meanwhile; `buf` is NULL or a live buffer handle.
#[no_mangle]
pub unsafe extern "C" fn mcqio_submit_read(
    qp: *mut McqioQpair,
    unit: u32,
    lba: u64,
    nblocks: u32,
    buf: *mut McqioBuf,
    user_tag: u64,
) -> Status {
    // SAFETY: forwarded caller contract.
    guard("mcqio_submit_read", || unsafe {
        queue_data(qp, false, unit, lba, nblocks, buf, user_tag)
    })
}

/// Queue a write of `nblocks` blocks at `lba` of unit `unit` from `buf`;
/// otherwise as `mcqio_submit_read()`.
///
/// # Safety
/// As `mcqio_submit_read()`.
#[no_mangle]
pub unsafe extern "C" fn mcqio_submit_write(
    qp: *mut McqioQpair,
    unit: u32,
    lba: u64,
    nblocks: u32,
    buf: *mut McqioBuf,
    user_tag: u64,
) -> Status {
    // SAFETY: forwarded caller contract.
    guard("mcqio_submit_write", || unsafe {
        queue_data(qp, true, unit, lba, nblocks, buf, user_tag)
    })
}

/// Queue a flush of unit `unit`'s volatile write cache (NVMe Flush, SCSI
/// SYNCHRONIZE CACHE); its completion has no buffer.
///
/// # Safety
/// `qp` is NULL or a live queue pair handle, used by no other thread
/// meanwhile.
#[no_mangle]
pub unsafe extern "C" fn mcqio_submit_flush(
    qp: *mut McqioQpair,
    unit: u32,
    user_tag: u64,
) -> Status {
    guard("mcqio_submit_flush", || {
        // SAFETY: forwarded caller contract.
        unsafe { queue_bufferless(qp, user_tag, |q, tag| q.flush(unit, tag)) }
    })
}

/// Queue a deallocation of `nblocks` blocks at `lba` of unit `unit`
/// (NVMe Dataset Management, SCSI UNMAP); its completion has no buffer.
/// `MCQIO_STATUS_UNSUPPORTED` if the device has no such command.
///
/// # Safety
/// As `mcqio_submit_flush()`.
#[no_mangle]
pub unsafe extern "C" fn mcqio_submit_deallocate(
    qp: *mut McqioQpair,
    unit: u32,
    lba: u64,
    nblocks: u32,
    user_tag: u64,
) -> Status {
    guard("mcqio_submit_deallocate", || {
        // SAFETY: forwarded caller contract.
        unsafe { queue_bufferless(qp, user_tag, |q, tag| q.deallocate(unit, lba, nblocks, tag)) }
    })
}

/// Ring the doorbell now for the commands queued since the last one
/// (polls and waits do it first anyway).
///
/// # Safety
/// As `mcqio_submit_flush()`.
#[no_mangle]
pub unsafe extern "C" fn mcqio_qpair_ring(qp: *mut McqioQpair) -> Status {
    guard("mcqio_qpair_ring", || {
        // SAFETY: forwarded caller contract.
        let h = unsafe { qpair(qp) }?;
        if std::mem::take(&mut h.queued) {
            h.queue.submit();
        }
        Ok(())
    })
}

/// Commands in flight at once at most (a negative status for NULL).
///
/// # Safety
/// As `mcqio_submit_flush()`.
#[no_mangle]
pub unsafe extern "C" fn mcqio_qpair_depth(qp: *mut McqioQpair) -> c_int {
    guard_count("mcqio_qpair_depth", || {
        // SAFETY: forwarded caller contract.
        let h = unsafe { qpair(qp) }?;
        Ok(h.slots.len())
    })
}

/// Commands submitted whose completion has not been delivered (a negative
/// status for NULL).
///
/// # Safety
/// As `mcqio_submit_flush()`.
#[no_mangle]
pub unsafe extern "C" fn mcqio_qpair_outstanding(qp: *mut McqioQpair) -> c_int {
    guard_count("mcqio_qpair_outstanding", || {
        // SAFETY: forwarded caller contract.
        let h = unsafe { qpair(qp) }?;
        Ok(h.slots.len() - h.free.len())
    })
}

/// Ring what is queued, then deliver up to `max` completions that have
/// arrived to `cb`, without waiting; each with its buffer handed back
/// before the call. Returns how many (0: none yet), or a negative status.
/// Timeouts are detected here: poll a queue pair with commands in flight
/// at least once per timeout.
///
/// # Safety
/// `qp` is NULL or a live queue pair handle, used by no other thread
/// meanwhile; `cb` keeps the rules of `mcqio_cpl_fn` and gets `ctx`.
#[no_mangle]
pub unsafe extern "C" fn mcqio_poll(
    qp: *mut McqioQpair,
    max: u32,
    cb: McqioCplFn,
    ctx: *mut c_void,
) -> c_int {
    guard_count("mcqio_poll", || {
        // SAFETY: forwarded caller contract.
        unsafe { reap_to_callback(qp, max as usize, Reap::Poll, cb, ctx) }
    })
}

/// `mcqio_poll()` into `out`: up to `n` completions written to `out[0..]`.
/// Returns how many, or a negative status.
///
/// # Safety
/// As `mcqio_poll()`; `out` is valid for `n` writes of the struct.
#[no_mangle]
pub unsafe extern "C" fn mcqio_poll_into(qp: *mut McqioQpair, out: *mut McqioCpl, n: u32) -> c_int {
    guard_count("mcqio_poll_into", || {
        // SAFETY: forwarded caller contract.
        unsafe { reap_into(qp, out, n, Reap::Poll) }
    })
}

/// [`reap`] into the caller's array.
///
/// # Safety
/// As `mcqio_poll_into()`.
unsafe fn reap_into(
    qp: *mut McqioQpair,
    out: *mut McqioCpl,
    n: u32,
    how: Reap,
) -> Result<usize, Status> {
    // SAFETY: forwarded caller contract.
    let h = unsafe { qpair_outside_callback(qp) }?;
    if out.is_null() && n > 0 {
        return Err(fail(Status::Invalid, "out is NULL"));
    }
    let mut i = 0;
    reap(h, n as usize, how, |c| {
        // SAFETY: the engine delivers at most `n` completions, so i < n,
        // and `out` is valid for `n` writes (caller contract).
        unsafe { out.add(i).write(c) };
        i += 1;
    })
}

/// Wait until a completion arrives or `timeout_ns` passes (negative: no
/// limit), as the queue pair's `wait` option says (spin, sleep on its
/// interrupt, or spin then sleep), then deliver up to `max` (at least 1)
/// completions to `cb` as `mcqio_poll()` does. Returns how many (0: the
/// time ran out, or nothing is in flight), or a negative status.
///
/// # Safety
/// As `mcqio_poll()`.
#[no_mangle]
pub unsafe extern "C" fn mcqio_wait(
    qp: *mut McqioQpair,
    max: u32,
    timeout_ns: i64,
    cb: McqioCplFn,
    ctx: *mut c_void,
) -> c_int {
    guard_count("mcqio_wait", || {
        if max == 0 {
            return Err(fail(
                Status::Invalid,
                "max 0: a wait that can deliver nothing",
            ));
        }
        let how = Reap::Wait(timeout(timeout_ns));
        // SAFETY: forwarded caller contract.
        unsafe { reap_to_callback(qp, max as usize, how, cb, ctx) }
    })
}

/// `mcqio_wait()` into `out` (`n` at least 1), as `mcqio_poll_into()`.
///
/// # Safety
/// As `mcqio_poll_into()`.
#[no_mangle]
pub unsafe extern "C" fn mcqio_wait_into(
    qp: *mut McqioQpair,
    out: *mut McqioCpl,
    n: u32,
    timeout_ns: i64,
) -> c_int {
    guard_count("mcqio_wait_into", || {
        if n == 0 {
            return Err(fail(
                Status::Invalid,
                "n 0: a wait that can deliver nothing",
            ));
        }
        // SAFETY: forwarded caller contract.
        unsafe { reap_into(qp, out, n, Reap::Wait(timeout(timeout_ns))) }
    })
}
