//! How a finished UFS command ended, decoded once.
//!
//! Three layers report separately and are kept apart: the host controller's
//! transport status (OCS, in the completion entry or UTRD), the target's
//! response byte in the RESPONSE UPIU header, and the SCSI status with its
//! sense data. OCS can be SUCCESS while the SCSI status is CHECK CONDITION
//! (the first command after a reset gets UNIT ATTENTION that way).

use super::scsi::{ScsiStatus, Sense};
use super::upiu::{trans, ResponseUpiu};
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
}
