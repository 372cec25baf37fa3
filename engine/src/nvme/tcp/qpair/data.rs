//! A command's data on the socket: the pieces of its buffer
//! ([`IoBuf::segment_host`]), C2HData copied in, in-capsule and H2CData
//! pieces queued straight from the buffer, a CapsuleCmd queued with its
//! data.

use super::{Cmd, Kind, HEADER_ROOM};
use crate::core::io::IoBuf;
use crate::core::qpair::Engine;
use crate::nvme::spec::Sqe;
use crate::nvme::tcp::conn::{Conn, TxQueue};
use crate::nvme::tcp::digest::DataDigest;
use crate::nvme::tcp::fabrics::FabricsSqe;
use crate::nvme::tcp::fabrics::SglDescriptor;
use crate::nvme::tcp::pdu;

/// The buffer that holds `slot`'s bytes: its own, or its split parent's.
#[inline]
pub(super) fn buf_of<B: IoBuf>(eng: &Engine<B, ()>, slot: u16) -> Option<&B> {
    match eng.trackers.slot(slot).buf.as_ref() {
        Some(b) => Some(b),
        None => eng.splits.buf_of(eng.splits.parent_of(slot)?),
    }
}

/// Call `each` with the host pieces of `buf`'s bytes `at..at + len` (only
/// inside its segments, whatever `at` and `len` say).
#[inline]
pub(super) fn pieces<B: IoBuf>(
    buf: &B,
    mut at: u64,
    mut len: usize,
    mut each: impl FnMut(*mut u8, usize),
) {
    for i in 0..buf.segment_count() {
        if len == 0 {
            return;
        }
        let seg = buf.segment(i).len as u64;
        if at >= seg {
            at -= seg;
            continue;
        }
        let Some(host) = buf.segment_host(i) else {
            return;
        };
        let n = ((seg - at) as usize).min(len);
        // SAFETY: `at < seg` and `at + n <= seg`: inside segment `i`, which
        // `segment_host` says is valid for `seg` bytes.
        each(unsafe { host.as_ptr().add(at as usize) }, n);
        len -= n;
        at = 0;
    }
}

/// Copy `data` into `buf` at `at` (the caller checked the range against
/// the command's transfer, which fits the buffer).
#[inline]
pub(super) fn copy_into<B: IoBuf>(buf: &B, at: u64, data: &[u8]) {
    let mut off = 0;
    pieces(buf, at, data.len(), |p, n| {
        // SAFETY: `p..p + n` lies inside one segment of a buffer the queue
        // pair holds (in flight: nobody else touches it, and no reference
        // to it exists); `data` is the receive buffer, a different
        // allocation.
        unsafe { std::ptr::copy_nonoverlapping(data[off..].as_ptr(), p, n) };
        off += n;
    });
}

/// Queue `buf`'s bytes `at..at + len` on `tx` (and their data digest if
/// `ddgst`).
pub(super) fn queue_data<B: IoBuf>(tx: &mut TxQueue, buf: &B, at: u64, len: usize, ddgst: bool) {
    let mut d = DataDigest::new();
    pieces(buf, at, len, |p, n| {
        if ddgst {
            // SAFETY: inside one segment of a buffer held in flight; a
            // write's buffer is only read, by us, while we hold it.
            d.update(unsafe { std::slice::from_raw_parts(p, n) });
        }
        // SAFETY: the buffer stays in its tracker (or its split parent's)
        // until the command completes, which `Violation::CompletedBeforeData`
        // keeps from happening before these bytes are sent; a connection
        // that ends clears the queue before any buffer is handed back.
        unsafe { tx.data(p, n) };
    });
    if ddgst {
        tx.digest(&d);
    }
}

/// Send-queue pieces the CapsuleCmd of a command moving `kind` data from
/// a buffer of `segs` segments takes at most (with [`HEADER_ROOM`] arena
/// bytes): its header, then for in-capsule data a piece per segment and
/// the data digest. One rule for queueing a capsule and for checking room
/// for a whole split beforehand.
#[inline]
pub(super) fn capsule_pieces(kind: Kind, segs: usize) -> usize {
    if kind == Kind::WriteInCapsule {
        segs + 2
    } else {
        1
    }
}

/// The data of one H2CData PDU for `buf`'s bytes `at..at + want`: how many
/// bytes (`want`, or fewer so they fit `max_pieces` pieces of the send
/// queue — only a buffer of very many segments is cut) and how many
/// pieces they take.
#[inline]
pub(super) fn h2c_span<B: IoBuf>(buf: &B, at: u64, want: u32, max_pieces: usize) -> (u32, usize) {
    if buf.segment_count() == 1 {
        return (want, 1);
    }
    let (mut bytes, mut n) = (0u64, 0usize);
    pieces(buf, at, want as usize, |_, len| {
        if n < max_pieces {
            bytes += len as u64;
            n += 1;
        }
    });
    (bytes as u32, n)
}

/// Queue the CapsuleCmd of `sqe` (CID set) moving `kind` data; record it
/// in `cmd`. `false`: no room in the send queue.
#[allow(clippy::too_many_arguments)]
pub(super) fn queue_capsule<B: IoBuf>(
    tx: &mut TxQueue,
    conn: &Conn,
    cmd: &mut Cmd,
    sqe: Sqe,
    kind: Kind,
    len: u32,
    base: u64,
    buf: Option<&B>,
) -> bool {
    let inline = kind == Kind::WriteInCapsule;
    if !tx.room(
        HEADER_ROOM,
        capsule_pieces(kind, buf.map_or(0, IoBuf::segment_count)),
    ) {
        return false;
    }
    let sgl = if inline {
        SglDescriptor::in_capsule(0, len)
    } else {
        SglDescriptor::transport(if kind == Kind::NoData { 0 } else { len })
    };
    let sqe = sqe.with_sgl(sgl);
    let data_len = if inline { len as usize } else { 0 };
    let neg = &conn.neg;
    let r = tx.header(|b| {
        pdu::write_capsule_cmd_header(b, &sqe, data_len, neg).map(|l| {
            if data_len > 0 {
                l.pdo
            } else {
                l.header_end
            }
        })
    });
    if r.is_err() {
        return false;
    }
    if let (true, Some(b)) = (inline, buf) {
        queue_data(tx, b, base, len as usize, neg.digests.data);
    }
    *cmd = Cmd {
        kind,
        len,
        base,
        cid: (sqe.cdw0 >> 16) as u16,
        got: 0,
        r2t_open: 0,
        data_done_at: tx.queued,
    };
    true
}
