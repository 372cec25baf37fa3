//! Reaping: the poll (one CQTP or UTRLDBR read), the proof that a completion
//! belongs to the command in its slot, its decoding and delivery; and the
//! HPB pass that posts internal map loads.

use super::*;

impl<B: IoBuf> UfsQueuePair<B> {
    /// Deliver up to `max` completions to `f`; returns how many. Rings a
    /// pending doorbell first. When the controller failed or disappeared,
    /// every outstanding command completes with
    /// [`IoError::ControllerFailed`] and the poll returns
    /// [`Error::ControllerFatal`] / [`Error::DeviceGone`].
    #[inline]
    pub fn poll<F: FnMut(Completion<B>)>(&mut self, max: usize, mut f: F) -> Result<usize> {
        // One relaxed load: a reset, or another queue pair that saw the
        // controller fail.
        if self.failed.is_some() || !self.held.is_empty() || self.ctrl.state() != self.seen_state {
            return self.poll_cold(max, &mut f);
        }
        self.transport.flush();
        let outstanding = self.trackers.outstanding();
        let UfsQueuePair {
            ctrl,
            transport,
            trackers,
            splits,
            ucds,
            tag_base,
            completed,
            timeouts,
            seen_state,
            hpb,
            ..
        } = self;
        let tag_base = *tag_base;
        let ucds_ref: &UcdSlice = ucds;
        // Asked after the completion register was read: a reset begins by
        // marking the state word before it disables the controller, so an
        // unchanged word means the register was read before the disable
        // (MMIO accesses stay in program order with these loads).
        let (ctrl, seen) = (&*ctrl, *seen_state);
        let live = || ctrl.state() == seen;
        // `slot` is proven to be the command the completion is for, or past
        // the depth: MCQ, the entry's UCD address is exactly the current
        // UCD of a slot (`UcdSlice::command_of`: an earlier command in the
        // slot had another); legacy, a doorbell bit we set cleared (it
        // clears once per ring). Whatever the OCS, an unproven one is
        // counted as stale and hands back nothing. A proven command's
        // malformed RESPONSE is its own error (`failed_result`).
        let mut deliver = |slot: u16, ocs: Ocs| {
            if usize::from(slot) >= trackers.slots() || !trackers.slot(slot).busy {
                trackers.stale += 1;
                return;
            }
            let task_tag = tag_base.wrapping_add(slot as u8);
            let head = ucds_ref.response_head(slot);
            let result = if ocs == Ocs::SUCCESS && head.is_good(task_tag) {
                Ok(())
            } else {
                let timed_out = timeouts.was_aborted(trackers, slot);
                failed_result(ocs, ucds_ref, slot, task_tag, timed_out)
            };
            if head.dev_info & DEV_INFO_HPB != 0 && result.is_ok() {
                hpb.note(slot, head.dev_info, &ucds_ref.response(slot));
            }
            let (tag, buf) = trackers.complete(slot);
            if end_internal(hpb, ucds_ref, slot, &result) {
                return;
            }
            if let Some(c) = deliver::route(splits, slot, tag, buf, result, 0) {
                // Counted before the callback runs: it may panic.
                *completed += 1;
                f(c);
            }
        };
        let (mut n, bad) = match &mut **transport {
            // A UCD address that is not the current one of a slot maps to
            // an impossible slot, which `deliver` counts as stale.
            Transport::Mcq(q) => match q.reap(max, outstanding, live, |ucd, ocs| {
                deliver(ucds_ref.command_of(ucd), ocs)
            }) {
                Reaped::Entries(n) => (n, false),
                Reaped::BadTail => (0, true),
            },
            Transport::Sdb(q) => match q.reap(max, live, &mut deliver) {
                SdbReaped::Entries(n) => (n, false),
                SdbReaped::AllOnes => (0, true),
            },
        };
        if n == 0 && self.trackers.outstanding() > 0 {
            self.empty_polls = self.empty_polls.wrapping_add(1);
            if (bad || self.empty_polls % HEALTH_CHECK_INTERVAL == 0)
                && self.ctrl.check_health() != self.seen_state
            {
                return self.poll_cold(max, &mut f);
            }
            if self.empty_polls % IDLE_CLOCK_INTERVAL == 0 && self.timeouts.enabled() {
                self.timeouts.tick();
            }
        } else {
            self.empty_polls = 0;
            if n != 0 && self.timeouts.enabled() {
                self.timeouts.tick();
            }
        }
        // Only after a poll that reaped everything the controller had
        // posted (fewer than `max`): a command whose completion waits in
        // the CQ is not a timeout.
        if self.timeouts.scan_due() && n < max && !bad {
            // What the scan ends counts against `max` too; the rest is held.
            let mut held = std::mem::take(&mut self.held);
            let ((), k) = held.budgeted(max - n, &mut f, |mut g| self.scan_timeouts(&mut g));
            self.held = held;
            n += k;
        }
        // No new map loads once the queue pair is closing.
        if self.hpb.pass_due() && !self.closed {
            self.hpb_pass();
        }
        Ok(n)
    }

    /// An HPB policy pass, then post the internal commands it prepared
    /// (map loads, inactivations) into free slots and ring once.
    #[cold]
    fn hpb_pass(&mut self) {
        self.hpb
            .pass(self.trackers.depth() - self.trackers.outstanding());
        let mut posted = false;
        // Internal commands are stamped with their own submission time
        // (the clock may not have been read for a while on a quiet queue).
        let mut stamped = !self.timeouts.enabled();
        while let Some(cmd) = self.hpb.next_cmd() {
            if !stamped {
                self.timeouts.tick();
                stamped = true;
            }
            let Some(slot) = self.alloc_slot() else {
                self.hpb.refused(cmd);
                continue;
            };
            let (dir, prdt, bytes) = match cmd.data {
                Some((iova, len)) => (
                    DataDir::FromDevice,
                    self.ucds.param_prdt(slot, iova, len),
                    len,
                ),
                None => (DataDir::None, 0, 0),
            };
            let task_tag = self.tag_base.wrapping_add(slot as u8);
            self.ucds
                .write_command(slot, cmd.lun, task_tag, cmd.cdb, bytes, bytes > 0);
            self.transport
                .post(slot, Utrd::new(self.ucds.iova(slot), dir, prdt));
            self.trackers
                .arm(slot, u64::MAX, None, self.timeouts.now_ms);
            self.hpb.posted(slot, cmd);
            posted = true;
        }
        if posted {
            self.transport.flush();
        }
    }
}
