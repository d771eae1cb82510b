//! `tessera verify gemm`: every path against the f64 reference on fresh random inputs: M, N, K
//! in {1, 7, 127, 129, ~4095} and non-multiples of every tile, every layout of A and B, padded
//! leading dimensions (the padding holds NaN, so reading it fails), every activation with bias,
//! C (separate or D itself) and residual, every precision and output dtype, batches, NaN/Inf
//! inputs, and forced paths. Each case passes when no element breaks the bound of
//! [`reference`](super::reference), the rel-L2 budget of the output dtype holds, every NaN/Inf of
//! the reference is reproduced, and D's padding is untouched. GLU epilogues (SwiGLU, GeGLU erf and
//! tanh) run on every path that has them (auto, sm80, simt; hopper on sm_90 through auto), both B
//! layouts, odd N, with and without the interleaved bias, and end to end from separate gate and up
//! weights through [`GluInterleave`](super::glu::GluInterleave). A last job checks that bad input
//! is refused with an error naming the argument, leaving D untouched.

use serde_json::{json, Value};

use super::plan::{GemmOptions, GemmPath, GemmPlan, GemmTuning};
use super::problem::{Activation, COperand, GemmEpilogue, GemmOperands, GemmProblem, Glu, Layout, Precision};
use super::reference::{self, Logical};
use crate::check::{compare, to_f64_vec};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::harness::VerifyOutcome;
use crate::runtime::Context;
use crate::testdata::{random_matrix, Dist};

/// Planted non-finite inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Special {
    None,
    /// A[0][0] = NaN (row 0 of D is NaN) and B[K/2][N/2] = +inf (a column of +-inf or NaN).
    NanInf,
}

/// One verification case.
#[derive(Clone, Debug)]
pub struct Case {
    pub precision: Precision,
    pub out: DType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub a_layout: Layout,
    pub b_layout: Layout,
    /// Extra elements of every leading dimension (0: contiguous).
    pub pad: usize,
    pub epilogue: GemmEpilogue,
    /// C is D itself (in place) rather than a separate tensor (when epilogue.c).
    pub c_in_d: bool,
    pub path: GemmPath,
    pub special: Special,
}

fn layout_name(l: Layout, operand: char) -> &'static str {
    match (operand, l) {
        ('a', Layout::RowMajor) => "A[M,K]",
        ('a', Layout::ColMajor) => "A[K,M]",
        (_, Layout::RowMajor) => "B[K,N]",
        (_, Layout::ColMajor) => "B[N,K]",
    }
}

impl Case {
    pub fn name(&self) -> String {
        let e = &self.epilogue;
        let mut s = format!(
            "gemm {}->{} {}x{}x{} {} {}",
            self.precision.name(),
            self.out,
            self.m,
            self.n,
            self.k,
            layout_name(self.a_layout, 'a'),
            layout_name(self.b_layout, 'b')
        );
        if self.batch > 1 {
            s.push_str(&format!(" batch {}", self.batch));
        }
        if self.pad > 0 {
            s.push_str(&format!(" ld+{}", self.pad));
        }
        if e.activation != Activation::None {
            s.push_str(&format!(" {}", e.activation.name()));
        }
        if e.glu.is_some() {
            s.push_str(&format!(" {}", e.glu.name()));
        }
        if e.bias {
            s.push_str(" bias");
        }
        if e.c {
            s.push_str(if self.c_in_d { " C=D" } else { " C" });
        }
        if e.residual {
            s.push_str(" residual");
        }
        if self.special == Special::NanInf {
            s.push_str(" nan/inf");
        }
        if self.path != GemmPath::Auto {
            s.push_str(&format!(" path {}", self.path.name()));
        }
        s
    }

    pub fn params(&self) -> Value {
        json!({
            "M": self.m, "N": self.n, "K": self.k, "batch": self.batch,
            "dtype": self.precision.name(), "out": self.out.name(),
            "a_layout": layout_name(self.a_layout, 'a'), "b_layout": layout_name(self.b_layout, 'b'),
            "pad": self.pad, "activation": self.epilogue.activation.name(),
            "glu": self.epilogue.glu.name(),
            "bias": self.epilogue.bias, "c": self.epilogue.c, "c_in_d": self.c_in_d,
            "residual": self.epilogue.residual, "path": self.path.name(),
            "special": self.special == Special::NanInf,
        })
    }

    /// The problem this case runs.
    pub fn problem(&self) -> GemmProblem {
        let mut p = GemmProblem::new(self.precision, self.out, self.m, self.n, self.k)
            .a_layout(self.a_layout)
            .b_layout(self.b_layout)
            .batched(self.batch);
        p.epilogue = self.epilogue;
        // B's contiguous ldb and stride for its 2N columns with a GLU
        p = p.b_layout(self.b_layout);
        let (ar, _) = p.a_stored();
        let (br, _) = p.b_stored();
        p.lda += self.pad;
        p.ldb += self.pad;
        p.ldc += self.pad;
        p.ldr += self.pad;
        p.ldd += self.pad;
        p.batch_stride_a = ar * p.lda;
        p.batch_stride_b = br * p.ldb;
        p.batch_stride_c = self.m * p.ldc;
        p.batch_stride_r = self.m * p.ldr;
        p.batch_stride_d = self.m * p.ldd;
        if self.c_in_d {
            p.ldc = p.ldd;
            p.batch_stride_c = p.batch_stride_d;
        }
        p
    }
}

/// The verification cases (`quick`: a small set for the sanitizers).
pub fn cases(quick: bool) -> Vec<Case> {
    let base = |precision, out, m, n, k| Case {
        precision,
        out,
        m,
        n,
        k,
        batch: 1,
        a_layout: Layout::RowMajor,
        b_layout: Layout::RowMajor,
        pad: 0,
        epilogue: GemmEpilogue::default(),
        c_in_d: false,
        path: GemmPath::Auto,
        special: Special::None,
    };
    let pairs = [
        (Precision::F16, DType::F16),
        (Precision::BF16, DType::BF16),
        (Precision::F16, DType::F32),
        (Precision::BF16, DType::F16),
        (Precision::F32, DType::F32),
        (Precision::F64, DType::F64),
        (Precision::BF16, DType::F32),
    ];
    // shapes: ones, sevens, around the 128 tile, non-multiples of every tile, K-heavy, 4095-ish
    let shapes: &[(usize, usize, usize)] = if quick {
        &[(1, 1, 1), (7, 129, 127), (129, 127, 72), (16, 200, 264)]
    } else {
        &[
            (1, 1, 1),
            (7, 7, 7),
            (1, 129, 136),
            (127, 129, 127),
            (129, 127, 129),
            (16, 520, 1032),
            (8, 4095, 264),
            (200, 300, 520),
            (257, 65, 4095),
            (4095, 136, 72),
            (130, 131, 0),
        ]
    };
    let layouts = [
        (Layout::RowMajor, Layout::RowMajor),
        (Layout::RowMajor, Layout::ColMajor),
        (Layout::ColMajor, Layout::RowMajor),
        (Layout::ColMajor, Layout::ColMajor),
    ];
    let mut out = Vec::new();
    let mut i = 0usize;
    for &(m, n, k) in shapes {
        for &(precision, o) in &pairs {
            for &(al, bl) in &layouts {
                i += 1;
                // each (shape, precision) pair takes two of the four layouts, rotating
                if (i + (i / 4)) % 2 == 1 {
                    continue;
                }
                let act = Activation::ALL[i % 5];
                let mut c = base(precision, o, m, n, k);
                c.a_layout = al;
                c.b_layout = bl;
                c.pad = if i % 3 == 0 { 8 } else { 0 };
                c.epilogue = GemmEpilogue {
                    activation: act,
                    bias: i % 2 == 0,
                    c: i % 3 != 1,
                    residual: i % 4 == 3,
                    glu: Glu::None,
                };
                c.c_in_d = i % 6 == 0;
                out.push(c);
            }
        }
    }
    // batches (one shared weight is not expressible by the case builder; strided packs are)
    for &(precision, o) in &pairs[..if quick { 2 } else { pairs.len() }] {
        let mut c = base(precision, o, 65, 70, 136);
        c.batch = 3;
        c.b_layout = Layout::ColMajor;
        c.epilogue = GemmEpilogue {
            activation: Activation::Silu,
            bias: true,
            c: true,
            residual: true,
            glu: Glu::None,
        };
        out.push(c);
    }
    // decode shapes through the skinny path (with and without split-K), and forced paths
    for &(m, n, k) in if quick {
        &[(1usize, 136usize, 1032usize)][..]
    } else {
        &[(1, 4096, 4096), (8, 1000, 14336), (16, 4099, 520), (3, 64, 8)][..]
    } {
        for &(precision, o) in &[(Precision::F16, DType::F16), (Precision::BF16, DType::BF16)] {
            let mut c = base(precision, o, m, n, k);
            c.b_layout = Layout::ColMajor;
            c.epilogue = GemmEpilogue {
                activation: Activation::GeluTanh,
                bias: true,
                c: true,
                residual: false,
                glu: Glu::None,
            };
            c.c_in_d = true;
            out.push(c);
        }
    }
    if !quick {
        for (path, precision, o, m, n, k, bl) in [
            (
                GemmPath::Sm80,
                Precision::F16,
                DType::F16,
                3,
                300,
                264,
                Layout::ColMajor,
            ),
            (
                GemmPath::Simt,
                Precision::BF16,
                DType::BF16,
                130,
                260,
                72,
                Layout::RowMajor,
            ),
            (
                GemmPath::Simt,
                Precision::F64,
                DType::F64,
                100,
                70,
                33,
                Layout::ColMajor,
            ),
            (
                GemmPath::Sm80,
                Precision::BF16,
                DType::F32,
                1000,
                1000,
                1000,
                Layout::RowMajor,
            ),
        ] {
            let mut c = base(precision, o, m, n, k);
            c.b_layout = bl;
            c.path = path;
            c.epilogue.c = true;
            out.push(c);
        }
    }
    // GLU epilogues: each kind on each path that has it (auto = hopper on sm_90, else sm80 or
    // simt), both B layouts, odd N and K tails, bias [2N] on and off, every input precision
    let glu_shapes: &[(usize, usize, usize)] = if quick {
        &[(7, 129, 72)]
    } else {
        &[
            (1, 1, 8),
            (7, 129, 72),
            (129, 127, 136),
            (200, 300, 520),
            (257, 65, 1000),
        ]
    };
    let glu_paths = [GemmPath::Auto, GemmPath::Sm80, GemmPath::Simt];
    let mut g = 0usize;
    for &(m, n, k) in glu_shapes {
        for kind in [Glu::SwiGlu, Glu::GeGluErf, Glu::GeGluTanh] {
            for &path in &glu_paths {
                g += 1;
                let (precision, o) = [
                    (Precision::BF16, DType::BF16),
                    (Precision::F16, DType::F16),
                    (Precision::BF16, DType::F32),
                ][g % 3];
                let mut c = base(precision, o, m, n, k);
                c.b_layout = if g % 2 == 0 { Layout::ColMajor } else { Layout::RowMajor };
                c.path = path;
                c.pad = if g % 4 == 1 { 8 } else { 0 };
                c.epilogue.glu = kind;
                c.epilogue.bias = g % 3 != 0;
                // the sm80 path needs ldb a multiple of 8 elements: B [K, 2N] only when 2N + pad is
                if path == GemmPath::Sm80 && c.b_layout == Layout::RowMajor && (2 * n + c.pad) % 8 != 0 {
                    c.b_layout = Layout::ColMajor;
                }
                out.push(c);
            }
        }
    }
    // N with 16-byte rows of D (and B [K, 2N]): what the Hopper path takes through auto on sm_90
    for (j, kind) in [Glu::SwiGlu, Glu::GeGluErf, Glu::GeGluTanh].into_iter().enumerate() {
        if quick && j > 0 {
            break;
        }
        for (precision, o, m, n, k, bl) in [
            (Precision::BF16, DType::BF16, 300, 264, 520, Layout::ColMajor),
            (Precision::F16, DType::F32, 129, 136, 104, Layout::RowMajor),
        ] {
            let mut c = base(precision, o, m, n, k);
            c.b_layout = bl;
            c.epilogue.glu = kind;
            c.epilogue.bias = j != 1;
            c.pad = if j == 2 { 8 } else { 0 };
            out.push(c);
        }
    }
    if !quick {
        // exact fp32 and fp64 (simt), a batch, and an LLM-like shape through the dispatcher
        for (precision, o) in [(Precision::F32, DType::F32), (Precision::F64, DType::F64)] {
            let mut c = base(precision, o, 67, 93, 130);
            c.b_layout = Layout::ColMajor;
            c.epilogue.glu = Glu::SwiGlu;
            c.epilogue.bias = true;
            out.push(c);
        }
        let mut c = base(Precision::BF16, DType::BF16, 65, 70, 136);
        c.batch = 3;
        c.b_layout = Layout::ColMajor;
        c.epilogue.glu = Glu::GeGluTanh;
        c.epilogue.bias = true;
        out.push(c);
        let mut c = base(Precision::BF16, DType::BF16, 512, 1408, 1024);
        c.b_layout = Layout::ColMajor;
        c.epilogue.glu = Glu::SwiGlu;
        out.push(c);
    }
    // NaN / Inf propagation through every activation
    for (j, act) in Activation::ALL.into_iter().enumerate() {
        if quick && j > 1 {
            break;
        }
        let (precision, o) = pairs[j % pairs.len()];
        let mut c = base(precision, o, 33, 40, 24);
        c.epilogue.activation = act;
        c.special = Special::NanInf;
        out.push(c);
        let mut s = base(Precision::BF16, DType::BF16, 4, 40, 24);
        s.b_layout = Layout::ColMajor;
        s.epilogue.activation = act;
        s.special = Special::NanInf;
        out.push(s);
    }
    out
}

/// Runs one case on the GPU and judges it against the f64 reference.
pub fn verify_case(ctx: &Context, case: &Case, seed: u64) -> Result<VerifyOutcome> {
    let input = case.precision.input_dtype()?;
    crate::dispatch_float!("gemm verify"; input, [F16, BF16, F32, F64], |I| {
        crate::dispatch_float!("gemm verify"; case.out, [F16, BF16, F32, F64], |O| run::<I, O>(ctx, case, seed))
    })
}

/// `len` stored elements of `rows x cols` blocks with leading dimension `ld`, `batch` of them
/// packed: random normal values, NaN in the padding.
fn stored<T: Element>(seed: u64, batch: usize, rows: usize, cols: usize, ld: usize) -> Vec<T> {
    let v: Vec<T> = random_matrix(seed, batch * rows, cols, ld, Dist::Normal { std: 1.0 });
    if v.is_empty() {
        vec![T::from_f64(0.0)]
    } else {
        v
    }
}

fn run<I: Element, O: Element>(ctx: &Context, case: &Case, seed: u64) -> Result<VerifyOutcome> {
    let p = case.problem();
    let (ar, ac) = p.a_stored();
    let (br, bc) = p.b_stored();
    let mut a: Vec<I> = stored(seed, p.batch, ar, ac, p.lda);
    let mut b: Vec<I> = stored(seed ^ 0xb, p.batch, br, bc, p.ldb);
    if case.special == Special::NanInf && p.m > 0 && p.n > 0 && p.k > 0 {
        a[0] = I::from_f64(f64::NAN);
        let (kk, j) = (p.k / 2, p.n / 2);
        let off = match p.b_layout {
            Layout::RowMajor => kk * p.ldb + j,
            Layout::ColMajor => j * p.ldb + kk,
        };
        b[off] = I::from_f64(f64::INFINITY);
    }
    let c: Vec<O> = stored(seed ^ 0xc, p.batch, p.m, p.n, p.ldc);
    // [N], or [2N] (gate and up interleaved) with a GLU
    let bias: Vec<O> = stored(seed ^ 0xd, 1, 1, p.b_n().max(1), p.b_n().max(1));
    let res: Vec<O> = stored(seed ^ 0xe, p.batch, p.m, p.n, p.ldr);
    // D starts as C when C is D, else poisoned
    let d0: Vec<O> = if case.c_in_d && p.epilogue.c {
        c.clone()
    } else {
        vec![O::from_f64(f64::NAN); c.len()]
    };

    let af = reference::gather_a(&p, &to_f64_vec(&a));
    let bf = reference::gather_b(&p, &to_f64_vec(&b));
    let cf = reference::gather_mn(&p, &to_f64_vec(&c), p.ldc, p.batch_stride_c);
    let rf = reference::gather_mn(&p, &to_f64_vec(&res), p.ldr, p.batch_stride_r);
    let biasf = to_f64_vec(&bias);
    let (alpha, beta) = (0.75, if p.epilogue.c { -1.25 } else { 0.0 });
    let (want, tol) = reference::gemm(
        &p,
        &Logical {
            a: &af,
            b: &bf,
            c: p.epilogue.c.then_some(&cf[..]),
            bias: p.epilogue.bias.then_some(&biasf[..]),
            residual: p.epilogue.residual.then_some(&rf[..]),
        },
        alpha,
        beta,
    );

    let plan = GemmPlan::new(
        ctx,
        &p,
        &GemmOptions {
            tuning: GemmTuning {
                path: case.path,
                splits: None,
                ..GemmTuning::default()
            },
        },
    )?;
    let da = ctx.upload(&a)?;
    let db = ctx.upload(&b)?;
    let dc = ctx.upload(&c)?;
    let dbias = ctx.upload(&bias)?;
    let dres = ctx.upload(&res)?;
    let mut dd = ctx.upload(&d0)?;
    let view3 = |batch: usize, rows: usize, cols: usize, ld: usize, stride: usize| {
        (vec![batch, rows, cols], vec![stride, ld, 1])
    };
    let (sa, ta) = view3(p.batch, ar, ac, p.lda, p.batch_stride_a);
    let (sb, tb) = view3(p.batch, br, bc, p.ldb, p.batch_stride_b);
    let (sc, tc) = view3(p.batch, p.m, p.n, p.ldc, p.batch_stride_c);
    let (sr, tr) = view3(p.batch, p.m, p.n, p.ldr, p.batch_stride_r);
    let (sd, td) = view3(p.batch, p.m, p.n, p.ldd, p.batch_stride_d);
    let ops = GemmOperands {
        a: da.view(&sa, &ta)?,
        b: db.view(&sb, &tb)?,
        c: match (p.epilogue.c, case.c_in_d) {
            (false, _) => COperand::None,
            (true, true) => COperand::D,
            (true, false) => COperand::Tensor(dc.view(&sc, &tc)?),
        },
        bias: if p.epilogue.bias {
            Some(dbias.view(&[p.b_n()], &[1])?)
        } else {
            None
        },
        residual: if p.epilogue.residual {
            Some(dres.view(&sr, &tr)?)
        } else {
            None
        },
    };
    plan.run(alpha, beta, &ops, &mut dd.view_mut(&sd, &td)?)?;
    let got_stored = dd.to_host()?;
    let got = reference::gather_mn(&p, &to_f64_vec(&got_stored), p.ldd, p.batch_stride_d);

    // D's padding (and anything outside the logical D) must be as it was
    let mut logical = vec![false; got_stored.len()];
    for z in 0..p.batch {
        for i in 0..p.m {
            let row = z * p.batch_stride_d + i * p.ldd;
            logical[row..row + p.n].iter_mut().for_each(|x| *x = true);
        }
    }
    let padding_changed = got_stored
        .iter()
        .zip(&d0)
        .zip(&logical)
        .filter(|((g, w), &l)| {
            !l && g.to_f64().to_bits() != w.to_f64().to_bits() && !(g.to_f64().is_nan() && w.to_f64().is_nan())
        })
        .count();
    let over: Vec<usize> = (0..want.len())
        .filter(|&e| want[e].is_finite() && got[e].is_finite() && (got[e] - want[e]).abs() > tol[e])
        .collect();
    let comparison = compare(&got, &want, 0.0, 0.0);
    let budget = O::DTYPE.rel_l2_budget().max(1e-12);
    // A result below the output type's smallest subnormal step everywhere (a tiny problem whose
    // GELU sits deep in its negative tail, written as fp16) rounds to zeros: its rel-L2 then
    // measures the type's range, not the kernel, so the element bound (whose floor is that
    // step) judges it alone.
    let below_resolution = want
        .iter()
        .all(|w| !w.is_finite() || w.abs() < reference::atol(O::DTYPE));
    let rel_l2_ok = comparison.passes(budget)
        || (below_resolution && comparison.nan_count == 0 && comparison.special_mismatches == 0);
    let mut notes = Vec::new();
    if let Some(&e) = over.first() {
        notes.push(format!(
            "{} elements beyond the error bound; first at {e}: got {:e} want {:e} bound {:.3e}",
            over.len(),
            got[e],
            want[e],
            tol[e]
        ));
    }
    if padding_changed > 0 {
        notes.push(format!(
            "{padding_changed} elements outside D's logical region were written"
        ));
    }
    Ok(VerifyOutcome {
        case: case.name(),
        params: case.params(),
        path: format!("{} ({})", plan.path().name(), plan.kernel_name()),
        passed: rel_l2_ok && notes.is_empty(),
        comparison,
        budget,
        note: (!notes.is_empty()).then(|| notes.join("; ")),
        skipped: None,
    })
}

/// The GLU weight preparation end to end, for B stored `layout`: separate gate and up weights
/// (bf16, `[N, K]` each for B [2N, K], `[K, N]` for B [K, 2N]) are concatenated on the host,
/// interleaved on the device by [`GluInterleave`](super::glu::GluInterleave) (checked bitwise
/// against [`interleave_host`](super::glu::interleave_host)), then a SwiGLU GEMM with an
/// interleaved bias runs through the dispatcher and is checked against
/// `silu(X Wg + bg) * (X Wu + bu)` computed from the separate weights by two f64 products.
pub fn verify_glu_interleave(ctx: &Context, layout: &Layout, seed: u64) -> Result<VerifyOutcome> {
    use super::glu::{interleave_host, GluInterleave};
    use half::bf16;
    let layout = *layout;
    let (m, n, k) = (77, 200, 136);
    let dist = Dist::Normal { std: 1.0 };
    let (wr, wc) = if layout == Layout::ColMajor { (n, k) } else { (k, n) };
    let wg: Vec<bf16> = random_matrix(seed, wr, wc, wc, dist);
    let wu: Vec<bf16> = random_matrix(seed ^ 1, wr, wc, wc, dist);
    let x: Vec<bf16> = random_matrix(seed ^ 2, m, k, k, dist);
    let bg: Vec<bf16> = random_matrix(seed ^ 3, 1, n, n, dist);
    let bu: Vec<bf16> = random_matrix(seed ^ 4, 1, n, n, dist);
    // [Wg; Wu] stacked along rows, or [Wg | Wu] side by side
    let stacked: Vec<bf16> = if layout == Layout::ColMajor {
        wg.iter().chain(&wu).copied().collect()
    } else {
        (0..k)
            .flat_map(|r| wg[r * n..(r + 1) * n].iter().chain(&wu[r * n..(r + 1) * n]).copied())
            .collect()
    };
    let bias_stacked: Vec<bf16> = bg.iter().chain(&bu).copied().collect();
    let want_w = interleave_host(&stacked, n, k, layout);
    let want_bias = interleave_host(&bias_stacked, n, 1, Layout::ColMajor);

    let plan_w = GluInterleave::new(ctx, DType::BF16, n, k, layout)?;
    let plan_b = GluInterleave::new(ctx, DType::BF16, n, 1, Layout::ColMajor)?;
    let (sr, sc) = plan_w.stored();
    let d_stacked = ctx.upload(&stacked)?;
    let d_bias_stacked = ctx.upload(&bias_stacked)?;
    let mut d_w = ctx.alloc::<bf16>(sr * sc)?;
    let mut d_bias = ctx.alloc::<bf16>(2 * n)?;
    plan_w.run(&d_stacked.matrix(sr, sc, sc)?, &mut d_w.matrix_mut(sr, sc, sc)?)?;
    plan_b.run(
        &d_bias_stacked.matrix(2 * n, 1, 1)?,
        &mut d_bias.matrix_mut(2 * n, 1, 1)?,
    )?;
    let got_w = d_w.to_host()?;
    let got_bias = d_bias.to_host()?;
    let mut notes = Vec::new();
    let bad_w = got_w
        .iter()
        .zip(&want_w)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    let bad_b = got_bias
        .iter()
        .zip(&want_bias)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    if bad_w + bad_b > 0 {
        notes.push(format!(
            "device interleave differs from the host's in {bad_w} weight and {bad_b} bias elements"
        ));
    }

    let p = GemmProblem::new(Precision::BF16, DType::BF16, m, n, k)
        .glu(Glu::SwiGlu)
        .b_layout(layout)
        .bias(true);
    let plan = GemmPlan::new(ctx, &p, &GemmOptions::default())?;
    let d_x = ctx.upload(&x)?;
    let mut d_d = ctx.alloc::<bf16>(m * n)?;
    let ops = GemmOperands {
        a: d_x.matrix(m, k, k)?,
        b: d_w.matrix(sr, sc, sc)?,
        c: COperand::None,
        bias: Some(d_bias.view(&[2 * n], &[1])?),
        residual: None,
    };
    plan.run(1.0, 0.0, &ops, &mut d_d.matrix_mut(m, n, n)?)?;
    let got = to_f64_vec(&d_d.to_host()?);

    // the reference from the separate weights: logical [K, N] each
    let logical = |w: &[bf16]| -> Vec<f64> {
        let w = to_f64_vec(w);
        if layout == Layout::ColMajor {
            (0..k * n).map(|e| w[(e % n) * k + e / n]).collect()
        } else {
            w
        }
    };
    let xf = to_f64_vec(&x);
    let (gl, ul) = (logical(&wg), logical(&wu));
    let (g, u) = (
        reference::matmul(&xf, &gl, m, n, k),
        reference::matmul(&xf, &ul, m, n, k),
    );
    let abs = |v: &[f64]| v.iter().map(|x| x.abs()).collect::<Vec<_>>();
    let (sg, su) = (
        reference::matmul(&abs(&xf), &abs(&gl), m, n, k),
        reference::matmul(&abs(&xf), &abs(&ul), m, n, k),
    );
    let (bgf, buf) = (to_f64_vec(&bg), to_f64_vec(&bu));
    let mut want = Vec::with_capacity(m * n);
    let mut tol = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let e = i * n + j;
            let v = reference::glu(Glu::SwiGlu, g[e], u[e], 1.0, Some((bgf[j], buf[j])));
            want.push(v);
            tol.push(reference::glu_bound(
                Glu::SwiGlu,
                DType::BF16,
                DType::F32,
                k,
                v,
                g[e] + bgf[j],
                u[e] + buf[j],
                (sg[e] + bgf[j].abs(), su[e] + buf[j].abs()),
            ));
        }
    }
    let over = (0..want.len()).filter(|&e| (got[e] - want[e]).abs() > tol[e]).count();
    if over > 0 {
        notes.push(format!("{over} elements beyond the error bound"));
    }
    let comparison = compare(&got, &want, 0.0, 0.0);
    let budget = DType::BF16.rel_l2_budget();
    Ok(VerifyOutcome {
        case: format!(
            "gemm glu interleave + swiglu bf16 {m}x{n}x{k} {}",
            layout_name(layout, 'b')
        ),
        params: json!({"M": m, "N": n, "K": k, "b_layout": layout_name(layout, 'b')}),
        path: format!("{} ({})", plan.path().name(), plan.kernel_name()),
        passed: comparison.passes(budget) && notes.is_empty(),
        comparison,
        budget,
        note: (!notes.is_empty()).then(|| notes.join("; ")),
        skipped: None,
    })
}

/// The bad-input job: each call must fail with an error naming the argument, leaving D as it was.
pub fn verify_bad_inputs(ctx: &Context, _case: &(), _seed: u64) -> Result<VerifyOutcome> {
    let (m, n, k) = (64, 64, 64);
    let p = GemmProblem::new(Precision::F16, DType::F16, m, n, k).b_layout(Layout::ColMajor);
    let a = ctx.upload(&vec![half::f16::ONE; m * k + 8])?;
    let b = ctx.upload(&vec![half::f16::ONE; n * k])?;
    let bias = ctx.upload(&vec![half::f16::ONE; n])?;
    let d0 = vec![half::f16::from_f32(7.0); m * n];
    let mut d = ctx.upload(&d0)?;
    let mut failures = Vec::new();
    let mut expect = |what: &str, r: Result<()>, arg: &str| match r {
        Ok(()) => failures.push(format!("{what}: accepted")),
        Err(Error::InvalidArgument { arg: got, .. }) if got == arg => {}
        Err(Error::Unsupported(msg)) if arg == "unsupported" && !msg.is_empty() => {}
        Err(e) => failures.push(format!("{what}: expected an error naming `{arg}`, got: {e}")),
    };
    let plan_err = |q: &GemmProblem, tuning: GemmTuning| GemmPlan::new(ctx, q, &GemmOptions { tuning }).map(|_| ());
    let mut q = p.clone();
    q.lda = k - 1;
    expect("lda < K", plan_err(&q, GemmTuning::default()), "lda");
    let mut q = p.clone();
    q.ldb = k + 1;
    expect(
        "ldb not a multiple of 8 on the sm80 path",
        plan_err(
            &q,
            GemmTuning {
                path: GemmPath::Sm80,
                splits: None,
                ..GemmTuning::default()
            },
        ),
        "ldb",
    );
    expect(
        "fp16 -> fp64",
        plan_err(
            &GemmProblem::new(Precision::F16, DType::F64, m, n, k),
            GemmTuning::default(),
        ),
        "unsupported",
    );
    expect(
        "tf32 with B [K, N]",
        plan_err(
            &GemmProblem::new(Precision::Tf32, DType::F32, m, n, k),
            GemmTuning::default(),
        ),
        "b_layout",
    );
    expect(
        "m >= 2^31",
        plan_err(
            &GemmProblem::new(Precision::F16, DType::F16, 1 << 31, n, k),
            GemmTuning::default(),
        ),
        "m",
    );
    let glu = p.clone().glu(Glu::SwiGlu);
    expect(
        "glu with C",
        plan_err(&glu.clone().with_c(true), GemmTuning::default()),
        "c",
    );
    expect(
        "glu with a residual",
        plan_err(&glu.clone().residual(true), GemmTuning::default()),
        "residual",
    );
    expect(
        "glu with an activation",
        plan_err(&glu.clone().activation(Activation::Relu), GemmTuning::default()),
        "activation",
    );
    expect(
        "glu forced onto the skinny path",
        plan_err(
            &glu,
            GemmTuning {
                path: GemmPath::Skinny,
                splits: None,
                ..GemmTuning::default()
            },
        ),
        "glu",
    );
    expect(
        "glu with fp8 inputs",
        plan_err(
            &GemmProblem::new(Precision::Fp8E4M3, DType::BF16, m, n, k)
                .b_layout(Layout::ColMajor)
                .glu(Glu::SwiGlu),
            GemmTuning::default(),
        ),
        "glu",
    );
    {
        // a GLU plan given B [N, K] instead of [2N, K], and a bias of N instead of 2N
        let glu_plan = GemmPlan::new(ctx, &glu.clone().bias(true), &GemmOptions::default())?;
        let b2 = ctx.upload(&vec![half::f16::ONE; 2 * n * k])?;
        let bias2 = ctx.upload(&vec![half::f16::ONE; 2 * n])?;
        let mut ops = GemmOperands {
            a: a.matrix(m, k, k)?,
            b: b.matrix(n, k, k)?,
            c: COperand::None,
            bias: Some(bias2.view(&[2 * n], &[1])?),
            residual: None,
        };
        expect(
            "glu with B of N rows",
            glu_plan.run(1.0, 0.0, &ops, &mut d.matrix_mut(m, n, n)?),
            "b",
        );
        ops.b = b2.matrix(2 * n, k, k)?;
        ops.bias = Some(bias.view(&[n], &[1])?);
        expect(
            "glu with a bias of N",
            glu_plan.run(1.0, 0.0, &ops, &mut d.matrix_mut(m, n, n)?),
            "bias",
        );
    }
    let plan = GemmPlan::new(
        ctx,
        &p,
        &GemmOptions {
            tuning: GemmTuning {
                path: GemmPath::Sm80,
                splits: None,
                ..GemmTuning::default()
            },
        },
    )?;
    let good = |a_off: usize| -> Result<GemmOperands<'_>> {
        Ok(GemmOperands {
            a: a.view_at(a_off, &[m, k], &[k, 1])?,
            b: b.matrix(n, k, k)?,
            c: COperand::None,
            bias: None,
            residual: None,
        })
    };
    let ops = good(1)?;
    expect(
        "A misaligned by 2 bytes",
        plan.run(1.0, 0.0, &ops, &mut d.matrix_mut(m, n, n)?),
        "a",
    );
    let mut ops = good(0)?;
    ops.b = a.matrix(m, k - 8, k)?;
    expect(
        "B of the wrong shape",
        plan.run(1.0, 0.0, &ops, &mut d.matrix_mut(m, n, n)?),
        "b",
    );
    let mut ops = good(0)?;
    ops.bias = Some(bias.view(&[n], &[1])?);
    expect(
        "bias the plan has not",
        plan.run(1.0, 0.0, &ops, &mut d.matrix_mut(m, n, n)?),
        "bias",
    );
    let ops = good(0)?;
    expect(
        "NaN alpha",
        plan.run(f64::NAN, 0.0, &ops, &mut d.matrix_mut(m, n, n)?),
        "alpha",
    );
    expect(
        "D of the wrong shape",
        plan.run(1.0, 0.0, &ops, &mut d.matrix_mut(m, n - 1, n)?),
        "d",
    );
    let after = d.to_host()?;
    if after.iter().zip(&d0).any(|(x, y)| x.to_bits() != y.to_bits()) {
        failures.push("D was written by a refused call".into());
    }
    Ok(VerifyOutcome {
        case: "gemm bad input".into(),
        params: json!({"checks": 17}),
        path: "-".into(),
        comparison: compare(&[], &[], 0.0, 0.0),
        budget: 0.0,
        passed: failures.is_empty(),
        note: (!failures.is_empty()).then(|| failures.join("; ")),
        skipped: None,
    })
}

/// The tensor-core paths' own jobs (Hopper: sm_90 only; the sm80 plan check: sm_80+); the
/// report goes in the note.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HopperJob {
    /// The kernel against an f64 host reference: odd tails, both B layouts, every operand and
    /// output dtype, scales, every epilogue.
    SelfCheck,
    /// tf32, fp8 and int8 problems through `GemmPlan::run_scaled`.
    PlanCheck,
    /// The same problems with the sm80 (mma.sync) path forced: sm_80+, fp8 on sm_89+.
    Sm80PlanCheck,
    /// The kernel side by side with cuBLAS in one process, each tiling forced.
    Bench,
}

pub fn verify_hopper(ctx: &Context, job: &HopperJob, _seed: u64) -> Result<VerifyOutcome> {
    let name = match job {
        HopperJob::SelfCheck => "gemm hopper self-check",
        HopperJob::PlanCheck => "gemm hopper tf32/fp8/int8 plans",
        HopperJob::Sm80PlanCheck => "gemm sm80 tf32/fp8/int8 plans",
        HopperJob::Bench => "gemm hopper bench",
    };
    if *job == HopperJob::Sm80PlanCheck && ctx.arch().major < 8 {
        return Ok(VerifyOutcome::skipped(name.into(), json!({}), "needs sm_80".into()));
    }
    if *job != HopperJob::Sm80PlanCheck && ctx.arch().major != 9 {
        return Ok(VerifyOutcome::skipped(name.into(), json!({}), "needs sm_90".into()));
    }
    let run = match job {
        HopperJob::SelfCheck => super::hopper::hopper_self_check(ctx),
        HopperJob::PlanCheck => super::hopper::plan_self_check(ctx, GemmPath::Auto),
        HopperJob::Sm80PlanCheck => super::hopper::plan_self_check(ctx, GemmPath::Sm80),
        HopperJob::Bench => super::hopper::hopper_bench(ctx),
    };
    let (passed, note) = match run {
        Ok(report) => (true, report),
        Err(e) => (false, e.to_string()),
    };
    Ok(VerifyOutcome {
        case: name.into(),
        params: json!({}),
        path: if *job == HopperJob::Sm80PlanCheck {
            "sm80"
        } else {
            "hopper"
        }
        .into(),
        comparison: compare(&[], &[], 0.0, 0.0),
        budget: 0.0,
        passed,
        note: Some(note),
        skipped: None,
    })
}
