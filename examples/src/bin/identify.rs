//! Print what a controller and its namespaces report.
//!
//! ```text
//! identify [DEVICE]   DEVICE = fake[,lbs=,lbads=,ns=,size=,latency=,qpairs=,sync=] (default: fake)
//!                     | vfio:<BDF> (the syntax and defaults of mcqio-perf -d)
//! ```

use std::process::ExitCode;
use std::sync::Arc;

use mcqio::vfio::Backend;
use mcqio::{Controller, ControllerOptions};
use mcqio_examples::devstr::{DeviceSpec, SpecError};

fn open(spec: &str) -> Result<Arc<dyn Backend>, String> {
    let spec: DeviceSpec = spec.parse().map_err(|e: SpecError| e.to_string())?;
    spec.open_backend("identify").map_err(|e| e.to_string())
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn run(spec: &str) -> Result<(), Box<dyn std::error::Error>> {
    let ctrl = Controller::new(open(spec)?, ControllerOptions::default())?;
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
        mcqio::spec::regs::doorbell_stride(cap.dstrd())
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
