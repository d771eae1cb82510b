//! CPU tests of [`DenseOperator`](super::DenseOperator)'s host side: argument checks, the
//! layout arithmetic, the split heuristic, and a host emulation of dense.cu's index and split
//! arithmetic against [`DenseHost`]'s products. (The kernels run in `tessera verify lsmr`.)

use super::dense_operator::{
    all_variants, check_dense, cols_splits, stored_index, stored_shape, DenseLayout, MAX_SPLITS, SOURCE,
};
use super::{DenseHost, HostLinearOperator};
use crate::error::Error;
use crate::sparse::generate::random_vector;

fn arg_of(r: crate::Result<usize>) -> &'static str {
    match r {
        Err(Error::InvalidArgument { arg, .. }) => arg,
        other => panic!("expected an invalid-argument error, got {other:?}"),
    }
}

#[test]
fn dense_descriptions_are_checked_naming_the_argument() {
    use DenseLayout::*;
    // exact and padded
    assert_eq!(check_dense(3, 5, RowMajor, 5, 15).unwrap(), 15);
    assert_eq!(check_dense(3, 5, RowMajor, 8, 21).unwrap(), 21); // 2 * 8 + 5
    assert_eq!(check_dense(3, 5, ColMajor, 3, 15).unwrap(), 15);
    assert_eq!(check_dense(3, 5, ColMajor, 4, 19).unwrap(), 19); // 4 * 4 + 3
                                                                 // ld below the line length: n for row-major, m for column-major
    assert_eq!(arg_of(check_dense(3, 5, RowMajor, 4, 100)), "ld");
    assert_eq!(arg_of(check_dense(3, 5, ColMajor, 2, 100)), "ld");
    assert!(check_dense(3, 5, ColMajor, 3, 100).is_ok());
    // a buffer too short by one
    assert_eq!(arg_of(check_dense(3, 5, RowMajor, 8, 20)), "data");
    assert_eq!(arg_of(check_dense(3, 5, ColMajor, 4, 18)), "data");
    // overflow
    assert_eq!(
        arg_of(check_dense(usize::MAX, 2, RowMajor, usize::MAX / 2, usize::MAX)),
        "ld"
    );
    // empty matrices need nothing
    assert_eq!(check_dense(0, 5, RowMajor, 5, 0).unwrap(), 0);
    assert_eq!(check_dense(4, 0, ColMajor, 4, 0).unwrap(), 0);
}

#[test]
fn layouts_place_elements_as_blas_does() {
    assert_eq!(stored_shape(3, 5, DenseLayout::RowMajor), (3, 5));
    assert_eq!(stored_shape(3, 5, DenseLayout::ColMajor), (5, 3));
    assert_eq!(stored_index(DenseLayout::RowMajor, 7, 2, 4), 18);
    assert_eq!(stored_index(DenseLayout::ColMajor, 7, 2, 4), 30);
}

#[test]
fn splits_fill_the_device_within_bounds() {
    for (lines, len) in [
        (0, 10),
        (10, 0),
        (63, 5),
        (1_000_000, 6177),
        (1_000_000, 3),
        (5000, 1),
        (1 << 20, 1 << 20),
    ] {
        let s = cols_splits(lines, len, 132);
        assert!((1..=MAX_SPLITS).contains(&s), "{lines} x {len}: {s}");
        assert!(
            s == 1 || lines / s >= 64,
            "{lines} x {len}: {s} splits leave under 64 lines each"
        );
    }
    // few columns, many lines: split; many columns: one pass fills the device
    assert!(cols_splits(306_136, 100, 132) > 1);
    assert_eq!(cols_splits(100, 1 << 20, 132), 1);
}

/// dense.cu's two kernels on the host, index for index: `S x` a line at a time, `S^T x` a
/// column at a time over `splits` line ranges summed in split order.
#[allow(clippy::too_many_arguments)] // the matrix description, the vector, the direction, the splits
fn emulate(
    layout: DenseLayout,
    ld: usize,
    rows: usize,
    cols: usize,
    data: &[f64],
    x: &[f64],
    transposed: bool,
    splits: usize,
) -> Vec<f64> {
    let (lines, len) = stored_shape(rows, cols, layout);
    let along = matches!(
        (layout, transposed),
        (DenseLayout::RowMajor, false) | (DenseLayout::ColMajor, true)
    );
    if along {
        (0..lines)
            .map(|l| (0..len).map(|j| data[l * ld + j] * x[j]).sum())
            .collect()
    } else {
        let per = lines.div_ceil(splits.max(1));
        (0..len)
            .map(|c| {
                (0..splits)
                    .map(|s| {
                        let (begin, end) = (s * per, ((s + 1) * per).min(lines));
                        (begin..end).map(|i| data[i * ld + c] * x[i]).sum::<f64>()
                    })
                    .sum()
            })
            .collect()
    }
}

#[test]
fn the_kernels_index_arithmetic_gives_the_dense_products() {
    for (rows, cols, pad) in [(37, 11, 0), (37, 11, 3), (5, 40, 2), (1, 1, 0), (200, 3, 1)] {
        let dense = DenseHost::new(rows, cols, random_vector(rows * cols, 17)).unwrap();
        let x = random_vector(cols, 2);
        let u = random_vector(rows, 3);
        let mut ax = vec![0.0; rows];
        dense.apply(1.0, &x, 0.0, &mut ax);
        let mut atu = vec![0.0; cols];
        dense.apply_transposed(1.0, &u, 0.0, &mut atu);
        for layout in [DenseLayout::RowMajor, DenseLayout::ColMajor] {
            let (lines, len) = stored_shape(rows, cols, layout);
            let ld = len + pad;
            let span = check_dense(rows, cols, layout, ld, usize::MAX).unwrap();
            let mut data = vec![f64::NAN; span]; // padding is never read
            for i in 0..rows {
                for j in 0..cols {
                    data[stored_index(layout, ld, i, j)] = dense.data[i * cols + j];
                }
            }
            for splits in [1, 2, 3, cols_splits(lines, len, 132)] {
                let got_ax = emulate(layout, ld, rows, cols, &data, &x, false, splits);
                let got_atu = emulate(layout, ld, rows, cols, &data, &u, true, splits);
                let close =
                    |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(p, q)| (p - q).abs() <= 1e-12 * (1.0 + q.abs()));
                assert!(
                    close(&got_ax, &ax),
                    "{rows}x{cols} {layout:?} pad {pad} splits {splits}: A x"
                );
                assert!(
                    close(&got_atu, &atu),
                    "{rows}x{cols} {layout:?} pad {pad} splits {splits}: A^T u"
                );
            }
        }
    }
}

#[test]
fn dense_variants_and_params_mirror_the_kernels() {
    let v = all_variants();
    assert_eq!(v.len(), 6);
    let mut names: Vec<String> = v.iter().map(|v| v.spec().name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 6);
    // GemvParams' fields in dense.cu's order (the Rust mirror is asserted to be 80 bytes)
    let start = SOURCE.find("struct GemvParams {").unwrap();
    let body = &SOURCE[start..start + SOURCE[start..].find("};").unwrap()];
    let mut at = 0;
    for field in [
        "a;",
        "x;",
        "y;",
        "partials;",
        "lines, len, ld;",
        "alpha, beta;",
        "splits;",
        "square;",
    ] {
        let pos = body[at..]
            .find(field)
            .unwrap_or_else(|| panic!("{field} after offset {at}"));
        at += pos + field.len();
    }
}
