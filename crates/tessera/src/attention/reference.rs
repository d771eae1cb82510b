//! The f64 CPU oracle for attention forward, written from the definition and independent of
//! the kernels (no tiling, no online softmax, no shared code with `attention_params.cuh`).
//!
//! For every sequence `b`, query head `h` (reading KV head `h / (Hq / Hkv)`) and query `i`:
//!
//! ```text
//! s_j  = scale * (q_i . k_j)
//! s_j  = softcap * tanh(s_j / softcap)                 when softcap > 0
//! s_j  = -inf                                          when key j is masked for query i
//! lse  = ln sum_j exp(s_j)                             (-inf when every key is masked)
//! o_i  = sum_j exp(s_j - lse) v_j                      (0 when every key is masked)
//! ```
//!
//! The mask is evaluated explicitly per `(i, j)` ([`is_visible`]): bottom-right aligned, so with
//! `shift = Nk - Nq` key `j` is visible iff `j - (i + shift)` lies in `[-left, right]` (a
//! negative `left`/`right` is unbounded on that side); causal is `right = 0`.
//!
//! Tensors are taken in one canonical packed layout, whatever layout the kernel ran on:
//! `q[row, h, d]` of `[total_q, Hq, D]` and `k`, `v` of `[total_k, Hkv, D]`, where sequence `b`
//! owns query rows `cu_q[b]..cu_q[b + 1]` and key rows `cu_k[b]..cu_k[b + 1]` (a padded batch
//! is `cu = [0, N, 2N, ...]`). The output is `o[row, h, d]` of `[total_q, Hq, D]` and
//! `lse[row, h]` of `[total_q, Hq]`.

use rayon::prelude::*;

/// The scalar parameters of a reference problem.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RefParams {
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    /// Softmax scale applied to `q . k` (before the softcap).
    pub scale: f64,
    /// Logit softcap; 0 = off.
    pub softcap: f64,
    /// Keys allowed left of the (bottom-right aligned) diagonal; negative = unbounded.
    pub window_left: i64,
    /// Keys allowed right of the diagonal; negative = unbounded; causal = 0.
    pub window_right: i64,
}

impl RefParams {
    /// Causal attention with the default scale `1/sqrt(D)`, no softcap, no left window.
    pub fn causal(heads_q: usize, heads_kv: usize, head_dim: usize) -> RefParams {
        RefParams {
            heads_q,
            heads_kv,
            head_dim,
            scale: 1.0 / (head_dim as f64).sqrt(),
            softcap: 0.0,
            window_left: -1,
            window_right: 0,
        }
    }
}

/// The inputs in the canonical layout of the module docs (f64, already rounded from the
/// storage dtype the kernel read).
#[derive(Clone, Copy, Debug)]
pub struct RefInputs<'a> {
    /// `[total_q, Hq, D]`.
    pub q: &'a [f64],
    /// `[total_k, Hkv, D]`.
    pub k: &'a [f64],
    /// `[total_k, Hkv, D]`.
    pub v: &'a [f64],
    /// Query row boundaries, `batch + 1` entries starting at 0.
    pub cu_q: &'a [usize],
    /// Key row boundaries, `batch + 1` entries starting at 0.
    pub cu_k: &'a [usize],
}

/// The reference result: `o` is `[total_q, Hq, D]`, `lse` is `[total_q, Hq]` (natural log).
#[derive(Clone, Debug, PartialEq)]
pub struct RefOutput {
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
}

/// Whether query `i` of a sequence with `nq` queries may see key `j` of `nk` keys.
pub fn is_visible(i: usize, j: usize, nq: usize, nk: usize, left: i64, right: i64) -> bool {
    if i >= nq || j >= nk {
        return false;
    }
    // Offset of key j from query i's diagonal key (i + nk - nq).
    let rel = j as i64 - (i as i64 + nk as i64 - nq as i64);
    (left < 0 || rel >= -left) && (right < 0 || rel <= right)
}

/// Sequence boundaries of a padded batch: `[0, n, 2n, ..., batch * n]`.
pub fn padded_cu_seqlens(batch: usize, n: usize) -> Vec<usize> {
    (0..=batch).map(|b| b * n).collect()
}

/// One query row: `(o, lse)` for query `i` of sequence `b`, query head `h`.
///
/// # Panics
/// If the indices or slices do not fit the problem (a harness bug).
pub fn reference_row(x: &RefInputs, p: &RefParams, b: usize, h: usize, i: usize) -> (Vec<f64>, f64) {
    let RefInputs { q, k, v, cu_q, cu_k } = *x;
    let (hq, hkv, d) = (p.heads_q, p.heads_kv, p.head_dim);
    let hk = h / (hq / hkv);
    let (q0, nq) = (cu_q[b], cu_q[b + 1] - cu_q[b]);
    let (k0, nk) = (cu_k[b], cu_k[b + 1] - cu_k[b]);
    assert!(i < nq && h < hq, "reference_row: query {i} of {nq}, head {h} of {hq}");
    let qrow = &q[((q0 + i) * hq + h) * d..][..d];
    let mut scores: Vec<(usize, f64)> = Vec::new();
    for j in 0..nk {
        if !is_visible(i, j, nq, nk, p.window_left, p.window_right) {
            continue;
        }
        let krow = &k[((k0 + j) * hkv + hk) * d..][..d];
        let dot: f64 = qrow.iter().zip(krow).map(|(a, b)| a * b).sum();
        let mut s = p.scale * dot;
        if p.softcap > 0.0 {
            s = p.softcap * (s / p.softcap).tanh();
        }
        scores.push((j, s));
    }
    let mut o = vec![0.0; d];
    if scores.is_empty() {
        return (o, f64::NEG_INFINITY);
    }
    let m = scores.iter().map(|&(_, s)| s).fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = scores.iter().map(|&(_, s)| (s - m).exp()).sum();
    let lse = m + sum.ln();
    for &(j, s) in &scores {
        let w = (s - lse).exp();
        let vrow = &v[((k0 + j) * hkv + hk) * d..][..d];
        for (oc, vc) in o.iter_mut().zip(vrow) {
            *oc += w * vc;
        }
    }
    (o, lse)
}

/// The full reference over every sequence, head and query, in parallel over (sequence, head).
///
/// # Panics
/// If `cu_q`/`cu_k` have different lengths or are not non-decreasing, `Hq % Hkv != 0`, or the
/// slices are shorter than the layout described in the module docs (harness bugs).
pub fn attention_reference(x: &RefInputs, p: &RefParams) -> RefOutput {
    let RefInputs { q, k, v, cu_q, cu_k } = *x;
    let (hq, hkv, d) = (p.heads_q, p.heads_kv, p.head_dim);
    assert!(
        hkv > 0 && hq % hkv == 0,
        "attention_reference: heads_q {hq} is not a multiple of heads_kv {hkv}"
    );
    assert!(
        cu_q.len() == cu_k.len() && !cu_q.is_empty(),
        "attention_reference: cu_q and cu_k lengths differ"
    );
    assert!(cu_q.windows(2).all(|w| w[0] <= w[1]) && cu_k.windows(2).all(|w| w[0] <= w[1]));
    let (total_q, total_k) = (*cu_q.last().unwrap(), *cu_k.last().unwrap());
    assert!(q.len() >= total_q * hq * d, "attention_reference: q too short");
    assert!(
        k.len() >= total_k * hkv * d && v.len() >= total_k * hkv * d,
        "attention_reference: k/v too short"
    );
    let batch = cu_q.len() - 1;
    // One task per (sequence, head): its rows' outputs and LSEs.
    let parts: Vec<(usize, usize, Vec<f64>, Vec<f64>)> = (0..batch * hq)
        .into_par_iter()
        .map(|bh| {
            let (b, h) = (bh / hq, bh % hq);
            let nq = cu_q[b + 1] - cu_q[b];
            let mut o = Vec::with_capacity(nq * d);
            let mut lse = Vec::with_capacity(nq);
            for i in 0..nq {
                let (row, l) = reference_row(x, p, b, h, i);
                o.extend_from_slice(&row);
                lse.push(l);
            }
            (b, h, o, lse)
        })
        .collect();
    let mut out = RefOutput {
        o: vec![0.0; total_q * hq * d],
        lse: vec![f64::NEG_INFINITY; total_q * hq],
    };
    for (b, h, o, lse) in parts {
        for (i, l) in lse.into_iter().enumerate() {
            let row = cu_q[b] + i;
            out.lse[row * hq + h] = l;
            out.o[(row * hq + h) * d..][..d].copy_from_slice(&o[i * d..][..d]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{random_matrix, Dist};

    fn params(hq: usize, hkv: usize, d: usize) -> RefParams {
        RefParams {
            window_right: -1,
            ..RefParams::causal(hq, hkv, d)
        }
    }

    fn rand(seed: u64, n: usize) -> Vec<f64> {
        random_matrix(seed, 1, n, n, Dist::Normal { std: 1.0 })
    }

    fn run(q: &[f64], k: &[f64], v: &[f64], cu_q: &[usize], cu_k: &[usize], p: &RefParams) -> RefOutput {
        attention_reference(&RefInputs { q, k, v, cu_q, cu_k }, p)
    }

    /// The textbook formula on a dense score matrix with an explicit `-inf` mask matrix, one
    /// (sequence, head) at a time: `softmax(S + M) V`, where `M[i][j]` comes from `mask(i, j)`.
    #[allow(clippy::too_many_arguments)]
    fn naive(
        q: &[f64],
        k: &[f64],
        v: &[f64],
        nq: usize,
        nk: usize,
        d: usize,
        score: impl Fn(f64) -> f64,
        mask: impl Fn(usize, usize) -> bool,
    ) -> (Vec<f64>, Vec<f64>) {
        let mut o = vec![0.0; nq * d];
        let mut lse = vec![f64::NEG_INFINITY; nq];
        for i in 0..nq {
            let s: Vec<f64> = (0..nk)
                .map(|j| {
                    if mask(i, j) {
                        score((0..d).map(|c| q[i * d + c] * k[j * d + c]).sum())
                    } else {
                        f64::NEG_INFINITY
                    }
                })
                .collect();
            let z: f64 = s.iter().map(|x| x.exp()).sum();
            if z == 0.0 {
                continue;
            }
            lse[i] = z.ln();
            for j in 0..nk {
                let p = s[j].exp() / z;
                for c in 0..d {
                    o[i * d + c] += p * v[j * d + c];
                }
            }
        }
        (o, lse)
    }

    fn assert_close(a: &[f64], b: &[f64], tol: f64) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            let ok = if x.is_finite() { (x - y).abs() <= tol } else { x == y };
            assert!(ok, "element {i}: {x} vs {y}");
        }
    }

    #[test]
    fn hand_computed_case() {
        // One query [1, 0], keys [1, 0] and [0, 1], values [1, 2] and [3, 4], scale 1:
        // scores (1, 0), weights (e, 1) / (e + 1), lse = ln(e + 1).
        let p = RefParams {
            scale: 1.0,
            ..params(1, 1, 2)
        };
        let out = run(
            &[1.0, 0.0],
            &[1.0, 0.0, 0.0, 1.0],
            &[1.0, 2.0, 3.0, 4.0],
            &[0, 1],
            &[0, 2],
            &p,
        );
        let e = std::f64::consts::E;
        let (w0, w1) = (e / (e + 1.0), 1.0 / (e + 1.0));
        assert_close(&out.o, &[w0 + 3.0 * w1, 2.0 * w0 + 4.0 * w1], 1e-15);
        assert_close(&out.lse, &[(e + 1.0).ln()], 1e-15);
    }

    #[test]
    fn matches_naive_formula_unmasked_and_causal() {
        let (nq, nk, d) = (5, 7, 8);
        let (q, k, v) = (rand(1, nq * d), rand(2, nk * d), rand(3, nk * d));
        for (left, right) in [(-1, -1), (-1, 0), (2, 1), (0, 0)] {
            let p = RefParams {
                window_left: left,
                window_right: right,
                ..params(1, 1, d)
            };
            let out = run(&q, &k, &v, &[0, nq], &[0, nk], &p);
            let (o, lse) = naive(
                &q,
                &k,
                &v,
                nq,
                nk,
                d,
                |s| s * p.scale,
                |i, j| {
                    let diag = (i + nk - nq) as i64;
                    (left < 0 || j as i64 >= diag - left) && (right < 0 || j as i64 <= diag + right)
                },
            );
            assert_close(&out.o, &o, 1e-12);
            assert_close(&out.lse, &lse, 1e-12);
        }
    }

    #[test]
    fn causal_alignment_is_bottom_right() {
        // Nq = 2, Nk = 5, causal: query 0 sees keys 0..=3, query 1 sees 0..=4.
        assert!((0..4).all(|j| is_visible(0, j, 2, 5, -1, 0)));
        assert!(!is_visible(0, 4, 2, 5, -1, 0));
        assert!((0..5).all(|j| is_visible(1, j, 2, 5, -1, 0)));
        // Nq = 5 > Nk = 2, causal: queries 0..=2 see nothing, query 3 sees key 0, query 4 both.
        for i in 0..3 {
            assert!((0..2).all(|j| !is_visible(i, j, 5, 2, -1, 0)), "query {i}");
        }
        assert!(is_visible(3, 0, 5, 2, -1, 0) && !is_visible(3, 1, 5, 2, -1, 0));
        assert!(is_visible(4, 1, 5, 2, -1, 0));
        // Window (1, 1) on Nq = Nk = 4: query 2 sees keys 1, 2, 3.
        let seen: Vec<usize> = (0..4).filter(|&j| is_visible(2, j, 4, 4, 1, 1)).collect();
        assert_eq!(seen, vec![1, 2, 3]);
        // Window (0, 0): only the diagonal.
        let seen: Vec<usize> = (0..4).filter(|&j| is_visible(2, j, 4, 4, 0, 0)).collect();
        assert_eq!(seen, vec![2]);
        // Out of range never visible.
        assert!(!is_visible(0, 5, 2, 5, -1, -1) && !is_visible(2, 0, 2, 5, -1, -1));
    }

    #[test]
    fn fully_masked_rows_are_zero_with_minus_inf_lse() {
        let (nq, nk, d) = (5, 2, 4);
        let (q, k, v) = (rand(4, nq * d), rand(5, nk * d), rand(6, nk * d));
        let p = RefParams {
            window_right: 0,
            ..params(1, 1, d)
        };
        let out = run(&q, &k, &v, &[0, nq], &[0, nk], &p);
        for i in 0..3 {
            assert_eq!(out.lse[i], f64::NEG_INFINITY);
            assert!(out.o[i * d..(i + 1) * d].iter().all(|&x| x == 0.0));
        }
        assert!(out.lse[3].is_finite() && out.lse[4].is_finite());
        // Query 3 sees only key 0: its output is v_0 and its LSE the single score.
        assert_close(&out.o[3 * d..4 * d], &v[..d], 1e-15);
        // An empty key sequence masks everything too.
        let out = run(&q[..d], &[], &[], &[0, 1], &[0, 0], &params(1, 1, d));
        assert_eq!(out.lse, vec![f64::NEG_INFINITY]);
        assert!(out.o.iter().all(|&x| x == 0.0));
    }

    #[test]
    fn softcap_matches_naive() {
        let (n, d) = (6, 8);
        let (q, k, v) = (rand(7, n * d), rand(8, n * d), rand(9, n * d));
        // Large q so the cap matters.
        let q: Vec<f64> = q.iter().map(|x| 4.0 * x).collect();
        let p = RefParams {
            softcap: 2.0,
            scale: 0.5,
            ..params(1, 1, d)
        };
        let out = run(&q, &k, &v, &[0, n], &[0, n], &p);
        let (o, lse) = naive(&q, &k, &v, n, n, d, |s| 2.0 * (s * 0.5 / 2.0).tanh(), |_, _| true);
        assert_close(&out.o, &o, 1e-12);
        assert_close(&out.lse, &lse, 1e-12);
        // The cap bounds the scores: lse <= ln(n) + softcap.
        assert!(out.lse.iter().all(|&l| l <= (n as f64).ln() + 2.0 + 1e-12));
    }

    #[test]
    fn gqa_equals_explicit_head_expansion() {
        let (n, d, hq, hkv) = (9, 8, 6, 2);
        let (q, k, v) = (rand(10, n * hq * d), rand(11, n * hkv * d), rand(12, n * hkv * d));
        let group = hq / hkv;
        let expand = |t: &[f64]| {
            let mut e = Vec::with_capacity(n * hq * d);
            for r in 0..n {
                for h in 0..hq {
                    e.extend_from_slice(&t[(r * hkv + h / group) * d..][..d]);
                }
            }
            e
        };
        let gqa = RefParams {
            window_right: 0,
            ..params(hq, hkv, d)
        };
        let mha = RefParams { heads_kv: hq, ..gqa };
        let a = run(&q, &k, &v, &[0, n], &[0, n], &gqa);
        let b = run(&q, &expand(&k), &expand(&v), &[0, n], &[0, n], &mha);
        assert_eq!(a, b);
    }

    #[test]
    fn varlen_matches_per_sequence_runs_including_empty() {
        let (hq, d) = (2, 8);
        let lens_q = [3usize, 0, 5, 1];
        let lens_k = [4usize, 2, 0, 6];
        let cu = |l: &[usize]| {
            let mut c = vec![0];
            for x in l {
                c.push(c.last().unwrap() + x);
            }
            c
        };
        let (cu_q, cu_k) = (cu(&lens_q), cu(&lens_k));
        let (tq, tk) = (cu_q[4], cu_k[4]);
        let (q, k, v) = (rand(13, tq * hq * d), rand(14, tk * hq * d), rand(15, tk * hq * d));
        let p = RefParams {
            window_right: 0,
            ..params(hq, hq, d)
        };
        let all = run(&q, &k, &v, &cu_q, &cu_k, &p);
        assert_eq!(all.o.len(), tq * hq * d);
        for b in 0..4 {
            let (qs, ks) = (
                cu_q[b] * hq * d..cu_q[b + 1] * hq * d,
                cu_k[b] * hq * d..cu_k[b + 1] * hq * d,
            );
            let one = run(
                &q[qs.clone()],
                &k[ks.clone()],
                &v[ks],
                &[0, lens_q[b]],
                &[0, lens_k[b]],
                &p,
            );
            assert_eq!(one.o[..], all.o[qs]);
            assert_eq!(one.lse[..], all.lse[cu_q[b] * hq..cu_q[b + 1] * hq]);
        }
        // Sequence 2 has no keys: all its rows are masked.
        assert!(all.lse[cu_q[2] * hq..cu_q[3] * hq]
            .iter()
            .all(|&l| l == f64::NEG_INFINITY));
    }

    #[test]
    fn row_function_agrees_with_full_reference() {
        let (n, d, hq, hkv) = (7, 8, 4, 1);
        let (q, k, v) = (
            rand(16, 2 * n * hq * d),
            rand(17, 2 * n * hkv * d),
            rand(18, 2 * n * hkv * d),
        );
        let p = params(hq, hkv, d);
        let cu = padded_cu_seqlens(2, n);
        let all = run(&q, &k, &v, &cu, &cu, &p);
        let x = RefInputs {
            q: &q,
            k: &k,
            v: &v,
            cu_q: &cu,
            cu_k: &cu,
        };
        let (o, l) = reference_row(&x, &p, 1, 3, 6);
        let row = n + 6;
        assert_eq!(o[..], all.o[(row * hq + 3) * d..][..d]);
        assert_eq!(l, all.lse[row * hq + 3]);
    }
}
