//! Exactly-once delivery when the device stops answering: ending every
//! command still outstanding, and leaking a buffer the device may still
//! own. Written once for both transports.
//!
//! The rules (the crate docs' table "How every command ends"):
//!
//! - A command ends once: its tracker slot is freed *before* the
//!   application's callback sees the completion, so a panicking callback
//!   loses nothing and ends nothing twice; what was not reached stays busy
//!   for a later call.
//! - A child of a split transfer ends through its parent
//!   ([`super::split`]): the parent completes when its last child ended,
//!   with the first error a child reported, else the error that ended the
//!   rest.
//! - A buffer goes back to the application only once the device can no
//!   longer access it (its own completion, a withdrawal the controller
//!   confirmed, a disabled or reset controller). Otherwise it is
//!   [leaked](leak): never freed, never reused, and counted.

use super::io::{Completion, IoBuf, IoError};
use super::split::Splits;
use super::tracker::Trackers;

/// The command in `slot` finished with `result` and its tracker slot was
/// just freed (`Trackers::complete`, which handed back `tag` and `buf`):
/// the completion to deliver — its own, or its parent's when it was the
/// last child of a split transfer — or `None` for a child whose siblings
/// are still in flight. The per-I/O delivery path of both transports.
#[inline(always)]
pub(crate) fn route<B: IoBuf, S>(
    splits: &mut Splits<B, S>,
    slot: u16,
    tag: u64,
    buf: Option<B>,
    result: Result<(), IoError>,
    dw0: u32,
) -> Option<Completion<B>> {
    if let Some(p) = splits.parent_of(slot) {
        return route_child(splits, slot, p, result);
    }
    Some(Completion {
        tag,
        result,
        buf,
        dw0,
    })
}

/// A child of a split transfer finished: the parent's completion once it
/// was the last.
#[cold]
#[inline(never)]
fn route_child<B: IoBuf, S>(
    splits: &mut Splits<B, S>,
    slot: u16,
    p: u16,
    result: Result<(), IoError>,
) -> Option<Completion<B>> {
    let (tag, buf, result) = splits.child_done(slot, p, result)?;
    Some(Completion {
        tag,
        result,
        buf,
        dw0: 0,
    })
}

/// End up to `budget` commands still outstanding, in slot order; returns
/// how many completions `f` received. `f` gets the tag, the buffer, and,
/// for a split transfer, the first error one of its children reported
/// (`None`: the caller's error applies). Children of a split are counted
/// only when their parent completes.
pub(crate) fn drain_all<B: IoBuf, S>(
    trackers: &mut Trackers<B>,
    splits: &mut Splits<B, S>,
    budget: usize,
    mut f: impl FnMut(u64, Option<B>, Option<IoError>),
) -> usize {
    if !splits.active() {
        return trackers.drain_up_to(budget, |tag, buf| f(tag, buf, None));
    }
    let mut n = 0;
    for slot in 0..trackers.slots() as u16 {
        if n == budget {
            break;
        }
        if !trackers.slot(slot).busy {
            continue;
        }
        let (tag, buf) = trackers.complete(slot);
        match splits.parent_of(slot) {
            None => {
                n += 1;
                f(tag, buf, None)
            }
            Some(p) => {
                // `Ok` records no error: the caller's one applies.
                if let Some((tag, buf, r)) = splits.child_done(slot, p, Ok(())) {
                    n += 1;
                    f(tag, buf, r.err());
                }
            }
        }
    }
    n
}

/// Leak a buffer the device may still access: it is never freed or
/// reused. Returns the bytes leaked, for the controller's count.
#[cold]
pub(crate) fn leak<B: IoBuf>(buf: Option<B>) -> u64 {
    match buf {
        Some(b) => {
            let n = b.total_len() as u64;
            std::mem::forget(b);
            n
        }
        None => 0,
    }
}
