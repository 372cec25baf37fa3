//! mcqio-vm-tests: the guest side of `fixtures/vm/run-tests.sh`.
//!
//! Runs inside the throw-away QEMU guest against QEMU's NVMe controller
//! through VFIO and the emulated Intel IOMMU (`vfio:<BDF>`); every
//! subcommand also accepts `fake` (the in-process fake controller) so the
//! checks themselves can be exercised on any host. Each subcommand is one
//! check that `fixtures/vm/guest/vm-tests.sh` calls; it exits non-zero with a
//! message saying what differed when the check fails.
//!
//! The cross-check data is a positional pattern ([`pattern`]): the bytes at
//! namespace offset `o` depend only on the seed and `o`, so data that lands
//! at the wrong LBA is caught as surely as corrupted data, and the kernel
//! side can compare with `cmp` against `gen-pattern`'s output.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use mcqio::core::block::BlockQueue;
use mcqio::nvme::spec::sqe::Command as _;
use mcqio::vfio::{
    AppBuffer, Backend, DmaDir, DmaMapper, DmaMode, IoBuffer, Mapped, MapperConfig, PoolConfig,
    QueueMapper, Returned, VfioBackend,
};
use mcqio::{Controller, ControllerOptions, DmaBuf, IoBuf, QpairOptions, QueuePair};
use mcqio_fixtures::{FakeConfig, FakeController, NamespaceConfig};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

mod args;
mod blk;
mod commands;
mod cross_check;
mod device;
mod identify;
mod iommu;
mod irq;
mod lanes;
mod pattern;
mod reset;
mod rw;
mod tcp;
mod ufs;

use args::*;
use blk::*;
use commands::*;
use cross_check::*;
use device::*;
use identify::*;
use iommu::*;
use irq::*;
use lanes::*;
use reset::*;
use rw::*;

/// The guest test program of the mcqio VM harness.
#[derive(Parser, Debug)]
#[command(
    name = "mcqio-vm-tests",
    version,
    about = "The guest side of mcqio's VM harness: one check per subcommand, on vfio:<BDF> or a fake"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Bring the controller up and print its identity (model, serial, limits, namespaces).
    Identify(DevArgs),
    /// Write, read back and verify data at random LBAs and sizes, one queue pair per thread.
    Rw(RwArgs),
    /// Route the MSI-X vectors to eventfds; each admin completion signals
    /// vector 0 (and /proc/interrupts counts it).
    Irq(DevArgs),
    /// Flush, Write Zeroes and Dataset Management (deallocate), each checked by reading back.
    Commands(DevArgs),
    /// Reset the controller with reads in flight; every read completes or is
    /// aborted, and the same queue pair works afterwards.
    Reset(DevArgs),
    /// Show that the IOMMU stops the device writing to a buffer after it was unmapped.
    DmaAfterUnmap(DevArgs),
    /// Map → touch → unmap throughput of each DMA mode on the device's IOMMU.
    MapBench(MapBenchArgs),
    /// Write the cross-check pattern to a byte range of namespace 1.
    WritePattern(DevPatternArgs),
    /// Read a byte range of namespace 1 and compare it with the cross-check pattern.
    CheckPattern(DevPatternArgs),
    /// Print the cross-check pattern for a byte range to stdout (no device needed).
    GenPattern(PatternArgs),
    /// UFS: bring the host controller and its device up, print what it
    /// reports, and check the transfer mode (MCQ or legacy) it ended in.
    UfsBringup(UfsDevArgs),
    /// UFS: route the controller's interrupt to an eventfd; each UIC
    /// command completion (IS.UCCS with IE.UCCE) is delivered, cleared and
    /// unmasked.
    UfsIrq(UfsDevArgs),
    /// UFS: write, read back and verify data at random LBAs and sizes of
    /// LU 0, one queue pair (an MCQ SQ/CQ pair) per thread.
    UfsRw(UfsRwArgs),
    /// UFS: show that the IOMMU stops the controller writing to a buffer
    /// after it was unmapped (the device reports success; the data decides).
    UfsDmaAfterUnmap(UfsDevArgs),
    /// UFS: abort commands right after submitting them: each completes exactly
    /// once, aborted or with correct data, and the queue pair works afterwards.
    UfsAbort(UfsDevArgs),
    /// UFS: host controller reset with I/O in flight on every queue pair:
    /// each command completes exactly once (with its data, or aborted by the
    /// reset with its buffer), the queue pairs re-create their hardware
    /// queues, and every block reads back right afterwards.
    UfsReset(UfsDevArgs),
    /// NVMe/TCP: write, read back and verify every I/O size class
    /// (in-capsule, one R2T, several H2CData per command), one queue pair
    /// (connection) per thread.
    TcpRw(tcp::TcpRwArgs),
    /// NVMe/TCP: reconnect (reset) with reads in flight; each ends once and
    /// the queue pairs carry on.
    TcpReset(tcp::TcpDevArgs),
    /// NVMe/TCP: write the cross-check pattern to a byte range of namespace 1.
    TcpWritePattern(tcp::TcpPatternArgs),
    /// NVMe/TCP: read a byte range of namespace 1 and compare it with the pattern.
    TcpCheckPattern(tcp::TcpPatternArgs),
    /// UFS: write the cross-check pattern to a byte range of LU 0.
    UfsWritePattern(UfsPatternArgs),
    /// UFS: read a byte range of LU 0 and compare it with the cross-check pattern.
    UfsCheckPattern(UfsPatternArgs),
}

/// Why a check failed; printed as the process's last line.
type Failure = String;

/// Turn any displayable error into a [`Failure`] with context.
fn ctx<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> Failure + '_ {
    move |e| format!("{what}: {e}")
}

/// Namespace 1, the one every check uses.
const NSID: u32 = 1;
/// Bound on waiting for any single command in these checks.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// A byte no read ever returns by accident: buffers are poisoned with it
/// before reads, so a read whose DMA never happened cannot pass.
const POISON: u8 = 0xA5;

fn main() -> ExitCode {
    // The library logs through `log`; RUST_LOG=debug (or warn, trace) shows it.
    env_logger::init();
    let cli = Cli::parse();
    let res = match &cli.cmd {
        Cmd::Identify(a) => identify(a),
        Cmd::Rw(a) => rw(a),
        Cmd::Irq(a) => irq(a),
        Cmd::Commands(a) => commands(a),
        Cmd::Reset(a) => reset(a),
        Cmd::DmaAfterUnmap(a) => dma_after_unmap(a),
        Cmd::MapBench(a) => map_bench(a),
        Cmd::WritePattern(a) => write_pattern(a),
        Cmd::CheckPattern(a) => check_pattern(a),
        Cmd::GenPattern(p) => gen_pattern(p),
        Cmd::UfsBringup(a) => ufs::bringup(a),
        Cmd::UfsIrq(a) => ufs::irq(a),
        Cmd::UfsRw(a) => ufs::rw(a),
        Cmd::UfsDmaAfterUnmap(a) => ufs::dma_after_unmap(a),
        Cmd::UfsAbort(a) => ufs::abort(a),
        Cmd::UfsReset(a) => ufs::reset(a),
        Cmd::TcpRw(a) => tcp::rw(a),
        Cmd::TcpReset(a) => tcp::reset(a),
        Cmd::TcpWritePattern(a) => tcp::write_pattern(a),
        Cmd::TcpCheckPattern(a) => tcp::check_pattern(a),
        Cmd::UfsWritePattern(a) => ufs::write_pattern(a),
        Cmd::UfsCheckPattern(a) => ufs::check_pattern(a),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("mcqio-vm-tests: FAIL: {why}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_positional_and_seeded() {
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 4096];
        pattern::fill(7, 8192, &mut a);
        pattern::fill(7, 8192, &mut b);
        assert_eq!(a, b);
        assert_eq!(pattern::first_mismatch(7, 8192, &a), None);
        // Same data checked at another offset or with another seed fails.
        assert_eq!(
            pattern::first_mismatch(7, 8192 + 512, &a).map(|m| m.0),
            Some(8192 + 512)
        );
        assert!(pattern::first_mismatch(8, 8192, &a).is_some());
        // A region is the concatenation of its parts.
        let mut tail = vec![0u8; 2048];
        pattern::fill(7, 8192 + 2048, &mut tail);
        assert_eq!(&a[2048..], &tail[..]);
    }

    #[test]
    fn extents_do_not_overlap_and_stay_in_their_slice() {
        let mut rng = SmallRng::seed_from_u64(3);
        let v = make_extents(&mut rng, 1 << 20, 64 << 20, 16 << 20, 4096, 1 << 20).unwrap();
        assert!(v.iter().map(|e| e.len).sum::<u64>() >= 16 << 20);
        for w in v.windows(2) {
            assert!(w[0].offset + w[0].len <= w[1].offset);
        }
        for e in &v {
            assert!(e.offset >= 1 << 20 && e.offset + e.len <= 65 << 20);
            assert!(e.len >= 4096 && e.len <= 1 << 20 && e.len % 4096 == 0);
        }
        assert!(make_extents(&mut rng, 0, 1 << 20, 4 << 20, 4096, 1 << 20).is_err());
    }
}
