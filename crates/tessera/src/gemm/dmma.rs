//! The fp64 tensor-core kernel (`gemm_dmma.cu`, sm_80+): 128 x 128 x 16 CTA tiles, 8 warps,
//! a 3-stage cp.async pipeline (4 stages on request where 128 KiB of shared memory fits),
//! mma.sync m16n8k16 f64 on sm_90 (m16n8k8 as four m8n8k4 before), any layout and alignment,
//! epilogue in f64.

use crate::runtime::{KernelKey, KernelSpec, LaunchConfig};

/// Source of the kernel.
pub const SOURCE: &str = include_str!("gemm_dmma.cu");
/// CTA tile (M, N, K) and pipeline depth, as in the kernel.
pub const TILE_M: usize = 128;
pub const TILE_N: usize = 128;
pub const TILE_K: usize = 16;
/// Pipeline depth by default, and the deeper one that sm_80 and sm_90 can hold (their opt-in
/// shared memory per CTA is 163 / 227 KiB; sm_86/89 have 99 KiB, three stages).
pub const STAGES: usize = 3;
pub const DEEP_STAGES: usize = 4;
pub const THREADS: u32 = 256;

/// Dynamic shared memory of `stages` stages of (A tile + B tile) doubles (32 KiB each; the
/// launch opts in above 48 KiB).
pub const fn shared_bytes(stages: usize) -> u32 {
    (stages * (TILE_M + TILE_N) * TILE_K * 8) as u32
}
/// Dynamic shared memory of the default depth (96 KiB, which fits the 99 KiB of sm_86/89).
pub const SHARED_BYTES: u32 = shared_bytes(STAGES);

/// The pipeline depths `arch` can run: 3 everywhere, 4 where a CTA may opt in to 128 KiB.
pub fn stage_choices(arch: crate::runtime::Arch) -> &'static [usize] {
    if arch.major >= 8 && arch.minor == 0 {
        &[STAGES, DEEP_STAGES]
    } else {
        &[STAGES]
    }
}

/// The variant of `stages` stages (f64 in and out).
pub fn key(stages: usize) -> KernelKey {
    KernelKey::new("gemm_dmma").int("kStages", "s", stages as i64)
}
pub fn spec(stages: usize) -> KernelSpec {
    key(stages).spec("gemm_dmma.cu", SOURCE, "gemm_dmma", super::DEVICE_HEADERS)
}
/// The launch for an M x N problem of `batch` entries: grid (N tiles, M tiles, batch).
pub fn launch_config(m: usize, n: usize, batch: usize, stages: usize) -> LaunchConfig {
    LaunchConfig {
        grid: (n.div_ceil(TILE_N) as u32, m.div_ceil(TILE_M) as u32, batch as u32),
        ..LaunchConfig::linear(1, THREADS, shared_bytes(stages))
    }
}

/// A CPU replay of `gemm_dmma.cu`'s index maps, written out from the kernel: the copies into the
/// swizzled shared tiles (all three copy maps, with tails), the fragment loads, the DMMA
/// fragment layouts of the PTX ISA (m8n8k4, m16n8k8, m16n8k16 of .f64) and the epilogue's
/// accumulator map. No GPU runs here: these tests check the index arithmetic only.
#[cfg(test)]
mod tests {
    use super::*;

    const BM: usize = TILE_M;
    const BK: usize = TILE_K;
    const THREADS_N: usize = THREADS as usize;
    const WARPS_M: usize = 4;
    const WARPS_N: usize = 2;
    const WARP_TILE_M: usize = BM / WARPS_M; // 32
    const WARP_TILE_N: usize = TILE_N / WARPS_N; // 64

    /// gemm_dmma.cu's swz: element offset of 16-byte chunk `c` of row `r` in a [rows][16] tile.
    fn swz(r: usize, c: usize) -> usize {
        r * BK + ((c ^ (r & 7)) * 2)
    }
    /// Element offset of tile element (r, k).
    fn at(r: usize, k: usize) -> usize {
        swz(r, k / 2) + k % 2
    }

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Map {
        /// k-contiguous operand, 16-byte copies.
        Vec16,
        /// k-contiguous operand, 8-byte copies.
        KFast8,
        /// row-contiguous operand (column-major A, B [K, N]), 8-byte copies.
        Transposed,
    }

    /// One cp.async of one thread: destination element offset in the tile, copy size in
    /// doubles, doubles actually read (the rest zero-filled) and the operand (row, k) of its
    /// first double.
    struct Copy {
        dst: usize,
        size: usize,
        read: usize,
        row: i64,
        k: i64,
    }

    /// The copies of thread `tid` for the K tile at k0 (Loader's constructor and `load`).
    fn copies(map: Map, tid: usize, row0: usize, rows: usize, k0: usize, k: usize) -> Vec<Copy> {
        let (lane, w) = (tid % 32, tid / 32);
        let (r, step, kk) = match map {
            Map::Vec16 => (tid / 8, THREADS_N / 8, (tid % 8) * 2),
            Map::KFast8 => (tid / BK, THREADS_N / BK, tid % BK),
            Map::Transposed => ((lane & 7) + 64 * (w & 1), 8, (lane >> 3) + 4 * (w >> 1)),
        };
        let row = row0 + r;
        let slots_valid = if row < rows {
            8.min((rows - row).div_ceil(step))
        } else {
            0
        };
        let k_left = k as i64 - (k0 + kk) as i64;
        let dst = swz(r, kk / 2) + kk % 2;
        let dst_step = step * BK;
        let (slots, size) = if map == Map::Vec16 { (4, 2) } else { (8, 1) };
        (0..slots)
            .map(|i| {
                let read = if i < slots_valid && k_left > 0 {
                    (k_left as usize).min(size)
                } else {
                    0
                };
                Copy {
                    dst: dst + i * dst_step,
                    size,
                    read,
                    row: (row + i * step) as i64,
                    k: (k0 + kk) as i64,
                }
            })
            .collect()
    }

    #[test]
    fn copies_fill_every_tile_element_once_and_read_only_inside_the_operand() {
        for map in [Map::Vec16, Map::KFast8, Map::Transposed] {
            // (row0, rows, k0, k): a full tile, then tails in rows, k and both
            for (row0, rows, k0, k) in [
                (0, 128, 0, 16),
                (128, 1000, 32, 4096),
                (256, 300, 0, 16),
                (0, 1, 0, 1),
                (128, 130, 48, 55),
                (0, 77, 16, 17),
            ] {
                let value = |row: i64, kk: i64| (row * 1000 + kk) as f64 + 0.5;
                let mut tile = vec![f64::NAN; BM * BK];
                let mut written = vec![0u32; BM * BK];
                for tid in 0..THREADS_N {
                    for c in copies(map, tid, row0, rows, k0, k) {
                        for e in 0..c.size {
                            let (row, kk) = (c.row, c.k + e as i64);
                            let v = if e < c.read {
                                assert!(
                                    (row as usize) < rows && (kk as usize) < k,
                                    "{map:?}: read ({row}, {kk}) outside {rows} x {k}"
                                );
                                value(row, kk)
                            } else {
                                0.0
                            };
                            tile[c.dst + e] = v;
                            written[c.dst + e] += 1;
                        }
                    }
                }
                assert!(
                    written.iter().all(|&n| n == 1),
                    "{map:?}: an element written {written:?}"
                );
                for r in 0..BM {
                    for kk in 0..BK {
                        let (row, kg) = (row0 + r, k0 + kk);
                        let want = if row < rows && kg < k {
                            value(row as i64, kg as i64)
                        } else {
                            0.0
                        };
                        assert_eq!(
                            tile[at(r, kk)],
                            want,
                            "{map:?} ({row0}, {rows}, {k0}, {k}): ({r}, {kk})"
                        );
                    }
                }
            }
        }
    }

    /// True when the lanes of each wavefront group (`group` lanes) touch distinct 4-byte banks;
    /// `addr` gives each lane's first byte, `bytes` the access size.
    fn conflict_free(addr: &[usize], bytes: usize, group: usize) -> bool {
        addr.chunks(group).all(|lanes| {
            let mut banks: Vec<usize> = lanes
                .iter()
                .flat_map(|&a| (0..bytes / 4).map(move |w| (a / 4 + w) % 32))
                .collect();
            let n = banks.len();
            banks.sort_unstable();
            banks.dedup();
            banks.len() == n
        })
    }

    #[test]
    fn copies_are_bank_conflict_free() {
        for map in [Map::Vec16, Map::KFast8, Map::Transposed] {
            for w in 0..THREADS_N / 32 {
                let per_lane: Vec<Vec<Copy>> = (0..32).map(|l| copies(map, 32 * w + l, 0, 128, 0, 16)).collect();
                for i in 0..per_lane[0].len() {
                    let addr: Vec<usize> = per_lane.iter().map(|c| c[i].dst * 8).collect();
                    let bytes = per_lane[0][i].size * 8;
                    // 16-byte accesses: 8 lanes per wavefront; 8-byte: 16
                    assert!(
                        conflict_free(&addr, bytes, 128 / bytes),
                        "{map:?} warp {w} slot {i}: {addr:?}"
                    );
                }
            }
        }
    }

    /// The fragment loads of the kernel's k step `s` (kMmaK = `kmma`) for lane `lane` of warp
    /// (warp_m, warp_n): A element offsets per (mi, h, q) and B per (nj, q), as the kernel
    /// computes them (a_off / b_off plus row steps of 16 mi + 8 h and 8 nj).
    fn a_load(warp_m: usize, lane: usize, j: usize, mi: usize, h: usize) -> usize {
        let (g, t) = (lane / 4, lane % 4);
        swz(warp_m * WARP_TILE_M + g, 2 * t + j) + (mi * 16 + 8 * h) * BK
    }
    fn b_load(warp_n: usize, lane: usize, j: usize, nj: usize) -> usize {
        let (g, t) = (lane / 4, lane % 4);
        swz(warp_n * WARP_TILE_N + g, 2 * t + j) + nj * 8 * BK
    }

    #[test]
    fn fragment_loads_are_bank_conflict_free() {
        for warp_m in 0..WARPS_M {
            for warp_n in 0..WARPS_N {
                for j in 0..2 {
                    for mi in 0..2 {
                        for h in 0..2 {
                            let addr: Vec<usize> = (0..32).map(|l| a_load(warp_m, l, j, mi, h) * 8).collect();
                            assert!(conflict_free(&addr, 16, 8), "A j {j} mi {mi} h {h}: {addr:?}");
                        }
                    }
                    for nj in 0..8 {
                        let addr: Vec<usize> = (0..32).map(|l| b_load(warp_n, l, j, nj) * 8).collect();
                        assert!(conflict_free(&addr, 16, 8), "B j {j} nj {nj}: {addr:?}");
                    }
                }
            }
        }
    }

    /// Per-lane fragments of one warp: `a[lane][v]`, `b[lane][v]`, `d[lane][v]`.
    type Frag = Vec<Vec<f64>>;

    /// mma.m8n8k4 .f64 (PTX ISA): a = A[g][t], b = B[t][g], d[e] += D[g][2t + e].
    fn mma_m8n8k4(d: &mut Frag, off: usize, a: &[f64], b: &[f64]) {
        let (mut am, mut bm) = ([[f64::NAN; 4]; 8], [[f64::NAN; 8]; 4]);
        for l in 0..32 {
            am[l / 4][l % 4] = a[l];
            bm[l % 4][l / 4] = b[l];
        }
        for (l, dl) in d.iter_mut().enumerate() {
            let (g, t) = (l / 4, l % 4);
            for e in 0..2 {
                dl[off + e] += (0..4).map(|kk| am[g][kk] * bm[kk][2 * t + e]).sum::<f64>();
            }
        }
    }

    /// mma.m16n8k{8,16} .f64 (PTX ISA): a[2c + h] = A[g + 8h][t + 4c], b[c] = B[t + 4c][g],
    /// d[2h + e] += D[g + 8h][2t + e]. Every element of A and B comes from exactly one lane.
    fn mma_m16n8(d: &mut Frag, a: &Frag, b: &Frag, kdepth: usize) {
        let mut am = vec![vec![f64::NAN; kdepth]; 16];
        let mut bm = vec![vec![f64::NAN; 8]; kdepth];
        for l in 0..32 {
            let (g, t) = (l / 4, l % 4);
            for c in 0..kdepth / 4 {
                for h in 0..2 {
                    assert!(am[g + 8 * h][t + 4 * c].is_nan(), "A element from two lanes");
                    am[g + 8 * h][t + 4 * c] = a[l][2 * c + h];
                }
                assert!(bm[t + 4 * c][g].is_nan(), "B element from two lanes");
                bm[t + 4 * c][g] = b[l][c];
            }
        }
        for (l, dl) in d.iter_mut().enumerate() {
            let (g, t) = (l / 4, l % 4);
            for h in 0..2 {
                for e in 0..2 {
                    dl[2 * h + e] += (0..kdepth).map(|kk| am[g + 8 * h][kk] * bm[kk][2 * t + e]).sum::<f64>();
                }
            }
        }
    }

    /// ts::mma_m16n8k8_f64 before sm_90: four m8n8k4 on (rows g, g + 8) x (k slices 0, 1).
    fn mma_m16n8k8_pre_sm90(d: &mut Frag, a: &Frag, b: &Frag) {
        let col = |f: &Frag, v: usize| -> Vec<f64> { f.iter().map(|x| x[v]).collect() };
        mma_m8n8k4(d, 0, &col(a, 0), &col(b, 0));
        mma_m8n8k4(d, 2, &col(a, 1), &col(b, 0));
        mma_m8n8k4(d, 0, &col(a, 2), &col(b, 1));
        mma_m8n8k4(d, 2, &col(a, 3), &col(b, 1));
    }

    /// Small integers, so every sum below is exact.
    fn ints(n: usize, seed: u64) -> Vec<f64> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x % 17) as f64) - 8.0
            })
            .collect()
    }

    #[test]
    fn pre_sm90_fallbacks_equal_the_sm90_shapes() {
        let a: Frag = (0..32).map(|l| ints(8, 11 + l)).collect();
        let b: Frag = (0..32).map(|l| ints(4, 101 + l)).collect();
        let k8 = |f: &Frag, lo: usize, n: usize| -> Frag { f.iter().map(|x| x[lo..lo + n].to_vec()).collect() };
        // m16n8k8: the documented shape against four m8n8k4
        let (mut native, mut fallback) = (vec![vec![0.0; 4]; 32], vec![vec![0.0; 4]; 32]);
        mma_m16n8(&mut native, &k8(&a, 0, 4), &k8(&b, 0, 2), 8);
        mma_m16n8k8_pre_sm90(&mut fallback, &k8(&a, 0, 4), &k8(&b, 0, 2));
        assert_eq!(native, fallback);
        // m16n8k16: the documented shape against two m16n8k8 on a[0..4], b[0..2] and a[4..8], b[2..4]
        let (mut native, mut fallback) = (vec![vec![0.0; 4]; 32], vec![vec![0.0; 4]; 32]);
        mma_m16n8(&mut native, &a, &b, 16);
        mma_m16n8(&mut fallback, &k8(&a, 0, 4), &k8(&b, 0, 2), 8);
        mma_m16n8(&mut fallback, &k8(&a, 4, 4), &k8(&b, 2, 2), 8);
        assert_eq!(native, fallback);
    }

    /// The kernel's main loop over one K tile for every warp, on tiles stored through the
    /// swizzle, with kMmaK = 16 (sm_90: m16n8k16) or 8 (sm_80/86/89: m16n8k8 as four m8n8k4);
    /// the epilogue's map then places every accumulator, which must equal A @ B^T.
    #[test]
    fn fragments_and_epilogue_compute_the_tile_product() {
        let a = ints(BM * BK, 7);
        let b = ints(TILE_N * BK, 8);
        let (mut sa, mut sb) = (vec![f64::NAN; BM * BK], vec![f64::NAN; TILE_N * BK]);
        for r in 0..BM {
            for kk in 0..BK {
                sa[at(r, kk)] = a[r * BK + kk];
                sb[at(r, kk)] = b[r * BK + kk];
            }
        }
        for kmma in [16, 8] {
            let steps = BK / kmma;
            let step_chunks = kmma / 8;
            let mut d = vec![f64::NAN; BM * TILE_N];
            for warp in 0..THREADS_N / 32 {
                let (warp_m, warp_n) = (warp / WARPS_N, warp % WARPS_N);
                // acc[mi][nj][lane][e]
                let mut acc = vec![vec![vec![vec![0.0; 4]; 32]; 8]; 2];
                for s in 0..steps {
                    let mut fa = vec![vec![vec![f64::NAN; kmma / 2]; 32]; 2];
                    for q in 0..step_chunks {
                        let j = step_chunks * s + q;
                        for (mi, fa_mi) in fa.iter_mut().enumerate() {
                            for (lane, f) in fa_mi.iter_mut().enumerate() {
                                for h in 0..2 {
                                    let o = a_load(warp_m, lane, j, mi, h);
                                    f[4 * q + h] = sa[o];
                                    f[4 * q + 2 + h] = sa[o + 1];
                                }
                            }
                        }
                    }
                    for nj in 0..8 {
                        let mut fb = vec![vec![f64::NAN; kmma / 4]; 32];
                        for q in 0..step_chunks {
                            for (lane, f) in fb.iter_mut().enumerate() {
                                let o = b_load(warp_n, lane, step_chunks * s + q, nj);
                                f[2 * q] = sb[o];
                                f[2 * q + 1] = sb[o + 1];
                            }
                        }
                        for (acc_mi, fa_mi) in acc.iter_mut().zip(&fa) {
                            if kmma == 16 {
                                mma_m16n8(&mut acc_mi[nj], fa_mi, &fb, 16);
                            } else {
                                mma_m16n8k8_pre_sm90(&mut acc_mi[nj], fa_mi, &fb);
                            }
                        }
                    }
                }
                for (mi, acc_mi) in acc.iter().enumerate() {
                    for (nj, acc_tile) in acc_mi.iter().enumerate() {
                        for (lane, v) in acc_tile.iter().enumerate() {
                            let (g, t) = (lane / 4, lane % 4);
                            for (e, &x) in v.iter().enumerate() {
                                let row = warp_m * WARP_TILE_M + mi * 16 + g + 8 * (e >> 1);
                                let col = warp_n * WARP_TILE_N + nj * 8 + 2 * t + (e & 1);
                                assert!(d[row * TILE_N + col].is_nan(), "D[{row}][{col}] twice");
                                d[row * TILE_N + col] = x;
                            }
                        }
                    }
                }
            }
            for m in 0..BM {
                for n in 0..TILE_N {
                    let want: f64 = (0..BK).map(|kk| a[m * BK + kk] * b[n * BK + kk]).sum();
                    assert_eq!(d[m * TILE_N + n], want, "kMmaK {kmma}: D[{m}][{n}]");
                }
            }
        }
    }

    #[test]
    fn shared_memory_fits_every_target() {
        // 3 x (128 + 128) x 16 doubles; sm_86/89 allow 99 KiB of opt-in shared memory per CTA
        assert_eq!(SHARED_BYTES, 96 * 1024);
        const { assert!(SHARED_BYTES <= 99 * 1024) };
        // the deep pipeline only where 128 KiB may be opted in to (sm_80: 163 KiB, sm_90: 227)
        assert_eq!(shared_bytes(DEEP_STAGES), 128 * 1024);
        let arch = |major, minor| crate::runtime::Arch { major, minor };
        assert_eq!(stage_choices(arch(9, 0)), &[3, 4]);
        assert_eq!(stage_choices(arch(8, 0)), &[3, 4]);
        assert_eq!(stage_choices(arch(8, 6)), &[3]);
        assert_eq!(stage_choices(arch(8, 9)), &[3]);
    }
}
