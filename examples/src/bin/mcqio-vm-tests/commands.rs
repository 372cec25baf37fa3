//! `commands`: Flush, Write Zeroes and Dataset Management, each checked by
//! reading back.

use super::*;

/// Read `len` bytes at `offset` of namespace 1 through the blocking API.
pub(crate) fn read_range(
    qp: &mut QueuePair,
    shift: u32,
    offset: u64,
    len: u64,
) -> Result<Vec<u8>, Failure> {
    let mut v = vec![0u8; len as usize];
    qp.read_blocking(NSID, offset >> shift, &mut v)
        .map_err(ctx("read"))?;
    Ok(v)
}

pub(crate) fn commands(a: &DevArgs) -> Result<(), Failure> {
    let ctrl = open(a)?;
    let (shift, size) = ns1(&ctrl)?;
    let raw = ctrl
        .admin_read(
            mcqio::nvme::spec::sqe::Identify::namespace(NSID).sqe(),
            "Identify Namespace",
        )
        .map_err(ctx("Identify Namespace"))?
        .1;
    // DLFEAT (byte 33) bits 2:0: what a deallocated block reads as.
    let dlfeat = raw[33] & 0x7;
    let mut qp = ctrl
        .create_qpair(QpairOptions::default())
        .map_err(ctx("creating a queue pair"))?;
    const REGION: u64 = 1 << 20;
    const HOLE: (u64, u64) = (256 << 10, 256 << 10); // write zeroes: offset, length in the region
    const TRIM: (u64, u64) = (640 << 10, 128 << 10); // deallocate: offset, length
    let base = size - 4 * REGION;
    let seed = 0x6d63_7169_6f5f_636d;
    let mut data = vec![0u8; REGION as usize];
    pattern::fill(seed, base, &mut data);
    qp.write_blocking(NSID, base >> shift, &data)
        .map_err(ctx("write"))?;

    qp.flush(NSID, 1).map_err(ctx("Flush submission"))?;
    let c = wait_tag(&mut qp, 1, "Flush")?;
    c.result.map_err(ctx("Flush"))?;
    println!("flush: OK");

    let nlb = (HOLE.1 >> shift) as u32;
    qp.write_zeroes(NSID, (base + HOLE.0) >> shift, nlb, 2)
        .map_err(ctx("Write Zeroes submission"))?;
    wait_tag(&mut qp, 2, "Write Zeroes")?
        .result
        .map_err(ctx("Write Zeroes"))?;
    let got = read_range(&mut qp, shift, base, REGION)?;
    let (h0, h1) = (HOLE.0 as usize, (HOLE.0 + HOLE.1) as usize);
    if let Some(i) = got[h0..h1].iter().position(|&b| b != 0) {
        return Err(format!(
            "Write Zeroes: byte {} of the zeroed range reads {:#04x}",
            i,
            got[h0 + i]
        ));
    }
    for (from, to) in [(0, h0), (h1, REGION as usize)] {
        if let Some(m) = pattern::first_mismatch(seed, base + from as u64, &got[from..to]) {
            return Err(format!(
                "Write Zeroes touched data outside its range: at {} expected {:#x} found {:#x}",
                m.0, m.1, m.2
            ));
        }
    }
    println!(
        "write zeroes: OK ({} blocks read back as zeros, neighbours intact)",
        nlb
    );

    let trim = ((base + TRIM.0) >> shift, (TRIM.1 >> shift) as u32);
    qp.deallocate(NSID, &[trim], 3)
        .map_err(ctx("Dataset Management submission"))?;
    wait_tag(&mut qp, 3, "Dataset Management")?
        .result
        .map_err(ctx("Dataset Management (deallocate)"))?;
    let got = read_range(&mut qp, shift, base, REGION)?;
    let (t0, t1) = (TRIM.0 as usize, (TRIM.0 + TRIM.1) as usize);
    let expect = match dlfeat {
        1 => Some(0x00),
        2 => Some(0xFF),
        _ => None,
    };
    match expect {
        Some(v) => {
            if let Some(i) = got[t0..t1].iter().position(|&b| b != v) {
                return Err(format!(
                    "Dataset Management: DLFEAT {dlfeat} promises {v:#04x} for deallocated blocks, but byte {i} reads {:#04x}",
                    got[t0 + i]
                ));
            }
        }
        None => println!(
            "deallocate: DLFEAT {dlfeat}: contents of deallocated blocks unspecified, not checked"
        ),
    }
    for (from, to) in [(t1, REGION as usize)] {
        if let Some(m) = pattern::first_mismatch(seed, base + from as u64, &got[from..to]) {
            return Err(format!(
                "Dataset Management touched data outside its range: at {} expected {:#x} found {:#x}",
                m.0, m.1, m.2
            ));
        }
    }
    println!(
        "deallocate: OK ({} blocks{}; neighbours intact)",
        trim.1,
        expect.map_or(String::new(), |v| format!(
            " read back as {v:#04x} per DLFEAT {dlfeat}"
        ))
    );
    qp.flush_blocking(NSID).map_err(ctx("Flush"))?;
    Ok(())
}
