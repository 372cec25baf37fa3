//! NVMe over PCIe's hooks of the shared lifecycle (`core::qpair::Wire`):
//! the doorbells (`ring`), the CQ (`reap`), the health look (CSTS), and
//! what a controller reset or failure leaves: the CQEs posted before it
//! stopped, the rings' positions, re-creating the queues.

use super::{QueuePair, SplitChild, HEALTH_CHECK_INTERVAL};
use crate::core::error::{Error, Result};
use crate::core::io::{Completion, IoBuf};
use crate::core::qpair::{Reaped, Recreated, Wire};
use crate::core::state::Stopped;
use crate::nvme::host::nvm;
use crate::nvme::pcie::controller::Controller;

impl<B: IoBuf> Wire for QueuePair<B> {
    type Buf = B;
    type Ctrl = Controller;
    type Child = SplitChild;
    const HEALTH_CHECK_INTERVAL: u32 = HEALTH_CHECK_INTERVAL;

    crate::core::qpair::wire_parts!(eng, ctrl);

    fn accesses(&self) -> (u64, u64) {
        // No register load on the I/O path: the CQ is polled by its phase
        // bit in host memory.
        (self.sq.db.mmio_writes + self.cq.db.mmio_writes, 0)
    }

    #[inline(always)]
    fn ring(&mut self) -> bool {
        let rang = self.sq.flush();
        // The head the last poll consumed, after the tail: a command the
        // application resubmitted from it is on its way one doorbell store
        // sooner (the rings have room for the wait: `ring_entries`).
        if self.cq_head_after_sq {
            self.cq.flush_lazy(self.cq_head_batch);
        }
        rang
    }

    #[inline(always)]
    fn reap<F: FnMut(Completion<B>)>(&mut self, max: usize, f: &mut F) -> Reaped {
        self.reap_cqes(max, f)
    }

    #[cold]
    fn check_controller(&mut self) {
        if let Err(e) = self.ctrl.health() {
            self.ctrl.note_failure(self.eng.seen_state, &e);
        }
    }

    #[cold]
    fn scan_timeouts(&mut self, _drained: bool, _f: &mut dyn FnMut(Completion<B>)) {
        self.scan_expired();
    }

    /// The CQEs the controller left in the ring (it can post no more: the
    /// queue is deleted or the controller disabled).
    fn deliver_posted(&mut self, f: &mut dyn FnMut(Completion<B>)) -> usize {
        let mut n = 0;
        let mut f = f;
        for _ in 0..self.sq.entries() {
            let Some(cqe) = self.cq.peek() else { break };
            self.cq.advance();
            if self.take_cqe(cqe, &mut f) {
                n += 1;
            }
        }
        n
    }

    fn forget(&mut self) {
        self.sq.reset();
        self.cq.reset();
    }

    fn recreate(&mut self, _settled: u64) -> Recreated {
        match self.ctrl.create_io_queues(
            self.qid,
            self.sq.entries(),
            self.cq.region().iova().raw(),
            self.sq.region().iova().raw(),
            self.eng.wait.vector,
        ) {
            Ok(s) => Recreated::Yes(s),
            Err((e, left)) => Recreated::Failed {
                error: e.to_string(),
                left,
            },
        }
    }

    fn note_leak(&self, bytes: u64) {
        if bytes != 0 {
            self.ctrl.note_leak(bytes);
        }
    }

    fn queue_id(&self) -> u16 {
        self.qid
    }

    fn stopped_error(&self, s: Stopped) -> Error {
        nvm::stopped_error(s, self.qid)
    }

    fn withdraw_all(&mut self, f: &mut dyn FnMut(Completion<B>)) -> Result<bool> {
        self.delete_queues(f)
    }

    fn closed(&mut self, gone: bool) {
        self.release_queue(gone)
    }
}
