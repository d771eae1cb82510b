//! The workload of `serve-sim`: requests with Poisson arrivals, log-uniform prompt lengths and
//! shared system prompts, and the default arrival rate and page pool sized from them.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// Share of a full batch's peak page demand the default pool holds (so that pages run out:
/// cached pages are evicted and sequences preempted).
pub const DEFAULT_PAGE_SHARE: f64 = 0.4;
/// The default arrival rate is this factor times the rate that keeps `--max-batch` sequences
/// running (Little's law with the mean generation length as the service time in steps).
pub const DEFAULT_ARRIVAL_FACTOR: f64 = 1.25;

/// An inclusive range of lengths, `LO..HI` on the command line (a single number `N` is `N..N`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LenRange {
    pub lo: usize,
    pub hi: usize,
}

impl std::fmt::Display for LenRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..{}", self.lo, self.hi)
    }
}

/// Parses `LO..HI` (inclusive; `LO..=HI` is accepted too) or `N`.
pub fn parse_range(s: &str) -> Result<LenRange, String> {
    let num = |x: &str| {
        x.trim()
            .parse::<usize>()
            .map_err(|_| format!("`{x}` is not a length (expected LO..HI, e.g. 128..4096)"))
    };
    let (lo, hi) = match s.split_once("..") {
        Some((a, b)) => (num(a)?, num(b.strip_prefix('=').unwrap_or(b))?),
        None => {
            let n = num(s)?;
            (n, n)
        }
    };
    if lo == 0 || lo > hi {
        return Err(format!("range {s}: needs 1 <= LO <= HI"));
    }
    Ok(LenRange { lo, hi })
}

/// What the workload generator draws from.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadSpec {
    pub requests: usize,
    pub prompt_len: LenRange,
    pub gen_len: LenRange,
    pub shared_prefixes: usize,
    pub prefix_len: usize,
    pub shared_fraction: f64,
    /// Mean arrivals per step.
    pub arrival_rate: f64,
    pub seed: u64,
}

impl WorkloadSpec {
    /// Checks the ranges; errors name the option.
    pub fn validate(&self) -> Result<(), String> {
        if self.requests == 0 {
            return Err("--requests must be at least 1".into());
        }
        for (name, r) in [("--prompt-len", self.prompt_len), ("--gen-len", self.gen_len)] {
            if r.lo == 0 || r.lo > r.hi {
                return Err(format!("{name} {r}: needs 1 <= LO <= HI"));
            }
        }
        if !(0.0..=1.0).contains(&self.shared_fraction) {
            return Err(format!("--shared-fraction {} must be in 0..=1", self.shared_fraction));
        }
        if self.uses_prefixes() && (self.prefix_len == 0 || self.prefix_len >= self.prompt_len.hi) {
            return Err(format!(
                "--prefix-len {} must be in 1..{} (shorter than the longest prompt, {})",
                self.prefix_len, self.prompt_len.hi, self.prompt_len
            ));
        }
        if !(self.arrival_rate.is_finite() && self.arrival_rate > 0.0) {
            return Err(format!("--arrival {} must be finite and > 0", self.arrival_rate));
        }
        Ok(())
    }
    fn uses_prefixes(&self) -> bool {
        self.shared_prefixes > 0 && self.shared_fraction > 0.0
    }
}

/// One request of the workload.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// The step at which it arrives (non-decreasing over the requests).
    pub arrival_step: u64,
    /// Token ids; with a system prompt, its ids come first.
    pub prompt: Vec<u32>,
    /// Tokens to generate (decode steps).
    pub gen_len: usize,
    /// The system prompt it starts with.
    pub prefix: Option<usize>,
}

/// The generated requests and the system prompts they share.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    pub system_prompts: Vec<Vec<u32>>,
    pub requests: Vec<Request>,
}

impl Workload {
    /// Tokens a request holds at its end (prompt + generated).
    pub fn peak_tokens(r: &Request) -> usize {
        r.prompt.len() + r.gen_len
    }
}

/// Log-uniform integer in `lo..=hi`.
fn log_uniform(rng: &mut StdRng, lo: usize, hi: usize) -> usize {
    let (a, b) = ((lo as f64).ln(), ((hi + 1) as f64).ln());
    ((a + rng.random::<f64>() * (b - a)).exp().floor() as usize).clamp(lo, hi)
}

/// Draws the requests: prompt lengths log-uniform in `prompt_len`, generation lengths uniform
/// in `gen_len`, token ids uniform `u32`; with probability `shared_fraction` a prompt starts
/// with one of the `shared_prefixes` system prompts (chosen uniformly; its length is then drawn
/// from `max(lo, prefix_len + 1)..=hi`, so a user part always follows); arrival steps from a
/// Poisson process of `arrival_rate` per step (the first request arrives at step 0).
pub fn generate_workload(spec: &WorkloadSpec) -> Result<Workload, String> {
    spec.validate()?;
    let mut rng = StdRng::seed_from_u64(spec.seed ^ 0x7365_7276_655f_7369);
    let system_prompts: Vec<Vec<u32>> = if spec.uses_prefixes() {
        (0..spec.shared_prefixes)
            .map(|_| (0..spec.prefix_len).map(|_| rng.random()).collect())
            .collect()
    } else {
        Vec::new()
    };
    let mut t = 0.0f64;
    let mut requests = Vec::with_capacity(spec.requests);
    for i in 0..spec.requests {
        if i > 0 {
            // exponential inter-arrival times: a Poisson process of arrival_rate per step
            t += -(1.0 - rng.random::<f64>()).ln() / spec.arrival_rate;
        }
        let prefix = (!system_prompts.is_empty() && rng.random::<f64>() < spec.shared_fraction)
            .then(|| rng.random_range(0..system_prompts.len()));
        let prompt = match prefix {
            Some(p) => {
                let len = log_uniform(
                    &mut rng,
                    spec.prompt_len.lo.max(spec.prefix_len + 1),
                    spec.prompt_len.hi,
                );
                let mut v = system_prompts[p].clone();
                v.extend((spec.prefix_len..len).map(|_| rng.random::<u32>()));
                v
            }
            None => {
                let len = log_uniform(&mut rng, spec.prompt_len.lo, spec.prompt_len.hi);
                (0..len).map(|_| rng.random()).collect()
            }
        };
        let gen_len = rng.random_range(spec.gen_len.lo..=spec.gen_len.hi);
        requests.push(Request {
            arrival_step: t.floor() as u64,
            prompt,
            gen_len,
            prefix,
        });
    }
    Ok(Workload {
        system_prompts,
        requests,
    })
}

/// The default arrival rate for a batch of `max_batch` (see [`DEFAULT_ARRIVAL_FACTOR`]).
pub fn default_arrival_rate(max_batch: usize, gen_len: LenRange) -> f64 {
    let mean_gen = (gen_len.lo + gen_len.hi) as f64 / 2.0;
    DEFAULT_ARRIVAL_FACTOR * max_batch as f64 / mean_gen.max(1.0)
}

/// Pages of the largest request at its end.
pub fn largest_request_pages(w: &Workload, page_size: usize) -> usize {
    w.requests
        .iter()
        .map(|r| Workload::peak_tokens(r).div_ceil(page_size))
        .max()
        .unwrap_or(1)
}

/// The default pool: [`DEFAULT_PAGE_SHARE`] of `min(max_batch, requests)` times the mean
/// pages of a request at its end, and at least the largest request's pages. Returns
/// `(pages, full-batch peak)`.
pub fn default_pages(w: &Workload, max_batch: usize, page_size: usize) -> (usize, usize) {
    let n = w.requests.len().max(1);
    let mean = w
        .requests
        .iter()
        .map(|r| Workload::peak_tokens(r).div_ceil(page_size))
        .sum::<usize>() as f64
        / n as f64;
    let peak = (mean * max_batch.min(n) as f64).ceil() as usize;
    let pages = ((peak as f64 * DEFAULT_PAGE_SHARE).ceil() as usize).max(largest_request_pages(w, page_size));
    (pages, peak)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve_sim::fixtures::{sched_cfg, spec};
    use crate::serve_sim::scheduler::{SchedConfig, Scheduler};

    #[test]
    fn shared_prefixes_share_token_ids_exactly() {
        let w = generate_workload(&spec(400, 7)).unwrap();
        assert_eq!(w.system_prompts.len(), 3);
        let mut per_prefix = [0usize; 3];
        for r in &w.requests {
            if let Some(p) = r.prefix {
                assert!(r.prompt.len() > 128, "a user part follows the system prompt");
                assert_eq!(&r.prompt[..128], &w.system_prompts[p][..]);
                per_prefix[p] += 1;
            }
        }
        // every system prompt is used, and the shared share is near 60%
        assert!(per_prefix.iter().all(|&n| n > 50), "{per_prefix:?}");
        let shared: usize = per_prefix.iter().sum();
        assert!((200..=280).contains(&shared), "{shared} of 400 shared");
        // distinct system prompts, and unshared prompts do not start with one
        assert_ne!(w.system_prompts[0], w.system_prompts[1]);
        for r in w
            .requests
            .iter()
            .filter(|r| r.prefix.is_none() && r.prompt.len() >= 128)
        {
            assert!(w.system_prompts.iter().all(|s| r.prompt[..128] != s[..]));
        }
    }

    #[test]
    fn lengths_and_arrivals_in_range() {
        let s = spec(500, 11);
        let w = generate_workload(&s).unwrap();
        assert_eq!(w.requests.len(), 500);
        let mut short = 0;
        for r in &w.requests {
            assert!((s.prompt_len.lo..=s.prompt_len.hi).contains(&r.prompt.len()));
            assert!((s.gen_len.lo..=s.gen_len.hi).contains(&r.gen_len));
            short += (r.prompt.len() < 181) as usize; // log-uniform: half the unshared ones
        }
        assert!(short > 60, "log-uniform lengths: {short} short prompts");
        assert_eq!(w.requests[0].arrival_step, 0);
        assert!(w.requests.windows(2).all(|p| p[0].arrival_step <= p[1].arrival_step));
        // 500 arrivals at 1 per step take about 500 steps
        let last = w.requests[499].arrival_step;
        assert!((400..600).contains(&last), "last arrival at step {last}");
        // deterministic in the seed
        assert_eq!(generate_workload(&s).unwrap(), w);
        assert_ne!(generate_workload(&spec(500, 12)).unwrap(), w);
    }

    #[test]
    fn bad_workload_options_are_rejected() {
        let mut s = spec(10, 1);
        s.prefix_len = 1024;
        assert!(generate_workload(&s).unwrap_err().contains("--prefix-len"));
        let mut s = spec(10, 1);
        s.arrival_rate = 0.0;
        assert!(generate_workload(&s).is_err());
        let mut s = spec(0, 1);
        s.requests = 0;
        assert!(generate_workload(&s).is_err());
        // no prefixes: any prefix length goes
        let mut s = spec(10, 1);
        s.shared_prefixes = 0;
        s.prefix_len = 5000;
        let w = generate_workload(&s).unwrap();
        assert!(w.system_prompts.is_empty() && w.requests.iter().all(|r| r.prefix.is_none()));
    }

    #[test]
    fn default_pages_hold_the_largest_request() {
        let w = generate_workload(&spec(50, 3)).unwrap();
        let (pages, peak) = default_pages(&w, 16, 16);
        assert!(pages >= largest_request_pages(&w, 16));
        assert!(pages < peak, "{pages} of {peak}");
        let cfg = SchedConfig {
            num_pages: largest_request_pages(&w, 16) - 1,
            ..sched_cfg(&w, 16, None, 3)
        };
        assert!(Scheduler::new(cfg, &w).is_err());
    }
}
