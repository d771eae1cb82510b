//! `tessera verify sparse`: SpMV, SpMM and A^T x without a copy on the GPU against the f64 reference, on fresh random matrices
//! of every structure class (uniform, banded, power-law rows, empty rows, one dense row, a few
//! very long rows, tall least-squares; 1 x n, n x 1, nnz = 0), every value dtype, both index
//! types, several (alpha, beta) pairs and forced kernel shapes (lanes, binned, merge path, column panels,
//! 16-bit columns: `--filter compact`). Each case also runs twice and
//! checks the two results are bitwise equal (the kernels are deterministic), and with beta = 0
//! starts from a NaN-filled y (which must not be read).

use serde_json::{json, Value};

use super::device::{upload_nonempty, CsrMatrix};
use super::generate::{random_vector, try_generate, MatrixClass};
use super::host::DenseLayout;
use super::index::SparseIndex;
use super::reference;
use super::spmm::SpmmPlan;
use super::spmv::{SkipIf, SpmvOptions, SpmvPlan, SpmvTuning};
use super::spmv_compact::{compact_columns_host, MAX_COMPACT_COLS};
use super::spmv_panels::panels_host;
use super::spmv_transposed::SpmvTransposedPlan;
use crate::check::{compare, to_f64_vec};
use crate::dtype::{DType, Element};
use crate::error::Result;
use crate::harness::VerifyOutcome;
use crate::runtime::Context;

/// One SpMV verification case.
#[derive(Clone, Debug)]
pub struct Case {
    pub class: MatrixClass,
    pub rows: usize,
    pub cols: usize,
    pub value: DType,
    pub index: DType,
    pub alpha: f64,
    pub beta: f64,
    pub tuning: SpmvTuning,
}

impl Case {
    pub fn name(&self) -> String {
        let mut s = format!(
            "spmv {} {} {}x{} {} idx alpha {} beta {}",
            self.class.name(),
            self.value,
            self.rows,
            self.cols,
            self.index,
            self.alpha,
            self.beta
        );
        if let Some(l) = self.tuning.lanes {
            s.push_str(&format!(" lanes {l}"));
        }
        if let Some(t) = self.tuning.long_threshold {
            s.push_str(&format!(" long>{t}"));
        }
        if self.tuning.binned {
            s.push_str(" binned");
        }
        if self.tuning.merge_path {
            s.push_str(" merge-path");
        }
        if let Some(w) = self.tuning.panel_width {
            s.push_str(&format!(" panels {w}"));
        }
        match self.tuning.compact_columns {
            Some(true) => s.push_str(" compact"),
            Some(false) => s.push_str(" full-idx"),
            None => {}
        }
        s
    }
    pub fn params(&self) -> Value {
        json!({
            "class": self.class.name(), "rows": self.rows, "cols": self.cols,
            "dtype": self.value.name(), "index": self.index.name(),
            "alpha": self.alpha, "beta": self.beta,
            "lanes": self.tuning.lanes, "long_threshold": self.tuning.long_threshold,
            "binned": self.tuning.binned, "merge_path": self.tuning.merge_path,
            "panel_width": self.tuning.panel_width, "compact_columns": self.tuning.compact_columns,
        })
    }
}

/// The verification cases (`quick`: a small set for the sanitizers).
pub fn cases(quick: bool) -> Vec<Case> {
    let shapes: Vec<(MatrixClass, usize, usize)> = vec![
        (MatrixClass::Uniform { per_row: 16 }, 10007, 9001),
        (MatrixClass::Banded { diagonals: 9 }, 5003, 5003),
        (
            MatrixClass::PowerLaw {
                mean: 20.0,
                exponent: 2.0,
            },
            20011,
            20011,
        ),
        (
            MatrixClass::EmptyRows {
                fraction: 0.5,
                per_row: 7,
            },
            3001,
            2999,
        ),
        (MatrixClass::OneDenseRow { per_row: 5 }, 2003, 60001),
        (
            MatrixClass::FewLongRows {
                long_rows: 3,
                long_len: 50000,
                short_len: 4,
            },
            20000,
            70001,
        ),
        (MatrixClass::TallLeastSquares { per_row: 18 }, 30011, 617),
        (MatrixClass::Uniform { per_row: 40 }, 1, 5000),
        (MatrixClass::Uniform { per_row: 1 }, 4097, 1),
        (MatrixClass::Uniform { per_row: 0 }, 513, 300),
        (MatrixClass::Uniform { per_row: 3 }, 0, 10),
    ];
    let mut out = Vec::new();
    let ab = [(1.0, 0.0), (-0.5, 2.0), (1.5, -1.0)];
    for (i, &(class, rows, cols)) in shapes.iter().enumerate() {
        if quick && i % 3 != 0 {
            continue;
        }
        out.extend(per_dtype((class, rows, cols), SpmvTuning::default(), |j| {
            let index = if (i + j) % 2 == 0 { DType::I32 } else { DType::I64 };
            (index, ab[(i + j) % ab.len()])
        }));
    }
    // forced shapes on two matrices: every lane count, and every row through the long kernel
    let (class, rows, cols) = shapes[2];
    for lanes in [1, 2, 4, 8, 16, 32] {
        if quick && lanes != 32 {
            continue;
        }
        out.push(Case {
            class,
            rows,
            cols,
            value: DType::F32,
            index: DType::I32,
            alpha: 1.0,
            beta: 0.5,
            tuning: SpmvTuning {
                lanes: Some(lanes),
                long_threshold: None,
                binned: false,
                merge_path: false,
                panel_width: None,
                compact_columns: None,
            },
        });
    }
    // the binned kernel (opt-in) on row lengths of every bin, with and without long rows
    for (k, &(class, rows, cols)) in [shapes[2], shapes[5], shapes[3]].iter().enumerate() {
        if quick && k > 0 {
            continue;
        }
        for value in [DType::F32, DType::BF16] {
            out.push(Case {
                class,
                rows,
                cols,
                value,
                index: if k % 2 == 0 { DType::I32 } else { DType::I64 },
                alpha: 1.0,
                beta: if k == 1 { 0.0 } else { -0.75 },
                tuning: SpmvTuning {
                    lanes: None,
                    long_threshold: None,
                    binned: true,
                    merge_path: false,
                    panel_width: None,
                    compact_columns: None,
                },
            });
        }
    }
    let (class, rows, cols) = shapes[0];
    out.push(Case {
        class,
        rows,
        cols,
        value: DType::F64,
        index: DType::I64,
        alpha: 2.0,
        beta: 0.0,
        tuning: SpmvTuning {
            lanes: None,
            long_threshold: Some(0),
            binned: false,
            merge_path: false,
            panel_width: None,
            compact_columns: None,
        },
    });
    // column panels (forced widths): 37 columns (hundreds of panels, most panel rows empty,
    // unaligned staging of x), 1000, 8192 (one panel where the matrix is narrower); every value
    // dtype, both index types, every (alpha, beta) pair; and 65536-column panels of halves (the
    // widest: two panels of 70001 columns, columns up to 65535, 128 KiB of shared memory, rows
    // of 50000 split across the panels). The rules' own choice of panels is covered by the
    // default cases above (one dense row of 60001 columns: five fp32 panels, three f16/bf16).
    let panel_shapes = [
        shapes[0], shapes[4], shapes[6], shapes[3], shapes[7], shapes[9], shapes[10],
    ];
    for (i, &(class, rows, cols)) in panel_shapes.iter().enumerate() {
        if quick && i % 2 != 0 {
            continue;
        }
        for (j, width) in [37usize, 1000, 8192].into_iter().enumerate() {
            let value = [DType::F32, DType::F64, DType::F16, DType::BF16][(i + j) % 4];
            let (alpha, beta) = ab[(i + 2 * j) % ab.len()];
            out.push(Case {
                class,
                rows,
                cols,
                value,
                index: if (i / 2 + j) % 2 == 0 { DType::I32 } else { DType::I64 },
                alpha,
                beta,
                tuning: SpmvTuning {
                    panel_width: Some(width),
                    ..SpmvTuning::default()
                },
            });
        }
    }
    if !quick {
        let (class, rows, cols) = shapes[5];
        for value in [DType::F16, DType::BF16] {
            out.push(Case {
                class,
                rows,
                cols,
                value,
                index: DType::I32,
                alpha: 1.0,
                beta: 0.0,
                tuning: SpmvTuning {
                    panel_width: Some(65536),
                    ..SpmvTuning::default()
                },
            });
        }
    }
    // the merge path (opt-in) on every shape class, every value dtype, both index types and
    // every (alpha, beta) pair; plus rows of 4000 (each spans CTAs of 1792 items, back to back:
    // a CTA ends one row and carries the next) and a row of 60000 (one dense row, ~34 CTAs)
    let mut merge_shapes = shapes.clone();
    merge_shapes.push((MatrixClass::Uniform { per_row: 4000 }, 7, 5003));
    for (i, &(class, rows, cols)) in merge_shapes.iter().enumerate() {
        if quick && i % 3 != 0 {
            continue;
        }
        let merge = SpmvTuning {
            merge_path: true,
            ..SpmvTuning::default()
        };
        out.extend(per_dtype((class, rows, cols), merge, |j| {
            let index = if (i + j) % 2 == 1 { DType::I32 } else { DType::I64 };
            (index, ab[(i + j + 1) % ab.len()])
        }));
    }
    compact_cases(quick, &shapes, &mut out);
    out
}

/// One case of `shape` and `tuning` per value dtype (the `j`-th of fp32, fp64, fp16, bf16), with
/// the index type and (alpha, beta) pair `pick(j)`.
fn per_dtype(
    (class, rows, cols): (MatrixClass, usize, usize),
    tuning: SpmvTuning,
    pick: impl Fn(usize) -> (DType, (f64, f64)),
) -> impl Iterator<Item = Case> {
    [DType::F32, DType::F64, DType::F16, DType::BF16]
        .into_iter()
        .enumerate()
        .map(move |(j, value)| {
            let (index, (alpha, beta)) = pick(j);
            Case {
                class,
                rows,
                cols,
                value,
                index,
                alpha,
                beta,
                tuning,
            }
        })
}

/// 16-bit columns forced on (named `... compact`): every shape of at most 65536 columns among
/// `shapes` (odd sizes, empty rows, one dense row: the long-row kernel, 1 x n, n x 1, nnz = 0, an
/// empty matrix), every value dtype, both index types and every (alpha, beta) pair; 65536
/// columns with column 65535 in the dense row (the boundary, long-row kernel); the binned
/// kernel, 32 lanes and every row long with them; and 65537 columns, which must be refused.
fn compact_cases(quick: bool, shapes: &[(MatrixClass, usize, usize)], out: &mut Vec<Case>) {
    let ab = [(1.0, 0.0), (-0.5, 2.0), (1.5, -1.0)];
    let forced = |tuning: SpmvTuning| SpmvTuning {
        compact_columns: Some(true),
        ..tuning
    };
    let dense = MatrixClass::OneDenseRow { per_row: 5 };
    let mut compact_shapes: Vec<_> = shapes.iter().copied().filter(|s| s.2 <= MAX_COMPACT_COLS).collect();
    compact_shapes.push((dense, 2003, MAX_COMPACT_COLS));
    let last = compact_shapes.len() - 1;
    for (i, &(class, rows, cols)) in compact_shapes.iter().enumerate() {
        if quick && i % 3 != 0 && i != last {
            continue;
        }
        out.extend(per_dtype((class, rows, cols), forced(SpmvTuning::default()), |j| {
            let index = if (i + j) % 2 == 0 { DType::I64 } else { DType::I32 };
            (index, ab[(i + 2 * j) % ab.len()])
        }));
    }
    // other row-kernel shapes with it: power-law rows binned (some long), 32 lanes, every row
    // through the long-row kernel
    let power_law = shapes[2];
    let knobs = [
        SpmvTuning {
            binned: true,
            ..SpmvTuning::default()
        },
        SpmvTuning {
            lanes: Some(32),
            ..SpmvTuning::default()
        },
        SpmvTuning {
            long_threshold: Some(0),
            ..SpmvTuning::default()
        },
    ];
    for (k, tuning) in knobs.into_iter().enumerate() {
        if quick && k != 2 {
            continue;
        }
        for (j, value) in [DType::F32, DType::BF16].into_iter().enumerate() {
            out.push(Case {
                class: power_law.0,
                rows: power_law.1,
                cols: power_law.2,
                value,
                index: if (k + j) % 2 == 0 { DType::I32 } else { DType::I64 },
                alpha: 1.0,
                beta: if j == 0 { 0.0 } else { -0.75 },
                tuning: forced(tuning),
            });
        }
    }
    // one column too many for 16 bits: refused
    out.push(Case {
        class: dense,
        rows: 2003,
        cols: MAX_COMPACT_COLS + 1,
        value: DType::F32,
        index: DType::I32,
        alpha: 1.0,
        beta: 0.0,
        tuning: forced(SpmvTuning::default()),
    });
}

/// `$run::<T, I>(args)` with `T` the value type of `$value` (any sparse value dtype) and `I`
/// that of `$index` (i32, else i64).
macro_rules! with_types {
    ($what:expr, $value:expr, $index:expr, $run:ident($($arg:expr),*)) => {
        crate::dispatch_float!($what; $value, [F32, F64, F16, BF16], |T| {
            match $index {
                DType::I32 => $run::<T, i32>($($arg),*),
                _ => $run::<T, i64>($($arg),*),
            }
        })
    };
}
pub(crate) use with_types;

/// Runs one case on the GPU and compares it with the f64 reference.
pub fn verify_case(ctx: &Context, case: &Case, seed: u64) -> Result<VerifyOutcome> {
    with_types!("sparse verify", case.value, case.index, run(ctx, case, seed))
}

fn run<T: Element, I: SparseIndex>(ctx: &Context, case: &Case, seed: u64) -> Result<VerifyOutcome> {
    let host = try_generate::<T, I>(case.class, case.rows, case.cols, seed)?;
    if case.tuning.compact_columns == Some(true) && case.cols > MAX_COMPACT_COLS {
        return compact_refused(ctx, case, &host);
    }
    let x: Vec<T> = random_vector(case.cols, seed ^ 0x5eed)
        .into_iter()
        .map(T::from_f64)
        .collect();
    let y0: Vec<T> = if case.beta == 0.0 {
        vec![T::from_f64(f64::NAN); case.rows]
    } else {
        random_vector(case.rows, seed ^ 0xbeef)
            .into_iter()
            .map(T::from_f64)
            .collect()
    };
    // the reference sees exactly the stored (rounded) inputs
    let xf = to_f64_vec(&x);
    let mut want: Vec<f64> = if case.beta == 0.0 {
        vec![f64::NAN; case.rows]
    } else {
        to_f64_vec(&y0)
    };
    reference::spmv(&host, case.alpha, &xf, case.beta, &mut want);

    let mut a = CsrMatrix::from_host(ctx, &host)?;
    let plan = SpmvPlan::new(&a, &SpmvOptions { tuning: case.tuning })?;
    let dx = upload_nonempty(ctx, &x)?;
    let mut dy = upload_nonempty(ctx, &y0)?;
    plan.run(&a, case.alpha, &dx, case.beta, &mut dy)?;
    let first = dy.to_host()?;
    // again from the same y0: bitwise the same result
    let mut dy2 = upload_nonempty(ctx, &y0)?;
    plan.run(&a, case.alpha, &dx, case.beta, &mut dy2)?;
    let second = dy2.to_host()?;
    let mut outcome = judge(
        case.name(),
        case.params(),
        plan.path(),
        &first[..case.rows],
        Some(&second),
        &want,
    );
    // the skip flag: set, the call leaves y as it was; cleared, it is the plain call, bitwise
    let mut flag = ctx.alloc::<f64>(1)?;
    flag.copy_from_host_at(0, &[1.0])?;
    let mut dy3 = upload_nonempty(ctx, &y0)?;
    plan.run_unless(Some(SkipIf::new(&flag, 0)?), &a, case.alpha, &dx, case.beta, &mut dy3)?;
    let kept = dy3.to_host()?;
    flag.copy_from_host_at(0, &[0.0])?;
    plan.run_unless(Some(SkipIf::new(&flag, 0)?), &a, case.alpha, &dx, case.beta, &mut dy3)?;
    let unskipped = dy3.to_host()?;
    let bits = |v: &[T]| v.iter().map(|e| e.to_f64().to_bits()).collect::<Vec<_>>();
    let skip_note = if bits(&kept[..case.rows]) != bits(&y0) {
        Some("skip flag set: y was written")
    } else if bits(&unskipped[..case.rows]) != bits(&first[..case.rows]) {
        Some("skip flag clear: y differs from the plain call")
    } else {
        None
    };
    if let Some(n) = skip_note {
        outcome.passed = false;
        outcome.note = Some(outcome.note.map_or(n.to_string(), |o| format!("{o}; {n}")));
    }
    // column panels: the device layout equals the host's, array for array, bit for bit
    if let Some(note) = panel_layout_note(&plan, &host, case.tuning.panel_width)? {
        outcome.passed = false;
        outcome.note = Some(outcome.note.map_or(note.clone(), |o| format!("{o}; {note}")));
    }
    // 16-bit columns: used when forced, equal to the host's narrowing, kept by update_values
    if case.tuning.compact_columns == Some(true) {
        let problems = compact_problems(&mut a, &plan, case, &host, &dx, &y0, &first[..case.rows])?;
        outcome = super::verify_convert::with_problems(outcome, problems);
    }
    Ok(outcome)
}

/// What is wrong with a plan's 16-bit columns (forced on): the plan must read them, its
/// product `first` must be bitwise the one of the same plan on the matrix's own indices (the
/// same columns summed in the same order), the copy cached on `a` must equal
/// [`compact_columns_host`] bit for bit, and after `update_values` (new values, same pattern:
/// each doubled) the copy must be the same one (not remade) and a new plan's product must match
/// the f64 reference of the new values.
#[allow(clippy::too_many_arguments)] // the case's operands and its first result, passed through
fn compact_problems<T: Element, I: SparseIndex>(
    a: &mut CsrMatrix<T, I>,
    plan: &SpmvPlan,
    case: &Case,
    host: &super::host::CsrHost<T, I>,
    dx: &crate::runtime::DeviceBuffer<T>,
    y0: &[T],
    first: &[T],
) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    if !plan.compact_columns() {
        problems.push(format!("16-bit columns forced, the plan runs {}", plan.path()));
    }
    let full = SpmvTuning {
        compact_columns: Some(false),
        ..case.tuning
    };
    let full = SpmvPlan::new(a, &SpmvOptions { tuning: full })?;
    let mut dy = upload_nonempty(a.context(), y0)?;
    full.run(a, case.alpha, dx, case.beta, &mut dy)?;
    let bits = |v: &[T]| v.iter().map(|e| e.to_f64().to_bits()).collect::<Vec<_>>();
    if bits(&dy.to_host()?[..case.rows]) != bits(first) {
        problems.push(format!("differs from {} on the matrix's own indices", full.path()));
    }
    let before = a.compact_columns()?;
    if before.to_host()? != compact_columns_host(&host.indices, host.cols)? {
        problems.push("16-bit columns differ from the host's narrowing".into());
    }
    let mut doubled = host.clone();
    for v in doubled.values.iter_mut() {
        *v = T::from_f64(2.0 * v.to_f64());
    }
    a.update_values(&doubled.values)?;
    if !std::sync::Arc::ptr_eq(&before, &a.compact_columns()?) {
        problems.push("update_values remade the 16-bit columns (the pattern did not change)".into());
    }
    let plan = SpmvPlan::new(a, &SpmvOptions { tuning: case.tuning })?;
    let mut dy = upload_nonempty(a.context(), y0)?;
    plan.run(a, case.alpha, dx, case.beta, &mut dy)?;
    let mut want: Vec<f64> = if case.beta == 0.0 {
        vec![f64::NAN; case.rows]
    } else {
        to_f64_vec(y0)
    };
    let xf = to_f64_vec(&dx.to_host()?[..case.cols]);
    reference::spmv(&doubled, case.alpha, &xf, case.beta, &mut want);
    let cmp = compare(&to_f64_vec(&dy.to_host()?[..case.rows]), &want, 0.0, 0.0);
    if !cmp.passes(T::DTYPE.rel_l2_budget().max(1e-12)) {
        problems.push(format!("after update_values: {cmp}"));
    }
    Ok(problems)
}

/// A matrix of more than 65536 columns with 16-bit columns forced: the plan must be refused
/// with an `InvalidArgument` error on `tuning.compact_columns`.
fn compact_refused<T: Element, I: SparseIndex>(
    ctx: &Context,
    case: &Case,
    host: &super::host::CsrHost<T, I>,
) -> Result<VerifyOutcome> {
    let a = CsrMatrix::from_host(ctx, host)?;
    let problems = match SpmvPlan::new(&a, &SpmvOptions { tuning: case.tuning }) {
        Err(crate::error::Error::InvalidArgument {
            arg: "tuning.compact_columns",
            ..
        }) => Vec::new(),
        Err(e) => vec![format!("refused with another error: {e}")],
        Ok(p) => vec![format!("accepted ({})", p.path())],
    };
    let problems = match a.compact_columns() {
        Ok(_) => [problems, vec!["compact_columns() accepted the matrix".into()]].concat(),
        Err(_) => problems,
    };
    Ok(super::verify_convert::with_problems(
        judge::<f32>(case.name(), case.params(), "refused".into(), &[], None, &[]),
        problems,
    ))
}

/// What differs between the plan's column-panel layout (if it has one) and
/// [`panels_host`] of the same matrix; `None` when they agree or the plan has no panels.
fn panel_layout_note<T: Element, I: SparseIndex>(
    plan: &SpmvPlan,
    host: &super::host::CsrHost<T, I>,
    forced_width: Option<usize>,
) -> Result<Option<String>> {
    let Some((panels, offsets, columns, values)) = plan.panel_layout::<T, I>()? else {
        return Ok(None);
    };
    let width = forced_width
        .filter(|&w| w > 0)
        .unwrap_or_else(|| super::spmv_panels::default_panel_width(T::DTYPE));
    let (want_panels, want_offsets, want_columns, want_values) = panels_host(host, width);
    let bits = |v: &[T]| v.iter().map(|e| e.to_f64().to_bits()).collect::<Vec<_>>();
    let note = if panels != want_panels {
        Some(format!("panel layout: {panels} panels, the host's {want_panels}"))
    } else if offsets.is_some_and(|o| o.iter().map(|v| v.to_usize()).collect::<Vec<_>>() != want_offsets) {
        Some("panel layout: offsets differ from the host's".to_string())
    } else if columns != want_columns {
        Some("panel layout: columns differ from the host's".to_string())
    } else if values.is_some_and(|v| bits(&v) != bits(&want_values)) {
        Some("panel layout: values differ from the host's".to_string())
    } else {
        None
    };
    Ok(note)
}

/// One SpMM verification case: `C = alpha A B + beta C`, B and C packed in `layout`.
#[derive(Clone, Debug)]
pub struct SpmmCase {
    pub class: MatrixClass,
    pub rows: usize,
    pub cols: usize,
    pub n: usize,
    pub layout: DenseLayout,
    pub value: DType,
    pub index: DType,
    pub alpha: f64,
    pub beta: f64,
}

impl SpmmCase {
    pub fn name(&self) -> String {
        format!(
            "spmm {} {} {}x{} n {} {} {} idx alpha {} beta {}",
            self.class.name(),
            self.value,
            self.rows,
            self.cols,
            self.n,
            match self.layout {
                DenseLayout::RowMajor => "row-major",
                DenseLayout::ColMajor => "col-major",
            },
            self.index,
            self.alpha,
            self.beta
        )
    }
    pub fn params(&self) -> Value {
        json!({
            "class": self.class.name(), "rows": self.rows, "cols": self.cols, "n": self.n,
            "layout": format!("{:?}", self.layout), "dtype": self.value.name(),
            "index": self.index.name(), "alpha": self.alpha, "beta": self.beta,
        })
    }
}

/// SpMM cases: N in {1, 2, 7, 32, 129}, both layouts, every dtype, odd shapes.
pub fn spmm_cases(quick: bool) -> Vec<SpmmCase> {
    let shapes: [(MatrixClass, usize, usize); 4] = [
        (MatrixClass::Uniform { per_row: 12 }, 3001, 2003),
        (
            MatrixClass::PowerLaw {
                mean: 10.0,
                exponent: 2.0,
            },
            2011,
            2011,
        ),
        (MatrixClass::TallLeastSquares { per_row: 9 }, 4099, 257),
        (
            MatrixClass::EmptyRows {
                fraction: 0.3,
                per_row: 5,
            },
            777,
            999,
        ),
    ];
    let mut out = Vec::new();
    let mut i = 0usize;
    for &(class, rows, cols) in &shapes {
        for n in [1usize, 2, 7, 32, 129] {
            for layout in [DenseLayout::RowMajor, DenseLayout::ColMajor] {
                i += 1;
                if quick && i % 7 != 0 {
                    continue;
                }
                let value = [DType::F32, DType::F64, DType::F16, DType::BF16][i % 4];
                let index = if i % 3 == 0 { DType::I64 } else { DType::I32 };
                let (alpha, beta) = [(1.0, 0.0), (-0.5, 2.0), (1.5, -1.0)][i % 3];
                out.push(SpmmCase {
                    class,
                    rows,
                    cols,
                    n,
                    layout,
                    value,
                    index,
                    alpha,
                    beta,
                });
            }
        }
    }
    out
}

/// Runs one SpMM case on the GPU and compares it with the f64 reference (and a second run,
/// bitwise).
pub fn verify_spmm_case(ctx: &Context, case: &SpmmCase, seed: u64) -> Result<VerifyOutcome> {
    with_types!("sparse spmm verify", case.value, case.index, run_spmm(ctx, case, seed))
}

fn run_spmm<T: Element, I: SparseIndex>(ctx: &Context, case: &SpmmCase, seed: u64) -> Result<VerifyOutcome> {
    let host = try_generate::<T, I>(case.class, case.rows, case.cols, seed)?;
    let b: Vec<T> = random_vector(case.cols * case.n, seed ^ 0x5eed)
        .into_iter()
        .map(T::from_f64)
        .collect();
    let c0: Vec<T> = if case.beta == 0.0 {
        vec![T::from_f64(f64::NAN); case.rows * case.n]
    } else {
        random_vector(case.rows * case.n, seed ^ 0xbeef)
            .into_iter()
            .map(T::from_f64)
            .collect()
    };
    let mut want: Vec<f64> = to_f64_vec(&c0);
    reference::spmm(
        &host,
        case.alpha,
        &to_f64_vec(&b),
        case.n,
        case.layout,
        case.beta,
        &mut want,
        case.layout,
    );
    let a = CsrMatrix::from_host(ctx, &host)?;
    let plan = SpmmPlan::new(&a, case.n, case.layout)?;
    let db = upload_nonempty(ctx, &b)?;
    let mut dc = upload_nonempty(ctx, &c0)?;
    plan.run(&a, case.alpha, &db, case.beta, &mut dc)?;
    let first = dc.to_host()?;
    let mut dc2 = upload_nonempty(ctx, &c0)?;
    plan.run(&a, case.alpha, &db, case.beta, &mut dc2)?;
    let second = dc2.to_host()?;
    Ok(judge(
        case.name(),
        case.params(),
        plan.path(),
        &first[..case.rows * case.n],
        Some(&second),
        &want,
    ))
}

/// One case of `y = alpha A^T x + beta y` without a transposed copy (atomic: compared with the
/// reference within the dtype's budget, not bitwise between runs).
#[derive(Clone, Debug)]
pub struct TransposedCase {
    pub class: MatrixClass,
    pub rows: usize,
    pub cols: usize,
    pub value: DType,
    pub index: DType,
    pub alpha: f64,
    pub beta: f64,
}

impl TransposedCase {
    pub fn name(&self) -> String {
        format!(
            "spmv A^T (no copy) {} {} {}x{} {} idx alpha {} beta {}",
            self.class.name(),
            self.value,
            self.rows,
            self.cols,
            self.index,
            self.alpha,
            self.beta
        )
    }
    pub fn params(&self) -> Value {
        json!({
            "class": self.class.name(), "rows": self.rows, "cols": self.cols,
            "dtype": self.value.name(), "index": self.index.name(),
            "alpha": self.alpha, "beta": self.beta, "transposed": true,
        })
    }
}

/// Transposed cases: tall, wide, power-law, empty rows, nnz = 0; fp32 and fp64.
pub fn transposed_cases(quick: bool) -> Vec<TransposedCase> {
    let shapes: [(MatrixClass, usize, usize); 5] = [
        (MatrixClass::TallLeastSquares { per_row: 18 }, 30011, 617),
        (MatrixClass::Uniform { per_row: 5 }, 700, 20011),
        (
            MatrixClass::PowerLaw {
                mean: 20.0,
                exponent: 2.0,
            },
            10007,
            10007,
        ),
        (
            MatrixClass::EmptyRows {
                fraction: 0.5,
                per_row: 7,
            },
            3001,
            2999,
        ),
        (MatrixClass::Uniform { per_row: 0 }, 100, 300),
    ];
    let mut out = Vec::new();
    for (i, &(class, rows, cols)) in shapes.iter().enumerate() {
        if quick && i > 0 {
            break;
        }
        for (j, value) in [DType::F32, DType::F64].into_iter().enumerate() {
            let (alpha, beta) = [(1.0, 0.0), (-0.5, 2.0), (1.5, -1.0)][(i + j) % 3];
            out.push(TransposedCase {
                class,
                rows,
                cols,
                value,
                index: if (i + j) % 2 == 0 { DType::I32 } else { DType::I64 },
                alpha,
                beta,
            });
        }
    }
    out
}

pub fn verify_transposed_case(ctx: &Context, case: &TransposedCase, seed: u64) -> Result<VerifyOutcome> {
    crate::dispatch_float!("sparse A^T verify"; case.value, [F32, F64], |T| {
        match case.index {
            DType::I32 => run_transposed::<T, i32>(ctx, case, seed),
            _ => run_transposed::<T, i64>(ctx, case, seed),
        }
    })
}

fn run_transposed<T: Element, I: SparseIndex>(
    ctx: &Context,
    case: &TransposedCase,
    seed: u64,
) -> Result<VerifyOutcome> {
    let host = try_generate::<T, I>(case.class, case.rows, case.cols, seed)?;
    let x: Vec<T> = random_vector(case.rows, seed ^ 0x5eed)
        .into_iter()
        .map(T::from_f64)
        .collect();
    let y0: Vec<T> = if case.beta == 0.0 {
        vec![T::from_f64(f64::NAN); case.cols]
    } else {
        random_vector(case.cols, seed ^ 0xbeef)
            .into_iter()
            .map(T::from_f64)
            .collect()
    };
    let mut want = to_f64_vec(&y0);
    reference::spmv_transposed(&host, case.alpha, &to_f64_vec(&x), case.beta, &mut want);
    let a = CsrMatrix::from_host(ctx, &host)?;
    let plan = SpmvTransposedPlan::new(&a)?;
    let dx = upload_nonempty(ctx, &x)?;
    let mut dy = upload_nonempty(ctx, &y0)?;
    plan.run(&a, case.alpha, &dx, case.beta, &mut dy)?;
    let got = dy.to_host()?;
    Ok(judge(
        case.name(),
        case.params(),
        "scatter".into(),
        &got[..case.cols],
        None,
        &want,
    ))
}

/// The verdict on `got` against the f64 reference `want` within `T`'s rel-L2 budget and, given a
/// second run's output, that the two are bitwise equal (the deterministic kernels).
pub(crate) fn judge<T: Element>(
    case: String,
    params: Value,
    path: String,
    got: &[T],
    second: Option<&[T]>,
    want: &[f64],
) -> VerifyOutcome {
    let comparison = compare(&to_f64_vec(got), want, 0.0, 0.0);
    let budget = T::DTYPE.rel_l2_budget().max(1e-12);
    let same = |a: &T, b: &T| {
        let (a, b) = (a.to_f64(), b.to_f64());
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    };
    let deterministic = second.is_none_or(|s| got.iter().zip(s).all(|(a, b)| same(a, b)));
    let note = (!deterministic).then(|| "two runs differ: not deterministic".to_string());
    VerifyOutcome {
        case,
        params,
        path,
        passed: comparison.passes(budget) && note.is_none(),
        comparison,
        budget,
        note,
        skipped: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_cases_cover_every_dtype_index_and_the_boundary() {
        for quick in [false, true] {
            let all = cases(quick);
            let compact: Vec<&Case> = all.iter().filter(|c| c.name().contains("compact")).collect();
            // `--filter compact` selects exactly the cases with 16-bit columns forced on
            assert!(compact.iter().all(|c| c.tuning.compact_columns == Some(true)));
            assert!(all
                .iter()
                .all(|c| c.tuning.compact_columns != Some(true) || c.name().contains("compact")));
            for value in [DType::F32, DType::F64, DType::F16, DType::BF16] {
                for index in [DType::I32, DType::I64] {
                    assert!(
                        compact.iter().any(|c| c.value == value && c.index == index),
                        "{value} {index} quick {quick}"
                    );
                }
            }
            let cols = |n: usize| compact.iter().any(|c| c.cols == n);
            assert!(cols(MAX_COMPACT_COLS) && cols(MAX_COMPACT_COLS + 1));
            let mut names: Vec<String> = compact.iter().map(|c| c.name()).collect();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), compact.len());
        }
        let all = cases(false);
        let compact = || all.iter().filter(|c| c.tuning.compact_columns == Some(true));
        // empty rows, nnz = 0, an empty matrix, the long-row kernel (dense rows, every row long),
        // the binned kernel, every (alpha, beta) pair
        assert!(compact().any(|c| matches!(c.class, MatrixClass::EmptyRows { .. })));
        assert!(compact().any(|c| c.class == MatrixClass::Uniform { per_row: 0 }));
        assert!(compact().any(|c| c.rows == 0));
        assert!(compact().any(|c| matches!(c.class, MatrixClass::OneDenseRow { .. }) && c.cols == 60001));
        assert!(compact().any(|c| c.tuning.long_threshold == Some(0)));
        assert!(compact().any(|c| c.tuning.binned));
        for ab in [(1.0, 0.0), (-0.5, 2.0), (1.5, -1.0)] {
            assert!(compact().any(|c| (c.alpha, c.beta) == ab));
        }
    }
}
