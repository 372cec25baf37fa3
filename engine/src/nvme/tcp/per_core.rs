//! One [`TcpQueuePair`] per core ([`crate::core::per_core`]), as on the
//! other wires.

use std::sync::Arc;

use super::controller::TcpController;
use super::qpair::TcpQueuePair;
use crate::core::error::Result;
use crate::core::io::DmaBuf;
use crate::core::per_core::PerCore;
use crate::nvme::pcie::qpair::QpairOptions;

/// One [`TcpQueuePair`] (its own connection) per thread, at most as many
/// as Number of Queues granted ([`crate::core::per_core`]).
impl PerCore for Arc<TcpController> {
    type Qpair = TcpQueuePair<DmaBuf>;
    type Options = QpairOptions;

    fn granted_queues(&self) -> usize {
        self.granted_io_queues()
    }

    fn create_for_core(&self, opts: &QpairOptions) -> Result<TcpQueuePair<DmaBuf>> {
        self.create_qpair(opts.clone())
    }
}
