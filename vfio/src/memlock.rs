//! The locked-memory limit, as it applies to VFIO DMA memory.
//!
//! Every page mapped for DMA is pinned by the type1 IOMMU driver and counted
//! against the process's `RLIMIT_MEMLOCK`, unless the process has
//! `CAP_IPC_LOCK` (root has it). [`crate::DmaSpace`] also `mlock`s its memory,
//! which the kernel counts in the same `locked_vm` total, so 4 KiB-page DMA
//! memory is charged twice; [`memlock_needed`] accounts for that.

use std::path::Path;

use crate::error::{Result, VfioError};
use crate::sysfs::SysRoots;

/// Capability bit of `CAP_IPC_LOCK` in `/proc/<pid>/status` `CapEff`.
const CAP_IPC_LOCK_BIT: u32 = 14;

/// The locked-memory situation of this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemlockStatus {
    /// Soft `RLIMIT_MEMLOCK` in bytes (`u64::MAX` when unlimited).
    pub limit: u64,
    /// Whether the process has `CAP_IPC_LOCK` (then the limit does not apply).
    pub cap_ipc_lock: bool,
}

impl MemlockStatus {
    /// Read the limit with `getrlimit` and the capability from
    /// `<proc>/self/status`.
    pub fn current(roots: &SysRoots) -> Self {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one `rlimit` into the valid, owned `rl`.
        let limit = if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) } == 0 {
            if rl.rlim_cur == libc::RLIM_INFINITY {
                u64::MAX
            } else {
                rl.rlim_cur
            }
        } else {
            0
        };
        Self {
            limit,
            cap_ipc_lock: has_cap_ipc_lock(&roots.proc.join("self/status")),
        }
    }

    /// Whether `needed` bytes can be locked.
    pub fn allows(&self, needed: u64) -> bool {
        self.cap_ipc_lock || self.limit >= needed
    }
}

/// Whether the `CapEff` line of a `/proc/<pid>/status` file has `CAP_IPC_LOCK`.
fn has_cap_ipc_lock(status: &Path) -> bool {
    let Ok(s) = std::fs::read_to_string(status) else {
        return false;
    };
    s.lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK_BIT) != 0)
}

/// Locked memory needed to pin `dma_bytes` of DMA memory through VFIO.
///
/// The VFIO pin is the only charge: [`crate::DmaSpace`] skips its own `mlock`
/// when the IOMMU pins pages ([`crate::Iommu::pins_pages`]), because both would
/// be charged to `locked_vm` and halve what a non-root user can map.
pub fn memlock_needed(dma_bytes: u64) -> u64 {
    dma_bytes
}

/// [`VfioError::Memlock`] unless `status` allows locking `needed` bytes.
pub fn check_memlock(bdf: &str, status: MemlockStatus, needed: u64) -> Result<()> {
    if status.allows(needed) {
        Ok(())
    } else {
        Err(VfioError::Memlock {
            bdf: bdf.to_string(),
            current: status.limit,
            needed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::fake::FakeSys;

    #[test]
    fn message_names_current_and_needed() {
        let st = MemlockStatus {
            limit: 8 << 20,
            cap_ipc_lock: false,
        };
        let e = check_memlock("0000:00:03.0", st, memlock_needed(64 << 20)).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("RLIMIT_MEMLOCK is 8 MiB"), "{m}");
        assert!(m.contains("64 MiB must be locked"), "{m}");
        assert!(m.contains("ulimit -l 65536"), "{m}");
        assert!(m.ends_with("run `mcqio-perf doctor 0000:00:03.0`"), "{m}");
        assert!(matches!(
            e,
            VfioError::Memlock {
                current,
                needed,
                ..
            } if current == 8 << 20 && needed == 64 << 20
        ));
    }

    #[test]
    fn capability_or_unlimited_passes() {
        let cap = MemlockStatus {
            limit: 0,
            cap_ipc_lock: true,
        };
        assert!(check_memlock("x", cap, u64::MAX).is_ok());
        let unl = MemlockStatus {
            limit: u64::MAX,
            cap_ipc_lock: false,
        };
        assert!(check_memlock("x", unl, 1 << 40).is_ok());
    }

    #[test]
    fn reads_cap_eff_from_proc() {
        let fs = FakeSys::new();
        fs.write("proc/self/status", "Name:\tx\nCapEff:\t0000000000004000\n");
        assert!(MemlockStatus::current(&fs.roots).cap_ipc_lock);
        fs.write("proc/self/status", "Name:\tx\nCapEff:\t0000000000000000\n");
        assert!(!MemlockStatus::current(&fs.roots).cap_ipc_lock);
        fs.write("proc/self/status", "garbage");
        assert!(!MemlockStatus::current(&fs.roots).cap_ipc_lock);
    }
}
