//! Exactly-once delivery when the device stops answering: ending every
//! command still outstanding, and leaking a buffer the device may still
//! own. Written once for every wire.
//!
//! The rules (the crate docs' table "How every command ends"):
//!
//! - A command ends once: its tracker slot is freed *before* the
//!   application's callback sees the completion, so a panicking callback
//!   loses nothing and ends nothing twice; what was not reached stays busy
//!   for a later call.
//! - A child of a split transfer ends through its parent
//!   ([`super::split_table`]): the parent completes when its last child ended,
//!   with the first error a child reported, else the error that ended the
//!   rest.
//! - A buffer goes back to the application only once the device can no
//!   longer access it (its own completion, a withdrawal the controller
//!   confirmed, a disabled or reset controller). Otherwise it is
//!   [leaked](leak): never freed, never reused, and counted.

use std::collections::VecDeque;

use super::io::{Completion, IoBuf, IoError};
use super::split_table::Splits;
use super::tracker::Trackers;

/// Completions that ended (tracker slot freed, buffer owned by the
/// completion) but did not fit in the `max` of the poll that ended them:
/// recovery after a reset or a failure ends every command at once, and
/// `poll` promises at most `max`. The next polls hand them out first, in
/// order. Preallocated at creation; untouched on the I/O path.
pub(crate) struct Held<B>(VecDeque<Completion<B>>);

impl<B> Default for Held<B> {
    fn default() -> Self {
        Held(VecDeque::new())
    }
}

impl<B: IoBuf> Held<B> {
    /// Room for `n` completions, allocated now: at most one per command
    /// slot ends per recovery, so a queue of depth `n` never allocates here
    /// again unless the application leaves them unpolled across resets.
    pub(crate) fn with_capacity(n: usize) -> Self {
        Held(VecDeque::with_capacity(n))
    }

    /// Nothing waits.
    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many wait.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Hand up to `max` to `f`, oldest first; returns how many. Each is
    /// taken out before `f` sees it, so a panicking `f` delivers nothing twice.
    #[cold]
    pub(crate) fn deliver(&mut self, max: usize, f: &mut impl FnMut(Completion<B>)) -> usize {
        let mut n = 0;
        while n < max {
            let Some(c) = self.0.pop_front() else { break };
            n += 1;
            f(c);
        }
        n
    }

    /// Run `end` — which ends any number of commands through the callback
    /// it is given — so that at most `budget` of them reach `f` and the
    /// rest wait here. Returns `end`'s result and how many reached `f`.
    #[cold]
    pub(crate) fn budgeted<R>(
        &mut self,
        budget: usize,
        f: &mut impl FnMut(Completion<B>),
        end: impl FnOnce(&mut dyn FnMut(Completion<B>)) -> R,
    ) -> (R, usize) {
        let mut n = 0;
        let r = end(&mut |c| {
            if n < budget {
                n += 1;
                f(c);
            } else {
                self.0.push_back(c);
            }
        });
        (r, n)
    }
}

/// The command in `slot` finished with `result` and its tracker slot was
/// just freed (`Trackers::complete`, which handed back `tag` and `buf`):
/// the completion to deliver — its own, or its parent's when it was the
/// last child of a split transfer — or `None` for a child whose siblings
/// are still in flight. The per-I/O delivery path of every wire.
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
        if !trackers.slot(slot).busy() {
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
