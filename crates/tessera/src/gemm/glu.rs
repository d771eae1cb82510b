//! The GLU weight layout ([`Glu`](super::problem::Glu)): SwiGLU / GeGLU run as one GEMM whose B
//! holds the gate and up projections interleaved at granularity 1 along N: column `2j` of B is
//! gate column `j`, column `2j + 1` is up column `j` (for B stored `[2N, K]`, the LLM weight
//! layout: row `2j` = `Wg[j]`, row `2j + 1` = `Wu[j]`). In every tensor-core accumulator layout a
//! thread holds adjacent column pairs `(c, c + 1)` with `c` even, so the epilogue multiplies
//! `act(gate)` by `up` in registers and writes one output column per pair.
//!
//! [`GluInterleave`] builds that layout on the device from the concatenated weights (plan once,
//! run once per weight): `[Wg; Wu]` `[2N, K]` (torch.cat along dim 0 of two `[N, K]` weights)
//! for B stored `[2N, K]` ([`Layout::ColMajor`]), or `[Wg | Wu]` `[K, 2N]` (cat along dim 1 of
//! two `[K, N]`) for B stored `[K, 2N]` ([`Layout::RowMajor`]). A bias for the GLU is interleaved
//! the same way (`[bg; bu]` -> `bias[2j] = bg[j]`, `bias[2j + 1] = bu[j]`): [`interleave_host`]
//! with `cols = 1`, or this plan with `k = 1`. [`interleave_host`] is the host form (tests,
//! references, weights prepared on the CPU).

use std::sync::Arc;

use super::problem::Layout;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::{Context, Kernel, KernelKey, KernelParams, KernelSpec, LaunchConfig, TensorView, TensorViewMut};

/// Source of the interleave kernel.
pub const SOURCE: &str = include_str!("gemm_glu_interleave.cu");
const THREADS: u32 = 256;

/// The interleaved copy of `stacked` on the host: rows of a `[2n, cols]` matrix
/// ([`Layout::ColMajor`]: B stored `[2N, K]`, `cols` = K) or columns of a `[cols, 2n]` one
/// ([`Layout::RowMajor`]: B stored `[K, 2N]`, `cols` = K rows), both row-major and contiguous.
/// Panics if `stacked.len() != 2 n cols` (a host helper for tests and CPU-side preparation).
pub fn interleave_host<T: Copy>(stacked: &[T], n: usize, cols: usize, layout: Layout) -> Vec<T> {
    assert_eq!(
        stacked.len(),
        2 * n * cols,
        "interleave_host: stacked is not 2 n x cols"
    );
    let mut out = Vec::with_capacity(stacked.len());
    match layout {
        Layout::ColMajor => {
            for j in 0..n {
                out.extend_from_slice(&stacked[j * cols..(j + 1) * cols]);
                out.extend_from_slice(&stacked[(n + j) * cols..(n + j + 1) * cols]);
            }
        }
        Layout::RowMajor => {
            for r in 0..cols {
                let row = &stacked[r * 2 * n..(r + 1) * 2 * n];
                for j in 0..n {
                    out.push(row[j]);
                    out.push(row[n + j]);
                }
            }
        }
    }
    out
}

/// `struct InterleaveParams` of gemm_glu_interleave.cu (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct InterleaveParams {
    src: u64,
    dst: u64,
    rows: i64,
    cols: i64,
    n: i64,
    interleave_rows: i32,
    pad_: i32,
}
const _: () = assert!(std::mem::size_of::<InterleaveParams>() == 48);
// SAFETY: #[repr(C)]: 2 pointers as u64, 3 i64, 2 i32, in the order and of the types of the
// kernel's struct (const void*, void*, long long, int); no padding (48 = 2*8 + 3*8 + 2*4).
unsafe impl KernelParams for InterleaveParams {}

/// The kernel variant moving `bytes`-byte elements.
pub fn interleave_key(bytes: usize) -> KernelKey {
    KernelKey::new("gemm_glu_interleave").int("kBytes", "b", bytes as i64)
}
pub fn interleave_spec(bytes: usize) -> KernelSpec {
    interleave_key(bytes).spec(
        "gemm_glu_interleave.cu",
        SOURCE,
        "gemm_glu_interleave",
        super::DEVICE_HEADERS,
    )
}
/// Every variant (1-, 2-, 4- and 8-byte elements).
pub fn all_specs() -> Vec<KernelSpec> {
    [1, 2, 4, 8].map(interleave_spec).to_vec()
}

/// A planned interleave of one weight shape: `n` output columns of the GLU (B has `2n`), depth
/// `k`, element `dtype`, the B layout the GEMM will read ([`Layout::ColMajor`]: `[2N, K]`).
pub struct GluInterleave {
    ctx: Context,
    dtype: DType,
    n: usize,
    k: usize,
    layout: Layout,
    kernel: Arc<Kernel>,
    config: LaunchConfig,
}

impl std::fmt::Debug for GluInterleave {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GluInterleave")
            .field("dtype", &self.dtype)
            .field("n", &self.n)
            .field("k", &self.k)
            .field("layout", &self.layout)
            .finish()
    }
}

impl GluInterleave {
    /// Plans the interleave of a `[2n, k]` ([`Layout::ColMajor`]) or `[k, 2n]`
    /// ([`Layout::RowMajor`]) weight of `dtype`; compiles the kernel.
    pub fn new(ctx: &Context, dtype: DType, n: usize, k: usize, layout: Layout) -> Result<GluInterleave> {
        if !matches!(dtype.size(), 1 | 2 | 4 | 8) {
            return Err(Error::invalid(
                "dtype",
                format!("{dtype}: elements of 1, 2, 4 or 8 bytes"),
            ));
        }
        let total = (2 * n as u128) * k as u128;
        if total > i64::MAX as u128 {
            return Err(Error::invalid(
                "n",
                format!("2 x {n} x {k} elements overflow a 64-bit index"),
            ));
        }
        let kernel = ctx.kernel(&interleave_spec(dtype.size()))?;
        let ctas = (total as usize)
            .div_ceil(THREADS as usize)
            .clamp(1, 8 * ctx.info().sm_count.max(1) as usize);
        Ok(GluInterleave {
            ctx: ctx.clone(),
            dtype,
            n,
            k,
            layout,
            kernel,
            config: LaunchConfig::linear(ctas as u32, THREADS, 0),
        })
    }

    /// `(rows, cols)` of the stacked input and of the output.
    pub fn stored(&self) -> (usize, usize) {
        match self.layout {
            Layout::ColMajor => (2 * self.n, self.k),
            Layout::RowMajor => (self.k, 2 * self.n),
        }
    }

    /// Writes the interleaved `out` from `stacked` (both contiguous row-major, [`Self::stored`]
    /// shape, the plan's dtype; they must not overlap).
    pub fn run(&self, stacked: &TensorView<'_>, out: &mut TensorViewMut<'_>) -> Result<()> {
        let (rows, cols) = self.stored();
        for (arg, dtype, shape, strides) in [
            ("stacked", stacked.dtype(), stacked.shape(), stacked.strides()),
            ("out", out.dtype(), out.shape(), out.strides()),
        ] {
            let contiguous = (rows <= 1 || strides[0] == cols) && (cols <= 1 || strides[1] == 1);
            if dtype != self.dtype || shape != [rows, cols] || !contiguous {
                return Err(Error::invalid(
                    arg,
                    format!(
                        "{dtype} view {shape:?} with strides {strides:?}; the plan expects a contiguous {} [{rows}, {cols}] ({})",
                        self.dtype,
                        match self.layout {
                            Layout::ColMajor => "[Wg; Wu] stacked along rows, B stored [2N, K]",
                            Layout::RowMajor => "[Wg | Wu] side by side, B stored [K, 2N]",
                        }
                    ),
                ));
            }
        }
        let bytes = (rows * cols * self.dtype.size()) as u64;
        let (s, d) = (stacked.device_ptr(), out.device_ptr());
        if bytes > 0 && s < d + bytes && d < s + bytes {
            return Err(Error::invalid(
                "out",
                "overlaps stacked: the interleave is not in place",
            ));
        }
        if bytes == 0 {
            return Ok(());
        }
        let params = InterleaveParams {
            src: s,
            dst: d,
            rows: rows as i64,
            cols: cols as i64,
            n: self.n as i64,
            interleave_rows: i32::from(self.layout == Layout::ColMajor),
            pad_: 0,
        };
        // SAFETY: both views were checked above to be contiguous [rows, cols] of the plan's dtype
        // (so rows x cols elements of dtype.size() bytes each lie inside their allocations, as
        // every view is bounds-checked when made) and not to overlap; the kernel reads src at
        // indices < rows x cols (the permutation of the header stays inside) and writes each
        // dst element once. InterleaveParams mirrors the kernel's struct.
        unsafe { self.kernel.launch(&self.ctx, self.config, &params) }
    }
}
