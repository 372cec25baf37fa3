//! The server's request mapping and per-tag state machine, on the
//! engine's fakes (`fake`, `fake-ufs`, and the fake NVMe/TCP target on
//! loopback) with the kernel's side of the ublk
//! queue played by [`FakeQueue`], which panics on any protocol breach
//! (an answer to a request never made, a second answer, a FETCH twice,
//! a READ answered with the wrong number of bytes).

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use mcqio::{QpairOptions, QueuePair};
use mcqio_fixtures::{FakeController, Fault};
use mcqio_open::{Device, DeviceSpec, Fake, Opened};
use mcqio_ublk::device::{caps_of, params_of, unit};
use mcqio_ublk::fake::{Answer, FakeQueue};
use mcqio_ublk::null::NullTarget;
use mcqio_ublk::server::{map_request, Idle, Request, Server};
use mcqio_ublk::sys::{self, IoDesc};
use mcqio_ublk::target::{Caps, Target};
use rand::{Rng, SeedableRng};

fn open(spec: &str) -> Opened {
    spec.parse::<DeviceSpec>()
        .unwrap()
        .open("mcqio-ublk test")
        .unwrap()
}

fn nvme_ctrl(o: &Opened) -> std::sync::Arc<mcqio::Controller> {
    match &o.device {
        Device::Nvme(c) => c.clone(),
        Device::Ufs(_) | Device::Tcp(_) => panic!("not NVMe over PCIe"),
    }
}

fn fake_nvme(o: &Opened) -> std::sync::Arc<FakeController> {
    match &o.fake {
        Some(Fake::Nvme(f)) => f.clone(),
        _ => panic!("not the NVMe fake"),
    }
}

fn caps(o: &Opened, max_io: u64) -> Caps {
    let u = unit(&o.device, None).unwrap();
    caps_of(&o.device, &u, max_io)
}

fn desc(op: u8, sector: u64, sectors: u32) -> IoDesc {
    IoDesc {
        op_flags: u32::from(op),
        nr_sectors: sectors,
        start_sector: sector,
        addr: 0,
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = rand::rngs::SmallRng::seed_from_u64(seed);
    (0..len).map(|_| r.gen()).collect()
}

/// Step until the fake has no request in flight; panics if that takes
/// unreasonably many passes (a request was lost).
fn settle<T: Target>(s: &mut Server<'_, FakeQueue, T>) {
    for _ in 0..2_000_000 {
        s.step().unwrap();
        if s.queue().in_flight() == 0 && s.outstanding() == 0 {
            return;
        }
        std::thread::yield_now();
    }
    panic!(
        "requests never answered: {} in flight at the fake, {} in the engine, {:?}",
        s.queue().in_flight(),
        s.outstanding(),
        s.stats()
    );
}

/// Hand `reqs` to ready tags (one each), settle, and return the answers
/// in the order of `reqs`.
fn exchange<T: Target>(
    s: &mut Server<'_, FakeQueue, T>,
    reqs: Vec<(IoDesc, Option<Vec<u8>>)>,
) -> Vec<Answer> {
    let ready = s.queue().ready_tags();
    assert!(reqs.len() <= ready.len(), "more requests than ready tags");
    let tags: Vec<u16> = ready[..reqs.len()].to_vec();
    for (tag, (d, data)) in tags.iter().zip(reqs) {
        s.queue_mut().request(*tag, d, data);
    }
    settle(s);
    let mut got = s.queue_mut().take_answers();
    assert_eq!(got.len(), tags.len(), "one answer per request");
    let mut out = Vec::new();
    for t in tags {
        let i = got
            .iter()
            .position(|a| a.tag == t)
            .expect("every tag answered");
        out.push(got.swap_remove(i));
    }
    out
}

fn shut_down<T: Target>(mut s: Server<'_, FakeQueue, T>) {
    s.queue_mut().abort();
    let stop = AtomicBool::new(false);
    s.run(&stop).unwrap();
    assert_eq!(s.live_tags(), 0);
    let (q, stats) = s.finish();
    assert!(q.all_gone());
    assert_eq!(stats.protocol_errors, 0, "{stats:?}");
    assert_eq!(stats.requests, stats.commits, "{stats:?}");
}

fn roundtrip<T: Target>(s: &mut Server<'_, FakeQueue, T>, caps: &Caps) {
    let bs = 1u32 << caps.block_shift;
    let spb = bs / 512; // sectors per block
                        // Writes of 1 block, 3 blocks, and the largest request, then read back.
    let sizes = [spb, 3 * spb, caps.max_io / 512];
    let mut at = 0u64;
    let mut writes = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let data = pattern(i as u64 + 1, n as usize * 512);
        writes.push((desc(sys::IO_OP_WRITE, at, n), Some(data)));
        at += u64::from(n) + u64::from(spb) * 7;
    }
    let answers = exchange(s, writes.clone());
    for (a, (d, _)) in answers.iter().zip(&writes) {
        assert_eq!(a.result, (d.nr_sectors * 512) as i32, "{a:?}");
    }
    let reads = writes
        .iter()
        .map(|(d, _)| (desc(sys::IO_OP_READ, d.start_sector, d.nr_sectors), None))
        .collect();
    let answers = exchange(s, reads);
    for (a, (_, data)) in answers.iter().zip(&writes) {
        assert_eq!(a.data.as_ref(), data.as_ref(), "read back what was written");
    }
}

fn nvme_qp(o: &Opened, depth: u16, timeout: Option<Duration>) -> QueuePair<mcqio::DmaBuf> {
    nvme_ctrl(o)
        .create_qpair(QpairOptions {
            depth,
            io_timeout: timeout,
            ..QpairOptions::default()
        })
        .unwrap()
}

#[test]
fn nvme_write_read_roundtrip() {
    let o = open("fake,sync=1,size=16m");
    let c = caps(&o, 128 << 10);
    assert_eq!(c.max_io, 128 << 10);
    let mut qp = nvme_qp(&o, 64, None);
    let mut s = Server::new(
        FakeQueue::new(0, 8),
        &mut qp,
        1u32,
        c,
        o.device.dma().clone(),
    )
    .unwrap();
    s.start().unwrap();
    assert_eq!(s.queue().ready_tags().len(), 8);
    roundtrip(&mut s, &c);
    shut_down(s);
}

#[test]
fn nvme_4k_blocks_and_a_device_thread() {
    let o = open("fake,lbs=4k,size=16m");
    let c = caps(&o, 64 << 10);
    assert_eq!(c.block_shift, 12);
    let mut qp = nvme_qp(&o, 64, None);
    let mut s = Server::new(
        FakeQueue::new(0, 8),
        &mut qp,
        1u32,
        c,
        o.device.dma().clone(),
    )
    .unwrap();
    s.start().unwrap();
    roundtrip(&mut s, &c);
    // Not whole 4 KiB blocks: refused before the engine sees it.
    let a = exchange(&mut s, vec![(desc(sys::IO_OP_READ, 1, 8), None)]);
    assert_eq!(a[0].result, -libc::EINVAL);
    let a = exchange(&mut s, vec![(desc(sys::IO_OP_READ, 8, 4), None)]);
    assert_eq!(a[0].result, -libc::EINVAL);
    shut_down(s);
}

#[test]
fn ufs_write_read_roundtrip() {
    let o = open("fake-ufs,sync=1,size=16m");
    let c = caps(&o, 256 << 10);
    assert!(!c.fua && c.volatile_cache && c.discard && c.write_zeroes_blocks == 0);
    let Device::Ufs(ctrl) = &o.device else {
        panic!("not UFS")
    };
    let mut qp = ctrl.create_qpair(Default::default()).unwrap();
    let mut s = Server::new(
        FakeQueue::new(0, 8),
        &mut qp,
        0u8,
        c,
        o.device.dma().clone(),
    )
    .unwrap();
    s.start().unwrap();
    roundtrip(&mut s, &c);
    // Flush (SYNCHRONIZE CACHE) and discard (UNMAP) go through; write
    // zeroes is not offered, so it is refused.
    let a = exchange(
        &mut s,
        vec![
            (desc(sys::IO_OP_FLUSH, 0, 0), None),
            (desc(sys::IO_OP_DISCARD, 64, 64), None),
            (desc(sys::IO_OP_WRITE_ZEROES, 0, 8), None),
        ],
    );
    assert_eq!(a[0].result, 0);
    assert_eq!(a[1].result, 0);
    assert_eq!(a[2].result, -libc::EOPNOTSUPP);
    shut_down(s);
}

#[test]
fn nvme_flush_discard_write_zeroes_fua() {
    let o = open("fake,sync=1,size=16m");
    let c = caps(&o, 128 << 10);
    assert!(c.volatile_cache && c.fua && c.discard && c.write_zeroes_blocks > 0);
    let mut qp = nvme_qp(&o, 64, None);
    let mut s = Server::new(
        FakeQueue::new(0, 8),
        &mut qp,
        1u32,
        c,
        o.device.dma().clone(),
    )
    .unwrap();
    s.start().unwrap();
    let data = pattern(9, 64 * 512);
    let mut fua_write = desc(sys::IO_OP_WRITE, 1000, 64);
    fua_write.op_flags |= sys::IO_F_FUA;
    let a = exchange(&mut s, vec![(fua_write, Some(data.clone()))]);
    assert_eq!(a[0].result, 64 * 512);
    let a = exchange(&mut s, vec![(desc(sys::IO_OP_READ, 1000, 64), None)]);
    assert_eq!(a[0].data.as_deref(), Some(&data[..]));
    // Zero the middle 16 sectors, flush, read the whole range.
    let a = exchange(
        &mut s,
        vec![
            (desc(sys::IO_OP_WRITE_ZEROES, 1016, 16), None),
            (desc(sys::IO_OP_FLUSH, 0, 0), None),
        ],
    );
    assert_eq!((a[0].result, a[1].result), (0, 0));
    let a = exchange(&mut s, vec![(desc(sys::IO_OP_READ, 1000, 64), None)]);
    let got = a[0].data.clone().unwrap();
    let mut want = data.clone();
    want[16 * 512..32 * 512].fill(0);
    assert_eq!(got, want);
    let a = exchange(&mut s, vec![(desc(sys::IO_OP_DISCARD, 1000, 64), None)]);
    assert_eq!(a[0].result, 0);
    shut_down(s);
}

#[test]
fn nvme_discard_reads_zeroes_where_the_namespace_promises_it() {
    let o = open("fake,sync=1,size=16m");
    // The fake's namespace reports DLFEAT 0x09: deallocated blocks read 0.
    let ctrl = nvme_ctrl(&o);
    assert_eq!(mcqio_ublk::device::nvme_dlfeat(&ctrl, 1), Some(0x09));
    let c = caps(&o, 128 << 10);
    assert!(c.discard && c.discard_zeroes);
    let mut qp = nvme_qp(&o, 64, None);
    let mut s = Server::new(
        FakeQueue::new(0, 8),
        &mut qp,
        1u32,
        c,
        o.device.dma().clone(),
    )
    .unwrap();
    s.start().unwrap();
    let data = pattern(11, 64 * 512);
    let a = exchange(
        &mut s,
        vec![(desc(sys::IO_OP_WRITE, 2000, 64), Some(data.clone()))],
    );
    assert_eq!(a[0].result, 64 * 512);
    // Discard 3 blocks in the middle; the rest keeps the pattern.
    let a = exchange(&mut s, vec![(desc(sys::IO_OP_DISCARD, 2016, 24), None)]);
    assert_eq!(a[0].result, 0);
    let a = exchange(&mut s, vec![(desc(sys::IO_OP_READ, 2000, 64), None)]);
    let mut want = data;
    want[16 * 512..40 * 512].fill(0);
    assert_eq!(a[0].data.as_deref(), Some(&want[..]));
    shut_down(s);
}

#[test]
fn ufs_discard_promises_nothing() {
    // The engine does not report UFS's LBPRZ: the server must not claim
    // that unmapped blocks read as zeroes.
    let o = open("fake-ufs,sync=1,size=16m");
    let c = caps(&o, 128 << 10);
    assert!(c.discard && !c.discard_zeroes);
}

#[test]
fn bad_requests_get_their_errno() {
    let o = open("fake,sync=1,size=1m");
    let c = caps(&o, 64 << 10);
    let sectors = c.blocks;
    let mut qp = nvme_qp(&o, 64, None);
    let mut s = Server::new(
        FakeQueue::new(0, 8),
        &mut qp,
        1u32,
        c,
        o.device.dma().clone(),
    )
    .unwrap();
    s.start().unwrap();
    let a = exchange(
        &mut s,
        vec![
            (desc(sys::IO_OP_WRITE_SAME, 0, 8), None),
            (desc(77, 0, 8), None),
            (desc(sys::IO_OP_READ, sectors - 4, 8), None), // past the end
            (desc(sys::IO_OP_READ, 0, (c.max_io / 512) + 1), None), // longer than the buffer
            (desc(sys::IO_OP_READ, 0, 0), None),
        ],
    );
    let r: Vec<i32> = a.iter().map(|a| a.result).collect();
    assert_eq!(
        r,
        vec![
            -libc::EOPNOTSUPP,
            -libc::EOPNOTSUPP,
            -libc::EIO,
            -libc::EINVAL,
            -libc::EINVAL
        ]
    );
    assert_eq!(s.stats().errors, 5);
    // The tags still serve afterwards.
    roundtrip(&mut s, &c);
    shut_down(s);
}

#[test]
fn device_errors_map_to_block_errnos() {
    let o = open("fake,sync=1,size=4m");
    let f = fake_nvme(&o);
    let c = caps(&o, 64 << 10);
    let mut qp = nvme_qp(&o, 64, None);
    let mut s = Server::new(
        FakeQueue::new(0, 4),
        &mut qp,
        1u32,
        c,
        o.device.dma().clone(),
    )
    .unwrap();
    s.start().unwrap();
    let cases = [
        (2u8, 0x81u8, -libc::ENODATA), // unrecovered read error
        (0, 0x04, -libc::EIO),         // data transfer error
        (0, 0x81, -libc::ENOSPC),      // capacity exceeded
        (2, 0x82, -libc::EILSEQ),      // guard check
    ];
    for (sct, sc, want) in cases {
        f.faults()
            .inject_next(Some(1), None, Fault::Status { sct, sc, dnr: true });
        let a = exchange(&mut s, vec![(desc(sys::IO_OP_READ, 0, 8), None)]);
        assert_eq!(a[0].result, want, "status {sct:#x}/{sc:#x}");
        assert!(a[0].data.is_none(), "no data handed out for a failed read");
    }
    shut_down(s);
}

#[test]
fn a_lost_completion_is_retried_after_the_engine_aborts_it() {
    let o = open("fake,sync=1,size=4m");
    let f = fake_nvme(&o);
    let c = caps(&o, 64 << 10);
    let mut qp = nvme_qp(&o, 64, Some(Duration::from_millis(20)));
    let mut s = Server::new(
        FakeQueue::new(0, 4),
        &mut qp,
        1u32,
        c,
        o.device.dma().clone(),
    )
    .unwrap();
    s.start().unwrap();
    let data = pattern(3, 8 * 512);
    let a = exchange(
        &mut s,
        vec![(desc(sys::IO_OP_WRITE, 64, 8), Some(data.clone()))],
    );
    assert_eq!(a[0].result, 8 * 512);
    f.faults().inject_next(Some(1), None, Fault::DropCompletion);
    let a = exchange(&mut s, vec![(desc(sys::IO_OP_READ, 64, 8), None)]);
    assert_eq!(a[0].result, 8 * 512, "answered once, after the retry");
    assert_eq!(a[0].data.as_deref(), Some(&data[..]));
    assert!(s.stats().retries >= 1, "{:?}", s.stats());
    shut_down(s);
}

/// More tags than the engine's queue has room for: the rest wait and are
/// sent as completions free slots; each is answered once.
#[test]
fn a_full_engine_queue_makes_requests_wait_not_fail() {
    let o = open("fake,size=8m");
    let c = caps(&o, 16 << 10);
    let mut qp = nvme_qp(&o, 4, None);
    let mut s = Server::new(
        FakeQueue::new(0, 32),
        &mut qp,
        1u32,
        c,
        o.device.dma().clone(),
    )
    .unwrap();
    s.start().unwrap();
    let writes: Vec<_> = (0..32u64)
        .map(|i| {
            (
                desc(sys::IO_OP_WRITE, i * 32, 32),
                Some(pattern(i, 32 * 512)),
            )
        })
        .collect();
    let a = exchange(&mut s, writes.clone());
    assert!(a.iter().all(|a| a.result == 32 * 512));
    assert!(s.stats().queue_full > 0, "{:?}", s.stats());
    let reads = (0..32u64)
        .map(|i| (desc(sys::IO_OP_READ, i * 32, 32), None))
        .collect();
    let a = exchange(&mut s, reads);
    for (a, (_, d)) in a.iter().zip(&writes) {
        assert_eq!(a.data.as_ref(), d.as_ref());
    }
    shut_down(s);
}

/// Passes of the random stream (fewer in unoptimised builds).
const PASSES: usize = if cfg!(debug_assertions) { 400 } else { 3000 };

/// A seeded random stream over every tag, with the engine's device
/// thread running; each tag owns a region, so the last write there is what
/// its reads must return. Stopped with requests in flight: every request
/// is answered exactly once (the fake checks) and every tag ends aborted.
#[test]
fn exactly_once_under_a_random_stream_and_a_stop_in_flight() {
    random_stream(&["fake,size=32m,sync=1", "fake-ufs,size=32m,sync=1"]);
}

/// The same with the fakes' device threads: completions arrive
/// concurrently with new requests and the stop.
#[test]
fn exactly_once_with_device_threads() {
    random_stream(&["fake,size=32m", "fake-ufs,size=32m"]);
}

fn random_stream(specs: &[&str]) {
    for &spec in specs {
        let o = open(spec);
        let c = caps(&o, 32 << 10);
        let spb = (1u64 << c.block_shift) / 512;
        let depth = 16u16;
        let region = 256 * spb; // sectors per tag
        let mut rng = rand::rngs::SmallRng::seed_from_u64(25);
        // What each sector holds, if known (discards make it unknown).
        let total = usize::from(depth) * region as usize;
        let mut model: Vec<Option<Vec<u8>>> = vec![None; total];
        let mut handed = 0u64;
        let mut answered = 0u64;
        let check = |answers: Vec<Answer>, model: &Vec<Option<Vec<u8>>>| -> u64 {
            for a in &answers {
                let d = a.desc;
                match d.op() {
                    sys::IO_OP_READ => {
                        assert_eq!(a.result, (d.nr_sectors * 512) as i32, "{spec}: {a:?}");
                        let data = a.data.as_ref().expect("a READ hands out data");
                        for i in 0..d.nr_sectors as usize {
                            if let Some(want) = &model[d.start_sector as usize + i] {
                                assert_eq!(
                                    &data[i * 512..(i + 1) * 512],
                                    &want[..],
                                    "{spec}: tag {} sector {}",
                                    a.tag,
                                    d.start_sector as usize + i
                                );
                            }
                        }
                    }
                    sys::IO_OP_WRITE => assert_eq!(a.result, (d.nr_sectors * 512) as i32),
                    _ => assert_eq!(a.result, 0, "{spec}: {a:?}"),
                }
            }
            answers.len() as u64
        };
        macro_rules! body {
            ($qp:expr, $at:expr) => {{
                let mut s = Server::new(
                    FakeQueue::new(0, depth),
                    $qp,
                    $at,
                    c,
                    o.device.dma().clone(),
                )
                .unwrap();
                s.start().unwrap();
                for pass in 0..PASSES {
                    let _ = pass;
                    for tag in s.queue().ready_tags() {
                        if !rng.gen_bool(0.5) {
                            continue;
                        }
                        let base = u64::from(tag) * region;
                        let n = spb * rng.gen_range(1..=(c.max_io as u64 / 512 / spb));
                        let at = base + spb * rng.gen_range(0..(region - n) / spb);
                        let (d, data) = match rng.gen_range(0..10) {
                            0..=3 => {
                                let data = pattern(rng.gen(), n as usize * 512);
                                for (i, sec) in data.chunks(512).enumerate() {
                                    model[at as usize + i] = Some(sec.to_vec());
                                }
                                (desc(sys::IO_OP_WRITE, at, n as u32), Some(data))
                            }
                            4..=7 => (desc(sys::IO_OP_READ, at, n as u32), None),
                            8 => (desc(sys::IO_OP_FLUSH, 0, 0), None),
                            _ => {
                                // A discard forgets what the model knew there.
                                for m in &mut model[at as usize..(at + n) as usize] {
                                    *m = None;
                                }
                                (desc(sys::IO_OP_DISCARD, at, n as u32), None)
                            }
                        };
                        s.queue_mut().request(tag, d, data);
                        handed += 1;
                    }
                    s.step().unwrap();
                    // With a device thread, wait (bounded) until a tag is
                    // free again rather than spinning through the passes.
                    let t0 = std::time::Instant::now();
                    while s.queue().ready_tags().is_empty() {
                        s.step().unwrap();
                        std::thread::yield_now();
                        assert!(
                            t0.elapsed() < Duration::from_secs(20),
                            "{spec}: stuck: {}",
                            s.describe()
                        );
                    }
                    let a = s.queue_mut().take_answers();
                    answered += check(a, &model);
                }
                // Stop with requests in flight: hand every ready tag one
                // more, then abort before the engine could answer them.
                for tag in s.queue().ready_tags() {
                    let at = u64::from(tag) * region;
                    s.queue_mut()
                        .request(tag, desc(sys::IO_OP_READ, at, spb as u32), None);
                    handed += 1;
                }
                assert!(s.queue().in_flight() > 0);
                s.queue_mut().abort();
                let stop = AtomicBool::new(false);
                s.run(&stop).unwrap();
                let a = s.queue_mut().take_answers();
                answered += check(a, &model);
                let stats = s.stats();
                let (q, _) = s.finish();
                assert!(q.all_gone(), "{spec}");
                assert_eq!(handed, answered, "{spec}: every request answered once");
                assert_eq!(stats.requests, handed, "{spec}");
                assert_eq!(stats.commits, handed, "{spec}");
                assert_eq!(stats.protocol_errors, 0, "{spec}");
                assert_eq!(stats.errors, 0, "{spec}");
                assert!(handed > PASSES as u64 / 2, "{spec}: only {handed} requests");
            }};
        }
        match &o.device {
            Device::Nvme(_) => {
                let mut qp = nvme_qp(&o, 64, None);
                body!(&mut qp, 1u32)
            }
            Device::Ufs(ctrl) => {
                let mut qp = ctrl.create_qpair(Default::default()).unwrap();
                body!(&mut qp, 0u8)
            }
            Device::Tcp(_) => unreachable!("only fake specs here"),
        }
    }
}

#[test]
fn the_mapping_follows_the_capabilities() {
    let caps = Caps {
        block_shift: 12,
        blocks: 1000,
        max_io: 64 << 10,
        volatile_cache: true,
        fua: false,
        discard: false,
        discard_zeroes: false,
        write_zeroes_blocks: 16,
    };
    let mut w = desc(sys::IO_OP_WRITE, 8, 16);
    w.op_flags |= sys::IO_F_FUA;
    // FUA dropped: the device cannot, the kernel emulates it (no ATTR_FUA).
    assert_eq!(
        map_request(&w, &caps),
        Ok(Request::Write {
            lba: 1,
            blocks: 2,
            bytes: 8192,
            fua: false
        })
    );
    assert_eq!(
        map_request(&desc(sys::IO_OP_DISCARD, 0, 8), &caps),
        Err(-libc::EOPNOTSUPP)
    );
    assert_eq!(
        map_request(&desc(sys::IO_OP_WRITE_ZEROES, 0, 8 * 17), &caps),
        Err(-libc::EINVAL)
    );
    assert_eq!(
        map_request(&desc(sys::IO_OP_WRITE_ZEROES, 8 * 999, 8), &caps),
        Ok(Request::WriteZeroes {
            lba: 999,
            blocks: 1
        })
    );
    assert_eq!(
        map_request(&desc(sys::IO_OP_READ, 8 * 999, 16), &caps),
        Err(-libc::EIO)
    );
    let p = params_of(&caps);
    assert_eq!(p.basic.logical_bs_shift, 12);
    assert_eq!(p.basic.dev_sectors, 8000);
    assert_eq!(p.basic.max_sectors, 128);
    assert_eq!(p.basic.attrs, sys::ATTR_VOLATILE_CACHE);
    assert_eq!(p.types, sys::PARAM_TYPE_BASIC | sys::PARAM_TYPE_DISCARD);
    assert_eq!(p.discard.max_discard_sectors, 0);
    assert_eq!(p.discard.max_write_zeroes_sectors, 128);
    assert_eq!(p.discard.discard_granularity, 4096);
}

#[test]
fn nvme_parameters_from_what_the_engine_reports() {
    let o = open("fake,sync=1,size=8m,lbs=4k");
    let c = caps(&o, 1 << 30);
    let Device::Nvme(ctrl) = &o.device else {
        panic!()
    };
    assert_eq!(
        u64::from(c.max_io),
        ctrl.max_transfer(),
        "capped at the engine's max transfer"
    );
    let p = params_of(&c);
    assert_eq!(p.basic.dev_sectors, 8 << 20 >> 9);
    assert_eq!(p.basic.logical_bs_shift, 12);
    assert_eq!(
        p.basic.attrs,
        sys::ATTR_VOLATILE_CACHE | sys::ATTR_FUA,
        "the fake has a volatile write cache"
    );
    assert_eq!(p.discard.max_discard_segments, 1);
    assert!(p.discard.max_write_zeroes_sectors > 0);
}

/// Step, and sleep as the idle server does whenever a pass found nothing,
/// until the fake has no request in flight.
fn settle_sleeping<T: Target>(s: &mut Server<'_, FakeQueue, T>) {
    for _ in 0..1_000_000 {
        if s.step().unwrap() > 0 {
            continue;
        }
        if s.queue().in_flight() == 0 && s.outstanding() == 0 {
            return;
        }
        s.idle_sleep().unwrap();
    }
    panic!("requests never answered: {:?}", s.stats());
}

/// The idle server sleeps on the ublk ring and the engine queue's
/// interrupt together (arm, poll again, then sleep), and no wake-up is
/// lost: every wait is made to last 20 s unless the watched eventfd ends
/// it, so a completion whose interrupt the arm swallowed without the
/// second poll seeing it would show as a wait that ran out. Writes then
/// reads of random blocks through a device thread that takes 100 us per
/// command.
#[test]
fn an_idle_server_sleeps_on_the_engine_interrupt_and_loses_no_wake_up() {
    let o = open("fake,size=16m,latency=100us");
    let c = caps(&o, 64 << 10);
    let mut qp = nvme_ctrl(&o)
        .create_qpair(QpairOptions {
            depth: 32,
            wait: mcqio::WaitPolicy::Interrupt,
            ..QpairOptions::default()
        })
        .unwrap();
    let mut q = FakeQueue::new(0, 8);
    q.long_waits = Some(Duration::from_secs(20));
    let s = Server::new(q, &mut qp, 1u32, c, o.device.dma().clone()).unwrap();
    sleeps_on_the_engine_and_loses_no_wake_up(s);
}

/// 40 rounds of 1..=8 writes of random blocks, then their reads, through
/// a server whose engine queue pair waits on its interrupt and whose
/// ublk waits last 20 s unless the watched descriptor ends them: none
/// runs out, and every engine sleep is ended by the engine's interrupt.
fn sleeps_on_the_engine_and_loses_no_wake_up<T: Target>(mut s: Server<'_, FakeQueue, T>) {
    s.set_idle(Idle::of(mcqio::WaitPolicy::Interrupt));
    s.start().unwrap();
    let mut r = rand::rngs::SmallRng::seed_from_u64(7);
    let t0 = std::time::Instant::now();
    for round in 0..40u64 {
        let n = r.gen_range(1..=8usize);
        let blocks: Vec<u64> = (0..n).map(|i| i as u64 * 64 + r.gen_range(0..64)).collect();
        let writes: Vec<_> = blocks
            .iter()
            .map(|&b| {
                (
                    desc(sys::IO_OP_WRITE, b * 8, 8),
                    Some(pattern(round << 8 | b, 4096)),
                )
            })
            .collect();
        for (tag, (d, data)) in s.queue().ready_tags().into_iter().zip(writes.clone()) {
            s.queue_mut().request(tag, d, data);
        }
        settle_sleeping(&mut s);
        let answers = s.queue_mut().take_answers();
        assert!(answers.iter().all(|a| a.result == 4096), "{answers:?}");
        for (tag, (d, _)) in s.queue().ready_tags().into_iter().zip(&writes) {
            s.queue_mut()
                .request(tag, desc(sys::IO_OP_READ, d.start_sector, 8), None);
        }
        settle_sleeping(&mut s);
        for a in s.queue_mut().take_answers() {
            let (_, data) = writes
                .iter()
                .find(|(d, _)| d.start_sector == a.desc.start_sector)
                .unwrap();
            assert_eq!(a.data.as_ref(), data.as_ref(), "read back what was written");
        }
    }
    let st = s.stats();
    let q = s.queue();
    assert!(st.engine_sleeps > 0, "it slept on the engine: {st:?}");
    assert_eq!(
        q.waits_ran_out, 0,
        "a sleep ran out its 20 s: a lost wake-up ({st:?})"
    );
    assert_eq!(st.engine_ran_out, 0, "{st:?}");
    assert_eq!(st.engine_wakeups, st.engine_sleeps, "{st:?}");
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    shut_down(s);
}

/// A queue pair that polls only gives the server nothing to sleep on
/// while it owes completions: the server never sleeps then.
#[test]
fn a_polled_engine_is_never_slept_on() {
    let o = open("fake,size=16m,latency=50us");
    let c = caps(&o, 64 << 10);
    let mut qp = nvme_qp(&o, 32, None);
    let mut s = Server::new(
        FakeQueue::new(0, 8),
        &mut qp,
        1u32,
        c,
        o.device.dma().clone(),
    )
    .unwrap();
    s.set_idle(Idle::of(mcqio::WaitPolicy::Poll));
    s.start().unwrap();
    roundtrip(&mut s, &c);
    assert_eq!(s.stats().engine_sleeps, 0);
    shut_down(s);
}

/// `--null`: every request is answered at once with its full length,
/// nothing reaches the engine, requests beyond the target's room wait
/// rather than fail, and nothing is answered twice.
#[test]
fn the_null_target_answers_everything_at_once() {
    let o = open("fake,size=16m");
    let c = caps(&o, 64 << 10);
    let mut t = NullTarget::new(c.block_shift, 4);
    let mut s = Server::new(
        FakeQueue::new(0, 16),
        &mut t,
        0u32,
        c,
        o.device.dma().clone(),
    )
    .unwrap();
    s.start().unwrap();
    let reqs: Vec<_> = (0..16u64)
        .map(|i| match i % 4 {
            0 => (
                desc(sys::IO_OP_WRITE, i * 128, 128),
                Some(pattern(i, 128 * 512)),
            ),
            1 => (desc(sys::IO_OP_READ, i * 8, 8), None),
            2 => (desc(sys::IO_OP_FLUSH, 0, 0), None),
            _ => (desc(sys::IO_OP_DISCARD, i * 8, 8), None),
        })
        .collect();
    let answers = exchange(&mut s, reqs.clone());
    for (a, (d, _)) in answers.iter().zip(&reqs) {
        let want = match d.op() {
            sys::IO_OP_READ | sys::IO_OP_WRITE => (d.nr_sectors * 512) as i32,
            _ => 0,
        };
        assert_eq!(a.result, want, "{a:?}");
    }
    assert!(
        s.stats().queue_full > 0,
        "16 requests on a target with room for 4"
    );
    shut_down(s);
}

/// A fake NVMe/TCP target on loopback: namespace 1 RAM in 512-byte
/// blocks (4 MiB), namespace 2 RAM in 4 KiB blocks (4 MiB); MAXH2CDATA
/// 32 KiB, so a 32 KiB request goes by R2T and a read in many C2HData.
fn tcp_target() -> mcqio_fixtures::tcp::FakeTcpTarget {
    use mcqio_fixtures::tcp::{FakeTcpTarget, TcpBacking, TcpNamespace, TcpTargetConfig};
    FakeTcpTarget::start(TcpTargetConfig {
        namespaces: vec![
            TcpNamespace {
                blocks: 8192,
                lba_shift: 9,
                backing: TcpBacking::Ram,
            },
            TcpNamespace {
                blocks: 1024,
                lba_shift: 12,
                backing: TcpBacking::Ram,
            },
        ],
        maxh2cdata: 32 << 10,
        ..TcpTargetConfig::default()
    })
    .expect("fake target")
}

fn tcp_ctrl(o: &Opened) -> std::sync::Arc<mcqio::nvme::tcp::TcpController> {
    match &o.device {
        Device::Tcp(c) => c.clone(),
        Device::Nvme(_) | Device::Ufs(_) => panic!("not NVMe/TCP"),
    }
}

/// The capabilities of a `tcp:` unit come from what the target reports:
/// its block size and capacity, the controller's per-command bound
/// (MDTS, MAXH2CDATA), and ONCS/VWC — the fake has no volatile cache and
/// no Dataset Management, so neither flush nor discard is offered; the
/// engine's NVMe/TCP queue pair has no FUA write or Write Zeroes.
#[test]
fn tcp_capabilities_from_what_the_target_reports() {
    let t = tcp_target();
    for (unit_id, shift, blocks) in [(1u32, 9u32, 8192u64), (2, 12, 1024)] {
        let o = open(&format!("tcp:{}/{},hdgst,ddgst", t.addr(), t.subnqn()));
        let ctrl = tcp_ctrl(&o);
        let u = unit(&o.device, Some(unit_id)).unwrap();
        let c = caps_of(&o.device, &u, 1 << 30);
        assert_eq!((c.block_shift, c.blocks), (shift, blocks));
        assert_eq!(u64::from(c.max_io), ctrl.max_transfer());
        assert!(
            c.max_io <= ctrl.maxh2cdata(),
            "within MAXH2CDATA: {c:?} {}",
            ctrl.maxh2cdata()
        );
        assert!(!ctrl.identify().has_volatile_write_cache());
        assert!(!ctrl.identify().supports_dsm());
        assert!(!c.volatile_cache && !c.fua && !c.discard && !c.discard_zeroes);
        assert_eq!(c.write_zeroes_blocks, 0);
        // A smaller request size asked for is kept, in whole blocks.
        let small = caps_of(&o.device, &u, 5000);
        assert_eq!(small.max_io, 5000 >> shift << shift);
        let p = params_of(&c);
        assert_eq!(p.basic.logical_bs_shift, shift as u8);
        assert_eq!(p.basic.dev_sectors, blocks << (shift - 9));
        assert_eq!(p.basic.max_sectors, c.max_io >> 9);
        assert_eq!(p.basic.attrs, 0, "no volatile cache: no FLUSH, no FUA");
        assert_eq!(
            p.types,
            sys::PARAM_TYPE_BASIC,
            "no discard, no write zeroes"
        );
        assert_eq!(
            map_request(&desc(sys::IO_OP_DISCARD, 0, 8), &c),
            Err(-libc::EOPNOTSUPP)
        );
        assert_eq!(
            map_request(&desc(sys::IO_OP_WRITE_ZEROES, 0, 8), &c),
            Err(-libc::EOPNOTSUPP)
        );
    }
}

/// Writes then reads through the server on an NVMe/TCP queue pair, with
/// and without digests, both block sizes; the data the kernel gets back
/// is what it wrote, and the target holds it.
#[test]
fn tcp_write_read_roundtrip() {
    let t = tcp_target();
    for (digests, unit_id) in [("", 1u32), (",hdgst,ddgst", 1), (",hdgst,ddgst", 2)] {
        let o = open(&format!("tcp:{}/{}{digests}", t.addr(), t.subnqn()));
        let u = unit(&o.device, Some(unit_id)).unwrap();
        let c = caps_of(&o.device, &u, 32 << 10);
        assert_eq!(c.max_io, 32 << 10);
        let mut qp = tcp_ctrl(&o)
            .create_qpair(QpairOptions {
                depth: 16,
                ..QpairOptions::default()
            })
            .unwrap();
        let mut s = Server::new(
            FakeQueue::new(0, 8),
            &mut qp,
            unit_id,
            c,
            o.device.dma().clone(),
        )
        .unwrap();
        s.start().unwrap();
        roundtrip(&mut s, &c);
        // The target holds the first write (one block at sector 0).
        let bs = 1usize << c.block_shift;
        assert_eq!(
            t.read_back(unit_id, 0, bs).unwrap(),
            pattern(1, bs),
            "{digests} unit {unit_id}"
        );
        // A flush is answered (the block layer sends none without a
        // volatile cache, but one that comes is not refused).
        let a = exchange(&mut s, vec![(desc(sys::IO_OP_FLUSH, 0, 0), None)]);
        assert_eq!(a[0].result, 0, "{a:?}");
        shut_down(s);
    }
}

/// On NVMe/TCP: an idle server whose engine queue pair waits
/// on its socket sleeps on the ublk ring and the queue's descriptor (its
/// epoll set) together, and loses no wake-up, against a target that
/// takes 100 us per command.
#[test]
fn an_idle_server_sleeps_on_a_tcp_queues_socket_and_loses_no_wake_up() {
    use mcqio_fixtures::tcp::{FakeTcpTarget, TcpBacking, TcpNamespace, TcpTargetConfig};
    let t = FakeTcpTarget::start(TcpTargetConfig {
        namespaces: vec![TcpNamespace {
            blocks: 8192,
            lba_shift: 9,
            backing: TcpBacking::Ram,
        }],
        latency: Duration::from_micros(100),
        ..TcpTargetConfig::default()
    })
    .expect("fake target");
    let o = open(&format!("tcp:{}/{}", t.addr(), t.subnqn()));
    let u = unit(&o.device, Some(1)).unwrap();
    let c = caps_of(&o.device, &u, 64 << 10);
    let mut qp = tcp_ctrl(&o)
        .create_qpair(QpairOptions {
            depth: 32,
            wait: mcqio::WaitPolicy::Interrupt,
            ..QpairOptions::default()
        })
        .unwrap();
    assert!(
        matches!(
            mcqio::core::block::BlockQueue::interrupt(&qp),
            Some(mcqio::Interrupt::Ready(_))
        ),
        "the socket's readiness"
    );
    let mut q = FakeQueue::new(0, 8);
    q.long_waits = Some(Duration::from_secs(20));
    let s = Server::new(q, &mut qp, 1u32, c, o.device.dma().clone()).unwrap();
    sleeps_on_the_engine_and_loses_no_wake_up(s);
}

/// A device error reaches the block layer as its errno, and a connection
/// the target drops mid-command as -ENOLINK (a dead link), the request
/// answered once; the queue's server then ends with the transport error
/// (its queue pair is gone) rather than serve on a dead connection.
#[test]
fn tcp_errors_reach_the_block_layer_as_errnos() {
    use mcqio_fixtures::tcp::TcpFault;
    let t = tcp_target();
    let o = open(&format!("tcp:{}/{}", t.addr(), t.subnqn()));
    let c = caps(&o, 32 << 10);
    let mut qp = tcp_ctrl(&o)
        .create_qpair(QpairOptions {
            depth: 16,
            ..QpairOptions::default()
        })
        .unwrap();
    let mut s = Server::new(
        FakeQueue::new(0, 4),
        &mut qp,
        1u32,
        c,
        o.device.dma().clone(),
    )
    .unwrap();
    s.start().unwrap();
    // Unrecovered Read Error (media, 0x81) on the next read.
    t.faults().inject_next(
        None,
        Some(0x02),
        TcpFault::Status {
            sct: 2,
            sc: 0x81,
            dnr: true,
        },
    );
    let a = exchange(&mut s, vec![(desc(sys::IO_OP_READ, 0, 8), None)]);
    assert_eq!(a[0].result, -libc::ENODATA, "{a:?}");
    // The target drops the connection on the next write.
    t.faults()
        .inject_next(None, Some(0x01), TcpFault::Disconnect);
    let a = exchange(
        &mut s,
        vec![(desc(sys::IO_OP_WRITE, 0, 8), Some(pattern(9, 4096)))],
    );
    assert_eq!(a[0].result, -libc::ENOLINK, "{a:?}");
    s.queue_mut().abort();
    let e = s.run(&AtomicBool::new(false)).unwrap_err();
    assert!(e.to_string().contains("closed the connection"), "{e}");
    let (_, stats) = s.finish();
    assert_eq!(stats.protocol_errors, 0, "{stats:?}");
}

/// More tags than the NVMe/TCP queue pair holds (the target's queues are
/// small: CAP.MQES): the rest wait for a completion, none fails, and
/// every block reads back what was written.
#[test]
fn tcp_more_tags_than_the_queue_pair_holds() {
    let t = tcp_target();
    let o = open(&format!("tcp:{}/{},ddgst", t.addr(), t.subnqn()));
    let c = caps(&o, 32 << 10);
    let mut qp = tcp_ctrl(&o)
        .create_qpair(QpairOptions {
            depth: 3,
            ..QpairOptions::default()
        })
        .unwrap();
    let mut s = Server::new(
        FakeQueue::new(0, 16),
        &mut qp,
        1u32,
        c,
        o.device.dma().clone(),
    )
    .unwrap();
    s.start().unwrap();
    let writes: Vec<_> = (0..16u64)
        .map(|i| {
            (
                desc(sys::IO_OP_WRITE, i * 64, 16),
                Some(pattern(100 + i, 16 * 512)),
            )
        })
        .collect();
    for a in exchange(&mut s, writes.clone()) {
        assert_eq!(a.result, 16 * 512, "{a:?}");
    }
    let reads = (0..16u64)
        .map(|i| (desc(sys::IO_OP_READ, i * 64, 16), None))
        .collect();
    for (a, (_, data)) in exchange(&mut s, reads).iter().zip(&writes) {
        assert_eq!(a.data.as_ref(), data.as_ref(), "tag {}", a.tag);
    }
    shut_down(s);
}
