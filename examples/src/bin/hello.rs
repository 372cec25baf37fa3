//! Hello, NVMe: open a controller, write a block pattern, read it back, compare.
//!
//! ```text
//! hello [DEVICE]      DEVICE = fake[,lbs=,lbads=,ns=,size=,latency=,qpairs=,sync=] (default: fake)
//!                     | vfio:<BDF>, e.g. vfio:0000:00:03.0 (the syntax and defaults of mcqio-perf -d)
//! ```
//!
//! With `vfio:` the device must be bound to vfio-pci (`mcqio-perf doctor <BDF>`
//! explains what is missing). Data at LBA 0.. of the first namespace is overwritten.

use std::process::ExitCode;
use std::sync::Arc;

use mcqio::vfio::{Backend, DmaDir};
use mcqio::{Controller, ControllerOptions, QpairOptions};
use mcqio_examples::devstr::{DeviceSpec, SpecError};

fn open(spec: &str) -> Result<Arc<dyn Backend>, String> {
    let spec: DeviceSpec = spec.parse().map_err(|e: SpecError| e.to_string())?;
    spec.open_backend("hello").map_err(|e| e.to_string())
}

fn run(spec: &str) -> Result<(), Box<dyn std::error::Error>> {
    let ctrl = Controller::new(open(spec)?, ControllerOptions::default())?;
    let id = ctrl.identify();
    let ns = ctrl
        .namespaces()
        .first()
        .ok_or("the controller has no active namespace")?
        .clone();
    println!(
        "{}: {} (serial {}), namespace {}: {} blocks of {} B",
        ctrl.backend().name(),
        id.model,
        id.serial,
        ns.id,
        ns.nsze,
        ns.lba_size
    );

    let mut qp = ctrl.create_qpair(QpairOptions::default())?;

    // 1. The blocking API: any byte slice, bounced through DMA memory.
    let len = (1usize << 20).min(ns.size_bytes() as usize);
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
    qp.write_blocking(ns.id, 0, &data)?;
    let mut back = vec![0u8; len];
    qp.read_blocking(ns.id, 0, &mut back)?;
    if back != data {
        return Err("read-back differs from what was written".into());
    }
    println!("blocking: wrote and read back {len} bytes: OK");

    // 2. The asynchronous API: DMA buffers moved through the queue, tags, poll.
    let bs = ns.lba_size as usize;
    let bufs = ctrl.alloc_buf(8 * bs, DmaDir::Bidirectional)?.chunks(bs)?;
    for (i, mut b) in bufs.into_iter().enumerate() {
        b.fill(i as u8 + 1);
        qp.write(ns.id, i as u64, 1, b, i as u64)
            .map_err(|e| e.kind)?;
    }
    qp.submit(); // one doorbell for all eight
    let mut done = 0;
    let mut returned = Vec::new();
    while done < 8 {
        done += qp.poll(32, |c| {
            c.result.expect("write failed");
            returned.push(c.buf.expect("data buffer"));
        })?;
    }
    for (i, b) in returned.into_iter().enumerate() {
        qp.read(ns.id, i as u64, 1, b, i as u64)
            .map_err(|e| e.kind)?;
    }
    let mut ok = 0;
    while ok < 8 {
        qp.poll(32, |c| {
            c.result.expect("read failed");
            let b = c.buf.expect("data buffer");
            let mut first = [0u8; 1];
            b.read_at(0, &mut first).expect("in bounds");
            assert_eq!(first[0], c.tag as u8 + 1, "block {}", c.tag);
            ok += 1;
        })?;
    }
    println!("async: 8 writes + 8 reads with tags: OK ({:?})", qp.stats());
    Ok(())
}

fn main() -> ExitCode {
    // The library logs through `log`; RUST_LOG=debug (or warn, trace) shows it.
    env_logger::init();
    let spec = std::env::args().nth(1).unwrap_or_else(|| "fake".into());
    match run(&spec) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hello: {e}");
            ExitCode::FAILURE
        }
    }
}
