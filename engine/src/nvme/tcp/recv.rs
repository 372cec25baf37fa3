//! A connection's receive buffer: fixed capacity, allocated once, PDUs
//! parsed in place where they were received.
//!
//! The socket reads into [`RecvBuf::spare`], [`RecvBuf::commit`] records
//! what arrived, [`RecvBuf::peek`] parses the PDU at the front (borrowing
//! the buffer) and [`RecvBuf::consume`] drops it. A PDU cut by the end of a
//! receive stays where it is until the rest arrives; the only copy is the
//! move of such a partial PDU to the front when the buffer's end is
//! reached ([`RecvBuf::spare`] does it), never of a whole batch.

use super::pdu::{parse, Direction, Negotiated, Parse, PduError};

/// A fixed-capacity receive buffer (see the module docs).
pub struct RecvBuf {
    buf: Box<[u8]>,
    head: usize,
    tail: usize,
}

impl std::fmt::Debug for RecvBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBuf")
            .field("capacity", &self.buf.len())
            .field("buffered", &self.len())
            .finish()
    }
}

impl RecvBuf {
    /// A buffer of `capacity` bytes: at least the largest PDU the
    /// connection accepts, more to batch several PDUs per receive.
    pub fn with_capacity(capacity: usize) -> Self {
        RecvBuf {
            buf: vec![0u8; capacity].into_boxed_slice(),
            head: 0,
            tail: 0,
        }
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Bytes received and not yet consumed.
    pub fn len(&self) -> usize {
        self.tail - self.head
    }

    /// Whether nothing is buffered.
    pub fn is_empty(&self) -> bool {
        self.head == self.tail
    }

    /// The bytes received and not yet consumed.
    pub fn buffered(&self) -> &[u8] {
        &self.buf[self.head..self.tail]
    }

    /// Where the next receive goes. Moves a partial PDU to the front
    /// first when the free space at the end is smaller than the space
    /// before it. Empty only when the buffer is full of unparsed bytes.
    pub fn spare(&mut self) -> &mut [u8] {
        if self.head == self.tail {
            self.head = 0;
            self.tail = 0;
        } else if self.buf.len() - self.tail < self.head {
            self.buf.copy_within(self.head..self.tail, 0);
            self.tail -= self.head;
            self.head = 0;
        }
        &mut self.buf[self.tail..]
    }

    /// Record that `n` bytes were received into [`RecvBuf::spare`]
    /// (clamped to the spare room).
    pub fn commit(&mut self, n: usize) {
        self.tail = (self.tail + n).min(self.buf.len());
    }

    /// Parse the PDU at the front. A PDU that needs more bytes than the
    /// buffer can ever hold is [`PduError::PlenTooLarge`].
    pub fn peek(&self, direction: Direction, neg: &Negotiated) -> Result<Parse<'_>, PduError> {
        let p = parse(self.buffered(), direction, neg)?;
        if let Parse::Incomplete { need } = p {
            if need > self.buf.len() {
                return Err(PduError::PlenTooLarge {
                    plen: need.min(u32::MAX as usize) as u32,
                    max: self.buf.len().min(u32::MAX as usize) as u32,
                });
            }
        }
        Ok(p)
    }

    /// Drop `n` bytes from the front (a parsed PDU's length; clamped).
    pub fn consume(&mut self, n: usize) {
        self.head = (self.head + n).min(self.tail);
    }
}

#[cfg(test)]
mod tests {
    use super::super::digest::Digests;
    use super::super::pdu::{pdu_type, write_data, write_r2t, DataPdu, Pdu};
    use super::*;
    use proptest::prelude::*;

    fn stream(n: &Negotiated, sizes: &[usize]) -> Vec<u8> {
        let mut s = Vec::new();
        for (i, &len) in sizes.iter().enumerate() {
            let mut out = vec![0u8; len + 128];
            let d = DataPdu {
                pdu_type: pdu_type::C2H_DATA,
                cccid: i as u16,
                ttag: 0,
                datao: 0,
                last: true,
                success: false,
            };
            let k = write_data(&mut out, &d, &vec![i as u8; len], n).unwrap();
            s.extend_from_slice(&out[..k]);
            let k = write_r2t(&mut out, i as u16, 1, 0, 512, n).unwrap();
            s.extend_from_slice(&out[..k]);
        }
        s
    }

    /// Feed `s` in receives of the sizes `reads` (cycled) into a buffer of
    /// `cap` bytes; the CIDs of the data PDUs parsed, in order.
    fn run(s: &[u8], reads: &[usize], cap: usize, n: &Negotiated) -> Result<Vec<u16>, PduError> {
        let mut rb = RecvBuf::with_capacity(cap);
        let mut at = 0;
        let mut cids = Vec::new();
        let mut i = 0;
        loop {
            loop {
                let len = match rb.peek(Direction::ControllerToHost, n)? {
                    Parse::Incomplete { .. } => break,
                    Parse::Complete { pdu, len } => {
                        if let Pdu::Data { cccid, data, .. } = pdu {
                            assert!(data.iter().all(|&b| b == cccid as u8));
                            cids.push(cccid);
                        }
                        len
                    }
                };
                rb.consume(len);
            }
            if at == s.len() {
                return Ok(cids);
            }
            let spare = rb.spare();
            assert!(!spare.is_empty(), "a partial PDU never fills the buffer");
            let k = reads[i % reads.len()]
                .clamp(1, spare.len())
                .min(s.len() - at);
            spare[..k].copy_from_slice(&s[at..at + k]);
            rb.commit(k);
            at += k;
            i += 1;
        }
    }

    #[test]
    fn a_pdu_larger_than_the_buffer_is_an_error_not_a_stall() {
        let n = Negotiated {
            digests: Digests::NONE,
            hpda: 0,
            cpda: 0,
            max_data: 1 << 20,
        };
        let s = stream(&n, &[5000]);
        assert!(matches!(
            run(&s, &[4096], 4096, &n),
            Err(PduError::PlenTooLarge { max: 4096, .. })
        ));
        assert_eq!(run(&s, &[4096], 8192, &n), Ok(vec![0]));
    }

    #[test]
    fn consume_and_commit_clamp() {
        let mut rb = RecvBuf::with_capacity(16);
        rb.commit(100);
        assert_eq!(rb.len(), 16);
        rb.consume(100);
        assert!(rb.is_empty());
        assert_eq!(rb.spare().len(), 16);
    }

    proptest! {
        #[test]
        fn any_receive_sizes_parse_every_pdu_once(sizes in proptest::collection::vec(1usize..3000, 1..8), reads in proptest::collection::vec(1usize..5000, 1..8), hd in any::<bool>(), dd in any::<bool>()) {
            let n = Negotiated { digests: Digests { header: hd, data: dd }, hpda: 0, cpda: 0, max_data: 1 << 20 };
            let s = stream(&n, &sizes);
            let cids = run(&s, &reads, 3100 + 64, &n).unwrap();
            prop_assert_eq!(cids, (0..sizes.len() as u16).collect::<Vec<_>>());
        }
    }
}
