//! The job's queue pair, of the device's wire, and the submit and reap
//! code written once over [`BlockQueue`].

use std::time::{Duration, Instant};

use mcqio::core::block::BlockQueue;
use mcqio::{IoError, SubmitErrorKind};
use mcqio_open::Queue;

use super::buffers::{BufsOut, FioBuf};
use super::{Event, Op};
use crate::EngineError;

/// Empty polls between two looks at the clock while `getevents` waits.
const CLOCK_EVERY: u32 = 1024;

/// The job's queue pair: the opener's one queue type, of whichever wire
/// the device is on.
pub(super) type Qp = Queue<FioBuf>;

/// Close `qp`: every command still in flight ends here, those that carried
/// a buffer and got it back are counted off `bufs`.
pub(super) fn close(qp: Qp, bufs: &mut BufsOut) -> mcqio::Result<()> {
    BlockQueue::close(qp, |c| bufs.returned(c.buf.is_some()))
}

/// Submit one command on `qp` (no doorbell). `buf` is `Some` for reads and
/// writes.
#[inline]
pub(super) fn submit<Q: BlockQueue>(
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
pub(super) fn reap<Q: BlockQueue>(
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
pub(super) fn reap_waiting<Q: BlockQueue>(
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
