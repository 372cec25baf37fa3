//! The `tokio` feature (issue 26 item 3 b): [`AsyncQueue::tokio`], the
//! same driver and futures as [`AsyncQueue::new`], whose keeper sleeps on
//! the queue pair's interrupt through [`tokio::io::unix::AsyncFd`] instead
//! of having the executor poll it again, so a tokio task `.await`s an I/O
//! while its thread sleeps in the runtime's epoll.
//!
//! # How the keeper sleeps
//!
//! The keeper is the one pending future that keeps the queue pair polled
//! (see [the module docs](super)). When its poll finds nothing of its
//! own, it takes the steps of [`BlockQueue::wait`] one executor round at
//! a time, in the same order, so no wake-up is lost:
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
//! When the eventfd or the timer ends the sleep, the keeper calls
//! [`BlockQueue::slept`] (a slice that no interrupt ended keeps timeouts
//! due and looks at the controller's health, as `wait` does) and goes
//! round again. A notifier shared by several queues (UFS's INTx line) may
//! have its signal cleared by another queue's arm before epoll reports
//! it; the 1 ms slice of a shared notifier bounds that, as in `wait`.
//! With [`WaitPolicy::Hybrid`](crate::WaitPolicy::Hybrid) the keeper has
//! the executor poll it again while the spin lasts, then sleeps.
//!
//! Only the keeper registers with the `AsyncFd` (tokio wakes the last task
//! that asked); the other futures sleep until a poll records their
//! completion. When the keeper's command ends, another pending future
//! becomes the keeper and sleeps in its place.
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
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::time::{Instant, Sleep};

use super::AsyncQueue;
use crate::core::block::BlockQueue;
use crate::core::error::{Error, Result};

/// What the keeper does next.
pub(super) enum Park {
    /// Its task sleeps: the eventfd or the timer wakes it.
    Sleeping,
    /// Poll the queue pair again now (step 3, or after a sleep ended).
    PollAgain,
    /// The policy says spin (a hybrid spin is running): have the executor
    /// poll again.
    Spin,
}

/// The keeper's sleep: the queue's eventfd in the runtime's reactor, and
/// the slice timer (both made once, in [`AsyncQueue::tokio`]).
pub(super) struct Reactor {
    fd: AsyncFd<OwnedFd>,
    timer: Pin<Box<Sleep>>,
    /// Steps 2 and 3 were taken since the last sleep ended: the next
    /// round may sleep.
    armed: bool,
}

impl Reactor {
    /// One step of the keeper's wait (see the module docs).
    pub(super) fn park<Q: BlockQueue>(&mut self, qp: &mut Q, cx: &mut Context<'_>) -> Park {
        if !self.armed {
            let Some(s) = qp.arm_sleep() else {
                return Park::Spin;
            };
            self.timer.as_mut().reset(Instant::now() + s.slice);
            self.armed = true;
            return Park::PollAgain;
        }
        match self.fd.poll_read_ready(cx) {
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
        if self.timer.as_mut().poll(cx).is_ready() {
            self.armed = false;
            qp.slept(false);
            return Park::PollAgain;
        }
        Park::Sleeping
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
    /// The keeper (the pending future that keeps the queue polled, see
    /// [`crate::core::asyncio`]) takes [`BlockQueue::wait`]'s steps one
    /// executor round at a time: a poll that finds nothing, then
    /// [`BlockQueue::arm_sleep`], a second poll, and only then a sleep on
    /// an `AsyncFd` over a duplicate of the queue's interrupt descriptor
    /// (an eventfd; an NVMe/TCP queue's epoll set on its socket), bounded by
    /// the wait's slice (10 ms; 1 ms on a notifier other queues share, such
    /// as UFS's INTx line), after which [`BlockQueue::slept`] keeps
    /// timeouts due and looks at the controller's health. The other
    /// futures sleep until a poll records their completion. The futures
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
    pub fn tokio(qp: Q) -> Result<Self> {
        let no = |why: String| Error::InvalidOption(format!("AsyncQueue::tokio: {why}"));
        let irq =
            qp.interrupt().ok_or_else(|| {
                no("the queue pair has no interrupt: create it with WaitPolicy::Interrupt or Hybrid"
                .into())
            })?;
        tokio::runtime::Handle::try_current().map_err(|e| no(e.to_string()))?;
        // A duplicate: queues sharing a notifier (UFS's INTx line) each
        // register their own descriptor with the reactor. An NVMe/TCP
        // queue's epoll set stays the same descriptor across reconnects.
        let fd = irq
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| no(format!("duplicating the interrupt's descriptor: {e}")))?;
        // SAFETY: `fd` is an open descriptor that the `AsyncFd` owns from
        // here on (an `OwnedFd` closes it only when dropped, with the
        // `AsyncFd`), and `OwnedFd::as_raw_fd` always returns that same
        // descriptor.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(|e| no(format!("registering the interrupt: {}", e.into_parts().1)))?;
        let timer = Box::pin(tokio::time::sleep(Duration::ZERO));
        let aq = Self::build(qp, true);
        aq.inner.borrow_mut().reactor = Some(Reactor {
            fd,
            timer,
            armed: false,
        });
        Ok(aq)
    }
}
