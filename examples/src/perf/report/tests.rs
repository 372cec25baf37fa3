//! A sample report, and the tests of the document as a whole.

use hdrhistogram::Histogram;

use super::*;

pub(super) fn sample_run(device: &str, iops: f64, avg: f64) -> RunReport {
    let stats = Stats {
        ios: 1000,
        reads: 1000,
        iops,
        iops_min: iops,
        iops_max: iops,
        iops_avg: iops,
        iops_samples: 1,
        mib_s: Some(iops * 4096.0 / 1048576.0),
        lat_us: LatUs {
            avg,
            min: 0.5,
            max: 9.0,
            p50: Some(1.0),
            p90: Some(2.0),
            p99: Some(4.0),
            p99_9: Some(8.0),
            p99_99: Some(9.0),
            ..Default::default()
        },
        elapsed_s: 1.0,
        ..Default::default()
    };
    RunReport {
        device: device.into(),
        backend: "test".into(),
        workload: WorkloadReport {
            pattern: "randread".into(),
            read_pct: 100,
            io_size: 4096,
            queue_depth: 32,
            jobs: 1,
            time_s: Some(1.0),
            ios_per_job: None,
            warmup_s: 0.0,
            verify: false,
            dma: "premapped".into(),
            seed: 1,
            distribution: "uniform".into(),
            offset: 0,
            size: None,
            rate_iops: None,
            wait: "poll".into(),
            poll_pause: "always".into(),
            bytes: None,
        },
        jobs: vec![JobReport {
            job: 0,
            device: device.into(),
            core: Some(0),
            nsid: Some(1),
            lun: None,
            stats: stats.clone(),
        }],
        total: TotalReport {
            stats,
            cpu_ns_per_io: 100.0,
            cycles_per_io: Some(300.0),
            process_cpu_pct: 200.0,
            process_cpu_ns_per_io: 200.0,
            per_io: Some(PerIoReport {
                doorbell_writes: 0.0625,
                register_reads: 0.0,
                engine_clock_calls: 0.001,
                wire_syscalls: 0.0,
                interrupt_sleeps: 0.0,
                interrupt_wakeups: 0.0,
            }),
        },
        dma: None,
        hpb: Vec::new(),
        verify: None,
        failures: vec![],
        notes: vec![],
        clock: ClockReport {
            source: "tsc".into(),
            ns_per_call: 7.0,
            ticks_per_sec: 3e9,
            reads_per_io: 2.0,
            ..ClockReport::default()
        },
        repeat_iops: vec![],
        interrupted: false,
        warnings: vec![],
        compare: None,
        time_series: vec![],
    }
}

/// A chosen percentile list, and power-of-two buckets
/// whose counts add up and whose cumulative share ends at 100 %.
#[test]
fn chosen_percentiles_and_buckets() {
    let mut h = Histogram::<u64>::new_with_bounds(1, 1_000_000_000, 3).unwrap();
    for v in 1..=10_000u64 {
        h.record(v).unwrap();
    }
    let o = LatOpts {
        percentiles: vec![25.0, 99.5],
        buckets: true,
    };
    let l = LatUs::with(1, 1, 10_000, 10_000, Some(&h), &o);
    let ps: Vec<f64> = l.percentiles.iter().map(|p| p.p).collect();
    assert_eq!(ps, vec![25.0, 99.5]);
    assert!(
        (l.percentiles[0].us - 2.5).abs() < 0.01,
        "{:?}",
        l.percentiles
    );
    assert!(
        (l.percentiles[1].us - 9.95).abs() < 0.02,
        "{:?}",
        l.percentiles
    );
    // Buckets (0,1] (1,2] (2,4] (4,8] (8,16] µs.
    let b = &l.buckets;
    assert_eq!(b.len(), 5, "{b:?}");
    assert_eq!(b.iter().map(|b| b.count).sum::<u64>(), 10_000);
    assert_eq!((b[0].hi_us, b[1].hi_us, b[4].hi_us), (1.0, 2.0, 16.0));
    assert!((b[0].cumulative_pct - 10.0).abs() < 0.1, "{b:?}");
    assert_eq!(b[4].cumulative_pct, 100.0);
    let t = {
        let mut r = sample_run("fake", 1.0, 1.0);
        r.total.stats.lat_us = l.clone();
        r.table(true)
    };
    assert!(t.contains("99.50000%"), "{t}");
    assert!(t.contains("Range in us"), "{t}");
    assert!(!LatUs::with(1, 1, 1, 1, Some(&h), &LatOpts::default())
        .percentiles
        .is_empty());
}

#[test]
fn json_roundtrip_has_required_fields() {
    let r = sample_run("fake:null", 1e6, 2.0);
    let s = serde_json::to_string(&r).unwrap();
    let v: serde_json::Value = serde_json::from_str(&s).unwrap();
    for k in ["device", "workload", "jobs", "total"] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    for k in [
        "ios",
        "iops",
        "iops_min",
        "iops_max",
        "iops_avg",
        "mib_s",
        "errors",
        "cpu_usr_pct",
        "cpu_sys_pct",
    ] {
        assert!(
            v["total"].get(k).is_some_and(|x| x.is_number()),
            "total.{k}"
        );
        assert!(
            v["jobs"][0].get(k).is_some_and(|x| x.is_number()),
            "jobs[0].{k}"
        );
    }
    for k in ["avg", "min", "max", "p50", "p90", "p99", "p99_9", "p99_99"] {
        assert!(
            v["total"]["lat_us"].get(k).is_some_and(|x| x.is_number()),
            "lat_us.{k}"
        );
    }
    let back: RunReport = serde_json::from_str(&s).unwrap();
    assert_eq!(back, r);
}
