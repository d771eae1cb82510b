//! GEMM tests without a GPU: the reference against the triple loop, erf, the epilogue order,
//! the Rust/device activation codes, problem validation, dispatch, split-K sizing, and (with
//! NVRTC) every kernel variant compiling for every CI architecture without spills; the GLU
//! epilogue's validation, dispatch, reference and weight layout.

use super::glu::interleave_host;
use super::plan::{choose_path, dmma_stages, kernel_specs, GemmPath};
use super::problem::{erf64, Activation, GemmProblem, GemmScales, Glu, Layout, Precision};
use super::reference::{self, matmul, matmul_naive};
use super::skinny::{choose_splits, CHUNK_K};
use crate::dtype::DType;
use crate::error::Error;
use crate::runtime::{compile_only, Arch};
use crate::testdata::{random_matrix, Dist};

fn rand(seed: u64, rows: usize, cols: usize) -> Vec<f64> {
    random_matrix(seed, rows, cols, cols, Dist::Normal { std: 1.0 })
}

#[test]
fn blocked_reference_equals_the_triple_loop() {
    // odd shapes around the row and column blocks; k-ordered sums make them bitwise equal
    for (m, n, k) in [
        (1, 1, 1),
        (9, 513, 3),
        (17, 1030, 31),
        (8, 512, 0),
        (0, 5, 5),
        (3, 0, 2),
    ] {
        let a = rand(1, m, k);
        let b = rand(2, k, n);
        assert_eq!(matmul(&a, &b, m, n, k), matmul_naive(&a, &b, m, n, k), "{m}x{n}x{k}");
    }
}

#[test]
fn reference_propagates_nan_and_inf_through_zeros() {
    let a = vec![0.0, 1.0, f64::NAN, 0.0];
    let b = vec![f64::INFINITY, 1.0, 1.0, 1.0];
    let d = matmul(&a, &b, 2, 2, 2);
    assert!(d[0].is_nan(), "0 * inf is NaN, not skipped");
    assert!(d[2].is_nan() && d[3].is_nan());
}

#[test]
fn erf_matches_known_values() {
    for (x, want) in [
        (0.0, 0.0),
        (0.1, 0.1124629160182849),
        (0.5, 0.5204998778130465),
        (1.0, 0.8427007929497149),
        (1.9, 0.9927904292352575),
        (2.0, 0.9953222650189527),
        (3.0, 0.9999779095030014),
        (4.5, 0.9999999998033839),
        (-1.0, -0.8427007929497149),
        (7.0, 1.0),
    ] {
        assert!((erf64(x) - want).abs() < 1e-14, "erf({x}) = {} want {want}", erf64(x));
    }
    assert!(erf64(f64::NAN).is_nan());
    assert_eq!(erf64(f64::INFINITY), 1.0);
}

#[test]
fn epilogue_order_is_bias_then_activation_then_residual() {
    // relu(2 * 1 + 0.5 * 4 - 10) + 3 = relu(-6) + 3 = 3
    let d = reference::epilogue(Activation::Relu, 1.0, 2.0, Some((0.5, 4.0)), Some(-10.0), Some(3.0));
    assert_eq!(d, 3.0);
    assert_eq!(reference::epilogue(Activation::None, 2.0, 3.0, None, None, None), 6.0);
    assert!(Activation::Relu.apply(f64::NAN).is_nan());
    assert!((Activation::GeluErf.apply(1.0) - 0.8413447460685429).abs() < 1e-14);
    assert!((Activation::GeluTanh.apply(1.0) - 0.8411919906082768).abs() < 1e-14);
    assert!((Activation::Silu.apply(1.0) - 0.7310585786300049).abs() < 1e-15);
}

#[test]
fn activation_codes_match_the_device_header() {
    for (act, name) in [
        (Activation::None, "kGemmActNone"),
        (Activation::Relu, "kGemmActRelu"),
        (Activation::GeluErf, "kGemmActGeluErf"),
        (Activation::GeluTanh, "kGemmActGeluTanh"),
        (Activation::Silu, "kGemmActSilu"),
    ] {
        let line = format!("constexpr int {name} = {};", act.code());
        assert!(
            super::EPILOGUE_HEADER.contains(&line),
            "{line} missing from epilogue.cuh"
        );
        assert_eq!(Activation::parse(act.name()), Some(act));
    }
}

fn arg_of(e: Error) -> String {
    match e {
        Error::InvalidArgument { arg, .. } => arg.to_string(),
        Error::Unsupported(_) => "unsupported".into(),
        other => format!("{other}"),
    }
}

#[test]
fn validation_names_the_argument() {
    let p = GemmProblem::new(Precision::F16, DType::F16, 64, 48, 32);
    assert!(p.validate().is_ok());
    let mut q = p.clone();
    q.lda = 31;
    assert_eq!(arg_of(q.validate().unwrap_err()), "lda");
    let mut q = p.clone().b_layout(Layout::ColMajor);
    q.ldb = 31;
    assert_eq!(arg_of(q.validate().unwrap_err()), "ldb");
    let mut q = p.clone().with_c(true);
    q.ldc = 47;
    assert_eq!(arg_of(q.validate().unwrap_err()), "ldc");
    let mut q = p.clone();
    q.ldd = 47;
    assert_eq!(arg_of(q.validate().unwrap_err()), "ldd");
    let mut q = p.clone().batched(2);
    q.batch_stride_d = 10;
    assert_eq!(arg_of(q.validate().unwrap_err()), "batch_stride_d");
    let q = GemmProblem::new(Precision::F16, DType::F16, 1 << 31, 8, 8);
    assert_eq!(arg_of(q.validate().unwrap_err()), "m");
    let q = GemmProblem::new(Precision::F16, DType::F16, 8, 8, 3_000_000_000);
    assert_eq!(arg_of(q.validate().unwrap_err()), "k");
    let q = GemmProblem::new(Precision::F16, DType::F64, 8, 8, 8);
    let e = q.validate().unwrap_err().to_string();
    assert!(e.contains("supported outputs: fp16, bf16, fp32"), "{e}");
    let q = GemmProblem::new(Precision::F32, DType::F16, 8, 8, 8);
    assert_eq!(arg_of(q.validate().unwrap_err()), "unsupported");
    // tf32, fp8 and int8: A row-major and B [N, K] only; scales on 8-bit inputs only; i32 out
    // is the plain product
    for prec in [Precision::Tf32, Precision::Fp8E4M3, Precision::Fp8E5M2, Precision::Int8] {
        let q = GemmProblem::new(prec, DType::F32, 8, 8, 8);
        assert_eq!(arg_of(q.clone().validate().unwrap_err()), "b_layout");
        assert!(q.b_layout(Layout::ColMajor).validate().is_ok(), "{prec:?}");
    }
    let nk = |prec, out| GemmProblem::new(prec, out, 8, 8, 16).b_layout(Layout::ColMajor);
    assert_eq!(
        arg_of(
            nk(Precision::BF16, DType::BF16)
                .scales(GemmScales::RowWise)
                .validate()
                .unwrap_err()
        ),
        "scales"
    );
    assert!(nk(Precision::Fp8E4M3, DType::BF16)
        .scales(GemmScales::RowWise)
        .validate()
        .is_ok());
    assert!(nk(Precision::Int8, DType::I32).validate().is_ok());
    assert_eq!(
        arg_of(nk(Precision::Int8, DType::I32).bias(true).validate().unwrap_err()),
        "out"
    );
    assert_eq!(
        arg_of(
            nk(Precision::Int8, DType::I32)
                .scales(GemmScales::PerTensor)
                .validate()
                .unwrap_err()
        ),
        "out"
    );
    let e = nk(Precision::Fp8E5M2, DType::F64).validate().unwrap_err().to_string();
    assert!(
        e.contains("supported outputs: bf16, fp16, fp32, fp8e4m3, fp8e5m2"),
        "{e}"
    );
    // fp8 outputs: fp8 inputs only, with an activation but no C, bias or residual
    for out in [DType::F8E4M3, DType::F8E5M2] {
        assert!(nk(Precision::Fp8E4M3, out)
            .scales(GemmScales::PerTensor)
            .activation(Activation::Silu)
            .validate()
            .is_ok());
        for q in [
            nk(Precision::Fp8E5M2, out).bias(true),
            nk(Precision::Fp8E5M2, out).with_c(true),
            nk(Precision::Fp8E5M2, out).residual(true),
        ] {
            let e = q.validate().unwrap_err();
            assert!(e.to_string().contains("no C, bias or residual"), "{e}");
            assert_eq!(arg_of(e), "out");
        }
        assert_eq!(arg_of(nk(Precision::Int8, out).validate().unwrap_err()), "unsupported");
        assert_eq!(arg_of(nk(Precision::BF16, out).validate().unwrap_err()), "unsupported");
    }
    // empty and K = 0 problems are valid
    assert!(GemmProblem::new(Precision::F32, DType::F32, 0, 8, 8).validate().is_ok());
    assert!(GemmProblem::new(Precision::F32, DType::F32, 8, 8, 0).validate().is_ok());
}

#[test]
fn dispatch_follows_precision_shape_layout_and_alignment() {
    let a100 = Arch::SM80;
    let h = |m, n, k| GemmProblem::new(Precision::BF16, DType::BF16, m, n, k);
    let auto = |p: &GemmProblem| choose_path(p, a100, GemmPath::Auto).unwrap();
    assert_eq!(auto(&h(4096, 4096, 4096)), GemmPath::Sm80);
    assert_eq!(auto(&h(4096, 4096, 4096).b_layout(Layout::ColMajor)), GemmPath::Sm80);
    assert_eq!(auto(&h(16, 4096, 4096).b_layout(Layout::ColMajor)), GemmPath::Skinny);
    assert_eq!(auto(&h(17, 4096, 4096).b_layout(Layout::ColMajor)), GemmPath::Sm80);
    assert_eq!(auto(&h(1, 4096, 4096)), GemmPath::Sm80, "skinny takes B [N, K] only");
    assert_eq!(auto(&h(64, 64, 7)), GemmPath::Simt, "lda = 7 breaks the 16-byte rule");
    assert_eq!(auto(&h(64, 64, 64).a_layout(Layout::ColMajor)), GemmPath::Simt);
    let f64p = GemmProblem::new(Precision::F64, DType::F64, 64, 64, 64);
    assert_eq!(auto(&f64p), GemmPath::Dmma);
    assert_eq!(
        choose_path(&f64p, Arch { major: 7, minor: 5 }, GemmPath::Auto).unwrap(),
        GemmPath::Simt
    );
    assert_eq!(
        auto(&GemmProblem::new(Precision::F32, DType::F32, 64, 64, 64)),
        GemmPath::Simt
    );
    // forced paths that cannot run the problem say why
    let e = choose_path(&h(64, 64, 7), a100, GemmPath::Sm80).unwrap_err();
    assert_eq!(arg_of(e), "lda");
    let e = choose_path(&h(64, 64, 64), a100, GemmPath::Skinny).unwrap_err();
    assert_eq!(arg_of(e), "unsupported");
    let e = choose_path(&h(64, 64, 64), a100, GemmPath::Dmma).unwrap_err();
    assert!(e.to_string().contains("fp64"), "{e}");
    let e = choose_path(&h(64, 64, 64), a100, GemmPath::Hopper).unwrap_err();
    assert!(e.to_string().contains("Hopper"), "{e}");
    // sm_90: the Hopper path for 16-byte-aligned fp16/bf16 past the skinny range, and the only
    // path of tf32, fp8 and int8
    let h100 = Arch::SM90;
    let auto90 = |p: &GemmProblem| choose_path(p, h100, GemmPath::Auto);
    assert_eq!(auto90(&h(4096, 4096, 4096)).unwrap(), GemmPath::Hopper);
    assert_eq!(
        auto90(&h(129, 264, 104).b_layout(Layout::ColMajor)).unwrap(),
        GemmPath::Hopper
    );
    // D's rows of 257 bf16 are not a multiple of 16 bytes (TMA stores): the sm80 path
    assert_eq!(
        auto90(&h(129, 257, 104).b_layout(Layout::ColMajor)).unwrap(),
        GemmPath::Sm80
    );
    assert_eq!(
        auto90(&h(16, 4096, 4096).b_layout(Layout::ColMajor)).unwrap(),
        GemmPath::Skinny
    );
    assert_eq!(
        auto90(&h(64, 64, 7)).unwrap(),
        GemmPath::Simt,
        "lda = 7: neither Hopper nor sm80"
    );
    assert_ne!(
        auto90(&h(64, 64, 0)).unwrap(),
        GemmPath::Hopper,
        "K = 0 is not the Hopper path's"
    );
    assert_eq!(
        auto90(&h(64, 64, 64).a_layout(Layout::ColMajor)).unwrap(),
        GemmPath::Simt
    );
    assert_eq!(auto90(&f64p).unwrap(), GemmPath::Dmma);
    let mut shared_b = h(256, 256, 256).batched(3);
    shared_b.batch_stride_b = 0;
    assert_eq!(
        auto90(&shared_b).unwrap(),
        GemmPath::Sm80,
        "a shared B (batch stride 0) is no TMA stride"
    );
    let fp8 = GemmProblem::new(Precision::Fp8E4M3, DType::BF16, 64, 64, 64).b_layout(Layout::ColMajor);
    assert_eq!(auto90(&fp8).unwrap(), GemmPath::Hopper);
    // fp8 mma.sync needs sm_89: A100 and sm_86 have no fp8 path, Ada (sm_89) the sm80 one
    assert!(choose_path(&fp8, a100, GemmPath::Auto).is_err_and(|e| e.to_string().contains("sm_89")));
    assert!(choose_path(&fp8, Arch::SM86, GemmPath::Sm80).is_err_and(|e| e.to_string().contains("sm_89")));
    assert_eq!(choose_path(&fp8, Arch::SM89, GemmPath::Auto).unwrap(), GemmPath::Sm80);
    assert_eq!(choose_path(&fp8, h100, GemmPath::Sm80).unwrap(), GemmPath::Sm80);
    assert!(
        choose_path(&fp8, h100, GemmPath::Simt).is_err_and(|e| e.to_string().contains("hopper and sm80 paths only"))
    );
    // int8 and tf32 run on the sm80 path from sm_80 on; B [K, N] is refused with the argument
    let int8 = GemmProblem::new(Precision::Int8, DType::I32, 64, 64, 64).b_layout(Layout::ColMajor);
    assert_eq!(choose_path(&int8, a100, GemmPath::Auto).unwrap(), GemmPath::Sm80);
    let tf32 = GemmProblem::new(Precision::Tf32, DType::F32, 100, 36, 44).b_layout(Layout::ColMajor);
    assert_eq!(choose_path(&tf32, a100, GemmPath::Auto).unwrap(), GemmPath::Sm80);
    let mut tf32_lda = tf32.clone();
    tf32_lda.lda = 46; // 184 bytes
    assert_eq!(arg_of(choose_path(&tf32_lda, a100, GemmPath::Auto).unwrap_err()), "lda");
    let mut tf32_kn = tf32.clone();
    tf32_kn.b_layout = Layout::RowMajor;
    assert_eq!(
        arg_of(choose_path(&tf32_kn, a100, GemmPath::Sm80).unwrap_err()),
        "b_layout"
    );
    // an output the sm80 path has not: int8 -> fp8
    let int8_fp8 = GemmProblem::new(Precision::Int8, DType::F8E4M3, 64, 64, 64).b_layout(Layout::ColMajor);
    assert!(choose_path(&int8_fp8, a100, GemmPath::Sm80).is_err());
    let odd_k = GemmProblem::new(Precision::Int8, DType::I32, 64, 64, 24).b_layout(Layout::ColMajor);
    assert_eq!(
        arg_of(auto90(&odd_k).unwrap_err()),
        "lda",
        "24 bytes is not a multiple of 16"
    );
    assert_eq!(
        auto90(&GemmProblem::new(Precision::F32, DType::F32, 64, 64, 64)).unwrap(),
        GemmPath::Simt,
        "fp32 stays exact: no silent tf32"
    );
    assert_eq!(
        choose_path(&h(64, 64, 7), a100, GemmPath::Simt).unwrap(),
        GemmPath::Simt
    );
    let mut batched = h(64, 64, 64).batched(2);
    batched.batch_stride_a = 64 * 64 + 4;
    assert_eq!(
        arg_of(choose_path(&batched, a100, GemmPath::Sm80).unwrap_err()),
        "batch_stride_a"
    );
    for p in GemmPath::ALL {
        assert_eq!(GemmPath::parse(p.name()), Some(p));
    }
}

#[test]
fn splits_fill_the_machine_and_cover_k() {
    // N = 4096 on 132 SMs: 64 column CTAs, split K to reach ~4 CTAs per SM
    let (s, per) = choose_splits(4096, 4096, 1, 132, None);
    assert!(
        s > 1 && per % CHUNK_K == 0 && s * per >= 4096 && (s - 1) * per < 4096,
        "{s} {per}"
    );
    // a grid already wider than four CTAs per SM is not split
    let (s, _) = choose_splits(14336 * 4, 4096, 1, 132, None);
    assert_eq!(s, 1);
    // short K cannot split below one slice
    assert_eq!(choose_splits(64, 100, 1, 132, None), (1, CHUNK_K));
    assert_eq!(choose_splits(64, 0, 1, 132, None), (1, CHUNK_K));
    // forced
    let (s, per) = choose_splits(4096, 4096, 1, 132, Some(3));
    assert_eq!((s, per), (3, 6 * CHUNK_K));
}

#[test]
fn every_variant_is_listed_once_per_arch() {
    for arch in Arch::CI_TARGETS {
        let specs = kernel_specs(arch);
        let mut names: Vec<_> = specs.iter().map(|s| s.name.clone()).collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(n, names.len(), "duplicate variant names for {arch}");
        // simt, sm80, skinny, split-K reductions, dmma (3 stages, and 4 on sm_80/90); on sm_90
        // the Hopper variants too
        // (simt and sm80 plain and GLU; the GLU interleave copy for 1/2/4/8-byte elements; the
        // sm80 tf32 (1) and int8 (4) variants, and fp8 (10) from sm_89 on)
        let hopper = if arch == Arch::SM90 { 69 + 24 } else { 0 };
        let sm80_fp8 = if (arch.major, arch.minor) >= (8, 9) { 10 } else { 0 };
        let dmma = super::dmma::stage_choices(arch).len();
        assert_eq!(
            n,
            16 + 24 + 5 + sm80_fp8 + 6 + 3 + dmma + 4 + hopper,
            "{arch}: {names:?}"
        );
    }
}

/// The per-arch compile check of CI, for the GEMM kernels only. CI's
/// `registry::every_kernel_compiles_for_every_ci_arch_without_spills` already compiles them
/// (120 compiles: minutes on 2 cores), so this focused copy is ignored by default:
/// `cargo test -p tessera --release --lib gemm_kernels_compile -- --ignored`.
#[test]
#[ignore = "covered by registry::every_kernel_compiles_for_every_ci_arch_without_spills"]
fn gemm_kernels_compile_for_every_ci_arch_without_spills() {
    if !crate::runtime::probe::nvrtc_or_skip("gemm_kernels_compile_for_every_ci_arch_without_spills") {
        return;
    }
    use rayon::prelude::*;
    let jobs: Vec<_> = Arch::CI_TARGETS
        .iter()
        .flat_map(|&a| kernel_specs(a).into_iter().map(move |s| (s, a)))
        .collect();
    let failures: Vec<String> = jobs
        .par_iter()
        .filter_map(|(s, a)| match compile_only(s, *a) {
            Ok(c) if c.resources.spill_free() && c.resources.registers <= 255 => {
                eprintln!("{} {a}: {} registers", s.name, c.resources.registers);
                None
            }
            Ok(c) => Some(format!("{} {a}: spills {:?}", s.name, c.resources)),
            Err(e) => Some(format!("{} {a}: {e}", s.name)),
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn glu_problem_has_2n_columns_of_b_and_names_broken_rules() {
    let p = GemmProblem::new(Precision::BF16, DType::BF16, 64, 48, 32).glu(Glu::SwiGlu);
    assert!(p.validate().is_ok());
    assert_eq!(p.b_n(), 96);
    assert_eq!((p.ldb, p.batch_stride_b), (96, 32 * 96));
    assert_eq!(p.b_stored(), (32, 96));
    let nk = p.clone().b_layout(Layout::ColMajor);
    assert_eq!((nk.b_stored(), nk.ldb), ((96, 32), 32));
    // the order of the builders does not matter for the contiguous ldb
    let nk2 = GemmProblem::new(Precision::BF16, DType::BF16, 64, 48, 32)
        .b_layout(Layout::ColMajor)
        .glu(Glu::SwiGlu);
    assert_eq!(nk, nk2);
    assert_eq!(p.flops(), 2.0 * 64.0 * 96.0 * 32.0);
    // ldb must cover 2N
    let mut q = p.clone();
    q.ldb = 48;
    assert_eq!(arg_of(q.validate().unwrap_err()), "ldb");
    assert_eq!(arg_of(p.clone().with_c(true).validate().unwrap_err()), "c");
    assert_eq!(arg_of(p.clone().residual(true).validate().unwrap_err()), "residual");
    assert_eq!(
        arg_of(p.clone().activation(Activation::Silu).validate().unwrap_err()),
        "activation"
    );
    assert!(p.clone().bias(true).validate().is_ok());
    for prec in [Precision::Tf32, Precision::Fp8E4M3, Precision::Int8] {
        let q = GemmProblem::new(prec, DType::F32, 8, 8, 16)
            .b_layout(Layout::ColMajor)
            .glu(Glu::GeGluErf);
        assert_eq!(arg_of(q.validate().unwrap_err()), "glu", "{prec:?}");
    }
    for prec in [Precision::F32, Precision::F64] {
        let out = if prec == Precision::F64 { DType::F64 } else { DType::F32 };
        assert!(GemmProblem::new(prec, out, 8, 8, 16)
            .glu(Glu::GeGluTanh)
            .validate()
            .is_ok());
    }
    // 2N past 2^31 - 1
    let q = GemmProblem::new(Precision::BF16, DType::BF16, 8, 1 << 30, 16).glu(Glu::SwiGlu);
    assert_eq!(arg_of(q.validate().unwrap_err()), "n");
    for g in Glu::ALL {
        assert_eq!(Glu::parse(g.name()), Some(g));
    }
    assert_eq!(Glu::parse("GeGLU_erf"), Some(Glu::GeGluErf));
    assert_eq!(Glu::SwiGlu.gate_activation(), Activation::Silu);
}

#[test]
fn glu_dispatch_skips_the_paths_without_it() {
    let h = |m, n, k| {
        GemmProblem::new(Precision::BF16, DType::BF16, m, n, k)
            .b_layout(Layout::ColMajor)
            .glu(Glu::SwiGlu)
    };
    // decode shapes: not the skinny path (no GLU there)
    assert_eq!(
        choose_path(&h(8, 4096, 4096), Arch::SM80, GemmPath::Auto).unwrap(),
        GemmPath::Sm80
    );
    assert_eq!(
        choose_path(&h(8, 4096, 4096), Arch::SM90, GemmPath::Auto).unwrap(),
        GemmPath::Hopper
    );
    assert_eq!(
        choose_path(&h(4096, 14336, 4096), Arch::SM90, GemmPath::Auto).unwrap(),
        GemmPath::Hopper
    );
    assert_eq!(
        choose_path(&h(64, 64, 7), Arch::SM80, GemmPath::Auto).unwrap(),
        GemmPath::Simt
    );
    for forced in [GemmPath::Skinny, GemmPath::Dmma] {
        assert_eq!(
            arg_of(choose_path(&h(8, 64, 64), Arch::SM80, forced).unwrap_err()),
            "glu"
        );
    }
    let f64p = GemmProblem::new(Precision::F64, DType::F64, 64, 64, 64).glu(Glu::SwiGlu);
    assert_eq!(choose_path(&f64p, Arch::SM80, GemmPath::Auto).unwrap(), GemmPath::Simt);
    // a B [K, 2N] whose 2N rows are 16-byte multiples stays on the Hopper path
    let kn = GemmProblem::new(Precision::F16, DType::F16, 256, 260, 64).glu(Glu::GeGluErf);
    assert_eq!(
        choose_path(&kn, Arch::SM90, GemmPath::Auto).unwrap(),
        GemmPath::Sm80,
        "ldd 520 B"
    );
    let kn = GemmProblem::new(Precision::F16, DType::F16, 256, 264, 64).glu(Glu::GeGluErf);
    assert_eq!(choose_path(&kn, Arch::SM90, GemmPath::Auto).unwrap(), GemmPath::Hopper);
}

#[test]
fn glu_reference_is_two_products_of_the_separate_weights() {
    // interleaving [Wg | Wu] (B [K, 2N]) and the GLU reference equal act(X Wg + bg) (X Wu + bu)
    // computed from the separate weights with the plain epilogue reference
    let (m, n, k) = (5, 7, 9);
    let x = rand(1, m, k);
    let wg = rand(2, k, n);
    let wu = rand(3, k, n);
    let bg = rand(4, 1, n);
    let bu = rand(5, 1, n);
    let stacked: Vec<f64> = (0..k)
        .flat_map(|r| wg[r * n..(r + 1) * n].iter().chain(&wu[r * n..(r + 1) * n]).copied())
        .collect();
    let b = interleave_host(&stacked, n, k, Layout::RowMajor);
    let bias = interleave_host(&[bg.clone(), bu.clone()].concat(), n, 1, Layout::ColMajor);
    for kind in [Glu::SwiGlu, Glu::GeGluErf, Glu::GeGluTanh] {
        let p = GemmProblem::new(Precision::F32, DType::F32, m, n, k)
            .glu(kind)
            .bias(true);
        let (d, tol) = reference::gemm(
            &p,
            &reference::Logical {
                a: &x,
                b: &b,
                c: None,
                bias: Some(&bias),
                residual: None,
            },
            0.5,
            0.0,
        );
        let g = matmul(&x, &wg, m, n, k);
        let u = matmul(&x, &wu, m, n, k);
        for i in 0..m {
            for j in 0..n {
                let e = i * n + j;
                let gate = reference::epilogue(kind.gate_activation(), g[e], 0.5, None, Some(bg[j]), None);
                let up = reference::epilogue(Activation::None, u[e], 0.5, None, Some(bu[j]), None);
                assert!((d[e] - gate * up).abs() <= 1e-12 * (1.0 + d[e].abs()), "{kind:?} {e}");
                assert!(
                    tol[e] > 0.0 && tol[e] < 1e-3 * (1.0 + d[e].abs()),
                    "{kind:?} {e}: {}",
                    tol[e]
                );
            }
        }
    }
}

#[test]
fn glu_interleave_host_layouts() {
    // [2N, K]: rows 2j / 2j + 1 are gate / up row j
    let stacked: Vec<u32> = (0..6 * 2).collect(); // 2N = 6 rows of K = 2
    let out = interleave_host(&stacked, 3, 2, Layout::ColMajor);
    assert_eq!(out, vec![0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11]);
    // [K, 2N]: columns 2j / 2j + 1 are gate / up column j
    let stacked: Vec<u32> = (0..2 * 6).collect(); // K = 2 rows of 2N = 6
    let out = interleave_host(&stacked, 3, 2, Layout::RowMajor);
    assert_eq!(out, vec![0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11]);
    assert!(interleave_host::<u8>(&[], 0, 5, Layout::ColMajor).is_empty());
}

#[test]
fn every_verify_case_plans_on_sm80_and_sm90() {
    // the verify cases (GLU ones included) are valid problems whose forced paths can run them
    for case in super::verify::cases(false)
        .into_iter()
        .chain(super::verify::cases(true))
    {
        let p = case.problem();
        assert!(p.validate().is_ok(), "{}: {:?}", case.name(), p.validate());
        for arch in [Arch::SM80, Arch::SM90] {
            let path = choose_path(&p, arch, case.path);
            assert!(path.is_ok(), "{} on {arch}: {path:?}", case.name());
        }
    }
    // and some GLU cases reach the Hopper path through the dispatcher on sm_90
    let hopper_glu = super::verify::cases(false)
        .into_iter()
        .filter(|c| c.epilogue.glu.is_some())
        .filter(|c| choose_path(&c.problem(), Arch::SM90, c.path).ok() == Some(GemmPath::Hopper))
        .count();
    assert!(hopper_glu >= 6, "{hopper_glu}");
}

#[test]
fn dmma_stages_default_to_three_and_reject_what_the_device_cannot_hold() {
    let sm86 = Arch { major: 8, minor: 6 };
    assert_eq!(dmma_stages(None, Arch::SM90).unwrap(), 3);
    assert_eq!(dmma_stages(None, sm86).unwrap(), 3);
    assert_eq!(dmma_stages(Some(4), Arch::SM90).unwrap(), 4);
    assert_eq!(dmma_stages(Some(3), sm86).unwrap(), 3);
    for (stages, arch) in [(4, sm86), (2, Arch::SM90), (5, Arch::SM90)] {
        match dmma_stages(Some(stages), arch) {
            Err(Error::InvalidArgument { arg, rule }) => {
                assert_eq!(arg, "dmma_stages");
                assert!(rule.contains("takes"), "{rule}");
            }
            other => panic!("{stages} stages on {arch:?}: {other:?}"),
        }
    }
}
