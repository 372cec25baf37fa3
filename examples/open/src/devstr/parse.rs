//! The parser: a device string to a [`DeviceSpec`], each kind with the
//! option keys it takes, and the PCI addresses in either spelling.

use super::values::{on_off, parse_device_duration, parse_size};
use super::{err, DeviceKind, DeviceOpts, DeviceSpec, SpecError};

const FAKE_KEYS: &[&str] = &[
    "lbs", "lbads", "ns", "size", "corrupt", "error", "latency", "qpairs", "core", "sync",
];
const FAKE_UFS_KEYS: &[&str] = &[
    "mcq", "queues", "lus", "size", "latency", "core", "sync", "tr", "tprog", "dies",
];
const VFIO_KEYS: &[&str] = &["qpairs", "mcq", "shadow", "iommu"];
const URING_NULL_KEYS: &[&str] = &[];
const URING_FILE_KEYS: &[&str] = &["lbs", "lbads", "size", "direct"];
const TCP_KEYS: &[&str] = &["hdgst", "ddgst", "qpairs", "kato", "pace"];
/// Options that may stand alone, meaning `=1`.
const FLAG_KEYS: &[&str] = &["hdgst", "ddgst", "pace"];

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
            ("", _) => return err("empty device spec: use fake, fake:null, fake-ufs, fake-ufs:null, vfio:<BDF>, tcp:<addr>:<port>/<subsystem NQN>, uring:<path> or uring:null"),
            (k, _) => return err(format!("unknown device kind `{k}`: use fake, fake:null, fake-ufs, fake-ufs:null, vfio:<BDF>, tcp:<addr>:<port>/<subsystem NQN>, uring:<path> or uring:null")),
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
                "iommu" => {
                    opts.iommu = Some(
                        v.parse()
                            .map_err(|e: String| SpecError(format!("iommu={v}: {e}")))?,
                    )
                }
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
