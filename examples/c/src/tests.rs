//! The extern functions called as C calls them, on the three fakes.

use std::ffi::{c_int, c_void, CStr, CString};
use std::ptr::null_mut;

use crate::buf::*;
use crate::device::*;
use crate::qpair::*;
use crate::status::*;

/// The thread's last error message.
fn last() -> String {
    // SAFETY: the library's NUL-terminated, thread-local string.
    unsafe { CStr::from_ptr(mcqio_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Open `s`, or panic with the message.
fn open(s: &str) -> *mut McqioDevice {
    let s = CString::new(s).unwrap();
    let mut dev = null_mut();
    // SAFETY: a NUL-terminated string and a pointer to write.
    let st = unsafe { mcqio_device_open(s.as_ptr(), &mut dev) };
    assert_eq!(st, Status::Ok, "{}", last());
    dev
}

fn first_unit(dev: *mut McqioDevice) -> McqioUnit {
    let mut u = [McqioUnit {
        id: 0,
        block_size: 0,
        blocks: 0,
        usable: false,
    }; 4];
    // SAFETY: a live device; room for 4 units.
    let n = unsafe { mcqio_device_units(dev, u.as_mut_ptr(), u.len()) };
    assert!(n >= 1, "{n}: {}", last());
    u[0]
}

fn qpair(dev: *mut McqioDevice, opts: Option<McqioQpairOpts>) -> *mut McqioQpair {
    let mut qp = null_mut();
    let o = opts.as_ref().map_or(std::ptr::null(), |o| o as *const _);
    // SAFETY: a live device, NULL or a struct, a pointer to write.
    let st = unsafe { mcqio_qpair_create(dev, o, &mut qp) };
    assert_eq!(st, Status::Ok, "{}", last());
    qp
}

fn alloc(dev: *mut McqioDevice, len: usize) -> *mut McqioBuf {
    let mut b = null_mut();
    // SAFETY: a live device and a pointer to write.
    let st = unsafe { mcqio_buf_alloc(dev, len, &mut b) };
    assert_eq!(st, Status::Ok, "{}", last());
    b
}

/// The buffer's bytes (idle).
fn bytes<'a>(b: *mut McqioBuf) -> &'a mut [u8] {
    // SAFETY: an idle buffer of this test: its data pointer is valid for
    // its length, and no command is in flight on it.
    unsafe {
        let p = mcqio_buf_data(b).cast::<u8>();
        assert!(!p.is_null());
        std::slice::from_raw_parts_mut(p, mcqio_buf_len(b))
    }
}

/// Wait for one completion through `mcqio_wait_into`.
fn one(qp: *mut McqioQpair) -> McqioCpl {
    let mut c = std::mem::MaybeUninit::<McqioCpl>::uninit();
    for _ in 0..1000 {
        // SAFETY: a live queue pair and room for one completion.
        let n = unsafe { mcqio_wait_into(qp, c.as_mut_ptr(), 1, 100_000_000) };
        assert!(n >= 0, "{n}: {}", last());
        if n == 1 {
            // SAFETY: the call wrote one completion.
            return unsafe { c.assume_init() };
        }
    }
    panic!("no completion in 100 s");
}

/// Write a pattern through the C ABI, read it back into another buffer
/// with a callback poll, flush: the same calls on every wire.
fn round_trip(devstr: &str) {
    let dev = open(devstr);
    let u = first_unit(dev);
    assert!(u.usable && u.blocks > 8, "{devstr}: {u:?}");
    let mut info = std::mem::MaybeUninit::uninit();
    // SAFETY: a live device and a struct to write.
    let st = unsafe { mcqio_device_info(dev, info.as_mut_ptr()) };
    assert_eq!(st, Status::Ok);
    // SAFETY: written above.
    let info = unsafe { info.assume_init() };
    assert!(info.queues >= 1 && info.units >= 1, "{devstr}: {info:?}");
    let qp = qpair(dev, None);
    // The device handle may go first: the queue pair keeps the controller.
    let bs = u.block_size as usize;
    let w = alloc(dev, 2 * bs);
    let r = alloc(dev, 2 * bs);
    for (i, b) in bytes(w).iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    // SAFETY: live handles.
    let st = unsafe { mcqio_submit_write(qp, u.id, 4, 2, w, 0xfeed) };
    assert_eq!(st, Status::Ok, "{devstr}: {}", last());
    // SAFETY: a live buffer.
    assert_eq!(unsafe { mcqio_buf_state_of(w) }, BufState::InFlight);
    let c = one(qp);
    assert_eq!((c.user_tag, c.status, c.flags), (0xfeed, Status::Ok, 0));
    assert_eq!(c.buf, w);
    // SAFETY: a live buffer.
    assert_eq!(unsafe { mcqio_buf_state_of(w) }, BufState::Idle);

    // SAFETY: live handles.
    let st = unsafe { mcqio_submit_read(qp, u.id, 4, 2, r, 7) };
    assert_eq!(st, Status::Ok);
    // SAFETY: a live queue pair.
    assert_eq!(unsafe { mcqio_qpair_outstanding(qp) }, 1);
    extern "C" fn note(c: *const McqioCpl, ctx: *mut c_void) {
        // SAFETY: `ctx` is the Vec below; `c` is valid during the call.
        unsafe { (*ctx.cast::<Vec<McqioCpl>>()).push(*c) };
    }
    let mut got: Vec<McqioCpl> = Vec::new();
    let ctx = (&mut got as *mut Vec<McqioCpl>).cast();
    for _ in 0..1_000_000 {
        // SAFETY: a live queue pair; `note` keeps the callback rules.
        let n = unsafe { mcqio_poll(qp, 8, Some(note), ctx) };
        assert!(n >= 0, "{n}: {}", last());
        if !got.is_empty() {
            break;
        }
        std::thread::yield_now();
    }
    assert_eq!(got.len(), 1, "{devstr}");
    assert_eq!((got[0].user_tag, got[0].status), (7, Status::Ok));
    assert_eq!(bytes(r), bytes(w), "{devstr}: read back what was written");

    // SAFETY: a live queue pair.
    assert_eq!(unsafe { mcqio_submit_flush(qp, u.id, 9) }, Status::Ok);
    let c = one(qp);
    assert_eq!((c.user_tag, c.status, c.buf), (9, Status::Ok, null_mut()));
    // SAFETY: live handles, each given up once.
    unsafe {
        mcqio_device_close(dev);
        assert_eq!(mcqio_qpair_destroy(qp, None, null_mut()), Status::Ok);
        assert_eq!(mcqio_buf_free(w), Status::Ok);
        assert_eq!(mcqio_buf_free(r), Status::Ok);
    }
}

#[test]
fn round_trip_on_the_nvme_fake() {
    round_trip("fake,sync=1");
    round_trip("fake,lbs=4k");
}

#[test]
fn round_trip_on_the_ufs_fake() {
    round_trip("fake-ufs,sync=1");
    round_trip("fake-ufs,mcq=off");
}

#[test]
fn round_trip_over_nvme_tcp() {
    let t = mcqio_fixtures::tcp::FakeTcpTarget::start(Default::default()).unwrap();
    round_trip(&format!("tcp:{}/{}", t.addr(), t.subnqn()));
    round_trip(&format!("tcp:{}/{},hdgst,ddgst", t.addr(), t.subnqn()));
}

/// A buffer in flight can be neither freed nor submitted again: both are
/// `Busy`, and the command completes as if nothing happened.
#[test]
fn a_buffer_in_flight_is_busy() {
    let dev = open("fake,latency=20ms");
    let u = first_unit(dev);
    let qp = qpair(dev, None);
    let b = alloc(dev, u.block_size as usize);
    // SAFETY: live handles throughout; each given up once at the end.
    unsafe {
        assert_eq!(mcqio_submit_read(qp, u.id, 0, 1, b, 1), Status::Ok);
        assert_eq!(mcqio_qpair_ring(qp), Status::Ok);
        assert_eq!(mcqio_buf_free(b), Status::Busy);
        assert!(last().contains("owned by a queue pair"), "{}", last());
        assert_eq!(mcqio_submit_write(qp, u.id, 0, 1, b, 2), Status::Busy);
        assert_eq!(mcqio_qpair_outstanding(qp), 1);
        let c = one(qp);
        assert_eq!((c.user_tag, c.status, c.buf), (1, Status::Ok, b));
        assert_eq!(mcqio_qpair_outstanding(qp), 0);
        assert_eq!(mcqio_buf_free(b), Status::Ok);
        assert_eq!(mcqio_qpair_destroy(qp, None, null_mut()), Status::Ok);
        mcqio_device_close(dev);
    }
}

/// Destroying a queue pair with commands in flight ends each once,
/// through the callback, with its buffer back and free-able.
#[test]
fn destroy_ends_every_command_in_flight_once() {
    let dev = open("fake,latency=50ms");
    let u = first_unit(dev);
    let qp = qpair(dev, None);
    let bufs: Vec<_> = (0..8).map(|_| alloc(dev, u.block_size as usize)).collect();
    // SAFETY: live handles throughout.
    unsafe {
        for (i, &b) in bufs.iter().enumerate() {
            assert_eq!(
                mcqio_submit_read(qp, u.id, i as u64, 1, b, 100 + i as u64),
                Status::Ok
            );
        }
        assert_eq!(mcqio_submit_flush(qp, u.id, 200), Status::Ok);
        // Half of them rung, half still queued.
        assert_eq!(mcqio_qpair_ring(qp), Status::Ok);
    }
    extern "C" fn note(c: *const McqioCpl, ctx: *mut c_void) {
        // SAFETY: `ctx` is the Vec below; `c` is valid during the call.
        unsafe { (*ctx.cast::<Vec<McqioCpl>>()).push(*c) };
        // SAFETY: the completion's buffer is idle now, and the queue pair
        // is gone: freeing it here is allowed.
        let st = unsafe { mcqio_buf_free((*c).buf) };
        assert_eq!(st, Status::Ok);
    }
    let mut got: Vec<McqioCpl> = Vec::new();
    // SAFETY: a live queue pair, given up; `note` keeps the rules.
    let st =
        unsafe { mcqio_qpair_destroy(qp, Some(note), (&mut got as *mut Vec<McqioCpl>).cast()) };
    assert_eq!(st, Status::Ok, "{}", last());
    let mut tags: Vec<u64> = got.iter().map(|c| c.user_tag).collect();
    tags.sort_unstable();
    let want: Vec<u64> = (100..108).chain([200]).collect();
    assert_eq!(tags, want, "each command once");
    for c in &got {
        assert!(
            matches!(c.status, Status::Ok | Status::Aborted),
            "{:?}",
            c.status
        );
        assert_eq!(c.flags, 0);
    }
    // SAFETY: a live device.
    unsafe { mcqio_device_close(dev) };
}

/// What a callback may and may not do: resubmit on its queue pair (a
/// chain of reads driven from the callback), but not poll, wait on or
/// destroy it.
#[test]
fn a_callback_resubmits_but_cannot_reenter_the_poll() {
    struct Chain {
        qp: *mut McqioQpair,
        unit: u32,
        done: u64,
        reentry: Vec<c_int>,
    }
    extern "C" fn next(c: *const McqioCpl, ctx: *mut c_void) {
        // SAFETY: `ctx` is the Chain below, `c` valid during the call.
        let (ch, c) = unsafe { (&mut *ctx.cast::<Chain>(), *c) };
        assert_eq!(c.status, Status::Ok);
        assert_eq!(c.user_tag, ch.done);
        ch.done += 1;
        // SAFETY: the queue pair is live; re-entry is what is tested.
        unsafe {
            ch.reentry.push(mcqio_poll(ch.qp, 1, Some(next), ctx));
            ch.reentry.push(mcqio_wait(ch.qp, 1, 0, Some(next), ctx));
            ch.reentry
                .push(mcqio_qpair_destroy(ch.qp, None, null_mut()) as c_int);
            if ch.done < 50 {
                let st = mcqio_submit_read(ch.qp, ch.unit, ch.done, 1, c.buf, ch.done);
                assert_eq!(st, Status::Ok);
            }
        }
    }
    let dev = open("fake,sync=1");
    let u = first_unit(dev);
    let qp = qpair(dev, None);
    let b = alloc(dev, u.block_size as usize);
    let mut ch = Chain {
        qp,
        unit: u.id,
        done: 0,
        reentry: Vec::new(),
    };
    // SAFETY: live handles; `next` keeps the callback rules.
    unsafe {
        assert_eq!(mcqio_submit_read(qp, u.id, 0, 1, b, 0), Status::Ok);
        // The callbacks change the chain through this pointer, so the
        // loop reads it through the same one.
        let chp: *mut Chain = &mut ch;
        let mut polls = 0;
        // Ends when the callbacks have counted 50 (a check clippy cannot
        // see change: they write through `chp`).
        loop {
            let done = (*chp).done;
            if done >= 50 {
                break;
            }
            assert!(mcqio_poll(qp, 4, Some(next), chp.cast()) >= 0, "{}", last());
            polls += 1;
            assert!(polls < 1_000_000, "the chain stalled at {done}");
        }
        assert_eq!(mcqio_qpair_outstanding(qp), 0);
        assert_eq!(mcqio_qpair_destroy(qp, None, null_mut()), Status::Ok);
        assert_eq!(mcqio_buf_free(b), Status::Ok);
        mcqio_device_close(dev);
    }
    assert_eq!(ch.reentry.len(), 150);
    assert!(ch.reentry.iter().all(|&s| s == Status::Busy as c_int));
}

/// Refusals are typed, name their reason, and leave the buffer idle.
#[test]
fn refusals_are_typed_and_hand_the_buffer_back() {
    let mut dev = null_mut();
    for (s, want) in [
        (c"nonsense", Status::Devstr),
        (c"fake,bogus=1", Status::Devstr),
        (c"vfio:0000:ff:1f.7", Status::Open),
    ] {
        // SAFETY: NUL-terminated strings and a pointer to write.
        let st = unsafe { mcqio_device_open(s.as_ptr(), &mut dev) };
        assert_eq!(st, want, "{s:?}: {}", last());
        assert!(dev.is_null());
        assert!(!last().is_empty());
    }
    // SAFETY: NULL arguments are refused, not dereferenced.
    unsafe {
        assert_eq!(
            mcqio_device_open(std::ptr::null(), &mut dev),
            Status::Invalid
        );
        assert_eq!(mcqio_submit_flush(null_mut(), 1, 0), Status::Invalid);
        assert_eq!(mcqio_poll(null_mut(), 1, None, null_mut()), -1);
        assert_eq!(mcqio_buf_free(null_mut()), Status::Ok);
        assert_eq!(
            mcqio_qpair_destroy(null_mut(), None, null_mut()),
            Status::Ok
        );
        mcqio_device_close(null_mut());
    }
    let dev = open("fake,sync=1,size=1M");
    let u = first_unit(dev);
    let qp = qpair(
        dev,
        Some(McqioQpairOpts {
            depth: 1,
            ..Default::default()
        }),
    );
    let b = alloc(dev, u.block_size as usize);
    // SAFETY: live handles throughout.
    unsafe {
        assert_eq!(mcqio_qpair_depth(qp), 1);
        let past = u.blocks;
        assert_eq!(mcqio_submit_read(qp, u.id, past, 1, b, 0), Status::Range);
        assert!(last().contains("past the last block"), "{}", last());
        assert_eq!(mcqio_buf_state_of(b), BufState::Idle);
        assert_eq!(mcqio_submit_read(qp, u.id, 0, 2, b, 0), Status::Range);
        assert_eq!(mcqio_submit_read(qp, 77, 0, 1, b, 0), Status::NoUnit);
        assert_eq!(mcqio_submit_read(qp, u.id, 0, 0, b, 0), Status::Invalid);
        assert_eq!(mcqio_buf_state_of(b), BufState::Idle);
        // Depth 1: the second command finds the queue full.
        assert_eq!(mcqio_submit_read(qp, u.id, 0, 1, b, 1), Status::Ok);
        assert_eq!(mcqio_submit_flush(qp, u.id, 2), Status::QueueFull);
        assert_eq!(one(qp).user_tag, 1);
        assert_eq!(mcqio_submit_flush(qp, u.id, 2), Status::Ok);
        assert_eq!(one(qp).user_tag, 2);
        let mut c = std::mem::MaybeUninit::<McqioCpl>::uninit();
        assert_eq!(
            mcqio_wait_into(qp, c.as_mut_ptr(), 0, 0),
            Status::Invalid as c_int
        );
        // A buffer of another device is refused, and stays idle.
        let other = open("fake,sync=1");
        let ob = alloc(other, u.block_size as usize);
        assert_eq!(mcqio_submit_read(qp, u.id, 0, 1, ob, 0), Status::Invalid);
        assert!(last().contains("not DMA-mapped"), "{}", last());
        assert_eq!(mcqio_buf_state_of(ob), BufState::Idle);
        assert_eq!(mcqio_buf_free(ob), Status::Ok);
        mcqio_device_close(other);
        // Options out of range.
        let mut q2 = null_mut();
        let bad = McqioQpairOpts {
            wait: 9,
            ..Default::default()
        };
        assert_eq!(mcqio_qpair_create(dev, &bad, &mut q2), Status::Invalid);
        assert!(q2.is_null());
        assert_eq!(mcqio_qpair_destroy(qp, None, null_mut()), Status::Ok);
        assert_eq!(mcqio_buf_free(b), Status::Ok);
        mcqio_device_close(dev);
    }
}

/// A queue pair created to sleep on its interrupt waits for its
/// completion, and one with nothing in flight returns at once.
#[test]
fn wait_sleeps_on_the_interrupt() {
    let dev = open("fake,latency=5ms");
    let u = first_unit(dev);
    let qp = qpair(
        dev,
        Some(McqioQpairOpts {
            wait: MCQIO_WAIT_IRQ,
            ..Default::default()
        }),
    );
    let b = alloc(dev, u.block_size as usize);
    // SAFETY: live handles.
    unsafe {
        let mut c = std::mem::MaybeUninit::<McqioCpl>::uninit();
        assert_eq!(mcqio_wait_into(qp, c.as_mut_ptr(), 1, -1), 0);
        assert_eq!(mcqio_submit_read(qp, u.id, 0, 1, b, 5), Status::Ok);
        assert_eq!(one(qp).user_tag, 5);
        assert_eq!(mcqio_qpair_destroy(qp, None, null_mut()), Status::Ok);
        assert_eq!(mcqio_buf_free(b), Status::Ok);
        mcqio_device_close(dev);
    }
}

/// Every code has its own sentence; an unknown one says so.
#[test]
fn strerror_names_every_status() {
    let mut seen = std::collections::HashSet::new();
    for s in ALL {
        // SAFETY: static NUL-terminated strings.
        let t = unsafe { CStr::from_ptr(mcqio_strerror(s as c_int)) };
        assert!(seen.insert(t.to_owned()), "{s:?} shares its text");
    }
    // SAFETY: as above.
    let t = unsafe { CStr::from_ptr(mcqio_strerror(-999)) };
    assert_eq!(t, c"unknown mcqio status");
}

/// A command whose buffer the device may still reach (a fatal controller
/// that ignores the disable) completes once with `MCQIO_CPL_BUF_LOST`: the
/// buffer is lost, has no data pointer, cannot be submitted again, and
/// only its handle can be freed.
#[test]
fn a_buffer_the_device_may_still_reach_is_lost() {
    let spec: mcqio_open::DeviceSpec = "fake-ufs,latency=200ms".parse().unwrap();
    let opened = spec.open("test").unwrap();
    let Some(mcqio_open::Fake::Ufs(fake)) = opened.fake.clone() else {
        panic!("fake-ufs opened without its fake")
    };
    let dev = Box::into_raw(Box::new(McqioDevice::new(opened.device)));
    let u = first_unit(dev);
    let qp = qpair(dev, None);
    let b = alloc(dev, u.block_size as usize);
    // SAFETY: live handles throughout; each given up once at the end.
    unsafe {
        assert_eq!(mcqio_submit_read(qp, u.id, 0, 1, b, 3), Status::Ok);
        assert_eq!(mcqio_qpair_ring(qp), Status::Ok);
        fake.set_ignore_disable(true);
        fake.set_fatal();
        let c = one(qp);
        assert_eq!((c.user_tag, c.buf, c.flags), (3, b, MCQIO_CPL_BUF_LOST));
        assert_eq!(c.status, Status::Failed);
        assert_eq!(mcqio_buf_state_of(b), BufState::Lost);
        assert!(mcqio_buf_data(b).is_null());
        assert_eq!(mcqio_submit_read(qp, u.id, 0, 1, b, 4), Status::Invalid);
        assert!(last().contains("lost"), "{}", last());
        assert_eq!(mcqio_buf_free(b), Status::Ok);
        let _ = mcqio_qpair_destroy(qp, None, null_mut());
        mcqio_device_close(dev);
    }
}

/// What the device posts for a command it had fetched when the host
/// deleted its queue ("aborted: SQ deletion") is the host's abort, as the
/// engine's own `Aborted` is, with the NVMe status kept in `detail`; any
/// other NVMe status stays `MCQIO_STATUS_IO`. (Seen under qemu-user, where
/// the fake's device thread fetched commands before `destroy` deleted the
/// queue, and `destroy_ends_every_command_in_flight_once` got `Io`.)
#[test]
fn a_device_abort_at_queue_deletion_is_aborted() {
    use engine::NvmeStatus;
    let deleted = NvmeStatus {
        dnr: true,
        ..NvmeStatus::new(0, 0x08)
    };
    assert_eq!(
        crate::status::io_status(&Err(engine::IoError::Nvme(deleted))),
        (Status::Aborted, 0x0008)
    );
    assert_eq!(
        crate::status::io_status(&Err(engine::IoError::Nvme(NvmeStatus::new(2, 0x81)))),
        (Status::Io, 0x0281)
    );
}
