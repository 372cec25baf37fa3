//! `mcqio_device`: a controller opened from a device string by the one
//! opener ([`mcqio_open`]), its units and its facts.

use std::ffi::{c_char, c_int, CStr};

use engine::{BlockDevice, BlockUnit};
use mcqio_open::{Device, DeviceSpec, OpenError};

use crate::status::{fail, guard, guard_count, new_handle, Status};

/// An open device: an NVMe controller (the fake or `vfio:`), a UFS host
/// controller (`fake-ufs`, `vfio:`) or an NVMe/TCP association (`tcp:`).
/// Opaque to C.
pub struct McqioDevice {
    pub(crate) device: Device,
    units: Vec<BlockUnit>,
}

impl McqioDevice {
    /// The handle of an open device; its units as they are now.
    pub(crate) fn new(device: Device) -> Self {
        let units = device.units();
        McqioDevice { device, units }
    }
}

/// Which wire a device speaks.
#[repr(u32)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    /// NVMe over PCIe (a `vfio:` controller, or the fake).
    Nvme = 0,
    /// UFS (a `vfio:` host controller, or the fake).
    Ufs = 1,
    /// NVMe over TCP.
    NvmeTcp = 2,
}

/// A namespace (NVMe) or logical unit (UFS).
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct McqioUnit {
    /// The id submissions take: an NVMe namespace id, a UFS LUN.
    pub id: u32,
    /// Logical block size in bytes: every transfer is a whole number of
    /// these.
    pub block_size: u32,
    /// Size in logical blocks.
    pub blocks: u64,
    /// Whether reads and writes can reach it (a unit whose block is larger
    /// than the controller's transfer limit is listed, and refused).
    pub usable: bool,
}

/// What a device is and offers.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct McqioDeviceInfo {
    /// The wire.
    pub transport: Transport,
    /// Namespaces or logical units (`mcqio_device_units()`).
    pub units: u32,
    /// I/O queue pairs the controller granted: at most this many queue
    /// pairs exist at once (one per thread).
    pub queues: u32,
    /// Largest transfer of one command in bytes (larger reads and writes
    /// are split into several commands and complete once).
    pub max_transfer: u64,
}

/// The handle behind a pointer C passes, or [`Status::Invalid`].
///
/// # Safety
/// `dev` is null or a handle from `mcqio_device_open()` not yet closed.
pub(crate) unsafe fn device<'a>(dev: *const McqioDevice) -> Result<&'a McqioDevice, Status> {
    // SAFETY: null or a live handle (caller contract); only shared
    // references are ever made to a device handle.
    unsafe { dev.as_ref() }.ok_or_else(|| fail(Status::Invalid, "the device is NULL"))
}

/// Open the device a device string names and bring its controller up:
/// `fake[,ns=N,lbs=4k,size=64M]` (the in-process NVMe fake),
/// `fake-ufs[,lus=N]` (the UFS fake), `vfio:0000:01:00.0` (an NVMe or UFS
/// controller bound to vfio-pci: its PCI class code says which),
/// `tcp:ADDR:PORT/NQN[,hdgst,ddgst]` (an NVMe/TCP target). On success
/// `*out` is the device (close it with `mcqio_device_close()`); on failure
/// `*out` is NULL.
///
/// # Safety
/// `devstr` is NULL or a NUL-terminated string; `out` is NULL or valid
/// for one pointer write.
#[no_mangle]
pub unsafe extern "C" fn mcqio_device_open(
    devstr: *const c_char,
    out: *mut *mut McqioDevice,
) -> Status {
    guard("mcqio_device_open", || {
        let make = || {
            if devstr.is_null() {
                return Err(fail(Status::Invalid, "the device string is NULL"));
            }
            // SAFETY: non-null and NUL-terminated (caller contract).
            let s = unsafe { CStr::from_ptr(devstr) }
                .to_str()
                .map_err(|_| fail(Status::Devstr, "the device string is not UTF-8"))?;
            let spec: DeviceSpec = s.parse().map_err(|e| fail(Status::Devstr, e))?;
            let opened = spec.open("libmcqio").map_err(|e| match e {
                OpenError::Spec(e) => fail(Status::Devstr, e),
                e => fail(Status::Open, format_args!("{s}: {e}")),
            })?;
            Ok(Box::new(McqioDevice::new(opened.device)))
        };
        // SAFETY: `out` is NULL or valid for one write (caller contract).
        unsafe { new_handle(out, make) }
    })
}

/// Close a device (NULL: nothing to do). Its queue pairs and buffers stay
/// usable and keep the controller up until the last of them is gone;
/// closing only gives up this handle.
///
/// # Safety
/// `dev` is NULL or a handle from `mcqio_device_open()` not yet closed;
/// no other thread uses it meanwhile, and nobody uses it after.
#[no_mangle]
pub unsafe extern "C" fn mcqio_device_close(dev: *mut McqioDevice) {
    let _ = guard("mcqio_device_close", || {
        if !dev.is_null() {
            // SAFETY: a live handle made by Box::into_raw, given up by the
            // caller (contract).
            drop(unsafe { Box::from_raw(dev) });
        }
        Ok(())
    });
}

/// What the device is and offers, into `*out`.
///
/// # Safety
/// `dev` is NULL or a live device handle; `out` is NULL or valid for one
/// write of the struct.
#[no_mangle]
pub unsafe extern "C" fn mcqio_device_info(
    dev: *const McqioDevice,
    out: *mut McqioDeviceInfo,
) -> Status {
    guard("mcqio_device_info", || {
        // SAFETY: forwarded caller contract.
        let d = unsafe { device(dev) }?;
        if out.is_null() {
            return Err(fail(Status::Invalid, "out is NULL"));
        }
        let transport = match d.device {
            Device::Nvme(_) => Transport::Nvme,
            Device::Ufs(_) => Transport::Ufs,
            Device::Tcp(_) => Transport::NvmeTcp,
        };
        let info = McqioDeviceInfo {
            transport,
            units: d.units.len() as u32,
            queues: u32::try_from(d.device.granted_queues()).unwrap_or(u32::MAX),
            max_transfer: d.device.max_transfer(),
        };
        // SAFETY: `out` is valid for one write (caller contract).
        unsafe { out.write(info) };
        Ok(())
    })
}

/// The device's namespaces or logical units, as they were when it was
/// opened: the first `cap` of them into `out` (which may be NULL when
/// `cap` is 0). Returns how many there are (more than `cap`: call again
/// with room for all), or a negative status.
///
/// # Safety
/// `dev` is NULL or a live device handle; `out` is valid for `cap`
/// writes of the struct.
#[no_mangle]
pub unsafe extern "C" fn mcqio_device_units(
    dev: *const McqioDevice,
    out: *mut McqioUnit,
    cap: usize,
) -> c_int {
    guard_count("mcqio_device_units", || {
        // SAFETY: forwarded caller contract.
        let d = unsafe { device(dev) }?;
        if out.is_null() && cap > 0 {
            return Err(fail(Status::Invalid, "out is NULL"));
        }
        for (i, u) in d.units.iter().take(cap).enumerate() {
            let unit = McqioUnit {
                id: u.id,
                block_size: u.block_size,
                blocks: u.blocks,
                usable: u.usable,
            };
            // SAFETY: i < cap, and `out` is valid for `cap` writes.
            unsafe { out.add(i).write(unit) };
        }
        Ok(d.units.len())
    })
}
