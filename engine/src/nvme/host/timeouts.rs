//! Timeouts, NVMe's side of the shared scan (`core::timeout`), on every
//! NVMe wire: a command past its time is aborted through the admin queue
//! (Abort names its queue and CID); what that does not settle — an Abort
//! refused, failed or not answered, or the `Reset` policy — resets the
//! controller once, after the scan (over PCIe a disable and bring-up, over
//! a fabric a reconnect), which ends every command of the epoch.

use crate::core::io::IoBuf;
use crate::core::qpair::Engine;
use crate::core::timeout::{self, Expired, TimeoutActions, Timeouts};
use crate::core::tracker::Trackers;
use crate::nvme::host::{Link, NvmeController};
use crate::nvme::spec::sqe::{Abort, Command};

/// Ask the controller to abort command `cid` of queue `qid`: whether it
/// reports it aborted it (completion dword 0 bit 0 clear), so that the
/// command's own completion, "abort requested", is due.
pub(in crate::nvme) fn abort<L: Link>(
    ctrl: &NvmeController<L>,
    qid: u16,
    cid: u16,
) -> crate::core::error::Result<bool> {
    let cqe = ctrl.admin_cmd(Abort::new(qid, cid).sqe(), "Abort")?;
    Ok(cqe.dw0 & 1 == 0)
}

/// Run one timeout scan of queue `qid` (the caller began it with
/// `Timeouts::begin_scan` and marked the slots whose completion is
/// already posted), then the controller reset it asked for, unless the
/// state moved on meanwhile; the poll that called it sees the reset.
pub(in crate::nvme) fn scan<B: IoBuf, S, L: Link>(
    eng: &mut Engine<B, S>,
    ctrl: &NvmeController<L>,
    qid: u16,
) {
    let seen = eng.seen_state;
    let mut scan = Scan {
        timeouts: &mut eng.timeouts,
        trackers: &mut eng.trackers,
        ctrl,
        qid,
        seen,
        reset: false,
    };
    timeout::scan(&mut scan);
    if scan.reset && ctrl.state() == seen {
        eng.timeouts.stats.resets_requested += 1;
        if let Err(e) = ctrl.reset_if(seen) {
            log::error!("queue {qid}: controller reset after a timeout failed: {e}");
        }
    }
}

/// The scan's actions on one NVMe queue.
struct Scan<'a, B, L: Link> {
    timeouts: &'a mut Timeouts,
    trackers: &'a mut Trackers<B>,
    ctrl: &'a NvmeController<L>,
    qid: u16,
    seen: u64,
    /// A command asked for a reset (made once, after the scan).
    reset: bool,
}

impl<B, L: Link> TimeoutActions for Scan<'_, B, L> {
    type Buf = B;

    fn state(&mut self) -> (&mut Timeouts, &mut Trackers<B>) {
        (self.timeouts, self.trackers)
    }

    fn queue_id(&self) -> u16 {
        self.qid
    }

    fn abort(&mut self, e: &Expired) -> bool {
        match abort(self.ctrl, self.qid, e.cid) {
            Ok(aborted) => aborted,
            Err(err) => {
                log::warn!(
                    "queue {}: Abort of cid {:#06x} failed: {err}",
                    self.qid,
                    e.cid
                );
                false
            }
        }
    }

    fn reset(&mut self, _: &Expired) -> bool {
        self.reset = true;
        false
    }

    fn stop(&self) -> bool {
        self.ctrl.state() != self.seen
    }
}
