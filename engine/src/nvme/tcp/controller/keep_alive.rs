//! Keep Alive: the association's Keep Alive commands, sent from the
//! queue pairs' polls when due (`keep_alive_if_due`) and settled before a
//! reset or shutdown uses the admin connection.

use super::{AdminConn, SentKeepAlive, TcpController};
use crate::core::error::{Error, Result};
use crate::nvme::spec::Cqe;
use crate::nvme::tcp::conn::SyncData;
use crate::nvme::tcp::error::TcpError;
use crate::nvme::tcp::fabrics;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl TcpController {
    /// Send a Keep Alive now and wait for it.
    pub fn keep_alive(&self) -> Result<()> {
        self.admin_cmd(fabrics::keep_alive(), "Keep Alive")?;
        self.link.keep_alives.fetch_add(1, Ordering::Relaxed);
        self.link.ka_last_ms.store(
            self.link.epoch.elapsed().as_millis() as u64,
            Ordering::Relaxed,
        );
        Ok(())
    }

    /// Look at the Keep Alive from a queue pair's poll, never waiting: if
    /// one was sent, take its answer if it came (or fail the association
    /// once KATO, or the admin timeout if shorter, passed without one); else,
    /// if KATO/2 passed since the last was sent, send one. Skipped while
    /// another thread holds the admin connection (it then looks itself).
    pub fn keep_alive_if_due(&self) {
        if self.link.ka_interval_ms == 0 {
            return;
        }
        let now = self.link.epoch.elapsed().as_millis() as u64;
        let due = |last: u64| now.saturating_sub(last) >= self.link.ka_interval_ms;
        if !self.link.ka_sent.load(Ordering::Relaxed)
            && !due(self.link.ka_last_ms.load(Ordering::Relaxed))
        {
            return;
        }
        let Ok(mut a) = self.link.admin.try_lock() else {
            return;
        };
        if self.failure().is_some() {
            return;
        }
        if let Some(k) = a.keep_alive {
            let r = match a.conn.poll_response(k.cid) {
                Ok(None) if now.saturating_sub(k.sent_ms) < self.keep_alive_wait_ms() => return,
                Ok(None) => Err(TcpError::Timeout {
                    ms: self.keep_alive_wait_ms(),
                }),
                Ok(Some(cqe)) => Ok(cqe),
                Err(e) => Err(e),
            };
            a.keep_alive = None;
            self.link.ka_sent.store(false, Ordering::Relaxed);
            match r {
                Ok(cqe) => self.keep_alive_answered(&cqe, k.sent_ms),
                Err(e) => self.fail_locked(&a, e),
            }
            return;
        }
        if !due(self.link.ka_last_ms.load(Ordering::Relaxed)) {
            return;
        }
        let cid = a.cid();
        let t = self.opts.admin_timeout;
        let sent = a.conn.send_command(
            fabrics::keep_alive(),
            cid,
            &SyncData::None,
            Instant::now() + t,
            t.as_millis() as u64,
        );
        match sent {
            Ok(()) => {
                a.keep_alive = Some(SentKeepAlive { cid, sent_ms: now });
                self.link.ka_sent.store(true, Ordering::Relaxed);
            }
            Err(e) => self.fail_locked(&a, e),
        }
    }

    /// How long a Keep Alive's answer may take: KATO, or the admin timeout
    /// if shorter.
    fn keep_alive_wait_ms(&self) -> u64 {
        (self.opts.kato.min(self.opts.admin_timeout).as_millis() as u64).max(1)
    }

    /// Wait for the answer to a Keep Alive sent from a poll (admin lock
    /// held), before another command uses the connection.
    pub(super) fn settle_keep_alive(&self, a: &mut AdminConn) -> std::result::Result<(), TcpError> {
        let Some(k) = a.keep_alive.take() else {
            return Ok(());
        };
        self.link.ka_sent.store(false, Ordering::Relaxed);
        let now = self.link.epoch.elapsed().as_millis() as u64;
        let ms = self.keep_alive_wait_ms();
        let left = Duration::from_millis(ms.saturating_sub(now.saturating_sub(k.sent_ms)).max(1));
        let cqe = a
            .conn
            .await_response(k.cid, SyncData::None, Instant::now() + left, ms)?;
        self.keep_alive_answered(&cqe, k.sent_ms);
        Ok(())
    }

    /// A Keep Alive sent at `sent_ms` was answered with `cqe`: the next is
    /// due KATO/2 after it was sent.
    fn keep_alive_answered(&self, cqe: &Cqe, sent_ms: u64) {
        let st = cqe.nvme_status();
        if st.is_success() {
            self.link.keep_alives.fetch_add(1, Ordering::Relaxed);
        } else {
            log::warn!(
                "nvme-tcp {}: Keep Alive: {}",
                self.link.addr,
                Error::Command {
                    command: "Keep Alive",
                    status: st
                }
            );
        }
        self.link.ka_last_ms.store(sent_ms, Ordering::Relaxed);
    }

    /// Keep Alive commands that succeeded.
    pub fn keep_alives(&self) -> u64 {
        self.link.keep_alives.load(Ordering::Relaxed)
    }
}
