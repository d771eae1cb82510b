//! Seeded random sparse matrices of the structures SpMV/SpMM kernels must handle (uniform rows,
//! bands, power-law rows, empty rows, one dense row, a few long rows, tall least-squares
//! systems), and random dense vectors, for tests and benchmarks; and real 2-D parallel-beam
//! tomography system matrices ([`parallel_beam_projector`]) with the modified Shepp-Logan
//! phantom ([`shepp_logan`]) to image through them.
//!
//! # Determinism
//! A matrix depends only on `(class, rows, cols, seed)`. Rows are generated in chunks of
//! [`CHUNK_ROWS`], each from its own `StdRng` seeded from `(seed, chunk index)`, so the result
//! does not depend on the thread count or on whether rayon runs the chunks in parallel (it does
//! above [`PARALLEL_MIN_ROWS`] rows). Choices that concern the whole matrix (which row is dense,
//! which rows are long) come from a generator seeded with `seed` alone.
//!
//! # Values
//! Columns within each row are strictly increasing (`sorted == true`, no duplicates). Values
//! are uniform in `[-1, 1]` with magnitudes below [`SMALLEST_MAGNITUDE`] redrawn, so no stored
//! value is zero or tiny in any float type (integer value types would round them to 0 or ±1).
//!
//! Cost: O(nnz) expected, plus O(cols) for rows holding more than half of the columns.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Bernoulli, Distribution, Pareto};
use rayon::prelude::*;

use super::{CsrHost, SparseIndex};
use crate::dtype::Element;
use crate::error::{Error, Result};

/// Rows per independently seeded chunk.
pub const CHUNK_ROWS: usize = 4096;

/// Rows from which chunks are generated in parallel (the result is the same either way).
pub const PARALLEL_MIN_ROWS: usize = 1 << 16;

/// Values of smaller magnitude are redrawn.
pub const SMALLEST_MAGNITUDE: f64 = 1.0 / 64.0;

/// The power-law exponent that [`MatrixClass::name`] leaves out of the name.
pub const USUAL_POWER_LAW_EXPONENT: f64 = 2.0;

/// The structure of a generated matrix. Row lengths are capped at `cols`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MatrixClass {
    /// Every row has `per_row` entries at uniformly random columns.
    Uniform { per_row: usize },
    /// Row `r` holds columns `r - (diagonals - 1) / 2 ..= r + diagonals / 2` (clipped to the
    /// matrix): `diagonals` full diagonals around the main one.
    Banded { diagonals: usize },
    /// Row lengths follow a Pareto law with the given mean and tail exponent (> 1; smaller is
    /// heavier), rounded stochastically so the expected length is `mean`; random columns.
    PowerLaw { mean: f64, exponent: f64 },
    /// Each row is empty with probability `fraction`, else has `per_row` random columns.
    EmptyRows { fraction: f64, per_row: usize },
    /// One random row holds every column; the others have `per_row` random columns.
    OneDenseRow { per_row: usize },
    /// `long_rows` random rows (all rows if there are fewer) have `long_len` random columns,
    /// the others `short_len`.
    FewLongRows {
        long_rows: usize,
        long_len: usize,
        short_len: usize,
    },
    /// `per_row` random columns within a window of `4 * per_row` columns at a random place in
    /// each row, as in the tall systems of tomography or geodesy (meant for rows >> cols).
    TallLeastSquares { per_row: usize },
}

impl MatrixClass {
    /// A short stable name for reports and benchmark cases: `uniform16`, `banded9`,
    /// `powerlaw20` (`powerlaw20a1.5` for an exponent other than
    /// [`USUAL_POWER_LAW_EXPONENT`]), `emptyrows50_16` (percent empty, per_row), `denserow16`,
    /// `longrows4x10000_8` (long rows x long length, short length), `tallls12`.
    pub fn name(&self) -> String {
        match *self {
            MatrixClass::Uniform { per_row } => format!("uniform{per_row}"),
            MatrixClass::Banded { diagonals } => format!("banded{diagonals}"),
            MatrixClass::PowerLaw { mean, exponent } if exponent == USUAL_POWER_LAW_EXPONENT => {
                format!("powerlaw{mean}")
            }
            MatrixClass::PowerLaw { mean, exponent } => format!("powerlaw{mean}a{exponent}"),
            MatrixClass::EmptyRows { fraction, per_row } => format!("emptyrows{}_{per_row}", fraction * 100.0),
            MatrixClass::OneDenseRow { per_row } => format!("denserow{per_row}"),
            MatrixClass::FewLongRows {
                long_rows,
                long_len,
                short_len,
            } => format!("longrows{long_rows}x{long_len}_{short_len}"),
            MatrixClass::TallLeastSquares { per_row } => format!("tallls{per_row}"),
        }
    }

    /// Checks the class parameters (any size of matrix suits every class).
    pub fn validate(&self) -> Result<()> {
        match *self {
            MatrixClass::PowerLaw { mean, exponent } => {
                if !(mean.is_finite() && mean > 0.0) {
                    return Err(Error::invalid(
                        "class",
                        format!("PowerLaw mean {mean} must be finite and > 0"),
                    ));
                }
                if !(exponent.is_finite() && exponent > 1.0) {
                    return Err(Error::invalid(
                        "class",
                        format!("PowerLaw exponent {exponent} must be finite and > 1 (the mean is infinite otherwise)"),
                    ));
                }
            }
            MatrixClass::EmptyRows { fraction, .. } if !(0.0..=1.0).contains(&fraction) => {
                return Err(Error::invalid(
                    "class",
                    format!("EmptyRows fraction {fraction} must be in 0..=1"),
                ));
            }
            _ => {}
        }
        Ok(())
    }
}

/// A random `rows x cols` matrix of the given class (see the module documentation).
///
/// # Panics
/// If [`try_generate`] fails: invalid class parameters, or sizes that do not fit `I`.
pub fn generate<T: Element, I: SparseIndex>(class: MatrixClass, rows: usize, cols: usize, seed: u64) -> CsrHost<T, I> {
    try_generate(class, rows, cols, seed).unwrap_or_else(|e| panic!("generate {}: {e}", class.name()))
}

/// [`generate`], returning an error for invalid class parameters ([`MatrixClass::validate`])
/// or a matrix whose rows, columns or nonzeros do not fit `I`.
pub fn try_generate<T: Element, I: SparseIndex>(
    class: MatrixClass,
    rows: usize,
    cols: usize,
    seed: u64,
) -> Result<CsrHost<T, I>> {
    class.validate()?;
    for (arg, n) in [("rows", rows), ("cols", cols)] {
        if n > I::MAX_USIZE {
            return Err(Error::invalid(
                arg,
                format!(
                    "{n} does not fit the {} index type (at most {})",
                    I::DTYPE,
                    I::MAX_USIZE
                ),
            ));
        }
    }
    let layout = MatrixLayout::new(class, rows, seed);
    let chunk_count = rows.div_ceil(CHUNK_ROWS);
    let make = |chunk: usize| generate_chunk::<T, I>(&layout, chunk, rows, cols, seed);
    let chunks: Vec<Chunk<T, I>> = if rows >= PARALLEL_MIN_ROWS {
        (0..chunk_count).into_par_iter().map(make).collect()
    } else {
        (0..chunk_count).map(make).collect()
    };

    let nnz: usize = chunks.iter().map(|c| c.indices.len()).sum();
    if nnz > I::MAX_USIZE {
        return Err(Error::invalid(
            "class",
            format!(
                "the generated matrix has {nnz} nonzeros, more than the {} index type holds ({})",
                I::DTYPE,
                I::MAX_USIZE
            ),
        ));
    }
    Ok(concat_chunks(rows, cols, nnz, chunks, |i| i, |v| v))
}

/// `n` values uniform in `[-1, 1]` from `seed`.
pub fn random_vector(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-1.0..=1.0)).collect()
}

/// The whole-matrix choices of a class, drawn once from the seed.
struct MatrixLayout {
    class: MatrixClass,
    /// [`MatrixClass::OneDenseRow`]: the dense row.
    dense_row: Option<usize>,
    /// [`MatrixClass::FewLongRows`]: the long rows, sorted.
    long_rows: Vec<usize>,
}

impl MatrixLayout {
    fn new(class: MatrixClass, rows: usize, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut layout = MatrixLayout {
            class,
            dense_row: None,
            long_rows: Vec::new(),
        };
        match class {
            MatrixClass::OneDenseRow { .. } if rows > 0 => layout.dense_row = Some(rng.random_range(0..rows)),
            MatrixClass::FewLongRows { long_rows, .. } => {
                layout.long_rows = rand::seq::index::sample(&mut rng, rows, long_rows.min(rows)).into_vec();
                layout.long_rows.sort_unstable();
            }
            _ => {}
        }
        layout
    }
}

/// The rows of one chunk: their lengths, then their columns and values back to back.
struct Chunk<T, I> {
    row_lens: Vec<usize>,
    indices: Vec<I>,
    values: Vec<T>,
}

/// The sorted CSR matrix whose rows are the chunks' rows in order (`nnz` entries in all, checked
/// to fit `I` by the caller), each chunk's indices and values mapped by `index` and `value`.
fn concat_chunks<T: Element, I: SparseIndex, CT, CI>(
    rows: usize,
    cols: usize,
    nnz: usize,
    chunks: Vec<Chunk<CT, CI>>,
    index: impl Fn(CI) -> I,
    value: impl Fn(CT) -> T,
) -> CsrHost<T, I> {
    let mut offsets = Vec::with_capacity(rows + 1);
    let mut indices = Vec::with_capacity(nnz);
    let mut values = Vec::with_capacity(nnz);
    offsets.push(I::ZERO);
    let mut end = 0;
    for chunk in chunks {
        for len in chunk.row_lens {
            end += len;
            offsets.push(I::from_usize_in_range(end));
        }
        indices.extend(chunk.indices.into_iter().map(&index));
        values.extend(chunk.values.into_iter().map(&value));
    }
    CsrHost {
        rows,
        cols,
        offsets,
        indices,
        values,
        sorted: true,
    }
}

/// Mixes a 64-bit value (the SplitMix64 finaliser), to derive independent chunk seeds.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn generate_chunk<T: Element, I: SparseIndex>(
    layout: &MatrixLayout,
    chunk: usize,
    rows: usize,
    cols: usize,
    seed: u64,
) -> Chunk<T, I> {
    let mut rng = StdRng::seed_from_u64(mix(seed ^ mix(chunk as u64)));
    let row_range = chunk * CHUNK_ROWS..((chunk + 1) * CHUNK_ROWS).min(rows);
    let mut out = Chunk {
        row_lens: Vec::with_capacity(row_range.len()),
        indices: Vec::new(),
        values: Vec::new(),
    };
    let mut row_cols = Vec::new();
    for r in row_range {
        row_cols.clear();
        row_columns(layout, r, cols, &mut rng, &mut row_cols);
        out.row_lens.push(row_cols.len());
        out.indices.extend(row_cols.iter().map(|&c| I::from_usize_in_range(c)));
        out.values
            .extend(row_cols.iter().map(|_| T::from_f64(random_value(&mut rng))));
    }
    out
}

/// Appends the strictly increasing columns of row `r` to `out`.
fn row_columns(layout: &MatrixLayout, r: usize, cols: usize, rng: &mut StdRng, out: &mut Vec<usize>) {
    match layout.class {
        MatrixClass::Uniform { per_row } => distinct_columns(rng, per_row, 0..cols, out),
        MatrixClass::Banded { diagonals } => {
            if diagonals > 0 {
                let first = r.saturating_sub((diagonals - 1) / 2);
                let last = r.saturating_add(diagonals / 2).min(cols.saturating_sub(1));
                if cols > 0 && first <= last {
                    out.extend(first..=last);
                }
            }
        }
        MatrixClass::PowerLaw { mean, exponent } => {
            // Pareto(scale, shape) has mean scale * shape / (shape - 1)
            let scale = mean * (exponent - 1.0) / exponent;
            let pareto = Pareto::new(scale, exponent).expect("validated: scale > 0, exponent > 1");
            let length = pareto.sample(rng) + rng.random::<f64>();
            let len = if length >= cols as f64 { cols } else { length as usize };
            distinct_columns(rng, len, 0..cols, out);
        }
        MatrixClass::EmptyRows { fraction, per_row } => {
            let empty = Bernoulli::new(fraction).expect("validated: fraction in 0..=1");
            if !empty.sample(rng) {
                distinct_columns(rng, per_row, 0..cols, out);
            }
        }
        MatrixClass::OneDenseRow { per_row } => {
            let len = if layout.dense_row == Some(r) { cols } else { per_row };
            distinct_columns(rng, len, 0..cols, out);
        }
        MatrixClass::FewLongRows {
            long_len, short_len, ..
        } => {
            let len = if layout.long_rows.binary_search(&r).is_ok() {
                long_len
            } else {
                short_len
            };
            distinct_columns(rng, len, 0..cols, out);
        }
        MatrixClass::TallLeastSquares { per_row } => {
            let width = per_row.saturating_mul(4).min(cols);
            let start = if cols > width {
                rng.random_range(0..=cols - width)
            } else {
                0
            };
            distinct_columns(rng, per_row, start..start + width, out);
        }
    }
}

/// Appends `min(count, range.len())` distinct columns drawn uniformly from `range`, in
/// increasing order. Dense requests walk the range (selection sampling, O(range)); sparse ones
/// draw, sort and top up duplicates (O(count log count) expected).
fn distinct_columns(rng: &mut StdRng, count: usize, range: std::ops::Range<usize>, out: &mut Vec<usize>) {
    let span = range.len();
    let count = count.min(span);
    if count == 0 {
        return;
    }
    if count == span {
        out.extend(range);
        return;
    }
    if count * 2 >= span {
        // keep each column with probability (still needed) / (still available)
        let mut needed = count;
        for (seen, c) in range.clone().enumerate() {
            if rng.random_range(0..span - seen) < needed {
                out.push(c);
                needed -= 1;
                if needed == 0 {
                    break;
                }
            }
        }
        return;
    }
    let start = out.len();
    loop {
        while out.len() - start < count {
            out.push(rng.random_range(range.clone()));
        }
        out[start..].sort_unstable();
        let mut kept = start;
        for k in start..out.len() {
            if k == start || out[k] != out[kept - 1] {
                out[kept] = out[k];
                kept += 1;
            }
        }
        out.truncate(kept);
        if out.len() - start == count {
            return;
        }
    }
}

/// A value uniform in `[-1, 1]` with magnitude at least [`SMALLEST_MAGNITUDE`].
fn random_value(rng: &mut StdRng) -> f64 {
    loop {
        let v: f64 = rng.random_range(-1.0..=1.0);
        if v.abs() >= SMALLEST_MAGNITUDE {
            return v;
        }
    }
}

/// The structure of a random block-sparse matrix ([`generate_block_sparse`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockSparse {
    /// Side of the aligned square blocks that hold the nonzeros.
    pub block: usize,
    /// Probability that a block of a nonempty block row holds entries.
    pub density: f64,
    /// Probability that an entry of a chosen block is stored (1: full blocks).
    pub fill: f64,
    /// Probability that a whole block row is empty.
    pub empty_block_rows: f64,
}

impl BlockSparse {
    /// `block16_d0.1_f1` (plus `_e0.2` when some block rows are empty).
    pub fn name(&self) -> String {
        let mut s = format!("block{}_d{}_f{}", self.block, self.density, self.fill);
        if self.empty_block_rows > 0.0 {
            s.push_str(&format!("_e{}", self.empty_block_rows));
        }
        s
    }
}

/// A random `rows x cols` CSR matrix whose entries lie in aligned `block x block` blocks (the
/// last block row and column cut at the matrix's edge), each block present with probability
/// `density`, each of its entries with probability `fill` (a present block keeps at least one
/// entry), block rows empty with probability `empty_block_rows`. Sorted, no duplicates, values
/// as [`generate`]'s. Depends only on (structure, rows, cols, seed).
pub fn generate_block_sparse<T: Element, I: SparseIndex>(
    s: BlockSparse,
    rows: usize,
    cols: usize,
    seed: u64,
) -> Result<CsrHost<T, I>> {
    for (what, p) in [
        ("density", s.density),
        ("fill", s.fill),
        ("empty_block_rows", s.empty_block_rows),
    ] {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::invalid("structure", format!("{what} {p} must be in 0..=1")));
        }
    }
    if s.block == 0 {
        return Err(Error::invalid("structure", "block must be positive"));
    }
    let b = s.block;
    let block_rows = rows.div_ceil(b);
    let block_cols = cols.div_ceil(b);
    let rows_of: Vec<Vec<(usize, f64)>> = (0..block_rows)
        .into_par_iter()
        .flat_map_iter(|br| {
            let mut rng = StdRng::seed_from_u64(seed ^ (br as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let height = b.min(rows - br * b);
            let mut out: Vec<Vec<(usize, f64)>> = vec![Vec::new(); height];
            if rng.random_bool(s.empty_block_rows) {
                return out;
            }
            for bc in 0..block_cols {
                if !rng.random_bool(s.density) {
                    continue;
                }
                let width = b.min(cols - bc * b);
                let mut any = false;
                for (i, row) in out.iter_mut().enumerate() {
                    for j in 0..width {
                        let last = i + 1 == height && j + 1 == width;
                        if rng.random_bool(s.fill) || (last && !any) {
                            any = true;
                            row.push((bc * b + j, random_value(&mut rng)));
                        }
                    }
                }
            }
            out
        })
        .collect();
    let nnz: usize = rows_of.iter().map(|r| r.len()).sum();
    super::host::check_sizes::<I>(rows, cols, nnz)?;
    let mut offsets = Vec::with_capacity(rows + 1);
    let mut indices = Vec::with_capacity(nnz);
    let mut values = Vec::with_capacity(nnz);
    offsets.push(I::ZERO);
    for row in rows_of {
        for (c, v) in row {
            indices.push(I::from_usize_in_range(c));
            values.push(T::from_f64(v));
        }
        offsets.push(I::from_usize_in_range(indices.len()));
    }
    Ok(CsrHost {
        rows,
        cols,
        offsets,
        indices,
        values,
        sorted: true,
    })
}

// ---- tomography: 2-D parallel-beam system matrices and the Shepp-Logan phantom ----

/// Segments shorter than this (in pixel widths) are dropped by [`parallel_beam_projector`]:
/// they are the rounding residue of a ray through a pixel corner (the crossing parameters
/// carry errors of about `n * 2^-52`, far below it for any image that fits an index type).
pub const TOMOGRAPHY_MIN_SEGMENT: f64 = 1e-10;

/// A 2-D parallel-beam scan geometry (the one of astra-toolbox's `parallel` geometry with a
/// square volume of unit pixels).
///
/// * Image: `n x n` pixels of side 1 covering `[-n/2, n/2]^2`, centred at the origin; pixel
///   `(i, j)` (row `i` from the top, column `j` from the left) is column `i * n + j` of the
///   matrix (row-major) and covers `x in [j - n/2, j + 1 - n/2)`, `y in (n/2 - i - 1, n/2 - i]`.
/// * Angles: `theta_k = k * pi / angles`, `k = 0 .. angles` (equally spaced in `[0, pi)`).
/// * Detector: `detectors` bins of width `det_width`; bin `m` has its centre at offset
///   `u_m = (m - (detectors - 1) / 2) * det_width` along `e = (cos theta, sin theta)`.
/// * Ray `(k, m)` is the line `{p : p . e = u_m}` (direction `(-sin theta, cos theta)`); at
///   `theta = 0` it is the vertical line `x = u_m`, at `pi / 2` the horizontal `y = u_m`.
///   It is row `k * detectors + m` of the matrix (angle-major).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ParallelBeam {
    /// Image side in pixels.
    pub n: usize,
    /// Number of projection angles.
    pub angles: usize,
    /// Number of detector bins per angle.
    pub detectors: usize,
    /// Width of a detector bin in pixel widths (default 1).
    pub det_width: f64,
}

impl ParallelBeam {
    /// `n x n` pixels, `angles` angles, `detectors` bins of width 1.
    pub fn new(n: usize, angles: usize, detectors: usize) -> Self {
        ParallelBeam {
            n,
            angles,
            detectors,
            det_width: 1.0,
        }
    }

    /// `tomo256_180x363` (image side, angles x detectors; `_w0.5` appended for a detector
    /// width other than 1).
    pub fn name(&self) -> String {
        let mut s = format!("tomo{}_{}x{}", self.n, self.angles, self.detectors);
        if self.det_width != 1.0 {
            s.push_str(&format!("_w{}", self.det_width));
        }
        s
    }

    /// Rays: `angles * detectors` (saturating; [`ParallelBeam::validate`] rejects overflow).
    pub fn rows(&self) -> usize {
        self.angles.saturating_mul(self.detectors)
    }

    /// Pixels: `n * n` (saturating; [`ParallelBeam::validate`] rejects overflow).
    pub fn cols(&self) -> usize {
        self.n.saturating_mul(self.n)
    }

    /// `(cos theta_k, sin theta_k)`, with the rounding residue of `cos(pi / 2)` (6e-17) set
    /// to 0 so that axis-aligned rays are exactly axis-aligned.
    pub fn direction(&self, k: usize) -> (f64, f64) {
        let theta = k as f64 * std::f64::consts::PI / self.angles as f64;
        let snap = |v: f64| if v.abs() < 1e-15 { 0.0 } else { v };
        (snap(theta.cos()), snap(theta.sin()))
    }

    /// The detector offset `u_m` of bin `m`.
    pub fn offset(&self, m: usize) -> f64 {
        (m as f64 - (self.detectors as f64 - 1.0) / 2.0) * self.det_width
    }

    /// `det_width` must be finite and positive, and `angles * detectors` and `n * n` must not
    /// overflow. Zero pixels, angles or detectors are allowed (an empty matrix).
    pub fn validate(&self) -> Result<()> {
        if !(self.det_width.is_finite() && self.det_width > 0.0) {
            return Err(Error::invalid(
                "geometry",
                format!("det_width {} must be finite and > 0", self.det_width),
            ));
        }
        if self.angles.checked_mul(self.detectors).is_none() || self.n.checked_mul(self.n).is_none() {
            return Err(Error::invalid(
                "geometry",
                format!(
                    "{} angles x {} detectors or {}^2 pixels overflow usize",
                    self.angles, self.detectors, self.n
                ),
            ));
        }
        Ok(())
    }
}

/// The system matrix of a 2-D parallel-beam scan: `A[ray, pixel]` = the length of the
/// intersection of the ray (the line through the detector bin's centre, [`ParallelBeam`]) with
/// the pixel, computed exactly by Siddon's method (the ray clipped to the image square, then
/// cut at every pixel boundary line it crosses; each piece belongs to the pixel holding its
/// midpoint). This is what astra-toolbox's `line` projector computes for parallel beams.
///
/// Pixels are half-open as [`ParallelBeam`] says, so a ray lying exactly on a pixel boundary
/// (axis-aligned rays when `n` and `det_width` put bin centres on the grid) counts for the
/// pixels on its right (`theta = 0`) or above it (`theta = pi / 2`), with length 1 each, and a
/// ray on the image's right or bottom edge hits nothing. Pieces shorter than
/// [`TOMOGRAPHY_MIN_SEGMENT`] are dropped (corner-crossing residue).
///
/// `(angles * detectors) x n^2`, rows angle-major, sorted columns without duplicates, values
/// in `(0, sqrt 2]`. Deterministic: each angle's rows are computed alone (in parallel by rayon)
/// and concatenated in order. Cost: O(rays * n) (about 2 n entries per ray at most).
///
/// Errors: an invalid geometry ([`ParallelBeam::validate`]) or rows, columns or nonzeros that
/// do not fit `I`.
pub fn parallel_beam_projector<T: Element, I: SparseIndex>(g: &ParallelBeam) -> Result<CsrHost<T, I>> {
    g.validate()?;
    let (rows, cols) = (g.rows(), g.cols());
    super::host::check_sizes::<I>(rows, cols, 0)?;
    let per_angle: Vec<Chunk<f64, usize>> = (0..g.angles)
        .into_par_iter()
        .map(|k| {
            let mut out = Chunk {
                row_lens: Vec::with_capacity(g.detectors),
                indices: Vec::new(),
                values: Vec::new(),
            };
            let mut ray = Vec::new();
            for m in 0..g.detectors {
                ray_pixels(g, k, m, &mut ray);
                out.row_lens.push(ray.len());
                out.indices.extend(ray.iter().map(|&(c, _)| c));
                out.values.extend(ray.iter().map(|&(_, v)| v));
            }
            out
        })
        .collect();
    let nnz: usize = per_angle.iter().map(|c| c.indices.len()).sum();
    super::host::check_sizes::<I>(rows, cols, nnz)?;
    Ok(concat_chunks(
        rows,
        cols,
        nnz,
        per_angle,
        I::from_usize_in_range,
        T::from_f64,
    ))
}

/// The parameter interval `[t0, t1)` over which the coordinate `p + t * d` lies in the
/// half-open `[-h, h)`; `None` if empty. An axis-parallel ray (`d == 0`) is in for every `t`
/// or for none.
fn slab(p: f64, d: f64, h: f64) -> Option<(f64, f64)> {
    if d == 0.0 {
        return (-h <= p && p < h).then_some((f64::NEG_INFINITY, f64::INFINITY));
    }
    let (a, b) = ((-h - p) / d, (h - p) / d);
    Some((a.min(b), a.max(b)))
}

/// The parameters `t` in `(t0, t1)`, increasing, at which `p + t * d` crosses the interior
/// grid lines `-h + j` (`j = 1 .. n`), appended to `out`.
fn crossings(p: f64, d: f64, h: f64, n: usize, (t0, t1): (f64, f64), out: &mut Vec<f64>) {
    if d == 0.0 || n < 2 {
        return;
    }
    // the grid lines between the coordinates at t0 and t1 (one more each side for rounding)
    let (c0, c1) = (p + t0 * d + h, p + t1 * d + h);
    let lo = (c0.min(c1).floor() as i64).max(1) as usize;
    let hi = ((c0.max(c1).ceil() as i64).max(0) as usize).min(n - 1);
    let start = out.len();
    for j in lo..=hi {
        let t = (j as f64 - h - p) / d;
        if t0 < t && t < t1 {
            out.push(t);
        }
    }
    if d < 0.0 {
        out[start..].reverse();
    }
}

/// The `(pixel, length)` entries of ray `(k, m)`, sorted by pixel, into `out` (cleared).
fn ray_pixels(g: &ParallelBeam, k: usize, m: usize, out: &mut Vec<(usize, f64)>) {
    out.clear();
    let n = g.n;
    if n == 0 {
        return;
    }
    let h = n as f64 / 2.0;
    let (c, s) = g.direction(k);
    let u = g.offset(m);
    let (px, py) = (u * c, u * s);
    let (dx, dy) = (-s, c);
    let (Some(sx), Some(sy)) = (slab(px, dx, h), slab(py, dy, h)) else {
        return;
    };
    let (t0, t1) = (sx.0.max(sy.0), sx.1.min(sy.1));
    if t0 >= t1 {
        return;
    }
    // the crossings of vertical and horizontal grid lines, each increasing, merged
    let mut tx = Vec::with_capacity(n);
    let mut ty = Vec::with_capacity(n);
    crossings(px, dx, h, n, (t0, t1), &mut tx);
    crossings(py, dy, h, n, (t0, t1), &mut ty);
    let (mut i, mut j) = (0, 0);
    let mut prev = t0;
    loop {
        let next = match (tx.get(i), ty.get(j)) {
            (Some(&a), Some(&b)) if a <= b => {
                i += 1;
                a
            }
            (_, Some(&b)) => {
                j += 1;
                b
            }
            (Some(&a), None) => {
                i += 1;
                a
            }
            (None, None) => t1,
        };
        let len = next - prev;
        if len >= TOMOGRAPHY_MIN_SEGMENT {
            let mid = 0.5 * (prev + next);
            let cell = |v: f64| ((v + h).floor().max(0.0) as usize).min(n - 1);
            let col = cell(px + mid * dx);
            let row = n - 1 - cell(py + mid * dy);
            out.push((row * n + col, len));
        }
        prev = next;
        if next == t1 {
            break;
        }
    }
    // one piece per pixel unless rounding split one; order by pixel and merge
    out.sort_unstable_by_key(|&(p, _)| p);
    let mut kept = 0;
    for e in 0..out.len() {
        if kept > 0 && out[kept - 1].0 == out[e].0 {
            out[kept - 1].1 += out[e].1;
        } else {
            out[kept] = out[e];
            kept += 1;
        }
    }
    out.truncate(kept);
}

/// One ellipse of the phantom: intensity, semi-axes `a` (along x before rotation) and `b`,
/// centre `(x0, y0)`, rotation `phi` in degrees (counter-clockwise), in the unit square
/// `[-1, 1]^2` with y pointing up.
struct Ellipse {
    intensity: f64,
    a: f64,
    b: f64,
    x0: f64,
    y0: f64,
    phi_deg: f64,
}

/// The modified Shepp-Logan phantom: the ellipses of Shepp and Logan (IEEE Trans. Nucl. Sci.
/// 21, 1974) with the higher-contrast intensities of Toft (1996), as commonly tabulated.
const SHEPP_LOGAN_MODIFIED: [Ellipse; 10] = {
    const fn e(intensity: f64, a: f64, b: f64, x0: f64, y0: f64, phi_deg: f64) -> Ellipse {
        Ellipse {
            intensity,
            a,
            b,
            x0,
            y0,
            phi_deg,
        }
    }
    [
        e(1.0, 0.69, 0.92, 0.0, 0.0, 0.0),
        e(-0.8, 0.6624, 0.874, 0.0, -0.0184, 0.0),
        e(-0.2, 0.11, 0.31, 0.22, 0.0, -18.0),
        e(-0.2, 0.16, 0.41, -0.22, 0.0, 18.0),
        e(0.1, 0.21, 0.25, 0.0, 0.35, 0.0),
        e(0.1, 0.046, 0.046, 0.0, 0.1, 0.0),
        e(0.1, 0.046, 0.046, 0.0, -0.1, 0.0),
        e(0.1, 0.046, 0.023, -0.08, -0.605, 0.0),
        e(0.1, 0.023, 0.023, 0.0, -0.606, 0.0),
        e(0.1, 0.023, 0.046, 0.06, -0.605, 0.0),
    ]
};

/// The modified Shepp-Logan phantom at `(x, y)` in `[-1, 1]^2` (y up): the sum of the
/// intensities of the ellipses holding the point (boundary included). Values lie in `[0, 1]`.
pub fn shepp_logan_at(x: f64, y: f64) -> f64 {
    SHEPP_LOGAN_MODIFIED
        .iter()
        .filter(|e| {
            let (sin, cos) = e.phi_deg.to_radians().sin_cos();
            let (dx, dy) = (x - e.x0, y - e.y0);
            let (along, across) = (dx * cos + dy * sin, -dx * sin + dy * cos);
            (along / e.a).powi(2) + (across / e.b).powi(2) <= 1.0
        })
        .map(|e| e.intensity)
        .sum()
}

/// The modified Shepp-Logan phantom sampled at the pixel centres of an `n x n` image
/// (row-major, row 0 at the top: the pixel order of [`parallel_beam_projector`]'s columns),
/// the image square mapped onto `[-1, 1]^2`.
pub fn shepp_logan(n: usize) -> Vec<f64> {
    let centre = |k: usize| (2.0 * k as f64 + 1.0) / n as f64 - 1.0;
    (0..n)
        .flat_map(|i| (0..n).map(move |j| shepp_logan_at(centre(j), -centre(i))))
        .collect()
}
