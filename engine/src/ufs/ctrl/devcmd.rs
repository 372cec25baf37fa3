//! The device-command channel of bring-up and reset: NOP OUT, queries and
//! SCSI commands in, one at a time over slot 0 of the legacy list, with
//! the one retry rule ([`transient`], [`DevCmd::retried`]).

use std::time::{Duration, Instant};

use mcqio_vfio::{barrier, DmaRegion};

use crate::ufs::error::{UfsCtrlError, UfsResult};
use crate::ufs::spec::desc::MAX_DESC_LEN;
use crate::ufs::spec::regs;
use crate::ufs::spec::scsi::{self, Capacity};
use crate::ufs::spec::status::{command_result, UfsError};
use crate::ufs::spec::upiu::{self, flag_idn, trans, CommandUpiu, QueryUpiu, ResponseUpiu};
use crate::ufs::spec::utrd::{DataDir, Ocs, PrdtEntry, Ucd, Utrd};

use super::{wait_until, Regs};

/// Query response code "invalid index" (a descriptor index that does not
/// exist).
pub(super) const QUERY_INVALID_INDEX: u8 = 0xFC;

/// Request/response area of device management during bring-up: a UCD, a
/// 4 KiB data page, and the legacy list (slot 0).
pub(super) struct DevCmd {
    pub(super) utrl: DmaRegion,
    pub(super) ucd: DmaRegion,
    pub(super) data: DmaRegion,
    pub(super) next_tag: u8,
}

/// Attempts of one device command of the bring-up (NOP OUT, a query, a
/// SCSI command) that keeps failing transiently (see [`transient`]).
/// Linux sends a query 3 times (ufshcd, QUERY_REQ_RETRIES) and READ
/// CAPACITY 3 times (sd).
pub(super) const DEV_CMD_ATTEMPTS: u32 = 3;
/// UNIT ATTENTIONs one device command may meet on top of those: each
/// reports an event (power on, a reset) and that the command did not run,
/// not a failure. Linux's sd allows READ CAPACITY 10 of the power-on/reset
/// kind outside its 3 attempts.
pub(super) const DEV_CMD_UNIT_ATTENTIONS: u32 = 10;
/// The `what` of a device-management request that did not complete in time
/// and was withdrawn (UTRLCLR, its doorbell bit read 0 again): the
/// controller dropped it, so the slot and its descriptor may be reused.
pub(super) const DEV_CMD_WITHDRAWN: &str = "complete a device-management request (withdrawn)";
/// The same, but the doorbell bit did not clear after UTRLCLR: the
/// controller may still hold the request and its memory. Never retried.
pub(super) const DEV_CMD_STUCK: &str =
    "complete a device-management request (nor clear it from the list with UTRLCLR)";
/// Query response code "general failure".
pub(super) const QUERY_GENERAL_FAILURE: u8 = 0xFF;
/// Bytes of the device-management data page.
pub(super) const DEV_DATA: usize = 4096;

impl DevCmd {
    pub(super) fn tag(&mut self) -> u8 {
        self.next_tag = self.next_tag.wrapping_add(1);
        self.next_tag
    }

    /// Run one request in legacy slot 0 and wait for it. `upiu` is the
    /// request UPIU; `data_len` bytes of the data page take part in the
    /// transfer in direction `dir`. Returns the OCS and the response area.
    pub(super) fn exec(
        &mut self,
        r: &Regs<'_>,
        t: Duration,
        upiu: &[u8],
        dir: DataDir,
        data_len: usize,
    ) -> UfsResult<(Ocs, [u8; Ucd::RESPONSE_LEN])> {
        debug_assert!(upiu.len() <= 64 && data_len <= DEV_DATA && data_len % 4 == 0);
        let zero = [0u8; Ucd::RESPONSE_LEN];
        self.ucd.write_bytes(Ucd::COMMAND_OFFSET, &zero[..64])?;
        self.ucd.write_bytes(Ucd::COMMAND_OFFSET, upiu)?;
        self.ucd.write_bytes(Ucd::RESPONSE_OFFSET, &zero)?;
        let mut prdt = 0;
        if data_len > 0 {
            let e = PrdtEntry::new(self.data.iova().raw(), data_len as u32).ok_or(
                UfsCtrlError::BadValue {
                    what: "device-management data page",
                    value: self.data.iova().raw(),
                    why: "not dword aligned",
                },
            )?;
            self.ucd.write_obj(Ucd::PRDT_OFFSET, e)?;
            prdt = 1;
        }
        let d = Utrd::new(self.ucd.iova().raw(), dir, prdt);
        self.utrl.write_obj(0, d)?;
        // Release: UCD and UTRD stores before the doorbell.
        barrier::stores_before_doorbell();
        r.write(regs::UTRLDBR, 1);
        let waited = wait_until(t, DEV_CMD_WITHDRAWN, || {
            r.check_fatal()?;
            Ok(r.read(regs::UTRLDBR)? & 1 == 0)
        });
        if let Err(e) = waited {
            if !matches!(e, UfsCtrlError::Timeout { .. }) {
                return Err(e);
            }
            // Withdraw it (write 0 to clear) and wait until the controller
            // confirms: only then is the slot free and the descriptor ours.
            r.write(regs::UTRLCLR, !1);
            let cleared = wait_until(t, DEV_CMD_STUCK, || Ok(r.read(regs::UTRLDBR)? & 1 == 0));
            return Err(cleared.err().unwrap_or(e));
        }
        r.write(regs::UTRLCNR, 1);
        // Acquire: the OCS and response were written before the bit cleared.
        barrier::loads_after_phase();
        let d: Utrd = self.utrl.read_obj(0)?;
        let mut rsp = [0u8; Ucd::RESPONSE_LEN];
        self.ucd.read_bytes(Ucd::RESPONSE_OFFSET, &mut rsp)?;
        Ok((Ocs(d.ocs & 0xF), rsp))
    }

    /// One device command, attempted again while it fails transiently:
    /// the one retry rule of the bring-up and of a reset ([`transient`]).
    /// `f` sends it once (with a new task tag each time). At most
    /// [`DEV_CMD_ATTEMPTS`] transient failures and
    /// [`DEV_CMD_UNIT_ATTENTIONS`] UNIT ATTENTIONs; the last error is
    /// returned as it came.
    pub(super) fn retried<T>(
        &mut self,
        mut f: impl FnMut(&mut Self) -> UfsResult<T>,
    ) -> UfsResult<T> {
        let (mut failures, mut attentions) = (0, 0);
        loop {
            let e = match f(self) {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let again = match transient(&e) {
                Transient::No => false,
                Transient::UnitAttention => {
                    attentions += 1;
                    attentions <= DEV_CMD_UNIT_ATTENTIONS
                }
                Transient::Yes => {
                    failures += 1;
                    failures < DEV_CMD_ATTEMPTS
                }
            };
            if !again {
                return Err(e);
            }
            log::debug!("device command failed ({e}); sending it again");
        }
    }

    pub(super) fn nop(&mut self, r: &Regs<'_>, t: Duration) -> UfsResult<()> {
        self.retried(|s| {
            let tag = s.tag();
            let (ocs, rsp) = s.exec(r, t, &upiu::nop_out(tag), DataDir::None, 0)?;
            let err = if ocs != Ocs::SUCCESS {
                UfsError::Transport(ocs)
            } else if rsp[0] != trans::NOP_IN || rsp[3] != tag {
                UfsError::BadResponse {
                    trans_type: rsp[0],
                    task_tag: rsp[3],
                }
            } else {
                return Ok(());
            };
            Err(UfsCtrlError::DevCmd {
                what: "NOP OUT",
                err,
            })
        })
    }

    /// A QUERY REQUEST built by `q` from a task tag, retried
    /// ([`Self::retried`]); returns the QUERY RESPONSE header and its data
    /// segment.
    pub(super) fn query(
        &mut self,
        r: &Regs<'_>,
        t: Duration,
        what: &'static str,
        q: impl Fn(u8) -> QueryUpiu,
        data_len: usize,
    ) -> UfsResult<(QueryUpiu, Vec<u8>)> {
        self.retried(|s| {
            let tag = s.tag();
            s.query_once(r, t, what, q(tag), data_len)
        })
    }

    pub(super) fn query_once(
        &mut self,
        r: &Regs<'_>,
        t: Duration,
        what: &'static str,
        q: QueryUpiu,
        data_len: usize,
    ) -> UfsResult<(QueryUpiu, Vec<u8>)> {
        let tag = q.header.task_tag;
        // SAFETY: `QueryUpiu` is PlainData (repr(C), 32 bytes of u8 fields):
        // viewing it as bytes is sound while `q` is borrowed.
        let bytes =
            unsafe { std::slice::from_raw_parts((&q as *const QueryUpiu).cast::<u8>(), 32) };
        let (ocs, rsp) = self.exec(r, t, bytes, DataDir::None, 0)?;
        if ocs != Ocs::SUCCESS {
            return Err(UfsCtrlError::DevCmd {
                what,
                err: UfsError::Transport(ocs),
            });
        }
        if rsp[0] != trans::QUERY_RSP || rsp[3] != tag {
            return Err(UfsCtrlError::DevCmd {
                what,
                err: UfsError::BadResponse {
                    trans_type: rsp[0],
                    task_tag: rsp[3],
                },
            });
        }
        if rsp[6] != 0 {
            return Err(UfsCtrlError::Query { what, code: rsp[6] });
        }
        let mut head = QueryUpiu::default();
        // SAFETY: as above, for writing 32 bytes into a PlainData value.
        unsafe {
            std::ptr::copy_nonoverlapping(
                rsp.as_ptr(),
                (&mut head as *mut QueryUpiu).cast::<u8>(),
                32,
            )
        };
        if data_len == 0 {
            return Ok((head, Vec::new()));
        }
        // The data segment length bounds the data; it must agree with the
        // descriptor length the response reports (QEMU 10 writes some
        // segment lengths byte-swapped: accept that form too).
        let dsl = head.header.data_segment_len();
        let len = head.desc_len();
        if !(dsl == len || dsl.swap_bytes() == len) {
            return Err(UfsCtrlError::BadValue {
                what: "QUERY RESPONSE descriptor length",
                value: u64::from(len),
                why: "disagrees with the data segment length",
            });
        }
        let n = usize::from(len).min(data_len).min(Ucd::RESPONSE_LEN - 32);
        Ok((head, rsp[32..32 + n].to_vec()))
    }

    pub(super) fn read_desc(
        &mut self,
        r: &Regs<'_>,
        t: Duration,
        idn: u8,
        index: u8,
    ) -> UfsResult<Vec<u8>> {
        let q = |tag| QueryUpiu::read_descriptor(tag, idn, index, MAX_DESC_LEN);
        Ok(self
            .query(r, t, "read descriptor", q, usize::from(MAX_DESC_LEN))?
            .1)
    }

    /// Set fDeviceInit and poll it until the device clears it.
    pub(super) fn device_init(&mut self, r: &Regs<'_>, t: Duration) -> UfsResult<()> {
        self.query(
            r,
            t,
            "set fDeviceInit",
            |tag| QueryUpiu::set_flag(tag, flag_idn::DEVICE_INIT),
            0,
        )?;
        let start = Instant::now();
        loop {
            let (h, _) = self.query(
                r,
                t,
                "read fDeviceInit",
                |tag| QueryUpiu::read_flag(tag, flag_idn::DEVICE_INIT),
                0,
            )?;
            if !h.flag_value() {
                return Ok(());
            }
            if start.elapsed() > t {
                return Err(UfsCtrlError::Timeout {
                    what: "clear fDeviceInit",
                    timeout_ms: t.as_millis() as u64,
                });
            }
            std::thread::yield_now();
        }
    }

    /// A device-management query of the HPB bring-up: an attribute's value,
    /// or a flag's (0/1) after reading or setting it.
    pub(super) fn hpb_query(
        &mut self,
        r: &Regs<'_>,
        t: Duration,
        q: crate::ufs::hpb::Query,
    ) -> UfsResult<u32> {
        use crate::ufs::hpb::Query;
        let what = match q {
            Query::ReadAttr(_) => "read HPB attribute",
            Query::SetFlag(_) => "set HPB flag",
            Query::ReadFlag(_) => "read HPB flag",
        };
        let req = |tag| match q {
            Query::ReadAttr(idn) => QueryUpiu::read_attribute(tag, idn, 0),
            Query::SetFlag(idn) => QueryUpiu::set_flag(tag, idn),
            Query::ReadFlag(idn) => QueryUpiu::read_flag(tag, idn),
        };
        let (h, _) = self.query(r, t, what, req, 0)?;
        Ok(match q {
            Query::ReadAttr(_) => h.attr_value(),
            _ => u32::from(h.flag_value()),
        })
    }

    /// SCSI command `what` on LU `lun`, reading up to `alloc` bytes into the
    /// data page, retried ([`Self::retried`]).
    pub(super) fn scsi(
        &mut self,
        r: &Regs<'_>,
        t: Duration,
        (what, lun): (&'static str, u8),
        cdb: scsi::Cdb,
        alloc: usize,
    ) -> UfsResult<Vec<u8>> {
        self.retried(|s| {
            s.scsi_once(r, t, lun, cdb, alloc)?
                .map_err(|err| UfsCtrlError::Scsi { what, lun, err })
        })
    }

    /// One SCSI command reading up to `alloc` bytes into the data page.
    pub(super) fn scsi_once(
        &mut self,
        r: &Regs<'_>,
        t: Duration,
        lun: u8,
        cdb: scsi::Cdb,
        alloc: usize,
    ) -> UfsResult<Result<Vec<u8>, UfsError>> {
        let tag = self.tag();
        let cmd = CommandUpiu::new(lun, tag, cdb, alloc as u32, true);
        // SAFETY: `CommandUpiu` is PlainData (32 bytes of u8 fields).
        let bytes =
            unsafe { std::slice::from_raw_parts((&cmd as *const CommandUpiu).cast::<u8>(), 32) };
        let dir = if alloc == 0 {
            DataDir::None
        } else {
            DataDir::FromDevice
        };
        let (ocs, rsp) = self.exec(r, t, bytes, dir, alloc)?;
        let mut resp = ResponseUpiu::default();
        // SAFETY: `ResponseUpiu` is PlainData (52 bytes of u8 fields); the
        // source has 512 bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                rsp.as_ptr(),
                (&mut resp as *mut ResponseUpiu).cast::<u8>(),
                std::mem::size_of::<ResponseUpiu>(),
            )
        };
        if let Err(e) = command_result(ocs, &resp, tag) {
            return Ok(Err(e));
        }
        // The residual counts what was not moved, except on OVERFLOW: then
        // it counts what the device had beyond `alloc`, and all of `alloc`
        // arrived.
        let got = if resp.header.flags & upiu::flags::OVERFLOW != 0 {
            alloc
        } else {
            alloc.saturating_sub(resp.residual() as usize)
        };
        let mut v = vec![0u8; got];
        self.data.read_bytes(0, &mut v)?;
        Ok(Ok(v))
    }

    pub(super) fn report_luns(&mut self, r: &Regs<'_>, t: Duration, lun: u8) -> UfsResult<Vec<u8>> {
        let alloc = 8 + 8 * 32;
        let cdb = scsi::report_luns(alloc as u32);
        let d = self.scsi(r, t, ("REPORT LUNS", lun), cdb, alloc)?;
        Ok(scsi::parse_report_luns(&d))
    }

    /// TEST UNIT READY (clears the power-on UNIT ATTENTION: retried).
    pub(super) fn clear_unit_attention(
        &mut self,
        r: &Regs<'_>,
        t: Duration,
        lun: u8,
    ) -> UfsResult<()> {
        let cdb = scsi::test_unit_ready();
        self.scsi(r, t, ("TEST UNIT READY", lun), cdb, 0)
            .map(|_| ())
    }

    pub(super) fn read_capacity(
        &mut self,
        r: &Regs<'_>,
        t: Duration,
        lun: u8,
    ) -> UfsResult<Capacity> {
        let (cdb, len) = (scsi::read_capacity16(), scsi::READ_CAPACITY_16_LEN);
        let d = self.scsi(r, t, ("READ CAPACITY(16)", lun), cdb, len)?;
        Capacity::parse(&d).ok_or(UfsCtrlError::BadValue {
            what: "READ CAPACITY(16) data",
            value: d.len() as u64,
            why: "too short, zero block length or a block count that overflows",
        })
    }
}

/// Whether a device command of the bring-up that failed with `e` is sent
/// again ([`DevCmd::retried`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum Transient {
    /// No: the answer is final (or the controller is unusable).
    No,
    /// Yes, counted against [`DEV_CMD_ATTEMPTS`].
    Yes,
    /// Yes, a UNIT ATTENTION: counted against [`DEV_CMD_UNIT_ATTENTIONS`].
    UnitAttention,
}

/// The retry rule of the bring-up's device commands (and a reset's, the
/// same path). Transient:
/// - a transport error (any OCS): the host controller's failure to carry
///   the request, not the device's answer (Linux fails such a SCSI command
///   with DID_ERROR / DID_REQUEUE, which its midlayer retries, and retries
///   a NOP OUT or query that ended so);
/// - a malformed or mismatched response UPIU, "target failure" alone;
/// - a device-management request that timed out **and** was withdrawn
///   (UTRLCLR confirmed; Linux: -EAGAIN, retried);
/// - the query response code GENERAL FAILURE;
/// - SCSI status BUSY, TASK SET FULL, TASK ABORTED, CHECK CONDITION
///   without usable sense, or with any sense key but those below
///   (NOT READY "becoming ready", a MEDIUM or HARDWARE ERROR on a command
///   that reads no medium, ABORTED COMMAND, …), as Linux's sd retries READ
///   CAPACITY on any failure but these;
/// - UNIT ATTENTION, on its own allowance.
///
/// Final: ILLEGAL REQUEST (the device rejects the command itself: asking
/// again gets the same answer), NOT READY / MEDIUM NOT PRESENT,
/// RESERVATION CONFLICT, every other query response code (invalid index,
/// IDN, opcode, …: an answer), a request the controller would not give
/// back, a fatal or absent controller, DMA errors and values that do not
/// parse.
pub(super) fn transient(e: &UfsCtrlError) -> Transient {
    use crate::ufs::spec::scsi::{sense_key, ScsiStatus};
    match e {
        UfsCtrlError::Timeout { what, .. } if *what == DEV_CMD_WITHDRAWN => Transient::Yes,
        UfsCtrlError::Query { code, .. } if *code == QUERY_GENERAL_FAILURE => Transient::Yes,
        UfsCtrlError::DevCmd { err, .. } | UfsCtrlError::Scsi { err, .. } => match err {
            UfsError::Transport(_) | UfsError::BadResponse { .. } | UfsError::TargetFailure(_) => {
                Transient::Yes
            }
            UfsError::Scsi { sense: Some(s), .. } if s.is_unit_attention() => {
                Transient::UnitAttention
            }
            UfsError::Scsi { sense: Some(s), .. }
                if s.key == sense_key::ILLEGAL_REQUEST
                    || (s.key == sense_key::NOT_READY && s.asc == 0x3A) =>
            {
                Transient::No
            }
            UfsError::Scsi { status, .. } if *status == ScsiStatus::RESERVATION_CONFLICT => {
                Transient::No
            }
            UfsError::Scsi { .. } => Transient::Yes,
            // A transfer that was not whole: the device's own account of
            // this command, asked again it gives the same.
            UfsError::Underflow { .. }
            | UfsError::Overflow { .. }
            | UfsError::BadResidual { .. } => Transient::No,
        },
        _ => Transient::No,
    }
}
