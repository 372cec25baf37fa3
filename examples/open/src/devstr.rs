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
//! covers 1 GiB): throughput then comes from the model, not the host CPU. `vfio:` takes `qpairs` (NVMe) and
//! `mcq` (UFS).
//!
//! A fio `--filename` ([`Filename::parse`]) is the same language with the
//! spelling fio allows and one difference of meaning: `fake`, `fake-ufs` or
//! a `vfio-`/`vfio:` address, then at most a selector of the unit the file
//! is — `ns=<N>` an NVMe namespace id, `lun=<N>` a UFS logical unit
//! number — and no device options (the fio engine takes those as engine
//! options). In a device string `ns=` is the fake's namespace *count*; in
//! a filename it *selects* one, as in SPDK's fio plugin.
//!
//! Defaults of `fake` are the library's ([`FakeConfig::default`]): one RAM
//! namespace of [`FAKE_SIZE`] bytes in [`FAKE_BLOCK_SIZE`]-byte blocks;
//! `fake:null` namespaces advertise [`FAKE_NULL_SIZE`] bytes.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use mcqio_fixtures::ufs::{
    FtlConfig, LuConfig, ModelClock, UfsConfig, BLOCK_SIZE as UFS_BLOCK_SIZE,
};
use mcqio_fixtures::{FakeConfig, NamespaceConfig};

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

/// Parse a byte size with the `parse-size` crate in binary mode: a plain
/// number of bytes or a number with a suffix `k`/`m`/`g`/`t` (case-insensitive,
/// optionally followed by `b` or `ib`, all powers of 1024): `512`, `4k`,
/// `128K`, `1M`, `2GiB`, `1.5M`. A result that is not a whole number of
/// bytes, or does not fit 64 bits, is an error.
pub fn parse_size(s: &str) -> Result<u64, SpecError> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s.trim())
        .map_err(|e| {
            SpecError(format!(
                "`{s}` is not a size ({e}): use bytes or a number with k/M/G/T (e.g. 4k, 128k, 1M)"
            ))
        })
}

/// Parse a duration the same way everywhere (`-t`, `--warmup`,
/// `latency=`): a plain number is seconds (`3`, `0.5`), anything else goes
/// to `humantime` (`1s`, `500ms`, `10us`, `1.5ms`, `2m`, `1h 30m`).
pub fn parse_duration(s: &str) -> Result<Duration, SpecError> {
    let t = s.trim();
    if let Ok(v) = t.parse::<f64>() {
        if !v.is_finite() || v < 0.0 {
            return err(format!("duration `{s}` must be a non-negative number"));
        }
        return Duration::try_from_secs_f64(v)
            .map_err(|_| SpecError(format!("duration `{s}` is too large")));
    }
    humantime::parse_duration(t).map_err(|e| {
        SpecError(format!(
            "`{s}` is not a duration ({e}): use seconds or a unit, e.g. 3, 1s, 500ms, 10us"
        ))
    })
}

/// Parse a device's duration option (`latency=`, `tr=`, `tprog=`, and the
/// fio engine's `fake_latency=`): a number with its unit (`10us`, `200us`,
/// `1.5ms`, `2s`), or `0`. A bare number is refused: it meant seconds here
/// and microseconds in fio (issue 29 item 4), and a device latency is
/// almost never meant in seconds.
pub fn parse_device_duration(key: &str, v: &str) -> Result<Duration, SpecError> {
    let t = v.trim();
    if let Ok(n) = t.parse::<f64>() {
        if n == 0.0 {
            return Ok(Duration::ZERO);
        }
        return err(format!(
            "`{key}={v}` needs a unit: {t}us, {t}ms or {t}s (ns, us, ms and s are understood)"
        ));
    }
    parse_duration(t).map_err(|e| SpecError(format!("`{key}={v}`: {e}")))
}

/// Parse a CPU list: `0`, `0,1`, `0-3`, `0-3,6`. Duplicates are an error
/// (two jobs on one core is almost always a typo).
pub fn parse_cpus(s: &str) -> Result<Vec<usize>, SpecError> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim) {
        if part.is_empty() {
            return err(format!("empty entry in CPU list `{s}`"));
        }
        let bad = || {
            SpecError(format!(
                "`{part}` in CPU list `{s}` is not a CPU number or range like 0-3"
            ))
        };
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (
                a.trim().parse::<usize>().map_err(|_| bad())?,
                b.trim().parse::<usize>().map_err(|_| bad())?,
            ),
            None => {
                let c = part.parse::<usize>().map_err(|_| bad())?;
                (c, c)
            }
        };
        if lo > hi {
            return err(format!("CPU range `{part}` runs backwards"));
        }
        if hi - lo > 4096 {
            return err(format!("CPU range `{part}` is implausibly large"));
        }
        for c in lo..=hi {
            if out.contains(&c) {
                return err(format!("CPU {c} appears twice in `{s}`"));
            }
            out.push(c);
        }
    }
    Ok(out)
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

/// A switch option `key=v`: on (`on`, `1`, `true`, `yes`) or off (`off`,
/// `0`, `false`, `no`); anything else is refused, naming what each means.
fn on_off(key: &str, v: &str, on: &str, off: &str) -> Result<bool, SpecError> {
    match v {
        "on" | "1" | "true" | "yes" => Ok(true),
        "off" | "0" | "false" | "no" => Ok(false),
        _ => Err(SpecError(format!(
            "{key}={v}: use on ({on}) or off ({off})"
        ))),
    }
}

const FAKE_KEYS: &[&str] = &[
    "lbs", "lbads", "ns", "size", "corrupt", "error", "latency", "qpairs", "core", "sync",
];
const FAKE_UFS_KEYS: &[&str] = &[
    "mcq", "queues", "lus", "size", "latency", "core", "sync", "tr", "tprog", "dies",
];
const VFIO_KEYS: &[&str] = &["qpairs", "mcq", "shadow"];
const URING_NULL_KEYS: &[&str] = &[];
const URING_FILE_KEYS: &[&str] = &["lbs", "lbads", "size", "direct"];
const TCP_KEYS: &[&str] = &["hdgst", "ddgst", "qpairs", "kato", "pace"];
/// Options that may stand alone, meaning `=1`.
const FLAG_KEYS: &[&str] = &["hdgst", "ddgst", "pace"];

impl DeviceSpec {
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

    /// The fake controller this spec describes, from the one set of defaults
    /// (the library's [`FakeConfig::default`]; see the module docs). Run-specific
    /// settings (queue pairs, queue sizes, threads, fault seeds) are the
    /// caller's to add. `None` if the spec is not a `fake`.
    pub fn fake_config(&self) -> Option<FakeConfig> {
        let DeviceKind::Fake { null } = self.kind else {
            return None;
        };
        let o = &self.opts;
        let base = FakeConfig::default();
        let lbs = o.block_size.unwrap_or(FAKE_BLOCK_SIZE);
        let size = o
            .size
            .unwrap_or(if null { FAKE_NULL_SIZE } else { FAKE_SIZE });
        // Whole blocks only; at least one.
        let size = (size / lbs as u64).max(1) * lbs as u64;
        let ns = |_| {
            if null {
                NamespaceConfig::null(size, lbs)
            } else {
                NamespaceConfig::ram(size, lbs)
            }
        };
        let mut cfg = FakeConfig {
            namespaces: (0..o.ns.unwrap_or(1)).map(ns).collect(),
            latency: o.latency.unwrap_or(base.latency),
            ..base
        };
        if let Some(q) = o.qpairs {
            cfg.io_queue_pairs = q;
        }
        if o.sync == Some(true) {
            cfg.exec = mcqio_fixtures::ExecMode::Sync;
        }
        Some(cfg)
    }

    /// The fake UFS controller this spec describes: `lus` LUs (default 1)
    /// of `size` bytes each (default [`FAKE_SIZE`], or [`FAKE_NULL_SIZE`]
    /// advertised for `fake-ufs:null`) in 4 KiB blocks, MCQ advertised
    /// unless `mcq=off`, `queues` MCQ queues (default: the library's), the
    /// `latency` and `sync` options. `None` if the spec is not a `fake-ufs`.
    /// Run-specific settings (queue depth, device thread core) are the
    /// caller's to add.
    pub fn fake_ufs_config(&self) -> Option<UfsConfig> {
        let DeviceKind::FakeUfs { null } = self.kind else {
            return None;
        };
        let o = &self.opts;
        let base = UfsConfig::default();
        let size = o
            .size
            .unwrap_or(if null { FAKE_NULL_SIZE } else { FAKE_SIZE })
            .max(u64::from(UFS_BLOCK_SIZE));
        let lu = if null {
            LuConfig::null_bytes(size)
        } else {
            LuConfig::ram_bytes(size)
        };
        let mut cfg = UfsConfig {
            lus: vec![lu; usize::from(o.lus.unwrap_or(1))],
            mcq: o.mcq.unwrap_or(true),
            latency: o.latency.unwrap_or(base.latency),
            ..base
        };
        if let Some(q) = o.queues {
            cfg.queues = q;
        }
        if o.sync == Some(true) {
            cfg.exec = mcqio_fixtures::ExecMode::Sync;
        }
        if o.nand_read.is_some() || o.nand_prog.is_some() || o.nand_units.is_some() {
            // The flash cost model in wall-clock time: throughput comes
            // from tR/tPROG and the NAND units, not from host CPU speed.
            let d = FtlConfig::default();
            cfg.ftl = Some(FtlConfig {
                t_read: o.nand_read.unwrap_or(d.t_read),
                t_prog: o.nand_prog.unwrap_or(d.t_prog),
                dies: o.nand_units.unwrap_or(d.dies),
                clock: ModelClock::Wall,
                ..d
            });
        }
        Some(cfg)
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

/// `host:port/subnqn` of a `tcp:` spec (IPv6 hosts in brackets:
/// `[::1]:4420/…`).
fn parse_tcp(a: &str) -> Result<DeviceKind, SpecError> {
    let usage = "use tcp:<address>:<port>/<subsystem NQN>, e.g. tcp:127.0.0.1:4420/nqn.2026-01.io.example:sub1";
    let Some((addr, subnqn)) = a.split_once('/') else {
        return err(format!("`tcp:{a}` names no subsystem: {usage}"));
    };
    let port = addr.rsplit_once(':').map(|(h, p)| (h, p.parse::<u16>()));
    match port {
        Some((h, Ok(p))) if !h.is_empty() && p != 0 => {}
        _ => return err(format!("`{addr}` is not <address>:<port>: {usage}")),
    }
    if subnqn.is_empty() || subnqn.len() > 255 {
        return err(format!(
            "subsystem NQN `{subnqn}` must be 1 to 255 bytes: {usage}"
        ));
    }
    Ok(DeviceKind::Tcp {
        addr: addr.into(),
        subnqn: subnqn.into(),
    })
}

impl std::str::FromStr for DeviceSpec {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, SpecError> {
        let raw = s.trim().to_string();
        let mut parts = raw.split(',');
        let head = parts.next().unwrap_or_default();
        let (kind_s, arg) = match head.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (head, None),
        };
        let (kind, keys) = match (kind_s, arg) {
            ("fake", None) => (DeviceKind::Fake { null: false }, FAKE_KEYS),
            ("fake", Some("null")) => (DeviceKind::Fake { null: true }, FAKE_KEYS),
            ("fake", Some("ram")) => (DeviceKind::Fake { null: false }, FAKE_KEYS),
            ("fake", Some(a)) => return err(format!("unknown fake variant `{a}`: use `fake` or `fake:null`")),
            ("fake-ufs", None) | ("fake-ufs", Some("ram")) => (DeviceKind::FakeUfs { null: false }, FAKE_UFS_KEYS),
            ("fake-ufs", Some("null")) => (DeviceKind::FakeUfs { null: true }, FAKE_UFS_KEYS),
            ("fake-ufs", Some(a)) => return err(format!("unknown fake-ufs variant `{a}`: use `fake-ufs` or `fake-ufs:null`")),
            ("vfio", Some(bdf)) if !bdf.is_empty() => (DeviceKind::Vfio { bdf: bdf.into() }, VFIO_KEYS),
            // The fio spelling, mapped onto `vfio:` with the address in its
            // canonical form.
            (k, None) if k.starts_with("vfio-") => match parse_bdf(&k["vfio-".len()..]) {
                Some(bdf) => (DeviceKind::Vfio { bdf }, VFIO_KEYS),
                None => return err(format!("`{}` is not a PCI address like 0000.01.00.0 or 01.00.0", &k["vfio-".len()..])),
            },
            ("vfio", _) => return err("`vfio` needs a PCI address: vfio:0000:01:00.0 (list them with `mcqio-perf devices` or lspci -D -d ::0108 for NVMe, ::0109 for UFS)"),
            ("uring", Some("null")) => (DeviceKind::UringNull, URING_NULL_KEYS),
            ("uring", Some(p)) if !p.is_empty() => (DeviceKind::UringFile { path: p.into() }, URING_FILE_KEYS),
            ("uring", _) => return err("`uring` needs a path or `null`: uring:/dev/nvme0n1, uring:/tmp/file, uring:null"),
            ("tcp", Some(a)) => (parse_tcp(a)?, TCP_KEYS),
            ("tcp", None) => return err("`tcp` needs an address and a subsystem: tcp:127.0.0.1:4420/nqn.2026-01.io.example:sub1"),
            ("", _) => return err("empty device spec: use fake, fake:null, fake-ufs, fake-ufs:null, vfio:<BDF>, uring:<path> or uring:null"),
            (k, _) => return err(format!("unknown device kind `{k}`: use fake, fake:null, fake-ufs, fake-ufs:null, vfio:<BDF>, uring:<path> or uring:null")),
        };
        let mut opts = DeviceOpts::default();
        let mut keys_given = Vec::new();
        for opt in parts {
            let opt = opt.trim();
            if opt.is_empty() {
                continue;
            }
            let (k, v) = match opt.split_once('=') {
                Some(kv) => kv,
                None if FLAG_KEYS.contains(&opt) && keys.contains(&opt) => (opt, "1"),
                None => return err(format!("device option `{opt}` needs a value: key=value")),
            };
            keys_given.push(k.to_string());
            if !keys.contains(&k) {
                let allowed = if keys.is_empty() {
                    "none".to_string()
                } else {
                    keys.join(", ")
                };
                return err(format!(
                    "option `{k}` does not apply to `{head}` (allowed: {allowed})"
                ));
            }
            let num = |v: &str| -> Result<u64, SpecError> {
                v.parse::<u64>()
                    .map_err(|_| SpecError(format!("`{k}={v}`: expected a whole number")))
            };
            match k {
                "lbs" => {
                    let b = parse_size(v)?;
                    if !(512..=65536).contains(&b) || !b.is_power_of_two() {
                        return err(format!("lbs={v}: the logical block size must be a power of two from 512 to 64k bytes"));
                    }
                    set_block_size(&mut opts, b as u32, opt)?;
                }
                "lbads" => {
                    // NVMe's LBADS: the block size as a power of two.
                    let shift = match v.parse::<u32>() {
                        Ok(n) if (9..=16).contains(&n) => n,
                        _ => {
                            return err(format!(
                                "lbads={v}: LBADS is a power of two as in NVMe (9 = 512 B, 12 = 4 KiB, up to 16); give bytes with lbs= (e.g. lbs=4k)"
                            ))
                        }
                    };
                    set_block_size(&mut opts, 1 << shift, opt)?;
                }
                "ns" => {
                    let n = num(v)?;
                    if !(1..=1024).contains(&n) {
                        return err(format!("ns={v}: namespace count must be 1..=1024"));
                    }
                    opts.ns = Some(n as u32);
                }
                "size" => {
                    let b = parse_size(v)?;
                    if b == 0 {
                        return err("size=0: a device needs at least one block");
                    }
                    opts.size = Some(b);
                }
                "corrupt" | "error" => {
                    let p: f64 = v.parse().map_err(|_| {
                        SpecError(format!("{k}={v}: expected a probability like 0.001"))
                    })?;
                    if !(0.0..=1.0).contains(&p) {
                        return err(format!("{k}={v}: a probability is between 0 and 1"));
                    }
                    if k == "corrupt" {
                        opts.corrupt = Some(p);
                    } else {
                        opts.error = Some(p);
                    }
                }
                "latency" => opts.latency = Some(parse_device_duration(k, v)?),
                "qpairs" => {
                    let n = num(v)?;
                    if !(1..=65535).contains(&n) {
                        return err(format!("qpairs={v}: must be 1..=65535"));
                    }
                    opts.qpairs = Some(n as u16);
                }
                "core" => opts.core = Some(num(v)? as usize),
                "tr" => opts.nand_read = Some(parse_device_duration(k, v)?),
                "tprog" => opts.nand_prog = Some(parse_device_duration(k, v)?),
                "dies" => {
                    let n = num(v)?;
                    if !(1..=4096).contains(&n) {
                        return err(format!("dies={v}: 1 to 4096 NAND units"));
                    }
                    opts.nand_units = Some(n as u32);
                }
                "mcq" => opts.mcq = Some(on_off(k, v, "MCQ", "legacy single doorbell")?),
                "shadow" => {
                    opts.shadow = Some(on_off(
                        k,
                        v,
                        "shadow doorbells when the NVMe controller offers them",
                        "doorbell registers only, the default",
                    )?)
                }
                "queues" | "lus" => {
                    let n = num(v)?;
                    if !(1..=32).contains(&n) {
                        return err(format!("{k}={v}: a UFS controller has 1 to 32"));
                    }
                    if k == "queues" {
                        opts.queues = Some(n as u8);
                    } else {
                        opts.lus = Some(n as u8);
                    }
                }
                "hdgst" | "ddgst" | "pace" => {
                    let b = match v {
                        "1" | "true" | "yes" | "on" => true,
                        "0" | "false" | "no" | "off" => false,
                        _ => return err(format!("{k}={v}: use {k} (on), {k}=0 or {k}=1")),
                    };
                    match k {
                        "hdgst" => opts.hdgst = Some(b),
                        "ddgst" => opts.ddgst = Some(b),
                        _ => opts.pace = Some(b),
                    }
                }
                "kato" => opts.kato = Some(parse_device_duration(k, v)?),
                "direct" | "sync" => {
                    let b = match v {
                        "1" | "true" | "yes" => true,
                        "0" | "false" | "no" => false,
                        _ => return err(format!("{k}={v}: use 0 or 1")),
                    };
                    if k == "direct" {
                        opts.direct = Some(b);
                    } else {
                        opts.sync = Some(b);
                    }
                }
                _ => unreachable!("key list and match agree"),
            }
        }
        Ok(DeviceSpec {
            raw,
            kind,
            opts,
            keys: keys_given,
        })
    }
}

fn set_block_size(opts: &mut DeviceOpts, bytes: u32, opt: &str) -> Result<(), SpecError> {
    match opts.block_size {
        Some(b) if b != bytes => err(format!(
            "`{opt}` contradicts the block size given before ({b} B); give lbs= or lbads= once"
        )),
        _ => {
            opts.block_size = Some(bytes);
            Ok(())
        }
    }
}

/// A PCI address with dots or colons between domain, bus and device and a
/// dot before the function (`0000.01.00.0`, `0000:01:00.0`, `01.00.0`, the
/// domain 0 when left out), in the canonical `dddd:bb:dd.f`; `None` if it is
/// malformed.
pub fn parse_bdf(s: &str) -> Option<String> {
    let parts: Vec<&str> = s.split(['.', ':']).collect();
    let (domain, bus, dev, func) = match parts[..] {
        [d, b, v, f] => (d, b, v, f),
        [b, v, f] => ("0000", b, v, f),
        _ => return None,
    };
    let hex = |p: &str, width: usize, max: u32| {
        if p.is_empty() || p.len() > width {
            return None;
        }
        u32::from_str_radix(p, 16).ok().filter(|&v| v <= max)
    };
    let (d, b, v, f) = (
        hex(domain, 4, 0xffff)?,
        hex(bus, 2, 0xff)?,
        hex(dev, 2, 0x1f)?,
        hex(func, 1, 7)?,
    );
    Some(format!("{d:04x}:{b:02x}:{v:02x}.{f:x}"))
}

/// The unit a fio filename selects on its controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// No selector: namespace 1 (NVMe) or LU 0 (UFS).
    Default,
    /// `ns=<N>`: an NVMe namespace id (at least 1).
    Ns(u32),
    /// `lun=<N>`: a UFS logical unit number.
    Lun(u8),
}

/// A fio filename that cannot be used, by the part that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilenameError {
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
}

/// A parsed fio `--filename`: a controller, as a device string of the one
/// language, and the unit the file is on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Filename {
    /// The controller: `fake`, `fake-ufs` or `vfio:<canonical BDF>`, with
    /// no options; jobs whose devices are equal share one controller
    /// (keyed by its [`DeviceSpec::label`]).
    pub device: DeviceSpec,
    /// The namespace or logical unit.
    pub unit: Unit,
}

impl Filename {
    /// Parse a filename as fio hands it over (its `\:` escapes already
    /// removed): the fio spelling is mapped onto the device-string
    /// language (`vfio-0000.01.00.0` → `vfio:0000:01:00.0`) and parsed by
    /// [`DeviceSpec`]'s parser; the selector is taken off first.
    pub fn parse(name: &str) -> Result<Filename, FilenameError> {
        let name = name.trim();
        let mut parts = name.split(',');
        let dev = parts.next().unwrap_or_default();
        let head = match dev {
            "fake" | "fake-ufs" => dev.to_string(),
            _ => match dev
                .strip_prefix("vfio-")
                .or_else(|| dev.strip_prefix("vfio:"))
            {
                Some(a) => format!(
                    "vfio:{}",
                    parse_bdf(a).ok_or_else(|| FilenameError::BadAddress(a.to_string()))?
                ),
                None => return Err(FilenameError::UnknownDevice(dev.to_string())),
            },
        };
        let device: DeviceSpec = head
            .parse()
            .map_err(|_| FilenameError::UnknownDevice(dev.to_string()))?;
        let (ns, lun, allowed) = match device.kind {
            DeviceKind::Fake { .. } => (true, false, "ns=<N> (namespace id)"),
            DeviceKind::FakeUfs { .. } => (false, true, "lun=<N> (logical unit)"),
            _ => (
                true,
                true,
                "ns=<N> (NVMe namespace id) or lun=<N> (UFS logical unit)",
            ),
        };
        let mut unit = Unit::Default;
        for p in parts {
            match p.split_once('=').map(|(k, v)| (k.trim(), v.trim())) {
                Some(("ns", v)) if ns => {
                    unit = Unit::Ns(
                        v.parse::<u32>()
                            .ok()
                            .filter(|&n| n >= 1)
                            .ok_or_else(|| FilenameError::BadNumber(v.to_string()))?,
                    )
                }
                Some(("lun", v)) if lun => {
                    unit = Unit::Lun(
                        v.parse::<u8>()
                            .map_err(|_| FilenameError::BadNumber(v.to_string()))?,
                    )
                }
                _ => {
                    return Err(FilenameError::BadSelector {
                        name: name.to_string(),
                        key: p.to_string(),
                        allowed,
                    })
                }
            }
        }
        Ok(Filename { device, unit })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 13 items 6/7: `vfio:` tells a UFS host controller from an
    /// NVMe controller by its class code, so it opens the UFS transport.
    #[test]
    fn vfio_tells_ufs_from_nvme() {
        use mcqio_vfio::sysfs::Transport;
        let base = std::env::temp_dir().join(format!("mcqio-devstr-ufs-{}", std::process::id()));
        let roots = mcqio_vfio::SysRoots::under(&base);
        for (bdf, class) in [("0000:00:04.0", "0x010901"), ("0000:00:03.0", "0x010802")] {
            let d = roots.sys.join("bus/pci/devices").join(bdf);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("vendor"), "0x1b36\n").unwrap();
            std::fs::write(d.join("device"), "0x0013\n").unwrap();
            std::fs::write(d.join("class"), format!("{class}\n")).unwrap();
        }
        assert_eq!(vfio_transport(&roots, "0000:00:04.0"), Some(Transport::Ufs));
        assert!(spec("vfio:0000:00:04.0").is_ufs(&roots));
        assert_eq!(
            vfio_transport(&roots, "0000:00:03.0"),
            Some(Transport::Nvme)
        );
        assert!(!spec("vfio:0000:00:03.0").is_ufs(&roots));
        assert_eq!(vfio_transport(&roots, "0000:00:09.0"), None);
        assert_eq!(vfio_transport(&roots, "not-a-bdf"), None);
        assert!(spec("fake-ufs").is_ufs(&roots));
        assert!(!spec("fake").is_ufs(&roots));
        let _ = std::fs::remove_dir_all(&base);
    }

    /// Issue 13 item 7: `fake-ufs` and its options.
    #[test]
    fn fake_ufs_specs() {
        let s = spec("fake-ufs,mcq=off,queues=4,lus=2,size=1M,latency=10us,sync=1");
        assert_eq!(s.kind, DeviceKind::FakeUfs { null: false });
        assert_eq!(s.label(), "fake-ufs");
        let c = s.fake_ufs_config().unwrap();
        assert!(!c.mcq);
        assert_eq!(c.queues, 4);
        assert_eq!(c.lus, vec![LuConfig::Ram { blocks: 256 }; 2]);
        assert_eq!(c.latency, Duration::from_micros(10));
        assert_eq!(c.exec, mcqio_fixtures::ExecMode::Sync);
        let n = spec("fake-ufs:null");
        assert_eq!(n.label(), "fake-ufs:null");
        assert!(!n.stores_data());
        assert!(spec("fake-ufs").stores_data());
        assert!(spec("fake-ufs").fake_ufs_config().unwrap().mcq);
        assert!(spec("fake").fake_ufs_config().is_none());
        for bad in [
            "fake-ufs:zero",
            "fake-ufs,mcq=maybe",
            "fake-ufs,queues=0",
            "fake-ufs,queues=33",
            "fake-ufs,lus=0",
            "fake-ufs,lbs=512",
            "fake,mcq=on",
        ] {
            assert!(
                bad.parse::<DeviceSpec>().is_err(),
                "{bad:?} should be rejected"
            );
        }
        assert_eq!(spec("vfio:0000:01:00.0,mcq=off").opts.mcq, Some(false));
        assert_eq!(
            spec("vfio:0000:01:00.0,shadow=off").opts.shadow,
            Some(false)
        );
        assert!("vfio:0000:01:00.0,shadow=maybe"
            .parse::<DeviceSpec>()
            .is_err());
        assert!("fake,shadow=off".parse::<DeviceSpec>().is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("128K").unwrap(), 128 << 10);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("1m").unwrap(), 1 << 20);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("64MB").unwrap(), 64 << 20);
        assert_eq!(parse_size("1t").unwrap(), 1 << 40);
        assert!(parse_size("").is_err());
        assert!(parse_size("k").is_err());
        assert!(parse_size("4q").is_err());
        assert!(parse_size("-4k").is_err());
        assert!(parse_size("99999999999999t").is_err());
        // Issue 16 item 23: the crate's extras, binary throughout.
        assert_eq!(parse_size("1.5M").unwrap(), 3 << 19);
        assert_eq!(parse_size("4 KiB").unwrap(), 4096);
        assert_eq!(parse_size("1KB").unwrap(), 1024);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10us").unwrap(), Duration::from_micros(10));
        assert_eq!(parse_duration("500ns").unwrap(), Duration::from_nanos(500));
        assert_eq!(
            parse_duration("1.5ms").unwrap(),
            Duration::from_micros(1500)
        );
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("-1us").is_err());
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("nan").is_err());
        assert_eq!(parse_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_duration("0.5").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
    }

    /// Issue 29 item 4: `latency=10` meant 10 s here and 10 µs in the fio
    /// engine. A device's durations now need their unit (only `0` is the
    /// same in every unit), and the fio engine parses its own with the same
    /// function.
    #[test]
    fn device_durations_need_a_unit() {
        for s in ["fake,latency=10", "fake-ufs,tr=200", "fake-ufs,tprog=0.5"] {
            let e = s.parse::<DeviceSpec>().unwrap_err().to_string();
            assert!(e.contains("unit"), "{s}: {e}");
        }
        let c = spec("fake,latency=10us").fake_config().unwrap();
        assert_eq!(c.latency, Duration::from_micros(10));
        let c = spec("fake,latency=0").fake_config().unwrap();
        assert_eq!(c.latency, Duration::ZERO);
        assert_eq!(
            parse_device_duration("latency", "1.5ms").unwrap(),
            Duration::from_micros(1500)
        );
        let e = parse_device_duration("fake_latency", "10")
            .unwrap_err()
            .to_string();
        assert!(e.contains("fake_latency=10") && e.contains("10us"), "{e}");
        assert!(parse_device_duration("x", "fast").is_err());
        assert!(parse_device_duration("x", "-1us").is_err());
    }

    /// Issue 16 item 6: `fake` means the library's default device.
    #[test]
    fn fake_defaults_are_the_library_defaults() {
        let lib = FakeConfig::default();
        let ours = spec("fake").fake_config().unwrap();
        assert_eq!(ours.namespaces.len(), lib.namespaces.len());
        assert_eq!(
            ours.namespaces[0].size_bytes(),
            lib.namespaces[0].size_bytes()
        );
        assert_eq!(ours.namespaces[0].size_bytes(), FAKE_SIZE);
        assert!(matches!(
            lib.namespaces[0],
            NamespaceConfig::Ram {
                lba_size: FAKE_BLOCK_SIZE,
                ..
            }
        ));
        let two = spec("fake,ns=2,lbads=12,size=1M").fake_config().unwrap();
        assert_eq!(two.namespaces.len(), 2);
        assert!(matches!(
            two.namespaces[1],
            NamespaceConfig::Ram {
                lba_size: 4096,
                size_bytes: 0x10_0000
            }
        ));
        assert!(spec("uring:null").fake_config().is_none());
    }

    #[test]
    fn commands_refuse_options_they_do_not_use() {
        let s = spec("fake,latency=10us");
        let e = s.check_keys(&["inval"], "dma-bench").unwrap_err();
        assert!(
            e.0.contains("`latency`") && e.0.contains("dma-bench"),
            "{e}"
        );
        assert!(spec("fake").check_keys(&[], "dma-bench").is_ok());
        let Err(e) = spec("fake,corrupt=0.1").backing("hello") else {
            panic!("corrupt= is not a hello option");
        };
        assert!(e.0.contains("corrupt"), "{e}");
        assert!(spec("uring:null").backing("hello").is_err());
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpus("0").unwrap(), vec![0]);
        assert_eq!(parse_cpus("0,1").unwrap(), vec![0, 1]);
        assert_eq!(parse_cpus("0-3,6").unwrap(), vec![0, 1, 2, 3, 6]);
        assert_eq!(parse_cpus(" 2 - 3 ").unwrap(), vec![2, 3]);
        assert!(parse_cpus("3-1").is_err());
        assert!(parse_cpus("0,0").is_err());
        assert!(parse_cpus("0,,1").is_err());
        assert!(parse_cpus("x").is_err());
        assert!(parse_cpus("0-999999").is_err());
    }

    fn spec(s: &str) -> DeviceSpec {
        s.parse().unwrap()
    }

    #[test]
    fn tcp_specs_name_address_subsystem_and_options() {
        let t = spec(
            "tcp:127.0.0.1:4420/nqn.2026-01.io.example:sub1,hdgst,ddgst=0,qpairs=3,kato=5s,pace=0",
        );
        assert_eq!(
            t.kind,
            DeviceKind::Tcp {
                addr: "127.0.0.1:4420".into(),
                subnqn: "nqn.2026-01.io.example:sub1".into()
            }
        );
        assert_eq!(t.label(), "tcp:127.0.0.1:4420/nqn.2026-01.io.example:sub1");
        assert_eq!((t.opts.hdgst, t.opts.ddgst), (Some(true), Some(false)));
        assert_eq!(t.opts.qpairs, Some(3));
        assert_eq!(t.opts.kato, Some(Duration::from_secs(5)));
        assert!(t.stores_data());
        let o = t.tcp_options("nqn.x");
        assert!(o.header_digest && !o.data_digest);
        assert!(!o.recv_pacing, "pace=0");
        assert!(
            spec("tcp:127.0.0.1:4420/nqn.x")
                .tcp_options("nqn.x")
                .recv_pacing
        );
        assert_eq!(
            (o.io_queues, o.kato, o.subnqn.as_str()),
            (3, Duration::from_secs(5), "nqn.x")
        );
        let ipv6 = spec("tcp:[::1]:4420/nqn.x");
        assert!(matches!(ipv6.kind, DeviceKind::Tcp { ref addr, .. } if addr == "[::1]:4420"));
        for bad in [
            "tcp",
            "tcp:127.0.0.1:4420",
            "tcp:127.0.0.1/nqn.x",
            "tcp:127.0.0.1:0/nqn.x",
            "tcp::4420/nqn.x",
            "tcp:127.0.0.1:4420/",
            "tcp:127.0.0.1:4420/nqn.x,lbs=4k",
            "tcp:127.0.0.1:4420/nqn.x,hdgst=maybe",
            "tcp:127.0.0.1:4420/nqn.x,kato=5",
            "fake,hdgst",
        ] {
            assert!(
                bad.parse::<DeviceSpec>().is_err(),
                "{bad} should be refused"
            );
        }
    }

    #[test]
    fn device_specs() {
        assert_eq!(spec("fake").kind, DeviceKind::Fake { null: false });
        assert_eq!(spec("fake:null").kind, DeviceKind::Fake { null: true });
        let f = spec("fake,lbs=4k,ns=2,size=64M,corrupt=0.0001,latency=10us,qpairs=8");
        assert_eq!(f.opts.block_size, Some(4096));
        assert_eq!(spec("fake,lbads=12").opts.block_size, Some(4096));
        assert_eq!(spec("fake,lbads=9,lbs=512").opts.block_size, Some(512));
        assert_eq!(f.opts.ns, Some(2));
        assert_eq!(f.opts.size, Some(64 << 20));
        assert_eq!(f.opts.corrupt, Some(0.0001));
        assert_eq!(spec("fake,error=0.5").opts.error, Some(0.5));
        assert_eq!(f.opts.latency, Some(Duration::from_micros(10)));
        assert_eq!(f.opts.qpairs, Some(8));
        assert_eq!(
            spec("vfio:0000:01:00.0").kind,
            DeviceKind::Vfio {
                bdf: "0000:01:00.0".into()
            }
        );
        assert_eq!(spec("uring:null").kind, DeviceKind::UringNull);
        let u = spec("uring:/tmp/x,direct=0,size=1M");
        assert_eq!(
            u.kind,
            DeviceKind::UringFile {
                path: "/tmp/x".into()
            }
        );
        assert_eq!(u.opts.direct, Some(false));
        assert_eq!(u.label(), "uring:/tmp/x");
        assert!(!spec("uring:null").stores_data());
        assert!(!spec("fake:null").stores_data());
        assert!(spec("fake").stores_data());
    }

    /// Where the language is spelled two ways.
    #[derive(Debug, Clone, Copy)]
    enum Lang {
        /// A device string (`mcqio-perf -d`, `hello`, `identify`).
        Cli,
        /// A fio `--filename`.
        Fio,
    }

    /// What a string parses to: the device's label and the unit selected
    /// (always the default for a device string), or the error's text.
    #[derive(Debug, PartialEq)]
    enum Want {
        Ok(&'static str, Unit),
        Err(&'static str),
    }

    /// One table for both spellings: every form each tool accepts today,
    /// and the ones each refuses.
    #[test]
    fn both_spellings() {
        use Lang::{Cli, Fio};
        use Want::{Err as E, Ok as O};
        let d = Unit::Default;
        let table: &[(Lang, &str, Want)] = &[
            // mcqio-perf, hello, identify.
            (Cli, "fake", O("fake", d)),
            (Cli, "fake:null", O("fake:null", d)),
            (Cli, "fake:ram", O("fake", d)),
            (Cli, "fake,ns=2,lbs=4k", O("fake", d)),
            (Cli, "fake-ufs", O("fake-ufs", d)),
            (Cli, "fake-ufs:null,mcq=off", O("fake-ufs:null", d)),
            (Cli, "vfio:0000:01:00.0", O("vfio:0000:01:00.0", d)),
            (Cli, "vfio:01:00.0,mcq=off", O("vfio:01:00.0", d)),
            // The fio spelling works in a device string too.
            (Cli, "vfio-0000.01.00.0", O("vfio:0000:01:00.0", d)),
            (Cli, "vfio-01.00.0,qpairs=4", O("vfio:0000:01:00.0", d)),
            (Cli, "vfio-1.2", E("not a PCI address")),
            (Cli, "uring:null", O("uring:null", d)),
            (Cli, "uring:/tmp/x", O("uring:/tmp/x", d)),
            (Cli, "fake,lun=1", E("does not apply")),
            // The fio engine's --filename.
            (Fio, "fake", O("fake", d)),
            (Fio, "fake,ns=3", O("fake", Unit::Ns(3))),
            (Fio, "fake-ufs", O("fake-ufs", d)),
            (Fio, "fake-ufs,lun=0", O("fake-ufs", Unit::Lun(0))),
            (Fio, "fake-ufs,lun=2", O("fake-ufs", Unit::Lun(2))),
            (Fio, "vfio-0000.01.00.0", O("vfio:0000:01:00.0", d)),
            (Fio, "vfio-01.00.0", O("vfio:0000:01:00.0", d)),
            (Fio, "vfio:0000:01:00.0", O("vfio:0000:01:00.0", d)),
            (Fio, "vfio-0000:01:00.0", O("vfio:0000:01:00.0", d)),
            (Fio, "vfio:01:00.0", O("vfio:0000:01:00.0", d)),
            (
                Fio,
                "vfio-0000.01.00.0,ns=1",
                O("vfio:0000:01:00.0", Unit::Ns(1)),
            ),
            (
                Fio,
                "vfio-0001.ff.1f.7,ns=2",
                O("vfio:0001:ff:1f.7", Unit::Ns(2)),
            ),
            // Its transport is known only when it is opened.
            (
                Fio,
                "vfio-01.00.0,lun=0",
                O("vfio:0000:01:00.0", Unit::Lun(0)),
            ),
            (Fio, "/dev/nvme0n1", E("unknown device")),
            (Fio, "fakeish", E("unknown device")),
            (Fio, "fake:null", E("unknown device")),
            (Fio, "uring:null", E("unknown device")),
            (Fio, "vfio-", E("not a PCI address")),
            (Fio, "vfio-1.2", E("not a PCI address")),
            (Fio, "vfio-0000.100.00.0", E("not a PCI address")),
            (Fio, "vfio-0000.00.20.0", E("not a PCI address")),
            (Fio, "vfio-0000.00.00.8", E("not a PCI address")),
            (Fio, "vfio-zz.00.0", E("not a PCI address")),
            (Fio, "vfio-00000.00.00.0", E("not a PCI address")),
            (Fio, "fake,ns=0", E("a namespace id is 1")),
            (Fio, "fake,ns=x", E("a namespace id is 1")),
            (Fio, "fake-ufs,lun=256", E("a LUN 0 to 255")),
            (Fio, "fake-ufs,lun=-1", E("a LUN 0 to 255")),
            (Fio, "fake-ufs,lun=x", E("a LUN 0 to 255")),
            // A filename carries no device options: they are engine options.
            (Fio, "fake,size=1M", E("the device takes ns=<N>")),
            (Fio, "fake,lun=1", E("the device takes ns=<N>")),
            (Fio, "fake-ufs,ns=1", E("the device takes lun=<N>")),
            (
                Fio,
                "vfio-01.00.0,qpairs=4",
                E("ns=<N> (NVMe namespace id) or lun=<N>"),
            ),
        ];
        for (lang, s, want) in table {
            let got = match lang {
                Cli => s
                    .parse::<DeviceSpec>()
                    .map(|d| (d.label(), Unit::Default))
                    .map_err(|e| e.to_string()),
                Fio => Filename::parse(s)
                    .map(|f| (f.device.label(), f.unit))
                    .map_err(|e| e.to_string()),
            };
            match (want, got) {
                (Want::Ok(label, unit), Ok((l, u))) => {
                    assert_eq!((label.to_string(), *unit), (l, u), "{lang:?} {s:?}")
                }
                (Want::Err(part), Err(e)) => assert!(e.contains(part), "{lang:?} {s:?}: {e}"),
                (want, got) => panic!("{lang:?} {s:?}: want {want:?}, got {got:?}"),
            }
        }
        // The fio errors are typed: the engine tells which part is wrong.
        assert!(matches!(
            Filename::parse("vfio-1.2"),
            Err(FilenameError::BadAddress(a)) if a == "1.2"
        ));
        assert!(matches!(
            Filename::parse("fake,size=1M"),
            Err(FilenameError::BadSelector { .. })
        ));
        // Jobs on one controller find it by label, whatever the spelling.
        assert_eq!(
            Filename::parse("vfio-01.00.0").unwrap().device,
            Filename::parse("vfio:0000:01:00.0,ns=2").unwrap().device
        );
    }

    #[test]
    fn bad_device_specs() {
        for bad in [
            "",
            "nvme",
            "vfio",
            "vfio:",
            "uring",
            "uring:",
            "fake:zero",
            "fake,lbs=1000",
            "fake,lbs=256",
            "fake,lbads=4096",
            "fake,lbads=8",
            "fake,lbads=12,lbs=512",
            "fake,ns=0",
            "fake,corrupt=2",
            "fake,size=0",
            "fake,bogus=1",
            "fake,ns",
            "uring:null,size=1M",
            "uring:/x,corrupt=0.1",
            "uring:/x,direct=maybe",
            "fake,latency=soon",
        ] {
            assert!(
                bad.parse::<DeviceSpec>().is_err(),
                "{bad:?} should be rejected"
            );
        }
        let e = "fake,bogus=1".parse::<DeviceSpec>().unwrap_err();
        assert!(e.0.contains("allowed: lbs, lbads"), "{e}");
        let e = "fake,lbads=4096".parse::<DeviceSpec>().unwrap_err();
        assert!(e.0.contains("lbs="), "{e}");
    }
}
