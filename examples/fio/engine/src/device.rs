//! Controllers shared by the fio jobs of one process.
//!
//! fio calls an engine's `setup` once per job; every job that names the
//! same controller (the filename's device part) gets the same [`Device`],
//! opened by the first and closed when the last job's handle is dropped.
//!
//! The transport is chosen once, when the controller is opened, by the
//! opener every frontend shares ([`mcqio_open::open`]): `fake` is NVMe,
//! `fake-ufs` UFS, and a `vfio-` function is whichever its PCI class code
//! says ([`mcqio_open::open::vfio_transport`]), and `tcp:` an NVMe/TCP
//! target (one connection per job's queue pair).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use mcqio::ufs::UfsOptions;
use mcqio::ControllerOptions;
use mcqio_fixtures::ufs::{LuConfig, UfsConfig, BLOCK_SIZE as UFS_BLOCK_SIZE};
#[cfg(test)]
use mcqio_fixtures::{ufs::FakeUfs, FakeController};
use mcqio_fixtures::{ExecMode, FakeConfig, NamespaceConfig};
use mcqio_open::{Backing, CtrlOptions, DeviceKind, DeviceSpec, Fake, OpenError};
use mcqio_vfio::sysfs::Transport;
use mcqio_vfio::{DmaSpace, OpenOptions as VfioOpenOptions};

use crate::spec::{DeviceOptions, FakeExec, SpecError};
use crate::EngineError;

/// The controller of a [`Device`], NVMe or UFS: the opener's device, which
/// mcqio-perf, `hello` and `identify` open too.
pub use mcqio_open::Device as Ctrl;

/// Default bytes per I/O command the controller is set up for (the PRP list
/// pages are sized for it); jobs with larger blocks raise it.
const DEFAULT_MAX_TRANSFER: u64 = 2 << 20;

/// UFSHCI 4.0 has at most 32 MCQ queues.
const UFS_MAX_QUEUES: u16 = 32;

/// Commands per UFS queue pair asked for: the controller lowers it to what
/// the host controller (MCQ MAC, or the 32 legacy slots) and the device
/// (bQueueDepth) allow.
const UFS_DEPTH: u16 = 256;

/// An open controller.
pub struct Device {
    key: String,
    /// The device string it was opened from, options included (a `tcp:`
    /// target's digests and queue count must agree between jobs).
    spec: DeviceSpec,
    opts: DeviceOptions,
    ctrl: Ctrl,
    /// Bytes of job buffers leaked because the device may still access
    /// them (see `Job::free_buffers`).
    leaked: AtomicU64,
    // Kept so the fake lives exactly as long as its controller handle.
    _fake: Option<Fake>,
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
        kind: &DeviceSpec,
        opts: &DeviceOptions,
        max_io: u64,
    ) -> Result<Arc<Device>, EngineError> {
        let key = kind.label();
        let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|(_, w)| w.strong_count() > 0);
        if let Some(dev) = open
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, w)| w.upgrade())
        {
            if dev.opts != *opts || dev.spec != *kind {
                return Err(EngineError::OptionsDiffer { device: key });
            }
            return Ok(dev);
        }
        let dev = Arc::new(Device::open(kind, opts, max_io)?);
        open.push((key, Arc::downgrade(&dev)));
        Ok(dev)
    }

    fn open(kind: &DeviceSpec, o: &DeviceOptions, max_io: u64) -> Result<Device, EngineError> {
        let key = kind.label();
        let max_transfer = max_io.max(DEFAULT_MAX_TRANSFER);
        let open_err = |e: OpenError| EngineError::Open {
            device: key.clone(),
            why: e.why(),
        };
        let backing = match &kind.kind {
            DeviceKind::Fake { .. } => {
                let size = o.fake_size / u64::from(o.fake_lbs) * u64::from(o.fake_lbs);
                Backing::FakeNvme(FakeConfig {
                    namespaces: (0..o.fake_namespaces)
                        .map(|_| NamespaceConfig::ram(size, o.fake_lbs))
                        .collect(),
                    io_queue_pairs: o.qpairs,
                    mqes: 4095,
                    mdts: pages_log2(max_transfer),
                    exec: fake_exec(o),
                    latency: o.fake_latency,
                    ..FakeConfig::default()
                })
            }
            DeviceKind::FakeUfs { .. } => Backing::FakeUfs(fake_ufs_config(o)?),
            DeviceKind::Vfio { bdf } => {
                let mut vo = VfioOpenOptions {
                    huge_pages: o.huge_pages,
                    ..VfioOpenOptions::default()
                };
                if o.dma_budget > 0 {
                    vo.dma_budget = o.dma_budget;
                }
                Backing::Vfio {
                    bdf: bdf.clone(),
                    options: vo,
                }
            }
            DeviceKind::Tcp { addr, subnqn } => {
                let mut options = kind.tcp_options(subnqn);
                // One connection per job: as many I/O queues as the
                // engine's qpairs option, unless the filename says.
                if kind.opts.qpairs.is_none() {
                    options.io_queues = o.qpairs;
                }
                Backing::Tcp {
                    addr: addr.clone(),
                    options,
                }
            }
            _ => {
                return Err(EngineError::Open {
                    device: key,
                    why: "not a controller the engine drives".into(),
                })
            }
        };
        let mut copts = CtrlOptions {
            nvme: ControllerOptions {
                io_queues: o.qpairs,
                shadow_doorbells: o.shadow_doorbells,
                max_transfer,
                ..ControllerOptions::default()
            },
            ..CtrlOptions::default()
        };
        if backing.transport().map_err(open_err)? == Transport::Ufs {
            copts.ufs = ufs_options(o, max_io, max_transfer, &key)?;
        }
        let opened = backing.open(&copts).map_err(open_err)?;
        Ok(Device {
            key,
            spec: kind.clone(),
            opts: o.clone(),
            ctrl: opened.device,
            leaked: AtomicU64::new(0),
            _fake: opened.fake,
        })
    }

    /// A private fake UFS controller (not shared through the registry),
    /// with its handle for fault injection.
    #[cfg(test)]
    pub(crate) fn private_fake_ufs(o: &DeviceOptions) -> (Arc<Device>, Arc<FakeUfs>) {
        let key = "fake-ufs (private)".to_string();
        let copts = CtrlOptions {
            ufs: ufs_options(o, 4096, DEFAULT_MAX_TRANSFER, &key).unwrap(),
            ..CtrlOptions::default()
        };
        let opened = Backing::FakeUfs(fake_ufs_config(o).unwrap())
            .open(&copts)
            .unwrap();
        let Some(Fake::Ufs(fake)) = opened.fake.clone() else {
            unreachable!("a fake UFS backing opens a fake UFS controller")
        };
        let dev = Device {
            key,
            spec: "fake-ufs".parse().expect("a device string"),
            opts: o.clone(),
            ctrl: opened.device,
            leaked: AtomicU64::new(0),
            _fake: opened.fake,
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
        let opened = Backing::FakeNvme(cfg)
            .open(&CtrlOptions::default())
            .unwrap();
        let Some(Fake::Nvme(fake)) = opened.fake.clone() else {
            unreachable!("a fake NVMe backing opens a fake NVMe controller")
        };
        let dev = Device {
            key: "fake (private)".to_string(),
            spec: "fake".parse().expect("a device string"),
            opts: o.clone(),
            ctrl: opened.device,
            leaked: AtomicU64::new(0),
            _fake: opened.fake,
        };
        (Arc::new(dev), fake)
    }

    /// The controller.
    pub fn ctrl(&self) -> &Ctrl {
        &self.ctrl
    }

    /// Largest bytes per command the controller was set up for.
    pub fn max_transfer(&self) -> u64 {
        self.ctrl.max_transfer()
    }

    /// The DMA space fio's buffers are allocated in.
    pub fn dma(&self) -> &Arc<DmaSpace> {
        self.ctrl.dma()
    }

    /// Queue pairs the controller can give jobs (for error messages).
    pub fn granted_queues(&self) -> usize {
        self.ctrl.granted_queues()
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

/// How the UFS host controller is brought up.
fn ufs_options(
    o: &DeviceOptions,
    max_io: u64,
    max_transfer: u64,
    key: &str,
) -> Result<UfsOptions, EngineError> {
    Ok(UfsOptions {
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcqio::ufs::UfsMode;
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
            wait: mcqio::WaitPolicy::Poll,
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
        let dev = Device::open(&"fake-ufs".parse().unwrap(), &o, 4096).unwrap();
        let Ctrl::Ufs(c) = dev.ctrl() else {
            panic!("fake-ufs opened as NVMe");
        };
        assert_eq!(c.mode(), UfsMode::Legacy);
        assert_eq!(dev.granted_queues(), 1);
        assert_eq!(dev.max_transfer(), DEFAULT_MAX_TRANSFER);
    }
}
