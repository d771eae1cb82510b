//! Tests of Matrix Market reading and writing: every header kind, symmetric and skew
//! expansion, patterns, the errors (each with its line number), a round trip through a file,
//! and the multi-threaded parse of a large body.

use super::mtx::read_mtx_csr;
use super::*;
use crate::error::Error;

/// The message of an `InvalidArgument` error (panics on anything else).
fn rule_of<T>(r: crate::Result<T>) -> String {
    match r {
        Err(Error::InvalidArgument { rule, .. }) => rule,
        Err(e) => panic!("expected InvalidArgument, got {e}"),
        Ok(_) => panic!("expected InvalidArgument, got Ok"),
    }
}

/// The triplets of a COO matrix, sorted, for order-independent comparison.
fn triplets(coo: &CooHost<f64, i64>) -> Vec<(i64, i64, f64)> {
    let mut t: Vec<_> = (0..coo.values.len())
        .map(|k| (coo.row_indices[k], coo.col_indices[k], coo.values[k]))
        .collect();
    t.sort_by_key(|a| (a.0, a.1));
    t
}

#[test]
fn general_real_with_comments_blank_lines_and_crlf() {
    let text = "%%MatrixMarket matrix coordinate real general\r\n% a comment\r\n\r\n%another\r\n  2 3 3\r\n1 1 1.5\r\n\r\n% inside the body\r\n2 3 -2e-3\r\n1 3 4\r\n";
    let (coo, header) = parse_mtx(text).unwrap();
    assert_eq!(
        header,
        MtxHeader {
            field: MtxField::Real,
            symmetry: MtxSymmetry::General
        }
    );
    assert_eq!((coo.rows, coo.cols), (2, 3));
    assert_eq!(triplets(&coo), vec![(0, 0, 1.5), (0, 2, 4.0), (1, 2, -2e-3)]);
    assert_eq!(header.to_string(), "matrix coordinate real general");
}

#[test]
fn integer_pattern_and_case_insensitive_banner() {
    let (coo, header) = parse_mtx("%%matrixmarket MATRIX Coordinate INTEGER general\n2 2 2\n1 2 -7\n2 1 3").unwrap();
    assert_eq!(header.field, MtxField::Integer);
    assert_eq!(triplets(&coo), vec![(0, 1, -7.0), (1, 0, 3.0)]);

    let (coo, header) = parse_mtx("%%MatrixMarket matrix coordinate pattern general\n3 3 2\n3 1\n2 2\n").unwrap();
    assert_eq!(header.field, MtxField::Pattern);
    assert_eq!(triplets(&coo), vec![(1, 1, 1.0), (2, 0, 1.0)]);
}

#[test]
fn symmetric_files_expand_to_both_triangles() {
    let text = "%%MatrixMarket matrix coordinate real symmetric\n3 3 3\n1 1 2\n3 1 5\n3 2 -1\n";
    let (coo, header) = parse_mtx(text).unwrap();
    assert_eq!(header.symmetry, MtxSymmetry::Symmetric);
    assert_eq!(
        triplets(&coo),
        vec![(0, 0, 2.0), (0, 2, 5.0), (1, 2, -1.0), (2, 0, 5.0), (2, 1, -1.0)]
    );
    let a = CsrHost::from_coo(coo, Duplicates::Reject).unwrap();
    let dense = a.to_dense_f64();
    assert_eq!(a.transpose().to_dense_f64(), dense);

    let (coo, _) = parse_mtx("%%MatrixMarket matrix coordinate pattern symmetric\n2 2 2\n1 1\n2 1\n").unwrap();
    assert_eq!(triplets(&coo), vec![(0, 0, 1.0), (0, 1, 1.0), (1, 0, 1.0)]);
}

#[test]
fn skew_symmetric_files_negate_the_mirror() {
    let text = "%%MatrixMarket matrix coordinate real skew-symmetric\n3 3 2\n2 1 4\n3 2 -0.5\n";
    let (coo, header) = parse_mtx(text).unwrap();
    assert_eq!(header.symmetry, MtxSymmetry::SkewSymmetric);
    assert_eq!(
        triplets(&coo),
        vec![(0, 1, -4.0), (1, 0, 4.0), (1, 2, 0.5), (2, 1, -0.5)]
    );
    let rule = rule_of(parse_mtx(
        "%%MatrixMarket matrix coordinate real skew-symmetric\n3 3 2\n2 1 4\n2 2 1\n",
    ));
    assert!(
        rule.contains("line 4:") && rule.contains("entry (2, 2) is on or above the diagonal"),
        "{rule}"
    );
}

#[test]
fn header_errors() {
    let unsupported = |text: &str| match parse_mtx(text) {
        Err(Error::Unsupported(m)) => m,
        other => panic!("expected Unsupported, got {other:?}"),
    };
    let m = unsupported("%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n4\n");
    assert!(m.contains("line 1") && m.contains("supported: coordinate"), "{m}");
    let m = unsupported("%%MatrixMarket matrix coordinate complex general\n1 1 1\n1 1 1 0\n");
    assert!(m.contains("complex"), "{m}");
    let m = unsupported("%%MatrixMarket matrix coordinate real hermitian\n1 1 1\n1 1 1\n");
    assert!(m.contains("hermitian"), "{m}");
    let m = unsupported("%%MatrixMarket vector coordinate real general\n1 1 1\n1 1 1\n");
    assert!(m.contains("object `vector`"), "{m}");

    for (text, needle) in [
        ("", "line 1: not a Matrix Market banner"),
        ("1 1 1\n1 1 1\n", "line 1: not a Matrix Market banner"),
        (
            "%%MatrixMarket matrix coordinate real\n",
            "line 1: the banner has 4 words",
        ),
        (
            "%%MatrixMarket matrix coordinate float general\n",
            "line 1: unknown field `float`",
        ),
        (
            "%%MatrixMarket matrix sparse real general\n",
            "line 1: unknown format `sparse`",
        ),
        (
            "%%MatrixMarket matrix coordinate real upper\n",
            "line 1: unknown symmetry `upper`",
        ),
        (
            "%%MatrixMarket matrix coordinate pattern skew-symmetric\n",
            "line 1: a `pattern` file cannot",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n% only comments\n",
            "line 2: the file ends before the size line",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n%\n2 x 1\n",
            "line 3: expected the size line",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n2 2\n",
            "line 2: expected the size line",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n2 -2 1\n",
            "line 2: expected the size line",
        ),
        (
            "%%MatrixMarket matrix coordinate real symmetric\n2 3 0\n",
            "line 2: a symmetric matrix must be square",
        ),
    ] {
        let rule = rule_of(parse_mtx(text));
        assert!(rule.contains(needle), "{text:?}: {rule}");
        assert!(rule.starts_with("Matrix Market text: "), "{rule}");
    }
}

#[test]
fn entry_errors_name_their_line() {
    let header = "%%MatrixMarket matrix coordinate real general\n% comment\n3 4 2\n1 1 1.0\n";
    for (bad_line, needle) in [
        ("0 1 1.0", "row index 0 is outside 1..=3"),
        ("4 1 1.0", "row index 4 is outside 1..=3"),
        ("1 5 1.0", "column index 5 is outside 1..=4"),
        ("1 -1 1.0", "column index `-1` is not a positive integer"),
        ("1 2", "missing value"),
        ("1", "missing column index"),
        ("1 2 x", "`x` is not a real number"),
        ("1 2 3 4", "unexpected `4` after the entry"),
        ("1 2 nan", "value NaN is not finite"),
        ("1 2 inf", "value inf is not finite"),
    ] {
        let rule = rule_of(parse_mtx(&format!("{header}{bad_line}\n")));
        assert!(
            rule.contains("line 5: ") && rule.contains(needle),
            "{bad_line:?}: {rule}"
        );
    }
    let rule = rule_of(parse_mtx(
        "%%MatrixMarket matrix coordinate integer general\n2 2 1\n1 1 1.5\n",
    ));
    assert!(rule.contains("line 3: `1.5` is not a 64-bit integer"), "{rule}");
    let rule = rule_of(parse_mtx(
        "%%MatrixMarket matrix coordinate pattern general\n2 2 1\n1 1 1\n",
    ));
    assert!(rule.contains("line 3: unexpected `1`"), "{rule}");
    let rule = rule_of(parse_mtx(
        "%%MatrixMarket matrix coordinate real symmetric\n2 2 1\n1 2 1\n",
    ));
    assert!(rule.contains("line 3: entry (1, 2) is above the diagonal"), "{rule}");

    // the entry count must match the size line (named by its line)
    let rule = rule_of(parse_mtx(header));
    assert!(
        rule.contains("line 3: the size line declares 2 entries but the file has 1"),
        "{rule}"
    );
    let rule = rule_of(parse_mtx(&format!("{header}2 2 1\n3 3 1\n")));
    assert!(rule.contains("declares 2 entries but the file has 3"), "{rule}");
}

/// A 5 x 7 matrix with values that need all 17 significant digits (and extreme exponents).
fn awkward() -> CsrHost<f64, i64> {
    let mut dense = vec![0.0; 5 * 7];
    let values = [
        1.0 / 3.0,
        -std::f64::consts::PI,
        1e-300,
        -2.5e300,
        0.1 + 0.2,
        5e-324,
        7.0,
    ];
    for (k, &v) in values.iter().enumerate() {
        dense[(k * 11) % 35] = v;
    }
    CsrHost::from_dense(5, 7, &dense)
}

#[test]
fn write_then_read_round_trips_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("awkward.mtx");
    let a = awkward();
    write_mtx(&path, &a).unwrap();
    let (coo, header) = read_mtx(&path).unwrap();
    assert_eq!(header.field, MtxField::Real);
    assert_eq!(header.symmetry, MtxSymmetry::General);
    assert_eq!(CsrHost::from_coo(coo, Duplicates::Reject).unwrap(), a);
    assert_eq!(read_mtx_csr::<f64, i32>(&path).unwrap(), a.with_index::<i32>().unwrap());

    // f32 values go through f64 exactly
    let b = a.map_values(|v| v.clamp(-1e30, 1e30) as f32);
    write_mtx(&path, &b).unwrap();
    assert_eq!(read_mtx_csr::<f32, i64>(&path).unwrap(), b);

    // an empty matrix
    let empty = CsrHost::<f64, i32>::from_dense(3, 2, &[0.0; 6]);
    write_mtx(&path, &empty).unwrap();
    assert_eq!(read_mtx_csr::<f64, i32>(&path).unwrap(), empty);
}

#[test]
fn write_refuses_non_finite_values_and_io_errors_are_io() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = awkward();
    a.values[2] = f64::NAN;
    let rule = rule_of(write_mtx(&dir.path().join("nan.mtx"), &a));
    assert!(rule.contains("values[2] = NaN"), "{rule}");
    assert!(!dir.path().join("nan.mtx").exists());

    match read_mtx(&dir.path().join("missing.mtx")) {
        Err(Error::Io { context, .. }) => assert!(context.contains("missing.mtx"), "{context}"),
        other => panic!("expected Io, got {other:?}"),
    }
    let path = dir.path().join("binary.mtx");
    std::fs::write(
        &path,
        b"%%MatrixMarket matrix coordinate real general\n1 1 1\n1 1 \xff\n",
    )
    .unwrap();
    let rule = rule_of(read_mtx(&path));
    assert!(rule.contains("binary.mtx: line 3: not ASCII/UTF-8"), "{rule}");
}

#[test]
fn large_bodies_parse_in_chunks_with_exact_line_numbers() {
    // ~4 MB of entries: several chunks when more than one CPU is available
    let n = 200_000usize;
    let mut text = format!("%%MatrixMarket matrix coordinate real general\n% header comment\n{n} {n} {n}\n");
    for i in 0..n {
        text.push_str(&format!("{} {} {}.25\n", i + 1, (i * 7919) % n + 1, i));
    }
    let (coo, _) = parse_mtx(&text).unwrap();
    assert_eq!(coo.values.len(), n);
    for i in [0, 1, n / 2, n - 1] {
        assert_eq!(coo.row_indices[i], i as i64);
        assert_eq!(coo.col_indices[i], ((i * 7919) % n) as i64);
        assert_eq!(coo.values[i], i as f64 + 0.25);
    }
    // break the entry of row 150000 (line 3 + 150000) and the one of row 190000: the first wins
    let bad = text.replace("\n150000 ", "\n150000x ").replace("\n190000 ", "\n0 ");
    let rule = rule_of(parse_mtx(&bad));
    assert!(rule.contains("line 150003: row index `150000x`"), "{rule}");
}

#[test]
fn large_symmetric_bodies_with_comments_close_up_their_chunks() {
    // diagonal entries and comment lines leave room unused in every chunk
    let n = 150_000usize;
    let mut text = format!("%%MatrixMarket matrix coordinate real symmetric\n{n} {n} {n}\n");
    let mut want = Vec::new();
    let mut line_of_entry = Vec::new();
    let mut line = 2;
    for i in 0..n {
        if i % 1000 == 0 {
            text.push_str("% a comment in the body\n");
            line += 1;
        }
        let (r, c) = if i % 3 == 0 { (i, i) } else { (i, i / 2) };
        let v = i as f64 + 0.5;
        text.push_str(&format!("{} {} {v}\n", r + 1, c + 1));
        line += 1;
        line_of_entry.push(line);
        want.push((r as i64, c as i64, v));
        if r != c {
            want.push((c as i64, r as i64, v));
        }
    }
    want.sort_by_key(|a| (a.0, a.1));
    let (coo, _) = parse_mtx(&text).unwrap();
    assert_eq!(triplets(&coo), want);

    // an error late in the body reports its own line
    let bad_entry = 140_002; // not a diagonal entry (i % 3 != 0)
    let bad = text.replace(
        &format!("\n{} {} ", bad_entry + 1, bad_entry / 2 + 1),
        &format!("\n{} {} ", bad_entry / 2 + 1, bad_entry + 1),
    );
    let rule = rule_of(parse_mtx(&bad));
    let needle = format!(
        "line {}: entry ({}, {}) is above the diagonal",
        line_of_entry[bad_entry],
        bad_entry / 2 + 1,
        bad_entry + 1
    );
    assert!(rule.contains(&needle), "{rule}");
}

/// `cargo test --release -p tessera --lib mtx_large -- --ignored --nocapture`
#[test]
#[ignore = "timing of a 16M-entry file; run by hand in release"]
fn mtx_large_file_timing() {
    use super::generate::{generate, MatrixClass};
    let a = generate::<f64, i32>(MatrixClass::Uniform { per_row: 16 }, 1_000_000, 1_000_000, 7);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("large.mtx");
    let start = std::time::Instant::now();
    write_mtx(&path, &a).unwrap();
    let written = start.elapsed();
    let (coo, _) = read_mtx(&path).unwrap();
    let read = start.elapsed() - written;
    let b = CsrHost::from_coo(coo.with_index::<i32>().unwrap(), Duplicates::Sum);
    let converted = start.elapsed() - written - read;
    let bytes = std::fs::metadata(&path).unwrap().len();
    println!("{bytes} bytes: write {written:?}, read {read:?}, from_coo {converted:?}");
    drop(coo);
    assert_eq!(b.unwrap_or_else(|e| panic!("{e}")).nnz(), a.nnz());
}

#[test]
fn header_shape_reads_only_the_size_line() {
    let dir = std::env::temp_dir().join(format!("tessera-mtx-shape-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("a.mtx");
    std::fs::write(
        &p,
        "%%MatrixMarket matrix coordinate real general\n% c\n\n 7 5 2\n1 1 1.0\n7 5 2.0\n",
    )
    .unwrap();
    assert_eq!(super::mtx::read_mtx_header_shape(&p).unwrap(), (7, 5));
    std::fs::write(&p, "%%MatrixMarket matrix coordinate real general\nx y z\n").unwrap();
    let e = super::mtx::read_mtx_header_shape(&p).unwrap_err().to_string();
    assert!(e.contains("line 2"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}
