//! Error metrics shared by every operator's verification (DESIGN.md "Numerics").
//!
//! An operator's output is converted to `f64` ([`to_f64_vec`]) and compared with its f64 CPU
//! reference by [`compare`]. The verdict is [`Comparison::passes`] with the dtype's budget
//! ([`crate::DType::rel_l2_budget`]); the element-wise `atol`/`rtol` test only *reports* the
//! worst offenders so a failure can be located, it does not decide the verdict.
//!
//! Rules, per position `i` (`g = got[i]`, `w = want[i]`):
//!
//! | reference `w`   | output `g` required       | on violation                          |
//! |-----------------|---------------------------|---------------------------------------|
//! | finite          | finite                    | counted in `nan_count` (fails)        |
//! | `+inf` / `-inf` | exactly the same infinity | counted in `special_mismatches` (fails)|
//! | NaN             | NaN (intended propagation)| counted in `special_mismatches` (fails)|
//!
//! Only positions where both `w` and `g` are finite enter `rel_l2` and `max_abs_err`; every
//! other failing position makes [`Comparison::passes`] false on its own.
//!
//! `rel_l2 = ||got - want||_2 / ||want||_2` over those positions, or the absolute
//! `||got - want||_2` when `||want||_2 == 0`. Norms are accumulated with scaling (as LAPACK's
//! `dnrm2`), so values near `f64::MAX` or in the subnormal range do not overflow or underflow.

use std::fmt;

use rayon::prelude::*;

use crate::dtype::Element;

/// How many failing positions [`Comparison::mismatches`] keeps (the first ones, by index).
pub const MAX_REPORTED_MISMATCHES: usize = 10;

/// One failing position, for diagnostics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mismatch {
    /// Flat index into the compared slices.
    pub index: usize,
    /// The operator's value.
    pub got: f64,
    /// The reference value.
    pub want: f64,
}

/// The result of [`compare`]: summary metrics plus the first failing positions.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// Number of compared elements.
    pub n: usize,
    /// Largest `|got - want|` over positions where both are finite (0 if there are none).
    pub max_abs_err: f64,
    /// `||got - want|| / ||want||` over positions where both are finite; the absolute norm of
    /// the difference when `||want|| == 0`; 0 when there are no such positions.
    pub rel_l2: f64,
    /// Positions where the reference is finite but the output is NaN or ±inf.
    pub nan_count: usize,
    /// Positions where the reference is ±inf or NaN and the output is not the same special
    /// value (same-signed infinity, or any NaN).
    pub special_mismatches: usize,
    /// Total number of failing positions: `nan_count + special_mismatches` plus the finite
    /// positions with `|got - want| > atol + rtol * |want|`.
    pub mismatch_count: usize,
    /// The first [`MAX_REPORTED_MISMATCHES`] failing positions, in index order.
    pub mismatches: Vec<Mismatch>,
    /// The worst position: the first non-finite failure if there is one (`nan_count` or
    /// `special_mismatches`), otherwise the position of `max_abs_err`. `None` when `n == 0`
    /// or nothing differs at all.
    pub worst_index: Option<usize>,
}

impl Comparison {
    /// The verdict: no unexpected NaN/inf (`nan_count == 0`), every ±inf/NaN of the reference
    /// reproduced (`special_mismatches == 0`), and `rel_l2 <= rel_l2_budget` (a NaN `rel_l2`
    /// fails). Element-wise `atol`/`rtol` mismatches alone do not fail; see
    /// [`Comparison::all_close`] for that stricter test.
    pub fn passes(&self, rel_l2_budget: f64) -> bool {
        self.nan_count == 0 && self.special_mismatches == 0 && self.rel_l2 <= rel_l2_budget
    }

    /// True when no position failed at all, including the element-wise
    /// `|got - want| <= atol + rtol * |want|` test.
    pub fn all_close(&self) -> bool {
        self.mismatch_count == 0
    }
}

impl fmt::Display for Comparison {
    /// One line of metrics, then (if any) one line per reported mismatch:
    ///
    /// ```text
    /// n=4096 rel_l2=1.234e-6 max_abs=2.000e-7 (at 17) nan=0 special=0 mismatches=2
    ///   [17] got=0.5000002 want=0.5 diff=2.000e-7
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "n={} rel_l2={:.3e} max_abs={:.3e}",
            self.n, self.rel_l2, self.max_abs_err
        )?;
        if let Some(i) = self.worst_index {
            write!(f, " (worst at {i})")?;
        }
        write!(
            f,
            " nan={} special={} mismatches={}",
            self.nan_count, self.special_mismatches, self.mismatch_count
        )?;
        for m in &self.mismatches {
            write!(
                f,
                "\n  [{}] got={:e} want={:e} diff={:.3e}",
                m.index,
                m.got,
                m.want,
                (m.got - m.want).abs()
            )?;
        }
        if self.mismatch_count > self.mismatches.len() {
            write!(f, "\n  ... and {} more", self.mismatch_count - self.mismatches.len())?;
        }
        Ok(())
    }
}

/// Scaled sum of squares: represents `scale^2 * ssq` without overflow or underflow
/// (the `dlassq` update of LAPACK).
#[derive(Clone, Copy, Debug)]
struct SumSq {
    scale: f64,
    ssq: f64,
}

impl SumSq {
    const ZERO: SumSq = SumSq { scale: 0.0, ssq: 1.0 };

    fn add(&mut self, x: f64) {
        let a = x.abs();
        if a == 0.0 {
            return;
        }
        if self.scale < a {
            let r = self.scale / a;
            self.ssq = 1.0 + self.ssq * r * r;
            self.scale = a;
        } else {
            let r = a / self.scale;
            self.ssq += r * r;
        }
    }

    /// The 2-norm, `scale * sqrt(ssq)`.
    fn norm(self) -> f64 {
        self.scale * self.ssq.sqrt()
    }
}

/// Compares an operator's output `got` with the reference `want`, element by element.
///
/// See the module documentation for the rules. `atol` and `rtol` only classify finite
/// positions as mismatches for the report (`|got - want| > atol + rtol * |want|`).
///
/// # Panics
/// If `got.len() != want.len()` (a harness bug, not a numerical failure).
pub fn compare(got: &[f64], want: &[f64], atol: f64, rtol: f64) -> Comparison {
    assert_eq!(
        got.len(),
        want.len(),
        "compare: got has {} elements, want has {}",
        got.len(),
        want.len()
    );

    let mut diff = SumSq::ZERO;
    let mut refn = SumSq::ZERO;
    let mut max_abs_err = 0.0f64;
    let mut max_abs_index = None;
    let mut nan_count = 0usize;
    let mut special_mismatches = 0usize;
    let mut mismatch_count = 0usize;
    let mut first_nonfinite = None;
    let mut mismatches = Vec::new();

    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let failed = if w.is_finite() {
            if g.is_finite() {
                let d = (g - w).abs();
                diff.add(d);
                refn.add(w);
                if d > max_abs_err {
                    max_abs_err = d;
                    max_abs_index = Some(i);
                }
                // A NaN tolerance (bad atol/rtol) reports every position rather than none.
                let tol = atol + rtol * w.abs();
                d > tol || tol.is_nan()
            } else {
                nan_count += 1;
                first_nonfinite.get_or_insert(i);
                true
            }
        } else {
            // w is ±inf or NaN: g must be the same special value.
            let ok = if w.is_nan() { g.is_nan() } else { g == w };
            if !ok {
                special_mismatches += 1;
                first_nonfinite.get_or_insert(i);
            }
            !ok
        };
        if failed {
            mismatch_count += 1;
            if mismatches.len() < MAX_REPORTED_MISMATCHES {
                mismatches.push(Mismatch {
                    index: i,
                    got: g,
                    want: w,
                });
            }
        }
    }

    let diff_norm = diff.norm();
    let ref_norm = refn.norm();
    let rel_l2 = if ref_norm == 0.0 {
        diff_norm
    } else {
        diff_norm / ref_norm
    };

    Comparison {
        n: got.len(),
        max_abs_err,
        rel_l2,
        nan_count,
        special_mismatches,
        mismatch_count,
        mismatches,
        worst_index: first_nonfinite.or(max_abs_index),
    }
}

/// Converts device elements to `f64` for [`compare`] (in parallel for large slices).
pub fn to_f64_vec<T: Element>(xs: &[T]) -> Vec<f64> {
    const PAR_MIN: usize = 1 << 16;
    if xs.len() >= PAR_MIN {
        xs.par_iter().map(|&x| x.to_f64()).collect()
    } else {
        xs.iter().map(|&x| x.to_f64()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    const INF: f64 = f64::INFINITY;
    const NAN: f64 = f64::NAN;

    #[test]
    fn identical_passes_with_zero_error() {
        let w = [1.0, -2.0, 3.5, 0.0];
        let c = compare(&w, &w, 0.0, 0.0);
        assert_eq!(c.n, 4);
        assert_eq!(c.rel_l2, 0.0);
        assert_eq!(c.max_abs_err, 0.0);
        assert_eq!(c.nan_count, 0);
        assert_eq!(c.mismatch_count, 0);
        assert!(c.mismatches.is_empty());
        assert_eq!(c.worst_index, None);
        assert!(c.passes(0.0));
        assert!(c.all_close());
    }

    #[test]
    fn empty_passes() {
        let c = compare(&[], &[], 0.0, 0.0);
        assert_eq!(c.n, 0);
        assert!(c.passes(1e-12));
    }

    #[test]
    fn rel_l2_and_max_abs_values() {
        // want = (3, 4), ||want|| = 5; diff = (0, 0.5) -> rel_l2 = 0.1.
        let c = compare(&[3.0, 4.5], &[3.0, 4.0], 0.0, 0.0);
        assert!((c.rel_l2 - 0.1).abs() < 1e-15, "{}", c.rel_l2);
        assert_eq!(c.max_abs_err, 0.5);
        assert_eq!(c.worst_index, Some(1));
        assert!(c.passes(0.1 + 1e-12));
        assert!(!c.passes(0.099));
    }

    #[test]
    fn zero_reference_uses_absolute_l2() {
        let c = compare(&[3e-7, 4e-7], &[0.0, 0.0], 0.0, 0.0);
        assert!((c.rel_l2 - 5e-7).abs() < 1e-20);
        assert!(c.passes(1e-6));
        assert!(!c.passes(1e-7));
    }

    #[test]
    fn nan_output_fails_even_with_huge_budget() {
        let c = compare(&[1.0, NAN, 3.0], &[1.0, 2.0, 3.0], 1.0, 1.0);
        assert_eq!(c.nan_count, 1);
        assert_eq!(c.worst_index, Some(1));
        assert_eq!(c.rel_l2, 0.0, "finite positions are exact");
        assert!(!c.passes(f64::MAX));
        assert_eq!(c.mismatches[0].index, 1);
    }

    #[test]
    fn inf_output_where_reference_finite_counts_as_nan() {
        let c = compare(&[INF, 2.0], &[1.0, 2.0], 0.0, 0.0);
        assert_eq!(c.nan_count, 1);
        assert!(!c.passes(1.0));
    }

    #[test]
    fn infinities_must_match_exactly() {
        let ok = compare(&[-INF, INF, 1.0], &[-INF, INF, 1.0], 0.0, 0.0);
        assert!(ok.passes(0.0), "{ok}");
        assert_eq!(ok.special_mismatches, 0);

        let wrong_sign = compare(&[INF, 1.0], &[-INF, 1.0], 0.0, 0.0);
        assert_eq!(wrong_sign.special_mismatches, 1);
        assert!(!wrong_sign.passes(1.0));

        let finite = compare(&[-1e300, 1.0], &[-INF, 1.0], 0.0, 0.0);
        assert_eq!(finite.special_mismatches, 1);
        assert!(!finite.passes(1.0));
        assert_eq!(finite.worst_index, Some(0));

        let nan = compare(&[NAN], &[-INF], 0.0, 0.0);
        assert!(!nan.passes(1.0));
    }

    #[test]
    fn nan_reference_requires_nan() {
        let ok = compare(&[NAN, 1.0], &[NAN, 1.0], 0.0, 0.0);
        assert!(ok.passes(0.0), "NaN propagation is intended: {ok}");
        assert_eq!(ok.nan_count, 0);

        let bad = compare(&[0.0, 1.0], &[NAN, 1.0], 0.0, 0.0);
        assert_eq!(bad.special_mismatches, 1);
        assert!(!bad.passes(1.0));
    }

    #[test]
    fn nan_rel_l2_fails() {
        let c = Comparison {
            n: 1,
            max_abs_err: 0.0,
            rel_l2: NAN,
            nan_count: 0,
            special_mismatches: 0,
            mismatch_count: 0,
            mismatches: vec![],
            worst_index: None,
        };
        assert!(!c.passes(f64::INFINITY));
    }

    #[test]
    fn tolerance_classifies_but_does_not_decide() {
        // |diff| = 1e-3 vs atol + rtol*|want| = 1e-4 + 1e-4*1 -> mismatch.
        let c = compare(&[1.001, 2.0], &[1.0, 2.0], 1e-4, 1e-4);
        assert_eq!(c.mismatch_count, 1);
        assert_eq!(
            c.mismatches,
            vec![Mismatch {
                index: 0,
                got: 1.001,
                want: 1.0
            }]
        );
        assert!(!c.all_close());
        assert!(c.passes(1e-3), "rel_l2 = {}", c.rel_l2);
        // Within tolerance: no mismatch.
        let c = compare(&[1.00001], &[1.0], 0.0, 1e-4);
        assert_eq!(c.mismatch_count, 0);
    }

    #[test]
    fn keeps_only_first_ten_mismatches() {
        let want = vec![0.0; 100];
        let got = vec![1.0; 100];
        let c = compare(&got, &want, 0.0, 0.0);
        assert_eq!(c.mismatch_count, 100);
        assert_eq!(c.mismatches.len(), MAX_REPORTED_MISMATCHES);
        let idx: Vec<usize> = c.mismatches.iter().map(|m| m.index).collect();
        assert_eq!(idx, (0..10).collect::<Vec<_>>());
        let s = c.to_string();
        assert!(s.contains("... and 90 more"), "{s}");
    }

    #[test]
    fn huge_and_tiny_values_do_not_overflow() {
        let want = [1e300, 1e300];
        let got = [1.0000001e300, 1e300];
        let c = compare(&got, &want, 0.0, 0.0);
        assert!(c.rel_l2.is_finite() && c.rel_l2 > 0.0);
        assert!((c.rel_l2 - 1e-7 / 2f64.sqrt()).abs() < 1e-12, "{}", c.rel_l2);

        let want = [1e-300, 1e-300];
        let got = [1.1e-300, 1e-300];
        let c = compare(&got, &want, 0.0, 0.0);
        assert!((c.rel_l2 - 0.1 / 2f64.sqrt()).abs() < 1e-12, "{}", c.rel_l2);
    }

    #[test]
    #[should_panic(expected = "compare")]
    fn length_mismatch_panics() {
        compare(&[1.0], &[1.0, 2.0], 0.0, 0.0);
    }

    #[test]
    fn display_mentions_key_fields() {
        let c = compare(&[1.5, NAN], &[1.0, 2.0], 0.0, 0.0);
        let s = c.to_string();
        for part in ["n=2", "rel_l2=", "max_abs=", "nan=1", "[0]", "[1]", "got=NaN"] {
            assert!(s.contains(part), "missing {part:?} in {s}");
        }
    }

    #[test]
    fn to_f64_vec_converts_all_element_types() {
        assert_eq!(to_f64_vec(&[1.5f32, -2.0]), vec![1.5, -2.0]);
        assert_eq!(to_f64_vec(&[1.5f64]), vec![1.5]);
        assert_eq!(to_f64_vec(&[f16::from_f32(0.5)]), vec![0.5]);
        assert_eq!(to_f64_vec(&[bf16::from_f32(-4.0)]), vec![-4.0]);
        assert!(to_f64_vec(&[f16::NAN])[0].is_nan());
        let big: Vec<f32> = (0..(1 << 17)).map(|i| i as f32).collect();
        let v = to_f64_vec(&big);
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as f64));
    }
}
