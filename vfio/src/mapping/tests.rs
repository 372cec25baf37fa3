//! Tests of the three mapping modes against the recording test IOMMU.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::testing::CountingIommu;
use super::*;
use crate::dma::{DmaSpace, HugePages, PAGE_SIZE};
use crate::iommu::Iommu;

const FOREVER: Duration = Duration::from_secs(3600);

fn space() -> (Arc<CountingIommu>, Arc<DmaSpace>) {
    let iommu = Arc::new(CountingIommu::new());
    let space = DmaSpace::new(iommu.clone(), HugePages::Never);
    (iommu, space)
}

fn lazy(space: &Arc<DmaSpace>, batch: usize, max_delay: Duration) -> LazyMapper {
    LazyMapper::new(space, 1 << 24, LazyConfig { batch, max_delay }).unwrap()
}

fn app(pages: usize) -> IoBuffer {
    AppBuffer::new(pages * PAGE_SIZE).unwrap().into()
}

#[test]
fn premapped_io_makes_no_iommu_calls() {
    let (iommu, space) = space();
    let mut m = PremappedMapper::new(
        &space,
        &PoolConfig {
            buf_size: 2 * PAGE_SIZE,
            count: 4,
        },
    )
    .unwrap();
    let before = iommu.counters().snapshot();
    assert_eq!(before.maps, 1, "the pool is mapped once, at creation");
    let mut out = Vec::new();
    for i in 0..1000u64 {
        let buf = m.pool().alloc().unwrap();
        let iova = buf.iova();
        let mapped = m.map(buf.into(), 100, DmaDir::FromDevice, i).unwrap();
        assert_eq!((mapped.iova(), mapped.len()), (iova, PAGE_SIZE));
        m.release(mapped, &mut out).unwrap();
        let r = out.pop().unwrap();
        assert_eq!(r.tag, i);
        drop(r.buf); // back to the pool through its return queue
    }
    assert_eq!(
        iommu.counters().snapshot(),
        before,
        "no IOMMU call on the I/O path"
    );
    let s = m.stats();
    assert_eq!((s.premapped_ios, s.unmap_calls), (1000, 0));
    assert_eq!(s.bytes_pinned, 8 * PAGE_SIZE as u64);

    let err = m.map(app(1), PAGE_SIZE, DmaDir::ToDevice, 0).unwrap_err();
    assert!(matches!(err.error, MapError::NotPremapped));
    assert!(matches!(err.buf, IoBuffer::App(_)), "the buffer comes back");
}

#[test]
fn pool_buffers_return_from_other_threads() {
    let (_iommu, space) = space();
    let mut pool = BufPool::new(
        &space,
        &PoolConfig {
            buf_size: PAGE_SIZE,
            count: 8,
        },
    )
    .unwrap();
    let bufs: Vec<_> = (0..8).map(|_| pool.alloc().unwrap()).collect();
    assert!(matches!(
        pool.alloc(),
        Err(MapError::PoolExhausted { count: 8, .. })
    ));
    let mut iovas: Vec<_> = bufs.iter().map(|b| b.iova().raw()).collect();
    iovas.sort_unstable();
    iovas.dedup();
    assert_eq!(iovas.len(), 8, "distinct buffers");
    std::thread::spawn(move || drop(bufs)).join().unwrap();
    assert_eq!(pool.free_count(), 8);
    let again: Vec<_> = (0..8).map(|_| pool.alloc().unwrap()).collect();
    for b in again {
        pool.put(b);
    }
    assert_eq!(pool.free_count(), 8);
}

#[test]
fn pool_buffer_of_another_space_is_refused() {
    let (_i1, s1) = space();
    let (_i2, s2) = space();
    let mut pool = BufPool::new(&s1, &PoolConfig::default()).unwrap();
    let mut m = StrictMapper::new(&s2, 1 << 20).unwrap();
    let err = m
        .map(pool.alloc().unwrap().into(), PAGE_SIZE, DmaDir::ToDevice, 0)
        .unwrap_err();
    assert!(matches!(err.error, MapError::ForeignPool));
}

#[test]
fn strict_is_one_map_one_unmap_one_invalidation_per_io() {
    let (iommu, space) = space();
    let mut m = StrictMapper::new(&space, 1 << 20).unwrap();
    let mut buf = app(4);
    let before = iommu.counters().snapshot();
    let mut out = Vec::new();
    for i in 0..100u64 {
        let mapped = m.map(buf, 3 * PAGE_SIZE - 1, DmaDir::ToDevice, i).unwrap();
        assert_eq!(mapped.len(), 3 * PAGE_SIZE);
        assert_eq!(mapped.transfer_len(), 3 * PAGE_SIZE - 1);
        assert!(mapped.is_mapped_in(&space));
        assert!(iommu.is_mapped(mapped.iova()));
        m.release(mapped, &mut out).unwrap();
        assert_eq!(out.len(), 1, "strict hands the buffer back at once");
        let r = out.pop().unwrap();
        assert!(!iommu.maps_host_range(r.buf.as_ptr(), r.buf.len()));
        buf = r.buf;
    }
    let after = iommu.counters().snapshot();
    assert_eq!(after.maps - before.maps, 100);
    assert_eq!(after.unmap_calls - before.unmap_calls, 100);
    assert_eq!(after.invalidations - before.invalidations, 100);
    assert_eq!(iommu.live_mappings(), 0);
    let s = m.stats();
    assert_eq!(
        (s.maps, s.unmaps, s.unmap_calls, s.invalidations),
        (100, 100, 100, 100)
    );
    assert_eq!(s.bytes_pinned, 0);
    assert_eq!(s.peak_bytes_pinned, 3 * PAGE_SIZE as u64);
}

#[test]
fn lazy_coalesces_contiguous_mappings_into_one_call() {
    let (iommu, space) = space();
    let mut m = lazy(&space, 16, FOREVER);
    let mut rng = SmallRng::seed_from_u64(7);
    let mut mapped: Vec<_> = (0..16u64)
        .map(|i| {
            m.map(app(1 + i as usize % 3), PAGE_SIZE, DmaDir::FromDevice, i)
                .unwrap()
        })
        .collect();
    // Completion order is random; the window allocation was not.
    let mut out = Vec::new();
    let before = iommu.counters().snapshot();
    while !mapped.is_empty() {
        let x = mapped.swap_remove(rng.gen_range(0..mapped.len()));
        m.release(x, &mut out).unwrap();
        if !mapped.is_empty() {
            assert!(out.is_empty(), "nothing comes back before the flush");
            assert_eq!(iommu.live_mappings(), 16);
        }
    }
    let after = iommu.counters().snapshot();
    assert_eq!(out.len(), 16);
    assert_eq!(
        after.unmap_calls - before.unmap_calls,
        1,
        "one ranged unmap"
    );
    assert_eq!(after.unmapped_ranges - before.unmapped_ranges, 16);
    assert_eq!(after.invalidations - before.invalidations, 1);
    assert_eq!(iommu.live_mappings(), 0);
    let s = m.stats();
    assert_eq!(
        (s.unmap_calls, s.unmap_ranges, s.unmaps, s.invalidations),
        (1, 1, 16, 1)
    );
    assert_eq!(s.flushes_full, 1);
}

#[test]
fn lazy_gaps_split_runs_but_not_calls() {
    let (iommu, space) = space();
    let mut m = lazy(&space, 64, FOREVER);
    let v: Vec<_> = (0..5u64)
        .map(|i| m.map(app(1), PAGE_SIZE, DmaDir::ToDevice, i).unwrap())
        .collect();
    let mut out = Vec::new();
    let mut keep = Vec::new();
    for (i, x) in v.into_iter().enumerate() {
        if i == 2 {
            keep.push(x); // still in flight: splits [0,1] from [3,4]
        } else {
            m.release(x, &mut out).unwrap();
        }
    }
    let before = iommu.counters().snapshot();
    m.flush(&mut out).unwrap();
    let after = iommu.counters().snapshot();
    assert_eq!(out.len(), 4);
    let s = m.stats();
    assert_eq!((s.unmap_calls, s.unmap_ranges, s.unmaps), (1, 2, 4));
    // The test IOMMU models VFIO: no multi-range ioctl, one call per range.
    assert_eq!(after.unmap_calls - before.unmap_calls, 2);
    assert_eq!(iommu.live_mappings(), 1);
    for x in keep {
        m.release(x, &mut out).unwrap();
    }
    m.flush(&mut out).unwrap();
    assert_eq!(iommu.live_mappings(), 0);
}

#[test]
fn lazy_time_limit_is_checked_by_poll() {
    let (_iommu, space) = space();
    let mut out = Vec::new();
    let mut slow = lazy(&space, 256, FOREVER);
    let x = slow.map(app(1), PAGE_SIZE, DmaDir::ToDevice, 1).unwrap();
    slow.release(x, &mut out).unwrap();
    slow.poll(&mut out).unwrap();
    assert!(out.is_empty(), "deadline an hour away");
    assert_eq!(slow.queued(), 1);

    let mut at_once = lazy(&space, 256, Duration::ZERO);
    let x = at_once.map(app(1), PAGE_SIZE, DmaDir::ToDevice, 2).unwrap();
    at_once.release(x, &mut out).unwrap();
    at_once.poll(&mut out).unwrap();
    assert_eq!(out.len(), 1, "an expired deadline flushes on poll");
    assert_eq!(at_once.stats().flushes_timed, 1);
}

#[test]
fn lazy_full_window_flushes_and_retries() {
    let (iommu, space) = space();
    let mut m = LazyMapper::new(&space, 4 * PAGE_SIZE as u64, LazyConfig::with_batch(100)).unwrap();
    let mut out = Vec::new();
    for i in 0..4 {
        let x = m.map(app(1), PAGE_SIZE, DmaDir::ToDevice, i).unwrap();
        m.release(x, &mut out).unwrap();
    }
    assert_eq!(iommu.live_mappings(), 4);
    let x = m.map(app(1), PAGE_SIZE, DmaDir::ToDevice, 4).unwrap();
    assert_eq!(m.stats().flushes_forced, 1);
    m.poll(&mut out).unwrap();
    assert_eq!(
        out.len(),
        4,
        "the forced flush's buffers come out on the next call"
    );
    // The window is full of in-flight mappings: a clear error, buffer returned.
    let mut held = vec![x];
    for i in 5..8 {
        held.push(m.map(app(1), PAGE_SIZE, DmaDir::ToDevice, i).unwrap());
    }
    let err = m.map(app(1), PAGE_SIZE, DmaDir::ToDevice, 9).unwrap_err();
    assert!(
        matches!(err.error, MapError::WindowFull { .. }),
        "{}",
        err.error
    );
    for x in held {
        m.release(x, &mut out).unwrap();
    }
}

#[test]
fn bad_lengths_and_foreign_releases_are_errors() {
    let (iommu, space) = space();
    let mut a = StrictMapper::new(&space, 1 << 20).unwrap();
    let mut b = lazy(&space, 4, FOREVER);
    for len in [0, 2 * PAGE_SIZE + 1] {
        let e = a.map(app(2), len, DmaDir::ToDevice, 0).unwrap_err();
        assert!(matches!(e.error, MapError::BadLength { .. }));
    }
    let x = a.map(app(1), PAGE_SIZE, DmaDir::ToDevice, 0).unwrap();
    let (_other_iommu, other) = self::space();
    assert!(x.is_mapped_in(&space) && !x.is_mapped_in(&other));
    let mut out = Vec::new();
    assert!(matches!(
        b.release(x, &mut out),
        Err(MapError::ForeignMapping { .. })
    ));
    // The foreign mapping was leaked, not unmapped under the device.
    assert_eq!(iommu.live_mappings(), 1);
}

#[test]
fn dropped_mapping_leaks_instead_of_freeing_reachable_memory() {
    let (iommu, space) = space();
    let mut m = StrictMapper::new(&space, 1 << 20).unwrap();
    let x = m.map(app(1), PAGE_SIZE, DmaDir::FromDevice, 0).unwrap();
    let iova = x.iova();
    drop(x);
    // The mapping and its memory stay: a late device write still lands in
    // valid (leaked) memory rather than in freed or reused pages.
    assert!(iommu.is_mapped(iova));
    iommu.device_write(iova, &[1; 64]).unwrap();
}

#[test]
fn queue_mapper_from_config() {
    let (_iommu, space) = space();
    for (name, mode) in [
        ("premapped", DmaMode::Premapped),
        ("strict", DmaMode::Strict),
        ("lazy", DmaMode::Lazy),
    ] {
        assert_eq!(name.parse::<DmaMode>().unwrap(), mode);
        let mut q = QueueMapper::new(&space, &MapperConfig::with_mode(mode)).unwrap();
        assert_eq!(q.mode(), mode);
        let buf = match q.pool() {
            Some(p) => p.alloc().unwrap().into(),
            None => app(1),
        };
        let x = q.map(buf, PAGE_SIZE, DmaDir::ToDevice, 5).unwrap();
        let mut out = Vec::new();
        q.release(x, &mut out).unwrap();
        q.flush(&mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].tag, 5);
    }
    assert!(matches!(
        "eager".parse::<DmaMode>(),
        Err(MapError::UnknownMode(_))
    ));
    let bad = MapperConfig {
        lazy: LazyConfig::with_batch(0),
        ..MapperConfig::default()
    };
    assert!(matches!(
        QueueMapper::new(&space, &bad),
        Err(MapError::LazyBatch { batch: 0, .. })
    ));
}

/// Issue 27 item 9 (d): a batch too large to ever fill is refused with a
/// typed error instead of sizing the flush queue for it (`usize::MAX` used
/// to panic with a capacity overflow), and no time limit is expressible
/// without overflowing the clock.
#[test]
fn lazy_config_is_validated_at_creation() {
    let (iommu, space) = space();
    for batch in [0, super::MAX_FLUSH_BATCH + 1, usize::MAX] {
        let cfg = LazyConfig {
            batch,
            max_delay: Duration::from_millis(1),
        };
        assert_eq!(
            cfg.validate().map_err(|e| e.to_string()),
            Err(MapError::LazyBatch {
                batch,
                max: super::MAX_FLUSH_BATCH
            }
            .to_string())
        );
        let r = LazyMapper::new(&space, 16 << 20, cfg);
        assert!(
            matches!(r, Err(MapError::LazyBatch { batch: b, .. }) if b == batch),
            "{batch}: {r:?}"
        );
    }
    // Batch only: Duration::MAX never expires, the batch flushes.
    let mut m = LazyMapper::new(&space, 16 << 20, LazyConfig::batch_only(2)).unwrap();
    let mut out = Vec::new();
    let a = m.map(app(1), 4096, DmaDir::FromDevice, 1).unwrap();
    m.release(a, &mut out).unwrap();
    m.poll(&mut out).unwrap();
    assert!(out.is_empty(), "no time limit");
    let b = m.map(app(1), 4096, DmaDir::FromDevice, 2).unwrap();
    m.release(b, &mut out).unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(iommu.live_mappings(), 0);
}

/// What one randomized lazy run observed.
#[derive(Debug, Default)]
struct Observed {
    /// Device accesses to in-flight mappings that faulted (must be 0).
    inflight_faults: u64,
    /// Buffers handed back while still mapped, plus app data overwritten by
    /// the device after the app got its buffer back (must be 0).
    violations: u64,
    /// Stray writes to released IOVAs that the IOMMU blocked.
    stray_blocked: u64,
    /// Stray writes to released IOVAs that landed in still-queued memory.
    stray_landed: u64,
}

const APP_BYTE: u8 = 0xA5;
const DEV_BYTE: u8 = 0xD0;

/// Random submits, device accesses, completions, stray (late) device writes to
/// released IOVAs, polls and flushes on one lazy mapper.
fn lazy_random_run(
    iommu: &CountingIommu,
    space: &Arc<DmaSpace>,
    seed: u64,
    broken: bool,
) -> Observed {
    let mut rng = SmallRng::seed_from_u64(seed);
    let batch = if broken {
        rng.gen_range(8..=48)
    } else {
        rng.gen_range(1..=48)
    };
    let mut m = lazy(space, batch, FOREVER);
    if broken {
        // SAFETY: every buffer stays in `owned`/`inflight` until the final
        // flush below; device writes to early-returned buffers are exactly
        // what the run detects (through volatile stores, no live borrow).
        unsafe { m.set_release_before_flush_for_tests(true) };
    }
    let mut obs = Observed::default();
    // Buffers the application holds, each filled with APP_BYTE.
    let mut owned: Vec<AppBuffer> = (0..24)
        .map(|_| {
            let mut b = AppBuffer::new(rng.gen_range(1..=4) * PAGE_SIZE).unwrap();
            b.as_mut_slice().fill(APP_BYTE);
            b
        })
        .collect();
    let mut inflight: Vec<Mapped> = Vec::new();
    let mut released: Vec<(Iova, usize)> = Vec::new();
    let mut out = Vec::new();

    let take_back = |out: &mut Vec<Returned>, owned: &mut Vec<AppBuffer>, obs: &mut Observed| {
        for r in out.drain(..) {
            let mut b = r.buf.into_app().unwrap();
            if iommu.maps_host_range(b.as_ptr(), b.len()) {
                obs.violations += 1;
            }
            b.as_mut_slice().fill(APP_BYTE);
            owned.push(b);
        }
    };
    let check_intact = |b: &AppBuffer, obs: &mut Observed| {
        if b.as_slice().iter().any(|&x| x != APP_BYTE) {
            obs.violations += 1;
        }
    };

    for _ in 0..3000 {
        match rng.gen_range(0..100) {
            0..=29 if !owned.is_empty() => {
                let b = owned.swap_remove(rng.gen_range(0..owned.len()));
                check_intact(&b, &mut obs);
                let len = rng.gen_range(1..=b.len());
                let dir = [DmaDir::ToDevice, DmaDir::FromDevice, DmaDir::Bidirectional]
                    [rng.gen_range(0..3)];
                inflight.push(m.map(b.into(), len, dir, 0).unwrap());
            }
            30..=54 if !inflight.is_empty() => {
                let x = &inflight[rng.gen_range(0..inflight.len())];
                let off =
                    rng.gen_range(0..x.len() / PAGE_SIZE) * PAGE_SIZE + rng.gen_range(0..4000);
                let r = if x.dir().device_writes() {
                    iommu.device_write(x.iova().add(off as u64), &[DEV_BYTE; 16])
                } else {
                    iommu.device_read(x.iova().add(off as u64), &mut [0; 16])
                };
                obs.inflight_faults += r.is_err() as u64;
            }
            55..=79 if !inflight.is_empty() => {
                let x = inflight.swap_remove(rng.gen_range(0..inflight.len()));
                released.push((x.iova(), x.len()));
                if released.len() > 64 {
                    released.remove(0);
                }
                m.release(x, &mut out).unwrap();
                take_back(&mut out, &mut owned, &mut obs);
            }
            80..=91 if !released.is_empty() => {
                // A late or misbehaving device writing to a released IOVA.
                let (iova, len) = released[rng.gen_range(0..released.len())];
                let off = rng.gen_range(0..len - 16);
                match iommu.device_write(iova.add(off as u64), &[DEV_BYTE; 16]) {
                    Ok(()) => obs.stray_landed += 1,
                    Err(_) => obs.stray_blocked += 1,
                }
            }
            92..=96 => {
                m.poll(&mut out).unwrap();
                take_back(&mut out, &mut owned, &mut obs);
            }
            97..=99 => {
                m.flush(&mut out).unwrap();
                take_back(&mut out, &mut owned, &mut obs);
            }
            _ => {}
        }
    }
    for x in inflight.drain(..) {
        m.release(x, &mut out).unwrap();
    }
    m.flush(&mut out).unwrap();
    take_back(&mut out, &mut owned, &mut obs);
    for b in &owned {
        check_intact(b, &mut obs);
    }
    assert_eq!(owned.len(), 24, "every buffer came back");
    obs
}

#[test]
fn lazy_never_lets_the_device_touch_memory_returned_to_the_app() {
    let mut total = Observed::default();
    for seed in 0..8 {
        let (iommu, space) = space();
        let o = lazy_random_run(&iommu, &space, seed, false);
        assert_eq!(
            o.inflight_faults, 0,
            "seed {seed}: in-flight access faulted: {o:?}"
        );
        assert_eq!(
            o.violations, 0,
            "seed {seed}: device reached app memory: {o:?}"
        );
        assert_eq!(iommu.faults(), o.stray_blocked, "only stray accesses fault");
        assert_eq!(iommu.live_mappings(), 0, "seed {seed}: everything unmapped");
        total.stray_landed += o.stray_landed;
        total.stray_blocked += o.stray_blocked;
    }
    // The run exercised both sides of the flush: late writes absorbed by
    // queued (still owned) memory, and late writes blocked after the flush.
    assert!(
        total.stray_landed > 0 && total.stray_blocked > 0,
        "{total:?}"
    );
}

#[test]
fn broken_release_before_flush_is_caught() {
    for seed in 0..4 {
        let (iommu, space) = space();
        let o = lazy_random_run(&iommu, &space, seed, true);
        assert_eq!(o.inflight_faults, 0, "{o:?}");
        assert!(
            o.violations > 0,
            "seed {seed}: broken ordering not detected: {o:?}"
        );
    }
}

#[test]
fn per_cpu_lazy_mappers_share_one_iommu_safely() {
    let iommu = Arc::new(CountingIommu::new());
    let space = DmaSpace::new(iommu.clone(), HugePages::Never);
    let results: Vec<Observed> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|t| {
                let (iommu, space) = (&iommu, &space);
                s.spawn(move || lazy_random_run(iommu, space, 100 + t, false))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for o in &results {
        assert_eq!((o.inflight_faults, o.violations), (0, 0), "{o:?}");
    }
    assert_eq!(iommu.live_mappings(), 0);
}

#[test]
fn bench_rows_have_the_expected_iommu_work() {
    let (_iommu, space) = space();
    let d = Duration::from_millis(20);
    let rows = bench::run_table(&space, &bench::BenchMode::standard(), 2, d).unwrap();
    assert_eq!(rows.len(), 7);
    for r in &rows {
        assert!(r.total > 0, "{r:?}");
        assert_eq!(r.per_thread.len(), 2);
        match r.label.as_str() {
            "premapped" => assert_eq!(r.iommu.maps + r.iommu.unmap_calls, 0),
            "strict" | "lazy/1" => {
                assert_eq!(r.iommu.maps, r.total);
                assert_eq!(r.iommu.unmap_calls, r.total);
            }
            _ => {
                let batch: u64 = r.label["lazy/".len()..].parse().unwrap();
                assert_eq!(r.iommu.maps, r.total);
                assert_eq!(r.iommu.unmapped_ranges, r.total);
                // One call per flush; full flushes need `batch` releases each.
                let s = &r.stats;
                assert_eq!(
                    s.unmap_calls,
                    s.flushes_full + s.flushes_timed + s.flushes_forced
                );
                assert!(s.flushes_full <= r.total / batch, "{r:?}");
            }
        }
    }
    let table = bench::format_table(&rows);
    assert!(
        table.contains("lazy/256") && table.contains("vs best"),
        "{table}"
    );
}

#[test]
fn pool_memory_outlives_the_pool_while_buffers_are_out() {
    let (iommu, space) = space();
    let mut pool = BufPool::new(
        &space,
        &PoolConfig {
            buf_size: PAGE_SIZE,
            count: 2,
        },
    )
    .unwrap();
    let mut buf = pool.alloc().unwrap();
    drop(pool);
    assert_eq!(
        iommu.live_mappings(),
        1,
        "a buffer is still out: stay mapped"
    );
    buf.write_bytes(0, &[7; 8]).unwrap();
    iommu.device_read(buf.iova(), &mut [0; 8]).unwrap();
    drop(buf);
    assert_eq!(
        iommu.live_mappings(),
        0,
        "last buffer gone: unmapped and freed"
    );
}

#[test]
fn dropping_a_lazy_mapper_flushes_its_queue_and_returns_its_window() {
    let window: u64 = 1 << 30;
    // An IOMMU with room for exactly one window.
    let iommu = Arc::new(
        CountingIommu::new().with_ranges(vec![crate::IovaRange::new(2 << 20, (2 << 20) + window)]),
    );
    let space = DmaSpace::new(iommu.clone(), HugePages::Never);
    {
        let mut m = LazyMapper::new(&space, window, LazyConfig::with_batch(64)).unwrap();
        let mut out = Vec::new();
        for i in 0..10 {
            let x = m.map(app(1), PAGE_SIZE, DmaDir::ToDevice, i).unwrap();
            m.release(x, &mut out).unwrap();
        }
        assert_eq!(iommu.live_mappings(), 10);
    }
    assert_eq!(iommu.live_mappings(), 0);
    // The window went back: the next mapper gets the whole space again.
    assert!(space.alloc_iova(4096, 4096).is_ok());
    assert!(LazyMapper::new(&space, window, LazyConfig::default()).is_err());
    drop(StrictMapper::new(&space, window / 2).unwrap());
}

/// Issue 12 item 4: a `Mapped` outlives its space, and a new space is
/// allocated at the same address. The new space must not claim the mapping.
#[test]
fn mapped_from_a_dropped_space_is_not_mapped_in_a_space_at_the_same_address() {
    let (_iommu_a, space_a) = space();
    let mut mapper = StrictMapper::new(&space_a, 1 << 24).unwrap();
    let m = mapper.map(app(1), PAGE_SIZE, DmaDir::ToDevice, 1).unwrap();
    assert!(m.is_mapped_in(&space_a));
    let addr_a = Arc::as_ptr(&space_a) as usize;
    drop(mapper);
    drop(space_a);
    // Allocate spaces (keeping each alive so the next gets a new address)
    // until the allocator hands out A's address again.
    let mut kept = Vec::new();
    let space_b = loop {
        assert!(
            kept.len() < 256,
            "the allocator never reused the address of the dropped space"
        );
        let (iommu, s) = space();
        if Arc::as_ptr(&s) as usize == addr_a {
            break s;
        }
        kept.push((iommu, s));
    };
    assert!(
        !m.is_mapped_in(&space_b),
        "a space at a reused address claimed a mapping of the dropped one"
    );
    for (_, s) in &kept {
        assert!(!m.is_mapped_in(s));
    }
    // `m` leaks its buffer on drop (its mapper is gone), as documented.
    drop(m);
}

/// Issue 12 item 5, the sound pattern: buffers of one pool never overlap, so
/// threads that each own one may write them at the same time (each write
/// needs `&mut PoolBuf`); readers share `&PoolBuf`. The compile-fail doctests
/// on `PoolBuf` and `DmaRegion` show the racy forms no longer compile.
#[test]
fn threads_write_their_own_pool_buffers_concurrently() {
    let (_iommu, space) = space();
    let mut pool = BufPool::new(
        &space,
        &PoolConfig {
            buf_size: PAGE_SIZE,
            count: 4,
        },
    )
    .unwrap();
    let mut bufs: Vec<PoolBuf> = (0..4).map(|_| pool.alloc().unwrap()).collect();
    std::thread::scope(|s| {
        for (i, b) in bufs.iter_mut().enumerate() {
            s.spawn(move || {
                for round in 0..64u8 {
                    b.write_bytes(0, &[round ^ i as u8; PAGE_SIZE]).unwrap();
                }
            });
        }
    });
    std::thread::scope(|s| {
        for (i, b) in bufs.iter().enumerate() {
            for _ in 0..2 {
                s.spawn(move || {
                    let mut got = [0u8; PAGE_SIZE];
                    b.read_bytes(0, &mut got).unwrap();
                    assert!(got.iter().all(|&x| x == 63 ^ i as u8), "buffer {i}");
                });
            }
        }
    });
}

/// A space whose IOMMU maps `granule`-byte pages (an arm64 SMMU set up for
/// 16 or 64 KiB).
fn granule_space(granule: usize) -> (Arc<CountingIommu>, Arc<DmaSpace>) {
    let iommu = Arc::new(CountingIommu::new().with_min_page_size(granule));
    let space = DmaSpace::new(iommu.clone(), HugePages::Never);
    (iommu, space)
}

/// Issue 15 item 4: strict and lazy mappings on a 16 or 64 KiB granule
/// cover whole granules, the device reaches exactly the transfer through
/// the IOVA it is given, and after the release (and flush) nothing stays
/// mapped. Transfers shorter than a granule, longer than one, and ending
/// mid-page are covered.
#[test]
fn strict_and_lazy_map_whole_granules() {
    for granule in [16 << 10, 64 << 10] {
        for mode in [DmaMode::Strict, DmaMode::Lazy] {
            let (iommu, space) = granule_space(granule);
            let mut m = QueueMapper::new(&space, &MapperConfig::with_mode(mode)).unwrap();
            let mut rng = SmallRng::seed_from_u64(granule as u64);
            let mut out = Vec::new();
            for (tag, len) in [
                100usize,
                PAGE_SIZE,
                granule - 8,
                granule + 5000,
                3 * granule,
            ]
            .into_iter()
            .enumerate()
            {
                let buf = AppBuffer::for_space(&space, len).unwrap();
                let host = buf.as_ptr();
                assert_eq!(host.as_ptr() as usize % granule, 0, "whole granules");
                let mapped = m
                    .map(buf.into(), len, DmaDir::FromDevice, tag as u64)
                    .map_err(|e| e.error)
                    .unwrap_or_else(|e| panic!("{mode} {len} bytes, {granule} granule: {e}"));
                assert_eq!(mapped.len(), len.div_ceil(PAGE_SIZE) * PAGE_SIZE);
                assert!(mapped.iova().is_aligned(granule as u64));
                let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                iommu.device_write(mapped.iova(), &data).unwrap();
                m.release(mapped, &mut out).unwrap();
                m.flush(&mut out).unwrap();
                assert!(!iommu.maps_host_range(host, len), "{mode}: still mapped");
                let r = out.pop().expect("the buffer comes back after its unmap");
                let app = r.buf.into_app().unwrap();
                assert!(app.as_slice()[..len] == data[..], "{mode}: data");
            }
            assert_eq!(iommu.live_mappings(), 0, "{mode}: nothing left mapped");
            assert_eq!(iommu.faults(), 0);
            assert_eq!(m.stats().bytes_pinned, 0);
        }
    }
}

/// Issue 15 item 4: a buffer that would share a granule with memory it
/// does not own is refused with a typed error, handed back, and nothing is
/// mapped (documented choice: refuse, not refcount).
#[test]
fn a_buffer_sharing_a_granule_is_refused() {
    let granule = 64 << 10;
    let (iommu, space) = granule_space(granule);
    let mut m = StrictMapper::new(&space, 1 << 24).unwrap();
    // `AppBuffer::new` allocates host pages; keep one not on a granule.
    let mut bufs: Vec<AppBuffer> = (0..32)
        .map(|_| AppBuffer::new(PAGE_SIZE).unwrap())
        .collect();
    let Some(i) = bufs
        .iter()
        .position(|b| b.as_ptr().as_ptr() as usize % granule != 0)
    else {
        return; // every mmap landed on a granule: nothing to refuse here
    };
    let buf = bufs.swap_remove(i);
    let ptr = buf.as_ptr();
    let err = m
        .map(buf.into(), PAGE_SIZE, DmaDir::ToDevice, 1)
        .unwrap_err();
    assert!(
        matches!(err.error, MapError::SharedGranule { granule: g, .. } if g == granule),
        "{}",
        err.error
    );
    assert_eq!(err.buf.as_ptr(), ptr, "the buffer comes back");
    assert_eq!(iommu.live_mappings(), 0);
    assert_eq!(iommu.counters().snapshot().maps, 0);
}

/// The span arithmetic itself, with a buffer starting inside a granule:
/// the span starts on the granule below, the device address keeps the
/// offset, and a span leaving the owned memory is refused.
#[test]
fn granule_span_keeps_the_offset_and_stays_inside_owned_memory() {
    use super::window::granule_span;
    let g = 64 << 10;
    let base = 0x7f00_0000_0000usize;
    let owned = (base, 4 * g);
    let ptr = base + g + 0x3000;
    assert_eq!(granule_span(ptr, 0x1000, owned, g), Some((base + g, g)));
    assert_eq!(granule_span(ptr, g, owned, g), Some((base + g, 2 * g)));
    assert_eq!(
        granule_span(ptr, 3 * g - 0x3000, owned, g),
        Some((base + g, 3 * g))
    );
    assert_eq!(granule_span(ptr, 3 * g, owned, g), None, "past the end");
    assert_eq!(
        granule_span(base + 0x3000, 0x1000, (base + 0x3000, g), g),
        None
    );
    assert_eq!(granule_span(usize::MAX - 10, 100, owned, g), None);
    assert_eq!(granule_span(ptr, 0, owned, g), None);
}

/// Issue 15 item 4: a pool on a 64 KiB granule is one mapping; its buffers
/// need only start on controller pages.
#[test]
fn pool_on_a_large_granule() {
    let (iommu, space) = granule_space(64 << 10);
    let mut m = PremappedMapper::new(
        &space,
        &PoolConfig {
            buf_size: 3 * PAGE_SIZE,
            count: 5,
        },
    )
    .unwrap();
    assert_eq!(iommu.live_mappings(), 1);
    let mut out = Vec::new();
    let b = m.pool().alloc().unwrap();
    let b2 = m.pool().alloc().unwrap();
    assert_eq!(b2.iova().raw() - b.iova().raw(), 3 * PAGE_SIZE as u64);
    let mapped = m.map(b2.into(), 5000, DmaDir::FromDevice, 7).unwrap();
    iommu.device_write(mapped.iova(), &[9; 5000]).unwrap();
    m.release(mapped, &mut out).unwrap();
    let back = out.pop().unwrap().buf.into_pool().unwrap();
    let mut v = vec![0; 5000];
    back.read_bytes(0, &mut v).unwrap();
    assert!(v.iter().all(|&x| x == 9));
    drop((b, back, m));
    assert_eq!(iommu.live_mappings(), 0);
}
