//! Property test of PRP construction: random buffer layouts (single and
//! vectored, unaligned first segment, empty segments anywhere, any size up
//! to 2 MiB) written through the engine and read back must round-trip, and
//! the device must touch exactly the submitted bytes: every PRP entry points
//! into the buffer (the fake's IOMMU sees no fault), and the memory around
//! each segment — guard bytes after it, and the buffers empty segments were
//! cut from — is never written by a read.
//!
//! Run twice: with no transfer limit (one command per transfer) and with a
//! small MDTS, where the queue splits each transfer into child commands.

use mcqio_fixtures::testing::engine::nvme as common;

use std::sync::Arc;

use common::*;
use mcqio::{Controller, DmaBuf, QpairOptions, QueuePair};
use mcqio_fixtures::{ExecMode, FakeController};
use proptest::prelude::*;

struct Env {
    fake: Arc<FakeController>,
    ctrl: Arc<Controller>,
}

/// `mdts` 0: no limit; 3: 32 KiB per command (most layouts are split).
fn env(mdts: u8) -> &'static std::sync::Mutex<Env> {
    static UNLIMITED: std::sync::OnceLock<std::sync::Mutex<Env>> = std::sync::OnceLock::new();
    static SMALL: std::sync::OnceLock<std::sync::Mutex<Env>> = std::sync::OnceLock::new();
    let cell = if mdts == 0 { &UNLIMITED } else { &SMALL };
    cell.get_or_init(|| {
        let (fake, ctrl) = open(config(ExecMode::Sync, mdts));
        std::sync::Mutex::new(Env { fake, ctrl })
    })
}

const GUARD: u8 = 0x5A;
const CANARY: u8 = 0xA5;

fn filled(ctrl: &Controller, len: usize, byte: u8) -> DmaBuf {
    let mut b = buf(ctrl, len);
    b.fill(byte);
    b
}

/// A segment of `len` bytes followed by a guard buffer the device must never
/// write: cut from one region so the guard is the IOVA right after it.
fn guarded(ctrl: &Controller, len: usize) -> (DmaBuf, DmaBuf) {
    filled(ctrl, len + 4096, GUARD).split_at(len).unwrap()
}

/// An empty segment cut from a canary buffer: at its start (`split_at(0)`)
/// or at its end (`split_at(len)`, the IOVA of whatever follows it).
fn empty_segment(ctrl: &Controller, at_end: bool) -> (DmaBuf, DmaBuf) {
    let c = filled(ctrl, 8192, CANARY);
    if at_end {
        let (c, e) = c.split_at(8192).unwrap();
        (e, c)
    } else {
        c.split_at(0).unwrap()
    }
}

/// What a test keeps to check after the I/O: the guards and canaries.
struct Witnesses(Vec<(DmaBuf, u8)>);

impl Witnesses {
    fn untouched(&self) -> bool {
        self.0
            .iter()
            .all(|(b, byte)| b.to_vec().iter().all(|x| x == byte))
    }
}

/// Build a layout: the first segment `off` bytes into a page, then
/// `middle` whole pages per segment, then `last_blocks` 512-byte blocks;
/// empty segments inserted before the segment indices in `empties` (an
/// index equal to the segment count puts it at the end). Returns the
/// segments, the witnesses, and the transfer size in bytes.
fn layout_bufs(
    ctrl: &Controller,
    off: usize,
    first_blocks: usize,
    middle: &[usize],
    last_blocks: usize,
    empties: &[(usize, bool)],
) -> (Vec<DmaBuf>, Witnesses, usize) {
    let mut w = Vec::new();
    let mut real = Vec::new();
    let first_len = if middle.is_empty() && last_blocks == 0 {
        first_blocks * 512
    } else {
        // End on a page boundary: whole pages minus the offset.
        first_blocks.div_ceil(8) * 4096 - off
    };
    let (head, first) = filled(ctrl, off + first_len + 4096, GUARD)
        .split_at(off)
        .unwrap();
    let (first, tail) = first.split_at(first_len).unwrap();
    w.push((head, GUARD));
    w.push((tail, GUARD));
    real.push(first);
    for pages in middle {
        let (s, g) = guarded(ctrl, pages * 4096);
        real.push(s);
        w.push((g, GUARD));
    }
    if last_blocks > 0 {
        let (s, g) = guarded(ctrl, last_blocks * 512);
        real.push(s);
        w.push((g, GUARD));
    }
    let total: usize = real.iter().map(|s| s.len()).sum();
    let bytes = total / 512 * 512;
    let mut segs = Vec::new();
    let n = real.len();
    for (i, s) in real.into_iter().enumerate() {
        for &(at, end) in empties {
            if at.min(n) == i {
                let (e, c) = empty_segment(ctrl, end);
                segs.push(e);
                w.push((c, CANARY));
            }
        }
        segs.push(s);
    }
    for &(at, end) in empties {
        if at >= n {
            let (e, c) = empty_segment(ctrl, end);
            segs.push(e);
            w.push((c, CANARY));
        }
    }
    (segs, Witnesses(w), bytes)
}

fn fill_segs(segs: &mut [DmaBuf], data: &[u8]) {
    let mut at = 0;
    for s in segs {
        let n = s.len().min(data.len() - at);
        s.write_at(0, &data[at..at + n]).unwrap();
        at += n;
    }
}

fn gather(segs: &[DmaBuf], bytes: usize) -> Vec<u8> {
    let mut out: Vec<u8> = segs.iter().flat_map(|s| s.to_vec()).collect();
    out.truncate(bytes);
    out
}

fn qpair(ctrl: &Arc<Controller>) -> QueuePair<Vec<DmaBuf>> {
    ctrl.create_qpair_for(QpairOptions {
        depth: 128,
        ..Default::default()
    })
    .unwrap()
}

/// Issue 12 item 1: an empty segment — first, in the middle or last, at the
/// start of a canary buffer or at its end — never becomes a PRP entry: a
/// read fills exactly the real segments, a write sends exactly their bytes.
#[test]
fn empty_segments_are_never_dma_targets() {
    for mdts in [0, 3] {
        let env = env(mdts).lock().unwrap_or_else(|p| p.into_inner());
        let ctrl = &env.ctrl;
        let mut qp = qpair(ctrl);
        let mut r = rng(7);
        for at in 0..=2 {
            for at_end in [false, true] {
                let ctx = format!("mdts {mdts}, empty segment before {at}, at end {at_end}");
                // Two page-aligned 8 KiB segments: nothing else to reject.
                let (mut segs, wit, bytes) = layout_bufs(ctrl, 0, 16, &[], 16, &[(at, at_end)]);
                assert_eq!(bytes, 16384, "{ctx}");
                let data = random_bytes(&mut r, bytes);
                fill_segs(&mut segs, &data);
                qp.write(1, 64, 32, segs, 1).unwrap();
                let c = wait_n(&mut qp, 1).pop().unwrap();
                assert_eq!(c.result, Ok(()), "{ctx}");
                assert!(
                    env.fake.namespace_bytes(1, 64 * 512, bytes) == data,
                    "write sent other bytes: {ctx}"
                );
                let mut segs = c.buf.unwrap();
                fill_segs(&mut segs, &vec![0; bytes]);
                qp.read(1, 64, 32, segs, 2).unwrap();
                let c = wait_n(&mut qp, 1).pop().unwrap();
                assert_eq!(c.result, Ok(()), "{ctx}");
                assert!(gather(&c.buf.unwrap(), bytes) == data, "read: {ctx}");
                assert!(
                    wit.untouched(),
                    "the device wrote outside the buffer: {ctx}"
                );
                assert_eq!(env.fake.iommu().fault_count(), 0, "{ctx}");
            }
        }
    }
}

/// Segment layout: (first offset in dwords, first length in blocks, middle
/// segment page counts, last segment blocks, empty segments (position, at
/// a canary's end)).
#[allow(clippy::type_complexity)]
fn layout() -> impl Strategy<Value = (usize, usize, Vec<usize>, usize, Vec<(usize, bool)>)> {
    (
        0usize..1024,
        1usize..16,
        proptest::collection::vec(1usize..48, 0..5),
        0usize..40,
        proptest::collection::vec((0usize..8, any::<bool>()), 0..3),
    )
}

fn roundtrip(
    mdts: u8,
    (off_dw, first_blocks, middle, last_blocks, empties): (
        usize,
        usize,
        Vec<usize>,
        usize,
        Vec<(usize, bool)>,
    ),
    lba: u64,
    seed: u64,
) -> Result<(), TestCaseError> {
    let env = env(mdts).lock().unwrap_or_else(|p| p.into_inner());
    let ctrl = &env.ctrl;
    let mut qp = qpair(ctrl);
    let mut r = rng(seed);
    let (mut segs, wit, bytes) = layout_bufs(
        ctrl,
        off_dw * 4,
        first_blocks,
        &middle,
        last_blocks,
        &empties,
    );
    let blocks = bytes / 512;
    prop_assume!(blocks > 0 && bytes <= 2 << 20);
    let data = random_bytes(&mut r, bytes);
    fill_segs(&mut segs, &data);
    qp.write(1, lba, blocks as u32, segs, 1).unwrap();
    let c = wait_n(&mut qp, 1).pop().unwrap();
    prop_assert!(c.result.is_ok(), "{:?}", c.result);
    prop_assert!(env.fake.namespace_bytes(1, lba * 512, bytes) == data);
    // Read back into the same layout (zeroed first), and as one contiguous
    // buffer.
    let mut segs = c.buf.unwrap();
    fill_segs(&mut segs, &vec![0; bytes]);
    qp.read(1, lba, blocks as u32, segs, 2).unwrap();
    let c = wait_n(&mut qp, 1).pop().unwrap();
    prop_assert!(c.result.is_ok(), "{:?}", c.result);
    prop_assert!(gather(&c.buf.unwrap(), bytes) == data);
    prop_assert!(wit.untouched(), "the device wrote outside the buffer");
    let rd = buf(ctrl, bytes);
    let mut qp1 = ctrl
        .create_qpair(QpairOptions {
            depth: 128,
            ..Default::default()
        })
        .unwrap();
    qp1.read(1, lba, blocks as u32, rd, 3).unwrap();
    let c = wait_n(&mut qp1, 1).pop().unwrap();
    prop_assert!(c.result.is_ok());
    prop_assert!(c.buf.unwrap().to_vec() == data);
    prop_assert_eq!(env.fake.iommu().fault_count(), 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn vectored_layouts_roundtrip(l in layout(), lba in 0u64..100_000, seed in any::<u64>()) {
        roundtrip(0, l, lba, seed)?;
    }

    /// The same layouts with 32 KiB per command: split into children.
    #[test]
    fn vectored_layouts_roundtrip_split(l in layout(), lba in 0u64..100_000, seed in any::<u64>()) {
        roundtrip(3, l, lba, seed)?;
    }
}
