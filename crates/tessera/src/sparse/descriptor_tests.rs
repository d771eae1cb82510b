//! Tests of [`SparseDescriptor`]: exact numbers on hand-made matrices, and the multi-threaded
//! path on a large block-diagonal matrix whose numbers follow from its structure.

use super::descriptor::BLOCK_SIZES;
use super::*;

fn from_rows(cols: usize, rows: &[&[i32]]) -> CsrHost<f32, i32> {
    let mut offsets = vec![0];
    let mut indices = Vec::new();
    for row in rows {
        indices.extend_from_slice(row);
        offsets.push(indices.len() as i32);
    }
    let values = vec![1.0; indices.len()];
    CsrHost::new(rows.len(), cols, offsets, indices, values, &CsrCheck::default()).unwrap()
}

#[test]
fn hand_made_matrix() {
    // lengths 4, 0, 1, 3; pairs within rows: (0,1) (1,31) local, (31,32) not, (0,40) not,
    // (40,63) local
    let a = from_rows(64, &[&[0, 1, 31, 32], &[], &[5], &[0, 40, 63]]);
    let d = SparseDescriptor::of(&a);
    assert_eq!((d.rows, d.cols, d.nnz), (4, 64, 8));
    assert_eq!(d.avg_row, 2.0);
    assert_eq!(d.max_row, 4);
    assert_eq!(d.p95_row, 4);
    assert_eq!(d.empty_rows, 1);
    // population variance of 4, 0, 1, 3 around 2 is 10 / 4
    assert_eq!(d.row_cv, 2.5f64.sqrt() / 2.0);
    assert_eq!(d.col_locality, 3.0 / 5.0);
    // distinct blocks: b=2: rows 0-1 {0,15,16}, rows 2-3 {2,0,20,31} -> 7
    //                  b=4: {0,7,8,1,10,15} -> 6; b=8: {0,3,4,5,7} -> 5; b=16: {0,1,2,3} -> 4;
    //                  b=32: {0,1} -> 2
    let expected_blocks = [7.0, 6.0, 5.0, 4.0, 2.0];
    for ((&fill, b), blocks) in d.block_fill.iter().zip(BLOCK_SIZES).zip(expected_blocks) {
        assert_eq!(fill, 8.0 / (blocks * (b * b) as f64), "b = {b}");
    }
    assert_eq!(d.fill_at(16), Some(d.block_fill[3]));
    assert_eq!(d.fill_at(3), None);
    assert_eq!(
        d.to_string(),
        "4x64 nnz 8 row avg 2.0 p95 4 max 4 cv 0.79 empty 1 locality 0.60 fill@16 0.008"
    );
}

#[test]
fn dense_and_identity_matrices() {
    let dense = CsrHost::<f64, i64>::from_dense(32, 32, &[1.0; 32 * 32]);
    let d = SparseDescriptor::of(&dense);
    assert_eq!(d.block_fill, [1.0; 5]);
    assert_eq!((d.col_locality, d.row_cv, d.p95_row), (1.0, 0.0, 32));

    let mut eye = vec![0.0; 64 * 64];
    for i in 0..64 {
        eye[i * 64 + i] = 1.0;
    }
    let d = SparseDescriptor::of(&CsrHost::<f64, i32>::from_dense(64, 64, &eye));
    for (&fill, b) in d.block_fill.iter().zip(BLOCK_SIZES) {
        assert_eq!(fill, 1.0 / b as f64);
    }
    // one entry per row: no pairs
    assert_eq!((d.col_locality, d.avg_row, d.max_row, d.empty_rows), (0.0, 1.0, 1, 0));
}

#[test]
fn empty_matrices_are_all_zero() {
    for (rows, cols) in [(0, 0), (3, 5), (0, 7)] {
        let d = SparseDescriptor::of(&CsrHost::<f32, i32>::from_dense(rows, cols, &vec![0.0; rows * cols]));
        assert_eq!(
            d,
            SparseDescriptor {
                rows,
                cols,
                nnz: 0,
                avg_row: 0.0,
                p95_row: 0,
                max_row: 0,
                row_cv: 0.0,
                empty_rows: rows,
                col_locality: 0.0,
                block_fill: [0.0; 5],
            }
        );
    }
}

#[test]
fn p95_is_the_nearest_rank() {
    // 20 rows of lengths 1..=20: the 19th smallest (rank ceil(0.95 * 20)) is 19
    let rows: Vec<Vec<i32>> = (1..=20).map(|n| (0..n).collect()).collect();
    let refs: Vec<&[i32]> = rows.iter().map(|r| r.as_slice()).collect();
    assert_eq!(SparseDescriptor::of(&from_rows(20, &refs)).p95_row, 19);
}

#[test]
fn many_threads_agree_with_the_structure() {
    // dense 2 x 2 blocks on the diagonal; a row count that is not a multiple of 32 leaves a
    // partial last block-row
    let rows = (1 << 20) + 6;
    let offsets: Vec<i64> = (0..=rows as i64).map(|r| 2 * r).collect();
    let indices: Vec<i64> = (0..rows as i64).flat_map(|r| [r / 2 * 2, r / 2 * 2 + 1]).collect();
    let values = vec![1.0f32; indices.len()];
    let a = CsrHost::new(rows, rows, offsets, indices, values, &CsrCheck::default()).unwrap();
    assert!(a.nnz() > super::row_ranges::PARALLEL_MIN_NNZ);
    let d = SparseDescriptor::of(&a);
    assert_eq!(
        (d.avg_row, d.row_cv, d.p95_row, d.max_row, d.empty_rows),
        (2.0, 0.0, 2, 2, 0)
    );
    assert_eq!(d.col_locality, 1.0);
    for (&fill, b) in d.block_fill.iter().zip(BLOCK_SIZES) {
        let blocks = rows.div_ceil(b);
        assert_eq!(fill, a.nnz() as f64 / (blocks as f64 * (b * b) as f64), "b = {b}");
    }
}
