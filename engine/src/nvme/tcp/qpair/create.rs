//! Creation: the queue's connection set-up (the connection opened,
//! ICReq/ICResp, Fabrics Connect under the controller's id), its send and
//! receive memory sized once, and [`TcpController::create_qpair`].

use super::{
    Cmd, NsGeom, TcpQpairStats, TcpQueuePair, H2C_ARENA, HEADER_ROOM, R2TS_SIZED, RX_ENTRIES_MAX,
    RX_PER_ENTRY,
};
use crate::core::error::{Error, Result};
use crate::core::io::{DmaBuf, IoBuf};
use crate::core::qpair::wait::Waiter;
use crate::core::qpair::{Engine, Interrupt};
use crate::nvme::host::QpairOptions;
use crate::nvme::tcp::conn::{Conn, TxQueue};
use crate::nvme::tcp::controller::{connect_queue, TcpController};
use crate::nvme::tcp::error::TcpError;
use crate::nvme::tcp::pace::RecvPacer;
use crate::nvme::tcp::r2t::R2tQueue;
use crate::nvme::tcp::ready::ReadySet;
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// Open queue `qid`'s connection and Connect it (`entries` deep) under
/// the controller's current id; non-blocking when it returns.
pub(super) fn open_conn(ctrl: &TcpController, qid: u16, entries: u16) -> Result<Conn> {
    let max_data = u32::try_from(ctrl.max_transfer).unwrap_or(u32::MAX);
    let rx_extra = usize::from(entries).min(RX_ENTRIES_MAX) * RX_PER_ENTRY;
    let mut conn = Conn::open(
        ctrl.addr(),
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
        if !matches!(o.mapping, crate::core::mapped::MappingMode::Premapped) {
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
}

impl TcpController {
    /// Create an I/O queue pair for [`DmaBuf`]s: its own connection, its
    /// queue Connected under this controller's id.
    pub fn create_qpair(self: &Arc<Self>, opts: QpairOptions) -> Result<TcpQueuePair<DmaBuf>> {
        TcpQueuePair::create(self, &opts)
    }

    /// [`TcpController::create_qpair`] for any buffer type with host
    /// addresses ([`IoBuf::segment_host`]).
    pub fn create_qpair_for<B: IoBuf>(
        self: &Arc<Self>,
        opts: QpairOptions,
    ) -> Result<TcpQueuePair<B>> {
        TcpQueuePair::create(self, &opts)
    }
}
