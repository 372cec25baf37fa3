//! `--minimal`: the engine alone. One queue pair on the calling thread,
//! driven with nothing but read, submit, poll and a completion counter —
//! no job LBA generator, no clock reads per I/O, no latency statistics, no
//! job-queue adapter — so that instructions (callgrind), register accesses
//! and system calls per I/O of the engine can be told apart from the
//! tool's (`mcqio-perf` without `--minimal` runs the same engine under the
//! job loop; the difference is the tool's cost).
//!
//! Each slot's buffer is reused for every read of that slot. The reads go
//! to random positions of the namespace (or LU; the first 2^20 positions)
//! with `-w randread`, the default — the job loop's generator
//! (`workload::Rng`), a few instructions — or walk them in order with `-w read`. On an emulated
//! controller the two cost the device differently (QEMU's NVMe read 25%
//! more I/Os per second in order at QD16), so the loop reads as the paths
//! it is compared with do.

use std::time::Instant;

use mcqio::core::block::BlockQueue;

use crate::error::PerfError;
use crate::queue::DmaMode;
use crate::slots::{BlockJobQueue, SlotBuf};
use crate::spec::DeviceSpec;
use crate::target::{OnSlotQueue, OpenPlan, Target};
use crate::workload::Rng;

/// What one minimal run did.
#[derive(Debug, Clone, PartialEq)]
pub struct MinimalReport {
    /// I/Os completed.
    pub ios: u64,
    /// Seconds from the first submission to the last completion.
    pub elapsed_s: f64,
    /// The engine's counters over the run.
    pub counters: mcqio::QueueCounters,
}

impl MinimalReport {
    /// The report line.
    pub fn line(&self, device: &str, depth: usize) -> String {
        let ios = self.ios.max(1) as f64;
        let c = &self.counters;
        format!(
            "minimal loop (engine only) on {device}: {} I/Os at QD {depth} in {:.3} s, {:.0} IOPS; \
             per I/O: {:.3} doorbell writes, {:.3} register reads, {:.4} engine clock calls",
            self.ios,
            self.elapsed_s,
            self.ios as f64 / self.elapsed_s.max(1e-9),
            c.doorbell_writes as f64 / ios,
            c.register_reads as f64 / ios,
            c.system_clock_reads as f64 / ios,
        )
    }
}

/// What a minimal run does.
#[derive(Debug, Clone)]
pub struct MinimalOpts {
    /// Reads in flight.
    pub depth: usize,
    /// NVMe I/O queue entries (`None`: the engine's choice).
    pub io_queue_size: Option<u16>,
    /// Bytes per read.
    pub io_size: u64,
    /// Reads to complete.
    pub ios: u64,
    /// Random positions (`-w randread`); in order otherwise (`-w read`).
    pub random: bool,
    /// The core the fake's device thread stays off (the caller's).
    pub cpus: Vec<usize>,
}

/// Open `spec` and run `o.ios` reads of `o.io_size` bytes at depth `o.depth`.
pub fn run(spec: &DeviceSpec, o: &MinimalOpts) -> Result<MinimalReport, PerfError> {
    let ios = o.ios;
    let plan = OpenPlan {
        jobs: 1,
        depth: o.depth,
        io_queue_size: o.io_queue_size,
        io_size: o.io_size,
        writes: false,
        job_cores: o.cpus.clone(),
        seed: 1,
        dma: DmaMode::Premapped,
        hpb: None,
        wait: mcqio::WaitPolicy::Poll,
    };
    let target = Target::open(spec, &plan)?;
    let lbads = u64::from(target.lbads());
    if o.io_size == 0 || o.io_size % lbads != 0 {
        return Err(PerfError::Usage(format!(
            "--minimal: the I/O size {} is not a multiple of the {lbads}-byte block",
            o.io_size
        )));
    }
    let nlb = (o.io_size / lbads) as u32;
    let ns = target
        .namespaces()
        .first()
        .copied()
        .ok_or_else(|| PerfError::Device(format!("{}: no namespace", spec.label())))?;
    let positions = (ns.blocks / u64::from(nlb)).min(1 << 20);
    let buf_len = o.io_size as usize;
    let depth = o.depth;
    let spin = Spin {
        nlb,
        positions,
        ios,
        random: o.random,
    };
    target
        .with_slot_queue(ns.nsid, depth, buf_len, spin)?
        .map_err(PerfError::Device)
}

/// [`spin`] with its arguments, for [`Target::with_slot_queue`].
struct Spin {
    nlb: u32,
    positions: u64,
    ios: u64,
    random: bool,
}

impl OnSlotQueue for Spin {
    type Output = Result<MinimalReport, String>;

    fn run<Q: BlockQueue<Buf = SlotBuf>>(self, q: BlockJobQueue<Q>) -> Self::Output {
        spin(q, self.nlb, self.positions, self.ios, self.random)
    }
}

/// The loop: keep `depth` reads in flight until `ios` completed, at random
/// positions below `positions` or (`random` false) in order.
fn spin<Q: BlockQueue<Buf = SlotBuf>>(
    mut q: BlockJobQueue<Q>,
    nlb: u32,
    positions: u64,
    ios: u64,
    random: bool,
) -> Result<MinimalReport, String> {
    let at = q.at;
    let mut free: Vec<SlotBuf> = q.mem.bufs.clone();
    free.truncate(q.qp.depth());
    let before = q.qp.counters();
    let (mut issued, mut done, mut pos) = (0u64, 0u64, 0u64);
    let mut rng = Rng::new(1);
    let mut lost = false;
    let t = Instant::now();
    while done < ios {
        while issued < ios {
            let Some(b) = free.pop() else { break };
            match q.qp.read(at, pos * u64::from(nlb), nlb, b, 0) {
                Ok(()) => issued += 1,
                Err(e) => {
                    let kind = e.kind;
                    free.push(e.into_buf());
                    if kind == mcqio::SubmitErrorKind::QueueFull {
                        break;
                    }
                    return Err(format!("read refused: {kind}"));
                }
            }
            if random {
                pos = rng.below(positions);
            } else {
                pos += 1;
                if pos == positions {
                    pos = 0;
                }
            }
        }
        q.qp.submit();
        done +=
            q.qp.poll(usize::MAX, |c| match (c.result, c.buf) {
                (Ok(()), Some(b)) => free.push(b),
                _ => lost = true,
            })
            .map_err(|e| e.to_string())? as u64;
        if lost {
            return Err("a read failed or came back without its buffer".into());
        }
    }
    let elapsed_s = t.elapsed().as_secs_f64();
    let after = q.qp.counters();
    let diff = |f: fn(&mcqio::QueueCounters) -> u64| f(&after) - f(&before);
    let counters = mcqio::QueueCounters {
        submitted: diff(|c| c.submitted),
        completed: diff(|c| c.completed),
        doorbell_writes: diff(|c| c.doorbell_writes),
        register_reads: diff(|c| c.register_reads),
        system_clock_reads: diff(|c| c.system_clock_reads),
        ..mcqio::QueueCounters::default()
    };
    Ok(MinimalReport {
        ios: done,
        elapsed_s,
        counters,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(depth: usize) -> MinimalOpts {
        MinimalOpts {
            depth,
            io_queue_size: None,
            io_size: 4096,
            ios: 1000,
            random: true,
            cpus: Vec::new(),
        }
    }

    /// The minimal loop completes exactly the I/Os asked
    /// for on NVMe and UFS, and reports the engine's doorbells: at QD1 one
    /// SQ tail per I/O and one CQ head per 32 consumed entries (NVMe stores
    /// it at the next ring, so 31 in 1000 I/Os; UFS MCQ in the poll that
    /// consumed the 32nd, so 31 too).
    #[test]
    fn the_minimal_loop_counts_its_ios_and_doorbells() {
        for (dev, stores, per_io) in [
            ("fake:null,sync=1", 1031, "1.031"),
            ("fake-ufs:null,sync=1", 1031, "1.031"),
        ] {
            let spec: DeviceSpec = dev.parse().expect("spec");
            let r = run(&spec, &opts(1)).expect("minimal run");
            assert_eq!(r.ios, 1000, "{dev}");
            assert_eq!(r.counters.completed, 1000, "{dev}");
            assert_eq!(r.counters.doorbell_writes, stores, "{dev}");
            let line = r.line(dev, 1);
            assert!(
                line.contains(&format!("per I/O: {per_io} doorbell writes")),
                "{line}"
            );
        }
    }
}
