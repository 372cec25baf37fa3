//! Sending: the send queue handed to the socket, and the H2CData owed for
//! R2Ts queued as it has room (`tcp::r2t`).

use super::data::{buf_of, h2c_span, queue_data};
use super::{Cmd, TcpQueuePair, HEADER_ROOM, OWED_ROUNDS, SEND_AHEAD};
use crate::core::io::IoBuf;
use crate::nvme::tcp::error::TcpError;
use crate::nvme::tcp::pdu;
use crate::nvme::tcp::pdu::{pdu_type, DataPdu};
use crate::nvme::tcp::r2t::R2tQueue;

impl<B: IoBuf> TcpQueuePair<B> {
    /// Send what is queued, and H2CData owed for R2Ts as the send queue
    /// has room; a socket error ends the connection. `Ok(true)`: something
    /// went out.
    #[inline]
    pub(super) fn flush_tx(&mut self) -> std::result::Result<bool, TcpError> {
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
    pub(super) fn send_owed(
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
    pub(super) fn queue_owed(&mut self) -> bool {
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
    pub(super) fn drop_sends(&mut self) {
        self.tx.clear();
        self.r2ts.clear();
    }

    /// The socket's buffer is full and bytes are left to send: a waiting
    /// queue also wakes when it has room (`tcp::ready`).
    #[cold]
    pub(super) fn sends_held(&mut self) {
        if let Some(r) = &mut self.ready {
            r.want_writable(true);
        }
    }
}

/// Retire the R2Ts whose data has all been sent (`sent`): each of its
/// command's count of open R2Ts drops (a command that ended is no longer
/// counted: its record belongs to the slot's next command).
#[inline]
pub(super) fn retire_r2ts(r2ts: &mut R2tQueue, cmds: &mut [Cmd], sent: u64) {
    r2ts.retire(sent, |o| {
        let cmd = &mut cmds[usize::from(o.slot)];
        if cmd.cid == o.cid {
            cmd.r2t_open = cmd.r2t_open.saturating_sub(1);
        }
    });
}
