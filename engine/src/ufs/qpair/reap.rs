//! Reaping: the poll (one CQTP or UTRLDBR read), the proof that a completion
//! belongs to the command in its slot, its decoding and delivery; and the
//! HPB pass that posts internal map loads.

use super::{end_internal, failed_result, HwQueue, UfsQueuePair};
use crate::core::error::Result;
use crate::core::io::{Completion, IoBuf};
use crate::core::qpair::Engine;
use crate::core::qpair::Lifecycle;
use crate::core::qpair::Reaped as CoreReaped;
use crate::ufs::hpb::qp::{HpbQp, DEV_INFO_HPB};
use crate::ufs::mcq::Reaped;
use crate::ufs::sdb::SdbReaped;
use crate::ufs::spec::utrd::{DataDir, Ocs, Utrd};
use crate::ufs::ucd::UcdSlice;

impl<B: IoBuf> UfsQueuePair<B> {
    /// Deliver up to `max` completions to `f`; returns how many. Rings a
    /// pending doorbell first. When the controller failed or disappeared,
    /// every outstanding command completes with
    /// [`IoError::ControllerFailed`](crate::core::io::IoError::ControllerFailed) and the poll returns
    /// [`Error::ControllerFatal`](crate::core::error::Error::ControllerFatal) / [`Error::DeviceGone`](crate::core::error::Error::DeviceGone).
    #[inline]
    pub fn poll<F: FnMut(Completion<B>)>(&mut self, max: usize, mut f: F) -> Result<usize> {
        Lifecycle::poll(self, max, &mut f)
    }

    /// The reaping pass of `poll` (the wire's `Wire::reap`): one CQTP or
    /// UTRLDBR read, then every entry proven and ended.
    #[inline(always)]
    pub(super) fn reap_entries<F: FnMut(Completion<B>)>(
        &mut self,
        max: usize,
        f: &mut F,
    ) -> CoreReaped {
        let outstanding = self.eng.trackers.outstanding();
        let UfsQueuePair {
            ctrl,
            hwq,
            eng,
            ucds,
            tag_base,
            hpb,
            ..
        } = self;
        let tag_base = *tag_base;
        let ucds_ref: &UcdSlice = ucds;
        // Asked after the completion register was read: a reset begins by
        // marking the state word before it disables the controller, so an
        // unchanged word means the register was read before the disable
        // (MMIO accesses stay in program order with these loads).
        let (ctrl, seen) = (&*ctrl, eng.seen_state);
        let live = || ctrl.state() == seen;
        let mut delivered = 0;
        // `slot` is proven to be the command the completion is for, or past
        // the depth: MCQ, the entry's UCD address is exactly the current
        // UCD of a slot (`UcdSlice::command_of`: an earlier command in the
        // slot had another); legacy, a doorbell bit we set cleared (it
        // clears once per ring). Whatever the OCS, an unproven one is
        // counted as stale and hands back nothing. A proven command's
        // malformed RESPONSE is its own error (`failed_result`).
        let mut deliver = |slot: u16, ocs: Ocs| {
            if finish(eng, hpb, ucds_ref, tag_base, slot, ocs, f) {
                delivered += 1;
            }
        };
        let (seen_entries, suspect) = match &mut **hwq {
            // A UCD address that is not the current one of a slot maps to
            // an impossible slot, which `finish` counts as stale.
            HwQueue::Mcq(q) => match q.reap(max, outstanding, live, |ucd, ocs| {
                deliver(ucds_ref.command_of(ucd), ocs)
            }) {
                Reaped::Entries(n) => (n, false),
                Reaped::BadTail => (0, true),
            },
            HwQueue::Legacy(q) => match q.reap(max, live, &mut deliver) {
                SdbReaped::Entries(n) => (n, false),
                SdbReaped::AllOnes => (0, true),
            },
        };
        CoreReaped {
            seen: seen_entries,
            delivered,
            suspect,
        }
    }

    /// An HPB policy pass, then post the internal commands it prepared
    /// (map loads, inactivations) into free slots and ring once.
    #[cold]
    pub(super) fn hpb_pass(&mut self) {
        self.hpb
            .pass(self.eng.trackers.depth() - self.eng.trackers.outstanding());
        let mut posted = false;
        // Internal commands are stamped with their own submission time
        // (the clock may not have been read for a while on a quiet queue).
        let mut stamped = !self.eng.timeouts.enabled();
        while let Some(cmd) = self.hpb.next_cmd() {
            if !stamped {
                self.eng.timeouts.tick();
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
            self.hwq
                .post(slot, Utrd::new(self.ucds.iova(slot), dir, prdt));
            self.eng
                .trackers
                .arm(slot, u64::MAX, None, self.eng.timeouts.now_ms);
            self.hpb.posted(slot, cmd);
            posted = true;
        }
        if posted {
            self.hwq.flush();
        }
    }
}

/// End the command in `slot` whose completion entry (MCQ) or doorbell bit
/// (legacy) reported `ocs`, or count the entry as stale when `slot` holds
/// no command in flight. Its result: OCS, then the RESPONSE UPIU
/// (`failed_result`); an HPB internal command ends in the HPB state, never
/// as an application completion. Shared by `poll` and the recovery after
/// a reset. Returns whether `f` was called.
#[inline(always)]
pub(super) fn finish<B: IoBuf, F: FnMut(Completion<B>)>(
    eng: &mut Engine<B, u16>,
    hpb: &mut HpbQp,
    ucds: &UcdSlice,
    tag_base: u8,
    slot: u16,
    ocs: Ocs,
    f: &mut F,
) -> bool {
    if usize::from(slot) >= eng.trackers.slots() || !eng.trackers.slot(slot).busy() {
        eng.trackers.stale += 1;
        return false;
    }
    let task_tag = tag_base.wrapping_add(slot as u8);
    let head = ucds.response_head(slot);
    if ocs == Ocs::SUCCESS && head.is_good(task_tag) {
        if head.dev_info & DEV_INFO_HPB != 0 {
            hpb.note(slot, head.dev_info, &ucds.response(slot));
        }
        // A success built as a constant into the callback's argument: a
        // result decided before the branch went through memory with its
        // error's bytes (as NVMe's `take_cqe`). The HPB check
        // inlined: as a call it cost a call, a frame and a return per I/O.
        return eng.complete(
            slot,
            0,
            |_, _| Ok(()),
            #[inline(always)]
            |slot, r| end_internal(hpb, ucds, slot, r),
            f,
        );
    }
    finish_failed(eng, hpb, ucds, task_tag, slot, ocs, head.dev_info, f)
}

/// `finish` of a command whose OCS or RESPONSE UPIU header is not a plain
/// success: the whole RESPONSE decides (it may still be one).
#[allow(clippy::too_many_arguments)]
#[cold]
#[inline(never)]
fn finish_failed<B: IoBuf, F: FnMut(Completion<B>)>(
    eng: &mut Engine<B, u16>,
    hpb: &mut HpbQp,
    ucds: &UcdSlice,
    task_tag: u8,
    slot: u16,
    ocs: Ocs,
    dev_info: u8,
    f: &mut F,
) -> bool {
    let timed_out = eng.timeouts.was_aborted(&eng.trackers, slot);
    let result = failed_result(ocs, ucds, slot, task_tag, timed_out);
    if dev_info & DEV_INFO_HPB != 0 && result.is_ok() {
        hpb.note(slot, dev_info, &ucds.response(slot));
    }
    eng.complete(
        slot,
        0,
        move |_, _| result,
        |slot, r| end_internal(hpb, ucds, slot, r),
        f,
    )
}
