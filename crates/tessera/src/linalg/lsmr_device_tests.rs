//! CPU tests of the GPU solver's host side: the state and parameter layouts against lsmr.cu,
//! the kernel variants, argument checks, storage choice and the finite-value check of A.
//! (The solver itself runs in `tessera verify lsmr` on a GPU.)

use super::device_operator::{check_finite_values, choose_dual, transpose_bytes, Storage};
use super::lsmr::{check_problem as check_lengths, LsmrOptions};
use super::lsmr_device::{all_variants, vector_grid, LsmrState, MAX_PARTIALS, SOURCE, STATE_LEN};
use crate::error::Error;
use crate::sparse::CsrHost;

/// The Rust mirror lists the fields of `struct LsmrState` in lsmr.cu, in order.
#[test]
fn state_mirrors_the_kernel_struct() {
    let start = SOURCE.find("struct LsmrState {").expect("struct LsmrState in lsmr.cu");
    let body = &SOURCE[start..start + SOURCE[start..].find("};").unwrap()];
    let fields: Vec<String> = body
        .lines()
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
        .collect();
    assert_eq!(fields.len(), STATE_LEN);
    // asymmetric data: slot i holds i, so a swapped pair of fields shows
    let mut slots = [0.0; STATE_LEN];
    for (i, s) in slots.iter_mut().enumerate() {
        *s = i as f64;
    }
    let st = LsmrState::from_slots(&slots);
    let dbg = format!("{st:?}");
    for (i, name) in fields.iter().enumerate() {
        assert!(
            dbg.contains(&format!("{name}: {i}.0")),
            "field {name} is not slot {i} of the Rust mirror: {dbg}"
        );
    }
    assert_eq!(st.to_slots(), slots);
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
    assert_eq!(vector_grid(0), 1);
    assert_eq!(vector_grid(1), 1);
    assert_eq!(vector_grid(256), 1);
    assert_eq!(vector_grid(257), 2);
    assert_eq!(vector_grid(100_000_000), MAX_PARTIALS as u32);
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
