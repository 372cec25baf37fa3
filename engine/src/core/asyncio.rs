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
//! let aq = AsyncQueue::new(ctrl.create_qpair(Default::default())?)?;
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
//! # Wrapping a queue pair
//!
//! The driver tags each command with its slot's index, so every
//! completion the queue pair delivers must be one of the driver's: the
//! constructors refuse a queue pair that still has commands of its own
//! (in flight, or ended and held for its next poll) with a
//! [`WrapError`] that gives it back ([`WrapError::into_queue`]); poll them
//! out, then wrap it. A future only ever resolves with the completion of
//! the command it submitted. Should a completion ever name no command of
//! the driver in flight, it is kept, with its buffer, for
//! [`AsyncQueue::take_strays`] — never handed to a future, never dropped.
//!
//! # No allocation per I/O
//!
//! The slot table is sized by the queue pair's depth and created once, in
//! the constructor; a command's tag is its slot's index. A future stores
//! its task's [`Waker`] in its slot (a clone is a reference-count
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
//! refuses with [`SubmitErrorKind::QueueFull`](super::io::SubmitErrorKind)
//! (a split transfer or the wire's own commands may hold trackers beyond
//! the slots), does not fail: it returns `Pending` until a slot frees.
//! Every waiter is woken when a slot frees, through the waker of its most
//! recent poll; the first polled takes it and the others wait again (no
//! order among waiters is kept). With nothing of this driver in flight to
//! free a slot (the wire's own commands hold the queue), a waiter asks to
//! be polled again at once.
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
//! # Who keeps polling, and what is guaranteed
//!
//! The engine is polled: nothing completes unless someone polls the queue
//! pair. No future depends on another one being polled: a future that is
//! alive but not polled (a `select!` over `&mut fut` whose other branch
//! won, a future stored while its task awaits something else, a task
//! blocked elsewhere) holds up nobody.
//!
//! - [`AsyncQueue::new`]: **every pending future drives.** Each returns
//!   `Pending` having woken its own task, so an executor that polls woken
//!   tasks polls every pending future once per round. A pending future
//!   polls the queue pair only if nobody did since its own last poll (or
//!   it queued a command not yet rung), so the queue is polled about once
//!   per round however many futures are pending, by whichever is polled
//!   first. Guarantee: a future whose command completed resolves at its
//!   task's next poll after the queue's next poll, and the queue is polled
//!   at least once in any two polls of the same pending future, whatever
//!   the other futures' tasks do. The price: every pending future's task
//!   is polled every round (for many tasks on one queue, `caller_driven`
//!   with a loop that drives, or the `tokio` driver, poll less).
//! - [`AsyncQueue::caller_driven`]: **the caller drives.** No future wakes
//!   itself; [`drive`](AsyncQueue::drive) and [`wait`](AsyncQueue::wait)
//!   (which may sleep on the queue's interrupt) record completions and
//!   wake their futures. A polled pending future also polls the queue
//!   when nobody did since its last poll. Guarantee: a future whose
//!   command completed is woken by the first `drive` or `wait` after the
//!   completion arrived. Exception: nothing completes while the caller
//!   does not drive and no future is polled.
//! - With the `tokio` feature, `AsyncQueue::tokio`: **the futures sleep on
//!   the queue's interrupt in tokio's reactor** (module `on_tokio`). The
//!   sleep's waker wakes *every* pending future (each keeps its waker in a
//!   cell of its own), so whichever of them is polled first after the
//!   interrupt polls the queue and sleeps again for all. Guarantee: a
//!   future whose command completed is woken within one interrupt or one
//!   wait slice (10 ms; 1 ms on a shared notifier), whatever the other
//!   futures' tasks do. Exceptions: while a hybrid spin runs, pending
//!   futures wake their own tasks as with `new`; a future waiting for a
//!   slot beyond the first `depth` waiters has no cell and is woken only
//!   when a slot frees, which needs some other pending future of this
//!   queue to be polled.

use std::cell::RefCell;
use std::task::Waker;
use std::time::Duration;

use super::block::BlockQueue;
use super::error::{Error, Result};
use super::io::Completion;

mod command;
mod future;
#[cfg(feature = "tokio")]
mod on_tokio;

pub use command::{Command, Data, NoData};
pub use future::IoFuture;

/// Who keeps the queue pair polled (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// [`AsyncQueue::caller_driven`]: the application, through
    /// [`AsyncQueue::drive`] or [`AsyncQueue::wait`].
    Caller,
    /// [`AsyncQueue::new`]: every pending future, each waking its own
    /// task after each poll.
    Spin,
    /// `AsyncQueue::tokio`: every pending future, sleeping on the queue's
    /// interrupt in tokio's reactor.
    #[cfg(feature = "tokio")]
    Reactor,
}

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
    /// Where the futures sleep (`AsyncQueue::tokio` only).
    #[cfg(feature = "tokio")]
    reactor: Option<on_tokio::Reactor>,
}

/// Everything but the queue pair (so its callback can borrow it).
struct Table<B> {
    slots: Box<[Slot<B>]>,
    /// Free slot indices (a stack, capacity = slots).
    free: Vec<u32>,
    /// Wakers of futures waiting for a free slot, woken all at once when
    /// one frees (then the round ends and the list starts again). A future
    /// registers once per round and replaces its own entry when a later
    /// poll comes with another waker.
    full: Vec<Waker>,
    full_round: u64,
    /// A slot was freed since the full-waiters were last woken.
    freed: bool,
    /// Wakers to call once the borrow is released (capacity = slots).
    wakes: Vec<Waker>,
    mode: Mode,
    /// Polls of the queue pair so far: a pending future polls the queue
    /// only if nobody did since its own last poll (see `IoFuture`).
    drives: u64,
    /// A command was queued and its doorbell not rung yet: the next poll
    /// of any pending future polls the queue.
    queued: bool,
    error: Option<Error>,
    in_flight: usize,
    /// Completions whose tag names no slot in flight. The constructors
    /// refuse a queue pair with commands of its own, so none should ever
    /// come; if one does, it is kept here (with its buffer), never handed
    /// to a future and never dropped ([`AsyncQueue::take_strays`]).
    strays: Vec<Completion<B>>,
}

impl<Q: BlockQueue> Inner<Q> {
    /// Poll the queue pair once: record completions, queue their wakers.
    fn drive(&mut self) -> Result<usize> {
        self.t.drives = self.t.drives.wrapping_add(1);
        self.t.queued = false;
        self.qp.submit();
        let Inner { qp, t, .. } = self;
        let r = qp.poll(t.slots.len(), |c| t.record(c));
        t.settle();
        r
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
            return self.stray(c);
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
                *slot = other;
                return self.stray(c);
            }
        }
        self.in_flight -= 1;
    }

    #[cold]
    #[inline(never)]
    fn stray(&mut self, c: Completion<B>) {
        log::error!(
            "AsyncQueue: a completion with tag {} names no command in flight; kept for take_strays",
            c.tag
        );
        self.strays.push(c);
    }

    /// After recording: wake the waiters for a slot if one freed.
    #[inline]
    fn settle(&mut self) {
        if self.freed {
            self.freed = false;
            if !self.full.is_empty() {
                self.full_round += 1;
                self.wakes.append(&mut self.full);
            }
        }
    }

    /// A future took its completion (or was dropped after it): free its
    /// slot.
    #[inline]
    fn free_slot(&mut self, i: u32) {
        self.slots[i as usize] = Slot::Free;
        self.free.push(i);
        self.freed = true;
    }

    /// Register `waker` as waiting for a free slot: a new entry once per
    /// round, or the future's own entry replaced (`reg`: the round and
    /// index it registered at) when the task changed.
    fn wait_for_slot(&mut self, reg: &mut Option<(u64, usize)>, waker: &Waker) {
        match *reg {
            Some((round, k)) if round == self.full_round => {
                if !self.full[k].will_wake(waker) {
                    self.full[k] = waker.clone();
                }
            }
            _ => {
                *reg = Some((self.full_round, self.full.len()));
                self.full.push(waker.clone());
            }
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

/// Why a queue pair was not wrapped into an [`AsyncQueue`]; the queue
/// pair comes back whole with [`into_queue`](Self::into_queue).
pub struct WrapError<Q> {
    kind: WrapErrorKind,
    qp: Q,
}

/// The reason of a [`WrapError`].
#[derive(Debug)]
#[non_exhaustive]
pub enum WrapErrorKind {
    /// Commands submitted on the queue pair itself are not yet delivered
    /// (in flight, or ended and held for its next poll). The driver tags
    /// its commands with its slot numbers, so their completions would
    /// reach its futures: poll them out through the queue pair, then wrap
    /// it.
    Busy {
        /// The queue pair's commands not yet delivered.
        outstanding: usize,
    },
    /// `AsyncQueue::tokio`: the queue pair or the runtime cannot put the
    /// futures to sleep (no interrupt, no current runtime, the reactor
    /// refused the descriptor).
    Reactor(String),
}

impl<Q> WrapError<Q> {
    #[cfg(feature = "tokio")]
    fn reactor(qp: Q, why: String) -> Self {
        WrapError {
            kind: WrapErrorKind::Reactor(why),
            qp,
        }
    }

    /// Why.
    pub fn kind(&self) -> &WrapErrorKind {
        &self.kind
    }

    /// The queue pair's commands not yet delivered (0 unless
    /// [`WrapErrorKind::Busy`]).
    pub fn outstanding(&self) -> usize {
        match self.kind {
            WrapErrorKind::Busy { outstanding } => outstanding,
            _ => 0,
        }
    }

    /// The queue pair, as it was given.
    pub fn into_queue(self) -> Q {
        self.qp
    }
}

impl<Q> std::fmt::Debug for WrapError<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WrapError")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl<Q> std::fmt::Display for WrapError<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            WrapErrorKind::Busy { outstanding } => write!(
                f,
                "AsyncQueue: the queue pair has {outstanding} command(s) of its own not yet \
                 delivered; poll them out before wrapping it"
            ),
            WrapErrorKind::Reactor(why) => write!(f, "AsyncQueue::tokio: {why}"),
        }
    }
}

impl<Q> std::error::Error for WrapError<Q> {}

impl<Q: BlockQueue> AsyncQueue<Q> {
    /// Own `qp`; its pending futures keep it polled, each waking its own
    /// task (see the module docs). The slot table (one slot per command of
    /// the queue's depth) is allocated here, once. Refused, with `qp` back,
    /// while `qp` has commands of its own outstanding.
    pub fn new(qp: Q) -> std::result::Result<Self, WrapError<Q>> {
        Self::build(qp, Mode::Spin)
    }

    /// Own `qp`; no future wakes itself: the caller polls the queue pair
    /// with [`drive`](Self::drive) or [`wait`](Self::wait). Refused as
    /// [`new`](Self::new) is.
    pub fn caller_driven(qp: Q) -> std::result::Result<Self, WrapError<Q>> {
        Self::build(qp, Mode::Caller)
    }

    fn build(qp: Q, mode: Mode) -> std::result::Result<Self, WrapError<Q>> {
        let outstanding = qp.outstanding();
        if outstanding > 0 {
            return Err(WrapError {
                kind: WrapErrorKind::Busy { outstanding },
                qp,
            });
        }
        let depth = qp.depth().clamp(1, u32::MAX as usize);
        Ok(AsyncQueue {
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
                    mode,
                    drives: 0,
                    queued: false,
                    error: None,
                    in_flight: 0,
                    strays: Vec::new(),
                },
            }),
        })
    }

    /// A future reading `blocks` blocks at `lba` of `at` into `buf`. It
    /// submits on its first poll.
    pub fn read(&self, at: Q::Addr, lba: u64, blocks: u32, buf: Q::Buf) -> IoFuture<'_, Q> {
        IoFuture::new(self, Data::new(at, lba, blocks, buf, true))
    }

    /// A future writing `blocks` blocks at `lba` of `at` from `buf`. It
    /// submits on its first poll.
    pub fn write(&self, at: Q::Addr, lba: u64, blocks: u32, buf: Q::Buf) -> IoFuture<'_, Q> {
        IoFuture::new(self, Data::new(at, lba, blocks, buf, false))
    }

    /// A future flushing the volatile write cache of `at` (NVMe Flush,
    /// SCSI SYNCHRONIZE CACHE). It submits on its first poll; a refusal
    /// comes back as `SubmitError<()>`.
    pub fn flush(&self, at: Q::Addr) -> IoFuture<'_, Q, NoData<Q::Addr>> {
        IoFuture::new(self, NoData::Flush { at })
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
        IoFuture::new(self, NoData::Deallocate { at, lba, blocks })
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
    /// commands completed. Returns how many completed (0: the timeout
    /// passed, or nothing was in flight).
    pub fn wait(&self, timeout: Option<Duration>) -> Result<usize> {
        let r = {
            let mut g = self.inner.borrow_mut();
            g.t.drives = g.t.drives.wrapping_add(1);
            g.t.queued = false;
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

    /// Completions whose tag named no command of this driver in flight,
    /// with their buffers, taken. Empty unless a queue pair broke its
    /// contract (every command of a wrapped queue pair is the driver's).
    pub fn take_strays(&self) -> Vec<Completion<Q::Buf>> {
        std::mem::take(&mut self.inner.borrow_mut().t.strays)
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
