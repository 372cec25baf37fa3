//! A minimal in-process "device" that completes every I/O command at once
//! without touching data: the engine's own per-I/O cost, with no emulator
//! in the way. Used by `qd_bench loopback`.
//!
//! It answers just what bring-up needs (identify, active namespaces, number
//! of queues, queue creation/deletion) and is not a test fixture: it checks
//! nothing. The real fake controller is `mcqio-fixtures`.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use mcqio::nvme::spec::opcodes::admin;
use mcqio::nvme::spec::{Cqe, Sqe};
use mcqio::vfio::{
    Backend, DmaDir, DmaSpace, DoorbellHook, HugePages, Iommu, IommuCounters, IommuError, Iova,
    IovaRange, Mmio,
};

const BAR_LEN: usize = 0x2000;
const NSZE: u64 = 1 << 40;

#[derive(Default)]
struct Table {
    map: BTreeMap<u64, (usize, usize)>,
}

struct LoopIommu {
    table: Mutex<Table>,
    counters: IommuCounters,
}

// SAFETY: unmap removes the entry before returning, so after a successful
// unmap this "IOMMU" never translates to the old memory again.
unsafe impl Iommu for LoopIommu {
    unsafe fn map(
        &self,
        iova: Iova,
        vaddr: NonNull<u8>,
        len: usize,
        _dir: DmaDir,
    ) -> Result<(), IommuError> {
        self.table
            .lock()
            .unwrap()
            .map
            .insert(iova.raw(), (vaddr.as_ptr() as usize, len));
        Ok(())
    }
    fn unmap(&self, iova: Iova, _len: u64) -> Result<(), IommuError> {
        self.table.lock().unwrap().map.remove(&iova.raw());
        Ok(())
    }
    fn valid_ranges(&self) -> Vec<IovaRange> {
        vec![IovaRange::new(1 << 20, 1 << 40)]
    }
    fn counters(&self) -> &IommuCounters {
        &self.counters
    }
}

impl LoopIommu {
    fn host(&self, iova: u64) -> *mut u8 {
        let t = self.table.lock().unwrap();
        let (&base, &(va, len)) = t.map.range(..=iova).next_back().expect("mapped iova");
        assert!(iova < base + len as u64);
        (va + (iova - base) as usize) as *mut u8
    }
}

#[derive(Clone, Copy, Default)]
struct Ring {
    base: usize,
    entries: u16,
    pos: u16,
    phase: u16,
}

struct State {
    sq: Vec<Ring>,
    cq: Vec<Ring>,
}

pub struct Loopback {
    bar: Box<[AtomicU32]>,
    iommu: Arc<LoopIommu>,
    dma: Arc<DmaSpace>,
    state: Mutex<State>,
    me: std::sync::Weak<Loopback>,
}

impl Loopback {
    pub fn new() -> Arc<Self> {
        let iommu = Arc::new(LoopIommu {
            table: Mutex::new(Table::default()),
            counters: IommuCounters::default(),
        });
        let dma = DmaSpace::new(iommu.clone(), HugePages::Prefer);
        Arc::new_cyclic(|me| Loopback {
            bar: (0..BAR_LEN / 4).map(|_| AtomicU32::new(0)).collect(),
            iommu,
            dma,
            state: Mutex::new(State {
                sq: vec![Ring::default(); 16],
                cq: vec![Ring::default(); 16],
            }),
            me: me.clone(),
        })
    }

    fn reg(&self, off: usize) -> u32 {
        self.bar[off / 4].load(Ordering::Acquire)
    }

    fn set(&self, off: usize, v: u32) {
        self.bar[off / 4].store(v, Ordering::Release)
    }

    fn post(&self, st: &mut State, cqid: usize, sqid: u16, cid: u16, dw0: u32) {
        let cq = &mut st.cq[cqid];
        let slot = (cq.base + cq.pos as usize * 16) as *mut Cqe;
        let cqe = Cqe {
            dw0,
            dw1: 0,
            sq_head: st.sq[sqid as usize].pos,
            sq_id: sqid,
            cid,
            status: cq.phase,
        };
        // SAFETY: the slot is inside the CQ the driver created and mapped.
        unsafe { slot.write_volatile(cqe) };
        cq.pos += 1;
        if cq.pos == cq.entries {
            cq.pos = 0;
            cq.phase ^= 1;
        }
    }

    fn admin(&self, st: &mut State, sqe: &Sqe) -> u32 {
        let page = |v: &dyn Fn(&mut [u8])| {
            let mut p = vec![0u8; 4096];
            v(&mut p);
            let dst = self.iommu.host(sqe.prp1);
            // SAFETY: PRP1 of an identify is a mapped 4 KiB page.
            unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), dst, 4096) };
        };
        match sqe.opcode() {
            admin::IDENTIFY => match sqe.cdw10 & 0xFF {
                1 => page(&|p| {
                    p[24..32].copy_from_slice(b"loopback");
                    p[512] = 0x66;
                    p[513] = 0x44;
                    p[516] = 1;
                }),
                2 => page(&|p| p[0] = 1),
                _ => page(&|p| {
                    p[0..8].copy_from_slice(&NSZE.to_le_bytes());
                    p[130] = 9;
                }),
            },
            admin::SET_FEATURES => return 15 | 15 << 16,
            admin::CREATE_IO_CQ => {
                let q = (sqe.cdw10 & 0xFFFF) as usize;
                st.cq[q] = Ring {
                    base: self.iommu.host(sqe.prp1) as usize,
                    entries: (sqe.cdw10 >> 16) as u16 + 1,
                    pos: 0,
                    phase: 1,
                };
            }
            admin::CREATE_IO_SQ => {
                let q = (sqe.cdw10 & 0xFFFF) as usize;
                st.sq[q] = Ring {
                    base: self.iommu.host(sqe.prp1) as usize,
                    entries: (sqe.cdw10 >> 16) as u16 + 1,
                    pos: 0,
                    phase: 0,
                };
            }
            _ => {}
        }
        0
    }
}

impl Mmio for Loopback {
    fn read32(&self, off: usize) -> u32 {
        match off {
            0 => 4095,   // MQES
            4 => 1 << 5, // CSS NVM (bit 37)
            _ => self.reg(off),
        }
    }
    fn write32(&self, off: usize, v: u32) {
        self.set(off, v);
        if off == mcqio::nvme::spec::regs::CC {
            let mut csts = v & 1; // RDY follows EN
            if (v >> 14) & 3 != 0 {
                csts |= 2 << 2; // shutdown complete
            }
            if v & 1 == 1 {
                let mut st = self.state.lock().unwrap();
                let aqa = self.reg(0x24);
                let asq = self.reg(0x28) as u64 | (self.reg(0x2C) as u64) << 32;
                let acq = self.reg(0x30) as u64 | (self.reg(0x34) as u64) << 32;
                st.sq[0] = Ring {
                    base: self.iommu.host(asq) as usize,
                    entries: (aqa & 0xFFF) as u16 + 1,
                    pos: 0,
                    phase: 0,
                };
                st.cq[0] = Ring {
                    base: self.iommu.host(acq) as usize,
                    entries: (aqa >> 16 & 0xFFF) as u16 + 1,
                    pos: 0,
                    phase: 1,
                };
            }
            self.set(mcqio::nvme::spec::regs::CSTS, csts);
        }
    }
    fn base(&self) -> NonNull<u8> {
        NonNull::new(self.bar.as_ptr() as *mut u8).unwrap()
    }
    fn len(&self) -> usize {
        BAR_LEN
    }
}

impl DoorbellHook for Loopback {
    fn rung(&self, offset: usize, value: u32) {
        let idx = (offset - 0x1000) / 4;
        if idx % 2 == 1 {
            return; // CQ head: nothing to do, the CQ never overflows here
        }
        let q = idx / 2;
        let mut st = self.state.lock().unwrap();
        while st.sq[q].pos != value as u16 {
            let sq = st.sq[q];
            // SAFETY: inside the SQ the driver created; the doorbell published it.
            let sqe = unsafe { ((sq.base + sq.pos as usize * 64) as *const Sqe).read_volatile() };
            let s = &mut st.sq[q];
            s.pos = if s.pos + 1 == s.entries { 0 } else { s.pos + 1 };
            let dw0 = if q == 0 { self.admin(&mut st, &sqe) } else { 0 };
            self.post(&mut st, q, q as u16, sqe.cid(), dw0);
        }
    }
}

impl Backend for Loopback {
    fn regs(&self) -> &dyn Mmio {
        self
    }
    fn dma(&self) -> &Arc<DmaSpace> {
        &self.dma
    }
    fn doorbell_hook(&self) -> Option<Arc<dyn DoorbellHook>> {
        self.me.upgrade().map(|a| a as Arc<dyn DoorbellHook>)
    }
    fn name(&self) -> String {
        "loopback".into()
    }
}
