//! Shared helpers for the engine's tests against the fake controller.
#![allow(dead_code)]

use std::sync::Arc;

use mcqio::{Controller, ControllerOptions, DmaBuf};
use mcqio_fixtures::{ExecMode, FakeConfig, FakeController, NamespaceConfig};
use mcqio_vfio::{Backend, DmaDir};
use rand::{Rng, SeedableRng};

/// Both execution modes of the fake, for tests that must hold in each.
pub fn modes() -> [ExecMode; 2] {
    [
        ExecMode::Sync,
        ExecMode::Threaded {
            workers: 1,
            pin_core: None,
        },
    ]
}

/// Two RAM namespaces (512 B and 4 KiB blocks), `mdts` as given.
pub fn config(exec: ExecMode, mdts: u8) -> FakeConfig {
    FakeConfig {
        namespaces: vec![
            NamespaceConfig::ram(64 << 20, 512),
            NamespaceConfig::ram(16 << 20, 4096),
        ],
        io_queue_pairs: 8,
        mdts,
        exec,
        ..FakeConfig::default()
    }
}

pub fn open(cfg: FakeConfig) -> (Arc<FakeController>, Arc<Controller>) {
    open_with(cfg, ControllerOptions::default())
}

pub fn open_with(
    cfg: FakeConfig,
    opts: ControllerOptions,
) -> (Arc<FakeController>, Arc<Controller>) {
    let fake = FakeController::new(cfg).expect("fake controller");
    let backend: Arc<dyn Backend> = fake.clone();
    let ctrl = Controller::new(backend, opts).expect("controller bring-up");
    (fake, ctrl)
}

pub fn rng(seed: u64) -> rand::rngs::SmallRng {
    rand::rngs::SmallRng::seed_from_u64(seed)
}

pub fn random_bytes(rng: &mut impl Rng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

pub fn buf(ctrl: &Controller, len: usize) -> DmaBuf {
    ctrl.alloc_buf(len, DmaDir::Bidirectional)
        .expect("dma buffer")
}

/// Poll until `n` completions arrived, collecting them.
pub fn wait_n<B: mcqio::IoBuf>(
    qp: &mut mcqio::QueuePair<B>,
    n: usize,
) -> Vec<mcqio::Completion<B>> {
    let mut out = Vec::with_capacity(n);
    let mut spins = 0u64;
    while out.len() < n {
        qp.poll(usize::MAX, |c| out.push(c)).expect("poll");
        spins += 1;
        if spins % 64 == 0 {
            std::thread::yield_now();
        }
        assert!(
            spins < 50_000_000,
            "completions did not arrive ({} of {n})",
            out.len()
        );
    }
    out
}
