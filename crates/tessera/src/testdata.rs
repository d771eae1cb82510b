//! Seeded random test inputs and poisoned output buffers (DESIGN.md "Numerics").
//!
//! Every check draws fresh inputs from a seed that the caller prints
//! ([`seed_from_env_or_time`]); rerunning with `TESSERA_SEED=<seed>` reproduces them exactly.
//! Inputs are never all zeros, and output buffers are filled with NaN ([`poison`]) before a
//! kernel runs so that elements it fails to write make the comparison fail.
//!
//! # Determinism
//! Values come from a small counter-seeded generator (SplitMix64) defined here, with normal
//! variates from `rand_distr::StandardNormal`. Element `(r, c)` of [`random_matrix`] depends
//! only on `(seed, r, c, dist)`: not on the thread count, not on `stride`, and not on `rows`
//! or on `cols` beyond `c`'s block of [`BLOCK`] columns. Each block of a row has its own stream
//! seeded from `(seed, row, block)`, which lets both many short rows and a few very long rows
//! be generated in parallel with rayon.

use rand::RngCore;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;

use crate::dtype::Element;

/// Environment variable that fixes the seed of [`seed_from_env_or_time`].
pub const SEED_ENV: &str = "TESSERA_SEED";

/// Columns per independently seeded random stream within a row of [`random_matrix`].
pub const BLOCK: usize = 4096;

/// Below this many elements [`random_matrix`] runs on the calling thread (same values).
const PAR_MIN: usize = 1 << 15;

/// The seed for this run: `TESSERA_SEED` if set (decimal, or hex with a `0x` prefix),
/// otherwise derived from the current time. Callers print it so a failure can be replayed.
///
/// A `TESSERA_SEED` that is not a `u64` is an error: silently ignoring a seed the user asked
/// for would make a reported failure irreproducible.
pub fn seed_from_env_or_time() -> crate::Result<u64> {
    match std::env::var(SEED_ENV) {
        Ok(s) => parse_seed(&s).ok_or_else(|| {
            crate::Error::invalid(
                "TESSERA_SEED",
                format!("{s:?} is not a u64 (decimal or 0x-prefixed hex)"),
            )
        }),
        Err(_) => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            Ok(mix(nanos ^ (std::process::id() as u64).rotate_left(32)))
        }
    }
}

fn parse_seed(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// The distribution of [`random_matrix`] values (before rounding to the storage dtype).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Dist {
    /// Normal with mean 0 and standard deviation `std`.
    Normal { std: f64 },
    /// Uniform on `[lo, hi)`.
    Uniform { lo: f64, hi: f64 },
    /// Normal with mean 0 and standard deviation `std`, where about 1% of the values are
    /// multiplied by 20: rows have a few dominant entries, so a softmax over them is far from
    /// uniform and errors in the max/rescale logic show up.
    WithOutliers { std: f64 },
}

impl Dist {
    /// Probability that [`Dist::WithOutliers`] makes a value an outlier.
    pub const OUTLIER_PROB: f64 = 0.01;
    /// Factor applied to an outlier of [`Dist::WithOutliers`].
    pub const OUTLIER_FACTOR: f64 = 20.0;

    fn validate(self) {
        match self {
            Dist::Normal { std } | Dist::WithOutliers { std } => {
                assert!(
                    std.is_finite() && std > 0.0,
                    "Dist std must be finite and > 0, got {std}"
                )
            }
            Dist::Uniform { lo, hi } => assert!(
                lo.is_finite() && hi.is_finite() && lo < hi,
                "Dist::Uniform needs finite lo < hi, got [{lo}, {hi})"
            ),
        }
    }

    fn sample(self, rng: &mut SplitMix64) -> f64 {
        match self {
            Dist::Normal { std } => {
                let z: f64 = StandardNormal.sample(rng);
                std * z
            }
            Dist::Uniform { lo, hi } => lo + (hi - lo) * unit_f64(rng),
            Dist::WithOutliers { std } => {
                let z: f64 = StandardNormal.sample(rng);
                let x = std * z;
                if unit_f64(rng) < Self::OUTLIER_PROB {
                    x * Self::OUTLIER_FACTOR
                } else {
                    x
                }
            }
        }
    }
}

/// A row-major `rows x cols` matrix with row pitch `stride`, as `rows * stride` elements.
///
/// Elements `(r, c)` for `c < cols` are drawn from `dist` and rounded to `T`
/// (large `std` can round to ±inf in f16; choose `dist` for the dtype).
/// **Padding columns `cols..stride` hold NaN**, so a kernel that reads padding produces NaN and
/// its verification fails. The values are deterministic in `seed` (see the module docs) and are
/// generated in parallel for large sizes.
///
/// # Panics
/// If `stride < cols`, if `rows * stride` overflows `usize`, or if `dist` has a non-finite or
/// non-positive `std` or an empty/non-finite uniform range.
pub fn random_matrix<T: Element>(seed: u64, rows: usize, cols: usize, stride: usize, dist: Dist) -> Vec<T> {
    assert!(stride >= cols, "random_matrix: stride {stride} < cols {cols}");
    dist.validate();
    let len = rows
        .checked_mul(stride)
        .expect("random_matrix: rows * stride overflows usize");
    let pad = T::from_f64(f64::NAN);
    let mut out = vec![pad; len];
    if len == 0 || cols == 0 {
        return out;
    }
    let seed = mix(seed);
    let fill_block = |row: usize, block: usize, dst: &mut [T]| {
        let mut rng = SplitMix64::new(seed, row as u64, block as u64);
        for x in dst {
            *x = T::from_f64(dist.sample(&mut rng));
        }
    };
    if len < PAR_MIN {
        for (r, row) in out.chunks_mut(stride).enumerate() {
            for (b, blk) in row[..cols].chunks_mut(BLOCK).enumerate() {
                fill_block(r, b, blk);
            }
        }
    } else {
        // Short rows are batched so each task fills at least ~BLOCK elements; long rows are
        // split into their blocks. Either way every block uses its own (seed, row, block) stream.
        let rows_per_task = (BLOCK / stride).max(1);
        out.par_chunks_mut(stride)
            .enumerate()
            .with_min_len(rows_per_task)
            .for_each(|(r, row)| {
                if cols <= BLOCK {
                    fill_block(r, 0, &mut row[..cols]);
                } else {
                    row[..cols]
                        .par_chunks_mut(BLOCK)
                        .enumerate()
                        .for_each(|(b, blk)| fill_block(r, b, blk));
                }
            });
    }
    out
}

/// A buffer of `n` NaNs in `T` (f32/f64/f16/bf16 NaN), to poison outputs before a kernel runs:
/// any element the kernel does not write stays NaN and fails [`crate::check::compare`].
pub fn poison<T: Element>(n: usize) -> Vec<T> {
    vec![T::from_f64(f64::NAN); n]
}

/// Sets the `cols` logical elements of row `row` of a matrix with pitch `stride` to `value`
/// (rounded to `T`), leaving padding untouched. Used to plant special rows, e.g. an all `-inf`
/// row (fully masked) or a NaN row. To plant a single special element, index directly:
/// `buf[row * stride + col] = T::from_f64(f64::NAN)`.
///
/// # Panics
/// If `stride < cols` or the row does not fit in `buf`.
pub fn set_row<T: Element>(buf: &mut [T], row: usize, cols: usize, stride: usize, value: f64) {
    assert!(stride >= cols, "set_row: stride {stride} < cols {cols}");
    let start = row.checked_mul(stride).expect("set_row: row * stride overflows usize");
    let end = start.checked_add(cols).expect("set_row: row end overflows usize");
    assert!(
        end <= buf.len(),
        "set_row: row {row} (elements {start}..{end}) is outside a buffer of {}",
        buf.len()
    );
    buf[start..end].fill(T::from_f64(value));
}

/// SplitMix64 finalizer: a bijective 64-bit mixer.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform `f64` in `[0, 1)` from the top 53 bits.
fn unit_f64(rng: &mut SplitMix64) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, statistically adequate for test data,
/// and defined here so streams do not change with `rand`'s choice of `StdRng`/`SmallRng`.
struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

    /// A stream for `(seed, row, block)`; `seed` should already be mixed.
    fn new(seed: u64, row: u64, block: u64) -> Self {
        SplitMix64 {
            state: mix(mix(seed ^ mix(row)) ^ block.wrapping_mul(Self::GAMMA)),
        }
    }
}

impl RngCore for SplitMix64 {
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(Self::GAMMA);
        mix(self.state)
    }
    fn fill_bytes(&mut self, dst: &mut [u8]) {
        for chunk in dst.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    #[test]
    fn deterministic_per_seed_and_different_across_seeds() {
        let a: Vec<f32> = random_matrix(7, 33, 100, 100, Dist::Normal { std: 1.0 });
        let b: Vec<f32> = random_matrix(7, 33, 100, 100, Dist::Normal { std: 1.0 });
        let c: Vec<f32> = random_matrix(8, 33, 100, 100, Dist::Normal { std: 1.0 });
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn rows_differ() {
        let a: Vec<f64> = random_matrix(1, 2, 64, 64, Dist::Normal { std: 1.0 });
        assert_ne!(a[..64], a[64..]);
    }

    #[test]
    fn padding_is_nan_and_values_are_independent_of_stride() {
        let (rows, cols) = (5, 37);
        let tight: Vec<f32> = random_matrix(3, rows, cols, cols, Dist::Uniform { lo: -1.0, hi: 1.0 });
        let padded: Vec<f32> = random_matrix(3, rows, cols, 48, Dist::Uniform { lo: -1.0, hi: 1.0 });
        assert_eq!(padded.len(), rows * 48);
        for r in 0..rows {
            assert_eq!(tight[r * cols..(r + 1) * cols], padded[r * 48..r * 48 + cols]);
            assert!(padded[r * 48 + cols..(r + 1) * 48].iter().all(|x| x.is_nan()));
            assert!(tight[r * cols..(r + 1) * cols].iter().all(|x| x.is_finite()));
        }
    }

    #[test]
    fn parallel_and_serial_paths_agree() {
        // 8 x 5000 = 40000 >= PAR_MIN takes the parallel path, and 5000 > BLOCK splits rows;
        // the first 8 rows of a larger matrix and of a small one must coincide.
        let big: Vec<f32> = random_matrix(11, 8, 5000, 5000, Dist::Normal { std: 1.0 });
        let small: Vec<f32> = random_matrix(11, 1, 5000, 5000, Dist::Normal { std: 1.0 });
        const { assert!(8 * 5000 >= PAR_MIN && 5000 < PAR_MIN) };
        assert_eq!(big[..5000], small[..]);
        // Prefix property across cols within the first block.
        let narrow: Vec<f32> = random_matrix(11, 1, 100, 100, Dist::Normal { std: 1.0 });
        assert_eq!(narrow[..], small[..100]);
    }

    #[test]
    fn never_all_zero_and_moments_are_plausible() {
        let n = 1 << 16;
        let x: Vec<f64> = random_matrix(5, 1, n, n, Dist::Normal { std: 2.0 });
        let mean = x.iter().sum::<f64>() / n as f64;
        let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.05, "mean {mean}");
        assert!((var.sqrt() - 2.0).abs() < 0.05, "std {}", var.sqrt());
        assert!(x.iter().filter(|&&v| v == 0.0).count() < 2);

        let u: Vec<f64> = random_matrix(5, 1, n, n, Dist::Uniform { lo: 2.0, hi: 3.0 });
        assert!(u.iter().all(|&v| (2.0..3.0).contains(&v)));
        let um = u.iter().sum::<f64>() / n as f64;
        assert!((um - 2.5).abs() < 0.01, "uniform mean {um}");
    }

    #[test]
    fn outliers_are_about_one_percent() {
        let n = 1 << 17;
        let x: Vec<f64> = random_matrix(9, 4, n / 4, n / 4, Dist::WithOutliers { std: 1.0 });
        // |N(0,1)| > 6 essentially never happens; a 20x outlier exceeds 6 with prob ~0.77.
        let big = x.iter().filter(|v| v.abs() > 6.0).count() as f64 / n as f64;
        assert!(big > 0.004 && big < 0.012, "outlier fraction {big}");
        assert!(x.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn half_types_are_finite_and_nonzero() {
        let h: Vec<f16> = random_matrix(2, 16, 100, 128, Dist::WithOutliers { std: 1.0 });
        let b: Vec<bf16> = random_matrix(2, 16, 100, 128, Dist::Normal { std: 1.0 });
        for r in 0..16 {
            assert!(h[r * 128..r * 128 + 100].iter().all(|x| x.is_finite()));
            assert!(h[r * 128 + 100..(r + 1) * 128].iter().all(|x| x.is_nan()));
            assert!(b[r * 128..r * 128 + 100].iter().any(|x| x.to_f32() != 0.0));
        }
    }

    #[test]
    fn empty_shapes() {
        assert!(random_matrix::<f32>(1, 0, 10, 10, Dist::Normal { std: 1.0 }).is_empty());
        assert!(random_matrix::<f32>(1, 10, 0, 0, Dist::Normal { std: 1.0 }).is_empty());
        let pad_only = random_matrix::<f32>(1, 2, 0, 3, Dist::Normal { std: 1.0 });
        assert_eq!(pad_only.len(), 6);
        assert!(pad_only.iter().all(|x| x.is_nan()));
    }

    #[test]
    #[should_panic(expected = "stride")]
    fn stride_smaller_than_cols_panics() {
        random_matrix::<f32>(1, 2, 10, 9, Dist::Normal { std: 1.0 });
    }

    #[test]
    #[should_panic(expected = "std")]
    fn bad_dist_panics() {
        random_matrix::<f32>(1, 2, 10, 10, Dist::Normal { std: 0.0 });
    }

    #[test]
    fn poison_is_nan_for_every_type() {
        assert!(poison::<f32>(5).iter().all(|x| x.is_nan()));
        assert!(poison::<f64>(5).iter().all(|x| x.is_nan()));
        assert!(poison::<f16>(5).iter().all(|x| x.is_nan()));
        assert!(poison::<bf16>(5).iter().all(|x| x.is_nan()));
        assert_eq!(poison::<f32>(7).len(), 7);
    }

    #[test]
    fn set_row_plants_values_and_keeps_padding() {
        let mut m: Vec<f32> = random_matrix(4, 3, 5, 8, Dist::Normal { std: 1.0 });
        let before = m.clone();
        set_row(&mut m, 1, 5, 8, f64::NEG_INFINITY);
        assert!(m[8..13].iter().all(|&x| x == f32::NEG_INFINITY));
        assert!(m[13..16].iter().all(|x| x.is_nan()));
        // Other rows' logical elements are untouched (padding is NaN, which never compares equal).
        assert_eq!(m[..5], before[..5]);
        assert_eq!(m[16..21], before[16..21]);
        set_row(&mut m, 2, 5, 8, f64::NAN);
        assert!(m[16..21].iter().all(|x| x.is_nan()));
        // Last row of a tightly sized buffer (no trailing padding) is in bounds.
        let mut t = vec![0.0f32; 2 * 8 - 3];
        set_row(&mut t, 1, 5, 8, 1.0);
        assert_eq!(t[8..13], [1.0; 5]);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn set_row_out_of_bounds_panics() {
        let mut m = vec![0.0f32; 16];
        set_row(&mut m, 2, 5, 8, 0.0);
    }

    #[test]
    fn parse_seed_forms() {
        assert_eq!(parse_seed("42"), Some(42));
        assert_eq!(parse_seed(" 0x2A "), Some(42));
        assert_eq!(parse_seed("0XfF"), Some(255));
        assert_eq!(parse_seed("abc"), None);
        assert_eq!(parse_seed("-1"), None);
    }

    #[test]
    fn large_matrix_is_filled_and_deterministic() {
        // 2^24 elements through the parallel path: every logical element finite, and the same
        // seed gives the same values whatever the thread scheduling.
        let a: Vec<f32> = random_matrix(1, 1 << 12, 1 << 12, 1 << 12, Dist::WithOutliers { std: 1.0 });
        assert_eq!(a.len(), 1 << 24);
        assert!(a.iter().all(|v| v.is_finite()));
        let b: Vec<f32> = random_matrix(1, 1 << 12, 1 << 12, 1 << 12, Dist::WithOutliers { std: 1.0 });
        assert!(a == b);
    }
}
