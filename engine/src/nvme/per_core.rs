//! NVMe's side of the shared per-core model ([`crate::core::per_core`]):
//! a controller hands out one [`QueuePair`] per thread, at most as many as
//! Set Features (Number of Queues) granted.

use std::sync::Arc;

use super::ctrl::Controller;
use super::pcie::qpair::{QpairOptions, QueuePair};
use crate::core::error::Result;
use crate::core::io::DmaBuf;
use crate::core::per_core::PerCore;

impl PerCore for Arc<Controller> {
    type Qpair = QueuePair<DmaBuf>;
    type Options = QpairOptions;

    fn granted_queues(&self) -> usize {
        self.granted_io_queues()
    }

    fn create_for_core(&self, opts: &QpairOptions) -> Result<QueuePair<DmaBuf>> {
        self.create_qpair(opts.clone())
    }
}
