//! `dma-after-unmap` and `map-bench`: what the IOMMU does for the checks, on
//! NVMe (and the shared unmap check UFS runs too).

use super::*;

pub(crate) fn dma_after_unmap(a: &DevArgs) -> Result<(), Failure> {
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
pub(crate) trait BlockingIo: BlockQueue<Buf = DmaBuf> {
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
pub(crate) fn check_dma_after_unmap<Q: BlockingIo>(
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
pub(crate) fn map_bench(a: &MapBenchArgs) -> Result<(), Failure> {
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
