//! Waiting for completions without burning a core: [`WaitPolicy`], the
//! queue's interrupt ([`Interrupt`], kept by [`Waiter`]), and the wait
//! written once for every wire ([`Lifecycle::wait`](super::Lifecycle::wait)).
//!
//! # What a queue sleeps on
//!
//! A queue's [`Interrupt`] is a descriptor that becomes readable when the
//! queue has something to look at, of one of two kinds:
//!
//! - [`Interrupt::Notifier`]: an eventfd the device's interrupt signals
//!   (an MSI-X vector or INTx line through VFIO, a fake's device model).
//!   It counts signals, so arming clears it.
//! - [`Interrupt::Ready`]: a descriptor whose readiness *is* the
//!   interrupt, level-triggered, with nothing to clear (NVMe/TCP: an epoll
//!   set holding the queue's connection, readable while an answer waits in
//!   the socket, or while sends are held up and the socket can take more).
//!
//! Both are waited on the same way — `poll(2)` for `POLLIN` here, an
//! `AsyncFd`'s readable interest, an io_uring `POLL_ADD` — so no caller
//! of [`BlockQueue::arm_sleep`](crate::core::block::BlockQueue::arm_sleep)
//! needs to know the wire.
//!
//! # The order that loses no wake-up
//!
//! A wait that finds nothing to complete goes to sleep in four steps:
//!
//! 1. **poll** — deliver what is there;
//! 2. **arm** — clear the queue's notifier (and, on a level-triggered
//!    line, acknowledge the interrupt status and unmask the line; on a
//!    socket, make the next poll receive and say whether sends wait for
//!    room: [`Wire::arm_interrupt`](super::Wire::arm_interrupt));
//! 3. **poll again**;
//! 4. **block** on the interrupt's descriptor.
//!
//! A completion the second poll does not see was posted after that poll
//! read the completion queue, so its interrupt comes later still, and its
//! signal lands on a counter step 2 already cleared: the block in step 4
//! returns at once. A completion whose interrupt step 2 swallowed was
//! posted before that interrupt, so before step 2, and the second poll
//! sees it. What makes both sides hold:
//!
//! - **The device orders the entry before the interrupt.** An NVMe
//!   controller writes the CQE and then sends the MSI-X message, both
//!   posted memory writes on PCIe, which keeps posted writes in order; a
//!   UFS controller sets the interrupt status after the entry (or the
//!   doorbell bit) it announces. Interrupt handlers everywhere rely on it:
//!   the entry is visible in memory before the interrupt is taken.
//! - **The eventfd counter only adds up.** The kernel's handler (VFIO's
//!   for MSI-X or INTx; a device model thread for a fake) adds to it under
//!   the eventfd's lock; step 2 reads and zeroes it under the same lock. A
//!   signal is either before the clear (then its entry is visible to the
//!   second poll) or after it (then the counter is non-zero at step 4).
//! - **The second poll's loads are not hoisted above the clear.** On
//!   x86-64 loads are not reordered with older locked operations (the
//!   eventfd lock) and the system call serialises besides. On arm64 the
//!   lock's acquire keeps later loads after it; a `fence(SeqCst)` (a
//!   `dmb ish`) after the clear makes it explicit rather than an accident of
//!   the kernel's locking.
//!
//! Completions are still delivered only by polling: the eventfd says
//! "look", never what completed. A spurious wake-up (the signal of an
//! entry a poll already consumed) costs one empty poll.
//!
//! ## On a socket
//!
//! A socket's readiness is level-triggered: bytes in its receive buffer
//! keep it readable until they are received, so there is no counter to
//! clear and no signal to lose — a wake-up cannot come "before" the
//! sleep, it is the state the sleep looks at. Arming only has to make sure
//! that nothing the queue already holds is left behind when it sleeps:
//!
//! - **its own receive buffer**: every poll parses every complete PDU in
//!   it (up to the poll's budget — then the poll delivered something and
//!   the wait does not sleep), so at the sleep it holds at most the front
//!   of a PDU whose rest is still to come, which makes the socket
//!   readable when it does;
//! - **a receive its pacer skipped** (the wire holds receives for a few
//!   polls after one that brought data, to batch them): the arm clears the
//!   hold, so the poll of step 3 receives, and so does the first poll after
//!   a sleep. Data that step 3's receive did not find arrives later and
//!   makes the socket readable;
//! - **sends held up** by a full socket buffer (H2CData for an R2T, or a
//!   batch of capsules larger than the buffer): the target may be waiting
//!   for them, so the queue also watches for the socket becoming
//!   writable while anything is left to send, and the next poll sends it.
//!
//! The kernel takes the socket's lock to queue received data and to hand
//! it to `recv`, and `poll(2)` and epoll register their waiter before they
//! look at the socket's state, so data queued after step 3's receive
//! either is seen by that look or wakes the waiter.
//!
//! # Shared vectors
//!
//! A notifier shared by several queues (a legacy INTx line, or more queues
//! than MSI-X vectors) is cleared by whichever waiter arms first, which
//! can swallow another queue's signal. A waiter on a shared notifier
//! therefore sleeps in short slices ([`SHARED_SLICE`]) and polls between
//! them: no wake-up is lost for longer than a slice.
//!
//! # Nothing outstanding
//!
//! A wait on a queue pair with no command in flight returns 0 at once,
//! whatever its timeout and policy: no completion can come, so nothing but
//! the timeout could end a sleep, and a caller blocked there could not
//! notice new work arriving elsewhere. A thread idle between requests (a
//! ublk server, a network front end) sleeps on its own source of work
//! and waits on the queue only once it has submitted something. Tested:
//! `a_wait_returns_at_its_timeout_and_with_nothing_outstanding` (NVMe;
//! a wait with no limit would hang there otherwise).
//!
//! # Health while asleep
//!
//! Nothing polls a sleeping queue, so the sleep is cut into slices
//! ([`SLICE`]): after a slice that no interrupt ended, the wait reads the
//! queue's coarse clock (timeouts stay due) and looks at the controller's
//! health, so a failed or reset controller ends the wait with what `poll`
//! reports (the commands' errors, then the stopped queue's typed error)
//! within a slice, never a hang. The health look is also where a wire
//! does what needs doing while nothing polls (NVMe/TCP: the admin queue's
//! Keep Alive when it is due). A connection that drops makes its socket
//! readable (end of stream), so a sleeping wait on it ends at once with
//! the connection's typed error.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcqio_vfio::Notifier;

/// The longest one sleep on an unshared notifier lasts before the wait
/// looks at the controller's health and the clock.
pub const SLICE: Duration = Duration::from_millis(10);
/// The longest one sleep on a shared notifier (INTx, a shared MSI-X
/// vector) lasts: another queue's waiter may have cleared our signal.
pub const SHARED_SLICE: Duration = Duration::from_millis(1);
/// Empty polls between clock readings of a spinning wait.
const SPINS_PER_CLOCK: u32 = 32;

/// How a queue pair waits for completions ([`QpairOptions::wait`](crate::QpairOptions::wait),
/// [`UfsQpairOptions::wait`](crate::UfsQpairOptions::wait)).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum WaitPolicy {
    /// Spin on the completion queue (no interrupt is enabled for the
    /// queue; a wait burns a core). The default: nothing on the I/O path
    /// changes.
    #[default]
    Poll,
    /// Sleep on the queue's interrupt as soon as a poll finds nothing.
    Interrupt,
    /// Spin for `spin` after the last completion, then sleep on the
    /// interrupt (Linux's hybrid polling, with a fixed spin).
    Hybrid {
        /// How long to keep spinning after the last completion.
        spin: Duration,
    },
}

impl WaitPolicy {
    /// Whether the queue needs an interrupt.
    pub fn wants_interrupt(self) -> bool {
        self != WaitPolicy::Poll
    }
}

impl std::str::FromStr for WaitPolicy {
    type Err = String;

    /// `poll`, `irq` (or `interrupt`), `hybrid` (50 µs spin) or
    /// `hybrid:SPIN` with SPIN in `ns`, `us`, `ms` or `s` (`hybrid:20us`).
    fn from_str(s: &str) -> Result<Self, String> {
        let spin = |v: &str| -> Result<Duration, String> {
            let i = v
                .find(|c: char| !c.is_ascii_digit())
                .ok_or_else(|| format!("hybrid spin {v:?} needs a unit (ns, us, ms, s)"))?;
            let n: u64 = v[..i]
                .parse()
                .map_err(|_| format!("hybrid spin {v:?}: not a number"))?;
            Ok(match &v[i..] {
                "ns" => Duration::from_nanos(n),
                "us" => Duration::from_micros(n),
                "ms" => Duration::from_millis(n),
                "s" => Duration::from_secs(n),
                u => return Err(format!("hybrid spin {v:?}: unknown unit {u:?}")),
            })
        };
        match s {
            "poll" => Ok(WaitPolicy::Poll),
            "irq" | "interrupt" => Ok(WaitPolicy::Interrupt),
            "hybrid" => Ok(WaitPolicy::Hybrid {
                spin: Duration::from_micros(50),
            }),
            _ => match s.strip_prefix("hybrid:") {
                Some(v) => Ok(WaitPolicy::Hybrid { spin: spin(v)? }),
                None => Err(format!(
                    "wait policy {s:?}: expected poll, irq, hybrid or hybrid:SPIN"
                )),
            },
        }
    }
}

/// What a queue sleeps on (see the module docs): a descriptor that is
/// readable (`POLLIN`) when the queue has something to look at.
#[derive(Clone, Debug)]
pub enum Interrupt {
    /// An eventfd the device's interrupt signals; arming clears its count.
    /// Other queues may share it (an INTx line, a shared MSI-X vector).
    Notifier(Arc<Notifier>),
    /// A descriptor whose readiness is the interrupt, level-triggered,
    /// with nothing to clear (NVMe/TCP: the queue's epoll set holding its
    /// connection; it stays the same descriptor across reconnects).
    Ready(Arc<OwnedFd>),
}

impl Interrupt {
    /// The eventfd, for a notifier.
    pub fn notifier(&self) -> Option<&Arc<Notifier>> {
        match self {
            Interrupt::Notifier(n) => Some(n),
            Interrupt::Ready(_) => None,
        }
    }

    /// Arming's part that belongs to the descriptor: clear a notifier's
    /// count (a readiness has nothing to clear).
    pub(crate) fn clear(&self) {
        if let Interrupt::Notifier(n) = self {
            n.take();
        }
    }

    /// Block until the descriptor is readable or `timeout` passes (`None`:
    /// no limit); whether it became readable. Nothing is consumed: a
    /// notifier's signal is left for the next arm, a socket's data for the
    /// next poll.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        match self {
            Interrupt::Notifier(n) => n.wait(timeout),
            Interrupt::Ready(fd) => readable(fd.as_fd(), timeout),
        }
    }
}

impl AsFd for Interrupt {
    /// The descriptor to watch for `POLLIN` (`try_clone_to_owned` gives a
    /// duplicate to register with a reactor).
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Interrupt::Notifier(n) => n.as_fd(),
            Interrupt::Ready(fd) => fd.as_fd(),
        }
    }
}

/// `poll(2)` one descriptor for `POLLIN` (an error or hang-up counts as
/// readable: the next poll of the queue finds out what it was).
fn readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> io::Result<bool> {
    let ms = timeout.map_or(-1, |t| {
        // Round up, so a short timeout still sleeps.
        t.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
    });
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: `p` is one valid pollfd that lives across the call;
        // poll(2) writes only its `revents`. The descriptor is borrowed,
        // so it stays open meanwhile.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n >= 0 {
            return Ok(n > 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// What a queue pair armed for a sleep ([`BlockQueue::arm_sleep`](crate::core::block::BlockQueue::arm_sleep)):
/// its interrupt, and the longest the sleep may last before the queue
/// must be polled again.
#[derive(Clone, Debug)]
pub struct SleepOn {
    /// The queue's interrupt: sleep until its descriptor is readable. A
    /// notifier may be shared with other queues: then `slice` is short,
    /// since another queue's waiter may clear our signal.
    pub interrupt: Interrupt,
    /// 10 ms, or 1 ms on a shared notifier (an INTx line, a shared MSI-X
    /// vector).
    pub slice: Duration,
}

/// What the wait counted (in [`crate::QueueCounters`]).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct WaitStats {
    /// Sleeps on the interrupt.
    pub sleeps: u64,
    /// Sleeps an interrupt ended (the rest ran out their slice).
    pub wakeups: u64,
}

/// A queue's side of waiting: its policy and its interrupt, if it has one.
/// Kept at the end of the [`Engine`](super::Engine), and read only by
/// [`Lifecycle::wait`](super::Lifecycle::wait): `poll` never looks at it.
#[derive(Debug)]
pub(crate) struct Waiter {
    /// What the queue sleeps on (`None`: polling only).
    pub irq: Option<Interrupt>,
    /// The wire's number for the queue's interrupt (NVMe: the MSI-X
    /// vector in Create I/O CQ), to enable it again on a re-created queue.
    pub vector: Option<u16>,
    /// The policy.
    pub policy: WaitPolicy,
    /// The longest one sleep lasts ([`SLICE`], or [`SHARED_SLICE`] on a
    /// shared notifier).
    pub slice: Duration,
    /// When a wait last delivered something, or first saw that a poll
    /// had (the hybrid spin runs from it).
    pub last_completion: Option<Instant>,
    /// The engine's completion count when a wait last looked: a wait that
    /// finds it moved knows a poll delivered something since.
    pub seen_completed: u64,
    /// Counters.
    pub stats: WaitStats,
}

impl Default for Waiter {
    fn default() -> Self {
        Waiter::new(WaitPolicy::Poll, None, false)
    }
}

impl Waiter {
    /// A waiter with `policy` sleeping on `irq` (`None`: it polls);
    /// `shared`: other queues' waiters may clear its signal.
    pub fn new(policy: WaitPolicy, irq: Option<Interrupt>, shared: bool) -> Self {
        Waiter {
            irq,
            vector: None,
            slice: if shared { SHARED_SLICE } else { SLICE },
            policy,
            last_completion: None,
            seen_completed: 0,
            stats: WaitStats::default(),
        }
    }

    /// Whether, at `now`, the wait should sleep rather than spin.
    pub(super) fn should_sleep(&self, now: Instant) -> bool {
        if self.irq.is_none() {
            return false;
        }
        match self.policy {
            WaitPolicy::Poll => false,
            WaitPolicy::Interrupt => true,
            WaitPolicy::Hybrid { spin } => self
                .last_completion
                .is_none_or(|t| now.saturating_duration_since(t) >= spin),
        }
    }
}

/// The refusal of a wait for at most 0 completions.
#[cold]
pub(crate) fn no_completion_asked() -> crate::core::error::Error {
    crate::core::error::Error::InvalidOption(
        "wait with max = 0 can deliver nothing; ask for at least one completion (poll(0) rings without waiting)".into(),
    )
}

/// Whether a deadline passed.
pub(super) fn past(deadline: Option<Instant>, now: Instant) -> bool {
    deadline.is_some_and(|d| now >= d)
}

/// The spin between clock readings.
pub(super) const SPIN_BATCH: u32 = SPINS_PER_CLOCK;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse() {
        assert_eq!("poll".parse(), Ok(WaitPolicy::Poll));
        assert_eq!("irq".parse(), Ok(WaitPolicy::Interrupt));
        assert_eq!(
            "hybrid:20us".parse(),
            Ok(WaitPolicy::Hybrid {
                spin: Duration::from_micros(20)
            })
        );
        assert_eq!(
            "hybrid".parse(),
            Ok(WaitPolicy::Hybrid {
                spin: Duration::from_micros(50)
            })
        );
        for bad in ["", "hybrid:", "hybrid:20", "hybrid:20 parsecs", "spin"] {
            assert!(bad.parse::<WaitPolicy>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn hybrid_spins_only_within_its_window() {
        let n = Interrupt::Notifier(Arc::new(Notifier::new().unwrap()));
        let spin = Duration::from_millis(5);
        let mut w = Waiter::new(WaitPolicy::Hybrid { spin }, Some(n), false);
        let t = Instant::now();
        assert!(w.should_sleep(t), "no completion yet: sleep");
        w.last_completion = Some(t);
        assert!(!w.should_sleep(t + spin / 2), "inside the spin window");
        assert!(w.should_sleep(t + spin), "the window is over");
        // Without an interrupt every policy spins.
        let w = Waiter::new(WaitPolicy::Interrupt, None, false);
        assert!(!w.should_sleep(t));
        let n = Interrupt::Notifier(Arc::new(Notifier::new().unwrap()));
        assert!(!Waiter::new(WaitPolicy::Poll, Some(n), false).should_sleep(t));
    }
}
