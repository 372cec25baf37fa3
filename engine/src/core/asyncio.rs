//! Futures over a queue pair, for thread-per-core runtimes (issue 26
//! item 3 a): [`AsyncQueue`] owns one [`BlockQueue`] and hands out an
//! [`IoFuture`] per read or write; the future resolves to the command's
//! [`Completion`], with the buffer handed back inside it.
//!
//! The driver is executor-agnostic and lives on one core, like the queue
//! pair it owns (`Send`, not `Sync`): polling any of its futures polls the
//! queue pair (rings the doorbell for what was queued, reaps completions),
//! records each completion in its slot, and only then wakes that slot's
//! future. [`AsyncQueue::drive`] and [`AsyncQueue::wait`] do the same for
//! a loop that polls the queue itself.
//!
//! ```
//! use std::future::Future;
//! use std::pin::pin;
//! use std::sync::Arc;
//! use std::task::{Context, Poll, Wake, Waker};
//! use mcqio::{vfio::Backend, vfio::DmaDir, AsyncQueue, Controller, ControllerOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let backend: Arc<dyn Backend> = mcqio_fixtures::FakeController::new(Default::default())?;
//! let ctrl = Controller::new(backend, ControllerOptions::default())?;
//! let aq = AsyncQueue::new(ctrl.create_qpair(Default::default())?);
//! let mut buf = ctrl.alloc_buf(512, DmaDir::Bidirectional)?;
//! buf.fill(7);
//! // Any executor; here the simplest: poll until ready.
//! struct Noop;
//! impl Wake for Noop {
//!     fn wake(self: Arc<Self>) {}
//! }
//! let waker = Waker::from(Arc::new(Noop));
//! let back = {
//!     let mut io = pin!(async {
//!         aq.write(1, 0, 1, buf).await.map_err(|e| e.kind)?.result?;
//!         let back = ctrl.alloc_buf(512, DmaDir::Bidirectional)?;
//!         let c = aq.read(1, 0, 1, back).await.map_err(|e| e.kind)?;
//!         c.result?;
//!         Ok::<_, Box<dyn std::error::Error>>(c.buf.expect("handed back"))
//!     });
//!     loop {
//!         if let Poll::Ready(r) = io.as_mut().poll(&mut Context::from_waker(&waker)) {
//!             break r?;
//!         }
//!     }
//! };
//! let mut bytes = [0u8; 512];
//! back.read_at(0, &mut bytes)?;
//! assert!(bytes.iter().all(|&b| b == 7));
//! aq.close()?;
//! # Ok(())
//! # }
//! ```
//!
//! # No allocation per I/O
//!
//! The slot table is sized by the queue pair's depth and created once, in
//! [`AsyncQueue::new`]; a command's tag is its slot's index. A future
//! stores its task's [`Waker`] in its slot (a clone is a reference-count
//! increment for the usual wakers, and is skipped when the task did not
//! change). The only list that may grow is the one of futures waiting for
//! a free slot: it starts with room for one waiter per slot and keeps what
//! it grew to, so it allocates only when more futures than ever before
//! wait at once.
//!
//! # Dropping a future early: the buffer rule
//!
//! A future owns its buffer until its command is submitted (its first
//! poll); from then on the **queue pair** holds it, because the device may
//! write it until the command's completion arrives. Dropping the future
//! before that leaves the command running: its slot is marked abandoned,
//! and when the completion arrives (from a later poll of another future,
//! [`AsyncQueue::drive`], or the queue pair's close) the driver drops the
//! completion and its buffer and frees the slot. So a dropped future never
//! frees, and never hands back, memory the device may still touch. A
//! future dropped after its completion was recorded (but before it was
//! polled again) drops the buffer at once: the device is done with it.
//!
//! # Queue full
//!
//! A future that finds no free slot, or whose submission the queue pair
//! refuses with [`SubmitErrorKind::QueueFull`] (a split transfer or the
//! wire's own commands may hold trackers beyond the slots), does not fail:
//! it returns `Pending` and is woken when a slot frees (or, if nothing of
//! this driver is in flight to free one, asks to be polled again at once).
//! Every waiter is woken when a slot frees; the first polled takes it and
//! the others register again (no order among waiters is kept).
//!
//! # Errors, exactly once
//!
//! Every future resolves once:
//! - a submission the queue pair refuses for any other reason (bad input,
//!   a stopped queue) resolves to `Err(SubmitError)` with the buffer;
//! - everything the queue pair ends — the device's status, a timeout
//!   ([`IoError::TimedOut`](super::io::IoError::TimedOut)), a reset
//!   ([`IoError::AbortedByReset`](super::io::IoError::AbortedByReset)),
//!   a controller failure — resolves to `Ok(Completion)` with that
//!   `result`, as `poll` delivers it.
//!
//! An error of the queue pair's `poll` itself (a stopped or lost queue:
//! it comes after the completions that ended every command) is kept for
//! [`AsyncQueue::take_error`] and returned by [`AsyncQueue::drive`].
//!
//! # Who keeps polling
//!
//! The engine is polled: nothing completes unless someone polls the queue
//! pair. By default ([`AsyncQueue::new`]) one pending future at a time —
//! the *keeper* — wakes its own task after each poll, so an executor that
//! polls woken tasks keeps polling the queue pair, once per round however
//! many futures are pending; the others sleep until their completion
//! wakes them. When the keeper's command ends (or it is dropped), the
//! driver wakes another pending future, which takes over. With
//! [`AsyncQueue::caller_driven`] no future wakes itself: the application
//! calls [`drive`](AsyncQueue::drive) or [`wait`](AsyncQueue::wait)
//! (which may sleep on the queue's interrupt) between executor rounds.
//! With the `tokio` feature, `AsyncQueue::tokio` makes a driver whose
//! keeper sleeps on the queue's interrupt in tokio's reactor instead of
//! waking itself (module `on_tokio`, issue 26 item 3 b): the thread sleeps
//! in epoll while futures are pending, with the same slots, futures and
//! buffer rule.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use super::block::BlockQueue;
use super::error::{Error, Result};
use super::io::{Completion, SubmitError, SubmitErrorKind};

#[cfg(feature = "tokio")]
mod on_tokio;

/// Most rounds of the keeper's wait in one poll of its future.
#[cfg(feature = "tokio")]
const MAX_ROUNDS: u32 = 8;

/// What a slot of the table holds.
enum Slot<B> {
    /// Unused; on the free stack.
    Free,
    /// Submitted, not completed: the future's task, or `None` once the
    /// future was dropped (abandoned: the driver drops the completion and
    /// its buffer when it arrives).
    InFlight(Option<Waker>),
    /// Completed; waiting for its future to take it.
    Done(Completion<B>),
}

/// The driver's state, behind the [`AsyncQueue`]'s `RefCell`.
struct Inner<Q: BlockQueue> {
    qp: Q,
    t: Table<Q::Buf>,
    /// Where the keeper sleeps when its poll found nothing (`None`: it
    /// wakes its own task, or nobody keeps the queue polled).
    #[cfg(feature = "tokio")]
    reactor: Option<on_tokio::Reactor>,
}

/// Everything but the queue pair (so its callback can borrow it).
struct Table<B> {
    slots: Box<[Slot<B>]>,
    /// Free slot indices (a stack, capacity = slots).
    free: Vec<u32>,
    /// Wakers of futures waiting for a free slot, and the round they
    /// registered in (a future registers once per round).
    full: Vec<Waker>,
    full_round: u64,
    /// A slot was freed since the full-waiters were last woken.
    freed: bool,
    /// Wakers to call once the borrow is released (capacity = slots).
    wakes: Vec<Waker>,
    /// The slot whose future wakes itself to keep the queue polled.
    keeper: Option<u32>,
    self_driving: bool,
    error: Option<Error>,
    in_flight: usize,
}

impl<Q: BlockQueue> Inner<Q> {
    /// Poll the queue pair once: record completions, queue their wakers.
    fn drive(&mut self) -> Result<usize> {
        self.qp.submit();
        let Inner { qp, t, .. } = self;
        let r = qp.poll(t.slots.len(), |c| t.record(c));
        t.settle();
        r
    }

    /// The keeper's poll found nothing of its own, in its `rounds`th
    /// round of this poll: sleep on the queue's interrupt where a reactor
    /// watches it, else have the executor poll it again. `true`: poll the
    /// queue again now; `false`: return `Pending` (the wake-up arranged).
    fn keep(&mut self, cx: &mut Context<'_>, rounds: u32) -> bool {
        #[cfg(feature = "tokio")]
        if let Some(r) = &mut self.reactor {
            if rounds <= MAX_ROUNDS {
                match r.park(&mut self.qp, cx) {
                    on_tokio::Park::Sleeping => return false,
                    on_tokio::Park::PollAgain => return true,
                    on_tokio::Park::Spin => {}
                }
            }
        }
        let _ = rounds;
        cx.waker().wake_by_ref();
        false
    }

    /// `drive` for a future: the error is kept for `take_error`.
    fn drive_kept(&mut self) {
        if let Err(e) = self.drive() {
            self.t.error = Some(e);
        }
    }
}

impl<B> Table<B> {
    /// Record one completion: into its slot (its waker queued), or, for
    /// an abandoned command, dropped with its buffer now that the device
    /// is done with it.
    fn record(&mut self, c: Completion<B>) {
        let i = c.tag as usize;
        let Some(slot) = self.slots.get_mut(i) else {
            debug_assert!(false, "completion for tag {i}, no such slot");
            return;
        };
        match std::mem::replace(slot, Slot::Free) {
            Slot::InFlight(Some(w)) => {
                *slot = Slot::Done(c);
                self.wakes.push(w);
            }
            Slot::InFlight(None) => {
                drop(c);
                self.free.push(i as u32);
                self.freed = true;
            }
            other => {
                debug_assert!(false, "completion for slot {i}, not in flight");
                *slot = other;
                return;
            }
        }
        self.in_flight -= 1;
        if self.keeper == Some(i as u32) {
            self.keeper = None;
            self.hand_over_keeper();
        }
    }

    /// After recording: wake the waiters for a slot if one freed.
    fn settle(&mut self) {
        if self.freed {
            self.freed = false;
            if !self.full.is_empty() {
                self.full_round += 1;
                self.wakes.append(&mut self.full);
            }
        }
    }

    /// The keeper ended: wake another pending future to take over.
    fn hand_over_keeper(&mut self) {
        if !self.self_driving {
            return;
        }
        for s in self.slots.iter() {
            if let Slot::InFlight(Some(w)) = s {
                self.wakes.push(w.clone());
                return;
            }
        }
        // Only abandoned commands (or none) are left: a waiter for a slot
        // (if any) polls again and keeps things moving.
        self.freed = true;
    }

    /// A future took its completion (or was dropped after it): free its
    /// slot. With no keeper (its command ended and the future it handed
    /// over to resolved here without polling the queue), hand over again,
    /// or the futures still in flight, which returned `Pending` without
    /// waking themselves, would never be polled.
    fn free_slot(&mut self, i: u32) {
        self.slots[i as usize] = Slot::Free;
        self.free.push(i);
        self.freed = true;
        if self.keeper.is_none() {
            self.hand_over_keeper();
        }
    }
}

/// A queue pair driven by its futures (see the [module docs](self)).
///
/// `Send` when the queue pair is (it may move to its core's thread), never
/// `Sync`: one core drives it.
///
/// ```
/// fn send<T: Send>() {}
/// send::<mcqio::AsyncQueue<mcqio::QueuePair>>();
/// send::<mcqio::AsyncQueue<mcqio::UfsQueuePair>>();
/// ```
///
/// ```compile_fail
/// fn sync<T: Sync>() {}
/// sync::<mcqio::AsyncQueue<mcqio::QueuePair>>();
/// ```
pub struct AsyncQueue<Q: BlockQueue> {
    inner: RefCell<Inner<Q>>,
}

impl<Q: BlockQueue> AsyncQueue<Q> {
    /// Own `qp`; its futures keep it polled (the keeper, see the module
    /// docs). The slot table (one slot per command of the queue's depth)
    /// is allocated here, once.
    pub fn new(qp: Q) -> Self {
        Self::build(qp, true)
    }

    /// Own `qp`; no future wakes itself: the caller polls the queue pair
    /// with [`drive`](Self::drive) or [`wait`](Self::wait).
    pub fn caller_driven(qp: Q) -> Self {
        Self::build(qp, false)
    }

    fn build(qp: Q, self_driving: bool) -> Self {
        let depth = qp.depth().clamp(1, u32::MAX as usize);
        AsyncQueue {
            inner: RefCell::new(Inner {
                #[cfg(feature = "tokio")]
                reactor: None,
                qp,
                t: Table {
                    slots: (0..depth).map(|_| Slot::Free).collect(),
                    free: (0..depth as u32).rev().collect(),
                    full: Vec::with_capacity(depth),
                    full_round: 0,
                    freed: false,
                    wakes: Vec::with_capacity(depth),
                    keeper: None,
                    self_driving,
                    error: None,
                    in_flight: 0,
                },
            }),
        }
    }

    /// A future reading `blocks` blocks at `lba` of `at` into `buf`. It
    /// submits on its first poll.
    pub fn read(&self, at: Q::Addr, lba: u64, blocks: u32, buf: Q::Buf) -> IoFuture<'_, Q> {
        self.future(Data {
            at,
            lba,
            blocks,
            buf,
            read: true,
        })
    }

    /// A future writing `blocks` blocks at `lba` of `at` from `buf`. It
    /// submits on its first poll.
    pub fn write(&self, at: Q::Addr, lba: u64, blocks: u32, buf: Q::Buf) -> IoFuture<'_, Q> {
        self.future(Data {
            at,
            lba,
            blocks,
            buf,
            read: false,
        })
    }

    /// A future flushing the volatile write cache of `at` (NVMe Flush,
    /// SCSI SYNCHRONIZE CACHE). It submits on its first poll; a refusal
    /// comes back as `SubmitError<()>`.
    pub fn flush(&self, at: Q::Addr) -> IoFuture<'_, Q, NoData<Q::Addr>> {
        self.future(NoData::Flush { at })
    }

    /// A future deallocating `blocks` blocks at `lba` of `at` (NVMe
    /// Dataset Management deallocate, SCSI UNMAP). It submits on its
    /// first poll; a refusal comes back as `SubmitError<()>`.
    pub fn deallocate(
        &self,
        at: Q::Addr,
        lba: u64,
        blocks: u32,
    ) -> IoFuture<'_, Q, NoData<Q::Addr>> {
        self.future(NoData::Deallocate { at, lba, blocks })
    }

    fn future<C: Command<Q>>(&self, cmd: C) -> IoFuture<'_, Q, C> {
        IoFuture {
            q: self,
            state: State::New(cmd),
            round: None,
        }
    }

    /// Poll the queue pair once (ringing the doorbell for what futures
    /// queued) and wake the futures whose commands completed; returns how
    /// many completed, or the queue pair's `poll` error.
    pub fn drive(&self) -> Result<usize> {
        let r = self.inner.borrow_mut().drive();
        self.wake_queued();
        r
    }

    /// Poll until something completes or `timeout` passes, through the
    /// queue pair's [`BlockQueue::wait`] (which sleeps on its interrupt
    /// when its wait policy says so), then wake the futures whose
    /// commands completed. Returns how many completed.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<usize> {
        let r = {
            let mut g = self.inner.borrow_mut();
            g.qp.submit();
            let Inner { qp, t, .. } = &mut *g;
            let r = qp.wait(t.slots.len(), timeout, |c| t.record(c));
            t.settle();
            r
        };
        self.wake_queued();
        r
    }

    /// Commands of this driver submitted and not completed (abandoned
    /// ones included).
    pub fn in_flight(&self) -> usize {
        self.inner.borrow().t.in_flight
    }

    /// The last error the queue pair's `poll` returned while futures
    /// drove it (see the module docs), taken.
    pub fn take_error(&self) -> Option<Error> {
        self.inner.borrow_mut().t.error.take()
    }

    /// Run `f` on the queue pair (counters, block sizes). `f` cannot poll
    /// it (a shared reference), so no completion bypasses its future.
    pub fn with_queue<R>(&self, f: impl FnOnce(&Q) -> R) -> R {
        f(&self.inner.borrow().qp)
    }

    /// Close the queue pair. No future is alive (they borrow the driver);
    /// completions of abandoned commands, and ones no future took, are
    /// dropped with their buffers as the queue pair hands them back.
    pub fn close(self) -> Result<()> {
        self.inner.into_inner().qp.close(drop)
    }

    /// Call the wakers queued while the state was borrowed.
    fn wake_queued(&self) {
        loop {
            let mut wakes = std::mem::take(&mut self.inner.borrow_mut().t.wakes);
            if wakes.is_empty() {
                self.inner.borrow_mut().t.wakes = wakes;
                return;
            }
            for w in wakes.drain(..) {
                w.wake();
            }
            // Give the (now empty) vector its place back, with whatever
            // the wakers themselves queued meanwhile for the next turn.
            let mut g = self.inner.borrow_mut();
            std::mem::swap(&mut g.t.wakes, &mut wakes);
            g.t.wakes.append(&mut wakes);
        }
    }
}

/// What an [`IoFuture`] submits: a read or write with its buffer
/// ([`Data`]), or a command without data ([`NoData`]). Sealed: the
/// driver's own commands only.
pub trait Command<Q: BlockQueue>: sealed::Sealed + Sized {
    /// What a refused submission hands back: the buffer, or `()`.
    type Refused;
    /// Submit with `tag` (no doorbell); a refusal gives the command back
    /// (to retry after `QueueFull`).
    #[doc(hidden)]
    fn submit_on(self, qp: &mut Q, tag: u64) -> std::result::Result<(), (SubmitErrorKind, Self)>;
    /// The refusal the future resolves to.
    #[doc(hidden)]
    fn refusal(self, kind: SubmitErrorKind) -> SubmitError<Self::Refused>;
}

mod sealed {
    pub trait Sealed {}
    impl<A, B> Sealed for super::Data<A, B> {}
    impl<A> Sealed for super::NoData<A> {}
}

/// A read or write and its buffer, before submission.
pub struct Data<A, B> {
    at: A,
    lba: u64,
    blocks: u32,
    buf: B,
    read: bool,
}

impl<Q: BlockQueue> Command<Q> for Data<Q::Addr, Q::Buf> {
    type Refused = Q::Buf;

    fn submit_on(self, qp: &mut Q, tag: u64) -> std::result::Result<(), (SubmitErrorKind, Self)> {
        let Data {
            at,
            lba,
            blocks,
            buf,
            read,
        } = self;
        let r = if read {
            qp.read(at, lba, blocks, buf, tag)
        } else {
            qp.write(at, lba, blocks, buf, tag)
        };
        r.map_err(|e| {
            (
                e.kind,
                Data {
                    at,
                    lba,
                    blocks,
                    buf: e.buf,
                    read,
                },
            )
        })
    }

    fn refusal(self, kind: SubmitErrorKind) -> SubmitError<Q::Buf> {
        SubmitError {
            kind,
            buf: self.buf,
        }
    }
}

/// A command without data (flush, deallocate), before submission.
#[derive(Clone, Copy, Debug)]
pub enum NoData<A> {
    /// Flush the volatile write cache of `at`.
    Flush {
        /// The namespace or logical unit.
        at: A,
    },
    /// Deallocate `blocks` blocks at `lba` of `at`.
    Deallocate {
        /// The namespace or logical unit.
        at: A,
        /// First block.
        lba: u64,
        /// Blocks.
        blocks: u32,
    },
}

impl<Q: BlockQueue> Command<Q> for NoData<Q::Addr> {
    type Refused = ();

    fn submit_on(self, qp: &mut Q, tag: u64) -> std::result::Result<(), (SubmitErrorKind, Self)> {
        let r = match self {
            NoData::Flush { at } => qp.flush(at, tag),
            NoData::Deallocate { at, lba, blocks } => qp.deallocate(at, lba, blocks, tag),
        };
        r.map_err(|e| (e.kind, self))
    }

    fn refusal(self, kind: SubmitErrorKind) -> SubmitError<()> {
        SubmitError { kind, buf: () }
    }
}

enum State<C> {
    /// Not submitted yet: the future owns the command (and its buffer).
    New(C),
    /// Submitted in this slot: the queue pair owns the buffer.
    Submitted(u32),
    /// Resolved.
    Gone,
}

/// One command on an [`AsyncQueue`] (a read or write by default; flush
/// and deallocate with [`NoData`]): resolves to its [`Completion`]
/// (buffer inside; its `tag` is the slot index) or to the refusal of its
/// submission. Dropping it early leaves the buffer with the queue pair
/// until the command completes (see the [module docs](self)). It borrows
/// its driver, so it stays on the driver's thread (not `Send`): the
/// per-core model.
#[must_use = "a future does nothing until polled; dropped unpolled, it never submits"]
pub struct IoFuture<
    'a,
    Q: BlockQueue,
    C: Command<Q> = Data<<Q as BlockQueue>::Addr, <Q as BlockQueue>::Buf>,
> {
    q: &'a AsyncQueue<Q>,
    state: State<C>,
    /// The full-waiters round this future registered in.
    round: Option<u64>,
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

impl<Q: BlockQueue, C: Command<Q>> IoFuture<'_, Q, C> {
    fn poll_inner(&mut self, cx: &mut Context<'_>) -> Poll<<Self as Future>::Output> {
        let mut g = self.q.inner.borrow_mut();
        if let State::New(_) = self.state {
            return self.submit(&mut g, cx);
        }
        let State::Submitted(i) = self.state else {
            panic!("IoFuture polled after it resolved");
        };
        let i_ = i as usize;
        // Rounds of the keeper's wait in this poll: bounded, so a stream
        // of interrupts (another queue's, on a shared line) cannot keep
        // the executor from its other tasks.
        let mut rounds = 0u32;
        loop {
            rounds += 1;
            if !matches!(g.t.slots[i_], Slot::Done(_)) {
                g.drive_kept();
            }
            let t = &mut g.t;
            if let Slot::Done(_) = t.slots[i_] {
                let Slot::Done(c) = std::mem::replace(&mut t.slots[i_], Slot::Free) else {
                    unreachable!()
                };
                t.free_slot(i);
                t.settle();
                self.state = State::Gone;
                return Poll::Ready(Ok(c));
            }
            if let Slot::InFlight(Some(w)) = &mut t.slots[i_] {
                if !w.will_wake(cx.waker()) {
                    *w = cx.waker().clone();
                }
            }
            if !t.self_driving {
                return Poll::Pending;
            }
            if t.keeper.is_none() {
                t.keeper = Some(i);
            }
            if t.keeper != Some(i) {
                return Poll::Pending;
            }
            if g.keep(cx, rounds) {
                continue;
            }
            return Poll::Pending;
        }
    }

    /// First poll: take a slot and queue the command (the doorbell rings
    /// on the next poll of any future, or `drive`).
    fn submit(&mut self, g: &mut Inner<Q>, cx: &mut Context<'_>) -> Poll<<Self as Future>::Output> {
        if g.t.free.is_empty() {
            g.drive_kept();
        }
        let Some(i) = g.t.free.pop() else {
            self.wait_for_slot(&mut g.t, cx);
            return Poll::Pending;
        };
        let State::New(cmd) = std::mem::replace(&mut self.state, State::Gone) else {
            unreachable!("submit is called on a new future")
        };
        let r = cmd.submit_on(&mut g.qp, u64::from(i));
        let t = &mut g.t;
        match r {
            Ok(()) => {
                t.slots[i as usize] = Slot::InFlight(Some(cx.waker().clone()));
                t.in_flight += 1;
                self.state = State::Submitted(i);
                // Polled again, it rings the doorbell (once for every
                // future submitted in this round) and reaps.
                if t.self_driving {
                    if t.keeper.is_none() {
                        t.keeper = Some(i);
                    }
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            }
            Err((SubmitErrorKind::QueueFull, cmd)) => {
                t.free.push(i);
                self.state = State::New(cmd);
                self.wait_for_slot(t, cx);
                Poll::Pending
            }
            Err((kind, cmd)) => {
                t.free.push(i);
                Poll::Ready(Err(cmd.refusal(kind)))
            }
        }
    }

    /// No slot now: register to be woken when one frees (once per round).
    fn wait_for_slot(&mut self, t: &mut Table<Q::Buf>, cx: &mut Context<'_>) {
        if self.round != Some(t.full_round) {
            self.round = Some(t.full_round);
            t.full.push(cx.waker().clone());
        }
        // Nothing of ours in flight would free a slot (the wire's own
        // commands hold the queue), or nobody keeps the queue polled: ask
        // to be polled again.
        if t.in_flight == 0 || (t.self_driving && t.keeper.is_none()) {
            cx.waker().wake_by_ref();
        }
    }
}

impl<Q: BlockQueue, C: Command<Q>> Drop for IoFuture<'_, Q, C> {
    fn drop(&mut self) {
        let State::Submitted(i) = self.state else {
            return;
        };
        let Ok(mut g) = self.q.inner.try_borrow_mut() else {
            // Only reachable from a waker run inside the driver, which
            // never happens (wakers run after the borrow ends): the slot
            // and buffer would stay with the queue pair until close.
            return;
        };
        let t = &mut g.t;
        match &mut t.slots[i as usize] {
            Slot::Done(_) => {
                // Completed: the device is done with the buffer.
                t.free_slot(i);
            }
            Slot::InFlight(waker) => {
                // The device may still write the buffer: it stays with the
                // queue pair; the driver drops it with the completion.
                *waker = None;
                if t.keeper == Some(i) {
                    t.keeper = None;
                    t.hand_over_keeper();
                }
            }
            Slot::Free => debug_assert!(false, "slot {i} freed under its future"),
        }
        t.settle();
        drop(g);
        self.q.wake_queued();
    }
}
