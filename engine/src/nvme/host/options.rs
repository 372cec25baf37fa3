//! [`QpairOptions`]: one set of queue-pair options for every NVMe wire.

use std::time::Duration;

use crate::core::qpair::WaitPolicy;
use crate::core::timeout::TimeoutPolicy;

/// Options for an NVMe queue pair, on every wire
/// ([`Controller::create_qpair`](crate::nvme::Controller::create_qpair)(crate::nvme::Controller::create_qpair),
/// [`TcpController::create_qpair`](crate::nvme::tcp::TcpController::create_qpair)).
/// Where a wire has no use for one (a socket has no rings, no MSI-X and
/// no IOVAs) it says so on the field.
#[derive(Clone, Debug)]
pub struct QpairOptions {
    /// Commands that may be outstanding at once (1..=4096).
    pub depth: u16,
    /// Entries of the I/O SQ and CQ (`spdk_nvme_perf -i`'s io-queue-size);
    /// 0 (the default): twice `depth` plus the CQ head batch where CAP.MQES
    /// allows, else `depth` plus the batch. The CQ head doorbell is written
    /// once 32 consumed entries have piled up (at any depth: a polled CQ's
    /// head is only flow control, so the controller needs it no sooner),
    /// or once `entries - depth` have if that is smaller, so fewer than
    /// that many consumed entries are ever unreleased; with at most `depth`
    /// commands outstanding the controller then never finds the CQ full (a
    /// full CQ would make it hold commands back). With at least twice
    /// `depth` plus the batch, the head a poll consumed is written at the
    /// next submit or poll, after the SQ tail doorbell of the commands the
    /// application queued meanwhile (so a resubmission reaches the
    /// controller one doorbell store sooner); with fewer, at the end of the
    /// poll. Must be `depth + 1 ..= CAP.MQES + 1`; `depth + 1` writes the
    /// head on every poll that consumed something.
    pub queue_entries: u16,
    /// Most completions one [`QueuePair::poll`](crate::nvme::QueuePair::poll) delivers (0: `depth`).
    pub max_completions_per_poll: usize,
    /// How long blocking calls wait for their completion before returning
    /// [`IoError::TimedOut`](crate::core::io::IoError::TimedOut).
    pub blocking_timeout: Duration,
    /// Per-command timeout for this queue's I/O (`None`: never time out).
    /// Detected while polling — no timer thread: [`QueuePair::poll`](crate::nvme::QueuePair::poll) scans
    /// the outstanding commands once the queue's coarse clock (read once per
    /// poll that completes something, every 64 empty polls while commands
    /// are outstanding, and when a command arrives on an idle queue) has
    /// moved a quarter of the timeout since the last scan, so a command is
    /// acted on about 1 to 1.25 timeouts after submission, as measured on
    /// that clock (and only while the queue is polled). A command is stamped
    /// with the clock's last reading: on a busy queue that is the last poll,
    /// so leave a busy queue unpolled for no longer than the timeout. A
    /// command whose completion is already posted in the CQ (a slow
    /// callback, a small `max`) is never taken for timed out. The admin
    /// queue has its own [`crate::ControllerOptions::admin_timeout`].
    pub io_timeout: Option<Duration>,
    /// What a timeout does; see [`TimeoutPolicy`].
    pub timeout_policy: TimeoutPolicy,
    /// How buffers get their device addresses: premapped [`DmaBuf`](crate::DmaBuf)s
    /// ([`Controller::create_qpair`](crate::nvme::Controller::create_qpair), the default) or application buffers
    /// mapped per I/O in strict or lazy mode
    /// ([`Controller::create_mapped_qpair`](crate::nvme::Controller::create_mapped_qpair)); see [`crate::core::mapped`].
    pub mapping: crate::core::mapped::MappingMode,
    /// How [`QueuePair::wait`](crate::nvme::QueuePair::wait) waits: spinning ([`WaitPolicy::Poll`], the
    /// default: the CQ is created without interrupts), or sleeping on the
    /// queue's own MSI-X vector (`Interrupt`, `Hybrid`: the CQ is created
    /// with IEN and IV). Creating the queue pair fails with
    /// [`Error::InvalidOption`](crate::core::error::Error::InvalidOption) where the device has no MSI-X or MSI.
    pub wait: WaitPolicy,
}

impl Default for QpairOptions {
    fn default() -> Self {
        QpairOptions {
            depth: 256,
            queue_entries: 0,
            max_completions_per_poll: 0,
            blocking_timeout: Duration::from_secs(30),
            io_timeout: Some(Duration::from_secs(30)),
            timeout_policy: TimeoutPolicy::Abort,
            mapping: crate::core::mapped::MappingMode::Premapped,
            wait: WaitPolicy::Poll,
        }
    }
}
