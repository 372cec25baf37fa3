//! Header and data digests: CRC32C (Castagnoli), seeded with all ones and
//! inverted at the end, stored little-endian after the header (HDGST) or
//! after the data (DDGST). The header digest covers the `hlen` header
//! bytes; the data digest covers the PDU data only (not the padding before
//! it).

/// Bytes one digest takes on the wire.
pub const DIGEST_BYTES: usize = 4;

/// Which digests a connection uses (negotiated in ICReq/ICResp; the
/// `dgst` byte of both: bit 0 header, bit 1 data).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Digests {
    /// HDGST: a CRC32C after the header of every PDU but ICReq/ICResp and
    /// TermReq.
    pub header: bool,
    /// DDGST: a CRC32C after the data of every PDU that carries data.
    pub data: bool,
}

impl Digests {
    /// No digests.
    pub const NONE: Digests = Digests {
        header: false,
        data: false,
    };
    /// Both digests.
    pub const BOTH: Digests = Digests {
        header: true,
        data: true,
    };
    /// The `dgst` byte of ICReq/ICResp.
    pub const fn to_byte(self) -> u8 {
        (self.header as u8) | (self.data as u8) << 1
    }
    /// Decode the `dgst` byte (reserved bits ignored).
    pub const fn from_byte(b: u8) -> Self {
        Digests {
            header: b & 1 != 0,
            data: b & 2 != 0,
        }
    }
    /// Bytes of the header digest (0 or 4).
    pub const fn header_len(self) -> usize {
        if self.header {
            DIGEST_BYTES
        } else {
            0
        }
    }
    /// Bytes of the data digest (0 or 4).
    pub const fn data_len(self) -> usize {
        if self.data {
            DIGEST_BYTES
        } else {
            0
        }
    }
}

/// The CRC32C digest of `bytes` (hardware-accelerated where the CPU has it).
#[inline]
pub fn crc32c(bytes: &[u8]) -> u32 {
    ::crc32c::crc32c(bytes)
}

/// A data digest computed piece by piece, for data that is placed
/// straight into a command's buffer as it arrives (one receive at a time)
/// rather than parsed whole from the receive buffer.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct DataDigest(u32);

impl DataDigest {
    /// The digest of no bytes.
    pub const fn new() -> Self {
        DataDigest(0)
    }
    /// Append `bytes`.
    #[inline]
    pub fn update(&mut self, bytes: &[u8]) {
        self.0 = ::crc32c::crc32c_append(self.0, bytes);
    }
    /// The digest of everything appended.
    pub const fn value(&self) -> u32 {
        self.0
    }
    /// Whether the 4 wire bytes that followed the data match.
    pub fn matches(&self, wire: [u8; 4]) -> bool {
        u32::from_le_bytes(wire) == self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_value_and_known_vectors() {
        // The CRC-32C check value (RFC 3720 appendix B.4 test patterns).
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xFFu8; 32]), 0x62A8_AB43);
        let inc: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c(&inc), 0x46DD_794E);
        assert_eq!(crc32c(&[]), 0);
    }

    #[test]
    fn incremental_digest_equals_whole() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 13 + 7) as u8).collect();
        for cut in [0, 1, 3, 64, 4095, 5000] {
            let mut d = DataDigest::new();
            d.update(&data[..cut]);
            d.update(&data[cut..]);
            assert_eq!(d.value(), crc32c(&data), "cut at {cut}");
            assert!(d.matches(crc32c(&data).to_le_bytes()));
        }
    }

    #[test]
    fn dgst_byte_round_trips() {
        for b in 0..4u8 {
            assert_eq!(Digests::from_byte(b).to_byte(), b);
        }
        assert_eq!(Digests::BOTH.header_len() + Digests::BOTH.data_len(), 8);
        assert_eq!(Digests::NONE.header_len() + Digests::NONE.data_len(), 0);
    }
}
