//! [`TcpOptions`]: how to reach and bring up a target.

use std::time::Duration;

use crate::nvme::tcp::digest::Digests;

/// How to reach and bring up a target.
#[derive(Clone, Debug)]
pub struct TcpOptions {
    /// The subsystem NQN to connect to.
    pub subnqn: String,
    /// Our host NQN.
    pub hostnqn: String,
    /// Our host identifier.
    pub hostid: [u8; 16],
    /// Ask for header digests (CRC32C over every PDU header).
    pub header_digest: bool,
    /// Ask for data digests (CRC32C over every PDU's data).
    pub data_digest: bool,
    /// Keep Alive Timeout sent in the admin Connect (`ZERO`: none). Keep
    /// Alive commands go out every KATO/2 (see the module docs).
    pub kato: Duration,
    /// I/O queues to ask for in Set Features (Number of Queues).
    pub io_queues: u16,
    /// Bound on connecting, negotiating and each admin command.
    pub admin_timeout: Duration,
    /// Cap on bytes per I/O command (the effective limit is the smaller of
    /// this and MDTS); larger transfers are split.
    pub max_transfer: u64,
    /// R2Ts per command we accept outstanding, 0's based (ICReq MAXR2T).
    pub maxr2t: u32,
    /// Bound on the shutdown handshake at drop.
    pub shutdown_timeout: Duration,
    /// With data digests, cap each command at MAXH2CDATA so its write data
    /// goes in one H2CData. Linux's nvmet-tcp checks every H2CData's data
    /// digest against the digest of the command's whole data, and drops
    /// the association when a write comes in several (its own initiator
    /// never sends more than 4 MiB, its MAXH2CDATA). Off: commands up to
    /// `max_transfer` and MDTS, H2CData as the spec allows.
    pub one_h2c_with_data_digest: bool,
    /// Cap each command's transfer at the target's MAXH2CDATA (larger
    /// transfers are split, as above `max_transfer`). Linux's nvmet-tcp,
    /// once it bounds the buffer it allocates per command (Debian's
    /// 6.12.117 has it, 6.12.95 not), answers any command whose data SGL is
    /// longer than its MAXH2CDATA (4 MiB) with Data SGL Length Invalid,
    /// reads too. Its own initiator never sends more, nor does SPDK's
    /// (whose MAXH2CDATA is its I/O unit). Off: commands up to
    /// `max_transfer` and MDTS, as the spec allows.
    pub within_maxh2cdata: bool,
    /// Coalesce receives on I/O queue pairs (`tcp::pace`): after a receive
    /// that brought answers, hold the next for a learnt number of polls so
    /// one `recv` takes about three quarters of what is in flight (fewer
    /// system calls per I/O, at the price of up to that hold of delay; a
    /// lone command is never held). Off: receive on every poll with
    /// commands in flight, backing off only after empty receives.
    pub recv_pacing: bool,
}

impl Default for TcpOptions {
    fn default() -> Self {
        TcpOptions {
            subnqn: String::new(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:6d637169-6f00-4000-8000-000000000001".into(),
            hostid: *b"mcqio-host-id-01",
            header_digest: false,
            data_digest: false,
            kato: Duration::from_secs(10),
            io_queues: 4,
            admin_timeout: Duration::from_secs(10),
            max_transfer: 128 << 10,
            maxr2t: 3,
            shutdown_timeout: Duration::from_secs(2),
            one_h2c_with_data_digest: true,
            within_maxh2cdata: true,
            recv_pacing: true,
        }
    }
}

impl TcpOptions {
    /// The digests asked for.
    pub fn digests(&self) -> Digests {
        Digests {
            header: self.header_digest,
            data: self.data_digest,
        }
    }
}
