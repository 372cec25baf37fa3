//! Timeouts, NVMe over TCP's side: the scan, whose actions are the NVMe
//! layer's (`host::timeouts`: Abort on the admin queue; a reset — here a
//! reconnect of the association — after the scan).

use super::TcpQueuePair;
use crate::core::io::IoBuf;
use crate::nvme::host::timeouts;

impl<B: IoBuf> TcpQueuePair<B> {
    /// Act on commands past their timeout (see `TimeoutPolicy`); a
    /// reconnect it asks for is seen by the poll that called it (it ends
    /// what was in flight with `AbortedByReset` and Connects again). Cold.
    pub(super) fn scan_expired(&mut self) {
        self.eng.timeouts.begin_scan();
        timeouts::scan(&mut self.eng, &self.ctrl, self.qid);
    }
}
