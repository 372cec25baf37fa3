//! The `tokio` feature (issue 26 item 3 b): [`AsyncQueue::tokio`], the
//! same driver and futures as [`AsyncQueue::new`], whose pending futures sleep on
//! the queue pair's interrupt through [`tokio::io::unix::AsyncFd`] instead
//! of having the executor poll it again, so a tokio task `.await`s an I/O
//! while its thread sleeps in the runtime's epoll.
//!
//! # How the futures sleep
//!
//! A pending future that finds no sleep covering it keeps the queue
//! polled (see [the module docs](super)); when its poll of the queue
//! found nothing, it takes the steps of [`BlockQueue::wait`] one executor
//! round at a time, in the same order, so no wake-up is lost:
//!
//! 1. the poll that found nothing (already done);
//! 2. [`BlockQueue::arm_sleep`]: clear the notifier (acknowledge and unmask
//!    a level-triggered line), fence;
//! 3. poll again: a completion posted before the arm is seen here;
//! 4. sleep: `poll_read_ready` on an `AsyncFd` registered on a duplicate of
//!    the interrupt's descriptor, and a timer for the wait's slice. A
//!    signal after step 2 makes the eventfd readable, so epoll reports it
//!    even when it came before this step; the readiness is cleared before
//!    the next arm reads the counter, so a later signal is reported again.
//!    An NVMe/TCP queue's descriptor is an epoll set holding its socket:
//!    every arrival on the socket wakes the set's watchers (tokio's epoll
//!    among them), so data after the clear is reported again too, and data
//!    the poll of step 3 did not find is such an arrival.
//!
//! The waker the reactor and the timer get is not the sleeper's own: it is
//! a fan-out that marks the sleep ended and wakes the cell of every
//! pending future (one lock-free waker cell per slot, and one per slot for
//! futures waiting for a slot). Every pending future registers its waker
//! in its cell before it looks at whether a sleep covers it, so a sleep
//! that ends meanwhile either sees the registration or is seen ended. The
//! sleep belongs to the queue, not to the future that took the steps: that
//! future may resolve, be dropped, or never be polled again, and the
//! others are woken all the same; the first of them polled polls the queue
//! and sleeps again. A future polled while a sleep covers it only polls
//! the queue when it queued a command (its doorbell rings; the armed
//! interrupt stays armed).
//!
//! When the eventfd or the timer ends the sleep, the next step calls
//! [`BlockQueue::slept`] (a slice that no interrupt ended keeps timeouts
//! due and looks at the controller's health, as `wait` does) and goes
//! round again. A notifier shared by several queues (UFS's INTx line) may
//! have its signal cleared by another queue's arm before epoll reports
//! it; the 1 ms slice of a shared notifier bounds that, as in `wait`.
//! With [`WaitPolicy::Hybrid`](crate::WaitPolicy::Hybrid) the pending
//! futures have the executor poll them again while the spin lasts, then
//! sleep. The cost of the fan-out: each interrupt wakes every pending
//! future's task once (a poll that finds a new sleep covering it is a
//! borrow and two loads).
//!
//! # The buffer rule
//!
//! As for every [`AsyncQueue`]: a future dropped before its completion —
//! by `tokio::time::timeout`, `select!`, an aborted task — leaves its
//! command running and its buffer with the queue pair, which drops it
//! when the completion arrives (a later poll of another future,
//! [`AsyncQueue::drive`], or [`AsyncQueue::close`]). A dropped future
//! never frees memory the device may still write.
//!
//! # Runtime
//!
//! The futures borrow the driver, which is not `Sync`: run them on one
//! thread, in a current-thread runtime or a `LocalSet`
//! (`spawn_local` with the driver in an `Rc`). The runtime needs its I/O
//! and time drivers (`Builder::enable_all`).

use std::future::Future;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use atomic_waker::AtomicWaker;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::time::{Instant, Sleep};

use super::future::{Cell, Next};
use super::{AsyncQueue, Inner, Mode, WrapError};
use crate::core::block::BlockQueue;

/// Most rounds of the sleep protocol in one poll of a future.
const MAX_ROUNDS: u32 = 8;

/// What the future that keeps the queue polled does next.
enum Park {
    /// The sleep is registered: the eventfd or the timer wakes every cell.
    Sleeping,
    /// Poll the queue pair again now (step 3, or after a sleep ended).
    PollAgain,
    /// The policy says spin (a hybrid spin is running), or the reactor is
    /// gone: have the executor poll again.
    Spin,
}

/// The waker the reactor and the timer hold while the queue sleeps: it
/// wakes every pending future's cell, so the sleep ends for all of them
/// whichever of them registered it.
struct FanOut {
    /// The sleep ended (set before the cells are woken).
    fired: AtomicBool,
    /// One cell per slot (its submitted future), then one per slot for
    /// futures waiting for a slot.
    cells: Box<[AtomicWaker]>,
}

impl Wake for FanOut {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Release: a future whose registration this wake missed (it came
        // after the cell was read) reads `fired` after its registration's
        // read-modify-write on the same cell, so it sees `true`.
        self.fired.store(true, Ordering::Release);
        for c in self.cells.iter() {
            c.wake();
        }
    }
}

/// The sleep: the queue's eventfd in the runtime's reactor, the slice
/// timer, and the cells (all made once, in [`AsyncQueue::tokio`]).
pub(super) struct Reactor {
    fd: AsyncFd<OwnedFd>,
    timer: Pin<Box<Sleep>>,
    /// Steps 2 and 3 were taken since the last sleep ended: the next
    /// round may sleep.
    armed: bool,
    /// A sleep is registered with the reactor and the timer, through
    /// `fan`, and has not been seen to end.
    sleeping: bool,
    fan: Arc<FanOut>,
    fan_waker: Waker,
    /// Waiter cells not taken (indices into `fan.cells`).
    spare: Vec<u32>,
}

impl Reactor {
    /// One step of the sleep protocol (see the module docs), with the
    /// fan-out as the waker.
    fn park<Q: BlockQueue>(&mut self, qp: &mut Q) -> Park {
        if !self.armed {
            let Some(s) = qp.arm_sleep() else {
                return Park::Spin;
            };
            self.timer.as_mut().reset(Instant::now() + s.slice);
            self.armed = true;
            return Park::PollAgain;
        }
        let mut cx = Context::from_waker(&self.fan_waker);
        match self.fd.poll_read_ready(&mut cx) {
            Poll::Ready(Ok(mut ready)) => {
                // The next arm reads the counter; a signal after this
                // clear sets the readiness again.
                ready.clear_ready();
                self.armed = false;
                qp.slept(true);
                return Park::PollAgain;
            }
            Poll::Ready(Err(e)) => {
                // The reactor is gone (the runtime is shutting down):
                // nothing can wake us; keep polling.
                log::warn!("AsyncQueue: the runtime's reactor failed: {e}");
                self.armed = false;
                return Park::Spin;
            }
            Poll::Pending => {}
        }
        if self.timer.as_mut().poll(&mut cx).is_ready() {
            self.armed = false;
            qp.slept(false);
            return Park::PollAgain;
        }
        Park::Sleeping
    }
}

fn reactor<Q: BlockQueue>(g: &mut Inner<Q>) -> &mut Reactor {
    g.reactor.as_mut().expect("a tokio driver has its reactor")
}

/// Whether a registered sleep covers a pending future: it will wake the
/// future's cell when it ends. Read after the future registered its cell.
pub(super) fn covered<Q: BlockQueue>(g: &Inner<Q>) -> bool {
    g.reactor
        .as_ref()
        .is_some_and(|r| r.sleeping && !r.fan.fired.load(Ordering::Acquire))
}

/// The end of a pending future's poll on a tokio driver: its cell holds
/// its waker; if a sleep covers it, that is all; otherwise it keeps the
/// queue polled: the one that just polled the queue takes the sleep
/// protocol's next step, any other asks to be polled again (the next
/// round, it polls the queue if nobody did).
pub(super) fn keep<Q: BlockQueue>(
    g: &mut Inner<Q>,
    seen: &mut u64,
    cx: &mut Context<'_>,
    rounds: u32,
    drove: bool,
    cell: Cell,
) -> Next {
    let r = reactor(g);
    let idx = match cell {
        Cell::Slot(i) => Some(i),
        Cell::Waiter(c) => c,
    };
    if let Some(k) = idx {
        r.fan.cells[k as usize].register(cx.waker());
    }
    if r.sleeping && !r.fan.fired.load(Ordering::Acquire) {
        *seen = g.t.drives;
        return Next::Pending;
    }
    // No sleep covers us: it ended (or none was registered).
    r.fan.fired.store(false, Ordering::Relaxed);
    r.sleeping = false;
    if !drove || rounds > MAX_ROUNDS {
        *seen = g.t.drives;
        cx.waker().wake_by_ref();
        return Next::Pending;
    }
    let Inner { qp, reactor, t } = g;
    let r = reactor.as_mut().expect("a tokio driver has its reactor");
    match r.park(qp) {
        Park::Sleeping => {
            r.sleeping = true;
            *seen = t.drives;
            Next::Pending
        }
        Park::PollAgain => Next::Again,
        Park::Spin => {
            *seen = t.drives;
            cx.waker().wake_by_ref();
            Next::Pending
        }
    }
}

/// A waiter cell, if one is free.
pub(super) fn take_cell<Q: BlockQueue>(g: &mut Inner<Q>) -> Option<u32> {
    g.reactor.as_mut().and_then(|r| r.spare.pop())
}

/// Give a waiter cell back, its waker dropped.
pub(super) fn put_cell<Q: BlockQueue>(g: &mut Inner<Q>, c: u32) {
    if let Some(r) = g.reactor.as_mut() {
        drop(r.fan.cells[c as usize].take());
        r.spare.push(c);
    }
}

/// Slot `i` has no pending future any more: drop the waker in its cell.
pub(super) fn clear_slot<Q: BlockQueue>(g: &mut Inner<Q>, i: u32) {
    if let Some(r) = g.reactor.as_mut() {
        drop(r.fan.cells[i as usize].take());
    }
}

impl<Q: BlockQueue> AsyncQueue<Q> {
    /// Own `qp`, whose futures sleep on its interrupt in the current tokio
    /// runtime's reactor rather than keep the thread polling (feature
    /// `tokio`). The queue pair must wait on interrupts
    /// ([`WaitPolicy::Interrupt`](crate::WaitPolicy::Interrupt) or
    /// [`Hybrid`](crate::WaitPolicy::Hybrid) in its options). Call it
    /// inside the runtime the futures run on; it needs the runtime's I/O
    /// and time drivers, and tokio panics here if the time driver is off.
    ///
    /// The pending future that finds no sleep covering it (see
    /// [`crate::core::asyncio`]) takes [`BlockQueue::wait`]'s steps one
    /// executor round at a time: a poll that finds nothing, then
    /// [`BlockQueue::arm_sleep`], a second poll, and only then a sleep on
    /// an `AsyncFd` over a duplicate of the queue's interrupt descriptor
    /// (an eventfd; an NVMe/TCP queue's epoll set on its socket), bounded by
    /// the wait's slice (10 ms; 1 ms on a notifier other queues share, such
    /// as UFS's INTx line), after which [`BlockQueue::slept`] keeps
    /// timeouts due and looks at the controller's health. The sleep wakes
    /// every pending future, so none depends on another's task. The futures
    /// borrow the driver, which is not `Sync`: run them on one thread (a
    /// current-thread runtime, or `spawn_local` in a `LocalSet` with the
    /// driver in an `Rc`). The buffer rule is every [`AsyncQueue`]'s: a
    /// future dropped before its completion (`tokio::time::timeout`,
    /// `select!`, an aborted task) leaves its buffer with the queue pair
    /// until the device is done with it.
    ///
    /// ```
    /// # use mcqio::{vfio::DmaDir, AsyncQueue, Controller, QpairOptions, WaitPolicy};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let fake = mcqio_fixtures::FakeController::new(mcqio_fixtures::FakeConfig {
    /// #     exec: mcqio_fixtures::ExecMode::Threaded { workers: 1, pin_core: None },
    /// #     ..Default::default()
    /// # })?;
    /// let ctrl = Controller::new(fake, Default::default())?;
    /// let opts = QpairOptions { wait: WaitPolicy::Interrupt, ..Default::default() };
    /// let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    /// let back = rt.block_on(async {
    ///     let aq = AsyncQueue::tokio(ctrl.create_qpair(opts)?)?;
    ///     let mut buf = ctrl.alloc_buf(512, DmaDir::Bidirectional)?;
    ///     buf.fill(7);
    ///     aq.write(1, 0, 1, buf).await.map_err(|e| e.kind)?.result?;
    ///     // The thread sleeps in epoll until the queue's vector fires.
    ///     let c = aq.read(1, 0, 1, ctrl.alloc_buf(512, DmaDir::Bidirectional)?)
    ///         .await
    ///         .map_err(|e| e.kind)?;
    ///     c.result?;
    ///     aq.close()?;
    ///     Ok::<_, Box<dyn std::error::Error>>(c.buf.expect("handed back"))
    /// })?;
    /// let mut bytes = [0u8; 512];
    /// back.read_at(0, &mut bytes)?;
    /// assert!(bytes.iter().all(|&b| b == 7));
    /// # Ok(())
    /// # }
    /// ```
    pub fn tokio(qp: Q) -> std::result::Result<Self, WrapError<Q>> {
        let Some(irq) = qp.interrupt() else {
            return Err(WrapError::reactor(
                qp,
                "the queue pair has no interrupt: create it with WaitPolicy::Interrupt or Hybrid"
                    .into(),
            ));
        };
        if let Err(e) = tokio::runtime::Handle::try_current() {
            return Err(WrapError::reactor(qp, e.to_string()));
        }
        // A duplicate: queues sharing a notifier (UFS's INTx line) each
        // register their own descriptor with the reactor. An NVMe/TCP
        // queue's epoll set stays the same descriptor across reconnects.
        let fd = match irq.as_fd().try_clone_to_owned() {
            Ok(fd) => fd,
            Err(e) => {
                let why = format!("duplicating the interrupt's descriptor: {e}");
                return Err(WrapError::reactor(qp, why));
            }
        };
        // SAFETY: `fd` is an open descriptor that the `AsyncFd` owns from
        // here on (an `OwnedFd` closes it only when dropped, with the
        // `AsyncFd`), and `OwnedFd::as_raw_fd` always returns that same
        // descriptor.
        let fd = match unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) } {
            Ok(fd) => fd,
            Err(e) => {
                let why = format!("registering the interrupt: {}", e.into_parts().1);
                return Err(WrapError::reactor(qp, why));
            }
        };
        let timer = Box::pin(tokio::time::sleep(Duration::ZERO));
        let aq = Self::build(qp, Mode::Reactor)?;
        {
            let mut g = aq.inner.borrow_mut();
            let slots = g.t.slots.len() as u32;
            let fan = Arc::new(FanOut {
                fired: AtomicBool::new(false),
                cells: (0..2 * slots).map(|_| AtomicWaker::new()).collect(),
            });
            g.reactor = Some(Reactor {
                fd,
                timer,
                armed: false,
                sleeping: false,
                fan_waker: Waker::from(fan.clone()),
                fan,
                spare: (slots..2 * slots).rev().collect(),
            });
        }
        Ok(aq)
    }
}
