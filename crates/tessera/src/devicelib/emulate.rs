//! CPU emulation of mma_sync.cu's fragment handling (#[cfg(test)]): the warp-level instructions
//! modelled from their PTX ISA definitions (ldmatrix .x4 with and without .trans, movmatrix
//! .trans, the m16n8k16 A / B / C fragments), driven by the same staging and addressing formulas
//! as the kernel. It checks the kernel's index arithmetic against [`super::reference::matmul`]
//! without a GPU; the GPU case checks the same against the hardware.

use super::reference::matmul;
use super::verify::MmaMode;

/// A 32-bit register of two 16-bit elements (lo, hi), per lane.
type Reg = [(f64, f64); 32];

/// Row stride of the kernel's shared tiles (`kStride`).
const STRIDE: usize = 24;

/// ldmatrix.x4 (PTX ISA): lane l supplies the address (element index) of row l % 8 of matrix
/// l / 8; without .trans lane l receives row l / 4, elements 2 (l % 4) and + 1 of each matrix;
/// with .trans it receives column l / 4, rows 2 (l % 4) and + 1.
fn ldmatrix_x4(smem: &[f64], addr: &[usize; 32], trans: bool) -> [Reg; 4] {
    let mut out = [[(0.0, 0.0); 32]; 4];
    for (j, reg) in out.iter_mut().enumerate() {
        let row = |i: usize| addr[8 * j + i];
        for (l, r) in reg.iter_mut().enumerate() {
            *r = if trans {
                let (k, c) = (2 * (l % 4), l / 4);
                (smem[row(k) + c], smem[row(k + 1) + c])
            } else {
                let (rr, c) = (l / 4, 2 * (l % 4));
                (smem[row(rr) + c], smem[row(rr) + c + 1])
            };
        }
    }
    out
}

/// movmatrix.m8n8.trans (PTX ISA): the 8x8 matrix with lane l holding row l / 4, columns
/// 2 (l % 4), + 1, transposed in the same layout.
fn movmatrix_trans(x: &Reg) -> Reg {
    let m = |r: usize, c: usize| {
        let v = x[4 * r + c / 2];
        if c % 2 == 0 {
            v.0
        } else {
            v.1
        }
    };
    std::array::from_fn(|l| (m(2 * (l % 4), l / 4), m(2 * (l % 4) + 1, l / 4)))
}

/// mma.m16n8k16 (PTX ISA fragments, g = lane / 4, t = lane % 4): A a0 (g, 2t..), a1 (g + 8, 2t..),
/// a2 (g, 2t + 8..), a3 (g + 8, 2t + 8..); B b0 (k = 2t.., n = g), b1 (k = 2t + 8.., n = g);
/// returns C[16][8] from A B.
fn mma(a: &[Reg; 4], b: &[Reg; 2]) -> [[f64; 8]; 16] {
    let mut am = [[0.0; 16]; 16];
    let mut bm = [[0.0; 8]; 16];
    for l in 0..32 {
        let (g, t) = (l / 4, l % 4);
        for (i, (r, c)) in [(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)]
            .into_iter()
            .enumerate()
        {
            am[r][c] = a[i][l].0;
            am[r][c + 1] = a[i][l].1;
        }
        for (i, k) in [2 * t, 2 * t + 8].into_iter().enumerate() {
            bm[k][g] = b[i][l].0;
            bm[k + 1][g] = b[i][l].1;
        }
    }
    let mut c = [[0.0; 8]; 16];
    for (m, row) in c.iter_mut().enumerate() {
        for (n, v) in row.iter_mut().enumerate() {
            *v = (0..16).map(|k| am[m][k] * bm[k][n]).sum();
        }
    }
    c
}

/// mma_sync.cu for one tile, instruction by instruction: returns C row-major [16][16].
fn kernel(a: &[f64], b: &[f64], mode: MmaMode) -> Vec<f64> {
    let lanes = 0..32usize;
    let mut af: [Reg; 4] = [[(0.0, 0.0); 32]; 4];
    let mut bf: [[Reg; 2]; 2] = [[[(0.0, 0.0); 32]; 2]; 2];
    if mode == MmaMode::Fragments {
        for l in lanes {
            let (g, t) = (l / 4, l % 4);
            let pair = |x: &[f64], lo: usize, hi: usize| (x[lo], x[hi]);
            af[0][l] = pair(a, g * 16 + 2 * t, g * 16 + 2 * t + 1);
            af[1][l] = pair(a, (g + 8) * 16 + 2 * t, (g + 8) * 16 + 2 * t + 1);
            af[2][l] = pair(a, g * 16 + 2 * t + 8, g * 16 + 2 * t + 9);
            af[3][l] = pair(a, (g + 8) * 16 + 2 * t + 8, (g + 8) * 16 + 2 * t + 9);
            for (nb, bfn) in bf.iter_mut().enumerate() {
                let n = nb * 8 + g;
                bfn[0][l] = pair(b, (2 * t) * 16 + n, (2 * t + 1) * 16 + n);
                bfn[1][l] = pair(b, (2 * t + 8) * 16 + n, (2 * t + 9) * 16 + n);
            }
        }
    } else {
        let mut sa = vec![f64::NAN; 16 * STRIDE];
        let mut sb = vec![f64::NAN; 16 * STRIDE];
        let a_t = mode == MmaMode::LdmatrixTrans;
        let b_t = mode == MmaMode::Ldmatrix;
        for e in 0..256 {
            let (r, c) = (e / 16, e % 16);
            sa[if a_t { c * STRIDE + r } else { r * STRIDE + c }] = a[e];
            sb[if b_t { c * STRIDE + r } else { r * STRIDE + c }] = b[e];
        }
        let addr = |f: &dyn Fn(usize, usize) -> usize| -> [usize; 32] { std::array::from_fn(|l| f(l % 8, l / 8)) };
        af = if mode == MmaMode::LdmatrixTrans {
            ldmatrix_x4(
                &sa,
                &addr(&|row, mat| (8 * (mat / 2) + row) * STRIDE + 8 * (mat % 2)),
                true,
            )
        } else {
            ldmatrix_x4(
                &sa,
                &addr(&|row, mat| (8 * (mat % 2) + row) * STRIDE + 8 * (mat / 2)),
                false,
            )
        };
        let r4 = match mode {
            MmaMode::Ldmatrix => ldmatrix_x4(
                &sb,
                &addr(&|row, mat| (8 * (mat / 2) + row) * STRIDE + 8 * (mat % 2)),
                false,
            ),
            MmaMode::LdmatrixTrans => ldmatrix_x4(
                &sb,
                &addr(&|row, mat| (8 * (mat % 2) + row) * STRIDE + 8 * (mat / 2)),
                true,
            ),
            _ => ldmatrix_x4(
                &sb,
                &addr(&|row, mat| (8 * (mat % 2) + row) * STRIDE + 8 * (mat / 2)),
                false,
            )
            .map(|r| movmatrix_trans(&r)),
        };
        bf = [[r4[0], r4[1]], [r4[2], r4[3]]];
    }
    let mut c = vec![f64::NAN; 256];
    for (nb, bfn) in bf.iter().enumerate() {
        let d = mma(&af, bfn);
        // store by the C fragment layout: lane (g, t) holds rows g, g + 8, columns 2t, 2t + 1
        for l in 0..32 {
            let (g, t) = (l / 4, l % 4);
            let col = nb * 8 + 2 * t;
            for (row, dc) in [(g, 0), (g, 1), (g + 8, 0), (g + 8, 1)] {
                c[row * 16 + col + dc] = d[row][2 * t + dc];
            }
        }
    }
    c
}

#[test]
fn mma_sync_kernel_index_arithmetic_matches_the_product() {
    // asymmetric, distinct values: any permutation of A, B or C shows
    let a: Vec<f64> = (0..256).map(|i| (i as f64 * 0.37).sin() + i as f64 * 1e-3).collect();
    let b: Vec<f64> = (0..256).map(|i| (i as f64 * 0.71).cos() - i as f64 * 2e-3).collect();
    let want = matmul(&a, &b, 16, 16, 16);
    for mode in [
        MmaMode::Fragments,
        MmaMode::Ldmatrix,
        MmaMode::LdmatrixTrans,
        MmaMode::Movmatrix,
    ] {
        let got = kernel(&a, &b, mode);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() < 1e-12, "{mode:?} C[{}][{}]: {g} vs {w}", i / 16, i % 16);
        }
    }
}
