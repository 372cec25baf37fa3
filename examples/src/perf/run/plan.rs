//! Planning a device's rows: open it with enough queue pairs, pick its
//! namespaces, check the region under test, and give each row (a thread
//! and a namespace) its range.

use std::sync::Arc;

use crate::job::JobSpec;
use crate::spec::{DeviceKind, DeviceSpec};
use crate::target::{OpenPlan, Target};

use super::{DmaMode, PerfError, RunOpts};

/// The most blocks one job tracks for `--verify` (4 bytes of state each).
pub const VERIFY_MAX_BLOCKS: u64 = 1 << 22;

/// The part `[first, first + blocks)` of a namespace the run may touch.
pub fn region(
    device: &str,
    ns: crate::target::Namespace,
    lbads: u64,
    offset: u64,
    size: Option<u64>,
) -> Result<(u64, u64), PerfError> {
    let ns_bytes = ns.blocks.saturating_mul(lbads);
    let bad = |why| PerfError::Region {
        device: device.to_string(),
        nsid: ns.nsid,
        offset,
        size,
        ns_bytes,
        lbads,
        why,
    };
    if offset % lbads != 0 || size.is_some_and(|s| s % lbads != 0) {
        return Err(bad("is not a multiple of the logical block size"));
    }
    if size == Some(0) {
        return Err(bad("is empty"));
    }
    let end = match size {
        Some(s) => offset.checked_add(s).ok_or_else(|| bad("overflows"))?,
        None => ns_bytes,
    };
    if offset >= ns_bytes || end > ns_bytes {
        return Err(bad("does not fit in the namespace"));
    }
    Ok((offset / lbads, (end - offset) / lbads))
}

/// An opened device with its notes and its jobs' specs.
pub(super) type PlannedDevice = (Arc<Target>, Vec<String>, Vec<JobSpec>);

/// Open one device for the job threads `mine` (global job numbers) and
/// plan their rows: which thread drives which namespace, in which range.
/// Rows are numbered from `first_row`. As spdk_nvme_perf associates
/// workers with namespaces: max(threads, namespaces) rows, row r on thread
/// r mod threads and namespace r mod namespaces, so with `-N` left out
/// every namespace is driven, a thread with several drives each on a queue
/// pair of its own at the full queue depth, and a namespace with several
/// threads is shared by them. Returns (target, notes, row specs); their
/// I/O counts and rates are set by the caller, which knows all rows.
pub(super) fn plan_device(
    spec: &DeviceSpec,
    o: &RunOpts,
    pct: u8,
    mine: &[usize],
    first_row: usize,
) -> Result<PlannedDevice, PerfError> {
    if o.verify && !spec.stores_data() {
        return Err(PerfError::Usage(format!(
            "--verify needs a device that stores data; `{}` moves none (use fake or uring:<file>)",
            spec.label()
        )));
    }
    if o.dma != DmaMode::Premapped
        && !matches!(spec.kind, DeviceKind::Fake { .. } | DeviceKind::Vfio { .. })
    {
        return Err(PerfError::Usage(format!(
            "--dma {} applies to mcqio devices (fake, vfio:<BDF>), not `{}`",
            o.dma.name(),
            spec.label()
        )));
    }
    let jobs = mine.len();
    // Queue pairs: one per row, max(threads, namespaces). A fake says its
    // namespace count up front; a real device is reopened below with more
    // queue pairs if it has more namespaces than threads.
    let known = match (&o.nsids, spec.fake_config(), spec.fake_ufs_config()) {
        (Some(want), _, _) => want.len(),
        (None, Some(c), _) => c.namespaces.len(),
        (None, None, Some(c)) => c.lus.len(),
        (None, None, None) => 0,
    };
    let mut plan = OpenPlan {
        jobs: jobs.max(known),
        depth: o.depth,
        io_queue_size: o.io_queue_size,
        io_size: o.io_size,
        writes: pct < 100 || o.verify,
        // Every job's core, not only this device's: a fake's device thread
        // stays off all of them.
        job_cores: o.cpus.clone(),
        seed: o.seed,
        dma: o.dma,
        hpb: o.hpb,
        wait: o.wait,
    };
    let mut target = Target::open(spec, &plan)?;
    let picked = match &o.nsids {
        Some(want) => want.len(),
        None => target.namespaces().len(),
    };
    if jobs.max(picked) > plan.jobs {
        drop(target);
        plan.jobs = jobs.max(picked);
        target = Target::open(spec, &plan)?;
    }
    let target = Arc::new(target);
    let lbads = target.lbads() as u64;
    if o.io_size == 0 || o.io_size % lbads != 0 {
        return Err(PerfError::Usage(format!(
            "I/O size {} is not a multiple of {}'s {lbads}-byte logical block (try -o {})",
            o.io_size,
            spec.label(),
            lbads.max(4096)
        )));
    }
    let nlb = o.io_size / lbads;
    if nlb > u32::MAX as u64 {
        return Err(PerfError::Usage(format!(
            "I/O size {} is too large",
            o.io_size
        )));
    }
    let nlb = nlb as u32;
    let mut namespaces = target.namespaces();
    if let Some(want) = &o.nsids {
        let have = namespaces
            .iter()
            .map(|n| n.nsid.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let mut picked = Vec::new();
        for &id in want {
            match namespaces.iter().find(|n| n.nsid == id) {
                Some(n) => picked.push(*n),
                None => {
                    return Err(PerfError::NoNamespace {
                        device: spec.label(),
                        nsid: id,
                        have,
                    })
                }
            }
        }
        namespaces = picked;
    }
    // The region under test, per namespace: offset and size in blocks.
    let mut regions = Vec::with_capacity(namespaces.len());
    for ns in &mut namespaces {
        let (first, blocks) = region(&spec.label(), *ns, lbads, o.offset, o.size)?;
        regions.push(first);
        ns.blocks = blocks;
    }
    let mut notes = target.notes();
    let nns = namespaces.len();
    let rows = jobs.max(nns);
    if jobs < nns {
        notes.push(format!(
            "{nns} namespaces on {jobs} job thread(s): a thread drives several, each on its own queue pair at QD {}",
            o.depth
        ));
    }
    // Assign rows to threads, namespaces and ranges (k: the row's number
    // on this device).
    let mut specs = Vec::with_capacity(rows);
    for k in 0..rows {
        let ns = namespaces[k % nns];
        let base = regions[k % nns];
        // Rows on this namespace, and this row's rank among them.
        let peers = (rows - 1 - k % nns) / nns + 1;
        let rank = (k / nns) as u64;
        if ns.blocks < nlb as u64 {
            let have = ns.blocks * lbads;
            let fix = if spec.fake_config().is_some() || spec.fake_ufs_config().is_some() {
                format!(
                    "use -o {} or less, or a larger fake (size= in the device string, e.g. {},size=1G)",
                    crate::report::bytes_text(have),
                    spec.label()
                )
            } else {
                format!("use -o {} or less", crate::report::bytes_text(have))
            };
            return Err(PerfError::Usage(format!(
                "namespace {} of {} holds {} ({} blocks), less than one {} I/O: {fix}",
                ns.nsid,
                spec.label(),
                crate::report::bytes_text(have),
                ns.blocks,
                crate::report::bytes_text(o.io_size)
            )));
        }
        let (first, blocks, seq_start) = if o.verify {
            // Disjoint ranges so no two jobs race on a block's expected contents.
            let share = (ns.blocks / peers as u64) / nlb as u64 * nlb as u64;
            if share < nlb as u64 {
                return Err(PerfError::Usage(format!(
                    "--verify gives each job its own range, but namespace {} is too small for {peers} jobs of {}-byte I/Os",
                    ns.nsid, o.io_size
                )));
            }
            let capped = share
                .min(VERIFY_MAX_BLOCKS / nlb as u64 * nlb as u64)
                .max(nlb as u64);
            if capped < share && k == 0 {
                notes.push(format!("--verify covers the first {capped} blocks of each job's range (state is kept per block)"));
            }
            (base + rank * share, capped, 0)
        } else {
            let positions = ns.blocks / nlb as u64;
            (base, ns.blocks, rank * positions / peers as u64)
        };
        specs.push(JobSpec {
            index: first_row + k,
            thread: mine[k % jobs],
            nsid: ns.nsid,
            first_lba: first,
            blocks,
            nlb,
            seq_start,
            lbads: lbads as u32,
            pattern: o.pattern,
            read_pct: pct,
            depth: o.depth,
            ios_limit: None,
            seed: o.seed,
            verify: o.verify,
            histogram: o.histogram,
            dma: o.dma,
            dma_batch: o.dma_batch,
            distribution: o.distribution,
            rate_iops: None,
            wait: o.wait,
            poll_pause: o.poll_pause.for_device(&spec.kind),
        });
    }
    Ok((target, notes, specs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Namespace;

    /// The region is checked against the namespace and given in blocks.
    #[test]
    fn regions_fit_the_namespace_or_are_typed_errors() {
        let ns = Namespace {
            nsid: 2,
            blocks: 1000,
        };
        assert_eq!(region("fake", ns, 512, 0, None).unwrap(), (0, 1000));
        assert_eq!(region("fake", ns, 512, 4096, Some(8192)).unwrap(), (8, 16));
        assert_eq!(region("fake", ns, 512, 4096, None).unwrap(), (8, 992));
        for (off, size, why) in [
            (100, None, "multiple"),
            (0, Some(100), "multiple"),
            (512_000, None, "does not fit"),
            (0, Some(512_512), "does not fit"),
            (511_488, Some(1024), "does not fit"),
            (512, Some(u64::MAX - 511), "overflows"),
            (512, Some(0), "empty"),
        ] {
            match region("fake", ns, 512, off, size) {
                Err(e @ PerfError::Region { nsid: 2, .. }) => {
                    assert!(e.to_string().contains(why), "{e}")
                }
                other => panic!("{off} {size:?}: {other:?}"),
            }
        }
    }
}
