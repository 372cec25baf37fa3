//! `ufs-abort`: commands aborted right after their submission.

use super::*;

pub(crate) fn abort(a: &UfsDevArgs) -> Result<(), Failure> {
    use mcqio::ufs::UfsError;
    use mcqio::IoError;
    let ctrl = open(a, Some(1))?;
    let (shift, size) = lu0(&ctrl)?;
    let mut qp: UfsQueuePair = ctrl
        .create_qpair(Default::default())
        .map_err(ctx("creating a queue pair"))?;
    const N: u64 = 16;
    const LEN: u64 = 64 << 10;
    let base = size / 4;
    let seed = 0x6162_6f72_745f_7566;
    let mut data = vec![0u8; (N * LEN) as usize];
    pattern::fill(seed, base, &mut data);
    qp.write_blocking(LUN, base >> shift, &data)
        .map_err(ctx("write"))?;
    for t in 0..N {
        let mut buf = ctrl
            .alloc_buf(LEN as usize, DmaDir::Bidirectional)
            .map_err(ctx("allocating a buffer"))?;
        buf.fill(POISON);
        qp.read(
            LUN,
            (base + t * LEN) >> shift,
            (LEN >> shift) as u32,
            buf,
            t,
        )
        .map_err(|e| format!("read {t}: {:?}", e.kind))?;
    }
    qp.submit();
    // Newest first: the most likely to be still queued.
    let mut asked = 0;
    let mut refused = None;
    for t in (0..N).rev() {
        match qp.abort(t) {
            Ok(true) => asked += 1,
            Ok(false) => {}
            // QEMU 10.0's MCQ has no SQ stop (SQRTC/SQRTS): the engine
            // must say so with a typed error and lose nothing.
            Err(e @ mcqio::Error::Timeout { .. }) => {
                refused = Some(e.to_string());
                break;
            }
            Err(e) => return Err(format!("abort: {e}")),
        }
    }
    if let Some(e) = &refused {
        println!("the controller cannot abort (typed error: {e}); every command must still complete once");
    }
    let mut seen = [0u32; N as usize];
    let (mut ok, mut aborted) = (0, 0);
    let mut err: Option<Failure> = None;
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    while qp.outstanding() > 0 {
        if Instant::now() > deadline {
            return Err(format!("{} command(s) never completed", qp.outstanding()));
        }
        qp.poll(usize::MAX, |c| {
            let Some(n) = seen.get_mut(c.tag as usize) else {
                err.get_or_insert(format!("completion for unknown tag {}", c.tag));
                return;
            };
            *n += 1;
            match (&c.result, c.buf) {
                (Ok(()), Some(b)) => {
                    let off = (c.tag * LEN) as usize;
                    if b.to_vec() != data[off..off + LEN as usize] {
                        err.get_or_insert(format!("read {} completed with wrong data", c.tag));
                    }
                    ok += 1;
                }
                (Err(IoError::Aborted), Some(_))
                | (Err(IoError::Ufs(UfsError::Transport(_))), Some(_)) => aborted += 1,
                (r, b) => {
                    err.get_or_insert(format!(
                        "read {}: unexpected outcome {r:?} (buffer back: {})",
                        c.tag,
                        b.is_some()
                    ));
                }
            }
        })
        .map_err(ctx("poll"))?;
        if let Some(e) = err.take() {
            return Err(e);
        }
    }
    if let Some((t, n)) = seen.iter().enumerate().find(|(_, &n)| n != 1) {
        return Err(format!("read {t} completed {n} times"));
    }
    println!(
        "{N} reads, {asked} abort(s) accepted: {aborted} ended aborted, {ok} completed with correct data; each exactly once"
    );
    let mut back = vec![POISON; LEN as usize];
    qp.read_blocking(LUN, base >> shift, &mut back)
        .map_err(ctx("read after the aborts"))?;
    if back[..] != data[..LEN as usize] {
        return Err("after the aborts a normal read returned wrong data".into());
    }
    println!("after the aborts the queue pair reads correctly");
    qp.close(|_| {}).map_err(ctx("closing the queue pair"))
}
