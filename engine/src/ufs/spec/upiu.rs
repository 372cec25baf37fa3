//! UFS Protocol Information Units. Multi-byte fields are big-endian; the
//! structs hold them as byte arrays so no field can be read in the wrong
//! byte order by accident.

use mcqio_vfio::PlainData;

/// Transaction codes (header byte 0).
pub mod trans {
    /// NOP OUT (host → device ping).
    pub const NOP_OUT: u8 = 0x00;
    /// COMMAND (a SCSI CDB).
    pub const COMMAND: u8 = 0x01;
    /// TASK MANAGEMENT REQUEST.
    pub const TASK_REQ: u8 = 0x04;
    /// QUERY REQUEST (descriptors, attributes, flags).
    pub const QUERY_REQ: u8 = 0x16;
    /// NOP IN (answer to NOP OUT).
    pub const NOP_IN: u8 = 0x20;
    /// RESPONSE (end of a COMMAND).
    pub const RESPONSE: u8 = 0x21;
    /// TASK MANAGEMENT RESPONSE.
    pub const TASK_RSP: u8 = 0x24;
    /// QUERY RESPONSE.
    pub const QUERY_RSP: u8 = 0x36;
    /// REJECT: the device could not parse the request.
    pub const REJECT: u8 = 0x3F;
}

/// Header flags (byte 1) of a COMMAND.
pub mod flags {
    /// The command reads (device → host data).
    pub const READ: u8 = 0x40;
    /// The command writes (host → device data).
    pub const WRITE: u8 = 0x20;
    /// In a RESPONSE: less data moved than expected (residual count valid).
    pub const UNDERFLOW: u8 = 0x20;
    /// In a RESPONSE: more data than expected.
    pub const OVERFLOW: u8 = 0x40;
}

/// Header byte 9: device information.
pub mod device_info {
    /// An exception event is pending.
    pub const EXCEPTION_EVENT: u8 = 1 << 0;
    /// HPB: the response carries map update recommendations.
    pub const HPB_UPDATE_ALERT: u8 = 1 << 1;
}

/// The 12-byte header every UPIU starts with.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct UpiuHeader {
    /// Transaction code ([`trans`]).
    pub trans_type: u8,
    /// Flags ([`flags`]).
    pub flags: u8,
    /// Logical unit number.
    pub lun: u8,
    /// Task tag: the host's name for the command.
    pub task_tag: u8,
    /// Bits 7:4 initiator id, bits 3:0 command set type (0 = SCSI).
    pub iid_cmd_set: u8,
    /// Query function or task-management function.
    pub function: u8,
    /// Response: 0 target success, 1 target failure (query: response code).
    pub response: u8,
    /// SCSI status (RESPONSE only).
    pub status: u8,
    /// Total extra-header-segment length, in 32-byte units.
    pub ehs_len: u8,
    /// Device information ([`device_info`]).
    pub device_info: u8,
    /// Data segment length, big-endian.
    pub data_seg_len: [u8; 2],
}

const _: () = assert!(std::mem::size_of::<UpiuHeader>() == 12);

impl UpiuHeader {
    /// A header with the given code, LUN and tag; everything else zero.
    pub const fn new(trans_type: u8, lun: u8, task_tag: u8) -> Self {
        UpiuHeader {
            trans_type,
            flags: 0,
            lun,
            task_tag,
            iid_cmd_set: 0,
            function: 0,
            response: 0,
            status: 0,
            ehs_len: 0,
            device_info: 0,
            data_seg_len: [0; 2],
        }
    }
    /// The data segment length.
    pub const fn data_segment_len(&self) -> u16 {
        u16::from_be_bytes(self.data_seg_len)
    }
}

/// COMMAND UPIU, 32 bytes: header, expected transfer length, CDB.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CommandUpiu {
    /// Header (code [`trans::COMMAND`]).
    pub header: UpiuHeader,
    /// Expected data transfer length in bytes, big-endian.
    pub exp_len: [u8; 4],
    /// The CDB, zero-padded to 16 bytes.
    pub cdb: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<CommandUpiu>() == 32);

// SAFETY: `#[repr(C)]` of byte fields only, 32 bytes without padding
// (asserted above): every bit pattern is valid.
unsafe impl PlainData for CommandUpiu {}

impl CommandUpiu {
    /// A SCSI command for `lun` with `task_tag`, moving `bytes` in the
    /// direction the flags say (`read` true: device → host).
    pub const fn new(lun: u8, task_tag: u8, cdb: [u8; 16], bytes: u32, read: bool) -> Self {
        let mut header = UpiuHeader::new(trans::COMMAND, lun, task_tag);
        if bytes != 0 {
            header.flags = if read { flags::READ } else { flags::WRITE };
        }
        CommandUpiu {
            header,
            exp_len: bytes.to_be_bytes(),
            cdb,
        }
    }

    /// The COMMAND UPIU of a READ or WRITE (`read`), `blocks` blocks at
    /// `lba`, moving `bytes`, as four little-endian words (store each with
    /// `to_le`): the same bytes as `CommandUpiu::new(lun, task_tag,
    /// scsi::read(lba, blocks, false) /* or write */, bytes, read)`, computed
    /// in registers. The hot path uses it: building the CDB byte by byte on
    /// the stack and reloading it as words stalled on store forwarding
    /// behind the submit path's stores to descriptor memory.
    #[inline(always)]
    pub const fn rw_le_words(
        lun: u8,
        task_tag: u8,
        lba: u64,
        blocks: u32,
        bytes: u32,
        read: bool,
    ) -> [u64; 4] {
        use super::scsi::op;
        let fl = if bytes == 0 {
            0
        } else if read {
            flags::READ
        } else {
            flags::WRITE
        };
        let w0 =
            trans::COMMAND as u64 | (fl as u64) << 8 | (lun as u64) << 16 | (task_tag as u64) << 24;
        let w1 = (bytes.swap_bytes() as u64) << 32;
        // READ(10)/WRITE(10) when LBA and length fit, as `scsi::read`.
        let (w2, w3) = if lba <= u32::MAX as u64 && blocks <= u16::MAX as u32 {
            let opc = if read { op::READ_10 } else { op::WRITE_10 };
            let n = blocks as u16;
            (
                // [0] opcode, [2..6] LBA BE32, [7..9] length BE16.
                opc as u64 | ((lba as u32).swap_bytes() as u64) << 16 | ((n >> 8) as u64) << 56,
                (n & 0xFF) as u64,
            )
        } else {
            let opc = if read { op::READ_16 } else { op::WRITE_16 };
            let l = lba.swap_bytes();
            (
                // [0] opcode, [2..10] LBA BE64, [10..14] length BE32.
                opc as u64 | l << 16,
                l >> 48 | (blocks.swap_bytes() as u64) << 16,
            )
        };
        [w0, w1, w2, w3]
    }

    /// The 32 bytes as four words in memory order (`from_ne_bytes` of
    /// each 8-byte group), so the hot path stores them with four 64-bit
    /// stores instead of one store per field.
    #[inline(always)]
    pub const fn to_words(&self) -> [u64; 4] {
        let h = &self.header;
        let e = &self.exp_len;
        let c = &self.cdb;
        [
            u64::from_ne_bytes([
                h.trans_type,
                h.flags,
                h.lun,
                h.task_tag,
                h.iid_cmd_set,
                h.function,
                h.response,
                h.status,
            ]),
            u64::from_ne_bytes([
                h.ehs_len,
                h.device_info,
                h.data_seg_len[0],
                h.data_seg_len[1],
                e[0],
                e[1],
                e[2],
                e[3],
            ]),
            u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
            u64::from_ne_bytes([c[8], c[9], c[10], c[11], c[12], c[13], c[14], c[15]]),
        ]
    }
}

/// Most sense bytes a RESPONSE carries (fixed-format sense, 18 bytes).
pub const SENSE_LEN: usize = 18;

/// RESPONSE UPIU as far as a COMMAND needs it: header, residual count,
/// sense data.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ResponseUpiu {
    /// Header (code [`trans::RESPONSE`]; `response` and `status` matter).
    pub header: UpiuHeader,
    /// Bytes not transferred, big-endian.
    pub residual: [u8; 4],
    /// Reserved.
    pub reserved: [u8; 16],
    /// Sense data length, big-endian.
    pub sense_len: [u8; 2],
    /// Sense data (fixed format).
    pub sense: [u8; SENSE_LEN],
}

const _: () = assert!(std::mem::size_of::<ResponseUpiu>() == 52);

// SAFETY: `#[repr(C)]` of byte fields only, 52 bytes without padding
// (asserted above): every bit pattern is valid.
unsafe impl PlainData for ResponseUpiu {}

impl Default for ResponseUpiu {
    fn default() -> Self {
        ResponseUpiu {
            header: UpiuHeader::default(),
            residual: [0; 4],
            reserved: [0; 16],
            sense_len: [0; 2],
            sense: [0; SENSE_LEN],
        }
    }
}

impl ResponseUpiu {
    /// Bytes the device did not transfer.
    pub const fn residual(&self) -> u32 {
        u32::from_be_bytes(self.residual)
    }
    /// The valid sense bytes. The length comes from the sense-length field
    /// (bytes 32–33), not from the header's data segment length, which some
    /// devices (QEMU 10.0.2) write byte-swapped; bounded to [`SENSE_LEN`].
    pub fn sense(&self) -> &[u8] {
        let n = (u16::from_be_bytes(self.sense_len) as usize).min(SENSE_LEN);
        &self.sense[..n]
    }
}

/// Query functions (header byte 5).
pub mod query_fn {
    /// Standard read request.
    pub const STANDARD_READ: u8 = 0x01;
    /// Standard write request.
    pub const STANDARD_WRITE: u8 = 0x81;
}

/// Query opcodes (transaction-specific byte 0).
pub mod query_op {
    /// Read a descriptor.
    pub const READ_DESC: u8 = 0x01;
    /// Write a descriptor.
    pub const WRITE_DESC: u8 = 0x02;
    /// Read an attribute.
    pub const READ_ATTR: u8 = 0x03;
    /// Write an attribute.
    pub const WRITE_ATTR: u8 = 0x04;
    /// Read a flag.
    pub const READ_FLAG: u8 = 0x05;
    /// Set a flag.
    pub const SET_FLAG: u8 = 0x06;
    /// Clear a flag.
    pub const CLEAR_FLAG: u8 = 0x07;
    /// Toggle a flag.
    pub const TOGGLE_FLAG: u8 = 0x08;
}

/// Flag identifiers.
pub mod flag_idn {
    /// Device initialisation: the host sets it, the device clears it when done.
    pub const DEVICE_INIT: u8 = 0x01;
    /// Permanent write protect.
    pub const PERMANENT_WP: u8 = 0x02;
    /// Background operations enable.
    pub const BKOPS_EN: u8 = 0x04;
}

/// QUERY REQUEST / QUERY RESPONSE UPIU, 32 bytes (data segment follows).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct QueryUpiu {
    /// Header (code [`trans::QUERY_REQ`] / [`trans::QUERY_RSP`]; `function`
    /// is the query function, `response` the query response code).
    pub header: UpiuHeader,
    /// Opcode ([`query_op`]).
    pub opcode: u8,
    /// Descriptor / attribute / flag identifier.
    pub idn: u8,
    /// Index (e.g. the LU of a unit descriptor).
    pub index: u8,
    /// Selector.
    pub selector: u8,
    /// Reserved.
    pub reserved_osf: [u8; 2],
    /// Descriptor length, big-endian.
    pub length: [u8; 2],
    /// Attribute value, big-endian (flags: the value is in the last byte).
    pub value: [u8; 4],
    /// Reserved.
    pub reserved: [u8; 8],
}

const _: () = assert!(std::mem::size_of::<QueryUpiu>() == 32);

// SAFETY: `#[repr(C)]` of byte fields only, 32 bytes without padding
// (asserted above): every bit pattern is valid.
unsafe impl PlainData for QueryUpiu {}

impl QueryUpiu {
    fn request(task_tag: u8, function: u8, opcode: u8, idn: u8, index: u8) -> Self {
        let mut header = UpiuHeader::new(trans::QUERY_REQ, 0, task_tag);
        header.function = function;
        QueryUpiu {
            header,
            opcode,
            idn,
            index,
            ..Default::default()
        }
    }
    /// Read descriptor `idn` (index `index`), up to `len` bytes.
    pub fn read_descriptor(task_tag: u8, idn: u8, index: u8, len: u16) -> Self {
        let mut q = Self::request(
            task_tag,
            query_fn::STANDARD_READ,
            query_op::READ_DESC,
            idn,
            index,
        );
        q.length = len.to_be_bytes();
        q
    }
    /// Read attribute `idn`.
    pub fn read_attribute(task_tag: u8, idn: u8, index: u8) -> Self {
        Self::request(
            task_tag,
            query_fn::STANDARD_READ,
            query_op::READ_ATTR,
            idn,
            index,
        )
    }
    /// Write `value` to attribute `idn`.
    pub fn write_attribute(task_tag: u8, idn: u8, index: u8, value: u32) -> Self {
        let mut q = Self::request(
            task_tag,
            query_fn::STANDARD_WRITE,
            query_op::WRITE_ATTR,
            idn,
            index,
        );
        q.value = value.to_be_bytes();
        q
    }
    /// Read flag `idn`.
    pub fn read_flag(task_tag: u8, idn: u8) -> Self {
        Self::request(
            task_tag,
            query_fn::STANDARD_READ,
            query_op::READ_FLAG,
            idn,
            0,
        )
    }
    /// Set flag `idn`.
    pub fn set_flag(task_tag: u8, idn: u8) -> Self {
        Self::request(
            task_tag,
            query_fn::STANDARD_WRITE,
            query_op::SET_FLAG,
            idn,
            0,
        )
    }
    /// The descriptor length of a response.
    pub const fn desc_len(&self) -> u16 {
        u16::from_be_bytes(self.length)
    }
    /// The attribute value of a response.
    pub const fn attr_value(&self) -> u32 {
        u32::from_be_bytes(self.value)
    }
    /// The flag value of a response.
    pub const fn flag_value(&self) -> bool {
        self.value[3] & 1 == 1
    }
}

/// NOP OUT UPIU (header only, 32 bytes with the reserved tail).
pub fn nop_out(task_tag: u8) -> [u8; 32] {
    let mut b = [0u8; 32];
    b[0] = trans::NOP_OUT;
    b[3] = task_tag;
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: PlainData>(v: &T) -> Vec<u8> {
        let n = std::mem::size_of::<T>();
        // SAFETY: `T: PlainData` has no padding and no invalid bit patterns,
        // so its `n` bytes may be read as `u8`s while `v` is borrowed.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), n) }.to_vec()
    }

    #[test]
    fn command_upiu_is_big_endian() {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x28;
        let c = CommandUpiu::new(2, 9, cdb, 8192, true);
        let b = bytes(&c);
        assert_eq!(&b[..4], &[trans::COMMAND, flags::READ, 2, 9]);
        assert_eq!(&b[12..16], &[0, 0, 0x20, 0], "8192 big-endian");
        assert_eq!(b[16], 0x28);
        let w = CommandUpiu::new(0, 1, cdb, 4096, false);
        assert_eq!(w.header.flags, flags::WRITE);
        assert_eq!(CommandUpiu::new(0, 1, cdb, 0, true).header.flags, 0);
        let mut cdb = [0u8; 16];
        for (i, x) in cdb.iter_mut().enumerate() {
            *x = 0x80 | i as u8;
        }
        let c = CommandUpiu::new(3, 0x7E, cdb, 0x0102_0304, false);
        let mut from_words = Vec::new();
        for w in c.to_words() {
            from_words.extend_from_slice(&w.to_ne_bytes());
        }
        assert_eq!(from_words, bytes(&c), "the word form is the same 32 bytes");
    }

    #[test]
    fn rw_words_are_the_read_write_command_upiu() {
        use crate::ufs::spec::scsi;
        let lbas = [
            0u64,
            1,
            0x1234_5678,
            u32::MAX as u64,
            u32::MAX as u64 + 1,
            0x0102_0304_0506_0708,
            u64::MAX - 7,
        ];
        let counts = [
            1u32,
            8,
            0x1234,
            u16::MAX as u32,
            u16::MAX as u32 + 1,
            0x0A0B_0C0D,
        ];
        for &lba in &lbas {
            for &blocks in &counts {
                for read in [true, false] {
                    for len in [0u32, 4096, 0x0102_0304] {
                        let cdb = if read {
                            scsi::read(lba, blocks, false)
                        } else {
                            scsi::write(lba, blocks, false)
                        };
                        let want = bytes(&CommandUpiu::new(7, 0xA5, cdb, len, read));
                        let mut got = Vec::new();
                        for w in CommandUpiu::rw_le_words(7, 0xA5, lba, blocks, len, read) {
                            got.extend_from_slice(&w.to_le_bytes());
                        }
                        assert_eq!(
                            got, want,
                            "lba {lba:#x} blocks {blocks:#x} read {read} bytes {len}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn query_fields_sit_where_the_spec_puts_them() {
        let q = QueryUpiu::read_descriptor(5, 0x02, 1, 0x2D);
        let b = bytes(&q);
        assert_eq!(b[0], trans::QUERY_REQ);
        assert_eq!(b[3], 5);
        assert_eq!(b[5], query_fn::STANDARD_READ);
        assert_eq!(&b[12..16], &[query_op::READ_DESC, 0x02, 1, 0]);
        assert_eq!(&b[18..20], &[0, 0x2D]);
        let f = QueryUpiu::set_flag(1, flag_idn::DEVICE_INIT);
        assert_eq!(bytes(&f)[5], query_fn::STANDARD_WRITE);
        let a = QueryUpiu::write_attribute(1, 0x10, 0, 0x0102_0304);
        assert_eq!(&bytes(&a)[20..24], &[1, 2, 3, 4]);
        assert_eq!(nop_out(7)[3], 7);
    }

    #[test]
    fn sense_length_is_bounded() {
        let mut r = ResponseUpiu {
            sense_len: 0xFFFFu16.to_be_bytes(),
            ..Default::default()
        };
        assert_eq!(r.sense().len(), SENSE_LEN);
        r.sense_len = 2u16.to_be_bytes();
        assert_eq!(r.sense().len(), 2);
    }
}
