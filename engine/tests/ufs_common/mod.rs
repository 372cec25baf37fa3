//! Shared set-up for the UFS transport tests: a fake UFS controller and
//! the engine's controller on top of it.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use mcqio::ufs::{UfsController, UfsOptions, UfsQueuePair};
use mcqio::vfio::{Backend, DmaDir};
use mcqio::{Completion, DmaBuf, IoBuf};
use mcqio_fixtures::ufs::{FakeUfs, LuConfig, UfsConfig};
use mcqio_fixtures::ExecMode;

pub fn sync_cfg(mcq: bool) -> UfsConfig {
    UfsConfig {
        exec: ExecMode::Sync,
        mcq,
        lus: vec![LuConfig::Ram { blocks: 4096 }],
        ..UfsConfig::default()
    }
}

pub fn threaded_cfg(mcq: bool, workers: usize) -> UfsConfig {
    UfsConfig {
        exec: ExecMode::Threaded {
            workers,
            pin_core: None,
        },
        mcq,
        lus: vec![LuConfig::Ram { blocks: 8192 }],
        ..UfsConfig::default()
    }
}

pub fn opts(queues: u16) -> UfsOptions {
    UfsOptions {
        queues,
        init_timeout: Duration::from_secs(5),
        close_timeout: Duration::from_millis(200),
        blocking_timeout: Duration::from_secs(10),
        ..UfsOptions::default()
    }
}

pub fn up(cfg: UfsConfig, o: UfsOptions) -> (Arc<FakeUfs>, Arc<UfsController>) {
    let fake = FakeUfs::new(cfg).expect("fake UFS");
    let backend: Arc<dyn Backend> = fake.clone();
    let ctrl = UfsController::new(backend, o).expect("bring-up");
    (fake, ctrl)
}

pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn buf_with(ctrl: &UfsController, data: &[u8]) -> DmaBuf {
    let mut b = ctrl.alloc_buf(data.len(), DmaDir::Bidirectional).unwrap();
    b.write_at(0, data).unwrap();
    b
}

/// Ring and poll until `n` completions arrived (bounded).
pub fn wait_n<B: IoBuf>(qp: &mut UfsQueuePair<B>, n: usize) -> Vec<Completion<B>> {
    qp.submit();
    let mut out = Vec::new();
    let start = Instant::now();
    while out.len() < n {
        qp.poll(64, |c| out.push(c)).expect("poll");
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "only {} of {n} completions",
            out.len()
        );
        std::thread::yield_now();
    }
    out
}
