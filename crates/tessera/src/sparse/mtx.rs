//! Matrix Market coordinate files: reading ([`read_mtx`], [`parse_mtx`]) into 0-based triplets
//! and writing a CSR matrix ([`write_mtx`]).
//!
//! Supported: `%%MatrixMarket matrix coordinate <real|double|integer|pattern>
//! <general|symmetric|skew-symmetric>`. Dense `array` files, `complex` values and `hermitian`
//! symmetry are [`Error::Unsupported`]. Comment lines (`%`) and blank lines may appear anywhere
//! after the banner. Pattern entries get the value 1. Symmetric files store the lower triangle
//! and are expanded to both triangles (diagonal entries once); skew-symmetric files store the
//! strictly lower triangle and the mirrored entry is negated. An entry above the diagonal of a
//! symmetric or skew-symmetric file, or on the diagonal of a skew-symmetric one, is an error
//! rather than being guessed at. Values must be finite.
//!
//! Reading is O(file size): the whole file is read, and the entry lines are split into about
//! one chunk per CPU at line boundaries and parsed in parallel with `std::thread::scope`.
//! Every error names the 1-based line it concerns.

use std::fmt;
use std::io::Write;
use std::path::Path;

use super::row_ranges::thread_count;
use super::{CooHost, CsrHost, Duplicates, SparseIndex};
use crate::dtype::Element;
use crate::error::{Error, Result};

/// The value type of a Matrix Market file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MtxField {
    /// Floating-point values (`real`, or its synonym `double`).
    Real,
    /// Integer values (read as f64: exact up to 2^53).
    Integer,
    /// No values: every stored entry is 1.
    Pattern,
}

/// Which entries a Matrix Market file stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MtxSymmetry {
    /// Every entry.
    General,
    /// The lower triangle of `A = A^T`.
    Symmetric,
    /// The strict lower triangle of `A = -A^T`.
    SkewSymmetric,
}

/// The banner of a Matrix Market coordinate file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MtxHeader {
    pub field: MtxField,
    pub symmetry: MtxSymmetry,
}

/// Entry bytes below which reading stays on one thread.
const PARALLEL_MIN_BYTES: usize = 1 << 20;

/// Reads a Matrix Market coordinate file into 0-based triplets (symmetric files expanded; see
/// the module documentation). Duplicates are kept; [`CsrHost::from_coo`] sums or rejects them.
pub fn read_mtx(path: &Path) -> Result<(CooHost<f64, i64>, MtxHeader)> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        context: format!("reading Matrix Market file {}", path.display()),
        source,
    })?;
    let source = path.display().to_string();
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        let line = 1 + bytes[..e.valid_up_to()].iter().filter(|&&b| b == b'\n').count();
        Error::invalid("path", format!("{source}: line {line}: not ASCII/UTF-8 text"))
    })?;
    Parser { arg: "path", source }.parse(text)
}

/// [`read_mtx`] from the text of a file.
pub fn parse_mtx(text: &str) -> Result<(CooHost<f64, i64>, MtxHeader)> {
    Parser {
        arg: "text",
        source: "Matrix Market text".to_string(),
    }
    .parse(text)
}

/// Reads a Matrix Market file straight into a CSR matrix with value type `T` and index type
/// `I`, summing duplicate entries.
pub fn read_mtx_csr<T: Element, I: SparseIndex>(path: &Path) -> Result<CsrHost<T, I>> {
    let (coo, _) = read_mtx(path)?;
    let coo = coo.with_index::<I>()?;
    let coo = CooHost {
        values: coo.values.iter().map(|&v| T::from_f64(v)).collect(),
        rows: coo.rows,
        cols: coo.cols,
        row_indices: coo.row_indices,
        col_indices: coo.col_indices,
    };
    CsrHost::from_coo(coo, Duplicates::Sum)
}

/// Writes `a` as a `coordinate real general` Matrix Market file, one line per stored entry
/// (1-based), values in the shortest form that reads back to the same f64 (`{:e}`).
///
/// `a` is validated first and non-finite values are an error, so nothing is written for a
/// matrix that could not be read back.
pub fn write_mtx<T: Element, I: SparseIndex>(path: &Path, a: &CsrHost<T, I>) -> Result<()> {
    a.validate()?;
    if let Some(p) = a.values.iter().position(|v| !v.to_f64().is_finite()) {
        return Err(Error::invalid(
            "a",
            format!(
                "values[{p}] = {}; Matrix Market files hold finite values only",
                a.values[p].to_f64()
            ),
        ));
    }
    let io_error = |source| Error::Io {
        context: format!("writing Matrix Market file {}", path.display()),
        source,
    };
    let file = std::fs::File::create(path).map_err(io_error)?;
    let mut out = std::io::BufWriter::new(file);
    let mut write_all = || -> std::io::Result<()> {
        writeln!(out, "%%MatrixMarket matrix coordinate real general")?;
        writeln!(out, "% written by tessera")?;
        writeln!(out, "{} {} {}", a.rows, a.cols, a.nnz())?;
        for r in 0..a.rows {
            let (cols, values) = a.row(r);
            for (&c, &v) in cols.iter().zip(values) {
                writeln!(out, "{} {} {:e}", r + 1, c.to_usize() + 1, v.to_f64())?;
            }
        }
        out.flush()
    };
    write_all().map_err(io_error)
}

impl MtxField {
    /// The banner word: `real`, `integer` or `pattern`.
    pub fn name(self) -> &'static str {
        match self {
            MtxField::Real => "real",
            MtxField::Integer => "integer",
            MtxField::Pattern => "pattern",
        }
    }
}

impl MtxSymmetry {
    /// The banner word: `general`, `symmetric` or `skew-symmetric`.
    pub fn name(self) -> &'static str {
        match self {
            MtxSymmetry::General => "general",
            MtxSymmetry::Symmetric => "symmetric",
            MtxSymmetry::SkewSymmetric => "skew-symmetric",
        }
    }
}

impl fmt::Display for MtxHeader {
    /// The banner after `%%MatrixMarket`, e.g. `matrix coordinate real symmetric`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "matrix coordinate {} {}", self.field.name(), self.symmetry.name())
    }
}

/// The size line: dimensions and the number of entry lines.
#[derive(Clone, Copy)]
struct Size {
    rows: usize,
    cols: usize,
    entries: usize,
}

/// 0-based triplets (symmetric entries already expanded).
struct Triplets {
    rows: Vec<i64>,
    cols: Vec<i64>,
    values: Vec<f64>,
}

/// Where one chunk writes its triplets: room for every line of the chunk (twice for
/// symmetric files).
struct ChunkOutput<'a> {
    rows: &'a mut [i64],
    cols: &'a mut [i64],
    values: &'a mut [f64],
}

/// What one chunk parsed.
struct ChunkCounts {
    /// Triplets written (after expansion).
    written: usize,
    /// Entry lines (before expansion).
    entries: usize,
}

/// A problem on the `line`-th line (0-based) of a chunk.
struct ChunkError {
    line: usize,
    message: String,
}

/// Parses Matrix Market text, naming `source` in errors and reporting them on argument `arg`.
struct Parser {
    arg: &'static str,
    source: String,
}

impl Parser {
    fn error(&self, line: usize, message: impl fmt::Display) -> Error {
        Error::invalid(self.arg, format!("{}: line {line}: {message}", self.source))
    }

    fn unsupported(&self, what: impl fmt::Display) -> Error {
        Error::Unsupported(format!("{}: line 1: {what}", self.source))
    }

    fn parse(&self, text: &str) -> Result<(CooHost<f64, i64>, MtxHeader)> {
        // split_inclusive keeps the line ends, so the byte length consumed is exact for \n and \r\n
        let mut lines = text.split_inclusive('\n');
        let banner = lines.next().unwrap_or("");
        let header = self.parse_banner(banner.trim_end())?;
        let mut consumed = banner.len();
        let mut line_number = 1;
        // the size line: the first line after the banner that is not a comment or blank
        let size = loop {
            let Some(line) = lines.next() else {
                return Err(self.error(line_number, "the file ends before the size line `rows cols entries`"));
            };
            line_number += 1;
            consumed += line.len();
            if !is_skipped(line) {
                break self.parse_size(line_number, line.trim_end(), header)?;
            }
        };
        let body = &text[consumed..];
        let (triplets, entries) = self.parse_body(body, line_number + 1, size, header)?;
        if entries != size.entries {
            return Err(self.error(
                line_number,
                format!(
                    "the size line declares {} entries but the file has {entries} entry lines",
                    size.entries
                ),
            ));
        }
        let coo = CooHost {
            rows: size.rows,
            cols: size.cols,
            row_indices: triplets.rows,
            col_indices: triplets.cols,
            values: triplets.values,
        };
        Ok((coo, header))
    }

    fn parse_banner(&self, line: &str) -> Result<MtxHeader> {
        const EXPECTED: &str =
            "expected `%%MatrixMarket matrix coordinate <real|integer|pattern> <general|symmetric|skew-symmetric>`";
        let tokens: Vec<String> = line.split_ascii_whitespace().map(|t| t.to_ascii_lowercase()).collect();
        if tokens.first().map(String::as_str) != Some("%%matrixmarket") {
            return Err(self.error(1, format!("not a Matrix Market banner; {EXPECTED}")));
        }
        if tokens.len() != 5 {
            return Err(self.error(1, format!("the banner has {} words; {EXPECTED}", tokens.len())));
        }
        if tokens[1] != "matrix" {
            return Err(self.unsupported(format!("Matrix Market object `{}`; supported: matrix", tokens[1])));
        }
        match tokens[2].as_str() {
            "coordinate" => {}
            "array" => return Err(self.unsupported("dense `array` Matrix Market files; supported: coordinate")),
            other => return Err(self.error(1, format!("unknown format `{other}`; {EXPECTED}"))),
        }
        let field = match tokens[3].as_str() {
            "real" | "double" => MtxField::Real,
            "integer" => MtxField::Integer,
            "pattern" => MtxField::Pattern,
            "complex" => {
                return Err(self.unsupported("`complex` values; supported: real, double, integer, pattern"));
            }
            other => return Err(self.error(1, format!("unknown field `{other}`; {EXPECTED}"))),
        };
        let symmetry = match tokens[4].as_str() {
            "general" => MtxSymmetry::General,
            "symmetric" => MtxSymmetry::Symmetric,
            "skew-symmetric" => MtxSymmetry::SkewSymmetric,
            "hermitian" => {
                return Err(self.unsupported("`hermitian` symmetry; supported: general, symmetric, skew-symmetric"));
            }
            other => return Err(self.error(1, format!("unknown symmetry `{other}`; {EXPECTED}"))),
        };
        if field == MtxField::Pattern && symmetry == MtxSymmetry::SkewSymmetric {
            return Err(self.error(
                1,
                "a `pattern` file cannot be `skew-symmetric` (its mirrored entries would need a value of -1)",
            ));
        }
        Ok(MtxHeader { field, symmetry })
    }

    fn parse_size(&self, line_number: usize, line: &str, header: MtxHeader) -> Result<Size> {
        let tokens: Vec<&str> = line.split_ascii_whitespace().collect();
        let parse = |t: &str| t.parse::<u64>().ok().filter(|&v| v <= i64::MAX as u64);
        let numbers: Vec<u64> = tokens.iter().filter_map(|t| parse(t)).collect();
        if tokens.len() != 3 || numbers.len() != 3 {
            return Err(self.error(
                line_number,
                format!("expected the size line `rows cols entries` (three integers in 0..2^63), found `{line}`"),
            ));
        }
        let size = Size {
            rows: numbers[0] as usize,
            cols: numbers[1] as usize,
            entries: numbers[2] as usize,
        };
        if header.symmetry != MtxSymmetry::General && size.rows != size.cols {
            return Err(self.error(
                line_number,
                format!(
                    "a {} matrix must be square, this one is {} x {}",
                    header.symmetry.name(),
                    size.rows,
                    size.cols
                ),
            ));
        }
        Ok(size)
    }

    /// Parses the entry lines, the first of which is line `first_line`, in chunks on several
    /// threads, and returns the triplets and the number of entry lines; the first error (by
    /// line) wins.
    ///
    /// Two passes: the lines of each chunk are counted, then each chunk writes its triplets
    /// straight into its own part of the output arrays, sized for every line being an entry;
    /// parts left partly empty (comment lines, symmetric diagonals) are closed up at the end.
    fn parse_body(&self, body: &str, first_line: usize, size: Size, header: MtxHeader) -> Result<(Triplets, usize)> {
        let pieces = split_at_lines(body, thread_count(), PARALLEL_MIN_BYTES);
        let line_counts = on_each_thread(pieces.clone(), count_lines);
        let per_line = if header.symmetry == MtxSymmetry::General { 1 } else { 2 };
        let total: usize = line_counts.iter().map(|n| n * per_line).sum();
        let mut triplets = Triplets {
            rows: vec![0; total],
            cols: vec![0; total],
            values: vec![0.0; total],
        };
        let mut work = Vec::with_capacity(pieces.len());
        let (mut rows, mut cols, mut values) =
            (&mut triplets.rows[..], &mut triplets.cols[..], &mut triplets.values[..]);
        for (&piece, &lines) in pieces.iter().zip(&line_counts) {
            let room = lines * per_line;
            let (piece_rows, rest_rows) = std::mem::take(&mut rows).split_at_mut(room);
            let (piece_cols, rest_cols) = std::mem::take(&mut cols).split_at_mut(room);
            let (piece_values, rest_values) = std::mem::take(&mut values).split_at_mut(room);
            (rows, cols, values) = (rest_rows, rest_cols, rest_values);
            let output = ChunkOutput {
                rows: piece_rows,
                cols: piece_cols,
                values: piece_values,
            };
            work.push((piece, output));
        }
        let results = on_each_thread(work, |(piece, output)| parse_chunk(piece, size, header, output));

        let mut chunk_first_line = first_line;
        let (mut kept, mut room_start, mut entries) = (0, 0, 0);
        for (result, lines) in results.into_iter().zip(line_counts) {
            let counts = result.map_err(|e| self.error(chunk_first_line + e.line, e.message))?;
            if room_start != kept {
                let moved = room_start..room_start + counts.written;
                triplets.rows.copy_within(moved.clone(), kept);
                triplets.cols.copy_within(moved.clone(), kept);
                triplets.values.copy_within(moved, kept);
            }
            kept += counts.written;
            room_start += lines * per_line;
            entries += counts.entries;
            chunk_first_line += lines;
        }
        triplets.rows.truncate(kept);
        triplets.cols.truncate(kept);
        triplets.values.truncate(kept);
        Ok((triplets, entries))
    }
}

/// `work` applied to every item, each on its own scoped thread when there are several.
fn on_each_thread<X: Send, T: Send>(items: Vec<X>, work: impl Fn(X) -> T + Sync) -> Vec<T> {
    if items.len() <= 1 {
        return items.into_iter().map(work).collect();
    }
    let work = &work;
    std::thread::scope(|scope| {
        let handles: Vec<_> = items.into_iter().map(|item| scope.spawn(move || work(item))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("Matrix Market parser thread panicked"))
            .collect()
    })
}

/// The number of lines `str::lines` yields for `piece`.
fn count_lines(piece: &str) -> usize {
    let ends = piece.bytes().filter(|&b| b == b'\n').count();
    ends + usize::from(!piece.is_empty() && !piece.ends_with('\n'))
}

/// Comment and blank lines carry no entry.
fn is_skipped(line: &str) -> bool {
    let line = line.trim_start();
    line.is_empty() || line.starts_with('%')
}

/// Splits `body` into at most `parts` pieces that each end at a line end (the last at the end
/// of `body`), none smaller than about `min_bytes` unless `body` is.
fn split_at_lines(body: &str, parts: usize, min_bytes: usize) -> Vec<&str> {
    let parts = parts.min(body.len() / min_bytes.max(1)).max(1);
    let bytes = body.as_bytes();
    let mut pieces = Vec::with_capacity(parts);
    let mut start = 0;
    for k in 1..=parts {
        let mut end = if k == parts { body.len() } else { body.len() * k / parts };
        end = end.max(start);
        while end < bytes.len() && (end == 0 || bytes[end - 1] != b'\n') {
            end += 1;
        }
        if end > start {
            pieces.push(&body[start..end]);
            start = end;
        }
    }
    pieces
}

/// Parses the entry lines of one chunk into 0-based expanded triplets in `out`, which has
/// room for every line of the chunk (twice that for symmetric files).
fn parse_chunk(
    piece: &str,
    size: Size,
    header: MtxHeader,
    out: ChunkOutput<'_>,
) -> std::result::Result<ChunkCounts, ChunkError> {
    let mut counts = ChunkCounts { written: 0, entries: 0 };
    let mut push = |row: usize, col: usize, value: f64| {
        out.rows[counts.written] = row as i64;
        out.cols[counts.written] = col as i64;
        out.values[counts.written] = value;
        counts.written += 1;
    };
    let mut entries = 0;
    for (k, line) in piece.lines().enumerate() {
        if is_skipped(line) {
            continue;
        }
        let (row, col, value) = parse_entry(line, size, header).map_err(|message| ChunkError { line: k, message })?;
        entries += 1;
        push(row, col, value);
        if row != col && header.symmetry != MtxSymmetry::General {
            let mirrored = if header.symmetry == MtxSymmetry::SkewSymmetric {
                -value
            } else {
                value
            };
            push(col, row, mirrored);
        }
    }
    counts.entries = entries;
    Ok(counts)
}

/// One entry line as a 0-based (row, column, value).
fn parse_entry(line: &str, size: Size, header: MtxHeader) -> std::result::Result<(usize, usize, f64), String> {
    let expected = if header.field == MtxField::Pattern {
        "`row col`"
    } else {
        "`row col value`"
    };
    let mut tokens = line.split_ascii_whitespace();
    let row = parse_position(tokens.next(), size.rows, "row", expected)?;
    let col = parse_position(tokens.next(), size.cols, "column", expected)?;
    let value = match header.field {
        MtxField::Pattern => 1.0,
        MtxField::Real => {
            let token = tokens
                .next()
                .ok_or_else(|| format!("missing value; expected {expected}"))?;
            token
                .parse::<f64>()
                .map_err(|_| format!("`{token}` is not a real number; expected {expected}"))?
        }
        MtxField::Integer => {
            let token = tokens
                .next()
                .ok_or_else(|| format!("missing value; expected {expected}"))?;
            token
                .parse::<i64>()
                .map_err(|_| format!("`{token}` is not a 64-bit integer; expected {expected}"))? as f64
        }
    };
    if let Some(extra) = tokens.next() {
        return Err(format!("unexpected `{extra}` after the entry; expected {expected}"));
    }
    if !value.is_finite() {
        return Err(format!(
            "value {value} is not finite; Matrix Market values must be finite"
        ));
    }
    match header.symmetry {
        MtxSymmetry::General => {}
        MtxSymmetry::Symmetric if col > row => {
            return Err(format!(
                "entry ({}, {}) is above the diagonal; a symmetric file stores the lower triangle only",
                row + 1,
                col + 1
            ));
        }
        MtxSymmetry::SkewSymmetric if col >= row => {
            return Err(format!(
                "entry ({}, {}) is on or above the diagonal; a skew-symmetric file stores the strict lower \
                 triangle only",
                row + 1,
                col + 1
            ));
        }
        _ => {}
    }
    Ok((row, col, value))
}

/// A 1-based position token checked against `1..=bound`, returned 0-based.
fn parse_position(token: Option<&str>, bound: usize, what: &str, expected: &str) -> std::result::Result<usize, String> {
    let token = token.ok_or_else(|| format!("missing {what} index; expected {expected}"))?;
    let position = parse_decimal(token)
        .ok_or_else(|| format!("{what} index `{token}` is not a positive integer; expected {expected}"))?;
    if position == 0 || position > bound as u64 {
        return Err(format!(
            "{what} index {position} is outside 1..={bound} (Matrix Market indices are 1-based)"
        ));
    }
    Ok(position as usize - 1)
}

/// A decimal `u64`: plain digits on a fast path, anything else (a `+` sign, overflow) through
/// `str::parse`.
fn parse_decimal(token: &str) -> Option<u64> {
    // 19 digits always fit a u64
    if token.is_empty() || token.len() > 19 || !token.bytes().all(|b| b.is_ascii_digit()) {
        return token.parse().ok();
    }
    Some(token.bytes().fold(0, |acc, b| acc * 10 + u64::from(b - b'0')))
}

/// The `(rows, cols)` of a Matrix Market file from its size line, reading only the lines before
/// it (for naming and sizing work before the whole file is parsed).
pub fn read_mtx_header_shape(path: &Path) -> Result<(usize, usize)> {
    use std::io::BufRead;
    let io = |source| Error::Io {
        context: format!("reading Matrix Market file {}", path.display()),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(io)?;
        let t = line.trim();
        if n == 0 || t.is_empty() || t.starts_with('%') {
            continue;
        }
        let mut it = t.split_whitespace().map(|w| w.parse::<usize>());
        return match (it.next(), it.next()) {
            (Some(Ok(r)), Some(Ok(c))) => Ok((r, c)),
            _ => Err(Error::invalid(
                "path",
                format!(
                    "{}: line {}: expected the size line `rows cols entries`, found `{t}`",
                    path.display(),
                    n + 1
                ),
            )),
        };
    }
    Err(Error::invalid(
        "path",
        format!("{}: the file ends before the size line", path.display()),
    ))
}
