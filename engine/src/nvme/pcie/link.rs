//! [`PcieLink`] as the NVMe layer's [`Link`]: health from CSTS, admin
//! commands on the rings, reset by disabling, the queue pairs it creates.

use std::sync::Arc;

use crate::core::error::{Error, Result};
use crate::nvme::host::regs::read_csts;
use crate::nvme::host::{Link, QpairOptions};
use crate::nvme::pcie::controller::{failure_error, Controller, ControllerOptions, PcieLink};
use crate::nvme::pcie::qpair::QueuePair;
use crate::nvme::spec::{Cqe, Sqe};

impl Link for PcieLink {
    type Options = ControllerOptions;
    type Qpair = QueuePair;
    const NAME: &'static str = "Controller";

    /// Read CSTS: `Err` if the controller is fatal or gone (or was found
    /// so earlier and has not been reset since).
    fn health(c: &Controller) -> Result<()> {
        if let Some(e) = failure_error(c.state()) {
            return Err(e);
        }
        if read_csts(&mut c.link.regs())?.cfs() {
            return Err(Error::ControllerFatal);
        }
        Ok(())
    }

    /// Its data and metadata pointers are cleared.
    fn admin_cmd(c: &Controller, mut sqe: Sqe, what: &'static str) -> Result<Cqe> {
        sqe.mptr = 0;
        let mut a = c.lock_admin();
        c.admin_locked(&mut a, sqe.with_prp(0, 0), what)
    }

    /// Disable (CC.EN = 0, wait for CSTS.RDY = 0, bounded by CAP.TO),
    /// which ends every command and I/O queue on the device, then bring it
    /// up again on the same admin queue memory (see the module docs).
    /// Asynchronous Event Requests are re-posted. Fails with
    /// [`Error::DeviceGone`] for a removed device, [`Error::Timeout`] if the
    /// controller does not become disabled or ready within CAP.TO, and
    /// [`Error::DeviceChanged`] if a different device answers.
    fn reset(c: &Controller) -> Result<()> {
        let mut a = c.lock_admin();
        let r = c.reset_locked(&mut a);
        c.wake_waiters();
        r
    }

    fn reset_if(c: &Controller, seen: u64) -> Result<()> {
        let mut a = c.lock_admin();
        if c.state() != seen {
            return Ok(());
        }
        let r = c.reset_locked(&mut a);
        c.wake_waiters();
        r
    }

    /// Taken under the admin lock, which a reset holds throughout.
    fn settled_state(c: &Controller) -> u64 {
        let _a = c.lock_admin();
        c.state()
    }

    fn create_qpair(c: &Arc<Controller>, opts: &QpairOptions) -> Result<QueuePair> {
        c.create_qpair(opts.clone())
    }

    fn describe(&self, d: &mut std::fmt::DebugStruct<'_, '_>) {
        d.field("backend", &self.backend.name());
    }
}
