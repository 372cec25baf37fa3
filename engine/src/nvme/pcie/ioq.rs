//! I/O queues on the controller: the Create and Delete I/O SQ/CQ admin
//! commands that hand a queue pair's rings to the controller and take them
//! back.

use crate::core::error::{Error, Result};
use crate::nvme::pcie::controller::{failure_error, state, Controller};
use crate::nvme::spec::sqe::{Command, CreateIoCq, CreateIoSq, DeleteIoCq, DeleteIoSq};

impl Controller {
    /// Create I/O CQ then SQ `qid` on rings at the given IOVAs, the CQ
    /// interrupting on MSI-X `vector` (IEN and IV) if one is given; returns
    /// the state word they belong to (the queues die with its epoch).
    ///
    /// On failure, also says whether a queue may have been left on the
    /// controller (a Create that timed out without a reset may have taken
    /// effect; a Delete I/O CQ after a failed Create SQ may fail): then the
    /// rings must not be freed and the queue id not reused.
    pub(crate) fn create_io_queues(
        &self,
        qid: u16,
        entries: u16,
        cq_iova: u64,
        sq_iova: u64,
        vector: Option<u16>,
    ) -> std::result::Result<u64, (Error, bool)> {
        let mut a = self.lock_admin();
        let s = self.state();
        if let Some(e) = failure_error(s) {
            return Err((e, false));
        }
        // Nothing of this epoch's queues survives a disable (new epoch).
        let left_behind = |e: &Error| {
            state::epoch(self.state()) == state::epoch(s) && !matches!(e, Error::Command { .. })
        };
        // A (re-)created queue starts at index 0 in the shadow slots too.
        let _ = self.shadow_slots(qid);
        let cq = match vector {
            Some(v) => CreateIoCq::new(qid, entries).interrupt(v),
            None => CreateIoCq::new(qid, entries),
        };
        if let Err(e) = self.admin_locked(
            &mut a,
            cq.sqe().with_prp(cq_iova, 0),
            "Create I/O Completion Queue",
        ) {
            let left = left_behind(&e);
            return Err((e, left));
        }
        if let Err(e) = self.admin_locked(
            &mut a,
            CreateIoSq::new(qid, entries, qid)
                .sqe()
                .with_prp(sq_iova, 0),
            "Create I/O Submission Queue",
        ) {
            if left_behind(&e) {
                // The SQ may exist (and then the CQ cannot be deleted).
                return Err((e, true));
            }
            let mut left = false;
            if self.state() == s {
                if let Err(d) =
                    self.admin_locked(&mut a, DeleteIoCq(qid).sqe(), "Delete I/O Completion Queue")
                {
                    left = state::epoch(self.state()) == state::epoch(s);
                    log::error!(
                        "queue {qid}: deleting the CQ after a failed Create I/O SQ failed: {d}"
                    );
                }
            }
            return Err((e, left));
        }
        Ok(s)
    }

    pub(crate) fn delete_sq(&self, qid: u16) -> Result<()> {
        self.admin_cmd(DeleteIoSq(qid).sqe(), "Delete I/O Submission Queue")
            .map(drop)
    }

    pub(crate) fn delete_cq(&self, qid: u16) -> Result<()> {
        self.admin_cmd(DeleteIoCq(qid).sqe(), "Delete I/O Completion Queue")
            .map(drop)
    }
}
