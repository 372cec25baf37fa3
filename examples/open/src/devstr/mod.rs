//! The device-string language every frontend shares (`mcqio-perf`,
//! `hello`, `identify`, the fio engine's `--filename`), with its sizes,
//! durations and CPU lists, and the one set of defaults a `fake` device is
//! built from.
//!
//! Device strings follow xNVMe's URI-with-options idea: a kind, an optional
//! argument after the first `:`, then `key=value` options after commas:
//!
//! | string | device |
//! |---|---|
//! | `fake` | in-process RAM-backed NVMe controller (the default) |
//! | `fake:null` | the same controller with null namespaces (no data movement) |
//! | `fake-ufs` | in-process RAM-backed UFS host controller (UFSHCI 4.0, MCQ) |
//! | `fake-ufs:null` | the same with null logical units (no data movement) |
//! | `vfio:0000:01:00.0` | a real NVMe or UFS controller bound to vfio-pci (the PCI class code says which) |
//! | `vfio-0000.01.00.0`, `vfio-01.00.0` | the same in the fio engine's spelling (a fio filename cannot hold `:`): dots for colons, as SPDK's `traddr=0000.01.00.0` |
//! | `uring:/path` | a file or block device through io_uring (`mcqio-perf` only) |
//! | `uring:null` | io_uring NOPs: the kernel path with no device at all (`mcqio-perf` only) |
//! | `tcp:127.0.0.1:4420/nqn.2026-01.io.example:sub1` | an NVMe/TCP target: address, port, then the subsystem NQN after the first `/` |
//!
//! Options: `lbs` (logical block size in bytes: `512`, `4k`) or `lbads`
//! (the same as NVMe's LBADS, a power of two: `9` = 512 B, `12` = 4 KiB),
//! `ns` (namespace count), `size` (bytes per namespace, or of a file to
//! create), `corrupt` (probability that the fake corrupts read data), `error`
//! (probability that the fake fails an I/O with Data Transfer Error),
//! `latency` (fake device latency per command, with its unit: `10us`,
//! `1.5ms`; a bare number other than `0` is refused), `qpairs` (I/O queue pairs
//! the fake offers), `core` (CPU the fake's device thread is pinned to),
//! `sync` (0/1: the fake runs inside the doorbell store, on the job's
//! thread), `direct` (0/1: O_DIRECT for `uring:<path>`).
//!
//! `tcp:` takes `hdgst` and `ddgst` (header and data digests; bare, or
//! `=0`/`=1`), `qpairs` (I/O queues to ask for), `kato` (Keep Alive
//! Timeout with its unit, `0` for none) and `pace` (`=0`: receive on every
//! poll instead of coalescing receives; default on).
//!
//! `fake-ufs` takes `mcq` (`on`/`off`: MCQ or the legacy single-doorbell
//! list), `queues` (MCQ hardware queues the fake offers, 1 to 32), `lus`
//! (logical units, 1 to 32), `size` (bytes per LU), `latency`, `core` and
//! `sync` as above; its blocks are 4 KiB. `tr`, `tprog` and `dies` switch
//! on the fake's flash cost model in wall-clock time (NAND read latency,
//! program latency per block, parallel NAND units; the device's map cache
//! covers 1 GiB): throughput then comes from the model, not the host CPU. `vfio:` takes `qpairs` (NVMe),
//! `mcq` (UFS) and `iommu` (`auto`, `type1` or `iommufd`: the IOMMU interface VFIO opens the device
//! through; `auto`, the default, takes iommufd where the kernel gave the device a cdev; without the
//! option the environment's `MCQIO_VFIO_IOMMU` decides).
//!
//! A fio `--filename` ([`Filename::parse`]) is the same language with the
//! spelling fio allows and one difference of meaning: `fake`, `fake-ufs` or
//! a `vfio-`/`vfio:` address, then at most a selector of the unit the file
//! is — `ns=<N>` an NVMe namespace id, `lun=<N>` a UFS logical unit
//! number — and no device options (the fio engine takes those as engine
//! options); a `tcp:` filename is the device string with its options and
//! at most an `ns=` selector. In a device string `ns=` is the fake's
//! namespace *count*; in a filename it *selects* one, as in SPDK's fio
//! plugin.
//!
//! Defaults of `fake` are the library's ([`mcqio_fixtures::FakeConfig::default`]): one RAM
//! namespace of [`FAKE_SIZE`] bytes in [`FAKE_BLOCK_SIZE`]-byte blocks;
//! `fake:null` namespaces advertise [`FAKE_NULL_SIZE`] bytes.

mod fake;
mod filename;
mod parse;
#[cfg(test)]
mod tests;
mod values;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

pub use filename::{Filename, FilenameError, Unit};
pub use parse::parse_bdf;
pub use values::{parse_cpus, parse_device_duration, parse_duration, parse_size};

/// Namespace size of `fake` when `size=` is not given (the library default).
pub const FAKE_SIZE: u64 = 64 << 20;
/// Namespace size of `fake:null` when `size=` is not given (advertised only).
pub const FAKE_NULL_SIZE: u64 = 1 << 40;
/// Logical block size of `fake` when neither `lbs=` nor `lbads=` is given
/// (the library default).
pub const FAKE_BLOCK_SIZE: u32 = 512;

/// A spec or value the user typed that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SpecError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, SpecError> {
    Err(SpecError(msg.into()))
}

/// Which device a spec names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceKind {
    /// The in-process fake controller; `null` namespaces move no data.
    Fake {
        /// Null namespaces (reads return without touching buffers).
        null: bool,
    },
    /// The in-process fake UFS host controller; `null` LUs move no data.
    FakeUfs {
        /// Null logical units (reads return without touching buffers).
        null: bool,
    },
    /// A real controller through VFIO.
    Vfio {
        /// PCI address, e.g. `0000:01:00.0`.
        bdf: String,
    },
    /// io_uring NOPs.
    UringNull,
    /// A file or block device through io_uring.
    UringFile {
        /// Path to the file or device.
        path: PathBuf,
    },
    /// An NVMe/TCP target.
    Tcp {
        /// `host:port` as given (resolved when opened).
        addr: String,
        /// The subsystem NQN.
        subnqn: String,
    },
}

/// Options after the commas of a device spec. `None` means "the default for
/// this device kind".
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceOpts {
    /// Logical block size in bytes (`lbs=` in bytes or `lbads=` as log2).
    pub block_size: Option<u32>,
    /// Number of namespaces (fake).
    pub ns: Option<u32>,
    /// Size in bytes of each namespace (fake) or of a file to create (uring).
    pub size: Option<u64>,
    /// Probability that a read returns corrupted data (fake).
    pub corrupt: Option<f64>,
    /// Probability that an I/O completes with Data Transfer Error (fake).
    pub error: Option<f64>,
    /// Device latency per command (fake).
    pub latency: Option<Duration>,
    /// I/O queue pairs the device offers (fake).
    pub qpairs: Option<u16>,
    /// CPU for the fake's device thread.
    pub core: Option<usize>,
    /// Use O_DIRECT (uring file).
    pub direct: Option<bool>,
    /// Run the fake synchronously inside the doorbell store (no device
    /// thread): deterministic, and all device work lands on the job's core.
    pub sync: Option<bool>,
    /// UFS: use MCQ (`mcq=on`, the default when the controller has it) or
    /// the legacy single-doorbell list (`mcq=off`).
    pub mcq: Option<bool>,
    /// `vfio:` NVMe: use the controller's shadow doorbells (Doorbell
    /// Buffer Config) when it offers them (`shadow=on`) or store to the
    /// doorbell registers only (`shadow=off`, the engine's default).
    pub shadow: Option<bool>,
    /// `vfio:`: the IOMMU interface to open the device through (`iommu=`).
    pub iommu: Option<mcqio_vfio::IommuChoice>,
    /// `fake-ufs`: MCQ hardware queues the fake offers (`queues=`).
    pub queues: Option<u8>,
    /// `fake-ufs`: logical units (`lus=`).
    pub lus: Option<u8>,
    /// `fake-ufs`: switch on the flash cost model with this NAND read
    /// latency tR (`tr=`), in wall-clock time.
    pub nand_read: Option<Duration>,
    /// `fake-ufs`: NAND program latency per block written (`tprog=`; cost
    /// model).
    pub nand_prog: Option<Duration>,
    /// `fake-ufs`: parallel NAND units, dies × planes (`dies=`; cost
    /// model).
    pub nand_units: Option<u32>,
    /// `tcp:`: ask for header digests (`hdgst`).
    pub hdgst: Option<bool>,
    /// `tcp:`: ask for data digests (`ddgst`).
    pub ddgst: Option<bool>,
    /// `tcp:`: Keep Alive Timeout (`kato=`).
    pub kato: Option<Duration>,
    /// `tcp:`: coalesce receives (`pace`, `pace=0`).
    pub pace: Option<bool>,
}

/// A parsed `--device` value.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceSpec {
    /// What the user typed.
    pub raw: String,
    /// The device.
    pub kind: DeviceKind,
    /// Its options.
    pub opts: DeviceOpts,
    /// The option keys given, in order.
    keys: Vec<String>,
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

impl DeviceSpec {
    /// The VFIO open options this spec asks for (`iommu=`), over the
    /// library's defaults.
    pub fn vfio_options(&self) -> mcqio_vfio::OpenOptions {
        let d = mcqio_vfio::OpenOptions::default();
        mcqio_vfio::OpenOptions {
            iommu: self.opts.iommu.unwrap_or(d.iommu),
            ..d
        }
    }

    /// A short label for table rows: the spec without its options.
    pub fn label(&self) -> String {
        match &self.kind {
            DeviceKind::Fake { null: false } => "fake".into(),
            DeviceKind::Fake { null: true } => "fake:null".into(),
            DeviceKind::FakeUfs { null: false } => "fake-ufs".into(),
            DeviceKind::FakeUfs { null: true } => "fake-ufs:null".into(),
            DeviceKind::Vfio { bdf } => format!("vfio:{bdf}"),
            DeviceKind::UringNull => "uring:null".into(),
            DeviceKind::UringFile { path } => format!("uring:{}", path.display()),
            DeviceKind::Tcp { addr, subnqn } => format!("tcp:{addr}/{subnqn}"),
        }
    }

    /// Refuse options a command does not use: `allowed` lists the keys
    /// `who` (a command name, for the message) reads.
    pub fn check_keys(&self, allowed: &[&str], who: &str) -> Result<(), SpecError> {
        match self.keys.iter().find(|k| !allowed.contains(&k.as_str())) {
            None => Ok(()),
            Some(k) => err(format!(
                "option `{k}` of `{}` is not used by {who} (it takes: {})",
                self.raw,
                if allowed.is_empty() {
                    "no options".to_string()
                } else {
                    allowed.join(", ")
                }
            )),
        }
    }

    /// Whether the device speaks UFS: `fake-ufs`, or a `vfio:` function
    /// whose PCI class code (under `roots`) says UFS host controller. An
    /// address sysfs does not know counts as NVMe (opening it reports why
    /// it cannot be used).
    pub fn is_ufs(&self, roots: &mcqio_vfio::SysRoots) -> bool {
        match &self.kind {
            DeviceKind::FakeUfs { .. } => true,
            DeviceKind::Vfio { bdf } => {
                vfio_transport(roots, bdf) == Some(mcqio_vfio::sysfs::Transport::Ufs)
            }
            _ => false,
        }
    }

    /// Whether the device stores data (so `--verify` means something).
    pub fn stores_data(&self) -> bool {
        !matches!(
            self.kind,
            DeviceKind::Fake { null: true }
                | DeviceKind::FakeUfs { null: true }
                | DeviceKind::UringNull
        )
    }
}

/// The transport of the PCI function a `vfio:<BDF>` names, from its class
/// code ([`mcqio_vfio::sysfs::transport_of`]); `None` when the address is
/// malformed, sysfs does not know it, or its class is neither NVMe nor UFS
/// (opening it then reports why it cannot be used).
pub fn vfio_transport(
    roots: &mcqio_vfio::SysRoots,
    bdf: &str,
) -> Option<mcqio_vfio::sysfs::Transport> {
    let addr = mcqio_vfio::PciAddress::parse(bdf).ok()?;
    mcqio_vfio::sysfs::transport_of(roots, &addr).ok().flatten()
}
