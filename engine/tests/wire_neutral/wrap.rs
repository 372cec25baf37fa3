//! The tracker's generation wrap-around on both transports (issue 27,
//! item 7): one slot reused until its generation wraps, with a stale
//! completion for the previous command in that slot waiting in the CQ
//! every time a new command is in flight, and stale CIDs from other
//! generations injected around the wrap.
//!
//! What the width allows (NVMe): a CID is `slot | generation << slot_bits`
//! in 16 bits, `slot_bits = max(1, ceil(log2 depth))`. A slot's CIDs repeat
//! after `2^(16 - slot_bits)` reuses (32768 at depth 1 or 2; 16 at depth
//! 4096; one fewer for the all-ones slot, which skips CID FFFFh): a stale
//! completion is caught unless it is exactly a multiple of that many reuses
//! of its slot old. UFS: the device echoes no generation (a completion
//! names the slot's command descriptor, the RESPONSE UPIU the slot's task
//! tag), so the tracker's generation cannot catch anything there; what
//! drops a stale SUCCESS entry is the response area cleared before each
//! submission, whatever the count.

use mcqio_fixtures::testing::engine::ufs as ufs_common;

use std::sync::Arc;
use std::time::Duration;

use mcqio::ufs::{UfsController, UfsOptions};
use mcqio::vfio::{Backend, DmaDir};
use mcqio::{Controller, ControllerOptions, IoError, QpairOptions};
use mcqio_fixtures::ufs::{
    HostileUfs, LuConfig, UfsConfig, UfsDeviceLies, UfsFault, UfsRegisterLies,
};
use mcqio_fixtures::{ExecMode, FakeConfig, FakeController, Fault, NamespaceConfig};

/// Reuses of one slot at depth 4 before its CIDs repeat (slot_bits = 2).
/// (Depth 4, not 1: the ring then has room for every duplicate.)
const NVME_PERIOD: u64 = 1 << 14;

#[test]
fn nvme_stale_completions_stay_stale_across_the_generation_wrap() {
    let fake = FakeController::new(FakeConfig {
        namespaces: vec![NamespaceConfig::ram(1 << 20, 4096)],
        io_queue_pairs: 1,
        exec: ExecMode::Sync,
        ..FakeConfig::default()
    })
    .unwrap();
    let ctrl = Controller::new(fake.clone(), ControllerOptions::default()).unwrap();
    let mut qp = ctrl
        .create_qpair(QpairOptions {
            depth: 4,
            io_timeout: None,
            ..QpairOptions::default()
        })
        .unwrap();
    // Every command's completion is posted twice: the copy is still in the
    // CQ when the next command (same slot, next generation) is in flight.
    fake.faults().set_probability(Fault::DuplicateCqe, 1.0);
    let mut buf = Some(ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap());
    let n = NVME_PERIOD + 64;
    let mut lost = 0u64;
    for i in 0..n {
        // Around the wrap, and once far from it, the command's completion
        // carries the CID of another generation of its slot (half a period
        // away, one generation away, or the wrap's neighbour): stale.
        let xor = match i {
            5 => Some(0x8000),
            x if x == NVME_PERIOD - 1 => Some(0x0004),
            x if x == NVME_PERIOD + 1 => Some(0xFFFC),
            _ => None,
        };
        if let Some(x) = xor {
            fake.faults().inject_next(Some(1), None, Fault::CidXor(x));
        }
        qp.read(1, i % 256, 1, buf.take().unwrap(), i).unwrap();
        qp.submit();
        let mut got = None;
        for _ in 0..8 {
            qp.poll(1, |c| {
                assert!(got.is_none(), "command {i}: two completions");
                got = Some(c);
            })
            .unwrap();
            if got.is_some() {
                break;
            }
        }
        match (xor, got) {
            (None, Some(c)) => {
                assert_eq!(c.tag, i, "completion for the wrong command");
                assert!(c.result.is_ok(), "command {i}: {:?}", c.result);
                buf = c.buf;
            }
            (Some(_), None) => {
                // Its only completion named another generation: nothing
                // was delivered. A reset ends it (buffer back: the
                // controller was disabled).
                lost += 1;
                ctrl.reset().unwrap();
                let mut ended = Vec::new();
                qp.poll(8, |c| ended.push(c)).unwrap();
                assert_eq!(ended.len(), 1, "command {i}");
                let c = ended.pop().unwrap();
                assert_eq!((c.tag, c.result), (i, Err(IoError::AbortedByReset)));
                buf = c.buf;
            }
            (None, None) => panic!("command {i} never completed"),
            (Some(x), Some(c)) => panic!(
                "command {i}: a completion with CID ^ {x:#x} was delivered as tag {}",
                c.tag
            ),
        }
    }
    let s = qp.stats();
    // Every duplicate (the last may still wait in the CQ) and every
    // foreign CID is dropped: one per command.
    assert_eq!(lost, 3);
    assert!(
        (n - 1..=n).contains(&s.stale_completions),
        "{} stale of {n} commands ({lost} reset)",
        s.stale_completions
    );
    assert_eq!(qp.outstanding(), 0);
    qp.close(|_| {}).unwrap();
}

#[test]
fn ufs_stale_completions_stay_stale_across_the_generation_wrap() {
    let h = HostileUfs::new(
        UfsConfig {
            lus: vec![LuConfig::Ram { blocks: 256 }],
            ..ufs_common::sync_cfg(true)
        },
        UfsRegisterLies::default(),
        UfsDeviceLies::default(),
    )
    .unwrap();
    let ctrl = UfsController::new(
        Arc::clone(&h) as Arc<dyn Backend>,
        UfsOptions {
            depth: 1,
            ..ufs_common::opts(1)
        },
    )
    .unwrap();
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    // Every command is held by the device for 20 µs, so it is in
    // flight (its response area cleared) when the previous command's entry
    // — same slot, same UCD — is posted again.
    h.fake()
        .faults()
        .set_probability(UfsFault::Delay(Duration::from_micros(20)), 1.0);
    let mut buf = Some(ctrl.alloc_buf(4096, DmaDir::Bidirectional).unwrap());
    // The tracker's generation at depth 1 wraps after 2^15 reuses.
    let n = (1u64 << 15) + 64;
    let mut replayed = 0;
    for i in 0..n {
        qp.read(0, i % 256, 1, buf.take().unwrap(), i).unwrap();
        qp.submit();
        if h.replay_last(0) {
            replayed += 1;
        }
        let mut got = None;
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(1) {
            qp.poll(8, |c| {
                assert!(got.is_none(), "command {i}: two completions");
                got = Some(c);
            })
            .unwrap();
            if got.is_some() {
                break;
            }
            h.poll();
        }
        let c = got.unwrap_or_else(|| panic!("command {i} never completed"));
        assert_eq!(c.tag, i);
        assert!(c.result.is_ok(), "command {i}: {:?}", c.result);
        buf = c.buf;
    }
    // A duplicate posted after the last command's own entry (the device
    // had posted it before the host replayed it: a slow host, e.g. under
    // qemu-user) is still in the queue, and a queue with nothing
    // outstanding does not read its tail: one more command, not replayed,
    // makes the queue read it (stale) before its own completion.
    qp.read(0, 0, 1, buf.take().unwrap(), n).unwrap();
    qp.submit();
    let mut last = None;
    let start = std::time::Instant::now();
    while last.is_none() && start.elapsed() < Duration::from_secs(1) {
        qp.poll(8, |c| {
            assert!(last.is_none(), "the extra command: two completions");
            last = Some(c);
        })
        .unwrap();
        h.poll();
    }
    let c = last.expect("the extra command never completed");
    assert_eq!(c.tag, n);
    assert!(c.result.is_ok(), "the extra command: {:?}", c.result);
    let s = qp.stats();
    // Every command after the first finds the previous one's entry to
    // re-post; the first finds one only where the device already posted its
    // own entry (a slow host, e.g. under qemu-user), and that duplicate is
    // just as stale once the command completed.
    assert!(replayed >= n - 1, "replayed {replayed} of {n}");
    assert_eq!(s.stale_completions, replayed, "{s:?}");
    assert!(h.fake().iommu().faults().is_empty());
    qp.close(|_| {}).unwrap();
}
