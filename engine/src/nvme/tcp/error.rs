//! How an NVMe/TCP connection ends: [`TcpError`], carried to the
//! application inside [`crate::Error::Transport`] (downcast it).

use std::io::ErrorKind;

use super::pdu::PduError;

/// Why a connection (the admin queue's or an I/O queue pair's) ended or
/// could not be made. Every one of them ends the connection: the commands
/// it carried end once with [`crate::IoError::ConnectionLost`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TcpError {
    /// The target closed the connection (or reset it).
    #[error("the target closed the connection")]
    Closed,
    /// A socket call failed otherwise.
    #[error("socket error: {0}")]
    Io(ErrorKind),
    /// Nothing (or not enough) arrived within the bound: a connect, a
    /// synchronous command, or an I/O command past its timeout.
    #[error("no answer from the target within {ms} ms")]
    Timeout {
        /// The bound.
        ms: u64,
    },
    /// The target ended the connection with a C2HTermReq.
    #[error("the target terminated the connection (C2HTermReq FES {fes:#x}, FEI {fei:#x})")]
    Terminated {
        /// Fatal error status.
        fes: u16,
        /// Fatal error information.
        fei: u32,
    },
    /// A malformed PDU (we answered with an H2CTermReq).
    #[error("malformed PDU from the target: {0}")]
    Pdu(#[from] PduError),
    /// A well-formed PDU the target must not send now.
    #[error("the target broke the protocol: {0}")]
    Protocol(#[from] Violation),
}

/// A well-formed PDU that is wrong for the commands in flight: what a
/// hostile or broken target does. Each is caught before any byte is
/// placed, so nothing is written outside a command's buffer.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// A CapsuleResp, C2HData or R2T naming no command in flight (or a
    /// command of an earlier generation of its slot).
    #[error("a PDU names CID {0:#06x}, which no command in flight has")]
    UnknownCid(u16),
    /// C2HData for a command that reads no data (a write, a flush).
    #[error("C2HData for CID {0:#06x}, which is not a read")]
    DataForNonRead(u16),
    /// C2HData past the command's transfer.
    #[error("C2HData for CID {cid:#06x} at {datao}+{datal} past its {len}-byte transfer")]
    DataOutOfRange {
        /// The command.
        cid: u16,
        /// DATAO.
        datao: u32,
        /// DATAL.
        datal: u32,
        /// The transfer's length.
        len: u32,
    },
    /// C2HData not at the next offset (data must arrive in order, each byte
    /// once: a gap or a range sent twice is refused).
    #[error("C2HData for CID {cid:#06x} at offset {datao}, expected {expected}")]
    DataOutOfOrder {
        /// The command.
        cid: u16,
        /// DATAO.
        datao: u32,
        /// The bytes received so far.
        expected: u32,
    },
    /// A read completed successfully (CapsuleResp, or C2HData SUCCESS)
    /// before all its data arrived.
    #[error("CID {cid:#06x} completed after {got} of {len} bytes")]
    ShortRead {
        /// The command.
        cid: u16,
        /// Bytes received.
        got: u32,
        /// The transfer's length.
        len: u32,
    },
    /// An R2T for a command that sends no data by R2T (a read, an
    /// in-capsule write).
    #[error("R2T for CID {0:#06x}, which takes no R2T")]
    R2tForNonWrite(u16),
    /// An R2T not at the next offset, or past the transfer.
    #[error("R2T for CID {cid:#06x} asks {r2to}+{r2tl}; {next} of {len} bytes were asked before")]
    R2tOutOfRange {
        /// The command.
        cid: u16,
        /// R2TO.
        r2to: u32,
        /// R2TL.
        r2tl: u32,
        /// Bytes asked for by earlier R2Ts.
        next: u32,
        /// The transfer's length.
        len: u32,
    },
    /// More R2Ts outstanding for one command than MAXR2T allows.
    #[error("CID {cid:#06x} has {outstanding} R2Ts outstanding; MAXR2T allows {max}")]
    R2tLimit {
        /// The command.
        cid: u16,
        /// R2Ts outstanding with this one.
        outstanding: u32,
        /// MAXR2T + 1.
        max: u32,
    },
    /// A CapsuleResp for a write whose data we had not finished sending.
    #[error("CID {0:#06x} completed before its data was sent")]
    CompletedBeforeData(u16),
    /// A PDU type the host never expects after the connection is up
    /// (another ICResp).
    #[error("unexpected PDU type {0:#04x}")]
    UnexpectedPdu(u8),
    /// The first PDU was not an ICResp.
    #[error("expected ICResp, got PDU type {0:#04x}")]
    NoIcResp(u8),
    /// The transfers asked for need more PDU headers at once than the send
    /// queue holds (many tiny R2Ts).
    #[error("the target's R2Ts need more PDUs at once than the send queue holds")]
    SendQueueFull,
}

impl TcpError {
    /// A socket error in our words.
    pub(crate) fn of_io(e: &std::io::Error) -> Self {
        match e.kind() {
            ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe
            | ErrorKind::NotConnected => TcpError::Closed,
            k => TcpError::Io(k),
        }
    }

    /// In the crate's error type.
    pub(crate) fn into_error(self) -> crate::core::error::Error {
        crate::core::error::Error::Transport(Box::new(self))
    }
}
