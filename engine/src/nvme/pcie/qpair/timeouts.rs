//! Timeouts and health, NVMe over PCIe's side: the scan (commands whose
//! completion is already posted in the CQ are not timed out; the actions
//! are the NVMe layer's, `host::timeouts`), and the lower-level hooks
//! `check_health`, `check_timeouts`, `abort_command`.

use super::QueuePair;
use crate::core::error::Result;
use crate::core::io::IoBuf;
use crate::core::timeout::Outstanding;
use crate::nvme::host::nvm::stopped_error;
use crate::nvme::host::timeouts;
use std::time::Duration;

impl<B: IoBuf> QueuePair<B> {
    /// Act on commands past their timeout (see [`TimeoutPolicy`](crate::TimeoutPolicy)); a
    /// reset it asks for is seen by the poll that called it. Cold.
    #[cold]
    #[inline(never)]
    pub(super) fn scan_expired(&mut self) {
        self.eng.timeouts.begin_scan();
        // A command whose completion is already posted in the CQ (not yet
        // consumed: a slow consumer, or `poll` with a small `max`) was
        // answered in time: it is not a timeout. Mark those slots first.
        let (marks, trackers) = (&mut self.eng.timeouts, &self.eng.trackers);
        self.cq.posted_cids(|cid| {
            if let Some(slot) = trackers.lookup(cid) {
                marks.mark_posted(slot);
            }
        });
        timeouts::scan(&mut self.eng, &self.ctrl, self.qid);
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
    /// Reporting only, independent of [`QpairOptions::io_timeout`](crate::nvme::QpairOptions::io_timeout) (which
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
        timeouts::abort(&self.ctrl, self.qid, cid)
    }
}
