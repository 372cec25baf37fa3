//! Print what a controller and its namespaces (or a UFS device and its
//! logical units) report.
//!
//! ```text
//! identify [DEVICE]   DEVICE = fake[,lbs=,lbads=,ns=,size=,latency=,qpairs=,sync=] (default: fake)
//!                     | fake-ufs[,mcq=on|off,queues=,lus=,size=,latency=,sync=]
//!                     | vfio:<BDF> (or vfio-0000.00.03.0), NVMe or UFS (the syntax and defaults of mcqio-perf -d)
//! ```

use std::process::ExitCode;
use std::sync::Arc;

use mcqio::ufs::{UfsController, UfsMode};
use mcqio_open::{Device, DeviceSpec, SpecError};

fn open(spec: &str) -> Result<Device, String> {
    let spec: DeviceSpec = spec.parse().map_err(|e: SpecError| e.to_string())?;
    Ok(spec.open("identify").map_err(|e| e.to_string())?.device)
}

/// A UFS device: its descriptors, the transfer mode and the logical units.
fn run_ufs(ctrl: Arc<UfsController>) -> Result<(), Box<dyn std::error::Error>> {
    let d = ctrl.device_descriptor();
    let g = ctrl.geometry();
    println!(
        "device            {} (UFS host controller)",
        ctrl.backend().name()
    );
    println!("UFS version       {:#06x}", d.spec_version);
    println!("manufacturer      {:#06x}", d.manufacturer);
    println!("LUs (bNumberLU)   {} (well-known: {})", d.lus, d.wlus);
    println!("bQueueDepth       {}", d.queue_depth);
    println!(
        "raw capacity      {} MiB ({} x 512 B)",
        g.raw_capacity_512 >> 11,
        g.raw_capacity_512
    );
    println!(
        "max LUs           {}, segment {} x 512 B, min block {} x 512 B",
        g.max_lus, g.segment_size_512, g.min_block_512
    );
    match ctrl.mode() {
        UfsMode::Mcq { queues } => println!("transfer mode     MCQ, {queues} queue(s)"),
        UfsMode::Legacy => println!("transfer mode     legacy single doorbell"),
    }
    println!("depth per queue   {}", ctrl.depth());
    for lu in ctrl.logical_units() {
        println!(
            "  LU {:>3}: {:>12} blocks x {:>5} B = {:>8} MiB",
            lu.lun,
            lu.blocks,
            lu.block_len,
            (lu.blocks.saturating_mul(u64::from(lu.block_len))) >> 20
        );
    }
    Ok(())
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn run(spec: &str) -> Result<(), Box<dyn std::error::Error>> {
    let ctrl = match open(spec)? {
        Device::Nvme(ctrl) => ctrl,
        Device::Ufs(ctrl) => return run_ufs(ctrl),
        Device::Tcp(_) => {
            return Err(format!(
                "{} runs on fake, fake-ufs and vfio: devices; drive an NVMe/TCP target with mcqio-perf -d tcp:…",
                env!("CARGO_BIN_NAME")
            )
            .into())
        }
    };
    let id = ctrl.identify();
    let cap = ctrl.cap();
    println!("device            {}", ctrl.backend().name());
    println!("model             {}", id.model);
    println!("serial            {}", id.serial);
    println!("firmware          {}", id.firmware);
    println!(
        "vendor            {:#06x} (subsystem {:#06x})",
        id.vid, id.ssvid
    );
    println!("NVMe version      {}", ctrl.version());
    println!("max queue entries {}", cap.max_queue_entries());
    println!(
        "doorbell stride   {} B",
        mcqio::nvme::spec::regs::doorbell_stride(cap.dstrd())
    );
    println!("ready timeout     {} ms", cap.timeout_ms());
    match id.max_transfer_bytes(12) {
        Some(b) => println!(
            "MDTS              {} ({} KiB per command)",
            id.mdts,
            b >> 10
        ),
        None => println!("MDTS              0 (no limit)"),
    }
    println!("I/O queues        {} granted", ctrl.granted_io_queues());
    println!(
        "namespaces        {} (NN = {})",
        ctrl.namespaces().len(),
        id.nn
    );
    println!("write cache       {}", yes(id.has_volatile_write_cache()));
    println!("write zeroes      {}", yes(id.supports_write_zeroes()));
    println!("deallocate (DSM)  {}", yes(id.supports_dsm()));
    println!("SGL               {}", yes(id.supports_sgl()));
    println!(
        "shadow doorbells  {} (in use: {})",
        yes(id.supports_doorbell_buffer()),
        yes(ctrl.shadow_doorbells())
    );
    for ns in ctrl.namespaces() {
        let i = &ns.identify;
        println!(
            "  ns {:>3}: {:>12} blocks x {:>5} B = {:>8} MiB  (capacity {}, used {}, format {} of {}, metadata {} B)",
            ns.id,
            ns.nsze,
            ns.lba_size,
            ns.size_bytes() >> 20,
            i.ncap,
            i.nuse,
            i.format_index(),
            i.lba_formats.len(),
            i.metadata_size()
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    // The library logs through `log`; RUST_LOG=debug (or warn, trace) shows it.
    env_logger::init();
    let spec = std::env::args().nth(1).unwrap_or_else(|| "fake".into());
    match run(&spec) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("identify: {e}");
            ExitCode::FAILURE
        }
    }
}
