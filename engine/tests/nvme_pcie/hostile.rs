//! A seeded hostile device: random lies in CAP, CSTS, the BAR length,
//! Identify data, the namespace list, Set Features replies and admin
//! completions, with faults in I/O completions on top (issue 12, item 13).
//! Whatever the device says, bring-up,
//! I/O and drop end — bounded by the engine's own timeouts — with `Ok` or a
//! typed error, never a panic, a hang or an access outside the BAR (the
//! hostile BAR has guard pages).

use std::sync::Arc;
use std::time::Duration;

use mcqio::{Controller, ControllerOptions, Error, QpairOptions, TimeoutPolicy};
use mcqio_fixtures::{
    CqeLie, CstsLie, DeviceLies, ExecMode, FakeConfig, FakeController, Fault, HostileBackend,
    NamespaceConfig, RegisterLies,
};
use mcqio_vfio::Backend;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const SEEDS: u64 = 256;

/// Identify Controller bytes the engine relies on: MDTS, OACS, AERL,
/// SQES, CQES, MAXCMD, NN, ONCS, VWC.
const ID_CTRL: &[usize] = &[
    77, 256, 257, 259, 512, 513, 514, 516, 517, 518, 519, 520, 525,
];
/// Identify Namespace bytes: NSZE, NLBAF, FLBAS, LBAF0..2.
const ID_NS: &[usize] = &[
    0, 1, 3, 5, 7, 8, 25, 26, 128, 129, 130, 131, 132, 134, 136, 138,
];

fn pick<T: Copy>(rng: &mut SmallRng, v: &[T]) -> T {
    v[rng.gen_range(0..v.len())]
}

fn config(rng: &mut SmallRng) -> FakeConfig {
    let nss = rng.gen_range(1..=2);
    FakeConfig {
        namespaces: (0..nss)
            .map(|_| NamespaceConfig::ram(1 << 20, pick(rng, &[512, 4096])))
            .collect(),
        io_queue_pairs: rng.gen_range(1..=4),
        mdts: rng.gen_range(0..=6),
        timeout_500ms_units: 1,
        shadow_doorbells: rng.gen_bool(0.3),
        exec: ExecMode::Sync,
        seed: rng.gen(),
        ..FakeConfig::default()
    }
}

fn register_lies(rng: &mut SmallRng, cfg: &FakeConfig) -> RegisterLies {
    let real_cap = FakeController::new(cfg.clone())
        .expect("fake")
        .regs()
        .read64(0);
    let cap = rng.gen_bool(0.3).then(|| {
        let mut cap = real_cap;
        if rng.gen_bool(0.5) {
            cap = cap & !(0xF << 32) | (rng.gen_range(0..16u64) << 32); // DSTRD
        }
        if rng.gen_bool(0.3) {
            cap = cap & !0xFFFF | rng.gen_range(0..64u64); // MQES
        }
        if rng.gen_bool(0.2) {
            cap = cap & !(0xF << 48) | (rng.gen_range(0..2u64) << 48); // MPSMIN
        }
        if rng.gen_bool(0.2) {
            cap ^= 1 << 37; // CSS: NVM
        }
        if rng.gen_bool(0.1) {
            cap = rng.gen();
        }
        // CAP.TO stays at 500 ms: it bounds every CSTS wait.
        cap & !(0xFF << 24) | 1 << 24
    });
    // Lies that make CSTS waits run to CAP.TO (500 ms each) are rare.
    let csts = match rng.gen_range(0..128) {
        0 => CstsLie::NeverReady,
        1 => CstsLie::ReadyStuck,
        2..=5 => CstsLie::Fatal,
        _ => CstsLie::Honest,
    };
    let bar_len = rng.gen_bool(0.1).then(|| rng.gen_range(1..=3usize) * 4096);
    RegisterLies { cap, csts, bar_len }
}

fn device_lies(rng: &mut SmallRng) -> DeviceLies {
    let patches = |rng: &mut SmallRng, offs: &[usize]| -> Vec<(usize, u8)> {
        (0..rng.gen_range(0..4))
            .map(|_| {
                let o = if rng.gen_bool(0.8) {
                    pick(rng, offs)
                } else {
                    rng.gen_range(0..4096)
                };
                (o, rng.gen())
            })
            .collect()
    };
    let active_namespaces = rng.gen_bool(0.25).then(|| {
        (0..rng.gen_range(0..8))
            .map(|_| match rng.gen_range(0..6) {
                0 => 0,
                1 => 0xFFFF_FFFE,
                2 => 0xFFFF_FFFF,
                3 => rng.gen(),
                _ => rng.gen_range(1..4),
            })
            .collect()
    });
    let admin_cqes = (0..rng.gen_range(0..3))
        .map(|_| CqeLie {
            nth: rng.gen_range(0..8),
            cid: rng.gen_bool(0.5).then(|| match rng.gen_range(0..3) {
                0 => 0xFF00 + rng.gen_range(0..8),
                1 => rng.gen_range(0..8),
                _ => rng.gen(),
            }),
            status: rng
                .gen_bool(0.5)
                .then(|| (rng.gen_range(0..8), rng.gen(), rng.gen())),
            dw0: rng.gen_bool(0.5).then(|| rng.gen()),
        })
        .collect();
    DeviceLies {
        identify_controller: patches(rng, ID_CTRL),
        identify_namespace: patches(rng, ID_NS),
        active_namespaces,
        number_of_queues: rng.gen_bool(0.2).then(|| rng.gen()),
        admin_cqes,
    }
}

/// Bring-up, some I/O and admin traffic, drop: everything ends.
fn run(seed: u64) -> Result<(), Error> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let cfg = config(&mut rng);
    let regs = register_lies(&mut rng, &cfg);
    let dev = device_lies(&mut rng);
    let b = HostileBackend::new(cfg, regs, dev).expect("hostile backend");
    if rng.gen_bool(0.1) {
        b.flood_stale_admin_cqes(rng.gen_range(1..5000));
    }
    // I/O completions lie too, now and then.
    let faults = b.fake().faults();
    for f in [
        Fault::CorruptCid,
        Fault::CidXor(rng.gen()),
        Fault::StealCid,
        Fault::DuplicateCqe,
        Fault::DropCompletion,
        Fault::Status {
            sct: rng.gen_range(0..8),
            sc: rng.gen(),
            dnr: rng.gen(),
        },
    ] {
        if rng.gen_bool(0.2) {
            faults.set_probability(f, rng.gen_range(0.05..0.5));
        }
    }
    let opts = ControllerOptions {
        admin_timeout: Duration::from_millis(10),
        admin_timeout_policy: pick(&mut rng, &[TimeoutPolicy::ReportOnly, TimeoutPolicy::Reset]),
        shutdown_timeout: Duration::from_millis(10),
        io_queues: rng.gen_range(1..=4),
        async_event_requests: rng.gen_range(0..4),
        shadow_doorbells: rng.gen(),
        ..ControllerOptions::default()
    };
    let ctrl = Controller::new(Arc::clone(&b) as Arc<dyn Backend>, opts)?;
    let nss: Vec<(u32, u64)> = ctrl
        .namespaces()
        .iter()
        .map(|n| (n.id, n.lba_size))
        .collect();
    let mut qp = ctrl.create_qpair(QpairOptions {
        depth: 16,
        blocking_timeout: Duration::from_millis(50),
        io_timeout: Some(Duration::from_millis(20)),
        timeout_policy: TimeoutPolicy::Reset,
        ..QpairOptions::default()
    })?;
    for (id, lba) in nss.into_iter().take(3) {
        let mut v = vec![0u8; lba.min(8192) as usize];
        let _ = qp.read_blocking(id, 0, &mut v);
        let _ = qp.write_blocking(id, 1, &v);
    }
    let _ = ctrl.admin_read(
        mcqio::nvme::spec::sqe::Command::sqe(&mcqio::nvme::spec::sqe::Identify::controller()),
        "Identify",
    );
    let _ = ctrl.async_events();
    drop(qp);
    drop(ctrl);
    b.flood_stale_admin_cqes(0);
    Ok(())
}

#[test]
fn hostile_identify_and_completions_end_in_typed_errors() {
    let mut outcomes = std::collections::BTreeMap::<String, u32>::new();
    for seed in 0..SEEDS {
        let r = std::panic::catch_unwind(|| run(seed));
        let key = match r {
            Ok(Ok(())) => "ok".to_string(),
            Ok(Err(e)) => format!("{e:?}")
                .split(|c: char| !c.is_alphanumeric())
                .next()
                .unwrap_or_default()
                .to_string(),
            Err(_) => panic!("seed {seed}: panicked"),
        };
        *outcomes.entry(key).or_default() += 1;
    }
    eprintln!("outcomes over {SEEDS} seeds: {outcomes:?}");
    // The lies are varied enough to reach both sides.
    assert!(outcomes.get("ok").copied().unwrap_or(0) > 0, "{outcomes:?}");
    assert!(outcomes.len() > 2, "{outcomes:?}");
}
