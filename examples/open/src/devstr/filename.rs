//! The fio spelling of the language: a `--filename` names a controller
//! and the unit (namespace or logical unit) the file is on it.

use super::parse::parse_bdf;
use super::{DeviceKind, DeviceSpec};

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
    #[error("`{0}`: unknown device; use fake, fake-ufs, vfio-<domain>.<bus>.<dev>.<fn> (e.g. vfio-0000.01.00.0), vfio\\:0000\\:01\\:00.0 or tcp\\:<addr>\\:<port>/<subsystem NQN>")]
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
    /// A `tcp:` filename whose device string the parser refuses.
    #[error("`{name}`: {why}")]
    BadTarget {
        /// The whole filename.
        name: String,
        /// The parser's reason.
        why: String,
    },
}

/// A parsed fio `--filename`: a controller, as a device string of the one
/// language, and the unit the file is on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Filename {
    /// The controller: `fake`, `fake-ufs` or `vfio:<canonical BDF>`, with
    /// no options, or a `tcp:` target with its options; jobs whose devices
    /// are equal share one controller (keyed by its
    /// [`DeviceSpec::label`]).
    pub device: DeviceSpec,
    /// The namespace or logical unit.
    pub unit: Unit,
}

impl Filename {
    /// Parse a filename as fio hands it over (its `\:` escapes already
    /// removed): the fio spelling is mapped onto the device-string
    /// language (`vfio-0000.01.00.0` → `vfio:0000:01:00.0`) and parsed by
    /// [`DeviceSpec`]'s parser; the selector is taken off first. A
    /// `tcp:` filename keeps the device string's options (`hdgst`,
    /// `ddgst`, `qpairs=`, `kato=`, `pace=`) before or after its `ns=`
    /// selector: the connection is made with them.
    pub fn parse(name: &str) -> Result<Filename, FilenameError> {
        let name = name.trim();
        if name.starts_with("tcp:") {
            return Filename::parse_tcp(name);
        }
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

    /// A `tcp:` filename: the device string with its options, and at most
    /// an `ns=` selector.
    fn parse_tcp(name: &str) -> Result<Filename, FilenameError> {
        let mut unit = Unit::Default;
        let mut spec = Vec::new();
        for (i, p) in name.split(',').enumerate() {
            let bad = || FilenameError::BadNumber(p.to_string());
            match p.split_once('=').map(|(k, v)| (k.trim(), v.trim())) {
                Some(("ns", v)) if i > 0 => {
                    unit = Unit::Ns(v.parse::<u32>().ok().filter(|&n| n >= 1).ok_or_else(bad)?)
                }
                Some(("lun", _)) if i > 0 => {
                    return Err(FilenameError::BadSelector {
                        name: name.to_string(),
                        key: p.to_string(),
                        allowed: "ns=<N> (NVMe namespace id) and the tcp: options",
                    })
                }
                _ => spec.push(p),
            }
        }
        let device =
            spec.join(",")
                .parse::<DeviceSpec>()
                .map_err(|e| FilenameError::BadTarget {
                    name: name.to_string(),
                    why: e.to_string(),
                })?;
        Ok(Filename { device, unit })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `tcp:` filename is the device string with its options (digests,
    /// queues, Keep Alive, pacing) and an optional `ns=` selector; `lun=`
    /// and a bad target are refused with the filename in the message.
    #[test]
    fn tcp_filenames_keep_their_options_and_select_a_namespace() {
        let f = Filename::parse("tcp:127.0.0.1:4420/nqn.x,hdgst,ddgst,ns=2").unwrap();
        assert_eq!(f.unit, Unit::Ns(2));
        assert_eq!(
            f.device.kind,
            DeviceKind::Tcp {
                addr: "127.0.0.1:4420".into(),
                subnqn: "nqn.x".into()
            }
        );
        assert_eq!(f.device.opts.hdgst, Some(true));
        assert_eq!(f.device.opts.ddgst, Some(true));
        assert_eq!(f.device.label(), "tcp:127.0.0.1:4420/nqn.x");
        let plain = Filename::parse("tcp:[::1]:4420/nqn.y").unwrap();
        assert_eq!(plain.unit, Unit::Default);
        assert_eq!(plain.device.opts.hdgst, None);
        assert!(matches!(
            Filename::parse("tcp:127.0.0.1:4420/nqn.x,lun=1"),
            Err(FilenameError::BadSelector { .. })
        ));
        assert!(matches!(
            Filename::parse("tcp:127.0.0.1:4420/nqn.x,ns=0"),
            Err(FilenameError::BadNumber(_))
        ));
        let e = Filename::parse("tcp:127.0.0.1/nqn.x").unwrap_err();
        assert!(e.to_string().starts_with("`tcp:127.0.0.1/nqn.x`: "), "{e}");
        let e = Filename::parse("tcp:127.0.0.1:4420/nqn.x,bogus=1").unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
    }
}
