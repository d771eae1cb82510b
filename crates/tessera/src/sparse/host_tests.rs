//! Tests of the host CSR/COO matrices: one test per validation rule, the column-order and
//! duplicate policies, and the conversions (transpose, COO, index and value types, dense).

use super::*;
use crate::error::Error;

/// The argument and rule of an `InvalidArgument` error (panics on anything else).
fn invalid<T: std::fmt::Debug>(r: crate::Result<T>) -> (&'static str, String) {
    match r {
        Err(Error::InvalidArgument { arg, rule }) => (arg, rule),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

fn csr(
    rows: usize,
    cols: usize,
    offsets: &[i32],
    indices: &[i32],
    values: &[f64],
    order: ColumnOrder,
    duplicates: Duplicates,
) -> crate::Result<CsrHost<f64, i32>> {
    CsrHost::new(
        rows,
        cols,
        offsets.to_vec(),
        indices.to_vec(),
        values.to_vec(),
        &CsrCheck { order, duplicates },
    )
}

/// A 3 x 4 matrix with an empty middle row:
/// ```text
/// [1 0 2 0]
/// [0 0 0 0]
/// [0 3 0 4]
/// ```
fn small() -> CsrHost<f64, i32> {
    csr(
        3,
        4,
        &[0, 2, 2, 4],
        &[0, 2, 1, 3],
        &[1.0, 2.0, 3.0, 4.0],
        ColumnOrder::Sorted,
        Duplicates::Reject,
    )
    .unwrap()
}

#[test]
fn a_valid_matrix_keeps_its_arrays() {
    let a = small();
    assert_eq!(a.nnz(), 4);
    assert!(a.sorted);
    assert_eq!(a.row(0), (&[0, 2][..], &[1.0, 2.0][..]));
    assert_eq!(a.row_len(1), 0);
    assert_eq!(a.row(2).0, &[1, 3]);
    assert_eq!(
        a.to_dense_f64(),
        vec![1.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0, 0.0, 4.0]
    );
    a.validate().unwrap();
}

#[test]
fn offsets_of_the_wrong_length_are_rejected() {
    let (arg, rule) = invalid(csr(
        3,
        4,
        &[0, 2, 4],
        &[0, 1, 2, 3],
        &[1.0; 4],
        ColumnOrder::Sort,
        Duplicates::Sum,
    ));
    assert_eq!(arg, "offsets");
    assert!(
        rule.contains("has 3 entries") && rule.contains("rows + 1 = 4"),
        "{rule}"
    );
}

#[test]
fn offsets_must_start_at_zero() {
    let (arg, rule) = invalid(csr(
        2,
        4,
        &[1, 2, 3],
        &[0, 1, 2],
        &[1.0; 3],
        ColumnOrder::Sort,
        Duplicates::Sum,
    ));
    assert_eq!(arg, "offsets");
    assert!(rule.contains("offsets[0] = 1") && rule.contains("must be 0"), "{rule}");
}

#[test]
fn decreasing_offsets_name_the_row() {
    let (arg, rule) = invalid(csr(
        3,
        4,
        &[0, 3, 2, 4],
        &[0, 1, 2, 3],
        &[1.0; 4],
        ColumnOrder::Sort,
        Duplicates::Sum,
    ));
    assert_eq!(arg, "offsets");
    assert!(rule.contains("offsets[2] = 2 is less than offsets[1] = 3"), "{rule}");
    assert!(rule.contains("row 1"), "{rule}");
    // a negative offset after the first is a decrease too
    let (arg, _) = invalid(csr(2, 4, &[0, -1, 0], &[], &[], ColumnOrder::Sort, Duplicates::Sum));
    assert_eq!(arg, "offsets");
}

#[test]
fn the_last_offset_must_equal_nnz() {
    let (arg, rule) = invalid(csr(
        2,
        4,
        &[0, 1, 2],
        &[0, 1, 2],
        &[1.0; 3],
        ColumnOrder::Sort,
        Duplicates::Sum,
    ));
    assert_eq!(arg, "offsets");
    assert!(rule.contains("offsets[2] = 2 but indices has 3 entries"), "{rule}");
}

#[test]
fn values_must_pair_with_indices() {
    let (arg, rule) = invalid(csr(1, 4, &[0, 2], &[0, 1], &[1.0], ColumnOrder::Sort, Duplicates::Sum));
    assert_eq!(arg, "values");
    assert!(rule.contains("has 1 entries but indices has 2"), "{rule}");
}

#[test]
fn column_indices_must_be_in_range() {
    let (arg, rule) = invalid(csr(
        2,
        4,
        &[0, 1, 2],
        &[0, 4],
        &[1.0; 2],
        ColumnOrder::Sort,
        Duplicates::Sum,
    ));
    assert_eq!(arg, "indices");
    assert!(
        rule.contains("indices[1] = 4 in row 1 is outside the columns 0..4"),
        "{rule}"
    );
    let (arg, rule) = invalid(csr(
        2,
        4,
        &[0, 1, 2],
        &[-1, 0],
        &[1.0; 2],
        ColumnOrder::Sort,
        Duplicates::Sum,
    ));
    assert_eq!(arg, "indices");
    assert!(rule.contains("indices[0] = -1 in row 0"), "{rule}");
}

#[test]
fn sizes_must_fit_the_index_type() {
    let too_many = i32::MAX as usize + 1;
    let (arg, rule) = invalid(CsrHost::<f32, i32>::new(
        1,
        too_many,
        vec![0, 0],
        vec![],
        vec![],
        &CsrCheck::default(),
    ));
    assert_eq!(arg, "cols");
    assert!(rule.contains("do not fit the i32 index type"), "{rule}");
    // the same matrix is fine with i64 indices, and narrowing it back is an error
    let wide = CsrHost::<f32, i64>::new(
        1,
        too_many,
        vec![0, 1],
        vec![too_many as i64 - 1],
        vec![1.0],
        &CsrCheck::default(),
    )
    .unwrap();
    let (arg, _) = invalid(wide.with_index::<i32>());
    assert_eq!(arg, "cols");
}

#[test]
fn sorted_promise_is_checked() {
    let (arg, rule) = invalid(csr(
        2,
        4,
        &[0, 1, 4],
        &[3, 0, 2, 1],
        &[1.0; 4],
        ColumnOrder::Sorted,
        Duplicates::Sum,
    ));
    assert_eq!(arg, "indices");
    assert!(
        rule.contains("row 1 is not sorted: column 1 at position 3 follows column 2"),
        "{rule}"
    );
}

#[test]
fn sort_moves_values_with_columns() {
    let a = csr(
        2,
        5,
        &[0, 3, 5],
        &[4, 0, 2, 3, 1],
        &[40.0, 0.5, 20.0, 13.0, 11.0],
        ColumnOrder::Sort,
        Duplicates::Reject,
    )
    .unwrap();
    assert!(a.sorted);
    assert_eq!(a.indices, vec![0, 2, 4, 1, 3]);
    assert_eq!(a.values, vec![0.5, 20.0, 40.0, 11.0, 13.0]);
}

#[test]
fn unsorted_is_kept_as_given() {
    let a = csr(
        1,
        5,
        &[0, 3],
        &[4, 0, 2],
        &[1.0, 2.0, 3.0],
        ColumnOrder::Unsorted,
        Duplicates::Reject,
    )
    .unwrap();
    assert!(!a.sorted);
    assert_eq!(a.indices, vec![4, 0, 2]);
    // sortedness is reported as a fact, even for Unsorted input
    let b = csr(
        1,
        5,
        &[0, 2],
        &[1, 3],
        &[1.0, 2.0],
        ColumnOrder::Unsorted,
        Duplicates::Reject,
    )
    .unwrap();
    assert!(b.sorted);
}

#[test]
fn duplicates_are_summed_or_rejected() {
    // row 1 holds column 2 three times (unsorted), row 0 column 1 twice
    let offsets = [0, 3, 7];
    let indices = [1, 3, 1, 2, 0, 2, 2];
    let values = [1.0, 2.0, 3.0, 0.25, 5.0, 0.5, 1.0];

    let summed = csr(2, 4, &offsets, &indices, &values, ColumnOrder::Sort, Duplicates::Sum).unwrap();
    assert!(summed.sorted);
    assert_eq!(summed.offsets, vec![0, 2, 4]);
    assert_eq!(summed.indices, vec![1, 3, 0, 2]);
    assert_eq!(summed.values, vec![4.0, 2.0, 5.0, 1.75]);

    let (arg, rule) = invalid(csr(
        2,
        4,
        &offsets,
        &indices,
        &values,
        ColumnOrder::Sort,
        Duplicates::Reject,
    ));
    assert_eq!(arg, "indices");
    assert!(rule.contains("row 0 holds column 1 more than once"), "{rule}");

    // Unsorted + Reject still finds them; Unsorted + Sum keeps them as given
    let (_, rule) = invalid(csr(
        2,
        4,
        &offsets,
        &indices,
        &values,
        ColumnOrder::Unsorted,
        Duplicates::Reject,
    ));
    assert!(rule.contains("row 0 holds column 1 more than once"), "{rule}");
    let kept = csr(
        2,
        4,
        &offsets,
        &indices,
        &values,
        ColumnOrder::Unsorted,
        Duplicates::Sum,
    )
    .unwrap();
    assert!(!kept.sorted);
    assert_eq!(kept.indices, indices.to_vec());
    assert_eq!(kept.to_dense_f64(), summed.to_dense_f64());

    // Sorted input with adjacent duplicates
    let (_, rule) = invalid(csr(
        1,
        4,
        &[0, 3],
        &[0, 2, 2],
        &[1.0; 3],
        ColumnOrder::Sorted,
        Duplicates::Reject,
    ));
    assert!(rule.contains("row 0 holds column 2 more than once"), "{rule}");
    let merged = csr(
        1,
        4,
        &[0, 3],
        &[0, 2, 2],
        &[1.0, 2.0, -2.0],
        ColumnOrder::Sorted,
        Duplicates::Sum,
    )
    .unwrap();
    // an exact-zero sum stays as an explicit entry
    assert_eq!((merged.indices, merged.values), (vec![0, 2], vec![1.0, 0.0]));
}

#[test]
fn validate_checks_hand_edited_fields() {
    let mut a = small();
    a.sorted = false;
    let (arg, _) = invalid(a.validate());
    assert_eq!(arg, "sorted");
    let mut b = small();
    b.indices[0] = 9;
    let (arg, _) = invalid(b.validate());
    assert_eq!(arg, "indices");
}

#[test]
fn transpose_matches_the_dense_transpose_and_twice_is_identity() {
    let a = small();
    let t = a.transpose();
    assert_eq!((t.rows, t.cols), (4, 3));
    assert!(t.sorted);
    t.validate().unwrap();
    let dense = a.to_dense_f64();
    let dense_t = t.to_dense_f64();
    for r in 0..a.rows {
        for c in 0..a.cols {
            assert_eq!(dense[r * a.cols + c], dense_t[c * a.rows + r]);
        }
    }
    assert_eq!(t.transpose(), a);
    let empty = CsrHost::<f32, i64>::from_dense(0, 3, &[]);
    assert_eq!(empty.transpose().transpose(), empty);
}

#[test]
fn coo_round_trip_and_duplicate_policies() {
    let a = small();
    let coo = a.to_coo();
    assert_eq!(coo.row_indices, vec![0, 0, 2, 2]);
    assert_eq!(CsrHost::from_coo(coo, Duplicates::Reject).unwrap(), a);

    // unordered triplets with a duplicate at (1, 0)
    let coo = CooHost::<f32, i64> {
        rows: 2,
        cols: 3,
        row_indices: vec![1, 0, 1, 1],
        col_indices: vec![2, 1, 0, 0],
        values: vec![1.0, 2.0, 3.0, 4.0],
    };
    let b = CsrHost::from_coo(coo.clone(), Duplicates::Sum).unwrap();
    assert!(b.sorted);
    assert_eq!(b.offsets, vec![0, 1, 3]);
    assert_eq!(b.indices, vec![1, 0, 2]);
    assert_eq!(b.values, vec![2.0, 7.0, 1.0]);
    let (_, rule) = invalid(CsrHost::from_coo(coo, Duplicates::Reject));
    assert!(rule.contains("row 1 holds column 0 more than once"), "{rule}");
}

#[test]
fn coo_indices_and_lengths_are_checked() {
    let coo = |rows: Vec<i32>, cols: Vec<i32>, values: Vec<f64>| CooHost {
        rows: 2,
        cols: 3,
        row_indices: rows,
        col_indices: cols,
        values,
    };
    let (arg, rule) = invalid(CsrHost::from_coo(
        coo(vec![0, 2], vec![0, 0], vec![1.0; 2]),
        Duplicates::Sum,
    ));
    assert_eq!(arg, "row_indices");
    assert!(rule.contains("row_indices[1] = 2 is outside the rows 0..2"), "{rule}");
    let (arg, _) = invalid(CsrHost::from_coo(
        coo(vec![0, 1], vec![0, -3], vec![1.0; 2]),
        Duplicates::Sum,
    ));
    assert_eq!(arg, "col_indices");
    let (arg, _) = invalid(CsrHost::from_coo(
        coo(vec![0, 1], vec![0], vec![1.0; 2]),
        Duplicates::Sum,
    ));
    assert_eq!(arg, "col_indices");
    let (arg, _) = invalid(CsrHost::from_coo(
        coo(vec![0, 1], vec![0, 1], vec![1.0]),
        Duplicates::Sum,
    ));
    assert_eq!(arg, "values");
}

#[test]
fn value_and_index_conversions() {
    let a = small();
    let f32s = a.map_values(|v| v as f32 * 2.0);
    assert_eq!(f32s.values, vec![2.0f32, 4.0, 6.0, 8.0]);
    assert_eq!(f32s.indices, a.indices);
    let wide = a.with_index::<i64>().unwrap();
    assert_eq!(wide.offsets, vec![0i64, 2, 2, 4]);
    assert_eq!(wide.with_index::<i32>().unwrap(), a);
}

#[test]
fn dense_round_trip_skips_zeros() {
    let dense = [0.0, 1.5, 0.0, -2.0, 0.0, 0.0];
    let a = CsrHost::<f64, i32>::from_dense(2, 3, &dense);
    assert_eq!(a.nnz(), 2);
    assert_eq!(a.offsets, vec![0, 1, 2]);
    assert_eq!(a.to_dense_f64(), dense.to_vec());
    a.validate().unwrap();
}

#[test]
fn dense_layout_offsets() {
    assert_eq!(DenseLayout::RowMajor.offset(1, 2, 3, 4), 6);
    assert_eq!(DenseLayout::ColMajor.offset(1, 2, 3, 4), 7);
    assert_eq!(DenseLayout::RowMajor.leading_dim(3, 4), 4);
    assert_eq!(DenseLayout::ColMajor.leading_dim(3, 4), 3);
}

#[test]
fn large_matrices_sort_on_several_threads_like_one() {
    // 3000 rows of 400 entries in descending column order: above the parallel threshold
    let (rows, per_row, cols) = (3000usize, 400usize, 1000usize);
    let mut indices = Vec::with_capacity(rows * per_row);
    let mut values = Vec::with_capacity(rows * per_row);
    for r in 0..rows {
        for k in 0..per_row {
            let c = (r * 7 + (per_row - 1 - k) * 2) % cols;
            indices.push(c as i32);
            values.push((r * cols + c) as f64);
        }
    }
    let offsets: Vec<i32> = (0..=rows).map(|r| (r * per_row) as i32).collect();
    let a = CsrHost::new(rows, cols, offsets, indices, values, &CsrCheck::default()).unwrap();
    assert!(a.nnz() > super::row_ranges::PARALLEL_MIN_NNZ);
    assert!(a.sorted);
    for r in 0..rows {
        let (cs, vs) = a.row(r);
        assert!(cs.windows(2).all(|w| w[0] < w[1]), "row {r}");
        for (&c, &v) in cs.iter().zip(vs) {
            assert_eq!(v, (r * cols + c as usize) as f64);
        }
    }
}

#[test]
fn coo_index_conversion_checks_ranges() {
    let coo = CooHost::<f64, i64> {
        rows: 3,
        cols: 4,
        row_indices: vec![2, 0],
        col_indices: vec![3, 1],
        values: vec![1.0, 2.0],
    };
    assert_eq!(coo.nnz(), 2);
    let narrow = coo.with_index::<i32>().unwrap();
    assert_eq!((narrow.row_indices, narrow.col_indices), (vec![2, 0], vec![3, 1]));
    let mut bad = coo.clone();
    bad.col_indices[1] = 4;
    let (arg, rule) = invalid(bad.with_index::<i32>());
    assert_eq!(arg, "col_indices");
    assert!(
        rule.contains("col_indices[1] = 4 is outside the columns 0..4"),
        "{rule}"
    );
    let mut huge = coo;
    huge.rows = 1 << 40;
    let (arg, _) = invalid(huge.with_index::<i32>());
    assert_eq!(arg, "rows");
}
