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

/// The device CSR -> BSR conversion (convert.rs `csr_to_bsr`, convert.cu's block kernels), step
/// for step on the host: stable sorts by column then block row, block heads, their scan, block
/// rows and columns of each head, offsets from counts, and the fill of each (row, column) run.
/// It must give `BsrHost::from_csr`'s arrays bit for bit, duplicates and unsorted rows included.
fn device_model<I: SparseIndex>(a: &CsrHost<f32, I>, b: usize) -> BsrHost<f32, I> {
    let nnz = a.nnz();
    let block_rows = a.rows.div_ceil(b);
    let row_of: Vec<usize> = (0..a.rows).flat_map(|r| std::iter::repeat_n(r, a.row_len(r))).collect();
    let col = |k: usize| a.indices[k].to_usize();
    // radix_sort(indices) then radix_sort(block rows, carrying the permutation): both stable
    let mut perm: Vec<usize> = (0..nnz).collect();
    perm.sort_by_key(|&k| col(k));
    perm.sort_by_key(|&k| row_of[k] / b);
    let sorted_br: Vec<usize> = perm.iter().map(|&k| row_of[k] / b).collect();
    // conv_bsr_heads, conv_scan
    let heads: Vec<usize> = (0..nnz)
        .map(|i| {
            let head = i == 0 || sorted_br[i] != sorted_br[i - 1] || col(perm[i]) / b != col(perm[i - 1]) / b;
            head as usize
        })
        .collect();
    let mut flags = vec![0usize; nnz + 1];
    for i in 0..nnz {
        flags[i + 1] = flags[i] + heads[i];
    }
    let nnzb = flags[nnz];
    // conv_bsr_blocks, offsets_of
    let (mut out_br, mut out_bc) = (vec![0; nnzb], vec![0; nnzb]);
    for i in 0..nnz {
        if flags[i + 1] > flags[i] {
            out_br[flags[i]] = sorted_br[i];
            out_bc[flags[i]] = col(perm[i]) / b;
        }
    }
    let mut offsets = vec![0usize; block_rows + 1];
    for &br in &out_br {
        offsets[br + 1] += 1;
    }
    for r in 0..block_rows {
        offsets[r + 1] += offsets[r];
    }
    // conv_bsr_fill
    let mut values = vec![0.0f32; nnzb * b * b];
    for i in 0..nnz {
        let o = perm[i];
        let (r, c) = (row_of[o], col(o));
        if i > 0 && row_of[perm[i - 1]] == r && col(perm[i - 1]) == c {
            continue;
        }
        let mut j = i + 1;
        while j < nnz && row_of[perm[j]] == r && col(perm[j]) == c {
            j += 1;
        }
        let v = if j == i + 1 {
            a.values[o]
        } else {
            let mut sum = a.values[o] as f64;
            for &p in &perm[i + 1..j] {
                sum += a.values[p] as f64;
            }
            sum as f32
        };
        let slot = flags[i + 1] - 1;
        values[slot * b * b + (r % b) * b + c % b] = v;
    }
    BsrHost {
        rows: a.rows,
        cols: a.cols,
        block: b,
        block_offsets: offsets.into_iter().map(I::from_usize_in_range).collect(),
        block_indices: out_bc.into_iter().map(I::from_usize_in_range).collect(),
        values,
    }
}

#[test]
fn device_conversion_model_matches_the_host_conversion() {
    for &b in &BLOCK_SIZES {
        for (s, &(rows, cols)) in SHAPES.iter().enumerate() {
            let a: CsrHost<f32, i32> =
                generate_block_sparse(structure(b, 0.3, 0.5, 0.2), rows, cols, SEED + s as u64).unwrap();
            assert_eq!(
                device_model(&a, b),
                BsrHost::from_csr(&a, b).unwrap(),
                "b {b} {rows}x{cols}"
            );
            // unsorted rows with entries stored up to three times
            if a.nnz() == 0 {
                continue;
            }
            let mut offsets = vec![0i32];
            let (mut indices, mut values) = (Vec::new(), Vec::new());
            for r in 0..a.rows {
                let (c, v) = a.row(r);
                for k in (0..c.len()).rev() {
                    for rep in 0..1 + (k * 7 + r) % 3 {
                        indices.push(c[k]);
                        values.push(v[k] * (1.0 + rep as f32 / 3.0));
                    }
                }
                offsets.push(indices.len() as i32);
            }
            let dup = CsrHost::new(
                a.rows,
                a.cols,
                offsets,
                indices,
                values,
                &CsrCheck {
                    order: ColumnOrder::Unsorted,
                    duplicates: Duplicates::Sum,
                },
            )
            .unwrap();
            let host = BsrHost::from_csr(&dup, b).unwrap();
            let model = device_model(&dup, b);
            assert_eq!(model.block_offsets, host.block_offsets);
            assert_eq!(model.block_indices, host.block_indices);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&model.values),
                bits(&host.values),
                "b {b} {rows}x{cols} duplicates"
            );
        }
    }
}

/// The blocks (position, block column) of block row `br` as the kernels walk them: BSR offsets,
/// or Blocked-ELL slots up to the first padding slot.
fn kernel_blocks(bsr: &BsrHost<f64, i32>, bell: Option<&BellHost<f64, i32>>, br: usize) -> Vec<(usize, usize)> {
    match bell {
        None => bsr
            .block_range(br)
            .map(|k| (k, bsr.block_indices[k] as usize))
            .collect(),
        Some(e) => (br * e.width..(br + 1) * e.width)
            .map_while(|k| (e.block_indices[k] >= 0).then(|| (k, e.block_indices[k] as usize)))
            .collect(),
    }
}

/// spmm_bsr.cu's tensor-core tile (and, `staged`, its shared-memory B path), lane for lane: the
/// A and B registers loaded with the kernel's addresses, the MMA applied through the fragment layouts of the PTX ISA (A row-major
/// 16x16, B "col" 16x8, C 16x8, as mma.cuh's header states them), C written from the
/// accumulator registers. f64 stands in for the halves (the index arithmetic is what is tested).
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // indices mirror the kernel's lanes
fn tensor_core_model(
    bsr: &BsrHost<f64, i32>,
    bell: Option<&BellHost<f64, i32>>,
    bm: &[f64],
    n: usize,
    (n8, staged): (usize, bool),
    layout: DenseLayout,
    alpha: f64,
    c: &mut [f64],
) {
    let (b, rows, cols) = (bsr.block, bsr.rows, bsr.cols);
    let values = bell.map_or(&bsr.values, |e| &e.values);
    let m16 = b / 16;
    let at = |r: usize, j: usize, ld: usize| match layout {
        DenseLayout::RowMajor => r * ld + j,
        DenseLayout::ColMajor => r + j * ld,
    };
    let (ldb, ldc) = (layout.leading_dim(cols, n), layout.leading_dim(rows, n));
    let b_el = |r: usize, j: usize| if r >= cols || j >= n { 0.0 } else { bm[at(r, j, ldb)] };
    for br in 0..bsr.block_rows() {
        for j0 in (0..n).step_by(8 * n8) {
            // acc[mt][nt][lane][e]
            let mut acc = vec![vec![vec![[0.0f64; 4]; 32]; n8]; m16];
            for (k, bc) in kernel_blocks(bsr, bell, br) {
                let block = &values[k * b * b..(k + 1) * b * b];
                for ks in 0..m16 {
                    // registers, as the kernel loads them: (lo, hi) element pairs
                    let mut bf = vec![[[0.0f64; 2]; 2]; 32 * n8];
                    let mut af = vec![[[0.0f64; 2]; 4]; 32 * m16];
                    for lane in 0..32 {
                        let (g, t) = (lane / 4, lane % 4);
                        let k0 = bc * b + ks * 16 + 2 * t;
                        for nt in 0..n8 {
                            let j = j0 + nt * 8 + g;
                            bf[lane * n8 + nt] = [[b_el(k0, j), b_el(k0 + 1, j)], [b_el(k0 + 8, j), b_el(k0 + 9, j)]];
                        }
                        if staged {
                            // the staged tile S[row][col] = B[bc * b + row][j0 + col] (zero
                            // outside B), read by ldmatrix.x4.trans: the 8 row addresses of
                            // matrix m come from lanes 8m .. 8m + 7 (row ks * 16 + (m % 2) * 8 + i,
                            // columns from (nt + m / 2) * 8); lane l receives, of each matrix,
                            // column l / 4 of rows 2 (l % 4) and 2 (l % 4) + 1
                            let s_el = |row: usize, col: usize| b_el(bc * b + row, j0 + col);
                            for nt in (0..n8).step_by(2) {
                                let mut r = [[0.0f64; 2]; 4];
                                for (m, rm) in r.iter_mut().enumerate() {
                                    let addr_of = |i: usize| {
                                        let krow = ks * 16 + (m % 2) * 8 + i;
                                        let ncol = if n8 > 1 { nt + m / 2 } else { nt } * 8;
                                        (krow, ncol)
                                    };
                                    for (e, x) in rm.iter_mut().enumerate() {
                                        let (krow, ncol) = addr_of(2 * t + e);
                                        *x = s_el(krow, ncol + g);
                                    }
                                }
                                bf[lane * n8 + nt] = [r[0], r[1]];
                                if n8 > 1 {
                                    bf[lane * n8 + nt + 1] = [r[2], r[3]];
                                }
                            }
                        }
                        for mt in 0..m16 {
                            let a_at = (mt * 16 + g) * b + ks * 16 + 2 * t;
                            let pair = |p: usize| [block[p], block[p + 1]];
                            af[lane * m16 + mt] =
                                [pair(a_at), pair(a_at + 8 * b), pair(a_at + 8), pair(a_at + 8 * b + 8)];
                        }
                    }
                    for mt in 0..m16 {
                        // the PTX fragment layouts: which lane register holds A[m][k], B[k][n]
                        let mut a = [[0.0; 16]; 16];
                        for lane in 0..32 {
                            let (g, t) = (lane / 4, lane % 4);
                            let r = af[lane * m16 + mt];
                            for e in 0..2 {
                                a[g][2 * t + e] = r[0][e];
                                a[g + 8][2 * t + e] = r[1][e];
                                a[g][2 * t + 8 + e] = r[2][e];
                                a[g + 8][2 * t + 8 + e] = r[3][e];
                            }
                        }
                        for nt in 0..n8 {
                            let mut bt = [[0.0; 8]; 16];
                            for lane in 0..32 {
                                let (g, t) = (lane / 4, lane % 4);
                                let r = bf[lane * n8 + nt];
                                for e in 0..2 {
                                    bt[2 * t + e][g] = r[0][e];
                                    bt[2 * t + 8 + e][g] = r[1][e];
                                }
                            }
                            for lane in 0..32 {
                                let (g, t) = (lane / 4, lane % 4);
                                for (e, (m, nn)) in [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]
                                    .into_iter()
                                    .enumerate()
                                {
                                    acc[mt][nt][lane][e] += (0..16).map(|kk| a[m][kk] * bt[kk][nn]).sum::<f64>();
                                }
                            }
                        }
                    }
                }
            }
            for (mt, acc_mt) in acc.iter().enumerate() {
                for (nt, acc_nt) in acc_mt.iter().enumerate() {
                    for (lane, d) in acc_nt.iter().enumerate() {
                        let (g, t) = (lane / 4, lane % 4);
                        let r = br * b + mt * 16 + g;
                        let j = j0 + nt * 8 + 2 * t;
                        for (e, (rr, jj)) in [(r, j), (r, j + 1), (r + 8, j), (r + 8, j + 1)].into_iter().enumerate() {
                            if rr < rows && jj < n {
                                c[at(rr, jj, ldc)] = alpha * d[e];
                            }
                        }
                    }
                }
            }
        }
    }
}

/// spmv_bsr.cu's lane mapping: lane l of a block row's warp takes row l / (32 / b) and every
/// (32 / b)-th (block, column) pair from l % (32 / b); the lanes of a row are summed.
fn spmv_model(bsr: &BsrHost<f64, i32>, bell: Option<&BellHost<f64, i32>>, x: &[f64], y: &mut [f64]) {
    let b = bsr.block;
    let values = bell.map_or(&bsr.values, |e| &e.values);
    let lanes = 32 / b;
    for br in 0..bsr.block_rows() {
        let blocks = kernel_blocks(bsr, bell, br);
        let mut sums = [0.0f64; 32];
        for (lane, sum) in sums.iter_mut().enumerate() {
            let (i, s) = (lane / lanes, lane % lanes);
            for q in (s..blocks.len() * b).step_by(lanes) {
                let (k, bc) = blocks[q / b];
                let col = bc * b + q % b;
                if col < bsr.cols {
                    *sum += values[k * b * b + i * b + q % b] * x[col];
                }
            }
        }
        for i in 0..b {
            let row = br * b + i;
            if row < bsr.rows {
                y[row] = sums[i * lanes..(i + 1) * lanes].iter().sum();
            }
        }
    }
}

#[test]
fn kernel_index_models_match_the_reference() {
    for &b in &BLOCK_SIZES {
        for (s, &(rows, cols)) in SHAPES.iter().enumerate() {
            let a: CsrHost<f64, i32> =
                generate_block_sparse(structure(b, 0.3, 0.6, 0.2), rows, cols, SEED ^ (s as u64 + 11)).unwrap();
            let bsr = BsrHost::from_csr(&a, b).unwrap();
            let bell = BellHost::from_bsr(&bsr).unwrap();
            let x = random_vector(cols, 3);
            let mut want = vec![0.0; rows];
            reference::spmv(&a, 1.0, &x, 0.0, &mut want);
            for e in [None, Some(&bell)] {
                let mut y = vec![f64::NAN; rows];
                spmv_model(&bsr, e, &x, &mut y);
                for (p, q) in y.iter().zip(&want) {
                    assert!((p - q).abs() <= 1e-12 * (1.0 + q.abs()), "spmv b {b} {rows}x{cols}");
                }
            }
            if b < 16 {
                continue;
            }
            for n in [1, 7, 8, 9, 45, 48] {
                for layout in [DenseLayout::RowMajor, DenseLayout::ColMajor] {
                    let bm = random_vector(cols * n, 4);
                    let mut want = vec![0.0; rows * n];
                    reference::spmm(&a, 0.5, &bm, n, layout, 0.0, &mut want, layout);
                    for (n8, staged) in [1, 2, 4].into_iter().flat_map(|n8| [(n8, false), (n8, true)]) {
                        if staged && (layout != DenseLayout::RowMajor || n % 8 != 0) {
                            continue;
                        }
                        for e in [None, Some(&bell)] {
                            let mut c = vec![f64::NAN; rows * n];
                            tensor_core_model(&bsr, e, &bm, n, (n8, staged), layout, 0.5, &mut c);
                            for (p, q) in c.iter().zip(&want) {
                                assert!(
                                    (p - q).abs() <= 1e-12 * (1.0 + q.abs()),
                                    "tc b {b} {rows}x{cols} n {n} n8 {n8}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
