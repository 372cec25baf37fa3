//! Recovery: what a controller reset or failure does to the queue (the
//! posted completions delivered, the rest ended, the queues re-created),
//! the timeout scan and its actions, health checks.

use super::*;

impl<B: IoBuf> QueuePair<B> {
    /// Deliver up to `budget` CQEs the controller left in the ring (it can
    /// post no more: the queue is deleted or the controller disabled). No
    /// doorbell. Returns how many were delivered and whether the ring is
    /// now empty (`false`: the budget ran out first; call again).
    pub(super) fn deliver_posted<F: FnMut(Completion<B>)>(
        &mut self,
        f: &mut F,
        budget: usize,
    ) -> (usize, bool) {
        let mut n = 0;
        for _ in 0..self.sq.entries() {
            let Some(cqe) = self.cq.peek() else {
                return (n, true);
            };
            if n == budget {
                return (n, false);
            }
            self.cq.advance();
            if let Some(c) = self.take_cqe(&cqe) {
                self.completed += 1;
                n += 1;
                f(c);
            }
        }
        (n, true)
    }

    /// Complete up to `budget` of the commands still outstanding with
    /// `err`; buffers are handed back only if `safe` (the device can no
    /// longer access them), otherwise leaked (and counted at the
    /// controller, [`Controller::leaked_queue_bytes`]).
    pub(super) fn fail_outstanding<F: FnMut(Completion<B>)>(
        &mut self,
        err: IoError,
        safe: bool,
        f: &mut F,
        budget: usize,
    ) -> usize {
        let (ctrl, rstats, completed) = (&self.ctrl, &mut self.rstats, &mut self.completed);
        drain_all(
            &mut self.trackers,
            &mut self.splits,
            budget,
            |tag, buf, first| {
                let buf = if safe {
                    buf
                } else {
                    leak(ctrl, buf);
                    None
                };
                match err {
                    IoError::AbortedByReset => rstats.aborted_by_reset += 1,
                    _ => rstats.failed_by_controller += 1,
                }
                // Counted before the callback runs: it may panic.
                *completed += 1;
                f(Completion {
                    tag,
                    result: Err(first.unwrap_or(err)),
                    buf,
                    dw0: 0,
                });
            },
        )
    }

    /// The controller was reset, failed, or disappeared since this queue
    /// last looked (see the controller's state word). Cold.
    ///
    /// Delivers at most `budget` completions. When that is not enough, it
    /// returns `Ok` with the state left unacknowledged, and the next call
    /// (the next poll) carries on where this one stopped; each step is
    /// recorded before the callback runs, so a panicking callback leaves a
    /// state this resumes from too.
    ///
    /// With `recreate` false (the queue is being closed or dropped) the
    /// queues are not re-created after a reset; `queue_absent` says so.
    #[cold]
    #[inline(never)]
    pub(super) fn on_state_change<F: FnMut(Completion<B>)>(
        &mut self,
        f: &mut F,
        recreate: bool,
        budget: usize,
    ) -> Result<usize> {
        let mut n = 0;
        loop {
            let now = self.ctrl.state();
            if now == self.seen_state {
                return match self.failed {
                    Some(e) => Err(failed_error(e, self.qid)),
                    None => Ok(n),
                };
            }
            if state::epoch(now) == state::epoch(self.seen_state) {
                // Failed, and the controller could not be disabled: the
                // device may still access the rings, the PRP pages and the
                // buffers; leak them.
                self.device_may_access = true;
                let (d, empty) = self.deliver_posted(f, budget - n);
                n += d;
                if !empty {
                    return Ok(n);
                }
                n += self.fail_outstanding(IoError::ControllerFailed, false, f, budget - n);
                if self.trackers.outstanding() > 0 {
                    return Ok(n);
                }
                self.failed = Some(failure_of(now));
                self.seen_state = now;
                continue;
            }
            // New epoch: the controller was disabled (or is gone), so it
            // dropped this queue and accesses none of its memory. Deliver
            // what it completed before, wait for a running reset to finish,
            // and fail or abort the rest.
            let (d, empty) = self.deliver_posted(f, budget - n);
            n += d;
            if !empty {
                return Ok(n);
            }
            let settled = self.ctrl.settled_state();
            let failed = state::failure(settled) != state::OK;
            let err = if failed {
                IoError::ControllerFailed
            } else {
                IoError::AbortedByReset
            };
            n += self.fail_outstanding(err, true, f, budget - n);
            if self.trackers.outstanding() > 0 {
                return Ok(n);
            }
            self.sq.reset();
            self.cq.reset();
            self.device_may_access = false;
            self.seen_state = settled;
            if failed {
                self.failed = Some(failure_of(settled));
                continue;
            }
            if !recreate {
                self.queue_absent = true;
                return Ok(n);
            }
            match self.ctrl.create_io_queues(
                self.qid,
                self.sq.entries(),
                self.cq.region().iova().raw(),
                self.sq.region().iova().raw(),
            ) {
                Ok(s) => {
                    self.seen_state = s;
                    self.failed = None;
                    self.rstats.recoveries += 1;
                    self.idle_polls = 0;
                }
                Err((e, queue_left)) => {
                    if self.ctrl.state() != settled {
                        continue; // reset again meanwhile: retry
                    }
                    // The controller may have the queue on our rings.
                    self.device_may_access |= queue_left;
                    log::error!(
                        "queue {}: re-creating the queue after a reset failed: {e}",
                        self.qid
                    );
                    self.failed = Some(Error0::Lost);
                    return Err(Error::QueueLost { qid: self.qid });
                }
            }
        }
    }

    /// Act on commands past their timeout (see [`TimeoutPolicy`]). Cold.
    #[cold]
    #[inline(never)]
    pub(super) fn scan_timeouts<F: FnMut(Completion<B>)>(
        &mut self,
        f: &mut F,
        budget: usize,
    ) -> Result<usize> {
        self.timeouts.begin_scan();
        // A command whose completion is already posted in the CQ (not yet
        // consumed: a slow consumer, or `poll` with a small `max`) was
        // answered in time: it is not a timeout. Mark those slots first.
        let (timeouts, trackers) = (&mut self.timeouts, &self.trackers);
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
        if reset && self.ctrl.state() == self.seen_state {
            self.timeouts.stats.resets_requested += 1;
            if let Err(e) = self.ctrl.reset_if(self.seen_state) {
                log::error!(
                    "queue {}: controller reset after a timeout failed: {e}",
                    self.qid
                );
            }
        }
        if self.ctrl.state() != self.seen_state {
            return self.on_state_change(f, true, budget);
        }
        Ok(0)
    }

    /// Read CSTS; if the controller is fatal or gone, record that at the
    /// controller (a fatal controller is disabled so no DMA stays in
    /// flight) and return the error. The next [`poll`](Self::poll)
    /// completes the outstanding commands with [`IoError::ControllerFailed`].
    pub fn check_health(&mut self) -> Result<()> {
        if let Some(e) = self.failed {
            return Err(failed_error(e, self.qid));
        }
        match self.ctrl.health() {
            Ok(()) => Ok(()),
            Err(e) => {
                self.ctrl.note_failure(self.seen_state, &e);
                Err(e)
            }
        }
    }

    /// Report every command outstanding for longer than `timeout`.
    ///
    /// Reporting only, independent of [`QpairOptions::io_timeout`] (which
    /// acts by itself inside [`poll`](Self::poll)). Ages use the queue's
    /// coarse clock, refreshed here.
    pub fn check_timeouts(&mut self, timeout: Duration, f: impl FnMut(Outstanding)) -> usize {
        self.timeouts
            .report_overdue(&self.trackers, timeout, |_| true, |_, cid| cid, f)
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
        (&mut self.qp.timeouts, &mut self.qp.trackers)
    }

    fn report(&mut self, e: &Expired) {
        log::warn!(
            "queue {}: command cid {:#06x} tag {} has no completion after {} ms",
            self.qp.qid,
            e.cid,
            e.tag,
            e.age_ms
        );
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
        self.qp.ctrl.state() != self.qp.seen_state
    }
}

pub(super) fn failed_error(e: Error0, qid: u16) -> Error {
    match e {
        Error0::Fatal => Error::ControllerFatal,
        Error0::Gone => Error::DeviceGone,
        Error0::Lost => Error::QueueLost { qid },
    }
}

pub(super) fn failure_of(s: u64) -> Error0 {
    if state::failure(s) == state::GONE {
        Error0::Gone
    } else {
        Error0::Fatal
    }
}
