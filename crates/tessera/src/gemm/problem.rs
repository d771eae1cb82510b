//! What a GEMM computes: shapes, layouts, precision and epilogue ([`GemmProblem`]), its
//! validation, and the operands of one call ([`GemmOperands`]) with their checks against it.

use super::fits_i32;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::{TensorView, TensorViewMut};

/// The epilogue activation. `code()` is the constant of `gemm/epilogue.cuh` (0 none, 1 relu,
/// 2 gelu_erf, 3 gelu_tanh, 4 silu).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    /// Identity.
    #[default]
    None,
    /// `max(x, 0)`, NaN passes through.
    Relu,
    /// `0.5 x (1 + erf(x / sqrt 2))` (torch `gelu(approximate='none')`).
    GeluErf,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))` (torch `gelu(approximate='tanh')`).
    GeluTanh,
    /// `x / (1 + exp(-x))` (SiLU, swish).
    Silu,
}

impl Activation {
    pub const ALL: [Activation; 5] = [
        Activation::None,
        Activation::Relu,
        Activation::GeluErf,
        Activation::GeluTanh,
        Activation::Silu,
    ];
    /// The device code of `epilogue.cuh` (`kGemmAct*`).
    pub const fn code(self) -> u32 {
        match self {
            Activation::None => 0,
            Activation::Relu => 1,
            Activation::GeluErf => 2,
            Activation::GeluTanh => 3,
            Activation::Silu => 4,
        }
    }
    pub const fn name(self) -> &'static str {
        match self {
            Activation::None => "none",
            Activation::Relu => "relu",
            Activation::GeluErf => "gelu",
            Activation::GeluTanh => "gelu_tanh",
            Activation::Silu => "silu",
        }
    }
    /// Parses the names of [`Activation::name`] (`gelu_erf` is accepted for `gelu`).
    pub fn parse(s: &str) -> Option<Activation> {
        let s = s.to_ascii_lowercase();
        Activation::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .or((s == "gelu_erf").then_some(Activation::GeluErf))
    }
    /// The activation in f64 (the CPU reference), the same formulas as the device.
    pub fn apply(self, x: f64) -> f64 {
        match self {
            Activation::None => x,
            Activation::Relu => {
                if x < 0.0 {
                    0.0
                } else {
                    x
                }
            }
            Activation::GeluErf => 0.5 * x * (1.0 + erf64(x * std::f64::consts::FRAC_1_SQRT_2)),
            Activation::GeluTanh => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
            }
            Activation::Silu => x / (1.0 + (-x).exp()),
        }
    }
}

/// erf(x) in f64 for the reference (std has none): the Maclaurin series below |x| = 2, Lentz's
/// continued fraction of erfc from 2 to 6, 1 beyond; about 1e-14 absolute, far below what any
/// GEMM output precision can see.
pub fn erf64(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    let r = if a < 2.0 {
        // Maclaurin series: erf(x) = 2/sqrt(pi) sum_n (-1)^n x^(2n+1) / (n! (2n+1))
        let mut term = a;
        let mut sum = a;
        let x2 = a * a;
        let mut n = 0.0;
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -x2 / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else if a < 6.0 {
        // erfc by Lentz's continued fraction: erfc(x) = exp(-x^2)/sqrt(pi) * 1/(x+ 1/2/(x+ 1/(x+ 3/2/(x+ ...))))
        let mut f = a;
        let tiny = 1e-300;
        let mut c = a;
        let mut d = 0.0;
        for i in 1..200 {
            let an = i as f64 * 0.5;
            d = a + an * d;
            d = if d.abs() < tiny { tiny } else { d };
            c = a + an / c;
            c = if c.abs() < tiny { tiny } else { c };
            d = 1.0 / d;
            let delta = c * d;
            f *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        1.0 - (-a * a).exp() / (f * std::f64::consts::PI.sqrt())
    } else {
        1.0
    };
    if x < 0.0 {
        -r
    } else {
        r
    }
}

/// A gated linear unit epilogue: `D[m, j] = act(g) * u` with `g = alpha * (A B)[m, 2j] +
/// bias[2j]` and `u = alpha * (A B)[m, 2j + 1] + bias[2j + 1]`, i.e. the gate and up projections
/// of an MLP computed by one GEMM whose B has `2N` columns interleaved at granularity 1 (column
/// `2j` of B is gate column `j`, column `2j + 1` is up column `j`; [`super::glu`] builds that
/// layout from the concatenated `[Wg; Wu]`). alpha applies to both halves before the activation;
/// the bias (optional) has `2N` values interleaved the same way. The problem's `n` is the
/// output width `N`; B is stored `[K, 2N]` (row-major) or `[2N, K]` (column-major, the LLM weight
/// layout). C and the residual are not available with a GLU; [`GemmEpilogue::activation`] must
/// stay `None` (the GLU names its own gate activation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Glu {
    /// No GLU: the plain epilogue (default).
    #[default]
    None,
    /// `silu(g) * u` (SwiGLU, Llama / Mistral MLPs).
    SwiGlu,
    /// `gelu(g) * u` with the erf GELU (GeGLU, torch `gelu(approximate='none')`).
    GeGluErf,
    /// `gelu_tanh(g) * u` (GeGLU with the tanh GELU, Gemma's MLP).
    GeGluTanh,
}

impl Glu {
    pub const ALL: [Glu; 4] = [Glu::None, Glu::SwiGlu, Glu::GeGluErf, Glu::GeGluTanh];
    pub const fn name(self) -> &'static str {
        match self {
            Glu::None => "none",
            Glu::SwiGlu => "swiglu",
            Glu::GeGluErf => "geglu",
            Glu::GeGluTanh => "geglu_tanh",
        }
    }
    /// Parses the names of [`Glu::name`] (`geglu_erf` is accepted for `geglu`).
    pub fn parse(s: &str) -> Option<Glu> {
        let s = s.to_ascii_lowercase();
        Glu::ALL
            .into_iter()
            .find(|g| g.name() == s)
            .or((s == "geglu_erf").then_some(Glu::GeGluErf))
    }
    /// The activation of the gate half (what the kernels receive as their activation code).
    pub const fn gate_activation(self) -> Activation {
        match self {
            Glu::None => Activation::None,
            Glu::SwiGlu => Activation::Silu,
            Glu::GeGluErf => Activation::GeluErf,
            Glu::GeGluTanh => Activation::GeluTanh,
        }
    }
    /// Columns of B per output column: 2 with a GLU, else 1.
    pub const fn b_factor(self) -> usize {
        match self {
            Glu::None => 1,
            _ => 2,
        }
    }
    pub const fn is_some(self) -> bool {
        !matches!(self, Glu::None)
    }
}

/// How a matrix is stored (see the module docs for what each means for A and B).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Layout {
    #[default]
    RowMajor,
    ColMajor,
}

/// The precision contract of A and B: their storage and the accumulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    /// fp16 inputs, f32 accumulate; fp16, bf16 or fp32 out.
    F16,
    /// bf16 inputs, f32 accumulate; fp16, bf16 or fp32 out.
    BF16,
    /// fp32 inputs, exact fp32 accumulate on CUDA cores (no tf32); fp32 out.
    F32,
    /// fp64 inputs and accumulate (DMMA on sm_80+); fp64 out.
    F64,
    /// fp32 inputs read as tf32 by the tensor cores (10-bit mantissas; opt-in), f32 accumulate;
    /// fp32 out. sm_90 only (the Hopper path), B stored [N, K].
    Tf32,
    /// fp8 e4m3 inputs, f32 accumulate, optional [`GemmScales`]; fp16, bf16 or fp32 out, or an
    /// fp8 (e4m3 or e5m2) out scaled by an optional result scale, with the output's amax
    /// ([`GemmPlan::run_scaled_amax`](super::plan::GemmPlan::run_scaled_amax)). sm_90 only (the
    /// Hopper path), B stored [N, K].
    Fp8E4M3,
    /// fp8 e5m2 inputs, as [`Precision::Fp8E4M3`].
    Fp8E5M2,
    /// int8 inputs, int32 accumulate: i32 out with no epilogue (torch._int_mm), or fp16, bf16 or
    /// fp32 out dequantised by [`GemmScales`] and the epilogue. sm_90 only, B stored [N, K].
    Int8,
}

impl Precision {
    pub const fn name(self) -> &'static str {
        match self {
            Precision::F16 => "fp16",
            Precision::BF16 => "bf16",
            Precision::F32 => "fp32",
            Precision::F64 => "fp64",
            Precision::Tf32 => "tf32",
            Precision::Fp8E4M3 => "fp8e4m3",
            Precision::Fp8E5M2 => "fp8e5m2",
            Precision::Int8 => "int8",
        }
    }
    pub fn parse(s: &str) -> Option<Precision> {
        Some(match s.to_ascii_lowercase().as_str() {
            "fp16" | "f16" | "half" => Precision::F16,
            "bf16" | "bfloat16" => Precision::BF16,
            "fp32" | "f32" => Precision::F32,
            "fp64" | "f64" => Precision::F64,
            "tf32" => Precision::Tf32,
            "fp8e4m3" | "e4m3" => Precision::Fp8E4M3,
            "fp8e5m2" | "e5m2" => Precision::Fp8E5M2,
            "int8" | "i8" => Precision::Int8,
            _ => return None,
        })
    }
    /// The storage dtype of A and B, for the implemented contracts.
    pub fn input_dtype(self) -> Result<DType> {
        match self {
            Precision::F16 => Ok(DType::F16),
            Precision::BF16 => Ok(DType::BF16),
            Precision::F32 => Ok(DType::F32),
            Precision::F64 => Ok(DType::F64),
            Precision::Tf32 => Ok(DType::F32),
            Precision::Fp8E4M3 => Ok(DType::F8E4M3),
            Precision::Fp8E5M2 => Ok(DType::F8E5M2),
            Precision::Int8 => Ok(DType::I8),
        }
    }
    /// Whether the contract runs on the tensor cores only (tf32, fp8, int8): the Hopper path, or
    /// the sm80 path (fp8 on sm_89+); A row-major and B stored [N, K].
    pub const fn tensor_core_only(self) -> bool {
        matches!(
            self,
            Precision::Tf32 | Precision::Fp8E4M3 | Precision::Fp8E5M2 | Precision::Int8
        )
    }
    /// The output dtypes of this contract.
    pub fn outputs(self) -> &'static [DType] {
        match self {
            Precision::F16 | Precision::BF16 => &[DType::F16, DType::BF16, DType::F32],
            Precision::F32 | Precision::Tf32 => &[DType::F32],
            Precision::F64 => &[DType::F64],
            Precision::Fp8E4M3 | Precision::Fp8E5M2 => {
                &[DType::BF16, DType::F16, DType::F32, DType::F8E4M3, DType::F8E5M2]
            }
            Precision::Int8 => &[DType::I32, DType::BF16, DType::F16, DType::F32],
        }
    }
}

/// Dequantisation scales of fp8 and int8 inputs (torch._scaled_mm's): the accumulator of
/// element (m, n) is multiplied by `scale_a[m or 0] * scale_b[n or 0]` (f32 device tensors given
/// to [`GemmPlan::run_scaled`](super::plan::GemmPlan::run_scaled)) before the epilogue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GemmScales {
    /// No scales (default).
    #[default]
    None,
    /// One f32 each: `scale_a [1]`, `scale_b [1]`.
    PerTensor,
    /// Row-wise: `scale_a [M]` (one per row of A), `scale_b [N]` (one per column of B).
    RowWise,
}

/// The scale tensors of one call of a plan with [`GemmScales`] (f32, contiguous).
#[derive(Clone, Copy, Debug, Default)]
pub struct GemmScaleOperands<'a> {
    pub a: Option<TensorView<'a>>,
    pub b: Option<TensorView<'a>>,
    /// The result scale of an fp8 output (torch._scaled_mm's `scale_result`): f32 `[1]`; D is
    /// `fp8(scale_result * d)`, `d` the epilogue's f32 value. None = 1. fp8 outputs only.
    pub result: Option<TensorView<'a>>,
}

/// Which epilogue terms the plan computes (the activation and the presence of each operand).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GemmEpilogue {
    /// Default [`Activation::None`].
    pub activation: Activation,
    /// `+ bias[n]` before the activation. Default false.
    pub bias: bool,
    /// `+ beta * C` (C a tensor or D itself). Default false: C is not read and beta is ignored.
    pub c: bool,
    /// `+ R[m, n]` after the activation. Default false.
    pub residual: bool,
    /// A gated linear unit (SwiGLU / GeGLU) over interleaved gate/up columns of B. Default
    /// [`Glu::None`]. See [`Glu`] for the layout and the rules (no C, residual or activation).
    pub glu: Glu,
}

/// One GEMM: shapes, layouts, leading dimensions, batch strides, precision and epilogue. Build
/// it with [`GemmProblem::new`] (contiguous row-major everything) and the builder methods.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GemmProblem {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Number of independent GEMMs. Default 1.
    pub batch: usize,
    pub precision: Precision,
    /// Dtype of D (and of C, bias and R).
    pub out: DType,
    pub a_layout: Layout,
    pub lda: usize,
    pub batch_stride_a: usize,
    pub b_layout: Layout,
    pub ldb: usize,
    pub batch_stride_b: usize,
    pub ldc: usize,
    pub batch_stride_c: usize,
    pub ldr: usize,
    pub batch_stride_r: usize,
    pub ldd: usize,
    pub batch_stride_d: usize,
    pub epilogue: GemmEpilogue,
    /// Dequantisation scales (fp8 and int8 only). Default [`GemmScales::None`].
    pub scales: GemmScales,
}

impl GemmProblem {
    /// `D[M, N] = A[M, K] @ B[K, N]`, all row-major and contiguous (leading dimensions at least 1),
    /// batch 1, no epilogue terms.
    pub fn new(precision: Precision, out: DType, m: usize, n: usize, k: usize) -> GemmProblem {
        GemmProblem {
            m,
            n,
            k,
            batch: 1,
            precision,
            out,
            a_layout: Layout::RowMajor,
            lda: k.max(1),
            batch_stride_a: m * k,
            b_layout: Layout::RowMajor,
            ldb: n.max(1),
            batch_stride_b: k * n,
            ldc: n.max(1),
            batch_stride_c: m * n,
            ldr: n.max(1),
            batch_stride_r: m * n,
            ldd: n.max(1),
            batch_stride_d: m * n,
            epilogue: GemmEpilogue::default(),
            scales: GemmScales::None,
        }
    }
    /// A's layout, with the contiguous leading dimension and batch stride for it.
    pub fn a_layout(mut self, layout: Layout) -> Self {
        self.a_layout = layout;
        self.lda = if layout == Layout::RowMajor { self.k } else { self.m }.max(1);
        self.batch_stride_a = self.m * self.k;
        self
    }
    /// B's layout (`ColMajor` = stored `[N, K]`), contiguous.
    pub fn b_layout(mut self, layout: Layout) -> Self {
        self.b_layout = layout;
        self.ldb = if layout == Layout::RowMajor { self.b_n() } else { self.k }.max(1);
        self.batch_stride_b = self.k * self.b_n();
        self
    }
    /// `batch` GEMMs, operands packed one after the other (the current strides are kept).
    pub fn batched(mut self, batch: usize) -> Self {
        self.batch = batch;
        self
    }
    pub fn activation(mut self, a: Activation) -> Self {
        self.epilogue.activation = a;
        self
    }
    pub fn bias(mut self, on: bool) -> Self {
        self.epilogue.bias = on;
        self
    }
    pub fn with_c(mut self, on: bool) -> Self {
        self.epilogue.c = on;
        self
    }
    pub fn residual(mut self, on: bool) -> Self {
        self.epilogue.residual = on;
        self
    }
    /// A GLU epilogue ([`Glu`]): B gets `2N` columns (interleaved gate/up), so B's contiguous
    /// leading dimension and batch stride are recomputed for the current B layout (set a custom
    /// `ldb` after this call).
    pub fn glu(mut self, glu: Glu) -> Self {
        self.epilogue.glu = glu;
        let layout = self.b_layout;
        self.b_layout(layout)
    }
    pub fn scales(mut self, scales: GemmScales) -> Self {
        self.scales = scales;
        self
    }

    /// The storage dtype of A and B.
    pub fn input(&self) -> Result<DType> {
        self.precision.input_dtype()
    }

    /// `(rows, cols)` of A as stored (row-major A: `[M, K]`, column-major: `[K, M]`).
    pub fn a_stored(&self) -> (usize, usize) {
        match self.a_layout {
            Layout::RowMajor => (self.m, self.k),
            Layout::ColMajor => (self.k, self.m),
        }
    }
    /// Columns of the logical B: `N`, or `2N` with a GLU (interleaved gate and up columns).
    pub fn b_n(&self) -> usize {
        self.n * self.epilogue.glu.b_factor()
    }
    /// `(rows, cols)` of B as stored (row-major: `[K, N]`, column-major: `[N, K]`; `2N` for
    /// `N` with a GLU).
    pub fn b_stored(&self) -> (usize, usize) {
        match self.b_layout {
            Layout::RowMajor => (self.k, self.b_n()),
            Layout::ColMajor => (self.b_n(), self.k),
        }
    }

    /// Useful floating-point operations (2 M N K per batch entry; 2 M 2N K with a GLU, whose
    /// product is twice as wide as D).
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.b_n() as f64 * self.k as f64 * self.batch as f64
    }

    /// Checks every rule that does not depend on the operands' addresses: supported precision
    /// and output, leading dimensions, batch strides of D, 32-bit index limits.
    pub fn validate(&self) -> Result<()> {
        let input = self.input()?;
        let _ = input;
        if !self.precision.outputs().contains(&self.out) {
            return Err(Error::Unsupported(format!(
                "GEMM {} inputs with {} output; supported outputs: {}",
                self.precision.name(),
                self.out,
                self.precision
                    .outputs()
                    .iter()
                    .map(|d| d.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let eight_bit = matches!(
            self.precision,
            Precision::Fp8E4M3 | Precision::Fp8E5M2 | Precision::Int8
        );
        if self.scales != GemmScales::None && !eight_bit {
            return Err(Error::invalid(
                "scales",
                format!(
                    "dequantisation scales apply to fp8 and int8 inputs, not {}",
                    self.precision.name()
                ),
            ));
        }
        let e = &self.epilogue;
        if self.out.size() == 1 && (e.c || e.bias || e.residual) {
            return Err(Error::invalid(
                "out",
                format!(
                    "an {} output takes no C, bias or residual (they would be stored in fp8); ask for bf16, fp16 \
                     or fp32 output for those terms",
                    self.out
                ),
            ));
        }
        if self.out == DType::I32
            && (self.scales != GemmScales::None || e.c || e.bias || e.residual || e.activation != Activation::None)
        {
            return Err(Error::invalid(
                "out",
                "an i32 output is the plain int8 product (torch._int_mm): no scales, C, bias, residual or activation; \
                 ask for fp32, fp16 or bf16 output to dequantise",
            ));
        }
        if self.precision.tensor_core_only() && (self.a_layout != Layout::RowMajor || self.b_layout != Layout::ColMajor)
        {
            return Err(Error::invalid(
                "b_layout",
                format!(
                    "{} inputs need A row-major and B stored [N, K] (column-major; the layout of LLM weights and of \
                     torch._scaled_mm's second operand): the tensor cores read them K-major only",
                    self.precision.name()
                ),
            ));
        }
        if e.glu.is_some() {
            let glu = e.glu.name();
            if !matches!(
                self.precision,
                Precision::F16 | Precision::BF16 | Precision::F32 | Precision::F64
            ) {
                return Err(Error::invalid(
                    "glu",
                    format!(
                        "{glu} takes fp16, bf16, fp32 or fp64 inputs, not {}",
                        self.precision.name()
                    ),
                ));
            }
            if e.activation != Activation::None {
                return Err(Error::invalid(
                    "activation",
                    format!(
                        "{} with {glu}: a GLU epilogue applies its own gate activation ({}); leave activation None",
                        e.activation.name(),
                        e.glu.gate_activation().name()
                    ),
                ));
            }
            if e.c {
                return Err(Error::invalid(
                    "c",
                    format!("a beta * C term is not available with {glu} (D = act(gate) * up)"),
                ));
            }
            if e.residual {
                return Err(Error::invalid(
                    "residual",
                    format!("a residual is not available with {glu} (D = act(gate) * up)"),
                ));
            }
            fits_i32("n", self.b_n()).map_err(|_| {
                Error::invalid(
                    "n",
                    format!(
                        "{glu} with N = {}: B's 2N = {} columns exceed 2^31 - 1",
                        self.n,
                        self.b_n()
                    ),
                )
            })?;
        }
        fits_i32("m", self.m)?;
        fits_i32("n", self.n)?;
        fits_i32("k", self.k)?;
        if self.batch > u16::MAX as usize {
            return Err(Error::invalid(
                "batch",
                format!("{} exceeds 65535 (the grid's z dimension)", self.batch),
            ));
        }
        let (ar, ac) = self.a_stored();
        let (br, bc) = self.b_stored();
        ld_rule("lda", self.lda, ac, "A", self.a_layout)?;
        ld_rule("ldb", self.ldb, bc, "B", self.b_layout)?;
        ld_rule("ldd", self.ldd, self.n, "D", Layout::RowMajor)?;
        if self.epilogue.c {
            ld_rule("ldc", self.ldc, self.n, "C", Layout::RowMajor)?;
        }
        if self.epilogue.residual {
            ld_rule("ldr", self.ldr, self.n, "R", Layout::RowMajor)?;
        }
        // every leading dimension and batch stride must keep element offsets within i64
        for (arg, ld, rows, stride) in [
            ("lda", self.lda, ar, self.batch_stride_a),
            ("ldb", self.ldb, br, self.batch_stride_b),
            ("ldc", self.ldc, self.m, self.batch_stride_c),
            ("ldr", self.ldr, self.m, self.batch_stride_r),
            ("ldd", self.ldd, self.m, self.batch_stride_d),
        ] {
            let extent = (rows as u128) * (ld as u128) + (stride as u128) * (self.batch as u128);
            if extent > i64::MAX as u128 {
                return Err(Error::invalid(
                    arg,
                    format!(
                        "{rows} rows of {ld} elements over {} batch entries overflow a 64-bit offset",
                        self.batch
                    ),
                ));
            }
        }
        // batch entries of D must not overlap (the same element would be written twice)
        if self.batch > 1 && self.m > 0 && self.n > 0 {
            let span = (self.m - 1) * self.ldd + self.n;
            if self.batch_stride_d < span {
                return Err(Error::invalid(
                    "batch_stride_d",
                    format!(
                        "{} < {span} ((M - 1) * ldd + N): the batch entries of D would overlap",
                        self.batch_stride_d
                    ),
                ));
            }
        }
        let _ = (ar, br);
        Ok(())
    }

    /// True when nothing is computed (an empty D).
    pub fn is_empty(&self) -> bool {
        self.m == 0 || self.n == 0 || self.batch == 0
    }
}

fn ld_rule(arg: &'static str, ld: usize, width: usize, what: &str, layout: Layout) -> Result<()> {
    if ld < width.max(1) {
        return Err(Error::invalid(
            arg,
            format!(
                "{ld} < {} (the row width of {what} stored {}); a leading dimension must be at least the row width",
                width.max(1),
                match layout {
                    Layout::RowMajor => "row-major",
                    Layout::ColMajor => "column-major",
                }
            ),
        ));
    }
    Ok(())
}

/// Where C comes from.
#[derive(Clone, Copy, Debug, Default)]
pub enum COperand<'a> {
    /// No C (the plan's epilogue has no C term).
    #[default]
    None,
    /// A separate tensor with the problem's `ldc` and `batch_stride_c`.
    Tensor(TensorView<'a>),
    /// D itself (in place, `D = alpha A B + beta D`): read with D's leading dimension and stride.
    D,
}

/// The inputs of one call. Each view is `[rows, cols]` (batch 1) or `[batch, rows, cols]` with
/// strides `[batch_stride, ld, 1]` exactly as the problem says; bias is `[N]` with stride 1.
#[derive(Clone, Copy, Debug)]
pub struct GemmOperands<'a> {
    pub a: TensorView<'a>,
    pub b: TensorView<'a>,
    pub c: COperand<'a>,
    pub bias: Option<TensorView<'a>>,
    pub residual: Option<TensorView<'a>>,
}

/// Checks one matrix view against what the problem says of it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_matrix(
    arg: &'static str,
    dtype: DType,
    batch: usize,
    rows: usize,
    cols: usize,
    ld: usize,
    batch_stride: usize,
    got: (DType, &[usize], &[usize]),
) -> Result<()> {
    let (gd, shape, strides) = got;
    if gd != dtype {
        return Err(Error::invalid(arg, format!("dtype {gd}, the plan expects {dtype}")));
    }
    let ok = match shape.len() {
        2 => batch == 1 && shape == [rows, cols] && (rows <= 1 || strides[0] == ld) && (cols <= 1 || strides[1] == 1),
        3 => {
            shape == [batch, rows, cols]
                && (batch <= 1 || strides[0] == batch_stride)
                && (rows <= 1 || strides[1] == ld)
                && (cols <= 1 || strides[2] == 1)
        }
        _ => false,
    };
    if !ok {
        return Err(Error::invalid(
            arg,
            format!(
                "view {shape:?} with strides {strides:?}; the plan expects [{rows}, {cols}] with strides [{ld}, 1]{}",
                if batch == 1 {
                    String::new()
                } else {
                    format!(" (or [{batch}, {rows}, {cols}] with strides [{batch_stride}, {ld}, 1])")
                }
            ),
        ));
    }
    Ok(())
}

/// The operands and D of one call, checked against the problem: dtypes, shapes, strides and
/// the presence of each epilogue operand. Returns nothing; addresses are checked by the plan.
pub(crate) fn check_operands(p: &GemmProblem, ops: &GemmOperands<'_>, d: &TensorViewMut<'_>) -> Result<()> {
    let input = p.input()?;
    let (ar, ac) = p.a_stored();
    let (br, bc) = p.b_stored();
    check_matrix(
        "a",
        input,
        p.batch,
        ar,
        ac,
        p.lda,
        p.batch_stride_a,
        (ops.a.dtype(), ops.a.shape(), ops.a.strides()),
    )?;
    check_matrix(
        "b",
        input,
        p.batch,
        br,
        bc,
        p.ldb,
        p.batch_stride_b,
        (ops.b.dtype(), ops.b.shape(), ops.b.strides()),
    )?;
    check_matrix(
        "d",
        p.out,
        p.batch,
        p.m,
        p.n,
        p.ldd,
        p.batch_stride_d,
        (d.dtype(), d.shape(), d.strides()),
    )?;
    match (p.epilogue.c, ops.c) {
        (false, COperand::None) => {}
        (false, _) => {
            return Err(Error::invalid(
                "c",
                "given, but the plan's epilogue has no C term (epilogue.c)",
            ))
        }
        (true, COperand::None) => return Err(Error::invalid("c", "missing: the plan's epilogue has a beta * C term")),
        (true, COperand::D) => {
            if p.ldc != p.ldd || (p.batch > 1 && p.batch_stride_c != p.batch_stride_d) {
                return Err(Error::invalid(
                    "c",
                    "C = D in place needs the problem's ldc and batch_stride_c equal to ldd and batch_stride_d",
                ));
            }
        }
        (true, COperand::Tensor(c)) => check_matrix(
            "c",
            p.out,
            p.batch,
            p.m,
            p.n,
            p.ldc,
            p.batch_stride_c,
            (c.dtype(), c.shape(), c.strides()),
        )?,
    }
    match (p.epilogue.bias, ops.bias) {
        (false, None) => {}
        (false, Some(_)) => return Err(Error::invalid("bias", "given, but the plan's epilogue has no bias")),
        (true, None) => return Err(Error::invalid("bias", "missing: the plan's epilogue adds a bias")),
        (true, Some(b)) => {
            // with a GLU the bias has B's 2N columns (gate and up biases interleaved)
            let len = p.b_n();
            if b.dtype() != p.out || b.shape() != [len] || (len > 1 && b.strides() != [1]) {
                return Err(Error::invalid(
                    "bias",
                    format!(
                        "{} view {:?} with strides {:?}; the plan expects {} [{len}] with stride 1{}",
                        b.dtype(),
                        b.shape(),
                        b.strides(),
                        p.out,
                        if p.epilogue.glu.is_some() {
                            " (2N: gate and up biases interleaved, as B's columns)"
                        } else {
                            ""
                        }
                    ),
                ));
            }
        }
    }
    match (p.epilogue.residual, ops.residual) {
        (false, None) => {}
        (false, Some(_)) => {
            return Err(Error::invalid(
                "residual",
                "given, but the plan's epilogue has no residual",
            ))
        }
        (true, None) => {
            return Err(Error::invalid(
                "residual",
                "missing: the plan's epilogue adds a residual",
            ))
        }
        (true, Some(r)) => check_matrix(
            "residual",
            p.out,
            p.batch,
            p.m,
            p.n,
            p.ldr,
            p.batch_stride_r,
            (r.dtype(), r.shape(), r.strides()),
        )?,
    }
    Ok(())
}

/// `ptr` is aligned to `bytes`, else an error naming `arg`.
pub(crate) fn check_aligned(arg: &'static str, ptr: u64, bytes: u64, why: &str) -> Result<()> {
    if ptr % bytes != 0 {
        return Err(Error::invalid(
            arg,
            format!("address {ptr:#x} is not {bytes}-byte aligned, which {why} needs"),
        ));
    }
    Ok(())
}
