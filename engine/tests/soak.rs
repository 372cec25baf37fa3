//! Seeded soak: many I/Os on several threads (one queue pair each) against
//! the fake controller with random faults — dropped completions (→ timeout,
//! refused Abort, reset), long delays (→ reordering, timeout, successful
//! Abort), error statuses, IOMMU faults, duplicate and corrupt-CID (stale)
//! completions — plus controller resets from another thread.
//!
//! Checked: every submitted I/O completes exactly once (and nothing else
//! completes), and every read returns, block by block, data of the last
//! write acknowledged for that block — or, for a block whose later write
//! failed or was aborted, of that write or an earlier candidate (the device
//! may or may not have executed it). Each thread owns its own LBA range and
//! never has two commands on one block in flight, so this model is exact.
//!
//! Environment:
//! - `MCQIO_SOAK_SEED`: seed (decimal or 0x-hex); printed at start and in
//!   every failure message, so a failing run can be replayed (the workload
//!   of each thread is a pure function of the seed; which command draws a
//!   fault also depends on thread interleaving).
//! - `MCQIO_SOAK_IOS`: total I/Os (default 1,000,000).
//! - `MCQIO_SOAK_THREADS`: threads / queue pairs (default 4).
//! - `MCQIO_SOAK_MODE`: `sync` (default: the fake runs in the submitting
//!   thread) or `threaded` (a device worker thread).
//!
//! Run with `-- --nocapture` to see the counts. Sizes: the default (1M
//! I/Os, sync mode) takes about 35-40 s in a debug `cargo test` on two
//! cores, so CI runs it as is. Larger runs:
//!
//! ```text
//! MCQIO_SOAK_IOS=20000000 cargo test --release -p mcqio --test soak -- --nocapture
//! MCQIO_SOAK_MODE=threaded MCQIO_SOAK_IOS=2000000 cargo test --release -p mcqio --test soak -- --nocapture
//! ```

use mcqio_fixtures::testing::engine::nvme as common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use mcqio::{Completion, DmaBuf, IoError, QpairOptions, QpairStats, TimeoutPolicy};
use mcqio_fixtures::{ExecMode, Fault, FaultKind};
use rand::Rng;

const LBA: usize = 512;
const MAX_NLB: u32 = 8;
/// Blocks each thread owns.
const REGION: u64 = 4096;
const DEPTH: u16 = 32;
/// No completion for this long means a hang.
const HANG: Duration = Duration::from_secs(60);

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => {
            let v = v.trim().replace('_', "");
            let r = if let Some(h) = v.strip_prefix("0x") {
                u64::from_str_radix(h, 16)
            } else {
                v.parse()
            };
            r.unwrap_or_else(|_| panic!("{name}={v} is not a number"))
        }
        Err(_) => default,
    }
}

/// The 8-bit fill and 16-byte header of block `lba` written by write `wtag`
/// (`wtag` 0: never written, all zeroes).
fn block_pattern(lba: u64, wtag: u64) -> (u8, [u8; 16]) {
    if wtag == 0 {
        return (0, [0; 16]);
    }
    let mut h = [0u8; 16];
    h[..8].copy_from_slice(&lba.to_le_bytes());
    h[8..].copy_from_slice(&wtag.to_le_bytes());
    let fill = (lba.wrapping_mul(0x9E37_79B9) ^ wtag.wrapping_mul(0x85EB_CA6B)) as u8 | 1;
    (fill, h)
}

fn block_matches(data: &[u8], lba: u64, wtag: u64) -> bool {
    let (fill, h) = block_pattern(lba, wtag);
    data[..16] == h && data[16..].iter().all(|&b| b == fill)
}

#[derive(Default, Debug, Clone)]
struct Outcomes {
    ok: u64,
    nvme_error: u64,
    timed_out: u64,
    aborted_by_reset: u64,
    other: u64,
    reads_verified_blocks: u64,
    unknown_blocks_resolved: u64,
    stats: QpairStats,
}

struct Inflight {
    write: bool,
    lba: u64,
    nlb: u32,
}

/// One thread's workload on its own queue pair and LBA range.
#[allow(clippy::too_many_arguments)]
fn worker(
    seed: u64,
    thread: usize,
    ios: u64,
    ctrl: Arc<mcqio::Controller>,
    progress: &AtomicU64,
    stop: &AtomicBool,
) -> Outcomes {
    let fail = |msg: String| -> ! {
        stop.store(true, Ordering::Relaxed);
        panic!("soak seed {seed:#x} thread {thread}: {msg} (replay: MCQIO_SOAK_SEED={seed:#x})")
    };
    let mut qp = ctrl
        .create_qpair(QpairOptions {
            depth: DEPTH,
            io_timeout: Some(Duration::from_millis(100)),
            timeout_policy: TimeoutPolicy::Abort,
            ..Default::default()
        })
        .unwrap_or_else(|e| fail(format!("create_qpair: {e}")));
    let mut r = rng(seed ^ (thread as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let base = thread as u64 * REGION;
    // Acceptable write tags per block (0 = never written); the last entry
    // is the newest candidate. One entry = known.
    let mut accept: Vec<Vec<u64>> = vec![vec![0]; REGION as usize];
    let mut busy = vec![false; REGION as usize];
    let mut pool: Vec<DmaBuf> = buf(&ctrl, DEPTH as usize * MAX_NLB as usize * LBA)
        .chunks(MAX_NLB as usize * LBA)
        .unwrap();
    // Completions seen per tag (tags are 0..ios).
    let mut seen = vec![0u8; ios as usize];
    let mut inflight: Vec<Option<Inflight>> = (0..ios.min(1 << 20)).map(|_| None).collect();
    let slot_of = |tag: u64| (tag % inflight_len(ios)) as usize;
    let mut out = Outcomes::default();
    let mut next = 0u64;
    let mut done = 0u64;
    let mut last_progress = Instant::now();
    let mut block = vec![0u8; LBA];
    while done < ios {
        if stop.load(Ordering::Relaxed) {
            fail("another thread failed".into());
        }
        // Fill the queue.
        while next < ios && !qp.is_full() {
            let Some(mut b) = pool.pop() else { break };
            let nlb = r.gen_range(1..=MAX_NLB);
            let mut lba = None;
            for _ in 0..8 {
                let l = r.gen_range(0..=REGION - nlb as u64);
                if !(l..l + nlb as u64).any(|i| busy[i as usize]) {
                    lba = Some(l);
                    break;
                }
            }
            let Some(l) = lba else {
                pool.push(b);
                break;
            };
            let write = r.gen_bool(0.5);
            let tag = next;
            if inflight[slot_of(tag)].is_some() {
                fail(format!("tag slot for {tag} still in use"));
            }
            let res = if write {
                let wtag = tag + 1;
                for i in 0..nlb as u64 {
                    let (fill, h) = block_pattern(base + l + i, wtag);
                    let off = i as usize * LBA;
                    block.fill(fill);
                    block[..16].copy_from_slice(&h);
                    b.write_at(off, &block).unwrap();
                }
                qp.write(1, base + l, nlb, b, tag)
            } else {
                qp.read(1, base + l, nlb, b, tag)
            };
            if let Err(e) = res {
                fail(format!("submission rejected: {}", e.kind));
            }
            for i in l..l + nlb as u64 {
                busy[i as usize] = true;
            }
            inflight[slot_of(tag)] = Some(Inflight { write, lba: l, nlb });
            next += 1;
        }
        let mut handle = |c: Completion<DmaBuf>| {
            let tag = c.tag;
            if tag >= next {
                fail(format!("completion for tag {tag} never submitted"));
            }
            seen[tag as usize] += 1;
            if seen[tag as usize] != 1 {
                fail(format!("tag {tag} completed {} times", seen[tag as usize]));
            }
            let Some(io) = inflight[slot_of(tag)].take() else {
                fail(format!("tag {tag}: no in-flight record"));
            };
            let Some(b) = c.buf else {
                fail(format!(
                    "tag {tag}: buffer not handed back ({:?})",
                    c.result
                ));
            };
            match c.result {
                Ok(()) => out.ok += 1,
                Err(IoError::Nvme(_)) => out.nvme_error += 1,
                Err(IoError::TimedOut) => out.timed_out += 1,
                Err(IoError::AbortedByReset) => out.aborted_by_reset += 1,
                Err(_) => out.other += 1,
            }
            for i in 0..io.nlb as u64 {
                let idx = (io.lba + i) as usize;
                let lba = base + io.lba + i;
                busy[idx] = false;
                let acc = &mut accept[idx];
                match (io.write, c.result.is_ok()) {
                    (true, true) => *acc = vec![tag + 1],
                    // Maybe executed, maybe not: old or new data.
                    (true, false) => acc.push(tag + 1),
                    (false, true) => {
                        b.read_at(i as usize * LBA, &mut block).unwrap();
                        match acc.iter().rev().find(|&&w| block_matches(&block, lba, w)) {
                            Some(&w) => {
                                if acc.len() > 1 {
                                    out.unknown_blocks_resolved += 1;
                                }
                                *acc = vec![w];
                                out.reads_verified_blocks += 1;
                            }
                            None => fail(format!(
                                "read tag {tag}: LBA {lba} holds {:02x?}.. which is none of the acceptable writes {acc:?}",
                                &block[..24]
                            )),
                        }
                    }
                    (false, false) => {}
                }
            }
            pool.push(b);
            done += 1;
        };
        match qp.poll(usize::MAX, &mut handle) {
            Ok(0) => {}
            Ok(n) => {
                progress.fetch_add(n as u64, Ordering::Relaxed);
                last_progress = Instant::now();
            }
            Err(e) => fail(format!("poll failed: {e}")),
        }
        if last_progress.elapsed() > HANG {
            fail(format!(
                "no completion for {HANG:?} with {} outstanding",
                qp.outstanding()
            ));
        }
    }
    if seen.iter().any(|&n| n != 1) {
        fail("a tag did not complete exactly once".into());
    }
    out.stats = qp.stats();
    qp.close(|c| fail(format!("tag {} still outstanding at close", c.tag)))
        .unwrap_or_else(|e| fail(format!("close: {e}")));
    out
}

fn inflight_len(ios: u64) -> u64 {
    ios.min(1 << 20)
}

#[test]
fn soak() {
    let seed = env_u64("MCQIO_SOAK_SEED", 0x50AC_2026);
    let ios = env_u64("MCQIO_SOAK_IOS", 1_000_000);
    let threads = env_u64("MCQIO_SOAK_THREADS", 4).clamp(1, 8) as usize;
    let exec = match std::env::var("MCQIO_SOAK_MODE").as_deref() {
        Ok("threaded") => ExecMode::Threaded {
            workers: 1,
            pin_core: None,
        },
        _ => ExecMode::Sync,
    };
    println!(
        "soak: seed {seed:#x} (replay: MCQIO_SOAK_SEED={seed:#x}), {ios} I/Os, {threads} threads, {exec:?}"
    );
    let mut cfg = config(exec, 5);
    cfg.seed = seed;
    cfg.namespaces = vec![mcqio_fixtures::NamespaceConfig::ram(
        threads as u64 * REGION * LBA as u64,
        LBA as u32,
    )];
    let (fake, ctrl) = open(cfg);
    // Per I/O command. Faults that lose a completion cost a 100 ms timeout
    // each (plus an Abort and a reset), so they are rarer.
    let lossy = (40.0 / ios as f64).min(1e-3);
    let f = fake.faults();
    f.set_probability(Fault::DropCompletion, lossy);
    // A corrupt CID can, rarely, equal the CID of another command in
    // flight (1 in 2^generation-bits): no driver can tell that apart, so
    // keep these few.
    f.set_probability(Fault::CorruptCid, (8.0 / ios as f64).min(1e-4));
    f.set_probability(Fault::Delay(Duration::from_millis(400)), lossy);
    f.set_probability(Fault::DuplicateCqe, 1e-3);
    f.set_probability(
        Fault::Status {
            sct: 2,
            sc: 0x80,
            dnr: false,
        },
        1e-3,
    );
    f.set_probability(Fault::IommuFault, 2e-4);
    // (One delay length per kind: the 400 ms delays above both reorder
    // completions and exceed the 100 ms timeout.)
    let start = Instant::now();
    let progress = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let explicit_resets = 4u64;
    let results: Vec<Outcomes> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let ctrl = Arc::clone(&ctrl);
                let (progress, stop) = (&progress, &stop);
                let my = ios / threads as u64 + u64::from((t as u64) < ios % threads as u64);
                s.spawn(move || worker(seed, t, my, ctrl, progress, stop))
            })
            .collect();
        // Explicit resets spread over the run.
        let mut resets_done = 0;
        while handles.iter().any(|h| !h.is_finished()) {
            let due = progress.load(Ordering::Relaxed) * (explicit_resets + 1) / ios.max(1);
            if resets_done < explicit_resets && due > resets_done {
                resets_done += 1;
                if let Err(e) = ctrl.reset() {
                    stop.store(true, Ordering::Relaxed);
                    panic!("soak seed {seed:#x}: explicit reset failed: {e}");
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let elapsed = start.elapsed();
    let mut total = Outcomes::default();
    for o in &results {
        total.ok += o.ok;
        total.nvme_error += o.nvme_error;
        total.timed_out += o.timed_out;
        total.aborted_by_reset += o.aborted_by_reset;
        total.other += o.other;
        total.reads_verified_blocks += o.reads_verified_blocks;
        total.unknown_blocks_resolved += o.unknown_blocks_resolved;
        let (t, s) = (&mut total.stats, &o.stats);
        t.submitted += s.submitted;
        t.completed += s.completed;
        t.stale_completions += s.stale_completions;
        t.timeouts += s.timeouts;
        t.aborts_sent += s.aborts_sent;
        t.timed_out += s.timed_out;
        t.resets_requested += s.resets_requested;
        t.aborted_by_reset += s.aborted_by_reset;
        t.recoveries += s.recoveries;
    }
    let faults: BTreeMap<FaultKind, u64> = f.counts();
    println!(
        "soak: {ios} I/Os in {:.1} s on {threads} threads",
        elapsed.as_secs_f64()
    );
    println!("soak: faults injected: {faults:?}");
    println!(
        "soak: outcomes: ok {}, error status {}, timed out (aborted) {}, aborted by reset {}, other {}",
        total.ok, total.nvme_error, total.timed_out, total.aborted_by_reset, total.other
    );
    println!(
        "soak: stale/duplicate CQEs dropped {}, timeouts {}, aborts sent {}, resets asked by timeouts {}, controller resets {} ({} explicit), queue recoveries {}",
        total.stats.stale_completions,
        total.stats.timeouts,
        total.stats.aborts_sent,
        total.stats.resets_requested,
        ctrl.resets(),
        explicit_resets,
        total.stats.recoveries
    );
    println!(
        "soak: blocks verified by reads {}, unknown blocks resolved by a read {}",
        total.reads_verified_blocks, total.unknown_blocks_resolved
    );
    let ctx = format!("seed {seed:#x} (replay: MCQIO_SOAK_SEED={seed:#x})");
    assert_eq!(total.stats.submitted, ios, "{ctx}");
    assert_eq!(
        total.ok + total.nvme_error + total.timed_out + total.aborted_by_reset + total.other,
        ios,
        "{ctx}: every I/O completed once"
    );
    assert_eq!(total.other, 0, "{ctx}: no unexpected error kinds");
    assert!(ctrl.resets() >= explicit_resets, "{ctx}");
    assert!(total.reads_verified_blocks > 0, "{ctx}");
    // Only injected duplicates and corrupt CIDs produce CQEs that match
    // nothing (the fake posts a duplicate only if its CQ has room).
    let stray = faults.get(&FaultKind::DuplicateCqe).copied().unwrap_or(0)
        + faults.get(&FaultKind::CorruptCid).copied().unwrap_or(0);
    assert!(
        total.stats.stale_completions <= stray,
        "{ctx}: {} stale CQEs but only {stray} injected",
        total.stats.stale_completions
    );
    if ios >= 100_000 {
        // Every fault class fired and was seen through its outcome.
        for k in [
            FaultKind::DropCompletion,
            FaultKind::Delay,
            FaultKind::DuplicateCqe,
            FaultKind::Status,
            FaultKind::IommuFault,
        ] {
            assert!(
                faults.get(&k).copied().unwrap_or(0) > 0,
                "{ctx}: {k:?} never injected"
            );
        }
        assert!(total.timed_out > 0, "{ctx}: no abort succeeded");
        assert!(total.stats.resets_requested > 0, "{ctx}: no timeout reset");
        assert!(total.stats.stale_completions > 0, "{ctx}");
    }
}
