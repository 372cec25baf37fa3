//! What the NVMe/TCP test files share: bring-up against the fake target,
//! queue pairs, data patterns and the typed error inside a transport
//! error.

use std::sync::Arc;
use std::time::Duration;

use mcqio::nvme::tcp::{TcpController, TcpError, TcpOptions, TcpQueuePair};
use mcqio::{Error, QpairOptions, WaitPolicy};
use mcqio_fixtures::tcp::{FakeTcpTarget, TcpTargetConfig};

pub fn start(cfg: TcpTargetConfig) -> FakeTcpTarget {
    FakeTcpTarget::start(cfg).expect("fake target starts")
}

/// Bring the target's subsystem up with `o` (a 5 s admin timeout).
pub fn connect(t: &FakeTcpTarget, o: TcpOptions) -> Arc<TcpController> {
    TcpController::connect(
        t.addr(),
        TcpOptions {
            subnqn: t.subnqn().into(),
            admin_timeout: Duration::from_secs(5),
            ..o
        },
    )
    .expect("bring-up")
}

/// A queue pair `depth` deep, no I/O timeout.
pub fn qpair(c: &Arc<TcpController>, depth: u16, wait: WaitPolicy) -> TcpQueuePair {
    c.create_qpair(QpairOptions {
        depth,
        wait,
        io_timeout: None,
        ..Default::default()
    })
    .expect("queue pair")
}

pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(29).wrapping_add(seed * 7) as u8 ^ (i >> 8) as u8)
        .collect()
}

/// The typed error inside an `Error::Transport`.
pub fn tcp_error(e: &Error) -> TcpError {
    match e {
        Error::Transport(b) => *b.downcast_ref::<TcpError>().expect("a TcpError"),
        other => panic!("expected a transport error, got {other:?}"),
    }
}
