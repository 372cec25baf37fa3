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

use mcqio_vfio::{DmaDir, DmaSpace};

mod keep_alive;
mod options;

pub use self::options::TcpOptions;
use crate::core::block::{BlockDevice, BlockUnit};
use crate::core::error::{Error, Result};
use crate::core::io::DmaBuf;
use crate::core::state::{self, Controlled, StateWord};
use crate::nvme::admin::active_namespaces_by;
use crate::nvme::ctrl::Namespace;
use crate::nvme::spec::identify::{IdentifyController, IdentifyNamespace};
use crate::nvme::spec::regs::{Cap, Cc, Csts, Version};
use crate::nvme::spec::sqe::{Command, Identify, SetFeatures};
use crate::nvme::spec::{Cqe, Sqe};
use crate::nvme::tcp::conn::{Conn, SyncData};
use crate::nvme::tcp::error::TcpError;
use crate::nvme::tcp::fabrics::{
    self, property, Connect, ConnectData, FabricsIdentify, PropertySize,
};
use crate::nvme::tcp::memory::host_space;

/// The admin connection and its command ids.
pub(crate) struct AdminLink {
    pub(super) conn: Conn,
    pub(super) next_cid: u16,
    /// A Keep Alive sent from a poll whose answer was not taken yet.
    pub(super) keep_alive: Option<SentKeepAlive>,
}

/// A Keep Alive on its way ([`TcpController::keep_alive_if_due`]).
#[derive(Copy, Clone, Debug)]
pub(crate) struct SentKeepAlive {
    cid: u16,
    /// When it was sent, in ms since the controller's epoch.
    sent_ms: u64,
}

impl AdminLink {
    /// A link with no command sent yet.
    pub(super) fn new(conn: Conn) -> Self {
        AdminLink {
            conn,
            next_cid: 1,
            keep_alive: None,
        }
    }

    /// The next command id.
    fn cid(&mut self) -> u16 {
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1) & 0x7FFF;
        cid
    }
}

/// An NVMe controller over NVMe/TCP (see the module docs). Shareable
/// (`Sync`); one [`TcpQueuePair`](crate::nvme::tcp::TcpQueuePair) per thread for I/O.
pub struct TcpController {
    pub(super) addr: SocketAddr,
    pub(super) opts: TcpOptions,
    /// Assigned by the target; a new one after every reset.
    cntlid: AtomicU16,
    cap: Cap,
    version: Version,
    identify: IdentifyController,
    fabrics: FabricsIdentify,
    namespaces: Vec<Namespace>,
    granted: u16,
    free_qids: Mutex<Vec<u16>>,
    pub(super) max_transfer: u64,
    /// MAXH2CDATA the target gave the admin connection at bring-up.
    maxh2cdata: u32,
    dma: Arc<DmaSpace>,
    admin: Mutex<AdminLink>,
    state: StateWord,
    /// Why the association failed, once it did (cleared by a reset).
    failure: Mutex<Option<TcpError>>,
    resets: AtomicU64,
    /// Keep Alive: the interval (KATO/2, 0: off) and when the last one
    /// succeeded, in ms since `epoch`.
    ka_interval_ms: u64,
    ka_last_ms: AtomicU64,
    /// A Keep Alive's answer is awaited (`AdminLink::keep_alive`): polls
    /// look at the admin connection before the interval is up.
    ka_sent: AtomicBool,
    keep_alives: AtomicU64,
    epoch: Instant,
}

impl std::fmt::Debug for TcpController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpController")
            .field("addr", &self.addr)
            .field("subnqn", &self.opts.subnqn)
            .field("cntlid", &self.cntlid())
            .field("namespaces", &self.namespaces.len())
            .field("granted_io_queues", &self.granted)
            .finish_non_exhaustive()
    }
}

/// A synchronous command on `a`: a fresh CID, the response's status turned
/// into [`Error::Command`].
fn run(
    a: &mut AdminLink,
    sqe: Sqe,
    data: SyncData<'_>,
    what: &'static str,
    t: Duration,
) -> std::result::Result<Result<Cqe>, TcpError> {
    let cid = a.cid();
    let cqe = a.conn.exec(sqe, cid, data, t)?;
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

/// [`run`] with a connection failure as an [`Error`] (bring-up).
pub(super) fn run_up(
    a: &mut AdminLink,
    sqe: Sqe,
    data: SyncData<'_>,
    what: &'static str,
    t: Duration,
) -> Result<Cqe> {
    run(a, sqe, data, what, t).map_err(TcpError::into_error)?
}

fn prop_get(a: &mut AdminLink, offset: u32, t: Duration) -> Result<u64> {
    let size = PropertySize::of(offset);
    let cqe = run_up(
        a,
        fabrics::property_get(offset, size),
        SyncData::None,
        "Property Get",
        t,
    )?;
    Ok(fabrics::property_value(&cqe, size))
}

fn prop_set(a: &mut AdminLink, offset: u32, value: u64, t: Duration) -> Result<()> {
    run_up(
        a,
        fabrics::property_set(offset, PropertySize::of(offset), value),
        SyncData::None,
        "Property Set",
        t,
    )
    .map(|_| ())
}

fn identify_page(
    a: &mut AdminLink,
    cmd: Identify,
    what: &'static str,
    t: Duration,
) -> Result<Vec<u8>> {
    let mut page = vec![0u8; crate::nvme::spec::identify::IDENTIFY_LEN];
    run_up(a, cmd.sqe(), SyncData::Out(&mut page), what, t)?;
    Ok(page)
}

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
    link: AdminLink,
    cntlid: u16,
    cap: Cap,
    version: Version,
    identify: IdentifyController,
    fabrics: FabricsIdentify,
    namespaces: Vec<Namespace>,
    granted: u16,
    max_transfer: u64,
}

/// Property Get CAP and VS, Property Set CC.EN, then Property Get CSTS
/// until RDY, bounded by CAP.TO (step 3 of the module docs).
pub(super) fn enable(a: &mut AdminLink, t: Duration) -> Result<(Cap, Version)> {
    let cap = Cap(prop_get(a, property::CAP, t)?);
    let version = Version(prop_get(a, property::VS, t)? as u32);
    let ready_ms = cap.timeout_ms().max(500);
    let cc = Cc::new()
        .css(Cc::CSS_NVM)
        .mps(0)
        .iosqes(6)
        .iocqes(4)
        .enable();
    prop_set(a, property::CC, u64::from(cc.0), t)?;
    let start = Instant::now();
    loop {
        let csts = Csts(prop_get(a, property::CSTS, t)? as u32);
        if csts.cfs() {
            return Err(Error::ControllerFatal);
        }
        if csts.rdy() {
            break;
        }
        if start.elapsed() > Duration::from_millis(ready_ms) {
            return Err(Error::Timeout {
                what: "become ready (CSTS.RDY = 1)",
                timeout_ms: ready_ms,
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok((cap, version))
}

/// Connect, negotiate, Connect the admin queue, enable, identify, ask for
/// queues (the module docs' steps 1 to 5).
fn bring_up(addr: SocketAddr, opts: &TcpOptions) -> Result<Up> {
    let t = opts.admin_timeout;
    let mut conn = Conn::open(addr, opts.digests(), opts.maxr2t, 1 << 16, 0, t)
        .map_err(TcpError::into_error)?;
    let kato_ms = u32::try_from(opts.kato.as_millis()).unwrap_or(u32::MAX);
    let cntlid = connect_queue(&mut conn, opts, 0, 32, fabrics::CNTLID_DYNAMIC, kato_ms)?;
    let mut a = AdminLink::new(conn);
    let (cap, version) = enable(&mut a, t)?;
    let page = identify_page(&mut a, Identify::controller(), "Identify Controller", t)?;
    let identify = IdentifyController::parse(&page)?;
    let fabrics = FabricsIdentify::parse(&page).ok_or(Error::BadDevice {
        what: "Identify Controller",
        detail: "short page".into(),
    })?;
    let mdts = identify.max_transfer_bytes(12).unwrap_or(u64::MAX);
    let mut max_transfer = opts.max_transfer.min(mdts).max(4096);
    if opts.within_maxh2cdata || (a.conn.neg.digests.data && opts.one_h2c_with_data_digest) {
        max_transfer = max_transfer.min(u64::from(a.conn.maxh2cdata)).max(4096);
    }
    let ids = active_namespaces_by(&identify, |cmd, what| identify_page(&mut a, cmd, what, t))?;
    let mut namespaces = Vec::with_capacity(ids.len());
    for id in ids {
        let p = identify_page(&mut a, Identify::namespace(id), "Identify Namespace", t)?;
        let ns = IdentifyNamespace::parse(&p)?;
        if ns.nsze == 0 {
            continue; // allocated but inactive
        }
        namespaces.push(Namespace::new(id, ns, max_transfer)?);
    }
    let cqe = run_up(
        &mut a,
        SetFeatures::number_of_queues(opts.io_queues, opts.io_queues).sqe(),
        SyncData::None,
        "Set Features (Number of Queues)",
        t,
    )?;
    let granted = ((cqe.dw0 & 0xFFFF) + 1)
        .min((cqe.dw0 >> 16) + 1)
        .min(u32::from(opts.io_queues)) as u16;
    log::info!(
        "nvme-tcp {addr} {}: controller {cntlid}, {} {}, {} namespaces, {granted} I/O queues, max transfer {max_transfer} B, in-capsule {} B, digests {:?}, MAXH2CDATA {}",
        opts.subnqn,
        identify.model,
        identify.serial,
        namespaces.len(),
        fabrics.in_capsule_bytes(),
        a.conn.neg.digests,
        a.conn.maxh2cdata,
    );
    Ok(Up {
        link: a,
        cntlid,
        cap,
        version,
        identify,
        fabrics,
        namespaces,
        granted,
        max_transfer,
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
        Ok(Arc::new(TcpController {
            addr,
            cntlid: AtomicU16::new(up.cntlid),
            cap: up.cap,
            version: up.version,
            identify: up.identify,
            fabrics: up.fabrics,
            namespaces: up.namespaces,
            granted: up.granted,
            free_qids: Mutex::new((1..=up.granted).rev().collect()),
            max_transfer: up.max_transfer,
            maxh2cdata: up.link.conn.maxh2cdata,
            dma: host_space(),
            admin: Mutex::new(up.link),
            state: StateWord::default(),
            failure: Mutex::new(None),
            resets: AtomicU64::new(0),
            ka_interval_ms,
            ka_last_ms: AtomicU64::new(0),
            ka_sent: AtomicBool::new(false),
            keep_alives: AtomicU64::new(0),
            epoch: Instant::now(),
            opts,
        }))
    }

    /// Reset by reconnecting: close the association's admin connection
    /// (the target then drops the association and every I/O connection of
    /// it) and bring a new association up on a new connection. Every
    /// command outstanding on a queue pair completes — at that queue pair's
    /// next poll — with [`crate::IoError::AbortedByReset`], and the queue
    /// pairs Connect their queues again, same queue ids, under the new
    /// controller id. Also brings back an association that failed (a
    /// closed admin connection, KATO expired). Fails with
    /// [`Error::DeviceChanged`] if the target now shows other namespaces or
    /// grants fewer queues, or with the bring-up's error; the association
    /// is then failed.
    pub fn reset(&self) -> Result<()> {
        let mut a = self.lock_admin();
        self.reset_locked(&mut a)
    }

    /// Reset unless the state moved on from `seen` (another queue pair's
    /// timeout already reset it).
    pub(super) fn reset_if(&self, seen: u64) -> Result<()> {
        let mut a = self.lock_admin();
        if self.state.load() != seen {
            return Ok(());
        }
        self.reset_locked(&mut a)
    }

    fn reset_locked(&self, a: &mut AdminLink) -> Result<()> {
        let s = self.state.load();
        self.state.begin_reset(s);
        a.conn.close();
        a.keep_alive = None;
        self.ka_sent.store(false, Ordering::Relaxed);
        let r = bring_up(self.addr, &self.opts).and_then(|up| {
            let same = up.namespaces.len() == self.namespaces.len()
                && up
                    .namespaces
                    .iter()
                    .zip(&self.namespaces)
                    .all(|(n, o)| n.id == o.id && n.nsze == o.nsze && n.lba_size == o.lba_size);
            if !same || up.fabrics.subnqn != self.fabrics.subnqn {
                return Err(Error::DeviceChanged(
                    "the subsystem shows other namespaces after the reconnect".into(),
                ));
            }
            if up.granted < self.granted {
                return Err(Error::DeviceChanged(format!(
                    "the target now grants {} I/O queues instead of {}",
                    up.granted, self.granted
                )));
            }
            Ok(up)
        });
        match r {
            Ok(up) => {
                *a = up.link;
                self.cntlid.store(up.cntlid, Ordering::Relaxed);
                *self.failure.lock().unwrap_or_else(|p| p.into_inner()) = None;
                self.ka_last_ms
                    .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
                self.resets.fetch_add(1, Ordering::Relaxed);
                // The old association is gone with its connection: a new
                // epoch, healthy.
                self.state.store(state::next(s, state::OK));
                log::info!(
                    "nvme-tcp {}: reconnected as controller {}",
                    self.addr,
                    up.cntlid
                );
                Ok(())
            }
            Err(e) => {
                let t = match &e {
                    Error::Transport(b) => b.downcast_ref::<TcpError>().copied(),
                    _ => None,
                };
                *self.failure.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(t.unwrap_or(TcpError::Closed));
                self.state.store(state::next(s, state::GONE));
                log::error!("nvme-tcp {}: reconnect failed: {e}", self.addr);
                Err(e)
            }
        }
    }

    /// Successful resets (reconnects).
    pub fn resets(&self) -> u64 {
        self.resets.load(Ordering::Relaxed)
    }

    fn lock_admin(&self) -> MutexGuard<'_, AdminLink> {
        self.admin.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The error of a failed association, if it failed.
    pub(super) fn failure(&self) -> Option<TcpError> {
        *self.failure.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The admin connection failed with `e` (admin lock held): record it
    /// once and move the state word to a new, gone epoch.
    fn fail_locked(&self, a: &AdminLink, e: TcpError) {
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            log::error!("nvme-tcp {}: the admin connection failed: {e}", self.addr);
            *f = Some(e);
            a.conn.close();
            // No memory can be left to the target: a new epoch, gone.
            self.state
                .store(state::next(self.state.load(), state::GONE));
        }
    }

    /// Run one admin command (no data, or data read back into `out`).
    fn admin_exec(&self, sqe: Sqe, out: Option<&mut [u8]>, what: &'static str) -> Result<Cqe> {
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
        match run(&mut a, sqe, data, what, self.opts.admin_timeout) {
            Ok(r) => r,
            Err(e) => {
                self.fail_locked(&a, e);
                Err(e.into_error())
            }
        }
    }

    /// An admin command without data (Abort, Set Features, Keep Alive):
    /// its response.
    pub fn admin_cmd(&self, sqe: Sqe, what: &'static str) -> Result<Cqe> {
        self.admin_exec(sqe, None, what)
    }

    /// An admin command that reads `len` bytes (Identify, Get Log Page):
    /// its response and the data.
    pub fn admin_read(&self, sqe: Sqe, len: usize, what: &'static str) -> Result<(Cqe, Vec<u8>)> {
        let mut v = vec![0u8; len];
        let c = self.admin_exec(sqe, Some(&mut v), what)?;
        Ok((c, v))
    }

    /// `Err` once the association failed.
    pub fn health(&self) -> Result<()> {
        match self.failure() {
            Some(e) => Err(e.into_error()),
            None => Ok(()),
        }
    }

    /// Where the target is.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The options the controller was connected with.
    pub fn options(&self) -> &TcpOptions {
        &self.opts
    }

    /// The controller id the target assigned.
    pub fn cntlid(&self) -> u16 {
        self.cntlid.load(Ordering::Relaxed)
    }

    /// CAP (Property Get).
    pub fn cap(&self) -> Cap {
        self.cap
    }

    /// VS (Property Get).
    pub fn version(&self) -> Version {
        self.version
    }

    /// Identify Controller data.
    pub fn identify(&self) -> &IdentifyController {
        &self.identify
    }

    /// The Fabrics fields of Identify Controller (IOCCSZ, SUBNQN, ...).
    pub fn fabrics_identify(&self) -> &FabricsIdentify {
        &self.fabrics
    }

    /// Active namespaces, by ascending id.
    pub fn namespaces(&self) -> &[Namespace] {
        &self.namespaces
    }

    /// Namespace `id`, if active.
    pub fn namespace(&self, id: u32) -> Option<&Namespace> {
        self.namespaces.iter().find(|n| n.id == id)
    }

    /// I/O queues granted.
    pub fn granted_io_queues(&self) -> usize {
        usize::from(self.granted)
    }

    /// Largest transfer per I/O command (MDTS and options).
    pub fn max_transfer(&self) -> u64 {
        self.max_transfer
    }

    /// The most data one H2CData PDU may carry (MAXH2CDATA of the
    /// target's ICResp at bring-up): writes above it go out as several.
    pub fn maxh2cdata(&self) -> u32 {
        self.maxh2cdata
    }

    /// Where buffers come from: host memory (no device maps it).
    pub fn dma(&self) -> &Arc<DmaSpace> {
        &self.dma
    }

    /// A buffer of `len` bytes for this controller's queue pairs.
    pub fn alloc_buf(&self, len: usize, dir: DmaDir) -> Result<DmaBuf> {
        Ok(DmaBuf::alloc(&self.dma, len, dir)?)
    }

    /// In-capsule data an I/O write may carry (IOCCSZ less the SQE).
    pub fn in_capsule_bytes(&self) -> usize {
        self.fabrics.in_capsule_bytes() as usize
    }

    pub(super) fn alloc_qid(&self) -> Result<u16> {
        self.health()?;
        self.free_qids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .ok_or(Error::NoFreeQueue {
                granted: self.granted as usize,
            })
    }

    pub(super) fn release_qid(&self, qid: u16) {
        self.free_qids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(qid);
    }

    /// Entries per queue the controller supports (CAP.MQES + 1).
    pub(super) fn max_entries(&self) -> u32 {
        self.cap.max_queue_entries()
    }
}

impl Controlled for TcpController {
    #[inline(always)]
    fn state_word(&self) -> &StateWord {
        &self.state
    }

    /// Taken under the admin lock, which a reset holds throughout.
    fn settled_state(&self) -> u64 {
        let _a = self.lock_admin();
        self.state.load_acquire()
    }
}

/// Its active namespaces.
impl BlockDevice for TcpController {
    fn units(&self) -> Vec<BlockUnit> {
        self.namespaces.iter().map(Into::into).collect()
    }
}

impl Drop for TcpController {
    fn drop(&mut self) {
        let t = self.opts.shutdown_timeout;
        let mut a = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        let settled = self.settle_keep_alive(&mut a).is_ok();
        let a = &mut *a;
        if settled && self.failure().is_none() {
            let cc = Cc::new()
                .css(Cc::CSS_NVM)
                .iosqes(6)
                .iocqes(4)
                .enable()
                .shn(Cc::SHN_NORMAL);
            if prop_set(a, property::CC, u64::from(cc.0), t).is_ok() {
                let start = Instant::now();
                while start.elapsed() < t {
                    match prop_get(a, property::CSTS, t) {
                        Ok(c) if Csts(c as u32).shst() == Csts::SHST_COMPLETE => break,
                        Ok(_) => std::thread::sleep(Duration::from_millis(1)),
                        Err(_) => break,
                    }
                }
            }
        }
        a.conn.close();
    }
}
