//! The NVMe/TCP guest checks of `mcqio-vm-tests` (`tcp-*`, which the
//! `GUEST_DEV=tcp` plan runs against Linux's nvmet-tcp) on the fixtures'
//! fake target, started inside the test: every size class, digests on and
//! off, the reconnect with reads in flight, and the pattern cross-check
//! (which must also reject the wrong seed).

mod support;

use mcqio_fixtures::tcp::{
    FakeTcpTarget, TcpBacking, TcpNamespace, TcpTargetConfig, TcpTargetStats,
};

fn vm_tests(args: &[&str]) -> (i32, String) {
    let out = support::command(env!("CARGO_BIN_EXE_mcqio-vm-tests"))
        .args(args)
        .output()
        .expect("mcqio-vm-tests runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

fn ok(args: &[&str]) -> String {
    let (code, text) = vm_tests(args);
    assert_eq!(code, 0, "mcqio-vm-tests {args:?} failed:\n{text}");
    text
}

/// 32 MiB of RAM, 4 KiB blocks, MDTS 128 KiB; one H2CData carries up to
/// 32 KiB, so the classes are 8 KiB in the capsule, 32 KiB by one R2T and
/// 68 KiB by several H2CData; reads come back 4 KiB per C2HData.
fn target() -> FakeTcpTarget {
    FakeTcpTarget::start(TcpTargetConfig {
        namespaces: vec![TcpNamespace {
            blocks: 8192,
            lba_shift: 12,
            backing: TcpBacking::Ram,
        }],
        maxh2cdata: 32 << 10,
        r2t_max: 1 << 20,
        ..Default::default()
    })
    .expect("fake target")
}

#[test]
fn tcp_rw_moves_every_size_class_with_and_without_digests() {
    let t = target();
    for opts in ["", ",hdgst,ddgst"] {
        let dev = format!("tcp:{}/{}{opts}", t.addr(), t.subnqn());
        let out = ok(&["tcp-rw", "-d", &dev, "--bytes", "4M", "--threads", "2"]);
        assert!(
            out.contains("read back identical on 2 queue pairs"),
            "{out}"
        );
        for class in ["in-capsule", "one-r2t", "many-h2cdata"] {
            assert!(out.contains(class), "{out}");
        }
    }
    let s = t.stats();
    assert!(TcpTargetStats::get(&s.r2ts) > 0);
    assert!(TcpTargetStats::get(&s.c2h_data) > 0);
}

#[test]
fn tcp_reset_ends_each_read_once_and_carries_on() {
    let t = target();
    let dev = format!("tcp:{}/{}", t.addr(), t.subnqn());
    let out = ok(&["tcp-reset", "-d", &dev]);
    assert!(out.contains("each once"), "{out}");
    assert!(out.contains("both queue pairs read and wrote"), "{out}");
    assert_eq!(TcpTargetStats::get(&t.stats().io_connects), 4, "{out}");
}

#[test]
fn tcp_pattern_round_trip_and_the_wrong_seed_is_rejected() {
    let t = target();
    let dev = format!("tcp:{}/{},ddgst", t.addr(), t.subnqn());
    let region = ["--offset", "1048576", "--len", "3145728"];
    let w = [
        &["tcp-write-pattern", "-d", &dev, "--seed", "42"][..],
        &region,
    ]
    .concat();
    ok(&w);
    let r = [
        &["tcp-check-pattern", "-d", &dev, "--seed", "42"][..],
        &region,
    ]
    .concat();
    assert!(ok(&r).contains("identical to pattern seed 42"));
    let bad = [
        &["tcp-check-pattern", "-d", &dev, "--seed", "43"][..],
        &region,
    ]
    .concat();
    let (code, text) = vm_tests(&bad);
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("holds"), "{text}");
}
