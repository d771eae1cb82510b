//! Softmax tests that need no GPU (validation, layout, NVRTC compile of every variant for every
//! CI architecture), plus GPU checks that run only where a device is present.

use super::plan::{
    ci_variants_for, cluster_shape, cluster_variant, split_claims_rows, split_row_shape, split_row_variant, warp_shape,
    SoftmaxParams, Variant, COPY_GROUPS, SPLIT_MAX_CTAS,
};
use super::*;
use crate::runtime::Arch;

#[test]
fn shape_validation_errors_name_the_rule() {
    let ok = SoftmaxShape::contiguous::<f32, f32>(4, 10);
    assert!(ok.validate().is_ok());
    let e = SoftmaxShape { cols: 0, ..ok }.validate().unwrap_err().to_string();
    assert!(e.contains("cols") && e.contains("at least 1"), "{e}");
    let e = SoftmaxShape { in_stride: 9, ..ok }.validate().unwrap_err().to_string();
    assert!(e.contains("input") && e.contains("stride 9 < cols 10"), "{e}");
    let e = SoftmaxShape { out_stride: 3, ..ok }.validate().unwrap_err().to_string();
    assert!(e.contains("output"), "{e}");
    let e = SoftmaxShape {
        in_dtype: DType::F8E4M3,
        ..ok
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(e.contains("unsupported") && e.contains("fp32, fp16, bf16"), "{e}");
    let e = SoftmaxShape {
        cols: MAX_COLS + 1,
        in_stride: MAX_COLS + 1,
        out_stride: MAX_COLS + 1,
        ..ok
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(e.contains("maximum"), "{e}");
}

#[test]
fn view_shapes_collapse_into_rows() {
    let len = 2 * 3 * 16;
    // SAFETY: the views are never dereferenced; the address is only bounds-checked.
    let v = unsafe { TensorView::from_raw(0x1000, DType::F32, len, &[2, 3, 10], &[48, 16, 1]) }.unwrap();
    let s = SoftmaxShape::of_views(&v, &v).unwrap();
    assert_eq!((s.rows, s.cols, s.in_stride), (6, 10, 16));
    // Rank 1 is a single row.
    // SAFETY: as above.
    let v1 = unsafe { TensorView::from_raw(0x1000, DType::F16, 7, &[7], &[1]) }.unwrap();
    let s = SoftmaxShape::of_views(&v1, &v1).unwrap();
    assert_eq!((s.rows, s.cols), (1, 7));
    // Non-contiguous last dim.
    // SAFETY: as above.
    let bad = unsafe { TensorView::from_raw(0x1000, DType::F32, 100, &[4, 10], &[1, 4]) }.unwrap();
    assert!(SoftmaxShape::of_views(&bad, &bad)
        .unwrap_err()
        .to_string()
        .contains("contiguous"));
    // Leading dims that do not collapse.
    // SAFETY: as above.
    let bad = unsafe { TensorView::from_raw(0x1000, DType::F32, 1000, &[2, 3, 10], &[100, 16, 1]) }.unwrap();
    assert!(SoftmaxShape::of_views(&bad, &bad)
        .unwrap_err()
        .to_string()
        .contains("collapse"));
    // Shape mismatch between input and output.
    // SAFETY: as above.
    let w = unsafe { TensorView::from_raw(0x1000, DType::F32, len, &[6, 10], &[16, 1]) }.unwrap();
    assert!(SoftmaxShape::of_views(&v, &w)
        .unwrap_err()
        .to_string()
        .contains("differs"));
    // A view past the end of its buffer is refused when made.
    // SAFETY: as above.
    let e = unsafe { TensorView::from_raw(0x1000, DType::F32, 50, &[6, 10], &[16, 1]) }.unwrap_err();
    assert!(e.to_string().contains("reaches element"), "{e}");
}

#[test]
fn params_layout_matches_the_kernel_struct() {
    assert_eq!(std::mem::size_of::<SoftmaxParams>(), 56);
    assert_eq!(std::mem::align_of::<SoftmaxParams>(), 8);
    let p = SoftmaxParams {
        input: 0x1111,
        output: 0x2222,
        rows: 3,
        cols: 4,
        in_stride: 5,
        out_stride: 6,
        scale_log2e: 7.0,
        scale: 8.0,
    };
    // SAFETY: reading the bytes of a plain #[repr(C)] struct without padding.
    let bytes: [u8; 56] = unsafe { std::mem::transmute(p) };
    let word = |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
    assert_eq!(
        [word(0), word(1), word(2), word(3), word(4), word(5)],
        [0x1111, 0x2222, 3, 4, 5, 6]
    );
    assert_eq!(f32::from_le_bytes(bytes[48..52].try_into().unwrap()), 7.0);
    assert_eq!(f32::from_le_bytes(bytes[52..56].try_into().unwrap()), 8.0);
}

#[test]
fn cluster_shapes_fit_and_cover_the_row() {
    let optin = 232_448;
    // fp16 rows of the bench: one CTA up to 64 KB of share, then 2, 4, 8.
    assert_eq!(cluster_shape(32768, 2, 8, 8, optin), Some((1, 32768)));
    // One CTA holds rows of up to 128 KB (fp32 32768); past that, shares of at most 64 KB.
    assert_eq!(cluster_shape(32768, 4, 4, 8, optin), Some((1, 32768)));
    assert_eq!(cluster_shape(32772, 4, 4, 8, optin), Some((4, 8196)));
    assert_eq!(cluster_shape(65536, 2, 8, 8, optin), Some((1, 65536)));
    assert_eq!(cluster_shape(131072, 2, 8, 8, optin), Some((4, 32768)));
    assert_eq!(cluster_shape(262144, 2, 8, 8, optin), Some((8, 32768)));
    assert_eq!(cluster_shape(262144, 4, 4, 8, optin), Some((8, 32768)));
    // Past the target the largest cluster takes up to the opt-in limit, then nothing.
    assert_eq!(cluster_shape(400_000, 4, 4, 8, optin), Some((8, 50_000)));
    assert_eq!(cluster_shape(1 << 24, 4, 4, 8, optin), None);
    // Without clusters (pre-Hopper) only one CTA.
    assert_eq!(cluster_shape(131072, 2, 8, 1, optin), None);
    for cols in [1usize, 7, 1000, 4097, 100_003, 333_333] {
        for align in [1usize, 4, 8] {
            if let Some((c, chunk)) = cluster_shape(cols, 2, align, 8, optin) {
                assert!(c as usize * chunk >= cols && chunk % align == 0 && chunk * 2 + 1024 <= optin);
            }
        }
    }
}

#[test]
fn split_row_shapes_cover_the_row_in_even_aligned_shares() {
    let kb64 = 64 * 1024;
    // The bench's long rows: fp32 1 MB rows in 16 shares of 64 KB, 512 KB rows in 8.
    assert_eq!(split_row_shape(262144, 4, 4, kb64), Some((16, 16384)));
    assert_eq!(split_row_shape(131072, 4, 4, kb64), Some((8, 16384)));
    assert_eq!(split_row_shape(262144, 2, 8, kb64), Some((8, 32768)));
    // A row one share holds is not split; past the CTA limit the shares grow instead.
    assert_eq!(split_row_shape(16384, 4, 4, kb64), None);
    assert_eq!(split_row_shape(1 << 20, 4, 4, kb64), Some((SPLIT_MAX_CTAS, 32768)));
    // Odd lengths: shares are a multiple of the pack and no CTA is left without columns.
    for cols in [16385usize, 40_000, 100_003, 262_147, 333_333, 1 << 21] {
        for (size, align) in [(4usize, 4usize), (2, 8)] {
            let Some((ctas, chunk)) = split_row_shape(cols, size, align, kb64) else {
                assert!(cols * size <= kb64, "{cols} x {size} B is not split");
                continue;
            };
            assert!((2..=SPLIT_MAX_CTAS).contains(&ctas), "{cols}");
            assert_eq!(chunk % align, 0);
            assert!(
                ctas as usize * chunk >= cols && (ctas as usize - 1) * chunk < cols,
                "{cols}"
            );
        }
    }
}

#[test]
fn warp_shapes_cover_every_width() {
    for pack in [1u32, 4, 8] {
        for cols in 1..=plan::WARP_MAX_COLS {
            let (cpt, width, rpw) = warp_shape(cols, pack);
            assert!(width.is_power_of_two() && width <= 32);
            assert!((cpt * width) as usize >= cols, "cols {cols} pack {pack}: {cpt}x{width}");
            assert_eq!(cpt % pack, 0);
            assert!(cpt <= 32 && (rpw == 1 || rpw == 2));
        }
    }
    assert_eq!(warp_shape(1, 8), (8, 1, 2));
    assert_eq!(warp_shape(1024, 8), (32, 32, 1));
    assert_eq!(warp_shape(1000, 1), (32, 32, 1));
}

#[test]
fn gpu_quick_verify_when_a_device_is_present() {
    let ctx = match crate::runtime::Context::new(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gpu_quick_verify_when_a_device_is_present: skipped, {e}");
            return;
        }
    };
    let seed = crate::testdata::seed_from_env_or_time().unwrap();
    for case in verify::cases(true) {
        let out = verify::verify_case(&ctx, &case, seed).unwrap();
        assert!(
            out.passed,
            "seed {seed} {}: {} {:?}",
            out.case, out.comparison, out.note
        );
    }
}

/// Every cluster-path and split-row kernel the plan can pick on the CI architectures (sm_80:
/// 163 KB of shared memory per CTA, sm_86 / sm_89: 99 KB, sm_90: 227 KB and clusters of 8), over
/// a sweep of column counts, dtypes and row strides (16-byte packs or not, in and out), is one
/// CI compiles for that architecture; and the pipelined kernels get one copy group per pack only
/// where every thread holds at most COPY_GROUPS packs of its share (the kernel traps otherwise).
#[test]
fn plan_picks_only_ci_compiled_cluster_variants_within_their_copy_groups() {
    let mut cols_list: Vec<usize> = vec![1000, 4097, 40_000, 70_000, 100_003, 262_147, 1_000_000, 2_000_003];
    for e in 10..=24 {
        for d in [-3i64, 0, 1, 5] {
            cols_list.push(((1i64 << e) + d) as usize);
        }
        cols_list.push(3 << (e - 2));
    }
    let archs = [
        (Arch::SM80, 163 * 1024, 1),
        (Arch::SM86, 99 * 1024, 1),
        (Arch::SM89, 99 * 1024, 1),
        (Arch::SM90, 227 * 1024, 8),
    ];
    let dtypes = [DType::F32, DType::F16, DType::BF16];
    let mut checked = 0;
    for (arch, optin, max_cluster) in archs {
        let compiled: std::collections::HashSet<String> =
            ci_variants_for(arch).into_iter().map(|v| v.spec().name).collect();
        let mut missing = std::collections::BTreeSet::new();
        for &d in &dtypes {
            for &cols in &cols_list {
                for (in_stride, out_stride) in [
                    (cols.div_ceil(8) * 8, cols.div_ceil(8) * 8),
                    (cols.div_ceil(8) * 8, cols | 1),
                    (cols | 1, cols.div_ceil(8) * 8),
                ] {
                    let shape = SoftmaxShape {
                        rows: 7,
                        cols,
                        in_stride,
                        out_stride,
                        in_dtype: d,
                        out_dtype: d,
                    };
                    let base = |path| Variant {
                        in_dtype: d,
                        out_dtype: d,
                        kind: SoftmaxKind::Softmax,
                        path,
                        block_threads: 256,
                        pack: 1,
                        cols_per_thread: 1,
                        rows_per_warp: 1,
                        warp_width: 32,
                        cluster: 1,
                        out_pack: 1,
                        copy_groups: 1,
                        claim_rows: false,
                    };
                    let mut picked = Vec::new();
                    for path in [SoftmaxPath::Cluster, SoftmaxPath::ClusterPipe] {
                        for vector in [true, false] {
                            picked.extend(
                                cluster_variant(&shape, base(path), vector, max_cluster, optin).map(|(v, c, _)| (v, c)),
                            );
                        }
                    }
                    picked
                        .extend(split_row_variant(&shape, base(SoftmaxPath::SplitRow), optin).map(|(v, c, _)| (v, c)));
                    for (v, chunk) in picked {
                        checked += 1;
                        if v.copy_groups > 1 {
                            assert_eq!(v.copy_groups, COPY_GROUPS);
                            assert!(
                                chunk / v.pack as usize <= (COPY_GROUPS * v.block_threads) as usize,
                                "{}: share of {chunk} columns, {} threads",
                                v.spec().name,
                                v.block_threads
                            );
                        }
                        let name = v.spec().name;
                        if !compiled.contains(&name) {
                            missing.insert(format!("{name} (cols {cols}, strides {in_stride}/{out_stride})"));
                        }
                    }
                }
            }
        }
        assert!(
            missing.is_empty(),
            "{arch}: the plan can pick kernels CI does not compile:\n{}",
            missing.into_iter().collect::<Vec<_>>().join("\n")
        );
    }
    assert!(checked > 1000, "{checked}");
}

#[test]
fn split_row_groups_claim_rows_only_where_the_static_schedule_leaves_groups_unused() {
    // The H200 shapes the rule was measured on (this folder's NOTES.md): rows, resident groups.
    // fp16 256 x 262144: the static schedule uses 43 of 49 groups (6 rows each)
    assert!(split_claims_rows(256, 49, 9));
    // fp16 1024 x 131072 (94 of 99), fp32 1024 x 131072 (49 of 49), fp32 256 x 262144 (24 of 24)
    assert!(!split_claims_rows(1024, 99, 9));
    assert!(!split_claims_rows(1024, 49, 9));
    assert!(!split_claims_rows(256, 24, 9));
    // verify's claiming cases on an H200: 133 rows over 132 groups (67 static), 53 over 44 (27)
    assert!(split_claims_rows(133, 132, 9));
    assert!(split_claims_rows(53, 44, 9));
    // verify's static case: 500 rows over 132 groups (125 static)
    assert!(!split_claims_rows(500, 132, 9));
    // one round (every row its own group); not before sm_90; row indices past 31 bits
    assert!(!split_claims_rows(10, 10, 9));
    assert!(!split_claims_rows(1, 49, 9));
    assert!(!split_claims_rows(20, 49, 9));
    assert!(!split_claims_rows(256, 49, 8));
    assert!(!split_claims_rows(3 << 30, 1 << 20, 9));
}

#[test]
fn plan_key_holds_shape_options_and_tuning() {
    use std::collections::HashSet;
    let shape = SoftmaxShape::contiguous::<half::f16, f32>(8, 1000);
    let opts = SoftmaxOptions::default();
    let key = SoftmaxPlanKey::new(&shape, &opts);
    assert_eq!(key, SoftmaxPlanKey::new(&shape, &SoftmaxOptions::default()));
    let changed = [
        SoftmaxPlanKey::new(
            &shape,
            &SoftmaxOptions {
                tuning: SoftmaxTuning {
                    path: SoftmaxPath::WarpNc,
                },
                ..opts
            },
        ),
        SoftmaxPlanKey::new(
            &shape,
            &SoftmaxOptions {
                kind: SoftmaxKind::LogSoftmax,
                ..opts
            },
        ),
        SoftmaxPlanKey::new(&shape, &SoftmaxOptions { scale: 0.5, ..opts }),
        SoftmaxPlanKey::new(&shape, &SoftmaxOptions { scale: -1.0, ..opts }),
        SoftmaxPlanKey::new(
            &SoftmaxShape {
                in_stride: 1008,
                ..shape
            },
            &opts,
        ),
        SoftmaxPlanKey::new(&SoftmaxShape::contiguous::<f32, f32>(8, 1000), &opts),
    ];
    let mut all: HashSet<SoftmaxPlanKey> = changed.iter().copied().collect();
    assert_eq!(all.len(), changed.len());
    assert!(all.insert(key), "a changed field must change the key");
    assert!(
        !all.insert(SoftmaxPlanKey::new(&shape, &opts)),
        "equal inputs, equal keys"
    );
    assert_eq!(SoftmaxTuning::default().path, SoftmaxPath::Auto);
    // on a GPU: a plan's key is the key of what it was made from
    if let Ok(ctx) = crate::runtime::Context::new(0) {
        let plan = SoftmaxPlan::new(&ctx, &shape, &opts).unwrap();
        assert_eq!(plan.key(), key);
    }
}
