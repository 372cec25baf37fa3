//! What bring-up asks every NVMe controller, on any wire, once it is
//! enabled: Identify Controller, the active namespaces and each of them,
//! Set Features (Number of Queues); and, after a reset, whether the same
//! device answered.
//!
//! The admin commands go through the wire's [`Exchange`]: PCIe's admin
//! rings (with a DMA page for the data), a fabric's admin connection.

use crate::core::error::{Error, Result};
use crate::nvme::host::namespace::{active_namespaces, Namespace};
use crate::nvme::spec::identify::{IdentifyController, IdentifyNamespace, IDENTIFY_LEN};
use crate::nvme::spec::sqe::{Command, Identify, SetFeatures};
use crate::nvme::spec::{Cqe, Sqe};

/// Smallest cap on one command's transfer: a 4 KiB page.
const MIN_TRANSFER: u64 = 4096;

/// One admin command on a wire's admin queue, waited for: `Ok` with its
/// completion on success status, [`Error::Command`] on an error status,
/// another error if the exchange itself failed. With `page`, the command
/// returns data (at most [`IDENTIFY_LEN`] bytes) into it.
pub(in crate::nvme) trait Exchange {
    /// Run `sqe` (`what` names it in errors).
    fn exchange(&mut self, sqe: Sqe, page: Option<&mut [u8]>, what: &'static str) -> Result<Cqe>;
}

/// One Identify: its 4096-byte page.
pub(in crate::nvme) fn identify_page(
    x: &mut impl Exchange,
    cmd: Identify,
    what: &'static str,
) -> Result<Vec<u8>> {
    let mut page = vec![0u8; IDENTIFY_LEN];
    x.exchange(cmd.sqe(), Some(&mut page), what)?;
    Ok(page)
}

/// What Identify found.
pub(in crate::nvme) struct Identified {
    /// Identify Controller, parsed.
    pub identify: IdentifyController,
    /// Its page as read (a fabric parses its own fields from it).
    pub page: Vec<u8>,
    /// The active namespaces (NSZE 0 dropped), by ascending id.
    pub namespaces: Vec<Namespace>,
    /// Bytes one command moves at most: MDTS (in 4 KiB pages), the wire's
    /// `cap`, at least 4 KiB.
    pub max_transfer: u64,
}

/// Identify Controller, the active namespace list and every namespace on
/// it. `cap` is what the wire allows one command (options, a fabric's
/// data PDU limit). A namespace whose blocks are larger than one command
/// moves is kept unusable if MDTS is what limits it (the controller and
/// its other namespaces stay usable), and refused as the caller's
/// [`Error::InvalidOption`] if `cap` is.
pub(in crate::nvme) fn identify(x: &mut impl Exchange, cap: u64) -> Result<Identified> {
    let page = identify_page(x, Identify::controller(), "Identify Controller")?;
    let identify = IdentifyController::parse(&page)?;
    let mdts = identify.max_transfer_bytes(12).unwrap_or(u64::MAX);
    let max_transfer = mdts.min(cap).max(MIN_TRANSFER);
    let ids = active_namespaces(&identify, |cmd, what| identify_page(x, cmd, what))?;
    let mut namespaces = Vec::with_capacity(ids.len());
    for id in ids {
        let p = identify_page(x, Identify::namespace(id), "Identify Namespace")?;
        let ns = IdentifyNamespace::parse(&p)?;
        if ns.nsze == 0 {
            continue; // allocated but inactive
        }
        let ns = Namespace::new(id, ns, max_transfer)?;
        if !ns.usable {
            let detail = format!(
                "namespace {id} has {} B blocks but one command moves at most {max_transfer} B",
                ns.lba_size
            );
            if ns.lba_size <= mdts {
                return Err(Error::InvalidOption(format!("max_transfer: {detail}")));
            }
            log::warn!("{detail} (LBADS above MDTS): reads and writes to it are refused");
        }
        namespaces.push(ns);
    }
    Ok(Identified {
        identify,
        page,
        namespaces,
        max_transfer,
    })
}

/// Set Features (Number of Queues) asking for `want` I/O queue pairs: the
/// grant, capped to the request (a controller may answer more) and to
/// 65534.
pub(in crate::nvme) fn number_of_queues(x: &mut impl Exchange, want: u16) -> Result<u16> {
    let cqe = x.exchange(
        SetFeatures::number_of_queues(want, want).sqe(),
        None,
        "Set Features (Number of Queues)",
    )?;
    let nsqa = (cqe.dw0 & 0xFFFF) + 1;
    let ncqa = (cqe.dw0 >> 16) + 1;
    Ok(nsqa.min(ncqa).min(u32::from(want)).min(65534) as u16)
}

/// After a reset: the controller that answered must be the one we had
/// (serial and model), show the same namespaces (ids, sizes, block sizes)
/// and grant at least the queues queue pairs may hold; else
/// [`Error::DeviceChanged`].
pub(in crate::nvme) fn check_same(
    had: (&IdentifyController, &[Namespace], u16),
    now: (&Identified, u16),
) -> Result<()> {
    let (id, namespaces, granted) = had;
    let (up, now_granted) = now;
    if up.identify.serial != id.serial || up.identify.model != id.model {
        return Err(Error::DeviceChanged(format!(
            "controller {} {} answered instead of {} {}",
            up.identify.model, up.identify.serial, id.model, id.serial
        )));
    }
    let ids = |v: &[Namespace]| v.iter().map(|n| n.id).collect::<Vec<_>>();
    if ids(&up.namespaces) != ids(namespaces) {
        return Err(Error::DeviceChanged(format!(
            "the active namespaces are now {:?} instead of {:?}",
            ids(&up.namespaces),
            ids(namespaces)
        )));
    }
    for (n, o) in up.namespaces.iter().zip(namespaces) {
        if n.nsze != o.nsze || n.lba_shift != o.lba_shift {
            return Err(Error::DeviceChanged(format!(
                "namespace {} changed from {} blocks of {} B to {} blocks of {} B",
                o.id, o.nsze, o.lba_size, n.nsze, n.lba_size
            )));
        }
    }
    if now_granted < granted {
        return Err(Error::DeviceChanged(format!(
            "the controller now grants {now_granted} I/O queues instead of {granted}"
        )));
    }
    Ok(())
}
