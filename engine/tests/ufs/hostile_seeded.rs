//! A seeded hostile UFS controller (issue 27, item 7): random lies in CAP,
//! MCQCAP, the queue configuration and pointer registers, UIC results,
//! HCE/HCS/IS, NOP IN, QUERY RESPONSE and RESPONSE UPIUs, SCSI data and MCQ
//! completion entries, with the fake's own I/O faults on top. Whatever the
//! controller says, bring-up, I/O, close and drop end — bounded by the
//! engine's own timeouts — in `Ok` or a typed error; every command ends at
//! most once (exactly once when close succeeds); and no buffer comes back
//! while the device may still write it: every buffer handed back is freed
//! (unmapped) at once, the device is then run to the end, and the IOMMU
//! must have seen no access to unmapped memory.

use mcqio_fixtures::testing::engine::ufs as ufs_common;
use ufs_common::*;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcqio::ufs::{UfsController, UfsOptions, UfsQpairOptions};
use mcqio::vfio::{Backend, DmaDir};
use mcqio::{DmaBuf, TimeoutPolicy};
use mcqio_fixtures::ufs::{
    CqeKind, DataLie, HceLie, HostileUfs, LuConfig, Pointer, UfsConfig, UfsCqeLie, UfsDeviceLies,
    UfsFault, UfsRegisterLies, UpiuKind, UpiuLie,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const SEEDS: u64 = 300;

fn pick<T: Copy>(rng: &mut SmallRng, v: &[T]) -> T {
    v[rng.gen_range(0..v.len())]
}

/// One of `special`, or a random byte.
fn byte(rng: &mut SmallRng, special: &[u8]) -> u8 {
    if rng.gen_bool(0.7) {
        pick(rng, special)
    } else {
        rng.gen()
    }
}

fn config(rng: &mut SmallRng) -> UfsConfig {
    UfsConfig {
        lus: (0..rng.gen_range(1..=2))
            .map(|_| LuConfig::Ram { blocks: 64 })
            .collect(),
        queues: rng.gen_range(1..=4),
        nutrs: pick(rng, &[1, 4, 32]),
        mac: pick(rng, &[1, 8, 64]),
        queue_depth: pick(rng, &[1, 8, 32]),
        seed: rng.gen(),
        ..sync_cfg(rng.gen_bool(0.7))
    }
}

/// The real CAP/MCQCAP and BAR length of `cfg`.
fn real(cfg: &UfsConfig) -> (u32, u32, usize) {
    let f = mcqio_fixtures::ufs::FakeUfs::new(cfg.clone()).expect("fake");
    let r = f.regs();
    (r.read32(0), r.read32(4), r.len())
}

fn register_lies(rng: &mut SmallRng, cfg: &UfsConfig) -> UfsRegisterLies {
    let (cap, mcqcap, bar) = real(cfg);
    let queues = usize::from(cfg.queues);
    let mut l = UfsRegisterLies::default();
    if rng.gen_bool(0.15) {
        l.cap = Some(match rng.gen_range(0..5) {
            0 => cap ^ (1 << 30),                        // MCQS
            1 => cap & !0xFF | rng.gen_range(0..256u32), // NUTRS / MAC
            2 => cap ^ (1 << 24),                        // 64AS
            3 => 0,
            _ => rng.gen(),
        });
    }
    if rng.gen_bool(0.2) {
        l.mcqcap = Some(match rng.gen_range(0..4) {
            0 => mcqcap & !0xFF | rng.gen_range(0..256u32), // MAXQ
            1 => mcqcap & !(0xFF << 16) | rng.gen_range(0..256u32) << 16, // QCFGPTR
            2 => mcqcap & !0xFF,
            _ => rng.gen(),
        });
    }
    let cfg_base = usize::from(cfg.qcfgptr) * 0x200;
    for _ in 0..rng.gen_range(0..3) {
        if !rng.gen_bool(0.3) {
            continue;
        }
        let q = rng.gen_range(0..queues) as u8;
        let reg = pick(rng, &[0x0C, 0x10, 0x2C, 0x30, 0x00, 0x20]);
        let v = match rng.gen_range(0..7) {
            0 => (bar + rng.gen_range(0..0x100)) as u32, // outside the BAR
            1 => (bar - 4) as u32,                       // runs past the end
            2 => (cfg.op_base + 2) as u32,               // unaligned
            3 => 0x20,                                   // onto IS/IE
            4 => cfg_base as u32,                        // onto the configuration array
            5 => cfg.op_base as u32,                     // queue 0's block, for every queue
            _ => rng.gen(),
        };
        l.qcfg.push((q, reg, v));
    }
    if rng.gen_bool(0.15) {
        let q = rng.gen_range(0..queues) as u8;
        let p = pick(
            rng,
            &[Pointer::Sqhp, Pointer::Sqtp, Pointer::Cqhp, Pointer::Cqtp],
        );
        let v = match rng.gen_range(0..4) {
            0 => 32 * rng.gen_range(1..300),
            1 => rng.gen_range(1..32),
            2 => u32::MAX - 1,
            _ => rng.gen(),
        };
        l.pointers.push((q, p, v));
    }
    if rng.gen_bool(0.05) {
        l.uic_result = Some(rng.gen_range(1..16));
    }
    // Lies that make a wait run to its timeout are rarer.
    l.hce = match rng.gen_range(0..40) {
        0 => HceLie::NeverSets,
        1 | 2 => HceLie::NeverClears,
        _ => HceLie::Honest,
    };
    if rng.gen_bool(0.03) {
        l.hcs_clear = pick(rng, &[1, 2, 8, 0xF]);
    }
    if rng.gen_bool(0.2) {
        // UE, ULSS, UCCS, CQES, UTRCS; now and then a fatal bit.
        let mut bits = 0;
        for b in [1 << 2, 1 << 8, 1 << 10, 1 << 20, 1 << 0] {
            if rng.gen_bool(0.5) {
                bits |= b;
            }
        }
        if rng.gen_bool(0.15) {
            bits |= pick(rng, &[1 << 11, 1 << 16, 1 << 17]);
        }
        l.is_flood = bits;
    }
    l.utrldbr_stuck = rng.gen_bool(0.02);
    if rng.gen_bool(0.05) {
        l.bar_len = Some(rng.gen_range(0x40..bar));
    }
    l
}

/// Lies in memory; `nth` picks among the first `span` UPIUs of a kind.
fn device_lies(rng: &mut SmallRng, span: u64) -> UfsDeviceLies {
    let mut d = UfsDeviceLies::default();
    let nth = |rng: &mut SmallRng| {
        if rng.gen_bool(0.8) {
            Some(rng.gen_range(0..span))
        } else {
            None
        }
    };
    if rng.gen_bool(0.1) {
        d.upius.push(UpiuLie {
            kind: UpiuKind::NopIn,
            nth: nth(rng),
            when: None,
            patches: vec![(pick(rng, &[0, 1, 3, 5, 6, 7]), rng.gen())],
        });
    }
    if rng.gen_bool(0.35) {
        // Header: transaction code, task tag, response, data segment
        // length; data segment: bLength, IDN, bNumberLU, wSpecVersion,
        // bQueueDepth, bMaxNumberLU, bUnitIndex, bLUEnable,
        // bLogicalBlockSize, qLogicalBlockCount.
        let offs = [
            0, 3, 6, 10, 11, 32, 33, 38, 48, 65, 44, 34, 35, 42, 43, 44, 45, 46, 50,
        ];
        d.upius.push(UpiuLie {
            kind: UpiuKind::QueryResponse,
            nth: nth(rng),
            when: None,
            patches: (0..rng.gen_range(1..4))
                .map(|_| (pick(rng, &offs), byte(rng, &[0, 1, 0x7F, 0xFF])))
                .collect(),
        });
    }
    if rng.gen_bool(0.3) {
        // Transaction code, task tag, response, status, data segment
        // length, residual, sense length, sense key / ASC.
        let offs = [0, 3, 6, 7, 10, 11, 12, 13, 14, 15, 32, 33, 36, 46];
        d.upius.push(UpiuLie {
            kind: UpiuKind::Response,
            nth: nth(rng),
            when: None,
            patches: (0..rng.gen_range(1..4))
                .map(|_| (pick(rng, &offs), byte(rng, &[0, 2, 0x7F, 0xFF])))
                .collect(),
        });
    }
    if rng.gen_bool(0.2) {
        // READ CAPACITY(16): the last LBA (capacities that overflow) and
        // the block length; REPORT LUNS: the list length and entries.
        let (opcode, offs): (u8, &[usize]) = if rng.gen_bool(0.6) {
            (0x9E, &[0, 1, 6, 7, 8, 9, 10, 11])
        } else {
            (0xA0, &[0, 1, 2, 3, 8, 9])
        };
        d.data.push(DataLie {
            opcode,
            nth: nth(rng),
            patches: (0..rng.gen_range(1..4))
                .map(|_| (pick(rng, offs), byte(rng, &[0, 0xFF])))
                .collect(),
        });
    }
    for _ in 0..rng.gen_range(0..3) {
        if rng.gen_bool(0.5) {
            let kind = match rng.gen_range(0..5) {
                0 => CqeKind::UcdOutside,
                1 => CqeKind::UcdMisaligned,
                2 => CqeKind::OtherQueue,
                3 => CqeKind::Replay,
                _ => CqeKind::Ocs(rng.gen_range(0..16)),
            };
            d.cqes.push(UfsCqeLie {
                nth: if rng.gen_bool(0.9) {
                    Some(rng.gen_range(0..4 * span))
                } else {
                    None
                },
                kind,
            });
        }
    }
    d
}

#[derive(Default)]
struct Outcome {
    /// Bring-up's or the queue pair's error, by variant.
    result: String,
    /// Commands delivered more than once.
    twice: Vec<u64>,
    /// What the IOMMU saw the device do to memory it could not reach.
    faults: Vec<mcqio_fixtures::IommuFault>,
    /// Completions the wrapper changed.
    lies: u64,
}

fn variant(e: &dyn std::fmt::Debug) -> String {
    format!("{e:?}")
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Register lies told once the controller is up: interrupt-status
/// floods (now and then a fatal bit), a controller that can no longer be
/// disabled, a legacy doorbell that never clears.
fn run_time_register_lies(rng: &mut SmallRng) -> UfsRegisterLies {
    let mut l = UfsRegisterLies::default();
    if rng.gen_bool(0.5) {
        l.is_flood = pick(rng, &[1 << 20, 1 << 0 | 1 << 2, 1 << 10, 1 << 16, 1 << 17]);
    }
    if rng.gen_bool(0.2) {
        l.hce = HceLie::NeverClears;
    }
    l.utrldbr_stuck = rng.gen_bool(0.1);
    l
}

/// `replay`: now and then the device posts the last entry of a queue once
/// more, as a stale completion.
fn run(seed: u64, replay: bool) -> Outcome {
    let mut rng = SmallRng::seed_from_u64(seed);
    let cfg = config(&mut rng);
    let mcq = cfg.mcq && rng.gen_bool(0.9);
    let queues = usize::from(cfg.queues);
    let regs = register_lies(&mut rng, &cfg);
    let dev = device_lies(&mut rng, 6);
    let h = HostileUfs::new(cfg, regs, dev).expect("hostile UFS");
    let faults = h.fake().faults();
    for f in [
        UfsFault::DropCompletion,
        UfsFault::Delay(Duration::from_millis(rng.gen_range(1..30))),
        UfsFault::DuplicateCompletion,
        UfsFault::StaleCompletion,
        UfsFault::Ocs(rng.gen_range(1..9)),
    ] {
        if rng.gen_bool(0.15) {
            faults.set_probability(f, rng.gen_range(0.05..0.4));
        }
    }
    let o = UfsOptions {
        mcq,
        queues: rng.gen_range(1..=3),
        depth: pick(&mut rng, &[1, 4, 16]),
        init_timeout: Duration::from_millis(20),
        close_timeout: Duration::from_millis(20),
        blocking_timeout: Duration::from_millis(30),
        ..UfsOptions::default()
    };
    let mut out = Outcome::default();
    let ctrl = match UfsController::new(Arc::clone(&h) as Arc<dyn Backend>, o) {
        Ok(c) => c,
        Err(e) => {
            out.result = format!("bring-up {}", variant(&e));
            if std::env::var("HOSTILE_DEBUG").is_ok() {
                eprintln!("seed {seed}: {e} / {h:?}");
            }
            settle(&h, &mut out);
            return out;
        }
    };
    let lus: Vec<(u8, u64, u32)> = ctrl
        .logical_units()
        .iter()
        .map(|l| (l.lun, l.blocks, l.block_len))
        .collect();
    if replay {
        // Failed commands and held ones: what a re-posted entry can hurt.
        let faults = h.fake().faults();
        faults.set_probability(UfsFault::Ocs(5), 0.3);
        faults.set_probability(UfsFault::Delay(Duration::from_millis(3)), 0.3);
    }
    // Half the runs: other lies from now on, for the I/O path.
    if rng.gen_bool(0.5) {
        h.set_device_lies(device_lies(&mut rng, 40));
        if rng.gen_bool(0.3) {
            h.set_register_lies(run_time_register_lies(&mut rng));
        }
    }
    let qopts = UfsQpairOptions {
        io_timeout: Some(Duration::from_millis(10)),
        timeout_policy: pick(
            &mut rng,
            &[
                TimeoutPolicy::Abort,
                TimeoutPolicy::Reset,
                TimeoutPolicy::ReportOnly,
            ],
        ),
        ..Default::default()
    };
    let mut qp = match ctrl.create_qpair_for::<DmaBuf>(qopts) {
        Ok(q) => q,
        Err(e) => {
            out.result = format!("create_qpair {}", variant(&e));
            drop(ctrl);
            settle(&h, &mut out);
            return out;
        }
    };
    let mut seen: HashMap<u64, u32> = HashMap::new();
    let deliver = |c: mcqio::Completion<DmaBuf>, seen: &mut HashMap<u64, u32>| {
        *seen.entry(c.tag).or_default() += 1;
        // The buffer is freed (unmapped) at once: a device that writes it
        // later faults in the IOMMU.
        drop(c.buf);
    };
    let mut submitted = Vec::new();
    let mut err = None;
    for tag in 0..rng.gen_range(1..24u64) {
        let (lun, blocks, len) = pick(&mut rng, &lus);
        let n = rng.gen_range(1..=4u32);
        let lba = rng.gen_range(0..blocks.max(1));
        let Ok(buf) = ctrl.alloc_buf(len as usize * n as usize, DmaDir::Bidirectional) else {
            break;
        };
        let r = if rng.gen() {
            qp.read(lun, lba, n, buf, tag)
        } else {
            qp.write(lun, lba, n, buf, tag)
        };
        if r.is_ok() {
            submitted.push(tag);
        }
        if replay && rng.gen_bool(0.5) {
            // This pair's queue, now and then another one.
            let q = match qp.hw_queue() {
                Some(q) if rng.gen_bool(0.8) => usize::from(q),
                _ => rng.gen_range(0..queues),
            };
            h.replay_last(q);
        }
        if rng.gen_bool(0.3) {
            qp.submit();
            h.poll();
            if let Err(e) = qp.poll(8, |c| deliver(c, &mut seen)) {
                err = Some(e);
                break;
            }
        }
    }
    qp.submit();
    let start = Instant::now();
    while qp.outstanding() > 0 && start.elapsed() < Duration::from_millis(60) && err.is_none() {
        h.poll();
        if let Err(e) = qp.poll(32, |c| deliver(c, &mut seen)) {
            err = Some(e);
        }
        std::thread::yield_now();
    }
    let mut v = vec![0u8; lus[0].2 as usize];
    let _ = qp.read_blocking(lus[0].0, 0, &mut v);
    let closed = qp.close(|c| deliver(c, &mut seen));
    out.twice = seen
        .iter()
        .filter(|(_, &n)| n > 1)
        .map(|(&t, _)| t)
        .collect();
    match (&closed, err) {
        (Ok(()), None) => {
            out.result = "ok".into();
            let missing: Vec<_> = submitted.iter().filter(|t| !seen.contains_key(t)).collect();
            assert!(
                missing.is_empty(),
                "seed {seed}: close succeeded but commands {missing:?} never ended"
            );
        }
        (Err(e), _) => out.result = format!("close {}", variant(e)),
        (Ok(()), Some(e)) => out.result = format!("poll {}", variant(&e)),
    }
    drop(ctrl);
    settle(&h, &mut out);
    out
}

/// Run the device until nothing it holds is left (delayed commands come
/// due): a buffer handed back early is written now, into unmapped memory.
fn settle(h: &HostileUfs, out: &mut Outcome) {
    let end = Instant::now() + Duration::from_millis(35);
    while Instant::now() < end {
        h.poll();
        std::thread::sleep(Duration::from_millis(2));
    }
    out.faults = h.fake().iommu().faults();
    out.lies = h.stats().lies;
}

#[test]
fn hostile_ufs_ends_in_typed_errors_and_never_hands_a_buffer_back_early() {
    seeds(false);
}

/// The same with stale entries re-posted at random while commands are in
/// flight.
#[test]
fn hostile_ufs_with_replayed_entries_never_hands_a_buffer_back_early() {
    seeds(true);
}

fn seeds(replay: bool) {
    let mut outcomes = BTreeMap::<String, u32>::new();
    let mut lies = 0;
    for seed in 0..SEEDS {
        let r = std::panic::catch_unwind(|| run(seed, replay));
        let o = match r {
            Ok(o) => o,
            Err(p) => panic!(
                "seed {seed}: panicked: {}",
                p.downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| p.downcast_ref::<&str>().copied())
                    .unwrap_or("?")
            ),
        };
        assert!(
            o.twice.is_empty(),
            "seed {seed}: delivered twice: {:?}",
            o.twice
        );
        assert!(
            o.faults.is_empty(),
            "seed {seed} ({}): the device touched unmapped memory (a buffer or queue freed while it could still reach it): {:?}",
            o.result,
            o.faults
        );
        *outcomes.entry(o.result).or_default() += 1;
        lies += o.lies;
    }
    eprintln!("outcomes over {SEEDS} seeds ({lies} completions lied about): {outcomes:?}");
    assert!(outcomes.get("ok").copied().unwrap_or(0) > 0, "{outcomes:?}");
    assert!(outcomes.len() > 3, "{outcomes:?}");
}
