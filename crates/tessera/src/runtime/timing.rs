//! CUDA-event timing and the L2 flush used by benchmarks.

use cudarc::driver::sys;

use super::context::{check, Context};
use crate::error::{Error, Result};

/// A pair of CUDA events recorded on the context's stream.
pub struct EventTimer {
    ctx: Context,
    start: sys::CUevent,
    stop: sys::CUevent,
}

impl Drop for EventTimer {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: created in `new`, destroyed once.
            unsafe {
                sys::cuEventDestroy_v2(self.start);
                sys::cuEventDestroy_v2(self.stop);
            }
        }
    }
}

impl EventTimer {
    pub fn new(ctx: &Context) -> Result<Self> {
        ctx.bind()?;
        let (mut start, mut stop) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: out-parameters.
        unsafe {
            check("cuEventCreate", sys::cuEventCreate(&mut start, 0))?;
            check("cuEventCreate", sys::cuEventCreate(&mut stop, 0))?;
        }
        Ok(EventTimer {
            ctx: ctx.clone(),
            start,
            stop,
        })
    }
    /// Records the start event.
    pub fn start(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: valid event and stream.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.start, self.ctx.cu_stream())
        })
    }
    /// Records the stop event, waits for it and returns the elapsed milliseconds.
    pub fn stop_ms(&self) -> Result<f64> {
        self.ctx.bind()?;
        let mut ms = 0f32;
        // SAFETY: valid events recorded on this context's stream.
        unsafe {
            check("cuEventRecord", sys::cuEventRecord(self.stop, self.ctx.cu_stream()))?;
            check("cuEventSynchronize", sys::cuEventSynchronize(self.stop))?;
            check(
                "cuEventElapsedTime",
                sys::cuEventElapsedTime_v2(&mut ms, self.start, self.stop),
            )?;
        }
        Ok(ms as f64)
    }
}

/// How a benchmark repeats its work. The Python baseline runner
/// (`scripts/baselines/bench_common.py`, `time_ms`) follows the same rules, so that ours and the
/// baselines are timed alike.
#[derive(Clone, Copy, Debug)]
pub struct TimingOptions {
    /// Untimed calls first (JIT, module load, plans). Default 5.
    pub warmup: usize,
    /// Device time the untimed calls after those must fill, at least, in milliseconds. Default
    /// 500. Under sustained load an H200 holds its 700 W power cap by lowering the SM clock
    /// within ~100-200 ms, so a short warm-up times a kernel at boost clocks that it would not
    /// keep, and two harnesses that time the same kernel with different call counts can land on
    /// either side of the cap (crates/tessera/src/attention/NOTES.md, `df6489f`). Warming up past
    /// the cap's reaction measures every implementation in the same, steady state.
    pub warmup_ms: f64,
    /// Host sleep after the first warm-up batch (which takes JIT and module loads), before the
    /// rest of the warm-up, in milliseconds. Default 0; [`TimingOptions::burst`] idles long
    /// enough for the board to fall back below its power cap.
    pub pause_ms: f64,
    /// Timed groups; the result is the median of group means. Default 7.
    pub groups: usize,
    /// Calls per group. Default: enough for ~2 ms per group, between `min_reps` and
    /// [`MAX_REPS`].
    pub reps: Option<usize>,
    /// Fewest calls per group when `reps` is `None`. Default [`MIN_REPS`].
    pub min_reps: usize,
}

/// Fewest calls per timed group when [`TimingOptions::reps`] is `None`.
pub const MIN_REPS: usize = 5;
/// Most calls per timed group when [`TimingOptions::reps`] is `None`.
pub const MAX_REPS: usize = 100;
/// Device time per timed group the default group size aims at (ms).
const TARGET_GROUP_MS: f64 = 2.0;
/// Most warm-up batches: bounds the warm-up when a call takes no measurable time.
const MAX_WARMUP_BATCHES: usize = 64;

impl Default for TimingOptions {
    fn default() -> Self {
        TimingOptions {
            warmup: 5,
            warmup_ms: 500.0,
            pause_ms: 0.0,
            groups: 7,
            reps: None,
            min_reps: MIN_REPS,
        }
    }
}

impl TimingOptions {
    /// Short bursts from a rested board, as `triton.testing.do_bench` and most published
    /// numbers time kernels (and as ANCHORS.md's baselines were timed): after the first batch, a
    /// [`BURST_PAUSE_MS`] idle so the board falls back below its power cap, 20 ms of warm-up to
    /// bring the clocks up, then 7 groups of about 2 ms (at least 1 call each). A kernel whose
    /// timed calls last longer than the cap's reaction (~100-200 ms on an H200) is still
    /// partly timed under the cap. The default ([`TimingOptions::default`]) is the sustained
    /// state a busy server sees instead.
    pub fn burst() -> Self {
        TimingOptions {
            warmup: 5,
            warmup_ms: 20.0,
            pause_ms: BURST_PAUSE_MS,
            groups: 7,
            reps: None,
            min_reps: 1,
        }
    }
}

/// Idle before a burst's timing (ms): long enough for an H200 under its 700 W cap to return to
/// its boost clock.
pub const BURST_PAUSE_MS: f64 = 2000.0;

/// Result of [`time_median`].
#[derive(Clone, Debug)]
pub struct Timing {
    /// Median over groups of the mean time per call (ms).
    pub median_ms: f64,
    /// Each group's mean (ms), for spread.
    pub group_ms: Vec<f64>,
    pub reps: usize,
}

/// Times `f(i)` with CUDA events: warm-up (`warmup` calls, then at least `warmup_ms` of device
/// time, back to back), then `groups` groups of `reps` calls; `i` counts calls so the caller can
/// rotate input sets to keep L2 from serving them.
pub fn time_median(ctx: &Context, opts: TimingOptions, mut f: impl FnMut(usize) -> Result<()>) -> Result<Timing> {
    let timer = EventTimer::new(ctx)?;
    let mut call = 0usize;
    run_schedule(opts, |n| {
        timer.start()?;
        for _ in 0..n {
            f(call)?;
            call += 1;
        }
        timer.stop_ms()
    })
}

/// The schedule of [`time_median`] over `batch(n)`, which makes `n` back-to-back calls and
/// returns their elapsed milliseconds.
fn run_schedule(opts: TimingOptions, mut batch: impl FnMut(usize) -> Result<f64>) -> Result<Timing> {
    // The first batch takes module loads, JIT and plan building on first use, host time that
    // the events count while the device idles, so it does not count towards warmup_ms; later
    // batches are sized from the last one's time per call to fill warmup_ms.
    let first = opts.warmup.max(1);
    let mut per_call = (batch(first)? / first as f64).max(1e-4);
    if opts.pause_ms > 0.0 {
        let pause = std::time::Duration::try_from_secs_f64(opts.pause_ms * 1e-3).map_err(|_| {
            Error::invalid(
                "pause_ms",
                format!("{} ms is not a pause the host can sleep", opts.pause_ms),
            )
        })?;
        std::thread::sleep(pause);
    }
    let mut warm_ms = 0.0;
    for _ in 0..MAX_WARMUP_BATCHES {
        if warm_ms >= opts.warmup_ms {
            break;
        }
        let n = (((opts.warmup_ms - warm_ms) / per_call).ceil() as usize).clamp(1, 1000);
        let t = batch(n)?;
        warm_ms += t;
        per_call = (t / n as f64).max(1e-4);
    }
    let reps = match opts.reps {
        Some(r) => r.max(1),
        None => ((TARGET_GROUP_MS / per_call).ceil() as usize).clamp(opts.min_reps.clamp(1, MAX_REPS), MAX_REPS),
    };
    let mut group_ms = Vec::with_capacity(opts.groups);
    for _ in 0..opts.groups.max(1) {
        group_ms.push(batch(reps)? / reps as f64);
    }
    let mut sorted = group_ms.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    Ok(Timing {
        median_ms: sorted[sorted.len() / 2],
        group_ms,
        reps,
    })
}

/// Measured device-to-device copy bandwidth in GB/s (bytes read + written), on `bytes`-sized
/// buffers (DESIGN.md uses 1 GiB).
pub fn copy_bandwidth_gbps(ctx: &Context, bytes: usize) -> Result<f64> {
    let mut a = ctx.alloc::<u8>(bytes)?;
    let mut b = ctx.alloc::<u8>(bytes)?;
    a.fill_bytes(0x3c)?;
    b.fill_bytes(0x1d)?;
    let t = time_median(
        ctx,
        TimingOptions {
            warmup: 3,
            reps: Some(5),
            ..TimingOptions::default()
        },
        |i| {
            if i % 2 == 0 {
                b.copy_from(&a)
            } else {
                a.copy_from(&b)
            }
        },
    )?;
    Ok(2.0 * bytes as f64 / (t.median_ms * 1e-3) / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake device: every call takes `ms` except the first, which takes `first_ms` (module
    /// load); records the batch sizes and the total device time.
    struct Fake {
        ms: f64,
        first_ms: f64,
        calls: usize,
        batches: Vec<usize>,
        elapsed: f64,
    }

    impl Fake {
        fn new(ms: f64, first_ms: f64) -> Fake {
            Fake {
                ms,
                first_ms,
                calls: 0,
                batches: Vec::new(),
                elapsed: 0.0,
            }
        }
        fn batch(&mut self, n: usize) -> Result<f64> {
            let mut t = 0.0;
            for _ in 0..n {
                t += if self.calls == 0 { self.first_ms } else { self.ms };
                self.calls += 1;
            }
            self.batches.push(n);
            self.elapsed += t;
            Ok(t)
        }
    }

    #[test]
    fn warms_up_for_the_device_time_then_times_groups_of_about_2_ms() {
        let opts = TimingOptions::default();
        let mut fake = Fake::new(0.25, 30.0);
        let t = run_schedule(opts, |n| fake.batch(n)).unwrap();
        let timed: usize = t.reps * opts.groups;
        // The first batch (the 30 ms load and 4 calls) does not count towards the warm-up.
        let warm_ms = fake.elapsed - timed as f64 * 0.25 - 31.0;
        assert_eq!(fake.batches[0], opts.warmup);
        assert!(warm_ms >= opts.warmup_ms, "warm-up {warm_ms} ms");
        assert!(warm_ms < opts.warmup_ms + 1.0, "warm-up {warm_ms} ms");
        assert_eq!(t.reps, 8); // 2 ms / 0.25 ms
        assert_eq!(t.group_ms.len(), 7);
        assert!((t.median_ms - 0.25).abs() < 1e-12);
    }

    #[test]
    fn group_size_stays_within_its_bounds() {
        let long = run_schedule(TimingOptions::default(), |n| Ok(n as f64 * 15.0)).unwrap();
        assert_eq!(long.reps, MIN_REPS);
        let short = run_schedule(TimingOptions::default(), |n| Ok(n as f64 * 0.001)).unwrap();
        assert_eq!(short.reps, MAX_REPS);
        let fixed = TimingOptions {
            reps: Some(3),
            ..TimingOptions::default()
        };
        assert_eq!(run_schedule(fixed, |n| Ok(n as f64)).unwrap().reps, 3);
    }

    #[test]
    fn a_burst_pauses_after_the_first_batch_and_times_single_long_calls() {
        let opts = TimingOptions {
            pause_ms: 1.0,
            ..TimingOptions::burst()
        };
        let mut fake = Fake::new(3.5, 3.5);
        let start = std::time::Instant::now();
        let t = run_schedule(opts, |n| fake.batch(n)).unwrap();
        assert!(start.elapsed() >= std::time::Duration::from_millis(1));
        // 5 calls, then 20 ms of warm-up (6 calls of 3.5 ms), then 7 groups of 1 call.
        assert_eq!(fake.batches, [5, 6, 1, 1, 1, 1, 1, 1, 1]);
        assert_eq!(t.reps, 1);
        assert!((t.median_ms - 3.5).abs() < 1e-12);
        // Short calls still fill about 2 ms per group.
        let short = run_schedule(opts, |n| Ok(n as f64 * 0.25)).unwrap();
        assert_eq!(short.reps, 8);
    }

    #[test]
    fn a_pause_too_long_to_sleep_is_an_error() {
        let opts = TimingOptions {
            pause_ms: f64::INFINITY,
            ..TimingOptions::burst()
        };
        let err = run_schedule(opts, |n| Ok(n as f64)).unwrap_err();
        assert!(err.to_string().contains("pause_ms"), "{err}");
    }

    #[test]
    fn calls_that_take_no_time_still_end() {
        let mut batches = 0;
        let t = run_schedule(TimingOptions::default(), |_| {
            batches += 1;
            Ok(0.0)
        })
        .unwrap();
        assert!(batches <= 1 + MAX_WARMUP_BATCHES + 7);
        assert_eq!(t.median_ms, 0.0);
    }

    #[test]
    fn a_slow_call_fills_the_warm_up_with_one_call() {
        // 600 ms per call: after the first batch (5 calls), one call fills the 500 ms.
        let mut fake = Fake::new(600.0, 600.0);
        let t = run_schedule(TimingOptions::default(), |n| fake.batch(n)).unwrap();
        assert_eq!(fake.batches[..3], [5, 1, t.reps]);
        assert_eq!(t.reps, MIN_REPS);
    }

    #[test]
    fn a_long_first_call_does_not_end_the_warm_up() {
        // A first call of 2 s (JIT on the host while the device idles) leaves 500 ms to fill.
        let mut fake = Fake::new(1.0, 2000.0);
        let t = run_schedule(TimingOptions::default(), |n| fake.batch(n)).unwrap();
        let warm_ms = fake.elapsed - 2004.0 - (t.reps * 7) as f64;
        assert!(warm_ms >= 500.0, "warm-up {warm_ms} ms");
    }

    #[test]
    fn errors_propagate() {
        let r = run_schedule(TimingOptions::default(), |_| {
            Err(crate::error::Error::invalid("x", "boom"))
        });
        assert!(r.is_err());
    }
}
