//! PDU codec tests: round trips, every malformed case, split receives.

use proptest::prelude::*;

use super::digest::Digests;
use super::pdu::*;
use crate::nvme::spec::{Cqe, Sqe};

const H2C: Direction = Direction::HostToController;
const C2H: Direction = Direction::ControllerToHost;

fn neg(digests: Digests, hpda: u8, cpda: u8) -> Negotiated {
    Negotiated {
        digests,
        hpda,
        cpda,
        max_data: 64 * 1024,
    }
}

fn one<'a>(buf: &'a [u8], dir: Direction, n: &Negotiated) -> Result<(Pdu<'a>, usize), PduError> {
    match parse(buf, dir, n)? {
        Parse::Complete { pdu, len } => Ok((pdu, len)),
        Parse::Incomplete { need } => panic!("incomplete: need {need} of {}", buf.len()),
    }
}

fn c2h_data_into(out: &mut [u8], n: &Negotiated, data: &[u8]) -> usize {
    let pdu = DataPdu {
        pdu_type: pdu_type::C2H_DATA,
        cccid: 1,
        ttag: 0,
        datao: 0,
        last: true,
        success: true,
    };
    write_data(out, &pdu, data, n).unwrap()
}

fn c2h_data(n: &Negotiated, data: &[u8], last: bool, success: bool) -> Vec<u8> {
    let mut out = vec![0u8; 512 + data.len()];
    let pdu = DataPdu {
        pdu_type: pdu_type::C2H_DATA,
        cccid: 9,
        ttag: 0,
        datao: 4096,
        last,
        success,
    };
    let len = write_data(&mut out, &pdu, data, n).unwrap();
    out.truncate(len);
    out
}

#[test]
fn ic_req_and_resp_round_trip() {
    let mut b = [0u8; 128];
    assert_eq!(write_ic_req(&mut b, 3, Digests::BOTH, 7).unwrap(), 128);
    let (p, len) = one(&b, H2C, &Negotiated::INITIAL).unwrap();
    assert_eq!(len, 128);
    let Pdu::IcReq(r) = p else { panic!("{p:?}") };
    assert_eq!(
        (r.hpda, Digests::from_byte(r.dgst), r.maxr2t),
        (3, Digests::BOTH, 7)
    );
    write_ic_resp(&mut b, 1, Digests::BOTH, 131072).unwrap();
    let (p, _) = one(&b, C2H, &Negotiated::INITIAL).unwrap();
    let Pdu::IcResp(r) = p else { panic!("{p:?}") };
    assert_eq!((r.cpda, r.maxh2cdata), (1, 131072));
    assert_eq!(
        write_ic_req(&mut b, 32, Digests::NONE, 0),
        Err(BuildError::BadPda(32))
    );
    assert!(matches!(
        write_ic_req(&mut b[..100], 0, Digests::NONE, 0),
        Err(BuildError::BufferTooSmall {
            need: 128,
            have: 100
        })
    ));
}

#[test]
fn ic_resp_parameters_checked() {
    let mut b = [0u8; 128];
    write_ic_resp(&mut b, 0, Digests::NONE, 4000).unwrap();
    assert_eq!(
        parse(&b, C2H, &Negotiated::INITIAL),
        Err(PduError::BadMaxH2cData(4000))
    );
    write_ic_resp(&mut b, 0, Digests::NONE, 4098).unwrap();
    assert_eq!(
        parse(&b, C2H, &Negotiated::INITIAL),
        Err(PduError::BadMaxH2cData(4098))
    );
    write_ic_resp(&mut b, 0, Digests::NONE, 8192).unwrap();
    b[8] = 1;
    assert_eq!(
        parse(&b, C2H, &Negotiated::INITIAL),
        Err(PduError::UnsupportedPfv(1))
    );
    b[8] = 0;
    b[10] = 40;
    assert_eq!(
        parse(&b, C2H, &Negotiated::INITIAL),
        Err(PduError::BadPda(40))
    );
    b[10] = 0;
    b[4..8].copy_from_slice(&132u32.to_le_bytes());
    assert!(matches!(
        parse(&b, C2H, &Negotiated::INITIAL),
        Err(PduError::BadPlen {
            plen: 132,
            expected: 128,
            ..
        })
    ));
}

#[test]
fn capsule_cmd_with_in_capsule_data_every_digest_and_alignment() {
    let sqe = Sqe::with_opcode(0x01).with_cid(0x42).with_nsid(1);
    let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
    for digests in [
        Digests::NONE,
        Digests {
            header: true,
            data: false,
        },
        Digests {
            header: false,
            data: true,
        },
        Digests::BOTH,
    ] {
        for cpda in [0u8, 1, 3, 15] {
            let n = neg(digests, 0, cpda);
            let mut out = vec![0u8; 2048];
            let len = write_capsule_cmd(&mut out, &sqe, &data, &n).unwrap();
            let pdo = out[3] as usize;
            assert_eq!(pdo % pda_alignment(cpda), 0);
            assert!(pdo >= 72 + digests.header_len());
            assert_eq!(len, pdo + data.len() + digests.data_len());
            let (p, used) = one(&out[..len], H2C, &n).unwrap();
            assert_eq!(used, len);
            assert_eq!(p, Pdu::CapsuleCmd { sqe, data: &data });
            // The header-only writer agrees with the whole-PDU writer.
            let mut head = vec![0u8; 256];
            let layout = write_capsule_cmd_header(&mut head, &sqe, data.len(), &n).unwrap();
            assert_eq!(layout.plen, len);
            assert_eq!(&head[..layout.pdo], &out[..layout.pdo]);
            if digests.data {
                assert_eq!(data_digest_bytes(&data), out[len - 4..len]);
            }
        }
    }
    // Without data: no DDGSTF, plen = header (+ digest).
    let n = neg(Digests::BOTH, 0, 0);
    let mut out = [0u8; 128];
    let len = write_capsule_cmd(&mut out, &sqe, &[], &n).unwrap();
    assert_eq!(len, 76);
    assert_eq!(out[1], flags::HDGSTF);
    assert_eq!(
        one(&out[..len], H2C, &n).unwrap().0,
        Pdu::CapsuleCmd { sqe, data: &[] }
    );
}

#[test]
fn resp_r2t_term_round_trip() {
    let n = neg(Digests::BOTH, 0, 0);
    let cqe = Cqe {
        dw0: 5,
        cid: 0x42,
        status: 0x0002 << 1,
        ..Default::default()
    };
    let mut out = [0u8; 256];
    let len = write_capsule_resp(&mut out, &cqe, &n).unwrap();
    assert_eq!(len, 28);
    assert_eq!(
        one(&out[..len], C2H, &n).unwrap().0,
        Pdu::CapsuleResp { cqe }
    );
    let len = write_r2t(&mut out, 7, 3, 8192, 4096, &n).unwrap();
    assert_eq!(
        one(&out[..len], C2H, &n).unwrap().0,
        Pdu::R2t {
            cccid: 7,
            ttag: 3,
            r2to: 8192,
            r2tl: 4096
        }
    );
    let bad = [0xAAu8; 200];
    let len = write_term_req(
        &mut out,
        pdu_type::C2H_TERM_REQ,
        fes::HEADER_DIGEST_ERROR,
        0,
        &bad,
    )
    .unwrap();
    assert_eq!(len, 152, "the copied header is cut at 128 bytes");
    let (p, _) = one(&out[..len], C2H, &n).unwrap();
    assert_eq!(
        p,
        Pdu::TermReq {
            pdu_type: pdu_type::C2H_TERM_REQ,
            fes: fes::HEADER_DIGEST_ERROR,
            fei: 0,
            header: &bad[..128]
        }
    );
}

#[test]
fn c2h_data_flags_and_offsets() {
    let n = neg(Digests::BOTH, 1, 0);
    let data = vec![0x5Au8; 3000];
    let b = c2h_data(&n, &data, true, true);
    assert_eq!(b[3] as usize % 8, 0, "HPDA 1 is 8-byte alignment");
    let (p, _) = one(&b, C2H, &n).unwrap();
    assert_eq!(
        p,
        Pdu::Data {
            pdu_type: pdu_type::C2H_DATA,
            cccid: 9,
            ttag: 0,
            datao: 4096,
            last: true,
            success: true,
            data: &data
        }
    );
    let b = c2h_data(&n, &data, false, true);
    assert_eq!(parse(&b, C2H, &n), Err(PduError::SuccessWithoutLast));
}

#[test]
fn every_malformed_header_is_typed() {
    let n = neg(Digests::BOTH, 0, 0);
    let data = vec![1u8; 512];
    let good = c2h_data(&n, &data, true, false);
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        f(&mut b);
        // Fix the header digest so only the field under test is wrong.
        if b[1] & flags::HDGSTF != 0 && b.len() >= 28 {
            let d = super::digest::crc32c(&b[..24]);
            b[24..28].copy_from_slice(&d.to_le_bytes());
        }
        parse(&b, C2H, &n).map(|_| ())
    };
    assert_eq!(with(&|b| b[0] = 0x08), Err(PduError::UnknownType(0x08)));
    assert_eq!(with(&|b| b[0] = 0x7E), Err(PduError::UnknownType(0x7E)));
    assert_eq!(
        with(&|b| b[0] = pdu_type::H2C_DATA),
        Err(PduError::WrongDirection(pdu_type::H2C_DATA))
    );
    assert_eq!(
        with(&|b| b[2] = 72),
        Err(PduError::BadHlen {
            pdu_type: pdu_type::C2H_DATA,
            hlen: 72,
            expected: 24
        })
    );
    assert_eq!(
        with(&|b| b[1] &= !flags::HDGSTF),
        Err(PduError::HeaderDigestFlag {
            flag: false,
            negotiated: true
        })
    );
    assert_eq!(
        with(&|b| b[1] &= !flags::DDGSTF),
        Err(PduError::DataDigestFlag {
            flag: false,
            negotiated: true
        })
    );
    assert_eq!(
        with(&|b| b[4..8].copy_from_slice(&20u32.to_le_bytes())),
        Err(PduError::PlenTooSmall { plen: 20, min: 28 })
    );
    assert!(matches!(
        with(&|b| b[4..8].copy_from_slice(&u32::MAX.to_le_bytes())),
        Err(PduError::PlenTooLarge { plen: u32::MAX, .. })
    ));
    assert_eq!(
        with(&|b| b[3] = 24),
        Err(PduError::PdoInsideHeader {
            pdo: 24,
            header_end: 28
        })
    );
    assert_eq!(
        with(&|b| b[3] = 30),
        Err(PduError::PdoMisaligned {
            pdo: 30,
            alignment: 4
        })
    );
    let plen = good.len() as u32;
    assert_eq!(
        with(&|b| {
            b[4..8].copy_from_slice(&32u32.to_le_bytes());
            b.truncate(32)
        }),
        Err(PduError::PdoPastEnd { pdo: 28, plen: 32 })
    );
    assert_eq!(
        with(&|b| b[16..20].copy_from_slice(&513u32.to_le_bytes())),
        Err(PduError::DatalMismatch {
            datal: 513,
            carried: 512
        })
    );
    // Corrupt the header digest itself (not refixed: flip after the fix).
    let mut b = good.clone();
    b[25] ^= 0x10;
    assert!(matches!(
        parse(&b, C2H, &n),
        Err(PduError::HeaderDigest { .. })
    ));
    let mut b = good.clone();
    b[100] ^= 1;
    assert!(matches!(
        parse(&b, C2H, &n),
        Err(PduError::DataDigest { .. })
    ));
    let mut b = good.clone();
    let last = b.len() - 1;
    b[last] ^= 0x80;
    assert!(matches!(
        parse(&b, C2H, &n),
        Err(PduError::DataDigest { .. })
    ));
    assert_eq!(plen, 28 + 512 + 4);
}

#[test]
fn no_data_types_refuse_data_and_zero_lengths() {
    let n = neg(Digests::NONE, 0, 0);
    let mut out = [0u8; 64];
    let len = write_r2t(&mut out, 1, 1, 0, 0, &n).unwrap();
    assert_eq!(
        parse(&out[..len], C2H, &n),
        Err(PduError::ZeroLength(pdu_type::R2T))
    );
    let len = write_r2t(&mut out, 1, 1, 0, 512, &n).unwrap();
    out[4..8].copy_from_slice(&(len as u32 + 4).to_le_bytes());
    assert!(matches!(
        parse(&out[..len + 4], C2H, &n),
        Err(PduError::BadPlen {
            pdu_type: pdu_type::R2T,
            ..
        })
    ));
    let cqe = Cqe::default();
    let len = write_capsule_resp(&mut out, &cqe, &n).unwrap();
    out[1] = flags::HDGSTF;
    assert!(matches!(
        parse(&out[..len], C2H, &n),
        Err(PduError::HeaderDigestFlag {
            flag: true,
            negotiated: false
        })
    ));
    // A data PDU with no data at all.
    let mut b = [0u8; 24];
    b[0] = pdu_type::C2H_DATA;
    b[2] = 24;
    b[4] = 24;
    assert_eq!(
        parse(&b, C2H, &n),
        Err(PduError::ZeroLength(pdu_type::C2H_DATA))
    );
    // A TermReq longer than 152 bytes, or with digest flags.
    let mut t = [0u8; 200];
    write_term_req(&mut t, pdu_type::C2H_TERM_REQ, 1, 0, &[]).unwrap();
    t[4..8].copy_from_slice(&153u32.to_le_bytes());
    assert_eq!(
        parse(&t, C2H, &n),
        Err(PduError::PlenTooLarge {
            plen: 153,
            max: 152
        })
    );
    // In-capsule data past the connection's limit.
    let small = Negotiated { max_data: 512, ..n };
    let mut out = vec![0u8; 2048];
    let len = write_capsule_cmd(&mut out, &Sqe::default(), &[0u8; 1024], &n).unwrap();
    assert!(matches!(
        parse(&out[..len], H2C, &small),
        Err(PduError::PlenTooLarge { .. })
    ));
    assert!(matches!(
        write_data(
            &mut out,
            &DataPdu {
                pdu_type: pdu_type::H2C_DATA,
                cccid: 0,
                ttag: 0,
                datao: 0,
                last: true,
                success: false
            },
            &[],
            &n
        ),
        Err(BuildError::DataTooLarge(0))
    ));
}

#[test]
fn fes_names_the_field() {
    assert_eq!(
        PduError::HeaderDigest {
            received: 0,
            computed: 1
        }
        .fes()
        .0,
        fes::HEADER_DIGEST_ERROR
    );
    assert_eq!(
        PduError::BadHlen {
            pdu_type: 7,
            hlen: 0,
            expected: 24
        }
        .fes(),
        (fes::INVALID_HEADER_FIELD, 2)
    );
    assert_eq!(
        PduError::PdoMisaligned {
            pdo: 0,
            alignment: 4
        }
        .fes(),
        (fes::INVALID_HEADER_FIELD, 3)
    );
    assert_eq!(
        PduError::PlenTooLarge { plen: 0, max: 0 }.fes().0,
        fes::DATA_OUT_OF_RANGE
    );
    assert!(PduError::UnknownType(0x42).to_string().contains("0x42"));
}

#[test]
fn a_stream_of_pdus_parses_across_every_receive_boundary() {
    let n = neg(Digests::BOTH, 0, 0);
    let mut stream = Vec::new();
    stream.extend(c2h_data(&n, &[3u8; 700], false, false));
    let mut out = [0u8; 64];
    let len = write_capsule_resp(
        &mut out,
        &Cqe {
            cid: 9,
            ..Default::default()
        },
        &n,
    )
    .unwrap();
    stream.extend_from_slice(&out[..len]);
    let len = write_r2t(&mut out, 2, 5, 0, 4096, &n).unwrap();
    stream.extend_from_slice(&out[..len]);
    for cut in 0..stream.len() {
        assert_eq!(feed(&stream, &[cut], &n), 3, "cut at {cut}");
    }
}

/// Feed `stream` in pieces cut at `cuts`, parsing as a receiver would:
/// the count of PDUs parsed.
fn feed(stream: &[u8], cuts: &[usize], n: &Negotiated) -> usize {
    let mut buf = Vec::new();
    let mut pos = 0;
    let mut count = 0;
    let mut bounds: Vec<usize> = cuts.iter().map(|&c| c.min(stream.len())).collect();
    bounds.push(stream.len());
    bounds.sort_unstable();
    for end in bounds {
        buf.extend_from_slice(&stream[pos..end.max(pos)]);
        pos = end.max(pos);
        loop {
            match parse(&buf, C2H, n).expect("valid stream") {
                Parse::Incomplete { need } => {
                    assert!(need > buf.len());
                    break;
                }
                Parse::Complete { len, .. } => {
                    count += 1;
                    buf.drain(..len);
                }
            }
        }
    }
    assert!(buf.is_empty());
    count
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400), hd in any::<bool>(), dd in any::<bool>(), pda in 0u8..4) {
        let n = neg(Digests { header: hd, data: dd }, pda, pda);
        for dir in [H2C, C2H] {
            if let Ok(Some(h)) = parse_header(&bytes, dir, &n) {
                prop_assert!(h.header_end <= bytes.len());
                prop_assert!(h.data_at >= h.header_end || h.data_len == 0);
                prop_assert!(h.data_at + h.data_len <= h.plen);
                let _ = h.data_header(&bytes);
            }
            if let Ok(Parse::Complete { len, pdu }) = parse(&bytes, dir, &n) {
                prop_assert!(len <= bytes.len());
                if let Pdu::Data { data, .. } | Pdu::CapsuleCmd { data, .. } = pdu {
                    prop_assert!(data.len() <= len);
                }
            }
        }
    }

    #[test]
    fn mutated_valid_pdus_never_panic(kind in 0usize..4, size in 0usize..600, edits in proptest::collection::vec((0usize..700, any::<u8>()), 1..6), cut in 0usize..800, hd in any::<bool>(), dd in any::<bool>(), pda in 0u8..4) {
        let n = neg(Digests { header: hd, data: dd }, pda, pda);
        let mut out = vec![0u8; 1024];
        let data = vec![0x77u8; size.max(1)];
        let (len, dir) = match kind {
            0 => (write_capsule_cmd(&mut out, &Sqe::default(), &data[..size], &n).unwrap(), H2C),
            1 => (c2h_data_into(&mut out, &n, &data), C2H),
            2 => (write_r2t(&mut out, 1, 2, 3, 4, &n).unwrap(), C2H),
            _ => (write_capsule_resp(&mut out, &Cqe::default(), &n).unwrap(), C2H),
        };
        let mut b = out[..len].to_vec();
        for (at, v) in edits {
            if !b.is_empty() {
                let i = at % b.len();
                b[i] = v;
            }
        }
        b.truncate(cut.min(b.len()));
        for d in [dir, if dir == H2C { C2H } else { H2C }] {
            if let Ok(Parse::Complete { len, pdu }) = parse(&b, d, &n) {
                prop_assert!(len <= b.len());
                if let Pdu::Data { data, .. } | Pdu::CapsuleCmd { data, .. } = pdu {
                    prop_assert!(data.len() < len);
                }
            }
            if let Ok(Some(h)) = parse_header(&b, d, &n) {
                prop_assert!(h.header_end <= b.len() && h.data_at + h.data_len <= h.plen);
            }
        }
    }

    #[test]
    fn random_splits_parse_the_same(sizes in proptest::collection::vec(1usize..5000, 1..6), cuts in proptest::collection::vec(0usize..30000, 0..12), hd in any::<bool>(), dd in any::<bool>(), hpda in 0u8..8) {
        let n = neg(Digests { header: hd, data: dd }, hpda, 0);
        let mut stream = Vec::new();
        for (i, s) in sizes.iter().enumerate() {
            stream.extend(c2h_data(&n, &vec![i as u8; *s], i + 1 == sizes.len(), false));
        }
        prop_assert_eq!(feed(&stream, &cuts, &n), sizes.len());
    }

    #[test]
    fn data_pdus_round_trip(cccid in any::<u16>(), ttag in any::<u16>(), datao in any::<u32>(), size in 1usize..3000, last in any::<bool>(), h2c in any::<bool>(), hd in any::<bool>(), dd in any::<bool>(), pda in 0u8..32) {
        let n = neg(Digests { header: hd, data: dd }, pda, pda);
        let (pdu_type, dir) = if h2c { (pdu_type::H2C_DATA, H2C) } else { (pdu_type::C2H_DATA, C2H) };
        let d = DataPdu { pdu_type, cccid, ttag, datao, last, success: false };
        let data: Vec<u8> = (0..size).map(|i| (i * 7) as u8).collect();
        let mut out = vec![0u8; 256 + size];
        let len = write_data(&mut out, &d, &data, &n).unwrap();
        let mut head = vec![0u8; 256];
        let layout = write_data_header(&mut head, &d, size, &n).unwrap();
        prop_assert_eq!(layout.plen, len);
        prop_assert_eq!(&head[..layout.pdo], &out[..layout.pdo]);
        let (p, used) = one(&out[..len], dir, &n).unwrap();
        prop_assert_eq!(used, len);
        let expected = Pdu::Data { pdu_type, cccid, ttag, datao, last, success: false, data: &data };
        prop_assert_eq!(p, expected);
    }

    #[test]
    fn one_flipped_bit_is_caught_with_both_digests(size in 1usize..2000, bit in 0usize..16000) {
        let n = neg(Digests::BOTH, 0, 0);
        let mut b = c2h_data(&n, &vec![0xC3; size], true, false);
        let bit = bit % (b.len() * 8);
        b[bit / 8] ^= 1 << (bit % 8);
        // Any single flip is an error or an incomplete PDU (a plen grown
        // past the buffer); never a PDU parsed with wrong bytes.
        let complete = matches!(parse(&b, C2H, &n), Ok(Parse::Complete { .. }));
        prop_assert!(!complete);
    }
}

#[test]
fn header_first_then_data_placed_by_the_receiver() {
    use super::digest::DataDigest;
    let n = neg(Digests::BOTH, 3, 0);
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    let b = c2h_data(&n, &data, true, false);
    // Nothing until the header and its digest are in.
    for cut in 0..28 {
        assert_eq!(parse_header(&b[..cut], C2H, &n), Ok(None), "cut {cut}");
    }
    let h = parse_header(&b[..28], C2H, &n).unwrap().unwrap();
    assert_eq!(
        (h.header_end, h.data_at, h.data_len, h.plen),
        (28, 32, data.len(), b.len())
    );
    assert!(h.data_digest);
    let dh = h.data_header(&b).unwrap();
    assert_eq!((dh.cccid, dh.datao, dh.datal), (9, 4096, data.len() as u32));
    // The receiver copies the data into its own buffer piece by piece.
    let mut placed = vec![0u8; data.len()];
    let mut d = DataDigest::new();
    for (i, piece) in b[h.data_at..h.data_at + h.data_len]
        .chunks(1460)
        .enumerate()
    {
        placed[i * 1460..i * 1460 + piece.len()].copy_from_slice(piece);
        d.update(piece);
    }
    assert_eq!(placed, data);
    let at = h.data_at + h.data_len;
    assert!(d.matches(b[at..at + 4].try_into().unwrap()));
    // A bad header digest or a lying DATAL is refused before any data.
    let mut bad = b[..28].to_vec();
    bad[26] ^= 1;
    assert!(matches!(
        parse_header(&bad, C2H, &n),
        Err(PduError::HeaderDigest { .. })
    ));
    let mut lie = b[..28].to_vec();
    lie[16] ^= 4;
    let dg = super::digest::crc32c(&lie[..24]);
    lie[24..28].copy_from_slice(&dg.to_le_bytes());
    assert!(matches!(
        parse_header(&lie, C2H, &n),
        Err(PduError::DatalMismatch { .. })
    ));
    // Non-data PDUs have no data header.
    let mut out = [0u8; 64];
    let len = write_r2t(&mut out, 1, 2, 0, 4096, &n).unwrap();
    let h = parse_header(&out[..len], C2H, &n).unwrap().unwrap();
    assert_eq!((h.data_len, h.data_digest), (0, false));
    assert!(h.data_header(&out).is_none());
}

#[test]
fn host_negotiation_takes_only_what_it_asked_for() {
    let mut b = [0u8; 128];
    write_ic_resp(
        &mut b,
        2,
        Digests {
            header: true,
            data: false,
        },
        8192,
    )
    .unwrap();
    let Pdu::IcResp(r) = one(&b, C2H, &Negotiated::INITIAL).unwrap().0 else {
        panic!()
    };
    let n = Negotiated::for_host(Digests::BOTH, 1, &r, 65536).unwrap();
    assert_eq!(
        (n.digests, n.hpda, n.cpda, n.max_data),
        (
            Digests {
                header: true,
                data: false
            },
            1,
            2,
            65536
        )
    );
    assert_eq!(
        Negotiated::for_host(Digests::NONE, 0, &r, 4096),
        Err(PduError::DigestNotAsked {
            asked: 0,
            granted: 1
        })
    );
    let mut r2 = r;
    r2.dgst = 0x04;
    assert!(matches!(
        Negotiated::for_host(Digests::BOTH, 0, &r2, 4096),
        Err(PduError::DigestNotAsked { .. })
    ));
}
