//! `rw`: write, read back and verify data at random LBAs and sizes, one
//! queue pair per thread; the extents, workers and phases the UFS `ufs-rw`
//! check runs too.

use super::*;

/// One command of the rw check: a byte range of namespace 1.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Extent {
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

/// Non-overlapping extents with random sizes in `[min, max]` (4 KiB steps)
/// and random gaps, inside `[base, base + span)`, totalling at least `want`
/// bytes.
pub(crate) fn make_extents(
    rng: &mut SmallRng,
    base: u64,
    span: u64,
    want: u64,
    min: u64,
    max: u64,
) -> Result<Vec<Extent>, Failure> {
    const STEP: u64 = 4096;
    let mut v = Vec::new();
    let (mut at, mut total) = (base, 0);
    // Average gap of a quarter of the average size keeps ~80% of the span usable.
    let max_gap = (min + max) / 4 / STEP;
    while total < want {
        at += rng.gen_range(0..=max_gap) * STEP;
        let len = rng.gen_range(min / STEP..=max / STEP) * STEP;
        if at + len > base + span {
            return Err(format!(
                "cannot place {want} bytes of I/O in a {span}-byte slice; lower --bytes or --threads"
            ));
        }
        v.push(Extent { offset: at, len });
        at += len;
        total += len;
    }
    Ok(v)
}

/// Run `worker` on `threads` pinned threads, each with its own queue pair
/// moving `B` buffers and its own lane from `make_lane`.
pub(crate) fn spawn_workers<B, L, F>(
    ctrl: &Arc<Controller>,
    threads: usize,
    (shift, seed): (u32, u64),
    plans: &[(Vec<Extent>, SmallRng)],
    make_lane: F,
) -> Vec<Result<WorkerReport, Failure>>
where
    B: IoBuf,
    L: Lane<B = B>,
    F: Fn(&Controller) -> Result<L, Failure> + Sync,
{
    let mut qps = Vec::new();
    for _ in 0..threads {
        match ctrl.create_qpair_for::<B>(QpairOptions::default()) {
            Ok(qp) => qps.push(qp),
            Err(e) => return vec![Err(format!("creating a queue pair: {e}"))],
        }
    }
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let make_lane = &make_lane;
    std::thread::scope(|s| {
        let hs: Vec<_> = qps
            .into_iter()
            .enumerate()
            .map(|(i, mut qp)| {
                let (extents, mut rng) = plans[i].clone();
                let core = (!cores.is_empty()).then(|| cores[i % cores.len()]);
                s.spawn(move || {
                    if let Some(c) = core {
                        core_affinity::set_for_current(c);
                    }
                    let mut lane = make_lane(ctrl)?;
                    let r = worker(&mut qp, &mut lane, shift, seed, &extents, &mut rng);
                    qp.close(|_| ()).map_err(ctx("closing the queue pair"))?;
                    r
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("worker panicked".into())))
            .collect()
    })
}

/// What one worker did.
pub(crate) struct WorkerReport {
    pub(crate) qid: u16,
    pub(crate) ios: u64,
    pub(crate) bytes: u64,
    pub(crate) lane: String,
}

/// Run every extent through the queue pair once, writing (`write`) or
/// reading and verifying, keeping up to the lane's buffer count in flight.
pub(crate) fn phase<Q: Blk<B = L::B>, L: Lane>(
    qp: &mut Q,
    lane: &mut L,
    shift: u32,
    seed: u64,
    extents: &[Extent],
    order: &[usize],
    write: bool,
) -> Result<(), Failure> {
    let what = if write { "write" } else { "read" };
    let mut data = vec![0u8; extents.iter().map(|e| e.len).max().unwrap_or(0) as usize];
    let mut next = 0;
    // Shared with the `done` callback below, which the lane may call from
    // `give`, `tick` or `drain`.
    let finished = Cell::new(0usize);
    let bad: RefCell<Option<Failure>> = RefCell::new(None);
    let done = &mut |tag: u64, bytes: &[u8]| {
        finished.set(finished.get() + 1);
        let e = extents[tag as usize];
        if !write && bad.borrow().is_none() {
            if let Some((at, want, got)) = pattern::first_mismatch(seed, e.offset, bytes) {
                *bad.borrow_mut() = Some(format!(
                    "read of {} bytes at offset {} (LBA {}) returned wrong data: at byte offset {at} expected {want:#018x}, found {got:#018x}",
                    e.len,
                    e.offset,
                    e.offset >> shift
                ));
            }
        }
    };
    let mut last_progress = Instant::now();
    let mut completions = Vec::new();
    while finished.get() < order.len() {
        while next < order.len() {
            let idx = order[next];
            let e = extents[idx];
            let len = e.len as usize;
            let fill = if write {
                pattern::fill(seed, e.offset, &mut data[..len]);
                Some(&data[..len])
            } else {
                None
            };
            let Some(b) = lane.take(idx as u64, len, fill)? else {
                break;
            };
            let (slba, nlb) = (e.offset >> shift, (e.len >> shift) as u32);
            qp.rw(write, slba, nlb, b, idx as u64)
                .map_err(|e2| format!("{what} of {} bytes at offset {}: {e2}", e.len, e.offset))?;
            next += 1;
        }
        qp.ring();
        let n = qp
            .reap(&mut completions)
            .map_err(|e| format!("{what}: {e}"))?;
        for c in completions.drain(..) {
            let e = extents[c.tag as usize];
            c.result.map_err(|err| {
                format!(
                    "{what} of {} bytes at offset {} failed: {err}",
                    e.len, e.offset
                )
            })?;
            let b = c
                .buf
                .ok_or_else(|| format!("{what} completed without its buffer"))?;
            lane.give(b, c.tag, done)?;
        }
        lane.tick(done)?;
        if qp.in_flight() == 0 && finished.get() < order.len() {
            // Nothing in flight, yet not everything came back: the lane (lazy
            // mode) holds the rest until its flush; force it.
            lane.drain(done)?;
        }
        if let Some(b) = bad.borrow_mut().take() {
            return Err(b);
        }
        if n > 0 {
            last_progress = Instant::now();
        } else if last_progress.elapsed() > COMMAND_TIMEOUT {
            return Err(format!(
                "{what}: no completion for {COMMAND_TIMEOUT:?} ({} of {} commands finished)",
                finished.get(),
                order.len()
            ));
        } else {
            std::hint::spin_loop();
        }
    }
    Ok(())
}

/// Write all extents, then read them back in another order and verify.
pub(crate) fn worker<Q: Blk<B = L::B>, L: Lane>(
    qp: &mut Q,
    lane: &mut L,
    shift: u32,
    seed: u64,
    extents: &[Extent],
    rng: &mut SmallRng,
) -> Result<WorkerReport, Failure> {
    let mut order: Vec<usize> = (0..extents.len()).collect();
    order.shuffle(rng);
    phase(qp, lane, shift, seed, extents, &order, true)?;
    order.shuffle(rng);
    phase(qp, lane, shift, seed, extents, &order, false)?;
    Ok(WorkerReport {
        qid: qp.id(),
        ios: 2 * extents.len() as u64,
        bytes: 2 * extents.iter().map(|e| e.len).sum::<u64>(),
        lane: lane.describe(),
    })
}

pub(crate) fn rw(args: &RwArgs) -> Result<(), Failure> {
    let (dev, vectored, a) = (&args.dev, args.vectored, &args.shape);
    let ctrl = open(dev)?;
    let (shift, size) = ns1(&ctrl)?;
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if vectored && a.dma.is_some() {
        return Err(
            "--vectored uses the engine's DmaBufs; it cannot be combined with --dma".into(),
        );
    }
    // An NVMe queue of depth D holds D - 1 commands.
    let max_io = a.check(
        ctrl.max_transfer(),
        usize::from(QpairOptions::default().depth) - 1,
    )?;
    let seed = a.seed();
    let per_thread = a.bytes.div_ceil(threads as u64);
    println!(
        "rw: {} thread(s) x 1 queue pair, {} MiB each in I/Os of {}..{} KiB at QD {}, buffers: {}, seed {seed:#x}",
        threads,
        per_thread >> 20,
        a.min_io >> 10,
        max_io >> 10,
        a.qd,
        match (a.dma, vectored) {
            (Some(m), _) => format!("{m} mapping"),
            (None, true) => "vectored: scattered 4 KiB DmaBufs per command".to_string(),
            (None, false) => "engine DmaBufs".to_string(),
        }
    );
    let plans = a.plans(seed, threads, size, max_io)?;
    let t0 = Instant::now();
    let reports: Vec<Result<WorkerReport, Failure>> = match a.dma {
        None if vectored => Vec::new(),
        None => mcqio::run_per_core(&ctrl, threads, QpairOptions::default(), |i, qp| {
            let (extents, mut rng) = plans[i].clone();
            let mut lane = DmaBufLane::new(&ctrl, a.qd, max_io as usize)?;
            worker(qp, &mut lane, shift, seed, &extents, &mut rng)
        })
        .map_err(ctx("running the workers"))?,
        Some(mode) => {
            spawn_workers::<Mapped, _, _>(&ctrl, threads, (shift, seed), &plans, |ctrl| {
                MapperLane::new(ctrl, mode, a.qd, max_io as usize)
            })
        }
    };
    let reports = match (reports, vectored) {
        (r, false) => r,
        (_, true) => {
            spawn_workers::<Vec<DmaBuf>, _, _>(&ctrl, threads, (shift, seed), &plans, |ctrl| {
                VecLane::new(ctrl, a.qd, max_io as usize, seed)
            })
        }
    };
    let secs = t0.elapsed().as_secs_f64();
    let mut qids = Vec::new();
    let (mut ios, mut bytes) = (0, 0);
    for (i, r) in reports.into_iter().enumerate() {
        let r = r.map_err(|e| format!("thread {i}: {e}"))?;
        println!(
            "  thread {i}: queue pair {}, {} commands, {} MiB written and read back; {}",
            r.qid,
            r.ios,
            r.bytes >> 21,
            r.lane
        );
        qids.push(r.qid);
        ios += r.ios;
        bytes += r.bytes;
    }
    qids.sort_unstable();
    qids.dedup();
    if qids.len() != threads {
        return Err(format!("{threads} threads shared queue pairs: {qids:?}"));
    }
    println!(
        "rw: OK: {} commands, {} MiB written and read back identical in {secs:.2} s ({} distinct queue pairs)",
        ios,
        bytes >> 21,
        qids.len()
    );
    Ok(())
}
