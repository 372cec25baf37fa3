//! The set-up subcommands: `devices`, `bind`, `unbind`, `doctor`.
//!
//! Thin front ends over `mcqio_vfio::{devices, bind, unbind, doctor}`, so an
//! application that links the library prints the same diagnosis.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use mcqio_vfio::{BindOptions, BindOutcome, DoctorOptions, IommuChoice, SysRoots};

use crate::spec::parse_size;

/// Set-up and diagnosis commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List NVMe and UFS controllers: address, kind, ids, driver, IOMMU group, viability, use;
    /// with `tcp:<address>:<port>`, the subsystems that NVMe/TCP port's discovery controller lists
    Devices(DevicesArgs),
    /// Hand an NVMe or UFS controller to vfio-pci (refuses while the kernel uses it)
    Bind(BindArgs),
    /// Give a controller back to the kernel's driver (nvme, or ufshcd (module ufshcd-pci) for UFS)
    Unbind(UnbindArgs),
    /// Check everything a VFIO run needs; exit 0 only when a run would work
    Doctor(DoctorArgs),
    /// Map -> I/O -> unmap throughput of the DMA modes (premapped, strict, lazy/N)
    DmaBench(Box<crate::dmabench::DmaBenchArgs>),
    /// Rerun a seed table: `seed mcq` (UFS MCQ vs legacy single doorbell)
    Seed(Box<crate::seed::SeedArgs>),
}

/// Options every set-up command takes.
#[derive(Debug, Args)]
pub struct Roots {
    /// Look for sys/, proc/ and dev/ under this directory instead of / (testing)
    #[arg(long, hide = true)]
    root: Option<PathBuf>,
}

impl Roots {
    fn get(&self) -> SysRoots {
        self.root
            .as_ref()
            .map_or_else(SysRoots::default, SysRoots::under)
    }
}

/// `devices`.
#[derive(Debug, Args)]
pub struct DevicesArgs {
    /// An NVMe/TCP port, `tcp:<address>:<port>`: list the subsystems its
    /// discovery controller offers instead of the local controllers
    target: Option<String>,
    #[command(flatten)]
    roots: Roots,
}

/// `devices tcp:<address>:<port>`: the port's Discovery Log Page.
fn discovery(target: &str) -> ExitCode {
    match mcqio_open::discover_tcp(target, std::time::Duration::from_secs(5)) {
        Ok(log) => {
            println!(
                "{target}: discovery log generation {}, {} entries",
                log.genctr,
                log.entries.len()
            );
            if log.entries.is_empty() {
                return ExitCode::SUCCESS;
            }
            println!(
                "{:<10} {:<6} {:<40} {:<8} Subsystem NQN",
                "Type", "trtype", "traddr", "trsvcid"
            );
            for e in &log.entries {
                println!(
                    "{:<10} {:<6} {:<40} {:<8} {}",
                    e.subtype_name(),
                    e.trtype_name(),
                    e.traddr,
                    e.trsvcid,
                    e.subnqn
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// `bind`.
#[derive(Debug, Args)]
pub struct BindArgs {
    /// PCI address (0000:01:00.0 or 01:00.0)
    bdf: String,
    /// Bind even if a namespace is mounted or open, or the device is not NVMe
    #[arg(long)]
    force: bool,
    /// Give this user (name or uid) the `/dev/vfio/<group>` node
    #[arg(long)]
    user: Option<String>,
    #[command(flatten)]
    roots: Roots,
}

/// `unbind`.
#[derive(Debug, Args)]
pub struct UnbindArgs {
    /// PCI address
    bdf: String,
    /// Unbind even if a process has the VFIO group open
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    roots: Roots,
}

/// `doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The controller to check (system-wide checks only without it)
    bdf: Option<String>,
    /// DMA memory the planned run maps, for the locked-memory and huge page
    /// checks (e.g. 64M); default: the library's default budget
    #[arg(long = "dma-budget", value_parser = |s: &str| parse_size(s).map_err(|e| e.to_string()))]
    dma_budget: Option<u64>,
    #[command(flatten)]
    roots: Roots,
}

fn outcome(verb: &str, o: &BindOutcome) {
    let was = o.previous_driver.as_deref().unwrap_or("no driver");
    let now = o.driver.as_deref().unwrap_or("no driver");
    if o.changed {
        println!("{}: {verb}: {was} -> {now}", o.bdf);
    } else {
        println!("{}: already on {now}; nothing to do", o.bdf);
    }
    if let Some(g) = o.group {
        print!("  IOMMU group {g}");
        if let Some(n) = &o.group_node {
            print!(" ({})", n.display());
        }
        println!();
    }
    if let Some(n) = &o.cdev_node {
        println!("  VFIO device cdev {} (iommufd)", n.display());
    }
    if let Some(uid) = o.granted_uid {
        let what = if o.cdev_node.is_some() {
            "group node and cdev"
        } else {
            "group node"
        };
        println!("  {what} given to uid {uid}");
    }
    for b in &o.blockers {
        println!("  warning: {b} shares the IOMMU group and keeps it from being viable: unbind it or bind it to vfio-pci too");
    }
    for f in &o.forced_over {
        println!("  forced although: {f}");
    }
}

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("mcqio-perf: error: {e}");
    ExitCode::FAILURE
}

/// The line above `devices`' table: which IOMMU interfaces the kernel
/// offers, and for each missing one why and the fix.
fn print_interfaces(o: &mcqio_vfio::Offered) {
    let say = |x: &Result<String, String>| match x {
        Ok(what) => format!("yes, {what}"),
        Err(why) => format!("no: {why}"),
    };
    println!("IOMMU interfaces: type1 {}", say(&o.type1));
    println!("                  iommufd {}", say(&o.iommufd));
}

/// Run a set-up command.
pub fn run(cmd: &Command) -> ExitCode {
    match cmd {
        Command::Devices(DevicesArgs {
            target: Some(t), ..
        }) => discovery(t),
        Command::Devices(a) => {
            let roots = a.roots.get();
            print_interfaces(&mcqio_vfio::interfaces(&roots));
            match mcqio_vfio::devices(&roots) {
                Ok(list) if list.is_empty() => {
                    println!("no NVMe controllers or UFS host controllers (PCI class 0x0108 / 0x0109) found");
                    ExitCode::SUCCESS
                }
                Ok(list) => {
                    println!(
                        "{:<14} {:<5} {:<10} {:<10} {:<6} {:<14} {:<8} In use / namespaces",
                        "Address", "Kind", "ID", "Driver", "Group", "Group viable", "Opens"
                    );
                    for c in &list {
                        let p = &c.pci;
                        let viable = match (p.iommu_group, c.blockers.is_empty()) {
                            (None, _) => "no IOMMU".to_string(),
                            (Some(_), true) => "yes".to_string(),
                            (Some(_), false) => "no".to_string(),
                        };
                        let usage = if !c.in_use.is_empty() {
                            c.in_use.join("; ")
                        } else if !c.namespaces.is_empty() {
                            format!("idle ({})", c.namespaces.join(", "))
                        } else {
                            "idle".to_string()
                        };
                        // What `vfio:<BDF>` (iommu=auto) would open it
                        // through; only a device on vfio-pci has the nodes.
                        let offered = mcqio_vfio::offered(&roots, p);
                        let opens = match (&offered.type1, &offered.iommufd) {
                            _ if !p.is_vfio() => "-".to_string(),
                            (Err(_), Err(_)) => "nothing".to_string(),
                            _ => IommuChoice::Auto.resolve(&roots, p).to_string(),
                        };
                        println!(
                            "{:<14} {:<5} {:04x}:{:04x}  {:<10} {:<6} {:<14} {:<8} {}",
                            p.bdf.to_string(),
                            c.transport.map_or("?", |t| t.name()),
                            p.vendor,
                            p.device,
                            p.driver.as_deref().unwrap_or("none"),
                            p.iommu_group
                                .map_or_else(|| "-".to_string(), |g| g.to_string()),
                            viable,
                            opens,
                            usage
                        );
                        if p.is_vfio() {
                            for (name, why) in
                                [("type1", &offered.type1), ("iommufd", &offered.iommufd)]
                            {
                                if let Err(why) = why {
                                    println!("{:<14} no {name}: {why}", "");
                                }
                            }
                        }
                        for b in &c.blockers {
                            println!("{:<14} group blocked by {b}", "");
                        }
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
        Command::Bind(a) => {
            let opts = BindOptions {
                force: a.force,
                user: a.user.clone(),
            };
            match mcqio_vfio::bind(&a.roots.get(), &a.bdf, &opts) {
                Ok(o) => {
                    outcome("bound", &o);
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
        Command::Unbind(a) => match mcqio_vfio::unbind(&a.roots.get(), &a.bdf, a.force) {
            Ok(o) => {
                outcome("unbound", &o);
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        },
        Command::DmaBench(a) => crate::dmabench::run(a),
        Command::Seed(a) => crate::seed::run(a),
        Command::Doctor(a) => {
            let mut opts = DoctorOptions {
                roots: a.roots.get(),
                bdf: a.bdf.clone(),
                ..DoctorOptions::default()
            };
            if let Some(b) = a.dma_budget {
                opts.dma_budget = b;
            }
            let mut report = mcqio_vfio::doctor(&opts);
            // The library's errors end with "run `mcqio-perf doctor <BDF>`"
            // for callers that are not the doctor; here it is already running.
            for c in &mut report.checks {
                if let Some(i) = c.detail.find("; run `mcqio-perf doctor") {
                    c.detail.truncate(i);
                }
            }
            println!("{report}");
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
