//! Interrupts as eventfds: what a polled engine sleeps on when it has
//! nothing left to poll.
//!
//! A [`Notifier`] is an eventfd. The device's interrupt signals it: for a
//! VFIO device the kernel's VFIO handler writes it when the MSI-X vector
//! fires (`VFIO_DEVICE_SET_IRQS` with `DATA_EVENTFD | ACTION_TRIGGER`), for
//! a fake controller its device model writes it when it posts to a
//! completion queue routed to that vector. The counter only ever adds up,
//! so a signal that comes before the waiter blocks is not lost: the wait
//! returns at once and [`Notifier::take`] clears it.
//!
//! A device model's [`Notifier::signal`] writes the eventfd only when the
//! last signal was taken: until then the descriptor is readable anyway,
//! and a model that wrote it after every completion would pay a system
//! call per completion while its host spins and never takes them (a
//! device's message costs the device nothing). The kernel's writes are
//! its own and are not absorbed.
//!
//! [`Interrupts`] is the device side of the seam ([`crate::Backend::interrupts`]):
//! which kind of interrupt the device has, and routing its vectors to
//! notifiers. Routing takes effect for the vectors given; the queues
//! decide what raises them (NVMe: IEN and IV of Create I/O CQ; the admin
//! queue always raises vector 0).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// One interrupt vector's eventfd.
#[derive(Debug)]
pub struct Notifier {
    fd: EventFd,
    /// [`Notifier::signal`] wrote the eventfd and [`Notifier::take`] has
    /// not cleared it since: the eventfd is readable (or its write is
    /// under way), so the next signals write nothing.
    pending: AtomicBool,
}

impl Notifier {
    /// A new, unsignalled notifier (non-blocking, close-on-exec).
    pub fn new() -> io::Result<Self> {
        // vmm-sys-util adds EFD_CLOEXEC itself.
        Ok(Notifier {
            fd: EventFd::new(EFD_NONBLOCK)?,
            pending: AtomicBool::new(false),
        })
    }

    /// Signal it, as an interrupt would (a device model's side): write the
    /// eventfd, unless a signal written before is not yet taken (see the
    /// module docs). Returns whether it wrote.
    pub fn signal(&self) -> bool {
        // Release: what the signaller wrote before (the completion entry
        // the interrupt announces) is visible to a `take` whose swap reads
        // this `true`, even when this signal writes nothing.
        if self.pending.swap(true, Ordering::AcqRel) {
            return false;
        }
        // A write fails only when the counter would overflow 2^64 - 2,
        // which means it is signalled already: nothing is lost.
        let _ = self.fd.write(1);
        true
    }

    /// Clear the signals: the eventfd's count (0 if none; signals
    /// [`signal`](Self::signal) absorbed are not counted). The only reader
    /// of the eventfd: one that read it elsewhere would leave the next
    /// signals absorbed with nothing to wake a waiter.
    pub fn take(&self) -> u64 {
        // Non-blocking: WouldBlock means no signal.
        let n = self.fd.read().unwrap_or(0);
        // After the read, so a signal whose write the read consumed is
        // cleared too, and from here every signal writes again. Acquire:
        // a signal absorbed before this clear (its swap read `true`) wrote
        // its entry before, and the caller's next poll sees it.
        self.pending.swap(false, Ordering::AcqRel);
        n
    }

    /// Block until signalled or `timeout` passes (`None`: no limit);
    /// whether it was signalled. The signal is left for [`Notifier::take`].
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        let ms = timeout.map_or(-1, |t| {
            // Round up, so a short timeout still sleeps.
            t.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
        });
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            // SAFETY: `p` is one valid pollfd that lives across the call;
            // poll(2) writes only its `revents`.
            let n = unsafe { libc::poll(&mut p, 1, ms) };
            if n >= 0 {
                return Ok(n > 0 && p.revents & libc::POLLIN != 0);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// The eventfd (for `VFIO_DEVICE_SET_IRQS`, an `AsyncFd`, epoll): to
    /// write to or watch, never to read ([`Notifier::take`] reads it).
    pub fn event_fd(&self) -> &EventFd {
        &self.fd
    }
}

impl AsRawFd for Notifier {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for Notifier {
    /// The eventfd, borrowed (`try_clone_to_owned` gives a duplicate, e.g.
    /// to register with a second reactor).
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: `self.fd` owns this descriptor and closes it only when
        // dropped, so it stays open for the borrow's lifetime (`&self`).
        unsafe { BorrowedFd::borrow_raw(self.fd.as_raw_fd()) }
    }
}

/// How a device interrupts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IrqKind {
    /// MSI-X with this many vectors (the table size).
    MsiX {
        /// Vectors in the MSI-X table.
        vectors: u32,
    },
    /// MSI with this many vectors.
    Msi {
        /// Vectors the MSI capability offers.
        vectors: u32,
    },
    /// The legacy INTx pin: one level-triggered line, masked by VFIO when
    /// it fires and unmasked by [`Interrupts::unmask`].
    Intx,
    /// No interrupt the host can use.
    None,
}

impl IrqKind {
    /// Vectors a queue can be given (INTx: one; none: zero).
    pub fn vectors(self) -> u32 {
        match self {
            IrqKind::MsiX { vectors } | IrqKind::Msi { vectors } => vectors,
            IrqKind::Intx => 1,
            IrqKind::None => 0,
        }
    }
}

/// Why interrupts could not be routed.
#[derive(Debug, thiserror::Error)]
pub enum IrqError {
    /// More notifiers than the device has vectors.
    #[error("{asked} interrupt vectors asked for, the device has {have}")]
    TooMany {
        /// Notifiers given.
        asked: usize,
        /// Vectors the device has.
        have: u32,
    },
    /// The device has no usable interrupt.
    #[error("the device has no interrupt the host can use")]
    Unsupported,
    /// The PCI command register could not be read or written.
    #[error("PCI command register: {0}")]
    Config(String),
    /// The VFIO call failed.
    #[error("VFIO {op} failed: {source}")]
    Vfio {
        /// What was being done.
        op: &'static str,
        /// What `vfio-ioctls` said.
        source: vfio_ioctls::VfioError,
    },
}

/// The device side of interrupt delivery.
pub trait Interrupts: Send + Sync {
    /// The best kind the device offers (MSI-X before MSI before INTx).
    fn kind(&self) -> IrqKind;
    /// Route vectors `0..notifiers.len()` to `notifiers` (replacing any
    /// earlier routing). The notifiers stay referenced until
    /// [`Interrupts::unroute`] or the device closes.
    fn route(&self, notifiers: &[Arc<Notifier>]) -> Result<(), IrqError>;
    /// Stop delivering interrupts to notifiers.
    fn unroute(&self) -> Result<(), IrqError>;
    /// INTx only: unmask the line after the waiter has handled it (VFIO
    /// masks a level-triggered line when it fires). A no-op otherwise.
    fn unmask(&self) -> Result<(), IrqError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_signal_before_the_wait_is_not_lost() {
        let n = Notifier::new().unwrap();
        assert_eq!(n.take(), 0, "a new notifier is clear");
        assert!(n.signal(), "the first signal writes");
        assert!(!n.signal(), "one not yet taken absorbs the next");
        // Already signalled: the wait returns at once, even without a limit.
        assert!(n.wait(None).unwrap());
        assert_eq!(n.take(), 1, "one write");
        assert_eq!(n.take(), 0);
        assert!(!n.wait(Some(Duration::ZERO)).unwrap(), "taken");
        assert!(n.signal(), "after a take the next signal writes again");
        assert!(n.wait(None).unwrap());
    }

    #[test]
    fn an_unsignalled_wait_times_out() {
        let n = Notifier::new().unwrap();
        let t = Instant::now();
        assert!(!n.wait(Some(Duration::from_millis(20))).unwrap());
        assert!(t.elapsed() >= Duration::from_millis(20));
        // A sub-millisecond timeout still sleeps rather than spinning.
        assert!(!n.wait(Some(Duration::from_micros(1))).unwrap());
    }

    #[test]
    fn a_signal_from_another_thread_wakes_the_waiter() {
        let n = Arc::new(Notifier::new().unwrap());
        let m = Arc::clone(&n);
        let h = std::thread::spawn(move || m.wait(Some(Duration::from_secs(30))).unwrap());
        std::thread::sleep(Duration::from_millis(10));
        n.signal();
        assert!(h.join().unwrap(), "woken by the signal, not the 30 s limit");
        assert_eq!(n.take(), 1);
    }

    #[test]
    fn kinds_count_their_vectors() {
        assert_eq!(IrqKind::MsiX { vectors: 65 }.vectors(), 65);
        assert_eq!(IrqKind::Msi { vectors: 4 }.vectors(), 4);
        assert_eq!(IrqKind::Intx.vectors(), 1);
        assert_eq!(IrqKind::None.vectors(), 0);
    }
}
