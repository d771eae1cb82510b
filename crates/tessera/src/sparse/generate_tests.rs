//! Tests of the random matrix generator: determinism, the structure each class promises, the
//! value range, and chunk seeding that does not depend on the matrix size or the threads.

use super::generate::*;
use super::*;
use crate::error::Error;

const SEED: u64 = 0x05ee_d0f5_a25e;

/// Every class with small parameters, for sweeps.
pub(super) fn all_classes() -> Vec<MatrixClass> {
    vec![
        MatrixClass::Uniform { per_row: 5 },
        MatrixClass::Banded { diagonals: 5 },
        MatrixClass::PowerLaw {
            mean: 4.0,
            exponent: 1.8,
        },
        MatrixClass::EmptyRows {
            fraction: 0.5,
            per_row: 3,
        },
        MatrixClass::OneDenseRow { per_row: 2 },
        MatrixClass::FewLongRows {
            long_rows: 1,
            long_len: 40,
            short_len: 2,
        },
        MatrixClass::TallLeastSquares { per_row: 3 },
    ]
}

/// Checks what every generated matrix promises: valid, sorted, values in range.
fn check_common(a: &CsrHost<f64, i32>) {
    a.validate().unwrap();
    assert!(a.sorted);
    for &v in &a.values {
        assert!((SMALLEST_MAGNITUDE..=1.0).contains(&v.abs()), "value {v}");
    }
}

#[test]
fn names_are_short_and_stable() {
    let names: Vec<String> = [
        MatrixClass::Uniform { per_row: 16 },
        MatrixClass::Banded { diagonals: 9 },
        MatrixClass::PowerLaw {
            mean: 20.0,
            exponent: 2.0,
        },
        MatrixClass::PowerLaw {
            mean: 20.0,
            exponent: 1.5,
        },
        MatrixClass::EmptyRows {
            fraction: 0.5,
            per_row: 16,
        },
        MatrixClass::OneDenseRow { per_row: 16 },
        MatrixClass::FewLongRows {
            long_rows: 4,
            long_len: 100_000,
            short_len: 8,
        },
        MatrixClass::TallLeastSquares { per_row: 12 },
    ]
    .iter()
    .map(MatrixClass::name)
    .collect();
    assert_eq!(
        names,
        [
            "uniform16",
            "banded9",
            "powerlaw20",
            "powerlaw20a1.5",
            "emptyrows50_16",
            "denserow16",
            "longrows4x100000_8",
            "tallls12"
        ]
    );
}

#[test]
fn the_same_seed_gives_the_same_matrix() {
    for class in all_classes() {
        let a = generate::<f64, i32>(class, 300, 200, SEED);
        check_common(&a);
        assert_eq!(a, generate::<f64, i32>(class, 300, 200, SEED), "{}", class.name());
        assert_ne!(a, generate::<f64, i32>(class, 300, 200, SEED + 1), "{}", class.name());
    }
}

#[test]
fn rows_do_not_depend_on_the_matrix_height_or_threads() {
    // 70000 rows run chunks on rayon; its first chunk equals a one-chunk matrix
    let class = MatrixClass::Uniform { per_row: 3 };
    let tall = generate::<f32, i64>(class, 70_000, 50, SEED);
    let short = generate::<f32, i64>(class, CHUNK_ROWS, 50, SEED);
    let prefix = short.nnz();
    assert_eq!(&tall.offsets[..=CHUNK_ROWS], &short.offsets[..]);
    assert_eq!(&tall.indices[..prefix], &short.indices[..]);
    assert_eq!(&tall.values[..prefix], &short.values[..]);
}

#[test]
fn uniform_rows_have_exactly_per_row_entries() {
    for (per_row, cols) in [(5, 100), (60, 100), (100, 100), (7, 3), (0, 10)] {
        let a = generate::<f64, i32>(MatrixClass::Uniform { per_row }, 50, cols, SEED);
        check_common(&a);
        for r in 0..a.rows {
            assert_eq!(a.row_len(r), per_row.min(cols), "per_row {per_row} cols {cols}");
        }
    }
}

#[test]
fn banded_stays_in_its_band_and_fills_it() {
    for diagonals in [1, 4, 9] {
        let (rows, cols) = (40, 30);
        let a = generate::<f64, i32>(MatrixClass::Banded { diagonals }, rows, cols, SEED);
        check_common(&a);
        for r in 0..rows {
            let lo = r as i64 - (diagonals as i64 - 1) / 2;
            let hi = r as i64 + diagonals as i64 / 2;
            let want: Vec<i32> = (lo.max(0)..=hi.min(cols as i64 - 1)).map(|c| c as i32).collect();
            assert_eq!(a.row(r).0, &want[..], "diagonals {diagonals} row {r}");
        }
    }
}

#[test]
fn power_law_rows_have_the_mean_and_a_heavy_tail() {
    let class = MatrixClass::PowerLaw {
        mean: 8.0,
        exponent: 2.5,
    };
    let a = generate::<f64, i32>(class, 20_000, 100_000, SEED);
    check_common(&a);
    let d = SparseDescriptor::of(&a);
    assert!((d.avg_row - 8.0).abs() < 0.5, "{d}");
    assert!(d.max_row > 10 * d.p95_row / 2, "{d}");
    // lengths are capped at the columns
    let capped = generate::<f64, i32>(class, 2000, 12, SEED);
    assert!((0..capped.rows).all(|r| capped.row_len(r) <= 12));
}

#[test]
fn empty_rows_are_about_the_fraction() {
    let a = generate::<f64, i32>(
        MatrixClass::EmptyRows {
            fraction: 0.3,
            per_row: 4,
        },
        10_000,
        64,
        SEED,
    );
    check_common(&a);
    let empty = (0..a.rows).filter(|&r| a.row_len(r) == 0).count();
    assert!((2700..3300).contains(&empty), "{empty} empty rows");
    assert!((0..a.rows).all(|r| [0, 4].contains(&a.row_len(r))));
}

#[test]
fn one_dense_row_and_few_long_rows() {
    let a = generate::<f64, i32>(MatrixClass::OneDenseRow { per_row: 3 }, 500, 1000, SEED);
    check_common(&a);
    let lens: Vec<usize> = (0..a.rows).map(|r| a.row_len(r)).collect();
    assert_eq!(lens.iter().filter(|&&n| n == 1000).count(), 1);
    assert_eq!(lens.iter().filter(|&&n| n == 3).count(), 499);

    let class = MatrixClass::FewLongRows {
        long_rows: 3,
        long_len: 700,
        short_len: 5,
    };
    let b = generate::<f64, i32>(class, 400, 1000, SEED);
    check_common(&b);
    let lens: Vec<usize> = (0..b.rows).map(|r| b.row_len(r)).collect();
    assert_eq!(lens.iter().filter(|&&n| n == 700).count(), 3);
    assert_eq!(lens.iter().filter(|&&n| n == 5).count(), 397);
    // more long rows than rows: every row is long
    let c = generate::<f64, i32>(class, 2, 1000, SEED);
    assert_eq!((c.row_len(0), c.row_len(1)), (700, 700));
}

#[test]
fn tall_least_squares_rows_are_clustered() {
    let per_row = 6;
    let a = generate::<f64, i32>(MatrixClass::TallLeastSquares { per_row }, 5000, 400, SEED);
    check_common(&a);
    for r in 0..a.rows {
        let cols = a.row(r).0;
        assert_eq!(cols.len(), per_row);
        assert!(
            ((cols[per_row - 1] - cols[0]) as usize) < 4 * per_row,
            "row {r}: {cols:?}"
        );
    }
    // the windows move: columns all over the matrix are used
    let used = a.transpose();
    assert!((0..used.rows).filter(|&c| used.row_len(c) > 0).count() > 390);
}

#[test]
fn degenerate_shapes() {
    for class in all_classes() {
        for (rows, cols) in [(0, 0), (0, 5), (5, 0), (1, 1), (1, 37), (37, 1)] {
            let a = generate::<f64, i32>(class, rows, cols, SEED);
            check_common(&a);
            assert_eq!((a.rows, a.cols), (rows, cols));
        }
    }
}

#[test]
fn invalid_classes_are_errors() {
    for (class, rows, needle) in [
        (
            MatrixClass::PowerLaw {
                mean: 4.0,
                exponent: 1.0,
            },
            10,
            "exponent 1 must be finite and > 1",
        ),
        (
            MatrixClass::PowerLaw {
                mean: -1.0,
                exponent: 2.0,
            },
            10,
            "mean -1 must be",
        ),
        (
            MatrixClass::EmptyRows {
                fraction: 1.5,
                per_row: 2,
            },
            10,
            "fraction 1.5",
        ),
    ] {
        match try_generate::<f32, i32>(class, rows, 10, SEED) {
            Err(Error::InvalidArgument { arg: "class", rule }) => assert!(rule.contains(needle), "{rule}"),
            other => panic!("expected an invalid class, got {other:?}"),
        }
    }
}

#[test]
fn random_vectors_are_seeded_and_in_range() {
    let x = random_vector(1000, SEED);
    assert_eq!(x, random_vector(1000, SEED));
    assert_ne!(x, random_vector(1000, SEED + 1));
    assert!(x.iter().all(|v| (-1.0..=1.0).contains(v)));
    assert!(x.iter().any(|&v| v < -0.5) && x.iter().any(|&v| v > 0.5));
}

/// `cargo test --release -p tessera --lib generate_large -- --ignored --nocapture`
#[test]
#[ignore = "timing of a 2M x 2M matrix; run by hand in release"]
fn generate_large_matrix_timing() {
    let start = std::time::Instant::now();
    let a = generate::<f32, i32>(MatrixClass::Uniform { per_row: 16 }, 2_000_000, 2_000_000, SEED);
    let generated = start.elapsed();
    let d = SparseDescriptor::of(&a);
    let described = start.elapsed() - generated;
    println!("generate {generated:?}, descriptor {described:?}: {d}");
    assert_eq!(a.nnz(), 32_000_000);
}

// ---- tomography ----

/// The dense `rows x n^2` matrix of a projector.
fn dense_of(a: &CsrHost<f64, i32>) -> Vec<Vec<f64>> {
    (0..a.rows)
        .map(|r| {
            let mut row = vec![0.0; a.cols];
            let (cols, vals) = a.row(r);
            for (&c, &v) in cols.iter().zip(vals) {
                row[c as usize] = v;
            }
            row
        })
        .collect()
}

/// The line `{p : p . e = u}`, `e = (c, s)`, clipped to the closed box `[x0, x1] x [y0, y1]`:
/// the distance between the extreme points where it meets the box's edges (0 if it misses).
/// Independent of the projector's slab clipping: it intersects the four edges as segments.
fn clipped_length(c: f64, s: f64, u: f64, (x0, x1): (f64, f64), (y0, y1): (f64, f64)) -> f64 {
    let mut pts: Vec<(f64, f64)> = Vec::new();
    // vertical edges x = x0, x1: c x + s y = u
    if s != 0.0 {
        for x in [x0, x1] {
            let y = (u - c * x) / s;
            if (y0..=y1).contains(&y) {
                pts.push((x, y));
            }
        }
    }
    if c != 0.0 {
        for y in [y0, y1] {
            let x = (u - s * y) / c;
            if (x0..=x1).contains(&x) {
                pts.push((x, y));
            }
        }
    }
    let mut best: f64 = 0.0;
    for p in &pts {
        for q in &pts {
            best = best.max(((p.0 - q.0).powi(2) + (p.1 - q.1).powi(2)).sqrt());
        }
    }
    best
}

/// The length of ray `(k, m)` inside pixel `(i, j)` by clipping the line to that pixel alone.
fn brute_force_entry(g: &ParallelBeam, k: usize, m: usize, i: usize, j: usize) -> f64 {
    let h = g.n as f64 / 2.0;
    let (c, s) = g.direction(k);
    let x0 = j as f64 - h;
    let y1 = h - i as f64;
    clipped_length(c, s, g.offset(m), (x0, x0 + 1.0), (y1 - 1.0, y1))
}

#[test]
fn tomography_matches_per_pixel_clipping() {
    // no ray lies on a pixel boundary (offsets are multiples of 0.77, grid lines half-integers)
    let g = ParallelBeam {
        n: 7,
        angles: 11,
        detectors: 13,
        det_width: 0.77,
    };
    let a = parallel_beam_projector::<f64, i32>(&g).unwrap();
    a.validate().unwrap();
    assert!(a.sorted);
    assert_eq!((a.rows, a.cols), (11 * 13, 49));
    let dense = dense_of(&a);
    let mut stored = 0;
    for k in 0..g.angles {
        for m in 0..g.detectors {
            for i in 0..g.n {
                for j in 0..g.n {
                    let want = brute_force_entry(&g, k, m, i, j);
                    let got = dense[k * g.detectors + m][i * g.n + j];
                    assert!(
                        (got - want).abs() <= 1e-12,
                        "ray ({k}, {m}) pixel ({i}, {j}): {got} vs {want}"
                    );
                    stored += usize::from(want > 1e-9);
                }
            }
        }
    }
    assert_eq!(a.nnz(), stored);
    assert!(a.values.iter().all(|&v| v > 0.0 && v <= 2f64.sqrt() + 1e-12));
}

#[test]
fn tomography_axis_aligned_rays_cross_whole_pixels() {
    // bin centres on pixel centres (n = 6, 6 bins) and on pixel boundaries (n = 6, 7 bins)
    for detectors in [6, 7] {
        let g = ParallelBeam::new(6, 2, detectors);
        let a = parallel_beam_projector::<f64, i32>(&g).unwrap();
        assert!(a.values.iter().all(|&v| v == 1.0), "{:?}", a.values);
        for m in 0..detectors {
            // angle 0: the vertical line x = u_m, counted in the column on its right
            let (cols, _) = a.row(m);
            let u = g.offset(m);
            let col = (u + 3.0).floor() as i32;
            let want: Vec<i32> = if (0..6).contains(&col) {
                (0..6).map(|i| i * 6 + col).collect()
            } else {
                vec![]
            };
            assert_eq!(cols, &want[..], "angle 0, bin {m}");
            // angle pi/2: the horizontal line y = u_m, counted in the row above it
            let (cols, _) = a.row(detectors + m);
            let row = 5 - (u + 3.0).floor() as i32;
            let want: Vec<i32> = if (0..6).contains(&row) {
                (0..6).map(|j| row * 6 + j).collect()
            } else {
                vec![]
            };
            assert_eq!(cols, &want[..], "angle pi/2, bin {m}");
        }
        assert_eq!(a.nnz(), 2 * 6 * 6);
    }
}

#[test]
fn tomography_row_sums_are_chord_lengths() {
    for g in [
        ParallelBeam {
            n: 16,
            angles: 37,
            detectors: 25,
            det_width: 0.9,
        },
        ParallelBeam::new(9, 8, 13),
        ParallelBeam::new(1, 5, 3),
    ] {
        let a = parallel_beam_projector::<f64, i32>(&g).unwrap();
        // A x for the constant image 1 is the chord of each ray through the image square
        let ones = vec![1.0; a.cols];
        let mut y = vec![0.0; a.rows];
        super::reference::spmv(&a, 1.0, &ones, 0.0, &mut y);
        let h = g.n as f64 / 2.0;
        for k in 0..g.angles {
            let (c, s) = g.direction(k);
            for m in 0..g.detectors {
                let u = g.offset(m);
                let on_edge = (c == 0.0 || s == 0.0) && (u.abs() - h).abs() < 1e-12;
                if on_edge {
                    continue; // half-open pixels: checked in the axis-aligned test
                }
                let want = clipped_length(c, s, u, (-h, h), (-h, h));
                let got = y[k * g.detectors + m];
                assert!(
                    (got - want).abs() <= 1e-12,
                    "{} ray ({k}, {m}): {got} vs {want}",
                    g.name()
                );
            }
        }
    }
}

#[test]
fn tomography_symmetries() {
    // no ray on a pixel boundary (bin offsets are multiples of 0.385, never on the grid)
    for (n, detectors) in [(8, 14), (7, 15)] {
        let g = ParallelBeam {
            n,
            angles: 12,
            detectors,
            det_width: 0.77,
        };
        check_symmetries(&g);
    }
}

fn check_symmetries(g: &ParallelBeam) {
    let (n, d) = (g.n, g.detectors);
    let dense = dense_of(&parallel_beam_projector::<f64, i32>(g).unwrap());
    for k in 0..g.angles {
        for m in 0..d {
            let ray = &dense[k * d + m];
            // u -> -u: the ray reflected through the centre
            let opposite = &dense[k * d + (d - 1 - m)];
            // theta -> pi - theta: the ray mirrored in x (pixel column j -> n - 1 - j)
            let mirrored = (k > 0).then(|| &dense[(g.angles - k) * d + m]);
            for i in 0..n {
                for j in 0..n {
                    let v = ray[i * n + j];
                    let w = opposite[(n - 1 - i) * n + (n - 1 - j)];
                    assert!((v - w).abs() <= 1e-12, "point symmetry ray ({k}, {m}) pixel ({i}, {j})");
                    if let Some(mr) = mirrored {
                        let w = mr[i * n + (n - 1 - j)];
                        assert!((v - w).abs() <= 1e-12, "mirror ray ({k}, {m}) pixel ({i}, {j})");
                    }
                }
            }
        }
    }
}

#[test]
fn tomography_tiny_geometry_by_hand() {
    // 2 x 2 pixels ([-1, 1]^2), angles 0, pi/4, pi/2, 3pi/4, bins at u = -0.5, 0, 0.5
    let g = ParallelBeam {
        n: 2,
        angles: 4,
        detectors: 3,
        det_width: 0.5,
    };
    let a = parallel_beam_projector::<f64, i32>(&g).unwrap();
    let r2 = 2f64.sqrt();
    let s = r2 - 1.0; // the corner pieces of the pi/4 rays at u = +-0.5
    #[rustfmt::skip]
    let want: [[f64; 4]; 12] = [
        // angle 0: x = -0.5 (column 0), x = 0 and x = 0.5 (column 1: x = 0 is its left edge)
        [1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0],
        // pi/4: x + y = -sqrt(2)/2, 0 (the diagonal through pixels 0 and 3), sqrt(2)/2
        [s, 0.0, 1.0, s], [r2, 0.0, 0.0, r2], [s, 1.0, 0.0, s],
        // pi/2: y = -0.5 (row 1), y = 0 and y = 0.5 (row 0: y = 0 is its bottom edge)
        [0.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0],
        // 3pi/4: y - x = -sqrt(2)/2, 0 (the diagonal through pixels 2 and 1), sqrt(2)/2
        [0.0, s, s, 1.0], [0.0, r2, r2, 0.0], [1.0, s, s, 0.0],
    ];
    let dense = dense_of(&a);
    for (r, (got, want)) in dense.iter().zip(&want).enumerate() {
        for (p, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= 1e-14, "row {r} pixel {p}: {g} vs {w}");
        }
    }
}

#[test]
fn tomography_sizes_names_and_errors() {
    let g = ParallelBeam::new(256, 180, 363);
    assert_eq!(g.name(), "tomo256_180x363");
    assert_eq!((g.rows(), g.cols()), (65_340, 65_536));
    let w = ParallelBeam { det_width: 0.5, ..g };
    assert_eq!(w.name(), "tomo256_180x363_w0.5");
    // degenerate geometries make empty matrices
    for g in [
        ParallelBeam::new(0, 3, 4),
        ParallelBeam::new(4, 0, 4),
        ParallelBeam::new(4, 3, 0),
    ] {
        let a = parallel_beam_projector::<f32, i32>(&g).unwrap();
        a.validate().unwrap();
        assert_eq!((a.rows, a.cols, a.nnz()), (g.rows(), g.cols(), 0));
    }
    // detectors wider than the image: the outer rays miss it
    let a = parallel_beam_projector::<f64, i32>(&ParallelBeam::new(4, 1, 8)).unwrap();
    assert_eq!(a.nnz(), 16);
    assert_eq!(
        a.row(0).0.len() + a.row(1).0.len() + a.row(6).0.len() + a.row(7).0.len(),
        0
    );
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let g = ParallelBeam {
            det_width: bad,
            ..ParallelBeam::new(4, 2, 2)
        };
        match parallel_beam_projector::<f32, i32>(&g) {
            Err(Error::InvalidArgument { arg: "geometry", rule }) => assert!(rule.contains("det_width"), "{rule}"),
            other => panic!("expected an invalid geometry, got {other:?}"),
        }
    }
    // 50000^2 pixels do not fit i32 columns: refused before any work
    match parallel_beam_projector::<f32, i32>(&ParallelBeam::new(50_000, 1, 1)) {
        Err(Error::InvalidArgument { arg: "cols", .. }) => {}
        other => panic!("expected cols not fitting i32, got {other:?}"),
    }
    // f32 values are the f64 values rounded; same structure
    let g = ParallelBeam::new(16, 9, 23);
    let (a64, a32) = (
        parallel_beam_projector::<f64, i32>(&g).unwrap(),
        parallel_beam_projector::<f32, i64>(&g).unwrap(),
    );
    assert_eq!(a64.offsets, a32.offsets.iter().map(|&o| o as i32).collect::<Vec<_>>());
    assert!(a64.values.iter().zip(&a32.values).all(|(&x, &y)| x as f32 == y));
}

#[test]
fn shepp_logan_values() {
    for (x, y, want) in [
        (0.0, 0.0, 0.2),    // brain: 1 - 0.8
        (0.0, 0.9, 1.0),    // skull
        (0.95, 0.0, 0.0),   // outside the head
        (0.22, 0.0, 0.0),   // right ventricle: 0.2 - 0.2
        (-0.22, 0.0, 0.0),  // left ventricle
        (0.0, 0.35, 0.3),   // the large ellipse above the ventricles
        (0.0, -0.1, 0.3),   // the small circle below the centre
        (0.0, -0.606, 0.3), // the small circle at the bottom
    ] {
        let got = shepp_logan_at(x, y);
        assert!((got - want).abs() < 1e-12, "({x}, {y}): {got} vs {want}");
    }
    let n = 256;
    let p = shepp_logan(n);
    assert_eq!(p.len(), n * n);
    assert!(p.iter().all(|&v| (-1e-12..=1.0 + 1e-12).contains(&v)));
    // row 0 is the top: the skull's top is in the upper rows, the image is left-right symmetric
    // apart from the ventricles' tilt and the bottom ellipses, so compare the masses instead
    let mass = p.iter().sum::<f64>() * (2.0 / n as f64).powi(2);
    let exact: f64 = [
        (1.0, 0.69, 0.92),
        (-0.8, 0.6624, 0.874),
        (-0.2, 0.11, 0.31),
        (-0.2, 0.16, 0.41),
        (0.1, 0.21, 0.25),
        (0.1, 0.046, 0.046),
        (0.1, 0.046, 0.046),
        (0.1, 0.046, 0.023),
        (0.1, 0.023, 0.023),
        (0.1, 0.023, 0.046),
    ]
    .iter()
    .map(|(i, a, b)| i * std::f64::consts::PI * a * b)
    .sum();
    assert!((mass - exact).abs() < 0.01 * exact, "mass {mass} vs {exact}");
    // orientation: the skull at x = 0 is 0.92 up and down; the bottom circles lie below
    let at = |i: usize, j: usize| p[i * n + j];
    let row_of = |y: f64| ((1.0 - y) / 2.0 * n as f64) as usize;
    let col_of = |x: f64| ((x + 1.0) / 2.0 * n as f64) as usize;
    assert_eq!(at(row_of(0.35), col_of(0.0)), shepp_logan_at(0.0, 0.35));
    assert!((at(row_of(0.9), col_of(0.0)) - 1.0).abs() < 1e-12);
}

/// `cargo test --release -p tessera --lib tomography_large -- --ignored --nocapture`
#[test]
#[ignore = "timing of the 512^2, 360 x 725 projector; run by hand in release"]
fn tomography_large_timing() {
    for g in [ParallelBeam::new(256, 180, 363), ParallelBeam::new(512, 360, 725)] {
        let start = std::time::Instant::now();
        let a = parallel_beam_projector::<f32, i32>(&g).unwrap();
        println!(
            "{}: {} x {}, nnz {} ({:.2} per row), {:?} on {} threads",
            g.name(),
            a.rows,
            a.cols,
            a.nnz(),
            a.nnz() as f64 / a.rows as f64,
            start.elapsed(),
            rayon::current_num_threads()
        );
    }
}
