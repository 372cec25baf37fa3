//! Discovery: which subsystems an NVMe/TCP port offers.
//!
//! [`discover`] connects to the port's discovery controller (the
//! well-known NQN [`DISCOVERY_NQN`], admin queue only), enables it, and
//! reads the Discovery Log Page (log 0x70) whole: a 1024-byte header
//! (GENCTR, NUMREC, RECFMT) then NUMREC entries of 1024 bytes. The log may
//! change while it is read in pieces, so the header is read first, then
//! the header with every entry it announces, then the header again; the
//! log is taken only if GENCTR and NUMREC did not move in between
//! (otherwise read again, at most [`DISCOVERY_ATTEMPTS`] times). The
//! connection is closed at the end; a discovery controller keeps no state
//! worth a Disconnect.

use std::net::SocketAddr;

use super::conn::Conn;
use super::controller::{connect_queue, enable, AdminConn, TcpOptions};
use super::error::TcpError;
use super::fabrics;
use crate::core::error::{Error, Result};
use crate::nvme::host::identify::Exchange;
use crate::nvme::spec::sqe::{Command, GetLogPage};

/// The well-known NQN of a discovery controller.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// Log identifier of the Discovery Log Page.
pub const LOG_DISCOVERY: u8 = 0x70;
/// Bytes of the log's header and of each entry.
pub const RECORD_BYTES: usize = 1024;
/// Entries read at most (a 1 MiB log): a larger NUMREC is refused.
pub const MAX_RECORDS: u64 = 1023;
/// Reads of the whole log before a log that keeps changing is an error.
pub const DISCOVERY_ATTEMPTS: u32 = 4;
/// Bytes one Get Log Page reads at most.
const CHUNK: usize = 64 << 10;

/// One Discovery Log Page entry (the fields a host needs to connect).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// Transport type (3: TCP, 1: RDMA, 2: Fibre Channel, 0xFE: loop).
    pub trtype: u8,
    /// Address family (1: IPv4, 2: IPv6).
    pub adrfam: u8,
    /// Subsystem type (1: a referral to another discovery service, 2: an
    /// NVM subsystem, 3: this discovery controller itself).
    pub subtype: u8,
    /// Transport requirements (secure channel, SQ flow control).
    pub treq: u8,
    /// Port id.
    pub portid: u16,
    /// Controller id (0xFFFF: dynamic).
    pub cntlid: u16,
    /// Admin submission queue size the target supports.
    pub asqsz: u16,
    /// Transport service id (for TCP the port number), as text.
    pub trsvcid: String,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Transport address (for TCP the IP address), as text.
    pub traddr: String,
}

impl DiscoveryEntry {
    /// The transport's name (`tcp`, `rdma`, `fc`, `loop`, or its number).
    pub fn trtype_name(&self) -> String {
        match self.trtype {
            1 => "rdma".into(),
            2 => "fc".into(),
            3 => "tcp".into(),
            0xFE => "loop".into(),
            n => format!("trtype {n}"),
        }
    }

    /// The subsystem type's name.
    pub fn subtype_name(&self) -> String {
        match self.subtype {
            1 => "referral".into(),
            2 => "nvme".into(),
            3 => "discovery".into(),
            n => format!("subtype {n}"),
        }
    }

    /// Decode one 1024-byte entry.
    pub fn parse(e: &[u8]) -> Option<Self> {
        if e.len() < RECORD_BYTES {
            return None;
        }
        let u16_at = |at: usize| u16::from_le_bytes([e[at], e[at + 1]]);
        Some(DiscoveryEntry {
            trtype: e[0],
            adrfam: e[1],
            subtype: e[2],
            treq: e[3],
            portid: u16_at(4),
            cntlid: u16_at(6),
            asqsz: u16_at(8),
            trsvcid: text(&e[32..64]),
            subnqn: text(&e[256..512]),
            traddr: text(&e[512..768]),
        })
    }
}

/// A fixed-size ASCII field: up to the first NUL, trailing spaces dropped,
/// anything not printable ASCII shown as `?`.
fn text(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    b[..end]
        .iter()
        .map(|&c| {
            if c.is_ascii_graphic() || c == b' ' {
                c as char
            } else {
                '?'
            }
        })
        .collect::<String>()
        .trim_end()
        .to_string()
}

/// A Discovery Log Page read whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryLog {
    /// Generation counter of the log as read.
    pub genctr: u64,
    /// Record format.
    pub recfmt: u16,
    /// The entries, NUMREC of them.
    pub entries: Vec<DiscoveryEntry>,
}

/// GENCTR, NUMREC and RECFMT of a log header.
fn header(h: &[u8]) -> (u64, u64, u16) {
    let u64_at = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&h[at..at + 8]);
        u64::from_le_bytes(b)
    };
    (u64_at(0), u64_at(8), u16::from_le_bytes([h[16], h[17]]))
}

fn bad(detail: String) -> Error {
    Error::BadDevice {
        what: "Discovery Log Page",
        detail,
    }
}

/// Read `out.len()` bytes of the discovery log from `offset`, in pieces of
/// at most [`CHUNK`].
fn read_log(a: &mut AdminConn, offset: usize, out: &mut [u8]) -> Result<()> {
    let mut at = 0;
    while at < out.len() {
        let n = (out.len() - at).min(CHUNK);
        let cmd = GetLogPage::new(LOG_DISCOVERY, n as u32)
            .nsid(0)
            .offset((offset + at) as u64);
        a.exchange(
            cmd.sqe(),
            Some(&mut out[at..at + n]),
            "Get Log Page (Discovery)",
        )?;
        at += n;
    }
    Ok(())
}

/// Read the discovery log whole (see the module docs) on an enabled
/// discovery controller.
fn read_whole(a: &mut AdminConn) -> Result<DiscoveryLog> {
    let mut h = [0u8; RECORD_BYTES];
    let mut last = None;
    for _ in 0..DISCOVERY_ATTEMPTS {
        read_log(a, 0, &mut h)?;
        let (genctr, numrec, _) = header(&h);
        if numrec > MAX_RECORDS {
            return Err(bad(format!(
                "NUMREC {numrec} is more than the {MAX_RECORDS} entries read"
            )));
        }
        // `numrec <= MAX_RECORDS`: the product is at most 1 MiB.
        let mut log = vec![0u8; (numrec as usize + 1) * RECORD_BYTES];
        read_log(a, 0, &mut log)?;
        read_log(a, 0, &mut h)?;
        let (g_all, n_all, recfmt) = header(&log[..RECORD_BYTES]);
        let (g_after, n_after, _) = header(&h);
        if (g_all, n_all) == (genctr, numrec) && (g_after, n_after) == (genctr, numrec) {
            let entries = log[RECORD_BYTES..]
                .chunks_exact(RECORD_BYTES)
                .filter_map(DiscoveryEntry::parse)
                .collect();
            return Ok(DiscoveryLog {
                genctr,
                recfmt,
                entries,
            });
        }
        last = Some((genctr, g_all, g_after));
    }
    let (g0, g1, g2) = last.unwrap_or_default();
    Err(bad(format!(
        "the log changed during each of {DISCOVERY_ATTEMPTS} reads (GENCTR {g0}, then {g1}, then {g2})"
    )))
}

/// List what the port at `addr` offers: connect to its discovery
/// controller with `opts` (its host NQN, digests, timeouts; its subsystem
/// NQN and KATO are not used) and read the Discovery Log Page whole.
pub fn discover(addr: SocketAddr, opts: &TcpOptions) -> Result<DiscoveryLog> {
    let t = opts.admin_timeout;
    let mut conn = Conn::open(addr, opts.digests(), opts.maxr2t, 1 << 16, 0, t)
        .map_err(TcpError::into_error)?;
    let o = TcpOptions {
        subnqn: DISCOVERY_NQN.into(),
        ..opts.clone()
    };
    // KATO 0: this connection lives only for the few commands below.
    connect_queue(&mut conn, &o, 0, 32, fabrics::CNTLID_DYNAMIC, 0)?;
    let mut a = AdminConn::new(conn, t);
    let r = enable(&mut a).and_then(|_| read_whole(&mut a));
    a.conn.close();
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_decodes_its_fields_and_trims_its_text() {
        let mut e = vec![0u8; RECORD_BYTES];
        e[0] = 3;
        e[1] = 1;
        e[2] = 2;
        e[4..6].copy_from_slice(&7u16.to_le_bytes());
        e[6..8].copy_from_slice(&0xFFFFu16.to_le_bytes());
        e[8..10].copy_from_slice(&128u16.to_le_bytes());
        e[32..64].fill(b' ');
        e[32..36].copy_from_slice(b"4420");
        e[256..266].copy_from_slice(b"nqn.x:sub\x01");
        e[512..521].copy_from_slice(b"127.0.0.1");
        let d = DiscoveryEntry::parse(&e).unwrap();
        assert_eq!(d.trtype_name(), "tcp");
        assert_eq!(d.subtype_name(), "nvme");
        assert_eq!((d.adrfam, d.portid, d.cntlid, d.asqsz), (1, 7, 0xFFFF, 128));
        assert_eq!(d.trsvcid, "4420");
        assert_eq!(d.subnqn, "nqn.x:sub?");
        assert_eq!(d.traddr, "127.0.0.1");
        assert!(DiscoveryEntry::parse(&e[..1023]).is_none());
    }
}
