//! [`TcpController`]: an NVMe controller reached over NVMe/TCP — the
//! association's admin queue on its own connection.
//!
//! Bring-up ([`TcpController::connect`]), in the order of NVMe over
//! Fabrics:
//!
//! 1. TCP connect, ICReq/ICResp (digests asked for, HPDA 0, MAXR2T;
//!    CPDA and MAXH2CDATA taken from the target);
//! 2. Connect on queue 0 with CNTLID 0xFFFF, the host and subsystem NQNs
//!    and KATO: the target assigns the controller id;
//! 3. Property Get CAP and VS, Property Set CC (EN, NVM, 64-byte SQEs,
//!    16-byte CQEs), Property Get CSTS until RDY — bounded by CAP.TO;
//!    CSTS.CFS is [`Error::ControllerFatal`]; these replace the MMIO of NVMe
//!    over PCIe;
//! 4. Identify Controller (its Fabrics fields: IOCCSZ sizes in-capsule
//!    writes), the active namespace list and each namespace (through the
//!    same seam as PCIe: `admin::active_namespaces_by`, `Namespace::new`);
//! 5. Set Features Number of Queues: the grant bounds
//!    [`TcpController::create_qpair`].
//!
//! Each I/O queue pair opens its own connection and Connects its queue id
//! with the controller id from step 2 ([`crate::nvme::tcp::TcpQueuePair`]).
//!
//! **Keep Alive** runs from polling, never from a thread, and never waits
//! inside a poll: every queue pair's poll looks, every few hundred polls,
//! whether KATO/2 passed since the last Keep Alive was sent, and if so
//! (and no other thread holds the admin connection) sends one on the admin
//! connection; later looks take its answer if it came (one receive that
//! does not wait), so a slow admin target costs an I/O thread nothing. An
//! answer that has not come within KATO (or the admin timeout, if
//! shorter) fails the association as a failed Keep Alive does (the
//! target may have dropped it). An admin command of another thread waits
//! for an outstanding Keep Alive's answer before its own. An application
//! that polls no queue pair for longer than KATO/2 calls
//! [`TcpController::keep_alive`] itself (which waits for the answer).
//!
//! **Failure.** A socket cannot reach host memory, so no failure here
//! ever leaves memory the target might still write: when the admin
//! connection fails (closed, TermReq, malformed PDU, a timeout), the state
//! word moves to a new epoch marked gone (`core::state`) and every
//! queue pair ends its commands, buffers handed back, with
//! [`crate::IoError::ControllerFailed`]; `poll`, admin calls and new queue
//! pairs then fail with [`Error::Transport`] holding the [`TcpError`].
//! [`TcpController::reset`] brings it back by reconnecting.
//!
//! **Reset** ([`TcpController::reset`], also run by the I/O timeout
//! policies) is a reconnect: the admin connection is closed (the target
//! drops the association and its I/O connections with it) and a new
//! association is brought up; its namespaces must be the ones we had. The
//! state word moves to a new epoch, so every queue pair, at its next poll,
//! ends what it had in flight once with [`crate::IoError::AbortedByReset`]
//! and Connects its queue again (same queue id, new controller id).
//!
//! **Dropping** the controller (after its queue pairs) sets CC.SHN and
//! waits for CSTS.SHST complete, bounded, then closes the connection.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

mod keep_alive;
mod options;

pub use self::options::TcpOptions;
use crate::core::error::{Error, Result};
use crate::core::state::{self, StateWord};
use crate::nvme::host::identify::{check_same, identify, number_of_queues, Exchange, Identified};
use crate::nvme::host::qids::QidPool;
use crate::nvme::host::regs::{self, Registers};
use crate::nvme::host::{NvmeController, Sealed};
use crate::nvme::spec::regs::{Cap, Version};
use crate::nvme::spec::{Cqe, Sqe};
use crate::nvme::tcp::conn::{Conn, SyncData};
use crate::nvme::tcp::error::TcpError;
use crate::nvme::tcp::fabrics::{self, Connect, ConnectData, FabricsIdentify, PropertySize};
use crate::nvme::tcp::memory::host_space;

/// The admin connection and its command ids.
pub(crate) struct AdminConn {
    pub(super) conn: Conn,
    pub(super) next_cid: u16,
    /// A Keep Alive sent from a poll whose answer was not taken yet.
    pub(super) keep_alive: Option<SentKeepAlive>,
    /// Bound on each command (the admin timeout).
    timeout: Duration,
}

/// A Keep Alive on its way ([`TcpController::keep_alive_if_due`]).
#[derive(Copy, Clone, Debug)]
pub(crate) struct SentKeepAlive {
    cid: u16,
    /// When it was sent, in ms since the controller's epoch.
    sent_ms: u64,
}

impl AdminConn {
    /// A connection with no command sent yet.
    pub(super) fn new(conn: Conn, timeout: Duration) -> Self {
        AdminConn {
            conn,
            next_cid: 1,
            keep_alive: None,
            timeout,
        }
    }

    /// The next command id.
    fn cid(&mut self) -> u16 {
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1) & 0x7FFF;
        cid
    }

    /// A synchronous command: a fresh CID, the response's status turned
    /// into [`Error::Command`]; the connection's failure as `Err` outside.
    fn run(
        &mut self,
        sqe: Sqe,
        data: SyncData<'_>,
        what: &'static str,
    ) -> std::result::Result<Result<Cqe>, TcpError> {
        let cid = self.cid();
        let cqe = self.conn.exec(sqe, cid, data, self.timeout)?;
        let st = cqe.nvme_status();
        Ok(if st.is_success() {
            Ok(cqe)
        } else {
            Err(Error::Command {
                command: what,
                status: st,
            })
        })
    }
}

/// The admin connection as the NVMe layer's [`Exchange`] (bring-up): a
/// failed connection is an [`Error::Transport`].
impl Exchange for AdminConn {
    fn exchange(&mut self, sqe: Sqe, page: Option<&mut [u8]>, what: &'static str) -> Result<Cqe> {
        let data = match page {
            Some(p) => SyncData::Out(p),
            None => SyncData::None,
        };
        self.run(sqe, data, what).map_err(TcpError::into_error)?
    }
}

/// The controller's properties, by Property Get and Set on the admin
/// connection.
impl Registers for AdminConn {
    fn read32(&mut self, offset: usize) -> Result<u32> {
        let off = offset as u32;
        let size = PropertySize::of(off);
        let cqe = self.exchange(fabrics::property_get(off, size), None, "Property Get")?;
        Ok(fabrics::property_value(&cqe, size) as u32)
    }

    fn write32(&mut self, offset: usize, value: u32) -> Result<()> {
        let off = offset as u32;
        let sqe = fabrics::property_set(off, PropertySize::of(off), u64::from(value));
        self.exchange(sqe, None, "Property Set").map(|_| ())
    }

    fn pause(&self) -> Duration {
        Duration::from_millis(1)
    }
}

/// CAP, a 64-bit property.
fn read_cap(a: &mut AdminConn) -> Result<Cap> {
    let size = PropertySize::of(fabrics::property::CAP);
    let cqe = a.exchange(
        fabrics::property_get(fabrics::property::CAP, size),
        None,
        "Property Get",
    )?;
    Ok(Cap(fabrics::property_value(&cqe, size)))
}

/// Property Get CAP and VS, then enable (CC.EN, CSTS.RDY bounded by
/// CAP.TO): step 3 of the module docs.
pub(super) fn enable(a: &mut AdminConn) -> Result<(Cap, Version)> {
    let cap = read_cap(a)?;
    let version = Version(a.read32(crate::nvme::spec::regs::VS)?);
    regs::enable(a, Duration::from_millis(cap.timeout_ms().max(500)))?;
    Ok((cap, version))
}

/// An NVMe controller over NVMe/TCP (see the module docs): the NVMe
/// layer's [`NvmeController`] over [`TcpLink`]. Shareable (`Sync`); one
/// [`TcpQueuePair`](crate::nvme::tcp::TcpQueuePair) per thread for I/O.
pub type TcpController = NvmeController<TcpLink>;

/// NVMe over TCP under the NVMe layer: the association's admin
/// connection, its controller id, Keep Alive.
pub struct TcpLink {
    pub(super) addr: SocketAddr,
    /// Assigned by the target; a new one after every reset.
    pub(super) cntlid: AtomicU16,
    pub(super) fabrics: FabricsIdentify,
    /// MAXH2CDATA the target gave the admin connection at bring-up.
    maxh2cdata: u32,
    admin: Mutex<AdminConn>,
    /// Why the association failed, once it did (cleared by a reset).
    failure: Mutex<Option<TcpError>>,
    /// Keep Alive: the interval (KATO/2, 0: off) and when the last one
    /// succeeded, in ms since `epoch`.
    ka_interval_ms: u64,
    ka_last_ms: AtomicU64,
    /// A Keep Alive's answer is awaited (`AdminConn::keep_alive`): polls
    /// look at the admin connection before the interval is up.
    ka_sent: AtomicBool,
    keep_alives: AtomicU64,
    epoch: Instant,
    /// Bound on the shutdown handshake at drop.
    shutdown_timeout: Duration,
}

impl Sealed for TcpLink {}

/// Connect queue `qid` on `conn` (CNTLID 0xFFFF for the admin queue):
/// the controller id the target answers with.
pub(super) fn connect_queue(
    conn: &mut Conn,
    opts: &TcpOptions,
    qid: u16,
    sqsize: u16,
    cntlid: u16,
    kato_ms: u32,
) -> Result<u16> {
    let data = ConnectData::new(opts.hostid, cntlid, &opts.subnqn, &opts.hostnqn)
        .map_err(|e| Error::InvalidOption(e.to_string()))?
        .to_bytes();
    let c = Connect {
        qid,
        sqsize,
        kato_ms,
    };
    let cqe = conn
        .exec(c.sqe(), 0, SyncData::In(&data), opts.admin_timeout)
        .map_err(TcpError::into_error)?;
    let st = cqe.nvme_status();
    if !st.is_success() {
        return Err(Error::Command {
            command: "Connect",
            status: st,
        });
    }
    Ok(Connect::cntlid(&cqe))
}

/// What one bring-up (a new association) found.
struct Up {
    link: AdminConn,
    cntlid: u16,
    cap: Cap,
    version: Version,
    found: Identified,
    pub(super) fabrics: FabricsIdentify,
    granted: u16,
}

/// Connect, negotiate, Connect the admin queue, enable, identify, ask for
/// queues (the module docs' steps 1 to 5).
fn bring_up(addr: SocketAddr, opts: &TcpOptions) -> Result<Up> {
    let t = opts.admin_timeout;
    let mut conn = Conn::open(addr, opts.digests(), opts.maxr2t, 1 << 16, 0, t)
        .map_err(TcpError::into_error)?;
    let kato_ms = u32::try_from(opts.kato.as_millis()).unwrap_or(u32::MAX);
    let cntlid = connect_queue(&mut conn, opts, 0, 32, fabrics::CNTLID_DYNAMIC, kato_ms)?;
    let mut a = AdminConn::new(conn, t);
    let (cap, version) = enable(&mut a)?;
    let mut limit = opts.max_transfer;
    if opts.within_maxh2cdata || (a.conn.neg.digests.data && opts.one_h2c_with_data_digest) {
        limit = limit.min(u64::from(a.conn.maxh2cdata));
    }
    let found = identify(&mut a, limit)?;
    let fabrics = FabricsIdentify::parse(&found.page).ok_or(Error::BadDevice {
        what: "Identify Controller",
        detail: "short page".into(),
    })?;
    let granted = number_of_queues(&mut a, opts.io_queues)?;
    log::info!(
        "nvme-tcp {addr} {}: controller {cntlid}, {} {}, {} namespaces, {granted} I/O queues, max transfer {} B, in-capsule {} B, digests {:?}, MAXH2CDATA {}",
        opts.subnqn,
        found.identify.model,
        found.identify.serial,
        found.namespaces.len(),
        found.max_transfer,
        fabrics.in_capsule_bytes(),
        a.conn.neg.digests,
        a.conn.maxh2cdata,
    );
    Ok(Up {
        link: a,
        cntlid,
        cap,
        version,
        found,
        fabrics,
        granted,
    })
}

impl TcpController {
    /// Connect to the target at `addr` and bring the controller up (see
    /// the module docs).
    pub fn connect(addr: SocketAddr, opts: TcpOptions) -> Result<Arc<Self>> {
        if opts.io_queues == 0 {
            return Err(Error::InvalidOption("io_queues must be at least 1".into()));
        }
        let up = bring_up(addr, &opts)?;
        let ka_interval_ms = (opts.kato.as_millis() as u64) / 2;
        let link = TcpLink {
            addr,
            cntlid: AtomicU16::new(up.cntlid),
            fabrics: up.fabrics,
            maxh2cdata: up.link.conn.maxh2cdata,
            admin: Mutex::new(up.link),
            failure: Mutex::new(None),
            ka_interval_ms,
            ka_last_ms: AtomicU64::new(0),
            ka_sent: AtomicBool::new(false),
            keep_alives: AtomicU64::new(0),
            epoch: Instant::now(),
            shutdown_timeout: opts.shutdown_timeout,
        };
        Ok(Arc::new(NvmeController {
            link,
            opts,
            dma: host_space(),
            cap: up.cap,
            version: up.version,
            identify: up.found.identify,
            namespaces: up.found.namespaces,
            qids: QidPool::new(up.granted),
            max_transfer: up.found.max_transfer,
            state: StateWord::default(),
            resets: AtomicU64::new(0),
            leaked_bytes: AtomicU64::new(0),
        }))
    }

    pub(super) fn reset_locked(&self, a: &mut AdminConn) -> Result<()> {
        let s = self.state.load();
        self.state.begin_reset(s);
        a.conn.close();
        a.keep_alive = None;
        self.link.ka_sent.store(false, Ordering::Relaxed);
        let r = bring_up(self.link.addr, &self.opts).and_then(|up| {
            if up.fabrics.subnqn != self.link.fabrics.subnqn {
                return Err(Error::DeviceChanged(format!(
                    "subsystem {} answered instead of {}",
                    up.fabrics.subnqn, self.link.fabrics.subnqn
                )));
            }
            check_same(
                (&self.identify, &self.namespaces, self.qids.granted()),
                (&up.found, up.granted),
            )?;
            Ok(up)
        });
        match r {
            Ok(up) => {
                *a = up.link;
                self.link.cntlid.store(up.cntlid, Ordering::Relaxed);
                *self.link.failure.lock().unwrap_or_else(|p| p.into_inner()) = None;
                self.link.ka_last_ms.store(
                    self.link.epoch.elapsed().as_millis() as u64,
                    Ordering::Relaxed,
                );
                self.resets.fetch_add(1, Ordering::Relaxed);
                // The old association is gone with its connection: a new
                // epoch, healthy.
                self.state.store(state::next(s, state::OK));
                log::info!(
                    "nvme-tcp {}: reconnected as controller {}",
                    self.link.addr,
                    up.cntlid
                );
                Ok(())
            }
            Err(e) => {
                let t = match &e {
                    Error::Transport(b) => b.downcast_ref::<TcpError>().copied(),
                    _ => None,
                };
                *self.link.failure.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(t.unwrap_or(TcpError::Closed));
                self.state.store(state::next(s, state::GONE));
                log::error!("nvme-tcp {}: reconnect failed: {e}", self.link.addr);
                Err(e)
            }
        }
    }

    pub(super) fn lock_admin(&self) -> MutexGuard<'_, AdminConn> {
        self.link.admin.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The error of a failed association, if it failed.
    pub(super) fn failure(&self) -> Option<TcpError> {
        *self.link.failure.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The admin connection failed with `e` (admin lock held): record it
    /// once and move the state word to a new, gone epoch.
    fn fail_locked(&self, a: &AdminConn, e: TcpError) {
        let mut f = self.link.failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            log::error!(
                "nvme-tcp {}: the admin connection failed: {e}",
                self.link.addr
            );
            *f = Some(e);
            a.conn.close();
            // No memory can be left to the target: a new epoch, gone.
            self.state
                .store(state::next(self.state.load(), state::GONE));
        }
    }

    /// Run one admin command (no data, or data read back into `out`).
    pub(super) fn admin_exec(
        &self,
        sqe: Sqe,
        out: Option<&mut [u8]>,
        what: &'static str,
    ) -> Result<Cqe> {
        let mut a = self.lock_admin();
        if let Some(e) = self.failure() {
            return Err(e.into_error());
        }
        if let Err(e) = self.settle_keep_alive(&mut a) {
            self.fail_locked(&a, e);
            return Err(e.into_error());
        }
        let data = match out {
            Some(b) => SyncData::Out(b),
            None => SyncData::None,
        };
        match a.run(sqe, data, what) {
            Ok(r) => r,
            Err(e) => {
                self.fail_locked(&a, e);
                Err(e.into_error())
            }
        }
    }

    /// An admin command that reads `len` bytes (Identify, Get Log Page):
    /// its response and the data.
    pub fn admin_read(&self, sqe: Sqe, len: usize, what: &'static str) -> Result<(Cqe, Vec<u8>)> {
        let mut v = vec![0u8; len];
        let c = self.admin_exec(sqe, Some(&mut v), what)?;
        Ok((c, v))
    }

    /// Where the target is.
    pub fn addr(&self) -> SocketAddr {
        self.link.addr
    }

    /// The controller id the target assigned.
    pub fn cntlid(&self) -> u16 {
        self.link.cntlid.load(Ordering::Relaxed)
    }

    /// The Fabrics fields of Identify Controller (IOCCSZ, SUBNQN, ...).
    pub fn fabrics_identify(&self) -> &FabricsIdentify {
        &self.link.fabrics
    }

    /// The most data one H2CData PDU may carry (MAXH2CDATA of the
    /// target's ICResp at bring-up): writes above it go out as several.
    pub fn maxh2cdata(&self) -> u32 {
        self.link.maxh2cdata
    }

    /// In-capsule data an I/O write may carry (IOCCSZ less the SQE).
    pub fn in_capsule_bytes(&self) -> usize {
        self.link.fabrics.in_capsule_bytes() as usize
    }

    /// Entries per queue the controller supports (CAP.MQES + 1).
    pub(super) fn max_entries(&self) -> u32 {
        self.cap.max_queue_entries()
    }
}

impl Drop for TcpLink {
    /// Shutdown (CC.SHN, CSTS.SHST) on a healthy association, then the
    /// connection closed.
    fn drop(&mut self) {
        let failed = self.failure.get_mut().map_or(true, |f| f.is_some());
        let a = self.admin.get_mut().unwrap_or_else(|p| p.into_inner());
        // A Keep Alive sent from a poll is answered before the shutdown's
        // Property Set goes out on the same connection.
        let settled = match a.keep_alive.take() {
            Some(k) => a
                .conn
                .await_response(
                    k.cid,
                    SyncData::None,
                    Instant::now() + a.timeout,
                    a.timeout.as_millis() as u64,
                )
                .is_ok(),
            None => true,
        };
        if settled && !failed {
            if let Err(e) = regs::shutdown(a, self.shutdown_timeout) {
                log::debug!("nvme-tcp {}: shutdown: {e}", self.addr);
            }
        }
        a.conn.close();
    }
}
