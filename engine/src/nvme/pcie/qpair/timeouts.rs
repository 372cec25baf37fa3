//! Timeouts and health, NVMe over PCIe's side: the actions of the shared
//! timeout scan (Abort on the admin queue, a controller reset), and the
//! lower-level hooks `check_health`, `check_timeouts`, `abort_command`.

use super::wire::stopped_error;
use super::QueuePair;
use crate::core::error::Result;
use crate::core::io::IoBuf;
use crate::core::timeout;
use crate::core::timeout::{Expired, Outstanding, TimeoutActions, Timeouts};
use crate::core::tracker::Trackers;
use crate::nvme::spec::sqe::Abort;
use crate::nvme::spec::sqe::Command;
use std::time::Duration;

impl<B: IoBuf> QueuePair<B> {
    /// Act on commands past their timeout (see [`TimeoutPolicy`]); a
    /// reset it asks for is seen by the poll that called it. Cold.
    #[cold]
    #[inline(never)]
    pub(super) fn scan_expired(&mut self) {
        self.eng.timeouts.begin_scan();
        // A command whose completion is already posted in the CQ (not yet
        // consumed: a slow consumer, or `poll` with a small `max`) was
        // answered in time: it is not a timeout. Mark those slots first.
        let (timeouts, trackers) = (&mut self.eng.timeouts, &self.eng.trackers);
        self.cq.posted_cids(|cid| {
            if let Some(slot) = trackers.lookup(cid) {
                timeouts.mark_posted(slot);
            }
        });
        let mut scan = NvmeTimeouts {
            qp: self,
            reset: false,
        };
        timeout::scan(&mut scan);
        let reset = scan.reset;
        if reset && self.ctrl.state() == self.eng.seen_state {
            self.eng.timeouts.stats.resets_requested += 1;
            if let Err(e) = self.ctrl.reset_if(self.eng.seen_state) {
                log::error!(
                    "queue {}: controller reset after a timeout failed: {e}",
                    self.qid
                );
            }
        }
    }

    /// Read CSTS; if the controller is fatal or gone, record that at the
    /// controller (a fatal controller is disabled so no DMA stays in
    /// flight) and return the error. The next [`poll`](Self::poll)
    /// completes the outstanding commands with [`IoError::ControllerFailed`](crate::core::io::IoError::ControllerFailed).
    pub fn check_health(&mut self) -> Result<()> {
        if let Some(e) = self.eng.stopped {
            return Err(stopped_error(e, self.qid));
        }
        match self.ctrl.health() {
            Ok(()) => Ok(()),
            Err(e) => {
                self.ctrl.note_failure(self.eng.seen_state, &e);
                Err(e)
            }
        }
    }

    /// Report every command outstanding for longer than `timeout`.
    ///
    /// Reporting only, independent of [`QpairOptions::io_timeout`](crate::nvme::pcie::qpair::QpairOptions::io_timeout) (which
    /// acts by itself inside [`poll`](Self::poll)). Ages use the queue's
    /// coarse clock, refreshed here.
    pub fn check_timeouts(&mut self, timeout: Duration, f: impl FnMut(Outstanding)) -> usize {
        self.eng
            .timeouts
            .report_overdue(&self.eng.trackers, timeout, |_| true, |_, cid| cid, f)
    }

    /// Ask the controller to abort the command with `cid` (from
    /// [`check_timeouts`](Self::check_timeouts)). Returns `true` if the
    /// controller reports it aborted the command, which then completes
    /// through [`poll`](Self::poll) with "abort requested"; `false` if it
    /// could not (the command may still complete normally, or never).
    /// Goes through the admin queue: never on the I/O path.
    pub fn abort_command(&self, cid: u16) -> Result<bool> {
        let cqe = self
            .ctrl
            .admin_cmd(Abort::new(self.qid, cid).sqe(), "Abort")?;
        // Dword 0 bit 0 clear: the command was aborted.
        Ok(cqe.dw0 & 1 == 0)
    }
}

/// NVMe's side of the shared timeout scan: log, send an Abort admin
/// command, and note that the controller must be reset (once, after the
/// scan).
pub(super) struct NvmeTimeouts<'a, B: IoBuf> {
    qp: &'a mut QueuePair<B>,
    reset: bool,
}

impl<B: IoBuf> TimeoutActions for NvmeTimeouts<'_, B> {
    type Buf = B;

    fn state(&mut self) -> (&mut Timeouts, &mut Trackers<B>) {
        (&mut self.qp.eng.timeouts, &mut self.qp.eng.trackers)
    }

    fn queue_id(&self) -> u16 {
        self.qp.qid
    }

    fn abort(&mut self, e: &Expired) -> bool {
        let qid = self.qp.qid;
        let r = self
            .qp
            .ctrl
            .admin_cmd(Abort::new(qid, e.cid).sqe(), "Abort");
        // Dword 0 bit 0 clear: the controller aborted it.
        match r {
            Ok(c) => c.dw0 & 1 == 0,
            Err(err) => {
                log::warn!("queue {qid}: Abort of cid {:#06x} failed: {err}", e.cid);
                false
            }
        }
    }

    fn reset(&mut self, _: &Expired) -> bool {
        self.reset = true;
        false
    }

    fn stop(&self) -> bool {
        self.qp.ctrl.state() != self.qp.eng.seen_state
    }
}
