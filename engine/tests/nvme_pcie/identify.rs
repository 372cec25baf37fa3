//! Bring-up and identify against the fake controller.

use mcqio_fixtures::testing::engine::nvme as common;

use common::*;
use mcqio::ControllerOptions;
use mcqio_fixtures::{FakeConfig, NamespaceConfig};

#[test]
fn identify_controller_and_namespaces() {
    for mode in modes() {
        let (_fake, ctrl) = open(FakeConfig {
            model: "mcqio test model".into(),
            serial: "SN-1234".into(),
            firmware: "9.9".into(),
            ..config(mode, 5)
        });
        let id = ctrl.identify();
        assert_eq!(id.model, "mcqio test model");
        assert_eq!(id.serial, "SN-1234");
        assert_eq!(id.firmware, "9.9");
        assert_eq!(id.mdts, 5);
        assert_eq!(ctrl.max_transfer(), 128 << 10, "MDTS 5 with 4 KiB pages");
        let ns = ctrl.namespaces();
        assert_eq!(ns.len(), 2);
        assert_eq!(
            (ns[0].id, ns[0].lba_size, ns[0].nsze),
            (1, 512, (64 << 20) / 512)
        );
        assert_eq!(
            (ns[1].id, ns[1].lba_size, ns[1].nsze),
            (2, 4096, (16 << 20) / 4096)
        );
        assert_eq!(ns[1].lba_shift, 12);
        assert_eq!(ns[0].size_bytes(), 64 << 20);
        assert_eq!(ctrl.granted_io_queues(), 8);
        assert!(ctrl.namespace(3).is_none());
        assert!(ctrl.version().major() >= 1);
    }
}

#[test]
fn many_namespaces() {
    let namespaces: Vec<_> = (0..6)
        .map(|i| NamespaceConfig::ram(1 << 20, if i % 2 == 0 { 512 } else { 4096 }))
        .collect();
    let (_fake, ctrl) = open(FakeConfig {
        namespaces,
        ..FakeConfig::sync()
    });
    let ids: Vec<u32> = ctrl.namespaces().iter().map(|n| n.id).collect();
    assert_eq!(ids, vec![1, 2, 3, 4, 5, 6]);
    for n in ctrl.namespaces() {
        let want = if n.id % 2 == 1 { 512 } else { 4096 };
        assert_eq!(n.lba_size, want);
    }
    // I/O to each namespace lands in that namespace only.
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    for n in ctrl.namespaces() {
        let data = vec![n.id as u8; n.lba_size as usize];
        qp.write_blocking(n.id, 1, &data).unwrap();
    }
    for n in ctrl.namespaces() {
        let mut back = vec![0u8; n.lba_size as usize];
        qp.read_blocking(n.id, 1, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == n.id as u8), "namespace {}", n.id);
    }
}

#[test]
fn queue_grant_is_bounded_by_request_and_controller() {
    let (_fake, ctrl) = open_with(
        FakeConfig {
            io_queue_pairs: 4,
            ..FakeConfig::sync()
        },
        ControllerOptions {
            io_queues: 16,
            ..Default::default()
        },
    );
    assert_eq!(ctrl.granted_io_queues(), 4);
    let (_fake, ctrl) = open_with(
        FakeConfig::sync(),
        ControllerOptions {
            io_queues: 2,
            ..Default::default()
        },
    );
    assert_eq!(ctrl.granted_io_queues(), 2);
}

#[test]
fn shutdown_and_queue_deletion_on_drop() {
    let (fake, ctrl) = open(FakeConfig::sync());
    let qp = ctrl.create_qpair(Default::default()).unwrap();
    assert_eq!(ctrl.free_io_queues(), 7);
    drop(qp);
    assert_eq!(ctrl.free_io_queues(), 8, "queue id returned after deletion");
    let stats = fake.stats();
    assert_eq!(
        stats.admin(mcqio::nvme::spec::opcodes::admin::DELETE_IO_SQ),
        1
    );
    assert_eq!(
        stats.admin(mcqio::nvme::spec::opcodes::admin::DELETE_IO_CQ),
        1
    );
    drop(ctrl);
    let cc = mcqio::nvme::spec::regs::Cc(fake.cc());
    assert_eq!(
        cc.0 >> 14 & 0b11,
        mcqio::nvme::spec::regs::Cc::SHN_NORMAL,
        "CC.SHN = normal at drop"
    );
}

#[test]
fn shadow_doorbells_when_advertised() {
    for mode in modes() {
        let (_fake, ctrl) = open(FakeConfig {
            shadow_doorbells: true,
            ..config(mode, 5)
        });
        assert!(ctrl.shadow_doorbells());
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        let mut r = rng(7);
        let data = random_bytes(&mut r, 64 << 10);
        qp.write_blocking(1, 100, &data).unwrap();
        let mut back = vec![0; data.len()];
        qp.read_blocking(1, 100, &mut back).unwrap();
        assert_eq!(back, data);
        let s = qp.stats();
        assert!(s.sq_doorbell_writes + s.sq_doorbell_skipped >= 2);

        let (_fake, ctrl) = open_with(
            FakeConfig {
                shadow_doorbells: true,
                ..FakeConfig::sync()
            },
            ControllerOptions {
                shadow_doorbells: false,
                ..Default::default()
            },
        );
        assert!(!ctrl.shadow_doorbells(), "option disables them");
    }
}

/// Issue 28: the default options leave a controller's shadow doorbells
/// unused (every doorbell is an MMIO store): with doorbells batched, they
/// save few stores while the controller reads and writes shadow memory for
/// every command and completion.
#[test]
fn shadow_doorbells_are_off_by_default() {
    let (_fake, ctrl) = open_with(
        FakeConfig {
            shadow_doorbells: true,
            ..FakeConfig::sync()
        },
        ControllerOptions::default(),
    );
    assert!(!ctrl.shadow_doorbells());
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    qp.write_blocking(1, 100, &[7; 4096]).unwrap();
    let s = qp.stats();
    assert!(s.sq_doorbell_writes >= 1);
    assert_eq!((s.sq_doorbell_skipped, s.cq_doorbell_skipped), (0, 0));
}

#[test]
fn asynchronous_events_reach_the_application() {
    for mode in modes() {
        let (fake, ctrl) = open(config(mode, 5));
        assert_eq!(ctrl.async_event_requests_posted(), 1);
        assert!(ctrl.async_events().is_empty());
        fake.raise_async_event(mcqio::nvme::event_type::NOTICE, 0x00, 0x04);
        // Events arrive whenever the admin queue is looked at: here while a
        // queue pair is created (an admin command is waited on) ...
        let qp = ctrl.create_qpair(Default::default()).unwrap();
        fake.raise_async_event(mcqio::nvme::event_type::SMART_HEALTH, 0x01, 0x02);
        // ... or by asking.
        let mut evs = Vec::new();
        for _ in 0..100_000 {
            evs.extend(ctrl.async_events());
            if evs.len() == 2 {
                break;
            }
            std::thread::yield_now();
        }
        assert_eq!(
            evs,
            vec![
                mcqio::AsyncEvent {
                    event_type: 2,
                    info: 0,
                    log_page: 4
                },
                mcqio::AsyncEvent {
                    event_type: 1,
                    info: 1,
                    log_page: 2
                },
            ]
        );
        assert_eq!(
            ctrl.async_event_requests_posted(),
            1,
            "re-armed after each event"
        );
        drop(qp);
        assert!(
            ctrl.async_events().is_empty(),
            "each event is returned once"
        );
    }
}
