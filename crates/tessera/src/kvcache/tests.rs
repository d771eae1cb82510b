//! KV cache tests that need no GPU: every bad input the issue lists is refused with an error
//! naming the rule (through the pure checkers the public entry points call), and the split-KV
//! planner's work lists cover every key exactly once.

use proptest::prelude::*;

use super::decode::{
    choose_chunk, default_kernel_shape, dependent_launch_pays, validate_decode, DecodeKernelShape, DecodeLayout,
    DecodeOptions, DecodePlanKey, DecodeTuning, DecodeVariant, WorkList, HOPPER_SHARED_LIMIT, MAX_ITEMS,
};
use super::*;

fn cfg() -> KvCacheConfig {
    KvCacheConfig {
        num_pages: 100,
        page_size: 16,
        heads_kv: 8,
        head_dim: 128,
        ..Default::default()
    }
}

fn err<T: std::fmt::Debug>(r: Result<T>) -> String {
    r.expect_err("expected an error").to_string()
}

#[test]
fn config_errors_name_the_field_and_the_supported_values() {
    let mut c = cfg();
    c.page_size = 12;
    assert!(err(c.validate()).contains("page_size"));
    c.page_size = 512;
    assert!(err(c.validate()).contains("power of two from 8 to 256"));
    let mut c = cfg();
    c.head_dim = 96;
    assert!(err(c.validate()).contains("[64, 128, 256]"));
    let mut c = cfg();
    c.dtype = DType::F32;
    assert!(err(c.validate()).contains("fp16, bf16 and fp8e4m3"));
    let mut c = cfg();
    c.num_pages = 0;
    assert!(err(c.validate()).contains("num_pages"));
    let mut c = cfg();
    c.heads_kv = 0;
    assert!(err(c.validate()).contains("heads_kv"));
    let mut c = cfg();
    c.fp8_scale = f32::NAN;
    assert!(err(c.validate()).contains("fp8_scale"));
    for t in [8, 16, 32, 64, 128, 256] {
        let mut c = cfg();
        c.page_size = t;
        c.validate().unwrap();
    }
}

fn csr(tables: &[&[i32]]) -> (Vec<i32>, Vec<i32>) {
    let mut indptr = vec![0];
    let mut indices = Vec::new();
    for t in tables {
        indices.extend_from_slice(t);
        indptr.push(indices.len() as i32);
    }
    (indptr, indices)
}

#[test]
fn tables_are_checked_against_the_pool_and_the_lengths() {
    let c = cfg();
    let (ip, ix) = csr(&[&[3, 7], &[9]]);
    check_tables(&c, &ip, &ix, &[20, 16], 4, 10).unwrap();
    // a longer table than needed is fine; length 0 needs no page
    let (ip, ix) = csr(&[&[3, 7, 8], &[]]);
    check_tables(&c, &ip, &ix, &[20, 0], 4, 10).unwrap();
    // page id out of range
    let (ip, ix) = csr(&[&[3, 100]]);
    let e = err(check_tables(&c, &ip, &ix, &[20], 4, 10));
    assert!(
        e.contains("physical page 100 is out of range") && e.contains("100 pages"),
        "{e}"
    );
    let (ip, ix) = csr(&[&[-1]]);
    assert!(err(check_tables(&c, &ip, &ix, &[1], 4, 10)).contains("out of range"));
    // block table shorter than the length
    let (ip, ix) = csr(&[&[3]]);
    let e = err(check_tables(&c, &ip, &ix, &[17], 4, 10));
    assert!(e.contains("need 2 pages") && e.contains("has 1"), "{e}");
    // indptr shape and order
    assert!(err(check_tables(&c, &[0, 1], &[3], &[1, 1], 4, 10)).contains("batch + 1"));
    assert!(err(check_tables(&c, &[1, 1], &[3], &[1], 4, 10)).contains("start at 0"));
    assert!(err(check_tables(&c, &[0, 2, 1], &[3, 4], &[1, 1], 4, 10)).contains("non-decreasing"));
    assert!(err(check_tables(&c, &[0, 5], &[3], &[1], 4, 10)).contains("within indices"));
    // capacities and empty batches
    let (ip, ix) = csr(&[&[1], &[2], &[3]]);
    assert!(err(check_tables(&c, &ip, &ix, &[1, 1, 1], 2, 10)).contains("capacity"));
    assert!(err(check_tables(&c, &ip, &ix, &[1, 1, 1], 4, 2)).contains("capacity"));
    assert!(err(check_tables(&c, &[0], &[], &[], 4, 10)).contains("batch of 0"));
    // an indptr that jumps past indices and comes back is an error, not a panic
    let e = err(check_tables(&c, &[0, 100, 5], &[0; 5], &[0, 0], 4, 10));
    assert!(e.contains("non-decreasing"), "{e}");
}

#[test]
fn decode_requests_are_validated() {
    let c = cfg();
    let o = DecodeOptions::default();
    assert_eq!(validate_decode(&c, 32, &[5], &o).unwrap().0, DType::F16);
    let e = err(validate_decode(&c, 12, &[5], &o));
    assert!(e.contains("Hq % Hkv == 0"), "{e}");
    assert!(err(validate_decode(&c, 0, &[5], &o)).contains("heads_q"));
    for q_len in [0, 9] {
        let o = DecodeOptions { q_len, ..o };
        assert!(err(validate_decode(&c, 32, &[5], &o)).contains("1..=8"));
    }
    // an fp16 cache takes fp16 queries only; an fp8 cache fp16 or bf16
    let o_bf = DecodeOptions {
        query_dtype: Some(DType::BF16),
        ..o
    };
    assert!(err(validate_decode(&c, 32, &[5], &o_bf)).contains("does not match"));
    let mut c8 = cfg();
    c8.dtype = DType::F8E4M3;
    assert_eq!(validate_decode(&c8, 32, &[5], &o_bf).unwrap().0, DType::BF16);
    let o_f32 = DecodeOptions {
        query_dtype: Some(DType::F32),
        ..o
    };
    assert!(err(validate_decode(&c8, 32, &[5], &o_f32)).contains("fp16 or bf16"));
    for scale in [0.0, -1.0, f32::INFINITY] {
        let o = DecodeOptions {
            scale: Some(scale),
            ..o
        };
        assert!(err(validate_decode(&c, 32, &[5], &o)).contains("scale"));
    }
    assert!(err(validate_decode(&c, 32, &[], &o)).contains("at least one sequence"));
    // KeyRows takes a CTA per 8 rows: grid.z bounds the rows per KV head
    let mut c1 = cfg();
    c1.heads_kv = 1;
    let key_rows = DecodeOptions {
        q_len: 8,
        tuning: DecodeTuning {
            layout: Some(DecodeLayout::KeyRows),
            ..Default::default()
        },
        ..o
    };
    assert!(err(validate_decode(&c1, 65536, &[5], &key_rows)).contains("use QueryRows"));
    validate_decode(&c1, 65536, &[5], &DecodeOptions { q_len: 8, ..o }).unwrap();
    assert!(err(validate_decode(&c, 32, &vec![1; MAX_ITEMS + 1], &o)).contains("at most 65535 sequences"));
    assert!(err(validate_decode(&c, 8 * 65536 * 2, &[1], &o)).contains("query heads exceed"));
    assert!(err(validate_decode(&c, 32, &[i32::MAX as usize], &o)).contains("32-bit"));
    // default scale 1/sqrt(D)
    let (_, s) = validate_decode(&c, 32, &[5], &o).unwrap();
    assert!((s - 1.0 / (128f32).sqrt()).abs() < 1e-7);
}

#[test]
fn fp8_scales_are_bounded_by_the_largest_fp16() {
    let mut c = cfg();
    c.dtype = DType::F8E4M3;
    for bad in [0.0, -1.0, 65505.0, f32::INFINITY, f32::NAN, 1e-40] {
        c.fp8_scale = bad;
        assert!(err(c.validate()).contains("(0, 65504]"), "{bad}");
    }
    for good in [65504.0, f32::MIN_POSITIVE, 1.0 / 448.0] {
        c.fp8_scale = good;
        c.validate().unwrap();
    }
}

#[test]
fn tunings_are_powers_of_two_tiles() {
    for tile_keys in [16, 32, 64] {
        DecodeKernelShape {
            warps: 4,
            tile_keys,
            stages: 2,
        }
        .validate()
        .unwrap();
    }
    // 48-key tiles could straddle pages of 64: refused
    let e = err(DecodeKernelShape {
        warps: 4,
        tile_keys: 48,
        stages: 2,
    }
    .validate());
    assert!(e.contains("16/32/64"), "{e}");
}

#[test]
fn dependent_launch_only_for_short_decodes() {
    // B=8, Hkv=8, D=128: 8K tokens each read 256 MiB (fp16) and use it; 16K does not
    let c = cfg();
    assert!(dependent_launch_pays(&[8192; 8], &c));
    assert!(!dependent_launch_pays(&[16384; 8], &c));
    assert!(dependent_launch_pays(&[], &c));
    let fp8 = KvCacheConfig {
        dtype: DType::F8E4M3,
        ..cfg()
    };
    assert!(dependent_launch_pays(&[16384; 8], &fp8));
    assert!(!dependent_launch_pays(&[32768; 8], &fp8));
    assert!(!dependent_launch_pays(&[usize::MAX, 1], &c)); // saturates, no overflow
}

#[test]
fn append_counts_are_checked() {
    assert!(err(AppendBatch::indptr_of(&[])).contains("one entry per sequence"));
    assert_eq!(AppendBatch::indptr_of(&[2, 0, 5]).unwrap(), vec![0, 2, 2, 7]);
    assert!(err(AppendBatch::indptr_of(&[1 << 30, 1 << 30])).contains("2^30"));
}

#[test]
fn default_tunings_fit_hopper_shared_memory() {
    for (cache, layout) in [DType::F16, DType::F8E4M3]
        .into_iter()
        .flat_map(|c| [(c, DecodeLayout::QueryRows), (c, DecodeLayout::KeyRows)])
    {
        for head_dim in [64, 128, 256] {
            let mut v = DecodeVariant {
                dtype: DType::F16,
                cache,
                head_dim,
                page_size: 16,
                layout,
                m_blocks: 1,
                shape: DecodeKernelShape::default(),
            };
            v.shape = default_kernel_shape(&v, HOPPER_SHARED_LIMIT);
            assert!(v.shared_bytes() <= HOPPER_SHARED_LIMIT, "{v:?}: {}", v.shared_bytes());
        }
    }
}

#[test]
fn the_planner_splits_short_batches_and_not_long_ones() {
    // 8 x 4K on 132 slots of 8 KV heads: split into at least 2 chunks per sequence
    let w = WorkList::new(&[4096; 8], choose_chunk(&[4096; 8], 64, 8, 132));
    assert!(w.num_items() >= 16 && w.splits(), "{w:?}");
    // 512 sequences of 1K already fill the machine: no split
    let lens = vec![1024; 512];
    let chunk = choose_chunk(&lens, 64, 8, 132);
    assert!(!WorkList::new(&lens, chunk).splits(), "chunk {chunk}");
}

proptest! {
    /// Every key of every sequence is covered by exactly one item, chunks are multiples of the
    /// quantum, items stay under the grid limit, and partial slots are a prefix sum.
    #[test]
    fn work_lists_cover_every_key_once(
        lens in proptest::collection::vec(0usize..70_000, 1..40),
        quantum in prop_oneof![Just(64usize), Just(128usize)],
        slots in 1usize..300,
        heads in 1usize..9,
    ) {
        let chunk = choose_chunk(&lens, quantum, heads, slots);
        prop_assert!(chunk % quantum == 0 && chunk > 0);
        let w = WorkList::new(&lens, chunk);
        prop_assert!(w.num_items() <= MAX_ITEMS);
        let mut covered = vec![0usize; lens.len()];
        let mut seen = std::collections::HashSet::new();
        for (x, &s) in w.item_seq.iter().enumerate() {
            let (s, k) = (s as usize, w.item_chunk[x] as usize);
            prop_assert!(seen.insert((s, k)));
            let n = (w.item_indptr[s + 1] - w.item_indptr[s]) as usize;
            prop_assert!(k < n);
            let begin = (k * chunk).min(lens[s]);
            let end = if k + 1 == n { lens[s] } else { ((k + 1) * chunk).min(lens[s]) };
            covered[s] += end - begin;
        }
        prop_assert_eq!(&covered, &lens);
        prop_assert_eq!(*w.item_indptr.last().unwrap() as usize, w.num_items());
        for (b, &l) in lens.iter().enumerate() {
            prop_assert_eq!((w.item_indptr[b + 1] - w.item_indptr[b]) as usize, l.div_ceil(chunk).max(1));
        }
    }
}

#[test]
fn decode_plan_key_holds_config_lengths_options_and_tuning() {
    use std::collections::HashSet;
    let c = cfg();
    let o = DecodeOptions::default();
    let key = DecodePlanKey::new(&c, 32, &[5, 700], &o);
    assert_eq!(
        key,
        DecodePlanKey::new(&cfg(), 32, &[5, 700], &DecodeOptions::default())
    );
    let tuned = |tuning| DecodeOptions { tuning, ..o };
    let mut c8 = cfg();
    c8.dtype = DType::F8E4M3;
    let mut c_scaled = c8.clone();
    c_scaled.fp8_scale = 0.5;
    let changed = [
        DecodePlanKey::new(
            &c,
            32,
            &[5, 700],
            &tuned(DecodeTuning {
                chunk_tokens: Some(256),
                ..Default::default()
            }),
        ),
        DecodePlanKey::new(
            &c,
            32,
            &[5, 700],
            &tuned(DecodeTuning {
                kernel: Some(DecodeKernelShape::default()),
                ..Default::default()
            }),
        ),
        DecodePlanKey::new(
            &c,
            32,
            &[5, 700],
            &tuned(DecodeTuning {
                layout: Some(DecodeLayout::QueryRows),
                ..Default::default()
            }),
        ),
        DecodePlanKey::new(&c, 32, &[5, 700], &DecodeOptions { q_len: 2, ..o }),
        DecodePlanKey::new(&c, 32, &[5, 700], &DecodeOptions { scale: Some(0.1), ..o }),
        DecodePlanKey::new(&c, 32, &[5, 701], &o),
        DecodePlanKey::new(&c, 16, &[5, 700], &o),
        DecodePlanKey::new(&c8, 32, &[5, 700], &o),
        DecodePlanKey::new(&c_scaled, 32, &[5, 700], &o),
    ];
    let mut all: HashSet<DecodePlanKey> = changed.iter().cloned().collect();
    assert_eq!(all.len(), changed.len());
    assert!(all.insert(key.clone()), "a changed field must change the key");
    assert!(
        !all.insert(DecodePlanKey::new(&c, 32, &[5, 700], &o)),
        "equal inputs, equal keys"
    );
    assert_eq!(
        DecodeTuning::default(),
        DecodeTuning {
            chunk_tokens: None,
            kernel: None,
            layout: None
        }
    );
    // on a GPU: a plan's key is the key of what it was made from, and follows `update`
    if let Ok(ctx) = crate::runtime::Context::new(0) {
        let mut plan = super::decode::DecodePlan::new(&ctx, &c, 32, &[5, 700], &o).unwrap();
        assert_eq!(plan.key(), key);
        plan.update(&[6, 700]).unwrap();
        assert_eq!(plan.key(), DecodePlanKey::new(&c, 32, &[6, 700], &o));
    }
}

#[test]
fn harness_parses_the_decode_environment_overrides() {
    use super::bench::{parse_kernel_shape, parse_layout};
    assert_eq!(
        parse_kernel_shape("8, 32,3").unwrap(),
        DecodeKernelShape {
            warps: 8,
            tile_keys: 32,
            stages: 3
        }
    );
    for bad in ["8,32", "a,b,c", "1,2,3,4", ""] {
        let e = err(parse_kernel_shape(bad));
        assert!(
            e.contains("TESSERA_DECODE_TUNING") && e.contains("three integers"),
            "{e}"
        );
    }
    assert_eq!(parse_layout("query").unwrap(), DecodeLayout::QueryRows);
    assert_eq!(parse_layout("key").unwrap(), DecodeLayout::KeyRows);
    let e = err(parse_layout("rows"));
    assert!(
        e.contains("TESSERA_DECODE_LAYOUT") && e.contains("`query` or `key`"),
        "{e}"
    );
}
