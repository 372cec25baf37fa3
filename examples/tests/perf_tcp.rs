//! `mcqio-perf -d tcp:…` against the fake NVMe/TCP target of
//! `mcqio-fixtures`, started inside the test on an ephemeral loopback port:
//! the tool drives the engine's NVMe/TCP queue pairs through the same job
//! loop as every other device, verify included.

mod support;

use mcqio_fixtures::tcp::{
    FakeTcpTarget, TcpBacking, TcpNamespace, TcpTargetConfig, TcpTargetStats,
};
use serde_json::Value;

fn perf(args: &[&str]) -> (i32, String, String) {
    let out = support::command(env!("CARGO_BIN_EXE_mcqio-perf"))
        .args(args)
        .output()
        .expect("mcqio-perf runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn target() -> FakeTcpTarget {
    FakeTcpTarget::start(TcpTargetConfig {
        namespaces: vec![TcpNamespace {
            blocks: 8192,
            lba_shift: 9,
            backing: TcpBacking::Ram,
        }],
        // With data digests commands are capped at MAXH2CDATA: room for
        // 16 KiB writes, above the 8 KiB in the capsule, so they go by R2T.
        maxh2cdata: 32 << 10,
        ..Default::default()
    })
    .expect("fake target")
}

#[test]
fn perf_runs_and_verifies_over_nvme_tcp() {
    let t = target();
    let dev = format!("tcp:{}/{},hdgst,ddgst", t.addr(), t.subnqn());
    let (code, out, err) = perf(&[
        "-d", &dev, "-w", "randrw", "-o", "16k", "-q", "8", "-j", "2", "-n", "2000", "--verify",
        "--json", "--force",
    ]);
    assert_eq!(code, 0, "stderr: {err}");
    let v: Value = serde_json::from_str(&out).expect("stdout is one JSON document");
    assert_eq!(v["total"]["ios"].as_u64(), Some(4000), "{v}");
    assert_eq!(v["total"]["errors"].as_u64(), Some(0), "{v}");
    let s = t.stats();
    assert_eq!(
        TcpTargetStats::get(&s.io_connects),
        2,
        "one connection per job"
    );
    assert!(TcpTargetStats::get(&s.r2ts) > 0, "16 KiB writes go by R2T");
    assert!(TcpTargetStats::get(&s.c2h_data) > 0);
    // The engine's own count of its sendmsg and recv calls is reported.
    let calls = v["total"]["per_io"]["wire_syscalls"]
        .as_f64()
        .expect("per_io.wire_syscalls");
    assert!(
        calls > 0.0 && calls < 4.0,
        "{calls} wire system calls per I/O"
    );
}

/// `mcqio-perf devices tcp:<address>:<port>` lists what the port's
/// discovery controller offers: the fake's subsystem with its transport,
/// address and port, and the extra subsystems of its log.
#[test]
fn devices_lists_the_subsystems_of_a_tcp_port() {
    let t = FakeTcpTarget::start(TcpTargetConfig {
        discovery_extra: 2,
        ..Default::default()
    })
    .expect("fake target");
    let (code, out, err) = perf(&["devices", &format!("tcp:{}", t.addr())]);
    assert_eq!(code, 0, "stderr: {err}");
    assert!(out.contains("3 entries"), "{out}");
    let row = out
        .lines()
        .find(|l| l.ends_with(t.subnqn()))
        .unwrap_or_else(|| panic!("no row for {}:\n{out}", t.subnqn()));
    let f: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        f,
        [
            "nvme",
            "tcp",
            &t.addr().ip().to_string(),
            &t.addr().port().to_string(),
            t.subnqn()
        ]
    );
    assert!(out.contains(&format!("{}.extra2", t.subnqn())), "{out}");

    // A subsystem or a missing port is refused, typed.
    for bad in [format!("tcp:{}/nqn.x", t.addr()), "tcp:127.0.0.1".into()] {
        let (code, _, err) = perf(&["devices", &bad]);
        assert_ne!(code, 0, "{bad}");
        assert!(err.contains("<address>:<port>"), "{bad}: {err}");
    }
}

#[test]
fn an_unreachable_target_is_an_error_not_a_hang() {
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (code, _, err) = perf(&["-d", &format!("tcp:{addr}/nqn.x"), "-t", "1"]);
    assert_ne!(code, 0);
    assert!(err.contains("tcp:"), "{err}");
}

/// On NVMe/TCP: `--wait irq` and `--wait hybrid` sleep on the
/// connection's socket (the report counts the sleeps, most of them ended
/// by the socket), `--wait poll` never sleeps; the data verifies.
#[test]
fn wait_irq_and_hybrid_sleep_on_the_socket() {
    let t = FakeTcpTarget::start(TcpTargetConfig {
        namespaces: vec![TcpNamespace {
            blocks: 8192,
            lba_shift: 9,
            backing: TcpBacking::Ram,
        }],
        latency: std::time::Duration::from_micros(200),
        ..Default::default()
    })
    .expect("fake target");
    let dev = format!("tcp:{}/{}", t.addr(), t.subnqn());
    let run = |wait: &str| -> (f64, f64) {
        let (code, out, err) = perf(&[
            "-d", &dev, "-w", "randrw", "-q", "4", "-n", "1000", "--verify", "--wait", wait,
            "--json", "--force",
        ]);
        assert_eq!(code, 0, "{wait}: {err}\n{out}");
        let v: Value = serde_json::from_str(&out).expect("one JSON document");
        assert_eq!(v["total"]["ios"].as_u64(), Some(1000), "{v}");
        assert_eq!(v["total"]["errors"].as_u64(), Some(0), "{v}");
        assert_eq!(v["workload"]["wait"], wait, "{v}");
        let per_io = &v["total"]["per_io"];
        let f = |k: &str| per_io[k].as_f64().unwrap_or_else(|| panic!("no {k}: {v}"));
        (f("interrupt_sleeps"), f("interrupt_wakeups"))
    };
    for wait in ["irq", "hybrid:0us"] {
        let (sleeps, woken) = run(wait);
        assert!(sleeps > 0.1, "{wait}: {sleeps} sleeps per I/O");
        assert!(woken > 0.0, "{wait}: the socket never ended a sleep");
    }
    assert_eq!(run("poll").0, 0.0, "poll never sleeps");
}
