//! Property tests ("fuzzing" with proptest) of what the engine parses and
//! validates: Identify pages (random and structure-aware: every accessor
//! on every format), completion status words, and the I/O submission
//! argument checks against a model — Ok or a typed error, never a panic,
//! and a rejected request always hands its buffer back.
//!
//! (Completion matching under random CQE streams is property-tested next to
//! the tracker, in `src/core/tracker.rs`, where it also runs under Miri.)

use mcqio_fixtures::testing::engine::nvme as common;

use std::sync::{Mutex, OnceLock};

use common::*;
use mcqio::nvme::spec::identify::IDENTIFY_LEN;
use mcqio::nvme::spec::{IdentifyController, IdentifyNamespace, NvmeStatus};
use mcqio::{Controller, QpairOptions, QueuePair, SubmitErrorKind};
use mcqio_fixtures::{ExecMode, FakeController};
use mcqio_vfio::DmaDir;
use proptest::prelude::*;

/// Exercise every accessor of a parsed namespace.
fn use_namespace(ns: &IdentifyNamespace) {
    assert!((ns.format_index() as usize) < ns.lba_formats.len());
    let f = ns.lba_format();
    assert!((9..=31).contains(&f.lbads));
    assert_eq!(ns.lba_size(), 1 << ns.lba_shift());
    let _ = ns.metadata_size();
    for f in &ns.lba_formats {
        let _ = f.lba_size();
    }
    let _ = format!("{ns:?}");
}

fn use_controller(c: &IdentifyController) {
    for shift in 0..=80 {
        let _ = c.max_transfer_bytes(shift);
    }
    let _ = (
        c.supports_doorbell_buffer(),
        c.supports_dsm(),
        c.supports_write_zeroes(),
        c.has_volatile_write_cache(),
        c.supports_sgl(),
    );
    let _ = format!("{c:?} {} {} {}", c.model, c.serial, c.firmware);
}

/// A page with random bytes, where the fields that decide validity are
/// steered so that a good share of pages parse.
fn namespace_page() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::vec(any::<u8>(), IDENTIFY_LEN),
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
        any::<bool>(),
    )
        .prop_map(|(mut p, nlbaf, flbas, lbads, steer)| {
            if steer {
                p[25] = nlbaf % 64;
                p[26] = flbas;
                let n = p[25] as usize + 1;
                let idx = if n > 16 {
                    (flbas & 0xF) | ((flbas >> 5) & 3) << 4
                } else {
                    flbas & 0xF
                } as usize;
                if idx < n {
                    // LBADS of the format in use: anything, often valid.
                    p[128 + 4 * idx + 2] = if lbads & 1 == 0 {
                        9 + lbads % 23
                    } else {
                        lbads
                    };
                }
            }
            p
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn identify_namespace_pages(page in namespace_page()) {
        if let Ok(ns) = IdentifyNamespace::parse(&page) {
            use_namespace(&ns);
        }
    }

    #[test]
    fn identify_controller_pages(page in proptest::collection::vec(any::<u8>(), IDENTIFY_LEN)) {
        if let Ok(c) = IdentifyController::parse(&page) {
            use_controller(&c);
        }
    }

    #[test]
    fn identify_any_length_is_a_typed_error(len in 0usize..9000) {
        let page = vec![0xA5u8; len];
        if len != IDENTIFY_LEN {
            prop_assert!(IdentifyNamespace::parse(&page).is_err());
            prop_assert!(IdentifyController::parse(&page).is_err());
        }
    }

    #[test]
    fn any_status_word_decodes(raw in any::<u16>()) {
        let st = NvmeStatus::from_cqe_status(raw);
        let _ = (st.name(), st.is_retryable(), st.is_success(), st.to_string());
        prop_assert_eq!(NvmeStatus::raw_is_success(raw), st.is_success());
    }
}

struct Env {
    _fake: std::sync::Arc<FakeController>,
    ctrl: std::sync::Arc<Controller>,
    qp: QueuePair,
}

fn env() -> &'static Mutex<Env> {
    static E: OnceLock<Mutex<Env>> = OnceLock::new();
    E.get_or_init(|| {
        let (fake, ctrl) = open(config(ExecMode::Sync, 5));
        let qp = ctrl
            .create_qpair(QpairOptions {
                depth: 4,
                ..Default::default()
            })
            .unwrap();
        Mutex::new(Env {
            _fake: fake,
            ctrl,
            qp,
        })
    })
}

/// A transfer above MDTS (128 KiB) is split into children of at most MDTS
/// each; it is too large only when it needs more children than the queue
/// pair (depth 4) has slots.
fn too_large(nlb: u32, shift: u32) -> bool {
    let per_child = (128u64 << 10) >> shift;
    (nlb as u64).div_ceil(per_child) > 4
}

/// What the submission checks must say, from the fake's configuration
/// (ns 1: 64 MiB of 512 B blocks, ns 2: 16 MiB of 4 KiB blocks, MDTS 5 =
/// 128 KiB).
fn model(
    nsid: u32,
    slba: u64,
    nlb: u32,
    len: usize,
    offset: usize,
    write: bool,
    dir: DmaDir,
) -> Result<(), &'static str> {
    let (nsze, shift) = match nsid {
        1 => ((64u64 << 20) >> 9, 9),
        2 => ((16u64 << 20) >> 12, 12),
        _ => return Err("namespace"),
    };
    if nlb == 0 {
        return Err("zero");
    }
    if slba.checked_add(nlb as u64).is_none_or(|e| e > nsze) {
        return Err("range");
    }
    let bytes = (nlb as u64) << shift;
    if too_large(nlb, shift) {
        return Err("too large");
    }
    let ok_dir = if write {
        dir.device_reads()
    } else {
        dir.device_writes()
    };
    if !ok_dir {
        return Err("direction");
    }
    if (len as u64) < bytes {
        return Err("buffer too small");
    }
    if offset % 4 != 0 {
        return Err("misaligned");
    }
    Ok(())
}

fn kind_name(k: &SubmitErrorKind) -> &'static str {
    match k {
        SubmitErrorKind::UnknownNamespace { .. } => "namespace",
        SubmitErrorKind::ZeroLength => "zero",
        SubmitErrorKind::LbaOutOfRange { .. } => "range",
        SubmitErrorKind::TransferTooLarge { .. } => "too large",
        SubmitErrorKind::WrongDirection { .. } => "direction",
        SubmitErrorKind::BufferTooSmall { .. } => "buffer too small",
        SubmitErrorKind::Misaligned { .. } => "misaligned",
        _ => "other",
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn io_arguments_are_validated(
        nsid in prop_oneof![Just(1u32), Just(2), any::<u32>()],
        slba in prop_oneof![0u64..200_000, any::<u64>()],
        nlb in prop_oneof![0u32..300, any::<u32>()],
        len in 1usize..(160 << 10),
        offset in prop_oneof![Just(0usize), 0usize..64],
        write in any::<bool>(),
        dir in prop_oneof![Just(DmaDir::ToDevice), Just(DmaDir::FromDevice), Just(DmaDir::Bidirectional)],
    ) {
        let mut env = env().lock().unwrap_or_else(|p| p.into_inner());
        let env = &mut *env;
        let whole = env.ctrl.alloc_buf(len + offset, dir).unwrap();
        let (_, b) = whole.split_at(offset).unwrap();
        let (iova, blen) = (b.iova(), b.len());
        let want = model(nsid, slba, nlb, blen, offset, write, dir);
        let r = if write {
            env.qp.write(nsid, slba, nlb, b, 1)
        } else {
            env.qp.read(nsid, slba, nlb, b, 1)
        };
        match (r, want) {
            (Ok(()), Ok(())) => {
                let c = wait_n(&mut env.qp, 1).pop().unwrap();
                prop_assert_eq!(c.result, Ok(()));
                prop_assert!(c.buf.is_some());
            }
            (Err(e), Err(w)) => {
                // Several checks may fail at once; the engine reports one.
                let got = kind_name(&e.kind);
                prop_assert!(got != "other", "unexpected {:?}", e.kind);
                prop_assert!(model_fails_with(nsid, slba, nlb, blen, offset, write, dir, got), "model says {}, engine {:?}", w, e.kind);
                let back = e.into_buf();
                prop_assert_eq!((back.iova(), back.len()), (iova, blen), "the buffer is handed back");
            }
            (r, w) => prop_assert!(false, "engine {:?} but model {:?}", r.map_err(|e| e.kind), w),
        }
        prop_assert_eq!(env.qp.outstanding(), 0);
    }
}

/// Whether check `which` is violated by these arguments.
#[allow(clippy::too_many_arguments)]
fn model_fails_with(
    nsid: u32,
    slba: u64,
    nlb: u32,
    len: usize,
    offset: usize,
    write: bool,
    dir: DmaDir,
    which: &str,
) -> bool {
    let (nsze, shift) = match nsid {
        1 => ((64u64 << 20) >> 9, 9),
        2 => ((16u64 << 20) >> 12, 12),
        _ => return which == "namespace",
    };
    let bytes = (nlb as u64) << shift;
    match which {
        "zero" => nlb == 0,
        "range" => slba.checked_add(nlb as u64).is_none_or(|e| e > nsze),
        "too large" => too_large(nlb, shift),
        "direction" => {
            !(if write {
                dir.device_reads()
            } else {
                dir.device_writes()
            })
        }
        "buffer too small" => (len as u64) < bytes,
        "misaligned" => offset % 4 != 0,
        _ => false,
    }
}
