//! What a run is asked to do besides the device: the options and the
//! choices among them (DMA mode, `--poll-pause`).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use crate::queue::DmaMode;
use crate::report::LatOpts;
use crate::workload::{Distribution, Pattern};

/// Everything a run needs besides the device.
#[derive(Debug, Clone)]
pub struct RunOpts {
    /// Access pattern.
    pub pattern: Pattern,
    /// Read percentage for mixed patterns.
    pub mix: u8,
    /// Bytes per I/O.
    pub io_size: u64,
    /// Queue depth per job.
    pub depth: usize,
    /// NVMe I/O queue entries (`None`: the engine's choice).
    pub io_queue_size: Option<u16>,
    /// How the engine's queue pairs wait for completions (`--wait`).
    pub wait: mcqio::WaitPolicy,
    /// Whether a polling job pauses (x86 PAUSE, arm YIELD) after a poll
    /// that found nothing (`--poll-pause`).
    pub poll_pause: PollPause,
    /// Number of jobs.
    pub jobs: usize,
    /// Cores to pin jobs to (job i on the i-th entry); empty: do not pin.
    pub cpus: Vec<usize>,
    /// Measured time; `None`: until `ios` (the run ends at whichever of the
    /// two comes first).
    pub time: Option<Duration>,
    /// I/Os per job.
    pub ios: Option<u64>,
    /// Warm-up time.
    pub warmup: Duration,
    /// Verify data.
    pub verify: bool,
    /// Record latency histograms.
    pub histogram: bool,
    /// DMA mode.
    pub dma: DmaMode,
    /// Lazy flush batch.
    pub dma_batch: Option<usize>,
    /// Seed.
    pub seed: u64,
    /// Print a live line per second on stderr.
    pub progress: bool,
    /// Set by SIGINT/SIGTERM: stop, drain and report what was measured.
    pub interrupt: Arc<AtomicBool>,
    /// How random positions are spread.
    pub distribution: Distribution,
    /// Start of the region under test in each namespace, bytes.
    pub offset: u64,
    /// Size of the region under test, bytes (`None`: to the namespace's end).
    pub size: Option<u64>,
    /// Namespaces to use (`None`: all).
    pub nsids: Option<Vec<u32>>,
    /// I/Os per second over all jobs.
    pub rate_iops: Option<u64>,
    /// Total bytes to move (sets the per-job I/O count).
    pub bytes: Option<u64>,
    /// UFS HPB with this host map budget per LU (`None`: off).
    pub hpb: Option<u64>,
    /// Percentiles and buckets to report.
    pub lat: LatOpts,
}

/// `--poll-pause`: when a polling job executes a spin-wait hint (x86
/// PAUSE, arm YIELD) after a poll that found nothing.
///
/// The hint helps where the device is another thread of this process on
/// another core (the fakes): the host then pulls the completion line the
/// device thread is writing less often. Where it is not, the hint's cost
/// lands on the command being waited for: on hardware it delays seeing a
/// completion by the hint's latency (about 140 cycles on recent x86
/// cores), in a KVM guest a run of them is what pause-loop exiting takes
/// for a spinning lock and exits to the hypervisor, and under QEMU's TCG
/// each one leaves the translated code and takes QEMU's big lock, which
/// the emulated controller needs to post the completion. With one command
/// in flight that is the whole latency of the next I/O; with several, a
/// completion found a hint later still finds the others queued behind it,
/// so the hint buys nothing there either. SPDK's, libvfn's and xNVMe's
/// poll loops never pause, and neither does `auto` off the fakes. (Under
/// TCG a pause with several commands out was once 1.4x faster than none
/// and on two other days 2x slower, see the README: an effect of how the
/// host schedules QEMU's threads, not a reason to pause on hardware.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PollPause {
    /// `always` on the in-process fakes (`fake…`, `fake-ufs…`), `never`
    /// on `vfio:`, `tcp:` and `uring:`.
    #[default]
    Auto,
    /// After every empty poll.
    Always,
    /// After an empty poll with more than one command in flight.
    Busy,
    /// Never.
    Never,
}

impl PollPause {
    /// The rule jobs on a device of `kind` follow.
    pub fn for_device(self, kind: &crate::spec::DeviceKind) -> crate::job::PauseRule {
        use crate::job::PauseRule;
        use crate::spec::DeviceKind;
        match self {
            PollPause::Always => PauseRule::Always,
            PollPause::Busy => PauseRule::Busy,
            PollPause::Never => PauseRule::Never,
            PollPause::Auto => match kind {
                DeviceKind::Fake { .. } | DeviceKind::FakeUfs { .. } => PauseRule::Always,
                _ => PauseRule::Never,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::DeviceSpec;

    /// `--poll-pause auto` pauses after every empty poll on the in-process
    /// fakes and never elsewhere.
    #[test]
    fn poll_pause_auto_always_pauses_on_the_in_process_fakes_only() {
        use crate::job::PauseRule;
        let kind = |s: &str| s.parse::<DeviceSpec>().unwrap().kind;
        for (spec, auto) in [
            ("fake", PauseRule::Always),
            ("fake:null", PauseRule::Always),
            ("fake-ufs", PauseRule::Always),
            ("vfio:0000:00:02.0", PauseRule::Never),
            ("uring:null", PauseRule::Never),
            ("tcp:127.0.0.1:4420/nqn.x", PauseRule::Never),
        ] {
            let k = kind(spec);
            assert_eq!(PollPause::Auto.for_device(&k), auto, "{spec}");
            assert_eq!(PollPause::Always.for_device(&k), PauseRule::Always);
            assert_eq!(PollPause::Busy.for_device(&k), PauseRule::Busy);
            assert_eq!(PollPause::Never.for_device(&k), PauseRule::Never);
        }
    }
}
