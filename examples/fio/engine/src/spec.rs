//! `--filename` in mcqio's syntax, and the engine options that describe a
//! device.
//!
//! fio splits `--filename` at every `:` (a `\:` is kept as a literal `:`),
//! so a PCI address cannot be written as is. The engine accepts:
//!
//! | filename | device |
//! |---|---|
//! | `fake` | the in-process fake NVMe controller of `mcqio-fixtures` |
//! | `vfio-0000.01.00.0` | a controller bound to vfio-pci (dots for colons, as SPDK's `traddr=0000.01.00.0`) |
//! | `vfio-01.00.0` | the same, PCI domain 0 |
//! | `vfio\:0000\:01\:00.0` | the same in mcqio-perf's spelling, colons escaped for fio |
//!
//! | `fake-ufs` | the in-process fake UFS host controller of `mcqio-fixtures` |
//!
//! followed by an optional selector of the file's unit on that controller:
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

/// A filename or option the engine cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The device part names no known kind.
    #[error("`{0}`: unknown device; use fake, fake-ufs, vfio-<domain>.<bus>.<dev>.<fn> (e.g. vfio-0000.01.00.0) or vfio\\:0000\\:01\\:00.0")]
    UnknownDevice(String),
    /// A malformed PCI address.
    #[error("`{0}` is not a PCI address like 0000.01.00.0 or 01.00.0")]
    BadAddress(String),
    /// A selector that is not `key=value` or has an unknown key.
    #[error("`{key}` in `{name}`: the device takes {allowed}")]
    BadSelector {
        /// The whole filename.
        name: String,
        /// The offending part.
        key: String,
        /// What the device kind accepts.
        allowed: &'static str,
    },
    /// A selector value out of range.
    #[error("`{0}`: a namespace id is 1 to 4294967295, a LUN 0 to 255")]
    BadNumber(String),
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

/// Which controller a filename names (the part before the selector).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// The fake NVMe controller, one per process.
    FakeNvme,
    /// A real NVMe controller bound to vfio-pci.
    Vfio {
        /// `dddd:bb:dd.f`.
        bdf: String,
    },
    /// The fake UFS host controller, one per process.
    FakeUfs,
}

impl DeviceKind {
    /// A stable key: jobs naming the same key share one controller.
    pub fn key(&self) -> String {
        match self {
            DeviceKind::FakeNvme => "fake".into(),
            DeviceKind::Vfio { bdf } => format!("vfio:{bdf}"),
            DeviceKind::FakeUfs => "fake-ufs".into(),
        }
    }
}

/// The unit a filename selects on its controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// No selector: namespace 1 (NVMe) or LU 0 (UFS).
    Default,
    /// `ns=<N>`: an NVMe namespace id (at least 1).
    Ns(u32),
    /// `lun=<N>`: a UFS logical unit number.
    Lun(u8),
}

/// A parsed `--filename`: a controller and a namespace (or LU) on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The controller.
    pub device: DeviceKind,
    /// The namespace or logical unit.
    pub unit: Unit,
}

fn parse_bdf(s: &str) -> Result<String, SpecError> {
    let bad = || SpecError::BadAddress(s.to_string());
    // Dots or colons between domain, bus and device; a dot before the function.
    let parts: Vec<&str> = s.split(['.', ':']).collect();
    let (domain, bus, dev, func) = match parts[..] {
        [d, b, v, f] => (d, b, v, f),
        [b, v, f] => ("0000", b, v, f),
        _ => return Err(bad()),
    };
    let hex = |p: &str, width: usize, max: u32| {
        if p.is_empty() || p.len() > width {
            return Err(bad());
        }
        u32::from_str_radix(p, 16)
            .ok()
            .filter(|&v| v <= max)
            .ok_or_else(bad)
    };
    let (d, b, v, f) = (
        hex(domain, 4, 0xffff)?,
        hex(bus, 2, 0xff)?,
        hex(dev, 2, 0x1f)?,
        hex(func, 1, 7)?,
    );
    Ok(format!("{d:04x}:{b:02x}:{v:02x}.{f:x}"))
}

fn parse_nsid(v: &str) -> Result<u32, SpecError> {
    v.parse::<u32>()
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| SpecError::BadNumber(v.to_string()))
}

fn parse_lun(v: &str) -> Result<u8, SpecError> {
    v.parse::<u8>()
        .map_err(|_| SpecError::BadNumber(v.to_string()))
}

impl Target {
    /// Parse a filename as fio hands it over (escapes already removed).
    pub fn parse(name: &str) -> Result<Target, SpecError> {
        let name = name.trim();
        let mut parts = name.split(',');
        let dev = parts.next().unwrap_or_default();
        let device = if dev == "fake" {
            DeviceKind::FakeNvme
        } else if dev == "fake-ufs" {
            DeviceKind::FakeUfs
        } else if let Some(a) = dev
            .strip_prefix("vfio-")
            .or_else(|| dev.strip_prefix("vfio:"))
        {
            DeviceKind::Vfio { bdf: parse_bdf(a)? }
        } else {
            return Err(SpecError::UnknownDevice(dev.to_string()));
        };
        let (ns, lun, allowed) = match device {
            DeviceKind::FakeNvme => (true, false, "ns=<N> (namespace id)"),
            DeviceKind::FakeUfs => (false, true, "lun=<N> (logical unit)"),
            DeviceKind::Vfio { .. } => (
                true,
                true,
                "ns=<N> (NVMe namespace id) or lun=<N> (UFS logical unit)",
            ),
        };
        let mut unit = Unit::Default;
        for p in parts {
            match p.split_once('=').map(|(k, v)| (k.trim(), v.trim())) {
                Some(("ns", v)) if ns => unit = Unit::Ns(parse_nsid(v)?),
                Some(("lun", v)) if lun => unit = Unit::Lun(parse_lun(v)?),
                _ => {
                    return Err(SpecError::BadSelector {
                        name: name.to_string(),
                        key: p.to_string(),
                        allowed,
                    })
                }
            }
        }
        Ok(Target { device, unit })
    }
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

    fn vfio(bdf: &str) -> DeviceKind {
        DeviceKind::Vfio { bdf: bdf.into() }
    }

    #[test]
    fn device_names() {
        let t = Target::parse("fake").unwrap();
        assert_eq!((t.device, t.unit), (DeviceKind::FakeNvme, Unit::Default));
        let t = Target::parse("fake,ns=3").unwrap();
        assert_eq!((t.device, t.unit), (DeviceKind::FakeNvme, Unit::Ns(3)));
        for s in [
            "vfio-0000.01.00.0",
            "vfio-01.00.0",
            "vfio:0000:01:00.0",
            "vfio-0000:01:00.0",
        ] {
            assert_eq!(
                Target::parse(s).unwrap().device,
                vfio("0000:01:00.0"),
                "{s}"
            );
        }
        let t = Target::parse("vfio-0001.ff.1f.7,ns=2").unwrap();
        assert_eq!(
            (t.device.clone(), t.unit),
            (vfio("0001:ff:1f.7"), Unit::Ns(2))
        );
        assert_eq!(t.device.key(), "vfio:0001:ff:1f.7");
        // The transport of a vfio- device is known only when it is opened.
        let t = Target::parse("vfio-01.00.0,lun=0").unwrap();
        assert_eq!((t.device, t.unit), (vfio("0000:01:00.0"), Unit::Lun(0)));
        let t = Target::parse("fake-ufs,lun=2").unwrap();
        assert_eq!((t.device, t.unit), (DeviceKind::FakeUfs, Unit::Lun(2)));
        let t = Target::parse("fake-ufs").unwrap();
        assert_eq!((t.device, t.unit), (DeviceKind::FakeUfs, Unit::Default));
        let t = Target::parse("fake-ufs,lun=0").unwrap();
        assert_eq!(t.unit, Unit::Lun(0));
    }

    #[test]
    fn bad_names_are_typed_errors() {
        assert!(matches!(
            Target::parse("/dev/nvme0n1"),
            Err(SpecError::UnknownDevice(_))
        ));
        assert!(matches!(
            Target::parse("fakeish"),
            Err(SpecError::UnknownDevice(_))
        ));
        for a in [
            "vfio-",
            "vfio-1.2",
            "vfio-0000.100.00.0",
            "vfio-0000.00.20.0",
            "vfio-0000.00.00.8",
            "vfio-zz.00.0",
            "vfio-00000.00.00.0",
        ] {
            assert!(
                matches!(Target::parse(a), Err(SpecError::BadAddress(_))),
                "{a}"
            );
        }
        assert!(matches!(
            Target::parse("fake,ns=0"),
            Err(SpecError::BadNumber(_))
        ));
        assert!(matches!(
            Target::parse("fake,ns=x"),
            Err(SpecError::BadNumber(_))
        ));
        assert!(matches!(
            Target::parse("fake,size=1M"),
            Err(SpecError::BadSelector { .. })
        ));
        assert!(matches!(
            Target::parse("fake,lun=1"),
            Err(SpecError::BadSelector { .. })
        ));
        assert!(matches!(
            Target::parse("fake-ufs,ns=1"),
            Err(SpecError::BadSelector { .. })
        ));
        for s in ["fake-ufs,lun=256", "fake-ufs,lun=-1", "fake-ufs,lun=x"] {
            assert!(
                matches!(Target::parse(s), Err(SpecError::BadNumber(_))),
                "{s}"
            );
        }
    }

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
