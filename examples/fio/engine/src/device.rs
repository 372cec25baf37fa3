//! Controllers shared by the fio jobs of one process.
//!
//! fio calls an engine's `setup` once per job; every job that names the
//! same controller (the filename's device part) gets the same [`Device`],
//! opened by the first and closed when the last job's handle is dropped.

use std::sync::{Arc, Mutex, Weak};

use mcqio::{Controller, ControllerOptions};
use mcqio_fixtures::{ExecMode, FakeConfig, FakeController, NamespaceConfig};
use mcqio_vfio::{Backend, OpenOptions as VfioOpenOptions, VfioBackend};

use crate::spec::{DeviceKind, DeviceOptions, FakeExec};
use crate::EngineError;

/// Default bytes per I/O command the controller is set up for (the PRP list
/// pages are sized for it); jobs with larger blocks raise it.
const DEFAULT_MAX_TRANSFER: u64 = 2 << 20;

/// An open controller.
pub struct Device {
    key: String,
    opts: DeviceOptions,
    ctrl: Arc<Controller>,
    // Kept so the fake lives exactly as long as its controller handle.
    _fake: Option<Arc<FakeController>>,
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
        let (backend, fake): (Arc<dyn Backend>, _) = match kind {
            DeviceKind::FakeNvme => {
                let size = o.fake_size / u64::from(o.fake_lbs) * u64::from(o.fake_lbs);
                let cfg = FakeConfig {
                    namespaces: (0..o.fake_namespaces)
                        .map(|_| NamespaceConfig::ram(size, o.fake_lbs))
                        .collect(),
                    io_queue_pairs: o.qpairs,
                    mqes: 4095,
                    mdts: pages_log2(max_transfer),
                    exec: match o.fake_exec {
                        FakeExec::Sync => ExecMode::Sync,
                        FakeExec::Thread => ExecMode::Threaded {
                            workers: 1,
                            pin_core: o.fake_core,
                        },
                    },
                    latency: o.fake_latency,
                    ..FakeConfig::default()
                };
                let fake = FakeController::new(cfg).map_err(|e| open_err(e.to_string()))?;
                (fake.clone() as Arc<dyn Backend>, Some(fake))
            }
            DeviceKind::Vfio { bdf } => {
                let mut vo = VfioOpenOptions {
                    huge_pages: o.huge_pages,
                    ..VfioOpenOptions::default()
                };
                if o.dma_budget > 0 {
                    vo.dma_budget = o.dma_budget;
                }
                let b = VfioBackend::open_with(bdf, &vo).map_err(|e| open_err(e.to_string()))?;
                (Arc::new(b) as Arc<dyn Backend>, None)
            }
            DeviceKind::FakeUfs => return Err(EngineError::UfsNotYet),
        };
        let copts = ControllerOptions {
            io_queues: o.qpairs,
            shadow_doorbells: o.shadow_doorbells,
            max_transfer,
            ..ControllerOptions::default()
        };
        let ctrl = Controller::new(backend, copts).map_err(|e| open_err(e.to_string()))?;
        Ok(Device {
            key,
            opts: o.clone(),
            ctrl,
            _fake: fake,
        })
    }

    /// The controller.
    pub fn ctrl(&self) -> &Arc<Controller> {
        &self.ctrl
    }

    /// The key jobs share it by (`fake`, `vfio:0000:01:00.0`).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The options it was opened with.
    pub fn options(&self) -> &DeviceOptions {
        &self.opts
    }
}
