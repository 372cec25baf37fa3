//! One way to open a device, for every mcqio frontend (`mcqio-perf`,
//! `hello`, `identify`, `app_buffers`, the fio engine, and the next ones):
//!
//! - [`devstr`]: the device-string language (`fake,ns=2,lbs=4k`,
//!   `fake-ufs:null`, `vfio:0000:01:00.0`, …) and its fio spelling
//!   ([`devstr::Filename`]: `vfio-0000.01.00.0,ns=1`), with the one set of
//!   defaults a fake is built from;
//! - [`open`]: from a device string or a fake's configuration to an open
//!   NVMe or UFS controller ([`Device`]), whose queue pairs run code
//!   written once against [`mcqio::core::block::BlockQueue`];
//! - [`queue`]: one queue type for any wire ([`Queue`], from
//!   [`Device::create_queue`]), for a frontend that keeps one type for
//!   its queue pair whatever the device.
//!
//! ```
//! use mcqio::BlockDevice;
//!
//! let spec: mcqio_open::DeviceSpec = "fake-ufs,sync=1".parse()?;
//! let opened = spec.open("doc")?;
//! assert_eq!(opened.device.units().len(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

pub mod devstr;
pub mod open;
pub mod queue;

pub use devstr::{DeviceKind, DeviceSpec, Filename, FilenameError, SpecError, Unit};
/// The engine's description of a namespace or logical unit, which
/// [`Device`]'s [`BlockDevice`] lists.
pub use mcqio::{BlockDevice, BlockUnit};
pub use open::{
    discover_tcp, Attached, Backing, CtrlOptions, Device, Fake, OnQueue, OpenError, Opened,
};
pub use queue::Queue;
