//! CPU tests of the GPU solver's host side: the state and parameter layouts against lsmr.cu,
//! the kernel variants, argument checks, storage choice and the finite-value check of A.
//! (The solver itself runs in `tessera verify lsmr` on a GPU.)

use super::device_operator::{check_finite_values, choose_dual, transpose_bytes, Storage};
use super::lsmr::{check_problem as check_lengths, LsmrOptions};
use super::lsmr_device::{
    all_variants, max_vector_ctas, vector_grid, LsmrDamp, LsmrShared, DAMP_LEN, MAX_PARTIALS, SHARED_LEN, SOURCE,
};
use crate::error::Error;
use crate::sparse::CsrHost;

/// The fields of `struct <name>` in lsmr.cu, in order.
fn kernel_fields(name: &str) -> Vec<String> {
    let start = SOURCE
        .find(&format!("struct {name} {{"))
        .unwrap_or_else(|| panic!("struct {name} in lsmr.cu"));
    let body = &SOURCE[start..start + SOURCE[start..].find("};").unwrap()];
    body.lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| l.starts_with("double "))
        .flat_map(|l| {
            l.trim_start_matches("double ")
                .trim_end_matches(';')
                .split(',')
                .map(|f| f.trim().to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Each field `name` of the Debug output `dbg` of a mirror filled with slot i = i is slot i.
fn assert_fields_in_order(fields: &[String], dbg: &str) {
    for (i, name) in fields.iter().enumerate() {
        assert!(
            dbg.contains(&format!("{name}: {i}.0")),
            "field {name} is not slot {i} of the Rust mirror: {dbg}"
        );
    }
}

/// The Rust mirrors list the fields of `struct LsmrShared` and `struct LsmrDamp` in lsmr.cu,
/// in order.
#[test]
fn state_mirrors_the_kernel_structs() {
    // asymmetric data: slot i holds i, so a swapped pair of fields shows
    let shared_fields = kernel_fields("LsmrShared");
    assert_eq!(shared_fields.len(), SHARED_LEN);
    let slots: Vec<f64> = (0..SHARED_LEN).map(|i| i as f64).collect();
    let sh = LsmrShared::from_slots(&slots);
    assert_fields_in_order(&shared_fields, &format!("{sh:?}"));
    assert_eq!(sh.to_slots().to_vec(), slots);

    let damp_fields = kernel_fields("LsmrDamp");
    assert_eq!(damp_fields.len(), DAMP_LEN);
    let slots: Vec<f64> = (0..DAMP_LEN).map(|i| i as f64).collect();
    let st = LsmrDamp::from_slots(&slots);
    assert_fields_in_order(&damp_fields, &format!("{st:?}"));
    assert_eq!(st.to_slots().to_vec(), slots);
}

#[test]
fn variants_are_few_and_named_apart() {
    let v = all_variants();
    assert_eq!(v.len(), 9);
    let mut names: Vec<String> = v.iter().map(|v| v.spec().name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 9);
}

#[test]
fn vector_grids_are_bounded_by_the_partials() {
    assert_eq!(vector_grid(0, 264), 1);
    assert_eq!(vector_grid(1, 264), 1);
    assert_eq!(vector_grid(256, 264), 1);
    assert_eq!(vector_grid(257, 264), 2);
    assert_eq!(vector_grid(100_000_000, 264), 264);
    assert_eq!(vector_grid(100_000_000, 0), 1);
    assert_eq!(vector_grid(100_000_000, 1 << 20), MAX_PARTIALS as u32);
    // two CTAs per multiprocessor, within the partials
    assert_eq!(max_vector_ctas(132), 264);
    assert_eq!(max_vector_ctas(1000), MAX_PARTIALS);
}

fn invalid(r: crate::Result<()>) -> (&'static str, String) {
    match r {
        Err(Error::InvalidArgument { arg, rule }) => (arg, rule),
        other => panic!("expected an invalid-argument error, got {other:?}"),
    }
}

#[test]
fn argument_checks_name_the_argument() {
    let ok = LsmrOptions::default();
    check_lengths(5, 3, 5, &ok).unwrap();
    assert_eq!(invalid(check_lengths(5, 3, 4, &ok)).0, "b");
    let x0 = |v: Vec<f64>| LsmrOptions {
        x0: Some(v),
        ..LsmrOptions::default()
    };
    assert_eq!(invalid(check_lengths(5, 3, 5, &x0(vec![0.0; 2]))).0, "x0");
    let (arg, rule) = invalid(check_lengths(5, 3, 5, &x0(vec![0.0, f64::NAN, 0.0])));
    assert_eq!(arg, "x0");
    assert!(rule.contains("element 1"), "{rule}");
    for (arg, opts) in [
        (
            "damp",
            LsmrOptions {
                damp: -1.0,
                ..LsmrOptions::default()
            },
        ),
        (
            "atol",
            LsmrOptions {
                atol: f64::NAN,
                ..LsmrOptions::default()
            },
        ),
        (
            "btol",
            LsmrOptions {
                btol: -1e-6,
                ..LsmrOptions::default()
            },
        ),
        (
            "conlim",
            LsmrOptions {
                conlim: f64::INFINITY,
                ..LsmrOptions::default()
            },
        ),
    ] {
        assert_eq!(invalid(check_lengths(5, 3, 5, &opts)).0, arg);
    }
}

#[test]
fn nonfinite_values_of_a_are_refused_with_their_position() {
    let mut a = CsrHost::<f64, i32>::from_dense(3, 3, &[1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 4.0, 0.0, 5.0]);
    check_finite_values(&a).unwrap();
    a.values[3] = f64::NAN; // the entry (2, 0)
    let (arg, rule) = invalid(check_finite_values(&a));
    assert_eq!(arg, "A");
    assert!(rule.contains("(2, 0)"), "{rule}");
}

#[test]
fn storage_is_dual_when_the_copy_fits() {
    let a = CsrHost::<f32, i32>::from_dense(2, 3, &[1.0, 0.0, 2.0, 0.0, 3.0, 0.0]);
    assert_eq!(transpose_bytes(&a), 3 * 8 + 4 * 4);
    assert!(choose_dual(Storage::Auto, 800, 1000));
    assert!(!choose_dual(Storage::Auto, 801, 1000));
    assert!(choose_dual(Storage::Dual, 10, 0));
    assert!(!choose_dual(Storage::Single, 0, 1 << 40));
}

/// The kernels of `lsmr` (the registry's list: the solver's and the operators') compile with
/// NVRTC for every CI architecture without spills (the registry-wide test does the same for
/// every operator; this one runs alone, filtered to linalg).
#[test]
fn linalg_kernels_compile_for_every_ci_arch_without_spills() {
    use crate::registry::Operator;
    use crate::runtime::Arch;
    if !crate::runtime::probe::nvrtc_or_skip("linalg_kernels_compile_for_every_ci_arch_without_spills") {
        return;
    }
    let mut failures = Vec::new();
    for arch in Arch::CI_TARGETS {
        for spec in super::OPERATOR.kernel_specs(arch) {
            match crate::runtime::compile_only(&spec, arch) {
                Ok(c) if c.resources.spill_free() => {
                    eprintln!("{} {arch}: {} registers", spec.name, c.resources.registers)
                }
                Ok(c) => failures.push(format!("{} {arch}: spills {:?}\n{}", spec.name, c.resources, c.log)),
                Err(e) => failures.push(format!("{} {arch}: {e}", spec.name)),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The GPU jobs (verify and bench, quick and full) of `lsmr` are named apart (`--filter` and
/// the results JSON key rows by name), and the new features each have jobs.
#[test]
fn lsmr_jobs_are_named_apart_and_cover_the_features() {
    use crate::registry::Operator;
    for quick in [true, false] {
        let verify: Vec<String> = super::OPERATOR.verify_jobs(quick).into_iter().map(|j| j.name).collect();
        let bench: Vec<String> = super::OPERATOR.bench_jobs(quick).into_iter().map(|j| j.name).collect();
        for names in [&verify, &bench] {
            let mut sorted = names.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), names.len(), "duplicate job names in {names:?}");
        }
        for feature in ["lsmr damps", "lsmr scaled", "lsmr dense"] {
            assert!(
                verify.iter().any(|n| n.starts_with(feature)),
                "no verify job {feature}* (quick {quick})"
            );
        }
        assert!(bench
            .iter()
            .any(|n| n.starts_with("lsmr damps8") && n.ends_with("separate")));
        assert!(bench
            .iter()
            .any(|n| n.starts_with("lsmr damps8") && !n.ends_with("separate")));
    }
}

/// The launch-parameter structs of lsmr.cu list the fields the Rust mirrors (`VecParams`,
/// `ScalarParams` in lsmr_device.rs) fill, in the same order (the strides of many right-hand
/// sides included).
#[test]
fn launch_params_mirror_the_kernel_structs() {
    let body = |name: &str| {
        let start = SOURCE.find(&format!("struct {name} {{")).unwrap();
        let end = start + SOURCE[start..].find("};").unwrap();
        SOURCE[start..end].to_string()
    };
    let names = |text: &str| -> Vec<String> {
        text.lines()
            .skip(1)
            .map(|l| l.split("//").next().unwrap().trim())
            .filter(|l| !l.is_empty())
            .flat_map(|l| {
                // `type name` or `type* name`, then `, name` for the others of the line
                let mut parts = l.trim_end_matches(';').split(',');
                let first = parts.next().unwrap().split_whitespace().last().unwrap();
                std::iter::once(first.trim_start_matches('*').to_string())
                    .chain(parts.map(|f| f.trim().to_string()))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let vec_fields = [
        "a",
        "u",
        "h",
        "hbar",
        "x",
        "d",
        "dv",
        "partials",
        "shared",
        "damps",
        "len",
        "stride",
        "col_stride",
        "state_stride",
        "damp_stride",
        "first",
        "fused",
        "scalar",
        "counters",
        "v",
        "partials_x",
        "x_ctas",
        "x_rows",
    ];
    assert_eq!(names(&body("VecParams")), vec_fields);
    let scalar_fields = [
        "shared",
        "damps",
        "partials_u",
        "partials_v",
        "partials_x",
        "count_u",
        "count_v",
        "count_x",
        "mode",
        "k",
        "state_stride",
    ];
    assert_eq!(names(&body("ScalarParams")), scalar_fields);
    assert_eq!(super::lsmr_device::COLUMN_LEN, SHARED_LEN + DAMP_LEN);
}

/// The device memory of many right-hand sides grows with k and overflows into `None`.
#[test]
fn many_bytes_counts_every_column() {
    use super::lsmr_device::many_bytes;
    let one = many_bytes::<f32>(1000, 100, 1).unwrap();
    assert_eq!(many_bytes::<f32>(1000, 100, 8).unwrap(), 8 * one);
    assert!(one >= (2 * 1000 + 6 * 100) * 4);
    assert!(many_bytes::<f64>(1000, 100, 1).unwrap() > one);
    assert_eq!(many_bytes::<f64>(usize::MAX / 2, 1, 1), None);
}
