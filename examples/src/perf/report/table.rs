//! The spdk_nvme_perf-style table (the output without `--json`).

use std::fmt::Write as _;

use super::{LatUs, RunReport, Stats};

/// The name column's width unless a name is longer (spdk_nvme_perf's).
const NAME_WIDTH: usize = 44;
/// Width of the figures right of the name column: `": "`, IOPS, MiB/s and
/// the three latencies.
const FIGURES_WIDTH: usize = 2 + 12 + 4 * 11;

fn row(out: &mut String, width: usize, name: &str, s: &Stats) {
    let _ = writeln!(
        out,
        "{name:<width$}: {:>12.2} {:>10} {:>10.2} {:>10.2} {:>10.2}",
        s.iops,
        s.mib_s
            .map_or_else(|| "-".to_string(), |m| format!("{m:.2}")),
        s.lat_us.avg,
        s.lat_us.min,
        s.lat_us.max
    );
}

/// The `read`/`write` rows under a row of a mixed workload.
fn dir_rows(out: &mut String, width: usize, s: &Stats) {
    if s.read.is_none() || s.write.is_none() {
        return;
    }
    for (name, d) in [("  read", &s.read), ("  write", &s.write)] {
        if let Some(d) = d {
            let _ = writeln!(
                out,
                "{name:<width$}: {:>12.2} {:>10} {:>10.2} {:>10.2} {:>10.2}",
                d.iops,
                d.mib_s
                    .map_or_else(|| "-".to_string(), |m| format!("{m:.2}")),
                d.lat_us.avg,
                d.lat_us.min,
                d.lat_us.max
            );
        }
    }
}

impl RunReport {
    /// The human-readable table.
    pub fn table(&self, percentiles: bool) -> String {
        let mut out = String::new();
        let w = &self.workload;
        let bound = match (w.ios_per_job, w.time_s) {
            (Some(n), Some(t)) => format!("{n} I/Os per job or {t} s, whichever came first"),
            (Some(n), None) => format!("{n} I/Os per job"),
            (None, Some(t)) => format!("{t} s"),
            _ => String::new(),
        };
        // What was measured, not what was asked for.
        let bound = if self.interrupted {
            format!(
                "interrupted after {:.2} s (asked: {bound})",
                self.total.stats.elapsed_s
            )
        } else {
            bound
        };
        let _ = writeln!(
            out,
            "{} ({}): {} {}B, read {}%, QD {} x {} job(s), {bound}{}{}",
            self.device,
            self.backend,
            w.pattern,
            w.io_size,
            w.read_pct,
            w.queue_depth,
            w.jobs,
            if w.warmup_s > 0.0 {
                format!(" after {} s warm-up", w.warmup_s)
            } else {
                String::new()
            },
            if w.verify { ", verify" } else { "" }
        );
        // The name column is as wide as its longest name (a tcp: device
        // with its NQN, `vfio:<BDF>,iommu=iommufd`), so the figures stay in
        // their columns.
        let names: Vec<String> = self
            .jobs
            .iter()
            .map(|j| {
                let core = j
                    .core
                    .map_or_else(|| "any core".to_string(), |c| format!("core {c}"));
                match j.unit() {
                    Some(u) => format!("{} {u} from {core}", j.device),
                    None => format!("{} from {core}", j.device),
                }
            })
            .collect();
        let width = names
            .iter()
            .map(|n| n.chars().count())
            .fold(NAME_WIDTH, usize::max);
        let rule = "=".repeat(width + FIGURES_WIDTH);
        let _ = writeln!(out, "{rule}");
        let _ = writeln!(
            out,
            "{:<width$}  {:>12} {:>10} {:>32}",
            "", "", "", "Latency(us)"
        );
        let _ = writeln!(
            out,
            "{:<width$}: {:>12} {:>10} {:>10} {:>10} {:>10}",
            "Device Information", "IOPS", "MiB/s", "Average", "min", "max"
        );
        for (j, name) in self.jobs.iter().zip(&names) {
            row(&mut out, width, name, &j.stats);
            dir_rows(&mut out, width, &j.stats);
        }
        let _ = writeln!(out, "{rule}");
        let t = &self.total.stats;
        row(&mut out, width, "Total", t);
        dir_rows(&mut out, width, t);
        let _ = writeln!(out);
        if t.iops_samples > 0 {
            let _ = writeln!(
                out,
                "IOPS per second: min {:.0}, max {:.0}, avg {:.0} ({} samples)",
                t.iops_min, t.iops_max, t.iops_avg, t.iops_samples
            );
        }
        let _ = write!(
            out,
            "CPU (job threads): usr {:.1}%, sys {:.1}%; {:.0} ns",
            t.cpu_usr_pct, t.cpu_sys_pct, self.total.cpu_ns_per_io
        );
        if let Some(c) = self.total.cycles_per_io {
            let _ = write!(out, " ({c:.0} TSC cycles)");
        }
        let _ = writeln!(out, " of CPU per I/O");
        let _ = writeln!(
            out,
            "CPU (whole process, incl. device threads): {:.1}% of one core; {:.0} ns per I/O",
            self.total.process_cpu_pct, self.total.process_cpu_ns_per_io
        );
        let _ = write!(out, "Per I/O:");
        if let Some(p) = &self.total.per_io {
            let _ = write!(
                out,
                " {:.3} doorbell writes, {:.3} register reads, {:.4} engine clock calls;",
                p.doorbell_writes, p.register_reads, p.engine_clock_calls
            );
            if p.wire_syscalls > 0.0 {
                let _ = write!(
                    out,
                    " {:.4} wire system calls (sendmsg + recv);",
                    p.wire_syscalls
                );
            }
            if p.interrupt_sleeps > 0.0 {
                let _ = write!(
                    out,
                    " {:.3} interrupt sleeps ({:.3} ended by the interrupt);",
                    p.interrupt_sleeps, p.interrupt_wakeups
                );
            }
        }
        let c = &self.clock;
        let _ = writeln!(
            out,
            " latency clock {}{} ({:.2} reads per I/O, {:.1} ns per read)",
            c.source,
            if c.forced {
                ", forced by --clock tsc"
            } else {
                ""
            },
            c.reads_per_io,
            c.ns_per_call
        );
        let _ = writeln!(
            out,
            "Errors: {} failed I/O(s), {} verify mismatch(es)",
            t.errors, t.verify_mismatches
        );
        if let Some(v) = &self.verify {
            let _ = writeln!(
                out,
                "Verify: {} blocks checked ({} prefilled)",
                v.blocks_checked, v.prefill_blocks
            );
        }
        if let Some(d) = &self.dma {
            let _ = writeln!(
                out,
                "DMA ({}): {} maps, {} unmap calls ({} ranges), {} invalidations during the run; {} bytes mapped",
                d.mode, d.maps, d.unmap_calls, d.unmapped_ranges, d.invalidations, d.mapped_bytes
            );
        }
        for h in &self.hpb {
            let _ = writeln!(
                out,
                "HPB LU{} ({} control): {} HPB reads, {} normal reads, {} map loads, {} device fallbacks, \
                 {} evictions; host map {} bytes (peak {}) of a {}-byte budget",
                h.lun,
                h.control,
                h.hpb_reads,
                h.normal_reads,
                h.map_loads,
                h.stale_fallbacks,
                h.evictions,
                h.host_map_bytes,
                h.host_map_bytes_peak,
                h.memory_budget
            );
        }
        if percentiles {
            let _ = writeln!(out);
            let mut rows: Vec<(String, &LatUs)> = Vec::new();
            if self.jobs.len() > 1 {
                for j in &self.jobs {
                    rows.push((
                        match j.unit() {
                            Some(u) => format!("job {} ({} {u})", j.job, j.device),
                            None => format!("job {} ({})", j.job, j.device),
                        },
                        &j.stats.lat_us,
                    ));
                }
            }
            rows.push(("Total".into(), &t.lat_us));
            if let (Some(r), Some(w)) = (&t.read, &t.write) {
                rows.push(("Total reads".into(), &r.lat_us));
                rows.push(("Total writes".into(), &w.lat_us));
            }
            for (name, l) in rows {
                let _ = writeln!(out, "Summary latency data for {name}:");
                for (p, v) in l.percentiles() {
                    match v {
                        Some(v) => {
                            let _ = writeln!(out, "  {p:>9.5}% : {v:>12.3}us");
                        }
                        None => {
                            let _ = writeln!(out, "  {p:>9.5}% : {:>12}", "n/a");
                        }
                    }
                }
                if !l.buckets.is_empty() {
                    let _ = writeln!(out, "Latency histogram for {name}:");
                    let _ = writeln!(
                        out,
                        "  {:>25}   {:>10}  {:>12}",
                        "Range in us", "Cumulative", "IO count"
                    );
                    for b in &l.buckets {
                        let _ = writeln!(
                            out,
                            "  {:>11.3} - {:>11.3}:   {:>9.4}%  ({:>10})",
                            b.lo_us, b.hi_us, b.cumulative_pct, b.count
                        );
                    }
                }
            }
        }
        for w in &self.warnings {
            let _ = writeln!(out, "WARNING: {w}");
        }
        for n in &self.notes {
            let _ = writeln!(out, "note: {n}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::sample_run;
    use crate::report::DirStats;

    /// A mixed workload's rows split into read and write.
    #[test]
    fn mixed_rows_split_by_direction() {
        let mut r = sample_run("fake", 1000.0, 1.0);
        let d = DirStats {
            ios: 500,
            iops: 500.0,
            mib_s: Some(1.95),
            lat_us: LatUs::default(),
        };
        r.total.stats.read = Some(d.clone());
        r.total.stats.write = Some(DirStats { iops: 321.0, ..d });
        let t = r.table(false);
        assert!(t.contains("  read "), "{t}");
        assert!(t.contains("  write ") && t.contains("321.00"), "{t}");
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["total"]["write"]["iops"], 321.0);
        assert!(v["jobs"][0]["read"].is_null());
    }

    /// The text report says what the engine did per I/O at the
    /// device's registers and which latency clock was read how often, at
    /// what cost; the JSON carries the same fields.
    #[test]
    fn the_report_gives_register_accesses_and_clock_reads_per_io() {
        let r = sample_run("fake:null", 1e6, 2.0);
        let t = r.table(false);
        assert!(
            t.contains(
                "Per I/O: 0.062 doorbell writes, 0.000 register reads, 0.0010 engine clock calls; \
                 latency clock tsc (2.00 reads per I/O, 7.0 ns per read)"
            ),
            "{t}"
        );
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["total"]["per_io"]["doorbell_writes"], 0.0625);
        assert_eq!(v["total"]["per_io"]["register_reads"], 0.0);
        assert_eq!(v["total"]["per_io"]["engine_clock_calls"], 0.001);
        assert_eq!(v["clock"]["reads_per_io"], 2.0);
        assert_eq!(v["clock"]["ns_per_call"], 7.0);
        // A run without engine queues (io_uring) still names its clock.
        let mut u = r.clone();
        u.total.per_io = None;
        let t = u.table(false);
        assert!(
            t.contains("Per I/O: latency clock tsc (2.00 reads per I/O, 7.0 ns per read)"),
            "{t}"
        );
    }

    /// A device string longer than the name column (a tcp: device with its
    /// NQN) keeps every figure in its column: the header, the job row and
    /// the Total row put their `: ` at the same place, and the rules are as
    /// wide as the rows.
    #[test]
    fn long_device_names_keep_the_columns_aligned() {
        for dev in [
            "tcp:192.168.100.1:4420,nqn=nqn.2014-08.org.nvmexpress:uuid:8f1f5c7e-3a59-4d3c-9d1e-2b3b7d0c9a10",
            "vfio:0000:00:04.0,iommu=iommufd",
        ] {
            let mut r = sample_run(dev, 1234.5, 2.0);
            r.total.stats.read = None;
            let t = r.table(false);
            let lines: Vec<&str> = t
                .lines()
                .filter(|l| {
                    l.starts_with("Device Information")
                        || l.contains(" from core")
                        || l.starts_with("Total")
                })
                .filter(|l| l.contains(": "))
                .collect();
            assert_eq!(lines.len(), 3, "{t}");
            let at: Vec<usize> = lines.iter().map(|l| l.find(": ").unwrap()).collect();
            assert!(at.iter().all(|&a| a == at[0]), "columns moved: {at:?}\n{t}");
            let width = lines[0].chars().count();
            assert!(lines.iter().all(|l| l.chars().count() == width), "{t}");
            let rule = t.lines().find(|l| l.starts_with("===")).unwrap();
            assert_eq!(rule.len(), width, "{t}");
        }
    }

    #[test]
    fn table_has_rows() {
        let mut r = sample_run("uring:null", 1234.5, 2.0);
        r.total.stats.errors = 2;
        let t = r.table(true);
        assert!(t.contains("uring:null ns1 from core 0"));
        assert!(t.contains("Total"));
        assert!(t.contains("1234.50"));
        assert!(t.contains("99.99000%"));
        assert!(t.contains("2 failed I/O(s)"));
        assert!(r.failed());
    }
}
