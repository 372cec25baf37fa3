//! Timeouts, NVMe over TCP's side of the shared scan: Abort on the admin
//! queue; a reset reconnects the association (after the scan).

use super::TcpQueuePair;
use crate::core::io::IoBuf;
use crate::core::qpair::Lifecycle;
use crate::core::timeout;
use crate::core::timeout::{Expired, TimeoutActions, Timeouts};
use crate::core::tracker::Trackers;
use crate::nvme::spec::sqe::Abort;
use crate::nvme::spec::sqe::Command;

impl<B: IoBuf> TcpQueuePair<B> {
    /// Act on commands past their timeout (see `TimeoutPolicy`); a
    /// reconnect it asks for is seen by the poll that called it. Cold.
    pub(super) fn scan_expired(&mut self) {
        self.eng.timeouts.begin_scan();
        let mut scan = TcpTimeouts {
            qp: self,
            reset: false,
        };
        timeout::scan(&mut scan);
        if scan.reset && self.state() == self.eng.seen_state {
            // The reset is a reconnect of the association; this poll sees
            // the new state word and recovers (AbortedByReset, re-Connect).
            self.eng.timeouts.stats.resets_requested += 1;
            if let Err(e) = self.ctrl.reset_if(self.eng.seen_state) {
                log::error!(
                    "nvme-tcp queue {}: reconnect after a timeout failed: {e}",
                    self.qid
                );
            }
        }
    }
}

/// NVMe/TCP's side of the shared timeout scan: Abort on the admin queue;
/// a reset reconnects the association (after the scan).
struct TcpTimeouts<'a, B: IoBuf> {
    qp: &'a mut TcpQueuePair<B>,
    reset: bool,
}

impl<B: IoBuf> TimeoutActions for TcpTimeouts<'_, B> {
    type Buf = B;

    fn state(&mut self) -> (&mut Timeouts, &mut Trackers<B>) {
        (&mut self.qp.eng.timeouts, &mut self.qp.eng.trackers)
    }

    fn queue_id(&self) -> u16 {
        self.qp.qid
    }

    fn abort(&mut self, e: &Expired) -> bool {
        match self
            .qp
            .ctrl
            .admin_cmd(Abort::new(self.qp.qid, e.cid).sqe(), "Abort")
        {
            // Dword 0 bit 0 clear: the controller aborted it.
            Ok(c) => c.dw0 & 1 == 0,
            Err(err) => {
                log::warn!(
                    "nvme-tcp queue {}: Abort of cid {:#06x} failed: {err}",
                    self.qp.qid,
                    e.cid
                );
                false
            }
        }
    }

    fn reset(&mut self, _: &Expired) -> bool {
        self.reset = true;
        true
    }

    fn stop(&self) -> bool {
        false
    }
}
