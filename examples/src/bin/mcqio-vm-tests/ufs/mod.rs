//! The UFS checks: the same shape as the NVMe ones, on
//! [`mcqio::ufs::UfsController`] over the same VFIO backend.

use super::*;
use mcqio::ufs::{UfsController, UfsMode, UfsOptions, UfsQpairOptions, UfsQueuePair};

mod abort;
mod cross_check;
mod iommu;
mod irq;
mod reset;
mod rw;

pub(crate) use abort::abort;
pub(crate) use cross_check::{check_pattern, write_pattern};
pub(crate) use iommu::dma_after_unmap;
pub(crate) use irq::irq;
pub(crate) use reset::reset;
pub(crate) use rw::rw;

/// The LU every check uses.
pub(crate) const LUN: u8 = 0;
/// PCI class of a UFSHCI host controller (mass storage, UFS, UFSHCI).
pub(crate) const UFSHCI_CLASS: u32 = 0x01_09_01;

/// Open the device and bring the controller up.
pub(crate) fn open(a: &UfsDevArgs, queues: Option<u16>) -> Result<Arc<UfsController>, Failure> {
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
pub(crate) fn lu0(ctrl: &UfsController) -> Result<(u32, u64), Failure> {
    let lu = ctrl
        .logical_unit(LUN)
        .ok_or_else(|| format!("LU {LUN} is not reported by {}", ctrl.backend().name()))?;
    let size = lu
        .blocks
        .checked_mul(u64::from(lu.block_len))
        .ok_or("LU size overflows")?;
    Ok((lu.block_shift(), size))
}

pub(crate) fn bringup(a: &UfsDevArgs) -> Result<(), Failure> {
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
    let mut qp: UfsQueuePair = ctrl
        .create_qpair(Default::default())
        .map_err(ctx("creating a queue pair"))?;
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
