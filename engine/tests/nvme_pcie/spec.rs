//! Wire-format tests: layouts, command encodings, status and identify parsing.

use mcqio::nvme::spec::identify::{IdentifyController, IdentifyError, IdentifyNamespace};
use mcqio::nvme::spec::opcodes::{admin, nvm};
use mcqio::nvme::spec::regs::{self, Aqa, Cap, Cc, Csts};
use mcqio::nvme::spec::sqe::*;
use mcqio::nvme::spec::{Cqe, NvmeStatus, Sqe};
use proptest::prelude::*;
use std::mem::{offset_of, size_of};

#[test]
fn layouts_match_the_spec() {
    assert_eq!(size_of::<Sqe>(), 64);
    assert_eq!(size_of::<Cqe>(), 16);
    assert_eq!(offset_of!(Sqe, nsid), 4);
    assert_eq!(offset_of!(Sqe, mptr), 16);
    assert_eq!(offset_of!(Sqe, prp1), 24);
    assert_eq!(offset_of!(Sqe, prp2), 32);
    assert_eq!(offset_of!(Sqe, cdw10), 40);
    assert_eq!(offset_of!(Sqe, cdw15), 60);
    assert_eq!(offset_of!(Cqe, sq_head), 8);
    assert_eq!(offset_of!(Cqe, sq_id), 10);
    assert_eq!(offset_of!(Cqe, cid), 12);
    assert_eq!(offset_of!(Cqe, status), 14);
    assert_eq!(size_of::<DsmRange>(), 16);
}

#[test]
fn read_write_encoding() {
    let s = Read::new(3, 0x1_2345_6789, 8)
        .fua(true)
        .sqe()
        .with_cid(0xBEEF)
        .with_prp(0x1000, 0x2000);
    assert_eq!(s.opcode(), nvm::READ);
    assert_eq!(s.cdw0 & 0xFF, 0x02);
    assert_eq!(s.cid(), 0xBEEF);
    assert_eq!(s.nsid, 3);
    assert_eq!(s.cdw10, 0x2345_6789);
    assert_eq!(s.cdw11, 0x1);
    assert_eq!(s.cdw12 & 0xFFFF, 7, "NLB is 0's based");
    assert_ne!(s.cdw12 & (1 << 30), 0, "FUA");
    assert_eq!((s.prp1, s.prp2), (0x1000, 0x2000));
    assert_eq!(s.slba(), 0x1_2345_6789);
    assert_eq!(s.nlb(), 8);
    let w = Write::new(1, 0, 1).sqe();
    assert_eq!(w.opcode(), nvm::WRITE);
    assert_eq!(w.cdw12, 0);
    assert_eq!(Write::OPCODE, 0x01);
    assert_eq!(Read::OPCODE, 0x02);
}

#[test]
fn admin_encodings() {
    let cq = CreateIoCq::new(5, 256).sqe();
    assert_eq!(cq.opcode(), admin::CREATE_IO_CQ);
    assert_eq!(cq.cdw10, 5 | (255 << 16));
    assert_eq!(cq.cdw11, 1, "physically contiguous, interrupts off");
    let sq = CreateIoSq::new(5, 256, 5).sqe();
    assert_eq!(sq.opcode(), admin::CREATE_IO_SQ);
    assert_eq!(sq.cdw10, 5 | (255 << 16));
    assert_eq!(sq.cdw11, 1 | (5 << 16));
    assert_eq!(DeleteIoSq(5).sqe().cdw10, 5);
    assert_eq!(DeleteIoSq(5).sqe().opcode(), 0x00);
    assert_eq!(DeleteIoCq(5).sqe().opcode(), 0x04);
    let nq = SetFeatures::number_of_queues(8, 8).sqe();
    assert_eq!(nq.opcode(), 0x09);
    assert_eq!(nq.cdw10, 0x07);
    assert_eq!(nq.cdw11, 7 | (7 << 16));
    let id = Identify::namespace(2).sqe();
    assert_eq!((id.opcode(), id.nsid, id.cdw10), (0x06, 2, 0));
    assert_eq!(Identify::controller().sqe().cdw10, 1);
    assert_eq!(Identify::active_namespaces(0).sqe().cdw10, 2);
    let ab = Abort::new(3, 0x42).sqe();
    assert_eq!((ab.opcode(), ab.cdw10), (0x08, 3 | (0x42 << 16)));
    let lp = GetLogPage::new(0x02, 512).sqe();
    assert_eq!(lp.opcode(), 0x02);
    assert_eq!(lp.cdw10, 0x02 | (127 << 16));
    assert_eq!(AsyncEventRequest.sqe().opcode(), 0x0C);
    assert_eq!(DoorbellBufferConfig.sqe().opcode(), 0x7C);
    let dsm = DatasetManagement::new(1, 3).deallocate().sqe();
    assert_eq!((dsm.opcode(), dsm.cdw10, dsm.cdw11), (0x09, 2, 1 << 2));
    let wz = WriteZeroes::new(1, 10, 4).deallocate(true).sqe();
    assert_eq!((wz.opcode(), wz.cdw10, wz.cdw12), (0x08, 10, 3 | (1 << 25)));
    assert_eq!(Flush::new(1).sqe().opcode(), 0x00);
}

#[test]
fn registers() {
    // MQES 1023, CQR, TO 20 (10 s), DSTRD 2, CSS NVM, MPSMIN 0, MPSMAX 4.
    let cap = Cap(1023 | 1 << 16 | 20 << 24 | 2 << 32 | 1 << 37 | 4 << 52);
    assert_eq!(cap.max_queue_entries(), 1024);
    assert!(cap.cqr());
    assert_eq!(cap.timeout_ms(), 10_000);
    assert_eq!(cap.dstrd(), 2);
    assert_eq!(cap.css() & 1, 1);
    assert_eq!(cap.mps_min_shift(), 12);
    assert_eq!(cap.mps_max_shift(), 16);
    let cc = Cc::new().css(0).mps(0).iosqes(6).iocqes(4).enable();
    assert_eq!(cc.0, 1 | 6 << 16 | 4 << 20);
    assert_eq!(cc.shn(Cc::SHN_NORMAL).0 >> 14 & 3, 1);
    assert!(!cc.disable().enabled());
    let csts = Csts(1 | 1 << 1 | 2 << 2);
    assert!(csts.rdy() && csts.cfs());
    assert_eq!(csts.shst(), Csts::SHST_COMPLETE);
    assert!(Csts(u32::MAX).is_all_ones());
    let aqa = Aqa::new(32, 64);
    assert_eq!(aqa.0, 31 | 63 << 16);
    assert_eq!((aqa.sq_entries(), aqa.cq_entries()), (32, 64));
    assert_eq!(regs::sq_tail_doorbell(0, 0), 0x1000);
    assert_eq!(regs::cq_head_doorbell(0, 0), 0x1004);
    assert_eq!(regs::sq_tail_doorbell(3, 0), 0x1018);
    assert_eq!(regs::cq_head_doorbell(3, 2), 0x1000 + 7 * 16);
}

#[test]
fn status_names_and_flags() {
    // SC 0x81 (unrecovered read), SCT 2, DNR, phase set.
    let raw: u16 = 1 | 0x81 << 1 | 2 << 9 | 1 << 15;
    let st = NvmeStatus::from_cqe_status(raw);
    assert_eq!((st.sct, st.sc, st.dnr, st.more), (2, 0x81, true, false));
    assert_eq!(st.name(), Some("unrecovered read error"));
    assert!(st.to_string().contains("unrecovered read error"));
    assert!(st.to_string().contains("do not retry"));
    assert!(!st.is_success());
    assert!(NvmeStatus::from_cqe_status(1).is_success());
    assert!(NvmeStatus::raw_is_success(1));
    assert!(NvmeStatus::raw_is_success(0));
    assert!(!NvmeStatus::raw_is_success(raw));
    assert_eq!(NvmeStatus::new(7, 0xC0).name(), None);
    assert!(NvmeStatus::new(7, 0xC0).to_string().contains("0xc0"));
}

fn controller_page(mn: &str, sn: &str, mdts: u8, nn: u32, oacs: u16, oncs: u16) -> Vec<u8> {
    let mut p = vec![0u8; 4096];
    p[0..2].copy_from_slice(&0x1b36u16.to_le_bytes());
    let pad = |s: &str, n: usize| {
        let mut v = s.as_bytes().to_vec();
        v.resize(n, b' ');
        v
    };
    p[4..24].copy_from_slice(&pad(sn, 20));
    p[24..64].copy_from_slice(&pad(mn, 40));
    p[64..72].copy_from_slice(&pad("1.0", 8));
    p[77] = mdts;
    p[256..258].copy_from_slice(&oacs.to_le_bytes());
    p[512] = 0x66;
    p[513] = 0x44;
    p[516..520].copy_from_slice(&nn.to_le_bytes());
    p[520..522].copy_from_slice(&oncs.to_le_bytes());
    p[525] = 1;
    p
}

#[test]
fn identify_controller_parse() {
    let p = controller_page("QEMU NVMe Ctrl", "deadbeef", 7, 4, 1 << 8, 0b1100);
    let c = IdentifyController::parse(&p).unwrap();
    assert_eq!(c.vid, 0x1b36);
    assert_eq!(c.model, "QEMU NVMe Ctrl");
    assert_eq!(c.serial, "deadbeef");
    assert_eq!(c.firmware, "1.0");
    assert_eq!(c.max_transfer_bytes(12), Some(512 << 10));
    assert_eq!(c.nn, 4);
    assert!(c.supports_doorbell_buffer());
    assert!(c.supports_dsm() && c.supports_write_zeroes());
    assert!(c.has_volatile_write_cache());
    assert_eq!(
        IdentifyController::parse(&p[..100]),
        Err(IdentifyError::Length(100))
    );
    let mut big = p.clone();
    big[512] = 0x77;
    assert!(matches!(
        IdentifyController::parse(&big),
        Err(IdentifyError::EntrySizes { .. })
    ));
}

fn namespace_page(nsze: u64, formats: &[(u16, u8)], flbas: u8) -> Vec<u8> {
    let mut p = vec![0u8; 4096];
    p[0..8].copy_from_slice(&nsze.to_le_bytes());
    p[8..16].copy_from_slice(&nsze.to_le_bytes());
    p[25] = formats.len() as u8 - 1;
    p[26] = flbas;
    for (i, (ms, lbads)) in formats.iter().enumerate() {
        let d = *ms as u32 | (*lbads as u32) << 16;
        p[128 + 4 * i..132 + 4 * i].copy_from_slice(&d.to_le_bytes());
    }
    p
}

#[test]
fn identify_namespace_parse() {
    let p = namespace_page(1 << 20, &[(0, 9), (0, 12), (8, 12)], 1);
    let ns = IdentifyNamespace::parse(&p).unwrap();
    assert_eq!(ns.nsze, 1 << 20);
    assert_eq!(ns.lba_size(), 4096);
    assert_eq!(ns.lba_shift(), 12);
    assert_eq!(ns.lba_formats.len(), 3);
    let bad = namespace_page(10, &[(0, 9)], 3);
    assert!(matches!(
        IdentifyNamespace::parse(&bad),
        Err(IdentifyError::BadFormatIndex { index: 3, count: 1 })
    ));
    let tiny = namespace_page(10, &[(0, 2)], 0);
    assert_eq!(
        IdentifyNamespace::parse(&tiny),
        Err(IdentifyError::BadLbaSize(2))
    );
}

proptest! {
    #[test]
    fn rw_roundtrip(nsid in 1u32.., slba in any::<u64>(), nlb in 1u32..=65536, cid in 0u16..0xFFFF, fua in any::<bool>()) {
        let s = Read::new(nsid, slba, nlb).fua(fua).sqe().with_cid(cid);
        prop_assert_eq!(s.nsid, nsid);
        prop_assert_eq!(s.slba(), slba);
        prop_assert_eq!(s.nlb(), nlb);
        prop_assert_eq!(s.cid(), cid);
        prop_assert_eq!(s.opcode(), nvm::READ);
        prop_assert_eq!(s.cdw12 & (1 << 30) != 0, fua);
    }

    #[test]
    fn status_roundtrip(sct in 0u8..8, sc in any::<u8>(), crd in 0u8..4, more in any::<bool>(), dnr in any::<bool>()) {
        let st = NvmeStatus { sct, sc, crd, more, dnr };
        let raw = st.to_cqe_status();
        prop_assert_eq!(raw & 1, 0);
        prop_assert_eq!(NvmeStatus::from_cqe_status(raw | 1), st);
        prop_assert_eq!(NvmeStatus::raw_is_success(raw), sct == 0 && sc == 0);
    }

    #[test]
    fn identify_namespace_never_panics(bytes in proptest::collection::vec(any::<u8>(), 4096)) {
        if let Ok(ns) = IdentifyNamespace::parse(&bytes) {
            prop_assert!((512..=1u64 << 31).contains(&ns.lba_size()));
            prop_assert!((ns.format_index() as usize) < ns.lba_formats.len());
        }
    }

    #[test]
    fn identify_controller_never_panics(bytes in proptest::collection::vec(any::<u8>(), 4096)) {
        let _ = IdentifyController::parse(&bytes);
    }

    #[test]
    fn identify_namespace_roundtrip(nsze in 1u64.., lbads in 9u8..=16, nformats in 1usize..=16, pick in 0usize..16) {
        let idx = pick % nformats;
        let mut formats: Vec<(u16, u8)> = (0..nformats).map(|_| (0, 9)).collect();
        formats[idx] = (0, lbads);
        let ns = IdentifyNamespace::parse(&namespace_page(nsze, &formats, idx as u8)).unwrap();
        prop_assert_eq!(ns.nsze, nsze);
        prop_assert_eq!(ns.lba_shift(), lbads as u32);
    }
}
