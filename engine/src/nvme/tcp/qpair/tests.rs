//! Unit tests of the NVMe/TCP queue pair that reach its internals.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::*;
use crate::core::block::BlockQueue;
use crate::core::io::SubmitErrorKind;
use crate::core::qpair::WaitPolicy;
use crate::core::qpair::Wire;
use crate::nvme::host::QpairOptions;
use crate::nvme::tcp::TcpOptions;
use mcqio_fixtures::tcp::{FakeTcpTarget, TcpFault, TcpTargetConfig, TcpTargetStats};
use mcqio_vfio::DmaDir;

/// Bring the target up with `o` and open a queue pair `depth` deep
/// (no I/O timeout, `wait`).
fn open(
    t: &FakeTcpTarget,
    o: TcpOptions,
    depth: u16,
    wait: WaitPolicy,
) -> (Arc<TcpController>, TcpQueuePair) {
    let c = TcpController::connect(
        t.addr(),
        TcpOptions {
            subnqn: t.subnqn().into(),
            ..o
        },
    )
    .unwrap();
    let q = c
        .create_qpair(QpairOptions {
            depth,
            wait,
            io_timeout: None,
            ..Default::default()
        })
        .unwrap();
    (c, q)
}

/// Issue 39, 5a: sustained 4 MiB writes, four in flight, against a
/// target that gives every write it received its R2Ts before taking
/// any data (as Linux's and SPDK's targets do), 64 KiB each and four
/// outstanding per write (a new one as soon as one's data is in), with
/// MAXH2CDATA 4096, through socket buffers far smaller than the data
/// owed (the host's send buffer set to 16 KiB, the target's receive
/// buffer to 16 KiB, the target slow to read): the send queue is then
/// never empty for long, and its header arena — reused only once
/// everything queued has left — must not fill up for it. Every write
/// lands in the target's memory and the connection never ends.
#[test]
fn sustained_r2t_writes_through_small_socket_buffers_never_fill_the_send_queue() {
    use mcqio_fixtures::tcp::{TcpBacking, TcpNamespace};
    let t = FakeTcpTarget::start(TcpTargetConfig {
        namespaces: vec![TcpNamespace {
            blocks: 8192,
            lba_shift: 12,
            backing: TcpBacking::Ram,
        }],
        maxh2cdata: 4096,
        r2t_max: 64 << 10,
        r2t_writes_together: 8,
        mdts: 0,
        recv_buffer: Some(16 << 10),
        recv_pause: Duration::from_micros(100),
        ..Default::default()
    })
    .unwrap();
    let depth = 4u16;
    let o = TcpOptions {
        max_transfer: 4 << 20,
        within_maxh2cdata: false,
        ..Default::default()
    };
    let (c, mut q) = open(&t, o, depth, WaitPolicy::Poll);
    let small: libc::c_int = 16 << 10;
    // SAFETY: a valid socket descriptor, and `small` is a c_int that
    // lives across the call, its size passed with it.
    let r = unsafe {
        libc::setsockopt(
            q.conn.sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&small as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    let len = 4usize << 20;
    let blocks = (len >> 12) as u32;
    let slots = 8u64;
    let total = 16u64;
    let fill = |i: u64| -> Vec<u8> {
        (0..len)
            .map(|k| (k as u64 ^ (k as u64 >> 9) ^ i.wrapping_mul(0x9E37)) as u8)
            .collect()
    };
    let submit = |q: &mut TcpQueuePair, i: u64| {
        let mut b = c.alloc_buf(len, DmaDir::Bidirectional).unwrap();
        b.write_at(0, &fill(i)).unwrap();
        BlockQueue::write(q, 1, (i % slots) * u64::from(blocks), blocks, b, i).unwrap();
    };
    let mut next = 0u64;
    while next < u64::from(depth) {
        submit(&mut q, next);
        next += 1;
    }
    BlockQueue::submit(&mut q);
    let mut done = 0u64;
    let mut held_polls = 0u64;
    let end = Instant::now() + Duration::from_secs(120);
    while done < total {
        assert!(Instant::now() < end, "{done} of {total} writes: a hang");
        let mut finished = Vec::new();
        if let Err(e) = BlockQueue::poll(&mut q, usize::MAX, |c| finished.push(c)) {
            panic!("poll after {done} writes: {e} ({:?})", q.connection_error());
        }
        held_polls += u64::from(!q.tx.is_empty());
        for f in finished {
            assert_eq!(
                f.result,
                Ok(()),
                "write {}: {:?}",
                f.tag,
                q.connection_error()
            );
            done += 1;
            if next < total {
                submit(&mut q, next);
                next += 1;
            }
        }
        BlockQueue::submit(&mut q);
    }
    assert_eq!(q.connection_error(), None);
    assert!(
        held_polls > 0,
        "the send queue was never held up: nothing tested"
    );
    assert!(
        q.stats().r2t_waits > 0,
        "owed data never waited: nothing tested"
    );
    let at_once = TcpTargetStats::get(&t.stats().r2t_writes_at_once);
    assert!(
        at_once >= 2,
        "R2Ts outstanding for {at_once} writes at once"
    );
    assert_eq!(TcpTargetStats::get(&t.stats().h2c_data), total * 1024);
    for i in total - slots..total {
        let at = ((i % slots) * u64::from(blocks)) << 12;
        assert!(
            t.read_back(1, at as usize, len).unwrap() == fill(i),
            "write {i}"
        );
    }
}

/// Issue 39, 5d: a split child that does not queue (impossible once
/// room for every child was checked; forced here) refuses the whole
/// request — QueueFull, the buffer back, every slot free, nothing
/// sent — where it used to be a `debug_assert!` (a panic in debug, and
/// in release a child never sent and a parent that waits forever).
/// The same request then goes through whole.
#[test]
fn a_split_child_that_does_not_queue_refuses_the_whole_request() {
    let t = FakeTcpTarget::start(TcpTargetConfig::default()).unwrap();
    let (c, mut q) = open(&t, TcpOptions::default(), 16, WaitPolicy::Poll);
    // Commands are capped at MAXH2CDATA (8 KiB): 64 KiB is 8 children.
    assert_eq!(c.max_transfer(), 8192);
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 7 + (i >> 9)) as u8).collect();
    let mut b = c.alloc_buf(data.len(), DmaDir::Bidirectional).unwrap();
    b.write_at(0, &data).unwrap();
    let commands = TcpTargetStats::get(&t.stats().commands);
    // The fourth child (16 blocks of 512 B each).
    q.fail_child = Some(48);
    let b = match BlockQueue::write(&mut q, 1, 0, 128, b, 5) {
        Err(e) => {
            assert_eq!(e.kind, SubmitErrorKind::QueueFull);
            e.buf
        }
        Ok(()) => {
            BlockQueue::submit(&mut q);
            let mut done = false;
            let end = Instant::now() + Duration::from_secs(5);
            while !done && Instant::now() < end {
                BlockQueue::poll(&mut q, usize::MAX, |_| done = true).unwrap();
            }
            panic!(
                "a child did not queue, yet the request was accepted; its parent {}",
                if done {
                    "completed"
                } else {
                    "never completed in 5 s (a hang)"
                }
            );
        }
    };
    assert!(b.to_vec() == data, "the buffer came back untouched");
    assert_eq!(q.eng.trackers.outstanding(), 0, "every slot is free");
    assert!(q.tx.is_empty(), "nothing of the request is queued");
    BlockQueue::submit(&mut q);
    let end = Instant::now() + Duration::from_millis(100);
    while Instant::now() < end {
        BlockQueue::poll(&mut q, usize::MAX, |c| panic!("{c:?}")).unwrap();
    }
    assert_eq!(
        TcpTargetStats::get(&t.stats().commands),
        commands,
        "nothing was sent"
    );
    q.fail_child = None;
    BlockQueue::write(&mut q, 1, 0, 128, b, 6).unwrap();
    BlockQueue::submit(&mut q);
    let mut got = None;
    let end = Instant::now() + Duration::from_secs(20);
    while got.is_none() {
        assert!(Instant::now() < end, "a hang");
        BlockQueue::poll(&mut q, usize::MAX, |c| got = Some(c)).unwrap();
    }
    let got = got.unwrap();
    assert_eq!((got.tag, got.result), (6, Ok(())));
    assert!(t.read_back(1, 0, data.len()).unwrap() == data);
}

/// Sends held up by a full socket (a target that stopped reading)
/// make a waiting queue watch for room to send as well, until they
/// left; all of them then complete through `wait`.
#[test]
fn held_up_sends_are_watched_until_they_left() {
    let t = FakeTcpTarget::start(TcpTargetConfig {
        in_capsule_bytes: 128 << 10,
        maxh2cdata: 128 << 10,
        ..Default::default()
    })
    .unwrap();
    let (c, mut q) = open(&t, TcpOptions::default(), 120, WaitPolicy::Interrupt);
    assert!(!q.ready.as_ref().unwrap().writable());
    // The target sleeps on the first command and reads nothing
    // meanwhile: 15 MiB of in-capsule writes fill the socket's buffers.
    t.faults().inject_next(
        Some(q.qid()),
        None,
        TcpFault::Delay(Duration::from_millis(500)),
    );
    let len = 128 << 10;
    for i in 0..120u64 {
        let b = c.alloc_buf(len, DmaDir::Bidirectional).unwrap();
        BlockQueue::write(&mut q, 1, (i % 8) * 256, 256, b, i).unwrap();
    }
    BlockQueue::submit(&mut q);
    BlockQueue::poll(&mut q, usize::MAX, |_| panic!("nothing answered yet")).unwrap();
    assert!(!q.tx.is_empty(), "the buffers took 15 MiB");
    assert!(q.ready.as_ref().unwrap().writable(), "held up: watched");
    let mut done = 0;
    let end = Instant::now() + Duration::from_secs(20);
    while done < 120 {
        assert!(Instant::now() < end, "a hang");
        BlockQueue::wait(&mut q, usize::MAX, Some(Duration::from_secs(5)), |c| {
            c.result.unwrap();
            done += 1;
        })
        .unwrap();
    }
    assert!(q.tx.is_empty());
    assert!(BlockQueue::counters(&q).interrupt_sleeps > 0);
    // The next arm stops watching for room.
    Wire::arm_interrupt(&mut q);
    assert!(!q.ready.as_ref().unwrap().writable());
}
