//! The f64 CPU oracle for row-wise softmax and log-softmax.
//!
//! For each row of `cols` logical elements (row pitch `stride`), with `x = scale * input`:
//!
//! ```text
//! m           = max_j x_j
//! d_j         = x_j - m            (defined as 0 where x_j == m, so +inf - +inf is 0, not NaN)
//! s           = sum_j exp(d_j)
//! softmax     = exp(d_j) / s
//! log_softmax = d_j - ln(s)
//! ```
//!
//! Special rows (the semantics kernels must reproduce; [`crate::check::compare`] requires
//! exact agreement at non-finite reference positions):
//!
//! * **Any NaN in the row** (including one produced by `scale * input`, e.g. `0 * inf`):
//!   the whole output row is NaN.
//! * **Every element `-inf`** (a fully masked row): softmax is `0` for every element and
//!   log-softmax is `-inf` for every element. No NaN is produced.
//! * **Some elements `+inf`**: the `k` elements equal to `+inf` share the mass equally
//!   (softmax `1/k`, log-softmax `-ln k`); every other element gets softmax `0` and
//!   log-softmax `-inf`.
//! * `-inf` elements in an otherwise finite row get softmax `0` and log-softmax `-inf`.
//!
//! `scale * input` is computed in f64; if it overflows to ±inf the element is treated as that
//! infinity. Values with a huge spread (e.g. ±1e30) stay finite: the row max is subtracted
//! before `exp`, so the largest term is exactly `exp(0) = 1` and `s >= 1`.

use rayon::prelude::*;

use super::SoftmaxKind;
use crate::check::to_f64_vec;
use crate::dtype::Element;

/// Reference softmax/log-softmax of a row-major `rows x cols` matrix with pitch `stride`.
///
/// Reads `input[r * stride + c]` for `c < cols` (padding is ignored) and returns `rows * cols`
/// values, contiguous (pitch `cols`). Rows are processed in parallel with rayon. See the module
/// documentation for the exact semantics, including fully masked, NaN and `+inf` rows.
///
/// # Panics
/// If `stride < cols`, or if `input` is too short to hold the last row
/// (`(rows - 1) * stride + cols` elements; the last row's padding need not be present).
pub fn softmax_reference(
    input: &[f64],
    rows: usize,
    cols: usize,
    stride: usize,
    scale: f64,
    kind: SoftmaxKind,
) -> Vec<f64> {
    assert!(stride >= cols, "softmax_reference: stride {stride} < cols {cols}");
    if rows == 0 || cols == 0 {
        return Vec::new();
    }
    let needed = (rows - 1)
        .checked_mul(stride)
        .and_then(|n| n.checked_add(cols))
        .expect("softmax_reference: rows * stride overflows usize");
    assert!(
        input.len() >= needed,
        "softmax_reference: input has {} elements, a {rows}x{cols} matrix with stride {stride} needs {needed}",
        input.len()
    );
    let mut out = vec![0.0; rows * cols];
    out.par_chunks_mut(cols)
        .enumerate()
        .with_min_len(rows_per_task(cols))
        .for_each(|(r, dst)| {
            let start = r * stride;
            softmax_row(&input[start..start + cols], scale, kind, dst);
        });
    out
}

/// [`softmax_reference`] on device-typed input (f32, f16, bf16, ...), converted to f64 first.
///
/// The conversion is exact for every supported storage type, so this is the reference for
/// exactly the values the kernel read.
pub fn softmax_reference_from<T: Element>(
    input: &[T],
    rows: usize,
    cols: usize,
    stride: usize,
    scale: f64,
    kind: SoftmaxKind,
) -> Vec<f64> {
    softmax_reference(&to_f64_vec(input), rows, cols, stride, scale, kind)
}

/// Rows per rayon task so that each task touches at least ~4096 elements.
fn rows_per_task(cols: usize) -> usize {
    (4096 / cols.max(1)).max(1)
}

/// One row: `src` holds the `cols` raw inputs, `dst` receives the `cols` outputs.
fn softmax_row(src: &[f64], scale: f64, kind: SoftmaxKind, dst: &mut [f64]) {
    debug_assert_eq!(src.len(), dst.len());
    // x = scale * input, kept in dst to avoid a second buffer.
    let mut m = f64::NEG_INFINITY;
    let mut has_nan = false;
    for (d, &v) in dst.iter_mut().zip(src) {
        let x = scale * v;
        has_nan |= x.is_nan();
        m = m.max(x);
        *d = x;
    }
    if has_nan {
        dst.fill(f64::NAN);
        return;
    }
    if m == f64::NEG_INFINITY {
        // Fully masked row: no mass anywhere.
        dst.fill(match kind {
            SoftmaxKind::Softmax => 0.0,
            SoftmaxKind::LogSoftmax => f64::NEG_INFINITY,
        });
        return;
    }
    // d_j = x_j - m, with d_j = 0 where x_j == m (this is what makes +inf rows NaN-free:
    // elements equal to +inf get 0, all others finite - inf = -inf).
    let mut s = 0.0;
    for d in dst.iter_mut() {
        *d = if *d == m { 0.0 } else { *d - m };
        s += d.exp();
    }
    // s >= 1 (the max contributes exp(0) = 1) and is finite (at most cols terms <= 1).
    match kind {
        SoftmaxKind::Softmax => {
            let inv = 1.0 / s;
            for d in dst.iter_mut() {
                *d = d.exp() * inv;
            }
        }
        SoftmaxKind::LogSoftmax => {
            let ls = s.ln();
            for d in dst.iter_mut() {
                *d -= ls;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{random_matrix, Dist};
    use half::f16;
    use proptest::prelude::*;

    const NEG_INF: f64 = f64::NEG_INFINITY;
    const INF: f64 = f64::INFINITY;
    const SM: SoftmaxKind = SoftmaxKind::Softmax;
    const LSM: SoftmaxKind = SoftmaxKind::LogSoftmax;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * (1.0 + b.abs())
    }

    #[test]
    fn known_values() {
        let y = softmax_reference(&[0.0, 2f64.ln()], 1, 2, 2, 1.0, SM);
        assert!(close(y[0], 1.0 / 3.0, 1e-15) && close(y[1], 2.0 / 3.0, 1e-15), "{y:?}");
        let l = softmax_reference(&[0.0, 2f64.ln()], 1, 2, 2, 1.0, LSM);
        assert!(close(l[0], -(3f64.ln()), 1e-15), "{l:?}");
    }

    #[test]
    fn rows_sum_to_one_and_log_matches() {
        let (rows, cols, stride) = (13, 301, 320);
        let x: Vec<f64> = random_matrix(42, rows, cols, stride, Dist::WithOutliers { std: 2.0 });
        let y = softmax_reference(&x, rows, cols, stride, 0.7, SM);
        let l = softmax_reference(&x, rows, cols, stride, 0.7, LSM);
        assert_eq!(y.len(), rows * cols);
        for r in 0..rows {
            let row = &y[r * cols..(r + 1) * cols];
            let s: f64 = row.iter().sum();
            assert!((s - 1.0).abs() < 1e-13, "row {r} sums to {s}");
            assert!(row.iter().all(|&p| (0.0..=1.0).contains(&p)));
        }
        for (i, (&p, &lp)) in y.iter().zip(&l).enumerate() {
            assert!(
                close(lp, p.ln(), 1e-12),
                "at {i}: log_softmax {lp} vs ln(softmax) {}",
                p.ln()
            );
        }
    }

    #[test]
    fn padding_is_ignored() {
        // random_matrix pads with NaN; a reference that read padding would produce NaN rows.
        let x: Vec<f32> = random_matrix(3, 4, 5, 8, Dist::Normal { std: 1.0 });
        let y = softmax_reference_from(&x, 4, 5, 8, 1.0, SM);
        assert!(y.iter().all(|v| v.is_finite()));
        // The last row's padding may be absent.
        let y2 = softmax_reference_from(&x[..3 * 8 + 5], 4, 5, 8, 1.0, SM);
        assert_eq!(y, y2);
    }

    #[test]
    fn shift_invariance() {
        let x: Vec<f64> = random_matrix(5, 3, 17, 17, Dist::Normal { std: 3.0 });
        let shifted: Vec<f64> = x.iter().map(|v| v + 123.25).collect();
        for kind in [SM, LSM] {
            let a = softmax_reference(&x, 3, 17, 17, 1.0, kind);
            let b = softmax_reference(&shifted, 3, 17, 17, 1.0, kind);
            for (p, q) in a.iter().zip(&b) {
                assert!(close(*p, *q, 1e-11), "{kind:?}: {p} vs {q}");
            }
        }
    }

    #[test]
    fn scale_is_applied_before_max() {
        let x: Vec<f64> = random_matrix(6, 2, 9, 9, Dist::Normal { std: 1.0 });
        let scaled: Vec<f64> = x.iter().map(|v| v * 0.125).collect();
        let a = softmax_reference(&x, 2, 9, 9, 0.125, SM);
        let b = softmax_reference(&scaled, 2, 9, 9, 1.0, SM);
        assert_eq!(a, b);
        // Negative scale flips the order; scale 0 gives a uniform row.
        let neg = softmax_reference(&[1.0, 2.0], 1, 2, 2, -1.0, SM);
        assert!(neg[0] > neg[1]);
        let zero = softmax_reference(&[1.0, 2.0, 3.0, 4.0], 1, 4, 4, 0.0, SM);
        assert_eq!(zero, vec![0.25; 4]);
    }

    #[test]
    fn fully_masked_row() {
        let x = [NEG_INF, NEG_INF, NEG_INF, 1.0, 2.0, 3.0];
        let y = softmax_reference(&x, 2, 3, 3, 1.0, SM);
        assert_eq!(y[..3], [0.0; 3]);
        assert!(close(y[3..].iter().sum::<f64>(), 1.0, 1e-15));
        let l = softmax_reference(&x, 2, 3, 3, 1.0, LSM);
        assert_eq!(l[..3], [NEG_INF; 3]);
        assert!(l[3..].iter().all(|v| v.is_finite()));
    }

    #[test]
    fn partially_masked_row() {
        let y = softmax_reference(&[NEG_INF, 0.0, NEG_INF, 0.0], 1, 4, 4, 1.0, SM);
        assert_eq!(y, vec![0.0, 0.5, 0.0, 0.5]);
        let l = softmax_reference(&[NEG_INF, 0.0, NEG_INF, 0.0], 1, 4, 4, 1.0, LSM);
        assert_eq!(l[0], NEG_INF);
        assert!(close(l[1], -(2f64.ln()), 1e-15));
    }

    #[test]
    fn nan_poisons_only_its_row() {
        let x = [1.0, f64::NAN, 3.0, 1.0, 2.0, 3.0];
        for kind in [SM, LSM] {
            let y = softmax_reference(&x, 2, 3, 3, 1.0, kind);
            assert!(y[..3].iter().all(|v| v.is_nan()), "{kind:?} {y:?}");
            assert!(y[3..].iter().all(|v| v.is_finite()));
        }
        // 0 * inf is NaN too.
        let y = softmax_reference(&[INF, 1.0], 1, 2, 2, 0.0, SM);
        assert!(y.iter().all(|v| v.is_nan()));
    }

    #[test]
    fn plus_inf_elements_share_mass() {
        let x = [INF, 1.0, INF, NEG_INF];
        let y = softmax_reference(&x, 1, 4, 4, 1.0, SM);
        assert_eq!(y, vec![0.5, 0.0, 0.5, 0.0]);
        let l = softmax_reference(&x, 1, 4, 4, 1.0, LSM);
        assert!(close(l[0], -(2f64.ln()), 1e-15) && l[0] == l[2]);
        assert_eq!(l[1], NEG_INF);
        assert_eq!(l[3], NEG_INF);
        // Scale overflow to +inf behaves the same.
        let y = softmax_reference(&[1e300, 1.0], 1, 2, 2, 1e10, SM);
        assert_eq!(y, vec![1.0, 0.0]);
    }

    #[test]
    fn huge_spread_stays_finite() {
        let x = [1e30, -1e30, 0.0, 1e30 - 1e15, -5e29];
        let y = softmax_reference(&x, 1, 5, 5, 1.0, SM);
        assert!(y.iter().all(|v| v.is_finite()), "{y:?}");
        assert!(close(y.iter().sum::<f64>(), 1.0, 1e-15));
        assert_eq!(y[0], 1.0);
        let l = softmax_reference(&x, 1, 5, 5, 1.0, LSM);
        assert!(l.iter().all(|v| v.is_finite()), "{l:?}");
        assert_eq!(l[0], 0.0);
        assert!(close(l[1], -2e30, 1e-15));

        // Tiny values: effectively uniform.
        let y = softmax_reference(&[1e-300, -1e-300, 5e-324], 1, 3, 3, 1.0, SM);
        for v in y {
            assert!(close(v, 1.0 / 3.0, 1e-15));
        }
    }

    #[test]
    fn one_by_one() {
        assert_eq!(softmax_reference(&[7.5], 1, 1, 1, 1.0, SM), vec![1.0]);
        assert_eq!(softmax_reference(&[7.5], 1, 1, 1, 1.0, LSM), vec![0.0]);
        assert_eq!(softmax_reference(&[-1e300], 1, 1, 4, 1.0, SM), vec![1.0]);
    }

    #[test]
    fn empty_shapes() {
        assert!(softmax_reference(&[], 0, 5, 5, 1.0, SM).is_empty());
        assert!(softmax_reference(&[], 3, 0, 0, 1.0, SM).is_empty());
    }

    #[test]
    #[should_panic(expected = "needs")]
    fn short_input_panics() {
        softmax_reference(&[0.0; 9], 2, 5, 5, 1.0, SM);
    }

    #[test]
    #[should_panic(expected = "stride")]
    fn stride_smaller_than_cols_panics() {
        softmax_reference(&[0.0; 20], 2, 5, 4, 1.0, SM);
    }

    #[test]
    fn generic_from_half() {
        let x: Vec<f16> = random_matrix(8, 3, 40, 48, Dist::WithOutliers { std: 1.0 });
        let xf = to_f64_vec(&x);
        assert_eq!(
            softmax_reference_from(&x, 3, 40, 48, 0.5, LSM),
            softmax_reference(&xf, 3, 40, 48, 0.5, LSM)
        );
    }

    #[test]
    fn parallel_matches_row_by_row() {
        let (rows, cols) = (1000, 3);
        let x: Vec<f64> = random_matrix(12, rows, cols, cols, Dist::Normal { std: 1.0 });
        let all = softmax_reference(&x, rows, cols, cols, 1.0, SM);
        for r in [0, 1, 499, 999] {
            let one = softmax_reference(&x[r * cols..(r + 1) * cols], 1, cols, cols, 1.0, SM);
            assert_eq!(all[r * cols..(r + 1) * cols], one[..]);
        }
    }

    proptest! {
        #[test]
        fn prop_sum_to_one_and_shift_invariant(
            rows in 1usize..5,
            cols in 1usize..40,
            pad in 0usize..4,
            seed in any::<u64>(),
            shift in -1e3f64..1e3,
            scale in 0.01f64..4.0,
        ) {
            let stride = cols + pad;
            let x: Vec<f64> = random_matrix(seed, rows, cols, stride, Dist::WithOutliers { std: 3.0 });
            let y = softmax_reference(&x, rows, cols, stride, scale, SM);
            let l = softmax_reference(&x, rows, cols, stride, scale, LSM);
            for r in 0..rows {
                let s: f64 = y[r * cols..(r + 1) * cols].iter().sum();
                prop_assert!((s - 1.0).abs() < 1e-12, "row {} sums to {}", r, s);
            }
            // Shift the scaled logits by `shift` (shift / scale in input space).
            let xs: Vec<f64> = x.iter().map(|v| v + shift / scale).collect();
            let ys = softmax_reference(&xs, rows, cols, stride, scale, SM);
            let ls = softmax_reference(&xs, rows, cols, stride, scale, LSM);
            for i in 0..rows * cols {
                prop_assert!((y[i] - ys[i]).abs() < 1e-9, "softmax {} vs {}", y[i], ys[i]);
                prop_assert!((l[i] - ls[i]).abs() < 1e-9 * (1.0 + l[i].abs()), "log {} vs {}", l[i], ls[i]);
                prop_assert!(y[i] >= 0.0 && l[i] <= 0.0);
            }
        }
    }
}
