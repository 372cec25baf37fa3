//! Property test of PRP construction: random buffer layouts (single and
//! vectored, unaligned first segment, any size up to 1 MiB) written through
//! the engine and read back contiguously must round-trip, and the fake's
//! IOMMU must see no fault (every PRP entry points into the buffer).

mod common;

use std::sync::Arc;

use common::*;
use mcqio::{Controller, DmaBuf, QpairOptions, QueuePair};
use mcqio_fixtures::{ExecMode, FakeController};
use proptest::prelude::*;

struct Env {
    fake: Arc<FakeController>,
    ctrl: Arc<Controller>,
}

fn env() -> &'static std::sync::Mutex<Env> {
    static ENV: std::sync::OnceLock<std::sync::Mutex<Env>> = std::sync::OnceLock::new();
    ENV.get_or_init(|| {
        let (fake, ctrl) = open(config(ExecMode::Sync, 0));
        std::sync::Mutex::new(Env { fake, ctrl })
    })
}

/// Segment layout: (first offset in dwords, first length in blocks, middle
/// segment page counts, last segment blocks).
fn layout() -> impl Strategy<Value = (usize, usize, Vec<usize>, usize)> {
    (
        0usize..1024,
        1usize..16,
        proptest::collection::vec(1usize..48, 0..5),
        0usize..40,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn vectored_layouts_roundtrip((off_dw, first_blocks, middle, last_blocks) in layout(), lba in 0u64..100_000, seed in any::<u64>()) {
        let env = env().lock().unwrap();
        let ctrl = &env.ctrl;
        let mut qp: QueuePair<Vec<DmaBuf>> = ctrl.create_qpair_for(QpairOptions { depth: 2, ..Default::default() }).unwrap();
        let mut r = rng(seed);
        // First segment: starts `off` bytes into a page, runs to a page
        // boundary if more segments follow.
        let off = off_dw * 4;
        let mut segs = Vec::new();
        let first_len = if middle.is_empty() && last_blocks == 0 {
            first_blocks * 512
        } else {
            // End on a page boundary: whole pages minus the offset.
            first_blocks.div_ceil(8) * 4096 - off
        };
        let (_, first) = buf(ctrl, off + first_len).split_at(off).unwrap();
        let (first, _) = first.split_at(first_len).unwrap();
        segs.push(first);
        for pages in &middle {
            segs.push(buf(ctrl, pages * 4096));
        }
        if last_blocks > 0 {
            segs.push(buf(ctrl, last_blocks * 512));
        }
        let total: usize = segs.iter().map(|s| s.len()).sum();
        let blocks = total / 512;
        prop_assume!(blocks > 0 && total <= 2 << 20);
        let bytes = blocks * 512;
        let data = random_bytes(&mut r, bytes);
        let mut at = 0;
        for s in &mut segs {
            let n = s.len().min(bytes - at);
            s.write_at(0, &data[at..at + n]).unwrap();
            at += n;
        }
        qp.write(1, lba, blocks as u32, segs, 1).unwrap();
        let c = wait_n(&mut qp, 1).pop().unwrap();
        prop_assert!(c.result.is_ok(), "{:?}", c.result);
        // Read back as one contiguous buffer with the engine, and check the
        // fake's own view too.
        let rd = buf(ctrl, bytes);
        let mut qp1 = ctrl.create_qpair(QpairOptions { depth: 2, ..Default::default() }).unwrap();
        qp1.read(1, lba, blocks as u32, rd, 2).unwrap();
        let c = wait_n(&mut qp1, 1).pop().unwrap();
        prop_assert!(c.result.is_ok());
        prop_assert!(c.buf.unwrap().to_vec() == data);
        prop_assert!(env.fake.namespace_bytes(1, lba * 512, bytes) == data);
        prop_assert_eq!(env.fake.iommu().fault_count(), 0);
    }
}
