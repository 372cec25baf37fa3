//! Hello, NVMe (or UFS): open a controller, write a block pattern, read it back, compare.
//!
//! ```text
//! hello [DEVICE]      DEVICE = fake[,lbs=,lbads=,ns=,size=,latency=,qpairs=,sync=] (default: fake)
//!                     | fake-ufs[,mcq=on|off,queues=,lus=,size=,latency=,sync=]
//!                     | vfio:<BDF>, e.g. vfio:0000:00:03.0 (or the fio engine's vfio-0000.00.03.0),
//!                       NVMe or UFS (the syntax and defaults of mcqio-perf -d)
//! ```
//!
//! With `vfio:` the device must be bound to vfio-pci (`mcqio-perf doctor <BDF>`
//! explains what is missing). Data at LBA 0.. of the first namespace is overwritten.

use std::process::ExitCode;
use std::sync::Arc;

use mcqio::ufs::UfsController;
use mcqio::vfio::DmaDir;
use mcqio::QpairOptions;
use mcqio_open::{Device, DeviceSpec, SpecError};

fn open(spec: &str) -> Result<Device, String> {
    let spec: DeviceSpec = spec.parse().map_err(|e: SpecError| e.to_string())?;
    Ok(spec.open("hello").map_err(|e| e.to_string())?.device)
}

/// The same on a UFS host controller: LU 0, blocking then asynchronous.
fn run_ufs(ctrl: Arc<UfsController>) -> Result<(), Box<dyn std::error::Error>> {
    let lu = *ctrl
        .logical_units()
        .first()
        .ok_or("the device has no logical unit")?;
    println!(
        "{}: UFS {:#06x}, {:?}, LU {}: {} blocks of {} B",
        ctrl.backend().name(),
        ctrl.device_descriptor().spec_version,
        ctrl.mode(),
        lu.lun,
        lu.blocks,
        lu.block_len
    );
    let mut qp = ctrl.create_qpair(Default::default())?;
    let bs = lu.block_len as usize;
    let len = (1usize << 20).min((lu.blocks as usize).saturating_mul(bs)) / bs * bs;
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
    qp.write_blocking(lu.lun, 0, &data)?;
    let mut back = vec![0u8; len];
    qp.read_blocking(lu.lun, 0, &mut back)?;
    if back != data {
        return Err("read-back differs from what was written".into());
    }
    println!("blocking: wrote and read back {len} bytes: OK");

    let n = 8.min(qp.depth()).min(lu.blocks as usize);
    let bufs = ctrl.alloc_buf(n * bs, DmaDir::Bidirectional)?.chunks(bs)?;
    for (i, mut b) in bufs.into_iter().enumerate() {
        b.fill(i as u8 + 1);
        qp.write(lu.lun, i as u64, 1, b, i as u64)
            .map_err(|e| e.kind)?;
    }
    qp.submit(); // one doorbell for the batch
    let mut returned = Vec::new();
    let mut failed = None;
    while returned.len() + usize::from(failed.is_some()) < n {
        qp.poll(32, |c| match (c.result, c.buf) {
            (Ok(()), Some(b)) => returned.push(b),
            (Err(e), _) => failed = Some(e.to_string()),
            (Ok(()), None) => failed = Some("a completion without its buffer".into()),
        })?;
    }
    if let Some(e) = failed {
        return Err(format!("write failed: {e}").into());
    }
    for (i, b) in returned.into_iter().enumerate() {
        qp.read(lu.lun, i as u64, 1, b, i as u64)
            .map_err(|e| e.kind)?;
    }
    qp.submit();
    let mut ok = 0;
    let mut bad = None;
    while ok + usize::from(bad.is_some()) < n {
        qp.poll(32, |c| {
            let mut first = [0u8; 1];
            match (c.result, c.buf) {
                (Ok(()), Some(b))
                    if b.read_at(0, &mut first).is_ok() && first[0] == c.tag as u8 + 1 =>
                {
                    ok += 1
                }
                (r, _) => bad = Some(format!("block {}: {r:?}, first byte {}", c.tag, first[0])),
            }
        })?;
    }
    if let Some(e) = bad {
        return Err(format!("read-back differs: {e}").into());
    }
    println!(
        "async: {n} writes + {n} reads with tags: OK ({:?})",
        qp.stats()
    );
    Ok(())
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
