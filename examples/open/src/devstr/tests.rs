//! The device-string language end to end: kinds, options, the fakes they
//! describe, and the two spellings.

use mcqio_fixtures::ufs::LuConfig;
use mcqio_fixtures::{FakeConfig, NamespaceConfig};

use super::*;

fn spec(s: &str) -> DeviceSpec {
    s.parse().unwrap()
}

/// `vfio:` tells a UFS host controller from an
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

/// `fake-ufs` and its options.
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

/// Issue 42: `iommu=` picks the IOMMU interface of a `vfio:` device, and
/// reaches the VFIO open options.
#[test]
fn vfio_takes_the_iommu_interface() {
    use mcqio_vfio::IommuChoice;
    for (s, want) in [
        ("vfio:0000:01:00.0,iommu=iommufd", IommuChoice::Iommufd),
        ("vfio:0000:01:00.0,iommu=type1", IommuChoice::Type1),
        ("vfio-0000.01.00.0,iommu=auto", IommuChoice::Auto),
    ] {
        let d = spec(s);
        assert_eq!(d.opts.iommu, Some(want), "{s}");
        assert_eq!(d.vfio_options().iommu, want, "{s}");
    }
    assert_eq!(spec("vfio:0000:01:00.0").opts.iommu, None);
    let e = "vfio:0000:01:00.0,iommu=vfio"
        .parse::<DeviceSpec>()
        .unwrap_err()
        .to_string();
    assert!(e.contains("auto, type1 or iommufd"), "{e}");
    assert!("fake,iommu=type1".parse::<DeviceSpec>().is_err());
}

/// `latency=10` meant 10 s here and 10 µs in the fio
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

/// `fake` means the library's default device.
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
