//! GEMM tests without a GPU: the reference against the triple loop, erf, the epilogue order,
//! the Rust/device activation codes, problem validation, dispatch, split-K sizing, and (with
//! NVRTC) every kernel variant compiling for every CI architecture without spills.

use super::plan::{choose_path, kernel_specs, GemmPath};
use super::problem::{erf64, Activation, GemmProblem, GemmScales, Layout, Precision};
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
    assert!(e.contains("supported outputs: bf16, fp16, fp32"), "{e}");
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
    assert!(choose_path(&fp8, a100, GemmPath::Auto).is_err_and(|e| e.to_string().contains("sm_90")));
    assert!(choose_path(&fp8, h100, GemmPath::Sm80).is_err_and(|e| e.to_string().contains("hopper path only")));
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
        // simt, sm80, skinny, split-K reductions, dmma; on sm_90 the Hopper variants too
        let hopper = if arch == Arch::SM90 { 38 } else { 0 };
        assert_eq!(n, 8 + 12 + 6 + 3 + 1 + hopper, "{arch}: {names:?}");
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
