//! `ufs-irq`: the UFS host controller's interrupt through VFIO as an
//! eventfd. QEMU's UFS controller has INTx only: a
//! UIC command completion sets IS.UCCS, which with IE.UCCE asserts the
//! line; VFIO masks it on delivery, and the check clears IS (write 1 to
//! clear) and unmasks before the next round, as an interrupt-driven
//! waiter does.
//!
//! The line must also be unmasked once after it is routed, before the
//! first command. The first version of this check did not: it cleared the
//! eventfd and waited, and on QEMU 7.2 / 10.0 with a 6.1 guest nothing was
//! delivered in 30 s (the line stayed masked in vfio-pci: routing happens
//! while the command register's Interrupt Disable, set by open, is still
//! on, and clearing it through VFIO's virtual command register did not
//! leave the line live). With the unmask every UIC completion is
//! delivered. The engine's waiters unmask before every sleep, so they
//! never depended on it. `/proc/interrupts` shows the line as
//! `vfio-intx(<BDF>)` only while VFIO's handler is on it, so the count is
//! read before the line is unrouted.

use super::*;
use mcqio::vfio::{IrqKind, Mmio, Notifier};

/// Interrupt status / enable, UIC command registers (UFSHCI 4.0 §5.2–5.6).
const IS: usize = 0x20;
const IE: usize = 0x24;
const HCS: usize = 0x30;
const UICCMD: usize = 0x90;
const UCMDARG1: usize = 0x94;
const UCMDARG2: usize = 0x98;
const UCMDARG3: usize = 0x9C;
/// IS/IE bit 10: UIC command completion.
const UCCS: u32 = 1 << 10;
/// HCS bit 3: ready for a UIC command.
const UCRDY: u32 = 1 << 3;
/// DME_GET of PA_CONNECTEDTXDATALANES (0x1561), a read-only UniPro attribute.
const DME_GET: u32 = 0x01;
const PA_CONNECTED_TX_DATA_LANES: u32 = 0x1561;

fn wait_bits(regs: &dyn Mmio, off: usize, bits: u32) -> Result<(), Failure> {
    let t = Instant::now();
    while regs.read32(off) & bits != bits {
        if t.elapsed() > COMMAND_TIMEOUT {
            return Err(format!("register {off:#x} never showed {bits:#x}"));
        }
        std::thread::yield_now();
    }
    Ok(())
}

pub(crate) fn irq(a: &UfsDevArgs) -> Result<(), Failure> {
    let ctrl = open(a, None)?;
    let backend = ctrl.backend();
    let irqs = backend
        .interrupts()
        .ok_or_else(|| format!("{} offers no interrupts", backend.name()))?;
    let kind = irqs.kind();
    println!("interrupts:  {kind:?}");
    if kind == IrqKind::None {
        return Err("the controller has no interrupt the host can use".into());
    }
    let n = Arc::new(Notifier::new().map_err(ctx("eventfd"))?);
    irqs.route(std::slice::from_ref(&n))
        .map_err(ctx("routing the interrupt"))?;
    let regs = backend.regs();
    let ie0 = regs.read32(IE);
    // Only UIC completions interrupt during the check, so no other status
    // the idle engine left set asserts the line.
    regs.write32(IS, UCCS);
    regs.write32(IE, UCCS);
    // Unmask once before the first command, as a waiter arms before it
    // sleeps: a cause that stood when the line was routed (or any signal
    // before this point) left the line masked by vfio-pci, and the
    // eventfd cleared below would have been its only trace.
    n.take();
    irqs.unmask().map_err(ctx("unmask"))?;
    let kernel_before = vfio_interrupts();
    const ROUNDS: u64 = 8;
    let mut res = Ok(());
    for round in 0..ROUNDS {
        n.take();
        if let Err(e) = wait_bits(regs, HCS, UCRDY) {
            res = Err(e);
            break;
        }
        regs.write32(UCMDARG1, PA_CONNECTED_TX_DATA_LANES << 16);
        regs.write32(UCMDARG2, 0);
        regs.write32(UCMDARG3, 0);
        regs.write32(UICCMD, DME_GET);
        match n.wait(Some(COMMAND_TIMEOUT)) {
            Ok(true) => {}
            Ok(false) => {
                res = Err(format!(
                    "round {round}: no interrupt within {COMMAND_TIMEOUT:?} of a UIC command (IS {:#x}, IE {:#x}); {}",
                    regs.read32(IS),
                    regs.read32(IE),
                    line_state(&a.device)
                ));
                break;
            }
            Err(e) => {
                res = Err(format!("waiting on the eventfd: {e}"));
                break;
            }
        }
        if regs.read32(IS) & UCCS == 0 {
            res = Err(format!("round {round}: interrupted, but IS.UCCS is clear"));
            break;
        }
        // The handler's part: clear the cause, then unmask the line.
        regs.write32(IS, UCCS);
        if let Err(e) = irqs.unmask() {
            res = Err(format!("unmask: {e}"));
            break;
        }
    }
    regs.write32(IE, ie0);
    // Counted while routed: /proc/interrupts names the line `vfio-intx`
    // only while VFIO's handler is on it.
    let kernel = vfio_interrupts().saturating_sub(kernel_before);
    let state = line_state(&a.device);
    let unrouted = irqs.unroute();
    res?;
    unrouted.map_err(ctx("unrouting"))?;
    println!(
        "UIC:         {ROUNDS} DME_GET completions, each delivered; /proc/interrupts: +{kernel}"
    );
    if a.device.starts_with("vfio:") && kernel < ROUNDS {
        return Err(format!(
            "/proc/interrupts counted {kernel} VFIO interrupts for {ROUNDS} UIC completions; {state}"
        ));
    }
    println!("line:        {state}");
    drop(ctrl);
    engine_wait(a)
}

/// What the guest kernel sees of the device's line: the physical command
/// register's Interrupt Disable and the status register's Interrupt Status
/// (sysfs reads the real config space; VFIO's view of Interrupt Disable is
/// virtual), and the `vfio-intx` lines of /proc/interrupts.
fn line_state(dev: &str) -> String {
    let Some(bdf) = dev.strip_prefix("vfio:") else {
        return "no VFIO device".into();
    };
    let bdf = if bdf.matches(':').count() == 1 {
        format!("0000:{bdf}")
    } else {
        bdf.to_string()
    };
    let cfg = std::fs::read(format!("/sys/bus/pci/devices/{bdf}/config")).unwrap_or_default();
    let word = |o: usize| cfg.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let irq = std::fs::read_to_string(format!("/sys/bus/pci/devices/{bdf}/irq"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let lines: Vec<String> = std::fs::read_to_string("/proc/interrupts")
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.contains("vfio-intx") || l.trim_start().split(':').next() == Some(irq.as_str())
        })
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    format!(
        "command {:?} (Interrupt Disable: bit 10), status {:?} (Interrupt Status: bit 3), irq {irq}, /proc/interrupts {lines:?}",
        word(4).map(|w| format!("{w:#06x}")),
        word(6).map(|w| format!("{w:#06x}")),
    )
}

/// The engine's side: an MCQ queue pair with `WaitPolicy::Interrupt`
/// sleeps in `wait` on the controller's INTx line (acknowledging CQIS and
/// IS.CQES and unmasking before each sleep) and is woken by it after each
/// read. A legacy controller's queue pairs poll: nothing to check there.
fn engine_wait(a: &UfsDevArgs) -> Result<(), Failure> {
    let ctrl = open(a, Some(1))?;
    if !matches!(ctrl.mode(), mcqio::ufs::UfsMode::Mcq { .. }) {
        println!(
            "engine wait: {:?} mode polls (INTx waits are MCQ only)",
            ctrl.mode()
        );
        return Ok(());
    }
    let mut qp = ctrl
        .create_qpair(mcqio::UfsQpairOptions {
            wait: mcqio::WaitPolicy::Interrupt,
            ..Default::default()
        })
        .map_err(ctx("creating a queue pair that waits on interrupts"))?;
    let kernel_before = vfio_interrupts();
    // 256 KiB each: QEMU answers a 4 KiB read within the wait's first
    // empty polls (seen: 16 reads, no sleep), so no sleep was tested. Even
    // so whether a wait sleeps is up to TCG's timing: read until a few
    // waits were woken by the line, within a bound that fails the step.
    const BLOCKS: u32 = 64;
    const WANT_WOKEN: u64 = 4;
    const MAX_READS: u64 = 512;
    let mut buf = Some(
        ctrl.alloc_buf(BLOCKS as usize * 4096, mcqio::vfio::DmaDir::FromDevice)
            .map_err(ctx("buffer"))?,
    );
    let mut reads = 0u64;
    while reads < MAX_READS && qp.counters().interrupt_wakeups < WANT_WOKEN {
        let i = reads;
        let b = buf.take().ok_or("a read came back without its buffer")?;
        qp.read(0, (i % 16) * u64::from(BLOCKS), BLOCKS, b, i)
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
        "engine wait: MCQ queue pair on INTx: {reads} reads of 256 KiB, {} sleeps, {} woken by the line; /proc/interrupts: +{kernel}",
        c.interrupt_sleeps, c.interrupt_wakeups
    );
    if c.interrupt_wakeups == 0 {
        return Err(format!(
            "no wait was woken by the line ({})",
            line_state(&a.device)
        ));
    }
    if a.device.starts_with("vfio:") && kernel < c.interrupt_wakeups {
        return Err(format!(
            "/proc/interrupts counted {kernel} VFIO interrupts for {} wake-ups",
            c.interrupt_wakeups
        ));
    }
    Ok(())
}
