//! Errors of the UFS control path: bring-up, device management, queue
//! creation. A finished command's own failure is a
//! [`UfsError`] (carried by
//! [`crate::IoError::Ufs`] on the I/O path).

use super::spec::desc::DescError;
use super::spec::status::UfsError;

/// Why a UFS host controller could not be brought up or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UfsCtrlError {
    /// DMA memory for lists, rings or descriptors could not be had.
    #[error("DMA memory: {0}")]
    Dma(#[from] mcqio_vfio::DmaError),
    /// The controller did not reach a state within the bound.
    #[error("UFS host controller did not {what} within {timeout_ms} ms")]
    Timeout {
        /// What we waited for.
        what: &'static str,
        /// The bound used.
        timeout_ms: u64,
    },
    /// Registers read all ones: the device is gone.
    #[error("the UFS host controller does not respond (registers read all ones)")]
    DeviceGone,
    /// IS reports a fatal error (host controller, system bus, device, UIC).
    #[error("UFS host controller reports a fatal error (IS = {is:#010x}); it must be reset")]
    ControllerFatal {
        /// The interrupt status read.
        is: u32,
    },
    /// A UIC command ended with a non-zero result code.
    #[error(
        "UIC command {cmd:#04x} failed with result code {result:#04x} after {attempts} attempts"
    )]
    Uic {
        /// The UIC command.
        cmd: u32,
        /// UCMDARG2 bits 7:0.
        result: u8,
        /// Attempts made.
        attempts: u32,
    },
    /// DME_LINKSTARTUP succeeded but no device is present (HCS.DP = 0).
    #[error("link started but no UFS device is present (HCS.DP = 0)")]
    NoDevice,
    /// A device-management request was not transported (OCS) or answered
    /// with the wrong UPIU.
    #[error("{what}: {err}")]
    DevCmd {
        /// Which request.
        what: &'static str,
        /// How it ended.
        err: UfsError,
    },
    /// A QUERY REQUEST was answered with a non-zero query response code.
    #[error("{what}: query response code {code:#04x}")]
    Query {
        /// Which request.
        what: &'static str,
        /// The response code.
        code: u8,
    },
    /// A descriptor is unusable.
    #[error(transparent)]
    Descriptor(#[from] DescError),
    /// A SCSI command of the bring-up failed.
    #[error("{what} on LU {lun}: {err}")]
    Scsi {
        /// Which command.
        what: &'static str,
        /// The logical unit.
        lun: u8,
        /// How it ended.
        err: UfsError,
    },
    /// After a reset, the controller or the device behind it is not the
    /// one brought up before (capabilities, logical units, their sizes):
    /// addresses may mean something else now. The controller stays failed;
    /// re-open it with [`UfsController::new`](super::UfsController::new).
    #[error("the UFS controller changed across a reset: {0}; re-open it with UfsController::new")]
    DeviceChanged(String),
    /// A register or device value is outside what the spec or the BAR allows.
    #[error("{what}: {value:#x} is invalid ({why})")]
    BadValue {
        /// Which value.
        what: &'static str,
        /// What we read.
        value: u64,
        /// Why it is refused.
        why: &'static str,
    },
    /// A register the controller points at lies outside the BAR.
    #[error("{what} at BAR offset {offset:#x} (+{size} bytes) lies outside the {bar_len:#x}-byte BAR or is misaligned")]
    OutsideBar {
        /// Which register block.
        what: &'static str,
        /// Its offset.
        offset: u64,
        /// Bytes it spans.
        size: usize,
        /// BAR length.
        bar_len: usize,
    },
    /// The controller refused a queue configuration (the enable bit did not stick).
    #[error("MCQ queue {queue}: the controller refused the {what} configuration")]
    QueueRefused {
        /// Queue index.
        queue: u32,
        /// "SQ", "CQ" or "MCQ mode".
        what: &'static str,
    },
    /// No logical unit is usable.
    #[error("the UFS device reports no usable logical unit")]
    NoLogicalUnits,
    /// An option is out of range.
    #[error("invalid option: {0}")]
    InvalidOption(String),
}

/// Result of the UFS control path.
pub type UfsResult<T> = std::result::Result<T, UfsCtrlError>;
