//! Vectors in Matrix Market files, for the `tessera lsmr` command: reading a right-hand side
//! given as a dense `array` file (`m x 1` or `1 x m`) or as a `coordinate` vector (missing
//! entries are 0; read with [`sparse::parse_mtx`](crate::sparse::parse_mtx)), and writing a
//! solution as a dense `array` file (`n x 1`, 17 significant digits: f64 round trips).
//! Several right-hand sides: [`read_mtx_columns`] reads an `m x k` file (array or coordinate)
//! column-major, [`write_mtx_columns`] writes an `n x k` array file.

use std::fmt::Write as _;
use std::path::Path;

use crate::error::{Error, Result};
use crate::sparse::parse_mtx;

/// Reads a vector from a Matrix Market file (`array` or `coordinate`, one row or one column).
pub fn read_mtx_vector(path: &Path) -> Result<Vec<f64>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Io {
        context: format!("reading {}", path.display()),
        source: e,
    })?;
    parse_mtx_vector(&text).map_err(|e| match e {
        Error::InvalidArgument { rule, .. } => Error::invalid("vector file", format!("{}: {rule}", path.display())),
        e => e,
    })
}

/// [`read_mtx_vector`] on the file's text.
pub fn parse_mtx_vector(text: &str) -> Result<Vec<f64>> {
    let banner = text.lines().next().unwrap_or("").to_ascii_lowercase();
    if !banner.starts_with("%%matrixmarket") {
        return Err(Error::invalid("vector file", "does not start with %%MatrixMarket"));
    }
    if banner.split_whitespace().any(|w| w == "coordinate") {
        let (coo, _) = parse_mtx(text)?;
        if coo.rows != 1 && coo.cols != 1 {
            return Err(Error::invalid(
                "vector file",
                format!(
                    "is a {} x {} matrix, not a vector (one row or column)",
                    coo.rows, coo.cols
                ),
            ));
        }
        let mut v = vec![0.0; coo.rows * coo.cols];
        for k in 0..coo.values.len() {
            let i = (coo.row_indices[k] as usize) * coo.cols + coo.col_indices[k] as usize;
            v[i] += coo.values[k];
        }
        return Ok(v);
    }
    if !banner.split_whitespace().any(|w| w == "array") {
        return Err(Error::invalid(
            "vector file",
            "is neither an array nor a coordinate file",
        ));
    }
    if banner.split_whitespace().any(|w| w == "complex" || w == "pattern") {
        return Err(Error::Unsupported("complex or pattern vector files".into()));
    }
    let mut lines = text
        .lines()
        .enumerate()
        .skip(1)
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('%'));
    let (line, size) = lines
        .next()
        .ok_or_else(|| Error::invalid("vector file", "has no size line"))?;
    let dims: Vec<usize> = size.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    let len = match dims.as_slice() {
        [r, 1] | [1, r] => *r,
        _ => {
            return Err(Error::invalid(
                "vector file",
                format!("line {}: size `{size}` is not that of a vector (m 1 or 1 m)", line + 1),
            ))
        }
    };
    let v = array_values(lines, len, "vector file")?;
    if v.len() != len {
        return Err(Error::invalid(
            "vector file",
            format!("holds {} values, its size line says {len}", v.len()),
        ));
    }
    Ok(v)
}

/// An `rows x cols` matrix from a Matrix Market file (`array`, stored column-major as the
/// format does, or `coordinate`, missing entries 0), as `(rows, cols, data)` with `data`
/// column-major (element `(i, j)` at `j * rows + i`).
pub fn read_mtx_columns(path: &Path) -> Result<(usize, usize, Vec<f64>)> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Io {
        context: format!("reading {}", path.display()),
        source: e,
    })?;
    parse_mtx_columns(&text).map_err(|e| match e {
        Error::InvalidArgument { rule, .. } => Error::invalid("matrix file", format!("{}: {rule}", path.display())),
        e => e,
    })
}

/// [`read_mtx_columns`] on the file's text.
pub fn parse_mtx_columns(text: &str) -> Result<(usize, usize, Vec<f64>)> {
    let banner = text.lines().next().unwrap_or("").to_ascii_lowercase();
    if !banner.starts_with("%%matrixmarket") {
        return Err(Error::invalid("matrix file", "does not start with %%MatrixMarket"));
    }
    if banner.split_whitespace().any(|w| w == "coordinate") {
        let (coo, _) = parse_mtx(text)?;
        let len = coo
            .rows
            .checked_mul(coo.cols)
            .ok_or_else(|| Error::invalid("matrix file", format!("{} x {} overflows", coo.rows, coo.cols)))?;
        let mut v = vec![0.0; len];
        for k in 0..coo.values.len() {
            let i = coo.col_indices[k] as usize * coo.rows + coo.row_indices[k] as usize;
            v[i] += coo.values[k];
        }
        return Ok((coo.rows, coo.cols, v));
    }
    if !banner.split_whitespace().any(|w| w == "array") {
        return Err(Error::invalid(
            "matrix file",
            "is neither an array nor a coordinate file",
        ));
    }
    if banner.split_whitespace().any(|w| w == "complex" || w == "pattern") {
        return Err(Error::Unsupported("complex or pattern matrix files".into()));
    }
    if !banner.split_whitespace().any(|w| w == "general") {
        return Err(Error::Unsupported(
            "symmetric array files (give the right-hand sides as a general array)".into(),
        ));
    }
    let mut lines = text
        .lines()
        .enumerate()
        .skip(1)
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('%'));
    let (line, size) = lines
        .next()
        .ok_or_else(|| Error::invalid("matrix file", "has no size line"))?;
    let dims: Vec<usize> = size.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    let (rows, cols) = match dims.as_slice() {
        [r, c] => (*r, *c),
        _ => {
            return Err(Error::invalid(
                "matrix file",
                format!("line {}: size `{size}` is not `rows cols`", line + 1),
            ))
        }
    };
    let len = rows
        .checked_mul(cols)
        .ok_or_else(|| Error::invalid("matrix file", format!("{rows} x {cols} overflows")))?;
    let v = array_values(lines, len, "matrix file")?;
    if v.len() != len {
        return Err(Error::invalid(
            "matrix file",
            format!("holds {} values, its size line says {rows} x {cols} = {len}", v.len()),
        ));
    }
    Ok((rows, cols, v))
}

/// The text of the column-major `rows x cols` matrix `data` as a Matrix Market array file.
pub fn format_mtx_columns(rows: usize, cols: usize, data: &[f64]) -> String {
    let mut s = String::with_capacity(24 * data.len() + 64);
    s.push_str("%%MatrixMarket matrix array real general\n");
    let _ = writeln!(s, "{rows} {cols}");
    for x in data {
        let _ = writeln!(s, "{x:.16e}");
    }
    s
}

/// Writes the column-major `rows x cols` matrix `data` as a Matrix Market array file.
pub fn write_mtx_columns(path: &Path, rows: usize, cols: usize, data: &[f64]) -> Result<()> {
    std::fs::write(path, format_mtx_columns(rows, cols, data)).map_err(|e| Error::Io {
        context: format!("writing {}", path.display()),
        source: e,
    })
}

/// The text of `v` as an `n x 1` Matrix Market array file.
pub fn format_mtx_vector(v: &[f64]) -> String {
    let mut s = String::with_capacity(24 * v.len() + 64);
    s.push_str("%%MatrixMarket matrix array real general\n");
    let _ = writeln!(s, "{} 1", v.len());
    for x in v {
        let _ = writeln!(s, "{x:.16e}");
    }
    s
}

/// Writes `v` as an `n x 1` Matrix Market array file.
pub fn write_mtx_vector(path: &Path, v: &[f64]) -> Result<()> {
    std::fs::write(path, format_mtx_vector(v)).map_err(|e| Error::Io {
        context: format!("writing {}", path.display()),
        source: e,
    })
}

/// The values of an `array` file's data lines `(line index, text)`: finite numbers, any number
/// per line (`len` only sizes the vector). Errors name `what` and the line.
fn array_values<'a>(lines: impl Iterator<Item = (usize, &'a str)>, len: usize, what: &'static str) -> Result<Vec<f64>> {
    let mut v = Vec::with_capacity(len);
    for (line, l) in lines {
        for w in l.split_whitespace() {
            let x: f64 = w
                .parse()
                .map_err(|_| Error::invalid(what, format!("line {}: `{w}` is not a number", line + 1)))?;
            if !x.is_finite() {
                return Err(Error::invalid(what, format!("line {}: {x} is not finite", line + 1)));
            }
            v.push(x);
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_and_coordinate_vectors_read_alike() {
        let array = "%%MatrixMarket matrix array real general\n% a comment\n3 1\n1.5\n0\n-2\n";
        assert_eq!(parse_mtx_vector(array).unwrap(), vec![1.5, 0.0, -2.0]);
        let coo = "%%MatrixMarket matrix coordinate real general\n3 1 2\n1 1 1.5\n3 1 -2\n";
        assert_eq!(parse_mtx_vector(coo).unwrap(), vec![1.5, 0.0, -2.0]);
        let row = "%%MatrixMarket matrix coordinate real general\n1 3 1\n1 2 4\n";
        assert_eq!(parse_mtx_vector(row).unwrap(), vec![0.0, 4.0, 0.0]);
    }

    #[test]
    fn written_vectors_read_back_exactly() {
        let v = vec![0.1, -1e-300, 12345.678901234567, 0.0];
        assert_eq!(parse_mtx_vector(&format_mtx_vector(&v)).unwrap(), v);
    }

    #[test]
    fn matrices_of_columns_read_column_major_and_round_trip() {
        let array = "%%MatrixMarket matrix array real general\n3 2\n1\n2\n3\n4\n5\n6\n";
        assert_eq!(
            parse_mtx_columns(array).unwrap(),
            (3, 2, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        );
        let coo = "%%MatrixMarket matrix coordinate real general\n3 2 2\n1 2 4\n3 1 3\n";
        assert_eq!(
            parse_mtx_columns(coo).unwrap(),
            (3, 2, vec![0.0, 0.0, 3.0, 4.0, 0.0, 0.0])
        );
        let data = vec![0.1, -2.5, 1e-300, 7.0];
        assert_eq!(
            parse_mtx_columns(&format_mtx_columns(2, 2, &data)).unwrap(),
            (2, 2, data)
        );
        // a vector file reads as one column, as read_mtx_vector reads it
        let v = "%%MatrixMarket matrix array real general\n3 1\n1.5\n0\n-2\n";
        assert_eq!(parse_mtx_columns(v).unwrap().2, parse_mtx_vector(v).unwrap());
        assert!(parse_mtx_columns("%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n").is_err());
        assert!(parse_mtx_columns("%%MatrixMarket matrix array real symmetric\n2 2\n1\n2\n3\n").is_err());
    }

    #[test]
    fn bad_vector_files_are_errors() {
        let m = "%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1 1\n";
        assert!(parse_mtx_vector(m).is_err());
        let short = "%%MatrixMarket matrix array real general\n3 1\n1\n2\n";
        assert!(parse_mtx_vector(short).is_err());
        let nan = "%%MatrixMarket matrix array real general\n1 1\nnan\n";
        assert!(parse_mtx_vector(nan).is_err());
        assert!(parse_mtx_vector("1 2 3").is_err());
    }
}
