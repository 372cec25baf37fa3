//! SCSI commands (SBC/SPC) as UFS carries them: CDB builders, the status
//! byte and fixed/descriptor-format sense data. All fields big-endian.

/// A CDB padded to the 16 bytes of a COMMAND UPIU.
pub type Cdb = [u8; 16];

/// Operation codes.
pub mod op {
    /// TEST UNIT READY.
    pub const TEST_UNIT_READY: u8 = 0x00;
    /// REQUEST SENSE.
    pub const REQUEST_SENSE: u8 = 0x03;
    /// INQUIRY.
    pub const INQUIRY: u8 = 0x12;
    /// READ(10).
    pub const READ_10: u8 = 0x28;
    /// WRITE(10).
    pub const WRITE_10: u8 = 0x2A;
    /// SYNCHRONIZE CACHE(10).
    pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    /// UNMAP.
    pub const UNMAP: u8 = 0x42;
    /// READ(16).
    pub const READ_16: u8 = 0x88;
    /// WRITE(16).
    pub const WRITE_16: u8 = 0x8A;
    /// SERVICE ACTION IN(16) (READ CAPACITY(16) is service action 0x10).
    pub const SERVICE_ACTION_IN_16: u8 = 0x9E;
    /// REPORT LUNS.
    pub const REPORT_LUNS: u8 = 0xA0;
}

/// Service action of READ CAPACITY(16).
pub const SA_READ_CAPACITY_16: u8 = 0x10;

/// FUA bit of READ/WRITE(10)/(16), byte 1.
pub const FUA: u8 = 0x08;

/// TEST UNIT READY.
pub const fn test_unit_ready() -> Cdb {
    [0; 16]
}

/// REQUEST SENSE for up to `alloc` bytes.
pub const fn request_sense(alloc: u8) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = op::REQUEST_SENSE;
    c[4] = alloc;
    c
}

/// INQUIRY (standard data) for up to `alloc` bytes.
pub const fn inquiry(alloc: u16) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = op::INQUIRY;
    let a = alloc.to_be_bytes();
    c[3] = a[0];
    c[4] = a[1];
    c
}

const fn rw10(opcode: u8, lba: u32, blocks: u16, fua: bool) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = opcode;
    if fua {
        c[1] = FUA;
    }
    let l = lba.to_be_bytes();
    c[2] = l[0];
    c[3] = l[1];
    c[4] = l[2];
    c[5] = l[3];
    let b = blocks.to_be_bytes();
    c[7] = b[0];
    c[8] = b[1];
    c
}

const fn rw16(opcode: u8, lba: u64, blocks: u32, fua: bool) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = opcode;
    if fua {
        c[1] = FUA;
    }
    let l = lba.to_be_bytes();
    let mut i = 0;
    while i < 8 {
        c[2 + i] = l[i];
        i += 1;
    }
    let b = blocks.to_be_bytes();
    c[10] = b[0];
    c[11] = b[1];
    c[12] = b[2];
    c[13] = b[3];
    c
}

/// READ(10) when `lba` and `blocks` fit its fields, else READ(16).
pub const fn read(lba: u64, blocks: u32, fua: bool) -> Cdb {
    if lba <= u32::MAX as u64 && blocks <= u16::MAX as u32 {
        rw10(op::READ_10, lba as u32, blocks as u16, fua)
    } else {
        rw16(op::READ_16, lba, blocks, fua)
    }
}

/// WRITE(10) when `lba` and `blocks` fit its fields, else WRITE(16).
pub const fn write(lba: u64, blocks: u32, fua: bool) -> Cdb {
    if lba <= u32::MAX as u64 && blocks <= u16::MAX as u32 {
        rw10(op::WRITE_10, lba as u32, blocks as u16, fua)
    } else {
        rw16(op::WRITE_16, lba, blocks, fua)
    }
}

/// READ(16), whatever the LBA.
pub const fn read16(lba: u64, blocks: u32, fua: bool) -> Cdb {
    rw16(op::READ_16, lba, blocks, fua)
}

/// WRITE(16), whatever the LBA.
pub const fn write16(lba: u64, blocks: u32, fua: bool) -> Cdb {
    rw16(op::WRITE_16, lba, blocks, fua)
}

/// SYNCHRONIZE CACHE(10) of the whole logical unit (LBA 0, 0 blocks).
pub const fn synchronize_cache() -> Cdb {
    rw10(op::SYNCHRONIZE_CACHE_10, 0, 0, false)
}

/// UNMAP with a parameter list of `list_len` bytes (see [`unmap_list`]).
pub const fn unmap(list_len: u16) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = op::UNMAP;
    let l = list_len.to_be_bytes();
    c[7] = l[0];
    c[8] = l[1];
    c
}

/// HPB (JESD220-3) operation codes and buffer ids.
pub mod hpb_op {
    /// HPB READ: a READ(10) rewritten to carry the first block's L2P entry.
    pub const HPB_READ: u8 = 0xF8;
    /// HPB READ BUFFER: the L2P entries of one sub-region.
    pub const READ_BUFFER: u8 = 0xF9;
    /// HPB WRITE BUFFER: inactivate regions (host control).
    pub const WRITE_BUFFER: u8 = 0xFA;
    /// READ BUFFER buffer id: L2P entries.
    pub const RB_ENTRIES: u8 = 0x01;
    /// WRITE BUFFER buffer id: inactivate one region.
    pub const WB_INACTIVATE_ONE: u8 = 0x01;
    /// WRITE BUFFER buffer id: inactivate every region.
    pub const WB_INACTIVATE_ALL: u8 = 0x03;
}

/// HPB READ (0xF8) of `blocks` (1..=255) from `lba` with the 8-byte entry of
/// `lba` copied verbatim (big-endian, as READ BUFFER returned it).
pub const fn hpb_read(lba: u32, entry: u64, blocks: u8) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = hpb_op::HPB_READ;
    let l = lba.to_be_bytes();
    let e = entry.to_be_bytes();
    let mut i = 0;
    while i < 4 {
        c[2 + i] = l[i];
        i += 1;
    }
    i = 0;
    while i < 8 {
        c[6 + i] = e[i];
        i += 1;
    }
    c[14] = blocks;
    c
}

/// HPB READ BUFFER (0xF9) of sub-region `srgn` of region `rgn`: `alloc`
/// bytes (24 bits) of 8-byte entries.
pub const fn hpb_read_buffer(rgn: u16, srgn: u16, alloc: u32) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = hpb_op::READ_BUFFER;
    c[1] = hpb_op::RB_ENTRIES;
    let r = rgn.to_be_bytes();
    let s = srgn.to_be_bytes();
    let a = alloc.to_be_bytes();
    c[2] = r[0];
    c[3] = r[1];
    c[4] = s[0];
    c[5] = s[1];
    c[6] = a[1];
    c[7] = a[2];
    c[8] = a[3];
    c
}

/// HPB WRITE BUFFER (0xFA): inactivate region `rgn`, or every region
/// (`None`).
pub const fn hpb_write_buffer(rgn: Option<u16>) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = hpb_op::WRITE_BUFFER;
    match rgn {
        Some(r) => {
            let r = r.to_be_bytes();
            c[1] = hpb_op::WB_INACTIVATE_ONE;
            c[2] = r[0];
            c[3] = r[1];
        }
        None => c[1] = hpb_op::WB_INACTIVATE_ALL,
    }
    c
}

/// Bytes of an UNMAP parameter list with one block descriptor.
pub const UNMAP_LIST_LEN: usize = 24;

/// UNMAP parameter list with one descriptor: `blocks` blocks from `lba`.
pub const fn unmap_list(lba: u64, blocks: u32) -> [u8; UNMAP_LIST_LEN] {
    let mut p = [0u8; UNMAP_LIST_LEN];
    // Data length excludes its own two bytes; block descriptor data length
    // counts the 16-byte descriptors.
    p[1] = (UNMAP_LIST_LEN - 2) as u8;
    p[3] = 16;
    let l = lba.to_be_bytes();
    let mut i = 0;
    while i < 8 {
        p[8 + i] = l[i];
        i += 1;
    }
    let b = blocks.to_be_bytes();
    p[16] = b[0];
    p[17] = b[1];
    p[18] = b[2];
    p[19] = b[3];
    p
}

/// Bytes READ CAPACITY(16) returns that we use.
pub const READ_CAPACITY_16_LEN: usize = 32;

/// READ CAPACITY(16).
pub const fn read_capacity16() -> Cdb {
    let mut c = [0u8; 16];
    c[0] = op::SERVICE_ACTION_IN_16;
    c[1] = SA_READ_CAPACITY_16;
    c[13] = READ_CAPACITY_16_LEN as u8;
    c
}

/// Decoded READ CAPACITY(16) data.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Number of logical blocks (last LBA + 1).
    pub blocks: u64,
    /// Logical block length in bytes.
    pub block_len: u32,
}

impl Capacity {
    /// Decode READ CAPACITY(16) data; `None` when too short, when the last
    /// LBA is u64::MAX (no block count fits) or the block length is zero.
    pub fn parse(d: &[u8]) -> Option<Capacity> {
        if d.len() < 12 {
            return None;
        }
        let blocks = super::be64(d, 0).checked_add(1)?;
        let block_len = super::be32(d, 8);
        (block_len != 0).then_some(Capacity { blocks, block_len })
    }
}

/// REPORT LUNS for up to `alloc` bytes (select report: all LUNs).
pub const fn report_luns(alloc: u32) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = op::REPORT_LUNS;
    let a = alloc.to_be_bytes();
    c[6] = a[0];
    c[7] = a[1];
    c[8] = a[2];
    c[9] = a[3];
    c
}

/// The LUNs of REPORT LUNS data (single-level, peripheral addressing: the
/// LUN is byte 1 of each 8-byte entry). Entries past the data are ignored.
pub fn parse_report_luns(d: &[u8]) -> Vec<u8> {
    if d.len() < 8 {
        return Vec::new();
    }
    let len = super::be32(d, 0) as usize;
    d[8..].chunks_exact(8).take(len / 8).map(|e| e[1]).collect()
}

/// The SCSI status byte of a RESPONSE UPIU.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScsiStatus(pub u8);

impl ScsiStatus {
    /// The command succeeded.
    pub const GOOD: ScsiStatus = ScsiStatus(0x00);
    /// Sense data says what went wrong.
    pub const CHECK_CONDITION: ScsiStatus = ScsiStatus(0x02);
    /// The logical unit is busy.
    pub const BUSY: ScsiStatus = ScsiStatus(0x08);
    /// A reservation conflicts.
    pub const RESERVATION_CONFLICT: ScsiStatus = ScsiStatus(0x18);
    /// The task set is full (queue depth exceeded).
    pub const TASK_SET_FULL: ScsiStatus = ScsiStatus(0x28);
    /// The command was aborted.
    pub const TASK_ABORTED: ScsiStatus = ScsiStatus(0x40);
}

/// Sense keys.
pub mod sense_key {
    /// No sense.
    pub const NO_SENSE: u8 = 0x0;
    /// Recovered error.
    pub const RECOVERED_ERROR: u8 = 0x1;
    /// Not ready.
    pub const NOT_READY: u8 = 0x2;
    /// Medium error.
    pub const MEDIUM_ERROR: u8 = 0x3;
    /// Hardware error.
    pub const HARDWARE_ERROR: u8 = 0x4;
    /// Illegal request (e.g. LBA out of range).
    pub const ILLEGAL_REQUEST: u8 = 0x5;
    /// Unit attention (e.g. power on / reset occurred).
    pub const UNIT_ATTENTION: u8 = 0x6;
    /// Data protect (write protected).
    pub const DATA_PROTECT: u8 = 0x7;
    /// Aborted command.
    pub const ABORTED_COMMAND: u8 = 0xB;
}

/// Sense key, additional sense code and qualifier.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Sense {
    /// Sense key ([`sense_key`]).
    pub key: u8,
    /// Additional sense code.
    pub asc: u8,
    /// Additional sense code qualifier.
    pub ascq: u8,
}

impl Sense {
    /// Decode fixed (0x70/0x71) or descriptor (0x72/0x73) format sense
    /// data; `None` when empty, too short or of another format.
    pub fn parse(d: &[u8]) -> Option<Sense> {
        match d.first()? & 0x7F {
            0x70 | 0x71 if d.len() >= 14 => Some(Sense {
                key: d[2] & 0xF,
                asc: d[12],
                ascq: d[13],
            }),
            0x72 | 0x73 if d.len() >= 4 => Some(Sense {
                key: d[1] & 0xF,
                asc: d[2],
                ascq: d[3],
            }),
            _ => None,
        }
    }
    /// UNIT ATTENTION: the device reports an event (power on, reset) once.
    pub const fn is_unit_attention(&self) -> bool {
        self.key == sense_key::UNIT_ATTENTION
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdbs_match_sbc_byte_positions() {
        let r = read(0x0102_0304, 8, true);
        assert_eq!(&r[..10], &[0x28, FUA, 1, 2, 3, 4, 0, 0, 8, 0]);
        let w = write(1 << 32, 1, false);
        assert_eq!(w[0], op::WRITE_16);
        assert_eq!(&w[2..14], &[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(
            read(0, 0x1_0000, false)[0],
            op::READ_16,
            "65536 blocks need READ(16)"
        );
        let c = read_capacity16();
        assert_eq!((c[0], c[1], c[13]), (0x9E, 0x10, 32));
        assert_eq!(&inquiry(36)[..5], &[0x12, 0, 0, 0, 36]);
        assert_eq!(&report_luns(0x110)[6..10], &[0, 0, 1, 0x10]);
        assert_eq!(synchronize_cache()[0], op::SYNCHRONIZE_CACHE_10);
    }

    #[test]
    fn unmap_list_layout() {
        let p = unmap_list(0x10, 0x20);
        assert_eq!(&p[..4], &[0, 22, 0, 16]);
        assert_eq!(&p[8..20], &[0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0x20]);
        assert_eq!(&unmap(24)[7..9], &[0, 24]);
    }

    #[test]
    fn decodes_capacity_luns_and_sense() {
        let mut d = [0u8; 32];
        d[7] = 0xFF; // last LBA 255
        d[10] = 0x10; // 4096-byte blocks
        assert_eq!(
            Capacity::parse(&d),
            Some(Capacity {
                blocks: 256,
                block_len: 4096
            })
        );
        d[..8].copy_from_slice(&u64::MAX.to_be_bytes());
        assert_eq!(Capacity::parse(&d), None, "a block count that overflows");
        assert_eq!(Capacity::parse(&d[..4]), None);

        let mut l = vec![0u8; 8 + 16];
        l[3] = 16;
        l[9] = 0;
        l[17] = 1;
        assert_eq!(parse_report_luns(&l), vec![0, 1]);
        l[3] = 200; // claims more than is there
        assert_eq!(parse_report_luns(&l), vec![0, 1]);

        let mut s = [0u8; 18];
        s[0] = 0x70;
        s[2] = sense_key::UNIT_ATTENTION;
        s[12] = 0x29;
        let sense = Sense::parse(&s).unwrap();
        assert!(sense.is_unit_attention());
        assert_eq!(sense.asc, 0x29);
        assert_eq!(
            Sense::parse(&[0x72, 5, 0x21, 0]).unwrap().key,
            sense_key::ILLEGAL_REQUEST
        );
        assert_eq!(Sense::parse(&[]), None);
        assert_eq!(Sense::parse(&[0x70, 0, 6]), None);
    }
}
