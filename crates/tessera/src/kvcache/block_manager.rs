//! Host-side block manager of the paged KV cache: which physical page holds which tokens of
//! which sequence.
//!
//! # Model
//!
//! The device holds a pool of `P` physical pages ([`BlockManagerConfig::num_pages`]), each with
//! room for the K/V of `T` tokens ([`BlockManagerConfig::page_size`], a power of two from 8 to
//! 256, default 16). Every live sequence has a *block table* mapping its logical pages to
//! physical ones: logical token `t` lives in page `table[t / T]` at offset `t % T`, and a
//! sequence of `len` tokens holds exactly `ceil(len / T)` pages. The tables are what the paged
//! attention kernels read.
//!
//! A sequence is created by [`BlockManager::allocate`] (prefill), grows by one token per decode
//! step ([`BlockManager::append_token`]) or by chunks ([`BlockManager::append_tokens`]), may be
//! cut back ([`BlockManager::truncate`], for rejected speculative tokens) and is released by
//! [`BlockManager::free`]. [`BlockManager::fork`] makes a child that shares every page of its
//! parent (beam search, parallel sampling). Pages carry reference counts: one per (sequence,
//! table slot) that points at them.
//!
//! ## Prefix caching
//!
//! A page that is full is identified by a chained hash: SHA-256 (truncated to 128 bits) of the
//! hash of the page before it (a fixed seed for page 0) and its `T` token ids, so the hash of a
//! page names everything up to its end. When a page fills up (during prefill or decode) it is
//! *registered* under that hash. [`BlockManager::allocate`] looks the prompt's full pages up in
//! order and maps every hit to the same physical page, so requests that share a prompt prefix
//! share its K/V; [`Allocation::cached_tokens`] tells the caller which prompt tokens need no
//! prefill. Only pages strictly before the page holding the prompt's last token are shared, so
//! at least the last token is always recomputed (its logits are needed).
//!
//! A hash hit is never trusted alone: the registered page's stored token ids must equal the
//! prompt's, and its parent must be exactly the page matched just before it (each registration
//! carries a unique id, and the entry stores its parent's). A hash collision, however unlikely,
//! therefore costs a missed share but can never map wrong K/V. When two sequences fill pages
//! with the same content independently, the first registered page stays the shared one; the
//! pages are not merged. A registered page whose parent registration has ended (its parent was
//! evicted) can no longer be reached; it is freed instead of cached when released, and
//! replaced when the same content is registered again.
//!
//! When the last reference to a registered page goes away the page stays *cached* (reference
//! count 0, content intact) in a least-recently-used list and a later hit revives it. Pages are
//! taken from the free list first and then by evicting the least recently used cached page.
//! Every page is exactly one of *free*, *cached* or *used* (`used + free + cached == P`).
//!
//! ## Copy-on-write
//!
//! Appending into a last page that other sequences share (after a fork, or after truncating
//! into a shared page) first moves the writer onto a fresh page: the call returns a
//! [`PageCopy`] `{ src, dst }` and the caller must copy the K/V of page `src` to page `dst` on
//! the device (at least the first `len % T` token slots) before writing the new tokens. Pages
//! matched by prefix caching are full and never written.
//!
//! ## Failure
//!
//! Every mutating call first works out how many pages it needs. When they cannot be found among
//! the free and evictable cached pages it returns [`Error::OutOfPages`] and changes nothing; the
//! caller preempts a sequence and retries. Bad input (unknown or duplicate sequence id, empty
//! prompt, ...) returns [`Error::InvalidArgument`], also without changing anything.
//!
//! ## Cost
//!
//! `append_token` is O(1) amortised (plus one SHA-256 of `4 T + 16` bytes when a page fills);
//! `allocate` is O(prompt length); `fork` is O(length); `free` and `truncate` are O(pages
//! released). The LRU list is intrusive (index-linked through the page records), O(1) per
//! operation. [`BlockManager::check_invariants`] is O(`P` + total tokens) and is meant for tests.
//!
//! # Example
//!
//! ```
//! # fn main() -> tessera::Result<()> {
//! use tessera::kvcache::block_manager::{BlockManager, BlockManagerConfig};
//!
//! let mut bm = BlockManager::new(BlockManagerConfig { num_pages: 8, ..Default::default() })?;
//! assert_eq!(bm.page_size(), 16);
//!
//! // Prefill a 40-token prompt: 3 pages (16 + 16 + 8 tokens).
//! let prompt: Vec<u32> = (100..140).collect();
//! let a = bm.allocate(1, &prompt)?;
//! assert_eq!(a.cached_tokens, 0); // nothing cached yet: prefill all 40 tokens
//! assert_eq!(bm.block_table(1).map(<[u32]>::len), Some(3));
//!
//! // A second request with the same first 32 tokens shares the two full pages.
//! let mut other = prompt[..32].to_vec();
//! other.extend([7, 8, 9]);
//! let b = bm.allocate(2, &other)?;
//! assert_eq!(b.cached_tokens, 32); // prefill only tokens 32..35
//! assert_eq!(bm.block_table(1).unwrap()[..2], bm.block_table(2).unwrap()[..2]);
//! assert_eq!(bm.refcount(bm.block_table(1).unwrap()[0]), 2);
//!
//! // Decode: one token per step; no copy needed, the last page is sequence 1's own.
//! assert_eq!(bm.append_token(1, 5)?, None);
//!
//! // Beam search: the child shares every page, so the first write into the shared last page
//! // copies it. The caller copies page `src` to page `dst` on the device, then writes.
//! bm.fork(1, 3)?;
//! let copy = bm.append_token(3, 6)?.expect("copy-on-write of the shared last page");
//! assert_eq!(copy.src, bm.block_table(1).unwrap()[2]);
//! assert_eq!(copy.dst, bm.block_table(3).unwrap()[2]);
//!
//! // Finished sequences release their pages; full ones stay cached for later prompts.
//! bm.free(1)?;
//! bm.free(3)?;
//! assert_eq!(bm.num_used_pages() + bm.num_free_pages() + bm.num_cached_pages(), bm.num_pages());
//! bm.check_invariants().expect("consistent");
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, HashMap};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Caller-chosen id of a sequence (a request, or one beam of it).
pub type SeqId = u64;

/// Index of a physical page in the device pool, `0..num_pages`.
pub type PageId = u32;

/// Default tokens per page.
pub const DEFAULT_PAGE_SIZE: usize = 16;
/// Smallest supported page size.
pub const MIN_PAGE_SIZE: usize = 8;
/// Largest supported page size.
pub const MAX_PAGE_SIZE: usize = 256;

/// Chained hash of a full page (see the module documentation).
type PageHash = u128;
/// Id of one registration of a page in the prefix index; never reused.
type RegId = u64;

/// Hash standing in for the parent of page 0 ("tessera_kv_root1").
const ROOT_HASH: PageHash = 0x7465_7373_6572_615f_6b76_5f72_6f6f_7431;
/// Registration id standing in for the parent of page 0. Real ids start at 1.
const ROOT_REG: RegId = 0;
/// End of the LRU list. `num_pages <= PageId::MAX`, so no real page has this id.
const NIL: PageId = PageId::MAX;

/// A page copy the caller must issue on the device before writing into `dst`: copy the K/V of
/// page `src` to page `dst` (copy-on-write of a shared page).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageCopy {
    /// Page to read from; it stays in use by the sequences still sharing it.
    pub src: PageId,
    /// Freshly allocated page to write to; it replaces `src` in the writer's block table.
    pub dst: PageId,
}

/// Settings of a [`BlockManager`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockManagerConfig {
    /// Physical pages in the device pool. Must be at least 1 (the default 0 is rejected by
    /// [`BlockManager::new`]: size the pool from the memory you have).
    pub num_pages: usize,
    /// Tokens per page: a power of two from 8 to 256. Default 16.
    pub page_size: usize,
    /// Share full pages between sequences with the same prompt prefix, and keep unreferenced
    /// full pages cached for reuse. Default `true`. When `false`, freed pages go straight back
    /// to the free list and [`Allocation::cached_tokens`] is always 0.
    pub prefix_caching: bool,
}

impl Default for BlockManagerConfig {
    fn default() -> Self {
        BlockManagerConfig {
            num_pages: 0,
            page_size: DEFAULT_PAGE_SIZE,
            prefix_caching: true,
        }
    }
}

/// What [`BlockManager::allocate`] did for a new sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// Prompt tokens whose K/V already sit in shared or cached pages: the caller prefills only
    /// tokens `cached_tokens..prompt.len()`. A multiple of the page size, always less than the
    /// prompt length (the last token is always recomputed).
    pub cached_tokens: usize,
}

/// Counters since the manager was created. Failed calls change none of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockManagerStats {
    /// Prompt tokens passed to successful [`BlockManager::allocate`] calls with prefix caching
    /// on (the denominator of the prefix hit rate).
    pub prefix_lookup_tokens: u64,
    /// Of those, tokens found in shared or cached pages ([`Allocation::cached_tokens`]).
    pub prefix_hit_tokens: u64,
    /// Cached pages evicted (least recently used first) to make room.
    pub evictions: u64,
    /// Copy-on-write page copies returned to callers.
    pub cow_copies: u64,
}

/// Bookkeeping of one physical page.
#[derive(Clone, Debug)]
#[cfg_attr(test, derive(PartialEq, Eq))]
struct PageMeta {
    /// Number of (sequence, table slot) references.
    refcount: u32,
    /// Hash under which the page is registered in the prefix index, if it is.
    key: Option<PageHash>,
    /// LRU neighbours (towards the least and the most recently used end) while cached.
    prev: PageId,
    next: PageId,
}

/// A registered full page in the prefix index.
#[derive(Clone, Debug)]
#[cfg_attr(test, derive(PartialEq, Eq))]
struct Entry {
    page: PageId,
    reg: RegId,
    /// Hash and registration id of the page before it (`ROOT_HASH`, `ROOT_REG` for page 0).
    parent_hash: PageHash,
    parent_reg: RegId,
    /// The page's `T` token ids, compared on every hit.
    tokens: Box<[u32]>,
}

/// What a sequence knows about one of its full pages.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(test, derive(PartialEq, Eq))]
struct FullPage {
    hash: PageHash,
    /// Registration whose content (with everything before it) is exactly this page's: the page
    /// itself or an earlier registered twin. `None` when there is none (a hash collision).
    canon: Option<RegId>,
}

/// One live sequence.
#[derive(Clone, Debug)]
#[cfg_attr(test, derive(PartialEq, Eq))]
struct Sequence {
    tokens: Vec<u32>,
    table: Vec<PageId>,
    /// One record per full page, in order (empty when prefix caching is off).
    full: Vec<FullPage>,
}

/// The page pool: page records, free list, LRU of cached pages and prefix index.
#[derive(Clone, Debug)]
#[cfg_attr(test, derive(PartialEq, Eq))]
struct Pool {
    page_size: usize,
    prefix_caching: bool,
    pages: Vec<PageMeta>,
    free: Vec<PageId>,
    /// Least recently used cached page (evicted first) and most recently used one.
    lru_head: PageId,
    lru_tail: PageId,
    num_cached: usize,
    index: HashMap<PageHash, Entry>,
    next_reg: RegId,
    stats: BlockManagerStats,
    /// Test hook: a deliberately colliding hash, to prove collisions never share wrong pages.
    #[cfg(test)]
    weak_hash: bool,
}

/// The paged KV cache block manager. See the [module documentation](self) for the model.
#[derive(Clone, Debug)]
#[cfg_attr(test, derive(PartialEq, Eq))]
pub struct BlockManager {
    pool: Pool,
    seqs: BTreeMap<SeqId, Sequence>,
}

/// What `allocate` would do, worked out without changing anything.
struct AllocPlan {
    /// Chained hashes of the prompt's full pages (empty without prefix caching).
    hashes: Vec<PageHash>,
    /// Prefix hits, in page order: (page, registration).
    hits: Vec<(PageId, RegId)>,
    /// Fresh pages to take.
    new_pages: usize,
    /// Free plus evictable pages for this call (hit pages being revived excluded).
    available: usize,
}

fn unknown_seq(arg: &'static str, seq: SeqId) -> Error {
    Error::invalid(arg, format!("no live sequence with id {seq}"))
}

impl Pool {
    fn chain_hash(&self, parent: PageHash, tokens: &[u32]) -> PageHash {
        #[cfg(test)]
        if self.weak_hash {
            // Three buckets per parent: nearly every lookup collides.
            let sum: u128 = tokens.iter().map(|&t| u128::from(t)).sum();
            return (parent % 5) * 3 + sum % 3;
        }
        let mut buf = [0u8; 16 + 4 * MAX_PAGE_SIZE];
        buf[..16].copy_from_slice(&parent.to_le_bytes());
        for (dst, t) in buf[16..].chunks_exact_mut(4).zip(tokens) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
        let digest = Sha256::digest(&buf[..16 + 4 * tokens.len()]);
        let mut low = [0u8; 16];
        low.copy_from_slice(&digest[..16]);
        PageHash::from_le_bytes(low)
    }

    fn page_tokens<'a>(&self, tokens: &'a [u32], i: usize) -> &'a [u32] {
        &tokens[i * self.page_size..(i + 1) * self.page_size]
    }

    /// Whether registration `reg` still stands under `hash` (the root always does).
    fn is_live(&self, hash: PageHash, reg: RegId) -> bool {
        reg == ROOT_REG || self.index.get(&hash).is_some_and(|e| e.reg == reg)
    }

    /// The exact parent of full page `full.len()` of a sequence, if it is still registered.
    fn parent_of_next(&self, full: &[FullPage]) -> Option<(PageHash, RegId)> {
        match full.last() {
            None => Some((ROOT_HASH, ROOT_REG)),
            Some(f) => f.canon.filter(|&r| self.is_live(f.hash, r)).map(|r| (f.hash, r)),
        }
    }

    /// A registered page whose content equals `tokens` after exactly the registration `parent`.
    fn lookup(&self, hash: PageHash, parent: RegId, tokens: &[u32]) -> Option<&Entry> {
        self.index
            .get(&hash)
            .filter(|e| e.parent_reg == parent && *e.tokens == *tokens)
    }

    fn available(&self) -> usize {
        self.free.len() + self.num_cached
    }

    fn lru_push_back(&mut self, p: PageId) {
        let tail = self.lru_tail;
        let m = &mut self.pages[p as usize];
        m.prev = tail;
        m.next = NIL;
        if tail == NIL {
            self.lru_head = p;
        } else {
            self.pages[tail as usize].next = p;
        }
        self.lru_tail = p;
        self.num_cached += 1;
    }

    fn lru_remove(&mut self, p: PageId) {
        let (prev, next) = {
            let m = &mut self.pages[p as usize];
            let links = (m.prev, m.next);
            m.prev = NIL;
            m.next = NIL;
            links
        };
        if prev == NIL {
            self.lru_head = next;
        } else {
            self.pages[prev as usize].next = next;
        }
        if next == NIL {
            self.lru_tail = prev;
        } else {
            self.pages[next as usize].prev = prev;
        }
        self.num_cached -= 1;
    }

    /// Removes page `p` from the prefix index (its registration dies). Placement is the
    /// caller's business.
    fn unregister(&mut self, p: PageId) {
        if let Some(h) = self.pages[p as usize].key.take() {
            self.index.remove(&h);
        }
    }

    /// Takes a page with reference count 1: from the free list, else by evicting the least
    /// recently used cached page. The caller has checked that one is available.
    fn take_page(&mut self) -> PageId {
        let p = match self.free.pop() {
            Some(p) => p,
            None => {
                let p = self.lru_head;
                assert!(
                    p != NIL,
                    "block manager: page availability was checked before taking pages"
                );
                self.lru_remove(p);
                self.unregister(p);
                self.stats.evictions += 1;
                p
            }
        };
        self.pages[p as usize].refcount = 1;
        p
    }

    /// Drops one reference to `p`. At zero a registered page is cached (most recently used),
    /// unless its parent registration is gone: then no lookup can ever reach it and it is freed.
    fn release(&mut self, p: PageId) {
        let m = &mut self.pages[p as usize];
        m.refcount -= 1;
        if m.refcount > 0 {
            return;
        }
        let key = m.key;
        match key {
            Some(h)
                if self
                    .index
                    .get(&h)
                    .is_some_and(|e| self.is_live(e.parent_hash, e.parent_reg)) =>
            {
                self.lru_push_back(p)
            }
            Some(_) => {
                self.unregister(p);
                self.free.push(p);
            }
            None => self.free.push(p),
        }
    }

    fn register(&mut self, page: PageId, hash: PageHash, parent: (PageHash, RegId), tokens: &[u32]) -> RegId {
        debug_assert!(self.pages[page as usize].key.is_none());
        self.next_reg += 1;
        let reg = self.next_reg;
        self.index.insert(
            hash,
            Entry {
                page,
                reg,
                parent_hash: parent.0,
                parent_reg: parent.1,
                tokens: tokens.into(),
            },
        );
        self.pages[page as usize].key = Some(hash);
        reg
    }

    /// Page `seq.full.len()` of `seq` has just become full (its tokens are in `seq.tokens`, its
    /// physical page in `seq.table`): record it and register it if it is new content.
    fn on_page_full(&mut self, seq: &mut Sequence, hash: PageHash) {
        let i = seq.full.len();
        let canon = self.parent_of_next(&seq.full).and_then(|parent| {
            let tokens = self.page_tokens(&seq.tokens, i);
            let found = self.index.get(&hash).map(|e| {
                let twin = e.parent_reg == parent.1 && *e.tokens == *tokens;
                let orphan = !self.is_live(e.parent_hash, e.parent_reg);
                (e.reg, e.page, twin, orphan)
            });
            match found {
                None => Some(self.register(seq.table[i], hash, parent, tokens)),
                // An earlier page with the same content: it stays the shared one.
                Some((reg, _, true, _)) => Some(reg),
                // The registered page's parent is gone, so no lookup can reach it: replace it.
                Some((_, old, false, true)) => {
                    self.unregister(old);
                    if self.pages[old as usize].refcount == 0 {
                        self.lru_remove(old);
                        self.free.push(old);
                    }
                    Some(self.register(seq.table[i], hash, parent, tokens))
                }
                // A hash collision with different content: keep the first.
                Some((_, _, false, false)) => None,
            }
        });
        seq.full.push(FullPage { hash, canon });
    }

    fn plan_allocate(&self, prompt: &[u32]) -> AllocPlan {
        let t = self.page_size;
        let total = prompt.len().div_ceil(t);
        let mut hashes = Vec::new();
        let mut hits = Vec::new();
        if self.prefix_caching {
            let n_full = prompt.len() / t;
            hashes.reserve_exact(n_full);
            let mut parent = (ROOT_HASH, ROOT_REG);
            let mut matching = true;
            for i in 0..n_full {
                let tokens = self.page_tokens(prompt, i);
                let h = self.chain_hash(parent.0, tokens);
                hashes.push(h);
                // Share only pages strictly before the one holding the last prompt token.
                if matching && i + 1 < total {
                    match self.lookup(h, parent.1, tokens) {
                        Some(e) => {
                            hits.push((e.page, e.reg));
                            parent.1 = e.reg;
                        }
                        None => matching = false,
                    }
                }
                parent.0 = h;
            }
        }
        let reviving = hits
            .iter()
            .filter(|&&(p, _)| self.pages[p as usize].refcount == 0)
            .count();
        AllocPlan {
            new_pages: total - hits.len(),
            available: self.available() - reviving,
            hashes,
            hits,
        }
    }

    fn commit_allocate(&mut self, prompt: &[u32], plan: AllocPlan) -> Sequence {
        let mut seq = Sequence {
            tokens: prompt.to_vec(),
            table: Vec::with_capacity(plan.hits.len() + plan.new_pages),
            full: Vec::with_capacity(plan.hashes.len()),
        };
        // Revive the hits first so that taking fresh pages cannot evict them.
        for (i, &(p, reg)) in plan.hits.iter().enumerate() {
            if self.pages[p as usize].refcount == 0 {
                self.lru_remove(p);
            }
            self.pages[p as usize].refcount += 1;
            seq.table.push(p);
            seq.full.push(FullPage {
                hash: plan.hashes[i],
                canon: Some(reg),
            });
        }
        for _ in 0..plan.new_pages {
            let p = self.take_page();
            seq.table.push(p);
        }
        for &h in &plan.hashes[plan.hits.len()..] {
            self.on_page_full(&mut seq, h);
        }
        if self.prefix_caching {
            let hit_tokens = plan.hits.len() * self.page_size;
            self.stats.prefix_lookup_tokens += prompt.len() as u64;
            self.stats.prefix_hit_tokens += hit_tokens as u64;
        }
        seq
    }

    /// Appends `tokens` to `seq`, all or nothing.
    fn append(&mut self, seq: &mut Sequence, tokens: &[u32]) -> Result<Option<PageCopy>> {
        let t = self.page_size;
        let len = seq.tokens.len();
        if tokens.is_empty() {
            return Ok(None);
        }
        let in_page = len % t != 0;
        let last = seq.table.last().copied();
        let cow = match last {
            Some(p) if in_page => self.pages[p as usize].refcount > 1,
            _ => false,
        };
        let new_len = len
            .checked_add(tokens.len())
            .ok_or_else(|| Error::invalid("tokens", "sequence length overflows usize"))?;
        let needed = usize::from(cow) + new_len.div_ceil(t) - len.div_ceil(t);
        if needed > self.available() {
            return Err(Error::OutOfPages {
                needed,
                available: self.available(),
            });
        }

        let mut copy = None;
        if let (Some(src), true) = (last, in_page) {
            if cow {
                let dst = self.take_page();
                self.release(src);
                *seq.table.last_mut().expect("a partial page exists") = dst;
                self.stats.cow_copies += 1;
                copy = Some(PageCopy { src, dst });
            } else {
                // The page is ours alone; writing into it ends any registration it still has
                // (a full registered page cut back by `truncate`).
                self.unregister(src);
            }
        }
        seq.tokens.reserve(tokens.len());
        for &tok in tokens {
            if seq.tokens.len() % t == 0 {
                let p = self.take_page();
                seq.table.push(p);
            }
            seq.tokens.push(tok);
            if self.prefix_caching && seq.tokens.len() % t == 0 {
                let i = seq.full.len();
                let parent = seq.full.last().map_or(ROOT_HASH, |f| f.hash);
                let h = self.chain_hash(parent, self.page_tokens(&seq.tokens, i));
                self.on_page_full(seq, h);
            }
        }
        Ok(copy)
    }
}

impl BlockManager {
    /// A manager of `cfg.num_pages` pages of `cfg.page_size` tokens, all free.
    ///
    /// Fails with [`Error::InvalidArgument`] when `page_size` is not a power of two in 8..=256,
    /// when `num_pages` is 0 or above `u32::MAX`, or when the host bookkeeping (about 50 bytes
    /// per page) cannot be allocated.
    pub fn new(cfg: BlockManagerConfig) -> Result<Self> {
        let t = cfg.page_size;
        if !t.is_power_of_two() || !(MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&t) {
            return Err(Error::invalid(
                "page_size",
                format!("must be a power of two from {MIN_PAGE_SIZE} to {MAX_PAGE_SIZE}, got {t}"),
            ));
        }
        let n = cfg.num_pages;
        if n == 0 || n > PageId::MAX as usize {
            return Err(Error::invalid(
                "num_pages",
                format!("must be from 1 to {}, got {n}", PageId::MAX),
            ));
        }
        let no_memory = |_| Error::invalid("num_pages", format!("cannot allocate host bookkeeping for {n} pages"));
        let mut pages = Vec::new();
        pages.try_reserve_exact(n).map_err(no_memory)?;
        pages.resize(
            n,
            PageMeta {
                refcount: 0,
                key: None,
                prev: NIL,
                next: NIL,
            },
        );
        let mut free = Vec::new();
        free.try_reserve_exact(n).map_err(no_memory)?;
        // Reversed so that pages are handed out in increasing order.
        free.extend((0..n as PageId).rev());
        Ok(BlockManager {
            pool: Pool {
                page_size: t,
                prefix_caching: cfg.prefix_caching,
                pages,
                free,
                lru_head: NIL,
                lru_tail: NIL,
                num_cached: 0,
                index: HashMap::new(),
                next_reg: ROOT_REG,
                stats: BlockManagerStats::default(),
                #[cfg(test)]
                weak_hash: false,
            },
            seqs: BTreeMap::new(),
        })
    }

    /// Test hook: a manager whose page hash collides all the time.
    #[cfg(test)]
    pub(crate) fn with_weak_hash(cfg: BlockManagerConfig) -> Result<Self> {
        let mut bm = Self::new(cfg)?;
        bm.pool.weak_hash = true;
        Ok(bm)
    }

    /// Tokens per page (`T`).
    pub fn page_size(&self) -> usize {
        self.pool.page_size
    }

    /// Physical pages in the pool (`P`).
    pub fn num_pages(&self) -> usize {
        self.pool.pages.len()
    }

    /// Creates sequence `seq` holding `prompt` (prefill) and returns how many leading prompt
    /// tokens are already cached.
    ///
    /// The sequence gets `ceil(len / T)` pages. With prefix caching, full pages before the page
    /// of the last prompt token that match registered pages (same tokens after the same
    /// prefix) are shared; the caller computes and writes the K/V of tokens
    /// `cached_tokens..len` only. Prompt pages that are full become registered, so later
    /// prompts can share them (the caller must have written them before those run).
    ///
    /// Errors: [`Error::InvalidArgument`] if `seq` is already live or `prompt` is empty;
    /// [`Error::OutOfPages`] if the fresh pages cannot be found among the free and evictable
    /// cached pages (pages this call revives as hits do not count as evictable). Nothing is
    /// changed on error.
    pub fn allocate(&mut self, seq: SeqId, prompt: &[u32]) -> Result<Allocation> {
        if self.seqs.contains_key(&seq) {
            return Err(Error::invalid("seq", format!("sequence {seq} already exists")));
        }
        if prompt.is_empty() {
            return Err(Error::invalid("prompt", "must hold at least one token"));
        }
        let plan = self.pool.plan_allocate(prompt);
        if plan.new_pages > plan.available {
            return Err(Error::OutOfPages {
                needed: plan.new_pages,
                available: plan.available,
            });
        }
        let cached_tokens = plan.hits.len() * self.pool.page_size;
        let s = self.pool.commit_allocate(prompt, plan);
        self.seqs.insert(seq, s);
        Ok(Allocation { cached_tokens })
    }

    /// Appends one decoded token to `seq` (one decode step).
    ///
    /// Takes a fresh page when the last one is full. When the last page is shared with other
    /// sequences, returns the [`PageCopy`] the caller must issue on the device before writing
    /// the token (copy-on-write). A page that fills up becomes registered for prefix sharing.
    ///
    /// Errors: [`Error::InvalidArgument`] for an unknown `seq`; [`Error::OutOfPages`] when a
    /// needed page cannot be found. Nothing is changed on error.
    pub fn append_token(&mut self, seq: SeqId, token: u32) -> Result<Option<PageCopy>> {
        let s = self.seqs.get_mut(&seq).ok_or_else(|| unknown_seq("seq", seq))?;
        self.pool.append(s, std::slice::from_ref(&token))
    }

    /// Appends several tokens to `seq` (chunked prefill, accepted speculative tokens), all or
    /// nothing.
    ///
    /// Returns the page copies to issue before writing; there is at most one (only the current
    /// last page can be shared). Prefix caching does not look these tokens up; pages they fill
    /// are registered. Errors as [`append_token`](Self::append_token); an empty `tokens` is a
    /// no-op.
    pub fn append_tokens(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<PageCopy>> {
        let s = self.seqs.get_mut(&seq).ok_or_else(|| unknown_seq("seq", seq))?;
        Ok(self.pool.append(s, tokens)?.into_iter().collect())
    }

    /// Creates sequence `child` as a copy of `parent` that shares every page (beam search,
    /// parallel sampling). Whichever writes first into a shared partial last page copies it.
    ///
    /// Errors: [`Error::InvalidArgument`] if `parent` is not live or `child` is. Needs no pages.
    pub fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<()> {
        let p = self.seqs.get(&parent).ok_or_else(|| unknown_seq("parent", parent))?;
        if self.seqs.contains_key(&child) {
            return Err(Error::invalid("child", format!("sequence {child} already exists")));
        }
        if p.table
            .iter()
            .any(|&pg| self.pool.pages[pg as usize].refcount == u32::MAX)
        {
            return Err(Error::invalid(
                "parent",
                "a page is already shared by u32::MAX sequences",
            ));
        }
        let s = p.clone();
        for &pg in &s.table {
            self.pool.pages[pg as usize].refcount += 1;
        }
        self.seqs.insert(child, s);
        Ok(())
    }

    /// Cuts `seq` back to its first `new_len` tokens (rejected speculative tokens); pages past
    /// the new end are released. If the new last page is shared, the next append copies it.
    ///
    /// Errors: [`Error::InvalidArgument`] for an unknown `seq` or `new_len` above the current
    /// length. `new_len == 0` is allowed and leaves a live sequence with no pages.
    pub fn truncate(&mut self, seq: SeqId, new_len: usize) -> Result<()> {
        let s = self.seqs.get_mut(&seq).ok_or_else(|| unknown_seq("seq", seq))?;
        if new_len > s.tokens.len() {
            return Err(Error::invalid(
                "new_len",
                format!("{new_len} exceeds the length {} of sequence {seq}", s.tokens.len()),
            ));
        }
        let keep = new_len.div_ceil(self.pool.page_size);
        // Released last page first, so that the earlier pages of a chain stay cached longer.
        while s.table.len() > keep {
            let p = s.table.pop().expect("table longer than keep");
            self.pool.release(p);
        }
        s.tokens.truncate(new_len);
        s.full.truncate(new_len / self.pool.page_size);
        Ok(())
    }

    /// Ends `seq` and releases its pages; registered full pages stay cached for reuse.
    ///
    /// Errors: [`Error::InvalidArgument`] for an unknown `seq`.
    pub fn free(&mut self, seq: SeqId) -> Result<()> {
        let s = self.seqs.remove(&seq).ok_or_else(|| unknown_seq("seq", seq))?;
        // Last page first: the LRU then evicts the tails of cached chains before their heads.
        for &p in s.table.iter().rev() {
            self.pool.release(p);
        }
        Ok(())
    }

    /// The block table of `seq` (physical page of each logical page), or `None` if not live.
    pub fn block_table(&self, seq: SeqId) -> Option<&[PageId]> {
        self.seqs.get(&seq).map(|s| s.table.as_slice())
    }

    /// Number of tokens in `seq`, or `None` if not live.
    pub fn seq_len(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(&seq).map(|s| s.tokens.len())
    }

    /// The token ids of `seq` (kept for hashing), or `None` if not live.
    pub fn tokens(&self, seq: SeqId) -> Option<&[u32]> {
        self.seqs.get(&seq).map(|s| s.tokens.as_slice())
    }

    /// Ids of the live sequences, in increasing order.
    pub fn sequences(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.seqs.keys().copied()
    }

    /// Pages on the free list.
    pub fn num_free_pages(&self) -> usize {
        self.pool.free.len()
    }

    /// Unreferenced full pages kept for prefix reuse (evictable).
    pub fn num_cached_pages(&self) -> usize {
        self.pool.num_cached
    }

    /// Pages referenced by at least one sequence. `used + free + cached == num_pages()`.
    pub fn num_used_pages(&self) -> usize {
        self.num_pages() - self.pool.free.len() - self.pool.num_cached
    }

    /// Number of (sequence, table slot) references to `page`; 0 for a free, cached or
    /// out-of-range page.
    pub fn refcount(&self, page: PageId) -> u32 {
        self.pool.pages.get(page as usize).map_or(0, |m| m.refcount)
    }

    /// Pages a prompt of `prompt_len` tokens occupies, `ceil(prompt_len / T)` (an upper bound
    /// on what [`allocate`](Self::allocate) takes: prefix hits need none).
    pub fn pages_needed_for(&self, prompt_len: usize) -> usize {
        prompt_len.div_ceil(self.pool.page_size)
    }

    /// Whether [`allocate`](Self::allocate) of `prompt` would find its pages now (counting
    /// prefix hits and evictable cached pages). False for an empty prompt. Does not check the
    /// sequence id.
    pub fn can_allocate(&self, prompt: &[u32]) -> bool {
        if prompt.is_empty() {
            return false;
        }
        let plan = self.pool.plan_allocate(prompt);
        plan.new_pages <= plan.available
    }

    /// Counters since creation.
    pub fn stats(&self) -> &BlockManagerStats {
        &self.pool.stats
    }

    /// Checks every internal invariant, for tests and debugging; O(`P` + total tokens).
    ///
    /// Every page is exactly one of free, cached or used; a used page's reference count is the
    /// number of (sequence, table slot) references to it; cached pages have count 0 and are
    /// registered; `used + free + cached == P`; the prefix index and the page records agree and
    /// every entry's hash and tokens are consistent; every table has exactly `ceil(len / T)`
    /// pages; every registered page a sequence uses holds that sequence's tokens, after the
    /// same registered prefix. Returns the first violation found.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let pool = &self.pool;
        let n = pool.pages.len();
        let t = pool.page_size;

        #[derive(Clone, Copy, PartialEq)]
        enum State {
            Unseen,
            Free,
            Cached,
        }
        let mut state = vec![State::Unseen; n];
        for &p in &pool.free {
            let i = p as usize;
            if i >= n {
                return Err(format!("free list holds page {p} >= {n}"));
            }
            if state[i] != State::Unseen {
                return Err(format!("page {p} is on the free list twice"));
            }
            state[i] = State::Free;
        }
        let (mut p, mut prev, mut count) = (pool.lru_head, NIL, 0usize);
        while p != NIL {
            let i = p as usize;
            if i >= n || count >= n {
                return Err(format!("LRU list is broken at page {p}"));
            }
            if state[i] != State::Unseen {
                return Err(format!("page {p} is both cached and free (or cached twice)"));
            }
            if pool.pages[i].prev != prev {
                return Err(format!("LRU back link of page {p} is wrong"));
            }
            state[i] = State::Cached;
            prev = p;
            p = pool.pages[i].next;
            count += 1;
        }
        if pool.lru_tail != prev || count != pool.num_cached {
            return Err(format!(
                "LRU tail/count mismatch: {count} walked, {} recorded",
                pool.num_cached
            ));
        }

        let mut refs = vec![0u64; n];
        for (&id, s) in &self.seqs {
            if s.table.len() != s.tokens.len().div_ceil(t) {
                return Err(format!(
                    "sequence {id}: {} pages for {} tokens",
                    s.table.len(),
                    s.tokens.len()
                ));
            }
            for &p in &s.table {
                match refs.get_mut(p as usize) {
                    Some(r) => *r += 1,
                    None => return Err(format!("sequence {id} references page {p} >= {n}")),
                }
            }
        }
        let mut used = 0;
        for (i, m) in pool.pages.iter().enumerate() {
            if u64::from(m.refcount) != refs[i] {
                return Err(format!("page {i}: refcount {} but {} references", m.refcount, refs[i]));
            }
            match state[i] {
                State::Free if m.refcount != 0 || m.key.is_some() => {
                    return Err(format!("free page {i} is referenced or registered"))
                }
                State::Cached if m.refcount != 0 || m.key.is_none() => {
                    return Err(format!("cached page {i} is referenced or not registered"))
                }
                State::Unseen if m.refcount == 0 => return Err(format!("page {i} is neither free, cached nor used")),
                State::Unseen => used += 1,
                _ => {}
            }
            if state[i] != State::Cached && (m.prev != NIL || m.next != NIL) {
                return Err(format!("page {i} has LRU links but is not cached"));
            }
            if let Some(h) = m.key {
                if pool.index.get(&h).map(|e| e.page) != Some(i as PageId) {
                    return Err(format!("page {i} is registered under a hash the index maps elsewhere"));
                }
            }
        }
        if used != self.num_used_pages() || used + pool.free.len() + pool.num_cached != n {
            return Err(format!(
                "counts: used {used} + free {} + cached {} != {n}",
                pool.free.len(),
                pool.num_cached
            ));
        }

        if !pool.prefix_caching && (!pool.index.is_empty() || self.seqs.values().any(|s| !s.full.is_empty())) {
            return Err("prefix caching is off but pages are registered".into());
        }
        let mut regs = std::collections::HashSet::new();
        for (&h, e) in &pool.index {
            if e.page as usize >= n || pool.pages[e.page as usize].key != Some(h) {
                return Err(format!(
                    "index entry for page {} disagrees with the page record",
                    e.page
                ));
            }
            if e.tokens.len() != t || pool.chain_hash(e.parent_hash, &e.tokens) != h {
                return Err(format!("index entry for page {} has wrong tokens or hash", e.page));
            }
            if e.reg == ROOT_REG || e.reg > pool.next_reg || !regs.insert(e.reg) {
                return Err(format!("index entry for page {} has a bad registration id", e.page));
            }
            if e.parent_reg >= e.reg || (e.parent_reg == ROOT_REG && e.parent_hash != ROOT_HASH) {
                return Err(format!("index entry for page {} has a bad parent", e.page));
            }
        }

        for (&id, s) in &self.seqs {
            let n_full = s.tokens.len() / t;
            if pool.prefix_caching && s.full.len() != n_full {
                return Err(format!(
                    "sequence {id}: {} full-page records for {n_full} full pages",
                    s.full.len()
                ));
            }
            let mut parent_hash = ROOT_HASH;
            for (i, f) in s.full.iter().enumerate() {
                let tokens = &s.tokens[i * t..(i + 1) * t];
                if f.hash != pool.chain_hash(parent_hash, tokens) {
                    return Err(format!("sequence {id}: wrong hash for page {i}"));
                }
                parent_hash = f.hash;
                let live = f.canon.and_then(|r| pool.index.get(&f.hash).filter(|e| e.reg == r));
                if let Some(e) = live {
                    let parent_reg = if i == 0 { Some(ROOT_REG) } else { s.full[i - 1].canon };
                    if *e.tokens != *tokens || Some(e.parent_reg) != parent_reg {
                        return Err(format!(
                            "sequence {id}: page {i} maps to a registration with other content"
                        ));
                    }
                }
            }
            for (i, &p) in s.table.iter().enumerate() {
                let Some(h) = pool.pages[p as usize].key else { continue };
                let e = &pool.index[&h];
                let end = s.tokens.len().min((i + 1) * t);
                if s.tokens[i * t..end] != e.tokens[..end - i * t] {
                    return Err(format!("sequence {id}: registered page {p} holds other tokens"));
                }
                if i < n_full && (s.full[i].hash != h || s.full[i].canon != Some(e.reg)) {
                    return Err(format!(
                        "sequence {id}: registered page {p} at slot {i} is not its canon"
                    ));
                }
            }
        }
        let stats = &pool.stats;
        if stats.prefix_hit_tokens > stats.prefix_lookup_tokens {
            return Err("more prefix hit tokens than looked-up tokens".into());
        }
        Ok(())
    }
}
