//! The arguments of the subcommands, shared where NVMe and UFS checks take
//! the same shape.

use super::*;

/// Which controller to test.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct DevArgs {
    /// `vfio:<BDF>` (a controller bound to vfio-pci) or `fake` (in-process fake controller).
    pub(crate) device: String,
    /// Do not use shadow doorbells (Doorbell Buffer Config) even if the controller offers them.
    #[arg(long)]
    pub(crate) no_shadow_doorbells: bool,
}

/// The shape of an `rw`/`ufs-rw` run, the same on NVMe and UFS.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct RwShape {
    /// Bytes to write and read back in total, over all threads.
    #[arg(long, default_value_t = 64 << 20)]
    pub(crate) bytes: u64,
    /// Threads, each with its own queue pair (default: one per CPU; UFS in
    /// legacy mode: 1).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Commands in flight per queue pair.
    #[arg(long, default_value_t = 8)]
    pub(crate) qd: usize,
    /// Smallest I/O in bytes (a multiple of 4 KiB).
    #[arg(long, default_value_t = 4 << 10)]
    pub(crate) min_io: u64,
    /// Largest I/O in bytes (a multiple of 4 KiB; capped at the queue pair's transfer limit).
    #[arg(long, default_value_t = 1 << 20)]
    pub(crate) max_io: u64,
    /// Seed for LBAs, sizes and data (default: from the clock).
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Buffers from a DMA mapping mode (premapped pool, strict, lazy:
    /// mapped per command through a `QueueMapper`) instead of the engine's
    /// DmaBufs.
    #[arg(long)]
    pub(crate) dma: Option<DmaMode>,
}

impl RwShape {
    /// The seed given, else one from the clock.
    pub(crate) fn seed(&self) -> u64 {
        self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
    }

    /// Check the sizes and the depth against a queue pair that moves at
    /// most `max_transfer` bytes per command and keeps at most `max_qd` in
    /// flight; returns the largest I/O to use.
    pub(crate) fn check(&self, max_transfer: u64, max_qd: usize) -> Result<u64, Failure> {
        let max_io = self.max_io.min(max_transfer);
        if self.min_io == 0 || self.min_io % 4096 != 0 || max_io % 4096 != 0 || max_io < self.min_io
        {
            return Err(format!(
                "I/O sizes {}..{} must be multiples of 4 KiB with min <= max (the queue pair allows up to {max_transfer} bytes)",
                self.min_io, self.max_io
            ));
        }
        if self.qd == 0 || self.qd > max_qd {
            return Err(format!("--qd must be 1..={max_qd}"));
        }
        Ok(max_io)
    }

    /// Each thread's extents over its own slice of a `size`-byte unit, and
    /// its random generator.
    pub(crate) fn plans(
        &self,
        seed: u64,
        threads: usize,
        size: u64,
        max_io: u64,
    ) -> Result<Vec<(Vec<Extent>, SmallRng)>, Failure> {
        let span = (size / threads as u64) & !((1 << 20) - 1);
        let per_thread = self.bytes.div_ceil(threads as u64);
        (0..threads)
            .map(|i| {
                let mut rng = SmallRng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9e37_79b9));
                make_extents(
                    &mut rng,
                    i as u64 * span,
                    span,
                    per_thread,
                    self.min_io,
                    max_io,
                )
                .map(|v| (v, rng))
            })
            .collect()
    }
}

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct RwArgs {
    #[command(flatten)]
    pub(crate) dev: DevArgs,
    #[command(flatten)]
    pub(crate) shape: RwShape,
    /// Vectored I/O: each command's buffer is a list of 4 KiB DmaBufs in
    /// shuffled IOVA order (one PRP entry per segment, none contiguous).
    #[arg(long)]
    pub(crate) vectored: bool,
}

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct MapBenchArgs {
    #[command(flatten)]
    pub(crate) dev: DevArgs,
    /// Seconds per row.
    #[arg(long, default_value_t = 0.5)]
    pub(crate) secs: f64,
    /// Threads, each with its own mapper (default: one per CPU).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
}

/// Which UFS host controller to test.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct UfsDevArgs {
    /// `vfio:<BDF>` (a UFS host controller bound to vfio-pci) or `fake-ufs`
    /// (the in-process fake UFS controller).
    pub(crate) device: String,
    /// Legacy single-doorbell mode (the 32-slot list) even when the
    /// controller offers MCQ.
    #[arg(long)]
    pub(crate) legacy: bool,
    /// Fail unless bring-up ends in this mode: `mcq` or `legacy`.
    #[arg(long)]
    pub(crate) expect: Option<String>,
}

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct UfsRwArgs {
    #[command(flatten)]
    pub(crate) dev: UfsDevArgs,
    #[command(flatten)]
    pub(crate) shape: RwShape,
    /// With `--dma strict|lazy`: the engine's own wrapper maps at
    /// submission and unmaps before it hands a buffer back
    /// (`UfsController::create_mapped_qpair`, application buffers), instead
    /// of this program driving a `QueueMapper`.
    #[arg(long, requires = "dma")]
    pub(crate) engine_mapped: bool,
}

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct UfsPatternArgs {
    #[command(flatten)]
    pub(crate) dev: UfsDevArgs,
    #[command(flatten)]
    pub(crate) region: PatternArgs,
}

/// A pattern region: which seed, where on the namespace, how long.
#[derive(clap::Args, Debug, Clone, Copy)]
pub(crate) struct PatternArgs {
    /// Seed of the pattern (any 64-bit value).
    #[arg(long)]
    pub(crate) seed: u64,
    /// Byte offset on namespace 1 (a multiple of the LBA size).
    #[arg(long)]
    pub(crate) offset: u64,
    /// Length in bytes (a multiple of the LBA size).
    #[arg(long)]
    pub(crate) len: u64,
}

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct DevPatternArgs {
    #[command(flatten)]
    pub(crate) dev: DevArgs,
    #[command(flatten)]
    pub(crate) region: PatternArgs,
}
