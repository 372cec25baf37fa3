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
//!   command's buffer ([`IoBuf::segment_host`]); an R2T is answered with
//!   H2CData PDUs of at most MAXH2CDATA bytes (their data again straight
//!   from the buffer), sent at the end of the pass; a CapsuleResp, or a
//!   C2HData with SUCCESS, ends the command through the engine, which
//!   proves its CID (slot and generation) and completes it exactly once.
//! - Every PDU is checked before a byte moves: its CID must name a command
//!   in flight of the right kind, data must arrive in order and inside the
//!   transfer, R2Ts in order, inside the transfer and no more outstanding
//!   than MAXR2T + 1, and a command completes only after its data left.
//!   Any violation, a malformed PDU, a TermReq or a closed socket **ends
//!   the connection** with a typed [`TcpError`]: every command in flight
//!   ends once with [`IoError::ConnectionLost`] (buffers back: a socket
//!   reaches no memory once we stop calling it) and `poll` reports the
//!   error as [`Error::Transport`].
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
use super::fabrics::{self, FabricsSqe, SglDescriptor};
use super::pace::RecvPacer;
use super::pdu::{self, pdu_type, DataPdu, Direction, Parse, Pdu};
use super::ready::ReadySet;
use crate::core::io::{Completion, DmaBuf, IoBuf, IoError, SubmitError, SubmitErrorKind};
use crate::core::qpair::wait::Waiter;
use crate::core::qpair::{
    Addressed, Engine, Interrupt, QueueCounters, Reaped, Recreated, SplitRequest, Wire,
};
use crate::core::state::Stopped;
use crate::core::timeout::{self, Expired, TimeoutActions, Timeouts};
use crate::core::tracker::Trackers;
use crate::nvme::pcie::queue::QpairOptions;
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
/// The CID of the Disconnect at close (never a tracker's: reserved).
const DISCONNECT_CID: u16 = 0xFFFF;

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
    /// Read: bytes received; R2T write: bytes asked for by R2Ts so far.
    got: u32,
    /// R2Ts whose H2CData may not have left yet.
    r2t_open: u32,
    /// The send queue position after the last R2T's data.
    r2t_done_at: u64,
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
    let pieces = if inline {
        buf.map_or(0, IoBuf::segment_count) + 2
    } else {
        1
    };
    if !tx.room(HEADER_ROOM, pieces) {
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
        got: 0,
        r2t_open: 0,
        r2t_done_at: 0,
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
        Ok(TcpQueuePair {
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
    /// timeout), Disconnect, and end what is left once with
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
        self.tx.clear();
        self.failed = Some(e);
        let n = self.budgeted(budget, f, |q, g| {
            q.eng.end_all(IoError::ConnectionLost, true, g);
        });
        self.eng.stopped = Some(Stopped::Lost);
        n
    }

    /// Send what is queued; a socket error ends the connection.
    #[inline]
    fn flush_tx(&mut self) -> std::result::Result<bool, TcpError> {
        let r = self.tx.flush(&self.conn.sock);
        if !self.tx.is_empty() {
            self.sends_held();
        }
        r
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
        let segs = buf.segment_count();
        let _ = self.flush_tx();
        if children > 0 && !self.tx.room(children * HEADER_ROOM, children * (segs + 2)) {
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
        for (c, ()) in &plan {
            let cid = self.eng.trackers.slot(c.slot).cid();
            let sqe = if read {
                Read::new(nsid, c.lba, c.blocks).sqe()
            } else {
                Write::new(nsid, c.lba, c.blocks).sqe()
            }
            .with_cid(cid);
            let len = c.bytes as u32;
            let kind = if read {
                Kind::Read
            } else if len as usize <= self.in_capsule {
                Kind::WriteInCapsule
            } else {
                Kind::WriteR2t
            };
            let Self {
                tx,
                conn,
                cmds,
                eng,
                ..
            } = self;
            let b = eng.splits.buf_of(p);
            // Room for every child was checked above.
            let queued = queue_capsule(
                tx,
                conn,
                &mut cmds[usize::from(c.slot)],
                sqe,
                kind,
                len,
                c.offset,
                b,
            );
            debug_assert!(queued);
            if kind == Kind::WriteInCapsule {
                self.stats.in_capsule_writes += 1;
            }
            self.eng.arm_child(c.slot, p, tag);
        }
        self.eng.armed_split(plan);
        Ok(())
    }

    /// Handle one received PDU. `Ok(true)`: a command completed through
    /// `f`.
    #[inline]
    fn on_pdu<F: FnMut(Completion<B>)>(
        eng: &mut Engine<B, ()>,
        cmds: &mut [Cmd],
        tx: &mut TxQueue,
        conn: &Conn,
        stats: &mut TcpQpairStats,
        p: Pdu<'_>,
        f: &mut F,
    ) -> std::result::Result<bool, TcpError> {
        stats.pdus += 1;
        let (conn_neg, maxh2cdata, max_r2ts) = (&conn.neg, conn.maxh2cdata, conn.max_r2ts);
        match p {
            Pdu::CapsuleResp { cqe } => {
                let slot = eng
                    .trackers
                    .lookup(cqe.cid)
                    .ok_or(Violation::UnknownCid(cqe.cid))?;
                let cmd = &cmds[usize::from(slot)];
                if cmd.data_done_at > tx.sent {
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
                if tx.sent >= cmd.r2t_done_at {
                    cmd.r2t_open = 0;
                }
                cmd.r2t_open += 1;
                if cmd.r2t_open > max_r2ts {
                    return Err(Violation::R2tLimit {
                        cid: cccid,
                        outstanding: cmd.r2t_open,
                        max: max_r2ts,
                    }
                    .into());
                }
                let chunk = maxh2cdata.max(4);
                let n_pdus = r2tl.div_ceil(chunk) as usize;
                let buf = buf_of(eng, slot).ok_or(Violation::UnknownCid(cccid))?;
                let segs = buf.segment_count();
                if !tx.room(n_pdus * HEADER_ROOM, n_pdus * (segs + 2)) {
                    return Err(Violation::SendQueueFull.into());
                }
                let end = r2to + r2tl;
                let mut at = r2to;
                while at < end {
                    let n = chunk.min(end - at);
                    let d = DataPdu {
                        pdu_type: pdu_type::H2C_DATA,
                        cccid,
                        ttag,
                        datao: at,
                        last: at + n == end,
                        success: false,
                    };
                    tx.header(|b| {
                        pdu::write_data_header(b, &d, n as usize, conn_neg).map(|l| l.pdo)
                    })
                    .map_err(|_| Violation::SendQueueFull)?;
                    queue_data(
                        tx,
                        buf,
                        cmd.base + u64::from(at),
                        n as usize,
                        conn_neg.digests.data,
                    );
                    stats.h2c_data += 1;
                    at += n;
                }
                stats.r2ts += 1;
                cmd.got = end;
                cmd.r2t_done_at = tx.queued;
                cmd.data_done_at = tx.queued;
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
                conn,
                stats,
                ..
            } = self;
            match conn.rx.peek(Direction::ControllerToHost, &conn.neg) {
                Ok(Parse::Incomplete { .. }) => break,
                Ok(Parse::Complete { pdu, len }) => {
                    let done = Self::on_pdu(eng, cmds, tx, conn, stats, pdu, f);
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
        self.tx.clear();
    }

    /// A socket has no count to clear (`tcp::ready`): make the next poll
    /// receive whatever the pacer held, and watch for room to send only
    /// while sends are held up.
    #[cold]
    fn arm_interrupt(&mut self) {
        self.pacer.idle();
        let held = !self.tx.is_empty();
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
                self.tx.clear();
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

    /// Let what is in flight finish (bounded), then Disconnect. A socket
    /// reaches no buffer once we stop using it, so this always reports the
    /// queue withdrawn.
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
                self.tx.clear();
                return Ok(true);
            }
            self.ring();
            if self.reap(usize::MAX, &mut g).seen == 0 {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        if self.failed.is_some() {
            return Ok(true);
        }
        let _ = self.flush_tx();
        if self.tx.is_empty() && self.conn.set_blocking(true).is_ok() {
            match self.conn.exec(
                fabrics::disconnect(),
                DISCONNECT_CID,
                super::conn::SyncData::None,
                t,
            ) {
                Ok(c) if !c.nvme_status().is_success() => log::warn!(
                    "nvme-tcp queue {}: Disconnect: {}",
                    self.qid,
                    c.nvme_status()
                ),
                Ok(_) => {}
                Err(e) => log::warn!("nvme-tcp queue {}: Disconnect: {e}", self.qid),
            }
        }
        self.conn.close();
        self.tx.clear();
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
    use mcqio_fixtures::tcp::{FakeTcpTarget, TcpFault, TcpTargetConfig};
    use mcqio_vfio::DmaDir;

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
        let c = TcpController::connect(
            t.addr(),
            TcpOptions {
                subnqn: t.subnqn().into(),
                ..Default::default()
            },
        )
        .unwrap();
        let mut q = c
            .create_qpair(QpairOptions {
                depth: 120,
                wait: WaitPolicy::Interrupt,
                io_timeout: None,
                ..Default::default()
            })
            .unwrap();
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
