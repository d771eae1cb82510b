//! [`PlanCache`]: one bounded, least-recently-used cache of plans, generic over the key and the
//! plan type and instantiated once per plan type (softmax, attention, ...) in `cache.rs`.
//!
//! A plan belongs to the stream it was made for (its workspace is used in that stream's order),
//! so every entry is keyed by (device, stream, the plan's own key); the caller's key need not
//! repeat them. Lookups and inserts count hits and misses for [`PlanCache::stats`]; the
//! [`AnyPlanCache`] trait lets `plan_cache_info()` and `clear_plan_cache()` walk every cache
//! without naming each one.
//!
//! Only `std`: the unit tests below run without Python or a GPU with
//! `rustc --edition 2021 --test crates/tessera-py/src/plan_cache.rs -o /tmp/plan_cache && /tmp/plan_cache`
//! (`scripts/test-python.sh` does), since the extension crate itself has no Rust test target.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};

/// A raw `CUstream` as an integer (what torch's `Stream.cuda_stream` gives).
pub type StreamId = u64;

/// Sizes and counters of one cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Plans held now.
    pub len: usize,
    /// Lookups that found a plan.
    pub hits: u64,
    /// Lookups that did not (each is followed by planning, unless planning fails).
    pub misses: u64,
    /// The most plans held; the least recently used goes first.
    pub capacity: usize,
}

/// The full key of an entry: device ordinal, stream, the plan's key.
type Full<K> = (usize, StreamId, K);

struct Lru<K, P> {
    entries: HashMap<Full<K>, (Arc<P>, u64)>,
    /// Bumped by every lookup and insert; an entry's stamp is its last use.
    clock: u64,
    hits: u64,
    misses: u64,
}

impl<K, P> Default for Lru<K, P> {
    fn default() -> Self {
        Lru {
            entries: HashMap::new(),
            clock: 0,
            hits: 0,
            misses: 0,
        }
    }
}

/// A least-recently-used map of at most `capacity` plans of type `P` per (device, stream, `K`).
/// Thread-safe; a `static` (its constructor is `const`).
pub struct PlanCache<K, P> {
    name: &'static str,
    capacity: usize,
    lru: Mutex<Option<Lru<K, P>>>,
}

impl<K: Eq + Hash + Clone, P> PlanCache<K, P> {
    /// An empty cache called `name` (the key of its counts in `plan_cache_info()`) holding at
    /// most `capacity` (>= 1) plans.
    pub const fn new(name: &'static str, capacity: usize) -> Self {
        PlanCache {
            name,
            capacity,
            lru: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Lru<K, P>>> {
        // a panic while holding the lock leaves a consistent map (no invariant spans two steps)
        self.lru.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached plan for `key` on `stream` of `device`, marked as just used.
    pub fn get(&self, device: usize, stream: StreamId, key: &K) -> Option<Arc<P>> {
        let mut guard = self.lock();
        let lru = guard.get_or_insert_with(Lru::default);
        lru.clock += 1;
        let now = lru.clock;
        // the key is cloned for the lookup: plan keys are small (shapes and options)
        match lru.entries.get_mut(&(device, stream, key.clone())) {
            Some((plan, used)) => {
                *used = now;
                lru.hits += 1;
                Some(plan.clone())
            }
            None => {
                lru.misses += 1;
                None
            }
        }
    }

    /// Caches `plan` under `key` on `stream` of `device` and returns it, or the plan another
    /// thread cached there meanwhile (then `plan` is dropped). When full, the least recently
    /// used plan is evicted (and dropped after the lock is released).
    pub fn insert(&self, device: usize, stream: StreamId, key: K, plan: P) -> Arc<P> {
        let full = (device, stream, key);
        let mut guard = self.lock();
        let lru = guard.get_or_insert_with(Lru::default);
        lru.clock += 1;
        let now = lru.clock;
        if let Some((p, used)) = lru.entries.get_mut(&full) {
            *used = now;
            return p.clone();
        }
        let mut evicted = None;
        if lru.entries.len() >= self.capacity.max(1) {
            if let Some(oldest) = lru
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
            {
                evicted = lru.entries.remove(&oldest);
            }
        }
        let plan = Arc::new(plan);
        lru.entries.insert(full, (plan.clone(), now));
        drop(guard);
        drop(evicted);
        plan
    }

    /// The plan for `key` on `stream` of `device`: the cached one, or one made by `make` (called
    /// without the lock held: planning may compile kernels for seconds) and cached. A failed
    /// `make` caches nothing.
    pub fn get_or_make<E>(
        &self,
        device: usize,
        stream: StreamId,
        key: K,
        make: impl FnOnce() -> Result<P, E>,
    ) -> Result<Arc<P>, E> {
        if let Some(p) = self.get(device, stream, &key) {
            return Ok(p);
        }
        let plan = make()?;
        Ok(self.insert(device, stream, key, plan))
    }
}

/// What `plan_cache_info()` and `clear_plan_cache()` need of any [`PlanCache`].
pub trait AnyPlanCache: Sync {
    /// The cache's name (`"softmax"`, `"attention"`, ...).
    fn name(&self) -> &'static str;
    /// Its size and counters.
    fn stats(&self) -> CacheStats;
    /// Drops every plan (after releasing the lock); the counters stay.
    fn clear(&self);
}

impl<K: Eq + Hash + Clone + Send, P: Send + Sync> AnyPlanCache for PlanCache<K, P> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn stats(&self) -> CacheStats {
        let guard = self.lock();
        let (len, hits, misses) = guard
            .as_ref()
            .map_or((0, 0, 0), |l| (l.entries.len(), l.hits, l.misses));
        CacheStats {
            len,
            hits,
            misses,
            capacity: self.capacity,
        }
    }

    fn clear(&self) {
        let mut guard = self.lock();
        let entries = guard.as_mut().map(|l| std::mem::take(&mut l.entries));
        drop(guard);
        drop(entries);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A plan that counts its drops.
    struct Plan(u32, &'static AtomicUsize);
    impl Drop for Plan {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn ok(p: Plan) -> impl FnOnce() -> Result<Plan, ()> {
        move || Ok(p)
    }

    #[test]
    fn hits_misses_and_lru_eviction() {
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        let c: PlanCache<u32, Plan> = PlanCache::new("t", 2);
        assert_eq!(
            c.stats(),
            CacheStats {
                len: 0,
                hits: 0,
                misses: 0,
                capacity: 2
            }
        );
        assert_eq!(c.get_or_make(0, 7, 1, ok(Plan(1, &DROPS))).unwrap().0, 1);
        assert_eq!(c.get_or_make(0, 7, 2, ok(Plan(2, &DROPS))).unwrap().0, 2);
        // a hit does not call make
        assert_eq!(
            c.get_or_make(0, 7, 1, || -> Result<Plan, ()> { panic!("cached") })
                .unwrap()
                .0,
            1
        );
        assert_eq!(
            c.stats(),
            CacheStats {
                len: 2,
                hits: 1,
                misses: 2,
                capacity: 2
            }
        );
        // full: 2 is the least recently used (1 was just used)
        c.get_or_make(0, 7, 3, ok(Plan(3, &DROPS))).unwrap();
        assert_eq!(DROPS.load(Ordering::SeqCst), 1);
        assert!(c.get(0, 7, &2).is_none());
        assert!(c.get(0, 7, &1).is_some() && c.get(0, 7, &3).is_some());
        assert_eq!(c.stats().len, 2);
        // a failed make caches nothing
        assert_eq!(c.get_or_make(0, 7, 4, || Err("no")).err(), Some("no"));
        assert_eq!(c.stats().len, 2);
        c.clear();
        assert_eq!(DROPS.load(Ordering::SeqCst), 3);
        let s = c.stats();
        assert_eq!((s.len, s.capacity), (0, 2));
        assert!(s.hits > 0 && s.misses > 0, "clear keeps the counters");
    }

    #[test]
    fn entries_are_per_device_and_stream() {
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        let c: PlanCache<&'static str, Plan> = PlanCache::new("t", 64);
        c.get_or_make(0, 1, "k", ok(Plan(1, &DROPS))).unwrap();
        c.get_or_make(0, 2, "k", ok(Plan(2, &DROPS))).unwrap();
        c.get_or_make(1, 1, "k", ok(Plan(3, &DROPS))).unwrap();
        assert_eq!(c.stats().len, 3);
        assert_eq!(c.get(0, 2, &"k").unwrap().0, 2);
        assert_eq!(c.get(1, 1, &"k").unwrap().0, 3);
        assert!(c.get(1, 2, &"k").is_none());
    }

    #[test]
    fn a_racing_insert_keeps_the_first_plan() {
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        let c: PlanCache<u8, Plan> = PlanCache::new("t", 4);
        let first = c.insert(0, 0, 9, Plan(1, &DROPS));
        let second = c.insert(0, 0, 9, Plan(2, &DROPS));
        assert!(Arc::ptr_eq(&first, &second) && second.0 == 1);
        assert_eq!(DROPS.load(Ordering::SeqCst), 1, "the loser is dropped");
    }

    #[test]
    fn caches_walk_as_trait_objects() {
        static A: PlanCache<u8, u8> = PlanCache::new("a", 64);
        static B: PlanCache<(u8, bool), String> = PlanCache::new("b", 64);
        static ALL: [&dyn AnyPlanCache; 2] = [&A, &B];
        A.get_or_make(0, 0, 1, || Ok::<_, ()>(5)).unwrap();
        B.get_or_make(0, 0, (1, true), || Ok::<_, ()>("x".into())).unwrap();
        let names: Vec<_> = ALL.iter().map(|c| (c.name(), c.stats().len)).collect();
        assert_eq!(names, [("a", 1), ("b", 1)]);
        ALL.iter().for_each(|c| c.clear());
        assert!(ALL.iter().all(|c| c.stats().len == 0));
    }
}
