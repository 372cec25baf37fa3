//! Namespaces: the active namespace list walked through Identify, and
//! what each namespace is checked for before it is kept ([`Namespace`]).

use crate::core::error::{Error, Result};
use crate::nvme::spec::identify::{IdentifyController, IdentifyNamespace, IDENTIFY_LEN};
use crate::nvme::spec::sqe::Identify;
use crate::nvme::spec::status::{generic, sct};
use crate::nvme::spec::NvmeStatus;

/// An active namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    /// Namespace id.
    pub id: u32,
    /// Size in blocks.
    pub nsze: u64,
    /// Block size in bytes.
    pub lba_size: u64,
    /// log2 of the block size.
    pub lba_shift: u32,
    /// The full identify data.
    pub identify: IdentifyNamespace,
    /// Whether reads and writes can reach it. `false` when one block is
    /// larger than the controller lets one command move (LBADS above
    /// MDTS): bring-up keeps the controller and its other namespaces, and
    /// every read or write to this one is refused before submission with
    /// [`crate::SubmitErrorKind::TransferTooLarge`] (commands that move no
    /// data — Flush, Write Zeroes, Dataset Management — still go through).
    pub usable: bool,
}

impl Namespace {
    /// Check what the controller reported for namespace `id`: its capacity
    /// in bytes must fit in a `u64`. Usable if one block fits in
    /// `max_transfer` bytes.
    pub(in crate::nvme) fn new(
        id: u32,
        identify: IdentifyNamespace,
        max_transfer: u64,
    ) -> Result<Self> {
        let ns = Namespace {
            id,
            nsze: identify.nsze,
            lba_size: identify.lba_size(),
            lba_shift: identify.lba_shift(),
            usable: identify.lba_size() <= max_transfer,
            identify,
        };
        if ns.checked_size_bytes().is_none() {
            return Err(Error::BadDevice {
                what: "namespace size (NSZE)",
                detail: format!(
                    "namespace {id}: {} blocks of {} B overflow 64 bits",
                    ns.nsze, ns.lba_size
                ),
            });
        }
        Ok(ns)
    }

    /// Capacity in bytes, `None` if it does not fit in a `u64` (never for a
    /// namespace from [`NvmeController::namespaces`](crate::nvme::NvmeController::namespaces): bring-up rejects those).
    pub fn checked_size_bytes(&self) -> Option<u64> {
        self.nsze.checked_mul(1u64.checked_shl(self.lba_shift)?)
    }

    /// Capacity in bytes, saturating at `u64::MAX` (see
    /// [`Self::checked_size_bytes`]).
    pub fn size_bytes(&self) -> u64 {
        self.checked_size_bytes().unwrap_or(u64::MAX)
    }
}

/// Most active namespaces mcqio takes from one controller. Each costs an
/// Identify at bring-up (and after every reset), so a device that reports
/// an endless list is refused instead of keeping bring-up busy.
pub const MAX_NAMESPACES: usize = 1 << 14;

/// Active NSIDs via CNS 02h (paged by 1024), falling back to 1..=NN for
/// controllers older than NVMe 1.1 that reject that CNS, over any way of
/// running an Identify (`identify` returns the 4096-byte page). The result
/// is strictly increasing (sorted, no duplicates, no 0, no broadcast id),
/// at most [`MAX_NAMESPACES`] long, and may be sparse (any id up to
/// 0xFFFF_FFFE).
pub(in crate::nvme) fn active_namespaces(
    id: &IdentifyController,
    mut identify: impl FnMut(Identify, &'static str) -> Result<Vec<u8>>,
) -> Result<Vec<u32>> {
    let too_many = || Error::BadDevice {
        what: "active namespace list",
        detail: format!("more than {MAX_NAMESPACES} active namespaces"),
    };
    let mut out = Vec::new();
    let mut after = 0u32;
    loop {
        let page = match identify(
            Identify::active_namespaces(after),
            "Identify Active Namespace List",
        ) {
            Ok(p) => p,
            Err(Error::Command { status, .. })
                if status == NvmeStatus::new(sct::GENERIC, generic::INVALID_FIELD)
                    && out.is_empty() =>
            {
                if id.nn as usize > MAX_NAMESPACES {
                    return Err(too_many());
                }
                return Ok((1..=id.nn).collect());
            }
            Err(e) => return Err(e),
        };
        let ids: Vec<u32> = page
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .take_while(|&n| n != 0)
            .collect();
        let full = ids.len() == IDENTIFY_LEN / 4;
        let last = ids.last().copied();
        // The list must be increasing and above `after`; whatever a device
        // returns beyond that is dropped here and sorted out below.
        out.extend(ids.into_iter().filter(|&n| n > after && n < 0xFFFF_FFFF));
        if out.len() > MAX_NAMESPACES {
            return Err(too_many());
        }
        match last {
            Some(l) if full && l > after && l < 0xFFFF_FFFE => after = l,
            _ => break,
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

impl From<&Namespace> for crate::core::block::BlockUnit {
    fn from(n: &Namespace) -> Self {
        crate::core::block::BlockUnit {
            id: n.id,
            blocks: n.nsze,
            // Bring-up keeps LBADS below 32 (the block size fits 32 bits).
            block_size: u32::try_from(n.lba_size).unwrap_or(u32::MAX),
            usable: n.usable,
        }
    }
}
