//! Application buffers with per-I/O DMA mapping (strict and lazy modes).
//!
//! ```text
//! app_buffers [DEVICE] [MODE]   DEVICE = fake[,...] (default) | vfio:<BDF>
//!                               MODE   = strict | lazy (default) | lazy:<batch>
//! ```
//!
//! The program owns ordinary memory (`AppBuffer`: page-aligned, not mapped
//! for the device). A queue pair created with `QpairOptions::mapping`
//! strict or lazy maps each buffer when its I/O is submitted and hands it
//! back only after the unmap (lazy: the batched flush) returned, so the
//! device can never reach a buffer the program holds. Data at LBA 0.. of
//! the first namespace is overwritten.

use std::process::ExitCode;
use std::time::Duration;

use mcqio::vfio::AppBuffer;
use mcqio::{MappingMode, QpairOptions};
use mcqio_open::{Device, DeviceSpec, SpecError};

const IOS: usize = 32;

fn mode(s: &str) -> Result<MappingMode, String> {
    let max_delay = Duration::from_millis(10);
    match s {
        "strict" => Ok(MappingMode::Strict),
        "lazy" => Ok(MappingMode::Lazy {
            batch: 8,
            max_delay,
        }),
        _ => match s.strip_prefix("lazy:").map(str::parse) {
            Some(Ok(batch)) if batch > 0 => Ok(MappingMode::Lazy { batch, max_delay }),
            _ => Err(format!(
                "unknown mode {s:?}: use strict, lazy or lazy:<batch> (batch >= 1)"
            )),
        },
    }
}

fn run(spec: &str, mode: MappingMode) -> Result<(), Box<dyn std::error::Error>> {
    let spec: DeviceSpec = spec.parse().map_err(|e: SpecError| e.to_string())?;
    let Device::Nvme(ctrl) = spec.open("app_buffers")?.device else {
        return Err(format!(
            "`{spec}` is a UFS device: app_buffers needs NVMe (per-I/O DMA mapping is NVMe's)"
        )
        .into());
    };
    let ns = ctrl
        .namespaces()
        .first()
        .ok_or("the controller has no active namespace")?
        .clone();
    // One I/O = 4 KiB or one block, whichever is larger.
    let nlb = (4096 / ns.lba_size).max(1) as u32;
    let len = nlb as usize * ns.lba_size as usize;
    if (IOS as u64) * u64::from(nlb) > ns.nsze {
        return Err(format!("namespace {} is too small for {IOS} I/Os", ns.id).into());
    }
    let mut qp = ctrl.create_mapped_qpair(QpairOptions {
        mapping: mode.clone(),
        ..QpairOptions::default()
    })?;
    println!(
        "{}: namespace {} ({} B blocks), {} mode, {IOS} I/Os of {len} B",
        ctrl.backend().name(),
        ns.id,
        ns.lba_size,
        qp.mode()
    );

    // Write: each buffer holds its index.
    for i in 0..IOS {
        let mut b = AppBuffer::for_space(ctrl.dma(), len)?;
        b.as_mut_slice().fill(i as u8 + 1);
        qp.write(ns.id, (i as u64) * u64::from(nlb), nlb, b, i as u64)
            .map_err(|e| e.to_string())?;
    }
    qp.submit();
    let mut free = Vec::new();
    while free.len() < IOS {
        qp.poll(64, |c| {
            if let Err(e) = c.result {
                eprintln!("write {} failed: {e}", c.tag);
            }
            // Back from the queue only once unmapped: safe to reuse.
            free.extend(c.buf);
        })?;
    }
    if free.len() != IOS {
        return Err("a buffer was not handed back".into());
    }

    // Read back into the same (now unmapped) buffers, cleared first.
    for (i, mut b) in free.into_iter().enumerate() {
        b.as_mut_slice().fill(0);
        qp.read(ns.id, (i as u64) * u64::from(nlb), nlb, b, i as u64)
            .map_err(|e| e.to_string())?;
    }
    qp.submit();
    let mut checked = 0;
    let mut bad = 0;
    while checked < IOS {
        qp.poll(64, |c| {
            checked += 1;
            let ok = c.result.is_ok()
                && c.buf
                    .as_ref()
                    .is_some_and(|b| b.as_slice()[..len].iter().all(|&x| x == c.tag as u8 + 1));
            if !ok {
                bad += 1;
            }
        })?;
    }
    let st = qp.mapper_stats();
    println!(
        "read back {IOS} buffers: {} ok; IOMMU: {} maps, {} unmaps in {} unmap calls",
        IOS - bad,
        st.maps,
        st.unmaps,
        st.unmap_calls
    );
    qp.close(|_| {})?;
    if bad > 0 {
        return Err(format!("{bad} buffers read back wrong").into());
    }
    Ok(())
}

fn main() -> ExitCode {
    env_logger::init();
    let mut args = std::env::args().skip(1);
    let spec = args.next().unwrap_or_else(|| "fake".into());
    let mode = match mode(&args.next().unwrap_or_else(|| "lazy".into())) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("app_buffers: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&spec, mode) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("app_buffers: {e}");
            ExitCode::FAILURE
        }
    }
}
