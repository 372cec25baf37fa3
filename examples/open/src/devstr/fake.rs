//! The fakes a `fake` or `fake-ufs` spec describes, from the one set of
//! defaults (the library's, see the module docs of [`super`]).

use mcqio_fixtures::ufs::{
    FtlConfig, LuConfig, ModelClock, UfsConfig, BLOCK_SIZE as UFS_BLOCK_SIZE,
};
use mcqio_fixtures::{FakeConfig, NamespaceConfig};

use super::{DeviceKind, DeviceSpec, FAKE_BLOCK_SIZE, FAKE_NULL_SIZE, FAKE_SIZE};

impl DeviceSpec {
    /// The fake controller this spec describes, from the one set of defaults
    /// (the library's [`FakeConfig::default`]; see the module docs). Run-specific
    /// settings (queue pairs, queue sizes, threads, fault seeds) are the
    /// caller's to add. `None` if the spec is not a `fake`.
    pub fn fake_config(&self) -> Option<FakeConfig> {
        let DeviceKind::Fake { null } = self.kind else {
            return None;
        };
        let o = &self.opts;
        let base = FakeConfig::default();
        let lbs = o.block_size.unwrap_or(FAKE_BLOCK_SIZE);
        let size = o
            .size
            .unwrap_or(if null { FAKE_NULL_SIZE } else { FAKE_SIZE });
        // Whole blocks only; at least one.
        let size = (size / lbs as u64).max(1) * lbs as u64;
        let ns = |_| {
            if null {
                NamespaceConfig::null(size, lbs)
            } else {
                NamespaceConfig::ram(size, lbs)
            }
        };
        let mut cfg = FakeConfig {
            namespaces: (0..o.ns.unwrap_or(1)).map(ns).collect(),
            latency: o.latency.unwrap_or(base.latency),
            ..base
        };
        if let Some(q) = o.qpairs {
            cfg.io_queue_pairs = q;
        }
        if o.sync == Some(true) {
            cfg.exec = mcqio_fixtures::ExecMode::Sync;
        }
        Some(cfg)
    }

    /// The fake UFS controller this spec describes: `lus` LUs (default 1)
    /// of `size` bytes each (default [`FAKE_SIZE`], or [`FAKE_NULL_SIZE`]
    /// advertised for `fake-ufs:null`) in 4 KiB blocks, MCQ advertised
    /// unless `mcq=off`, `queues` MCQ queues (default: the library's), the
    /// `latency` and `sync` options. `None` if the spec is not a `fake-ufs`.
    /// Run-specific settings (queue depth, device thread core) are the
    /// caller's to add.
    pub fn fake_ufs_config(&self) -> Option<UfsConfig> {
        let DeviceKind::FakeUfs { null } = self.kind else {
            return None;
        };
        let o = &self.opts;
        let base = UfsConfig::default();
        let size = o
            .size
            .unwrap_or(if null { FAKE_NULL_SIZE } else { FAKE_SIZE })
            .max(u64::from(UFS_BLOCK_SIZE));
        let lu = if null {
            LuConfig::null_bytes(size)
        } else {
            LuConfig::ram_bytes(size)
        };
        let mut cfg = UfsConfig {
            lus: vec![lu; usize::from(o.lus.unwrap_or(1))],
            mcq: o.mcq.unwrap_or(true),
            latency: o.latency.unwrap_or(base.latency),
            ..base
        };
        if let Some(q) = o.queues {
            cfg.queues = q;
        }
        if o.sync == Some(true) {
            cfg.exec = mcqio_fixtures::ExecMode::Sync;
        }
        if o.nand_read.is_some() || o.nand_prog.is_some() || o.nand_units.is_some() {
            // The flash cost model in wall-clock time: throughput comes
            // from tR/tPROG and the NAND units, not from host CPU speed.
            let d = FtlConfig::default();
            cfg.ftl = Some(FtlConfig {
                t_read: o.nand_read.unwrap_or(d.t_read),
                t_prog: o.nand_prog.unwrap_or(d.t_prog),
                dies: o.nand_units.unwrap_or(d.dies),
                clock: ModelClock::Wall,
                ..d
            });
        }
        Some(cfg)
    }
}
