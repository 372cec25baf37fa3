//! [`TcpLink`] as the NVMe layer's [`Link`]: health from the
//! association's recorded failure, admin commands on its connection,
//! reset by reconnecting, the queue pairs it creates.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::core::error::Result;
use crate::nvme::host::{Link, QpairOptions};
use crate::nvme::spec::{Cqe, Sqe};
use crate::nvme::tcp::controller::{TcpController, TcpLink, TcpOptions};
use crate::nvme::tcp::qpair::TcpQueuePair;

impl Link for TcpLink {
    type Options = TcpOptions;
    type Qpair = TcpQueuePair;
    const NAME: &'static str = "TcpController";

    /// `Err` once the association failed.
    fn health(c: &TcpController) -> Result<()> {
        match c.failure() {
            Some(e) => Err(e.into_error()),
            None => Ok(()),
        }
    }

    fn admin_cmd(c: &TcpController, sqe: Sqe, what: &'static str) -> Result<Cqe> {
        c.admin_exec(sqe, None, what)
    }

    /// Reset by reconnecting: close the association's admin connection
    /// (the target then drops the association and every I/O connection of
    /// it) and bring a new association up on a new connection; the queue
    /// pairs Connect their queues again, same queue ids, under the new
    /// controller id. Also brings back an association that failed (a
    /// closed admin connection, KATO expired). Fails with
    /// [`Error::DeviceChanged`](crate::Error::DeviceChanged) if the target now shows another subsystem,
    /// other namespaces or grants fewer queues, or with the bring-up's
    /// error; the association is then failed.
    fn reset(c: &TcpController) -> Result<()> {
        let mut a = c.lock_admin();
        c.reset_locked(&mut a)
    }

    fn reset_if(c: &TcpController, seen: u64) -> Result<()> {
        let mut a = c.lock_admin();
        if c.state.load() != seen {
            return Ok(());
        }
        c.reset_locked(&mut a)
    }

    /// Taken under the admin lock, which a reset holds throughout.
    fn settled_state(c: &TcpController) -> u64 {
        let _a = c.lock_admin();
        c.state.load_acquire()
    }

    fn create_qpair(c: &Arc<TcpController>, opts: &QpairOptions) -> Result<TcpQueuePair> {
        c.create_qpair(opts.clone())
    }

    fn describe(&self, d: &mut std::fmt::DebugStruct<'_, '_>) {
        d.field("addr", &self.addr)
            .field("subnqn", &self.fabrics.subnqn)
            .field("cntlid", &self.cntlid.load(Ordering::Relaxed));
    }
}
