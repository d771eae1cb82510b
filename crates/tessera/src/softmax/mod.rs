//! Softmax and log-softmax over the last dimension.
//!
//! `y = softmax(scale * x)` or `y = log_softmax(scale * x)` row by row, for f32, f16 and bf16
//! inputs and outputs (any pairing), computed in f32 with the row maximum subtracted. Rows may
//! be padded (row stride >= cols) and the operation may run in place
//! ([`SoftmaxPlan::run_inplace`]).
//!
//! Special values: a row whose every element is `-inf` yields zeros (softmax) or `-inf`
//! (log-softmax), never NaN; a NaN anywhere in a row makes the whole row NaN; `+inf` elements
//! share the row's mass equally.
//!
//! Dispatch follows OneFlow's three paths (see [`plan`]): a warp per row with the row in
//! registers (up to 1024 columns), a block per row with the row cached in shared memory, and a
//! block per row that re-reads the row (any length). [`SoftmaxTuning::path`] (reached as
//! [`SoftmaxOptions::tuning`]) forces one, for benchmarks and experiments.
//!
//! ```no_run
//! # fn main() -> tessera::Result<()> {
//! use tessera::runtime::Context;
//! use tessera::softmax::{SoftmaxOptions, SoftmaxPlan, SoftmaxShape};
//! let ctx = Context::new(0)?;
//! let x = ctx.upload(&vec![1.0f32; 4 * 1000])?;
//! let mut y = ctx.alloc::<f32>(4 * 1000)?;
//! let plan = SoftmaxPlan::new(&ctx, &SoftmaxShape::contiguous::<f32, f32>(4, 1000), &SoftmaxOptions::default())?;
//! plan.run(&x.matrix(4, 1000, 1000)?, &mut y.matrix_mut(4, 1000, 1000)?)?;
//! # Ok(()) }
//! ```

#[cfg(feature = "harness")]
pub mod bench;
#[cfg(feature = "harness")]
mod operator;
pub mod plan;
#[cfg(feature = "harness")]
pub mod reference;
#[cfg(test)]
mod tests;
#[cfg(feature = "harness")]
pub mod verify;

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::runtime::{Context, TensorView, TensorViewMut};

#[cfg(feature = "harness")]
pub use operator::OPERATOR;
pub use plan::{SoftmaxPath, SoftmaxPlan, SoftmaxPlanKey};

/// Which row-wise operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SoftmaxKind {
    /// `exp(x - max) / sum(exp(x - max))`.
    Softmax,
    /// `x - max - ln(sum(exp(x - max)))`.
    LogSoftmax,
}

impl SoftmaxKind {
    pub fn name(self) -> &'static str {
        match self {
            SoftmaxKind::Softmax => "softmax",
            SoftmaxKind::LogSoftmax => "log_softmax",
        }
    }
}

/// Options of a softmax plan. `SoftmaxOptions { kind: SoftmaxKind::LogSoftmax, ..Default::default() }`.
///
/// `kind` and `scale` say what is computed; [`SoftmaxOptions::tuning`] only how (benchmarks and
/// experiments), and its defaults are the dispatcher's choice.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SoftmaxOptions {
    /// Softmax or log-softmax. Default: [`SoftmaxKind::Softmax`].
    pub kind: SoftmaxKind,
    /// Multiplies the input before the softmax (e.g. an inverse temperature). Default 1.0.
    /// Must be finite and non-zero.
    pub scale: f32,
    /// Forced kernel choices, for benchmarks and experiments. Default: none forced
    /// ([`SoftmaxTuning::default`]).
    pub tuning: SoftmaxTuning,
}

impl Default for SoftmaxOptions {
    fn default() -> Self {
        SoftmaxOptions {
            kind: SoftmaxKind::Softmax,
            scale: 1.0,
            tuning: SoftmaxTuning::default(),
        }
    }
}

/// Kernel choices of a softmax plan, for benchmarks and experiments; the defaults are what the
/// dispatcher chooses. Results do not depend on them (within the dtype's rounding), only speed
/// and which shapes a plan accepts: a forced path that cannot hold a shape is `Unsupported`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SoftmaxTuning {
    /// Kernel path. Default [`SoftmaxPath::Auto`] (chosen from cols, dtype and occupancy; see
    /// [`plan`]). The warp variants [`SoftmaxPath::WarpNc`] and [`SoftmaxPath::WarpV2`] and the
    /// cluster schedules exist to be measured side by side.
    pub path: SoftmaxPath,
}

/// The problem a plan is made for: rows x cols with row strides (elements) and dtypes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SoftmaxShape {
    pub rows: usize,
    pub cols: usize,
    pub in_stride: usize,
    pub out_stride: usize,
    pub in_dtype: DType,
    pub out_dtype: DType,
}

/// Largest supported `cols` (the kernels index columns with 32-bit integers).
pub const MAX_COLS: usize = (1 << 31) - 1;

impl SoftmaxShape {
    /// Contiguous rows of `I` in and `O` out.
    pub fn contiguous<I: Element, O: Element>(rows: usize, cols: usize) -> Self {
        SoftmaxShape {
            rows,
            cols,
            in_stride: cols,
            out_stride: cols,
            in_dtype: I::DTYPE,
            out_dtype: O::DTYPE,
        }
    }

    /// The shape of `input -> output` views: the last dimension is the softmax dimension and
    /// must be contiguous; leading dimensions must collapse into rows of one stride.
    pub fn of_views(input: &TensorView<'_>, output: &TensorView<'_>) -> Result<Self> {
        let (rows, cols, in_stride) = rows_of(input, "input")?;
        let (orows, ocols, out_stride) = rows_of(output, "output")?;
        if input.shape() != output.shape() {
            return Err(Error::invalid(
                "output",
                format!(
                    "shape {:?} differs from the input's {:?}",
                    output.shape(),
                    input.shape()
                ),
            ));
        }
        debug_assert_eq!((rows, cols), (orows, ocols));
        Ok(SoftmaxShape {
            rows,
            cols,
            in_stride,
            out_stride,
            in_dtype: input.dtype(),
            out_dtype: output.dtype(),
        })
    }

    /// Checks the documented rules: supported dtypes, cols >= 1, strides >= cols.
    pub fn validate(&self) -> Result<()> {
        for (arg, d) in [("input", self.in_dtype), ("output", self.out_dtype)] {
            if !matches!(d, DType::F32 | DType::F16 | DType::BF16) {
                return Err(Error::Unsupported(format!(
                    "softmax {arg} dtype {d}; supported: fp32, fp16, bf16 (any input/output pairing)"
                )));
            }
        }
        if self.cols == 0 {
            return Err(Error::invalid(
                "cols",
                "must be at least 1 (softmax of an empty row is undefined)",
            ));
        }
        if self.cols > MAX_COLS {
            return Err(Error::invalid(
                "cols",
                format!("{} exceeds the supported maximum {MAX_COLS}", self.cols),
            ));
        }
        if self.in_stride < self.cols {
            return Err(Error::invalid(
                "input",
                format!("row stride {} < cols {}", self.in_stride, self.cols),
            ));
        }
        if self.out_stride < self.cols {
            return Err(Error::invalid(
                "output",
                format!("row stride {} < cols {}", self.out_stride, self.cols),
            ));
        }
        Ok(())
    }
}

/// (rows, cols, row stride) of a view whose last dimension is contiguous.
fn rows_of(v: &TensorView<'_>, arg: &'static str) -> Result<(usize, usize, usize)> {
    let (shape, strides) = (v.shape(), v.strides());
    let r = shape.len();
    let cols = shape[r - 1];
    if strides[r - 1] != 1 && cols > 1 {
        return Err(Error::invalid(
            arg,
            format!(
                "last dimension must be contiguous (stride 1), got stride {}",
                strides[r - 1]
            ),
        ));
    }
    if r == 1 {
        return Ok((1, cols, cols));
    }
    let row_stride = strides[r - 2];
    for i in 0..r - 2 {
        if shape[i] > 1 && strides[i] != strides[i + 1] * shape[i + 1] {
            return Err(Error::invalid(
                arg,
                format!(
                    "leading dimensions must collapse into evenly strided rows; shape {shape:?} strides {strides:?}"
                ),
            ));
        }
    }
    let rows = shape[..r - 1].iter().product();
    Ok((rows, cols, if rows <= 1 { row_stride.max(cols) } else { row_stride }))
}

/// One-shot softmax: plans (kernels come from the cache after the first call) and runs.
pub fn softmax(
    ctx: &Context,
    input: &TensorView<'_>,
    output: &mut TensorViewMut<'_>,
    opts: &SoftmaxOptions,
) -> Result<()> {
    let shape = SoftmaxShape::of_views(input, &output.as_view())?;
    SoftmaxPlan::new(ctx, &shape, opts)?.run(input, output)
}

/// One-shot log-softmax (see [`softmax`]).
pub fn log_softmax(ctx: &Context, input: &TensorView<'_>, output: &mut TensorViewMut<'_>, scale: f32) -> Result<()> {
    softmax(
        ctx,
        input,
        output,
        &SoftmaxOptions {
            kind: SoftmaxKind::LogSoftmax,
            scale,
            ..Default::default()
        },
    )
}
