//! Opening the NVMe device and the checks' view of namespace 1.

use super::*;

/// Open the device and bring the controller up.
pub(crate) fn open(a: &DevArgs) -> Result<Arc<Controller>, Failure> {
    let dev = a.device.as_str();
    let backend: Arc<dyn Backend> = if dev == "fake" {
        let cfg = FakeConfig {
            namespaces: vec![NamespaceConfig::ram(256 << 20, 512)],
            io_queue_pairs: 8,
            shadow_doorbells: true,
            ..FakeConfig::default()
        };
        FakeController::new(cfg).map_err(ctx("fake controller"))?
    } else if let Some(bdf) = dev.strip_prefix("vfio:") {
        Arc::new(VfioBackend::open(bdf).map_err(ctx(dev))?)
    } else {
        return Err(format!("unknown device {dev:?}: use vfio:<BDF> or fake"));
    };
    let opts = ControllerOptions {
        shadow_doorbells: !a.no_shadow_doorbells,
        ..ControllerOptions::default()
    };
    Controller::new(backend, opts).map_err(ctx("controller bring-up"))
}

/// Namespace 1's block size (log2) and size in bytes.
pub(crate) fn ns1(ctrl: &Controller) -> Result<(u32, u64), Failure> {
    let ns = ctrl.namespace(NSID).ok_or_else(|| {
        format!(
            "namespace {NSID} is not active on {}",
            ctrl.backend().name()
        )
    })?;
    Ok((ns.lba_shift, ns.size_bytes()))
}

/// Check that `[offset, offset+len)` is block-aligned and inside namespace 1.
pub(crate) fn check_range(ctrl: &Controller, offset: u64, len: u64) -> Result<u32, Failure> {
    let (shift, size) = ns1(ctrl)?;
    let mask = (1u64 << shift) - 1;
    if len == 0 || offset & mask != 0 || len & mask != 0 {
        return Err(format!(
            "offset {offset} and length {len} must be non-zero multiples of the {}-byte LBA size",
            1u64 << shift
        ));
    }
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(format!(
            "range {offset}+{len} is past the end of namespace {NSID} ({size} bytes)"
        ));
    }
    Ok(shift)
}

/// Poll until the command with `tag` completes (a queue with nothing else
/// in flight); NVMe and UFS alike.
pub(crate) fn wait_tag<Q: BlockQueue>(
    qp: &mut Q,
    tag: u64,
    what: &str,
) -> Result<mcqio::Completion<Q::Buf>, Failure> {
    qp.submit();
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    loop {
        let mut done = None;
        qp.poll(1, |c| done = Some(c)).map_err(ctx(what))?;
        match done {
            Some(c) if c.tag == tag => return Ok(c),
            Some(c) => return Err(format!("{what}: completion for unexpected tag {}", c.tag)),
            None if Instant::now() > deadline => {
                return Err(format!("{what}: no completion within {COMMAND_TIMEOUT:?}"))
            }
            None => std::thread::yield_now(),
        }
    }
}
