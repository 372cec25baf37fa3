//! Reaping: one receive, the PDUs parsed in place and checked before a
//! byte moves, each command proven by its CID and ended through the
//! engine; a violation ends the connection.

use super::data::{buf_of, copy_into};
use super::send::retire_r2ts;
use super::{Cmd, Kind, TcpQpairStats, TcpQueuePair};
use crate::core::io::{Completion, IoBuf, IoError};
use crate::core::qpair::Lifecycle;
use crate::core::qpair::{Engine, Reaped};
use crate::core::state::Stopped;
use crate::nvme::host::nvm::error_of;
use crate::nvme::spec::NvmeStatus;
use crate::nvme::tcp::conn::{Conn, TxQueue};
use crate::nvme::tcp::error::{TcpError, Violation};
use crate::nvme::tcp::pdu::{Direction, Parse, Pdu};
use crate::nvme::tcp::r2t::{Owed, R2tQueue};

impl<B: IoBuf> TcpQueuePair<B> {
    /// End the connection with `e`: every command in flight ends once
    /// with [`IoError::ConnectionLost`], at most `budget` through `f` (the
    /// rest are held for the next polls). Returns those delivered.
    #[cold]
    #[inline(never)]
    pub(super) fn fail_conn<F: FnMut(Completion<B>)>(
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

    /// Handle one received PDU. `Ok(true)`: a command completed through
    /// `f`.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_pdu<F: FnMut(Completion<B>)>(
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
            other => Err(Violation::UnexpectedPdu(crate::nvme::tcp::conn::type_of(&other)).into()),
        }
    }

    /// The reaping pass (see the module docs).
    pub(super) fn reap_pdus<F: FnMut(Completion<B>)>(&mut self, max: usize, f: &mut F) -> Reaped {
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
}
