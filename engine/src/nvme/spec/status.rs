//! Completion status, decoded once into [`NvmeStatus`].

use std::fmt;

/// Status Code Type values.
pub mod sct {
    /// Generic command status.
    pub const GENERIC: u8 = 0;
    /// Command specific status.
    pub const COMMAND_SPECIFIC: u8 = 1;
    /// Media and data integrity errors.
    pub const MEDIA: u8 = 2;
    /// Path related status.
    pub const PATH: u8 = 3;
    /// Vendor specific.
    pub const VENDOR: u8 = 7;
}

/// Common generic status codes (SCT 0).
pub mod generic {
    /// Successful completion.
    pub const SUCCESS: u8 = 0x00;
    /// Invalid command opcode.
    pub const INVALID_OPCODE: u8 = 0x01;
    /// Invalid field in command.
    pub const INVALID_FIELD: u8 = 0x02;
    /// Command ID conflict.
    pub const CID_CONFLICT: u8 = 0x03;
    /// Data transfer error.
    pub const DATA_TRANSFER_ERROR: u8 = 0x04;
    /// Commands aborted due to power loss notification.
    pub const ABORTED_POWER_LOSS: u8 = 0x05;
    /// Internal error.
    pub const INTERNAL_ERROR: u8 = 0x06;
    /// Command abort requested.
    pub const ABORT_REQUESTED: u8 = 0x07;
    /// Command aborted due to SQ deletion.
    pub const ABORTED_SQ_DELETION: u8 = 0x08;
    /// Invalid namespace or format.
    pub const INVALID_NAMESPACE: u8 = 0x0B;
    /// Command sequence error.
    pub const COMMAND_SEQUENCE_ERROR: u8 = 0x0C;
    /// PRP offset invalid.
    pub const INVALID_PRP_OFFSET: u8 = 0x13;
    /// LBA out of range.
    pub const LBA_OUT_OF_RANGE: u8 = 0x80;
    /// Capacity exceeded.
    pub const CAPACITY_EXCEEDED: u8 = 0x81;
    /// Namespace not ready.
    pub const NAMESPACE_NOT_READY: u8 = 0x82;
}

/// Common command specific status codes (SCT 1).
pub mod command_specific {
    /// Completion queue invalid.
    pub const INVALID_CQ: u8 = 0x00;
    /// Invalid queue identifier.
    pub const INVALID_QID: u8 = 0x01;
    /// Invalid queue size.
    pub const INVALID_QUEUE_SIZE: u8 = 0x02;
    /// Abort command limit exceeded.
    pub const ABORT_LIMIT_EXCEEDED: u8 = 0x03;
    /// Asynchronous event request limit exceeded.
    pub const AER_LIMIT_EXCEEDED: u8 = 0x05;
    /// Invalid log page.
    pub const INVALID_LOG_PAGE: u8 = 0x09;
    /// Invalid queue deletion.
    pub const INVALID_QUEUE_DELETION: u8 = 0x0C;
    /// Attempted write to read-only range.
    pub const WRITE_TO_READ_ONLY: u8 = 0x82;
}

/// Common media error status codes (SCT 2).
pub mod media {
    /// Write fault.
    pub const WRITE_FAULT: u8 = 0x80;
    /// Unrecovered read error.
    pub const UNRECOVERED_READ: u8 = 0x81;
    /// End-to-end guard check error.
    pub const GUARD_CHECK: u8 = 0x82;
    /// Compare failure.
    pub const COMPARE_FAILURE: u8 = 0x85;
    /// Access denied.
    pub const ACCESS_DENIED: u8 = 0x86;
    /// Deallocated or unwritten logical block.
    pub const DEALLOCATED_OR_UNWRITTEN: u8 = 0x87;
}

/// A decoded completion status.
#[derive(Copy, Clone, PartialEq, Eq, Hash)]
pub struct NvmeStatus {
    /// Status Code Type.
    pub sct: u8,
    /// Status Code.
    pub sc: u8,
    /// Command Retry Delay index.
    pub crd: u8,
    /// More status information available in the Error Information log.
    pub more: bool,
    /// Do Not Retry.
    pub dnr: bool,
}

impl NvmeStatus {
    /// Successful completion.
    pub const SUCCESS: NvmeStatus = NvmeStatus::new(sct::GENERIC, generic::SUCCESS);

    /// A status with the given type and code and no flags.
    pub const fn new(sct: u8, sc: u8) -> Self {
        NvmeStatus {
            sct,
            sc,
            crd: 0,
            more: false,
            dnr: false,
        }
    }

    /// Decode the 16-bit status/phase halfword of a CQE.
    #[inline]
    pub const fn from_cqe_status(raw: u16) -> Self {
        NvmeStatus {
            sc: (raw >> 1) as u8,
            sct: ((raw >> 9) & 0b111) as u8,
            crd: ((raw >> 12) & 0b11) as u8,
            more: raw >> 14 & 1 != 0,
            dnr: raw >> 15 & 1 != 0,
        }
    }

    /// Encode back into the CQE halfword (phase bit 0 clear).
    pub const fn to_cqe_status(self) -> u16 {
        (self.sc as u16) << 1
            | ((self.sct & 0b111) as u16) << 9
            | ((self.crd & 0b11) as u16) << 12
            | (self.more as u16) << 14
            | (self.dnr as u16) << 15
    }

    /// Whether the CQE halfword (phase ignored) means success.
    #[inline]
    pub const fn raw_is_success(raw: u16) -> bool {
        raw & 0x0FFE == 0
    }

    /// Whether this is a successful completion (SCT 0, SC 0).
    #[inline]
    pub const fn is_success(self) -> bool {
        self.sct == 0 && self.sc == 0
    }

    /// Whether retrying the command may succeed (DNR clear).
    pub const fn is_retryable(self) -> bool {
        !self.dnr
    }

    /// A human name for well-known codes.
    pub fn name(self) -> Option<&'static str> {
        use command_specific as cs;
        Some(match (self.sct, self.sc) {
            (sct::GENERIC, generic::SUCCESS) => "success",
            (sct::GENERIC, generic::INVALID_OPCODE) => "invalid command opcode",
            (sct::GENERIC, generic::INVALID_FIELD) => "invalid field in command",
            (sct::GENERIC, generic::CID_CONFLICT) => "command ID conflict",
            (sct::GENERIC, generic::DATA_TRANSFER_ERROR) => "data transfer error",
            (sct::GENERIC, generic::ABORTED_POWER_LOSS) => "aborted: power loss notification",
            (sct::GENERIC, generic::INTERNAL_ERROR) => "internal error",
            (sct::GENERIC, generic::ABORT_REQUESTED) => "aborted: abort requested",
            (sct::GENERIC, generic::ABORTED_SQ_DELETION) => "aborted: SQ deletion",
            (sct::GENERIC, generic::INVALID_NAMESPACE) => "invalid namespace or format",
            (sct::GENERIC, generic::COMMAND_SEQUENCE_ERROR) => "command sequence error",
            (sct::GENERIC, generic::INVALID_PRP_OFFSET) => "PRP offset invalid",
            (sct::GENERIC, generic::LBA_OUT_OF_RANGE) => "LBA out of range",
            (sct::GENERIC, generic::CAPACITY_EXCEEDED) => "capacity exceeded",
            (sct::GENERIC, generic::NAMESPACE_NOT_READY) => "namespace not ready",
            (sct::COMMAND_SPECIFIC, cs::INVALID_CQ) => "completion queue invalid",
            (sct::COMMAND_SPECIFIC, cs::INVALID_QID) => "invalid queue identifier",
            (sct::COMMAND_SPECIFIC, cs::INVALID_QUEUE_SIZE) => "invalid queue size",
            (sct::COMMAND_SPECIFIC, cs::ABORT_LIMIT_EXCEEDED) => "abort command limit exceeded",
            (sct::COMMAND_SPECIFIC, cs::AER_LIMIT_EXCEEDED) => {
                "asynchronous event request limit exceeded"
            }
            (sct::COMMAND_SPECIFIC, cs::INVALID_LOG_PAGE) => "invalid log page",
            (sct::COMMAND_SPECIFIC, cs::INVALID_QUEUE_DELETION) => "invalid queue deletion",
            (sct::COMMAND_SPECIFIC, cs::WRITE_TO_READ_ONLY) => "write to read-only range",
            (sct::MEDIA, media::WRITE_FAULT) => "write fault",
            (sct::MEDIA, media::UNRECOVERED_READ) => "unrecovered read error",
            (sct::MEDIA, media::GUARD_CHECK) => "end-to-end guard check error",
            (sct::MEDIA, media::COMPARE_FAILURE) => "compare failure",
            (sct::MEDIA, media::ACCESS_DENIED) => "access denied",
            (sct::MEDIA, media::DEALLOCATED_OR_UNWRITTEN) => "deallocated or unwritten block",
            _ => return None,
        })
    }
}

impl fmt::Display for NvmeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n} (sct {:#x}, sc {:#04x}", self.sct, self.sc)?,
            None => write!(f, "status sct {:#x}, sc {:#04x}", self.sct, self.sc)?,
        }
        if self.dnr {
            f.write_str(", do not retry")?;
        }
        if self.more {
            f.write_str(", more info in error log")?;
        }
        if self.name().is_some() {
            f.write_str(")")?;
        }
        Ok(())
    }
}

impl fmt::Debug for NvmeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NvmeStatus({self})")
    }
}
