//! Issue 27 items 2 to 4: HPB's internal commands (map loads, inactivations)
//! keep to themselves — their own submit time and timeout handling, never
//! the application's statistics, a controller reset or a completion — and a
//! map load that raced a write is never used after that write completed,
//! even by a device that trusts the host's entries.

use mcqio_fixtures::testing::engine::ufs as ufs_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use mcqio::ufs::{HpbConfig, HpbStats, UfsController, UfsOptions, UfsQpairOptions, UfsQueuePair};
use mcqio::vfio::DmaDir;
use mcqio::{Completion, DmaBuf, IoError, TimeoutPolicy};
use mcqio_fixtures::ufs::{
    unwritten_word, FakeUfs, FtlConfig, HpbConfig as DevHpb, HpbControl as DevControl, LuConfig,
    UfsConfig, UfsFault,
};
use mcqio_fixtures::ExecMode;
use ufs_common::*;

const BLOCK: usize = 4096;
const READ_BUFFER: u8 = 0xF9;
const READ10: u8 = 0x28;

/// Sync fake, cost model, host-control HPB on LU 0 (4096 blocks, 16-block
/// sub-regions, 64-block regions); `trust`: the device trusts entries.
fn dev(mcq: bool, trust: bool) -> UfsConfig {
    UfsConfig {
        exec: ExecMode::Sync,
        mcq,
        lus: vec![LuConfig::Sparse { blocks: 4096 }],
        ftl: Some(FtlConfig::default()),
        hpb: Some(DevHpb {
            control: DevControl::Host,
            region_size: 9,
            subregion_size: 7,
            max_active_regions: 16,
            trust_entries: trust,
            ..DevHpb::default()
        }),
        ..UfsConfig::default()
    }
}

fn host_opts(queues: u16) -> UfsOptions {
    UfsOptions {
        hpb: Some(HpbConfig {
            memory_budget: 1 << 20,
            activation_threshold: 2,
            eviction_enter: 0,
            eviction_exit: u32::MAX,
            ..HpbConfig::default()
        }),
        depth: 16,
        blocking_timeout: Duration::from_secs(3),
        ..opts(queues)
    }
}

fn stats(ctrl: &UfsController) -> HpbStats {
    ctrl.hpb_stats(0).expect("HPB on LU 0")
}

fn qpair(
    ctrl: &Arc<UfsController>,
    timeout: Option<Duration>,
    policy: TimeoutPolicy,
) -> UfsQueuePair<DmaBuf> {
    ctrl.create_qpair_for::<DmaBuf>(UfsQpairOptions {
        io_timeout: timeout,
        timeout_policy: policy,
        ..Default::default()
    })
    .unwrap()
}

fn block_of(x: u64) -> Vec<u8> {
    (0..BLOCK / 8)
        .flat_map(|i| (x ^ i as u64).to_le_bytes())
        .collect()
}

fn unwritten(lba: u64) -> Vec<u8> {
    (0..BLOCK as u64 / 8)
        .flat_map(|i| unwritten_word(lba * BLOCK as u64 + 8 * i).to_le_bytes())
        .collect()
}

/// Poll `qp` until `f` holds; every application completion goes to `out`.
/// Runs the sync fake first each time, so delayed commands execute when due.
fn poll_until(
    fake: &FakeUfs,
    qp: &mut UfsQueuePair<DmaBuf>,
    out: &mut Vec<Completion<DmaBuf>>,
    what: &str,
    mut f: impl FnMut(&UfsQueuePair<DmaBuf>, &[Completion<DmaBuf>]) -> bool,
) {
    qp.submit();
    let start = Instant::now();
    while !f(qp, out) {
        fake.poll();
        let _ = qp.poll(64, |c| out.push(c));
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{what}: not reached; {} completions, {:?}",
            out.len(),
            qp.stats()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Read LBA `lba` `n` times (normal READs until the sub-region is loaded):
/// makes its sub-region hot, so the queue pair's next policy pass loads it.
fn heat(qp: &mut UfsQueuePair<DmaBuf>, lba: u64, n: usize) {
    let mut v = vec![0u8; BLOCK];
    for _ in 0..n {
        qp.read_blocking(0, lba, &mut v).expect("read");
    }
}

/// Item 3: a map load issued after a write dirtied its sub-region, but run
/// by the device before that write, must not be used once the write has
/// completed. The write (or unmap) is queued on queue pair `a` without its
/// doorbell, a read on `b` loads the sub-region (the device runs the load
/// first: pre-write entries), then `a` rings and, inside the write's
/// completion callback, the application reads the block on `b`. A device
/// that trusts the entry returns the pre-write data if the host sent it; a
/// validating one falls back — neither may be needed.
#[test]
fn a_load_that_ran_before_a_write_is_not_used_after_the_write_completed() {
    for trust in [true, false] {
        for unmap in [false, true] {
            let what = format!("trust={trust} unmap={unmap}");
            let (fake, ctrl) = up(dev(true, trust), host_opts(2));
            let mut a = ctrl.create_qpair(Default::default()).unwrap();
            let mut b = ctrl.create_qpair(Default::default()).unwrap();
            let lba = 20u64; // sub-region 1
            heat(&mut b, lba, 3);
            poll_until(&fake, &mut b, &mut Vec::new(), &what, |_, _| {
                stats(&ctrl).valid_subregions == 1
            });
            let loads = stats(&ctrl).map_loads;
            // The write, posted but not rung: the sub-region is dirtied.
            let new = block_of(0x5eed_0001);
            if unmap {
                a.unmap(0, lba, 1, 1).unwrap();
            } else {
                a.write(0, lba, 1, buf_with(&ctrl, &new), 1).unwrap();
            }
            assert_eq!(stats(&ctrl).valid_subregions, 0, "{what}: dirtied");
            // A read on `b` loads the sub-region again: the device runs
            // that READ BUFFER now, before the write.
            heat(&mut b, lba + 1, 1);
            poll_until(&fake, &mut b, &mut Vec::new(), &what, |_, _| {
                stats(&ctrl).map_loads > loads
            });
            let before = fake.ftl_stats().unwrap();
            // Ring the write; read the block on `b` as soon as it completed.
            a.submit();
            let mut done = false;
            let start = Instant::now();
            while !done {
                a.poll(8, |c| {
                    assert!(c.result.is_ok(), "{what}: {:?}", c.result);
                    let r = ctrl.alloc_buf(BLOCK, DmaDir::Bidirectional).unwrap();
                    b.read(0, lba, 1, r, 2).unwrap();
                    done = true;
                })
                .unwrap();
                assert!(start.elapsed() < Duration::from_secs(10), "{what}");
            }
            let got = wait_n(&mut b, 1).pop().unwrap();
            assert!(got.result.is_ok(), "{what}: {:?}", got.result);
            let mut data = vec![0u8; BLOCK];
            got.buf.unwrap().read_at(0, &mut data).unwrap();
            let after = fake.ftl_stats().unwrap();
            let want = if unmap { vec![0u8; BLOCK] } else { new.clone() };
            assert!(
                data == want,
                "{what}: the read after the write's completion returned {} data (HPB READs {}, trusted superseded {}, rejected stale {})",
                if data == unwritten(lba) { "the pre-write" } else { "wrong" },
                after.hpb_reads - before.hpb_reads,
                after.hpb_trusted_superseded - before.hpb_trusted_superseded,
                after.hpb_rejected_stale - before.hpb_rejected_stale,
            );
            assert_eq!(
                (
                    after.hpb_trusted_superseded - before.hpb_trusted_superseded,
                    after.hpb_rejected_stale - before.hpb_rejected_stale
                ),
                (0, 0),
                "{what}: an entry older than a completed write was sent"
            );
        }
    }
}

/// Item 2: with a 1 s timeout on a queue pair 1.5 s old, a map load that
/// takes 300 ms is not a timeout: neither policy `Reset` (which reset the
/// controller) nor `Abort` (which withdrew the load and counted a timeout
/// the application never caused) acts on it.
#[test]
fn a_slow_map_load_on_an_old_queue_pair_is_not_a_timeout() {
    let timeout = Duration::from_secs(1);
    let hs: Vec<_> = [TimeoutPolicy::Reset, TimeoutPolicy::Abort]
        .into_iter()
        .map(|policy| {
            std::thread::spawn(move || {
                let (fake, ctrl) = up(dev(true, false), host_opts(1));
                let mut qp = qpair(&ctrl, Some(timeout), policy);
                std::thread::sleep(timeout * 3 / 2);
                fake.faults().inject_next(
                    None,
                    Some(READ_BUFFER),
                    UfsFault::Delay(Duration::from_millis(300)),
                );
                heat(&mut qp, 40, 3);
                let mut out = Vec::new();
                poll_until(&fake, &mut qp, &mut out, "load", |_, _| {
                    let s = stats(&ctrl);
                    s.map_loads + s.map_load_errors >= 1
                });
                let (s, h) = (qp.stats(), stats(&ctrl));
                assert!(out.is_empty(), "{policy:?}");
                assert_eq!(
                    (
                        ctrl.resets(),
                        s.resets_requested,
                        s.timeouts,
                        s.aborts_sent,
                        s.timed_out
                    ),
                    (0, 0, 0, 0, 0),
                    "{policy:?}: resets, resets asked for, timeouts, aborts, timed out; {h:?}"
                );
                assert_eq!(
                    (h.map_loads, h.map_load_errors, h.internal_timeouts),
                    (1, 0, 0),
                    "{policy:?}: {h:?}"
                );
                assert_eq!(qp.outstanding(), 0);
            })
        })
        .collect();
    for h in hs {
        h.join().expect("policy thread");
    }
}

/// Item 2: an application command submitted after an idle spell, while
/// only a map load was outstanding, is stamped with its own submission
/// time: it is not timed out for the time the queue sat idle.
#[test]
fn a_command_after_an_idle_spell_with_only_a_map_load_outstanding_is_stamped_now() {
    // The read takes 150 ms: a timeout of 600 ms leaves room for a loaded
    // machine; the idle spell is twice the timeout.
    let timeout = Duration::from_millis(600);
    let (fake, ctrl) = up(dev(true, false), host_opts(1));
    let mut qp = qpair(&ctrl, Some(timeout), TimeoutPolicy::Abort);
    fake.faults()
        .inject_next(None, Some(READ_BUFFER), UfsFault::Delay(timeout * 4));
    heat(&mut qp, 40, 3);
    // The load is posted by the last read's poll; nobody polls now.
    std::thread::sleep(timeout * 2);
    fake.faults().inject_next(
        None,
        Some(READ10),
        UfsFault::Delay(Duration::from_millis(150)),
    );
    let b = ctrl.alloc_buf(BLOCK, DmaDir::Bidirectional).unwrap();
    qp.read(0, 1000, 1, b, 7).unwrap();
    let mut out = Vec::new();
    poll_until(&fake, &mut qp, &mut out, "read", |_, o| !o.is_empty());
    assert_eq!(out[0].tag, 7);
    assert!(out[0].result.is_ok(), "{:?}", out[0].result);
    let s = qp.stats();
    assert_eq!((s.timeouts, s.aborts_sent), (0, 0), "{s:?}");
}

/// Item 4: the device drops a map load, the policy is `Reset` and the
/// controller ignores the disable. The load is the queue pair's own: it is
/// withdrawn, never escalated to a reset, and nothing reaches the
/// application — no phantom completion, `outstanding()` stays 0. After a
/// later successful reset every slot serves the application again.
#[test]
fn a_dropped_map_load_never_reaches_the_application() {
    for mcq in [true, false] {
        let timeout = Duration::from_millis(50);
        let (fake, ctrl) = up(dev(mcq, false), host_opts(1));
        let mut qp = qpair(&ctrl, Some(timeout), TimeoutPolicy::Reset);
        let depth = qp.depth();
        fake.faults()
            .inject_next(None, Some(READ_BUFFER), UfsFault::DropCompletion);
        fake.set_ignore_disable(true);
        heat(&mut qp, 40, 3);
        let mut out = Vec::new();
        poll_until(&fake, &mut qp, &mut out, "internal timeout", |_, o| {
            !o.is_empty() || stats(&ctrl).internal_timeouts >= 1
        });
        // Some more scans.
        let t = Instant::now();
        while t.elapsed() < timeout * 4 {
            let _ = qp.poll(64, |c| out.push(c));
        }
        let tags: Vec<(u64, _)> = out.iter().map(|c| (c.tag, c.result)).collect();
        assert!(tags.is_empty(), "mcq={mcq}: the application got {tags:?}");
        assert_eq!(qp.outstanding(), 0, "mcq={mcq}");
        let s = qp.stats();
        assert_eq!(
            (s.timeouts, s.resets_requested, s.timed_out, ctrl.resets()),
            (0, 0, 0, 0),
            "mcq={mcq}: {s:?}"
        );
        let h = stats(&ctrl);
        assert_eq!(
            (h.internal_timeouts, h.internal_given_up, h.map_load_errors),
            (1, 0, 1),
            "mcq={mcq}: withdrawn, given back ABORTED: {h:?}"
        );
        fake.set_ignore_disable(false);
        ctrl.reset().expect("reset");
        poll_until(&fake, &mut qp, &mut out, "recovery", |qp, _| {
            qp.recoveries() == 1
        });
        assert_eq!(qp.depth(), depth, "mcq={mcq}");
        // Every slot carries an application command and completes.
        for i in 0..depth as u64 {
            let b = ctrl.alloc_buf(BLOCK, DmaDir::Bidirectional).unwrap();
            qp.read(0, 2000 + i, 1, b, i).unwrap();
        }
        poll_until(&fake, &mut qp, &mut out, "all slots", |_, o| {
            o.len() == depth
        });
        assert!(out.iter().all(|c| c.result.is_ok()), "mcq={mcq}");
        assert_eq!(qp.outstanding(), 0);
        assert_eq!(ctrl.leaked_bytes(), 0, "mcq={mcq}");
    }
}

/// Item 4: an application command and a map load both dropped, policy
/// `Reset`, and the reset fails. The application's command ends once,
/// `TimedOut` without its buffer; the map load ends inside the queue pair
/// (no completion with the internal tag); `outstanding()` does not
/// underflow. A later successful reset brings every slot back, and the next
/// application command in each completes (none is swallowed as internal).
#[test]
fn a_failed_reset_ends_map_loads_internally_and_frees_their_slots_after_the_next_reset() {
    for mcq in [true, false] {
        let timeout = Duration::from_millis(50);
        let (fake, ctrl) = up(dev(mcq, false), host_opts(1));
        let mut qp = qpair(&ctrl, Some(timeout), TimeoutPolicy::Reset);
        let depth = qp.depth();
        heat(&mut qp, 40, 2);
        fake.faults()
            .inject_next(None, Some(READ_BUFFER), UfsFault::DropCompletion);
        fake.faults()
            .inject_next(None, Some(READ10), UfsFault::DropCompletion);
        fake.set_ignore_disable(true);
        // The read is dropped; its poll's pass posts the (dropped) load.
        let b = ctrl.alloc_buf(BLOCK, DmaDir::Bidirectional).unwrap();
        qp.read(0, 40, 1, b, 5).unwrap();
        let mut out = Vec::new();
        poll_until(&fake, &mut qp, &mut out, "failed reset", |qp, o| {
            qp.stats().resets_requested >= 1 && !o.is_empty()
        });
        let t = Instant::now();
        while t.elapsed() < timeout * 4 {
            let _ = qp.poll(64, |c| out.push(c));
        }
        let tags: Vec<(u64, Result<(), IoError>, bool)> = out
            .iter()
            .map(|c| (c.tag, c.result, c.buf.is_some()))
            .collect();
        assert_eq!(tags, vec![(5, Err(IoError::TimedOut), false)], "mcq={mcq}");
        assert_eq!(qp.outstanding(), 0, "mcq={mcq}");
        fake.set_ignore_disable(false);
        ctrl.reset().expect("reset");
        out.clear();
        poll_until(&fake, &mut qp, &mut out, "recovery", |qp, _| {
            qp.recoveries() == 1
        });
        assert!(out.is_empty(), "mcq={mcq}");
        assert_eq!(qp.depth(), depth, "mcq={mcq}");
        for i in 0..depth as u64 {
            let b = ctrl.alloc_buf(BLOCK, DmaDir::Bidirectional).unwrap();
            qp.read(0, 2000 + i, 1, b, i).unwrap();
        }
        poll_until(&fake, &mut qp, &mut out, "all slots", |_, o| {
            o.len() == depth
        });
        assert!(out.iter().all(|c| c.result.is_ok()), "mcq={mcq}");
        assert_eq!(qp.outstanding(), 0, "mcq={mcq}");
    }
}

/// `close` and drop end a map load the device holds inside the queue pair:
/// no completion reaches the application.
#[test]
fn close_and_drop_end_map_loads_internally() {
    for close in [true, false] {
        let (fake, ctrl) = up(dev(true, false), host_opts(1));
        let mut qp = qpair(&ctrl, None, TimeoutPolicy::Abort);
        fake.faults()
            .inject_next(None, Some(READ_BUFFER), UfsFault::DropCompletion);
        heat(&mut qp, 40, 3);
        assert_eq!(qp.outstanding(), 0);
        if close {
            let mut n = 0;
            qp.close(|_| n += 1).unwrap();
            assert_eq!(n, 0);
        } else {
            drop(qp);
        }
        assert_eq!(ctrl.leaked_bytes(), 0, "close={close}: withdrawn");
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        heat(&mut qp, 41, 1);
    }
}
