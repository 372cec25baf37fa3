//! [`TcpQueuePair`]: one NVMe/TCP I/O queue on its own connection, owned by
//! one thread, on the shared queue-pair engine (`core::qpair`).
//!
//! The wire's part of the lifecycle:
//!
//! - **submit** builds each command's CapsuleCmd header in a fixed arena
//!   and queues it with its in-capsule data (a write up to IOCCSZ) straight
//!   from the command's buffer; `ring` hands everything queued since the
//!   last ring to the socket in **one vectored send** (`sendmsg`).
//! - **reap** makes at most **one receive** into the connection's buffer
//!   and parses the PDUs in place: C2HData is copied straight into the
//!   command's buffer ([`IoBuf::segment_host`]); an R2T goes to the
//!   connection's R2T queue (`tcp::r2t`, sized once by slots × (MAXR2T +
//!   1)) and is answered, oldest R2T first, with H2CData PDUs of at most
//!   MAXH2CDATA bytes (their data again straight from the buffer) as the
//!   send queue has room — at the end of the pass and on every later
//!   send, for as long as the socket takes them — so no R2T the spec
//!   allows, however large, ever waits on more room than an empty send
//!   queue has; a CapsuleResp, or a
//!   C2HData with SUCCESS, ends the command through the engine, which
//!   proves its CID (slot and generation) and completes it exactly once.
//! - Every PDU is checked before a byte moves: its CID must name a command
//!   in flight of the right kind, data must arrive in order and inside the
//!   transfer, R2Ts in order, inside the transfer and no more outstanding
//!   than MAXR2T + 1 (an R2T counts until its own data was all handed to
//!   the socket: the target may send the next once it received it), and a
//!   command completes only after its data left (none of it still owed).
//!   Any violation, a malformed PDU, a TermReq or a closed socket **ends
//!   the connection** with a typed [`TcpError`]: every command in flight
//!   ends once with [`IoError::ConnectionLost`] (buffers back: a socket
//!   reaches no memory once we stop calling it) and `poll` reports the
//!   error as [`Error::Transport`].
//! - The send queue (`TxQueue`) holds PDU headers in an arena reused from
//!   its start once everything queued has left: every addition needs room
//!   and sends only take away, so whenever it is full nothing more is
//!   added until the socket took it all and it starts again; H2CData
//!   stays at most `SEND_AHEAD` bytes ahead of the socket, the rest owed
//!   in the R2T queue, so submissions keep their room under sustained R2T
//!   writes. A split is queued all or nothing (a child that does not fit
//!   takes the others back out of the send queue, unsent, and the request
//!   is refused with its buffer).
//! - Closing a queue pair lets its commands finish, then shuts its socket
//!   down, as Linux's initiator stops an I/O queue (no Disconnect: Linux's
//!   nvmet-tcp does not implement it on an I/O queue and logs each as a
//!   failed command).
//! - Timeouts (`QpairOptions::io_timeout`) send Abort on the admin queue
//!   (`TimeoutPolicy::Abort`); what that does not settle resets the
//!   controller — a reconnect of the association
//!   ([`TcpController::reset`]) — after which every queue pair ends its
//!   commands once with [`IoError::AbortedByReset`] and Connects its queue
//!   again. A reset also brings back a queue pair whose own connection
//!   ended.
//!
//! What a socket cannot promise that a PCIe queue can: every submit batch
//! costs a `sendmsg` and seeing answers a `recv` (a PCIe queue needs one
//! doorbell store and no system call). The queue pair does not receive on
//! every poll: its receive pacer (`tcp::pace`) holds receives after one
//! that brought data, for a number of polls learnt so that a receive
//! brings about three quarters of what is in flight (no hold at depth 1,
//! at most `HOLD_MAX` polls; [`super::TcpOptions::recv_pacing`] switches
//! it off), and backs off after receives that found nothing. The price is
//! that an answer may wait in the socket for up to that hold. And data is
//! copied twice each way (the kernel's copy into or out of the socket,
//! ours between the receive buffer and the command's buffer) where a PCIe
//! device moves it once by DMA. A target that stops answering is only
//! noticed by a timeout.
//!
//! **Waiting** ([`crate::WaitPolicy::Interrupt`], `Hybrid`): a socket has
//! no interrupt to enable; its readiness is the interrupt. A waiting queue
//! pair keeps an epoll set holding its connection (`tcp::ready`), which the
//! core's `wait`, `BlockQueue::arm_sleep` callers and `AsyncQueue::tokio`
//! watch like any queue's eventfd: readable when an answer arrived or the
//! connection ended, or — only while sends are held up by a full socket
//! buffer — when the socket has room. Arming clears the receive pacer's
//! hold, so the poll before the sleep (and the first one after it)
//! receives: a queue never sleeps on an answer its pacer held back in the
//! socket, and its own receive buffer then holds at most the front of a
//! PDU whose rest wakes it. What that costs a socket, beyond a PCIe
//! queue's eventfd: each sleep is a `poll(2)` of the set besides the
//! `recv` that finds nothing before it, and each wake-up a `recv` more;
//! at depth 1 an I/O that sleeps costs about a `sendmsg`, three `recv`s
//! and a `poll` (a polled one: a `sendmsg` and its `recv`s). The Keep
//! Alive and the command timeouts run from the sleep's slices (10 ms).

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcqio_vfio::DmaSpace;

use super::conn::{Conn, TxQueue};
use super::controller::{connect_queue, TcpController};
use super::digest::DataDigest;
use super::error::{TcpError, Violation};
use super::fabrics::{FabricsSqe, SglDescriptor};
use super::pace::RecvPacer;
use super::pdu::{self, pdu_type, DataPdu, Direction, Parse, Pdu};
use super::r2t::{Owed, R2tQueue};
use super::ready::ReadySet;
use crate::core::io::{Completion, DmaBuf, IoBuf, IoError, SubmitError, SubmitErrorKind};
use crate::core::qpair::wait::Waiter;
use crate::core::qpair::{
    Addressed, Engine, Interrupt, QueueCounters, Reaped, Recreated, SplitRequest, Wire,
};
use crate::core::state::Stopped;
use crate::core::timeout::{self, Expired, TimeoutActions, Timeouts};
use crate::core::tracker::Trackers;
use crate::nvme::pcie::qpair::QpairOptions;
use crate::nvme::spec::sqe::{
    Abort, Command, DatasetManagement, DsmRange, Flush, Read, Write, MAX_NLB,
};
use crate::nvme::spec::status::{generic, sct};
use crate::nvme::spec::{NvmeStatus, Sqe};
use crate::{Error, Result};

/// Polls between looks at the Keep Alive clock.
const KEEP_ALIVE_POLLS: u32 = 256;
/// Empty polls (with commands outstanding) between health looks.
const HEALTH_CHECK_INTERVAL: u32 = 4096;
/// Arena bytes one PDU header may take: 72-byte CapsuleCmd header, its
/// digest, padding to a CPDA of up to 128 bytes, a data digest.
const HEADER_ROOM: usize = 136;
/// Arena bytes for H2CData headers beyond one capsule per slot.
const H2C_ARENA: usize = 64 << 10;
/// Receive-buffer bytes per queue entry beyond the largest data PDU, so
/// one `recv` can take the answers to a whole batch of small reads (a 4 KiB
/// read's C2HData and CapsuleResp with digests and padding).
const RX_PER_ENTRY: usize = 4096 + 128;
/// Entries the receive buffer is sized for at most.
const RX_ENTRIES_MAX: usize = 256;
/// Bytes of H2CData queued ahead of the socket at most: owed R2T data
/// beyond it waits in the R2T queue (`tcp::r2t`), which keeps the send
/// queue's arena for submissions and lets it drain and restart often.
const SEND_AHEAD: u64 = 1 << 20;
/// Queue-and-send rounds one pass makes for owed R2T data.
const OWED_ROUNDS: usize = 16;
/// R2Ts per command the R2T queue is sized for at most (a larger MAXR2T
/// still works; the queue then grows the first time it is needed).
const R2TS_SIZED: u32 = 16;

const ABORT_REQUESTED: NvmeStatus = NvmeStatus::new(sct::GENERIC, generic::ABORT_REQUESTED);

/// What a command in a slot moves.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
enum Kind {
    /// No data (Flush), or data in the arena (Dataset Management).
    #[default]
    NoData,
    /// Data comes back by C2HData.
    Read,
    /// Data went in the capsule.
    WriteInCapsule,
    /// Data goes out by R2T and H2CData.
    WriteR2t,
}

/// The wire's record of the command in a tracker slot.
#[derive(Copy, Clone, Debug, Default)]
struct Cmd {
    kind: Kind,
    /// Bytes of the transfer.
    len: u32,
    /// Where the transfer starts in the buffer (a split child's offset in
    /// its parent's buffer).
    base: u64,
    /// Its CID (slot and generation).
    cid: u16,
    /// Read: bytes received; R2T write: bytes asked for by R2Ts so far.
    got: u32,
    /// Its R2Ts in the R2T queue: data not all sent yet.
    r2t_open: u32,
    /// The send queue position after all this command's queued data.
    data_done_at: u64,
}

#[derive(Copy, Clone, Debug)]
struct NsGeom {
    id: u32,
    nsze: u64,
    shift: u32,
    usable: bool,
}

/// Counters of one NVMe/TCP queue pair.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TcpQpairStats {
    /// The counters every queue pair keeps.
    pub counters: QueueCounters,
    /// `sendmsg` calls.
    pub sends: u64,
    /// `recv` calls.
    pub recvs: u64,
    /// `recv` calls that found nothing (EAGAIN).
    pub empty_recvs: u64,
    /// PDUs received and parsed.
    pub pdus: u64,
    /// C2HData PDUs received.
    pub c2h_data: u64,
    /// R2Ts answered.
    pub r2ts: u64,
    /// H2CData PDUs sent.
    pub h2c_data: u64,
    /// Times H2CData owed for R2Ts waited for room in the send queue (or
    /// for the socket to take what was queued ahead of it).
    pub r2t_waits: u64,
    /// Writes whose data went in the capsule.
    pub in_capsule_writes: u64,
}

/// One NVMe/TCP I/O queue pair (see the module docs). `Send`, not `Sync`:
/// one per thread. Its I/O API is [`crate::core::block::BlockQueue`] (and
/// the blocking helpers `read_blocking`, `write_blocking`, `flush_blocking`), as on every
/// wire.
pub struct TcpQueuePair<B: IoBuf = DmaBuf> {
    eng: Engine<B, ()>,
    ctrl: Arc<TcpController>,
    qid: u16,
    /// Queue entries asked for in Connect (depth + 1).
    entries: u16,
    conn: Conn,
    tx: TxQueue,
    /// H2CData owed for R2Ts, not all sent yet.
    r2ts: R2tQueue,
    cmds: Box<[Cmd]>,
    in_capsule: usize,
    ns: Vec<NsGeom>,
    /// Why the connection ended, once it did.
    failed: Option<TcpError>,
    polls: u32,
    /// Which polls receive (`tcp::pace`).
    pacer: RecvPacer,
    /// What a waiting queue sleeps on (`tcp::ready`); `None`: polled only
    /// ([`crate::WaitPolicy::Poll`]).
    ready: Option<ReadySet>,
    stats: TcpQpairStats,
    /// The qid went back to the controller.
    released: bool,
    /// Tests: the split child (by its first LBA) that fails to queue.
    #[cfg(test)]
    fail_child: Option<u64>,
}

impl<B: IoBuf> std::fmt::Debug for TcpQueuePair<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpQueuePair")
            .field("qid", &self.qid)
            .field("depth", &self.eng.depth())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

/// The buffer that holds `slot`'s bytes: its own, or its split parent's.
#[inline]
fn buf_of<B: IoBuf>(eng: &Engine<B, ()>, slot: u16) -> Option<&B> {
    match eng.trackers.slot(slot).buf.as_ref() {
        Some(b) => Some(b),
        None => eng.splits.buf_of(eng.splits.parent_of(slot)?),
    }
}

/// Call `each` with the host pieces of `buf`'s bytes `at..at + len` (only
/// inside its segments, whatever `at` and `len` say).
#[inline]
fn pieces<B: IoBuf>(buf: &B, mut at: u64, mut len: usize, mut each: impl FnMut(*mut u8, usize)) {
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
fn copy_into<B: IoBuf>(buf: &B, at: u64, data: &[u8]) {
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
fn queue_data<B: IoBuf>(tx: &mut TxQueue, buf: &B, at: u64, len: usize, ddgst: bool) {
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
fn capsule_pieces(kind: Kind, segs: usize) -> usize {
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
fn h2c_span<B: IoBuf>(buf: &B, at: u64, want: u32, max_pieces: usize) -> (u32, usize) {
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
fn queue_capsule<B: IoBuf>(
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

/// Open queue `qid`'s connection and Connect it (`entries` deep) under
/// the controller's current id; non-blocking when it returns.
fn open_conn(ctrl: &TcpController, qid: u16, entries: u16) -> Result<Conn> {
    let max_data = u32::try_from(ctrl.max_transfer).unwrap_or(u32::MAX);
    let rx_extra = usize::from(entries).min(RX_ENTRIES_MAX) * RX_PER_ENTRY;
    let mut conn = Conn::open(
        ctrl.addr,
        ctrl.opts.digests(),
        ctrl.opts.maxr2t,
        max_data,
        rx_extra,
        ctrl.opts.admin_timeout,
    )
    .map_err(TcpError::into_error)?;
    connect_queue(&mut conn, &ctrl.opts, qid, entries, ctrl.cntlid(), 0)?;
    conn.set_blocking(false).map_err(TcpError::into_error)?;
    Ok(conn)
}

impl<B: IoBuf> TcpQueuePair<B> {
    /// Open the queue's connection and Connect queue `qid` (see
    /// [`TcpController::create_qpair`]).
    pub(super) fn create(ctrl: &Arc<TcpController>, o: &QpairOptions) -> Result<Self> {
        if !matches!(o.mapping, crate::MappingMode::Premapped) {
            return Err(Error::InvalidOption(
                "NVMe/TCP queue pairs take premapped buffers (the socket copies; nothing is mapped per I/O)".into(),
            ));
        }
        let entries = u32::from(o.depth) + 1;
        if o.depth == 0 || o.depth > 4096 || entries > ctrl.max_entries() {
            return Err(Error::InvalidOption(format!(
                "depth {} must be 1..={} (CAP.MQES + 1 = {} entries, one kept free)",
                o.depth,
                ctrl.max_entries().saturating_sub(1).min(4096),
                ctrl.max_entries()
            )));
        }
        let qid = ctrl.alloc_qid()?;
        let conn = match open_conn(ctrl, qid, entries as u16) {
            Ok(c) => c,
            Err(e) => {
                ctrl.release_qid(qid);
                return Err(e);
            }
        };
        let depth = usize::from(o.depth);
        let ready = match o.wait.wants_interrupt() {
            true => {
                let set = ReadySet::new().and_then(|mut s| {
                    s.watch(conn.sock.as_raw_fd())?;
                    Ok(s)
                });
                match set {
                    Ok(s) => Some(s),
                    Err(e) => {
                        ctrl.release_qid(qid);
                        return Err(Error::InvalidOption(format!(
                            "NVMe/TCP queue {qid}: an epoll set to wait on its socket: {e}"
                        )));
                    }
                }
            }
            false => None,
        };
        let mut eng = Engine::new(
            o.depth,
            o.max_completions_per_poll,
            ctrl.max_transfer,
            o.io_timeout,
            o.timeout_policy,
            o.blocking_timeout,
            crate::core::state::Controlled::state_word(&**ctrl).load(),
        );
        if let Some(r) = &ready {
            eng.wait = Waiter::new(o.wait, Some(Interrupt::Ready(r.fd())), false);
        }
        let ns = ctrl
            .namespaces()
            .iter()
            .map(|n| NsGeom {
                id: n.id,
                nsze: n.nsze,
                shift: n.lba_shift,
                usable: n.usable,
            })
            .collect();
        let r2ts_each = ctrl.opts.maxr2t.saturating_add(1).min(R2TS_SIZED) as usize;
        Ok(TcpQueuePair {
            r2ts: R2tQueue::with_capacity(eng.trackers.slots() * r2ts_each),
            cmds: vec![Cmd::default(); eng.trackers.slots()].into_boxed_slice(),
            eng,
            ctrl: Arc::clone(ctrl),
            qid,
            entries: entries as u16,
            conn,
            tx: TxQueue::new(depth * HEADER_ROOM + H2C_ARENA, depth * 8 + 4096),
            in_capsule: ctrl.in_capsule_bytes(),
            ns,
            failed: None,
            polls: 0,
            pacer: RecvPacer::new(ctrl.opts.recv_pacing),
            ready,
            stats: TcpQpairStats::default(),
            released: false,
            #[cfg(test)]
            fail_child: None,
        })
    }

    /// The queue id.
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// The controller.
    pub fn controller(&self) -> &Arc<TcpController> {
        &self.ctrl
    }

    /// The counters.
    pub fn stats(&self) -> TcpQpairStats {
        TcpQpairStats {
            counters: self.eng.counters(),
            sends: self.tx.sends,
            ..self.stats
        }
    }

    /// The counters every queue pair keeps.
    pub fn counters(&self) -> QueueCounters {
        self.eng.counters()
    }

    /// Why the connection ended, if it did.
    pub fn connection_error(&self) -> Option<TcpError> {
        self.failed
    }

    /// Close: let the commands in flight finish (bounded by the admin
    /// timeout), shut the connection down (as Linux's initiator closes an
    /// I/O queue: no Disconnect), and end what is left once with
    /// [`IoError::Aborted`].
    pub fn close(mut self, mut f: impl FnMut(Completion<B>)) -> Result<()> {
        self.shutdown(&mut f)
    }

    fn geom(&self, nsid: u32) -> Option<NsGeom> {
        self.ns.iter().find(|n| n.id == nsid).copied()
    }

    /// End the connection with `e`: every command in flight ends once
    /// with [`IoError::ConnectionLost`], at most `budget` through `f` (the
    /// rest are held for the next polls). Returns those delivered.
    #[cold]
    #[inline(never)]
    fn fail_conn<F: FnMut(Completion<B>)>(
        &mut self,
        e: TcpError,
        budget: usize,
        f: &mut F,
    ) -> usize {
        log::error!("nvme-tcp queue {}: connection ends: {e}", self.qid);
        if let Some(r) = &mut self.ready {
            r.unwatch();
        }
        self.conn.terminate(&e);
        // Nothing reads a buffer once the queue is cleared.
        self.drop_sends();
        self.failed = Some(e);
        let n = self.budgeted(budget, f, |q, g| {
            q.eng.end_all(IoError::ConnectionLost, true, g);
        });
        self.eng.stopped = Some(Stopped::Lost);
        n
    }

    /// Send what is queued, and H2CData owed for R2Ts as the send queue
    /// has room; a socket error ends the connection. `Ok(true)`: something
    /// went out.
    #[inline]
    fn flush_tx(&mut self) -> std::result::Result<bool, TcpError> {
        let mut r = self.tx.flush(&self.conn.sock);
        if self.r2ts.has_unqueued() {
            r = self.send_owed(r);
        }
        if !self.tx.is_empty() {
            self.sends_held();
        }
        r
    }

    /// [`TcpQueuePair::flush_tx`] with R2T data owed (`first`: the first
    /// send's result): queue what fits and send it, for as long as the
    /// socket takes it (bounded rounds).
    #[cold]
    #[inline(never)]
    fn send_owed(
        &mut self,
        first: std::result::Result<bool, TcpError>,
    ) -> std::result::Result<bool, TcpError> {
        let mut any = first?;
        for _ in 0..OWED_ROUNDS {
            if !self.r2ts.has_unqueued() || !self.queue_owed() {
                break;
            }
            if !self.tx.flush(&self.conn.sock)? {
                break;
            }
            any = true;
        }
        Ok(any)
    }

    /// Queue H2CData PDUs for the R2T queue (`tcp::r2t`), oldest R2T
    /// first, each R2T's PDUs in order, while the send queue has room and
    /// is less than [`SEND_AHEAD`] ahead of the socket. An R2T of a
    /// command that ended is dropped unanswered. Returns whether anything
    /// was queued.
    fn queue_owed(&mut self) -> bool {
        let Self {
            eng,
            cmds,
            tx,
            conn,
            r2ts,
            stats,
            ..
        } = self;
        let chunk = conn.maxh2cdata.max(4);
        let neg = &conn.neg;
        let ddgst = neg.digests.data;
        let max_pieces = tx.piece_capacity().saturating_sub(2).max(1);
        let mut any = false;
        while let Some(o) = r2ts.next_to_queue() {
            let live = eng.trackers.lookup(o.cid) == Some(o.slot);
            let Some(buf) = buf_of(eng, o.slot).filter(|_| live) else {
                // Its command ended: nothing is sent for it.
                r2ts.drop_next();
                let cmd = &mut cmds[usize::from(o.slot)];
                if cmd.cid == o.cid {
                    cmd.r2t_open = cmd.r2t_open.saturating_sub(1);
                }
                continue;
            };
            let cmd = &mut cmds[usize::from(o.slot)];
            let mut at = o.at;
            while at < o.end {
                let want = chunk.min(o.end - at);
                let (n, p) = h2c_span(buf, cmd.base + u64::from(at), want, max_pieces);
                if n == 0 || tx.unsent() >= SEND_AHEAD || !tx.room(HEADER_ROOM, p + 2) {
                    r2ts.queued_to(at, tx.queued);
                    stats.r2t_waits += 1;
                    return any;
                }
                let d = DataPdu {
                    pdu_type: pdu_type::H2C_DATA,
                    cccid: o.cid,
                    ttag: o.ttag,
                    datao: at,
                    last: at + n == o.end,
                    success: false,
                };
                if tx
                    .header(|b| pdu::write_data_header(b, &d, n as usize, neg).map(|l| l.pdo))
                    .is_err()
                {
                    r2ts.queued_to(at, tx.queued);
                    return any;
                }
                queue_data(tx, buf, cmd.base + u64::from(at), n as usize, ddgst);
                stats.h2c_data += 1;
                any = true;
                at += n;
                cmd.data_done_at = tx.queued;
            }
            r2ts.queued_to(at, tx.queued);
        }
        any
    }

    /// Forget every send queued or owed (the connection is gone: nothing
    /// will read the buffers any more).
    fn drop_sends(&mut self) {
        self.tx.clear();
        self.r2ts.clear();
    }

    /// The socket's buffer is full and bytes are left to send: a waiting
    /// queue also wakes when it has room (`tcp::ready`).
    #[cold]
    fn sends_held(&mut self) {
        if let Some(r) = &mut self.ready {
            r.want_writable(true);
        }
    }

    /// Queue a command that the engine does not split.
    #[allow(clippy::too_many_arguments)]
    fn queue_one(&mut self, sqe: Sqe, kind: Kind, len: u32, buf: Option<&B>, slot: u16) -> bool {
        let cid = self.eng.trackers.slot(slot).cid();
        let sqe = sqe.with_cid(cid);
        let Self { tx, conn, cmds, .. } = self;
        let cmd = &mut cmds[usize::from(slot)];
        if queue_capsule(tx, conn, cmd, sqe, kind, len, 0, buf) {
            return true;
        }
        // Full: send what is queued, then try once more.
        if tx.flush(&conn.sock).is_err() {
            return false;
        }
        queue_capsule(tx, conn, cmd, sqe, kind, len, 0, buf)
    }

    /// A read or write above the per-command limit, as children: planned
    /// and refused all or nothing by the engine, then queued all or
    /// nothing here. Room for every child's capsule is checked before the
    /// plan (with the rule `queue_capsule` uses, `capsule_pieces`); should
    /// a child still not queue, what the others queued is taken back out
    /// of the send queue (none of it was sent), every slot is freed and
    /// the request is refused with [`SubmitErrorKind::QueueFull`], its
    /// buffer back — never a child left unsent with its parent waiting.
    #[allow(clippy::too_many_arguments)]
    fn split(
        &mut self,
        nsid: u32,
        lba: u64,
        blocks: u32,
        shift: u32,
        limit: u64,
        buf: B,
        tag: u64,
        read: bool,
    ) -> std::result::Result<(), SubmitError<B>> {
        let per_child = limit >> shift;
        let children = if per_child == 0 {
            0
        } else {
            u64::from(blocks).div_ceil(per_child) as usize
        };
        let in_capsule = self.in_capsule;
        let kind_of = |len: u64| {
            if read {
                Kind::Read
            } else if len as usize <= in_capsule {
                Kind::WriteInCapsule
            } else {
                Kind::WriteR2t
            }
        };
        // Any write child may go in the capsule (the last may be short).
        let widest = if read {
            Kind::Read
        } else {
            Kind::WriteInCapsule
        };
        let pieces = capsule_pieces(widest, buf.segment_count());
        let _ = self.flush_tx();
        if children > 0 && !self.tx.room(children * HEADER_ROOM, children * pieces) {
            return Err(SubmitError {
                kind: SubmitErrorKind::QueueFull,
                buf,
            });
        }
        let r = SplitRequest {
            lba,
            blocks,
            shift,
            per_child,
            tag,
        };
        let (p, plan) = self.eng.plan_split(r, buf, |_, _| Ok(()))?;
        let mark = self.tx.mark();
        let mut all = true;
        for (c, ()) in &plan {
            #[cfg(test)]
            let refused = self.fail_child == Some(c.lba);
            #[cfg(not(test))]
            let refused = false;
            let len = c.bytes as u32;
            let kind = kind_of(c.bytes);
            let cid = self.eng.trackers.slot(c.slot).cid();
            let sqe = if read {
                Read::new(nsid, c.lba, c.blocks).sqe()
            } else {
                Write::new(nsid, c.lba, c.blocks).sqe()
            }
            .with_cid(cid);
            let Self {
                tx,
                conn,
                cmds,
                eng,
                ..
            } = self;
            let b = eng.splits.buf_of(p);
            let cmd = &mut cmds[usize::from(c.slot)];
            if refused || !queue_capsule(tx, conn, cmd, sqe, kind, len, c.offset, b) {
                all = false;
                break;
            }
        }
        if !all {
            return Err(self.unplan_split(p, plan, mark));
        }
        for (c, ()) in &plan {
            if !read && c.bytes as usize <= self.in_capsule {
                self.stats.in_capsule_writes += 1;
            }
            self.eng.arm_child(c.slot, p, tag);
        }
        self.eng.armed_split(plan);
        Ok(())
    }

    /// Take back a split whose children did not all queue: out of the send
    /// queue, every slot free, the parent ended; the refusal with the
    /// buffer.
    #[cold]
    #[inline(never)]
    fn unplan_split(
        &mut self,
        p: u16,
        plan: Vec<(crate::core::qpair::Child, ())>,
        mark: super::conn::TxMark,
    ) -> SubmitError<B> {
        if !self.tx.roll_back(mark) {
            // Sent already (not possible: nothing flushes in between):
            // the bytes are on the wire; the connection cannot go on.
            log::error!(
                "nvme-tcp queue {}: a split's capsules left before all were queued",
                self.qid
            );
            self.conn.close();
        }
        let mut back = None;
        for (c, ()) in &plan {
            self.eng.trackers.unreserve(c.slot);
            if let Some((_, buf, _)) = self.eng.splits.child_done(c.slot, p, Err(IoError::Aborted))
            {
                back = buf;
            }
        }
        self.eng.armed_split(plan);
        log::warn!(
            "nvme-tcp queue {}: a split's children did not all fit the send queue; refused",
            self.qid
        );
        match back {
            Some(buf) => SubmitError {
                kind: SubmitErrorKind::QueueFull,
                buf,
            },
            None => unreachable!("the last child of a parent hands its buffer back"),
        }
    }

    /// Handle one received PDU. `Ok(true)`: a command completed through
    /// `f`.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn on_pdu<F: FnMut(Completion<B>)>(
        eng: &mut Engine<B, ()>,
        cmds: &mut [Cmd],
        tx: &TxQueue,
        r2ts: &mut R2tQueue,
        conn: &Conn,
        stats: &mut TcpQpairStats,
        p: Pdu<'_>,
        f: &mut F,
    ) -> std::result::Result<bool, TcpError> {
        stats.pdus += 1;
        match p {
            Pdu::CapsuleResp { cqe } => {
                let slot = eng
                    .trackers
                    .lookup(cqe.cid)
                    .ok_or(Violation::UnknownCid(cqe.cid))?;
                if !r2ts.is_empty() {
                    retire_r2ts(r2ts, cmds, tx.sent);
                }
                let cmd = &cmds[usize::from(slot)];
                if cmd.data_done_at > tx.sent || cmd.r2t_open > 0 {
                    return Err(Violation::CompletedBeforeData(cqe.cid).into());
                }
                let ok = NvmeStatus::raw_is_success(cqe.status);
                if ok && cmd.kind == Kind::Read && cmd.got != cmd.len {
                    return Err(Violation::ShortRead {
                        cid: cqe.cid,
                        got: cmd.got,
                        len: cmd.len,
                    }
                    .into());
                }
                Ok(eng.complete(
                    slot,
                    cqe.dw0,
                    |timeouts, trackers| {
                        if ok {
                            Ok(())
                        } else {
                            Err(error_of(timeouts, trackers, slot, cqe.nvme_status()))
                        }
                    },
                    |_, _| false,
                    f,
                ))
            }
            Pdu::Data {
                cccid,
                datao,
                success,
                data,
                ..
            } => {
                stats.c2h_data += 1;
                let slot = eng
                    .trackers
                    .lookup(cccid)
                    .ok_or(Violation::UnknownCid(cccid))?;
                let cmd = &mut cmds[usize::from(slot)];
                if cmd.kind != Kind::Read {
                    return Err(Violation::DataForNonRead(cccid).into());
                }
                if datao != cmd.got {
                    return Err(Violation::DataOutOfOrder {
                        cid: cccid,
                        datao,
                        expected: cmd.got,
                    }
                    .into());
                }
                let datal = data.len() as u32;
                if u64::from(datao) + u64::from(datal) > u64::from(cmd.len) {
                    return Err(Violation::DataOutOfRange {
                        cid: cccid,
                        datao,
                        datal,
                        len: cmd.len,
                    }
                    .into());
                }
                let buf = buf_of(eng, slot).ok_or(Violation::UnknownCid(cccid))?;
                copy_into(buf, cmd.base + u64::from(datao), data);
                cmd.got += datal;
                if !success {
                    return Ok(false);
                }
                if cmd.got != cmd.len {
                    return Err(Violation::ShortRead {
                        cid: cccid,
                        got: cmd.got,
                        len: cmd.len,
                    }
                    .into());
                }
                Ok(eng.complete(slot, 0, |_, _| Ok(()), |_, _| false, f))
            }
            Pdu::R2t {
                cccid,
                ttag,
                r2to,
                r2tl,
            } => {
                let slot = eng
                    .trackers
                    .lookup(cccid)
                    .ok_or(Violation::UnknownCid(cccid))?;
                let cmd = &mut cmds[usize::from(slot)];
                if cmd.kind != Kind::WriteR2t {
                    return Err(Violation::R2tForNonWrite(cccid).into());
                }
                if r2to != cmd.got || u64::from(r2to) + u64::from(r2tl) > u64::from(cmd.len) {
                    return Err(Violation::R2tOutOfRange {
                        cid: cccid,
                        r2to,
                        r2tl,
                        next: cmd.got,
                        len: cmd.len,
                    }
                    .into());
                }
                // The R2Ts whose data has all been sent are done as far as
                // the target may know: it counts outstanding R2Ts so.
                retire_r2ts(r2ts, cmds, tx.sent);
                let cmd = &mut cmds[usize::from(slot)];
                let max_r2ts = conn.max_r2ts;
                if cmd.r2t_open >= max_r2ts {
                    return Err(Violation::R2tLimit {
                        cid: cccid,
                        outstanding: cmd.r2t_open + 1,
                        max: max_r2ts,
                    }
                    .into());
                }
                if buf_of(eng, slot).is_none() {
                    return Err(Violation::UnknownCid(cccid).into());
                }
                // Answered as the send queue has room (`tcp::r2t`).
                let end = r2to + r2tl;
                r2ts.push(Owed {
                    slot,
                    cid: cccid,
                    ttag,
                    at: r2to,
                    end,
                    done_at: 0,
                });
                cmd.r2t_open += 1;
                cmd.got = end;
                stats.r2ts += 1;
                Ok(false)
            }
            Pdu::TermReq { fes, fei, .. } => Err(TcpError::Terminated { fes, fei }),
            other => Err(Violation::UnexpectedPdu(super::conn::type_of(&other)).into()),
        }
    }

    /// The reaping pass (see the module docs).
    fn reap_pdus<F: FnMut(Completion<B>)>(&mut self, max: usize, f: &mut F) -> Reaped {
        let mut r = Reaped::default();
        if self.failed.is_some() {
            return r;
        }
        let in_flight = self.eng.trackers.outstanding();
        if in_flight == 0 && self.conn.rx.is_empty() {
            self.pacer.idle();
            return r;
        }
        // At most one receive per pass, on the polls the pacer lets.
        let r2ts = self.stats.r2ts;
        let mut received = false;
        let spare = self.conn.rx.spare();
        if !spare.is_empty() && self.pacer.due() {
            self.stats.recvs += 1;
            match std::io::Read::read(&mut &self.conn.sock, spare) {
                Ok(0) => {
                    r.delivered += self.fail_conn(TcpError::Closed, max, f);
                    r.seen = r.delivered;
                    return r;
                }
                Ok(n) => {
                    self.conn.rx.commit(n);
                    received = true;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.stats.empty_recvs += 1;
                    self.pacer
                        .empty(u32::try_from(in_flight).unwrap_or(u32::MAX));
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    r.delivered += self.fail_conn(TcpError::of_io(&e), max, f);
                    r.seen = r.delivered;
                    return r;
                }
            }
        }
        let mut err = None;
        while r.delivered < max {
            let Self {
                eng,
                cmds,
                tx,
                r2ts,
                conn,
                stats,
                ..
            } = self;
            match conn.rx.peek(Direction::ControllerToHost, &conn.neg) {
                Ok(Parse::Incomplete { .. }) => break,
                Ok(Parse::Complete { pdu, len }) => {
                    let done = Self::on_pdu(eng, cmds, tx, r2ts, conn, stats, pdu, f);
                    conn.rx.consume(len);
                    match done {
                        Ok(true) => {
                            r.delivered += 1;
                            r.seen += 1;
                        }
                        Ok(false) => {}
                        Err(e) => {
                            err = Some(e);
                            break;
                        }
                    }
                }
                Err(e) => {
                    err = Some(TcpError::Pdu(e));
                    break;
                }
            }
        }
        if received {
            let events = r.seen + (self.stats.r2ts - r2ts) as usize;
            self.pacer.got(
                u32::try_from(events).unwrap_or(u32::MAX),
                u32::try_from(in_flight).unwrap_or(u32::MAX),
            );
        }
        if err.is_none() {
            // H2CData queued for R2Ts goes out now.
            if let Err(e) = self.flush_tx() {
                err = Some(e);
            }
        }
        if let Some(e) = err {
            let n = self.fail_conn(e, max - r.delivered, f);
            r.delivered += n;
            r.seen += n;
        }
        r
    }

    /// Queue a command with no data of the caller's (Flush, DSM).
    fn queue_internal_data(
        &mut self,
        sqe: Sqe,
        data: Option<&[u8]>,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<()>> {
        let refuse = |kind| Err(SubmitError { kind, buf: () });
        if self.eng.stopped.is_some() {
            return refuse(SubmitErrorKind::ControllerFailed);
        }
        let Some(slot) = self.eng.trackers.alloc() else {
            return refuse(SubmitErrorKind::QueueFull);
        };
        let ok = match data {
            None => self.queue_one(sqe, Kind::NoData, 0, None, slot),
            Some(d) => {
                // Data from the arena, in the capsule.
                let cid = self.eng.trackers.slot(slot).cid();
                let sqe = sqe
                    .with_cid(cid)
                    .with_sgl(SglDescriptor::in_capsule(0, d.len() as u32));
                let neg = self.conn.neg;
                let tx = &mut self.tx;
                if !tx.room(HEADER_ROOM + d.len(), 3) {
                    false
                } else {
                    let h = tx.header(|b| {
                        pdu::write_capsule_cmd_header(b, &sqe, d.len(), &neg).map(|l| l.pdo)
                    });
                    let body = tx.header(|b: &mut [u8]| -> std::result::Result<usize, ()> {
                        b[..d.len()].copy_from_slice(d);
                        Ok(d.len())
                    });
                    if neg.digests.data {
                        let mut g = DataDigest::new();
                        g.update(d);
                        tx.digest(&g);
                    }
                    self.cmds[usize::from(slot)] = Cmd {
                        data_done_at: tx.queued,
                        ..Cmd::default()
                    };
                    h.is_ok() && body.is_ok()
                }
            }
        };
        if !ok {
            self.eng.trackers.unreserve(slot);
            return refuse(SubmitErrorKind::QueueFull);
        }
        self.eng.arm(slot, tag, None);
        Ok(())
    }
}

/// Retire the R2Ts whose data has all been sent (`sent`): each of its
/// command's count of open R2Ts drops (a command that ended is no longer
/// counted: its record belongs to the slot's next command).
#[inline]
fn retire_r2ts(r2ts: &mut R2tQueue, cmds: &mut [Cmd], sent: u64) {
    r2ts.retire(sent, |o| {
        let cmd = &mut cmds[usize::from(o.slot)];
        if cmd.cid == o.cid {
            cmd.r2t_open = cmd.r2t_open.saturating_sub(1);
        }
    });
}

/// The error of a failed completion: a command we aborted because it timed
/// out reports [`IoError::TimedOut`].
#[cold]
fn error_of<B>(
    timeouts: &mut Timeouts,
    trackers: &Trackers<B>,
    slot: u16,
    st: NvmeStatus,
) -> IoError {
    if st == ABORT_REQUESTED && timeouts.was_aborted(trackers, slot) {
        IoError::TimedOut
    } else {
        IoError::Nvme(st)
    }
}

impl<B: IoBuf> Wire for TcpQueuePair<B> {
    type Buf = B;
    type Ctrl = TcpController;
    type Child = ();
    const HEALTH_CHECK_INTERVAL: u32 = HEALTH_CHECK_INTERVAL;

    crate::core::qpair::wire_parts!(eng, ctrl);

    #[inline]
    fn ring(&mut self) -> bool {
        if self.failed.is_some() {
            return false;
        }
        match self.flush_tx() {
            Ok(sent) => sent,
            Err(e) => {
                // Seen by the next reap: nothing is delivered from here.
                log::error!("nvme-tcp queue {}: send failed: {e}", self.qid);
                self.conn.close();
                false
            }
        }
    }

    #[inline]
    fn reap<F: FnMut(Completion<B>)>(&mut self, max: usize, f: &mut F) -> Reaped {
        self.reap_pdus(max, f)
    }

    #[cold]
    fn check_controller(&mut self) {
        self.ctrl.keep_alive_if_due();
    }

    #[cold]
    fn scan_timeouts(&mut self, _drained: bool, _f: &mut dyn FnMut(Completion<B>)) {
        self.eng.timeouts.begin_scan();
        let mut scan = TcpTimeouts {
            qp: self,
            reset: false,
        };
        timeout::scan(&mut scan);
        if scan.reset && self.state() == self.eng.seen_state {
            // The reset is a reconnect of the association; this poll sees
            // the new state word and recovers (AbortedByReset, re-Connect).
            self.eng.timeouts.stats.resets_requested += 1;
            if let Err(e) = self.ctrl.reset_if(self.eng.seen_state) {
                log::error!(
                    "nvme-tcp queue {}: reconnect after a timeout failed: {e}",
                    self.qid
                );
            }
        }
    }

    #[inline]
    fn after_poll(&mut self) {
        self.polls = self.polls.wrapping_add(1);
        if self.polls % KEEP_ALIVE_POLLS == 0 {
            self.ctrl.keep_alive_if_due();
        }
    }

    /// A socket leaves nothing posted that the next receive would not
    /// find; after the association failed there is nothing to take.
    fn deliver_posted(&mut self, _f: &mut dyn FnMut(Completion<B>)) -> usize {
        0
    }

    fn forget(&mut self) {
        if let Some(r) = &mut self.ready {
            r.unwatch();
        }
        self.conn.close();
        self.drop_sends();
    }

    /// A socket has no count to clear (`tcp::ready`): make the next poll
    /// receive whatever the pacer held, and watch for room to send only
    /// while sends are held up.
    #[cold]
    fn arm_interrupt(&mut self) {
        self.pacer.idle();
        let held = !self.tx.is_empty() || self.r2ts.has_unqueued();
        if let Some(r) = &mut self.ready {
            r.want_writable(held);
        }
    }

    /// The socket woke us (or the slice ran out): the next poll receives.
    #[cold]
    fn after_sleep(&mut self) {
        self.pacer.idle();
    }

    /// After a reset (a new association): a new connection, the same queue
    /// id Connected under the new controller id.
    fn recreate(&mut self, settled: u64) -> Recreated {
        match open_conn(&self.ctrl, self.qid, self.entries) {
            Ok(c) => {
                if let Some(r) = &mut self.ready {
                    if let Err(e) = r.watch(c.sock.as_raw_fd()) {
                        return Recreated::Failed {
                            error: format!("watching the new connection (epoll): {e}"),
                            left: false,
                        };
                    }
                }
                self.conn = c;
                self.failed = None;
                self.drop_sends();
                self.pacer.reset();
                if self.state() != settled {
                    return Recreated::Moved;
                }
                Recreated::Yes(settled)
            }
            Err(e) => Recreated::Failed {
                error: e.to_string(),
                left: false,
            },
        }
    }

    fn note_leak(&self, bytes: u64) {
        if bytes != 0 {
            log::error!("nvme-tcp queue {}: {bytes} bytes leaked", self.qid);
        }
    }

    fn queue_id(&self) -> u16 {
        self.qid
    }

    fn stopped_error(&self, s: Stopped) -> Error {
        if let Some(e) = self.failed.or_else(|| self.ctrl.failure()) {
            return e.into_error();
        }
        match s {
            Stopped::Fatal => Error::ControllerFatal,
            Stopped::Gone => Error::DeviceGone,
            Stopped::Lost => Error::QueueLost { qid: self.qid },
        }
    }

    /// Let what is in flight finish (bounded), then shut the socket down,
    /// as Linux's initiator stops an I/O queue: no Disconnect, which
    /// Linux's nvmet-tcp does not implement on an I/O queue (it answers
    /// Invalid Opcode and logs a failed command); the target ends the
    /// queue when its connection ends. A socket reaches no buffer once we
    /// stop using it, so this always reports the queue withdrawn.
    fn withdraw_all(&mut self, f: &mut dyn FnMut(Completion<B>)) -> Result<bool> {
        if self.failed.is_some() {
            return Ok(true);
        }
        let t = self.ctrl.opts.admin_timeout;
        let deadline = Instant::now() + t;
        let mut g = |c| f(c);
        while self.eng.trackers.outstanding() > 0 && self.failed.is_none() {
            if Instant::now() >= deadline {
                log::warn!(
                    "nvme-tcp queue {}: {} commands still in flight at close",
                    self.qid,
                    self.eng.trackers.outstanding()
                );
                self.conn.close();
                self.drop_sends();
                return Ok(true);
            }
            self.ring();
            if self.reap(usize::MAX, &mut g).seen == 0 {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        self.conn.close();
        self.drop_sends();
        Ok(true)
    }

    fn closed(&mut self, _gone: bool) {
        self.conn.close();
        if !self.released {
            self.released = true;
            self.ctrl.release_qid(self.qid);
        }
    }
}

impl<B: IoBuf> Addressed for TcpQueuePair<B> {
    type Addr = u32;

    fn read_write(
        &mut self,
        nsid: u32,
        lba: u64,
        blocks: u32,
        buf: B,
        tag: u64,
        read: bool,
    ) -> std::result::Result<(), SubmitError<B>> {
        let refuse = |kind, buf| Err(SubmitError { kind, buf });
        if self.eng.stopped.is_some() {
            return refuse(SubmitErrorKind::ControllerFailed, buf);
        }
        let Some(g) = self.geom(nsid) else {
            return refuse(SubmitErrorKind::UnknownNamespace { nsid }, buf);
        };
        if blocks == 0 {
            return refuse(SubmitErrorKind::ZeroLength, buf);
        }
        if lba
            .checked_add(u64::from(blocks))
            .is_none_or(|end| end > g.nsze)
        {
            return refuse(
                SubmitErrorKind::LbaOutOfRange {
                    slba: lba,
                    nlb: u64::from(blocks),
                    nsze: g.nsze,
                },
                buf,
            );
        }
        let bytes = u64::from(blocks) << g.shift;
        if !g.usable {
            return refuse(
                SubmitErrorKind::TransferTooLarge {
                    bytes: 1 << g.shift,
                    max: self.eng.max_xfer,
                },
                buf,
            );
        }
        let available = buf.total_len() as u64;
        if available < bytes {
            return refuse(
                SubmitErrorKind::BufferTooSmall {
                    needed: bytes,
                    available,
                },
                buf,
            );
        }
        if let Err(mapped) = buf.check_dir(read) {
            let needs = if read {
                "write into the buffer"
            } else {
                "read from the buffer"
            };
            return refuse(SubmitErrorKind::WrongDirection { mapped, needs }, buf);
        }
        if (0..buf.segment_count()).any(|i| buf.segment_host(i).is_none()) {
            // A socket copies: a buffer without a host view cannot be moved.
            return refuse(SubmitErrorKind::NotDmaMapped, buf);
        }
        let limit = self.limit_for(g.shift);
        if bytes > limit {
            return self.split(nsid, lba, blocks, g.shift, limit, buf, tag, read);
        }
        let Some(slot) = self.eng.trackers.alloc() else {
            return refuse(SubmitErrorKind::QueueFull, buf);
        };
        let (sqe, kind) = if read {
            (Read::new(nsid, lba, blocks).sqe(), Kind::Read)
        } else if bytes as usize <= self.in_capsule {
            (Write::new(nsid, lba, blocks).sqe(), Kind::WriteInCapsule)
        } else {
            (Write::new(nsid, lba, blocks).sqe(), Kind::WriteR2t)
        };
        if !self.queue_one(sqe, kind, bytes as u32, Some(&buf), slot) {
            self.eng.trackers.unreserve(slot);
            return refuse(SubmitErrorKind::QueueFull, buf);
        }
        if kind == Kind::WriteInCapsule {
            self.stats.in_capsule_writes += 1;
        }
        self.eng.stamp_if_idle(0);
        self.eng.arm(slot, tag, Some(buf));
        Ok(())
    }

    fn flush_at(&mut self, nsid: u32, tag: u64) -> std::result::Result<(), SubmitError<()>> {
        if self.geom(nsid).is_none() {
            return Err(SubmitError {
                kind: SubmitErrorKind::UnknownNamespace { nsid },
                buf: (),
            });
        }
        self.eng.stamp_if_idle(0);
        self.queue_internal_data(Flush::new(nsid).sqe(), None, tag)
    }

    fn deallocate_at(
        &mut self,
        nsid: u32,
        lba: u64,
        blocks: u32,
        tag: u64,
    ) -> std::result::Result<(), SubmitError<()>> {
        let refuse = |kind| Err(SubmitError { kind, buf: () });
        let Some(g) = self.geom(nsid) else {
            return refuse(SubmitErrorKind::UnknownNamespace { nsid });
        };
        if blocks == 0 {
            return refuse(SubmitErrorKind::ZeroLength);
        }
        if lba
            .checked_add(u64::from(blocks))
            .is_none_or(|end| end > g.nsze)
        {
            return refuse(SubmitErrorKind::LbaOutOfRange {
                slba: lba,
                nlb: u64::from(blocks),
                nsze: g.nsze,
            });
        }
        let range = DsmRange {
            cattr: 0,
            nlb: blocks,
            slba: lba,
        };
        let mut bytes = [0u8; 16];
        bytes[4..8].copy_from_slice(&range.nlb.to_le_bytes());
        bytes[8..16].copy_from_slice(&range.slba.to_le_bytes());
        self.eng.stamp_if_idle(0);
        self.queue_internal_data(
            DatasetManagement::new(nsid, 1).deallocate().sqe(),
            Some(&bytes),
            tag,
        )
    }

    fn shift_of(&self, nsid: u32) -> Option<u32> {
        self.geom(nsid).map(|g| g.shift)
    }

    fn dma_space(&self) -> &Arc<DmaSpace> {
        self.ctrl.dma()
    }

    fn limit_for(&self, shift: u32) -> u64 {
        self.eng.max_xfer.min(u64::from(MAX_NLB) << shift)
    }

    fn finish<F: FnMut(Completion<B>)>(self, f: F) -> Result<()> {
        self.close(f)
    }
}

impl<B: IoBuf> Drop for TcpQueuePair<B> {
    fn drop(&mut self) {
        let _ = self.shutdown(&mut drop);
    }
}

/// NVMe/TCP's side of the shared timeout scan: Abort on the admin queue;
/// a reset reconnects the association (after the scan).
struct TcpTimeouts<'a, B: IoBuf> {
    qp: &'a mut TcpQueuePair<B>,
    reset: bool,
}

impl<B: IoBuf> TimeoutActions for TcpTimeouts<'_, B> {
    type Buf = B;

    fn state(&mut self) -> (&mut Timeouts, &mut Trackers<B>) {
        (&mut self.qp.eng.timeouts, &mut self.qp.eng.trackers)
    }

    fn queue_id(&self) -> u16 {
        self.qp.qid
    }

    fn abort(&mut self, e: &Expired) -> bool {
        match self
            .qp
            .ctrl
            .admin_cmd(Abort::new(self.qp.qid, e.cid).sqe(), "Abort")
        {
            // Dword 0 bit 0 clear: the controller aborted it.
            Ok(c) => c.dw0 & 1 == 0,
            Err(err) => {
                log::warn!(
                    "nvme-tcp queue {}: Abort of cid {:#06x} failed: {err}",
                    self.qp.qid,
                    e.cid
                );
                false
            }
        }
    }

    fn reset(&mut self, _: &Expired) -> bool {
        self.reset = true;
        true
    }

    fn stop(&self) -> bool {
        false
    }
}

/// The blocking convenience API (as on the PCIe queue pair): one bounce
/// buffer kept by the queue pair, requests above the per-command limit
/// split. Each needs an idle queue pair ([`Error::QueueBusy`] otherwise).
impl TcpQueuePair<DmaBuf> {
    /// Read `dst.len()` bytes (a multiple of the block size) from `slba`.
    pub fn read_blocking(&mut self, nsid: u32, slba: u64, dst: &mut [u8]) -> Result<()> {
        crate::core::block::read_blocking(self, nsid, slba, dst)
    }

    /// Write `src` (a multiple of the block size) at `slba`.
    pub fn write_blocking(&mut self, nsid: u32, slba: u64, src: &[u8]) -> Result<()> {
        crate::core::block::write_blocking(self, nsid, slba, src)
    }

    /// Flush namespace `nsid` and wait.
    pub fn flush_blocking(&mut self, nsid: u32) -> Result<()> {
        crate::core::block::flush_blocking(self, nsid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::block::BlockQueue;
    use crate::nvme::tcp::TcpOptions;
    use crate::WaitPolicy;
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
}
