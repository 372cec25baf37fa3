//! `ufs-irq`: the UFS host controller's interrupt through VFIO as an
//! eventfd (issue 26, first part). QEMU's UFS controller has INTx only: a
//! UIC command completion sets IS.UCCS, which with IE.UCCE asserts the
//! line; VFIO masks it on delivery, and the check clears IS (write 1 to
//! clear) and unmasks before the next round, as an interrupt-driven
//! waiter does.

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
                    "round {round}: no interrupt within {COMMAND_TIMEOUT:?} of a UIC command (IS {:#x})",
                    regs.read32(IS)
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
    let unrouted = irqs.unroute();
    res?;
    unrouted.map_err(ctx("unrouting"))?;
    let kernel = vfio_interrupts().saturating_sub(kernel_before);
    println!(
        "UIC:         {ROUNDS} DME_GET completions, each delivered; /proc/interrupts: +{kernel}"
    );
    if a.device.starts_with("vfio:") && kernel < ROUNDS {
        return Err(format!(
            "/proc/interrupts counted {kernel} VFIO interrupts for {ROUNDS} UIC completions"
        ));
    }
    Ok(())
}
