//! [`IoFuture`]: one command on an [`AsyncQueue`], and the rule by which
//! every pending future keeps the queue polled (see the [module
//! docs](super)).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::{AsyncQueue, Command, Data, Inner, Mode, Slot};
use crate::core::block::BlockQueue;
use crate::core::io::{Completion, SubmitError, SubmitErrorKind};

/// `seen` of a future that was never pending.
const NEVER: u64 = u64::MAX;

enum State<C> {
    /// Not submitted yet: the future owns the command (and its buffer).
    New(C),
    /// Submitted in this slot: the queue pair owns the buffer.
    Submitted(u32),
    /// Resolved.
    Gone,
}

/// Where a pending future's waker is kept for the queue's interrupt
/// (`AsyncQueue::tokio`).
#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "tokio"), allow(dead_code))]
pub(super) enum Cell {
    /// The cell of its slot (submitted).
    Slot(u32),
    /// A waiter's cell, if it got one.
    Waiter(Option<u32>),
}

/// What a pending future does at the end of its poll.
#[cfg_attr(not(feature = "tokio"), allow(dead_code))]
pub(super) enum Next {
    /// Poll the queue again now (a step of the sleep protocol).
    Again,
    /// Return `Pending` (its wake-up is arranged).
    Pending,
}

/// One command on an [`AsyncQueue`] (a read or write by default; flush
/// and deallocate with [`NoData`](super::NoData)): resolves to its
/// [`Completion`] (buffer inside; its `tag` is the slot index) or to the
/// refusal of its submission. Dropping it early leaves the buffer with
/// the queue pair until the command completes (see the [module
/// docs](super)). It borrows its driver, so it stays on the driver's
/// thread (not `Send`): the per-core model.
#[must_use = "a future does nothing until polled; dropped unpolled, it never submits"]
pub struct IoFuture<
    'a,
    Q: BlockQueue,
    C: Command<Q> = Data<<Q as BlockQueue>::Addr, <Q as BlockQueue>::Buf>,
> {
    q: &'a AsyncQueue<Q>,
    state: State<C>,
    /// The driver's count of queue polls at this future's last pending
    /// poll: it polls the queue itself only when nobody did since.
    seen: u64,
    /// Its entry in the list of futures waiting for a slot: the round and
    /// index it registered at.
    reg: Option<(u64, usize)>,
    /// Its waker cell while it waits for a slot (`AsyncQueue::tokio`).
    #[cfg(feature = "tokio")]
    cell: Option<u32>,
}

// Nothing is pinned structurally: the future only moves its fields by
// value through `&mut self`, and the slot table refers to it by index.
impl<Q: BlockQueue, C: Command<Q>> Unpin for IoFuture<'_, Q, C> {}

impl<Q: BlockQueue, C: Command<Q>> Future for IoFuture<'_, Q, C> {
    type Output = std::result::Result<Completion<Q::Buf>, SubmitError<C::Refused>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let out = this.poll_inner(cx);
        this.q.wake_queued();
        out
    }
}

impl<Q: BlockQueue> Inner<Q> {
    /// Whether a pending future polls the queue now: when something was
    /// queued and not rung; in a step of the sleep protocol (`rounds >
    /// 1`); or when nobody polled the queue since the future's last poll
    /// (`seen`) and no sleep covers it. So the queue is polled about once
    /// per executor round however many futures are pending, and by
    /// whichever of them is polled.
    fn should_drive(&self, seen: u64, rounds: u32) -> bool {
        let t = &self.t;
        if t.queued || rounds > 1 {
            return true;
        }
        match t.mode {
            Mode::Caller | Mode::Spin => t.drives == seen,
            #[cfg(feature = "tokio")]
            Mode::Reactor => t.drives == seen && !super::on_tokio::covered(self),
        }
    }

    /// The end of a pending future's poll: arrange that it is polled
    /// again (or woken) whatever any other future's task does.
    fn keep_polled(
        &mut self,
        seen: &mut u64,
        cx: &mut Context<'_>,
        rounds: u32,
        drove: bool,
        cell: Cell,
    ) -> Next {
        let _ = (rounds, drove, cell);
        match self.t.mode {
            // Its waker is in its slot or the waiters' list: `drive`
            // wakes it.
            Mode::Caller => {
                *seen = self.t.drives;
                Next::Pending
            }
            // Every pending future wakes its own task: none depends on
            // another being polled.
            Mode::Spin => {
                *seen = self.t.drives;
                cx.waker().wake_by_ref();
                Next::Pending
            }
            #[cfg(feature = "tokio")]
            Mode::Reactor => super::on_tokio::keep(self, seen, cx, rounds, drove, cell),
        }
    }
}

impl<'a, Q: BlockQueue, C: Command<Q>> IoFuture<'a, Q, C> {
    pub(super) fn new(q: &'a AsyncQueue<Q>, cmd: C) -> Self {
        IoFuture {
            q,
            state: State::New(cmd),
            seen: NEVER,
            reg: None,
            #[cfg(feature = "tokio")]
            cell: None,
        }
    }

    fn poll_inner(&mut self, cx: &mut Context<'_>) -> Poll<<Self as Future>::Output> {
        let mut g = self.q.inner.borrow_mut();
        // Rounds of the sleep protocol in this poll: bounded, so a stream
        // of interrupts (another queue's, on a shared line) cannot keep
        // the executor from its other tasks.
        let mut rounds = 0u32;
        loop {
            rounds += 1;
            let next = match self.state {
                State::New(_) => match self.submit(&mut g, cx, rounds) {
                    Ok(next) => next,
                    Err(out) => return Poll::Ready(out),
                },
                State::Submitted(i) => {
                    let i_ = i as usize;
                    let mut drove = false;
                    if !matches!(g.t.slots[i_], Slot::Done(_)) && g.should_drive(self.seen, rounds)
                    {
                        g.drive_kept();
                        drove = true;
                    }
                    if let Slot::Done(_) = g.t.slots[i_] {
                        let Slot::Done(c) = std::mem::replace(&mut g.t.slots[i_], Slot::Free)
                        else {
                            unreachable!()
                        };
                        g.release(i);
                        self.state = State::Gone;
                        return Poll::Ready(Ok(c));
                    }
                    self.pending(&mut g, cx, i, rounds, drove)
                }
                State::Gone => panic!("IoFuture polled after it resolved"),
            };
            match next {
                Next::Again => continue,
                Next::Pending => return Poll::Pending,
            }
        }
    }

    /// A submitted future whose command has not completed: its task's
    /// waker in the slot, then what to do next.
    #[inline]
    fn pending(
        &mut self,
        g: &mut Inner<Q>,
        cx: &mut Context<'_>,
        i: u32,
        rounds: u32,
        drove: bool,
    ) -> Next {
        if let Slot::InFlight(Some(w)) = &mut g.t.slots[i as usize] {
            if !w.will_wake(cx.waker()) {
                *w = cx.waker().clone();
            }
        }
        g.keep_polled(&mut self.seen, cx, rounds, drove, Cell::Slot(i))
    }

    /// A future not yet submitted: take a slot and queue the command (the
    /// doorbell rings on the next poll of any future, or `drive`), or wait
    /// for a slot. `Err`: resolved (a refusal).
    fn submit(
        &mut self,
        g: &mut Inner<Q>,
        cx: &mut Context<'_>,
        rounds: u32,
    ) -> std::result::Result<Next, <Self as Future>::Output> {
        let waited = self.seen != NEVER;
        let mut drove = false;
        if (g.t.free.is_empty() || waited) && g.should_drive(self.seen, rounds) {
            g.drive_kept();
            drove = true;
        }
        if let Some(i) = g.t.free.pop() {
            let State::New(cmd) = std::mem::replace(&mut self.state, State::Gone) else {
                unreachable!("submit is called on a new future")
            };
            match cmd.submit_on(&mut g.qp, u64::from(i)) {
                Ok(()) => {
                    self.stop_waiting(g);
                    let t = &mut g.t;
                    t.slots[i as usize] = Slot::InFlight(Some(cx.waker().clone()));
                    t.in_flight += 1;
                    t.queued = true;
                    self.state = State::Submitted(i);
                    self.seen = t.drives;
                    // Polled again, it rings the doorbell (once for every
                    // future submitted in this round) and reaps.
                    if t.mode != Mode::Caller {
                        cx.waker().wake_by_ref();
                    }
                    return Ok(Next::Pending);
                }
                Err((SubmitErrorKind::QueueFull, cmd)) => {
                    g.t.free.push(i);
                    self.state = State::New(cmd);
                }
                Err((kind, cmd)) => {
                    g.t.free.push(i);
                    self.stop_waiting(g);
                    return Err(Err(cmd.refusal(kind)));
                }
            }
        }
        // No slot now.
        let t = &mut g.t;
        if t.mode != Mode::Spin {
            t.wait_for_slot(&mut self.reg, cx.waker());
        }
        if t.in_flight == 0 {
            // Nothing of ours in flight would free a slot (the wire's own
            // commands hold the queue): ask to be polled again.
            self.seen = t.drives;
            cx.waker().wake_by_ref();
            return Ok(Next::Pending);
        }
        let cell = self.waiter_cell(g);
        Ok(g.keep_polled(&mut self.seen, cx, rounds, drove, Cell::Waiter(cell)))
    }

    /// The waiter's cell for the queue's interrupt: taken on its first
    /// wait (`AsyncQueue::tokio`; `None` when all are taken, or in the
    /// other modes).
    fn waiter_cell(&mut self, g: &mut Inner<Q>) -> Option<u32> {
        #[cfg(feature = "tokio")]
        if self.cell.is_none() {
            self.cell = super::on_tokio::take_cell(g);
        }
        #[cfg(feature = "tokio")]
        return self.cell;
        #[cfg(not(feature = "tokio"))]
        {
            let _ = g;
            None
        }
    }

    /// The future no longer waits for a slot: its cell goes back.
    fn stop_waiting(&mut self, g: &mut Inner<Q>) {
        self.reg = None;
        #[cfg(feature = "tokio")]
        if let Some(c) = self.cell.take() {
            super::on_tokio::put_cell(g, c);
        }
        let _ = g;
    }
}

impl<Q: BlockQueue> Inner<Q> {
    /// A future took its completion (or was dropped after it): free its
    /// slot and let waiters know.
    #[inline]
    fn release(&mut self, i: u32) {
        self.t.free_slot(i);
        self.t.settle();
        #[cfg(feature = "tokio")]
        super::on_tokio::clear_slot(self, i);
    }
}

impl<Q: BlockQueue, C: Command<Q>> Drop for IoFuture<'_, Q, C> {
    fn drop(&mut self) {
        let i = match self.state {
            State::Submitted(i) => i,
            // A waiter's entry in the list is harmless (a spurious wake);
            // only a waiter cell goes back.
            #[cfg(feature = "tokio")]
            State::New(_) if self.cell.is_some() => {
                if let Ok(mut g) = self.q.inner.try_borrow_mut() {
                    self.stop_waiting(&mut g);
                }
                return;
            }
            State::New(_) | State::Gone => return,
        };
        let Ok(mut g) = self.q.inner.try_borrow_mut() else {
            // Only reachable from a waker run inside the driver, which
            // never happens (wakers run after the borrow ends): the slot
            // and buffer would stay with the queue pair until close.
            return;
        };
        match &mut g.t.slots[i as usize] {
            Slot::Done(_) => {
                // Completed: the device is done with the buffer.
                g.release(i);
            }
            Slot::InFlight(waker) => {
                // The device may still write the buffer: it stays with the
                // queue pair; the driver drops it with the completion.
                *waker = None;
                #[cfg(feature = "tokio")]
                super::on_tokio::clear_slot(&mut g, i);
            }
            Slot::Free => debug_assert!(false, "slot {i} freed under its future"),
        }
        drop(g);
        self.q.wake_queued();
    }
}
