//! `--filename` in mcqio's syntax, and the engine options that describe a
//! device.
//!
//! fio splits `--filename` at every `:` (a `\:` is kept as a literal `:`),
//! so a PCI address cannot be written as is. The engine accepts the
//! spelling of the device-string language every frontend shares that fio
//! allows ([`mcqio_open::devstr`], whose [`Target::parse`] maps it onto
//! mcqio-perf's: `vfio-0000.01.00.0` is `vfio:0000:01:00.0`):
//!
//! | filename | device |
//! |---|---|
//! | `fake` | the in-process fake NVMe controller of `mcqio-fixtures` |
//! | `vfio-0000.01.00.0` | a controller bound to vfio-pci (dots for colons, as SPDK's `traddr=0000.01.00.0`) |
//! | `vfio-01.00.0` | the same, PCI domain 0 |
//! | `vfio\:0000\:01\:00.0` | the same in mcqio-perf's spelling, colons escaped for fio |
//! | `fake-ufs` | the in-process fake UFS host controller of `mcqio-fixtures` |
//! | `tcp\:127.0.0.1\:4420/nqn.2026-01.io.example\:sub1` | an NVMe/TCP target (address, port, subsystem NQN), colons escaped for fio |
//!
//! A `tcp:` filename takes the options of the device string before its
//! selector (`hdgst`, `ddgst`, `qpairs=`, `kato=`, `pace=`), e.g.
//! `tcp\:127.0.0.1\:4420/nqn.x,hdgst,ddgst,ns=2`; jobs that share the
//! target must give it the same ones.
//!
//! The device part is followed by an optional selector of the file's unit on that controller:
//!
//! - NVMe: `,ns=<N>`, a namespace id (default 1), e.g. `fake,ns=2` or
//!   `vfio-0000.01.00.0,ns=1`. Note that in mcqio-perf `fake,ns=2` means
//!   "two namespaces"; here `ns` selects one, as in SPDK's plugin, and the
//!   fake's namespace count is the `fake_namespaces` option.
//! - UFS: `,lun=<N>`, a logical unit number as the device reports it
//!   (REPORT LUNS), from 0 (default 0), e.g. `fake-ufs,lun=1`. The fake's LU
//!   count is the `fake_namespaces` option. (mcqio-perf numbers UFS LUs as
//!   namespaces `lun + 1`; the engine uses the LUN itself.)
//!
//! A `vfio-` controller is NVMe or UFS by its PCI class code, which is only
//! read when it is opened, so its filename may carry either selector; the
//! one that does not fit the controller is refused then.

use std::time::Duration;

use mcqio_vfio::HugePages;

/// A parsed `--filename`: a controller and a namespace (or LU) on it, in
/// the device-string language every frontend shares
/// ([`mcqio_open::devstr::Filename`]).
pub use mcqio_open::devstr::Filename as Target;
pub use mcqio_open::devstr::{FilenameError, Unit};

/// A filename or option the engine cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The filename: its device part or its selector.
    #[error(transparent)]
    Filename(#[from] FilenameError),
    /// A duration option without its unit, or not a duration.
    #[error("option {0}")]
    Duration(#[from] mcqio_open::devstr::SpecError),
    /// An engine option value that is not allowed.
    #[error("option {option}={value}: {why}")]
    BadOption {
        /// The option's name.
        option: &'static str,
        /// What was given.
        value: String,
        /// What is allowed.
        why: &'static str,
    },
}

/// How the fake's device side runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FakeExec {
    /// A device thread polls the doorbells (like hardware on another core).
    Thread,
    /// The device work runs inside the doorbell store, on the job's thread.
    Sync,
}

/// The engine options that describe a device (equal options are required
/// of jobs that share a controller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceOptions {
    /// Page-size policy for DMA memory.
    pub huge_pages: HugePages,
    /// RLIMIT_MEMLOCK pre-check budget for `vfio-` devices (0: the library default).
    pub dma_budget: u64,
    /// I/O queue pairs to ask the controller for (the fake offers this many;
    /// UFS has at most 32 MCQ queues, so more are asked as 32).
    pub qpairs: u16,
    /// UFS: use MCQ when the controller has it (`false`: the legacy
    /// single-doorbell list, one queue pair); the fake advertises MCQ only
    /// when it is on. Not used by NVMe.
    pub mcq: bool,
    /// Use shadow doorbells where the controller has them.
    pub shadow_doorbells: bool,
    /// Per-command timeout (`None`: never).
    pub io_timeout: Option<Duration>,
    /// Bytes per fake namespace (or fake UFS LU).
    pub fake_size: u64,
    /// The fake's logical block size (the fake UFS's is 4096, fixed).
    pub fake_lbs: u32,
    /// Namespaces of the fake (logical units of the fake UFS, 1 to 32).
    pub fake_namespaces: u32,
    /// Thread or synchronous fake.
    pub fake_exec: FakeExec,
    /// The fake's per-command latency.
    pub fake_latency: Duration,
    /// Core the fake's device thread is pinned to (`None`: not pinned).
    pub fake_core: Option<usize>,
    /// How `getevents` waits for completions (`wait`, or fio's `hipri`):
    /// polling (the default), or sleeping on the queue's interrupt.
    pub wait: mcqio::WaitPolicy,
}

/// The DMA mode: how fio's buffers reach the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DmaMode {
    /// fio's I/O buffers are one DMA region allocated and mapped when fio
    /// allocates them (`iomem_alloc`): zero copy, no IOMMU work per I/O.
    Premapped,
}

impl DmaMode {
    /// Parse the `dma` option.
    pub fn parse(s: &str) -> Result<DmaMode, SpecError> {
        match s.trim() {
            "" | "premapped" => Ok(DmaMode::Premapped),
            "strict" | "lazy" => Err(SpecError::BadOption {
                option: "dma",
                value: s.to_string(),
                why: "per-I/O mapping modes are mcqio-perf's (--dma strict|lazy); fio's buffers are premapped DMA memory here",
            }),
            _ => Err(SpecError::BadOption {
                option: "dma",
                value: s.to_string(),
                why: "use premapped",
            }),
        }
    }
}

/// Parse the `hugepages` option.
pub fn parse_huge_pages(s: &str) -> Result<HugePages, SpecError> {
    match s.trim() {
        "" | "prefer" => Ok(HugePages::Prefer),
        "never" => Ok(HugePages::Never),
        _ => Err(SpecError::BadOption {
            option: "hugepages",
            value: s.to_string(),
            why: "use prefer or never",
        }),
    }
}

/// Parse the `fake_exec` option.
pub fn parse_fake_exec(s: &str) -> Result<FakeExec, SpecError> {
    match s.trim() {
        "" | "thread" => Ok(FakeExec::Thread),
        "sync" => Ok(FakeExec::Sync),
        _ => Err(SpecError::BadOption {
            option: "fake_exec",
            value: s.to_string(),
            why: "use thread or sync",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn option_values() {
        assert_eq!(DmaMode::parse("premapped").unwrap(), DmaMode::Premapped);
        assert_eq!(DmaMode::parse("").unwrap(), DmaMode::Premapped);
        assert!(DmaMode::parse("strict").is_err());
        assert!(DmaMode::parse("bogus").is_err());
        assert_eq!(parse_huge_pages("never").unwrap(), HugePages::Never);
        assert!(parse_huge_pages("always").is_err());
        assert_eq!(parse_fake_exec("sync").unwrap(), FakeExec::Sync);
        assert!(parse_fake_exec("async").is_err());
    }
}
