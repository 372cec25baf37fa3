//! Host HPB on the fake UFS device (issue 14 items 3 and 5): bring-up of HPB
//! LUs, HPB READ after map loads, the device catching a stale or corrupt
//! entry, the memory budget, and a randomized multi-thread correctness test
//! in both control modes on a sparse LU.

use mcqio_fixtures::testing::engine::ufs as ufs_common;

use std::collections::HashMap;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use mcqio::ufs::{HpbConfig, HpbStats, UfsController, UfsOptions, UfsQueuePair};
use mcqio::vfio::DmaDir;
use mcqio::{Completion, DmaBuf};
use mcqio_fixtures::ufs::{
    unwritten_word, FtlConfig, HpbConfig as DevHpb, HpbControl as DevControl, LuConfig, UfsConfig,
};
use mcqio_fixtures::ExecMode;
use ufs_common::*;

const BLOCK: usize = 4096;

/// A fake with the cost model and HPB: LU 0 sparse (`blocks`), sub-regions
/// of `16 << (ss - 7)` blocks, regions of `rs`.
fn dev_cfg(control: DevControl, blocks: u64, rs: u8, ss: u8, threaded: bool) -> UfsConfig {
    UfsConfig {
        exec: if threaded {
            ExecMode::Threaded {
                workers: 1,
                pin_core: None,
            }
        } else {
            ExecMode::Sync
        },
        lus: vec![LuConfig::Sparse { blocks }],
        ftl: Some(FtlConfig::default()),
        hpb: Some(DevHpb {
            control,
            region_size: rs,
            subregion_size: ss,
            max_active_regions: 16,
            activation_threshold: 2,
            ..DevHpb::default()
        }),
        ..UfsConfig::default()
    }
}

fn hpb_opts(queues: u16, h: HpbConfig) -> UfsOptions {
    UfsOptions {
        hpb: Some(h),
        depth: 16,
        ..opts(queues)
    }
}

fn host(budget: u64) -> HpbConfig {
    HpbConfig {
        memory_budget: budget,
        activation_threshold: 2,
        eviction_enter: 0,
        eviction_exit: u32::MAX,
        ..HpbConfig::default()
    }
}

fn stats(ctrl: &UfsController) -> HpbStats {
    ctrl.hpb_stats(0).expect("HPB on LU 0")
}

/// What a block of the sparse LU holds.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Blk {
    Unwritten,
    Zero,
    Data(u64),
}

fn expect_block(lba: u64, b: Blk, got: &[u8]) -> Result<(), String> {
    for (i, w) in got.chunks_exact(8).enumerate() {
        let v = u64::from_le_bytes(w.try_into().unwrap());
        let want = match b {
            Blk::Unwritten => unwritten_word(lba * BLOCK as u64 + 8 * i as u64),
            Blk::Zero => 0,
            Blk::Data(x) => x ^ i as u64,
        };
        if v != want {
            return Err(format!(
                "LBA {lba} word {i}: {v:#x}, expected {want:#x} ({b:?})"
            ));
        }
    }
    Ok(())
}

fn fill(x: u64, buf: &mut [u8]) {
    for (i, w) in buf.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&(x ^ i as u64).to_le_bytes());
    }
}

fn read1(qp: &mut UfsQueuePair, lba: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n * BLOCK];
    qp.read_blocking(0, lba, &mut v).expect("read");
    v
}

/// Poll until `f` holds (bounded): lets internal map loads finish.
fn settle(qp: &mut UfsQueuePair, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        qp.poll(16, |_| panic!("no application command is in flight"))
            .expect("poll");
        assert!(start.elapsed() < Duration::from_secs(10), "did not settle");
        std::thread::yield_now();
    }
}

/// Issue 14 item 3: the fake marks HPB LUs with bLUEnable = 2; bring-up
/// ignored every LU whose bLUEnable was not 1, so an HPB device had no LU.
#[test]
fn hpb_lu_is_brought_up_and_enabled() {
    let (fake, ctrl) = up(
        dev_cfg(DevControl::Host, 4096, 9, 7, false),
        hpb_opts(1, host(1 << 20)),
    );
    assert_eq!(ctrl.logical_units().len(), 1);
    let s = stats(&ctrl);
    assert!(s.host_control);
    assert_eq!(s.memory_budget, 1 << 20);
    assert!(fake.hpb_active_regions(0).is_empty());
}

/// Without `UfsOptions::hpb` nothing changes: normal reads only.
#[test]
fn hpb_off_sends_normal_reads() {
    let (fake, ctrl) = up(
        dev_cfg(DevControl::Host, 4096, 9, 7, false),
        UfsOptions {
            depth: 16,
            ..opts(1)
        },
    );
    assert!(ctrl.hpb_stats(0).is_none());
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    for _ in 0..8 {
        expect_block(5, Blk::Unwritten, &read1(&mut qp, 5, 1)).unwrap();
    }
    assert_eq!(fake.ftl_stats().unwrap().hpb_reads, 0);
}

/// Host control: a sub-region read `activation_threshold` times is loaded
/// with READ BUFFER on the same queue pair, then reads go out as HPB READ
/// and the device accepts their entries; data is right throughout.
#[test]
fn host_control_loads_hot_subregion_then_sends_hpb_reads() {
    for control in [DevControl::Host, DevControl::Device] {
        let (fake, ctrl) = up(
            dev_cfg(control, 4096, 9, 7, false),
            hpb_opts(1, host(1 << 20)),
        );
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        for i in 0..4 {
            expect_block(40 + i, Blk::Unwritten, &read1(&mut qp, 40 + i, 1)).unwrap();
        }
        settle(&mut qp, || stats(&ctrl).map_loads >= 1);
        let before = fake.ftl_stats().unwrap();
        for i in 0..8 {
            expect_block(33 + i, Blk::Unwritten, &read1(&mut qp, 33 + i, 2)).unwrap();
        }
        drop(qp);
        let after = fake.ftl_stats().unwrap();
        let s = stats(&ctrl);
        assert_eq!(
            after.hpb_accepted - before.hpb_accepted,
            8,
            "{control:?}: {s:?}"
        );
        assert!(s.hpb_reads >= 8 && s.map_loads >= 1, "{s:?}");
        assert_eq!(after.hpb_read_buffers, s.map_loads);
        assert_eq!(s.stale_fallbacks, 0);
    }
}

/// Issue 14 item 5: a write dirties its sub-region at submission, so the
/// read after it is a normal READ (never the old entry); the device's
/// update recommendation reloads the sub-region and HPB READs resume with
/// the new entry.
#[test]
fn write_dirties_then_update_reloads() {
    let (fake, ctrl) = up(
        dev_cfg(DevControl::Host, 4096, 9, 7, false),
        hpb_opts(1, host(1 << 20)),
    );
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    for _ in 0..3 {
        read1(&mut qp, 20, 1);
    }
    settle(&mut qp, || stats(&ctrl).valid_subregions == 1);
    let mut data = vec![0u8; BLOCK];
    fill(0xabc, &mut data);
    qp.write_blocking(0, 20, &data).unwrap();
    let a = fake.ftl_stats().unwrap();
    expect_block(20, Blk::Data(0xabc), &read1(&mut qp, 20, 1)).unwrap();
    let b = fake.ftl_stats().unwrap();
    assert_eq!(
        b.hpb_rejected_stale, a.hpb_rejected_stale,
        "a stale entry was sent"
    );
    settle(&mut qp, || stats(&ctrl).valid_subregions == 1);
    expect_block(20, Blk::Data(0xabc), &read1(&mut qp, 20, 1)).unwrap();
    let c = fake.ftl_stats().unwrap();
    assert_eq!(c.hpb_accepted, b.hpb_accepted + 1, "{:?}", stats(&ctrl));
    assert!(stats(&ctrl).dirtied >= 1);
}

/// Issue 14 item 5: a deliberately stale entry (the one from before a write,
/// put back by the test knob as a broken host would) and a corrupt one are
/// sent in HPB READs; the device's check catches both, falls back, the
/// data is right, the host counts the device's fallback reports and
/// reloads the sub-region.
#[test]
fn stale_or_corrupt_entry_is_caught_by_the_device() {
    let (fake, ctrl) = up(
        dev_cfg(DevControl::Host, 4096, 9, 7, false),
        hpb_opts(1, host(1 << 20)),
    );
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    for _ in 0..3 {
        read1(&mut qp, 70, 1);
    }
    settle(&mut qp, || stats(&ctrl).valid_subregions == 1);
    let old = ctrl
        .hpb_swap_entry_for_test(0, 70, |e| e)
        .expect("entry of LBA 70 held");
    let mut data = vec![0u8; BLOCK];
    fill(0x5157, &mut data);
    qp.write_blocking(0, 70, &data).unwrap();
    settle(&mut qp, || stats(&ctrl).valid_subregions == 1);
    // Stale: put the pre-write entry back.
    let new = ctrl.hpb_swap_entry_for_test(0, 70, |_| old).unwrap();
    assert_ne!(new, old, "the reload brought a new entry");
    let a = fake.ftl_stats().unwrap();
    expect_block(70, Blk::Data(0x5157), &read1(&mut qp, 70, 1)).unwrap();
    let b = fake.ftl_stats().unwrap();
    assert_eq!(b.hpb_reads - a.hpb_reads, 1, "sent as HPB READ");
    assert_eq!(b.hpb_rejected_stale - a.hpb_rejected_stale, 1);
    assert_eq!(stats(&ctrl).stale_fallbacks, 1);
    // The host reloads it after the report.
    settle(&mut qp, || stats(&ctrl).valid_subregions == 1);
    assert_eq!(ctrl.hpb_swap_entry_for_test(0, 70, |e| e), Some(new));
    // Corrupt: flip a PPN bit of a neighbour's entry.
    ctrl.hpb_swap_entry_for_test(0, 71, |e| e ^ 1 << 40)
        .unwrap();
    expect_block(71, Blk::Unwritten, &read1(&mut qp, 71, 1)).unwrap();
    let c = fake.ftl_stats().unwrap();
    assert_eq!(c.hpb_rejected_invalid - b.hpb_rejected_invalid, 1);
    assert_eq!(stats(&ctrl).stale_fallbacks, 2);
}

/// Issue 14 item 3: the host map never holds more than its budget; reads
/// over a range larger than it evict least recently used regions (host
/// control tells the device with WRITE BUFFER) and data stays right.
#[test]
fn host_map_stays_within_budget_and_evicts() {
    // 64 KiB sub-regions (16 entries = 128 B of map), 256 KiB regions.
    let budget = 6 * 128;
    let (fake, ctrl) = up(
        dev_cfg(DevControl::Host, 4096, 9, 7, false),
        hpb_opts(1, host(budget)),
    );
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    let mut x = 0x1234_5678_9abc_def1u64;
    for i in 0..3000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // 32 sub-regions = 8 regions.
        let lba = x % 512;
        expect_block(lba, Blk::Unwritten, &read1(&mut qp, lba, 1)).unwrap();
        if i % 64 == 0 {
            let s = stats(&ctrl);
            assert!(s.host_map_bytes <= budget, "{s:?}");
            assert!(s.host_map_bytes_used <= budget, "{s:?}");
        }
    }
    drop(qp);
    let s = stats(&ctrl);
    assert!(
        s.host_map_bytes_peak <= budget && s.host_map_bytes <= budget,
        "{s:?}"
    );
    assert!(s.evictions > 0 && s.inactivations_sent > 0, "{s:?}");
    assert!(s.hpb_reads > 0, "{s:?}");
    let d = fake.ftl_stats().unwrap();
    assert_eq!(d.hpb_inactivated, s.inactivations_sent, "{d:?}");
}

/// One thread's share of the randomized test: blocks in 8-block chunks,
/// chunk `c` owned by thread `c % threads`; writes, unmaps and reads (1 to
/// 8 blocks inside one owned chunk) with up to `depth` in flight, never two
/// on one block at once; every read checked against the last acknowledged
/// state.
fn worker(
    ctrl: Arc<UfsController>,
    me: u64,
    threads: u64,
    chunks: u64,
    ops: usize,
    seed: u64,
    go: Arc<Barrier>,
) -> Result<(u64, u64), String> {
    let mut qp = ctrl
        .create_qpair(Default::default())
        .map_err(|e| e.to_string())?;
    let depth = 6usize;
    let mut model: HashMap<u64, Blk> = HashMap::new();
    let mut busy: HashMap<u64, ()> = HashMap::new();
    let mut bufs: Vec<Option<DmaBuf>> = (0..depth)
        .map(|_| Some(ctrl.alloc_buf(8 * BLOCK, DmaDir::Bidirectional).unwrap()))
        .collect();
    // tag -> (op, lba, n, value)
    let mut inflight: HashMap<u64, (u8, u64, u32, u64)> = HashMap::new();
    let mut x = seed | 1;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut done, mut issued, mut reads) = (0usize, 0usize, 0u64);
    let mut version = me << 40;
    go.wait();
    let start = Instant::now();
    while done < ops {
        // Submit while there is room.
        while issued < ops && inflight.len() < depth {
            let Some(tag) = (0..depth as u64).find(|t| !inflight.contains_key(t)) else {
                break;
            };
            let chunk = (rnd() % (chunks / threads)) * threads + me;
            let off = rnd() % 8;
            let n = 1 + (rnd() % (8 - off)) as u32;
            let lba = chunk * 8 + off;
            if (lba..lba + u64::from(n)).any(|b| busy.contains_key(&b)) {
                // Let something complete first.
                break;
            }
            let op = match rnd() % 10 {
                0..=5 => 0u8, // read
                6..=8 => 1,   // write
                _ => 2,       // unmap
            };
            let mut val = 0;
            let res = match op {
                0 => {
                    let b = bufs[tag as usize].take().unwrap();
                    qp.read(0, lba, n, b, tag).map_err(|e| e.kind)
                }
                1 => {
                    version += 1;
                    val = version;
                    let mut b = bufs[tag as usize].take().unwrap();
                    for i in 0..u64::from(n) {
                        let mut blk = vec![0u8; BLOCK];
                        fill(val ^ (lba + i) << 20, &mut blk);
                        b.write_at(i as usize * BLOCK, &blk).unwrap();
                    }
                    qp.write(0, lba, n, b, tag).map_err(|e| e.kind)
                }
                _ => qp.unmap(0, lba, n, tag).map_err(|e| e.kind),
            };
            res.map_err(|k| format!("submit: {k:?}"))?;
            for b in lba..lba + u64::from(n) {
                busy.insert(b, ());
            }
            inflight.insert(tag, (op, lba, n, val));
            issued += 1;
        }
        qp.submit();
        let mut comps: Vec<Completion<DmaBuf>> = Vec::new();
        qp.poll(64, |c| comps.push(c)).map_err(|e| e.to_string())?;
        for c in comps {
            let (op, lba, n, val) = inflight
                .remove(&c.tag)
                .ok_or_else(|| format!("unknown tag {}", c.tag))?;
            c.result.map_err(|e| format!("op {op} at {lba}: {e:?}"))?;
            for b in lba..lba + u64::from(n) {
                busy.remove(&b);
            }
            if let Some(buf) = c.buf {
                if op == 0 {
                    reads += 1;
                    let mut v = vec![0u8; n as usize * BLOCK];
                    buf.read_at(0, &mut v).unwrap();
                    for i in 0..u64::from(n) {
                        let b = *model.get(&(lba + i)).unwrap_or(&Blk::Unwritten);
                        let s = i as usize * BLOCK;
                        expect_block(lba + i, b, &v[s..s + BLOCK])
                            .map_err(|e| format!("thread {me}: {e}"))?;
                    }
                }
                bufs[c.tag as usize] = Some(buf);
            }
            // Acknowledged: the model changes now.
            for i in 0..u64::from(n) {
                match op {
                    1 => {
                        model.insert(lba + i, Blk::Data(val ^ (lba + i) << 20));
                    }
                    2 => {
                        model.insert(lba + i, Blk::Zero);
                    }
                    _ => {}
                }
            }
            done += 1;
        }
        if start.elapsed() > Duration::from_secs(60) {
            return Err(format!("thread {me}: only {done} of {ops} done"));
        }
    }
    Ok((reads, qp.stats().submitted))
}

fn randomized(control: DevControl, trust: bool) {
    // 1 MiB of 64 KiB sub-regions (16 blocks: two chunks of different
    // threads each), 256 KiB regions; a budget of 8 sub-regions of the 16.
    let threads = 3u64;
    let blocks = 256u64;
    let mut cfg = dev_cfg(control, blocks, 9, 7, true);
    if let Some(h) = cfg.hpb.as_mut() {
        h.trust_entries = trust;
    }
    let (fake, ctrl) = up(cfg, hpb_opts(threads as u16, host(8 * 128)));
    let go = Arc::new(Barrier::new(threads as usize));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (c, g) = (Arc::clone(&ctrl), Arc::clone(&go));
            std::thread::spawn(move || worker(c, t, threads, blocks / 8, 1500, 0x9e37 + t * 77, g))
        })
        .collect();
    for h in hs {
        h.join().expect("thread").expect("worker");
    }
    let s = stats(&ctrl);
    let d = fake.ftl_stats().unwrap();
    assert!(s.hpb_reads > 0 && s.map_loads > 0, "{control:?}: {s:?}");
    assert!(d.hpb_accepted > 0, "{control:?}: {d:?}");
    assert!(s.dirtied > 0, "{s:?}");
    assert!(s.host_map_bytes_peak <= 8 * 128, "{s:?}");
    // No read carried an entry older than the last acknowledged write of
    // its block (a validating device would have served it right anyway, a
    // trusting one returned old data).
    assert_eq!(
        (d.hpb_rejected_stale, d.hpb_trusted_superseded),
        (0, 0),
        "{control:?} trust={trust}: {d:?}"
    );
    eprintln!("{control:?} trust={trust}: host {s:?}\ndevice {d:?}");
}

/// Issue 14 item 5: three threads interleave writes, unmaps and reads on
/// shared sub-regions, HPB on, device-control mode; every read returns the
/// last acknowledged data.
#[test]
fn randomized_device_control_reads_last_acknowledged_data() {
    randomized(DevControl::Device, false);
}

/// Issue 27 item 3: the same against a device that trusts the host's
/// entries (`trust_entries`): an entry older than an acknowledged write
/// would return old data.
#[test]
fn randomized_device_control_trusting_device_reads_last_acknowledged_data() {
    randomized(DevControl::Device, true);
}

/// The same in host-control mode, trusting device.
#[test]
fn randomized_host_control_trusting_device_reads_last_acknowledged_data() {
    randomized(DevControl::Host, true);
}

/// The same in host-control mode.
#[test]
fn randomized_host_control_reads_last_acknowledged_data() {
    randomized(DevControl::Host, false);
}

/// Issue 14 item 3: map loads are the queue pair's own commands. A failed
/// READ BUFFER is counted, publishes nothing and is loaded again when the
/// sub-region stays hot; one whose completion never comes is withdrawn by
/// `close` without ever reaching the application's callback.
#[test]
fn internal_map_loads_fail_and_vanish_without_reaching_the_application() {
    use mcqio_fixtures::ufs::UfsFault;
    let (fake, ctrl) = up(
        dev_cfg(DevControl::Host, 4096, 9, 7, false),
        hpb_opts(1, host(1 << 20)),
    );
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    fake.faults()
        .inject_next(None, Some(0xF9), UfsFault::Ocs(0x02));
    for _ in 0..3 {
        expect_block(100, Blk::Unwritten, &read1(&mut qp, 100, 1)).unwrap();
    }
    settle(&mut qp, || stats(&ctrl).map_load_errors == 1);
    assert_eq!(stats(&ctrl).valid_subregions, 0);
    // Still hot: the next read queues it again.
    expect_block(101, Blk::Unwritten, &read1(&mut qp, 101, 1)).unwrap();
    settle(&mut qp, || stats(&ctrl).map_loads == 1);
    let a = fake.ftl_stats().unwrap();
    expect_block(102, Blk::Unwritten, &read1(&mut qp, 102, 1)).unwrap();
    assert_eq!(fake.ftl_stats().unwrap().hpb_accepted, a.hpb_accepted + 1);
    // A READ BUFFER that never completes.
    fake.faults()
        .inject_next(None, Some(0xF9), UfsFault::DropCompletion);
    for _ in 0..3 {
        expect_block(300, Blk::Unwritten, &read1(&mut qp, 300, 1)).unwrap();
    }
    let start = Instant::now();
    while fake.ftl_stats().unwrap().hpb_read_buffers < 2 {
        qp.poll(16, |_| {
            panic!("an internal completion reached the application")
        })
        .unwrap();
        assert!(start.elapsed() < Duration::from_secs(10));
    }
    assert_eq!(qp.outstanding(), 0, "map loads are not the application's");
    let mut seen = 0;
    qp.close(|_| seen += 1).unwrap();
    assert_eq!(seen, 0);
    // The controller still works for a new queue pair.
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    expect_block(300, Blk::Unwritten, &read1(&mut qp, 300, 1)).unwrap();
}

/// Issue 14 item 3: pinned regions (wHPBPinnedRegionStartIdx,
/// wNumHPBPinnedRegions) are loaded without being read first and are never
/// evicted, however hard other regions compete for the budget.
#[test]
fn pinned_region_is_loaded_first_and_never_evicted() {
    let mut cfg = dev_cfg(DevControl::Host, 4096, 9, 7, false);
    if let Some(h) = cfg.hpb.as_mut() {
        h.pinned_start = 2;
        h.pinned_count = 1;
    }
    // Room for the pinned region's 4 sub-regions and 2 more.
    let budget = 6 * 128;
    let (fake, ctrl) = up(cfg, hpb_opts(1, host(budget)));
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    settle(&mut qp, || stats(&ctrl).valid_subregions == 4);
    // Region 2 = blocks 128..192: HPB READ on first touch.
    let a = fake.ftl_stats().unwrap();
    expect_block(130, Blk::Unwritten, &read1(&mut qp, 130, 1)).unwrap();
    assert_eq!(fake.ftl_stats().unwrap().hpb_accepted, a.hpb_accepted + 1);
    let mut x = 0x5eedu64;
    for _ in 0..1500 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Regions 4.. (blocks 256..1024): 48 sub-regions for 2 slots.
        let lba = 256 + x % 768;
        expect_block(lba, Blk::Unwritten, &read1(&mut qp, lba, 1)).unwrap();
    }
    let s = stats(&ctrl);
    assert!(s.evictions > 0, "{s:?}");
    assert!(s.host_map_bytes_peak <= budget, "{s:?}");
    let b = fake.ftl_stats().unwrap();
    for lba in [128, 150, 191] {
        expect_block(lba, Blk::Unwritten, &read1(&mut qp, lba, 1)).unwrap();
    }
    assert_eq!(fake.ftl_stats().unwrap().hpb_accepted, b.hpb_accepted + 3);
}

/// A host controller reset clears the device's HPB state: bring-up after
/// it enables HPB again and reloads every sub-region the host had active
/// (the host's entries are suspect), then HPB READs resume and data stays
/// right.
#[test]
fn host_controller_reset_reloads_the_active_map() {
    let (fake, ctrl) = up(
        dev_cfg(DevControl::Host, 4096, 9, 7, false),
        hpb_opts(1, host(1 << 20)),
    );
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    for i in 0..4 {
        expect_block(40 + i, Blk::Unwritten, &read1(&mut qp, 40 + i, 1)).unwrap();
    }
    settle(&mut qp, || stats(&ctrl).map_loads >= 1);
    let loads = stats(&ctrl).map_loads;
    ctrl.reset().expect("reset");
    // The queue pair recovers at its next poll; the reload is an internal
    // command on it.
    settle(&mut qp, || stats(&ctrl).map_loads > loads);
    // The device's own reset-of-map notice may queue one more reload;
    // reads in between go out as normal READ. Let it settle.
    for i in 0..8 {
        expect_block(33 + i, Blk::Unwritten, &read1(&mut qp, 33 + i, 2)).unwrap();
    }
    settle(&mut qp, || stats(&ctrl).valid_subregions >= 1);
    let before = fake.ftl_stats().unwrap();
    for i in 0..8 {
        expect_block(33 + i, Blk::Unwritten, &read1(&mut qp, 33 + i, 2)).unwrap();
    }
    let after = fake.ftl_stats().unwrap();
    let s = stats(&ctrl);
    assert_eq!(
        after.hpb_accepted - before.hpb_accepted,
        8,
        "{s:?} {before:?} {after:?}"
    );
    assert_eq!(s.stale_fallbacks, 0, "{s:?}");
    assert_eq!(qp.recoveries(), 1);
}
