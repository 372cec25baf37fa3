//! The NVMe/TCP checks (`tcp-*`): mcqio's initiator against a target
//! named by `tcp:<addr>:<port>/<nqn>[,hdgst,ddgst]` — in the guest, Linux's
//! nvmet-tcp on loopback, backed by QEMU's NVMe namespace; on any host,
//! the fixtures' fake target.
//!
//! - `tcp-rw`: every I/O size class (in-capsule, one R2T, several H2CData
//!   per command, large reads), written, read back and verified with the
//!   positional pattern, one queue pair (one connection) per thread, each
//!   pinned to its core; the wire counters show which PDUs moved.
//! - `tcp-reset`: a reconnect with reads in flight: each ends once, and the
//!   queue pairs carry on.
//! - `tcp-write-pattern` / `tcp-check-pattern`: the cross-check with the
//!   kernel's initiator (and the local namespace under the target).

use mcqio::nvme::tcp::{TcpController, TcpQpairStats, TcpQueuePair};
use mcqio::IoError;
use mcqio_open::{Backing, Device, DeviceSpec};

use super::*;

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct TcpDevArgs {
    /// `tcp:<addr>:<port>/<subsystem nqn>[,hdgst,ddgst]`.
    #[arg(short, long)]
    pub(crate) device: String,
}

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct TcpRwArgs {
    #[command(flatten)]
    pub(crate) dev: TcpDevArgs,
    /// Bytes written (and then read back) over all size classes (k, M, G
    /// suffixes).
    #[arg(long, default_value = "64M", value_parser = parse_bytes)]
    pub(crate) bytes: u64,
    /// Threads, each with its own queue pair (default: one per CPU).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Commands in flight per queue pair.
    #[arg(long, default_value_t = 8)]
    pub(crate) qd: usize,
    /// Byte offset on namespace 1 where the checked region starts.
    #[arg(long, default_value_t = 0)]
    pub(crate) offset: u64,
    /// Pattern seed (default: from the clock).
    #[arg(long)]
    pub(crate) seed: Option<u64>,
}

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct TcpPatternArgs {
    #[command(flatten)]
    pub(crate) dev: TcpDevArgs,
    #[command(flatten)]
    pub(crate) region: PatternArgs,
}

/// The largest command the checks send (the many-H2CData class needs
/// more than two MAXH2CDATA; Linux's nvmet-tcp gives 4 MiB).
const MAX_COMMAND: u64 = 16 << 20;

fn parse_bytes(s: &str) -> Result<u64, String> {
    mcqio_open::devstr::parse_size(s).map_err(|e| e.to_string())
}

fn connect(a: &TcpDevArgs) -> Result<Arc<TcpController>, Failure> {
    let spec: DeviceSpec = a.device.parse().map_err(ctx(&a.device))?;
    let Backing::Tcp { addr, mut options } =
        spec.backing("mcqio-vm-tests").map_err(ctx(&a.device))?
    else {
        return Err(format!("{} is not a tcp: device", a.device));
    };
    options.max_transfer = MAX_COMMAND;
    options.io_queues = options.io_queues.max(8);
    let mut copts = mcqio_open::CtrlOptions::default();
    copts.nvme.max_transfer = MAX_COMMAND;
    let opened = Backing::Tcp { addr, options }
        .open(&copts)
        .map_err(|e| format!("{}: {}", a.device, e.why()))?;
    let Device::Tcp(c) = opened.device else {
        return Err(format!("{} did not open as NVMe/TCP", a.device));
    };
    println!(
        "connected to {} as controller {}: {} namespace(s), {} I/O queues, in-capsule {} B, MAXH2CDATA {} B, max transfer {} B, digests header {} data {}",
        c.addr(),
        c.cntlid(),
        c.namespaces().len(),
        c.granted_io_queues(),
        c.in_capsule_bytes(),
        c.maxh2cdata(),
        c.max_transfer(),
        c.options().header_digest,
        c.options().data_digest,
    );
    Ok(c)
}

fn qpair(c: &Arc<TcpController>) -> Result<TcpQueuePair, Failure> {
    let most = c.cap().max_queue_entries().saturating_sub(1).clamp(1, 4096) as u16;
    let d = QpairOptions::default();
    c.create_qpair(QpairOptions {
        depth: d.depth.min(most),
        ..d
    })
    .map_err(ctx("creating a queue pair"))
}

fn ns1(c: &TcpController) -> Result<(u32, u64), Failure> {
    let ns = c
        .namespace(NSID)
        .ok_or_else(|| format!("namespace {NSID} is not active on {}", c.addr()))?;
    Ok((ns.lba_shift, ns.size_bytes()))
}

/// Byte ranges of namespace 1, one command each: (offset, length).
type Extents = Vec<(u64, u64)>;

/// What one `tcp-rw` thread reports: its lines and the bytes it wrote.
type ThreadReport = Result<(Vec<String>, u64), Failure>;

/// A size class: its name and the bytes per command.
#[derive(Copy, Clone, Debug)]
struct Class {
    name: &'static str,
    len: u64,
}

/// The classes on this target: in the capsule, one R2T and one H2CData,
/// one R2T answered by several H2CData (and as many bytes per C2HData as
/// the target sends).
fn classes(c: &TcpController) -> Vec<Class> {
    let block = 4096u64;
    let icd = (c.in_capsule_bytes() as u64) / block * block;
    let h2c = u64::from(c.maxh2cdata());
    let mut v = Vec::new();
    if icd >= block {
        v.push(Class {
            name: "in-capsule",
            len: icd.min(8192).max(block),
        });
    }
    let one = (icd + block).max(64 << 10).min(h2c / block * block);
    if one > icd {
        v.push(Class {
            name: "one-r2t",
            len: one,
        });
    }
    let many = (2 * h2c + block).div_ceil(block) * block;
    if many <= MAX_COMMAND.min(c.max_transfer()) {
        v.push(Class {
            name: "many-h2cdata",
            len: many,
        });
    }
    v
}

/// Write (or read and verify) `extents` through `qp`, keeping up to `qd`
/// in flight; every command must end once, with success.
fn pump(
    qp: &mut TcpQueuePair,
    c: &TcpController,
    shift: u32,
    seed: u64,
    extents: &[(u64, u64)],
    qd: usize,
    write: bool,
) -> Result<(), Failure> {
    let what = if write { "write" } else { "read" };
    let max = extents.iter().map(|e| e.1).max().unwrap_or(0) as usize;
    let mut free: Vec<DmaBuf> = (0..qd.min(extents.len()).max(1))
        .map(|_| c.alloc_buf(max, DmaDir::Bidirectional))
        .collect::<Result<_, _>>()
        .map_err(ctx("allocating buffers"))?;
    let mut ended = vec![0u8; extents.len()];
    let (mut next, mut done) = (0, 0);
    let deadline = Instant::now() + COMMAND_TIMEOUT * 4;
    while done < extents.len() {
        while next < extents.len() && !free.is_empty() && !qp.is_full() {
            let (off, len) = extents[next];
            let mut buf = free.pop().expect("non-empty");
            let n = len as usize;
            let blocks = (len >> shift) as u32;
            let r = if write {
                pattern::fill(seed, off, &mut buf.as_mut_slice()[..n]);
                qp.write(NSID, off >> shift, blocks, buf, next as u64)
            } else {
                buf.as_mut_slice()[..n].fill(POISON);
                qp.read(NSID, off >> shift, blocks, buf, next as u64)
            };
            if let Err(e) = r {
                return Err(format!("{what} at {off}+{len}: refused: {:?}", e.kind));
            }
            next += 1;
        }
        qp.submit();
        let mut bad = None;
        qp.poll(qd, |cp| {
            let i = cp.tag as usize;
            let (off, len) = extents[i];
            ended[i] += 1;
            done += 1;
            if let Err(e) = cp.result {
                bad.get_or_insert(format!("{what} at {off}+{len}: {e:?}"));
            }
            match cp.buf {
                Some(b) => {
                    if !write && bad.is_none() {
                        if let Some((at, want, got)) =
                            pattern::first_mismatch(seed, off, &b.as_slice()[..len as usize])
                        {
                            bad = Some(format!(
                                "read at {off}+{len}: byte offset {at} holds {got:#018x}, expected {want:#018x}"
                            ));
                        }
                    }
                    free.push(b);
                }
                None => {
                    bad.get_or_insert(format!("{what} at {off}+{len}: no buffer came back"));
                }
            }
        })
        .map_err(ctx(what))?;
        if let Some(b) = bad {
            return Err(b);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{what}: {} of {} commands ended in {:?}",
                done,
                extents.len(),
                COMMAND_TIMEOUT * 4
            ));
        }
    }
    if let Some(i) = ended.iter().position(|&n| n != 1) {
        return Err(format!("{what} {i} ended {} times", ended[i]));
    }
    Ok(())
}

fn delta(a: TcpQpairStats, b: TcpQpairStats) -> String {
    format!(
        "{} sendmsg, {} recv, {} PDUs in, {} C2HData, {} R2T, {} H2CData, {} in-capsule writes",
        b.sends - a.sends,
        b.recvs - a.recvs,
        b.pdus - a.pdus,
        b.c2h_data - a.c2h_data,
        b.r2ts - a.r2ts,
        b.h2c_data - a.h2c_data,
        b.in_capsule_writes - a.in_capsule_writes
    )
}

pub(crate) fn rw(a: &TcpRwArgs) -> Result<(), Failure> {
    let c = connect(&a.dev)?;
    let (shift, size) = ns1(&c)?;
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, c.granted_io_queues());
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let classes = classes(&c);
    if classes.len() < 2 {
        return Err(format!(
            "this target allows only the classes {classes:?} (in-capsule {} B, MAXH2CDATA {} B, max transfer {} B)",
            c.in_capsule_bytes(),
            c.maxh2cdata(),
            c.max_transfer()
        ));
    }
    if !classes.iter().any(|k| k.name == "many-h2cdata") {
        println!(
            "tcp-rw: no many-h2cdata class: commands are capped at {} B{}",
            c.max_transfer(),
            if c.options().within_maxh2cdata {
                " (MAXH2CDATA: a target may refuse a longer command, as Linux's nvmet-tcp does since it bounds its per-command buffer; see TcpOptions::within_maxh2cdata)"
            } else if c.options().data_digest && c.options().one_h2c_with_data_digest {
                " (MAXH2CDATA: with data digests every write goes in one H2CData, see TcpOptions::one_h2c_with_data_digest)"
            } else {
                ""
            }
        );
    }
    // Each class gets its share of the bytes, cut in per-thread slices of
    // the region: commands never overlap, so every read has one writer.
    let share = a.bytes.div_ceil(classes.len() as u64);
    let mut plan: Vec<Vec<(Class, Extents)>> = vec![Vec::new(); threads];
    let mut at = a.offset;
    for cl in &classes {
        let per_thread = share.div_ceil(threads as u64).div_ceil(cl.len).max(1);
        for p in plan.iter_mut() {
            let ext: Extents = (0..per_thread).map(|i| (at + i * cl.len, cl.len)).collect();
            at += per_thread * cl.len;
            p.push((*cl, ext));
        }
    }
    if at > size {
        return Err(format!(
            "the plan needs {at} bytes of namespace 1, which has {size}"
        ));
    }
    println!(
        "tcp-rw: {} threads, QD {}, seed {seed}, classes {}, region {}..{at}",
        threads,
        a.qd,
        classes
            .iter()
            .map(|c| format!("{} {} B", c.name, c.len))
            .collect::<Vec<_>>()
            .join(", "),
        a.offset
    );
    let mut qps = Vec::new();
    for _ in 0..threads {
        qps.push(qpair(&c)?);
    }
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let t0 = Instant::now();
    let results: Vec<ThreadReport> = std::thread::scope(|s| {
        let hs: Vec<_> = qps
            .into_iter()
            .zip(&plan)
            .enumerate()
            .map(|(i, (mut qp, mine))| {
                let core = (!cores.is_empty()).then(|| cores[i % cores.len()]);
                let c = &c;
                s.spawn(move || {
                    if let Some(core) = core {
                        core_affinity::set_for_current(core);
                    }
                    let mut lines = Vec::new();
                    let mut bytes = 0;
                    for (cl, ext) in mine {
                        for write in [true, false] {
                            let s0 = qp.stats();
                            pump(&mut qp, c, shift, seed, ext, a.qd, write)
                                .map_err(|e| format!("{} {e}", cl.name))?;
                            let s1 = qp.stats();
                            check_class(cl, c, ext.len() as u64, write, s0, s1)?;
                            lines.push(format!(
                                "  qid {} {:<13} {:>5} x {:>8} B {}: {}",
                                qp.qid(),
                                cl.name,
                                ext.len(),
                                cl.len,
                                if write { "write" } else { "read " },
                                delta(s0, s1)
                            ));
                            bytes += ext.len() as u64 * cl.len;
                        }
                    }
                    qp.close(|_| ()).map_err(ctx("closing the queue pair"))?;
                    Ok((lines, bytes))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("worker panicked".into())))
            .collect()
    });
    let mut total = 0;
    for r in results {
        let (lines, bytes) = r?;
        for l in lines {
            println!("{l}");
        }
        total += bytes;
    }
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "tcp-rw: {total} bytes written and {total} read back identical on {threads} queue pairs in {dt:.2} s ({:.1} MiB/s)",
        2.0 * total as f64 / dt / f64::from(1 << 20)
    );
    Ok(())
}

/// The wire did what the class says: in-capsule writes carried their
/// data, R2T writes were asked for by the target, the many-H2CData class
/// sent more than one H2CData per command.
fn check_class(
    cl: &Class,
    c: &TcpController,
    n: u64,
    write: bool,
    s0: TcpQpairStats,
    s1: TcpQpairStats,
) -> Result<(), Failure> {
    let (icw, r2t, h2c, c2h) = (
        s1.in_capsule_writes - s0.in_capsule_writes,
        s1.r2ts - s0.r2ts,
        s1.h2c_data - s0.h2c_data,
        s1.c2h_data - s0.c2h_data,
    );
    let ok = match (cl.name, write) {
        ("in-capsule", true) => icw == n && r2t == 0 && h2c == 0,
        ("one-r2t", true) => icw == 0 && r2t >= n && h2c >= n,
        ("many-h2cdata", true) => {
            icw == 0 && h2c >= n * cl.len.div_ceil(u64::from(c.maxh2cdata().max(1))) && h2c > r2t
        }
        (_, false) => c2h >= n && icw == 0 && h2c == 0,
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{} {}: {n} commands moved {icw} in-capsule writes, {r2t} R2Ts, {h2c} H2CData, {c2h} C2HData",
            cl.name,
            if write { "write" } else { "read" }
        ))
    }
}

/// A reconnect with reads in flight on one queue pair and another idle:
/// each read ends exactly once (done, with its data, or aborted by the
/// reset), and both queue pairs work on the new association.
pub(crate) fn reset(a: &TcpDevArgs) -> Result<(), Failure> {
    let c = connect(a)?;
    let (shift, _) = ns1(&c)?;
    let mut q1 = qpair(&c)?;
    let mut q2 = qpair(&c)?;
    // Data to check after the reset, written before it.
    let seed = 0x7463_7072_6573_6574;
    // One command per read (at most 256 KiB): 16 in flight fit the queue
    // whatever the transfer limit (MAXH2CDATA may cap it).
    let len = (256u64 << 10).min(c.max_transfer()) >> shift << shift;
    let base = 0u64;
    let ext: Vec<(u64, u64)> = (0..16).map(|i| (base + i * len, len)).collect();
    pump(&mut q1, &c, shift, seed, &ext, 16, true)?;
    let cntlid = c.cntlid();
    let n = ext.len();
    for (i, &(off, len)) in ext.iter().enumerate() {
        let b = c
            .alloc_buf(len as usize, DmaDir::Bidirectional)
            .map_err(ctx("allocating"))?;
        q1.read(NSID, off >> shift, (len >> shift) as u32, b, i as u64)
            .map_err(|e| format!("read {i} refused: {:?}", e.kind))?;
    }
    q1.submit();
    c.reset().map_err(ctx("reset (reconnect)"))?;
    let (mut ok, mut aborted) = (0, 0);
    let mut ended = vec![0u32; n];
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let mut bad = None;
    while ended.iter().sum::<u32>() < n as u32 {
        if Instant::now() > deadline {
            return Err(format!("reads after the reset: {ended:?} ended (a hang)"));
        }
        q1.poll(n, |cp| {
            let i = cp.tag as usize;
            ended[i] += 1;
            match cp.result {
                Ok(()) => {
                    ok += 1;
                    let (off, len) = ext[i];
                    let b = cp.buf.as_ref().expect("a read has a buffer");
                    if pattern::first_mismatch(seed, off, &b.as_slice()[..len as usize]).is_some() {
                        bad.get_or_insert(format!("read {i} completed with wrong data"));
                    }
                }
                Err(IoError::AbortedByReset) => aborted += 1,
                Err(e) => {
                    bad.get_or_insert(format!("read {i} ended with {e:?}"));
                }
            }
            if cp.buf.is_none() {
                bad.get_or_insert(format!("read {i}: no buffer came back"));
            }
        })
        .map_err(ctx("poll after the reset"))?;
        if let Some(b) = bad.take() {
            return Err(b);
        }
    }
    if ended.iter().any(|&e| e != 1) {
        return Err(format!("each read must end once: {ended:?}"));
    }
    println!(
        "reset: controller {cntlid} -> {} ({} reset), {n} reads in flight: {ok} done with their data, {aborted} aborted by the reset, each once",
        c.cntlid(),
        c.resets()
    );
    // Both queue pairs carry on. q2 was idle through the reset: the
    // engine notices a reset at a queue pair's next poll and ends what was
    // queued before it (AbortedByReset), so it polls first.
    q2.poll(8, |_| ())
        .map_err(ctx("q2's first poll after the reset"))?;
    pump(&mut q2, &c, shift, seed, &ext, 8, false).map_err(ctx("q2 after the reset"))?;
    let seed2 = seed ^ 0xff;
    pump(&mut q1, &c, shift, seed2, &ext, 8, true).map_err(ctx("q1 write after the reset"))?;
    pump(&mut q2, &c, shift, seed2, &ext, 8, false).map_err(ctx("q2 read after the reset"))?;
    println!(
        "reset: both queue pairs read and wrote {} bytes afterwards (recoveries: q1 {}, q2 {})",
        n as u64 * len,
        q1.stats().counters.recoveries,
        q2.stats().counters.recoveries
    );
    Ok(())
}

/// The cross-check region through mcqio over TCP, one command per MiB.
fn region(a: &TcpPatternArgs) -> Result<(Arc<TcpController>, u32, Extents), Failure> {
    let c = connect(&a.dev)?;
    let (shift, size) = ns1(&c)?;
    let p = a.region;
    let mask = (1u64 << shift) - 1;
    if p.len == 0 || p.offset & mask != 0 || p.len & mask != 0 || p.offset + p.len > size {
        return Err(format!(
            "region {}+{} must be whole blocks inside namespace {NSID} ({size} bytes)",
            p.offset, p.len
        ));
    }
    const CHUNK: u64 = 1 << 20;
    let ext = (0..p.len.div_ceil(CHUNK))
        .map(|i| (p.offset + i * CHUNK, (p.len - i * CHUNK).min(CHUNK)))
        .collect();
    Ok((c, shift, ext))
}

pub(crate) fn write_pattern(a: &TcpPatternArgs) -> Result<(), Failure> {
    let (c, shift, ext) = region(a)?;
    let mut qp = qpair(&c)?;
    pump(&mut qp, &c, shift, a.region.seed, &ext, 8, true)?;
    qp.flush_blocking(NSID).map_err(ctx("flush"))?;
    println!(
        "wrote {} bytes of pattern seed {} at offset {} through mcqio over NVMe/TCP ({}), flushed",
        a.region.len,
        a.region.seed,
        a.region.offset,
        c.addr()
    );
    Ok(())
}

pub(crate) fn check_pattern(a: &TcpPatternArgs) -> Result<(), Failure> {
    let (c, shift, ext) = region(a)?;
    let mut qp = qpair(&c)?;
    pump(&mut qp, &c, shift, a.region.seed, &ext, 8, false)?;
    println!(
        "read {} bytes at offset {} through mcqio over NVMe/TCP ({}): identical to pattern seed {}",
        a.region.len,
        a.region.offset,
        c.addr(),
        a.region.seed
    );
    Ok(())
}
