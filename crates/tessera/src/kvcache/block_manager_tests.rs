//! Tests of the paged KV cache block manager: one unit test per behaviour and error, and a
//! property test that runs random operation sequences against a simulated device page store.

use std::collections::{BTreeMap, HashMap};

use proptest::collection::vec;
use proptest::prelude::*;

use super::block_manager::*;
use crate::error::{Error, Result};

fn manager(num_pages: usize, page_size: usize) -> BlockManager {
    BlockManager::new(BlockManagerConfig {
        num_pages,
        page_size,
        ..Default::default()
    })
    .expect("valid config")
}

/// Tokens `start..start + n`, distinct from every other range.
fn run(start: u32, n: usize) -> Vec<u32> {
    (start..start + n as u32).collect()
}

fn cat(parts: &[&[u32]]) -> Vec<u32> {
    parts.concat()
}

fn table(bm: &BlockManager, seq: SeqId) -> Vec<PageId> {
    bm.block_table(seq).expect("live sequence").to_vec()
}

fn invalid_arg<T: std::fmt::Debug>(r: Result<T>) -> &'static str {
    match r {
        Err(Error::InvalidArgument { arg, .. }) => arg,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

fn out_of_pages<T: std::fmt::Debug>(r: Result<T>) -> (usize, usize) {
    match r {
        Err(Error::OutOfPages { needed, available }) => (needed, available),
        other => panic!("expected OutOfPages, got {other:?}"),
    }
}

fn ok(bm: &BlockManager) {
    if let Err(e) = bm.check_invariants() {
        panic!("invariant broken: {e}\n{bm:#?}");
    }
}

#[test]
fn config_defaults_and_validation() {
    let d = BlockManagerConfig::default();
    assert_eq!((d.num_pages, d.page_size, d.prefix_caching), (0, 16, true));
    assert_eq!(invalid_arg(BlockManager::new(d.clone())), "num_pages");
    for bad in [0, 1, 4, 12, 24, 512] {
        let cfg = BlockManagerConfig {
            num_pages: 4,
            page_size: bad,
            ..Default::default()
        };
        assert_eq!(invalid_arg(BlockManager::new(cfg)), "page_size", "page_size {bad}");
    }
    for good in [8, 16, 32, 64, 128, 256] {
        let bm = manager(3, good);
        assert_eq!((bm.page_size(), bm.num_pages(), bm.num_free_pages()), (good, 3, 3));
        ok(&bm);
    }
}

#[test]
fn out_of_pages_message_says_what_to_do() {
    let e = Error::OutOfPages {
        needed: 3,
        available: 1,
    };
    assert_eq!(
        e.to_string(),
        "KV cache out of pages: needed 3, 1 free or evictable; preempt a sequence or free pages"
    );
}

#[test]
fn allocate_maps_tokens_to_pages() {
    let mut bm = manager(8, 16);
    let a = bm.allocate(7, &run(0, 40)).unwrap();
    assert_eq!(a.cached_tokens, 0);
    assert_eq!(table(&bm, 7), vec![0, 1, 2]);
    assert_eq!(bm.seq_len(7), Some(40));
    assert_eq!(bm.tokens(7), Some(run(0, 40).as_slice()));
    assert_eq!(
        (bm.num_used_pages(), bm.num_free_pages(), bm.num_cached_pages()),
        (3, 5, 0)
    );
    assert!(table(&bm, 7).iter().all(|&p| bm.refcount(p) == 1));
    assert_eq!(bm.sequences().collect::<Vec<_>>(), vec![7]);
    ok(&bm);
}

#[test]
fn bad_input_is_rejected_and_changes_nothing() {
    let mut bm = manager(8, 8);
    bm.allocate(1, &run(0, 10)).unwrap();
    let before = bm.clone();
    assert_eq!(invalid_arg(bm.allocate(1, &run(0, 3))), "seq");
    assert_eq!(invalid_arg(bm.allocate(2, &[])), "prompt");
    assert_eq!(invalid_arg(bm.append_token(9, 1)), "seq");
    assert_eq!(invalid_arg(bm.append_tokens(9, &[1, 2])), "seq");
    assert_eq!(invalid_arg(bm.fork(9, 3)), "parent");
    assert_eq!(invalid_arg(bm.fork(1, 1)), "child");
    assert_eq!(invalid_arg(bm.truncate(9, 0)), "seq");
    assert_eq!(invalid_arg(bm.truncate(1, 11)), "new_len");
    assert_eq!(invalid_arg(bm.free(9)), "seq");
    assert_eq!(bm, before);
    assert_eq!(bm.block_table(9), None);
    assert_eq!(bm.seq_len(9), None);
    assert_eq!(bm.tokens(9), None);
    assert_eq!(bm.refcount(1000), 0);
    assert_eq!(bm.append_tokens(1, &[]).unwrap(), vec![]);
    assert_eq!(bm, before);
}

#[test]
fn prefix_hit_shares_full_pages() {
    let mut bm = manager(8, 16);
    let prompt = run(0, 40);
    bm.allocate(1, &prompt).unwrap();
    let b = bm.allocate(2, &cat(&[&prompt[..32], &[900, 901, 902]])).unwrap();
    assert_eq!(b.cached_tokens, 32);
    let (t1, t2) = (table(&bm, 1), table(&bm, 2));
    assert_eq!(t1[..2], t2[..2]);
    assert_ne!(t1[2], t2[2]);
    assert_eq!((bm.refcount(t1[0]), bm.refcount(t1[1]), bm.refcount(t2[2])), (2, 2, 1));
    // A different first page shares nothing, even when later pages match.
    let c = bm.allocate(3, &cat(&[&run(500, 16), &prompt[16..40]])).unwrap();
    assert_eq!(c.cached_tokens, 0);
    let s = bm.stats();
    assert_eq!((s.prefix_lookup_tokens, s.prefix_hit_tokens), (40 + 35 + 40, 32));
    ok(&bm);
}

#[test]
fn prefix_sharing_stops_before_the_last_token_page() {
    let mut bm = manager(8, 16);
    let prompt = run(0, 32);
    bm.allocate(1, &prompt).unwrap();
    // Same 32 tokens: page 1 holds the last token, so only page 0 is shared.
    let b = bm.allocate(2, &prompt).unwrap();
    assert_eq!(b.cached_tokens, 16);
    let (t1, t2) = (table(&bm, 1), table(&bm, 2));
    assert_eq!(t1[0], t2[0]);
    assert_ne!(t1[1], t2[1]);
    // A prompt shorter than a page never hits.
    assert_eq!(bm.allocate(3, &prompt[..10]).unwrap().cached_tokens, 0);
    assert_eq!(bm.allocate(4, &prompt[..16]).unwrap().cached_tokens, 0);
    assert_eq!(bm.allocate(5, &prompt[..17]).unwrap().cached_tokens, 16);
    ok(&bm);
}

#[test]
fn freed_full_pages_stay_cached_and_are_revived() {
    let mut bm = manager(8, 8);
    let prompt = run(0, 20); // 2 full pages + 4 tokens
    bm.allocate(1, &prompt).unwrap();
    let t1 = table(&bm, 1);
    bm.free(1).unwrap();
    assert_eq!(
        (bm.num_used_pages(), bm.num_cached_pages(), bm.num_free_pages()),
        (0, 2, 6)
    );
    assert_eq!(bm.sequences().count(), 0);
    ok(&bm);
    let b = bm.allocate(2, &prompt).unwrap();
    assert_eq!(b.cached_tokens, 16);
    let t2 = table(&bm, 2);
    assert_eq!(t1[..2], t2[..2]);
    assert_eq!((bm.refcount(t2[0]), bm.refcount(t2[1])), (1, 1));
    assert_eq!(
        (bm.num_used_pages(), bm.num_cached_pages(), bm.num_free_pages()),
        (3, 0, 5)
    );
    ok(&bm);
}

#[test]
fn prefix_caching_off_shares_and_caches_nothing() {
    let mut bm = BlockManager::new(BlockManagerConfig {
        num_pages: 8,
        page_size: 8,
        prefix_caching: false,
    })
    .unwrap();
    let prompt = run(0, 20);
    bm.allocate(1, &prompt).unwrap();
    assert_eq!(bm.allocate(2, &prompt).unwrap().cached_tokens, 0);
    bm.free(1).unwrap();
    bm.free(2).unwrap();
    assert_eq!((bm.num_cached_pages(), bm.num_free_pages()), (0, 8));
    assert_eq!(bm.allocate(3, &prompt).unwrap().cached_tokens, 0);
    assert_eq!(*bm.stats(), BlockManagerStats::default());
    ok(&bm);
}

#[test]
fn eviction_takes_free_pages_first_then_least_recently_used() {
    let mut bm = manager(6, 8);
    let (a, b) = (run(0, 17), run(100, 17)); // 2 full pages + 1 token each
    bm.allocate(1, &a).unwrap();
    bm.allocate(2, &b).unwrap();
    bm.free(1).unwrap(); // a's full pages cached first: least recently used
    bm.free(2).unwrap();
    assert_eq!((bm.num_cached_pages(), bm.num_free_pages()), (4, 2));
    // 3 pages: 2 free ones, then one eviction, from a's chain (its tail page first).
    bm.allocate(3, &run(200, 24)).unwrap();
    assert_eq!(bm.stats().evictions, 1);
    assert_eq!(bm.num_cached_pages(), 3);
    bm.free(3).unwrap(); // LRU order now: a0, b1, b0, then seq 3's pages
    assert_eq!((bm.num_cached_pages(), bm.num_free_pages()), (6, 0));
    // a lost its tail page but kept its head; its 2 fresh pages evict b's, the least recent.
    assert_eq!(bm.allocate(4, &a).unwrap().cached_tokens, 8);
    assert_eq!(bm.stats().evictions, 3);
    // Seq 3's pages, the most recent, all survived.
    assert_eq!(bm.allocate(5, &run(200, 17)).unwrap().cached_tokens, 16);
    bm.free(4).unwrap();
    assert_eq!(bm.allocate(6, &b).unwrap().cached_tokens, 0);
    ok(&bm);
}

#[test]
fn lookup_hit_refreshes_recency() {
    let mut bm = manager(5, 8);
    let (a, b) = (run(0, 9), run(100, 9)); // 1 full page + 1 token each
    bm.allocate(1, &a).unwrap();
    bm.free(1).unwrap();
    bm.allocate(2, &b).unwrap();
    bm.free(2).unwrap();
    // Touch a's page again: now b's page is the least recently used.
    bm.allocate(3, &a).unwrap();
    bm.free(3).unwrap();
    bm.allocate(4, &run(200, 32)).unwrap(); // 4 pages: 3 free + 1 eviction
    assert_eq!(bm.stats().evictions, 1);
    bm.free(4).unwrap();
    assert_eq!(bm.allocate(5, &a).unwrap().cached_tokens, 8);
    assert_eq!(bm.allocate(6, &b).unwrap().cached_tokens, 0);
    ok(&bm);
}

#[test]
fn decode_registers_pages_as_they_fill() {
    let mut bm = manager(8, 8);
    let prompt = run(0, 5);
    bm.allocate(1, &prompt).unwrap();
    let mut all = prompt.clone();
    for tok in 50..62 {
        assert_eq!(bm.append_token(1, tok).unwrap(), None);
        all.push(tok);
    }
    assert_eq!((bm.seq_len(1), table(&bm, 1).len()), (Some(17), 3));
    // Pages 0 and 1 filled during decode, so a prompt with the same 16 tokens shares them.
    let b = bm.allocate(2, &cat(&[&all[..16], &[7]])).unwrap();
    assert_eq!(b.cached_tokens, 16);
    assert_eq!(table(&bm, 1)[..2], table(&bm, 2)[..2]);
    ok(&bm);
}

#[test]
fn append_tokens_chunks_and_registers() {
    let mut bm = manager(8, 8);
    bm.allocate(1, &run(0, 3)).unwrap();
    assert_eq!(bm.append_tokens(1, &run(3, 20)).unwrap(), vec![]);
    assert_eq!((bm.seq_len(1), table(&bm, 1).len()), (Some(23), 3));
    assert_eq!(bm.allocate(2, &run(0, 17)).unwrap().cached_tokens, 16);
    ok(&bm);
}

#[test]
fn fork_shares_every_page_and_copies_on_write() {
    let mut bm = manager(8, 8);
    bm.allocate(1, &run(0, 12)).unwrap();
    bm.fork(1, 2).unwrap();
    let t = table(&bm, 1);
    assert_eq!(table(&bm, 2), t);
    assert!(t.iter().all(|&p| bm.refcount(p) == 2));
    assert_eq!(bm.tokens(2), bm.tokens(1));
    // The child writes into the shared partial page: it gets a copy.
    let copy = bm.append_token(2, 77).unwrap().expect("copy-on-write");
    assert_eq!(copy.src, t[1]);
    assert_eq!(table(&bm, 2), vec![t[0], copy.dst]);
    assert_eq!((bm.refcount(t[1]), bm.refcount(copy.dst)), (1, 1));
    // The parent now owns its page alone: no copy.
    assert_eq!(bm.append_token(1, 78).unwrap(), None);
    assert_eq!(table(&bm, 1), t);
    assert_eq!(bm.stats().cow_copies, 1);
    assert_eq!(bm.tokens(2).unwrap()[12], 77);
    assert_eq!(bm.tokens(1).unwrap()[12], 78);
    ok(&bm);
}

#[test]
fn fork_at_a_page_boundary_needs_no_copy() {
    let mut bm = manager(8, 8);
    bm.allocate(1, &run(0, 16)).unwrap();
    bm.fork(1, 2).unwrap();
    assert_eq!(bm.append_token(2, 1).unwrap(), None);
    assert_eq!(bm.append_token(1, 2).unwrap(), None);
    assert_eq!(table(&bm, 1)[..2], table(&bm, 2)[..2]);
    assert_ne!(table(&bm, 1)[2], table(&bm, 2)[2]);
    ok(&bm);
}

#[test]
fn append_tokens_returns_one_copy_for_a_shared_last_page() {
    let mut bm = manager(8, 8);
    bm.allocate(1, &run(0, 5)).unwrap();
    bm.fork(1, 2).unwrap();
    let copies = bm.append_tokens(2, &run(40, 20)).unwrap();
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].src, table(&bm, 1)[0]);
    assert_eq!(table(&bm, 2)[0], copies[0].dst);
    assert_eq!(table(&bm, 2).len(), 4);
    ok(&bm);
}

#[test]
fn free_releases_and_keeps_shared_pages() {
    let mut bm = manager(8, 8);
    bm.allocate(1, &run(0, 12)).unwrap();
    bm.fork(1, 2).unwrap();
    bm.free(1).unwrap();
    assert!(table(&bm, 2).iter().all(|&p| bm.refcount(p) == 1));
    assert_eq!(bm.append_token(2, 5).unwrap(), None);
    bm.free(2).unwrap();
    assert_eq!((bm.num_used_pages(), bm.num_cached_pages()), (0, 1));
    ok(&bm);
}

#[test]
fn truncate_releases_pages_past_the_end() {
    let mut bm = manager(8, 8);
    bm.allocate(1, &run(0, 30)).unwrap();
    let t = table(&bm, 1);
    bm.truncate(1, 17).unwrap();
    assert_eq!(table(&bm, 1), t[..3]);
    assert_eq!(bm.tokens(1), Some(run(0, 17).as_slice()));
    bm.truncate(1, 17).unwrap();
    assert_eq!(table(&bm, 1), t[..3]);
    bm.truncate(1, 0).unwrap();
    assert_eq!((bm.seq_len(1), table(&bm, 1).len()), (Some(0), 0));
    ok(&bm);
    // A sequence of length 0 is still live and can grow again.
    assert_eq!(bm.append_tokens(1, &run(0, 9)).unwrap(), vec![]);
    assert_eq!(table(&bm, 1).len(), 2);
    ok(&bm);
}

#[test]
fn truncate_into_a_shared_page_then_append_copies() {
    let mut bm = manager(8, 8);
    bm.allocate(1, &run(0, 20)).unwrap();
    bm.fork(1, 2).unwrap();
    bm.truncate(2, 12).unwrap(); // into shared full page 1
    let t = table(&bm, 1);
    assert_eq!(bm.refcount(t[1]), 2);
    assert_eq!(bm.refcount(t[2]), 1);
    let copy = bm.append_token(2, 99).unwrap().expect("copy-on-write");
    assert_eq!(copy.src, t[1]);
    assert_eq!(bm.tokens(1), Some(run(0, 20).as_slice()));
    // Page 1 of sequence 1 is untouched and still shared by prefix lookups.
    assert_eq!(bm.allocate(3, &run(0, 17)).unwrap().cached_tokens, 16);
    assert_eq!(table(&bm, 3)[1], t[1]);
    ok(&bm);
}

#[test]
fn rewriting_a_truncated_registered_page_unregisters_it() {
    let mut bm = manager(8, 8);
    bm.allocate(1, &run(0, 20)).unwrap();
    let t = table(&bm, 1);
    bm.truncate(1, 12).unwrap(); // page 1 (registered, ours alone) is partial again
    assert_eq!(bm.append_token(1, 555).unwrap(), None); // written in place
    assert_eq!(table(&bm, 1), t[..2]);
    // The old content of page 1 is gone, so it must not be found any more.
    assert_eq!(bm.allocate(2, &run(0, 17)).unwrap().cached_tokens, 8);
    ok(&bm);
}

#[test]
fn truncated_registered_page_stays_cached_if_never_rewritten() {
    let mut bm = manager(8, 8);
    bm.allocate(1, &run(0, 20)).unwrap();
    bm.truncate(1, 12).unwrap();
    bm.free(1).unwrap();
    assert_eq!(bm.num_cached_pages(), 2);
    assert_eq!(bm.allocate(2, &run(0, 17)).unwrap().cached_tokens, 16);
    ok(&bm);
}

#[test]
fn twin_pages_are_not_merged() {
    let mut bm = manager(8, 8);
    let p = run(0, 4);
    bm.allocate(1, &p).unwrap();
    bm.allocate(2, &p).unwrap();
    bm.append_tokens(1, &run(4, 5)).unwrap(); // page 0 of seq 1 registered first
    bm.append_tokens(2, &run(4, 5)).unwrap(); // the twin stays seq 2's own
    let (t1, t2) = (table(&bm, 1), table(&bm, 2));
    assert_ne!(t1[0], t2[0]);
    assert!(bm.refcount(t1[0]) == 1 && bm.refcount(t2[0]) == 1);
    assert_eq!(bm.allocate(3, &run(0, 9)).unwrap().cached_tokens, 8);
    assert_eq!(table(&bm, 3)[0], t1[0]);
    // Only the registered one is cached on free.
    bm.free(3).unwrap();
    bm.free(1).unwrap();
    bm.free(2).unwrap();
    assert_eq!(bm.num_cached_pages(), 1);
    ok(&bm);
}

#[test]
fn pages_registered_after_a_twin_chain_are_found() {
    // Sequence 2's page 0 is a twin of sequence 1's; the page it fills next is registered
    // after the first page and is found by a later prompt through it.
    let mut bm = manager(8, 8);
    bm.allocate(1, &run(0, 9)).unwrap();
    bm.allocate(2, &run(0, 8)).unwrap(); // page 0 holds the last token: not shared
    assert_ne!(table(&bm, 1)[0], table(&bm, 2)[0]);
    bm.append_tokens(2, &run(8, 8)).unwrap();
    let b = bm.allocate(3, &run(0, 17)).unwrap();
    assert_eq!(b.cached_tokens, 16);
    assert_eq!(table(&bm, 3)[..2], [table(&bm, 1)[0], table(&bm, 2)[1]]);
    ok(&bm);
}

#[test]
fn pages_whose_parent_was_evicted_are_replaced_not_kept() {
    let mut bm = manager(6, 8);
    let (p0, p1) = (run(0, 8), run(8, 8));
    bm.allocate(1, &cat(&[&p0, &[99]])).unwrap();
    bm.allocate(2, &p0).unwrap(); // a twin of seq 1's page 0
    bm.free(1).unwrap(); // seq 1's page 0 cached
                         // Seq 2's page 1 is registered after seq 1's page 0 (the registered twin of its own).
    bm.append_tokens(2, &p1).unwrap();
    // Evict seq 1's page 0 (3 free pages + 1 eviction): seq 2's page 1 is now unreachable.
    bm.allocate(3, &run(300, 25)).unwrap();
    assert_eq!(bm.stats().evictions, 1);
    bm.free(3).unwrap();
    // Seq 4 recomputes page 0 and registers page 1 in place of seq 2's unreachable one.
    assert_eq!(bm.allocate(4, &cat(&[&p0, &p1, &[5]])).unwrap().cached_tokens, 0);
    ok(&bm);
    let b = bm.allocate(5, &cat(&[&p0, &p1, &[6]])).unwrap();
    assert_eq!(b.cached_tokens, 16);
    assert_eq!(table(&bm, 5)[..2], table(&bm, 4)[..2]);
    // Seq 2's pages are no longer registered: freeing it caches nothing new.
    let cached = bm.num_cached_pages();
    bm.free(2).unwrap();
    assert_eq!(bm.num_cached_pages(), cached);
    ok(&bm);
}

#[test]
fn unreachable_pages_are_freed_not_cached() {
    let mut bm = manager(5, 8);
    let p0 = run(0, 8);
    bm.allocate(1, &cat(&[&p0, &[99]])).unwrap();
    bm.allocate(2, &p0).unwrap();
    bm.free(1).unwrap();
    bm.append_tokens(2, &run(8, 9)).unwrap(); // seq 2 page 1 registered under seq 1's page 0
    bm.allocate(3, &run(300, 9)).unwrap(); // 2 pages: 1 free + evicts seq 1's page 0
    assert_eq!(bm.stats().evictions, 1);
    bm.free(2).unwrap();
    // Seq 2's page 1 has lost its parent: it goes to the free list.
    assert_eq!(bm.num_cached_pages(), 0);
    ok(&bm);
}

#[test]
fn hash_collisions_never_share_other_content() {
    // The weak test hash puts the first pages of these two prompts in the same bucket.
    let mut bm = BlockManager::with_weak_hash(BlockManagerConfig {
        num_pages: 8,
        page_size: 8,
        ..Default::default()
    })
    .unwrap();
    let a = cat(&[&[3, 0, 0, 0, 0, 0, 0, 0], &[1]]);
    let b = cat(&[&[0, 3, 0, 0, 0, 0, 0, 0], &[1]]);
    bm.allocate(1, &a).unwrap();
    assert_eq!(bm.allocate(2, &b).unwrap().cached_tokens, 0);
    assert_ne!(table(&bm, 1)[0], table(&bm, 2)[0]);
    assert_eq!(bm.allocate(3, &a).unwrap().cached_tokens, 8);
    ok(&bm);
}

#[test]
fn out_of_pages_on_allocate_changes_nothing() {
    let mut bm = manager(4, 8);
    bm.allocate(1, &run(0, 17)).unwrap();
    let before = bm.clone();
    assert_eq!(out_of_pages(bm.allocate(2, &run(100, 17))), (3, 1));
    assert!(!bm.can_allocate(&run(100, 17)));
    assert!(bm.can_allocate(&run(100, 8)));
    assert_eq!(bm, before);
    ok(&bm);
}

#[test]
fn pages_revived_as_hits_do_not_count_as_evictable() {
    let mut bm = manager(3, 8);
    let prompt = run(0, 17);
    bm.allocate(1, &prompt).unwrap();
    bm.free(1).unwrap(); // 2 cached + 1 free
                         // 4 pages: 2 hits (revived) + 2 fresh, but only 1 page is free or evictable besides them.
    let longer = cat(&[&prompt[..16], &run(50, 9)]);
    let before = bm.clone();
    assert!(!bm.can_allocate(&longer));
    assert_eq!(out_of_pages(bm.allocate(2, &longer)), (2, 1));
    assert_eq!(bm, before);
    // 3 pages: 2 hits + 1 fresh fits.
    assert!(bm.can_allocate(&prompt));
    assert_eq!(bm.allocate(2, &prompt).unwrap().cached_tokens, 16);
    assert_eq!(bm.stats().evictions, 0);
    ok(&bm);
}

#[test]
fn out_of_pages_on_append_changes_nothing() {
    let mut bm = manager(2, 8);
    bm.allocate(1, &run(0, 16)).unwrap();
    let before = bm.clone();
    assert_eq!(out_of_pages(bm.append_token(1, 5)), (1, 0));
    assert_eq!(out_of_pages(bm.append_tokens(1, &run(0, 9))), (2, 0));
    assert_eq!(bm, before);
    ok(&bm);
}

#[test]
fn out_of_pages_on_copy_on_write_changes_nothing() {
    let mut bm = manager(2, 8);
    bm.allocate(1, &run(0, 12)).unwrap();
    bm.fork(1, 2).unwrap();
    let before = bm.clone();
    assert_eq!(out_of_pages(bm.append_token(2, 5)), (1, 0));
    assert_eq!(out_of_pages(bm.append_tokens(2, &run(0, 20))), (3, 0));
    assert_eq!(bm, before);
    // Once the parent is gone the child owns the page and writes in place.
    bm.free(1).unwrap();
    assert_eq!(bm.append_token(2, 5).unwrap(), None);
    ok(&bm);
}

#[test]
fn append_all_or_nothing_when_partly_possible() {
    let mut bm = manager(3, 8);
    bm.allocate(1, &run(0, 8)).unwrap();
    let before = bm.clone();
    // 17 more tokens need 3 pages; 2 are free: nothing is appended.
    assert_eq!(out_of_pages(bm.append_tokens(1, &run(8, 17))), (3, 2));
    assert_eq!(bm, before);
    bm.append_tokens(1, &run(8, 16)).unwrap();
    assert_eq!(bm.num_free_pages(), 0);
    ok(&bm);
}

#[test]
fn pages_needed_and_stats() {
    let mut bm = manager(8, 16);
    assert_eq!([0, 1, 16, 17, 32].map(|n| bm.pages_needed_for(n)), [0, 1, 1, 2, 2]);
    assert!(!bm.can_allocate(&[]));
    bm.allocate(1, &run(0, 33)).unwrap();
    bm.allocate(2, &run(0, 33)).unwrap();
    bm.fork(2, 3).unwrap();
    bm.append_token(3, 1).unwrap();
    assert_eq!(
        *bm.stats(),
        BlockManagerStats {
            prefix_lookup_tokens: 66,
            prefix_hit_tokens: 32,
            evictions: 0,
            cow_copies: 1,
        }
    );
}

// ---- property test: random operations against a simulated device page store ----

/// Which sequence an operation addresses, resolved against the live ones when it runs: mostly
/// a live sequence (or, for `allocate` and a fork's child, an unused id), sometimes any id of
/// 0..8 so that unknown and duplicate ids come up too.
#[derive(Clone, Copy, Debug)]
struct Target {
    usual: bool,
    n: u64,
}

type Model = BTreeMap<SeqId, Vec<u32>>;

impl Target {
    fn live(self, model: &Model) -> SeqId {
        match model.keys().nth(self.n as usize % model.len().max(1)) {
            Some(&id) if self.usual => id,
            _ => self.n % 8,
        }
    }

    fn unused(self, model: &Model) -> SeqId {
        if self.usual {
            (self.n % 8..)
                .find(|id| !model.contains_key(id))
                .expect("ids are unbounded")
        } else {
            self.n % 8
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Allocate {
        seq: Target,
        prefix: usize,
        keep: usize,
        suffix: Vec<u32>,
    },
    AppendToken {
        seq: Target,
        token: u32,
    },
    AppendTokens {
        seq: Target,
        tokens: Vec<u32>,
    },
    Fork {
        parent: Target,
        child: Target,
    },
    /// `new_len = len - back`, floored at 0; `back == TRUNCATE_PAST_END` asks for `len + 1`.
    Truncate {
        seq: Target,
        back: usize,
    },
    Free {
        seq: Target,
    },
}

const TRUNCATE_PAST_END: usize = 11;

/// Three 40-token prefixes; the first two share their first 12 tokens. Tokens are small so
/// that decoded pages often repeat registered content.
fn shared_prefix(k: usize) -> Vec<u32> {
    (0..40)
        .map(|i| {
            if i < 12 && k < 2 {
                (i % 3) as u32
            } else {
                ((i * (k + 2) + k) % 4) as u32
            }
        })
        .collect()
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let seq = (prop::bool::weighted(0.9), 0u64..64).prop_map(|(usual, n)| Target { usual, n });
    prop_oneof![
        4 => (seq.clone(), 0usize..3, 0usize..=40, vec(0u32..4, 0..10))
            .prop_map(|(seq, prefix, keep, suffix)| Op::Allocate { seq, prefix, keep, suffix }),
        6 => (seq.clone(), 0u32..4).prop_map(|(seq, token)| Op::AppendToken { seq, token }),
        2 => (seq.clone(), vec(0u32..4, 0..20)).prop_map(|(seq, tokens)| Op::AppendTokens { seq, tokens }),
        2 => (seq.clone(), seq.clone()).prop_map(|(parent, child)| Op::Fork { parent, child }),
        2 => (seq.clone(), 0usize..=TRUNCATE_PAST_END).prop_map(|(seq, back)| Op::Truncate { seq, back }),
        2 => seq.prop_map(|seq| Op::Free { seq }),
    ]
}

/// Stand-in for the K/V of token `t` of a sequence: it depends on every token up to `t`, so a
/// slot is right only if it was written after exactly the same prefix.
fn kv_of(tokens: &[u32]) -> Vec<u64> {
    let mut h = 0x243f_6a88_85a3_08d3u64;
    tokens
        .iter()
        .map(|&t| {
            h = (h ^ u64::from(t).wrapping_add(1)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            h ^= h >> 29;
            h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
            h ^= h >> 32;
            h
        })
        .collect()
}

/// The device: what each slot of each physical page holds.
#[derive(Default)]
struct Device {
    pages: HashMap<PageId, Vec<Option<u64>>>,
}

impl Device {
    fn copy(&mut self, c: PageCopy) {
        let src = self.pages.get(&c.src).cloned().unwrap_or_default();
        self.pages.insert(c.dst, src);
    }

    /// Writes the K/V of tokens `from..` of a sequence through its block table.
    fn write(&mut self, table: &[PageId], tokens: &[u32], from: usize, t: usize) {
        let kv = kv_of(tokens);
        for (i, &v) in kv.iter().enumerate().skip(from) {
            let page = self.pages.entry(table[i / t]).or_default();
            page.resize(page.len().max(t), None);
            page[i % t] = Some(v);
        }
    }

    fn read(&self, table: &[PageId], len: usize, t: usize) -> Vec<Option<u64>> {
        (0..len)
            .map(|i| {
                self.pages
                    .get(&table[i / t])
                    .and_then(|p| p.get(i % t).copied().flatten())
            })
            .collect()
    }
}

fn check_state(bm: &BlockManager, model: &Model, dev: &Device) -> std::result::Result<(), String> {
    bm.check_invariants()?;
    let t = bm.page_size();
    if !bm.sequences().eq(model.keys().copied()) {
        return Err("live sequences differ from the model".into());
    }
    for (&id, tokens) in model {
        if bm.tokens(id) != Some(tokens.as_slice()) {
            return Err(format!("sequence {id}: tokens differ from the model"));
        }
        let table = bm.block_table(id).ok_or("no table")?;
        let want: Vec<Option<u64>> = kv_of(tokens).into_iter().map(Some).collect();
        if dev.read(table, tokens.len(), t) != want {
            return Err(format!("sequence {id}: device pages hold other K/V than its tokens"));
        }
    }
    Ok(())
}

/// Runs `ops` on a manager, the model and the simulated device; fails on any disagreement.
fn run_ops(mut bm: BlockManager, ops: &[Op]) -> std::result::Result<(), TestCaseError> {
    let t = bm.page_size();
    let prefixes: Vec<Vec<u32>> = (0..3).map(shared_prefix).collect();
    let mut model = Model::new();
    let mut dev = Device::default();
    for op in ops {
        let before = bm.clone();
        let stats_before = *bm.stats();
        let spare = bm.num_free_pages() + bm.num_cached_pages();
        // Whether the arguments are valid, so that only running out of pages may fail it.
        let (valid, result): (bool, Result<()>) = match op {
            Op::Allocate {
                seq,
                prefix,
                keep,
                suffix,
            } => {
                let seq = seq.unused(&model);
                let prompt = cat(&[&prefixes[*prefix][..*keep], suffix]);
                let valid = !model.contains_key(&seq) && !prompt.is_empty();
                let predicted = bm.can_allocate(&prompt);
                let r = bm.allocate(seq, &prompt);
                if valid {
                    prop_assert_eq!(predicted, r.is_ok(), "can_allocate disagrees with allocate");
                }
                let r = r.map(|a| {
                    let c = a.cached_tokens;
                    assert!(c % t == 0 && c < prompt.len(), "cached_tokens {c} of {}", prompt.len());
                    assert_eq!(bm.stats().prefix_hit_tokens - stats_before.prefix_hit_tokens, c as u64);
                    // Prefix-hit pages are not rewritten: they must already hold the right K/V.
                    dev.write(bm.block_table(seq).unwrap(), &prompt, c, t);
                    model.insert(seq, prompt);
                });
                (valid, r)
            }
            Op::AppendToken { seq, token } => {
                let seq = seq.live(&model);
                let r = bm.append_token(seq, *token).map(|copy| {
                    copy.into_iter().for_each(|c| dev.copy(c));
                    let tokens = model.get_mut(&seq).unwrap();
                    tokens.push(*token);
                    dev.write(bm.block_table(seq).unwrap(), tokens, tokens.len() - 1, t);
                });
                (model.contains_key(&seq), r)
            }
            Op::AppendTokens { seq, tokens: new } => {
                let seq = seq.live(&model);
                let r = bm.append_tokens(seq, new).map(|copies| {
                    assert!(copies.len() <= 1);
                    copies.into_iter().for_each(|c| dev.copy(c));
                    let tokens = model.get_mut(&seq).unwrap();
                    let from = tokens.len();
                    tokens.extend_from_slice(new);
                    dev.write(bm.block_table(seq).unwrap(), tokens, from, t);
                });
                (model.contains_key(&seq), r)
            }
            Op::Fork { parent, child } => {
                let (parent, child) = (parent.live(&model), child.unused(&model));
                let valid = model.contains_key(&parent) && !model.contains_key(&child);
                let r = bm.fork(parent, child).map(|()| {
                    let tokens = model[&parent].clone();
                    model.insert(child, tokens);
                });
                (valid, r)
            }
            Op::Truncate { seq, back } => {
                let seq = seq.live(&model);
                let len = model.get(&seq).map_or(0, Vec::len);
                let new_len = if *back == TRUNCATE_PAST_END {
                    len + 1
                } else {
                    len.saturating_sub(*back)
                };
                let valid = model.contains_key(&seq) && new_len <= len;
                let r = bm
                    .truncate(seq, new_len)
                    .map(|()| model.get_mut(&seq).unwrap().truncate(new_len));
                (valid, r)
            }
            Op::Free { seq } => {
                let seq = seq.live(&model);
                (
                    model.contains_key(&seq),
                    bm.free(seq).map(|()| drop(model.remove(&seq))),
                )
            }
        };
        match result {
            Ok(()) => prop_assert!(valid, "{op:?}: invalid arguments were accepted"),
            Err(Error::OutOfPages { needed, available }) => {
                prop_assert!(valid, "{op:?}: invalid arguments reported as out of pages");
                prop_assert!(needed > available, "{op:?}: needed {needed} <= available {available}");
                prop_assert!(available <= spare, "{op:?}: available {available} > spare {spare}");
                prop_assert!(bm == before, "{op:?}: failed with OutOfPages but changed the state");
            }
            Err(Error::InvalidArgument { .. }) => {
                prop_assert!(!valid, "{op:?}: valid arguments rejected");
                prop_assert!(
                    bm == before,
                    "{op:?}: failed with InvalidArgument but changed the state"
                );
            }
            Err(e) => prop_assert!(false, "{op:?}: unexpected error {e}"),
        }
        if let Err(e) = check_state(&bm, &model, &dev) {
            prop_assert!(false, "after {op:?}: {e}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Random operations on small pools (so eviction and out-of-pages happen): invariants hold
    /// after every call, failed calls change nothing, and every live sequence reads back
    /// exactly its own K/V through its block table from a device on which only the tokens each
    /// call reported as new were written (after the returned page copies).
    #[test]
    fn random_operations_keep_the_cache_consistent(
        num_pages in 2usize..14,
        page_size in prop_oneof![Just(8usize), Just(16)],
        prefix_caching in prop::bool::weighted(0.8),
        ops in vec(op_strategy(), 1..100),
    ) {
        let cfg = BlockManagerConfig { num_pages, page_size, prefix_caching };
        run_ops(BlockManager::new(cfg).unwrap(), &ops)?;
    }

    /// The same with a hash that collides all the time: sharing must still be exact.
    #[test]
    fn random_operations_with_colliding_hashes(
        num_pages in 2usize..14,
        ops in vec(op_strategy(), 1..100),
    ) {
        let cfg = BlockManagerConfig { num_pages, page_size: 8, prefix_caching: true };
        run_ops(BlockManager::with_weak_hash(cfg).unwrap(), &ops)?;
    }
}
