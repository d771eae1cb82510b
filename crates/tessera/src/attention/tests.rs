//! Attention tests that need no GPU: validation of every bad input the issue lists (through the
//! pure checkers the public entry points call), the mask's pair count and FLOPs, the split
//! heuristic, and properties of the CPU reference.

use proptest::prelude::*;

use super::plan::{choose_splits, resolve_path, validate_options, MAX_SPLITS};
use super::reference::{attention_reference, is_visible, RefInputs, RefParams};
use super::*;
use crate::runtime::{contiguous_strides, Arch};
use crate::testdata::{random_matrix, Dist};

fn err_text<T: std::fmt::Debug>(r: Result<T>) -> String {
    r.expect_err("expected an error").to_string()
}

/// Contiguous `[B, N, H, D]` descriptors of q and k/v.
struct Shapes {
    q: Vec<usize>,
    kv: Vec<usize>,
    qs: Vec<usize>,
    kvs: Vec<usize>,
}

impl Shapes {
    fn new(q: &[usize], kv: &[usize]) -> Shapes {
        Shapes {
            q: q.to_vec(),
            kv: kv.to_vec(),
            qs: contiguous_strides(q),
            kvs: contiguous_strides(kv),
        }
    }
    fn problem(&self, dq: DType, dkv: DType, cu: Option<(&[i32], &[i32])>) -> Result<AttentionProblem> {
        let q = TensorDesc {
            shape: &self.q,
            strides: &self.qs,
            dtype: dq,
        };
        let kv = TensorDesc {
            shape: &self.kv,
            strides: &self.kvs,
            dtype: dkv,
        };
        AttentionProblem::of_descs(&q, &kv, &kv, QkvLayout::Bnhd, cu)
    }
}

#[test]
fn valid_padded_and_varlen_problems() {
    let p = Shapes::new(&[2, 100, 8, 128], &[2, 300, 2, 128])
        .problem(DType::F16, DType::F16, None)
        .unwrap();
    assert_eq!(
        (p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim),
        (2, 8, 2, 100, 300, 128)
    );
    assert_eq!(p.group(), 4);
    let (cq, ck) = ([0, 5, 5, 12], [0, 7, 9, 9]);
    let p = Shapes::new(&[12, 4, 64], &[9, 4, 64])
        .problem(DType::BF16, DType::BF16, Some((&cq, &ck)))
        .unwrap();
    assert_eq!((p.batch, p.seqlen_q, p.seqlen_k, p.varlen), (3, 7, 7, Some((12, 9))));
    // Bhnd reads N and H from the other positions.
    let (q, s) = ([2usize, 8, 100, 64], contiguous_strides(&[2, 8, 100, 64]));
    let d = TensorDesc {
        shape: &q,
        strides: &s,
        dtype: DType::F16,
    };
    let p = AttentionProblem::of_descs(&d, &d, &d, QkvLayout::Bhnd, None).unwrap();
    assert_eq!((p.heads_q, p.seqlen_q), (8, 100));
}

#[test]
fn varlen_known_by_its_shape_alone() {
    // The same batch as above, described by sizes (offsets on the device): the same problem.
    let sh = Shapes::new(&[12, 4, 64], &[9, 4, 64]);
    let (q, kv) = (
        TensorDesc {
            shape: &sh.q,
            strides: &sh.qs,
            dtype: DType::BF16,
        },
        TensorDesc {
            shape: &sh.kv,
            strides: &sh.kvs,
            dtype: DType::BF16,
        },
    );
    let (cq, ck) = ([0, 5, 5, 12], [0, 7, 9, 9]);
    let shape = VarlenShape::of_cu_seqlens(&cq, &ck).unwrap();
    assert_eq!(
        shape,
        VarlenShape {
            batch: 3,
            total_q: 12,
            total_k: 9,
            max_seqlen_q: 7,
            max_seqlen_k: 7
        }
    );
    let by_shape = AttentionProblem::of_descs_shape(&q, &kv, &kv, QkvLayout::Bnhd, Some(shape)).unwrap();
    let by_host = sh.problem(DType::BF16, DType::BF16, Some((&cq, &ck))).unwrap();
    assert_eq!(by_shape, by_host);
    // Totals that differ from the packed rows, maxima beyond the totals, no sequence.
    let e = err_text(AttentionProblem::of_descs_shape(
        &q,
        &kv,
        &kv,
        QkvLayout::Bnhd,
        Some(VarlenShape { total_q: 11, ..shape }),
    ));
    assert!(e.contains("described with total_q = 11 and total_k = 9"), "{e}");
    let e = err_text(
        VarlenShape {
            max_seqlen_k: 10,
            ..shape
        }
        .validate(),
    );
    assert!(
        e.contains("`max_seqlen_k`: max_seqlen_k = 10 exceeds the 9 packed rows"),
        "{e}"
    );
    let e = err_text(VarlenShape { batch: 0, ..shape }.validate());
    assert!(e.contains("batch + 1 >= 2"), "{e}");
    // SAFETY: never run; only the validation of the description is exercised.
    let e = err_text(unsafe { VarlenBatch::from_device(0x1000, 0x1002, shape) });
    assert!(e.contains("`cu_seqlens_k`") && e.contains("not 4-byte aligned"), "{e}");
    // SAFETY: as above.
    let b = unsafe { VarlenBatch::from_device(0x1000, 0x2000, shape) }.unwrap();
    assert_eq!((b.batch(), b.shape(), b.cu_seqlens_q()), (3, shape, None));
}

#[test]
fn head_ratio_must_divide() {
    let e = err_text(Shapes::new(&[1, 16, 6, 64], &[1, 16, 4, 64]).problem(DType::F16, DType::F16, None));
    assert!(
        e.contains("heads_q (6) must be a positive multiple of heads_kv (4)"),
        "{e}"
    );
    let e = err_text(Shapes::new(&[1, 16, 0, 64], &[1, 16, 0, 64]).problem(DType::F16, DType::F16, None));
    assert!(e.contains("heads_q"), "{e}");
}

#[test]
fn mismatched_batch_head_dim_and_dtypes() {
    let e = err_text(Shapes::new(&[2, 16, 4, 64], &[3, 16, 4, 64]).problem(DType::F16, DType::F16, None));
    assert!(e.contains("agree in batch and head dim"), "{e}");
    let e = err_text(Shapes::new(&[2, 16, 4, 64], &[2, 16, 4, 128]).problem(DType::F16, DType::F16, None));
    assert!(e.contains("agree in batch and head dim"), "{e}");
    let e = err_text(Shapes::new(&[2, 16, 4, 64], &[2, 16, 4, 64]).problem(DType::F16, DType::BF16, None));
    assert!(
        e.contains("share a dtype") && e.contains("fp16") && e.contains("bf16"),
        "{e}"
    );
    // k and v must match each other.
    let (q, qs) = ([1usize, 8, 2, 64], contiguous_strides(&[1, 8, 2, 64]));
    let (v, vs) = ([1usize, 9, 2, 64], contiguous_strides(&[1, 9, 2, 64]));
    let dq = TensorDesc {
        shape: &q,
        strides: &qs,
        dtype: DType::F16,
    };
    let dv = TensorDesc {
        shape: &v,
        strides: &vs,
        dtype: DType::F16,
    };
    let e = err_text(AttentionProblem::of_descs(&dq, &dq, &dv, QkvLayout::Bnhd, None));
    assert!(e.contains("k and v must have the same shape"), "{e}");
}

#[test]
fn rank_and_contiguity_errors_name_the_tensor() {
    let e = err_text(Shapes::new(&[16, 4, 64], &[16, 4, 64]).problem(DType::F16, DType::F16, None));
    assert!(
        e.contains("`q`") && e.contains("rank 4") && e.contains("[B, N, H, D]"),
        "{e}"
    );
    let (q, s) = ([1usize, 8, 2, 64], [2048usize, 256, 128, 2]);
    let bad = TensorDesc {
        shape: &q,
        strides: &s,
        dtype: DType::F16,
    };
    let (g, gs) = ([1usize, 8, 2, 64], contiguous_strides(&[1, 8, 2, 64]));
    let good = TensorDesc {
        shape: &g,
        strides: &gs,
        dtype: DType::F16,
    };
    let e = err_text(AttentionProblem::of_descs(&good, &bad, &good, QkvLayout::Bnhd, None));
    assert!(e.contains("`k`") && e.contains("contiguous"), "{e}");
    let short = TensorDesc {
        shape: &q,
        strides: &s[..2],
        dtype: DType::F16,
    };
    let e = err_text(AttentionProblem::of_descs(&short, &good, &good, QkvLayout::Bnhd, None));
    assert!(e.contains("one stride per dim"), "{e}");
    // Varlen tensors are rank 3.
    let e =
        err_text(Shapes::new(&[1, 8, 2, 64], &[1, 8, 2, 64]).problem(DType::F16, DType::F16, Some((&[0, 8], &[0, 8]))));
    assert!(e.contains("[total, H, D]"), "{e}");
}

#[test]
fn cu_seqlens_rules() {
    assert_eq!(validate_cu_seqlens(&[0, 3, 3, 10], &[0, 0, 4, 4]).unwrap(), (7, 4));
    let e = err_text(validate_cu_seqlens(&[1, 3], &[0, 3]));
    assert!(e.contains("cu_seqlens_q[0] must be 0, got 1"), "{e}");
    let e = err_text(validate_cu_seqlens(&[0, 3], &[0, 5, 4]));
    assert!(
        e.contains("cu_seqlens_k must be non-decreasing") && e.contains("[2] = 4 < cu_seqlens_k[1] = 5"),
        "{e}"
    );
    let e = err_text(validate_cu_seqlens(&[0], &[0]));
    assert!(e.contains("batch + 1 >= 2"), "{e}");
    let e = err_text(validate_cu_seqlens(&[0, 2, 4], &[0, 4]));
    assert!(e.contains("3 entries but cu_seqlens_k has 2"), "{e}");
    // Beyond (or short of) the packed length.
    let s = Shapes::new(&[10, 2, 64], &[10, 2, 64]);
    let e = err_text(s.problem(DType::F16, DType::F16, Some((&[0, 4, 12], &[0, 4, 10]))));
    assert!(
        e.contains("q has 10 rows") && e.contains("cu_seqlens_q ends at 12"),
        "{e}"
    );
    let e = err_text(s.problem(DType::F16, DType::F16, Some((&[0, 4, 10], &[0, 4, 9]))));
    assert!(e.contains("cu_seqlens_k at 9"), "{e}");
    // The same rules through the varlen problem path.
    let e = err_text(s.problem(DType::F16, DType::F16, Some((&[0, 6, 4, 10], &[0, 4, 6, 10]))));
    assert!(e.contains("non-decreasing"), "{e}");
    // Empty sequences are fine, and so is an all-empty batch.
    let z = Shapes::new(&[0, 2, 64], &[0, 2, 64]);
    let p = z
        .problem(DType::F16, DType::F16, Some((&[0, 0, 0], &[0, 0, 0])))
        .unwrap();
    assert_eq!((p.batch, p.seqlen_q, p.varlen), (2, 0, Some((0, 0))));
}

#[test]
fn unsupported_head_dims_and_dtypes() {
    for d in [0usize, 12, 264, 100] {
        let e = err_text(AttentionProblem::padded(1, 2, 2, 16, 16, d, DType::F16).validate());
        assert!(
            e.contains(&format!("head dim {d}")) && e.contains("multiples of 8 up to 256"),
            "{e}"
        );
    }
    for d in [8usize, 64, 80, 200, 256] {
        AttentionProblem::padded(1, 2, 2, 16, 16, d, DType::BF16)
            .validate()
            .unwrap();
    }
    for dt in [DType::F32, DType::F8E4M3, DType::F64] {
        let e = err_text(AttentionProblem::padded(1, 2, 2, 16, 16, 64, dt).validate());
        assert!(e.contains("unsupported") && e.contains("fp16 and bf16"), "{e}");
    }
}

#[test]
fn index_overflow_is_unsupported() {
    // 2^31 query rows x heads exceed the 32-bit row index.
    let e = err_text(AttentionProblem::padded(1 << 12, 1 << 8, 1 << 8, 1 << 11, 16, 64, DType::F16).validate());
    assert!(e.contains("32-bit") && e.contains("unsupported"), "{e}");
    let e = err_text(AttentionProblem::padded(1, 8, 8, 16, 1 << 29, 64, DType::F16).validate());
    assert!(e.contains("key rows"), "{e}");
    // Saturates rather than wrapping.
    let e = err_text(AttentionProblem::padded(usize::MAX, 1, 1, usize::MAX, 1, 64, DType::F16).validate());
    assert!(e.contains("32-bit"), "{e}");
    AttentionProblem::padded(1, 1 << 8, 1 << 8, (1 << 23) - 8, 16, 64, DType::F16)
        .validate()
        .unwrap();
}

#[test]
fn windows_that_cannot_mask_become_unbounded() {
    let o = |window, causal| AttentionOptions {
        window,
        causal,
        ..Default::default()
    };
    // left >= max keys and right >= max queries mask nothing under the bottom-right rule.
    assert_eq!(o((-1, i32::MAX), false).window_for(1000, 255), (-1, -1));
    assert_eq!(o((i32::MAX, -1), false).window_for(1000, 255), (-1, -1));
    assert_eq!(o((255, 1000), false).window_for(1000, 255), (-1, -1));
    // One below the bound still masks, and causal keeps right = 0.
    assert_eq!(o((254, 999), false).window_for(1000, 255), (254, 999));
    assert_eq!(o((i32::MAX, 5), true).window_for(10, 10), (-1, 0));
    // The rule is exact: same visible pairs as the original window on every length pair.
    for (nq, nk) in [(1usize, 1usize), (7, 3), (3, 7), (16, 16)] {
        for (l, r) in [(0, 0), (2, 1), (6, 6), (7, 7), (100, 100), (i32::MAX, i32::MAX)] {
            let (l2, r2) = o((l, r), false).window_for(nq, nk);
            assert_eq!(
                visible_pairs(nq, nk, l, r),
                visible_pairs(nq, nk, l2, r2),
                "{nq}x{nk} ({l},{r})"
            );
        }
    }
}

#[test]
fn option_rules() {
    let ok = AttentionOptions::default();
    validate_options(&ok, 64).unwrap();
    for s in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
        let e = err_text(validate_options(&AttentionOptions { scale: Some(s), ..ok }, 64));
        assert!(e.contains("scale") && e.contains("finite and > 0"), "{e}");
    }
    for c in [-1.0f32, f32::NAN, f32::INFINITY] {
        let e = err_text(validate_options(&AttentionOptions { softcap: c, ..ok }, 64));
        assert!(e.contains("softcap") && e.contains(">= 0"), "{e}");
    }
    for w in [(-2, 0), (0, -5)] {
        let e = err_text(validate_options(&AttentionOptions { window: w, ..ok }, 64));
        assert!(e.contains("window") && e.contains(">= -1"), "{e}");
    }
    for n in [0usize, MAX_SPLITS + 1] {
        let e = err_text(validate_options(
            &AttentionOptions {
                tuning: AttentionTuning {
                    num_splits: Some(n),
                    ..ok.tuning
                },
                ..ok
            },
            64,
        ));
        assert!(
            e.contains("num_splits") && e.contains(&format!("1..={MAX_SPLITS}")),
            "{e}"
        );
    }
    let keys = |n, softcap| AttentionOptions {
        softcap,
        tuning: AttentionTuning {
            sm80_block_n: Some(n),
            ..ok.tuning
        },
        ..ok
    };
    for d in [65, 80, 128] {
        validate_options(&keys(32, 0.0), d).unwrap();
        validate_options(&keys(64, 0.0), d).unwrap();
    }
    let e = err_text(validate_options(
        &AttentionOptions {
            tuning: AttentionTuning {
                sm80_heads_per_section: Some(0),
                ..ok.tuning
            },
            ..ok
        },
        64,
    ));
    assert!(e.contains("sm80_heads_per_section") && e.contains(">= 1"), "{e}");
    let e = err_text(validate_options(
        &AttentionOptions {
            tuning: AttentionTuning {
                hopper_max_ctas: Some(0),
                ..ok.tuning
            },
            ..ok
        },
        64,
    ));
    assert!(e.contains("hopper_max_ctas") && e.contains(">= 1"), "{e}");
    validate_options(
        &AttentionOptions {
            tuning: AttentionTuning {
                hopper_max_ctas: Some(1),
                hopper_tail_split: false,
                ..ok.tuning
            },
            ..ok
        },
        64,
    )
    .unwrap();
    let hkeys = |n| AttentionOptions {
        tuning: AttentionTuning {
            hopper_block_n: Some(n),
            ..ok.tuning
        },
        ..ok
    };
    for d in [65, 100, 128] {
        validate_options(&hkeys(128), d).unwrap();
        validate_options(&hkeys(176), d).unwrap();
    }
    for (d, n) in [(128, 64), (128, 192), (64, 176), (64, 128), (192, 176), (256, 64)] {
        let e = err_text(validate_options(&hkeys(n), d));
        assert!(
            e.contains("hopper_block_n") && e.contains("128 or 176") && e.contains("65..=128"),
            "{e}"
        );
    }
    let e = err_text(validate_options(&keys(48, 0.0), 128));
    assert!(e.contains("sm80_block_n") && e.contains("32 or 64"), "{e}");
    for (d, softcap) in [(64, 0.0), (136, 0.0), (128, 30.0)] {
        let e = err_text(validate_options(&keys(32, softcap), d));
        assert!(
            e.contains("sm80_block_n") && e.contains("65..=128 without softcap"),
            "{e}"
        );
    }
    validate_options(
        &AttentionOptions {
            tuning: AttentionTuning {
                num_splits: Some(MAX_SPLITS),
                ..ok.tuning
            },
            softcap: 30.0,
            scale: Some(0.1),
            window: (-1, 0),
            ..ok
        },
        64,
    )
    .unwrap();
}

#[test]
fn effective_window_and_scale() {
    let o = AttentionOptions {
        causal: true,
        window: (16, 8),
        ..Default::default()
    };
    assert_eq!(o.effective_window(), (16, 0));
    assert!(o.is_masked());
    assert!(!AttentionOptions::default().is_masked());
    assert_eq!(AttentionOptions::default().effective_scale(64), 0.125);
    assert_eq!(
        AttentionOptions {
            scale: Some(0.5),
            ..Default::default()
        }
        .effective_scale(64),
        0.5
    );
}

#[test]
fn hopper_path_needs_sm90() {
    let e = err_text(resolve_path(AttentionPath::Hopper, Arch::SM80));
    assert!(e.contains("unsupported"), "{e}");
    assert_eq!(
        resolve_path(AttentionPath::Sm80, Arch::SM90).unwrap(),
        AttentionPath::Sm80
    );
    let e = err_text(resolve_path(AttentionPath::Auto, Arch { major: 7, minor: 5 }));
    assert!(e.contains("8.0 or newer"), "{e}");
}

/// Pairs counted by brute force with the reference's explicit mask.
fn brute_pairs(nq: usize, nk: usize, left: i32, right: i32) -> u64 {
    let mut n = 0;
    for i in 0..nq {
        for j in 0..nk {
            n += is_visible(i, j, nq, nk, left as i64, right as i64) as u64;
        }
    }
    n
}

#[test]
fn visible_pairs_known_values() {
    assert_eq!(visible_pairs(4, 4, -1, -1), 16);
    assert_eq!(visible_pairs(4, 4, -1, 0), 10);
    assert_eq!(visible_pairs(4, 4, 0, 0), 4);
    // Nq > Nk causal: the first Nq - Nk rows see nothing.
    assert_eq!(visible_pairs(5, 2, -1, 0), 3);
    assert_eq!(visible_pairs(0, 7, -1, 0), 0);
    assert_eq!(visible_pairs(7, 0, -1, -1), 0);
    let p = AttentionProblem::padded(2, 8, 2, 1024, 1024, 128, DType::F16);
    let causal = AttentionOptions {
        causal: true,
        ..Default::default()
    };
    let f = p.flops(&causal, &[(1024, 1024), (1024, 1024)]);
    assert_eq!(f, 4.0 * 128.0 * 8.0 * 2.0 * (1024.0 * 1025.0 / 2.0));
    let full = p.flops(&AttentionOptions::default(), &[(1024, 1024)]);
    assert_eq!(full, 4.0 * 128.0 * 8.0 * 1024.0 * 1024.0);
}

#[test]
fn choose_splits_properties() {
    // Enough CTAs to fill the GPU, or a single key tile: no split.
    assert_eq!(choose_splits(132, 132, 64), 1);
    assert_eq!(choose_splits(1000, 132, 64), 1);
    assert_eq!(choose_splits(4, 132, 1), 1);
    assert_eq!(choose_splits(0, 132, 64), 1);
    for sms in [108usize, 132] {
        for ctas in 1..200 {
            for k_tiles in [1usize, 2, 3, 7, 64, 512] {
                let s = choose_splits(ctas, sms, k_tiles);
                assert!((1..=MAX_SPLITS).contains(&s), "{ctas} {sms} {k_tiles}: {s}");
                assert!(
                    s <= k_tiles.max(1),
                    "more splits than key tiles: {ctas} {sms} {k_tiles}: {s}"
                );
                // Wave efficiency (busy fraction of the last wave) within 85% of any allowed
                // alternative, and no smaller count would do.
                if ctas * 5 < sms * 4 && k_tiles >= 2 {
                    let eff = |s: usize| {
                        let w = (ctas * s) as f64 / sms as f64;
                        w / w.ceil()
                    };
                    let best = (1..=MAX_SPLITS.min(sms).min(k_tiles)).map(eff).fold(0.0, f64::max);
                    assert!(eff(s) >= 0.85 * best, "{ctas} {sms} {k_tiles}: {s}");
                    assert!((1..s).all(|t| eff(t) < 0.85 * best), "{ctas} {sms} {k_tiles}: {s}");
                }
            }
        }
        // Few long rows do split.
        assert!(choose_splits(8, sms, 128) > 1);
    }
}

fn reference_case(
    seed: u64,
    nq: usize,
    nk: usize,
    d: usize,
    left: i64,
    right: i64,
    softcap: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>, RefParams) {
    let q: Vec<f64> = random_matrix(seed, nq, d, d, Dist::Normal { std: 2.0 });
    let k: Vec<f64> = random_matrix(seed ^ 1, nk, d, d, Dist::Normal { std: 1.0 });
    let v: Vec<f64> = random_matrix(seed ^ 2, nk, d, d, Dist::WithOutliers { std: 1.0 });
    let p = RefParams {
        heads_q: 1,
        heads_kv: 1,
        head_dim: d,
        scale: 1.0 / (d as f64).sqrt(),
        softcap,
        window_left: left,
        window_right: right,
    };
    (q, k, v, p)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Every output row is a convex combination of the visible V rows (so within V's per-column
    /// min/max), the LSE is at least the largest visible score (and at most it plus ln of the
    /// count), and a row that sees no key is 0 with LSE -inf.
    #[test]
    fn reference_rows_are_convex_combinations(
        seed in any::<u64>(),
        nq in 1usize..24,
        nk in 0usize..24,
        d in 1usize..12,
        left in -1i64..6,
        right in -1i64..6,
        capped in any::<bool>(),
    ) {
        let softcap = if capped { 3.0 } else { 0.0 };
        let (q, k, v, p) = reference_case(seed, nq, nk, d, left, right, softcap);
        let out = attention_reference(
            &RefInputs { q: &q, k: &k, v: &v, cu_q: &[0, nq], cu_k: &[0, nk] },
            &p,
        );
        for i in 0..nq {
            let visible: Vec<usize> = (0..nk).filter(|&j| is_visible(i, j, nq, nk, left, right)).collect();
            let row = &out.o[i * d..(i + 1) * d];
            if visible.is_empty() {
                prop_assert_eq!(out.lse[i], f64::NEG_INFINITY);
                prop_assert!(row.iter().all(|&x| x == 0.0));
                continue;
            }
            let scores: Vec<f64> = visible
                .iter()
                .map(|&j| {
                    let s = p.scale * (0..d).map(|c| q[i * d + c] * k[j * d + c]).sum::<f64>();
                    if softcap > 0.0 { softcap * (s / softcap).tanh() } else { s }
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let tol = 1e-9 * (1.0 + max.abs());
            prop_assert!(out.lse[i] >= max - tol, "lse {} < max score {}", out.lse[i], max);
            prop_assert!(out.lse[i] <= max + (visible.len() as f64).ln() + tol);
            for c in 0..d {
                let lo = visible.iter().map(|&j| v[j * d + c]).fold(f64::INFINITY, f64::min);
                let hi = visible.iter().map(|&j| v[j * d + c]).fold(f64::NEG_INFINITY, f64::max);
                let t = 1e-9 * (1.0 + lo.abs().max(hi.abs()));
                prop_assert!(row[c] >= lo - t && row[c] <= hi + t, "column {c}: {} not in [{lo}, {hi}]", row[c]);
            }
        }
    }

    /// `visible_pairs` (the FLOP count's closed form) agrees with the reference's explicit mask.
    #[test]
    fn visible_pairs_matches_explicit_mask(nq in 0usize..40, nk in 0usize..40, left in -1i32..45, right in -1i32..45) {
        prop_assert_eq!(visible_pairs(nq, nk, left, right), brute_pairs(nq, nk, left, right));
    }
}
