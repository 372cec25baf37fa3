//! Controllers shared by the fio jobs of one process.
//!
//! fio calls an engine's `setup` once per job; every job that names the
//! same controller (the filename's device part) gets the same [`Device`],
//! opened by the first and closed when the last job's handle is dropped.
//!
//! The transport is chosen once, when the controller is opened: `fake` is
//! NVMe, `fake-ufs` UFS, and a `vfio-` function is whichever its PCI class
//! code says ([`mcqio_vfio::sysfs::transport_of`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use mcqio::ufs::{UfsController, UfsMode, UfsOptions};
use mcqio::{Controller, ControllerOptions};
use mcqio_fixtures::ufs::{FakeUfs, LuConfig, UfsConfig, BLOCK_SIZE as UFS_BLOCK_SIZE};
use mcqio_fixtures::{ExecMode, FakeConfig, FakeController, NamespaceConfig};
use mcqio_vfio::sysfs::{self, Transport};
use mcqio_vfio::{
    Backend, DmaSpace, OpenOptions as VfioOpenOptions, PciAddress, SysRoots, VfioBackend,
};

use crate::spec::{DeviceKind, DeviceOptions, FakeExec, SpecError};
use crate::EngineError;

/// Default bytes per I/O command the controller is set up for (the PRP list
/// pages are sized for it); jobs with larger blocks raise it.
const DEFAULT_MAX_TRANSFER: u64 = 2 << 20;

/// UFSHCI 4.0 has at most 32 MCQ queues.
const UFS_MAX_QUEUES: u16 = 32;

/// Commands per UFS queue pair asked for: the controller lowers it to what
/// the host controller (MCQ MAC, or the 32 legacy slots) and the device
/// (bQueueDepth) allow.
const UFS_DEPTH: u16 = 256;

/// The controller of a [`Device`], one per transport.
pub enum Ctrl {
    /// An NVMe controller.
    Nvme(Arc<Controller>),
    /// A UFS host controller.
    Ufs(Arc<UfsController>),
}

/// An open controller.
pub struct Device {
    key: String,
    opts: DeviceOptions,
    ctrl: Ctrl,
    /// Bytes of job buffers leaked because the device may still access
    /// them (see `Job::free_buffers`).
    leaked: AtomicU64,
    // Kept so the fake lives exactly as long as its controller handle.
    _fake: Option<Arc<dyn Backend>>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// Open controllers by key. Only `setup` and `cleanup` take the lock.
static OPEN: Mutex<Vec<(String, Weak<Device>)>> = Mutex::new(Vec::new());

fn pages_log2(bytes: u64) -> u8 {
    let pages = bytes.div_ceil(4096).max(1);
    pages.next_power_of_two().trailing_zeros() as u8
}

impl Device {
    /// The controller `kind` names, opened with `opts` if no job has it open.
    /// `max_io` is the largest I/O the calling job issues.
    pub fn get(
        kind: &DeviceKind,
        opts: &DeviceOptions,
        max_io: u64,
    ) -> Result<Arc<Device>, EngineError> {
        let key = kind.key();
        let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|(_, w)| w.strong_count() > 0);
        if let Some(dev) = open
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, w)| w.upgrade())
        {
            if dev.opts != *opts {
                return Err(EngineError::OptionsDiffer { device: key });
            }
            return Ok(dev);
        }
        let dev = Arc::new(Device::open(kind, opts, max_io)?);
        open.push((key, Arc::downgrade(&dev)));
        Ok(dev)
    }

    fn open(kind: &DeviceKind, o: &DeviceOptions, max_io: u64) -> Result<Device, EngineError> {
        let key = kind.key();
        let max_transfer = max_io.max(DEFAULT_MAX_TRANSFER);
        let open_err = |e: String| EngineError::Open {
            device: key.clone(),
            why: e,
        };
        let (backend, fake, transport): (Arc<dyn Backend>, _, _) = match kind {
            DeviceKind::FakeNvme => {
                let size = o.fake_size / u64::from(o.fake_lbs) * u64::from(o.fake_lbs);
                let cfg = FakeConfig {
                    namespaces: (0..o.fake_namespaces)
                        .map(|_| NamespaceConfig::ram(size, o.fake_lbs))
                        .collect(),
                    io_queue_pairs: o.qpairs,
                    mqes: 4095,
                    mdts: pages_log2(max_transfer),
                    exec: fake_exec(o),
                    latency: o.fake_latency,
                    ..FakeConfig::default()
                };
                let fake = FakeController::new(cfg).map_err(|e| open_err(e.to_string()))?;
                let b = fake as Arc<dyn Backend>;
                (b.clone(), Some(b), Transport::Nvme)
            }
            DeviceKind::FakeUfs => {
                let fake =
                    FakeUfs::new(fake_ufs_config(o)?).map_err(|e| open_err(e.to_string()))?;
                let b = fake as Arc<dyn Backend>;
                (b.clone(), Some(b), Transport::Ufs)
            }
            DeviceKind::Vfio { bdf } => {
                let transport = vfio_transport(&SysRoots::default(), bdf)?;
                let mut vo = VfioOpenOptions {
                    huge_pages: o.huge_pages,
                    // The default refuses anything but an NVMe controller.
                    require_nvme: transport == Transport::Nvme,
                    ..VfioOpenOptions::default()
                };
                if o.dma_budget > 0 {
                    vo.dma_budget = o.dma_budget;
                }
                let b = VfioBackend::open_with(bdf, &vo).map_err(|e| open_err(e.to_string()))?;
                (Arc::new(b) as Arc<dyn Backend>, None, transport)
            }
        };
        let ctrl = match transport {
            Transport::Nvme => {
                let copts = ControllerOptions {
                    io_queues: o.qpairs,
                    shadow_doorbells: o.shadow_doorbells,
                    max_transfer,
                    ..ControllerOptions::default()
                };
                Ctrl::Nvme(Controller::new(backend, copts).map_err(|e| open_err(e.to_string()))?)
            }
            Transport::Ufs => ufs_ctrl(backend, o, max_io, max_transfer, &key)?,
        };
        Ok(Device {
            key,
            opts: o.clone(),
            ctrl,
            leaked: AtomicU64::new(0),
            _fake: fake,
        })
    }

    /// A private fake UFS controller (not shared through the registry),
    /// with its handle for fault injection.
    #[cfg(test)]
    pub(crate) fn private_fake_ufs(o: &DeviceOptions) -> (Arc<Device>, Arc<FakeUfs>) {
        let fake = FakeUfs::new(fake_ufs_config(o).unwrap()).unwrap();
        let b = fake.clone() as Arc<dyn Backend>;
        let key = "fake-ufs (private)".to_string();
        let ctrl = ufs_ctrl(b.clone(), o, 4096, DEFAULT_MAX_TRANSFER, &key).unwrap();
        let dev = Device {
            key,
            opts: o.clone(),
            ctrl,
            leaked: AtomicU64::new(0),
            _fake: Some(b),
        };
        (Arc::new(dev), fake)
    }

    /// A private fake NVMe controller (not shared through the registry),
    /// with its handle for fault injection.
    #[cfg(test)]
    pub(crate) fn private_fake_nvme(o: &DeviceOptions) -> (Arc<Device>, Arc<FakeController>) {
        let size = o.fake_size / u64::from(o.fake_lbs) * u64::from(o.fake_lbs);
        let cfg = FakeConfig {
            namespaces: (0..o.fake_namespaces)
                .map(|_| NamespaceConfig::ram(size, o.fake_lbs))
                .collect(),
            io_queue_pairs: o.qpairs,
            exec: fake_exec(o),
            ..FakeConfig::default()
        };
        let fake = FakeController::new(cfg).unwrap();
        let b = fake.clone() as Arc<dyn Backend>;
        let ctrl = Controller::new(b.clone(), ControllerOptions::default()).unwrap();
        let dev = Device {
            key: "fake (private)".to_string(),
            opts: o.clone(),
            ctrl: Ctrl::Nvme(ctrl),
            leaked: AtomicU64::new(0),
            _fake: Some(b),
        };
        (Arc::new(dev), fake)
    }

    /// The controller.
    pub fn ctrl(&self) -> &Ctrl {
        &self.ctrl
    }

    /// Largest bytes per command the controller was set up for.
    pub fn max_transfer(&self) -> u64 {
        match &self.ctrl {
            Ctrl::Nvme(c) => c.max_transfer(),
            Ctrl::Ufs(c) => u64::from(c.options().max_transfer),
        }
    }

    /// The DMA space fio's buffers are allocated in.
    pub fn dma(&self) -> &Arc<DmaSpace> {
        match &self.ctrl {
            Ctrl::Nvme(c) => c.dma(),
            Ctrl::Ufs(c) => c.dma(),
        }
    }

    /// Queue pairs the controller can give jobs (for error messages).
    pub fn granted_queues(&self) -> usize {
        match &self.ctrl {
            Ctrl::Nvme(c) => c.granted_io_queues(),
            Ctrl::Ufs(c) => match c.mode() {
                UfsMode::Mcq { queues } => usize::from(queues),
                UfsMode::Legacy => 1,
            },
        }
    }

    /// The key jobs share it by (`fake`, `vfio:0000:01:00.0`).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Bytes of job buffers leaked (never unmapped, never reused) because
    /// the device may still access them: a command came back without its
    /// buffer.
    pub fn leaked_bytes(&self) -> u64 {
        self.leaked.load(Ordering::Relaxed)
    }

    /// Count `bytes` of job buffers leaked.
    pub(crate) fn note_leak(&self, bytes: u64) {
        self.leaked.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The options it was opened with.
    pub fn options(&self) -> &DeviceOptions {
        &self.opts
    }
}

fn fake_exec(o: &DeviceOptions) -> ExecMode {
    match o.fake_exec {
        FakeExec::Sync => ExecMode::Sync,
        FakeExec::Thread => ExecMode::Threaded {
            workers: 1,
            pin_core: o.fake_core,
        },
    }
}

/// The fake UFS host controller the options describe: `fake_namespaces`
/// RAM LUs of `fake_size` bytes in 4 KiB blocks, `qpairs` MCQ queues (at
/// most 32), MCQ advertised if `mcq`.
fn fake_ufs_config(o: &DeviceOptions) -> Result<UfsConfig, EngineError> {
    let bad =
        |option, value: String, why| EngineError::Spec(SpecError::BadOption { option, value, why });
    if o.fake_lbs != UFS_BLOCK_SIZE {
        return Err(bad(
            "fake_lbs",
            o.fake_lbs.to_string(),
            "the fake UFS device has 4096-byte blocks",
        ));
    }
    if o.fake_size < u64::from(UFS_BLOCK_SIZE) {
        return Err(bad(
            "fake_size",
            o.fake_size.to_string(),
            "must hold at least one 4096-byte block",
        ));
    }
    let lus = usize::try_from(o.fake_namespaces)
        .ok()
        .filter(|n| (1..=32).contains(n))
        .ok_or_else(|| {
            bad(
                "fake_namespaces",
                o.fake_namespaces.to_string(),
                "the fake UFS device has 1 to 32 logical units",
            )
        })?;
    Ok(UfsConfig {
        lus: vec![LuConfig::ram_bytes(o.fake_size); lus],
        mcq: o.mcq,
        // Bounded by UFS_MAX_QUEUES (32), so it fits.
        queues: o.qpairs.clamp(1, UFS_MAX_QUEUES) as u8,
        exec: fake_exec(o),
        latency: o.fake_latency,
        ..UfsConfig::default()
    })
}

/// NVMe or UFS, from the PCI class code of `bdf` under `roots`. An address
/// sysfs does not know is taken for NVMe: opening it then says why it
/// cannot be used.
pub fn vfio_transport(roots: &SysRoots, bdf: &str) -> Result<Transport, EngineError> {
    let addr = PciAddress::parse(bdf).map_err(|e| EngineError::Open {
        device: format!("vfio:{bdf}"),
        why: e.to_string(),
    })?;
    match sysfs::transport_of(roots, &addr) {
        Ok(Some(t)) => Ok(t),
        Ok(None) => Err(EngineError::Open {
            device: format!("vfio:{bdf}"),
            why: "its PCI class code is neither NVMe (0x0108xx) nor UFS (0x0109xx)".into(),
        }),
        Err(_) => Ok(Transport::Nvme),
    }
}

/// Bring up the UFS host controller behind `backend`.
fn ufs_ctrl(
    backend: Arc<dyn Backend>,
    o: &DeviceOptions,
    max_io: u64,
    max_transfer: u64,
    key: &str,
) -> Result<Ctrl, EngineError> {
    let uopts = UfsOptions {
        mcq: o.mcq,
        queues: o.qpairs.min(UFS_MAX_QUEUES),
        depth: UFS_DEPTH,
        // Whole pages (UFS wants a multiple of 4), at most 4 GiB - 4 KiB.
        max_transfer: max_transfer
            .checked_next_multiple_of(4096)
            .and_then(|m| u32::try_from(m).ok())
            .ok_or(EngineError::TooLarge {
                bs: max_io,
                max: u64::from(u32::MAX) & !4095,
                file: key.to_string(),
            })?,
        ..UfsOptions::default()
    };
    let ctrl = UfsController::new(backend, uopts).map_err(|e| EngineError::Open {
        device: key.to_string(),
        why: e.to_string(),
    })?;
    Ok(Ctrl::Ufs(ctrl))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcqio_vfio::HugePages;
    use std::time::Duration;

    fn opts() -> DeviceOptions {
        DeviceOptions {
            huge_pages: HugePages::Never,
            dma_budget: 0,
            qpairs: 64,
            mcq: true,
            shadow_doorbells: true,
            io_timeout: None,
            fake_size: 1 << 20,
            fake_lbs: 4096,
            fake_namespaces: 3,
            fake_exec: FakeExec::Sync,
            fake_latency: Duration::ZERO,
            fake_core: None,
        }
    }

    #[test]
    fn fake_ufs_config_from_the_engine_options() {
        let c = fake_ufs_config(&opts()).unwrap();
        assert_eq!(c.lus, vec![LuConfig::ram_bytes(1 << 20); 3]);
        // qpairs=64 (fio's default) is more than UFS has: 32 queues.
        assert_eq!(c.queues, 32);
        assert!(c.mcq);
        assert_eq!(c.exec, ExecMode::Sync);
        let c = fake_ufs_config(&DeviceOptions {
            mcq: false,
            qpairs: 2,
            fake_exec: FakeExec::Thread,
            fake_core: Some(1),
            ..opts()
        })
        .unwrap();
        assert_eq!((c.mcq, c.queues), (false, 2));
        assert_eq!(
            c.exec,
            ExecMode::Threaded {
                workers: 1,
                pin_core: Some(1)
            }
        );
        for (bad, option) in [
            (
                DeviceOptions {
                    fake_lbs: 512,
                    ..opts()
                },
                "fake_lbs",
            ),
            (
                DeviceOptions {
                    fake_namespaces: 33,
                    ..opts()
                },
                "fake_namespaces",
            ),
            (
                DeviceOptions {
                    fake_size: 2048,
                    ..opts()
                },
                "fake_size",
            ),
        ] {
            match fake_ufs_config(&bad) {
                Err(EngineError::Spec(SpecError::BadOption { option: o, .. })) => {
                    assert_eq!(o, option)
                }
                r => panic!("{option}: expected BadOption, got {r:?}"),
            }
        }
    }

    #[test]
    fn legacy_fake_ufs_has_one_queue_pair() {
        let o = DeviceOptions {
            mcq: false,
            ..opts()
        };
        let dev = Device::open(&DeviceKind::FakeUfs, &o, 4096).unwrap();
        let Ctrl::Ufs(c) = dev.ctrl() else {
            panic!("fake-ufs opened as NVMe");
        };
        assert_eq!(c.mode(), UfsMode::Legacy);
        assert_eq!(dev.granted_queues(), 1);
        assert_eq!(dev.max_transfer(), DEFAULT_MAX_TRANSFER);
    }

    /// The transport of a `vfio-` device comes from its PCI class code.
    #[test]
    fn vfio_transport_from_the_class_code() {
        let base = std::env::temp_dir().join(format!("mcqio-fio-sysfs-{}", std::process::id()));
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
        assert!(matches!(t("0000:00:05.0"), Err(EngineError::Open { .. })));
        // Unknown to sysfs: NVMe, and opening it says why it cannot be used.
        assert_eq!(t("0000:00:09.0").unwrap(), Transport::Nvme);
        let _ = std::fs::remove_dir_all(&base);
    }
}
