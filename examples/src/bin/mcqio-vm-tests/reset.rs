//! `reset`: a controller reset with reads in flight.

use super::*;

pub(crate) fn reset(a: &DevArgs) -> Result<(), Failure> {
    let ctrl = open(a)?;
    let (shift, size) = ns1(&ctrl)?;
    let mut qp = ctrl
        .create_qpair(QpairOptions::default())
        .map_err(ctx("creating a queue pair"))?;
    const PIECE: u64 = 64 << 10;
    const PIECES: u64 = 32;
    let base = size - 16 * (1 << 20);
    let seed = 0x6d63_7169_6f5f_7273;
    let mut data = vec![0u8; (PIECE * PIECES) as usize];
    pattern::fill(seed, base, &mut data);
    qp.write_blocking(NSID, base >> shift, &data)
        .map_err(ctx("write"))?;

    // Reads in flight when the controller is reset.
    for i in 0..PIECES {
        let mut b = ctrl
            .alloc_buf(PIECE as usize, DmaDir::Bidirectional)
            .map_err(ctx("allocating a buffer"))?;
        b.fill(POISON);
        qp.read(
            NSID,
            (base + i * PIECE) >> shift,
            (PIECE >> shift) as u32,
            b,
            i,
        )
        .map_err(ctx("read"))?;
    }
    qp.submit();
    ctrl.reset().map_err(ctx("Controller::reset"))?;
    let (mut ok, mut aborted) = (0u64, 0u64);
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let mut bad = None;
    while ok + aborted < PIECES {
        qp.poll(usize::MAX, |c| match c.result {
            Ok(()) => {
                ok += 1;
                let got = c.buf.as_ref().map(|b| b.to_vec()).unwrap_or_default();
                let at = base + c.tag * PIECE;
                if let Some(m) = pattern::first_mismatch(seed, at, &got) {
                    bad.get_or_insert(format!(
                        "read {} completed across the reset with wrong data at {} (expected {:#x}, found {:#x})",
                        c.tag, m.0, m.1, m.2
                    ));
                }
            }
            Err(mcqio::IoError::AbortedByReset) => aborted += 1,
            Err(e) => {
                bad.get_or_insert(format!("read {} ended with {e}, not success or AbortedByReset", c.tag));
                aborted += 1;
            }
        })
        .map_err(ctx("poll after reset"))?;
        if Instant::now() > deadline {
            return Err(format!(
                "after the reset only {} of {PIECES} reads came back within {COMMAND_TIMEOUT:?}",
                ok + aborted
            ));
        }
    }
    if let Some(b) = bad {
        return Err(b);
    }
    println!(
        "reset with {PIECES} reads in flight: {ok} completed with correct data, {aborted} aborted by the reset (resets: {})",
        ctrl.resets()
    );
    if ctrl.resets() != 1 {
        return Err(format!(
            "Controller::resets() is {}, expected 1",
            ctrl.resets()
        ));
    }
    // The same queue pair works after the reset.
    let got = read_range(&mut qp, shift, base, PIECE * PIECES)?;
    if let Some(m) = pattern::first_mismatch(seed, base, &got) {
        return Err(format!(
            "after the reset the queue pair read wrong data at {} (expected {:#x}, found {:#x})",
            m.0, m.1, m.2
        ));
    }
    qp.write_blocking(NSID, base >> shift, &data)
        .map_err(ctx("write after the reset"))?;
    println!("after the reset the same queue pair reads and writes correctly");
    Ok(())
}
