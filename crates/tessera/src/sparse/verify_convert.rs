//! `tessera verify sparse`, conversion cases: the device transpose and COO -> CSR against the
//! host's ([`CsrHost::transpose`], [`CsrHost::from_coo`]) array for array, bitwise (both are
//! deterministic and specified to give the same matrix), their descriptors against
//! [`SparseDescriptor::of`] the host result, SpMV on the converted matrix against the f64
//! reference, and in-place value updates (version, dropped caches).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::convert::CooMatrix;
use super::descriptor::SparseDescriptor;
use super::device::{upload_nonempty, CsrMatrix};
use super::generate::{random_vector, try_generate, MatrixClass};
use super::host::{CooHost, CsrHost, Duplicates};
use super::index::SparseIndex;
use super::reference;
use super::sell::{SellMatrix, SellOptions};
use super::verify::{judge, with_types};
use crate::check::to_f64_vec;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::harness::VerifyOutcome;
use crate::runtime::Context;

/// What a conversion case checks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ConvertKind {
    /// `CsrMatrix::transpose` / `transposed` against `CsrHost::transpose`.
    Transpose,
    /// `CsrMatrix::from_coo` on shuffled triplets with `duplicates` repeated ones.
    FromCoo { duplicates: Duplicates, repeated: usize },
    /// A triplet index out of range given to `CooMatrix::from_device`: must be an error.
    BadCooIndex,
    /// `update_values`: the version, SpMV and the cached transpose follow the new values.
    UpdateValues,
    /// SELL-C-sigma built from the device CSR: SpMV against the reference, twice bitwise.
    Sell { sigma: usize, alpha: f64, beta: f64 },
}

#[derive(Clone, Debug)]
pub struct ConvertCase {
    pub kind: ConvertKind,
    pub class: MatrixClass,
    pub rows: usize,
    pub cols: usize,
    pub value: DType,
    pub index: DType,
}

impl ConvertCase {
    pub fn name(&self) -> String {
        let kind = match self.kind {
            ConvertKind::Transpose => "transpose".to_string(),
            ConvertKind::FromCoo { duplicates, repeated } => format!("coo->csr {duplicates:?} +{repeated} dup"),
            ConvertKind::BadCooIndex => "coo bad index".to_string(),
            ConvertKind::UpdateValues => "update_values".to_string(),
            ConvertKind::Sell { sigma, alpha, beta } => format!("sell sigma {sigma} alpha {alpha} beta {beta}"),
        };
        format!(
            "convert {kind} {} {} {}x{} {} idx",
            self.class.name(),
            self.value,
            self.rows,
            self.cols,
            self.index
        )
    }
    pub fn params(&self) -> Value {
        json!({
            "kind": format!("{:?}", self.kind), "class": self.class.name(), "rows": self.rows,
            "cols": self.cols, "dtype": self.value.name(), "index": self.index.name(),
        })
    }
}

/// Conversion cases: every structure class for the transpose (tall, wide, power-law, long rows,
/// empty, 1 x n, n x 1, nnz = 0, more than 2^16 columns for three radix passes), COO with and
/// without duplicates, both policies, every dtype and both index types.
pub fn cases(quick: bool) -> Vec<ConvertCase> {
    let shapes: Vec<(MatrixClass, usize, usize)> = vec![
        (MatrixClass::TallLeastSquares { per_row: 18 }, 30011, 617),
        (MatrixClass::Uniform { per_row: 5 }, 700, 70001),
        (
            MatrixClass::PowerLaw {
                mean: 20.0,
                exponent: 2.0,
            },
            20011,
            20011,
        ),
        (
            MatrixClass::FewLongRows {
                long_rows: 3,
                long_len: 50000,
                short_len: 4,
            },
            20000,
            70001,
        ),
        (
            MatrixClass::EmptyRows {
                fraction: 0.5,
                per_row: 7,
            },
            3001,
            2999,
        ),
        (MatrixClass::Banded { diagonals: 9 }, 5003, 5003),
        (MatrixClass::Uniform { per_row: 40 }, 1, 5000),
        (MatrixClass::Uniform { per_row: 1 }, 4097, 1),
        (MatrixClass::Uniform { per_row: 0 }, 513, 300),
        (MatrixClass::Uniform { per_row: 3 }, 0, 10),
    ];
    let dtypes = [DType::F32, DType::F64, DType::F16, DType::BF16];
    let mut out = Vec::new();
    for (i, &(class, rows, cols)) in shapes.iter().enumerate() {
        if quick && i % 3 != 0 {
            continue;
        }
        let value = dtypes[i % 4];
        let index = if i % 2 == 0 { DType::I32 } else { DType::I64 };
        out.push(ConvertCase {
            kind: ConvertKind::Transpose,
            class,
            rows,
            cols,
            value,
            index,
        });
        let coo = |kind| ConvertCase {
            kind,
            class,
            rows,
            cols,
            value: dtypes[(i + 1) % 4],
            index: if i % 2 == 0 { DType::I64 } else { DType::I32 },
        };
        out.push(coo(ConvertKind::FromCoo {
            duplicates: Duplicates::Sum,
            repeated: if i % 2 == 0 { 1000 } else { 0 },
        }));
        if i < 3 {
            out.push(coo(ConvertKind::FromCoo {
                duplicates: Duplicates::Reject,
                repeated: i,
            }));
        }
    }
    // SELL-C-sigma: every dtype on the power-law matrix, the other classes in fp32
    for (i, &(class, rows, cols)) in shapes.iter().enumerate() {
        if quick && i != 2 {
            continue;
        }
        let dtypes: &[DType] = if i == 2 { &dtypes } else { &dtypes[..1] };
        for (j, &value) in dtypes.iter().enumerate() {
            let (alpha, beta) = [(1.0, 0.0), (-0.5, 2.0), (1.5, -1.0)][(i + j) % 3];
            out.push(ConvertCase {
                kind: ConvertKind::Sell {
                    sigma: [32, 1024, 4096][(i + j) % 3],
                    alpha,
                    beta,
                },
                class,
                rows,
                cols,
                value,
                index: if (i + j) % 2 == 0 { DType::I32 } else { DType::I64 },
            });
        }
    }
    let (class, rows, cols) = shapes[2];
    for (kind, value, index) in [
        (ConvertKind::BadCooIndex, DType::F32, DType::I32),
        (ConvertKind::UpdateValues, DType::F64, DType::I32),
        (ConvertKind::UpdateValues, DType::BF16, DType::I64),
    ] {
        if quick && value == DType::BF16 {
            continue;
        }
        out.push(ConvertCase {
            kind,
            class,
            rows,
            cols,
            value,
            index,
        });
    }
    out
}

pub fn verify_case(ctx: &Context, case: &ConvertCase, seed: u64) -> Result<VerifyOutcome> {
    with_types!("sparse convert verify", case.value, case.index, run(ctx, case, seed))
}

fn run<T: Element, I: SparseIndex>(ctx: &Context, case: &ConvertCase, seed: u64) -> Result<VerifyOutcome> {
    let host = try_generate::<T, I>(case.class, case.rows, case.cols, seed)?;
    match case.kind {
        ConvertKind::Transpose => {
            let a = CsrMatrix::from_host(ctx, &host)?;
            let t = a.transposed()?;
            let again = a.transposed()?;
            let mut problems = Vec::new();
            if !std::sync::Arc::ptr_eq(&t, &again) {
                problems.push("transposed() made the transpose twice".to_string());
            }
            let want = host.transpose();
            problems.extend(same_matrix(&t, &want)?);
            spmv_outcome(ctx, case, &t, &want, seed, problems)
        }
        ConvertKind::FromCoo { duplicates, repeated } => {
            let coo = shuffled_triplets(&host, repeated, seed);
            let want = CsrHost::from_coo(coo.clone(), duplicates);
            let got = CooMatrix::from_host(ctx, &coo).and_then(|c| CsrMatrix::from_coo(&c, duplicates));
            match (got, want) {
                (Ok(got), Ok(want)) => {
                    let problems = same_matrix(&got, &want)?;
                    spmv_outcome(ctx, case, &got, &want, seed, problems)
                }
                (Err(g), Err(w)) => {
                    let problems = if g.to_string() == w.to_string() {
                        vec![]
                    } else {
                        vec![format!("device error '{g}' differs from the host's '{w}'")]
                    };
                    Ok(verdict(case, "coo-reject", problems))
                }
                (Ok(_), Err(w)) => Ok(verdict(case, "coo", vec![format!("device accepted; host: {w}")])),
                (Err(g), Ok(_)) => Ok(verdict(case, "coo", vec![format!("device failed: {g}; host accepted")])),
            }
        }
        ConvertKind::BadCooIndex => {
            let coo = shuffled_triplets(&host, 0, seed);
            let mut cols = coo.col_indices.clone();
            let at = cols.len() / 2;
            if let Some(c) = cols.get_mut(at) {
                *c = I::from_usize_in_range(case.cols);
            }
            let result = CooMatrix::from_device(
                ctx,
                coo.rows,
                coo.cols,
                ctx.upload(&coo.row_indices)?,
                ctx.upload(&cols)?,
                ctx.upload(&coo.values)?,
            );
            let problems = match result {
                Err(Error::InvalidArgument { arg: "col_indices", .. }) => vec![],
                Err(e) => vec![format!("wrong error: {e}")],
                Ok(_) => vec!["an out-of-range column was accepted".to_string()],
            };
            Ok(verdict(case, "coo-check", problems))
        }
        ConvertKind::Sell { sigma, alpha, beta } => {
            let a = CsrMatrix::from_host(ctx, &host)?;
            let sell = SellMatrix::from_csr(&a, &SellOptions { sigma })?;
            let x: Vec<T> = random_vector(case.cols, seed ^ 0x5eed)
                .into_iter()
                .map(T::from_f64)
                .collect();
            let y0: Vec<T> = if beta == 0.0 {
                vec![T::from_f64(f64::NAN); case.rows]
            } else {
                random_vector(case.rows, seed ^ 0xbeef)
                    .into_iter()
                    .map(T::from_f64)
                    .collect()
            };
            let mut want = to_f64_vec(&y0);
            reference::spmv(&host, alpha, &to_f64_vec(&x), beta, &mut want);
            let dx = upload_nonempty(ctx, &x)?;
            let mut runs = Vec::new();
            for _ in 0..2 {
                let mut dy = upload_nonempty(ctx, &y0)?;
                sell.spmv(alpha, &dx, beta, &mut dy)?;
                runs.push(dy.to_host()?[..case.rows].to_vec());
            }
            let path = format!("sell padding {:.3}", sell.padding_ratio());
            Ok(judge(case.name(), case.params(), path, &runs[0], Some(&runs[1]), &want))
        }
        ConvertKind::UpdateValues => {
            let mut a = CsrMatrix::from_host(ctx, &host)?;
            let x = upload_nonempty(ctx, &vec![T::from_f64(1.0); case.cols])?;
            let mut y = upload_nonempty(ctx, &vec![T::from_f64(0.0); case.rows])?;
            a.spmv(1.0, &x, 0.0, &mut y)?; // caches a plan
            let stale = a.transposed()?;
            let values: Vec<T> = random_vector(host.nnz(), seed ^ 0x7a1)
                .into_iter()
                .map(T::from_f64)
                .collect();
            a.update_values(&values)?;
            let mut problems = Vec::new();
            if a.version() != 1 {
                problems.push(format!("version {} after one update", a.version()));
            }
            let updated = CsrHost { values, ..host.clone() };
            let t = a.transposed()?;
            if std::sync::Arc::ptr_eq(&t, &stale) {
                problems.push("transposed() kept the transpose of the old values".to_string());
            }
            problems.extend(same_matrix(&t, &updated.transpose())?);
            if a.update_values(&[]).is_ok() && host.nnz() > 0 {
                problems.push("update_values accepted the wrong number of values".to_string());
            }
            // SpMV of the updated matrix (a fresh cached plan) against the reference
            let (outcome_problems, got, want) = spmv_check(ctx, &a, &updated, seed)?;
            problems.extend(outcome_problems);
            Ok(with_problems(
                judge(case.name(), case.params(), "update".into(), &got, None, &want),
                problems,
            ))
        }
    }
}

/// The host's matrix and the device's, array for array.
fn same_matrix<T: Element, I: SparseIndex>(got: &CsrMatrix<T, I>, want: &CsrHost<T, I>) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    if (got.rows(), got.cols(), got.nnz()) != (want.rows, want.cols, want.nnz()) {
        problems.push(format!(
            "shape {}x{} nnz {}, want {}x{} nnz {}",
            got.rows(),
            got.cols(),
            got.nnz(),
            want.rows,
            want.cols,
            want.nnz()
        ));
        return Ok(problems);
    }
    let nnz = want.nnz();
    if got.offsets.to_host()? != want.offsets {
        problems.push("offsets differ".into());
    }
    if got.indices.to_host()?[..nnz] != want.indices[..] {
        problems.push("indices differ".into());
    }
    let values = got.values.to_host()?;
    let bits = |v: &T| v.to_f64().to_bits();
    if let Some(k) = (0..nnz).find(|&k| bits(&values[k]) != bits(&want.values[k])) {
        problems.push(format!(
            "values differ first at {k}: {:?}, want {:?}",
            values[k], want.values[k]
        ));
    }
    let want_descriptor = SparseDescriptor::of(want);
    if got.descriptor() != &want_descriptor {
        problems.push(format!(
            "descriptor {} differs from the host's {}",
            got.descriptor(),
            want_descriptor
        ));
    }
    if got.row_lengths().iter().sum::<usize>() != nnz {
        problems.push("row lengths do not add up to nnz".into());
    }
    if got.conversion().is_none() {
        problems.push("no conversion report".into());
    }
    Ok(problems)
}

/// SpMV with the converted matrix against the f64 reference on `want`.
fn spmv_check<T: Element, I: SparseIndex>(
    ctx: &Context,
    got: &CsrMatrix<T, I>,
    want: &CsrHost<T, I>,
    seed: u64,
) -> Result<(Vec<String>, Vec<T>, Vec<f64>)> {
    let x: Vec<T> = random_vector(want.cols, seed ^ 0x5eed)
        .into_iter()
        .map(T::from_f64)
        .collect();
    let mut reference_y = vec![f64::NAN; want.rows];
    reference::spmv(want, 1.0, &to_f64_vec(&x), 0.0, &mut reference_y);
    let dx = upload_nonempty(ctx, &x)?;
    let mut dy = upload_nonempty(ctx, &vec![T::from_f64(f64::NAN); want.rows])?;
    got.spmv(1.0, &dx, 0.0, &mut dy)?;
    let y = dy.to_host()?;
    Ok((Vec::new(), y[..want.rows].to_vec(), reference_y))
}

fn spmv_outcome<T: Element, I: SparseIndex>(
    ctx: &Context,
    case: &ConvertCase,
    got: &CsrMatrix<T, I>,
    want: &CsrHost<T, I>,
    seed: u64,
    mut problems: Vec<String>,
) -> Result<VerifyOutcome> {
    let (more, y, reference_y) = spmv_check(ctx, got, want, seed)?;
    problems.extend(more);
    let path = got.conversion().map_or("-".to_string(), |r| r.to_string());
    Ok(with_problems(
        judge(case.name(), case.params(), path, &y, None, &reference_y),
        problems,
    ))
}

/// The triplets of `host` in a seeded random order, with `repeated` of them given again (with
/// new values) at random places.
fn shuffled_triplets<T: Element, I: SparseIndex>(host: &CsrHost<T, I>, repeated: usize, seed: u64) -> CooHost<T, I> {
    let mut coo = host.to_coo();
    let mut rng = StdRng::seed_from_u64(seed ^ 0xc00);
    let n = coo.values.len();
    for _ in 0..repeated.min(n * 4) {
        let k = rng.random_range(0..n);
        coo.row_indices.push(coo.row_indices[k]);
        coo.col_indices.push(coo.col_indices[k]);
        coo.values.push(T::from_f64(rng.random_range(-1.0..=1.0)));
    }
    for k in (1..coo.values.len()).rev() {
        let j = rng.random_range(0..=k);
        coo.row_indices.swap(k, j);
        coo.col_indices.swap(k, j);
        coo.values.swap(k, j);
    }
    coo
}

pub(crate) fn with_problems(mut outcome: VerifyOutcome, problems: Vec<String>) -> VerifyOutcome {
    if !problems.is_empty() {
        outcome.passed = false;
        let note = problems.join("; ");
        outcome.note = Some(match outcome.note.take() {
            Some(n) => format!("{n}; {note}"),
            None => note,
        });
    }
    outcome
}

/// A case judged only by `problems` (no numbers to compare).
fn verdict(case: &ConvertCase, path: &str, problems: Vec<String>) -> VerifyOutcome {
    with_problems(
        judge::<f32>(case.name(), case.params(), path.into(), &[], None, &[]),
        problems,
    )
}
