//! Work counters of persistent and cooperative kernels: a small device buffer of `i32`s that
//! kernels claim work from (`atomicAdd`) or count arrivals in.
//!
//! The rule: the owner (a plan) creates the buffer zeroed, once, stream-ordered before any launch
//! that uses it ([`WorkCounters::new`]); every launch leaves each counter as it found it (the
//! kernel re-arms itself: the last draw or arrival resets the counter to 0), so nothing is
//! re-zeroed between launches and a launch stays CUDA-graph capturable. Launches sharing one
//! buffer must therefore be ordered (one stream). An owner that may have cut a launch short
//! (a graph replayed with stale inputs) re-zeroes with [`WorkCounters::zero`] before the next.

use super::{Context, DeviceBuffer};
use crate::error::Result;

/// A zeroed, stream-ordered buffer of `i32` counters that kernels re-arm themselves (see the
/// module rule).
#[derive(Debug)]
pub struct WorkCounters {
    buf: DeviceBuffer<i32>,
}

impl WorkCounters {
    /// Allocates `len` counters on `ctx` and zeroes them, ordered on its stream before any
    /// later launch.
    pub fn new(ctx: &Context, len: usize) -> Result<WorkCounters> {
        let mut buf = ctx.alloc::<i32>(len)?;
        if len > 0 {
            buf.fill_bytes(0)?;
        }
        Ok(WorkCounters { buf })
    }

    /// Zeroes every counter again (stream-ordered), for an owner that cannot rely on the last
    /// launch having re-armed them.
    pub fn zero(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.buf.fill_bytes(0)
    }

    /// Device address of the first counter.
    pub fn ptr(&self) -> u64 {
        self.buf.device_ptr()
    }

    /// Device address of counter `index` (at most `len()`, the end).
    pub fn ptr_at(&self, index: usize) -> u64 {
        debug_assert!(index <= self.len());
        self.buf.device_ptr() + (index * std::mem::size_of::<i32>()) as u64
    }

    /// Number of counters.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Bytes of device memory held.
    pub fn bytes(&self) -> usize {
        self.buf.bytes()
    }
}
