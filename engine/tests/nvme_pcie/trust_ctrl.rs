//! Controller trust: what bring-up, drop and the admin queue do when the
//! device misbehaves or the caller asks for odd transfers (issue 12, items
//! 3, 6 and 9), against the fake and its hostile mode.

use mcqio_fixtures::testing::engine::nvme as common;

use std::sync::Arc;
use std::time::Duration;

use mcqio::nvme::spec::identify::IdentifyError;
use mcqio::nvme::spec::opcodes::admin as op;
use mcqio::nvme::spec::sqe::{Command, GetLogPage, Identify};
use mcqio::{Controller, ControllerOptions, Error, IoError, QpairOptions, TimeoutPolicy};
use mcqio_fixtures::nvme::hostile::STALE_CID;
use mcqio_fixtures::{
    CqeLie, CstsLie, DeviceLies, ExecMode, FakeConfig, FakeController, Fault, HostileBackend,
    NamespaceConfig, RegisterLies,
};
use mcqio_vfio::{Backend, DmaDir};

const EN: u32 = 1;

/// A small sync fake; CAP.TO = 500 ms so that waits on a lying CSTS end soon.
fn cfg() -> FakeConfig {
    FakeConfig {
        namespaces: vec![NamespaceConfig::ram(1 << 20, 512)],
        io_queue_pairs: 4,
        timeout_500ms_units: 1,
        exec: ExecMode::Sync,
        ..FakeConfig::default()
    }
}

fn hostile(cfg: FakeConfig, regs: RegisterLies, dev: DeviceLies) -> Arc<HostileBackend> {
    HostileBackend::new(cfg, regs, dev).expect("hostile backend")
}

fn open(b: &Arc<HostileBackend>, opts: ControllerOptions) -> Result<Arc<Controller>, Error> {
    Controller::new(Arc::clone(b) as Arc<dyn Backend>, opts)
}

fn quick() -> ControllerOptions {
    ControllerOptions {
        admin_timeout: Duration::from_millis(200),
        admin_timeout_policy: TimeoutPolicy::ReportOnly,
        shutdown_timeout: Duration::from_millis(200),
        ..ControllerOptions::default()
    }
}

/// Identify Controller with a required SQ entry size of 2^7: unusable.
fn bad_sqes() -> DeviceLies {
    DeviceLies {
        identify_controller: vec![(512, 0x77)],
        ..DeviceLies::default()
    }
}

// ---- item 3: drop and failed bring-up disable the controller ----

#[test]
fn drop_disables_the_controller_before_freeing_admin_memory() {
    let fake = FakeController::new(FakeConfig {
        shadow_doorbells: true,
        ..cfg()
    })
    .unwrap();
    let opts = ControllerOptions {
        shadow_doorbells: true,
        ..ControllerOptions::default()
    };
    let ctrl = Controller::new(fake.clone(), opts).unwrap();
    assert!(ctrl.shadow_doorbells());
    assert_eq!(ctrl.async_event_requests_posted(), 1);
    drop(ctrl);
    assert_eq!(fake.cc() & EN, 0, "CC.EN still set after drop");
    assert_eq!(fake.iommu().mapping_count(), 0);
}

#[test]
fn failed_bring_up_disables_the_controller() {
    let b = hostile(cfg(), RegisterLies::default(), bad_sqes());
    let e = open(&b, quick()).unwrap_err();
    assert!(
        matches!(e, Error::Identify(IdentifyError::EntrySizes { .. })),
        "{e:?}"
    );
    assert_eq!(b.fake().cc() & EN, 0, "CC.EN left set by a failed bring-up");
    assert_eq!(b.fake().iommu().mapping_count(), 0);
    assert!(b.violations().is_empty(), "{:?}", b.violations());
}

#[test]
fn failed_bring_up_leaks_admin_memory_of_a_controller_that_stays_ready() {
    let b = hostile(
        cfg(),
        RegisterLies {
            csts: CstsLie::ReadyStuck,
            ..RegisterLies::default()
        },
        bad_sqes(),
    );
    let e = open(&b, quick()).unwrap_err();
    assert!(matches!(e, Error::Identify(_)), "{e:?}");
    // Admin SQ, CQ and data page: the device may still write them.
    assert_eq!(b.fake().iommu().mapping_count(), 3);
}

#[test]
fn drop_leaks_admin_and_shadow_memory_of_a_controller_that_stays_ready() {
    let b = hostile(
        FakeConfig {
            shadow_doorbells: true,
            ..cfg()
        },
        RegisterLies::default(),
        DeviceLies::default(),
    );
    let opts = ControllerOptions {
        shadow_doorbells: true,
        ..quick()
    };
    let ctrl = open(&b, opts).unwrap();
    assert!(ctrl.shadow_doorbells());
    let mapped = b.fake().iommu().mapping_count();
    assert_eq!(
        mapped, 5,
        "admin SQ, CQ, data page, shadow and EventIdx pages"
    );
    b.set_csts_lie(CstsLie::ReadyStuck);
    drop(ctrl);
    assert_eq!(b.fake().iommu().mapping_count(), mapped);
}

#[test]
fn an_enable_in_progress_is_waited_for_before_disabling() {
    let b = hostile(
        FakeConfig {
            ready_delay: Duration::from_millis(100),
            // A generous bound: the wait ends when RDY comes, at ~100 ms.
            timeout_500ms_units: 10,
            ..cfg()
        },
        RegisterLies::default(),
        DeviceLies::default(),
    );
    // A previous driver enabled the controller just now: EN = 1, RDY = 0.
    let dma = b.dma();
    let sq = dma.alloc(4096, DmaDir::ToDevice).unwrap();
    let cq = dma.alloc(4096, DmaDir::Bidirectional).unwrap();
    let regs = b.regs();
    regs.write32(0x24, 0x001F_001F);
    regs.write64(0x28, sq.iova().raw());
    regs.write64(0x30, cq.iova().raw());
    regs.write32(0x14, FakeController::CC_ENABLE_4K);
    assert_eq!(regs.read32(0x1C) & 1, 0, "not ready yet");
    let ctrl = open(&b, quick()).unwrap();
    assert!(b.violations().is_empty(), "{:?}", b.violations());
    drop(ctrl);
    assert!(b.violations().is_empty(), "{:?}", b.violations());
}

// ---- item 6: admin_read describes every page it asks for ----

#[test]
fn admin_read_above_one_page_builds_prp2() {
    let (fake, ctrl) = common::open(FakeConfig::sync());
    let (_, log) = ctrl
        .admin_read(GetLogPage::new(0x01, 8192).sqe(), "Get Log Page")
        .expect("8 KiB error log");
    assert_eq!(log.len(), 8192);
    assert_eq!(fake.iommu().fault_count(), 0, "{:?}", fake.iommu().faults());
}

#[test]
fn admin_read_builds_a_prp_list_and_rejects_what_it_cannot_describe() {
    let (fake, ctrl) = common::open(FakeConfig::sync());
    let (_, log) = ctrl
        .admin_read(GetLogPage::new(0x01, 64 << 10).sqe(), "Get Log Page")
        .expect("64 KiB error log");
    assert_eq!(log.len(), 64 << 10);
    assert_eq!(fake.iommu().fault_count(), 0, "{:?}", fake.iommu().faults());
    let (_, id) = ctrl
        .admin_read(Identify::controller().sqe(), "Identify")
        .unwrap();
    assert_eq!(id.len(), 4096);

    let e = ctrl
        .admin_read(GetLogPage::new(0x01, 4 << 20).sqe(), "Get Log Page")
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::AdminRead {
                opcode: op::GET_LOG_PAGE,
                ..
            }
        ),
        "{e:?}"
    );
    let e = ctrl
        .admin_read(
            mcqio::nvme::spec::sqe::Sqe::with_opcode(op::GET_FEATURES),
            "Get Features",
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::AdminRead {
                opcode: op::GET_FEATURES,
                ..
            }
        ),
        "{e:?}"
    );
    // A data pointer of the caller's own is never used.
    let mut mine = ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
    mine.fill(0xA5);
    let sqe = Identify::controller().sqe().with_prp(mine.iova().raw(), 0);
    ctrl.admin_read(sqe, "Identify").unwrap();
    assert!(
        mine.to_vec().iter().all(|&b| b == 0xA5),
        "the caller's buffer was written"
    );
}

// ---- item 9: device values are bounds-checked ----

fn cap_of(cfg: &FakeConfig) -> u64 {
    let f = FakeController::new(cfg.clone()).unwrap();
    f.regs().read64(0)
}

#[test]
fn a_doorbell_stride_past_the_bar_is_a_typed_error() {
    let c = cfg();
    let cap = cap_of(&c) | 0xF << 32;
    let b = hostile(
        c,
        RegisterLies {
            cap: Some(cap),
            ..RegisterLies::default()
        },
        DeviceLies::default(),
    );
    let e = open(&b, quick()).unwrap_err();
    assert!(matches!(e, Error::BadDevice { .. }), "{e:?}");
    assert_eq!(b.fake().iommu().mapping_count(), 0);
}

#[test]
fn io_queues_whose_doorbells_are_past_the_bar_are_not_granted() {
    // Stride 1 KiB: in an 8 KiB BAR only the admin queue and queue 1 fit.
    let b = hostile(
        FakeConfig { dstrd: 8, ..cfg() },
        RegisterLies {
            bar_len: Some(0x2000),
            ..RegisterLies::default()
        },
        DeviceLies {
            // ... whatever the device grants.
            number_of_queues: Some(0xFFFE_FFFE),
            ..DeviceLies::default()
        },
    );
    let ctrl = open(&b, quick()).unwrap();
    assert_eq!(ctrl.granted_io_queues(), 1);
    let mut qp = ctrl.create_qpair(QpairOptions::default()).unwrap();
    let e = ctrl.create_qpair(QpairOptions::default()).unwrap_err();
    assert!(matches!(e, Error::NoFreeQueue { granted: 1 }), "{e:?}");
    let mut v = vec![0u8; 4096];
    qp.read_blocking(1, 0, &mut v).unwrap();
}

#[test]
fn a_grant_above_the_request_is_capped() {
    let b = hostile(
        cfg(),
        RegisterLies::default(),
        DeviceLies {
            number_of_queues: Some(0xFFFE_FFFE),
            ..DeviceLies::default()
        },
    );
    let ctrl = open(
        &b,
        ControllerOptions {
            io_queues: 2,
            ..quick()
        },
    )
    .unwrap();
    assert_eq!(ctrl.granted_io_queues(), 2);
}

#[test]
fn a_sparse_nsid_does_not_allocate_a_dense_table() {
    let b = hostile(
        cfg(),
        RegisterLies::default(),
        DeviceLies {
            active_namespaces: Some(vec![1, 0xFFFF_FFFE]),
            ..DeviceLies::default()
        },
    );
    let ctrl = open(&b, quick()).unwrap();
    let ids: Vec<u32> = ctrl.namespaces().iter().map(|n| n.id).collect();
    assert_eq!(ids, [1, 0xFFFF_FFFE]);
    assert!(ctrl.namespace(0xFFFF_FFFE).is_some());
    let mut qp = ctrl.create_qpair(QpairOptions::default()).unwrap();
    let mut v = vec![0u8; 4096];
    qp.read_blocking(1, 0, &mut v).unwrap();
    // The device does not really have it: a typed I/O error.
    let e = qp.read_blocking(0xFFFF_FFFE, 0, &mut v).unwrap_err();
    assert!(matches!(e, Error::Io(IoError::Nvme(_))), "{e:?}");
}

#[test]
fn an_unsorted_namespace_list_is_sorted_and_deduplicated() {
    let b = hostile(
        cfg(),
        RegisterLies::default(),
        DeviceLies {
            active_namespaces: Some(vec![3, 1, 1, 2, 0xFFFF_FFFF]),
            ..DeviceLies::default()
        },
    );
    let ctrl = open(&b, quick()).unwrap();
    let ids: Vec<u32> = ctrl.namespaces().iter().map(|n| n.id).collect();
    assert_eq!(ids, [1, 2, 3]);
    assert_eq!(ctrl.namespace(2).map(|n| n.id), Some(2));
}

#[test]
fn a_namespace_size_that_overflows_is_a_typed_error() {
    let b = hostile(
        cfg(),
        RegisterLies::default(),
        DeviceLies {
            identify_namespace: (0..8).map(|i| (i, 0xF0)).collect(),
            ..DeviceLies::default()
        },
    );
    let e = open(&b, quick()).unwrap_err();
    assert!(matches!(e, Error::BadDevice { .. }), "{e:?}");
    assert_eq!(b.fake().cc() & EN, 0);
}

#[test]
fn a_stale_completion_flood_does_not_extend_an_admin_timeout() {
    let b = hostile(cfg(), RegisterLies::default(), DeviceLies::default());
    let ctrl = open(&b, quick()).unwrap();
    b.fake()
        .faults()
        .inject_next(Some(0), Some(op::IDENTIFY), Fault::DropCompletion);
    // Far more stale completions than 200 ms can consume.
    let flood = 20_000_000;
    b.flood_stale_admin_cqes(flood);
    let e = ctrl
        .admin_read(Identify::controller().sqe(), "Identify")
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    let left = b.stale_flood_remaining();
    b.flood_stale_admin_cqes(0);
    assert!(left > 0, "the whole flood was waited out");
    assert!(left < flood, "the flood never reached the host");
    let _ = STALE_CID;
}

#[test]
fn a_completion_in_the_aer_range_does_not_post_another_request() {
    let b = hostile(
        cfg(),
        RegisterLies::default(),
        DeviceLies {
            // Identify Controller, active list, Identify Namespace, Set
            // Features: then the next completion carries an AER-range CID
            // that is not outstanding.
            admin_cqes: vec![CqeLie {
                nth: 4,
                cid: Some(0xFF07),
                ..CqeLie::default()
            }],
            ..DeviceLies::default()
        },
    );
    let ctrl = open(
        &b,
        ControllerOptions {
            admin_timeout: Duration::from_millis(50),
            ..quick()
        },
    )
    .unwrap();
    let e = ctrl
        .admin_read(Identify::controller().sqe(), "Identify")
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert_eq!(ctrl.async_event_requests_posted(), 1);
    assert_eq!(
        b.fake().stats().admin(op::ASYNC_EVENT_REQUEST),
        1,
        "an extra Asynchronous Event Request was posted"
    );
}

// ---- item 10: a completion whose CID collides ----

#[test]
fn a_cid_of_another_generation_of_the_same_slot_is_stale() {
    let (fake, ctrl) = common::open(FakeConfig::sync());
    let mut qp = ctrl.create_qpair(QpairOptions::default()).unwrap();
    // Depth 256: the low 8 bits are the slot, bit 15 is generation.
    fake.faults()
        .inject_next(Some(qp.qid()), None, Fault::CidXor(0x8000));
    let buf = ctrl.alloc_buf(4096, DmaDir::FromDevice).unwrap();
    qp.read(1, 0, 8, buf, 7).map_err(|e| e.kind).unwrap();
    qp.submit();
    let mut done = Vec::new();
    for _ in 0..100 {
        qp.poll(16, |c| {
            done.push((c.tag, c.result.is_ok(), c.buf.is_some()))
        })
        .unwrap();
    }
    assert!(
        done.is_empty(),
        "delivered on a foreign generation: {done:?}"
    );
    assert_eq!(qp.stats().stale_completions, 1);
    // Still outstanding as far as the host knows: a reset ends it.
    ctrl.reset().unwrap();
    qp.poll(16, |c| {
        done.push((c.tag, c.result.is_ok(), c.buf.is_some()))
    })
    .unwrap();
    assert_eq!(done, [(7, false, true)]);
}

#[test]
fn a_block_larger_than_one_command_is_a_typed_error() {
    // The caller's own cap below a block is the caller's mistake.
    let b = hostile(
        cfg(),
        RegisterLies::default(),
        DeviceLies {
            identify_namespace: vec![(130, 13)],
            ..DeviceLies::default()
        },
    );
    let e = open(
        &b,
        ControllerOptions {
            max_transfer: 4096,
            ..quick()
        },
    )
    .unwrap_err();
    assert!(matches!(e, Error::InvalidOption(_)), "{e:?}");
}

/// Issue 27 item 8: a namespace whose blocks are larger than MDTS does not
/// take the controller (and its other namespaces) down: bring-up succeeds,
/// the namespace is marked unusable, and I/O to it is a typed error.
#[test]
fn a_namespace_with_blocks_above_mdts_is_unusable_not_fatal() {
    let fake = FakeController::new(FakeConfig {
        // NSID 1: 512 B blocks; NSID 2: 64 KiB blocks; MDTS = 8 KiB.
        namespaces: vec![
            NamespaceConfig::ram(1 << 20, 512),
            NamespaceConfig::ram(1 << 20, 65536),
        ],
        mdts: 1,
        ..cfg()
    })
    .unwrap();
    let ctrl = Controller::new(fake.clone(), quick()).expect("bring-up");
    assert_eq!(ctrl.max_transfer(), 8192);
    let ns1 = ctrl.namespace(1).expect("namespace 1").clone();
    let ns2 = ctrl.namespace(2).expect("namespace 2 is listed").clone();
    assert!(ns1.usable, "{ns1:?}");
    assert!(!ns2.usable, "{ns2:?}");
    assert_eq!(ns2.lba_size, 65536);

    let mut qp = ctrl.create_qpair(QpairOptions::default()).unwrap();
    // I/O to the odd namespace: a typed error, the buffer back at once.
    let buf = ctrl.alloc_buf(65536, DmaDir::Bidirectional).unwrap();
    let e = qp.read(2, 0, 1, buf, 1).unwrap_err();
    assert!(
        matches!(
            e.kind,
            mcqio::SubmitErrorKind::TransferTooLarge {
                bytes: 65536,
                max: 8192
            }
        ),
        "{:?}",
        e.kind
    );
    let e = qp.write(2, 0, 1, e.buf, 2).unwrap_err();
    assert!(
        matches!(
            e.kind,
            mcqio::SubmitErrorKind::TransferTooLarge {
                bytes: 65536,
                max: 8192
            }
        ),
        "{:?}",
        e.kind
    );
    let mut block = vec![0u8; 65536];
    assert!(
        matches!(
            qp.read_blocking(2, 0, &mut block),
            Err(Error::Submit(mcqio::SubmitErrorKind::TransferTooLarge {
                bytes: 65536,
                max: 8192
            }))
        ),
        "blocking read of the odd namespace"
    );
    // The other namespace works, before and after a reset (which finds
    // the same odd namespace again: not a different device).
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
    qp.write_blocking(1, 8, &data).unwrap();
    ctrl.reset().unwrap();
    assert!(!ctrl.namespace(2).unwrap().usable);
    let mut back = vec![0u8; 8192];
    qp.read_blocking(1, 8, &mut back).unwrap();
    assert_eq!(back, data);
    // Commands that move no data still reach it.
    qp.flush_blocking(2).unwrap();
    qp.close(|_| {}).unwrap();
}

#[test]
fn admin_read_keeps_its_buffer_while_a_timed_out_command_may_write_it() {
    let b = hostile(cfg(), RegisterLies::default(), DeviceLies::default());
    let ctrl = open(
        &b,
        ControllerOptions {
            admin_timeout: Duration::from_millis(20),
            ..quick()
        },
    )
    .unwrap();
    let iommu = b.fake().iommu();
    let before = iommu.mapping_count();
    // Completed with an error status: the device is done with the buffer.
    b.fake().faults().inject_next(
        Some(0),
        Some(op::GET_LOG_PAGE),
        Fault::Status {
            sct: 0,
            sc: 0x02,
            dnr: true,
        },
    );
    let e = ctrl
        .admin_read(GetLogPage::new(0x01, 8192).sqe(), "Get Log Page")
        .unwrap_err();
    assert!(matches!(e, Error::Command { .. }), "{e:?}");
    assert_eq!(iommu.mapping_count(), before);
    // Timed out under ReportOnly: the device may still write it.
    b.fake()
        .faults()
        .inject_next(Some(0), Some(op::GET_LOG_PAGE), Fault::DropCompletion);
    let e = ctrl
        .admin_read(GetLogPage::new(0x01, 64 << 10).sqe(), "Get Log Page")
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert_eq!(
        iommu.mapping_count(),
        before + 2,
        "buffer and PRP list kept"
    );
}

#[test]
fn zero_queue_entries_is_a_typed_error() {
    let c = cfg();
    let cap = cap_of(&c) & !0xFFFF;
    let b = hostile(
        c,
        RegisterLies {
            cap: Some(cap),
            ..RegisterLies::default()
        },
        DeviceLies::default(),
    );
    let e = open(&b, quick()).unwrap_err();
    assert!(matches!(e, Error::BadDevice { .. }), "{e:?}");
}
