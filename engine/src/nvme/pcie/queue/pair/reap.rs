//! Completion: [`QueuePair::poll`], CQE to tracker (CID = slot |
//! generation), stale CQEs dropped and counted.

use super::*;

impl<B: IoBuf> QueuePair<B> {
    /// Ring pending submissions, then deliver up to `max` completions (and at
    /// most the queue's `max_completions_per_poll`) to `f`, then write the CQ
    /// head doorbell once. Returns how many completions were delivered.
    ///
    /// Also where recovery happens (cold paths, off the per-I/O path): a
    /// controller reset since the last poll completes every outstanding
    /// command ([`IoError::AbortedByReset`]) and re-creates the queues; the
    /// timeout scan runs when due ([`QpairOptions::io_timeout`]).
    ///
    /// `max` is honoured on every path, recovery included: `poll(0)`
    /// delivers nothing (it rings pending submissions), and the completions
    /// a reset or failure produces are spread over as many polls as `max`
    /// requires (the queue is re-created once they are all delivered).
    ///
    /// `Err` means the controller failed ([`Error::ControllerFatal`]) or
    /// disappeared ([`Error::DeviceGone`]) — checked from time to time while
    /// commands are outstanding and nothing completes — or this queue could
    /// not be re-created after a reset ([`Error::QueueLost`]). Every
    /// outstanding command has then been completed (with
    /// [`IoError::ControllerFailed`]), and later calls fail the same way
    /// until a successful [`Controller::reset`].
    #[inline]
    pub fn poll<F: FnMut(Completion<B>)>(&mut self, max: usize, mut f: F) -> Result<usize> {
        let max = max.min(self.max_per_poll);
        if self.ctrl.state() != self.seen_state {
            return self.on_state_change(&mut f, true, max);
        }
        if let Some(e) = self.failed {
            return Err(failed_error(e, self.qid));
        }
        self.sq.flush();
        let mut delivered = 0;
        let mut seen = 0;
        while seen < max {
            let Some(cqe) = self.cq.peek() else { break };
            self.cq.advance();
            self.cq.prefetch_next();
            seen += 1;
            self.sq.head = cqe.sq_head;
            if let Some(c) = self.take_cqe(&cqe) {
                // Counted before the callback runs: it may panic.
                self.completed += 1;
                f(c);
                delivered += 1;
            }
        }
        self.cq.flush_lazy(self.cq_head_batch);
        if seen != 0 {
            self.idle_polls = 0;
            self.timeouts.tick();
        } else if self.trackers.outstanding() > 0 {
            self.idle_polls += 1;
            if self.idle_polls % IDLE_CLOCK_INTERVAL == 0 {
                self.timeouts.tick();
            }
            if self.idle_polls % HEALTH_CHECK_INTERVAL == 0 {
                if let Err(e) = self.check_health() {
                    let _ = self.on_state_change(&mut f, true, max - delivered);
                    return Err(e);
                }
            }
        }
        // Nothing outstanding and nothing seen: nothing can time out, and the
        // next command on this idle queue reads the clock itself.
        if self.timeouts.scan_due() {
            delivered += self.scan_timeouts(&mut f, max - delivered)?;
        }
        Ok(delivered)
    }

    /// Match a CQE to its command: the completion to deliver, or `None` (and
    /// counted) for a CQE that matches nothing in flight.
    #[inline(always)]
    pub(super) fn take_cqe(&mut self, cqe: &Cqe) -> Option<Completion<B>> {
        match self.trackers.lookup(cqe.cid) {
            Some(slot) if cqe.sq_id == self.qid => {
                let (tag, buf) = self.trackers.complete(slot);
                // After `complete`: the slot keeps its timeout state until
                // it is armed again, and the hot path keeps `complete`
                // right after `lookup` (one bounds check).
                let result = if NvmeStatus::raw_is_success(cqe.status) {
                    Ok(())
                } else {
                    Err(self.error_of(slot, cqe))
                };
                deliver::route(&mut self.splits, slot, tag, buf, result, cqe.dw0)
            }
            _ => {
                self.stale(cqe);
                None
            }
        }
    }

    /// Count and log a CQE that matches no command in flight.
    #[cold]
    #[inline(never)]
    pub(super) fn stale(&mut self, cqe: &Cqe) {
        self.trackers.stale += 1;
        log::warn!(
            "queue {}: dropped stale/duplicate completion (cid {:#06x}, sq {}, status {:#06x})",
            self.qid,
            cqe.cid,
            cqe.sq_id,
            cqe.status
        );
    }

    /// The error of a failed completion (of the command just completed in
    /// `slot`): a command we aborted because it timed out reports
    /// [`IoError::TimedOut`].
    #[cold]
    pub(super) fn error_of(&mut self, slot: u16, cqe: &Cqe) -> IoError {
        let st = cqe.nvme_status();
        if st == ABORT_REQUESTED && self.timeouts.was_aborted(&self.trackers, slot) {
            IoError::TimedOut
        } else {
            IoError::Nvme(st)
        }
    }
}
