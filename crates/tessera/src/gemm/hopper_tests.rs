//! Tests of the Hopper GEMM path that need no GPU: argument rules, tile choice, tensor-map
//! geometry, the parameter struct's layout, the tile order, the epilogue's staging layout, the
//! f64 reference's activations, and (with NVRTC) every kernel variant compiled for sm_90a
//! without spills or serialised wgmma.

use std::mem::{align_of, offset_of, size_of};

use super::hopper::*;
use crate::dtype::DType;
use crate::runtime::probe::nvrtc_or_skip;
use crate::runtime::{compile_only, tma, Arch};

/// A valid call: bf16, B [N, K], every epilogue input present, batched, padded leading dims.
fn args() -> HopperGemmArgs {
    let (m, n, k) = (300, 1000, 520);
    HopperGemmArgs {
        m,
        n,
        k,
        batch: 2,
        dtype: DType::BF16,
        out_dtype: DType::BF16,
        a: 0x10000,
        lda: 528,
        stride_a: 528 * m,
        b: 0x20000,
        ldb: 528,
        stride_b: 528 * n,
        b_nk: true,
        c: 0x30000,
        ldc: 1008,
        stride_c: 1008 * m,
        beta: 0.5,
        d: 0x40000,
        ldd: 1008,
        stride_d: 1008 * m,
        bias: 0x50000,
        residual: 0x60000,
        ldr: 1008,
        stride_r: 1008 * m,
        alpha: 1.0,
        activation: 2,
        glu: false,
        scale_a: 0,
        scale_a_rows: false,
        scale_b: 0,
        scale_b_cols: false,
        scale_result: 0,
        amax: 0,
    }
}

/// A valid int8 call with s32 output (torch._int_mm): no epilogue, B [N, K].
fn int_args() -> HopperGemmArgs {
    HopperGemmArgs {
        dtype: DType::I8,
        out_dtype: DType::I32,
        c: 0,
        beta: 0.0,
        bias: 0,
        residual: 0,
        activation: 0,
        ..args()
    }
}

#[test]
fn fp8_outputs_take_a_result_scale_and_an_amax_and_no_c_bias_or_residual() {
    let fp8 = HopperGemmArgs {
        dtype: DType::F8E4M3,
        out_dtype: DType::F8E5M2,
        c: 0,
        beta: 0.0,
        bias: 0,
        residual: 0,
        scale_a: 0x70000,
        scale_b: 0x70100,
        scale_result: 0x70200,
        amax: 0x70300,
        ..args()
    };
    assert_eq!(hopper_supports(&fp8), Ok(()));
    assert_eq!(
        hopper_supports(&HopperGemmArgs {
            out_dtype: DType::F8E4M3,
            ..fp8
        }),
        Ok(())
    );
    for (bad, want) in [
        (HopperGemmArgs { bias: 0x50000, ..fp8 }, "no C, bias or residual"),
        (
            HopperGemmArgs {
                c: 0x30000,
                beta: 0.5,
                ..fp8
            },
            "no C, bias or residual",
        ),
        (
            HopperGemmArgs {
                residual: 0x60000,
                ..fp8
            },
            "no C, bias or residual",
        ),
        (HopperGemmArgs { amax: 0x70302, ..fp8 }, "amax: address"),
        (
            HopperGemmArgs {
                scale_result: 0x70201,
                ..fp8
            },
            "scale_result: address",
        ),
        (
            HopperGemmArgs {
                out_dtype: DType::BF16,
                scale_result: 0,
                ..fp8
            },
            "amax: applies to fp8 outputs only",
        ),
        (
            HopperGemmArgs {
                amax: 0,
                out_dtype: DType::F32,
                ..fp8
            },
            "scale_result: applies to fp8 outputs only",
        ),
        (
            HopperGemmArgs {
                dtype: DType::BF16,
                scale_a: 0,
                scale_b: 0,
                ..fp8
            },
            "out_dtype",
        ),
    ] {
        let err = hopper_supports(&bad).expect_err(want);
        assert!(err.contains(want), "{err} lacks {want}");
    }
}

#[test]
fn a_valid_call_is_supported_in_every_variant() {
    assert_eq!(hopper_supports(&args()), Ok(()));
    for dtype in [DType::F16, DType::BF16] {
        for out_dtype in [dtype, DType::F32] {
            for b_nk in [true, false] {
                let a = HopperGemmArgs {
                    dtype,
                    out_dtype,
                    b_nk,
                    ldb: if b_nk { 528 } else { 1008 },
                    stride_b: 528 * 1008,
                    ..args()
                };
                assert_eq!(hopper_supports(&a), Ok(()), "{a:?}");
            }
        }
    }
    // Optional inputs may be absent; C may alias D exactly; a batch of one ignores strides.
    let bare = HopperGemmArgs {
        c: 0,
        bias: 0,
        residual: 0,
        batch: 1,
        stride_a: 3,
        stride_d: 0,
        ..args()
    };
    assert_eq!(hopper_supports(&bare), Ok(()));
    let alias = HopperGemmArgs { c: 0x40000, ..args() };
    assert_eq!(hopper_supports(&alias), Ok(()));
    // Tails of every size: M = N = K = 1.
    let tiny = HopperGemmArgs {
        m: 1,
        n: 1,
        k: 1,
        lda: 8,
        ldb: 8,
        ldc: 8,
        ldd: 8,
        ldr: 8,
        batch: 1,
        ..args()
    };
    assert_eq!(hopper_supports(&tiny), Ok(()));
    // tf32, fp8 and int8 operands: every output of each, B [N, K], scales on the 8-bit ones.
    for dtype in [DType::F32, DType::F8E4M3, DType::F8E5M2, DType::I8] {
        for &out_dtype in hopper_outputs(dtype) {
            let eight = dtype.size() == 1;
            let a = if out_dtype == DType::I32 {
                int_args()
            } else {
                HopperGemmArgs {
                    dtype,
                    out_dtype,
                    ldc: 1024,
                    ldd: 1024,
                    ldr: 1024,
                    stride_c: 1024 * 300,
                    stride_d: 1024 * 300,
                    stride_r: 1024 * 300,
                    scale_a: if eight { 0x70000 } else { 0 },
                    scale_a_rows: eight,
                    scale_b: if eight { 0x80000 } else { 0 },
                    // fp8 outputs take no C, bias or residual
                    c: if out_dtype.size() == 1 { 0 } else { 0x30000 },
                    beta: if out_dtype.size() == 1 { 0.0 } else { 0.5 },
                    bias: if out_dtype.size() == 1 { 0 } else { 0x50000 },
                    residual: if out_dtype.size() == 1 { 0 } else { 0x60000 },
                    ..args()
                }
            };
            assert_eq!(hopper_supports(&a), Ok(()), "{a:?}");
        }
    }
}

/// Every rule names its argument.
#[test]
fn broken_rules_name_the_argument() {
    let cases: Vec<(HopperGemmArgs, &str)> = vec![
        (
            HopperGemmArgs {
                dtype: DType::F64,
                ..args()
            },
            "dtype",
        ),
        (
            HopperGemmArgs {
                dtype: DType::F32,
                out_dtype: DType::F32,
                b_nk: false,
                ldb: 1008,
                ldc: 1008,
                ..args()
            },
            "b: fp32 operands need B stored [N, K]",
        ),
        (
            HopperGemmArgs {
                scale_a: 0x70000,
                ..args()
            },
            "scale_a: scales apply to fp8 and int8",
        ),
        (
            HopperGemmArgs {
                dtype: DType::F8E4M3,
                scale_b: 0x70002,
                ..args()
            },
            "scale_b: address",
        ),
        (
            HopperGemmArgs {
                bias: 0x50000,
                ..int_args()
            },
            "out_dtype: an i32 output",
        ),
        (
            HopperGemmArgs {
                alpha: 2.0,
                ..int_args()
            },
            "out_dtype: an i32 output",
        ),
        (
            HopperGemmArgs {
                out_dtype: DType::I32,
                ..args()
            },
            "out_dtype",
        ),
        (
            HopperGemmArgs {
                out_dtype: DType::F16,
                ..args()
            },
            "out_dtype",
        ),
        (HopperGemmArgs { m: 0, ..args() }, "m:"),
        (HopperGemmArgs { k: 0, ..args() }, "k:"),
        (HopperGemmArgs { n: 1 << 31, ..args() }, "n:"),
        (
            HopperGemmArgs {
                activation: 5,
                ..args()
            },
            "activation",
        ),
        (HopperGemmArgs { a: 0, ..args() }, "a: null"),
        (HopperGemmArgs { a: 0x10008, ..args() }, "a: base address"),
        (
            HopperGemmArgs { lda: 512, ..args() },
            "a: leading dimension 512 is below",
        ),
        (HopperGemmArgs { lda: 530, ..args() }, "a: leading dimension 530"),
        (HopperGemmArgs { ldb: 524, ..args() }, "b: leading dimension"),
        (
            HopperGemmArgs {
                stride_b: 528 * 1000 + 4,
                ..args()
            },
            "b: batch stride",
        ),
        (HopperGemmArgs { ldd: 1004, ..args() }, "d: leading dimension"),
        (
            HopperGemmArgs {
                stride_d: 1008 * 299,
                ..args()
            },
            "d: batch stride",
        ),
        (HopperGemmArgs { c: 0x30004, ..args() }, "c: base address"),
        (HopperGemmArgs { ldr: 1001, ..args() }, "residual: leading dimension"),
        (
            HopperGemmArgs {
                bias: 0x50002,
                ..args()
            },
            "bias",
        ),
        (
            HopperGemmArgs {
                c: 0x40000,
                ldc: 1016,
                stride_c: 1016 * 300,
                ..args()
            },
            "c: aliases d",
        ),
    ];
    for (a, name) in cases {
        match hopper_supports(&a) {
            Err(rule) => assert!(rule.starts_with(name), "{name}: got `{rule}`"),
            Ok(()) => panic!("{name}: accepted {a:?}"),
        }
    }
    // [K, N] B: its rows are N long.
    let kn = HopperGemmArgs {
        b_nk: false,
        ldb: 528,
        ..args()
    };
    assert!(hopper_supports(&kn)
        .unwrap_err()
        .starts_with("b: leading dimension 528 is below the row length 1000"));
}

#[test]
fn tile_choice_follows_waves() {
    let sms = 132;
    // The shapes all take 128 x 256 tiles.
    for (m, n) in [
        (2048, 2048),
        (4096, 4096),
        (8192, 8192),
        (4096, 14336),
        (4096, 28672),
        (4096, 8192),
    ] {
        assert_eq!(choose_tile(m, n, 1, sms), TILES[0], "{m} x {n}");
    }
    // 4096 x 384: 256-column tiles pad N to 512 and both fill one wave; 128 columns cost less.
    assert_eq!(choose_tile(4096, 384, 1, sms), TILES[1]);
    // A problem of one tile either way: the narrow tile has half the work.
    assert_eq!(choose_tile(1, 1, 1, sms), TILES[1]);
    // 2048 x 2048: one wave of 128 wide tiles against two of 256 narrow ones.
    assert_eq!(choose_tile(2048, 2048, 1, sms), TILES[0]);
    for t in TILES {
        assert!(shared_bytes(t) <= 227 * 1024, "{t:?}: {}", shared_bytes(t));
        assert_eq!(shared_bytes(t), 4 * 48 * 1024 + 32 * 1024 + 16 * t.stages + 1024);
    }
}

#[test]
fn group_rows_make_square_waves() {
    assert_eq!(group_rows(32, 132, 256), 16);
    assert_eq!(group_rows(32, 132, 128), 11);
    assert_eq!(group_rows(4, 132, 256), 4);
    assert_eq!(group_rows(1, 1, 128), 1);
}

/// gemm_sm90.cu's tile_of, mirrored: the tile (row, column, batch) that the CTA of rank `rank`
/// takes in cluster tile t of a launch with `cluster` CTAs per cluster and `group_m` cluster
/// rows per group.
fn tile_of(
    tiles_m: usize,
    tiles_n: usize,
    group_m: usize,
    cluster: usize,
    t: usize,
    rank: usize,
) -> (usize, usize, usize) {
    let cluster_rows = tiles_m.div_ceil(cluster);
    let per_batch = cluster_rows * tiles_n;
    let b = t / per_batch;
    let mut r = t - b * per_batch;
    let group_tiles = group_m * tiles_n;
    let g = r / group_tiles;
    let first = g * group_m;
    let rows = (cluster_rows - first).min(group_m);
    r -= g * group_tiles;
    ((first + r % rows) * cluster + rank, r / rows, b)
}

/// The grouped order visits every tile exactly once, for group sizes that do and do not divide
/// the (cluster) tile rows; with clusters of two, the ranks of a cluster tile take vertically
/// adjacent tiles of one column (sharing its B tile), and only an odd tile-row count's last
/// cluster row has a second tile past M.
#[test]
fn tile_order_is_a_permutation() {
    for (tm, tn, batch) in [(1usize, 1, 1), (3, 5, 2), (32, 16, 1), (33, 57, 1), (7, 1, 3)] {
        for cluster in [1, 2] {
            let cluster_rows = tm.div_ceil(cluster);
            for g in [1, 2, 5, 16, 40] {
                let g = g.min(cluster_rows);
                let mut seen = vec![false; tm * tn * batch];
                let mut past_m = 0;
                for t in 0..cluster_rows * tn * batch {
                    let first = tile_of(tm, tn, g, cluster, t, 0);
                    for rank in 0..cluster {
                        let (i, j, b) = tile_of(tm, tn, g, cluster, t, rank);
                        assert_eq!((i, j, b), (first.0 + rank, first.1, first.2), "one B tile per cluster");
                        assert!(j < tn && b < batch, "{tm} {tn} {g} t {t}");
                        if i >= tm {
                            past_m += 1;
                            continue;
                        }
                        let at = (b * tm + i) * tn + j;
                        assert!(!seen[at], "tile visited twice: {tm} {tn} {g} t {t}");
                        seen[at] = true;
                    }
                }
                assert!(seen.iter().all(|&s| s), "every tile: {tm} {tn} {g} cluster {cluster}");
                assert_eq!(past_m, (cluster_rows * cluster - tm) * tn * batch);
            }
        }
    }
}

/// Clusters of two where tile rows pair up, and where an odd count wastes at most a ninth.
#[test]
fn cluster_choice_pairs_tile_rows() {
    assert_eq!(choose_cluster(1), 1);
    assert_eq!(choose_cluster(2), 2);
    assert_eq!(choose_cluster(3), 1);
    assert_eq!(choose_cluster(7), 1);
    assert_eq!(choose_cluster(9), 2);
    assert_eq!(choose_cluster(32), 2);
}

#[test]
fn tensor_maps_describe_the_operands() {
    let a = args();
    let [am, bm, dm] = map_shapes(&a, TILES[0], 1);
    assert_eq!((am.box_cols, am.box_rows), (64, 128));
    assert_eq!(am.geometry(), ([520, 300, 2, 1], [1056, 1056 * 300, 1056 * 300 * 2]));
    assert_eq!((bm.cols, bm.rows, bm.box_cols, bm.box_rows), (520, 1000, 64, 256));
    assert_eq!((dm.box_cols, dm.box_rows, dm.load), (64, 64, false));
    // B [K, N]: N is the inner dimension, 64 x 64 boxes.
    let kn = HopperGemmArgs {
        b_nk: false,
        ldb: 1008,
        ..a
    };
    let [_, bm, _] = map_shapes(&kn, TILES[1], 1);
    assert_eq!((bm.cols, bm.rows, bm.box_cols, bm.box_rows), (1000, 520, 64, 64));
    // In a cluster of two each CTA loads half of a B [N, K] tile's rows; B [K, N] keeps its
    // 64 x 64 boxes (each CTA loads half of the column blocks).
    let [_, bm, _] = map_shapes(&a, TILES[0], 2);
    assert_eq!((bm.box_cols, bm.box_rows), (64, 128));
    let [_, bm, _] = map_shapes(&kn, TILES[0], 2);
    assert_eq!((bm.box_cols, bm.box_rows), (64, 64));
    // f32 output: 32-column (128-byte) boxes; a batch of one gets a packed batch stride.
    let f32_out = HopperGemmArgs {
        out_dtype: DType::F32,
        batch: 1,
        ldd: 1004,
        ..a
    };
    let [_, _, dm] = map_shapes(&f32_out, TILES[0], 1);
    assert_eq!(dm.box_cols, 32);
    assert_eq!(dm.geometry(), ([1000, 300, 1, 1], [4016, 4016 * 300, 4016 * 300]));
    // 8-bit operands: 128-element (128-byte) k boxes described as bytes; tf32: 32 elements.
    let fp8 = HopperGemmArgs {
        dtype: DType::F8E4M3,
        ..a
    };
    let [am8, bm8, _] = map_shapes(&fp8, TILES[0], 1);
    assert_eq!(
        (am8.dtype, am8.box_cols, bm8.dtype, bm8.box_cols),
        (DType::U8, 128, DType::U8, 128)
    );
    let tf32 = HopperGemmArgs {
        dtype: DType::F32,
        out_dtype: DType::F32,
        ..a
    };
    let [am32, bm32, _] = map_shapes(&tf32, TILES[1], 1);
    assert_eq!((am32.box_cols, bm32.box_cols, bm32.box_rows), (32, 32, 128));
    assert_eq!(
        (block_k(DType::F16), block_k(DType::F32), block_k(DType::I8)),
        (64, 32, 128)
    );
    // TMA's host-side rules hold for every map of a supported call.
    for s in map_shapes(&a, TILES[0], 1)
        .iter()
        .chain(map_shapes(&kn, TILES[1], 1).iter())
        .chain(map_shapes(&fp8, TILES[0], 1).iter())
        .chain(map_shapes(&tf32, TILES[1], 1).iter())
    {
        let (dims, strides) = s.geometry();
        let m = tma::TiledMap {
            ptr: s.ptr,
            dtype: s.dtype,
            dims: &dims,
            byte_strides: &strides,
            stride_names: &[],
            box_dims: &[s.box_cols, s.box_rows, 1, 1],
            element_strides: &[1; 4],
            swizzle: tma::Swizzle::B128,
            l2_promotion: tma::L2Promotion::None,
            oob_fill: tma::OobFill::Zeros,
        };
        assert!(tma::check(&m).is_ok(), "{s:?}");
        assert!(
            s.box_cols as usize * s.dtype.size() <= 128 && s.box_rows <= 256,
            "{s:?}"
        );
    }
}

#[test]
fn params_struct_matches_the_kernel() {
    assert_eq!(size_of::<GemmParams>(), 576);
    assert_eq!(align_of::<GemmParams>(), 64);
    // The field order of gemm_sm90.cu (which static_asserts the size).
    assert_eq!(offset_of!(GemmParams, c), 384);
    assert_eq!(offset_of!(GemmParams, ldc), 408);
    assert_eq!(offset_of!(GemmParams, alpha), 440);
    assert_eq!(offset_of!(GemmParams, m), 448);
    assert_eq!(offset_of!(GemmParams, activation), 480);
    assert_eq!(offset_of!(GemmParams, scale_a), 488);
    assert_eq!(offset_of!(GemmParams, scale_b), 496);
    assert_eq!(offset_of!(GemmParams, scale_a_rows), 504);
    assert_eq!(offset_of!(GemmParams, scale_b_cols), 508);
    assert_eq!(offset_of!(GemmParams, scale_result), 512);
    assert_eq!(offset_of!(GemmParams, amax), 520);
    assert_eq!(offset_of!(GemmParams, cluster_m), 528);
    assert_eq!(offset_of!(GemmParams, cluster_rows), 532);
}

/// The epilogue's staging writes (gemm_sm90.cu stage_pair): every output of a consumer's chunk
/// lands in its own place of the 8 KiB buffer at TMA's 128-byte swizzle position, and a warp's
/// 16-bit stores of one accumulator block hit 32 distinct banks.
#[test]
fn staging_layout_is_tmas_swizzle_without_bank_conflicts() {
    for out_size in [2usize, 4] {
        let store_cols = 128 / out_size;
        let mut seen = vec![false; 64 * 128];
        for warp in 0..4 {
            for lb in 0..store_cols / 8 {
                for h in 0..2 {
                    let mut banks = vec![0; 32];
                    for lane in 0..32 {
                        let r = warp * 16 + lane / 4 + 8 * h;
                        let cc = 8 * lb + 2 * (lane % 4);
                        let bc = cc * out_size;
                        let off = r * 128 + ((((bc >> 4) ^ (r & 7)) << 4) | (bc & 15));
                        // TMA's 128-byte swizzle: 16-byte chunk j of row r at chunk j ^ (r % 8).
                        assert_eq!(off / 128, r);
                        assert_eq!((off % 128) / 16, (bc / 16) ^ (r % 8));
                        for (byte, s) in seen.iter_mut().enumerate().skip(off).take(2 * out_size) {
                            assert!(!*s, "byte {byte} written twice");
                            *s = true;
                        }
                        for word in (off / 4)..(off + 2 * out_size) / 4 {
                            banks[word % 32] += 1;
                        }
                    }
                    if out_size == 2 {
                        assert!(banks.iter().all(|&b| b == 1), "bank conflict: {banks:?}");
                    }
                }
            }
        }
        assert!(seen.iter().all(|&s| s), "every byte of the chunk written");
    }
}

#[test]
fn reference_activations() {
    // erf against known values.
    for (x, want) in [
        (0.0, 0.0),
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.5, 0.999_593_047_982_555),
        (3.5, 0.999_999_256_901_628),
        (-1.0, -0.842_700_792_949_714_9),
    ] {
        assert!((erf(x) - want).abs() < 1e-13, "erf({x}) = {}", erf(x));
    }
    assert_eq!(activate(0, -2.0), -2.0);
    assert_eq!(activate(1, -2.0), 0.0);
    assert!((activate(2, 1.0) - 0.841_344_746_068_543).abs() < 1e-12);
    assert!((activate(3, 1.0) - 0.841_191_990_607_477_2).abs() < 1e-12);
    assert!((activate(4, 1.0) - 0.731_058_578_630_004_9).abs() < 1e-12);
}

#[test]
fn kernel_variants_are_hopper_only_and_distinct() {
    let specs = kernel_specs(Arch::SM90);
    // 16-bit: 2 dtypes x 2 outputs x 2 B layouts x 3 tilings; tf32: 1 x 1 x 3; fp8: 2 x 5 x 1 x 3;
    // int8: 4 outputs x 1 x 3; the GLU variants of the 16-bit ones.
    assert_eq!(specs.len(), 24 + 3 + 30 + 12 + 24);
    let mut names: Vec<_> = specs.iter().map(|s| s.name.clone()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), specs.len());
    for arch in [Arch::SM80, Arch::SM86, Arch::SM89] {
        assert!(kernel_specs(arch).is_empty());
    }
    // The self-check covers both dtypes, layouts, tilings and output kinds.
    let cases = check_cases();
    assert!(cases.iter().any(|c| c.b_nk) && cases.iter().any(|c| !c.b_nk));
    assert!(cases.iter().any(|c| c.out_dtype == DType::F32));
    for dtype in HOPPER_OPERANDS {
        for &out in hopper_outputs(dtype) {
            if dtype.size() != 2 && out != DType::F16 && out.size() != 1 {
                // every (operand, output) pair of the new precisions but f16 out (the same
                // store code as bf16) and fp8 out (with its result scale and amax, checked
                // through the plan: plan_self_check)
                assert!(
                    cases.iter().any(|c| c.dtype == dtype && c.out_dtype == out) || dtype == DType::F8E5M2,
                    "{dtype} -> {out}"
                );
            }
        }
        assert!(cases.iter().any(|c| c.dtype == dtype), "{dtype}");
    }
    assert!(cases.iter().any(|c| c.scales == 1) && cases.iter().any(|c| c.scales == 2));
    // forced tile-order groups, with and without clusters
    assert!(cases.iter().any(|c| c.group.is_some() && c.cluster == Some(1)));
    assert!(cases.iter().any(|c| c.group.is_some() && c.cluster == Some(2)));
    // GLU: each gate activation, both layouts, f32 out, bias, both tilings
    for code in [2, 3, 4] {
        assert!(cases.iter().any(|c| c.glu && c.activation == code), "glu {code}");
    }
    let glu: Vec<_> = cases.iter().filter(|c| c.glu).collect();
    assert!(glu.iter().any(|c| c.b_nk) && glu.iter().any(|c| !c.b_nk));
    assert!(glu.iter().any(|c| c.out_dtype == DType::F32) && glu.iter().any(|c| c.bias));
    assert!(glu.iter().any(|c| c.tile == Some(TILES[0])) && glu.iter().any(|c| c.tile == Some(TILES[1])));
    for code in 0..=MAX_ACTIVATION {
        assert!(cases.iter().any(|c| c.activation == code), "activation {code}");
    }
    // ping-pong: both B layouts, clusters on and off, C and residual, 8-bit operands, a GLU
    let pp: Vec<_> = cases.iter().filter(|c| c.tile == Some(PINGPONG_TILE)).collect();
    assert!(pp.iter().any(|c| c.b_nk) && pp.iter().any(|c| !c.b_nk));
    assert!(pp.iter().any(|c| c.cluster == Some(1)) && pp.iter().any(|c| c.cluster == Some(2)));
    assert!(pp.iter().any(|c| c.beta.is_some() && c.residual));
    assert!(pp.iter().any(|c| c.dtype.size() == 1) && pp.iter().any(|c| c.glu));
}

/// Every variant compiles for sm_90a with no spills, no stack and no serialised wgmma (C7520),
/// within the consumers' 232 registers.
#[test]
fn every_hopper_gemm_variant_compiles_without_spills() {
    if !nvrtc_or_skip("every_hopper_gemm_variant_compiles_without_spills") {
        return;
    }
    let mut failures = Vec::new();
    for spec in kernel_specs(Arch::SM90) {
        match compile_only(&spec, Arch::SM90) {
            Ok(c) if c.log.contains("wgmma.mma_async instructions are serialized") => {
                failures.push(format!("{}: serialised wgmma (C7520)\n{}", spec.name, c.log))
            }
            Ok(c) if !c.resources.spill_free() => failures.push(format!("{}: spills {:?}", spec.name, c.resources)),
            Ok(c) => eprintln!("{}: {} registers", spec.name, c.resources.registers),
            Err(e) => failures.push(format!("{}: {e}", spec.name)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn k_heavy_shapes_split_k_into_equal_block_multiples() {
    use crate::gemm::plan::{hopper_splits, HOPPER_MAX_SPLITS, HOPPER_MIN_SPLIT_BLOCKS};
    use crate::gemm::problem::{GemmProblem, Precision};
    let bf16 = |m, n, k| GemmProblem::new(Precision::BF16, DType::BF16, m, n, k);
    // the K-heavy shapes on 132 SMs
    assert_eq!(hopper_splits(&bf16(128, 128, 65536), 132, None).unwrap(), (64, 1024));
    assert_eq!(hopper_splits(&bf16(256, 256, 32768), 132, None).unwrap(), (32, 1024));
    // enough tiles, or K too short or not divisible into k-block multiples: no split
    assert_eq!(hopper_splits(&bf16(4096, 4096, 4096), 132, None).unwrap(), (1, 4096));
    assert_eq!(hopper_splits(&bf16(128, 128, 256), 132, None).unwrap(), (1, 256));
    assert_eq!(hopper_splits(&bf16(128, 128, 1000), 132, None).unwrap(), (1, 1000));
    // fp8's k-blocks are 128 deep
    let fp8 = GemmProblem::new(Precision::Fp8E4M3, DType::BF16, 64, 136, 16384);
    let (s, kc) = hopper_splits(&fp8, 132, None).unwrap();
    assert!(
        s > 1 && s * kc == 16384 && kc % 128 == 0 && kc >= HOPPER_MIN_SPLIT_BLOCKS * 128,
        "{s} x {kc}"
    );
    // batched problems and i32 outputs never split; a forced count is checked
    let batched = bf16(128, 128, 65536).batched(2);
    assert_eq!(hopper_splits(&batched, 132, None).unwrap(), (1, 65536));
    let int8 = GemmProblem::new(Precision::Int8, DType::I32, 128, 128, 65536);
    assert_eq!(hopper_splits(&int8, 132, None).unwrap(), (1, 65536));
    // nor do fp8 outputs (their conversion and amax live in the Hopper epilogue)
    let fp8_out = GemmProblem::new(Precision::Fp8E4M3, DType::F8E4M3, 128, 128, 65536);
    assert_eq!(hopper_splits(&fp8_out, 132, None).unwrap(), (1, 65536));
    assert!(hopper_splits(&fp8_out, 132, Some(16)).is_err());
    assert_eq!(
        hopper_splits(&bf16(128, 128, 65536), 132, Some(16)).unwrap(),
        (16, 4096)
    );
    assert_eq!(hopper_splits(&bf16(128, 128, 65536), 132, Some(1)).unwrap(), (1, 65536));
    for bad in [3, HOPPER_MAX_SPLITS as u32 * 2] {
        let e = hopper_splits(&bf16(128, 128, 65536), 132, Some(bad)).unwrap_err();
        assert!(e.to_string().contains("splits"), "{e}");
    }
}

#[test]
fn autotune_file_lines_round_trip_and_bad_lines_are_skipped() {
    use crate::gemm::autotune::{format, parse, HopperChoice};
    let text = "NVIDIA H100 sm_90a bf16 ->bf16 128x128x65536 bnk None\t128\t64\n\
                bad line\n\
                k2\t300\t1\n\
                k3\t256\t0\n\
                k4\t256\t2\textra\n\
                NVIDIA H100 sm_90a bf16 ->bf16 2048x2048x2048 bnk None\t256\t1\n";
    let got = parse(text);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(
        got["NVIDIA H100 sm_90a bf16 ->bf16 128x128x65536 bnk None"],
        HopperChoice {
            block_n: 128,
            splits: 64
        }
    );
    assert_eq!(parse(&format(&got)), got);
}

#[test]
fn autotune_candidates_start_with_the_rules_choice() {
    use crate::gemm::autotune::{candidates, MAX_CANDIDATES};
    use crate::gemm::plan::hopper_splits;
    use crate::gemm::problem::{GemmProblem, Precision};
    for (m, n, k) in [
        (128, 128, 65536),
        (256, 256, 32768),
        (2048, 2048, 2048),
        (4096, 14336, 4096),
    ] {
        let p = GemmProblem::new(Precision::BF16, DType::BF16, m, n, k);
        let c = candidates(&p, 132).unwrap();
        let (s0, _) = hopper_splits(&p, 132, None).unwrap();
        assert!(!c.is_empty() && c.len() <= MAX_CANDIDATES, "{c:?}");
        assert_eq!(c[0].splits as usize, s0);
        assert_eq!(c[0].block_n, choose_tile(m, n, 1, 132).block_n);
        for x in &c {
            assert!(hopper_splits(&p, 132, Some(x.splits)).is_ok(), "{x:?}");
            assert!(x.block_n == 128 || x.block_n == 256);
        }
    }
}

/// The GLU variant: B has 2N rows ([N, K] layout) or columns, D has N; 16-bit operands only, no
/// C or residual; the tensor maps and tile counts follow B's 2N.
#[test]
fn glu_calls_read_2n_columns_of_b() {
    let glu = HopperGemmArgs {
        glu: true,
        c: 0,
        beta: 0.0,
        residual: 0,
        activation: 4,
        stride_b: 528 * 2000,
        ..args()
    };
    assert_eq!(hopper_supports(&glu), Ok(()));
    assert_eq!(glu.b_n(), 2000);
    assert!(glu.shape_key().glu && glu.shape_key().b_n() == 2000);
    let [_, bm, dm] = map_shapes(&glu, TILES[0], 1);
    assert_eq!((bm.cols, bm.rows), (520, 2000));
    // D keeps N columns and the 128-byte store box
    assert_eq!((dm.cols, dm.rows, dm.box_cols, dm.box_rows), (1000, 300, 64, 64));
    let kn = HopperGemmArgs {
        b_nk: false,
        ldb: 2000,
        stride_b: 2000 * 520,
        ..glu
    };
    assert_eq!(hopper_supports(&kn), Ok(()));
    let [_, bm, _] = map_shapes(&kn, TILES[1], 1);
    assert_eq!((bm.cols, bm.rows), (2000, 520));
    // [K, 2N] with a leading dimension below 2N
    let short = HopperGemmArgs { ldb: 1008, ..kn };
    assert!(hopper_supports(&short).unwrap_err().starts_with("b: leading dimension"));
    for (bad, name) in [
        (
            HopperGemmArgs {
                c: 0x30000,
                beta: 0.5,
                ..glu
            },
            "glu:",
        ),
        (
            HopperGemmArgs {
                residual: 0x60000,
                ..glu
            },
            "glu:",
        ),
        (
            HopperGemmArgs {
                dtype: DType::F8E4M3,
                ..glu
            },
            "glu:",
        ),
    ] {
        let rule = hopper_supports(&bad).unwrap_err();
        assert!(rule.starts_with(name), "{rule}");
    }
    // the kernel variant differs from the plain one
    let plain = kernel_key(DType::BF16, DType::BF16, true, TILES[0], false).name();
    let with_glu = kernel_key(DType::BF16, DType::BF16, true, TILES[0], true).name();
    assert_ne!(plain, with_glu);
    assert!(with_glu.ends_with("_glu"), "{with_glu}");
}

/// Every case of the GPU plan check meets the Hopper path's rules (16-byte rows of A, B and D
/// at their element sizes), so that the GPU run checks the kernels, not the case list.
#[test]
fn plan_check_cases_meet_the_hopper_rules() {
    use crate::gemm::plan::hopper_rule_broken;
    use crate::gemm::problem::{GemmProblem, Layout};
    for (precision, out, scales, activation, bias, (m, n, k)) in plan_check_cases() {
        let p = GemmProblem::new(precision, out, m, n, k)
            .b_layout(Layout::ColMajor)
            .scales(scales)
            .activation(activation)
            .bias(bias);
        assert!(p.validate().is_ok(), "{p:?}");
        if let Some(e) = hopper_rule_broken(&p, Arch::SM90) {
            panic!("{precision:?} -> {out} {m}x{n}x{k}: {e}");
        }
    }
}
