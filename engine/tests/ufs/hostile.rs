//! Hostile register and descriptor values of the fake UFS controller give
//! typed errors (bring-up) or stale-completion counting (I/O), never a
//! panic or a hang.

use mcqio_fixtures::testing::engine::ufs as ufs_common;
use ufs_common::*;

use std::sync::Arc;

use mcqio::ufs::spec::desc::DescError;
use mcqio::ufs::{UfsController, UfsCtrlError, UfsMode, UfsOptions};
use mcqio::vfio::{Backend, DmaDir};
use mcqio::{DmaBuf, IoError};
use mcqio_fixtures::ufs::{FakeUfs, UfsConfig, UfsHostile};

fn bring_up(cfg: UfsConfig, o: UfsOptions) -> Result<Arc<UfsController>, UfsCtrlError> {
    let fake = FakeUfs::new(cfg).unwrap();
    let backend: Arc<dyn Backend> = fake;
    UfsController::new(backend, o)
}

fn hostile(h: UfsHostile) -> UfsConfig {
    UfsConfig {
        hostile: h,
        ..sync_cfg(true)
    }
}

#[test]
fn maxq_beyond_the_bar_is_refused() {
    let e = bring_up(
        hostile(UfsHostile {
            maxq: Some(250),
            ..Default::default()
        }),
        opts(2),
    )
    .unwrap_err();
    assert!(matches!(e, UfsCtrlError::OutsideBar { .. }), "{e}");
    // Legacy mode does not use MCQCAP at all.
    let o = UfsOptions {
        mcq: false,
        ..opts(2)
    };
    let ctrl = bring_up(
        hostile(UfsHostile {
            maxq: Some(250),
            ..Default::default()
        }),
        o,
    )
    .unwrap();
    assert_eq!(ctrl.mode(), UfsMode::Legacy);
}

#[test]
fn doorbell_offsets_outside_the_bar_are_refused() {
    let e = bring_up(
        hostile(UfsHostile {
            dao_outside_bar: true,
            ..Default::default()
        }),
        opts(2),
    )
    .unwrap_err();
    assert!(matches!(e, UfsCtrlError::OutsideBar { .. }), "{e}");
    assert!(e.to_string().contains("DAO"), "{e}");
}

#[test]
fn bogus_cqe_ucd_addresses_are_counted_stale() {
    let (_f, ctrl) = up(
        hostile(UfsHostile {
            bogus_cqe_ucd: true,
            ..Default::default()
        }),
        opts(1),
    );
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    for i in 0..3 {
        qp.read(
            0,
            i,
            1,
            ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
            i,
        )
        .unwrap();
    }
    qp.submit();
    for _ in 0..50 {
        qp.poll(8, |c| {
            panic!("delivered a completion naming no command: {}", c.tag)
        })
        .unwrap();
    }
    let s = qp.stats();
    assert_eq!(s.stale_completions, 3, "{s:?}");
    assert_eq!(qp.outstanding(), 3);
    // Closing ends each command once. The cleanup's ABORTED entries carry
    // bogus addresses too, so the controller never gives the commands
    // back: their buffers and the queue's memory are leaked, not reused.
    let mut ended = Vec::new();
    qp.close(|c| ended.push((c.tag, c.result, c.buf.is_some())))
        .unwrap();
    ended.sort_by_key(|e| e.0);
    assert_eq!(
        ended,
        (0..3)
            .map(|t| (t, Err(IoError::Aborted), false))
            .collect::<Vec<_>>()
    );
    assert!(ctrl.leaked_bytes() > 0);
}

/// The queue's memory leaked at drop is what it allocated: with a depth
/// that is not a power of two, `depth` command descriptors of 8 KiB (the
/// tracker pads its slots to the next power of two; those are not memory
/// the device holds). Compared with the same run at a depth one higher,
/// so the leaked buffers and any per-queue memory cancel out.
#[test]
fn the_leak_at_drop_counts_the_descriptors_the_queue_allocated() {
    let leaked = |depth: u16| {
        let (_f, ctrl) = up(
            hostile(UfsHostile {
                bogus_cqe_ucd: true,
                ..Default::default()
            }),
            UfsOptions { depth, ..opts(1) },
        );
        assert_eq!(ctrl.depth(), depth);
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        for i in 0..3 {
            qp.read(
                0,
                i,
                1,
                ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
                i,
            )
            .unwrap();
        }
        qp.submit();
        for _ in 0..50 {
            qp.poll(8, |_| ()).unwrap();
        }
        qp.close(|_| ()).unwrap();
        ctrl.leaked_bytes()
    };
    // 5 and 6 both pad to 8 tracker slots; their descriptors differ by one.
    assert_eq!(leaked(6) - leaked(5), 8192);
}

#[test]
fn descriptor_lengths_that_disagree_with_the_data_are_refused() {
    for len in [0x10u8, 0xFF] {
        let e = bring_up(
            hostile(UfsHostile {
                descriptor_length: Some(len),
                ..Default::default()
            }),
            opts(1),
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                UfsCtrlError::BadValue { .. }
                    | UfsCtrlError::Descriptor(DescError::TooShort { .. })
            ),
            "bLength {len:#x}: {e}"
        );
    }
}

#[test]
fn absurd_logical_block_sizes_are_refused() {
    let e = bring_up(
        hostile(UfsHostile {
            logical_block_size_log2: Some(40),
            ..Default::default()
        }),
        opts(1),
    )
    .unwrap_err();
    assert!(
        matches!(e, UfsCtrlError::Descriptor(DescError::Invalid { .. })),
        "{e}"
    );
    // In range but not what READ CAPACITY says.
    let e = bring_up(
        hostile(UfsHostile {
            logical_block_size_log2: Some(13),
            ..Default::default()
        }),
        opts(1),
    )
    .unwrap_err();
    assert!(matches!(e, UfsCtrlError::BadValue { .. }), "{e}");
}

#[test]
fn bad_options_are_refused() {
    for o in [
        UfsOptions {
            depth: 0,
            ..opts(1)
        },
        UfsOptions {
            queues: 0,
            ..opts(1)
        },
        UfsOptions {
            max_transfer: 6,
            ..opts(1)
        },
    ] {
        assert!(matches!(
            bring_up(sync_cfg(true), o),
            Err(UfsCtrlError::InvalidOption(_))
        ));
    }
}

#[test]
fn a_removed_controller_fails_bring_up() {
    let fake = FakeUfs::new(sync_cfg(true)).unwrap();
    fake.surprise_remove();
    let backend: Arc<dyn Backend> = fake;
    assert!(matches!(
        UfsController::new(backend, opts(1)),
        Err(UfsCtrlError::DeviceGone)
    ));
}

/// Issue 27 item 8: an LU whose blocks the per-command transfer limit
/// cannot carry does not take the controller down: bring-up succeeds, the
/// LU is marked unusable, and reads and writes to it are a typed error.
#[test]
fn an_lu_with_blocks_above_the_transfer_limit_is_unusable_not_fatal() {
    for mcq in [true, false] {
        let cfg = UfsConfig {
            lus: vec![
                mcqio_fixtures::ufs::LuConfig::Ram { blocks: 64 },
                mcqio_fixtures::ufs::LuConfig::Ram { blocks: 64 },
            ],
            ..sync_cfg(mcq)
        };
        let (_f, ctrl) = up(
            cfg,
            UfsOptions {
                mcq,
                max_transfer: 2048,
                ..opts(1)
            },
        );
        for lu in ctrl.logical_units() {
            assert_eq!(lu.block_len, 4096);
            assert!(!lu.usable, "{lu:?}");
        }
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        let buf = ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
        let e = qp.read(1, 0, 1, buf, 1).unwrap_err();
        assert!(
            matches!(
                e.kind,
                mcqio::SubmitErrorKind::TransferTooLarge {
                    bytes: 4096,
                    max: 2048
                }
            ),
            "{:?}",
            e.kind
        );
        let e = qp.write(0, 0, 1, e.buf, 2).unwrap_err();
        assert!(
            matches!(e.kind, mcqio::SubmitErrorKind::TransferTooLarge { .. }),
            "{:?}",
            e.kind
        );
        let mut block = vec![0u8; 4096];
        assert!(matches!(
            qp.read_blocking(0, 0, &mut block),
            Err(mcqio::Error::Submit(
                mcqio::SubmitErrorKind::TransferTooLarge { .. }
            ))
        ));
        assert_eq!(qp.outstanding(), 0);
        qp.close(|_| {}).unwrap();
    }
}

// ---- the hostile wrapper (issue 27 item 7) ----

use mcqio_fixtures::ufs::{
    CqeKind, HceLie, HostileUfs, Pointer, UfsDeviceLies, UfsRegisterLies, UpiuKind, UpiuLie,
};

fn quick(queues: u16) -> UfsOptions {
    UfsOptions {
        init_timeout: std::time::Duration::from_millis(50),
        close_timeout: std::time::Duration::from_millis(50),
        blocking_timeout: std::time::Duration::from_millis(100),
        ..opts(queues)
    }
}

fn liar(cfg: UfsConfig, regs: UfsRegisterLies, dev: UfsDeviceLies) -> Arc<HostileUfs> {
    HostileUfs::new(cfg, regs, dev).expect("hostile UFS")
}

fn open_liar(h: &Arc<HostileUfs>, o: UfsOptions) -> Result<Arc<UfsController>, UfsCtrlError> {
    UfsController::new(Arc::clone(h) as Arc<dyn Backend>, o)
}

/// A bring-up that fails after HCE = 1 must disable the controller before
/// it frees the memory the controller was given (the legacy list, the
/// command descriptor, the data page, MCQ rings) — or leak that memory.
#[test]
fn a_failed_bring_up_disables_the_controller_before_freeing_its_memory() {
    let cases: Vec<(&str, bool, UfsRegisterLies, UfsDeviceLies)> = vec![
        (
            "NOP IN with the wrong transaction code",
            true,
            UfsRegisterLies::default(),
            UfsDeviceLies {
                upius: vec![UpiuLie {
                    kind: UpiuKind::NopIn,
                    nth: None,
                    when: None,
                    patches: vec![(0, 0x3F)],
                }],
                ..Default::default()
            },
        ),
        (
            "a legacy doorbell that never clears",
            true,
            UfsRegisterLies {
                utrldbr_stuck: true,
                ..Default::default()
            },
            UfsDeviceLies::default(),
        ),
        (
            "SQHP after enable beyond the ring",
            true,
            UfsRegisterLies {
                pointers: vec![(0, Pointer::Sqhp, 0x7FE0)],
                ..Default::default()
            },
            UfsDeviceLies::default(),
        ),
    ];
    for (what, mcq, regs, dev) in cases {
        let h = liar(sync_cfg(mcq), regs, dev);
        let e = open_liar(&h, UfsOptions { mcq, ..quick(2) }).unwrap_err();
        let mapped = h.fake().iommu().mapping_count();
        assert!(
            !h.really_enabled() || mapped > 0,
            "{what}: bring-up failed ({e}) with HCE still 1 and all {mapped} mappings gone"
        );
    }
}

/// Dropping the controller frees its pooled queue memory only once the
/// controller reads disabled; one that ignores HCE = 0 keeps it mapped.
#[test]
fn drop_leaks_the_pooled_queues_of_a_controller_that_cannot_be_disabled() {
    for mcq in [true, false] {
        let h = liar(
            sync_cfg(mcq),
            UfsRegisterLies {
                hce: HceLie::NeverClears,
                ..Default::default()
            },
            UfsDeviceLies::default(),
        );
        // The first HCE = 0 (before enabling) is honoured; from then on not.
        let ctrl = open_liar(&h, UfsOptions { mcq, ..quick(2) }).unwrap();
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        let mut v = vec![0u8; 4096];
        qp.read_blocking(0, 0, &mut v).unwrap();
        qp.close(|_| {}).unwrap();
        drop(ctrl);
        assert!(h.really_enabled(), "the lie holds");
        assert!(
            h.fake().iommu().mapping_count() > 0,
            "mcq {mcq}: queue memory freed under a controller that is still enabled"
        );
    }
}

/// The harness finds a buffer handed back early: a write fails with an
/// error OCS; a read takes its slot and the device holds it; the device
/// re-posts the write's entry. A command that ended on that entry would
/// hand its buffer back while the device still owns it, and the device's
/// later data lands in freed memory (an IOMMU fault here).
#[test]
fn a_replayed_error_entry_does_not_end_the_command_in_its_slot() {
    let h = liar(
        sync_cfg(true),
        UfsRegisterLies::default(),
        UfsDeviceLies::default(),
    );
    let ctrl = open_liar(
        &h,
        UfsOptions {
            depth: 1,
            ..quick(1)
        },
    )
    .unwrap();
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    let faults = h.fake().faults();
    faults.inject_next(None, None, mcqio_fixtures::ufs::UfsFault::Ocs(0x5));
    qp.write(
        0,
        0,
        1,
        ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
        1,
    )
    .unwrap();
    let mut done = Vec::new();
    for _ in 0..10 {
        qp.submit();
        qp.poll(4, |c| done.push((c.tag, c.result.is_ok())))
            .unwrap();
    }
    assert_eq!(done, [(1, false)], "the write fails");
    faults.inject_next(
        None,
        None,
        mcqio_fixtures::ufs::UfsFault::Delay(std::time::Duration::from_millis(30)),
    );
    qp.read(
        0,
        0,
        1,
        ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
        2,
    )
    .unwrap();
    qp.submit();
    assert!(h.replay_last(0), "the write's entry is posted again");
    let mut early = Vec::new();
    for _ in 0..10 {
        qp.poll(4, |c| {
            early.push((c.tag, c.result));
            // Freed at once: a device still holding it faults.
            drop(c.buf);
        })
        .unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(40));
    h.poll();
    let faults = h.fake().iommu().faults();
    assert!(
        early.is_empty() && faults.is_empty(),
        "read ended on the write's stale entry: {early:?}; device wrote freed memory: {faults:?}"
    );
    assert_eq!(qp.stats().stale_completions, 1);
    qp.poll(4, |c| early.push((c.tag, c.result))).unwrap();
    assert_eq!(early, [(2, Ok(()))]);
    qp.close(|_| {}).unwrap();
}

/// Doorbell and interrupt blocks that overlap each other, the host
/// registers or the configuration array, or are unaligned, are refused at
/// bring-up: a doorbell store there would land in another register.
#[test]
fn overlapping_or_unaligned_queue_blocks_are_refused() {
    let cfg = sync_cfg(true);
    let (qc, op) = (usize::from(cfg.qcfgptr) * 0x200, cfg.op_base);
    // (what, queue, register in the block, value)
    let cases: Vec<(&str, u8, usize, u32)> = vec![
        ("queue 1's SQ doorbells on queue 0's", 1, 0x0C, op as u32),
        (
            "queue 0's CQ doorbells on its SQ doorbells",
            0,
            0x2C,
            op as u32,
        ),
        ("SQ doorbells on IS/IE", 0, 0x0C, 0x20),
        (
            "CQ interrupt block on the configuration array",
            1,
            0x30,
            qc as u32,
        ),
        ("SQ doorbells unaligned", 1, 0x0C, (op + 0x82) as u32),
        (
            "SQ interrupt block on queue 0's CQ doorbells",
            1,
            0x10,
            (op + 0x40) as u32,
        ),
    ];
    for (what, q, reg, v) in cases {
        let h = liar(
            cfg.clone(),
            UfsRegisterLies {
                qcfg: vec![(q, reg, v)],
                ..Default::default()
            },
            UfsDeviceLies::default(),
        );
        match open_liar(&h, quick(2)) {
            Err(UfsCtrlError::BadValue { .. } | UfsCtrlError::OutsideBar { .. }) => {}
            Err(e) => panic!("{what}: {e}"),
            Ok(c) => panic!("{what}: accepted ({:?})", c.mode()),
        }
    }
}

/// A capacity whose size in bytes overflows 64 bits (READ CAPACITY's last
/// LBA near 2^63, the unit descriptor's block count 0 = "ask READ
/// CAPACITY") is refused with a typed error, as NVMe refuses such a
/// namespace: nothing downstream can compute its size.
#[test]
fn a_capacity_that_overflows_is_refused() {
    let h = liar(
        sync_cfg(true),
        UfsRegisterLies::default(),
        UfsDeviceLies {
            upius: vec![UpiuLie {
                kind: UpiuKind::QueryResponse,
                nth: None,
                // A unit descriptor: qLogicalBlockCount (data 0x0B..0x13) = 0.
                when: Some((33, 0x02)),
                patches: (43..51).map(|o| (o, 0)).collect(),
            }],
            data: vec![mcqio_fixtures::ufs::DataLie {
                opcode: 0x9E,
                nth: None,
                patches: (0..8)
                    .map(|o| (o, if o == 0 { 0x7F } else { 0xFF }))
                    .collect(),
            }],
            ..Default::default()
        },
    );
    match open_liar(&h, quick(1)) {
        Err(UfsCtrlError::BadValue { .. }) => {}
        Err(e) => panic!("{e}"),
        Ok(c) => panic!("accepted: {:?}", c.logical_units()),
    }
}

/// Lies in every RESPONSE UPIU and every completion entry of the I/O path
/// (bring-up saw the truth): each command ends exactly once — with `Ok`,
/// a typed error, or by close — never with a panic, and the device never
/// reaches memory that was handed back.
#[test]
fn lies_in_io_responses_and_entries_end_every_command_once() {
    use mcqio_fixtures::ufs::UfsCqeLie;
    let rsp = |patches: Vec<(usize, u8)>| UfsDeviceLies {
        upius: vec![UpiuLie {
            kind: UpiuKind::Response,
            nth: None,
            when: None,
            patches,
        }],
        ..Default::default()
    };
    let cqe = |kind: CqeKind| UfsDeviceLies {
        cqes: vec![UfsCqeLie { nth: None, kind }],
        ..Default::default()
    };
    let cases: Vec<(&str, UfsDeviceLies)> = vec![
        (
            "CHECK CONDITION, sense length 0xFFFF",
            rsp(vec![(7, 0x02), (32, 0xFF), (33, 0xFF)]),
        ),
        (
            "CHECK CONDITION, no sense",
            rsp(vec![(7, 0x02), (32, 0), (33, 0)]),
        ),
        (
            "UNIT ATTENTION forever",
            rsp(vec![
                (7, 0x02),
                (32, 0),
                (33, 18),
                (34, 0x70),
                (36, 0x06),
                (46, 0x29),
            ]),
        ),
        (
            "residual 0xFFFFFFFF",
            rsp((12..16).map(|o| (o, 0xFF)).collect()),
        ),
        (
            "data segment length 0xFFFF",
            rsp(vec![(10, 0xFF), (11, 0xFF)]),
        ),
        ("response: target failure", rsp(vec![(6, 0x01)])),
        ("another task tag", rsp(vec![(3, 0x77)])),
        ("another transaction code", rsp(vec![(0, 0x3F)])),
        ("status BUSY", rsp(vec![(7, 0x08)])),
        ("UCD outside", cqe(CqeKind::UcdOutside)),
        ("UCD misaligned", cqe(CqeKind::UcdMisaligned)),
        ("another queue's entry", cqe(CqeKind::OtherQueue)),
        ("the previous entry", cqe(CqeKind::Replay)),
        ("OCS INVALID_PRDT_ATTR", cqe(CqeKind::Ocs(2))),
        ("OCS 0xF (not completed)", cqe(CqeKind::Ocs(0xF))),
    ];
    for (what, lies) in cases {
        for mcq in [true, false] {
            let h = liar(
                sync_cfg(mcq),
                UfsRegisterLies::default(),
                UfsDeviceLies::default(),
            );
            let ctrl = open_liar(&h, UfsOptions { mcq, ..quick(2) }).unwrap();
            let qopts = mcqio::ufs::UfsQpairOptions {
                io_timeout: Some(std::time::Duration::from_millis(5)),
                timeout_policy: mcqio::TimeoutPolicy::Abort,
                ..Default::default()
            };
            // Another queue pair first, so "another queue's entry" has one
            // (legacy mode has a single one).
            let mut other = mcq.then(|| ctrl.create_qpair_for::<DmaBuf>(qopts.clone()).unwrap());
            if let Some(o) = &mut other {
                let mut v = vec![0u8; 4096];
                let _ = o.read_blocking(0, 1, &mut v);
            }
            let mut qp = ctrl.create_qpair_for::<DmaBuf>(qopts).unwrap();
            h.set_device_lies(lies.clone());
            let mut seen = std::collections::HashMap::<u64, u32>::new();
            let mut results = Vec::new();
            let n = 6u64;
            for tag in 0..n {
                let b = ctrl.alloc_buf(8192, DmaDir::Bidirectional).unwrap();
                if tag % 2 == 0 {
                    qp.read(0, tag * 2, 2, b, tag).unwrap();
                } else {
                    qp.write(0, tag * 2, 2, b, tag).unwrap();
                }
            }
            qp.submit();
            let start = std::time::Instant::now();
            while qp.outstanding() > 0 && start.elapsed() < std::time::Duration::from_millis(100) {
                h.poll();
                let r = qp.poll(16, |c| {
                    *seen.entry(c.tag).or_default() += 1;
                    results.push(format!("{}:{:?}", c.tag, c.result));
                    drop(c.buf);
                });
                if r.is_err() {
                    break;
                }
            }
            let qstats = qp.stats();
            let closed = qp.close(|c| {
                *seen.entry(c.tag).or_default() += 1;
                results.push(format!("close {}:{:?}", c.tag, c.result));
                drop(c.buf);
            });
            if let Some(o) = other {
                let _ = o.close(|_| {});
            }
            drop(ctrl);
            h.poll();
            let ctx = format!("{what} (mcq {mcq}, close {closed:?})");
            if std::env::var("HOSTILE_DEBUG").is_ok() {
                eprintln!("{ctx}: {:?} {:?} {results:?}", h.stats(), qstats);
            }
            assert!(seen.values().all(|&k| k == 1), "{ctx}: twice: {seen:?}");
            if closed.is_ok() {
                assert_eq!(seen.len() as u64, n, "{ctx}: {seen:?}");
            }
            let f = h.fake().iommu().faults();
            assert!(f.is_empty(), "{ctx}: device reached freed memory: {f:?}");
        }
    }
}

/// A RESPONSE that says the device moved less than asked (UNDERFLOW, a
/// residual of half the transfer) must not complete a read as `Ok`: the
/// application would take stale buffer bytes for data.
#[test]
fn a_short_read_is_not_ok() {
    for mcq in [true, false] {
        let h = liar(
            sync_cfg(mcq),
            UfsRegisterLies::default(),
            UfsDeviceLies::default(),
        );
        let ctrl = open_liar(&h, UfsOptions { mcq, ..quick(1) }).unwrap();
        let mut qp = ctrl.create_qpair(Default::default()).unwrap();
        h.set_device_lies(UfsDeviceLies {
            upius: vec![UpiuLie {
                kind: UpiuKind::Response,
                nth: None,
                when: None,
                // Flags: UNDERFLOW; residual: 4096 of 8192 bytes.
                patches: vec![(1, 0x20), (12, 0), (13, 0), (14, 0x10), (15, 0)],
            }],
            ..Default::default()
        });
        qp.read(
            0,
            0,
            2,
            ctrl.alloc_buf(8192, DmaDir::Bidirectional).unwrap(),
            1,
        )
        .unwrap();
        let done = wait_n(&mut qp, 1);
        assert!(
            done[0].result.is_err(),
            "mcq {mcq}: a read the device says moved 4096 of 8192 bytes completed {:?}",
            done[0].result
        );
        qp.close(|_| {}).unwrap();
    }
}

/// Each way a GOOD RESPONSE can say the transfer was not whole ends in
/// its own typed error, for reads, writes and a command without data, on
/// both wires (the rule: `mcqio::ufs::spec::status::transfer_result`);
/// flag bits other than OVERFLOW/UNDERFLOW change nothing.
#[test]
fn every_transfer_report_that_is_not_whole_ends_in_its_error() {
    use mcqio::UfsError;
    const U: u8 = 0x20;
    const O: u8 = 0x40;
    let under = |residual| UfsError::Underflow {
        expected: 8192,
        residual,
    };
    let bad = |flags, expected, residual| UfsError::BadResidual {
        flags,
        expected,
        residual,
    };
    #[derive(Copy, Clone, Debug)]
    enum Cmd {
        Read,
        Write,
        Flush,
    }
    // (what, flags byte, residual, command, expected result)
    type Case = (&'static str, u8, u32, Cmd, Result<(), UfsError>);
    let cases: Vec<Case> = vec![
        ("read, UNDERFLOW 4096", U, 4096, Cmd::Read, Err(under(4096))),
        (
            "write, UNDERFLOW 4096",
            U,
            4096,
            Cmd::Write,
            Err(under(4096)),
        ),
        (
            "read, UNDERFLOW of all",
            U,
            8192,
            Cmd::Read,
            Err(under(8192)),
        ),
        (
            "read, residual, no flag",
            0,
            4096,
            Cmd::Read,
            Err(under(4096)),
        ),
        (
            "read, OVERFLOW 4096",
            O,
            4096,
            Cmd::Read,
            Err(UfsError::Overflow {
                expected: 8192,
                residual: 4096,
            }),
        ),
        (
            "read, UNDERFLOW past the transfer",
            U,
            8193,
            Cmd::Read,
            Err(bad(U, 8192, 8193)),
        ),
        ("read, UNDERFLOW 0", U, 0, Cmd::Read, Err(bad(U, 8192, 0))),
        ("write, OVERFLOW 0", O, 0, Cmd::Write, Err(bad(O, 8192, 0))),
        (
            "read, both flags",
            O | U,
            4096,
            Cmd::Read,
            Err(bad(O | U, 8192, 4096)),
        ),
        ("flush, UNDERFLOW 0", U, 0, Cmd::Flush, Err(bad(U, 0, 0))),
        ("flush, residual 1", 0, 1, Cmd::Flush, Err(bad(0, 0, 1))),
        ("read, other flag bits", 0x9F, 0, Cmd::Read, Ok(())),
    ];
    for (what, flags, residual, cmd, want) in cases {
        for mcq in [true, false] {
            let h = liar(
                sync_cfg(mcq),
                UfsRegisterLies::default(),
                UfsDeviceLies::default(),
            );
            let ctrl = open_liar(&h, UfsOptions { mcq, ..quick(1) }).unwrap();
            let mut qp = ctrl.create_qpair(Default::default()).unwrap();
            let r = residual.to_be_bytes();
            h.set_device_lies(UfsDeviceLies {
                upius: vec![UpiuLie {
                    kind: UpiuKind::Response,
                    nth: None,
                    when: None,
                    patches: vec![(1, flags), (12, r[0]), (13, r[1]), (14, r[2]), (15, r[3])],
                }],
                ..Default::default()
            });
            let buf = || ctrl.alloc_buf(8192, DmaDir::Bidirectional).unwrap();
            match cmd {
                Cmd::Read => qp.read(0, 0, 2, buf(), 1).unwrap(),
                Cmd::Write => qp.write(0, 0, 2, buf(), 1).unwrap(),
                Cmd::Flush => qp.flush(0, 1).unwrap(),
            }
            let done = wait_n(&mut qp, 1);
            assert_eq!(
                done[0].result,
                want.map_err(IoError::Ufs),
                "{what} (mcq {mcq})"
            );
            qp.close(|_| {}).unwrap();
        }
    }
}

/// A controller that never sets HCE, never clears it, or never sets a
/// ready bit ends bring-up in a typed error within the bounded waits.
#[test]
fn hce_and_ready_bits_that_never_move_end_in_typed_errors() {
    let cases: Vec<(&str, UfsRegisterLies)> = vec![
        (
            "HCE never sets",
            UfsRegisterLies {
                hce: HceLie::NeverSets,
                ..Default::default()
            },
        ),
        (
            "UCRDY never sets",
            UfsRegisterLies {
                hcs_clear: 1 << 3,
                ..Default::default()
            },
        ),
        (
            "UTRLRDY never sets",
            UfsRegisterLies {
                hcs_clear: 1 << 1,
                ..Default::default()
            },
        ),
        (
            "no device present",
            UfsRegisterLies {
                hcs_clear: 1 << 0,
                ..Default::default()
            },
        ),
        (
            "the UIC result is an error",
            UfsRegisterLies {
                uic_result: Some(0x0A),
                ..Default::default()
            },
        ),
        (
            "IS reports a host controller fatal error",
            UfsRegisterLies {
                is_flood: 1 << 16,
                ..Default::default()
            },
        ),
    ];
    for (what, regs) in cases {
        let h = liar(sync_cfg(true), regs, UfsDeviceLies::default());
        let start = std::time::Instant::now();
        let e = open_liar(&h, quick(1)).unwrap_err();
        assert!(
            matches!(
                e,
                UfsCtrlError::Timeout { .. }
                    | UfsCtrlError::NoDevice
                    | UfsCtrlError::Uic { .. }
                    | UfsCtrlError::ControllerFatal { .. }
            ),
            "{what}: {e}"
        );
        assert!(
            start.elapsed() < std::time::Duration::from_secs(2),
            "{what}"
        );
    }
    // A controller that never clears HCE: the next owner cannot start.
    let h = liar(
        sync_cfg(true),
        UfsRegisterLies {
            hce: HceLie::NeverClears,
            ..Default::default()
        },
        UfsDeviceLies::default(),
    );
    let ctrl = open_liar(&h, quick(1)).unwrap();
    drop(ctrl);
    let e = open_liar(&h, quick(1)).unwrap_err();
    assert!(matches!(e, UfsCtrlError::Timeout { .. }), "{e}");
}

/// A CQ tail that is unaligned, past the ring, or ahead of what the device
/// wrote (over entries never posted, or posted long ago) delivers nothing
/// it cannot prove; the commands still end once, and the device never
/// reaches memory handed back.
#[test]
fn a_lying_cq_tail_delivers_nothing_unproven() {
    for (what, ahead) in [
        ("unaligned", None),
        ("past the ring", None),
        ("4 slots ahead", Some(4u32)),
        ("the whole ring ahead", Some(256)),
    ] {
        let h = liar(
            sync_cfg(true),
            UfsRegisterLies::default(),
            UfsDeviceLies::default(),
        );
        let ctrl = open_liar(&h, quick(1)).unwrap();
        let mut qp = ctrl
            .create_qpair_for::<DmaBuf>(mcqio::ufs::UfsQpairOptions {
                io_timeout: Some(std::time::Duration::from_millis(5)),
                timeout_policy: mcqio::TimeoutPolicy::Abort,
                ..Default::default()
            })
            .unwrap();
        // Some history in the ring, then commands the device holds.
        let mut v = vec![0u8; 4096];
        for lba in 0..8 {
            qp.read_blocking(0, lba, &mut v).unwrap();
        }
        let q = usize::from(qp.hw_queue().unwrap());
        h.fake().faults().set_probability(
            mcqio_fixtures::ufs::UfsFault::Delay(std::time::Duration::from_millis(20)),
            1.0,
        );
        for tag in 0..4 {
            qp.read(
                0,
                tag,
                1,
                ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap(),
                tag,
            )
            .unwrap();
        }
        qp.submit();
        // The host's head is at slot 8 (+ 4 held commands' entries to come).
        let tail = match (what, ahead) {
            ("unaligned", _) => 8 * 32 + 5,
            ("past the ring", _) => 0x10_0000,
            (_, Some(n)) => ((8 + n) % 257) * 32,
            _ => unreachable!(),
        };
        h.set_cqtp(q, tail);
        let mut seen = std::collections::HashMap::<u64, u32>::new();
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(100) && qp.outstanding() > 0 {
            let _ = qp.poll(16, |c| {
                *seen.entry(c.tag).or_default() += 1;
                drop(c.buf);
            });
            h.poll();
        }
        if std::env::var("HOSTILE_DEBUG").is_ok() {
            eprintln!("{what}: {:?} {seen:?}", qp.stats());
        }
        let closed = qp.close(|c| {
            *seen.entry(c.tag).or_default() += 1;
            drop(c.buf);
        });
        drop(ctrl);
        std::thread::sleep(std::time::Duration::from_millis(25));
        h.poll();
        assert!(seen.values().all(|&k| k == 1), "{what}: {seen:?}");
        if closed.is_ok() {
            assert_eq!(seen.len(), 4, "{what}: {seen:?}");
        }
        let f = h.fake().iommu().faults();
        assert!(f.is_empty(), "{what}: device reached freed memory: {f:?}");
    }
}

/// Interrupt-status floods while I/O is in flight (bring-up saw the
/// truth): completion and UIC bits that are always set change nothing; a
/// fatal bit that is always set fails the controller, and every command
/// still ends exactly once.
#[test]
fn interrupt_status_floods_during_io_end_every_command_once() {
    for (what, bits) in [
        ("CQES", 1u32 << 20),
        ("UTRCS | UE", 1 | 1 << 2),
        ("UCCS | ULSS", 1 << 10 | 1 << 8),
        ("HCFES", 1 << 16),
        ("SBFES", 1 << 17),
        ("DFES", 1 << 11),
    ] {
        for mcq in [true, false] {
            let h = liar(
                sync_cfg(mcq),
                UfsRegisterLies::default(),
                UfsDeviceLies::default(),
            );
            let ctrl = open_liar(&h, UfsOptions { mcq, ..quick(1) }).unwrap();
            let mut qp = ctrl
                .create_qpair_for::<DmaBuf>(mcqio::ufs::UfsQpairOptions {
                    io_timeout: Some(std::time::Duration::from_millis(5)),
                    timeout_policy: mcqio::TimeoutPolicy::Reset,
                    ..Default::default()
                })
                .unwrap();
            h.fake().faults().set_probability(
                mcqio_fixtures::ufs::UfsFault::Delay(std::time::Duration::from_millis(2)),
                0.5,
            );
            h.set_register_lies(UfsRegisterLies {
                is_flood: bits,
                ..Default::default()
            });
            let mut seen = std::collections::HashMap::<u64, u32>::new();
            for tag in 0..6u64 {
                let b = ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap();
                let _ = qp.read(0, tag, 1, b, tag);
            }
            qp.submit();
            let start = std::time::Instant::now();
            let mut err = None;
            while qp.outstanding() > 0 && start.elapsed() < std::time::Duration::from_millis(100) {
                h.poll();
                if let Err(e) = qp.poll(16, |c| {
                    *seen.entry(c.tag).or_default() += 1;
                    drop(c.buf);
                }) {
                    err = Some(e);
                    break;
                }
            }
            let closed = qp.close(|c| {
                *seen.entry(c.tag).or_default() += 1;
                drop(c.buf);
            });
            drop(ctrl);
            std::thread::sleep(std::time::Duration::from_millis(5));
            h.poll();
            let ctx = format!("{what} (mcq {mcq}): poll {err:?}, close {closed:?}");
            assert!(seen.values().all(|&k| k == 1), "{ctx}: {seen:?}");
            assert_eq!(seen.len(), 6, "{ctx}: {seen:?}");
            let f = h.fake().iommu().faults();
            assert!(f.is_empty(), "{ctx}: device reached freed memory: {f:?}");
        }
    }
}

/// OVERFLOW on a device command's RESPONSE means the device had more data
/// than the host asked for: the buffer holds all that was asked, and the
/// residual counts bytes beyond it. Bring-up must not cut the data short
/// by that residual (READ CAPACITY(16)'s 32 bytes would become 4).
#[test]
fn an_overflow_residual_does_not_shorten_bring_up_data() {
    for mcq in [true, false] {
        let h = liar(
            sync_cfg(mcq),
            UfsRegisterLies::default(),
            UfsDeviceLies {
                upius: vec![UpiuLie {
                    kind: UpiuKind::Response,
                    nth: None,
                    when: None,
                    // Flags: OVERFLOW; residual: 28 bytes more than asked.
                    patches: vec![(1, 0x40), (12, 0), (13, 0), (14, 0), (15, 28)],
                }],
                ..Default::default()
            },
        );
        let ctrl = open_liar(&h, UfsOptions { mcq, ..quick(1) })
            .unwrap_or_else(|e| panic!("mcq {mcq}: bring-up with OVERFLOW responses: {e}"));
        let lu = &ctrl.logical_units()[0];
        assert_eq!((lu.blocks, lu.block_len), (4096, 4096), "mcq {mcq}");
    }
}
