//! Quick engine-overhead check: 4 KiB reads at a fixed queue depth against
//! the fake controller's null namespace, next to io_uring NOPs at the same
//! depth on this machine. Not a benchmark suite (see mcqio-perf); a sanity
//! check of the hot path while developing.
//!
//! ```text
//! cargo run --release -p mcqio --example qd_bench -- [sync|threaded|loopback] [QD] [SECONDS] [--engine-only|--uring-only]
//! ```
//!
//! `loopback` replaces the fake with a stub that completes every command at
//! once without parsing it (see `loopback.rs`): the engine's own cost.
//!
//! ```text
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use mcqio::vfio::{Backend, DmaDir};
use mcqio::{Controller, ControllerOptions, QpairOptions};
use mcqio_fixtures::{ExecMode, FakeConfig, FakeController, NamespaceConfig};

mod loopback;

fn engine(exec: Option<ExecMode>, qd: usize, secs: f64) -> f64 {
    let backend: Arc<dyn Backend> = match exec {
        Some(exec) => FakeController::new(FakeConfig {
            namespaces: vec![NamespaceConfig::null(1 << 40, 512)],
            exec,
            ..FakeConfig::default()
        })
        .unwrap(),
        None => loopback::Loopback::new(),
    };
    let ctrl = Controller::new(backend, ControllerOptions::default()).unwrap();
    let mut qp = ctrl
        .create_qpair(QpairOptions {
            depth: qd as u16,
            ..Default::default()
        })
        .unwrap();
    let mut bufs = ctrl
        .alloc_buf(qd * 4096, DmaDir::Bidirectional)
        .unwrap()
        .chunks(4096)
        .unwrap();
    let mut lba = 0u64;
    let mut n = 0u64;
    let start = Instant::now();
    let dur = Duration::from_secs_f64(secs);
    let mut free = Vec::with_capacity(qd);
    loop {
        for b in bufs.drain(..) {
            qp.read(1, lba, 8, b, lba).unwrap();
            lba = (lba + 8) & ((1 << 30) - 1);
        }
        qp.poll(qd, |c| {
            free.push(c.buf.unwrap());
        })
        .unwrap();
        n += free.len() as u64;
        std::mem::swap(&mut bufs, &mut free);
        if n & 0xFFF < qd as u64 && start.elapsed() >= dur {
            break;
        }
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn uring_nops(qd: usize, secs: f64) -> f64 {
    use io_uring::{opcode, IoUring};
    let mut ring = IoUring::new(qd as u32 * 2).unwrap();
    let start = Instant::now();
    let dur = Duration::from_secs_f64(secs);
    let mut n = 0u64;
    let mut inflight = 0usize;
    loop {
        {
            let mut sq = ring.submission();
            while inflight < qd {
                let e = opcode::Nop::new().build().user_data(n);
                // SAFETY: a NOP references no memory.
                unsafe { sq.push(&e).unwrap() };
                inflight += 1;
            }
        }
        ring.submit_and_wait(1).unwrap();
        for _ in ring.completion() {
            inflight -= 1;
            n += 1;
        }
        if n & 0xFFF < qd as u64 && start.elapsed() >= dur {
            break;
        }
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("sync");
    let qd: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(128);
    let secs: f64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(2.0);
    // The threaded fake's worker is pinned to core 1; keep this thread off it.
    if let Some(c) = core_affinity::get_core_ids().and_then(|v| v.into_iter().next()) {
        core_affinity::set_for_current(c);
    }
    let exec = match mode {
        "threaded" => Some(ExecMode::Threaded {
            workers: 1,
            pin_core: Some(1),
        }),
        "loopback" => None,
        _ => Some(ExecMode::Sync),
    };
    if args.iter().any(|a| a == "--uring-only") {
        let u = uring_nops(qd, secs);
        println!("QD{qd}: io_uring NOPs {:.2} M/s", u / 1e6);
        return;
    }
    let e = engine(exec, qd, secs);
    if args.iter().any(|a| a == "--engine-only") {
        println!("QD{qd} {mode}: mcqio null reads {:.2} M/s", e / 1e6);
        return;
    }
    let u = uring_nops(qd, secs);
    println!(
        "QD{qd} {mode}: mcqio null reads {:.2} M/s, io_uring NOPs {:.2} M/s, ratio {:.2}",
        e / 1e6,
        u / 1e6,
        e / u
    );
}
