//! A host model of the merge-path SpMV (`spmv_merge.cu`): the kernels' searches, staging bounds,
//! per-thread walks, shared-memory carries, per-CTA carry-outs and the fixup, step for step on the
//! CPU, over row-length vectors of every kind (empty rows, all empty, one row, rows spanning many
//! CTAs, rows ending exactly on tile and thread boundaries, no rows) and over the kernel's geometry
//! (7 x 256) and tiny ones (where every row spans threads and CTAs). It checks that every merge
//! item is consumed exactly once and in merge order by the thread the search gives it to, that
//! the shared-memory search agrees with the global one, that the staged tile fits the kernel's
//! buffer, that every row is written exactly once, that the sums reproduce an f64 CSR reference,
//! and that the result does not depend on the order the CTAs and threads run in (bitwise).

use std::ops::Add;

use super::spmv_merge::{merge_ctas, BLOCK_THREADS, ITEMS_PER_THREAD, TILE_ITEMS};

/// One item of the merge list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Item {
    RowEnd(usize),
    Nonzero(usize),
}

/// The merge list by a plain sequential merge: the definition the model is checked against.
fn merge_list(offsets: &[usize]) -> Vec<Item> {
    let mut out = Vec::new();
    let mut j = 0;
    for r in 0..offsets.len() - 1 {
        while j < offsets[r + 1] {
            out.push(Item::Nonzero(j));
            j += 1;
        }
        out.push(Item::RowEnd(r));
    }
    out
}

/// `path_row` of the kernel: the row ends before item `d`.
fn path_row(offsets: &[usize], d: usize) -> usize {
    let rows = offsets.len() - 1;
    let nnz = offsets[rows];
    let (mut lo, mut hi) = (d.saturating_sub(nnz), d.min(rows));
    while lo < hi {
        let mid = (lo + hi) / 2;
        if offsets[mid + 1] + mid < d {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// `tile_path_row` of the kernel: the same search on a tile's staged row ends (int, relative to
/// the tile's first nonzero).
fn tile_path_row(end: &[i32], rows_in: usize, nnz_in: usize, d: usize) -> usize {
    let (mut lo, mut hi) = (d.saturating_sub(nnz_in), d.min(rows_in));
    while lo < hi {
        let mid = (lo + hi) / 2;
        if end[mid] as i64 + (mid as i64) < d as i64 {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The accumulate type (f32 for the bitwise checks, f64 for the accuracy ones).
trait Acc: Copy + Default + Add<Output = Self> + std::fmt::Debug {
    fn bits(self) -> u64;
    fn f64(self) -> f64;
}
impl Acc for f32 {
    fn bits(self) -> u64 {
        self.to_bits() as u64
    }
    fn f64(self) -> f64 {
        self as f64
    }
}
impl Acc for f64 {
    fn bits(self) -> u64 {
        self.to_bits()
    }
    fn f64(self) -> f64 {
        self
    }
}

/// Items per thread and threads per CTA.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    items: usize,
    threads: usize,
}

impl Geometry {
    fn tile(&self) -> usize {
        self.items * self.threads
    }
}

/// The kernel's geometry and tiny ones.
const GEOMETRIES: [Geometry; 4] = [
    Geometry {
        items: ITEMS_PER_THREAD as usize,
        threads: BLOCK_THREADS as usize,
    },
    Geometry { items: 3, threads: 4 },
    Geometry { items: 2, threads: 3 },
    Geometry { items: 1, threads: 1 },
];

/// `run_sum` of the kernel.
fn run_sum<A: Acc>(carry: &[A], has_end: &[bool], last: usize) -> A {
    let mut first = last;
    while first > 0 && !has_end[first] {
        first -= 1;
    }
    let mut s = carry[first];
    for c in &carry[first + 1..=last] {
        s = s + *c;
    }
    s
}

/// What the model's run produced.
struct Model<A> {
    /// The row sums as written (alpha = 1, beta = 0).
    y: Vec<A>,
    /// Writes per row.
    writes: Vec<u32>,
    /// Consumptions per merge item.
    consumed: Vec<u32>,
    /// The CTAs' carry rows (-1: none).
    carry_row: Vec<i64>,
}

/// A small deterministic generator (splitmix64).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// `0..n` in an order of this generator (identity when `None`).
    fn order(rng: &mut Option<Rng>, n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        if let Some(r) = rng {
            for i in (1..n).rev() {
                v.swap(i, r.below(i + 1));
            }
        }
        v
    }
}

/// Runs both kernels on the host for a matrix of row pointer `offsets` whose nonzeros'
/// products values[j] * x[indices[j]] are `prods`, CTAs and threads in the order `shuffle`
/// draws (in order without one).
fn simulate<A: Acc>(offsets: &[usize], prods: &[A], g: Geometry, mut shuffle: Option<Rng>) -> Model<A> {
    let rows = offsets.len() - 1;
    let nnz = offsets[rows];
    let total = rows + nnz;
    let tile = g.tile();
    let ctas = total.div_ceil(tile);
    let list = merge_list(offsets);
    assert_eq!(list.len(), total);
    let mut m = Model {
        y: vec![A::default(); rows],
        writes: vec![0; rows],
        consumed: vec![0; total],
        carry_row: vec![i64::MIN; ctas],
    };
    let mut carry_sum = vec![A::default(); ctas];
    let mut head_sum: Vec<Option<A>> = vec![None; ctas];
    let write = |m: &mut Model<A>, row: usize, v: A| {
        m.y[row] = v;
        m.writes[row] += 1;
    };

    for b in Rng::order(&mut shuffle, ctas) {
        // 1. the tile's points
        let d0 = b * tile;
        let d1 = (d0 + tile).min(total);
        let (i0, i1) = (path_row(offsets, d0), path_row(offsets, d1));
        let (j0, j1) = (d0 - i0, d1 - i1);
        let (rows_in, nnz_in, items) = (i1 - i0, j1 - j0, d1 - d0);
        // 2. staging: row ends as ints relative to j0 (in 0..=nnz_in), then products; both fit
        //    the kernel's buffer (row ends padded to 8 bytes) for 4- and 8-byte Acc
        let end: Vec<i32> = (0..rows_in).map(|e| (offsets[i0 + 1 + e] - j0) as i32).collect();
        assert!(end.iter().all(|&e| e >= 0 && e as usize <= nnz_in));
        for slot in [4usize, 8] {
            assert!(rows_in.div_ceil(2) * 8 + nnz_in * slot <= tile * slot + 8);
        }
        let prod = &prods[j0..j1];

        // 3. each thread's walk (in any order: they share nothing until the barrier)
        let mut carry = vec![A::default(); g.threads];
        let mut has_end = vec![false; g.threads];
        let mut first: Vec<Option<(usize, A)>> = vec![None; g.threads];
        for t in Rng::order(&mut shuffle, g.threads) {
            let d = (t * g.items).min(items);
            let mut k = tile_path_row(&end, rows_in, nnz_in, d);
            assert_eq!(i0 + k, path_row(offsets, d0 + d), "tile search = global search");
            let mut jl = d - k;
            let mut sum = A::default();
            for it in 0..g.items {
                if d + it >= items {
                    continue;
                }
                let at = d0 + d + it;
                m.consumed[at] += 1;
                if k < rows_in && end[k] as usize <= jl {
                    assert_eq!(list[at], Item::RowEnd(i0 + k), "item {at}");
                    if first[t].is_none() {
                        first[t] = Some((k, sum));
                    } else {
                        write(&mut m, i0 + k, sum);
                    }
                    sum = A::default();
                    k += 1;
                } else {
                    assert!(jl < nnz_in, "a nonzero past the tile's");
                    assert_eq!(list[at], Item::Nonzero(j0 + jl), "item {at}");
                    sum = sum + prod[jl];
                    jl += 1;
                }
            }
            // the walk ends where the next thread's search starts
            let next = (d + g.items).min(items);
            assert_eq!(
                (i0 + k, j0 + jl),
                (path_row(offsets, d0 + next), d0 + next - path_row(offsets, d0 + next))
            );
            carry[t] = sum;
            has_end[t] = first[t].is_some();
        }
        // 4. after the barrier: first row ends, then the carry-out
        for t in Rng::order(&mut shuffle, g.threads) {
            if let Some((k, first_sum)) = first[t] {
                let row_sum = if t > 0 {
                    run_sum(&carry, &has_end, t - 1) + first_sum
                } else {
                    first_sum
                };
                if k == 0 && j0 > offsets[i0] {
                    assert!(head_sum[b].is_none());
                    head_sum[b] = Some(row_sum);
                } else {
                    write(&mut m, i0 + k, row_sum);
                }
            }
            if t == g.threads - 1 {
                let inside = j1 > offsets[i1];
                m.carry_row[b] = if inside { i1 as i64 } else { -1 };
                carry_sum[b] = if inside {
                    run_sum(&carry, &has_end, t)
                } else {
                    A::default()
                };
            }
        }
    }
    // the fixup: one thread per CTA carry
    for b in Rng::order(&mut shuffle, ctas) {
        let r = m.carry_row[b];
        if r < 0 || (b > 0 && m.carry_row[b - 1] == r) {
            continue;
        }
        let mut s = carry_sum[b];
        let mut e = b + 1;
        while e < ctas && m.carry_row[e] == r {
            s = s + carry_sum[e];
            e += 1;
        }
        assert!(e < ctas, "a run of carries up to the last CTA");
        s = s + head_sum[e].expect("the CTA that ends a carried row wrote its head");
        write(&mut m, r as usize, s);
    }
    if ctas > 0 {
        assert_eq!(m.carry_row[ctas - 1], -1, "the last tile ends on the last row end");
    }
    m
}

fn offsets_of(lengths: &[usize]) -> Vec<usize> {
    let mut o = vec![0];
    for &l in lengths {
        o.push(o.last().unwrap() + l);
    }
    o
}

/// Row-length vectors of every kind the kernel must handle.
fn row_length_cases() -> Vec<(&'static str, Vec<usize>)> {
    let mut rng = Rng(0x6d_6572_6765);
    let tile = TILE_ITEMS;
    let mut power_law: Vec<usize> = (0..4000)
        .map(|_| ((2.0 / (rng.unit() + 1e-3).powf(0.8)) as usize).min(3000))
        .collect();
    power_law[1234] = 20_000; // spans about 11 tiles of the kernel
    power_law.extend([0, 0, 0]);
    vec![
        ("no rows", vec![]),
        ("one empty row", vec![0]),
        ("one row of one", vec![1]),
        ("one row over three tiles", vec![5000]),
        ("one row filling a tile", vec![tile - 1]),
        ("rows ending on tile ends", vec![tile - 1, tile - 1, 0, tile - 2, 1]),
        ("all empty", vec![0; 5000]),
        (
            "empty rows, 30%",
            (0..3000)
                .map(|_| if rng.below(10) < 3 { 0 } else { 1 + rng.below(40) })
                .collect(),
        ),
        ("power law with a huge row", power_law),
        (
            "huge rows between empty ones",
            vec![0, 9000, 0, 0, 4000, 1, 0, 12000, 0],
        ),
        ("rows of 6", vec![6; 700]),
        ("rows of 7", vec![7; 700]),
        ("rows of 8", vec![8; 700]),
    ]
}

#[test]
fn merge_path_covers_every_item_once_and_writes_every_row_once() {
    for (name, lengths) in row_length_cases() {
        let offsets = offsets_of(&lengths);
        let nnz = offsets[lengths.len()];
        let mut rng = Rng(nnz as u64 ^ 0x5eed);
        let prods: Vec<f64> = (0..nnz).map(|_| rng.unit() - 0.5).collect();
        for g in GEOMETRIES {
            let m = simulate(&offsets, &prods, g, None);
            assert!(m.consumed.iter().all(|&c| c == 1), "{name} {g:?}: items consumed once");
            assert!(m.writes.iter().all(|&w| w == 1), "{name} {g:?}: rows written once");
            // the f64 CSR reference, row by row in stored order
            for (r, w) in offsets.windows(2).enumerate() {
                let want: f64 = prods[w[0]..w[1]].iter().sum();
                let scale: f64 = prods[w[0]..w[1]].iter().map(|p| p.abs()).sum();
                assert!(
                    (m.y[r] - want).abs() <= 1e-13 * scale,
                    "{name} {g:?} row {r}: {} vs {want}",
                    m.y[r]
                );
            }
        }
    }
}

#[test]
fn merge_path_geometry_matches_the_plan() {
    for (name, lengths) in row_length_cases() {
        let offsets = offsets_of(&lengths);
        let m = simulate(&offsets, &vec![1.0f64; offsets[lengths.len()]], GEOMETRIES[0], None);
        assert_eq!(
            m.carry_row.len(),
            merge_ctas(lengths.len(), offsets[lengths.len()]),
            "{name}: one carry slot per CTA"
        );
    }
}

#[test]
fn rows_spanning_ctas_are_carried() {
    // the cases meant to exercise the carries do: runs of several CTAs in one row (the huge
    // rows), and CTAs that end one carried row and carry the next
    let cases = row_length_cases();
    let get = |n: &str| &cases.iter().find(|(name, _)| *name == n).unwrap().1;
    let offsets = offsets_of(get("huge rows between empty ones"));
    let m = simulate(&offsets, &vec![1.0f64; offsets[offsets.len() - 1]], GEOMETRIES[0], None);
    let same_row_pairs = m.carry_row.windows(2).filter(|w| w[0] >= 0 && w[0] == w[1]).count();
    assert!(same_row_pairs >= 5, "{:?}", m.carry_row);
    // row 7 is carried out of exactly the tiles whose last item lies in (its first nonzero's
    // item, its row end's item]
    let (first_item, end_item) = (offsets[7] + 7, offsets[8] + 7);
    let tiles_ending_inside = (1..=m.carry_row.len())
        .filter(|&b| b * TILE_ITEMS > first_item && b * TILE_ITEMS <= end_item)
        .count();
    assert!(tiles_ending_inside >= 6);
    assert_eq!(m.carry_row.iter().filter(|&&r| r == 7).count(), tiles_ending_inside);
    let offsets = offsets_of(get("rows of 8"));
    let m = simulate(&offsets, &vec![1.0f64; offsets[offsets.len() - 1]], GEOMETRIES[1], None);
    assert!(m.carry_row.windows(2).any(|w| w[0] >= 0 && w[1] >= 0 && w[0] != w[1]));
    // a tile that ends exactly on a row end carries nothing
    let offsets = offsets_of(get("rows ending on tile ends"));
    let m = simulate(&offsets, &vec![1.0f64; offsets[offsets.len() - 1]], GEOMETRIES[0], None);
    assert_eq!(m.carry_row[0], -1);
}

#[test]
fn merge_path_is_bitwise_independent_of_execution_order() {
    for (name, lengths) in row_length_cases() {
        let offsets = offsets_of(&lengths);
        let nnz = offsets[lengths.len()];
        let mut rng = Rng(nnz as u64 ^ 0xf32);
        // f32 products of mixed magnitude, so a different summation order would show
        let prods: Vec<f32> = (0..nnz)
            .map(|_| ((rng.unit() - 0.5) * 10f64.powi(rng.below(7) as i32 - 3)) as f32)
            .collect();
        for g in GEOMETRIES {
            let bits = |m: Model<f32>| m.y.iter().map(|v| v.bits()).collect::<Vec<_>>();
            let in_order = bits(simulate(&offsets, &prods, g, None));
            assert_eq!(in_order, bits(simulate(&offsets, &prods, g, None)), "{name} {g:?}");
            for seed in 1..4 {
                let shuffled = bits(simulate(&offsets, &prods, g, Some(Rng(seed))));
                assert_eq!(in_order, shuffled, "{name} {g:?}: order {seed}");
            }
            // and f32 sums stay close to the f64 row sums
            let m = simulate(&offsets, &prods, g, None);
            for (r, w) in offsets.windows(2).enumerate() {
                let want: f64 = prods[w[0]..w[1]].iter().map(|&p| p as f64).sum();
                let scale: f64 = prods[w[0]..w[1]].iter().map(|p| p.abs() as f64).sum();
                assert!((m.y[r].f64() - want).abs() <= 1e-5 * scale, "{name} {g:?} row {r}");
            }
        }
    }
}
