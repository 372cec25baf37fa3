//! NVMe over TCP's hooks of the shared lifecycle (`core::qpair::Wire`):
//! `ring` (one vectored send), `reap`, the health look, Keep Alive and the
//! receive pacer after a poll, what a dropped connection leaves, the
//! reconnect after a reset, the withdrawal when closing.

use super::create::open_conn;
use super::{TcpQueuePair, HEALTH_CHECK_INTERVAL, KEEP_ALIVE_POLLS};
use crate::core::error::{Error, Result};
use crate::core::io::{Completion, IoBuf};
use crate::core::qpair::Lifecycle;
use crate::core::qpair::{Reaped, Recreated, Wire};
use crate::core::state::Stopped;
use crate::nvme::host::nvm;
use crate::nvme::tcp::controller::TcpController;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

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
        self.scan_expired();
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
        nvm::stopped_error(s, self.qid)
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
