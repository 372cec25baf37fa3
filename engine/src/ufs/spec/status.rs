//! How a finished UFS command ended, decoded once.
//!
//! Three layers report separately and are kept apart: the host controller's
//! transport status (OCS, in the completion entry or UTRD), the target's
//! response byte in the RESPONSE UPIU header, and the SCSI status with its
//! sense data. OCS can be SUCCESS while the SCSI status is CHECK CONDITION
//! (the first command after a reset gets UNIT ATTENTION that way).
//!
//! A fourth report matters for commands that move data: the RESPONSE's
//! OVERFLOW/UNDERFLOW flags (header byte 1) and residual transfer count
//! (bytes 12–15) say whether the device moved the expected data transfer
//! length (EDTL) of the COMMAND UPIU. [`command_result`] decodes the first
//! three; [`io_result`] adds the transfer check for the application's and
//! HPB's commands (see [`transfer_result`] for the rule per case).

use super::scsi::{ScsiStatus, Sense};
use super::upiu::{flags, trans, ResponseUpiu};
use super::utrd::Ocs;

/// Why a UFS command did not succeed.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UfsError {
    /// The host controller could not transport the command.
    #[error("transport error: OCS {:#x} ({})", .0 .0, .0.name())]
    Transport(Ocs),
    /// The response was not a RESPONSE UPIU for this command.
    #[error("malformed response UPIU (transaction code {trans_type:#04x}, task tag {task_tag})")]
    BadResponse {
        /// The transaction code found.
        trans_type: u8,
        /// The task tag found.
        task_tag: u8,
    },
    /// The target reported failure in the response byte.
    #[error("target failure (response {0:#04x})")]
    TargetFailure(u8),
    /// The SCSI command failed; `sense` is present for CHECK CONDITION with
    /// decodable sense data.
    #[error("SCSI status {:#04x}{}", .status.0, match .sense { Some(s) => format!(", sense key {:#x} ASC {:#04x} ASCQ {:#04x}", s.key, s.asc, s.ascq), None => String::new() })]
    Scsi {
        /// The SCSI status byte.
        status: ScsiStatus,
        /// Sense key / ASC / ASCQ.
        sense: Option<Sense>,
    },
    /// GOOD status, but the device says it moved `residual` bytes fewer
    /// than the `expected` transfer (UNDERFLOW, or a residual without
    /// either flag): the buffer holds that many bytes of whatever it held
    /// before (a read) or the medium did not get them (a write).
    #[error("short transfer: the device moved {} of {expected} bytes (residual {residual})", .expected.saturating_sub(*.residual))]
    Underflow {
        /// Bytes the command asked to move (the COMMAND UPIU's EDTL).
        expected: u32,
        /// Bytes the device says it did not move (`0 < residual <= expected`).
        residual: u32,
    },
    /// GOOD status, but the device wanted to move `residual` bytes more
    /// than the `expected` transfer (OVERFLOW): it read the command
    /// differently from the host (another block size or length), so what
    /// it moved is not what was asked for.
    #[error("overflow: the device wanted {residual} bytes beyond the {expected} asked for")]
    Overflow {
        /// Bytes the command asked to move.
        expected: u32,
        /// Bytes beyond `expected` the device did not move (non-zero).
        residual: u32,
    },
    /// GOOD status with transfer flags and a residual that contradict each
    /// other or the command: both OVERFLOW and UNDERFLOW, a flag with a
    /// residual of 0, or an underflow larger than the transfer. What moved
    /// is unknown.
    #[error("malformed response UPIU: transfer flags {flags:#04x} with residual {residual} of {expected} bytes")]
    BadResidual {
        /// The OVERFLOW/UNDERFLOW bits of the header flags.
        flags: u8,
        /// Bytes the command asked to move.
        expected: u32,
        /// The residual transfer count found.
        residual: u32,
    },
}

impl UfsError {
    /// A UNIT ATTENTION report (the command did not run; retrying is right).
    pub fn is_unit_attention(&self) -> bool {
        matches!(self, UfsError::Scsi { sense: Some(s), .. } if s.is_unit_attention())
    }
}

/// Decode a command's outcome from its OCS and its response UPIU; `tag`
/// is the task tag the command was sent with.
pub fn command_result(ocs: Ocs, rsp: &ResponseUpiu, tag: u8) -> Result<(), UfsError> {
    if ocs != Ocs::SUCCESS {
        return Err(UfsError::Transport(ocs));
    }
    let h = &rsp.header;
    if h.trans_type != trans::RESPONSE || h.task_tag != tag {
        return Err(UfsError::BadResponse {
            trans_type: h.trans_type,
            task_tag: h.task_tag,
        });
    }
    let status = ScsiStatus(h.status);
    // A non-GOOD SCSI status explains itself (QEMU 10 sets the response
    // field to "target failure" next to every CHECK CONDITION, even the
    // power-on UNIT ATTENTION); "target failure" alone is the target's word.
    if h.response != 0 && status == ScsiStatus::GOOD {
        return Err(UfsError::TargetFailure(h.response));
    }
    if status == ScsiStatus::GOOD {
        return Ok(());
    }
    let sense = if status == ScsiStatus::CHECK_CONDITION {
        Sense::parse(rsp.sense())
    } else {
        None
    };
    Err(UfsError::Scsi { status, sense })
}

/// Decode an application or HPB command's outcome: [`command_result`],
/// then, when that is GOOD, [`transfer_result`] against `expected`, the
/// EDTL the COMMAND UPIU carried. A non-GOOD status explains itself
/// first: a failed command's residual says only how much moved before it
/// failed. (Device commands at bring-up use [`command_result`] alone: an
/// allocation length longer than the data is an ordinary underflow there.)
pub fn io_result(ocs: Ocs, rsp: &ResponseUpiu, tag: u8, expected: u32) -> Result<(), UfsError> {
    command_result(ocs, rsp, tag)?;
    transfer_result(rsp.header.flags, rsp.residual(), expected)
}

/// Whether a GOOD RESPONSE's transfer report (header `flags`, `residual`)
/// says all `expected` bytes moved, and nothing more was wanted. The rule:
///
/// | OVERFLOW | UNDERFLOW | residual | result |
/// |---|---|---|---|
/// | – | – | 0 | `Ok` |
/// | – | either | `1..=expected` | [`UfsError::Underflow`] |
/// | set | – | non-zero | [`UfsError::Overflow`] |
/// | – | either | `> expected` | [`UfsError::BadResidual`] |
/// | set | set | any | [`UfsError::BadResidual`] |
/// | one set | | 0 | [`UfsError::BadResidual`] |
///
/// The UFS RESPONSE UPIU gives the count a meaning only with a flag; a
/// count without either is still taken as an underflow, as Linux does
/// (ufshcd sets the SCSI residual whenever the count is non-zero and
/// OVERFLOW is clear, for devices that set neither flag) — the midlayer
/// then completes only the bytes before the residual. A completion here
/// is all or nothing, so any shortfall is an error. A flag with a count of
/// 0 contradicts itself: which one is true is unknown, so it is not `Ok`
/// either (it costs nothing: a GOOD response with a flag already left the
/// fast path). The same holds for commands without data (`expected` 0):
/// any flag or count is an error. Flag bits other than O and U are not
/// looked at.
pub fn transfer_result(flags: u8, residual: u32, expected: u32) -> Result<(), UfsError> {
    let over = flags & flags::OVERFLOW != 0;
    let under = flags & flags::UNDERFLOW != 0;
    match (over, under, residual) {
        (false, false, 0) => Ok(()),
        (false, _, r) if r != 0 && r <= expected => Err(UfsError::Underflow { expected, residual }),
        (true, false, r) if r != 0 => Err(UfsError::Overflow { expected, residual }),
        _ => Err(UfsError::BadResidual {
            flags: flags & (flags::OVERFLOW | flags::UNDERFLOW),
            expected,
            residual,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::super::scsi::sense_key;
    use super::super::upiu::UpiuHeader;
    use super::*;

    fn rsp(status: u8, sense: &[u8]) -> ResponseUpiu {
        let mut r = ResponseUpiu {
            header: UpiuHeader::new(trans::RESPONSE, 0, 4),
            ..Default::default()
        };
        r.header.status = status;
        r.sense_len = (sense.len() as u16).to_be_bytes();
        r.sense[..sense.len()].copy_from_slice(sense);
        r
    }

    #[test]
    fn transport_and_scsi_status_stay_apart() {
        assert_eq!(command_result(Ocs::SUCCESS, &rsp(0, &[]), 4), Ok(()));
        assert_eq!(
            command_result(Ocs::ABORTED, &rsp(0, &[]), 4),
            Err(UfsError::Transport(Ocs::ABORTED))
        );
        let mut s = [0u8; 18];
        s[0] = 0x70;
        s[2] = sense_key::UNIT_ATTENTION;
        s[12] = 0x29;
        let e = command_result(Ocs::SUCCESS, &rsp(2, &s), 4).unwrap_err();
        assert!(e.is_unit_attention(), "{e}");
        assert!(e.to_string().contains("ASC 0x29"));
        assert!(matches!(
            command_result(Ocs::SUCCESS, &rsp(0, &[]), 5),
            Err(UfsError::BadResponse { task_tag: 4, .. })
        ));
        let mut tf = rsp(0, &[]);
        tf.header.response = 1;
        assert_eq!(
            command_result(Ocs::SUCCESS, &tf, 4),
            Err(UfsError::TargetFailure(1))
        );
        assert!(matches!(
            command_result(Ocs::SUCCESS, &rsp(0x28, &[]), 4),
            Err(UfsError::Scsi { sense: None, .. })
        ));
    }

    /// Every row of `transfer_result`'s table, at the edges.
    #[test]
    fn a_transfer_that_is_not_whole_is_an_error() {
        use flags::{OVERFLOW as O, UNDERFLOW as U};
        let under = |expected, residual| Err(UfsError::Underflow { expected, residual });
        let over = |expected, residual| Err(UfsError::Overflow { expected, residual });
        let bad = |flags, expected, residual| {
            Err(UfsError::BadResidual {
                flags,
                expected,
                residual,
            })
        };
        let cases: &[(u8, u32, u32, Result<(), UfsError>)] = &[
            (0, 0, 8192, Ok(())),
            (0, 0, 0, Ok(())),
            // Flag bits other than O and U are not looked at.
            (0x9F, 0, 8192, Ok(())),
            (U, 4096, 8192, under(8192, 4096)),
            (U, 1, 8192, under(8192, 1)),
            (U, 8192, 8192, under(8192, 8192)),
            (U | 0x80, 4096, 8192, under(8192, 4096)),
            // A count without a flag is an underflow too (as Linux).
            (0, 4096, 8192, under(8192, 4096)),
            (O, 4096, 8192, over(8192, 4096)),
            (O, u32::MAX, 8192, over(8192, u32::MAX)),
            (O, 1, 0, over(0, 1)),
            (U, 8193, 8192, bad(U, 8192, 8193)),
            (0, u32::MAX, 8192, bad(0, 8192, u32::MAX)),
            (U, 0, 8192, bad(U, 8192, 0)),
            (O, 0, 8192, bad(O, 8192, 0)),
            (O | U, 4096, 8192, bad(O | U, 8192, 4096)),
            (O | U | 0x80, 0, 8192, bad(O | U, 8192, 0)),
            // No data: any flag or count is an error.
            (U, 0, 0, bad(U, 0, 0)),
            (0, 1, 0, bad(0, 0, 1)),
        ];
        for &(f, residual, expected, want) in cases {
            assert_eq!(
                transfer_result(f, residual, expected),
                want,
                "flags {f:#04x} residual {residual} of {expected}"
            );
        }
        let e = UfsError::Underflow {
            expected: 8192,
            residual: 4096,
        };
        assert!(e.to_string().contains("4096 of 8192"), "{e}");
    }

    /// `io_result` checks the transfer only once status is GOOD: a failed
    /// command's error is its own, whatever its residual.
    #[test]
    fn status_explains_itself_before_the_residual() {
        let mut r = rsp(0, &[]);
        r.header.flags = flags::UNDERFLOW;
        r.residual = 4096u32.to_be_bytes();
        assert_eq!(
            io_result(Ocs::SUCCESS, &r, 4, 8192),
            Err(UfsError::Underflow {
                expected: 8192,
                residual: 4096
            })
        );
        assert_eq!(
            command_result(Ocs::SUCCESS, &r, 4),
            Ok(()),
            "device commands"
        );
        assert_eq!(
            io_result(Ocs::ABORTED, &r, 4, 8192),
            Err(UfsError::Transport(Ocs::ABORTED))
        );
        assert!(matches!(
            io_result(Ocs::SUCCESS, &r, 5, 8192),
            Err(UfsError::BadResponse { .. })
        ));
        r.header.status = 2;
        assert!(matches!(
            io_result(Ocs::SUCCESS, &r, 4, 8192),
            Err(UfsError::Scsi { .. })
        ));
        assert_eq!(io_result(Ocs::SUCCESS, &rsp(0, &[]), 4, 8192), Ok(()));
    }
}
