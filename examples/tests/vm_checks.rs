//! The guest checks of `mcqio-vm-tests` (what `fixtures/vm/run-tests.sh`
//! runs against QEMU's controllers) run here on the in-process fakes, so a
//! change to a check is exercised on every `cargo test`, not only in the
//! guest VMs. Short runs; each check verifies its own data.

mod support;

fn vm_tests(args: &[&str]) -> (i32, String) {
    let out = support::command(env!("CARGO_BIN_EXE_mcqio-vm-tests"))
        .args(args)
        .output()
        .expect("mcqio-vm-tests runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

fn ok(args: &[&str]) -> String {
    let (code, text) = vm_tests(args);
    assert_eq!(code, 0, "mcqio-vm-tests {args:?} failed:\n{text}");
    text
}

/// The IOMMU check on NVMe and UFS: the fake IOMMU blocks the read into
/// the unmapped buffer and the controller reads correctly after.
#[test]
fn dma_after_unmap_on_both_fakes() {
    for (cmd, dev) in [
        ("dma-after-unmap", "fake"),
        ("ufs-dma-after-unmap", "fake-ufs"),
    ] {
        let out = ok(&[cmd, dev]);
        assert!(
            out.contains("control: a read into a mapped buffer delivers the data"),
            "{out}"
        );
        assert!(out.contains("buffer unchanged (DMA blocked)"), "{out}");
        assert!(
            out.contains("after the fault the controller still reads correctly"),
            "{out}"
        );
    }
}

/// Write/read/verify through every kind of queue pair the checks drive
/// (NVMe's, UFS's, and UFS's behind the engine's mapping wrapper) and every
/// kind of buffer lane.
#[test]
fn rw_on_both_fakes_and_through_the_mapping_wrapper() {
    let out = ok(&["rw", "fake", "--bytes", "1048576"]);
    assert!(out.contains("rw: OK"), "{out}");
    let out = ok(&["ufs-rw", "fake-ufs", "--bytes", "1048576", "--threads", "2"]);
    assert!(
        out.contains("ufs-rw: OK") && out.contains("2 hardware queue(s)"),
        "{out}"
    );
    for m in ["strict", "lazy"] {
        let out = ok(&[
            "ufs-rw",
            "fake-ufs",
            "--bytes",
            "1048576",
            "--dma",
            m,
            "--engine-mapped",
        ]);
        assert!(out.contains("ufs-rw: OK"), "{m}: {out}");
    }
    // The other buffer lanes: scattered 4 KiB DmaBufs, and a QueueMapper
    // per thread in each DMA mode.
    let out = ok(&["rw", "fake", "--bytes", "1048576", "--vectored"]);
    assert!(out.contains("rw: OK"), "{out}");
    for m in ["premapped", "strict", "lazy"] {
        let out = ok(&["rw", "fake", "--bytes", "1048576", "--dma", m]);
        assert!(out.contains("rw: OK"), "{m}: {out}");
        let out = ok(&["ufs-rw", "fake-ufs", "--bytes", "1048576", "--dma", m]);
        assert!(out.contains("ufs-rw: OK"), "{m}: {out}");
    }
}

/// A check must be able to fail: an unknown device is refused, not passed.
#[test]
fn a_check_on_a_device_it_cannot_open_fails() {
    let (code, text) = vm_tests(&["ufs-dma-after-unmap", "fake"]);
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("unknown device"), "{text}");
    // Run shapes are checked the same way on NVMe and UFS.
    for args in [
        &["rw", "fake", "--qd", "0"][..],
        &["ufs-rw", "fake-ufs", "--qd", "0"],
        &["ufs-rw", "fake-ufs", "--qd", "33"],
    ] {
        let (code, text) = vm_tests(args);
        assert_ne!(code, 0, "{args:?}: {text}");
        assert!(text.contains("--qd must be 1..="), "{args:?}: {text}");
    }
    for args in [
        &["rw", "fake", "--min-io", "1000"][..],
        &["ufs-rw", "fake-ufs", "--min-io", "8192", "--max-io", "4096"],
    ] {
        let (code, text) = vm_tests(args);
        assert_ne!(code, 0, "{args:?}: {text}");
        assert!(
            text.contains("must be multiples of 4 KiB"),
            "{args:?}: {text}"
        );
    }
}
