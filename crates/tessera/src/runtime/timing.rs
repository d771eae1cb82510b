//! CUDA-event timing and the L2 flush used by benchmarks.

use cudarc::driver::sys;

use super::context::{check, Context};
use crate::error::Result;

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

/// How a benchmark repeats its work.
#[derive(Clone, Copy, Debug)]
pub struct TimingOptions {
    /// Untimed calls before measuring (JIT, module load, clocks ramp-up). Default 5.
    pub warmup: usize,
    /// Timed groups; the result is the median of group means. Default 7.
    pub groups: usize,
    /// Calls per group. Default: enough for ~2 ms per group, between 1 and 100.
    pub reps: Option<usize>,
}

impl Default for TimingOptions {
    fn default() -> Self {
        TimingOptions {
            warmup: 5,
            groups: 7,
            reps: None,
        }
    }
}

/// Result of [`time_median`].
#[derive(Clone, Debug)]
pub struct Timing {
    /// Median over groups of the mean time per call (ms).
    pub median_ms: f64,
    /// Each group's mean (ms), for spread.
    pub group_ms: Vec<f64>,
    pub reps: usize,
}

/// Times `f(i)` with CUDA events: warm-up, then `groups` groups of `reps` calls; `i` counts
/// calls so the caller can rotate input sets to keep L2 from serving them.
pub fn time_median(ctx: &Context, opts: TimingOptions, mut f: impl FnMut(usize) -> Result<()>) -> Result<Timing> {
    let mut call = 0usize;
    for _ in 0..opts.warmup.max(1) {
        f(call)?;
        call += 1;
    }
    let timer = EventTimer::new(ctx)?;
    let reps = match opts.reps {
        Some(r) => r.max(1),
        None => {
            timer.start()?;
            f(call)?;
            call += 1;
            let one = timer.stop_ms()?.max(1e-4);
            ((2.0 / one).ceil() as usize).clamp(1, 100)
        }
    };
    let mut group_ms = Vec::with_capacity(opts.groups);
    for _ in 0..opts.groups.max(1) {
        timer.start()?;
        for _ in 0..reps {
            f(call)?;
            call += 1;
        }
        group_ms.push(timer.stop_ms()? / reps as f64);
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
            groups: 7,
            reps: Some(5),
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
