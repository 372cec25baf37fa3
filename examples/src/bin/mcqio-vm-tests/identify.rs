//! `identify`: bring the controller up and print its identity.

use super::*;

pub(crate) fn identify(a: &DevArgs) -> Result<(), Failure> {
    let ctrl = open(a)?;
    let id = ctrl.identify();
    let cap = ctrl.cap();
    let vs = ctrl.version();
    println!("device:      {}", ctrl.backend().name());
    println!("model:       '{}'", id.model);
    println!("serial:      '{}'", id.serial);
    println!("firmware:    '{}'", id.firmware);
    println!("vendor:      {:#06x}", id.vid);
    println!(
        "version:     NVMe {}.{}.{}",
        vs.major(),
        vs.minor(),
        vs.tertiary()
    );
    println!(
        "CAP:         MQES {} entries, DSTRD {}, TO {} ms, MPS {}..{} KiB",
        cap.max_queue_entries(),
        cap.dstrd(),
        cap.timeout_ms(),
        (1u64 << cap.mps_min_shift()) >> 10,
        (1u64 << cap.mps_max_shift()) >> 10
    );
    println!(
        "limits:      MDTS {} (max transfer {} KiB), ONCS {:#06x}, OACS {:#06x}, VWC {}",
        id.mdts,
        ctrl.max_transfer() >> 10,
        id.oncs,
        id.oacs,
        id.vwc
    );
    println!(
        "queues:      {} I/O queue pairs granted, shadow doorbells {}",
        ctrl.granted_io_queues(),
        if ctrl.shadow_doorbells() { "on" } else { "off" }
    );
    for ns in ctrl.namespaces() {
        println!(
            "namespace {}: {} blocks of {} B ({} MiB)",
            ns.id,
            ns.nsze,
            ns.lba_size,
            ns.size_bytes() >> 20
        );
    }
    // DLFEAT (Identify Namespace byte 33) bits 2:0, read here on its own
    // so the ublk plan can check what mcqio-ublk claims for discarded
    // blocks against the device rather than against its own setup.
    if let Ok((_, page)) = ctrl.admin_read(
        mcqio::nvme::spec::sqe::Identify::namespace(NSID).sqe(),
        "Identify Namespace",
    ) {
        if let Some(&d) = page.get(33) {
            let reads = match d & 0x7 {
                0 => "not reported",
                1 => "zeroes",
                2 => "ones",
                _ => "reserved",
            };
            println!("namespace {NSID} DLFEAT: {d:#04x} (deallocated blocks read: {reads})");
        }
    }
    if id.model.trim().is_empty() {
        return Err("Identify Controller returned an empty model number".into());
    }
    ns1(&ctrl).map(drop)
}
