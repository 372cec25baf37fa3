//! The job's files: what fio learns of each (its unit, block size and
//! capacity) and the block-size check made before the job runs.

use mcqio::BlockDevice;

use crate::device::{Ctrl, Device};
use crate::spec::Unit;
use crate::EngineError;

/// A file of the job: a namespace (NVMe) or logical unit (UFS) of the
/// job's controller, as fio sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileInfo {
    /// Namespace id (NVMe) or LUN (UFS).
    pub unit: u32,
    /// log2 of the block size.
    pub lba_shift: u32,
    /// Capacity in bytes.
    pub size: u64,
}

impl FileInfo {
    /// The cookie fio keeps in `fio_file::engine_pos`: the namespace id
    /// (or LUN) and block shift, so `queue` needs no lookup.
    pub fn cookie(&self) -> u64 {
        (u64::from(self.unit) << 8) | u64::from(self.lba_shift)
    }

    pub(super) fn from_cookie(c: u64) -> (u32, u32) {
        ((c >> 8) as u32, (c & 0xff) as u32)
    }
}

/// Refuse a job whose block sizes (`min_bs`, `max_bs`; 0: unknown) are
/// not whole logical blocks of every file, with the engine's own message
/// instead of fio's bare `err=22` at the first I/O.
pub fn check_block_sizes(
    files: &[FileInfo],
    names: &[&str],
    min_bs: u64,
    max_bs: u64,
) -> Result<(), EngineError> {
    for (f, name) in files.iter().zip(names) {
        let lbs = 1u64 << f.lba_shift;
        for bs in [min_bs, max_bs] {
            if bs != 0 && bs % lbs != 0 {
                return Err(EngineError::Unaligned {
                    bs,
                    lbs,
                    file: name.to_string(),
                    hint: if name.starts_with("fake") && !name.starts_with("fake-ufs") {
                        " (or the fake's fake_lbs=)"
                    } else {
                        ""
                    },
                });
            }
        }
    }
    Ok(())
}

/// What fio needs to know of the file `name`: the unit `unit` selects on
/// the device's controller.
pub(super) fn file_info(dev: &Device, unit: Unit, name: &str) -> Result<FileInfo, EngineError> {
    let wrong = |want: &'static str| EngineError::WrongSelector {
        file: name.to_string(),
        device: dev.key().to_string(),
        want,
    };
    let ctrl = dev.ctrl();
    let ufs = matches!(ctrl, Ctrl::Ufs(_));
    let id = match (unit, ctrl) {
        (Unit::Default, _) => u32::from(!ufs),
        (Unit::Lun(n), Ctrl::Ufs(_)) => u32::from(n),
        (Unit::Ns(n), Ctrl::Nvme(_) | Ctrl::Tcp(_)) => n,
        (Unit::Ns(_), Ctrl::Ufs(_)) => {
            return Err(wrong(
                "a UFS host controller: select a logical unit with lun=<N>",
            ))
        }
        (Unit::Lun(_), Ctrl::Tcp(_)) => {
            return Err(wrong("an NVMe/TCP target: select a namespace with ns=<N>"))
        }
        (Unit::Lun(_), Ctrl::Nvme(_)) => {
            return Err(wrong("an NVMe controller: select a namespace with ns=<N>"))
        }
    };
    let Some(u) = ctrl.unit(id) else {
        let have = ctrl.units().into_iter().map(|u| u.id);
        return Err(if ufs {
            EngineError::NoLogicalUnit {
                file: name.to_string(),
                // LUNs are bytes (the unit ids of a UFS controller).
                lun: id as u8,
                have: have.map(|l| l as u8).collect(),
            }
        } else {
            EngineError::NoNamespace {
                file: name.to_string(),
                nsid: id,
                have: have.collect(),
            }
        });
    };
    let size = u
        .blocks
        .checked_mul(u64::from(u.block_size))
        .ok_or_else(|| {
            EngineError::Controller(format!(
                "{} {id}: {} blocks of {} bytes overflow 64 bits",
                if ufs { "LU" } else { "namespace" },
                u.blocks,
                u.block_size
            ))
        })?;
    Ok(FileInfo {
        unit: u.id,
        lba_shift: u.block_size.trailing_zeros(),
        size,
    })
}
