//! The control path's one error type, for every transport.
//!
//! [`Error`] is what bring-up, admin or device-management commands, queue
//! creation, `poll` and the blocking helpers return, on NVMe and on UFS
//! alike (re-exported as [`crate::Error`] with [`crate::Result`]). Most
//! variants are shared and worded without any transport's vocabulary (a
//! fatal controller is "fatal" whether NVMe set CSTS.CFS or UFS raised a
//! fatal bit in IS). The variants only one transport returns are marked
//! with it and say what happened in its words; their data are the plain
//! types of that transport's leaf `spec` module ([`NvmeStatus`],
//! [`IdentifyError`]), so the core names no transport machinery (the
//! `.ci/core-is-neutral` check).

use super::io::{IoError, SubmitError, SubmitErrorKind};
use crate::nvme::spec::identify::IdentifyError;
use crate::nvme::spec::status::NvmeStatus;

/// Errors of the control path (bring-up, admin commands, queue creation,
/// blocking I/O). The asynchronous I/O path reports through
/// [`SubmitError`] and [`IoError`] instead.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// DMA memory could not be allocated or mapped.
    #[error("DMA memory: {0}")]
    Dma(#[from] mcqio_vfio::DmaError),
    /// The controller did not reach a state in time.
    #[error("controller did not {what} within {timeout_ms} ms; check that the device is not held by another driver, then reset it (echo 1 > /sys/bus/pci/devices/<bdf>/reset)")]
    Timeout {
        /// What we were waiting for.
        what: &'static str,
        /// The bound we used.
        timeout_ms: u64,
    },
    /// The controller reports a fatal internal error (NVMe: CSTS.CFS; UFS:
    /// a fatal error bit in IS).
    #[error("the controller reports a fatal error; it must be reset before it can be used again")]
    ControllerFatal,
    /// Register reads return all ones: the device was removed or its BAR is unreachable.
    #[error("the device does not respond (registers read all ones): it was removed or its BAR is no longer reachable")]
    DeviceGone,
    /// NVMe: after a reset, a different device (or a changed namespace)
    /// answered. (UFS reports this as
    /// [`UfsCtrlError::DeviceChanged`](crate::UfsCtrlError::DeviceChanged).)
    #[error("the controller changed across a reset: {0}; re-open it with Controller::new")]
    DeviceChanged(String),
    /// A queue pair could not re-create its queues after a controller reset.
    #[error("queue {qid} could not be re-created after a controller reset; drop this queue pair and create a new one")]
    QueueLost {
        /// The queue id.
        qid: u16,
    },
    /// NVMe: an admin command completed with an error status.
    #[error("{command} failed: {status}")]
    Command {
        /// Which command.
        command: &'static str,
        /// What the controller said.
        status: NvmeStatus,
    },
    /// NVMe: the controller reported a register or data value mcqio cannot use
    /// safely (a doorbell outside BAR0, a namespace whose size overflows, a
    /// namespace list without end, ...).
    #[error("the controller reported an unusable {what}: {detail}")]
    BadDevice {
        /// Which value.
        what: &'static str,
        /// The value and why it cannot be used.
        detail: String,
    },
    /// NVMe: [`Controller::admin_read`](crate::Controller::admin_read)
    /// cannot describe this command's data transfer with the PRPs it
    /// builds; use the `unsafe` [`Controller::admin`](crate::Controller::admin)
    /// with a buffer of your own.
    #[error("admin_read cannot run opcode {opcode:#04x}: {reason}")]
    AdminRead {
        /// The command's opcode.
        opcode: u8,
        /// Why.
        reason: String,
    },
    /// NVMe: the identify data is unusable.
    #[error(transparent)]
    Identify(#[from] IdentifyError),
    /// More queue pairs (threads) were requested than the controller granted.
    #[error("{requested} queue pairs requested but the controller granted only {granted} I/O queues; use at most {granted} threads (queues are never shared silently)")]
    NotEnoughQueues {
        /// Queue pairs asked for.
        requested: usize,
        /// I/O queue pairs the controller granted (NVMe: Set Features
        /// Number of Queues; UFS: the MCQ hardware queues, or 1 legacy list).
        granted: usize,
    },
    /// Every granted queue is in use by a live queue pair.
    #[error("all {granted} I/O queue pairs the controller granted are in use; drop a queue pair before creating another")]
    NoFreeQueue {
        /// I/O queue pairs granted.
        granted: usize,
    },
    /// An option is out of range.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// A blocking call found other commands in flight on the queue pair.
    #[error("blocking I/O needs an idle queue pair but {outstanding} commands are in flight; poll them to completion first")]
    QueueBusy {
        /// Commands in flight.
        outstanding: usize,
    },
    /// A blocking call's command was rejected before submission.
    #[error("request rejected: {0}")]
    Submit(SubmitErrorKind),
    /// A blocking call's command completed with an error.
    #[error("I/O failed: {0}")]
    Io(#[from] IoError),
    /// Unmapping an application buffer failed
    /// ([`MappedQueuePair`](super::mapped::MappedQueuePair)): the
    /// buffer is leaked (its completion comes without it) so the device
    /// cannot reach memory that is reused.
    #[error("DMA unmap failed, buffer leaked: {0}")]
    Mapping(#[source] mcqio_vfio::MapError),
    /// A wire's own failure that no variant above names: a connection to a
    /// network-attached controller (NVMe/TCP) closed, timed out, was
    /// terminated by the peer or carried a malformed or hostile unit.
    /// The wire's typed error is inside; downcast it to inspect it
    /// (NVMe/TCP: `mcqio::nvme::tcp::TcpError`). Boxed so the core names
    /// no wire's type.
    #[error("transport: {0}")]
    Transport(Box<dyn std::error::Error + Send + Sync + 'static>),
    /// A worker thread of [`run_per_core`](super::per_core::run_per_core) panicked.
    #[error("worker thread {0} panicked")]
    WorkerPanicked(usize),
}

impl<T> From<SubmitError<T>> for Error {
    fn from(e: SubmitError<T>) -> Self {
        Error::Submit(e.kind)
    }
}

/// Result of control-path operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
