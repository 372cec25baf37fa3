//! Opening a device: from a [`Backing`] (a fake's configuration or a VFIO
//! address) to a [`Device`], the NVMe or UFS controller brought up on it.
//!
//! The one rule for which transport a device speaks lives here: `fake` is
//! NVMe, `fake-ufs` UFS, and a `vfio:` function is whichever its PCI class
//! code says ([`vfio_transport`]). A frontend builds the [`Backing`] from a
//! device string ([`DeviceSpec::backing`]) or from its own options, adjusts
//! what is run-specific (queue pairs, queue sizes, device thread, fault
//! seeds), and opens it with the controller options it wants.
//!
//! A [`Device`] gives its controller for the transport's own API, the
//! common facts (units, DMA space, queues granted), and runs code written
//! once against [`BlockQueue`] on any wire: one queue pair
//! ([`Device::with_queue`]) or one per core ([`Device::run_per_core`]).

use std::sync::Arc;

use mcqio::core::block::BlockQueue;
use mcqio::nvme::tcp::{TcpController, TcpOptions};
use mcqio::ufs::UfsMode;
use mcqio::{BlockDevice, BlockUnit};
use mcqio::{Controller, ControllerOptions, DmaBuf, UfsController, UfsOptions};
use mcqio_fixtures::ufs::{FakeUfs, UfsConfig};
use mcqio_fixtures::{FakeConfig, FakeController};
use mcqio_vfio::sysfs::{self, Transport};
use mcqio_vfio::{Backend, DmaSpace, OpenOptions as VfioOpenOptions, PciAddress, SysRoots};

use crate::devstr::{DeviceKind, DeviceSpec, SpecError};

/// What a device is built on, before its controller is brought up.
#[derive(Debug, Clone)]
pub enum Backing {
    /// The in-process fake NVMe controller.
    FakeNvme(FakeConfig),
    /// The in-process fake UFS host controller.
    FakeUfs(UfsConfig),
    /// A PCI function bound to vfio-pci: NVMe or UFS by its class code.
    Vfio {
        /// PCI address as given (`0000:01:00.0`, `01:00.0`).
        bdf: String,
        /// How to open it. `require_nvme` is set by the opener from the
        /// class code; `roots` is also where the class code is read.
        options: VfioOpenOptions,
    },
    /// An NVMe/TCP target: no backend, the controller is a connection.
    Tcp {
        /// `host:port`.
        addr: String,
        /// Subsystem, digests, Keep Alive, queues to ask for.
        options: TcpOptions,
    },
}

/// Controller options for every wire: the one that fits the device
/// is used.
#[derive(Debug, Clone, Default)]
pub struct CtrlOptions {
    /// For an NVMe controller.
    pub nvme: ControllerOptions,
    /// For a UFS host controller.
    pub ufs: UfsOptions,
}

/// An open controller, NVMe or UFS.
#[derive(Debug, Clone)]
pub enum Device {
    /// An NVMe controller.
    Nvme(Arc<Controller>),
    /// A UFS host controller.
    Ufs(Arc<UfsController>),
    /// An NVMe controller over NVMe/TCP.
    Tcp(Arc<TcpController>),
}

/// The fake a device runs on, for fault injection and its counters.
#[derive(Debug, Clone)]
pub enum Fake {
    /// The fake NVMe controller.
    Nvme(Arc<FakeController>),
    /// The fake UFS host controller.
    Ufs(Arc<FakeUfs>),
}

/// What [`Backing::open`] returns: the controller, and the fake under it
/// (`None` for a real device).
#[derive(Debug, Clone)]
pub struct Opened {
    /// The controller.
    pub device: Device,
    /// The fake, if the device is one.
    pub fake: Option<Fake>,
}

/// Why a device cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The device string names no controller, or options the caller does
    /// not use.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The fake refused its configuration.
    #[error("{what}: {why}")]
    Fake {
        /// "fake controller" or "fake UFS controller".
        what: &'static str,
        /// The fixture's message.
        why: String,
    },
    /// The PCI function is neither an NVMe nor a UFS controller.
    #[error("{bdf}: its PCI class code is neither NVMe (0x0108xx) nor UFS (0x0109xx)")]
    NotAController {
        /// The address.
        bdf: String,
    },
    /// The PCI function could not be opened through VFIO.
    #[error("{bdf}: {why}")]
    Vfio {
        /// The address.
        bdf: String,
        /// The library's message.
        why: String,
    },
    /// The NVMe controller did not come up.
    #[error(transparent)]
    Nvme(#[from] mcqio::Error),
    /// The UFS host controller did not come up.
    #[error(transparent)]
    Ufs(#[from] mcqio::UfsCtrlError),
}

impl OpenError {
    /// The message without the device's name in front (for callers that
    /// name the device themselves).
    pub fn why(&self) -> String {
        match self {
            OpenError::Fake { why, .. } | OpenError::Vfio { why, .. } => why.clone(),
            OpenError::NotAController { .. } => {
                "its PCI class code is neither NVMe (0x0108xx) nor UFS (0x0109xx)".into()
            }
            e => e.to_string(),
        }
    }
}

/// NVMe or UFS, from the PCI class code of `bdf` under `roots`. An address
/// sysfs does not know is taken for NVMe: opening it then says why it
/// cannot be used.
pub fn vfio_transport(roots: &SysRoots, bdf: &str) -> Result<Transport, OpenError> {
    let addr = PciAddress::parse(bdf).map_err(|e| OpenError::Vfio {
        bdf: bdf.to_string(),
        why: e.to_string(),
    })?;
    match sysfs::transport_of(roots, &addr) {
        Ok(Some(t)) => Ok(t),
        Ok(None) => Err(OpenError::NotAController {
            bdf: bdf.to_string(),
        }),
        Err(_) => Ok(Transport::Nvme),
    }
}

impl Backing {
    /// The transport the device speaks (a `Vfio` backing reads its class
    /// code).
    pub fn transport(&self) -> Result<Transport, OpenError> {
        match self {
            Backing::FakeNvme(_) => Ok(Transport::Nvme),
            Backing::FakeUfs(_) => Ok(Transport::Ufs),
            Backing::Vfio { bdf, options } => vfio_transport(&options.roots, bdf),
            Backing::Tcp { .. } => Ok(Transport::Nvme),
        }
    }

    /// Build the backend and bring its controller up with `opts` (an
    /// NVMe/TCP target: connect and bring the association up; `opts.nvme`
    /// gives the admin timeout and the per-command cap).
    pub fn open(self, opts: &CtrlOptions) -> Result<Opened, OpenError> {
        if let Backing::Tcp { addr, options } = self {
            return open_tcp(&addr, options, opts);
        }
        self.attach()?.open(opts)
    }

    /// Build the backend (create the fake, or open the PCI function) and
    /// stop there: the caller may arm the fake's fault injection before
    /// the controller is brought up ([`Attached::open`]).
    pub fn attach(self) -> Result<Attached, OpenError> {
        let transport = self.transport()?;
        let (backend, fake): (Arc<dyn Backend>, _) = match self {
            Backing::FakeNvme(cfg) => {
                let f = FakeController::new(cfg).map_err(|e| OpenError::Fake {
                    what: "fake controller",
                    why: e.to_string(),
                })?;
                (f.clone(), Some(Fake::Nvme(f)))
            }
            Backing::FakeUfs(cfg) => {
                let f = FakeUfs::new(cfg).map_err(|e| OpenError::Fake {
                    what: "fake UFS controller",
                    why: e.to_string(),
                })?;
                (f.clone(), Some(Fake::Ufs(f)))
            }
            Backing::Tcp { addr, .. } => {
                return Err(OpenError::Spec(SpecError(format!(
                    "tcp:{addr} has no backend to attach: open it (Backing::open)"
                ))))
            }
            Backing::Vfio { bdf, options } => {
                let options = VfioOpenOptions {
                    // The default refuses anything but an NVMe controller.
                    require_nvme: transport == Transport::Nvme,
                    ..options
                };
                let b = mcqio_vfio::VfioBackend::open_with(&bdf, &options).map_err(|e| {
                    OpenError::Vfio {
                        bdf: bdf.clone(),
                        why: e.to_string(),
                    }
                })?;
                (Arc::new(b), None)
            }
        };
        Ok(Attached {
            backend,
            fake,
            transport,
        })
    }
}

/// What the discovery controller at `target` — `tcp:<address>:<port>`,
/// no subsystem (IPv6 hosts in brackets) — lists: its Discovery Log Page
/// read whole ([`mcqio::nvme::tcp::discover`]), from the first address it
/// resolves to that answers. `timeout` bounds each step.
pub fn discover_tcp(
    target: &str,
    timeout: std::time::Duration,
) -> Result<mcqio::nvme::tcp::DiscoveryLog, OpenError> {
    use std::net::ToSocketAddrs;
    let usage = "use tcp:<address>:<port>, e.g. tcp:127.0.0.1:4420";
    let Some(addr) = target.trim().strip_prefix("tcp:") else {
        return Err(SpecError(format!("`{target}` is not a tcp: target: {usage}")).into());
    };
    match addr.rsplit_once(':').map(|(h, p)| (h, p.parse::<u16>())) {
        Some((h, Ok(p))) if !h.is_empty() && p != 0 && !addr.contains('/') => {}
        _ => return Err(SpecError(format!("`{addr}` is not <address>:<port>: {usage}")).into()),
    }
    let addrs: Vec<_> = addr
        .to_socket_addrs()
        .map_err(|e| SpecError(format!("tcp:{addr}: {e}")))?
        .collect();
    let o = TcpOptions {
        admin_timeout: timeout,
        ..TcpOptions::default()
    };
    let mut last = None;
    for a in addrs {
        match mcqio::nvme::tcp::discover(a, &o) {
            Ok(log) => return Ok(log),
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) => OpenError::Nvme(e),
        None => SpecError(format!("tcp:{addr} resolves to no address")).into(),
    })
}

/// Resolve `addr` and connect (each address it resolves to, in turn).
fn open_tcp(addr: &str, mut o: TcpOptions, opts: &CtrlOptions) -> Result<Opened, OpenError> {
    use std::net::ToSocketAddrs;
    o.admin_timeout = opts.nvme.admin_timeout;
    o.max_transfer = opts.nvme.max_transfer;
    let addrs: Vec<_> = addr
        .to_socket_addrs()
        .map_err(|e| SpecError(format!("tcp:{addr}: {e}")))?
        .collect();
    let mut last = None;
    for a in addrs {
        match TcpController::connect(a, o.clone()) {
            Ok(c) => {
                return Ok(Opened {
                    device: Device::Tcp(c),
                    fake: None,
                })
            }
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) => OpenError::Nvme(e),
        None => SpecError(format!("tcp:{addr} resolves to no address")).into(),
    })
}

/// The default queue-pair options, the depth capped to what the target
/// offers (Linux's nvmet-tcp and the fake offer 128 entries, below the
/// default depth of 256).
fn tcp_qpair_options(c: &TcpController) -> mcqio::QpairOptions {
    let d = mcqio::QpairOptions::default();
    let most = c.cap().max_queue_entries().saturating_sub(1).clamp(1, 4096) as u16;
    mcqio::QpairOptions {
        depth: d.depth.min(most),
        ..d
    }
}

/// A backend built and its controller not yet brought up
/// ([`Backing::attach`]).
#[derive(Clone)]
pub struct Attached {
    /// The backend the controller will drive.
    pub backend: Arc<dyn Backend>,
    /// The fake, if the backend is one.
    pub fake: Option<Fake>,
    /// The transport the controller speaks.
    pub transport: Transport,
}

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attached")
            .field("backend", &self.backend.name())
            .field("transport", &self.transport)
            .finish_non_exhaustive()
    }
}

impl Attached {
    /// Bring the controller up with `opts` (the transport's half).
    pub fn open(self, opts: &CtrlOptions) -> Result<Opened, OpenError> {
        let device = match self.transport {
            Transport::Nvme => Device::Nvme(Controller::new(self.backend, opts.nvme.clone())?),
            Transport::Ufs => Device::Ufs(UfsController::new(self.backend, opts.ufs.clone())?),
        };
        Ok(Opened {
            device,
            fake: self.fake,
        })
    }
}

/// Options of a `fake` device the small programs (`hello`, `identify`,
/// `app_buffers`) use; the others (fault injection, `core=`) are refused.
const SMALL_FAKE_KEYS: &[&str] = &["lbs", "lbads", "ns", "size", "latency", "qpairs", "sync"];
/// The same for `fake-ufs`.
const SMALL_FAKE_UFS_KEYS: &[&str] = &[
    "mcq", "queues", "lus", "size", "latency", "sync", "tr", "tprog", "dies",
];

impl DeviceSpec {
    /// What a `fake`, `fake-ufs` or `vfio:` spec is built on, from the one
    /// set of defaults, for programs that take no run-specific settings.
    /// `who` (a program name, for the message) reads `lbs`, `lbads`, `ns`,
    /// `size`, `latency`, `qpairs` and `sync` of `fake` (and `mcq`,
    /// `queues`, `lus` and the cost model of `fake-ufs`); other options and
    /// the io_uring kinds are refused.
    pub fn backing(&self, who: &str) -> Result<Backing, SpecError> {
        match &self.kind {
            DeviceKind::FakeUfs { .. } => {
                self.check_keys(SMALL_FAKE_UFS_KEYS, who)?;
                Ok(Backing::FakeUfs(
                    self.fake_ufs_config()
                        .expect("a fake-ufs spec has a fake UFS config"),
                ))
            }
            DeviceKind::Fake { .. } => {
                self.check_keys(SMALL_FAKE_KEYS, who)?;
                Ok(Backing::FakeNvme(
                    self.fake_config().expect("a fake spec has a fake config"),
                ))
            }
            DeviceKind::Vfio { bdf } => {
                self.check_keys(&["mcq", "iommu"], who)?;
                Ok(Backing::Vfio {
                    bdf: bdf.clone(),
                    options: self.vfio_options(),
                })
            }
            DeviceKind::Tcp { addr, subnqn } => Ok(Backing::Tcp {
                addr: addr.clone(),
                options: self.tcp_options(subnqn),
            }),
            _ => Err(SpecError(format!(
                "{who} drives an NVMe or UFS controller: use fake[,options], fake-ufs[,options] or vfio:<BDF>, not `{}`",
                self.label()
            ))),
        }
    }

    /// The NVMe/TCP options a `tcp:` spec gives for `subnqn`: digests,
    /// `qpairs=` (queues to ask for), `kato=`.
    pub fn tcp_options(&self, subnqn: &str) -> TcpOptions {
        let d = TcpOptions::default();
        TcpOptions {
            subnqn: subnqn.into(),
            header_digest: self.opts.hdgst.unwrap_or(false),
            data_digest: self.opts.ddgst.unwrap_or(false),
            io_queues: self.opts.qpairs.unwrap_or(d.io_queues),
            kato: self.opts.kato.unwrap_or(d.kato),
            recv_pacing: self.opts.pace.unwrap_or(d.recv_pacing),
            ..d
        }
    }

    /// Open the device with the controller defaults (UFS: `mcq=` of the
    /// spec; NVMe: `shadow=`), for `who` (see [`DeviceSpec::backing`]).
    pub fn open(&self, who: &str) -> Result<Opened, OpenError> {
        let mut opts = CtrlOptions::default();
        if let Some(mcq) = self.opts.mcq {
            opts.ufs.mcq = mcq;
        }
        if let Some(shadow) = self.opts.shadow {
            opts.nvme.shadow_doorbells = shadow;
        }
        self.backing(who)?.open(&opts)
    }
}

/// Its namespaces (NVMe, active ones) or logical units (UFS), as the
/// engine describes them for every wire.
impl BlockDevice for Device {
    fn units(&self) -> Vec<BlockUnit> {
        match self {
            Device::Nvme(c) => c.units(),
            Device::Ufs(c) => c.units(),
            Device::Tcp(c) => c.units(),
        }
    }
}

/// Code run on a queue pair of any wire: a closure generic over
/// the queue pair's type, which Rust closures cannot be. Resolved
/// statically: each transport gets its own copy, nothing is dispatched
/// per I/O.
pub trait OnQueue: Sync {
    /// What one run returns.
    type Output: Send;
    /// Run on queue pair number `index` (from 0); `units` are the device's
    /// namespaces or logical units as that queue pair addresses them, in
    /// the order of [`BlockDevice::units`].
    fn run<Q: BlockQueue<Buf = DmaBuf>>(
        &self,
        index: usize,
        qp: &mut Q,
        units: &[Q::Addr],
    ) -> Self::Output;
}

impl Device {
    /// The transport.
    pub fn transport(&self) -> Transport {
        match self {
            Device::Nvme(_) | Device::Tcp(_) => Transport::Nvme,
            Device::Ufs(_) => Transport::Ufs,
        }
    }

    /// The DMA space buffers are allocated in.
    pub fn dma(&self) -> &Arc<DmaSpace> {
        match self {
            Device::Nvme(c) => c.dma(),
            Device::Ufs(c) => c.dma(),
            Device::Tcp(c) => c.dma(),
        }
    }

    /// Largest bytes per command the controller was set up for.
    pub fn max_transfer(&self) -> u64 {
        match self {
            Device::Nvme(c) => c.max_transfer(),
            Device::Ufs(c) => u64::from(c.options().max_transfer),
            Device::Tcp(c) => c.max_transfer(),
        }
    }

    /// I/O queue pairs the controller granted (UFS MCQ: its hardware
    /// queues; legacy: the one list).
    pub fn granted_queues(&self) -> usize {
        match self {
            Device::Nvme(c) => c.granted_io_queues(),
            Device::Tcp(c) => c.granted_io_queues(),
            Device::Ufs(c) => match c.mode() {
                UfsMode::Mcq { queues } => usize::from(queues),
                UfsMode::Legacy => 1,
            },
        }
    }

    /// Create one queue pair with the transport's default options and run
    /// `f` on it (as queue pair 0).
    pub fn with_queue<F: OnQueue>(&self, f: &F) -> mcqio::Result<F::Output> {
        match self {
            Device::Nvme(c) => {
                let mut qp = c.create_qpair(Default::default())?;
                let units: Vec<u32> = c.namespaces().iter().map(|n| n.id).collect();
                Ok(f.run(0, &mut qp, &units))
            }
            Device::Tcp(c) => {
                let mut qp = c.create_qpair(tcp_qpair_options(c))?;
                let units: Vec<u32> = c.namespaces().iter().map(|n| n.id).collect();
                Ok(f.run(0, &mut qp, &units))
            }
            Device::Ufs(c) => {
                let mut qp = c.create_qpair(Default::default())?;
                let units: Vec<u8> = c.logical_units().iter().map(|l| l.lun).collect();
                Ok(f.run(0, &mut qp, &units))
            }
        }
    }

    /// Run `f` on `threads` pinned threads, one queue pair each
    /// ([`mcqio::run_per_core`], default queue-pair options), and return
    /// the results in index order.
    pub fn run_per_core<F: OnQueue>(&self, threads: usize, f: &F) -> mcqio::Result<Vec<F::Output>> {
        match self {
            Device::Nvme(c) => {
                let units: Vec<u32> = c.namespaces().iter().map(|n| n.id).collect();
                mcqio::run_per_core(c, threads, Default::default(), |i, qp| f.run(i, qp, &units))
            }
            Device::Tcp(c) => {
                let units: Vec<u32> = c.namespaces().iter().map(|n| n.id).collect();
                mcqio::run_per_core(c, threads, tcp_qpair_options(c), |i, qp| {
                    f.run(i, qp, &units)
                })
            }
            Device::Ufs(c) => {
                let units: Vec<u8> = c.logical_units().iter().map(|l| l.lun).collect();
                mcqio::run_per_core(c, threads, Default::default(), |i, qp| f.run(i, qp, &units))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcqio::vfio::DmaDir;

    /// Write one block per queue pair with its index, read it back: the
    /// same code on NVMe and UFS.
    struct Stamp(Arc<DmaSpace>);

    impl OnQueue for Stamp {
        type Output = bool;
        fn run<Q: BlockQueue<Buf = DmaBuf>>(
            &self,
            index: usize,
            qp: &mut Q,
            units: &[Q::Addr],
        ) -> bool {
            let at = units[0];
            let bs = 1usize << qp.block_shift(at).expect("unit 0 exists");
            let mut b = DmaBuf::alloc(&self.0, bs, DmaDir::Bidirectional).unwrap();
            b.fill(index as u8 + 1);
            let once = |qp: &mut Q, write: bool, b: DmaBuf| -> DmaBuf {
                if write {
                    qp.write(at, index as u64, 1, b, 0)
                        .map_err(|e| e.kind)
                        .unwrap();
                } else {
                    qp.read(at, index as u64, 1, b, 0)
                        .map_err(|e| e.kind)
                        .unwrap();
                }
                qp.submit();
                let mut got = None;
                while got.is_none() {
                    qp.poll(1, |c| {
                        c.result.unwrap();
                        got = c.buf;
                    })
                    .unwrap();
                }
                got.unwrap()
            };
            let mut b = once(qp, true, b);
            b.fill(0);
            let b = once(qp, false, b);
            let mut first = [0u8; 1];
            b.read_at(0, &mut first).unwrap();
            first[0] == index as u8 + 1
        }
    }

    #[test]
    fn one_body_on_nvme_and_ufs() {
        for s in ["fake,sync=1", "fake-ufs,sync=1"] {
            let spec: DeviceSpec = s.parse().unwrap();
            let dev = spec.open("test").unwrap().device;
            assert_eq!(dev.units().len(), 1, "{s}");
            let stamp = Stamp(dev.dma().clone());
            assert!(dev.with_queue(&stamp).unwrap(), "{s}");
            for ok in dev.run_per_core(1, &stamp).unwrap() {
                assert!(ok, "{s}");
            }
            assert!(dev.granted_queues() >= 1, "{s}");
        }
    }

    /// A `tcp:` device runs the same body, one connection per queue pair.
    #[test]
    fn one_body_over_nvme_tcp() {
        let t = mcqio_fixtures::tcp::FakeTcpTarget::start(Default::default()).unwrap();
        let spec: DeviceSpec = format!("tcp:{}/{},hdgst,ddgst,qpairs=2", t.addr(), t.subnqn())
            .parse()
            .unwrap();
        let o = spec.open("test").unwrap();
        assert!(o.fake.is_none());
        let dev = o.device;
        assert!(matches!(dev, Device::Tcp(_)));
        assert_eq!(dev.transport(), Transport::Nvme);
        assert_eq!(dev.units().len(), 2);
        assert_eq!(dev.granted_queues(), 2);
        let stamp = Stamp(dev.dma().clone());
        assert!(dev.with_queue(&stamp).unwrap());
        for ok in dev.run_per_core(2, &stamp).unwrap() {
            assert!(ok);
        }
        assert_eq!(
            mcqio_fixtures::tcp::TcpTargetStats::get(&t.stats().io_connects),
            3
        );
    }

    /// The transport of a `vfio:` device comes from its PCI class code.
    #[test]
    fn vfio_transport_from_the_class_code() {
        let base = std::env::temp_dir().join(format!("mcqio-open-sysfs-{}", std::process::id()));
        let roots = SysRoots::under(&base);
        for (bdf, class) in [
            ("0000:00:04.0", "0x010901"),
            ("0000:00:03.0", "0x010802"),
            ("0000:00:05.0", "0x020000"),
        ] {
            let d = roots.sys.join("bus/pci/devices").join(bdf);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("vendor"), "0x1b36\n").unwrap();
            std::fs::write(d.join("device"), "0x0013\n").unwrap();
            std::fs::write(d.join("class"), format!("{class}\n")).unwrap();
        }
        let t = |bdf| vfio_transport(&roots, bdf);
        assert_eq!(t("0000:00:04.0").unwrap(), Transport::Ufs);
        assert_eq!(t("0000:00:03.0").unwrap(), Transport::Nvme);
        // A network card is neither: refused with its reason.
        let e = t("0000:00:05.0").unwrap_err();
        assert!(matches!(e, OpenError::NotAController { .. }), "{e}");
        assert!(e.why().starts_with("its PCI class code"), "{e}");
        // Unknown to sysfs: NVMe, and opening it says why it cannot be used.
        assert_eq!(t("0000:00:09.0").unwrap(), Transport::Nvme);
        let b = Backing::Vfio {
            bdf: "0000:00:04.0".into(),
            options: VfioOpenOptions {
                roots: roots.clone(),
                ..VfioOpenOptions::default()
            },
        };
        assert_eq!(b.transport().unwrap(), Transport::Ufs);
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn the_transport_follows_the_spec() {
        let o = |s: &str| s.parse::<DeviceSpec>().unwrap().open("test").unwrap();
        let n = o("fake,sync=1");
        assert!(matches!(
            (&n.device, &n.fake),
            (Device::Nvme(_), Some(Fake::Nvme(_)))
        ));
        let u = o("fake-ufs,mcq=off,sync=1");
        let Device::Ufs(c) = &u.device else {
            panic!("fake-ufs opened as NVMe")
        };
        assert_eq!(c.mode(), UfsMode::Legacy);
        assert_eq!(u.device.granted_queues(), 1);
    }
}
