//! `irq`: the device's interrupt vectors through VFIO as eventfds. The admin queue always interrupts on vector 0, so routing
//! the vectors and running admin commands must signal vector 0's eventfd
//! once per completion — delivered by the real MSI-X path (QEMU's NVMe
//! writes the message, the vIOMMU remaps it, the kernel's VFIO handler
//! signals the eventfd), counted in /proc/interrupts too.

use super::*;
use mcqio::vfio::{IrqKind, Notifier};

/// Interrupts the kernel counted for VFIO vectors (the `vfio-msix[N](<BDF>)`,
/// `vfio-msi` and `vfio-intx` lines of /proc/interrupts), summed over CPUs.
pub(crate) fn vfio_interrupts() -> u64 {
    let Ok(t) = std::fs::read_to_string("/proc/interrupts") else {
        return 0;
    };
    t.lines()
        .filter(|l| l.contains("vfio-"))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .map_while(|w| w.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

pub(crate) fn irq(a: &DevArgs) -> Result<(), Failure> {
    let ctrl = open(a)?;
    let irqs = ctrl
        .backend()
        .interrupts()
        .ok_or_else(|| format!("{} offers no interrupts", ctrl.backend().name()))?;
    let kind = irqs.kind();
    println!("interrupts:  {kind:?}");
    if !matches!(kind, IrqKind::MsiX { vectors } if vectors >= 2) {
        return Err(format!(
            "expected MSI-X with an admin and an I/O vector, got {kind:?}"
        ));
    }
    let n: Vec<Arc<Notifier>> = (0..2)
        .map(|_| Notifier::new().map(Arc::new))
        .collect::<std::io::Result<_>>()
        .map_err(ctx("eventfd"))?;
    irqs.route(&n)
        .map_err(ctx("routing MSI-X vectors 0 and 1"))?;
    let kernel_before = vfio_interrupts();
    const ROUNDS: u64 = 8;
    for _ in 0..ROUNDS {
        n[0].take();
        ctrl.admin_read(
            mcqio::nvme::spec::sqe::Identify::namespace(NSID).sqe(),
            "Identify Namespace",
        )
        .map_err(ctx("Identify Namespace"))?;
        // The command completed by polling; its interrupt may trail the
        // entry by the message's trip through the vIOMMU and the kernel.
        if !n[0]
            .wait(Some(COMMAND_TIMEOUT))
            .map_err(ctx("waiting on vector 0"))?
        {
            return Err(format!(
                "no interrupt on vector 0 within {COMMAND_TIMEOUT:?} of an admin completion"
            ));
        }
    }
    let kernel = vfio_interrupts().saturating_sub(kernel_before);
    println!("vector 0:    signalled after each of {ROUNDS} admin completions; /proc/interrupts: +{kernel}");
    // The fake's messages bypass the kernel; a VFIO device's are counted.
    if a.device.starts_with("vfio:") && kernel < ROUNDS {
        return Err(format!(
            "/proc/interrupts counted {kernel} VFIO interrupts for {ROUNDS} admin completions"
        ));
    }
    // No I/O CQ has IEN yet: vector 1 stays quiet.
    let quiet = n[1].take();
    irqs.unroute().map_err(ctx("unrouting"))?;
    if quiet != 0 {
        return Err(format!("vector 1 fired {quiet} time(s) with no CQ on it"));
    }
    engine_wait(a, &ctrl)
}

/// The engine's side: an I/O queue pair created with
/// `WaitPolicy::Interrupt` (its CQ with IEN and its own vector) sleeps in
/// `wait` and is woken by its MSI-X vector after each read.
fn engine_wait(a: &DevArgs, ctrl: &Arc<mcqio::Controller>) -> Result<(), Failure> {
    let mut qp = ctrl
        .create_qpair(mcqio::QpairOptions {
            depth: 4,
            wait: mcqio::WaitPolicy::Interrupt,
            ..Default::default()
        })
        .map_err(ctx("creating a queue pair that waits on interrupts"))?;
    let vector = qp.interrupt_vector();
    let kernel_before = vfio_interrupts();
    // Whether a wait sleeps depends on whether QEMU has answered before the
    // wait's first polls end: under TCG a 4 KiB read often has (seen: 16
    // reads, 0 sleeps). So read 256 KiB at a time, and go on until a few
    // waits were woken by the vector, within a bound that fails the step.
    const WANT_WOKEN: u64 = 4;
    const MAX_READS: u64 = 512;
    const BYTES: u32 = 256 << 10;
    let ns = ctrl
        .namespaces()
        .iter()
        .find(|n| n.id == NSID)
        .ok_or("namespace 1 is missing")?;
    let lba = u32::try_from(ns.lba_size).map_err(|_| "odd block size")?;
    let blocks = (BYTES / lba.max(1)).max(1);
    let span = (ns.nsze / u64::from(blocks)).clamp(1, 256);
    let mut buf = Some(
        ctrl.alloc_buf(BYTES as usize, mcqio::vfio::DmaDir::FromDevice)
            .map_err(ctx("buffer"))?,
    );
    let mut reads = 0u64;
    while reads < MAX_READS && qp.counters().interrupt_wakeups < WANT_WOKEN {
        let i = reads;
        let b = buf.take().ok_or("a read came back without its buffer")?;
        qp.read(NSID, (i % span) * u64::from(blocks), blocks, b, i)
            .map_err(|e| format!("read {i}: {}", e.kind))?;
        qp.submit();
        let mut result = None;
        let n = qp
            .wait(1, Some(COMMAND_TIMEOUT), |c| {
                result = Some(c.result);
                buf = c.buf;
            })
            .map_err(ctx("wait"))?;
        match result {
            Some(Ok(())) if n == 1 => {}
            r => return Err(format!("read {i}: waited {n}, ended {r:?}")),
        }
        reads += 1;
    }
    let c = qp.counters();
    let kernel = vfio_interrupts().saturating_sub(kernel_before);
    println!(
        "engine wait: queue {} on vector {vector:?}: {reads} reads of 256 KiB, {} sleeps, {} woken by the vector; /proc/interrupts: +{kernel}",
        qp.qid(),
        c.interrupt_sleeps,
        c.interrupt_wakeups
    );
    if vector != Some(qp.qid()) {
        return Err(format!("queue {} got vector {vector:?}", qp.qid()));
    }
    if c.interrupt_wakeups == 0 {
        return Err("no wait was woken by the queue's vector".into());
    }
    if a.device.starts_with("vfio:") && kernel < c.interrupt_wakeups {
        return Err(format!(
            "/proc/interrupts counted {kernel} VFIO interrupts for {} wake-ups",
            c.interrupt_wakeups
        ));
    }
    Ok(())
}
