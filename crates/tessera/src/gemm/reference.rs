//! The f64 CPU reference of the GEMM and its error bound.
//!
//! [`matmul`] multiplies packed row-major matrices in f64, blocked (8 rows of D by 512 columns,
//! one k at a time, each element summed in k order) and parallel over row blocks with rayon;
//! [`gemm`] applies the epilogue in the order of `epilogue.cuh`. The `gather_*` helpers turn
//! stored operands (any layout, leading dimension and batch stride) into packed logical
//! matrices, so the reference never shares indexing code with the kernels' launch.
//!
//! Error bound ([`bound`]), per element of D, with u_out and u_acc the unit roundoffs of the
//! output and accumulate types (fp16 2^-11, bf16 2^-8, fp32 2^-24, fp64 2^-53):
//!
//! ```text
//! |d - ref| <= u_out |ref| + 4 u_acc (sqrt(K) + 4) (2 S + |R|) + atol_out
//! S = |alpha| sum_k |A[m,k]| |B[k,n]| + |beta C| + |bias|
//! ```
//!
//! The first term is the final rounding to the output type; the second the accumulation (a
//! blocked or pairwise f32/f64 sum of K products has an error that grows like sqrt(K) u_acc
//! times the sum of magnitudes for inputs of random sign), the epilogue's few roundings (the
//! added 4) and the activation's slope (at most ~1.13 for GELU, hence 2 S); atol_out is the
//! smallest subnormal step of the output type. The inputs are the stored (already rounded)
//! values, so input rounding is not part of the error. Verification also applies DESIGN.md's
//! rel-L2 budget of the output dtype.
//!
//! GLU epilogues ([`Glu`]): the product has `2N` columns (gate `2j`, up `2j + 1`) and
//! `d = act(g) u` with `g = alpha acc_g + bias_g`, `u = alpha acc_u + bias_u` ([`glu`]). With
//! `e(S) = 4 u_acc (sqrt(K) + 4) 2 S` the accumulation bound of one half (as above, the 2
//! covering the activation's slope), the bound is
//!
//! ```text
//! |d - ref| <= u_out |ref| + |u| e(S_g) + |act(g)| e(S_u) + e(S_g) e(S_u) + atol_out
//! ```
//!
//! (first-order error of a product, plus the product of the two errors).

use rayon::prelude::*;

use super::problem::{Activation, GemmProblem, Glu, Layout};
use crate::dtype::DType;

/// Rows of D per parallel task and columns per block of [`matmul`].
const ROW_BLOCK: usize = 8;
const COL_BLOCK: usize = 512;

/// `D[m][n] = sum_k A[m][k] B[k][n]` for packed row-major `a` [m, k] and `b` [k, n], in f64
/// (k in order for each element; NaN and Inf propagate: zeros are multiplied, not skipped).
pub fn matmul(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    assert_eq!(a.len(), m * k, "matmul: a is not m x k");
    assert_eq!(b.len(), k * n, "matmul: b is not k x n");
    let mut d = vec![0.0; m * n];
    if n == 0 || m == 0 {
        return d;
    }
    d.par_chunks_mut(ROW_BLOCK * n).enumerate().for_each(|(blk, dc)| {
        let i0 = blk * ROW_BLOCK;
        let rows = dc.len() / n;
        for j0 in (0..n).step_by(COL_BLOCK) {
            let jn = COL_BLOCK.min(n - j0);
            for kk in 0..k {
                let brow = &b[kk * n + j0..kk * n + j0 + jn];
                for r in 0..rows {
                    let aik = a[(i0 + r) * k + kk];
                    let drow = &mut dc[r * n + j0..r * n + j0 + jn];
                    for (x, y) in drow.iter_mut().zip(brow) {
                        *x += aik * y;
                    }
                }
            }
        }
    });
    d
}

/// The plain triple loop (the reference's own test oracle).
pub fn matmul_naive(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut d = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0;
            for kk in 0..k {
                s += a[i * k + kk] * b[kk * n + j];
            }
            d[i * n + j] = s;
        }
    }
    d
}

/// `act(alpha * acc + beta * c + bias) + residual` in the order of `epilogue.cuh`; `None` terms
/// are absent.
pub fn epilogue(
    act: Activation,
    acc: f64,
    alpha: f64,
    c: Option<(f64, f64)>,
    bias: Option<f64>,
    residual: Option<f64>,
) -> f64 {
    let mut x = alpha * acc;
    if let Some((beta, c)) = c {
        x += beta * c;
    }
    if let Some(b) = bias {
        x += b;
    }
    let mut d = act.apply(x);
    if let Some(r) = residual {
        d += r;
    }
    d
}

/// The GLU epilogue `act(alpha g + bias_g) * (alpha u + bias_u)` of [`Glu`] (`None` biases are
/// absent); `Glu::None` is the identity on g (u ignored).
pub fn glu(kind: Glu, gate: f64, up: f64, alpha: f64, bias: Option<(f64, f64)>) -> f64 {
    let (bg, bu) = bias.unwrap_or((0.0, 0.0));
    let g = alpha * gate + bg;
    if kind == Glu::None {
        return g;
    }
    let u = alpha * up + bu;
    kind.gate_activation().apply(g) * u
}

/// The GLU bound of the module docs for one element: the reference `reference`, the gate and
/// up values `g`, `u` entering the product and their magnitudes `s = (S_g, S_u)`
/// (`|alpha| sum |A||B| + |bias|`).
#[allow(clippy::too_many_arguments)]
pub fn glu_bound(kind: Glu, out: DType, acc: DType, k: usize, reference: f64, g: f64, u: f64, s: (f64, f64)) -> f64 {
    let e = |mag: f64| 4.0 * unit_roundoff(acc) * ((k as f64).sqrt() + 4.0) * 2.0 * mag;
    let (eg, eu) = (e(s.0), e(s.1));
    let act_g = kind.gate_activation().apply(g);
    unit_roundoff(out) * reference.abs() + u.abs() * eg + act_g.abs() * eu + eg * eu + atol(out)
}

/// Unit roundoff of a storage or accumulate type.
pub fn unit_roundoff(d: DType) -> f64 {
    match d {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        DType::F64 => 2f64.powi(-53),
        _ => 2f64.powi(-24),
    }
}

/// Smallest subnormal step of the output type (the absolute floor of the bound).
pub fn atol(d: DType) -> f64 {
    match d {
        DType::F16 => 2f64.powi(-24),
        DType::BF16 => 2f64.powi(-133),
        DType::F64 => 0.0,
        _ => 2f64.powi(-149),
    }
}

/// The bound of the module docs for one element: `reference`, the magnitude `s` entering the
/// activation and the residual's magnitude `r`.
pub fn bound(out: DType, acc: DType, k: usize, reference: f64, s: f64, r: f64) -> f64 {
    unit_roundoff(out) * reference.abs()
        + 4.0 * unit_roundoff(acc) * ((k as f64).sqrt() + 4.0) * (2.0 * s + r)
        + atol(out)
}

/// Packed logical A, [batch][M][K], from its stored form (`stored` as f64).
pub fn gather_a(p: &GemmProblem, stored: &[f64]) -> Vec<f64> {
    let mut out = Vec::with_capacity(p.batch * p.m * p.k);
    for z in 0..p.batch {
        for i in 0..p.m {
            for kk in 0..p.k {
                let off = z * p.batch_stride_a
                    + match p.a_layout {
                        Layout::RowMajor => i * p.lda + kk,
                        Layout::ColMajor => kk * p.lda + i,
                    };
                out.push(stored[off]);
            }
        }
    }
    out
}

/// Packed logical B, [batch][K][N] (N = [`GemmProblem::b_n`]: 2N with a GLU), from its stored
/// form.
pub fn gather_b(p: &GemmProblem, stored: &[f64]) -> Vec<f64> {
    let bn = p.b_n();
    let mut out = Vec::with_capacity(p.batch * p.k * bn);
    for z in 0..p.batch {
        for kk in 0..p.k {
            for j in 0..bn {
                let off = z * p.batch_stride_b
                    + match p.b_layout {
                        Layout::RowMajor => kk * p.ldb + j,
                        Layout::ColMajor => j * p.ldb + kk,
                    };
                out.push(stored[off]);
            }
        }
    }
    out
}

/// Packed [batch][M][N] from a row-major stored matrix with leading dimension `ld`.
pub fn gather_mn(p: &GemmProblem, stored: &[f64], ld: usize, batch_stride: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(p.batch * p.m * p.n);
    for z in 0..p.batch {
        for i in 0..p.m {
            let row = z * batch_stride + i * ld;
            out.extend_from_slice(&stored[row..row + p.n]);
        }
    }
    out
}

/// The logical operands of one GEMM, packed (see the gather helpers).
pub struct Logical<'a> {
    pub a: &'a [f64],
    pub b: &'a [f64],
    pub c: Option<&'a [f64]>,
    pub bias: Option<&'a [f64]>,
    pub residual: Option<&'a [f64]>,
}

/// The reference D ([batch][M][N]) and each element's error bound, for the problem's epilogue
/// (with a GLU: `x.b` is [batch][K][2N] and `x.bias` [2N], see [`gemm_glu`]).
pub fn gemm(p: &GemmProblem, x: &Logical<'_>, alpha: f64, beta: f64) -> (Vec<f64>, Vec<f64>) {
    if p.epilogue.glu.is_some() {
        return gemm_glu(p, x, alpha);
    }
    let (m, n, k) = (p.m, p.n, p.k);
    let acc_dtype = if p.out == DType::F64 { DType::F64 } else { DType::F32 };
    let mut d = Vec::with_capacity(p.batch * m * n);
    let mut tol = Vec::with_capacity(p.batch * m * n);
    for z in 0..p.batch {
        let a = &x.a[z * m * k..(z + 1) * m * k];
        let b = &x.b[z * k * n..(z + 1) * k * n];
        let acc = matmul(a, b, m, n, k);
        let abs_a: Vec<f64> = a.iter().map(|v| v.abs()).collect();
        let abs_b: Vec<f64> = b.iter().map(|v| v.abs()).collect();
        let mag = matmul(&abs_a, &abs_b, m, n, k);
        for i in 0..m {
            for j in 0..n {
                let e = z * m * n + i * n + j;
                let c = x.c.map(|c| (beta, c[e]));
                let bias = x.bias.map(|b| b[j]);
                let res = x.residual.map(|r| r[e]);
                let v = epilogue(p.epilogue.activation, acc[i * n + j], alpha, c, bias, res);
                let s =
                    alpha.abs() * mag[i * n + j] + c.map_or(0.0, |(b, c)| (b * c).abs()) + bias.map_or(0.0, f64::abs);
                d.push(v);
                tol.push(bound(p.out, acc_dtype, k, v, s, res.map_or(0.0, f64::abs)));
            }
        }
    }
    (d, tol)
}

/// The GLU reference: the `[M, 2N]` product (interleaved gate and up columns), then [`glu`]
/// per output column with the bound [`glu_bound`]. C and R do not exist with a GLU.
pub fn gemm_glu(p: &GemmProblem, x: &Logical<'_>, alpha: f64) -> (Vec<f64>, Vec<f64>) {
    let (m, n, k) = (p.m, p.n, p.k);
    let bn = p.b_n();
    let kind = p.epilogue.glu;
    let acc_dtype = if p.out == DType::F64 { DType::F64 } else { DType::F32 };
    let mut d = Vec::with_capacity(p.batch * m * n);
    let mut tol = Vec::with_capacity(p.batch * m * n);
    for z in 0..p.batch {
        let a = &x.a[z * m * k..(z + 1) * m * k];
        let b = &x.b[z * k * bn..(z + 1) * k * bn];
        let acc = matmul(a, b, m, bn, k);
        let abs_a: Vec<f64> = a.iter().map(|v| v.abs()).collect();
        let abs_b: Vec<f64> = b.iter().map(|v| v.abs()).collect();
        let mag = matmul(&abs_a, &abs_b, m, bn, k);
        for i in 0..m {
            for j in 0..n {
                let (cg, cu) = (i * bn + 2 * j, i * bn + 2 * j + 1);
                let bias = x.bias.map(|b| (b[2 * j], b[2 * j + 1]));
                let (bg, bu) = bias.unwrap_or((0.0, 0.0));
                let v = glu(kind, acc[cg], acc[cu], alpha, bias);
                let (g, u) = (alpha * acc[cg] + bg, alpha * acc[cu] + bu);
                let s = (alpha.abs() * mag[cg] + bg.abs(), alpha.abs() * mag[cu] + bu.abs());
                d.push(v);
                tol.push(glu_bound(kind, p.out, acc_dtype, k, v, g, u, s));
            }
        }
    }
    (d, tol)
}
