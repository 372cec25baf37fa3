//! NVMe's side of application buffers mapped per I/O
//! ([`crate::core::mapped`]): the queue pair a mapped queue pair wraps by
//! default, how [`Controller::create_mapped_qpair`] builds one, and the
//! NVMe-only accessors.

use std::sync::Arc;

use mcqio_vfio::Mapped;

use super::host::QpairOptions;
use super::pcie::controller::Controller;
use super::pcie::qpair::{QpairStats, QueuePair};
use crate::core::error::Result;
use crate::core::mapped::MappingMode;

/// A queue pair for application buffers mapped per I/O, over any
/// transport's queue pair `Q` — NVMe's [`QueuePair`] unless named
/// otherwise (UFS: `MappedQueuePair<UfsQueuePair<Mapped>>`). The type is
/// [`core::mapped::MappedQueuePair`](crate::core::mapped::MappedQueuePair);
/// this name only gives it NVMe as the default.
pub type MappedQueuePair<Q = QueuePair<Mapped>> = crate::core::mapped::MappedQueuePair<Q>;

impl MappedQueuePair<QueuePair<Mapped>> {
    /// An NVMe queue pair of [`Mapped`] buffers (premapped itself: the
    /// mapper sits above it) wrapped for `opts.mapping` (strict or lazy).
    pub(crate) fn create(ctrl: &Arc<Controller>, opts: &QpairOptions) -> Result<Self> {
        Self::check_mode(&opts.mapping)?;
        let qp = QueuePair::<Mapped>::create(
            ctrl,
            &QpairOptions {
                mapping: MappingMode::Premapped,
                ..opts.clone()
            },
        )?;
        Self::new(qp, ctrl.dma(), ctrl.max_transfer(), &opts.mapping)
    }

    /// The underlying queue's id.
    pub fn qid(&self) -> u16 {
        self.queue_pair().map_or(0, |q| q.qid())
    }

    /// The queue pair's counters.
    pub fn stats(&self) -> QpairStats {
        self.queue_pair().map(|q| q.stats()).unwrap_or_default()
    }
}

// One per thread, like `QueuePair`.
const _: () = {
    const fn send<T: Send>() {}
    send::<MappedQueuePair>();
};

impl Controller {
    /// Create a queue pair for application buffers
    /// ([`AppBuffer`](mcqio_vfio::AppBuffer)) mapped per I/O in the strict
    /// or lazy mode `opts.mapping` names; see [`crate::core::mapped`].
    pub fn create_mapped_qpair(self: &Arc<Self>, opts: QpairOptions) -> Result<MappedQueuePair> {
        MappedQueuePair::create(self, &opts)
    }
}
