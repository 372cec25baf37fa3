//! `mcqio-ublk`: serve an mcqio device as `/dev/ublkbN` (see the crate docs).

use std::fs::OpenOptions;
use std::os::fd::OwnedFd;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use mcqio::{ControllerOptions, WaitPolicy};
use mcqio_open::{CtrlOptions, DeviceSpec};
use mcqio_ublk::ctrl::{self, Control};
use mcqio_ublk::device::{self, QueueEvent, ServeOptions};
use mcqio_ublk::null::NullMode;
use mcqio_ublk::sys;

#[derive(Parser)]
#[command(
    name = "mcqio-ublk",
    about = "Serve a namespace or logical unit mcqio drives as a kernel block device (/dev/ublkbN)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create /dev/ublkbN on a device and serve it in the foreground until
    /// SIGINT or SIGTERM, then delete it.
    Add {
        /// The device: vfio:<BDF> (NVMe or UFS bound to vfio-pci), fake[,size=..,lbs=..],
        /// fake-ufs[,...], tcp:<addr>:<port>/<nqn>[,hdgst,ddgst,...] (an NVMe/TCP target)
        /// (mcqio's device-string language).
        device: String,
        /// ublk queues, each served by one pinned thread with its own
        /// engine queue pair.
        #[arg(long, short = 'q', default_value_t = 1)]
        queues: u16,
        /// Tags (requests in flight) per queue.
        #[arg(long, short = 'd', default_value_t = 64)]
        depth: u16,
        /// The ublk device id (N of /dev/ublkbN); default: the driver picks.
        #[arg(long)]
        id: Option<u32>,
        /// The NVMe namespace id or UFS LUN to serve (default: the first).
        #[arg(long)]
        unit: Option<u32>,
        /// Largest request (bytes; the per-tag buffer); capped at the
        /// engine's max transfer.
        #[arg(long, default_value_t = device::DEFAULT_MAX_IO, value_parser = parse_size)]
        max_io: u64,
        /// Move data by pread/pwrite on /dev/ublkcN (UBLK_F_USER_COPY)
        /// instead of the kernel copying through the buffer address.
        #[arg(long)]
        user_copy: bool,
        /// Keep the block device if the server dies (USER_RECOVERY with
        /// reissue): its requests wait for `mcqio-ublk recover`. VFIO
        /// devices only.
        #[arg(long)]
        recovery: bool,
        #[command(flatten)]
        timeouts: IoTimeoutArgs,
        /// How a queue thread waits when both rings are idle: irq (sleep at
        /// once, on the ublk ring and the engine queue's interrupt
        /// together), hybrid[:SPIN] (spin SPIN after the last work, then
        /// sleep), poll (spin while the engine owes completions).
        #[arg(long, default_value = "irq")]
        wait: WaitPolicy,
        /// Diagnostics, not storage: answer every request at once without
        /// the engine (the device only lends its DMA memory); `copy`
        /// keeps the kernel's data copy, `nocopy` (needs --user-copy)
        /// moves no data. Reads return garbage, writes are dropped.
        #[arg(long)]
        null: Option<NullMode>,
    },
    /// Take over a device added with --recovery whose server died, and
    /// serve it in the foreground as `add` does (same device string).
    Recover {
        /// The device the dead server served (vfio:<BDF>).
        device: String,
        /// The ublk device id.
        #[arg(long)]
        id: u32,
        /// The NVMe namespace id or UFS LUN it served (default: the first).
        #[arg(long)]
        unit: Option<u32>,
        #[command(flatten)]
        timeouts: IoTimeoutArgs,
        #[command(flatten)]
        quiesce: QuiesceArgs,
        /// How a queue thread waits when both rings are idle: irq (sleep at
        /// once, on the ublk ring and the engine queue's interrupt
        /// together), hybrid[:SPIN] (spin SPIN after the last work, then
        /// sleep), poll (spin while the engine owes completions).
        #[arg(long, default_value = "irq")]
        wait: WaitPolicy,
    },
    /// List the ublk devices.
    List,
    /// Stop and delete ublk devices (whose server is gone, or is to go).
    Del {
        /// Device ids.
        ids: Vec<u32>,
        /// Every ublk device.
        #[arg(long, short = 'a')]
        all: bool,
    },
}

fn parse_size(s: &str) -> Result<u64, String> {
    mcqio_open::devstr::parse_size(s).map_err(|e| e.to_string())
}

/// Durations as every mcqio frontend reads them (`-t`, `kato=`): seconds
/// or with a unit (`30s`, `500ms`, `2m`).
fn parse_duration(s: &str) -> Result<Duration, String> {
    mcqio_open::devstr::parse_duration(s).map_err(|e| e.to_string())
}

/// The engine's per-command timeout, shared by `add` and `recover`.
#[derive(clap::Args)]
struct IoTimeoutArgs {
    /// Engine per-command timeout: seconds or with a unit (30s, 500ms,
    /// 2m; 0: none).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    io_timeout: Duration,
    /// Deprecated spelling of --io-timeout in milliseconds, kept for one
    /// release.
    #[arg(long, hide = true, conflicts_with = "io_timeout")]
    io_timeout_ms: Option<u64>,
}

impl IoTimeoutArgs {
    /// The timeout to give the engine (`None`: none).
    fn io_timeout(&self) -> Option<Duration> {
        let t = self
            .io_timeout_ms
            .map_or(self.io_timeout, Duration::from_millis);
        (!t.is_zero()).then_some(t)
    }

    /// Say so on stderr when the deprecated flag was used.
    fn warn_deprecated(&self) {
        if let Some(ms) = self.io_timeout_ms {
            eprintln!("mcqio-ublk: --io-timeout-ms is deprecated: use --io-timeout {ms}ms");
        }
    }
}

/// `recover`: how long the dead server's device may take to be quiesced.
#[derive(clap::Args)]
struct QuiesceArgs {
    /// How long to wait for the dead server's device to be quiesced and
    /// released by the kernel: seconds or with a unit (30s, 2m).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    quiesce_timeout: Duration,
    /// Deprecated spelling of --quiesce-timeout in seconds, kept for one
    /// release.
    #[arg(long, hide = true, conflicts_with = "quiesce_timeout")]
    wait_s: Option<u64>,
}

impl QuiesceArgs {
    fn timeout(&self) -> Duration {
        self.wait_s
            .map_or(self.quiesce_timeout, Duration::from_secs)
    }

    fn warn_deprecated(&self) {
        if let Some(s) = self.wait_s {
            eprintln!("mcqio-ublk: --wait-s is deprecated: use --quiesce-timeout {s}s");
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Add {
            device,
            queues,
            depth,
            id,
            unit,
            max_io,
            user_copy,
            recovery,
            timeouts,
            wait,
            null,
        } => {
            timeouts.warn_deprecated();
            add(AddArgs {
                device,
                queues,
                depth,
                id,
                unit,
                max_io,
                user_copy,
                recovery,
                io_timeout: timeouts.io_timeout(),
                wait,
                null,
            })
        }
        Cmd::Recover {
            device,
            id,
            unit,
            timeouts,
            quiesce,
            wait,
        } => {
            timeouts.warn_deprecated();
            quiesce.warn_deprecated();
            recover(
                &device,
                id,
                unit,
                timeouts.io_timeout(),
                quiesce.timeout(),
                wait,
            )
        }
        Cmd::List => list(),
        Cmd::Del { ids, all } => del(ids, all),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mcqio-ublk: {e}");
            ExitCode::FAILURE
        }
    }
}

fn wait_name(w: WaitPolicy) -> String {
    match w {
        WaitPolicy::Poll => "poll".into(),
        WaitPolicy::Interrupt => "irq".into(),
        WaitPolicy::Hybrid { spin } => format!("hybrid:{}us", spin.as_micros()),
    }
}

struct AddArgs {
    device: String,
    queues: u16,
    depth: u16,
    id: Option<u32>,
    unit: Option<u32>,
    max_io: u64,
    user_copy: bool,
    recovery: bool,
    io_timeout: Option<Duration>,
    wait: WaitPolicy,
    null: Option<NullMode>,
}

/// How a served device goes live once every queue has fetched its tags.
#[derive(Copy, Clone, PartialEq, Eq)]
enum Live {
    /// A new device: START_DEV.
    Start,
    /// A device taken over after its server died: END_USER_RECOVERY.
    EndRecovery,
}

fn add(a: AddArgs) -> Result<(), String> {
    if a.queues == 0 {
        return Err("--queues must be at least 1".into());
    }
    if a.depth == 0 || a.depth > sys::MAX_QUEUE_DEPTH {
        return Err(format!("--depth must be 1 to {}", sys::MAX_QUEUE_DEPTH));
    }
    // The engine first: a device that cannot be opened leaves nothing
    // behind in the kernel. A PCI function still bound to its kernel
    // driver is refused here (it is not on vfio-pci).
    let spec: DeviceSpec = a.device.parse().map_err(|e| format!("{e}"))?;
    if a.null.is_some() && a.recovery {
        return Err("--null serves no data: nothing to recover".into());
    }
    if a.null == Some(NullMode::NoCopy) && !a.user_copy {
        return Err(
            "--null nocopy needs --user-copy (in copy mode the kernel always copies)".into(),
        );
    }
    if a.recovery {
        mcqio_ublk::recover::recoverable(&spec).map_err(|e| format!("--recovery: {e}"))?;
    }
    let mut backing = spec.backing("mcqio-ublk").map_err(|e| e.to_string())?;
    // NVMe/TCP: one connection per ublk queue; ask for as many I/O queues
    // unless the device string gives `qpairs=`.
    if let mcqio_open::Backing::Tcp { options, .. } = &mut backing {
        if spec.opts.qpairs.is_none() {
            options.io_queues = a.queues;
        }
    }
    let mut copts = CtrlOptions {
        nvme: ControllerOptions {
            io_queues: a.queues,
            max_transfer: a.max_io,
            ..ControllerOptions::default()
        },
        ..CtrlOptions::default()
    };
    if let Some(mcq) = spec.opts.mcq {
        copts.ufs.mcq = mcq;
    }
    let opened = backing
        .open(&copts)
        .map_err(|e| format!("{}: {e}", spec.label()))?;
    let dev = opened.device.clone();
    if dev.granted_queues() < usize::from(a.queues) {
        return Err(format!(
            "{}: the controller granted {} queue pairs, {} asked for (use --queues {})",
            spec.label(),
            dev.granted_queues(),
            a.queues,
            dev.granted_queues()
        ));
    }
    let unit = device::unit(&dev, a.unit)?;
    let caps = device::caps_of(&dev, &unit, a.max_io);
    let params = device::params_of(&caps);

    let mut ctl = Control::open().map_err(|e| e.to_string())?;
    let features = ctl.features().map_err(|e| e.to_string())?;
    let mut flags = sys::F_URING_CMD_COMP_IN_TASK | sys::F_CMD_IOCTL_ENCODE;
    if a.user_copy {
        if features & sys::F_USER_COPY == 0 {
            return Err(format!(
                "the driver has no USER_COPY (features {})",
                ctrl::flag_names(features)
            ));
        }
        flags |= sys::F_USER_COPY;
    }
    if a.recovery {
        let want = sys::F_USER_RECOVERY | sys::F_USER_RECOVERY_REISSUE;
        if features & want != want {
            return Err(format!(
                "the driver has no USER_RECOVERY with reissue (features {})",
                ctrl::flag_names(features)
            ));
        }
        flags |= want;
    }
    let info = ctl
        .add(sys::DevInfo {
            nr_hw_queues: a.queues,
            queue_depth: a.depth,
            max_io_buf_bytes: caps.max_io,
            dev_id: a.id.unwrap_or(u32::MAX),
            flags,
            ..sys::DevInfo::default()
        })
        .map_err(|e| e.to_string())?;
    let id = info.dev_id;
    // From here on the kernel has a device: every way out deletes it.
    let r = ctl
        .set_params(id, &params)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            serve_device(
                &mut ctl,
                id,
                &info,
                &dev,
                &unit,
                caps,
                &a.device,
                Serving {
                    io_timeout: a.io_timeout,
                    wait: a.wait,
                    null: a.null,
                },
                Live::Start,
            )
        });
    if let Err(e) = ctl.delete(id) {
        eprintln!("mcqio-ublk: deleting device {id}: {e}");
    } else {
        eprintln!("mcqio-ublk: device {id} deleted");
    }
    drop(opened);
    r
}

/// How the queues serve (the options `add` and `recover` share).
struct Serving {
    io_timeout: Option<Duration>,
    wait: WaitPolicy,
    null: Option<NullMode>,
}

#[allow(clippy::too_many_arguments)]
fn serve_device(
    ctl: &mut Control,
    id: u32,
    info: &sys::DevInfo,
    dev: &mcqio_open::Device,
    unit: &mcqio_open::BlockUnit,
    caps: mcqio_ublk::target::Caps,
    label: &str,
    how: Serving,
    live: Live,
) -> Result<(), String> {
    let cdev = open_cdev(id)?;
    let term = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // A second signal while shutting down exits at once.
        signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, Arc::clone(&term))
            .and_then(|_| signal_hook::flag::register(sig, Arc::clone(&term)))
            .map_err(|e| format!("signal handler: {e}"))?;
    }
    let stop = AtomicBool::new(false);
    let o = ServeOptions {
        cdev: cdev.clone(),
        depth: info.queue_depth,
        user_copy: info.flags & sys::F_USER_COPY != 0,
        caps,
        io_timeout: how.io_timeout,
        wait: how.wait,
        null: how.null,
    };
    let (tx, rx) = mpsc::channel();
    let queues = info.nr_hw_queues;
    let unit_id = unit.id;
    std::thread::scope(|s| {
        let server = s.spawn(|| device::serve(dev, unit_id, queues, &o, tx, &stop));
        let mut fetched = 0;
        let mut failed = None;
        while fetched < queues && failed.is_none() {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(QueueEvent::Fetched(_)) => fetched += 1,
                Ok(QueueEvent::Failed(_, e)) => failed = Some(e),
                Err(mpsc::RecvTimeoutError::Timeout) if server.is_finished() => {
                    failed = Some("the queue threads ended before fetching".into())
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    failed = Some("the queue threads ended before fetching".into())
                }
            }
        }
        let pid = std::process::id() as i32;
        let started = match (failed, live) {
            (None, Live::Start) => ctl.start(id, pid).map_err(|e| e.to_string()),
            (None, Live::EndRecovery) => ctl.end_recovery(id, pid).map_err(|e| e.to_string()),
            (Some(e), _) => Err(e),
        };
        match &started {
            Ok(()) => eprintln!(
                "mcqio-ublk: /dev/ublkb{id} {}: {} x {} B blocks ({} MiB) of {} unit {}, {} queue(s) x {} tags, max I/O {} KiB, {}{}{}{}, {} mode, wait {}{}",
                if live == Live::Start { "ready" } else { "recovered, ready" },
                caps.blocks,
                1u64 << caps.block_shift,
                (caps.blocks << caps.block_shift) >> 20,
                label,
                unit.id,
                queues,
                info.queue_depth,
                caps.max_io >> 10,
                if caps.volatile_cache { "volatile cache" } else { "no volatile cache" },
                if caps.fua { ", FUA" } else { "" },
                match (caps.discard, caps.discard_zeroes) {
                    (false, _) => "",
                    (true, false) => ", discard (contents of discarded blocks unspecified)",
                    (true, true) => ", discard (discarded blocks read zeroes)",
                },
                if caps.write_zeroes_blocks > 0 { ", write zeroes" } else { "" },
                if o.user_copy { "user-copy" } else { "copy" },
                wait_name(how.wait),
                match how.null {
                    None => "",
                    Some(NullMode::Copy) => "; NULL TARGET (diagnostics: nothing is stored; the kernel's copy kept)",
                    Some(NullMode::NoCopy) => "; NULL TARGET (diagnostics: nothing is stored, no data moves)",
                },
            ),
            Err(e) => eprintln!("mcqio-ublk: device {id} not started: {e}"),
        }
        // Serve until a signal, or until the device is stopped from
        // elsewhere (`mcqio-ublk del`): then the queues end by themselves.
        while started.is_ok() && !term.load(Ordering::Relaxed) && !server.is_finished() {
            std::thread::sleep(Duration::from_millis(50));
        }
        if !server.is_finished() {
            eprintln!("mcqio-ublk: stopping device {id}");
            if let Err(e) = ctl.stop(id) {
                eprintln!("mcqio-ublk: {e}");
            }
        }
        stop.store(true, Ordering::Relaxed);
        let results = server
            .join()
            .map_err(|_| "a queue thread panicked".to_string())?;
        let results = results?;
        let mut errs = Vec::new();
        for (q, r) in results.into_iter().enumerate() {
            match r {
                Ok(st) => eprintln!(
                    "mcqio-ublk: queue {q}: {} requests, {} errors, {} retries, {} queue-full waits, {} kernel entries, {} sleeps ({} on the engine: {} woken by its interrupt, {} ran out), {} protocol errors",
                    st.requests, st.errors, st.retries, st.queue_full, st.enters, st.sleeps,
                    st.engine_sleeps, st.engine_wakeups, st.engine_ran_out, st.protocol_errors
                ),
                Err(e) => errs.push(e),
            }
        }
        started?;
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs.join("; "))
        }
    })
}

/// Take over device `id`, whose server died, on `device` (see
/// [`mcqio_ublk::recover`] for the sequence).
fn recover(
    device: &str,
    id: u32,
    unit: Option<u32>,
    io_timeout: Option<Duration>,
    wait: Duration,
    policy: WaitPolicy,
) -> Result<(), String> {
    use mcqio_ublk::recover::{
        check_takeover, poll_until, recoverable, start_takeover, wait_quiesced,
    };
    let spec: DeviceSpec = device.parse().map_err(|e| format!("{e}"))?;
    recoverable(&spec)?;
    let mut ctl = Control::open().map_err(|e| e.to_string())?;
    // The driver quiesces the device once it has noticed the server's
    // death (its io_uring torn down); until then it is LIVE.
    let every = Duration::from_millis(100);
    let info = wait_quiesced(&mut ctl, id, wait, every)?;
    let params = ctl.params(id).map_err(|e| e.to_string())?;

    // The engine: the dead server's VFIO files were closed by the kernel
    // when it died (which resets the function); the group may stay busy
    // for a moment while the process is torn down, so the open is retried.
    let mut copts = CtrlOptions {
        nvme: ControllerOptions {
            io_queues: info.nr_hw_queues,
            max_transfer: u64::from(info.max_io_buf_bytes),
            ..ControllerOptions::default()
        },
        ..CtrlOptions::default()
    };
    if let Some(mcq) = spec.opts.mcq {
        copts.ufs.mcq = mcq;
    }
    let mut last = String::new();
    let opened = poll_until(Duration::from_secs(10), Duration::from_millis(200), || {
        let backing = spec.backing("mcqio-ublk").map_err(|e| e.to_string())?;
        match backing.open(&copts) {
            Ok(o) => Ok::<_, String>(Some(o)),
            Err(e) => {
                last = format!("{}: {e}", spec.label());
                Ok(None)
            }
        }
    })?
    .ok_or(last)?;
    let dev = opened.device.clone();
    if dev.granted_queues() < usize::from(info.nr_hw_queues) {
        return Err(format!(
            "{}: the controller granted {} queue pairs, device {id} has {} queues",
            spec.label(),
            dev.granted_queues(),
            info.nr_hw_queues
        ));
    }
    let unit = device::unit(&dev, unit)?;
    let caps = device::caps_of(&dev, &unit, u64::from(info.max_io_buf_bytes));
    let caps = check_takeover(&info, &params, &caps)?;

    // START_USER_RECOVERY is refused (EBUSY) until the old server's
    // /dev/ublkcN is closed as well.
    start_takeover(&mut ctl, id, wait, every)?;
    eprintln!("mcqio-ublk: device {id}: recovery started (the old server's tags are forgotten)");
    let r = serve_device(
        &mut ctl,
        id,
        &info,
        &dev,
        &unit,
        caps,
        device,
        Serving {
            io_timeout,
            wait: policy,
            null: None,
        },
        Live::EndRecovery,
    );
    if r.is_err() {
        eprintln!(
            "mcqio-ublk: device {id} could not be taken over, and the driver allows one START_USER_RECOVERY per crash: it is deleted"
        );
    }
    if let Err(e) = ctl.delete(id) {
        eprintln!("mcqio-ublk: deleting device {id}: {e}");
    } else {
        eprintln!("mcqio-ublk: device {id} deleted");
    }
    drop(opened);
    r
}

/// Open `/dev/ublkcN`, which devtmpfs (or udev) creates after ADD_DEV.
fn open_cdev(id: u32) -> Result<Arc<OwnedFd>, String> {
    let path = format!("/dev/ublkc{id}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => return Ok(Arc::new(OwnedFd::from(f))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => return Err(format!("{path}: {e}")),
        }
    }
}

fn list() -> Result<(), String> {
    let mut ctl = Control::open().map_err(|e| e.to_string())?;
    let ids = ctrl::device_ids();
    if ids.is_empty() {
        println!("no ublk devices");
        return Ok(());
    }
    println!(
        "{:<4} {:<9} {:>6} {:>6} {:>8} {:>8} {:>12} {:>6}  flags",
        "id", "state", "queues", "depth", "max_io", "pid", "sectors", "lbs"
    );
    for id in ids {
        let info = match ctl.info(id) {
            Ok(i) => i,
            Err(e) => {
                println!("{id:<4} {e}");
                continue;
            }
        };
        let (sectors, lbs) = match ctl.params(id) {
            Ok(p) => (p.basic.dev_sectors, 1u32 << p.basic.logical_bs_shift),
            Err(_) => (0, 0),
        };
        println!(
            "{:<4} {:<9} {:>6} {:>6} {:>8} {:>8} {:>12} {:>6}  {}",
            id,
            ctrl::state_name(info.state),
            info.nr_hw_queues,
            info.queue_depth,
            info.max_io_buf_bytes,
            info.ublksrv_pid,
            sectors,
            lbs,
            ctrl::flag_names(info.flags)
        );
    }
    Ok(())
}

fn del(mut ids: Vec<u32>, all: bool) -> Result<(), String> {
    if all {
        ids = ctrl::device_ids();
    } else if ids.is_empty() {
        return Err("name the devices to delete, or --all".into());
    }
    let mut ctl = Control::open().map_err(|e| e.to_string())?;
    let mut errs = Vec::new();
    for id in ids {
        // A live server sees its queues aborted by the stop and exits.
        if let Err(e) = ctl.stop(id) {
            eprintln!("mcqio-ublk: {e}");
        }
        match ctl.delete(id) {
            Ok(()) => println!("deleted ublk device {id}"),
            Err(e) => errs.push(e.to_string()),
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("mcqio-ublk").chain(args.iter().copied()))
    }

    #[test]
    fn recover_needs_the_device_and_its_id() {
        assert!(parse(&["recover", "vfio:0000:00:04.0"]).is_err());
        assert!(parse(&["recover", "--id", "0"]).is_err());
        let Cmd::Recover { device, id, .. } = parse(&["recover", "vfio:0000:00:04.0", "--id", "2"])
            .unwrap()
            .cmd
        else {
            panic!("not recover");
        };
        assert_eq!((device.as_str(), id), ("vfio:0000:00:04.0", 2));
    }

    #[test]
    fn add_takes_recovery() {
        let Cmd::Add { recovery, .. } = parse(&["add", "vfio:0000:00:04.0", "--recovery"])
            .unwrap()
            .cmd
        else {
            panic!("not add");
        };
        assert!(recovery);
        let Cmd::Add { recovery, .. } = parse(&["add", "fake"]).unwrap().cmd else {
            panic!("not add");
        };
        assert!(!recovery);
    }

    #[test]
    fn add_takes_wait_and_null() {
        let Cmd::Add { wait, null, .. } = parse(&["add", "fake"]).unwrap().cmd else {
            panic!("not add");
        };
        assert_eq!((wait, null), (WaitPolicy::Interrupt, None));
        let Cmd::Add { wait, null, .. } =
            parse(&["add", "fake", "--wait", "hybrid:20us", "--null", "nocopy"])
                .unwrap()
                .cmd
        else {
            panic!("not add");
        };
        assert_eq!(
            wait,
            WaitPolicy::Hybrid {
                spin: Duration::from_micros(20)
            }
        );
        assert_eq!(null, Some(NullMode::NoCopy));
        assert!(parse(&["add", "fake", "--null", "zero"]).is_err());
        assert!(parse(&["add", "fake", "--wait", "sometimes"]).is_err());
    }

    /// Durations take units as everywhere else (`-t 1s`, `kato=10s`):
    /// `--io-timeout 500ms`, `--io-timeout 0` for none, a bare number is
    /// seconds; `--io-timeout-ms` stays for one release as a hidden alias
    /// and is refused together with `--io-timeout`. `recover`'s
    /// `--quiesce-timeout` likewise, with `--wait-s` as its old spelling.
    #[test]
    fn timeouts_take_units_and_the_old_flags_still_work() {
        let add_timeout = |args: &[&str]| {
            let mut v = vec!["add", "fake"];
            v.extend_from_slice(args);
            let Cmd::Add { timeouts, .. } = parse(&v).unwrap().cmd else {
                panic!("not add");
            };
            timeouts.io_timeout()
        };
        assert_eq!(add_timeout(&[]), Some(Duration::from_secs(30)));
        assert_eq!(
            add_timeout(&["--io-timeout", "500ms"]),
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            add_timeout(&["--io-timeout", "2"]),
            Some(Duration::from_secs(2))
        );
        assert_eq!(add_timeout(&["--io-timeout", "0"]), None);
        assert_eq!(
            add_timeout(&["--io-timeout-ms", "1500"]),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(add_timeout(&["--io-timeout-ms", "0"]), None);
        assert!(parse(&["add", "fake", "--io-timeout", "soon"]).is_err());
        assert!(parse(&["add", "fake", "--io-timeout", "1s", "--io-timeout-ms", "5"]).is_err());
        let recover_args = |args: &[&str]| {
            let mut v = vec!["recover", "vfio:0000:00:04.0", "--id", "0"];
            v.extend_from_slice(args);
            let Cmd::Recover {
                timeouts, quiesce, ..
            } = parse(&v).unwrap().cmd
            else {
                panic!("not recover");
            };
            (timeouts.io_timeout(), quiesce.timeout())
        };
        assert_eq!(
            recover_args(&[]),
            (Some(Duration::from_secs(30)), Duration::from_secs(30))
        );
        assert_eq!(
            recover_args(&["--io-timeout", "1m", "--quiesce-timeout", "90s"]),
            (Some(Duration::from_secs(60)), Duration::from_secs(90))
        );
        assert_eq!(recover_args(&["--wait-s", "5"]).1, Duration::from_secs(5));
        // The help lists the new spellings only.
        let help = {
            use clap::CommandFactory;
            let mut c = Cli::command();
            c.find_subcommand_mut("recover")
                .unwrap()
                .render_long_help()
                .to_string()
        };
        assert!(
            help.contains("--quiesce-timeout") && help.contains("--io-timeout"),
            "{help}"
        );
        assert!(
            !help.contains("--wait-s") && !help.contains("--io-timeout-ms"),
            "{help}"
        );
    }

    // Refused before the kernel or the engine is touched.
    #[test]
    fn null_refuses_recovery_and_nocopy_needs_user_copy() {
        let args = |user_copy, recovery, null| AddArgs {
            device: "fake,size=16m".into(),
            queues: 1,
            depth: 4,
            id: None,
            unit: None,
            max_io: 1 << 20,
            user_copy,
            recovery,
            io_timeout: None,
            wait: WaitPolicy::Interrupt,
            null: Some(null),
        };
        let e = add(args(false, true, NullMode::Copy)).unwrap_err();
        assert!(e.contains("nothing to recover"), "{e}");
        let e = add(args(false, false, NullMode::NoCopy)).unwrap_err();
        assert!(e.contains("needs --user-copy"), "{e}");
    }

    // Both are refused before the kernel or the engine is touched, so they
    // run without ublk_drv.
    #[test]
    fn a_fake_is_neither_added_with_recovery_nor_recovered() {
        let e = add(AddArgs {
            device: "fake,size=16m".into(),
            queues: 1,
            depth: 4,
            id: None,
            unit: None,
            max_io: 1 << 20,
            user_copy: false,
            recovery: true,
            io_timeout: None,
            wait: WaitPolicy::Interrupt,
            null: None,
        })
        .unwrap_err();
        assert!(
            e.starts_with("--recovery: fake") && e.contains("outlives"),
            "{e}"
        );
        let e = recover(
            "fake",
            0,
            None,
            None,
            Duration::from_secs(1),
            WaitPolicy::Interrupt,
        )
        .unwrap_err();
        assert!(e.contains("outlives"), "{e}");
    }
}
