//! Teardown: [`TcpQueuePair::close`] and `Drop` (the core's
//! `Lifecycle::shutdown`; the socket is shut down, no Disconnect).

use super::TcpQueuePair;
use crate::core::error::Result;
use crate::core::io::{Completion, IoBuf};
use crate::core::qpair::Lifecycle;

impl<B: IoBuf> TcpQueuePair<B> {
    /// Close: let the commands in flight finish (bounded by the admin
    /// timeout), shut the connection down (as Linux's initiator closes an
    /// I/O queue: no Disconnect), and end what is left once with
    /// [`IoError::Aborted`](crate::core::io::IoError::Aborted).
    pub fn close(mut self, mut f: impl FnMut(Completion<B>)) -> Result<()> {
        self.shutdown(&mut f)
    }
}

impl<B: IoBuf> Drop for TcpQueuePair<B> {
    fn drop(&mut self) {
        let _ = self.shutdown(&mut drop);
    }
}
