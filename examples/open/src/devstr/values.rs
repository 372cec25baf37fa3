//! The values inside options and flags: sizes, durations, CPU lists and
//! on/off switches, parsed the same way by every frontend.

use std::time::Duration;

use super::{err, SpecError};

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
/// and microseconds in fio, and a device latency is
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

/// A switch option `key=v`: on (`on`, `1`, `true`, `yes`) or off (`off`,
/// `0`, `false`, `no`); anything else is refused, naming what each means.
pub(super) fn on_off(key: &str, v: &str, on: &str, off: &str) -> Result<bool, SpecError> {
    match v {
        "on" | "1" | "true" | "yes" => Ok(true),
        "off" | "0" | "false" | "no" => Ok(false),
        _ => Err(SpecError(format!(
            "{key}={v}: use on ({on}) or off ({off})"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // The crate's extras, binary throughout.
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
}
