//! UFS bring-up against the fake controller: MCQ and legacy single
//! doorbell, queue counts, logical units, queue-pair ownership.

use mcqio_fixtures::testing::engine::ufs as ufs_common;
use ufs_common::*;

use std::time::{Duration, Instant};

use mcqio::ufs::{UfsCtrlError, UfsError, UfsMode, UfsOptions};
use mcqio::Error;
use mcqio_fixtures::ufs::{
    HostileUfs, LuConfig, Sense, UfsConfig, UfsDeviceLies, UfsFault, UfsFaultKind, UfsRegisterLies,
    UpiuKind, UpiuLie, LEGACY_QUEUE,
};

#[test]
fn mcq_bring_up_sets_up_queues_and_reads_the_device() {
    let (fake, ctrl) = up(sync_cfg(true), opts(4));
    assert_eq!(ctrl.mode(), UfsMode::Mcq { queues: 4 });
    // min(depth 32, MAC 64, bQueueDepth 32)
    assert_eq!(ctrl.depth(), 32);
    let lus = ctrl.logical_units();
    assert_eq!(lus.len(), 1);
    assert_eq!(
        (lus[0].lun, lus[0].blocks, lus[0].block_len),
        (0, 4096, 4096)
    );
    assert_eq!(ctrl.device_descriptor().lus, 1);
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    assert!(qp.hw_queue().is_some());
    let data = pattern(1, 8192);
    qp.write_blocking(0, 10, &data).unwrap();
    let mut back = vec![0u8; 8192];
    qp.read_blocking(0, 10, &mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(fake.lu_bytes(0, 10 * 4096, 8192), data);
    let s = qp.stats();
    assert_eq!((s.submitted, s.completed), (2, 2));
    // Two completions: CQTP read for each, CQHP not yet stored (it waits
    // for 32 consumed entries).
    assert!(s.completion_reads >= 2 && s.cq_head_writes == 0, "{s:?}");
}

#[test]
fn legacy_bring_up_when_the_controller_has_no_mcq() {
    let (fake, ctrl) = up(sync_cfg(false), opts(4));
    assert_eq!(ctrl.mode(), UfsMode::Legacy);
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    assert_eq!(qp.hw_queue(), None);
    let data = pattern(2, 4096 * 3);
    qp.write_blocking(0, 100, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    qp.read_blocking(0, 100, &mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(fake.lu_bytes(0, 100 * 4096, data.len()), data);
    assert_eq!(qp.stats().doorbell_writes, 2);
}

#[test]
fn legacy_bring_up_when_the_options_ask_for_it() {
    let o = UfsOptions {
        mcq: false,
        ..opts(4)
    };
    let (_fake, ctrl) = up(sync_cfg(true), o);
    assert_eq!(ctrl.mode(), UfsMode::Legacy);
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    qp.write_blocking(0, 0, &pattern(3, 4096)).unwrap();
}

#[test]
fn queue_count_is_bounded_by_maxq_and_queues_are_not_shared() {
    let cfg = UfsConfig {
        queues: 2,
        ..sync_cfg(true)
    };
    let (_fake, ctrl) = up(cfg, opts(8));
    assert_eq!(ctrl.mode(), UfsMode::Mcq { queues: 2 });
    let a = ctrl.create_qpair(Default::default()).unwrap();
    let b = ctrl.create_qpair(Default::default()).unwrap();
    assert_ne!(a.hw_queue(), b.hw_queue());
    assert!(matches!(
        ctrl.create_qpair(Default::default()),
        Err(Error::NoFreeQueue { granted: 2 })
    ));
    let freed = a.hw_queue();
    drop(a);
    let c = ctrl.create_qpair(Default::default()).unwrap();
    assert_eq!(
        c.hw_queue(),
        freed,
        "a dropped queue pair's queue is reused"
    );
}

#[test]
fn legacy_mode_has_one_queue_pair() {
    let (_fake, ctrl) = up(sync_cfg(false), opts(1));
    let a = ctrl.create_qpair(Default::default()).unwrap();
    assert!(matches!(
        ctrl.create_qpair(Default::default()),
        Err(Error::NoFreeQueue { granted: 1 })
    ));
    drop(a);
    let mut b = ctrl.create_qpair(Default::default()).unwrap();
    b.write_blocking(0, 1, &pattern(4, 4096)).unwrap();
}

#[test]
fn several_logical_units_and_a_slow_device_init() {
    let cfg = UfsConfig {
        lus: vec![
            LuConfig::Ram { blocks: 1024 },
            LuConfig::Null { blocks: 1 << 20 },
            LuConfig::Ram { blocks: 64 },
        ],
        device_init_reads: 20,
        ..sync_cfg(true)
    };
    let (fake, ctrl) = up(cfg, opts(1));
    let lus: Vec<(u8, u64)> = ctrl
        .logical_units()
        .iter()
        .map(|l| (l.lun, l.blocks))
        .collect();
    assert_eq!(lus, vec![(0, 1024), (1, 1 << 20), (2, 64)]);
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    let data = pattern(5, 4096);
    qp.write_blocking(2, 63, &data).unwrap();
    assert_eq!(fake.lu_bytes(2, 63 * 4096, 4096), data);
    qp.write_blocking(1, (1 << 20) - 1, &data).unwrap();
}

#[test]
fn bring_up_twice_on_the_same_controller() {
    // A second bring-up finds HCE set and resets the controller first.
    let (fake, ctrl) = up(sync_cfg(true), opts(2));
    drop(ctrl);
    let backend: std::sync::Arc<dyn mcqio::vfio::Backend> = fake.clone();
    let ctrl = mcqio::UfsController::new(backend, opts(2)).unwrap();
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    qp.write_blocking(0, 0, &pattern(6, 4096)).unwrap();
}

#[test]
fn a_reused_queue_continues_where_the_controller_stands() {
    // The controller keeps SQHP/CQTP across queue pairs: a new queue pair
    // on the same hardware queue must continue from there, not from slot 0.
    let cfg = mcqio_fixtures::ufs::UfsConfig {
        queues: 1,
        ..sync_cfg(true)
    };
    let (fake, ctrl) = up(cfg, opts(1));
    for round in 0..4u64 {
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        for i in 0..(3 + round) {
            let data = pattern(round * 10 + i, 4096);
            qp.write_blocking(0, round * 10 + i, &data).unwrap();
            assert_eq!(fake.lu_bytes(0, (round * 10 + i) * 4096, 4096), data);
        }
        let s = qp.stats();
        assert_eq!(
            (s.submitted, s.completed, s.stale_completions),
            (3 + round, 3 + round, 0)
        );
    }
    // The device executed exactly our commands (bring-up's included), no
    // stale ring entries, and reported no error.
    let st = fake.stats();
    assert_eq!(st.errors, 0, "{st:?}");
    let before = st.commands;
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    qp.write_blocking(0, 99, &pattern(99, 4096)).unwrap();
    assert_eq!(fake.stats().commands, before + 1);
}

/// Issue 13 item 8 (found on QEMU 10.0.2's UFS model): QEMU has no unit
/// descriptor for an LU that does not exist and fails that query with OCS
/// INVALID_CMD_TABLE_ATTR. Bring-up used to read every index up to
/// bMaxNumberLU and died on the first absent one.
#[test]
fn qemu_absent_unit_descriptors_do_not_fail_bring_up() {
    for mcq in [true, false] {
        let cfg = UfsConfig {
            qemu_quirks: true,
            ..sync_cfg(mcq)
        };
        let (_fake, ctrl) = up(cfg, opts(2));
        let lus = ctrl.logical_units();
        assert_eq!(lus.len(), 1, "mcq {mcq}");
        assert_eq!((lus[0].lun, lus[0].blocks), (0, 4096));
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        qp.write_blocking(0, 7, &pattern(9, 4096)).unwrap();
    }
    // Two LUs: the scan finds both and still stops before absent indexes.
    let cfg = UfsConfig {
        qemu_quirks: true,
        lus: vec![
            LuConfig::Ram { blocks: 4096 },
            LuConfig::Ram { blocks: 2048 },
        ],
        ..sync_cfg(true)
    };
    let (_fake, ctrl) = up(cfg, opts(2));
    let got: Vec<_> = ctrl
        .logical_units()
        .iter()
        .map(|l| (l.lun, l.blocks))
        .collect();
    assert_eq!(got, vec![(0, 4096), (1, 2048)]);
}

/// Issue 13 item 8 (found on QEMU 10.0.2's UFS model): QEMU sets the
/// RESPONSE UPIU's response field to "target failure" whenever the SCSI
/// status is not GOOD, so the power-on UNIT ATTENTION of the first TEST UNIT
/// READY looked like a target failure and the first bring-up after power-on
/// failed. The SCSI status and sense decide; and a CHECK CONDITION on I/O
/// still arrives as the SCSI error it is.
#[test]
fn qemu_target_failure_with_check_condition_is_a_scsi_status() {
    use mcqio::ufs::UfsError;
    use mcqio::IoError;
    use mcqio_fixtures::ufs::{Sense, UfsFault};
    for mcq in [true, false] {
        let cfg = UfsConfig {
            qemu_quirks: true,
            ..sync_cfg(mcq)
        };
        let (fake, ctrl) = up(cfg, opts(1));
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        qp.write_blocking(0, 3, &pattern(5, 4096)).unwrap();
        fake.faults().inject_next(
            None,
            None,
            UfsFault::CheckCondition(Sense::new(0x3, 0x11, 0x00)),
        );
        let mut back = vec![0u8; 4096];
        match qp.read_blocking(0, 3, &mut back) {
            Err(Error::Io(IoError::Ufs(UfsError::Scsi { sense: Some(_), .. }))) => {}
            other => panic!("mcq {mcq}: expected a SCSI error with sense, got {other:?}"),
        }
        qp.read_blocking(0, 3, &mut back).unwrap();
        assert_eq!(back, pattern(5, 4096));
    }
}

/// Issue 13 item 8 (found on QEMU 10.0.2's UFS model): QEMU keeps a
/// queue's SQHP/SQTP/CQHP/CQTP across a host controller reset and a
/// re-enable, so a second process's bring-up started its rings at 0 while
/// the controller stood elsewhere: it fetched zeroed slots (a DMA read at
/// IOVA 0), posted completions nobody sent, and under load lost commands.
#[test]
fn qemu_queue_pointers_that_survive_a_reset_are_adopted() {
    use mcqio::ufs::UfsController;
    let cfg = UfsConfig {
        qemu_quirks: true,
        queues: 2,
        ..sync_cfg(true)
    };
    let (fake, ctrl) = up(cfg, opts(2));
    {
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        // 5 commands: the rings stop at slot 5, not 0.
        for i in 0..5u64 {
            qp.write_blocking(0, i, &pattern(i, 4096)).unwrap();
        }
    }
    drop(ctrl);
    let backend: std::sync::Arc<dyn mcqio::vfio::Backend> = fake.clone();
    let ctrl = UfsController::new(backend, opts(2)).unwrap();
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    // Enough commands to wrap the 33-slot rings twice.
    for i in 0..70u64 {
        let lba = 100 + i % 7;
        qp.write_blocking(0, lba, &pattern(i, 4096)).unwrap();
        let mut back = vec![0u8; 4096];
        qp.read_blocking(0, lba, &mut back).unwrap();
        assert_eq!(back, pattern(i, 4096), "command {i}");
    }
    let s = qp.stats();
    assert_eq!(s.stale_completions, 0, "{s:?}");
    // The controller fetched no slot the engine had not written (each
    // would be an error completion for UCD address 0).
    assert_eq!(fake.stats().errors, 0, "{:?}", fake.stats());
    assert_eq!((s.submitted, s.completed), (140, 140), "{s:?}");
}

/// Issue 13 item 8 (found on QEMU 10.0.2's UFS model, after Linux's
/// ufshcd-pci had the controller): QEMU's HCE reset leaves the MCQ queues
/// enabled on their old ring addresses, and programming the new addresses
/// into an enabled queue does not move it. Bring-up must disable a queue
/// that is still enabled before it programs it; otherwise the controller
/// fetches from the previous owner's rings and every command is lost.
#[test]
fn qemu_queues_left_enabled_by_the_previous_owner_are_reprogrammed() {
    use mcqio::ufs::UfsController;
    use mcqio::vfio::{Backend, DmaDir};
    let cfg = UfsConfig {
        qemu_quirks: true,
        queues: 2,
        ..sync_cfg(true)
    };
    let (fake, ctrl) = up(cfg, opts(2));
    {
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        qp.write_blocking(0, 1, &pattern(1, 4096)).unwrap();
    }
    drop(ctrl);
    // Whatever comes next lands at other IOVAs than the old rings.
    let hold = fake.dma().alloc(1 << 20, DmaDir::Bidirectional).unwrap();
    let backend: std::sync::Arc<dyn Backend> = fake.clone();
    let ctrl = UfsController::new(backend, opts(2)).unwrap();
    let mut qps: Vec<_> = (0..2)
        .map(|_| ctrl.create_qpair(Default::default()).unwrap())
        .collect();
    for (i, qp) in qps.iter_mut().enumerate() {
        let lba = 10 + i as u64;
        qp.write_blocking(0, lba, &pattern(lba, 4096)).unwrap();
        let mut back = vec![0u8; 4096];
        qp.read_blocking(0, lba, &mut back).unwrap();
        assert_eq!(back, pattern(lba, 4096));
    }
    drop(hold);
}

// Device commands of the bring-up (NOP OUT, queries, REPORT LUNS, TEST UNIT
// READY, READ CAPACITY) travel on the legacy list, so faults aimed at
// `LEGACY_QUEUE` hit them and nothing else.

const TEST_UNIT_READY: u8 = 0x00;
const READ_CAPACITY_16: u8 = 0x9E;
const REPORT_LUNS: u8 = 0xA0;

fn fake(cfg: UfsConfig) -> std::sync::Arc<mcqio_fixtures::ufs::FakeUfs> {
    mcqio_fixtures::ufs::FakeUfs::new(cfg).expect("fake UFS")
}

fn bring_up(
    f: &std::sync::Arc<mcqio_fixtures::ufs::FakeUfs>,
    o: UfsOptions,
) -> Result<std::sync::Arc<mcqio::UfsController>, UfsCtrlError> {
    let backend: std::sync::Arc<dyn mcqio::vfio::Backend> = f.clone();
    mcqio::UfsController::new(backend, o)
}

#[test]
fn one_transport_error_on_test_unit_ready_does_not_fail_bring_up() {
    for mcq in [true, false] {
        let f = fake(sync_cfg(mcq));
        f.faults().inject_next(
            Some(LEGACY_QUEUE),
            Some(TEST_UNIT_READY),
            UfsFault::Ocs(0x5),
        );
        let ctrl = bring_up(&f, opts(1))
            .unwrap_or_else(|e| panic!("mcq={mcq}: one OCS error failed bring-up: {e}"));
        assert_eq!(f.faults().count(UfsFaultKind::Ocs), 1, "mcq={mcq}");
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        qp.write_blocking(0, 3, &pattern(1, 4096)).unwrap();
        assert_eq!(f.lu_bytes(0, 3 * 4096, 4096), pattern(1, 4096));
    }
}

#[test]
fn transient_failures_of_each_bring_up_command_are_retried() {
    // One failure of each kind the retry rule calls transient, on each SCSI
    // command of the bring-up: a transport error, NOT READY (becoming
    // ready), a MEDIUM ERROR on a command that reads no medium, and a
    // device-management request whose completion never comes (withdrawn
    // with UTRLCLR, then sent again).
    let f = fake(sync_cfg(true));
    let faults = f.faults();
    faults.inject_next(Some(LEGACY_QUEUE), Some(REPORT_LUNS), UfsFault::Ocs(0x5));
    faults.inject_next(
        Some(LEGACY_QUEUE),
        Some(TEST_UNIT_READY),
        UfsFault::CheckCondition(Sense::new(0x2, 0x04, 0x01)),
    );
    faults.inject_next(
        Some(LEGACY_QUEUE),
        Some(READ_CAPACITY_16),
        UfsFault::CheckCondition(Sense::UNRECOVERED_READ),
    );
    faults.inject_next(
        Some(LEGACY_QUEUE),
        Some(READ_CAPACITY_16),
        UfsFault::DropCompletion,
    );
    let o = UfsOptions {
        init_timeout: Duration::from_secs(1),
        ..opts(1)
    };
    let ctrl = bring_up(&f, o).unwrap_or_else(|e| panic!("bring-up: {e}"));
    assert_eq!(faults.count(UfsFaultKind::Ocs), 1);
    assert_eq!(faults.count(UfsFaultKind::CheckCondition), 2);
    assert_eq!(faults.count(UfsFaultKind::DropCompletion), 1);
    assert_eq!(ctrl.logical_unit(0).map(|l| l.blocks), Some(4096));
}

#[test]
fn a_device_that_fails_test_unit_ready_every_time_ends_in_a_typed_error() {
    let f = fake(sync_cfg(true));
    for _ in 0..64 {
        f.faults().inject_next(
            Some(LEGACY_QUEUE),
            Some(TEST_UNIT_READY),
            UfsFault::Ocs(0x5),
        );
    }
    let start = Instant::now();
    let e = bring_up(&f, opts(1)).expect_err("TEST UNIT READY never succeeds");
    let took = start.elapsed();
    match &e {
        UfsCtrlError::Scsi {
            what: "TEST UNIT READY",
            lun: 0,
            err: UfsError::Transport(ocs),
        } if ocs.0 == 0x5 => {}
        e => panic!("unexpected error: {e}"),
    }
    // A bounded number of attempts, none of them waiting.
    let n = f.faults().count(UfsFaultKind::Ocs);
    assert!((2..=5).contains(&n), "{n} attempts");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn a_device_that_never_completes_test_unit_ready_ends_in_a_timeout() {
    let f = fake(sync_cfg(true));
    for _ in 0..64 {
        f.faults().inject_next(
            Some(LEGACY_QUEUE),
            Some(TEST_UNIT_READY),
            UfsFault::DropCompletion,
        );
    }
    let o = UfsOptions {
        init_timeout: Duration::from_millis(200),
        ..opts(1)
    };
    let e = bring_up(&f, o).expect_err("TEST UNIT READY never completes");
    assert!(matches!(e, UfsCtrlError::Timeout { .. }), "{e}");
    let n = f.faults().count(UfsFaultKind::DropCompletion);
    assert!((2..=5).contains(&n), "{n} attempts");
}

#[test]
fn illegal_request_on_a_bring_up_command_is_not_retried() {
    // The device says the command itself is wrong: asking again gets the
    // same answer.
    let f = fake(sync_cfg(true));
    f.faults().inject_next(
        Some(LEGACY_QUEUE),
        Some(TEST_UNIT_READY),
        UfsFault::CheckCondition(Sense::INVALID_FIELD_IN_CDB),
    );
    let e = bring_up(&f, opts(1)).expect_err("ILLEGAL REQUEST is final");
    match &e {
        UfsCtrlError::Scsi {
            what: "TEST UNIT READY",
            err: UfsError::Scsi { sense: Some(s), .. },
            ..
        } if s.key == 0x5 => {}
        e => panic!("unexpected error: {e}"),
    }
    assert_eq!(f.faults().count(UfsFaultKind::CheckCondition), 1);
}

// Queries and NOP OUT are never faulted by the fake's injector; the hostile
// wrapper patches the QUERY RESPONSE UPIUs the device writes instead.

fn query_liar(nth: Option<u64>, patches: Vec<(usize, u8)>) -> std::sync::Arc<HostileUfs> {
    HostileUfs::new(
        sync_cfg(true),
        UfsRegisterLies::default(),
        UfsDeviceLies {
            upius: vec![UpiuLie {
                kind: UpiuKind::QueryResponse,
                nth,
                when: None,
                patches,
            }],
            ..Default::default()
        },
    )
    .expect("hostile UFS")
}

fn open(
    h: &std::sync::Arc<HostileUfs>,
) -> Result<std::sync::Arc<mcqio::UfsController>, UfsCtrlError> {
    let backend: std::sync::Arc<dyn mcqio::vfio::Backend> = h.clone();
    mcqio::UfsController::new(backend, opts(1))
}

#[test]
fn a_query_that_fails_once_is_sent_again() {
    // The first QUERY RESPONSE (set fDeviceInit) says GENERAL FAILURE; the
    // fourth (a descriptor read) carries another task tag.
    for (nth, patch) in [(0, (6, 0xFF)), (3, (3, 0xEE))] {
        let h = query_liar(Some(nth), vec![patch]);
        let ctrl = open(&h).unwrap_or_else(|e| panic!("lie in query {nth}: {e}"));
        assert_eq!(h.stats().lies, 1, "lie in query {nth}");
        assert_eq!(ctrl.logical_unit(0).map(|l| l.blocks), Some(4096));
    }
}

#[test]
fn a_query_that_always_fails_ends_in_a_typed_error() {
    let h = query_liar(None, vec![(6, 0xFF)]);
    let e = open(&h).expect_err("every query fails");
    assert!(
        matches!(
            e,
            UfsCtrlError::Query {
                what: "set fDeviceInit",
                code: 0xFF
            }
        ),
        "{e}"
    );
    let n = h.stats().lies;
    assert!((2..=5).contains(&n), "{n} attempts");
}
