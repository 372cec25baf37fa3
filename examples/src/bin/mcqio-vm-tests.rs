//! mcqio-vm-tests: the guest side of `fixtures/vm/run-tests.sh`.
//!
//! Runs inside the throw-away QEMU guest against QEMU's NVMe controller
//! through VFIO and the emulated Intel IOMMU (`vfio:<BDF>`); every
//! subcommand also accepts `fake` (the in-process fake controller) so the
//! checks themselves can be exercised on any host. Each subcommand is one
//! check that `fixtures/vm/guest/vm-tests.sh` calls; it exits non-zero with a
//! message saying what differed when the check fails.
//!
//! The cross-check data is a positional pattern ([`pattern`]): the bytes at
//! namespace offset `o` depend only on the seed and `o`, so data that lands
//! at the wrong LBA is caught as surely as corrupted data, and the kernel
//! side can compare with `cmp` against `gen-pattern`'s output.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use mcqio::core::block::BlockQueue;
use mcqio::nvme::spec::sqe::Command as _;
use mcqio::vfio::{
    AppBuffer, Backend, DmaDir, DmaMapper, DmaMode, IoBuffer, Mapped, MapperConfig, PoolConfig,
    QueueMapper, Returned, VfioBackend,
};
use mcqio::{Controller, ControllerOptions, DmaBuf, IoBuf, QpairOptions, QueuePair};
use mcqio_fixtures::{FakeConfig, FakeController, NamespaceConfig};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// The guest test program of the mcqio VM harness.
#[derive(Parser, Debug)]
#[command(
    name = "mcqio-vm-tests",
    version,
    about = "The guest side of mcqio's VM harness: one check per subcommand, on vfio:<BDF> or a fake"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Bring the controller up and print its identity (model, serial, limits, namespaces).
    Identify(DevArgs),
    /// Write, read back and verify data at random LBAs and sizes, one queue pair per thread.
    Rw(RwArgs),
    /// Flush, Write Zeroes and Dataset Management (deallocate), each checked by reading back.
    Commands(DevArgs),
    /// Reset the controller with reads in flight; every read completes or is
    /// aborted, and the same queue pair works afterwards.
    Reset(DevArgs),
    /// Show that the IOMMU stops the device writing to a buffer after it was unmapped.
    DmaAfterUnmap(DevArgs),
    /// Map → touch → unmap throughput of each DMA mode on the device's IOMMU (issue 6's table).
    MapBench(MapBenchArgs),
    /// Write the cross-check pattern to a byte range of namespace 1.
    WritePattern(DevPatternArgs),
    /// Read a byte range of namespace 1 and compare it with the cross-check pattern.
    CheckPattern(DevPatternArgs),
    /// Print the cross-check pattern for a byte range to stdout (no device needed).
    GenPattern(PatternArgs),
    /// UFS: bring the host controller and its device up, print what it
    /// reports, and check the transfer mode (MCQ or legacy) it ended in.
    UfsBringup(UfsDevArgs),
    /// UFS: write, read back and verify data at random LBAs and sizes of
    /// LU 0, one queue pair (an MCQ SQ/CQ pair) per thread.
    UfsRw(UfsRwArgs),
    /// UFS: show that the IOMMU stops the controller writing to a buffer
    /// after it was unmapped (the device reports success; the data decides).
    UfsDmaAfterUnmap(UfsDevArgs),
    /// UFS: abort commands right after submitting them: each completes exactly
    /// once, aborted or with correct data, and the queue pair works afterwards.
    UfsAbort(UfsDevArgs),
    /// UFS: host controller reset with I/O in flight on every queue pair:
    /// each command completes exactly once (with its data, or aborted by the
    /// reset with its buffer), the queue pairs re-create their hardware
    /// queues, and every block reads back right afterwards.
    UfsReset(UfsDevArgs),
    /// UFS: write the cross-check pattern to a byte range of LU 0.
    UfsWritePattern(UfsPatternArgs),
    /// UFS: read a byte range of LU 0 and compare it with the cross-check pattern.
    UfsCheckPattern(UfsPatternArgs),
}

/// Which controller to test.
#[derive(clap::Args, Debug, Clone)]
struct DevArgs {
    /// `vfio:<BDF>` (a controller bound to vfio-pci) or `fake` (in-process fake controller).
    device: String,
    /// Do not use shadow doorbells (Doorbell Buffer Config) even if the controller offers them.
    #[arg(long)]
    no_shadow_doorbells: bool,
}

/// The shape of an `rw`/`ufs-rw` run, the same on both transports.
#[derive(clap::Args, Debug, Clone)]
struct RwShape {
    /// Bytes to write and read back in total, over all threads.
    #[arg(long, default_value_t = 64 << 20)]
    bytes: u64,
    /// Threads, each with its own queue pair (default: one per CPU; UFS in
    /// legacy mode: 1).
    #[arg(long)]
    threads: Option<usize>,
    /// Commands in flight per queue pair.
    #[arg(long, default_value_t = 8)]
    qd: usize,
    /// Smallest I/O in bytes (a multiple of 4 KiB).
    #[arg(long, default_value_t = 4 << 10)]
    min_io: u64,
    /// Largest I/O in bytes (a multiple of 4 KiB; capped at the queue pair's transfer limit).
    #[arg(long, default_value_t = 1 << 20)]
    max_io: u64,
    /// Seed for LBAs, sizes and data (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// Buffers from a DMA mapping mode (premapped pool, strict, lazy:
    /// mapped per command through a `QueueMapper`) instead of the engine's
    /// DmaBufs.
    #[arg(long)]
    dma: Option<DmaMode>,
}

impl RwShape {
    /// The seed given, else one from the clock.
    fn seed(&self) -> u64 {
        self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
    }

    /// Check the sizes and the depth against a queue pair that moves at
    /// most `max_transfer` bytes per command and keeps at most `max_qd` in
    /// flight; returns the largest I/O to use.
    fn check(&self, max_transfer: u64, max_qd: usize) -> Result<u64, Failure> {
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
    fn plans(
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
struct RwArgs {
    #[command(flatten)]
    dev: DevArgs,
    #[command(flatten)]
    shape: RwShape,
    /// Vectored I/O: each command's buffer is a list of 4 KiB DmaBufs in
    /// shuffled IOVA order (one PRP entry per segment, none contiguous).
    #[arg(long)]
    vectored: bool,
}

#[derive(clap::Args, Debug, Clone)]
struct MapBenchArgs {
    #[command(flatten)]
    dev: DevArgs,
    /// Seconds per row.
    #[arg(long, default_value_t = 0.5)]
    secs: f64,
    /// Threads, each with its own mapper (default: one per CPU).
    #[arg(long)]
    threads: Option<usize>,
}

/// Which UFS host controller to test.
#[derive(clap::Args, Debug, Clone)]
struct UfsDevArgs {
    /// `vfio:<BDF>` (a UFS host controller bound to vfio-pci) or `fake-ufs`
    /// (the in-process fake UFS controller).
    device: String,
    /// Legacy single-doorbell mode (the 32-slot list) even when the
    /// controller offers MCQ.
    #[arg(long)]
    legacy: bool,
    /// Fail unless bring-up ends in this mode: `mcq` or `legacy`.
    #[arg(long)]
    expect: Option<String>,
}

#[derive(clap::Args, Debug, Clone)]
struct UfsRwArgs {
    #[command(flatten)]
    dev: UfsDevArgs,
    #[command(flatten)]
    shape: RwShape,
    /// With `--dma strict|lazy`: the engine's own wrapper maps at
    /// submission and unmaps before it hands a buffer back
    /// (`UfsController::create_mapped_qpair`, application buffers), instead
    /// of this program driving a `QueueMapper`.
    #[arg(long, requires = "dma")]
    engine_mapped: bool,
}

#[derive(clap::Args, Debug, Clone)]
struct UfsPatternArgs {
    #[command(flatten)]
    dev: UfsDevArgs,
    #[command(flatten)]
    region: PatternArgs,
}

/// A pattern region: which seed, where on the namespace, how long.
#[derive(clap::Args, Debug, Clone, Copy)]
struct PatternArgs {
    /// Seed of the pattern (any 64-bit value).
    #[arg(long)]
    seed: u64,
    /// Byte offset on namespace 1 (a multiple of the LBA size).
    #[arg(long)]
    offset: u64,
    /// Length in bytes (a multiple of the LBA size).
    #[arg(long)]
    len: u64,
}

#[derive(clap::Args, Debug, Clone)]
struct DevPatternArgs {
    #[command(flatten)]
    dev: DevArgs,
    #[command(flatten)]
    region: PatternArgs,
}

/// Deterministic test data shared by the mcqio and the kernel side.
mod pattern {
    /// Bytes per pattern word.
    pub const WORD: u64 = 8;

    /// SplitMix64's finaliser: a bijective 64-bit mixer, so neighbouring words
    /// and neighbouring seeds give unrelated values.
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The word stored at absolute byte offset `offset` (a multiple of
    /// [`WORD`]). It depends on the position, so data landing at the wrong
    /// LBA is caught as surely as corrupted data.
    pub fn word(seed: u64, offset: u64) -> u64 {
        mix(mix(seed) ^ (offset / WORD))
    }

    /// Fill `buf` with the pattern of the region starting at byte `offset`.
    pub fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
        for (i, chunk) in buf.chunks_exact_mut(WORD as usize).enumerate() {
            let w = word(seed, offset + i as u64 * WORD);
            chunk.copy_from_slice(&w.to_le_bytes());
        }
    }

    /// The first word of `buf` that differs from the pattern, as
    /// (byte offset on the namespace, expected, found).
    pub fn first_mismatch(seed: u64, offset: u64, buf: &[u8]) -> Option<(u64, u64, u64)> {
        buf.chunks_exact(WORD as usize)
            .enumerate()
            .find_map(|(i, chunk)| {
                let at = offset + i as u64 * WORD;
                let want = word(seed, at);
                let got = u64::from_le_bytes(chunk.try_into().expect("chunk of WORD bytes"));
                (want != got).then_some((at, want, got))
            })
    }
}

/// Why a check failed; printed as the process's last line.
type Failure = String;

/// Turn any displayable error into a [`Failure`] with context.
fn ctx<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> Failure + '_ {
    move |e| format!("{what}: {e}")
}

/// Namespace 1, the one every check uses.
const NSID: u32 = 1;
/// Bound on waiting for any single command in these checks.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// A byte no read ever returns by accident: buffers are poisoned with it
/// before reads, so a read whose DMA never happened cannot pass.
const POISON: u8 = 0xA5;

// ------------------------------------------------------------------ device

/// Open the device and bring the controller up.
fn open(a: &DevArgs) -> Result<Arc<Controller>, Failure> {
    let dev = a.device.as_str();
    let backend: Arc<dyn Backend> = if dev == "fake" {
        let cfg = FakeConfig {
            namespaces: vec![NamespaceConfig::ram(256 << 20, 512)],
            io_queue_pairs: 8,
            shadow_doorbells: true,
            ..FakeConfig::default()
        };
        FakeController::new(cfg).map_err(ctx("fake controller"))?
    } else if let Some(bdf) = dev.strip_prefix("vfio:") {
        Arc::new(VfioBackend::open(bdf).map_err(ctx(dev))?)
    } else {
        return Err(format!("unknown device {dev:?}: use vfio:<BDF> or fake"));
    };
    let opts = ControllerOptions {
        shadow_doorbells: !a.no_shadow_doorbells,
        ..ControllerOptions::default()
    };
    Controller::new(backend, opts).map_err(ctx("controller bring-up"))
}

/// Namespace 1's block size (log2) and size in bytes.
fn ns1(ctrl: &Controller) -> Result<(u32, u64), Failure> {
    let ns = ctrl.namespace(NSID).ok_or_else(|| {
        format!(
            "namespace {NSID} is not active on {}",
            ctrl.backend().name()
        )
    })?;
    Ok((ns.lba_shift, ns.size_bytes()))
}

/// Check that `[offset, offset+len)` is block-aligned and inside namespace 1.
fn check_range(ctrl: &Controller, offset: u64, len: u64) -> Result<u32, Failure> {
    let (shift, size) = ns1(ctrl)?;
    let mask = (1u64 << shift) - 1;
    if len == 0 || offset & mask != 0 || len & mask != 0 {
        return Err(format!(
            "offset {offset} and length {len} must be non-zero multiples of the {}-byte LBA size",
            1u64 << shift
        ));
    }
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(format!(
            "range {offset}+{len} is past the end of namespace {NSID} ({size} bytes)"
        ));
    }
    Ok(shift)
}

/// Poll until the command with `tag` completes (a queue with nothing else
/// in flight); NVMe and UFS alike.
fn wait_tag<Q: BlockQueue>(
    qp: &mut Q,
    tag: u64,
    what: &str,
) -> Result<mcqio::Completion<Q::Buf>, Failure> {
    qp.submit();
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    loop {
        let mut done = None;
        qp.poll(1, |c| done = Some(c)).map_err(ctx(what))?;
        match done {
            Some(c) if c.tag == tag => return Ok(c),
            Some(c) => return Err(format!("{what}: completion for unexpected tag {}", c.tag)),
            None if Instant::now() > deadline => {
                return Err(format!("{what}: no completion within {COMMAND_TIMEOUT:?}"))
            }
            None => std::thread::yield_now(),
        }
    }
}

// ------------------------------------------------------------------ identify

fn identify(a: &DevArgs) -> Result<(), Failure> {
    let ctrl = open(a)?;
    let id = ctrl.identify();
    let cap = ctrl.cap();
    let vs = ctrl.version();
    println!("device:      {}", ctrl.backend().name());
    println!("model:       '{}'", id.model);
    println!("serial:      '{}'", id.serial);
    println!("firmware:    '{}'", id.firmware);
    println!("vendor:      {:#06x}", id.vid);
    println!(
        "version:     NVMe {}.{}.{}",
        vs.major(),
        vs.minor(),
        vs.tertiary()
    );
    println!(
        "CAP:         MQES {} entries, DSTRD {}, TO {} ms, MPS {}..{} KiB",
        cap.max_queue_entries(),
        cap.dstrd(),
        cap.timeout_ms(),
        (1u64 << cap.mps_min_shift()) >> 10,
        (1u64 << cap.mps_max_shift()) >> 10
    );
    println!(
        "limits:      MDTS {} (max transfer {} KiB), ONCS {:#06x}, OACS {:#06x}, VWC {}",
        id.mdts,
        ctrl.max_transfer() >> 10,
        id.oncs,
        id.oacs,
        id.vwc
    );
    println!(
        "queues:      {} I/O queue pairs granted, shadow doorbells {}",
        ctrl.granted_io_queues(),
        if ctrl.shadow_doorbells() { "on" } else { "off" }
    );
    for ns in ctrl.namespaces() {
        println!(
            "namespace {}: {} blocks of {} B ({} MiB)",
            ns.id,
            ns.nsze,
            ns.lba_size,
            ns.size_bytes() >> 20
        );
    }
    if id.model.trim().is_empty() {
        return Err("Identify Controller returned an empty model number".into());
    }
    ns1(&ctrl).map(drop)
}

// ------------------------------------------------------------------ rw

/// One command of the rw check: a byte range of namespace 1.
#[derive(Copy, Clone, Debug)]
struct Extent {
    offset: u64,
    len: u64,
}

/// Non-overlapping extents with random sizes in `[min, max]` (4 KiB steps)
/// and random gaps, inside `[base, base + span)`, totalling at least `want`
/// bytes.
fn make_extents(
    rng: &mut SmallRng,
    base: u64,
    span: u64,
    want: u64,
    min: u64,
    max: u64,
) -> Result<Vec<Extent>, Failure> {
    const STEP: u64 = 4096;
    let mut v = Vec::new();
    let (mut at, mut total) = (base, 0);
    // Average gap of a quarter of the average size keeps ~80% of the span usable.
    let max_gap = (min + max) / 4 / STEP;
    while total < want {
        at += rng.gen_range(0..=max_gap) * STEP;
        let len = rng.gen_range(min / STEP..=max / STEP) * STEP;
        if at + len > base + span {
            return Err(format!(
                "cannot place {want} bytes of I/O in a {span}-byte slice; lower --bytes or --threads"
            ));
        }
        v.push(Extent { offset: at, len });
        at += len;
        total += len;
    }
    Ok(v)
}

/// Where a worker's buffers come from: the engine's own [`DmaBuf`]s, or one
/// of the DMA mapping modes. A buffer is taken for each command and handed
/// back at completion; the lane reports when its data may be looked at.
trait Lane {
    /// What the queue pair moves (an `IoBuf`, or an application buffer
    /// the engine maps itself).
    type B;
    /// A free buffer holding `data` (writes) or poisoned (reads), ready to
    /// submit for a `len`-byte transfer; `None` while every buffer is busy.
    fn take(
        &mut self,
        tag: u64,
        len: usize,
        data: Option<&[u8]>,
    ) -> Result<Option<Self::B>, Failure>;
    /// The buffer of the completed command `tag`. Buffers the device can no
    /// longer reach (this one, or in lazy mode a batch, later) are reported
    /// through `done(tag, contents)`.
    fn give(
        &mut self,
        b: Self::B,
        tag: u64,
        done: &mut dyn FnMut(u64, &[u8]),
    ) -> Result<(), Failure>;
    /// Called on every reaping pass (lazy mode flushes on a timer here).
    /// Lanes that defer nothing have nothing to do.
    fn tick(&mut self, _done: &mut dyn FnMut(u64, &[u8])) -> Result<(), Failure> {
        Ok(())
    }
    /// Force every deferred release (end of a phase).
    fn drain(&mut self, _done: &mut dyn FnMut(u64, &[u8])) -> Result<(), Failure> {
        Ok(())
    }
    /// One line about the lane's mapping work.
    fn describe(&self) -> String;
}

/// Buffers are [`DmaBuf`]s mapped once.
struct DmaBufLane {
    free: Vec<DmaBuf>,
    lens: HashMap<u64, usize>,
    scratch: Vec<u8>,
}

impl DmaBufLane {
    fn new(ctrl: &Controller, count: usize, size: usize) -> Result<Self, Failure> {
        let free = (0..count)
            .map(|_| ctrl.alloc_buf(size, DmaDir::Bidirectional))
            .collect::<Result<_, _>>()
            .map_err(ctx("allocating DMA buffers"))?;
        Ok(Self {
            free,
            lens: HashMap::new(),
            scratch: vec![0; size],
        })
    }
}

impl Lane for DmaBufLane {
    type B = DmaBuf;
    fn take(
        &mut self,
        tag: u64,
        len: usize,
        data: Option<&[u8]>,
    ) -> Result<Option<DmaBuf>, Failure> {
        let Some(mut b) = self.free.pop() else {
            return Ok(None);
        };
        match data {
            Some(d) => b.write_at(0, d).map_err(ctx("filling a buffer"))?,
            None => b.fill(POISON),
        }
        self.lens.insert(tag, len);
        Ok(Some(b))
    }
    fn give(
        &mut self,
        b: DmaBuf,
        tag: u64,
        done: &mut dyn FnMut(u64, &[u8]),
    ) -> Result<(), Failure> {
        // Mapped once: the data may be looked at as soon as the command completed.
        let len = self.lens.remove(&tag).unwrap_or(0);
        let data = &mut self.scratch[..len];
        b.read_at(0, data).map_err(ctx("reading a buffer"))?;
        done(tag, data);
        self.free.push(b);
        Ok(())
    }
    fn describe(&self) -> String {
        format!("{} DmaBufs mapped once", self.free.len())
    }
}

/// Application buffers the engine's `MappedQueuePair` maps and unmaps:
/// a buffer it hands back is no longer reachable by the device, so its
/// data may be looked at at once.
struct AppLane {
    free: Vec<AppBuffer>,
    lens: HashMap<u64, usize>,
    mode: DmaMode,
}

impl AppLane {
    fn new(
        dma: &Arc<mcqio::vfio::DmaSpace>,
        mode: DmaMode,
        count: usize,
        size: usize,
    ) -> Result<Self, Failure> {
        let free = (0..count)
            .map(|_| AppBuffer::for_space(dma, size))
            .collect::<Result<_, _>>()
            .map_err(ctx("allocating application buffers"))?;
        Ok(Self {
            free,
            lens: HashMap::new(),
            mode,
        })
    }
}

impl Lane for AppLane {
    type B = AppBuffer;
    fn take(
        &mut self,
        tag: u64,
        len: usize,
        data: Option<&[u8]>,
    ) -> Result<Option<AppBuffer>, Failure> {
        let Some(mut b) = self.free.pop() else {
            return Ok(None);
        };
        match data {
            Some(d) => b.as_mut_slice()[..d.len()].copy_from_slice(d),
            None => b.as_mut_slice()[..len].fill(POISON),
        }
        self.lens.insert(tag, len);
        Ok(Some(b))
    }
    fn give(
        &mut self,
        b: AppBuffer,
        tag: u64,
        done: &mut dyn FnMut(u64, &[u8]),
    ) -> Result<(), Failure> {
        let len = self.lens.remove(&tag).unwrap_or(0);
        done(tag, &b.as_slice()[..len]);
        self.free.push(b);
        Ok(())
    }
    fn describe(&self) -> String {
        format!(
            "{} application buffers, mapped by the engine's MappedQueuePair ({})",
            self.free.len(),
            self.mode
        )
    }
}

/// Buffers go through a [`QueueMapper`] (premapped pool, strict or lazy).
struct MapperLane {
    mapper: QueueMapper,
    free: Vec<IoBuffer>,
    lens: HashMap<u64, usize>,
    scratch: Vec<u8>,
    returned: Vec<Returned>,
}

impl MapperLane {
    fn new(ctrl: &Controller, mode: DmaMode, count: usize, size: usize) -> Result<Self, Failure> {
        Self::for_space(ctrl.dma(), mode, count, size)
    }

    /// The same on any DMA space (a UFS controller's, too).
    fn for_space(
        dma: &Arc<mcqio::vfio::DmaSpace>,
        mode: DmaMode,
        count: usize,
        size: usize,
    ) -> Result<Self, Failure> {
        let cfg = MapperConfig {
            pool: PoolConfig {
                buf_size: size,
                count,
            },
            ..MapperConfig::with_mode(mode)
        };
        let mut mapper = QueueMapper::new(dma, &cfg).map_err(ctx("creating the DMA mapper"))?;
        let free = match mapper.pool() {
            Some(pool) => (0..count)
                .map(|_| pool.alloc().map(IoBuffer::Pool))
                .collect::<Result<_, _>>()
                .map_err(ctx("taking pool buffers"))?,
            None => (0..count)
                .map(|_| AppBuffer::for_space(dma, size).map(IoBuffer::App))
                .collect::<Result<_, _>>()
                .map_err(ctx("allocating application buffers"))?,
        };
        Ok(Self {
            mapper,
            free,
            lens: HashMap::new(),
            scratch: vec![0; size],
            returned: Vec::new(),
        })
    }

    fn deliver(&mut self, done: &mut dyn FnMut(u64, &[u8])) {
        for Returned { tag, buf } in self.returned.drain(..) {
            let len = self.lens.remove(&tag).unwrap_or(0);
            let data = &mut self.scratch[..len];
            match &buf {
                IoBuffer::Pool(p) => p
                    .read_bytes(0, data)
                    .expect("the transfer length fits the pool buffer"),
                IoBuffer::App(a) => data.copy_from_slice(&a.as_slice()[..len]),
            }
            done(tag, data);
            self.free.push(buf);
        }
    }
}

impl Lane for MapperLane {
    type B = Mapped;
    fn take(
        &mut self,
        tag: u64,
        len: usize,
        data: Option<&[u8]>,
    ) -> Result<Option<Mapped>, Failure> {
        let Some(mut b) = self.free.pop() else {
            return Ok(None);
        };
        match (&mut b, data) {
            (IoBuffer::Pool(p), Some(d)) => p.write_bytes(0, d).map_err(ctx("filling a buffer"))?,
            (IoBuffer::Pool(p), None) => p
                .write_bytes(0, &vec![POISON; len])
                .map_err(ctx("poisoning a buffer"))?,
            (IoBuffer::App(a), Some(d)) => a.as_mut_slice()[..d.len()].copy_from_slice(d),
            (IoBuffer::App(a), None) => a.as_mut_slice()[..len].fill(POISON),
        }
        let dir = if data.is_some() {
            DmaDir::ToDevice
        } else {
            DmaDir::FromDevice
        };
        self.lens.insert(tag, len);
        self.mapper
            .map(b, len, dir, tag)
            .map(Some)
            .map_err(|f| format!("mapping a {len}-byte buffer: {}", f.error))
    }
    fn give(
        &mut self,
        m: Mapped,
        _tag: u64,
        done: &mut dyn FnMut(u64, &[u8]),
    ) -> Result<(), Failure> {
        self.mapper
            .release(m, &mut self.returned)
            .map_err(ctx("releasing a mapping"))?;
        self.deliver(done);
        Ok(())
    }
    fn tick(&mut self, done: &mut dyn FnMut(u64, &[u8])) -> Result<(), Failure> {
        self.mapper
            .poll(&mut self.returned)
            .map_err(ctx("polling the mapper"))?;
        self.deliver(done);
        Ok(())
    }
    fn drain(&mut self, done: &mut dyn FnMut(u64, &[u8])) -> Result<(), Failure> {
        self.mapper
            .flush(&mut self.returned)
            .map_err(ctx("flushing the mapper"))?;
        self.deliver(done);
        Ok(())
    }
    fn describe(&self) -> String {
        let s = self.mapper.stats();
        format!(
            "{} mode: {} maps, {} premapped I/Os, {} unmaps in {} unmap calls, peak {} KiB pinned",
            self.mapper.mode(),
            s.maps,
            s.premapped_ios,
            s.unmaps,
            s.unmap_calls,
            s.peak_bytes_pinned >> 10
        )
    }
}

/// Vectored buffers: every slot is a list of 4 KiB pages cut from one DMA
/// buffer and shuffled, so a command's segments are scattered in IOVA space
/// and its PRP list has to name each page on its own.
struct VecLane {
    free: Vec<Vec<DmaBuf>>,
    /// Pages of a slot not used by the command in flight, by tag.
    spare: HashMap<u64, Vec<DmaBuf>>,
    lens: HashMap<u64, usize>,
    scratch: Vec<u8>,
}

impl VecLane {
    const PAGE: usize = 4096;

    fn new(ctrl: &Controller, count: usize, size: usize, seed: u64) -> Result<Self, Failure> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut free = Vec::with_capacity(count);
        for _ in 0..count {
            let mut pages = ctrl
                .alloc_buf(size, DmaDir::Bidirectional)
                .and_then(|b| b.chunks(Self::PAGE).map_err(Into::into))
                .map_err(ctx("allocating DMA pages"))?;
            pages.shuffle(&mut rng);
            free.push(pages);
        }
        Ok(Self {
            free,
            spare: HashMap::new(),
            lens: HashMap::new(),
            scratch: vec![0; size],
        })
    }
}

impl Lane for VecLane {
    type B = Vec<DmaBuf>;
    fn take(
        &mut self,
        tag: u64,
        len: usize,
        data: Option<&[u8]>,
    ) -> Result<Option<Vec<DmaBuf>>, Failure> {
        let Some(mut pages) = self.free.pop() else {
            return Ok(None);
        };
        let rest = pages.split_off(len.div_ceil(Self::PAGE).min(pages.len()));
        for (i, p) in pages.iter_mut().enumerate() {
            match data {
                Some(d) => {
                    let chunk = &d[i * Self::PAGE..((i + 1) * Self::PAGE).min(d.len())];
                    p.write_at(0, chunk).map_err(ctx("filling a page"))?;
                }
                None => p.fill(POISON),
            }
        }
        self.spare.insert(tag, rest);
        self.lens.insert(tag, len);
        Ok(Some(pages))
    }
    fn give(
        &mut self,
        mut pages: Vec<DmaBuf>,
        tag: u64,
        done: &mut dyn FnMut(u64, &[u8]),
    ) -> Result<(), Failure> {
        let len = self.lens.remove(&tag).unwrap_or(0);
        for (i, p) in pages.iter().enumerate() {
            let at = i * Self::PAGE;
            if at >= len {
                break;
            }
            let end = (at + Self::PAGE).min(len);
            p.read_at(0, &mut self.scratch[at..end])
                .map_err(ctx("reading a page"))?;
        }
        done(tag, &self.scratch[..len]);
        pages.extend(self.spare.remove(&tag).unwrap_or_default());
        self.free.push(pages);
        Ok(())
    }
    fn describe(&self) -> String {
        format!(
            "{} slots of scattered 4 KiB DmaBufs mapped once",
            self.free.len()
        )
    }
}

/// Run `worker` on `threads` pinned threads, each with its own queue pair
/// moving `B` buffers and its own lane from `make_lane`.
fn spawn_workers<B, L, F>(
    ctrl: &Arc<Controller>,
    threads: usize,
    (shift, seed): (u32, u64),
    plans: &[(Vec<Extent>, SmallRng)],
    make_lane: F,
) -> Vec<Result<WorkerReport, Failure>>
where
    B: IoBuf,
    L: Lane<B = B>,
    F: Fn(&Controller) -> Result<L, Failure> + Sync,
{
    let mut qps = Vec::new();
    for _ in 0..threads {
        match ctrl.create_qpair_for::<B>(QpairOptions::default()) {
            Ok(qp) => qps.push(qp),
            Err(e) => return vec![Err(format!("creating a queue pair: {e}"))],
        }
    }
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let make_lane = &make_lane;
    std::thread::scope(|s| {
        let hs: Vec<_> = qps
            .into_iter()
            .enumerate()
            .map(|(i, mut qp)| {
                let (extents, mut rng) = plans[i].clone();
                let core = (!cores.is_empty()).then(|| cores[i % cores.len()]);
                s.spawn(move || {
                    if let Some(c) = core {
                        core_affinity::set_for_current(c);
                    }
                    let mut lane = make_lane(ctrl)?;
                    let r = worker(&mut qp, &mut lane, shift, seed, &extents, &mut rng);
                    qp.close(|_| ()).map_err(ctx("closing the queue pair"))?;
                    r
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("worker panicked".into())))
            .collect()
    })
}

/// What one worker did.
struct WorkerReport {
    qid: u16,
    ios: u64,
    bytes: u64,
    lane: String,
}

/// The block operations [`phase`] needs, on an NVMe queue pair (namespace
/// 1) or a UFS one (LU 0): the same checks run on both transports.
trait Blk {
    type B;
    /// Queue a write (`write`) or a read of `blocks` blocks at `lba`.
    fn rw(
        &mut self,
        write: bool,
        lba: u64,
        blocks: u32,
        buf: Self::B,
        tag: u64,
    ) -> Result<(), Failure>;
    fn ring(&mut self);
    /// Poll once, appending what completed to `out`.
    fn reap(&mut self, out: &mut Vec<mcqio::Completion<Self::B>>) -> Result<usize, Failure>;
    fn in_flight(&self) -> usize;
    /// The queue pair's id (NVMe qid; UFS hardware queue, 0 in legacy mode).
    fn id(&self) -> u16;
}

/// Where a queue pair's checks send their I/O and which hardware queue it
/// is: with [`BlockQueue`], all [`Blk`] needs.
trait Target: BlockQueue {
    /// The namespace (NVMe) or LU (UFS) every check uses.
    const AT: Self::Addr;
    /// NVMe qid; UFS hardware queue, 0 in legacy mode.
    fn queue_id(&self) -> u16;
}

impl<B: IoBuf> Target for QueuePair<B> {
    const AT: u32 = NSID;
    fn queue_id(&self) -> u16 {
        self.qid()
    }
}

impl<B: IoBuf> Target for mcqio::ufs::UfsQueuePair<B> {
    const AT: u8 = ufs::LUN;
    fn queue_id(&self) -> u16 {
        self.hw_queue().unwrap_or(0)
    }
}

impl<Q: Target> Blk for Q {
    type B = Q::Buf;
    fn rw(
        &mut self,
        write: bool,
        lba: u64,
        blocks: u32,
        buf: Q::Buf,
        tag: u64,
    ) -> Result<(), Failure> {
        let r = if write {
            self.write(Q::AT, lba, blocks, buf, tag)
        } else {
            self.read(Q::AT, lba, blocks, buf, tag)
        };
        r.map_err(|e| e.to_string())
    }
    fn ring(&mut self) {
        self.submit();
    }
    fn reap(&mut self, out: &mut Vec<mcqio::Completion<Q::Buf>>) -> Result<usize, Failure> {
        self.poll(usize::MAX, |c| out.push(c))
            .map_err(|e| e.to_string())
    }
    fn in_flight(&self) -> usize {
        self.outstanding()
    }
    fn id(&self) -> u16 {
        self.queue_id()
    }
}

/// The engine's mapping wrapper on UFS: it maps each `AppBuffer` at
/// submission and hands it back only after its unmap (and, lazy, the
/// batch's invalidation) completed.
impl Blk for mcqio::MappedQueuePair<mcqio::ufs::UfsQueuePair<Mapped>> {
    type B = AppBuffer;
    fn rw(
        &mut self,
        write: bool,
        lba: u64,
        blocks: u32,
        buf: AppBuffer,
        tag: u64,
    ) -> Result<(), Failure> {
        let r = if write {
            self.write(ufs::LUN, lba, blocks, buf, tag)
        } else {
            self.read(ufs::LUN, lba, blocks, buf, tag)
        };
        r.map_err(|e| e.to_string())
    }
    fn ring(&mut self) {
        self.submit();
    }
    fn reap(&mut self, out: &mut Vec<mcqio::Completion<AppBuffer>>) -> Result<usize, Failure> {
        self.poll(usize::MAX, |c| out.push(c))
            .map_err(|e| e.to_string())
    }
    fn in_flight(&self) -> usize {
        self.outstanding()
    }
    fn id(&self) -> u16 {
        self.queue_pair().and_then(|q| q.hw_queue()).unwrap_or(0)
    }
}

/// Run every extent through the queue pair once, writing (`write`) or
/// reading and verifying, keeping up to the lane's buffer count in flight.
fn phase<Q: Blk<B = L::B>, L: Lane>(
    qp: &mut Q,
    lane: &mut L,
    shift: u32,
    seed: u64,
    extents: &[Extent],
    order: &[usize],
    write: bool,
) -> Result<(), Failure> {
    let what = if write { "write" } else { "read" };
    let mut data = vec![0u8; extents.iter().map(|e| e.len).max().unwrap_or(0) as usize];
    let mut next = 0;
    // Shared with the `done` callback below, which the lane may call from
    // `give`, `tick` or `drain`.
    let finished = Cell::new(0usize);
    let bad: RefCell<Option<Failure>> = RefCell::new(None);
    let done = &mut |tag: u64, bytes: &[u8]| {
        finished.set(finished.get() + 1);
        let e = extents[tag as usize];
        if !write && bad.borrow().is_none() {
            if let Some((at, want, got)) = pattern::first_mismatch(seed, e.offset, bytes) {
                *bad.borrow_mut() = Some(format!(
                    "read of {} bytes at offset {} (LBA {}) returned wrong data: at byte offset {at} expected {want:#018x}, found {got:#018x}",
                    e.len,
                    e.offset,
                    e.offset >> shift
                ));
            }
        }
    };
    let mut last_progress = Instant::now();
    let mut completions = Vec::new();
    while finished.get() < order.len() {
        while next < order.len() {
            let idx = order[next];
            let e = extents[idx];
            let len = e.len as usize;
            let fill = if write {
                pattern::fill(seed, e.offset, &mut data[..len]);
                Some(&data[..len])
            } else {
                None
            };
            let Some(b) = lane.take(idx as u64, len, fill)? else {
                break;
            };
            let (slba, nlb) = (e.offset >> shift, (e.len >> shift) as u32);
            qp.rw(write, slba, nlb, b, idx as u64)
                .map_err(|e2| format!("{what} of {} bytes at offset {}: {e2}", e.len, e.offset))?;
            next += 1;
        }
        qp.ring();
        let n = qp
            .reap(&mut completions)
            .map_err(|e| format!("{what}: {e}"))?;
        for c in completions.drain(..) {
            let e = extents[c.tag as usize];
            c.result.map_err(|err| {
                format!(
                    "{what} of {} bytes at offset {} failed: {err}",
                    e.len, e.offset
                )
            })?;
            let b = c
                .buf
                .ok_or_else(|| format!("{what} completed without its buffer"))?;
            lane.give(b, c.tag, done)?;
        }
        lane.tick(done)?;
        if qp.in_flight() == 0 && finished.get() < order.len() {
            // Nothing in flight, yet not everything came back: the lane (lazy
            // mode) holds the rest until its flush; force it.
            lane.drain(done)?;
        }
        if let Some(b) = bad.borrow_mut().take() {
            return Err(b);
        }
        if n > 0 {
            last_progress = Instant::now();
        } else if last_progress.elapsed() > COMMAND_TIMEOUT {
            return Err(format!(
                "{what}: no completion for {COMMAND_TIMEOUT:?} ({} of {} commands finished)",
                finished.get(),
                order.len()
            ));
        } else {
            std::hint::spin_loop();
        }
    }
    Ok(())
}

/// Write all extents, then read them back in another order and verify.
fn worker<Q: Blk<B = L::B>, L: Lane>(
    qp: &mut Q,
    lane: &mut L,
    shift: u32,
    seed: u64,
    extents: &[Extent],
    rng: &mut SmallRng,
) -> Result<WorkerReport, Failure> {
    let mut order: Vec<usize> = (0..extents.len()).collect();
    order.shuffle(rng);
    phase(qp, lane, shift, seed, extents, &order, true)?;
    order.shuffle(rng);
    phase(qp, lane, shift, seed, extents, &order, false)?;
    Ok(WorkerReport {
        qid: qp.id(),
        ios: 2 * extents.len() as u64,
        bytes: 2 * extents.iter().map(|e| e.len).sum::<u64>(),
        lane: lane.describe(),
    })
}

fn rw(args: &RwArgs) -> Result<(), Failure> {
    let (dev, vectored, a) = (&args.dev, args.vectored, &args.shape);
    let ctrl = open(dev)?;
    let (shift, size) = ns1(&ctrl)?;
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if vectored && a.dma.is_some() {
        return Err(
            "--vectored uses the engine's DmaBufs; it cannot be combined with --dma".into(),
        );
    }
    // An NVMe queue of depth D holds D - 1 commands.
    let max_io = a.check(
        ctrl.max_transfer(),
        usize::from(QpairOptions::default().depth) - 1,
    )?;
    let seed = a.seed();
    let per_thread = a.bytes.div_ceil(threads as u64);
    println!(
        "rw: {} thread(s) x 1 queue pair, {} MiB each in I/Os of {}..{} KiB at QD {}, buffers: {}, seed {seed:#x}",
        threads,
        per_thread >> 20,
        a.min_io >> 10,
        max_io >> 10,
        a.qd,
        match (a.dma, vectored) {
            (Some(m), _) => format!("{m} mapping"),
            (None, true) => "vectored: scattered 4 KiB DmaBufs per command".to_string(),
            (None, false) => "engine DmaBufs".to_string(),
        }
    );
    let plans = a.plans(seed, threads, size, max_io)?;
    let t0 = Instant::now();
    let reports: Vec<Result<WorkerReport, Failure>> = match a.dma {
        None if vectored => Vec::new(),
        None => mcqio::run_per_core(&ctrl, threads, QpairOptions::default(), |i, qp| {
            let (extents, mut rng) = plans[i].clone();
            let mut lane = DmaBufLane::new(&ctrl, a.qd, max_io as usize)?;
            worker(qp, &mut lane, shift, seed, &extents, &mut rng)
        })
        .map_err(ctx("running the workers"))?,
        Some(mode) => {
            spawn_workers::<Mapped, _, _>(&ctrl, threads, (shift, seed), &plans, |ctrl| {
                MapperLane::new(ctrl, mode, a.qd, max_io as usize)
            })
        }
    };
    let reports = match (reports, vectored) {
        (r, false) => r,
        (_, true) => {
            spawn_workers::<Vec<DmaBuf>, _, _>(&ctrl, threads, (shift, seed), &plans, |ctrl| {
                VecLane::new(ctrl, a.qd, max_io as usize, seed)
            })
        }
    };
    let secs = t0.elapsed().as_secs_f64();
    let mut qids = Vec::new();
    let (mut ios, mut bytes) = (0, 0);
    for (i, r) in reports.into_iter().enumerate() {
        let r = r.map_err(|e| format!("thread {i}: {e}"))?;
        println!(
            "  thread {i}: queue pair {}, {} commands, {} MiB written and read back; {}",
            r.qid,
            r.ios,
            r.bytes >> 21,
            r.lane
        );
        qids.push(r.qid);
        ios += r.ios;
        bytes += r.bytes;
    }
    qids.sort_unstable();
    qids.dedup();
    if qids.len() != threads {
        return Err(format!("{threads} threads shared queue pairs: {qids:?}"));
    }
    println!(
        "rw: OK: {} commands, {} MiB written and read back identical in {secs:.2} s ({} distinct queue pairs)",
        ios,
        bytes >> 21,
        qids.len()
    );
    Ok(())
}

// ------------------------------------------------------------------ commands

/// Read `len` bytes at `offset` of namespace 1 through the blocking API.
fn read_range(qp: &mut QueuePair, shift: u32, offset: u64, len: u64) -> Result<Vec<u8>, Failure> {
    let mut v = vec![0u8; len as usize];
    qp.read_blocking(NSID, offset >> shift, &mut v)
        .map_err(ctx("read"))?;
    Ok(v)
}

fn commands(a: &DevArgs) -> Result<(), Failure> {
    let ctrl = open(a)?;
    let (shift, size) = ns1(&ctrl)?;
    let raw = ctrl
        .admin_read(
            mcqio::nvme::spec::sqe::Identify::namespace(NSID).sqe(),
            "Identify Namespace",
        )
        .map_err(ctx("Identify Namespace"))?
        .1;
    // DLFEAT (byte 33) bits 2:0: what a deallocated block reads as.
    let dlfeat = raw[33] & 0x7;
    let mut qp = ctrl
        .create_qpair(QpairOptions::default())
        .map_err(ctx("creating a queue pair"))?;
    const REGION: u64 = 1 << 20;
    const HOLE: (u64, u64) = (256 << 10, 256 << 10); // write zeroes: offset, length in the region
    const TRIM: (u64, u64) = (640 << 10, 128 << 10); // deallocate: offset, length
    let base = size - 4 * REGION;
    let seed = 0x6d63_7169_6f5f_636d;
    let mut data = vec![0u8; REGION as usize];
    pattern::fill(seed, base, &mut data);
    qp.write_blocking(NSID, base >> shift, &data)
        .map_err(ctx("write"))?;

    qp.flush(NSID, 1).map_err(ctx("Flush submission"))?;
    let c = wait_tag(&mut qp, 1, "Flush")?;
    c.result.map_err(ctx("Flush"))?;
    println!("flush: OK");

    let nlb = (HOLE.1 >> shift) as u32;
    qp.write_zeroes(NSID, (base + HOLE.0) >> shift, nlb, 2)
        .map_err(ctx("Write Zeroes submission"))?;
    wait_tag(&mut qp, 2, "Write Zeroes")?
        .result
        .map_err(ctx("Write Zeroes"))?;
    let got = read_range(&mut qp, shift, base, REGION)?;
    let (h0, h1) = (HOLE.0 as usize, (HOLE.0 + HOLE.1) as usize);
    if let Some(i) = got[h0..h1].iter().position(|&b| b != 0) {
        return Err(format!(
            "Write Zeroes: byte {} of the zeroed range reads {:#04x}",
            i,
            got[h0 + i]
        ));
    }
    for (from, to) in [(0, h0), (h1, REGION as usize)] {
        if let Some(m) = pattern::first_mismatch(seed, base + from as u64, &got[from..to]) {
            return Err(format!(
                "Write Zeroes touched data outside its range: at {} expected {:#x} found {:#x}",
                m.0, m.1, m.2
            ));
        }
    }
    println!(
        "write zeroes: OK ({} blocks read back as zeros, neighbours intact)",
        nlb
    );

    let trim = ((base + TRIM.0) >> shift, (TRIM.1 >> shift) as u32);
    qp.deallocate(NSID, &[trim], 3)
        .map_err(ctx("Dataset Management submission"))?;
    wait_tag(&mut qp, 3, "Dataset Management")?
        .result
        .map_err(ctx("Dataset Management (deallocate)"))?;
    let got = read_range(&mut qp, shift, base, REGION)?;
    let (t0, t1) = (TRIM.0 as usize, (TRIM.0 + TRIM.1) as usize);
    let expect = match dlfeat {
        1 => Some(0x00),
        2 => Some(0xFF),
        _ => None,
    };
    match expect {
        Some(v) => {
            if let Some(i) = got[t0..t1].iter().position(|&b| b != v) {
                return Err(format!(
                    "Dataset Management: DLFEAT {dlfeat} promises {v:#04x} for deallocated blocks, but byte {i} reads {:#04x}",
                    got[t0 + i]
                ));
            }
        }
        None => println!(
            "deallocate: DLFEAT {dlfeat}: contents of deallocated blocks unspecified, not checked"
        ),
    }
    for (from, to) in [(t1, REGION as usize)] {
        if let Some(m) = pattern::first_mismatch(seed, base + from as u64, &got[from..to]) {
            return Err(format!(
                "Dataset Management touched data outside its range: at {} expected {:#x} found {:#x}",
                m.0, m.1, m.2
            ));
        }
    }
    println!(
        "deallocate: OK ({} blocks{}; neighbours intact)",
        trim.1,
        expect.map_or(String::new(), |v| format!(
            " read back as {v:#04x} per DLFEAT {dlfeat}"
        ))
    );
    qp.flush_blocking(NSID).map_err(ctx("Flush"))?;
    Ok(())
}

// ------------------------------------------------------------------ reset

fn reset(a: &DevArgs) -> Result<(), Failure> {
    let ctrl = open(a)?;
    let (shift, size) = ns1(&ctrl)?;
    let mut qp = ctrl
        .create_qpair(QpairOptions::default())
        .map_err(ctx("creating a queue pair"))?;
    const PIECE: u64 = 64 << 10;
    const PIECES: u64 = 32;
    let base = size - 16 * (1 << 20);
    let seed = 0x6d63_7169_6f5f_7273;
    let mut data = vec![0u8; (PIECE * PIECES) as usize];
    pattern::fill(seed, base, &mut data);
    qp.write_blocking(NSID, base >> shift, &data)
        .map_err(ctx("write"))?;

    // Reads in flight when the controller is reset.
    for i in 0..PIECES {
        let mut b = ctrl
            .alloc_buf(PIECE as usize, DmaDir::Bidirectional)
            .map_err(ctx("allocating a buffer"))?;
        b.fill(POISON);
        qp.read(
            NSID,
            (base + i * PIECE) >> shift,
            (PIECE >> shift) as u32,
            b,
            i,
        )
        .map_err(ctx("read"))?;
    }
    qp.submit();
    ctrl.reset().map_err(ctx("Controller::reset"))?;
    let (mut ok, mut aborted) = (0u64, 0u64);
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let mut bad = None;
    while ok + aborted < PIECES {
        qp.poll(usize::MAX, |c| match c.result {
            Ok(()) => {
                ok += 1;
                let got = c.buf.as_ref().map(|b| b.to_vec()).unwrap_or_default();
                let at = base + c.tag * PIECE;
                if let Some(m) = pattern::first_mismatch(seed, at, &got) {
                    bad.get_or_insert(format!(
                        "read {} completed across the reset with wrong data at {} (expected {:#x}, found {:#x})",
                        c.tag, m.0, m.1, m.2
                    ));
                }
            }
            Err(mcqio::IoError::AbortedByReset) => aborted += 1,
            Err(e) => {
                bad.get_or_insert(format!("read {} ended with {e}, not success or AbortedByReset", c.tag));
                aborted += 1;
            }
        })
        .map_err(ctx("poll after reset"))?;
        if Instant::now() > deadline {
            return Err(format!(
                "after the reset only {} of {PIECES} reads came back within {COMMAND_TIMEOUT:?}",
                ok + aborted
            ));
        }
    }
    if let Some(b) = bad {
        return Err(b);
    }
    println!(
        "reset with {PIECES} reads in flight: {ok} completed with correct data, {aborted} aborted by the reset (resets: {})",
        ctrl.resets()
    );
    if ctrl.resets() != 1 {
        return Err(format!(
            "Controller::resets() is {}, expected 1",
            ctrl.resets()
        ));
    }
    // The same queue pair works after the reset.
    let got = read_range(&mut qp, shift, base, PIECE * PIECES)?;
    if let Some(m) = pattern::first_mismatch(seed, base, &got) {
        return Err(format!(
            "after the reset the queue pair read wrong data at {} (expected {:#x}, found {:#x})",
            m.0, m.1, m.2
        ));
    }
    qp.write_blocking(NSID, base >> shift, &data)
        .map_err(ctx("write after the reset"))?;
    println!("after the reset the same queue pair reads and writes correctly");
    Ok(())
}

// ------------------------------------------------------------------ IOMMU

fn dma_after_unmap(a: &DevArgs) -> Result<(), Failure> {
    let ctrl = open(a)?;
    let (shift, size) = ns1(&ctrl)?;
    let mut qp = ctrl
        .create_qpair(QpairOptions::default())
        .map_err(ctx("creating a queue pair"))?;
    check_dma_after_unmap(
        &mut qp,
        ctrl.dma(),
        NSID,
        shift,
        size,
        0x6d63_7169_6f5f_756d,
    )
}

/// The engine's blocking helpers (bounce buffer, split at the transfer
/// limit, timeout), which each transport offers as inherent methods.
trait BlockingIo: BlockQueue<Buf = DmaBuf> {
    fn write_all(&mut self, at: Self::Addr, lba: u64, src: &[u8]) -> mcqio::Result<()>;
    fn read_all(&mut self, at: Self::Addr, lba: u64, dst: &mut [u8]) -> mcqio::Result<()>;
}

impl BlockingIo for QueuePair {
    fn write_all(&mut self, at: u32, lba: u64, src: &[u8]) -> mcqio::Result<()> {
        self.write_blocking(at, lba, src)
    }
    fn read_all(&mut self, at: u32, lba: u64, dst: &mut [u8]) -> mcqio::Result<()> {
        self.read_blocking(at, lba, dst)
    }
}

impl BlockingIo for mcqio::ufs::UfsQueuePair {
    fn write_all(&mut self, at: u8, lba: u64, src: &[u8]) -> mcqio::Result<()> {
        self.write_blocking(at, lba, src)
    }
    fn read_all(&mut self, at: u8, lba: u64, dst: &mut [u8]) -> mcqio::Result<()> {
        self.read_blocking(at, lba, dst)
    }
}

/// `dma-after-unmap` and `ufs-dma-after-unmap`: a read into a buffer that
/// was unmapped from the IOMMU must leave the buffer untouched (the
/// IOMMU blocked the DMA), after a control read into a mapped buffer
/// delivered the data; and the controller must read correctly after the
/// fault. Uses 64 KiB, 8 MiB before the end of `at` (`size` bytes).
fn check_dma_after_unmap<Q: BlockingIo>(
    qp: &mut Q,
    dma: &Arc<mcqio::vfio::DmaSpace>,
    at: Q::Addr,
    shift: u32,
    size: u64,
    seed: u64,
) -> Result<(), Failure> {
    const LEN: u64 = 64 << 10;
    let offset = size - (8 << 20);
    let mut data = vec![0u8; LEN as usize];
    pattern::fill(seed, offset, &mut data);
    qp.write_all(at, offset >> shift, &data)
        .map_err(ctx("write"))?;
    let blocks = (LEN >> shift) as u32;

    // Control: with the mapping in place, the read lands in the buffer.
    let mut buf = DmaBuf::alloc(dma, LEN as usize, DmaDir::Bidirectional)
        .map_err(ctx("allocating a buffer"))?;
    buf.fill(POISON);
    qp.read(at, offset >> shift, blocks, buf, 1)
        .map_err(ctx("read"))?;
    let c = wait_tag(qp, 1, "control read")?;
    c.result.map_err(ctx("control read"))?;
    let buf = c.buf.ok_or("control read lost its buffer")?;
    if buf.to_vec() != data {
        return Err("control read into a mapped buffer did not return the data written".into());
    }
    println!("control: a read into a mapped buffer delivers the data");

    // The real check: unmap the buffer in the IOMMU (its memory and IOVA stay
    // owned by `victim`, so nothing else can be there), point a read at it.
    let mut victim = DmaBuf::alloc(dma, LEN as usize, DmaDir::Bidirectional)
        .map_err(ctx("allocating a buffer"))?;
    victim.fill(POISON);
    let iova = victim.iova();
    let region = Arc::clone(victim.region());
    let iommu = Arc::clone(dma.iommu());
    iommu
        .unmap(region.iova(), region.len() as u64)
        .map_err(ctx("unmapping the buffer"))?;
    println!(
        "unmapped {} bytes at IOVA {iova} from the IOMMU; reading {LEN} bytes into it",
        region.len()
    );
    qp.read(at, offset >> shift, blocks, victim, 2)
        .map_err(ctx("read into the unmapped IOVA"))?;
    let c = wait_tag(qp, 2, "read into the unmapped IOVA")?;
    let status = match c.result {
        Ok(()) => "success".to_string(),
        Err(e) => format!("error ({e})"),
    };
    let victim = c.buf.ok_or("the read lost its buffer")?;
    let after = victim.to_vec();
    // Put the mapping back so the region's own teardown unmaps it normally.
    // SAFETY: the pages belong to `region`, which stays allocated until its
    // drop, and that drop unmaps this mapping before freeing them.
    unsafe { iommu.map(region.iova(), region.as_ptr(), region.len(), region.dir()) }
        .map_err(ctx("remapping the buffer"))?;
    drop(victim);
    drop(region);
    let untouched = after.iter().all(|&b| b == POISON);
    println!(
        "read into unmapped IOVA {iova}: command status {status}; buffer {}",
        if untouched {
            "unchanged (DMA blocked)"
        } else if after == data {
            "holds the disk data (DMA went through!)"
        } else {
            "partly changed"
        }
    );
    if !untouched {
        return Err("the device wrote to memory that was unmapped from the IOMMU".into());
    }
    // The controller must still work after the fault.
    let mut back = vec![POISON; LEN as usize];
    qp.read_all(at, offset >> shift, &mut back)
        .map_err(ctx("read after the fault"))?;
    if back != data {
        return Err("after the blocked DMA, a normal read returned wrong data".into());
    }
    println!("after the fault the controller still reads correctly");
    Ok(())
}

/// The map/unmap table on the controller's real IOMMU. Speed is reported,
/// not asserted; what is checked is counted: the premapped row makes no
/// IOMMU call at all while it runs.
fn map_bench(a: &MapBenchArgs) -> Result<(), Failure> {
    use mcqio::vfio::mapping::bench::{format_table, run_table, BenchMode};
    let ctrl = open(&a.dev)?;
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if !(a.secs > 0.0 && a.secs <= 60.0) {
        return Err("--secs must be in (0, 60]".into());
    }
    let rows = run_table(
        ctrl.dma(),
        &BenchMode::standard(),
        threads,
        Duration::from_secs_f64(a.secs),
    )
    .map_err(ctx("map/unmap benchmark"))?;
    println!(
        "map -> touch -> unmap of 4 KiB buffers on {} ({threads} thread(s), {} s per row):",
        ctrl.backend().name(),
        a.secs
    );
    print!("{}", format_table(&rows));
    let rate = |label: &str| rows.iter().find(|r| r.label == label).map(|r| r.rate());
    if let (Some(lazy), Some(strict)) = (rate("lazy/256"), rate("strict")) {
        println!(
            "lazy/256 vs strict: {:.1}x the map/unmap throughput",
            lazy / strict.max(1e-9)
        );
    }
    let pre = rows
        .iter()
        .find(|r| r.label == "premapped")
        .ok_or("no premapped row")?;
    if pre.iommu.maps != 0 || pre.iommu.unmap_calls != 0 {
        return Err(format!(
            "premapped mode made IOMMU calls on the I/O path: {} maps, {} unmap calls",
            pre.iommu.maps, pre.iommu.unmap_calls
        ));
    }
    println!(
        "premapped: {} cycles with 0 IOMMU maps and 0 unmap calls (counted)",
        pre.total
    );
    Ok(())
}

// ------------------------------------------------------------------ patterns

fn write_pattern(a: &DevPatternArgs) -> Result<(), Failure> {
    let ctrl = open(&a.dev)?;
    let p = a.region;
    let shift = check_range(&ctrl, p.offset, p.len)?;
    let mut qp = ctrl
        .create_qpair(QpairOptions::default())
        .map_err(ctx("creating a queue pair"))?;
    const CHUNK: u64 = 1 << 20;
    let mut buf = vec![0u8; CHUNK as usize];
    let mut done = 0;
    while done < p.len {
        let n = (p.len - done).min(CHUNK);
        let at = p.offset + done;
        pattern::fill(p.seed, at, &mut buf[..n as usize]);
        qp.write_blocking(NSID, at >> shift, &buf[..n as usize])
            .map_err(ctx("write"))?;
        done += n;
    }
    qp.flush_blocking(NSID).map_err(ctx("flush"))?;
    println!(
        "wrote {} bytes of pattern seed {} at offset {} (LBA {}) through {}, flushed",
        p.len,
        p.seed,
        p.offset,
        p.offset >> shift,
        ctrl.backend().name()
    );
    Ok(())
}

fn check_pattern(a: &DevPatternArgs) -> Result<(), Failure> {
    let ctrl = open(&a.dev)?;
    let p = a.region;
    let shift = check_range(&ctrl, p.offset, p.len)?;
    let mut qp = ctrl
        .create_qpair(QpairOptions::default())
        .map_err(ctx("creating a queue pair"))?;
    const CHUNK: u64 = 1 << 20;
    let mut done = 0;
    while done < p.len {
        let n = (p.len - done).min(CHUNK);
        let at = p.offset + done;
        let got = read_range(&mut qp, shift, at, n)?;
        if let Some((off, want, found)) = pattern::first_mismatch(p.seed, at, &got) {
            return Err(format!(
                "pattern seed {} differs at byte offset {off} (LBA {}): expected {want:#018x}, found {found:#018x}",
                p.seed,
                off >> shift
            ));
        }
        done += n;
    }
    println!(
        "read {} bytes at offset {} (LBA {}) through {}: identical to pattern seed {}",
        p.len,
        p.offset,
        p.offset >> shift,
        ctrl.backend().name(),
        p.seed
    );
    Ok(())
}

fn gen_pattern(p: &PatternArgs) -> Result<(), Failure> {
    if p.offset % pattern::WORD != 0 || p.len % pattern::WORD != 0 || p.len == 0 {
        return Err(format!(
            "--offset {} and --len {} must be non-zero multiples of {}",
            p.offset,
            p.len,
            pattern::WORD
        ));
    }
    const CHUNK: u64 = 1 << 20;
    let mut buf = vec![0u8; CHUNK as usize];
    let mut out = std::io::stdout().lock();
    let mut done = 0;
    while done < p.len {
        let n = (p.len - done).min(CHUNK) as usize;
        pattern::fill(p.seed, p.offset + done, &mut buf[..n]);
        out.write_all(&buf[..n])
            .map_err(ctx("writing the pattern to stdout"))?;
        done += n as u64;
    }
    out.flush().map_err(ctx("flushing stdout"))
}

// ------------------------------------------------------------------ UFS

/// The UFS checks: the same shape as the NVMe ones, on
/// [`mcqio::ufs::UfsController`] over the same VFIO backend.
mod ufs {
    use super::*;
    use mcqio::ufs::{UfsController, UfsMode, UfsOptions, UfsQpairOptions, UfsQueuePair};

    /// The LU every check uses.
    pub const LUN: u8 = 0;
    /// PCI class of a UFSHCI host controller (mass storage, UFS, UFSHCI).
    const UFSHCI_CLASS: u32 = 0x01_09_01;

    /// Open the device and bring the controller up.
    pub fn open(a: &UfsDevArgs, queues: Option<u16>) -> Result<Arc<UfsController>, Failure> {
        let dev = a.device.as_str();
        let backend: Arc<dyn Backend> = if dev == "fake-ufs" {
            let cfg = mcqio_fixtures::ufs::UfsConfig {
                lus: vec![mcqio_fixtures::ufs::LuConfig::Ram { blocks: 65536 }],
                ..Default::default()
            };
            mcqio_fixtures::ufs::FakeUfs::new(cfg).map_err(ctx("fake UFS controller"))?
        } else if let Some(bdf) = dev.strip_prefix("vfio:") {
            let opts = mcqio::vfio::OpenOptions {
                require_nvme: false,
                ..Default::default()
            };
            let b = VfioBackend::open_with(bdf, &opts).map_err(ctx(dev))?;
            let class = b.info().class;
            if class != UFSHCI_CLASS {
                return Err(format!(
                    "{dev}: PCI class {class:#08x}, not a UFS host controller ({UFSHCI_CLASS:#08x})"
                ));
            }
            Arc::new(b)
        } else {
            return Err(format!(
                "unknown device {dev:?}: use vfio:<BDF> or fake-ufs"
            ));
        };
        let mut opts = UfsOptions {
            mcq: !a.legacy,
            ..UfsOptions::default()
        };
        if let Some(q) = queues {
            opts.queues = q;
        }
        let ctrl = UfsController::new(backend, opts).map_err(ctx("UFS bring-up"))?;
        match (a.expect.as_deref(), ctrl.mode()) {
            (None, _) | (Some("mcq"), UfsMode::Mcq { .. }) | (Some("legacy"), UfsMode::Legacy) => {
                Ok(ctrl)
            }
            (Some(want @ ("mcq" | "legacy")), got) => Err(format!(
                "bring-up ended in {got:?}, expected {want} (--expect)"
            )),
            (Some(other), _) => Err(format!("--expect must be mcq or legacy, not {other:?}")),
        }
    }

    /// LU 0's block size (log2) and size in bytes.
    pub fn lu0(ctrl: &UfsController) -> Result<(u32, u64), Failure> {
        let lu = ctrl
            .logical_unit(LUN)
            .ok_or_else(|| format!("LU {LUN} is not reported by {}", ctrl.backend().name()))?;
        let size = lu
            .blocks
            .checked_mul(u64::from(lu.block_len))
            .ok_or("LU size overflows")?;
        Ok((lu.block_shift(), size))
    }

    pub fn bringup(a: &UfsDevArgs) -> Result<(), Failure> {
        let t0 = Instant::now();
        let ctrl = open(a, None)?;
        let bring_up = t0.elapsed();
        let d = ctrl.device_descriptor();
        println!("controller:  {}", ctrl.backend().name());
        println!("bring-up:    {:.1} ms", bring_up.as_secs_f64() * 1e3);
        println!("mode:        {:?}", ctrl.mode());
        println!("depth:       {} commands per queue pair", ctrl.depth());
        println!(
            "device:      UFS {:x}.{:x}, bNumberLU {}, bNumberWLU {}, wManufacturerID {:#06x}, bQueueDepth {}",
            d.spec_version >> 8,
            (d.spec_version >> 4) & 0xf,
            d.lus,
            d.wlus,
            d.manufacturer,
            d.queue_depth
        );
        for lu in ctrl.logical_units() {
            println!(
                "LU {}:        {} blocks of {} B ({} MiB)",
                lu.lun,
                lu.blocks,
                lu.block_len,
                (lu.blocks << lu.block_shift()) >> 20
            );
        }
        let (shift, size) = lu0(&ctrl)?;
        // One write and read-back through a queue pair proves the data path
        // of the mode bring-up chose.
        let mut qp: UfsQueuePair = ctrl.create_qpair().map_err(ctx("creating a queue pair"))?;
        println!(
            "queue pair:  hardware queue {:?}, max transfer {} KiB",
            qp.hw_queue(),
            qp.max_transfer() >> 10
        );
        const LEN: u64 = 64 << 10;
        let offset = size / 2;
        let seed = 0x7566_735f_6272_696e;
        let mut data = vec![0u8; LEN as usize];
        pattern::fill(seed, offset, &mut data);
        qp.write_blocking(LUN, offset >> shift, &data)
            .map_err(ctx("write"))?;
        qp.flush_blocking(LUN).map_err(ctx("flush"))?;
        let mut back = vec![POISON; LEN as usize];
        qp.read_blocking(LUN, offset >> shift, &mut back)
            .map_err(ctx("read"))?;
        if let Some((off, want, got)) = pattern::first_mismatch(seed, offset, &back) {
            return Err(format!(
                "read back differs at byte {off}: expected {want:#018x}, found {got:#018x}"
            ));
        }
        let st = qp.stats();
        println!("data path:   {LEN} bytes written, flushed, read back identical; {st:?}");
        qp.close(|_| {}).map_err(ctx("closing the queue pair"))?;
        Ok(())
    }

    struct Report {
        hw_queue: Option<u16>,
        ios: u64,
        bytes: u64,
    }

    /// One thread: write every extent (QD `qd`), then read each back and
    /// compare with the pattern.
    fn worker(
        ctrl: &Arc<UfsController>,
        shift: u32,
        seed: u64,
        qd: usize,
        max_io: usize,
        extents: &[Extent],
    ) -> Result<Report, Failure> {
        let mut qp: UfsQueuePair = ctrl.create_qpair().map_err(ctx("creating a queue pair"))?;
        let mut free: Vec<DmaBuf> = (0..qd)
            .map(|_| ctrl.alloc_buf(max_io, DmaDir::Bidirectional))
            .collect::<Result<_, _>>()
            .map_err(ctx("allocating buffers"))?;
        let mut ios = 0u64;
        for write in [true, false] {
            let what = if write { "write" } else { "read" };
            let mut next = 0usize;
            let mut inflight = 0usize;
            let mut err: Option<Failure> = None;
            let mut last_progress = Instant::now();
            while next < extents.len() || inflight > 0 {
                while next < extents.len() && inflight < qd {
                    let e = extents[next];
                    let mut buf = free.pop().ok_or("no free buffer")?;
                    let blocks = (e.len >> shift) as u32;
                    let r = if write {
                        let mut v = vec![0u8; e.len as usize];
                        pattern::fill(seed, e.offset, &mut v);
                        buf.write_at(0, &v).map_err(ctx("filling a buffer"))?;
                        qp.write(LUN, e.offset >> shift, blocks, buf, next as u64)
                    } else {
                        buf.fill(POISON);
                        qp.read(LUN, e.offset >> shift, blocks, buf, next as u64)
                    };
                    if let Err(e) = r {
                        return Err(format!("{what} submit: {:?}", e.kind));
                    }
                    next += 1;
                    inflight += 1;
                }
                qp.submit();
                let n = qp
                    .poll(qd, |c| {
                        inflight -= 1;
                        let Some(buf) = c.buf else {
                            err.get_or_insert(format!("{what} {} lost its buffer", c.tag));
                            return;
                        };
                        if let Err(e) = c.result {
                            err.get_or_insert(format!("{what} of extent {}: {e}", c.tag));
                        } else if !write {
                            let e = extents[c.tag as usize];
                            let mut v = vec![0u8; e.len as usize];
                            match buf.read_at(0, &mut v) {
                                Err(x) => {
                                    err.get_or_insert(format!("reading a buffer: {x}"));
                                }
                                Ok(()) => {
                                    if let Some((off, want, got)) =
                                        pattern::first_mismatch(seed, e.offset, &v)
                                    {
                                        err.get_or_insert(format!(
                                            "read back differs at byte {off} (LBA {}, extent {} of {} bytes at {}): expected {want:#018x}, found {got:#018x}",
                                            off >> shift, c.tag, e.len, e.offset
                                        ));
                                    }
                                }
                            }
                        }
                        free.push(buf);
                    })
                    .map_err(ctx(what))?;
                if let Some(e) = err.take() {
                    return Err(e);
                }
                ios += n as u64;
                if n > 0 {
                    last_progress = Instant::now();
                } else if last_progress.elapsed() > COMMAND_TIMEOUT {
                    return Err(format!(
                        "{what}: {inflight} command(s) without a completion for {COMMAND_TIMEOUT:?}"
                    ));
                } else {
                    std::thread::yield_now();
                }
            }
            if write {
                qp.flush_blocking(LUN).map_err(ctx("flush"))?;
            }
        }
        let hw_queue = qp.hw_queue();
        qp.close(|_| {}).map_err(ctx("closing the queue pair"))?;
        Ok(Report {
            hw_queue,
            ios,
            bytes: extents.iter().map(|e| e.len).sum::<u64>() * 2,
        })
    }

    pub fn rw(a: &UfsRwArgs) -> Result<(), Failure> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = a
            .shape
            .threads
            .unwrap_or(if a.dev.legacy { 1 } else { cpus })
            .max(1);
        let ctrl = open(&a.dev, Some(threads.min(32) as u16))?;
        let (shift, size) = lu0(&ctrl)?;
        let threads = match ctrl.mode() {
            UfsMode::Legacy if threads > 1 && a.shape.threads.is_none() => 1,
            _ => threads,
        };
        let seed = a.shape.seed();
        let probe: UfsQueuePair = ctrl.create_qpair().map_err(ctx("creating a queue pair"))?;
        let max_io = a
            .shape
            .check(probe.max_transfer(), usize::from(ctrl.depth()))?;
        drop(probe);
        let per_thread = a.shape.bytes.div_ceil(threads as u64);
        println!(
            "ufs-rw: {:?}, {threads} thread(s) x 1 queue pair, {} MiB each in I/Os of {}..{} KiB at QD {}, seed {seed:#x}",
            ctrl.mode(),
            per_thread >> 20,
            a.shape.min_io >> 10,
            max_io >> 10,
            a.shape.qd
        );
        let plans: Vec<Vec<Extent>> = a
            .shape
            .plans(seed, threads, size, max_io)?
            .into_iter()
            .map(|(v, _)| v)
            .collect();
        if let Some(mode) = a.shape.dma {
            let engine = a.engine_mapped;
            if engine && mode == DmaMode::Premapped {
                return Err("--engine-mapped maps per I/O: use --dma strict or lazy".into());
            }
            return rw_mapped(
                &ctrl,
                mode,
                engine,
                threads,
                (shift, seed),
                a.shape.qd,
                max_io,
                plans,
            );
        }
        let t0 = Instant::now();
        let reports: Vec<Result<Report, Failure>> = std::thread::scope(|s| {
            let hs: Vec<_> = plans
                .iter()
                .map(|ext| {
                    let ctrl = &ctrl;
                    s.spawn(move || worker(ctrl, shift, seed, a.shape.qd, max_io as usize, ext))
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("worker panicked".into())))
                .collect()
        });
        let secs = t0.elapsed().as_secs_f64();
        let (mut ios, mut bytes, mut queues) = (0, 0, Vec::new());
        for (i, r) in reports.into_iter().enumerate() {
            let r = r.map_err(|e| format!("thread {i}: {e}"))?;
            println!(
                "  thread {i}: hardware queue {:?}, {} commands, {} MiB written and read back",
                r.hw_queue,
                r.ios,
                r.bytes >> 21
            );
            queues.push(r.hw_queue);
            ios += r.ios;
            bytes += r.bytes;
        }
        queues.sort_unstable();
        queues.dedup();
        if matches!(ctrl.mode(), UfsMode::Mcq { .. }) && queues.len() != threads {
            return Err(format!(
                "{threads} threads shared hardware queues: {queues:?}"
            ));
        }
        println!(
            "ufs-rw: OK: {ios} commands, {} MiB written and read back identical in {secs:.2} s ({} hardware queue(s))",
            bytes >> 21,
            queues.len()
        );
        Ok(())
    }

    /// `ufs-rw --dma MODE`: the same extents through the NVMe checks' own
    /// write/read/verify worker, one queue pair per thread: buffers from a
    /// [`QueueMapper`] in `mode` (premapped pool, strict or lazy) on a
    /// `UfsQueuePair<Mapped>`, or with `engine` the engine's own
    /// `MappedQueuePair` (strict or lazy) mapping application buffers.
    #[allow(clippy::too_many_arguments)]
    fn rw_mapped(
        ctrl: &Arc<UfsController>,
        mode: DmaMode,
        engine: bool,
        threads: usize,
        (shift, seed): (u32, u64),
        qd: usize,
        max_io: u64,
        plans: Vec<Vec<Extent>>,
    ) -> Result<(), Failure> {
        let t0 = Instant::now();
        let reports: Vec<Result<WorkerReport, Failure>> = std::thread::scope(|s| {
            let hs: Vec<_> = plans
                .into_iter()
                .enumerate()
                .map(|(i, ext)| {
                    s.spawn(move || {
                        let mut rng = SmallRng::seed_from_u64(seed ^ 0x6d61_7070 ^ i as u64);
                        if engine {
                            let mapping = match mode {
                                DmaMode::Strict => mcqio::MappingMode::Strict,
                                DmaMode::Lazy => mcqio::MappingMode::lazy(),
                                DmaMode::Premapped => unreachable!("refused before the threads start"),
                            };
                            let mut qp = ctrl
                                .create_mapped_qpair(UfsQpairOptions::default(), mapping)
                                .map_err(ctx("creating a mapped queue pair"))?;
                            let mut lane = AppLane::new(ctrl.dma(), mode, qd, max_io as usize)?;
                            let r = super::worker(&mut qp, &mut lane, shift, seed, &ext, &mut rng);
                            let st = qp.mapper_stats();
                            qp.close(|_| ()).map_err(ctx("closing the mapped queue pair"))?;
                            return r.map(|mut r| {
                                r.lane = format!(
                                    "{}: {} maps, {} unmaps in {} unmap calls, {} IOTLB invalidations",
                                    r.lane, st.maps, st.unmaps, st.unmap_calls, st.invalidations
                                );
                                r
                            });
                        }
                        let mut qp: UfsQueuePair<Mapped> =
                            ctrl.create_qpair().map_err(ctx("creating a queue pair"))?;
                        let mut lane =
                            MapperLane::for_space(ctrl.dma(), mode, qd, max_io as usize)?;
                        let r = super::worker(&mut qp, &mut lane, shift, seed, &ext, &mut rng);
                        qp.close(|_| ()).map_err(ctx("closing the queue pair"))?;
                        r
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("worker panicked".into())))
                .collect()
        });
        let secs = t0.elapsed().as_secs_f64();
        let (mut ios, mut bytes, mut queues) = (0, 0, Vec::new());
        for (i, r) in reports.into_iter().enumerate() {
            let r = r.map_err(|e| format!("thread {i}: {e}"))?;
            println!(
                "  thread {i}: hardware queue {}, {} commands, {} MiB written and read back; {}",
                r.qid,
                r.ios,
                r.bytes >> 21,
                r.lane
            );
            queues.push(r.qid);
            ios += r.ios;
            bytes += r.bytes;
        }
        queues.sort_unstable();
        queues.dedup();
        if matches!(ctrl.mode(), UfsMode::Mcq { .. }) && queues.len() != threads {
            return Err(format!(
                "{threads} threads shared hardware queues: {queues:?}"
            ));
        }
        println!(
            "ufs-rw: OK ({mode} mapping{}): {ios} commands, {} MiB written and read back identical in {secs:.2} s",
            if engine { " by the engine's MappedQueuePair" } else { "" },
            bytes >> 21
        );
        Ok(())
    }

    /// `ufs-reset`: see the subcommand's help.
    pub fn reset(a: &UfsDevArgs) -> Result<(), Failure> {
        use std::collections::BTreeMap;
        // Two hardware queues in MCQ mode (I/O in flight on both), the one
        // list in legacy mode.
        let ctrl = open(a, Some(2))?;
        let (shift, size) = lu0(&ctrl)?;
        let pairs = match ctrl.mode() {
            UfsMode::Mcq { queues } => usize::from(queues.min(2)),
            UfsMode::Legacy => 1,
        };
        let mut qps: Vec<UfsQueuePair> = (0..pairs)
            .map(|_| ctrl.create_qpair())
            .collect::<Result<_, _>>()
            .map_err(ctx("creating the queue pairs"))?;
        // Per pair: 8 reads of data written first and 8 writes of new data,
        // 256 KiB each, in a 4 MiB region of its own, rung; then 4 more
        // reads queued in the ring but not rung when the reset comes (the
        // controller never sees them: they must end AbortedByReset).
        const IO: u64 = 256 << 10;
        const READS: u64 = 8;
        const WRITES: u64 = 8;
        const UNRUNG: u64 = 4;
        const UNRUNG_TAG: u64 = 100;
        let blocks = (IO >> shift) as u32;
        let base = |p: usize| size / 4 + p as u64 * (8 << 20);
        let clock = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        let (old_seed, new_seed) = (clock, clock ^ 0x5eed);
        let mut data = vec![0u8; ((READS + WRITES) * IO) as usize];
        for (p, qp) in qps.iter_mut().enumerate() {
            pattern::fill(old_seed, base(p), &mut data);
            qp.write_blocking(LUN, base(p) >> shift, &data)
                .map_err(ctx("writing the data the reads expect"))?;
        }
        let mut io = vec![0u8; IO as usize];
        for (p, qp) in qps.iter_mut().enumerate() {
            for i in 0..READS + WRITES {
                let off = base(p) + i * IO;
                let mut buf = ctrl
                    .alloc_buf(IO as usize, DmaDir::Bidirectional)
                    .map_err(ctx("allocating a buffer"))?;
                let r = if i < READS {
                    buf.fill(POISON);
                    qp.read(LUN, off >> shift, blocks, buf, i)
                } else {
                    pattern::fill(new_seed, off, &mut io);
                    buf.write_at(0, &io).map_err(ctx("filling a buffer"))?;
                    qp.write(LUN, off >> shift, blocks, buf, i)
                };
                r.map_err(|e| format!("submit: {:?}", e.kind))?;
            }
        }
        for qp in qps.iter_mut() {
            qp.submit();
        }
        for (p, qp) in qps.iter_mut().enumerate() {
            for j in 0..UNRUNG {
                let buf = ctrl
                    .alloc_buf(IO as usize, DmaDir::Bidirectional)
                    .map_err(ctx("allocating a buffer"))?;
                qp.read(
                    LUN,
                    (base(p) + j * IO) >> shift,
                    blocks,
                    buf,
                    UNRUNG_TAG + j,
                )
                .map_err(|e| format!("submit: {:?}", e.kind))?;
            }
        }
        let t0 = Instant::now();
        ctrl.reset().map_err(ctx("host controller reset"))?;
        let reset_ms = t0.elapsed().as_secs_f64() * 1e3;
        println!(
            "reset with {} commands rung and {} queued but not rung on {pairs} queue pair(s) of {} KiB each: {reset_ms:.1} ms (HCE = 0, link start-up, NOP, fDeviceInit, {:?})",
            pairs as u64 * (READS + WRITES),
            pairs as u64 * UNRUNG,
            IO >> 10,
            ctrl.mode()
        );
        for qp in qps.iter_mut() {
            if qp.submit() {
                return Err("a doorbell was rung before the queue pair saw the reset".into());
            }
        }
        let mut rewrite = Vec::new();
        for (p, qp) in qps.iter_mut().enumerate() {
            let mut done = BTreeMap::new();
            let deadline = Instant::now() + COMMAND_TIMEOUT;
            while done.len() < (READS + WRITES + UNRUNG) as usize {
                let mut dup = None;
                qp.poll(usize::MAX, |c| {
                    let tag = c.tag;
                    if done.insert(tag, c).is_some() {
                        dup = Some(tag);
                    }
                })
                .map_err(ctx("poll after the reset"))?;
                if let Some(t) = dup {
                    return Err(format!("pair {p}: command {t} completed twice"));
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "pair {p}: {} of {} commands completed after the reset",
                        done.len(),
                        READS + WRITES + UNRUNG
                    ));
                }
            }
            for _ in 0..8 {
                let mut extra = 0;
                qp.poll(usize::MAX, |_| extra += 1)
                    .map_err(ctx("poll after the reset"))?;
                if extra > 0 {
                    return Err(format!("pair {p}: {extra} extra completion(s)"));
                }
            }
            let (mut ok, mut aborted) = (0, 0);
            for (&i, c) in &done {
                if i >= UNRUNG_TAG {
                    if c.result != Err(mcqio::IoError::AbortedByReset) || c.buf.is_none() {
                        return Err(format!(
                            "pair {p}: a read the controller never saw ended {:?} (buffer back: {})",
                            c.result,
                            c.buf.is_some()
                        ));
                    }
                    continue;
                }
                let off = base(p) + i * IO;
                let buf = c
                    .buf
                    .as_ref()
                    .ok_or_else(|| format!("pair {p}: command {i} came back without its buffer"))?;
                match c.result {
                    Ok(()) => {
                        ok += 1;
                        if i < READS {
                            buf.read_at(0, &mut io).map_err(ctx("reading a buffer"))?;
                            if let Some((at, want, got)) =
                                pattern::first_mismatch(old_seed, off, &io)
                            {
                                return Err(format!(
                                    "pair {p}: read {i} completed before the reset with wrong data at byte {at}: expected {want:#018x}, found {got:#018x}"
                                ));
                            }
                        }
                    }
                    Err(mcqio::IoError::AbortedByReset) => {
                        aborted += 1;
                        if i >= READS {
                            rewrite.push((p, off));
                        }
                    }
                    Err(e) => return Err(format!("pair {p}: command {i}: {e}")),
                }
            }
            println!(
                "  pair {p} (hardware queue {:?}): of the rung commands {ok} completed before the reset, {aborted} ended AbortedByReset; the {UNRUNG} not rung ended AbortedByReset; all with their buffers; queue re-created ({} recovery)",
                qp.hw_queue(),
                qp.recoveries()
            );
            if qp.recoveries() != 1 {
                return Err(format!(
                    "pair {p}: {} recoveries, expected 1",
                    qp.recoveries()
                ));
            }
        }
        // The writes the reset ended may or may not have reached the medium:
        // write them again, then every block must read back right through
        // the re-created queues.
        for &(p, off) in &rewrite {
            pattern::fill(new_seed, off, &mut io);
            qps[p]
                .write_blocking(LUN, off >> shift, &io)
                .map_err(ctx("rewriting after the reset"))?;
        }
        let verify = |qps: &mut Vec<UfsQueuePair>, when: &str| -> Result<(), Failure> {
            let mut back = vec![0u8; ((READS + WRITES) * IO) as usize];
            for p in 0..pairs {
                // Read each region through the other pair too.
                let qp = &mut qps[(p + 1) % pairs];
                qp.read_blocking(LUN, base(p) >> shift, &mut back)
                    .map_err(ctx("reading back"))?;
                let (r, w) = back.split_at((READS * IO) as usize);
                let bad = pattern::first_mismatch(old_seed, base(p), r).or_else(|| {
                    pattern::first_mismatch(new_seed, base(p) + READS * IO, w)
                        .map(|(at, a, b)| (at + READS * IO, a, b))
                });
                if let Some((at, want, got)) = bad {
                    return Err(format!(
                        "{when}: region of pair {p} differs at byte {at}: expected {want:#018x}, found {got:#018x}"
                    ));
                }
            }
            Ok(())
        };
        verify(&mut qps, "after the reset")?;
        println!(
            "every block reads back right after the reset ({} MiB, {} write(s) repeated)",
            (pairs as u64 * (READS + WRITES) * IO) >> 20,
            rewrite.len()
        );
        // A second reset with nothing in flight: the pairs recover again.
        ctrl.reset().map_err(ctx("second reset"))?;
        verify(&mut qps, "after a second reset")?;
        println!(
            "second reset (idle): the queue pairs recovered again; {} resets, {} bytes leaked",
            ctrl.resets(),
            ctrl.leaked_bytes()
        );
        if ctrl.leaked_bytes() != 0 {
            return Err("buffers were leaked".into());
        }
        for qp in qps {
            qp.close(|_| {}).map_err(ctx("closing a queue pair"))?;
        }
        Ok(())
    }

    /// Check that `[offset, offset+len)` is block-aligned and inside LU 0.
    fn check_range(ctrl: &UfsController, offset: u64, len: u64) -> Result<u32, Failure> {
        let (shift, size) = lu0(ctrl)?;
        let mask = (1u64 << shift) - 1;
        if len == 0 || offset & mask != 0 || len & mask != 0 {
            return Err(format!(
                "offset {offset} and length {len} must be non-zero multiples of the {}-byte block size",
                1u64 << shift
            ));
        }
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(format!(
                "range {offset}+{len} is past the end of LU {LUN} ({size} bytes)"
            ));
        }
        Ok(shift)
    }

    const CHUNK: u64 = 1 << 20;

    pub fn write_pattern(a: &UfsPatternArgs) -> Result<(), Failure> {
        let ctrl = open(&a.dev, Some(1))?;
        let p = a.region;
        let shift = check_range(&ctrl, p.offset, p.len)?;
        let mut qp: UfsQueuePair = ctrl.create_qpair().map_err(ctx("creating a queue pair"))?;
        let mut buf = vec![0u8; CHUNK as usize];
        let mut done = 0;
        while done < p.len {
            let n = (p.len - done).min(CHUNK) as usize;
            let at = p.offset + done;
            pattern::fill(p.seed, at, &mut buf[..n]);
            qp.write_blocking(LUN, at >> shift, &buf[..n])
                .map_err(ctx("write"))?;
            done += n as u64;
        }
        qp.flush_blocking(LUN).map_err(ctx("flush"))?;
        println!(
            "wrote {} bytes of pattern seed {} at offset {} (LBA {}) of LU {LUN} through {} ({:?}), flushed",
            p.len,
            p.seed,
            p.offset,
            p.offset >> shift,
            ctrl.backend().name(),
            ctrl.mode()
        );
        qp.close(|_| {}).map_err(ctx("closing the queue pair"))
    }

    pub fn check_pattern(a: &UfsPatternArgs) -> Result<(), Failure> {
        let ctrl = open(&a.dev, Some(1))?;
        let p = a.region;
        let shift = check_range(&ctrl, p.offset, p.len)?;
        let mut qp: UfsQueuePair = ctrl.create_qpair().map_err(ctx("creating a queue pair"))?;
        let mut buf = vec![POISON; CHUNK as usize];
        let mut done = 0;
        while done < p.len {
            let n = (p.len - done).min(CHUNK) as usize;
            let at = p.offset + done;
            buf[..n].fill(POISON);
            qp.read_blocking(LUN, at >> shift, &mut buf[..n])
                .map_err(ctx("read"))?;
            if let Some((off, want, found)) = pattern::first_mismatch(p.seed, at, &buf[..n]) {
                return Err(format!(
                    "pattern seed {} differs at byte offset {off} (LBA {}): expected {want:#018x}, found {found:#018x}",
                    p.seed,
                    off >> shift
                ));
            }
            done += n as u64;
        }
        println!(
            "read {} bytes at offset {} (LBA {}) of LU {LUN} through {} ({:?}): identical to pattern seed {}",
            p.len,
            p.offset,
            p.offset >> shift,
            ctrl.backend().name(),
            ctrl.mode(),
            p.seed
        );
        qp.close(|_| {}).map_err(ctx("closing the queue pair"))
    }

    pub fn abort(a: &UfsDevArgs) -> Result<(), Failure> {
        use mcqio::ufs::UfsError;
        use mcqio::IoError;
        let ctrl = open(a, Some(1))?;
        let (shift, size) = lu0(&ctrl)?;
        let mut qp: UfsQueuePair = ctrl.create_qpair().map_err(ctx("creating a queue pair"))?;
        const N: u64 = 16;
        const LEN: u64 = 64 << 10;
        let base = size / 4;
        let seed = 0x6162_6f72_745f_7566;
        let mut data = vec![0u8; (N * LEN) as usize];
        pattern::fill(seed, base, &mut data);
        qp.write_blocking(LUN, base >> shift, &data)
            .map_err(ctx("write"))?;
        for t in 0..N {
            let mut buf = ctrl
                .alloc_buf(LEN as usize, DmaDir::Bidirectional)
                .map_err(ctx("allocating a buffer"))?;
            buf.fill(POISON);
            qp.read(
                LUN,
                (base + t * LEN) >> shift,
                (LEN >> shift) as u32,
                buf,
                t,
            )
            .map_err(|e| format!("read {t}: {:?}", e.kind))?;
        }
        qp.submit();
        // Newest first: the most likely to be still queued.
        let mut asked = 0;
        let mut refused = None;
        for t in (0..N).rev() {
            match qp.abort(t) {
                Ok(true) => asked += 1,
                Ok(false) => {}
                // QEMU 10.0's MCQ has no SQ stop (SQRTC/SQRTS): the engine
                // must say so with a typed error and lose nothing.
                Err(e @ mcqio::Error::Timeout { .. }) => {
                    refused = Some(e.to_string());
                    break;
                }
                Err(e) => return Err(format!("abort: {e}")),
            }
        }
        if let Some(e) = &refused {
            println!("the controller cannot abort (typed error: {e}); every command must still complete once");
        }
        let mut seen = [0u32; N as usize];
        let (mut ok, mut aborted) = (0, 0);
        let mut err: Option<Failure> = None;
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        while qp.outstanding() > 0 {
            if Instant::now() > deadline {
                return Err(format!("{} command(s) never completed", qp.outstanding()));
            }
            qp.poll(usize::MAX, |c| {
                let Some(n) = seen.get_mut(c.tag as usize) else {
                    err.get_or_insert(format!("completion for unknown tag {}", c.tag));
                    return;
                };
                *n += 1;
                match (&c.result, c.buf) {
                    (Ok(()), Some(b)) => {
                        let off = (c.tag * LEN) as usize;
                        if b.to_vec() != data[off..off + LEN as usize] {
                            err.get_or_insert(format!("read {} completed with wrong data", c.tag));
                        }
                        ok += 1;
                    }
                    (Err(IoError::Aborted), Some(_))
                    | (Err(IoError::Ufs(UfsError::Transport(_))), Some(_)) => aborted += 1,
                    (r, b) => {
                        err.get_or_insert(format!(
                            "read {}: unexpected outcome {r:?} (buffer back: {})",
                            c.tag,
                            b.is_some()
                        ));
                    }
                }
            })
            .map_err(ctx("poll"))?;
            if let Some(e) = err.take() {
                return Err(e);
            }
        }
        if let Some((t, n)) = seen.iter().enumerate().find(|(_, &n)| n != 1) {
            return Err(format!("read {t} completed {n} times"));
        }
        println!(
            "{N} reads, {asked} abort(s) accepted: {aborted} ended aborted, {ok} completed with correct data; each exactly once"
        );
        let mut back = vec![POISON; LEN as usize];
        qp.read_blocking(LUN, base >> shift, &mut back)
            .map_err(ctx("read after the aborts"))?;
        if back[..] != data[..LEN as usize] {
            return Err("after the aborts a normal read returned wrong data".into());
        }
        println!("after the aborts the queue pair reads correctly");
        qp.close(|_| {}).map_err(ctx("closing the queue pair"))
    }

    pub fn dma_after_unmap(a: &UfsDevArgs) -> Result<(), Failure> {
        let ctrl = open(a, Some(1))?;
        let (shift, size) = lu0(&ctrl)?;
        let mut qp: UfsQueuePair = ctrl.create_qpair().map_err(ctx("creating a queue pair"))?;
        check_dma_after_unmap(&mut qp, ctrl.dma(), LUN, shift, size, 0x6d63_7169_6f5f_7566)?;
        qp.close(|_| {}).map_err(ctx("closing the queue pair"))
    }
}

fn main() -> ExitCode {
    // The library logs through `log`; RUST_LOG=debug (or warn, trace) shows it.
    env_logger::init();
    let cli = Cli::parse();
    let res = match &cli.cmd {
        Cmd::Identify(a) => identify(a),
        Cmd::Rw(a) => rw(a),
        Cmd::Commands(a) => commands(a),
        Cmd::Reset(a) => reset(a),
        Cmd::DmaAfterUnmap(a) => dma_after_unmap(a),
        Cmd::MapBench(a) => map_bench(a),
        Cmd::WritePattern(a) => write_pattern(a),
        Cmd::CheckPattern(a) => check_pattern(a),
        Cmd::GenPattern(p) => gen_pattern(p),
        Cmd::UfsBringup(a) => ufs::bringup(a),
        Cmd::UfsRw(a) => ufs::rw(a),
        Cmd::UfsDmaAfterUnmap(a) => ufs::dma_after_unmap(a),
        Cmd::UfsAbort(a) => ufs::abort(a),
        Cmd::UfsReset(a) => ufs::reset(a),
        Cmd::UfsWritePattern(a) => ufs::write_pattern(a),
        Cmd::UfsCheckPattern(a) => ufs::check_pattern(a),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("mcqio-vm-tests: FAIL: {why}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_positional_and_seeded() {
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 4096];
        pattern::fill(7, 8192, &mut a);
        pattern::fill(7, 8192, &mut b);
        assert_eq!(a, b);
        assert_eq!(pattern::first_mismatch(7, 8192, &a), None);
        // Same data checked at another offset or with another seed fails.
        assert_eq!(
            pattern::first_mismatch(7, 8192 + 512, &a).map(|m| m.0),
            Some(8192 + 512)
        );
        assert!(pattern::first_mismatch(8, 8192, &a).is_some());
        // A region is the concatenation of its parts.
        let mut tail = vec![0u8; 2048];
        pattern::fill(7, 8192 + 2048, &mut tail);
        assert_eq!(&a[2048..], &tail[..]);
    }

    #[test]
    fn extents_do_not_overlap_and_stay_in_their_slice() {
        let mut rng = SmallRng::seed_from_u64(3);
        let v = make_extents(&mut rng, 1 << 20, 64 << 20, 16 << 20, 4096, 1 << 20).unwrap();
        assert!(v.iter().map(|e| e.len).sum::<u64>() >= 16 << 20);
        for w in v.windows(2) {
            assert!(w[0].offset + w[0].len <= w[1].offset);
        }
        for e in &v {
            assert!(e.offset >= 1 << 20 && e.offset + e.len <= 65 << 20);
            assert!(e.len >= 4096 && e.len <= 1 << 20 && e.len % 4096 == 0);
        }
        assert!(make_extents(&mut rng, 0, 1 << 20, 4 << 20, 4096, 1 << 20).is_err());
    }
}
