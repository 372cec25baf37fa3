//! UFS's side of the shared per-core model ([`crate::core::per_core`]): a
//! host controller hands out one [`UfsQueuePair`] per thread, one per MCQ
//! hardware queue (or the one legacy request list).

use std::sync::Arc;

use super::ctrl::{UfsController, UfsMode};
use super::qpair::{UfsQpairOptions, UfsQueuePair};
use crate::core::error::Result;
use crate::core::io::DmaBuf;
use crate::core::per_core::PerCore;

impl PerCore for Arc<UfsController> {
    type Qpair = UfsQueuePair<DmaBuf>;
    type Options = UfsQpairOptions;

    /// MCQ: the hardware queues set up at bring-up; legacy: the one list.
    fn granted_queues(&self) -> usize {
        match self.mode() {
            UfsMode::Mcq { queues } => usize::from(queues),
            UfsMode::Legacy => 1,
        }
    }

    fn create_for_core(&self, opts: &UfsQpairOptions) -> Result<UfsQueuePair<DmaBuf>> {
        self.create_qpair_for(opts.clone())
    }
}

// One per thread, like `UfsQueuePair`: a mapped UFS queue pair moves to its
// thread too.
const _: () = {
    const fn send<T: Send>() {}
    send::<crate::core::mapped::MappedQueuePair<UfsQueuePair<mcqio_vfio::Mapped>>>();
};
