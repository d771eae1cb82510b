//! Tests of the host block formats: CSR -> BSR -> Blocked-ELL against the dense matrix, the
//! rules of `BsrHost::validate` / `BellHost::validate` (each broken on purpose), duplicates
//! summed as the module documents, and the BSR references against the CSR references.

use super::block::{check_block_size, BellHost, BsrHost};
use super::generate::{generate, generate_block_sparse, random_vector, BlockSparse, MatrixClass};
use super::reference;
use super::*;
use half::{bf16, f16};

const SEED: u64 = 0xb10c_5eed;

fn structure(block: usize, density: f64, fill: f64, empty: f64) -> BlockSparse {
    BlockSparse {
        block,
        density,
        fill,
        empty_block_rows: empty,
    }
}

/// Odd shapes (not multiples of any block size), tiny and degenerate ones.
const SHAPES: [(usize, usize); 7] = [(37, 53), (64, 64), (1, 40), (40, 1), (0, 7), (7, 0), (129, 31)];

#[test]
fn bsr_of_csr_is_the_same_matrix_for_every_block_size() {
    for &b in &BLOCK_SIZES {
        for (s, &(rows, cols)) in SHAPES.iter().enumerate() {
            let a: CsrHost<f64, i32> = generate(MatrixClass::Uniform { per_row: 5 }, rows, cols, SEED + s as u64);
            let bsr = BsrHost::from_csr(&a, b).unwrap();
            bsr.validate().unwrap();
            assert_eq!(bsr.block_rows(), rows.div_ceil(b));
            assert_eq!(bsr.to_dense_f64(), a.to_dense_f64(), "b {b} {rows}x{cols}");
            // every stored block holds an entry of a
            for k in 0..bsr.nnzb() {
                assert!(bsr.values[k * b * b..(k + 1) * b * b].iter().any(|&v| v != 0.0));
            }
            let bell = BellHost::from_bsr(&bsr).unwrap();
            bell.validate().unwrap();
            assert_eq!(bell.to_bsr(), bsr, "b {b} {rows}x{cols}");
        }
    }
}

#[test]
fn block_counts_match_the_descriptor() {
    let a: CsrHost<f32, i32> = generate_block_sparse(structure(4, 0.3, 0.5, 0.2), 203, 157, SEED).unwrap();
    let d = SparseDescriptor::of(&a);
    for (k, &b) in BLOCK_SIZES.iter().enumerate() {
        let bsr = BsrHost::from_csr(&a, b).unwrap();
        let fill = a.nnz() as f64 / (bsr.nnzb() * b * b) as f64;
        assert!(
            (d.block_fill[k] - fill).abs() < 1e-12,
            "b {b}: {} vs {fill}",
            d.block_fill[k]
        );
    }
}

#[test]
fn generated_block_sparse_matrices_have_the_asked_structure() {
    let s = structure(16, 0.1, 1.0, 0.25);
    let a: CsrHost<f32, i32> = generate_block_sparse(s, 1000, 777, SEED).unwrap();
    a.validate().unwrap();
    let bsr = BsrHost::from_csr(&a, 16).unwrap();
    let empty = (0..bsr.block_rows())
        .filter(|&br| bsr.block_range(br).is_empty())
        .count();
    assert!(empty > 0, "some block rows are empty");
    // full blocks inside the matrix: nnz = blocks * 256 minus the edge cuts
    let density = bsr.block_density();
    assert!(density > 0.04 && density < 0.12, "{density}");
    assert_eq!(a, generate_block_sparse(s, 1000, 777, SEED).unwrap(), "seeded");
    assert!(generate_block_sparse::<f32, i32>(structure(16, 1.5, 1.0, 0.0), 10, 10, 1).is_err());
}

#[test]
fn duplicates_are_summed_in_stored_order_and_singles_copied() {
    // row 0 holds column 1 three times (unsorted, duplicates kept), row 1 column 0 once
    let values = vec![0.1f32, 1.0, 2.0, 0.2, 0.3];
    let a = CsrHost::<f32, i32>::new(
        2,
        3,
        vec![0, 4, 5],
        vec![1, 2, 1, 1, 0],
        values.clone(),
        &CsrCheck {
            order: ColumnOrder::Unsorted,
            duplicates: Duplicates::Sum,
        },
    )
    .unwrap();
    let bsr = BsrHost::from_csr(&a, 2).unwrap();
    assert_eq!(bsr.block_indices, vec![0, 1]);
    let want01 = (0.1f32 as f64 + 2.0f32 as f64 + 0.2f32 as f64) as f32;
    // block 0 (columns 0, 1): (0,1) = sum, (1,0) = 0.3; block 1 (column 2): (0,0) = 1
    assert_eq!(&bsr.values[..4], &[0.0, want01, 0.3, 0.0]);
    assert_eq!(&bsr.values[4..], &[1.0, 0.0, 0.0, 0.0]);
}

#[test]
fn bsr_references_equal_the_csr_references() {
    for &b in &BLOCK_SIZES {
        for (s, &(rows, cols)) in SHAPES.iter().enumerate() {
            let a: CsrHost<f64, i32> =
                generate_block_sparse(structure(b, 0.3, 0.6, 0.2), rows, cols, SEED ^ s as u64).unwrap();
            let bsr = BsrHost::from_csr(&a, b).unwrap();
            let x = random_vector(cols, 7);
            let y0 = random_vector(rows, 8);
            for (alpha, beta) in [(1.0, 0.0), (-0.5, 2.0)] {
                let (mut y1, mut y2) = (y0.clone(), y0.clone());
                reference::spmv(&a, alpha, &x, beta, &mut y1);
                reference::spmv_bsr(&bsr, alpha, &x, beta, &mut y2);
                for (p, q) in y1.iter().zip(&y2) {
                    assert!((p - q).abs() <= 1e-12 * (1.0 + p.abs()), "spmv b {b} {rows}x{cols}");
                }
            }
            for n in [1, 2, 7] {
                for layout in [DenseLayout::RowMajor, DenseLayout::ColMajor] {
                    let bm = random_vector(cols * n, 9);
                    let c0 = random_vector(rows * n, 10);
                    let (mut c1, mut c2) = (c0.clone(), c0.clone());
                    reference::spmm(&a, 1.5, &bm, n, layout, -1.0, &mut c1, layout);
                    reference::spmm_bsr(&bsr, 1.5, &bm, n, layout, -1.0, &mut c2, layout);
                    for (p, q) in c1.iter().zip(&c2) {
                        assert!(
                            (p - q).abs() <= 1e-12 * (1.0 + p.abs()),
                            "spmm b {b} {rows}x{cols} n {n}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn half_values_convert_bitwise() {
    let a: CsrHost<f16, i64> = generate_block_sparse(structure(16, 0.2, 0.7, 0.0), 70, 90, SEED).unwrap();
    let bsr = BsrHost::from_csr(&a, 16).unwrap();
    let back = bsr.to_csr();
    // the stored entries of a are the nonzeros of the BSR form, bit for bit
    let nz: Vec<u16> = back
        .values
        .iter()
        .filter(|v| v.to_f64() != 0.0)
        .map(|v| v.to_bits())
        .collect();
    assert_eq!(nz, a.values.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    let a: CsrHost<bf16, i32> = generate_block_sparse(structure(8, 0.2, 0.7, 0.0), 33, 17, SEED).unwrap();
    assert_eq!(BsrHost::from_csr(&a, 8).unwrap().to_dense_f64(), a.to_dense_f64());
}

#[test]
fn block_sizes_outside_the_list_are_rejected() {
    for b in [0, 1, 3, 6, 12, 24, 64] {
        let e = check_block_size(b).unwrap_err().to_string();
        assert!(e.contains("block") && e.contains("2, 4, 8, 16 or 32"), "{e}");
        let a: CsrHost<f32, i32> = generate(MatrixClass::Uniform { per_row: 2 }, 8, 8, 1);
        assert!(BsrHost::from_csr(&a, b).is_err());
    }
}

fn small_bsr() -> BsrHost<f32, i32> {
    // 5 x 7 matrix of 4 x 4 blocks: 2 block rows, 2 block columns
    let a: CsrHost<f32, i32> = CsrHost::from_dense(
        5,
        7,
        &[
            1., 0., 0., 0., 0., 2., 0., //
            0., 0., 0., 0., 0., 0., 3., //
            0., 0., 0., 0., 0., 0., 0., //
            0., 4., 0., 0., 0., 0., 0., //
            0., 0., 0., 0., 5., 0., 6., //
        ],
    );
    BsrHost::from_csr(&a, 4).unwrap()
}

#[test]
fn bsr_validation_names_the_argument_and_rule() {
    let good = small_bsr();
    assert_eq!(good.block_offsets, vec![0, 2, 3]);
    assert_eq!(good.block_indices, vec![0, 1, 1]);
    good.validate().unwrap();
    let err = |f: &dyn Fn(&mut BsrHost<f32, i32>)| {
        let mut a = good.clone();
        f(&mut a);
        BsrHost::new(a.rows, a.cols, a.block, a.block_offsets, a.block_indices, a.values)
            .unwrap_err()
            .to_string()
    };
    assert!(err(&|a| a.block = 3).contains("block"));
    assert!(err(&|a| a.block_offsets.pop().map_or((), |_| ())).contains("block_offsets"));
    assert!(err(&|a| a.block_offsets[0] = 1).contains("first offset"));
    assert!(err(&|a| a.block_offsets = vec![0, 3, 2]).contains("nondecreasing"));
    assert!(err(&|a| a.block_offsets[2] = 2).contains("last offset"));
    assert!(err(&|a| a.values.pop().map_or((), |_| ())).contains("values"));
    assert!(err(&|a| a.block_indices[2] = 2).contains("outside the block columns"));
    assert!(err(&|a| a.block_indices[2] = -1).contains("outside the block columns"));
    assert!(err(&|a| a.block_indices[1] = 0).contains("strictly increasing"));
    // (4, 7) lies past the 7 columns: padding must be zero
    let e = err(&|a| a.values[2 * 16 + 3] = 1.0);
    assert!(e.contains("padding") && e.contains("(4, 7)"), "{e}");
    // (5, 4) lies past the 5 rows
    let e = err(&|a| a.values[2 * 16 + 4] = 1.0);
    assert!(e.contains("(5, 4)"), "{e}");
    // too many blocks for i32 are caught by the size check (rows that do not fit)
    let e = BsrHost::<f32, i32>::new(1 << 31, 1, 2, vec![], vec![], vec![])
        .unwrap_err()
        .to_string();
    assert!(e.contains("rows"), "{e}");
}

#[test]
fn bell_validation_names_the_argument_and_rule() {
    let good = BellHost::from_bsr(&small_bsr()).unwrap();
    assert_eq!(good.width, 2);
    assert_eq!(good.block_indices, vec![0, 1, 1, -1]);
    good.validate().unwrap();
    let err = |f: &dyn Fn(&mut BellHost<f32, i32>)| {
        let mut a = good.clone();
        f(&mut a);
        BellHost::new(a.rows, a.cols, a.block, a.width, a.block_indices, a.values)
            .unwrap_err()
            .to_string()
    };
    assert!(err(&|a| a.block = 5).contains("block"));
    assert!(err(&|a| a.block_indices.pop().map_or((), |_| ())).contains("block_indices"));
    assert!(err(&|a| a.values.pop().map_or((), |_| ())).contains("values"));
    assert!(err(&|a| a.values[3 * 16] = 1.0).contains("padding slot"));
    let e = err(&|a| {
        a.block_indices = vec![-1, 1, 1, -1];
        a.values[..16].fill(0.0);
    });
    assert!(e.contains("padding comes last"), "{e}");
    assert!(err(&|a| a.block_indices[1] = 0).contains("strictly increasing"));
    assert!(err(&|a| a.block_indices[2] = 5).contains("outside"));
    // no blocks at all: width 0
    let empty: CsrHost<f32, i32> = CsrHost::from_dense(9, 9, &[0.0; 81]);
    let bell = BellHost::from_bsr(&BsrHost::from_csr(&empty, 8).unwrap()).unwrap();
    assert_eq!((bell.width, bell.block_indices.len()), (0, 0));
    bell.validate().unwrap();
}
