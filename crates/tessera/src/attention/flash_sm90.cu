// flash_sm90.cu: FlashAttention forward for Hopper (sm_90a): TMA loads completed on mbarriers,
// wgmma for both GEMMs, one producer and two or three consumer warpgroups, persistent CTAs.
//
// Preamble (attention/plan.rs, Variant::spec): Elem, kHeadDim (64, 128, 192 or 256; the real D is
// p.head_dim, the tensor maps zero-fill columns past it and the epilogue never stores them),
// kBlockM (64 query rows per consumer warpgroup: 128 or 192), kBlockN (keys per tile: 128 at
// D = 64, 128 or 176 at D = 128 as hopper::choose_block_n picks, 64 beyond), kThreads
// (128 per warpgroup: 384 or 512),
// kStages (K/V ring depth), kMasked, kSoftcap, kSplit, kPair.
//
// CTA pairs (kPair; hopper::use_cta_pairs: long sequences, two consumers, no split; varlen when
// forced):
// the grid is clusters of two CTAs, and an item is a pair of neighbouring query tiles of one head,
// 2 i and 2 i + 1 for rank 0 and 1. Both producers load the hull of the two tiles' key ranges in
// the same order, each the half of every K/V tile's rows given by its rank, multicast into both
// CTAs' ring slot (the tensor maps' K/V boxes are half tiles); each full barrier expects the
// whole tile, and each slot is released by the consumer warps of both CTAs (remote arrivals), so
// the two rings advance in lockstep. A consumer passes over the hull's tiles outside its own
// range (skip_tiles: the causal tile the second CTA has more). Rank 0 draws the items and sends
// each to rank 1 through a one-word mailbox (send_work / receive_work; rank 1 hands the word back
// with a cluster-scope release, so that rank 0's next store cannot overtake its load); items in
// which neither CTA has rows (a short varlen sequence) rank 0 finishes itself. Half the L2 reads
// of K and V, which the long rows gain from (see this folder's NOTES.md, CTA pairs).
//
// Work: item w of hp.work_items (grid = min(all items, SMs), plan.rs). CTA c (with kPair,
// cluster c, and the grid counts clusters) starts with item c and then takes items grid,
// grid + 1, ... in the order its producer draws them from a counter (hp.tile_counter; dynamic
// scheduling: a CTA that finished short items takes the next long one,
// and the CTAs running together stay on neighbouring items, which a fixed stride loses after the
// first round). The last draw of a launch resets the counter to 0 for the next launch. The
// batch-heads are cut into sections of hp.l2_heads whose K and V fit in L2 together (the first
// section takes the remainder, so that the launch ends on a full section whose short tiles fill
// the tail); inside a section items run query tile descending (longest causal tiles first), then
// split, then head, so the CTAs running at one time share a few heads' K/V instead of streaming
// one head each from HBM. Items whose query tile starts past the sequence do nothing. The
// producer hands each item to the consumers through the CTA's slot hp.work_slots[blockIdx.x],
// written before the arrival on full_q that its Q tile completes (release / acquire through the
// mbarrier; CTA-scope relaxed store and load, which L1 may serve); -1 ends. The slot is in
// global memory, not shared: compute-sanitizer racecheck does not model mbarrier or bar.arrive
// ordering of ordinary shared-memory data and would report it.
//
// Roles (warpgroup = 128 threads):
//   WG0 (producer, 40 registers, 56 with kPair): one thread draws the work items, publishes
//     them, loads the Q tile of each item once (after the consumers released the previous one)
//     and the K and V tiles of its key range, newest first, into a kStages-deep ring (K and V
//     with an evict-last L2 policy, Q evict-first unless split-KV reads it once per split);
//     every load completes on a "full" mbarrier, every slot is handed back on an "empty"
//     mbarrier (one arrival per consumer warp).
//   WG1 .. WGc (c = kBlockM / 64 consumers, 232 registers each for two (224 with kPair), 160
//     for three; the producer then keeps 40 (56) or 32): rows 64 (i - 1) .. 64 i - 1 of the
//     query tile. Per key tile: S = Q K^T (wgmma, both from shared memory), mask, online
//     softmax in registers (log2 domain, ts::OnlineSoftmax rules: a row that has seen no key
//     keeps m = -inf, its P and output are 0; P = 2^(S * scale - m) unclamped,
//     ts::exp2_fma_unclamped: a +inf score gives a NaN row), P packed to Elem as the register A
//     operand of O += P V (V read N-major from shared memory).
//     The consumers take turns issuing their GEMMs in a fixed ring order (named barrier 1 + i
//     gates consumer i, which then opens the next one's), so one warpgroup's softmax runs while
//     another's GEMMs occupy the tensor cores.
//   Epilogue: O / l stored from registers (rows < len_q, columns < head_dim), LSE; with kSplit the
//   normalised partial and its LSE go to the split-KV workspace instead (combine.cu merges).
// Tail launch (kSplit, hp.tail_first >= 0; hopper.rs `tail_split`): where the non-split launch's
//   items leave a short last wave, that launch stops before its last items and this one runs
//   them split along the keys over the idle SMs, into a compact workspace (see decode_work and
//   the epilogue), then combine.cu merges them through p.tail_meta.
//
// Shared memory (1024-byte aligned, every tile in 64-column blocks of 128-byte swizzled rows):
//   Q [kHeadDim/64][kBlockM][64], K[kStages] and V[kStages] [kHeadDim/64][kBlockN][64], mbarriers,
//   one f32 per consumer thread (Smem::sink, see order_max_before_wait).
#include "tessera/attention_params.cuh"
#include "tessera/cluster.cuh"
#include "tessera/mbarrier.cuh"
#include "tessera/memory_order.cuh"
#include "tessera/online_softmax.cuh"
#include "tessera/tma.cuh"
#include "tessera/wgmma.cuh"

#ifndef TS_GENERATED_PREAMBLE
// Defaults so the file can be read and compiled on its own; the plan always prepends its own.
#include "tessera/dtype.cuh"
using Elem = ts::f16;
constexpr int kHeadDim = 128;
constexpr int kBlockM = 128;
constexpr int kBlockN = 128;
constexpr int kThreads = 384;
constexpr int kStages = 2;
constexpr bool kMasked = true;
constexpr bool kSoftcap = false;
constexpr bool kSplit = false;
constexpr bool kPair = false;
#endif

/// The kernel parameter: the shared attention params plus the Hopper path's tensor maps.
/// Mirrored by `HopperParams` in attention/hopper.rs.
struct HopperParams {
  ts::AttentionParams p;
  ts::TensorMap q_map;  // (D, rows, heads_q, batch), box (64, kBlockM, 1, 1), 128-byte swizzle
  ts::TensorMap k_map;  // (D, rows, heads_kv, batch), box (64, kBlockN, 1, 1)
  ts::TensorMap v_map;
  int work_items;       // this launch's items: q_tiles * num_splits * batch * heads_q (with
                        // kPair ceil(q_tiles / 2) pairs of query tiles), less the tail items
                        // (tail split), or tail items * num_splits (tail launch)
  int l2_heads;         // batch-heads per L2 section (>= 1)
  unsigned* tile_counter;  // dynamic scheduler: 0 before every launch, left at 0 after it
  int* work_slots;         // [gridDim.x]: the item each CTA's producer published last
  int tail_first;          // kSplit tail launch (plan.rs): the first item of the non-split
                           // launch's order it covers; -1 otherwise (see decode_work)
  int pad_[9];
};

#if defined(TS_HAS_WGMMA) && defined(TS_HAS_TMA)


namespace {

constexpr int kColBlocks = kHeadDim / 64;        // 64-column (128-byte) blocks of a row
constexpr int kConsumerRows = 64;                // query rows per consumer warpgroup
constexpr uint32_t kQBytes = kBlockM * kHeadDim * 2;
constexpr uint32_t kKVBytes = kBlockN * kHeadDim * 2;
constexpr int kConsumers = kBlockM / kConsumerRows;  // consumer warpgroups
constexpr uint32_t kConsumerWarps = 4 * kConsumers;  // arrivals that release a slot
// setmaxnreg budgets: 128 * (producer + kConsumers * consumer) <= 65536.
constexpr int kProducerRegs = kConsumers == 2 ? (kPair ? 56 : 40) : 32;
constexpr int kConsumerRegs = kConsumers == 2 ? (kPair ? 224 : 232) : 160;
static_assert(kBlockM % kConsumerRows == 0 && (kConsumers == 2 || kConsumers == 3),
              "two or three consumer warpgroups of 64 rows");
static_assert(kThreads == 128 * (1 + kConsumers), "one producer warpgroup and the consumers");
// The budgets must fit the registers the CTA holds from its launch, not just the register file:
// __launch_bounds__(kThreads, 1) gives each thread 65536 / kThreads rounded down to a multiple
// of 8 (168 for 384 threads), and setmaxnreg.inc waits until decreases elsewhere in the CTA have
// freed enough of them, so a larger sum hangs the consumers (the first 176-key build did: see
// this folder's NOTES.md).
constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8;
static_assert(128 * (kProducerRegs + kConsumers * kConsumerRegs) <= kThreads * kLaunchRegs,
              "setmaxnreg budgets exceed the registers held at launch");
static_assert(kHeadDim % 64 == 0 && kHeadDim <= 256, "compiled head dim: multiple of 64, <= 256");
static_assert(kBlockN == 64 || kBlockN == 128 || (kBlockN == 176 && kHeadDim == 128),
              "key tile: 64 or 128, or 176 at D = 128");
static_assert(sizeof(Elem) == 2, "f16 or bf16");
static_assert(!(kPair && kSplit), "CTA pairs run the non-split launch only");
static_assert(!kPair || kConsumers == 2, "CTA pairs: two consumer warpgroups (the producer needs 56 registers)");
static_assert(!kPair || (kBlockN / 2) % 8 == 0, "a pair's half key tile: whole 1024-byte swizzle periods");
static_assert(sizeof(ts::AttentionParams) == 256, "AttentionParams layout (plan.rs)");
static_assert(sizeof(HopperParams) == 704, "HopperParams layout (hopper.rs)");

/// Shared-memory carve-up (offsets from the 1024-aligned base).
struct Smem {
  static constexpr uint32_t q = 0;
  static constexpr uint32_t k = q + kQBytes;
  static constexpr uint32_t v = k + kStages * kKVBytes;
  static constexpr uint32_t bars = v + kStages * kKVBytes;
  // barriers: full_q, empty_q, full_k[S], empty_k[S], full_v[S], empty_v[S], mail_full, mail_empty
  static constexpr uint32_t mail = bars + 8 * (4 + 4 * kStages);  // kPair: the item rank 0 sends
  static constexpr uint32_t sink = mail + 8;
  // one f32 per consumer thread, written and never read (order_max_before_wait)
  static constexpr uint32_t end = sink + 4 * 128 * kConsumers;
};
static_assert(Smem::end + 1024 <= 227 * 1024, "shared memory of one CTA (hopper::shared_bytes)");

/// One work item; `tail` is its index among the tail launch's items, -1 outside that launch.
/// With kPair, `q_tile` numbers pairs of query tiles: rank r of the cluster takes tile
/// 2 q_tile + r.
struct Work {
  int b, h, q_tile, split, tail;
};

/// Item w of the work order with `splits` KV splits per query tile.
TS_DEVICE Work decode_order(const HopperParams& hp, int w, int splits) {
  const ts::AttentionParams& p = hp.p;
  const int bh = p.batch * p.heads_q;
  const int units = kPair ? (p.q_tiles + 1) / 2 : p.q_tiles;  // query tiles, or pairs of them
  const int head_items = units * splits;
  // Sections: first bh % l2_heads heads (when not 0), then full sections of l2_heads.
  const int rem = bh % hp.l2_heads;
  int first_head, heads, r;
  if (w < rem * head_items) {
    first_head = 0;
    heads = rem;
    r = w;
  } else {
    const int section_items = hp.l2_heads * head_items;
    const int w2 = w - rem * head_items;
    first_head = rem + w2 / section_items * hp.l2_heads;
    heads = hp.l2_heads;
    r = w2 % section_items;
  }
  const int per_tile = heads * splits;
  Work wk;
  wk.q_tile = units - 1 - r / per_tile;
  wk.split = r % per_tile / heads;
  const int bhi = first_head + r % heads;
  wk.b = bhi / p.heads_q;
  wk.h = bhi % p.heads_q;
  wk.tail = -1;
  return wk;
}

/// Item w of this launch. The tail launch (kSplit with hp.tail_first >= 0, plan.rs) covers the
/// items the non-split launch before it left out, tail_first .. tail_first + work_items /
/// num_splits - 1 of that launch's order (one split per query tile, same l2_heads): its item w
/// is split w % num_splits of item tail_first + w / num_splits there.
TS_DEVICE Work decode_work(const HopperParams& hp, int w) {
  if (kSplit && hp.tail_first >= 0) {
    const int splits = hp.p.num_splits;
    Work wk = decode_order(hp, hp.tail_first + w / splits, 1);
    wk.split = w % splits;
    wk.tail = w / splits;
    return wk;
  }
  return decode_order(hp, w, hp.p.num_splits);
}

/// Key tiles [t0, t1) the rows m0 .. min(m0 + kBlockM, len_q) - 1 of a sequence see in split
/// `split` (empty when t0 >= t1). Producer and consumers call it with the same arguments.
TS_DEVICE void key_tiles(const ts::AttentionParams& p, const ts::AttnMask& mask, int m0, int len_q, int split,
                         int& t0, int& t1) {
  const int last = min(m0 + kBlockM, len_q) - 1;
  const int lo = kMasked ? mask.first_key(m0) : 0;
  const int hi = kMasked ? mask.end_key(last) : mask.len_k;
  if (hi <= lo) {
    t0 = t1 = 0;
    return;
  }
  t0 = lo / kBlockN;
  t1 = ts::ceil_div(hi, kBlockN);
  if (kSplit) {
    const int per = ts::ceil_div(t1 - t0, p.num_splits);
    t0 += split * per;
    t1 = min(t1, t0 + per);
  }
}

/// Row base and batch coordinate of a sequence in the tensor maps: varlen maps are
/// (D, total, H, 1) and address row cu_seqlens[b] + i; padded maps are (D, N, H, B).
TS_DEVICE void map_rows(const int* cu, int b, int& row0, int& bcoord) {
  if (cu != nullptr) {
    row0 = cu[b];
    bcoord = 0;
  } else {
    row0 = 0;
    bcoord = b;
  }
}

/// The query tile this CTA computes for item `wk` (first row m0), its key tiles [t0, t1) and the
/// key tiles [u0, u1) its producer loads: its own, or with kPair the hull of both CTAs' ranges
/// (both load every tile of it, in the same order, and each consumer skips the tiles outside its
/// own range). Empty ranges have t0 >= t1 (u0 >= u1).
TS_DEVICE void item_tiles(const ts::AttentionParams& p, const ts::AttnSeq& seq, const Work& wk, uint32_t rank,
                          int& m0, int& t0, int& t1, int& u0, int& u1) {
  const ts::AttnMask mask = ts::AttnMask::of(p, seq);
  m0 = (kPair ? 2 * wk.q_tile + int(rank) : wk.q_tile) * kBlockM;
  t0 = t1 = 0;
  if (m0 < seq.len_q) key_tiles(p, mask, m0, seq.len_q, wk.split, t0, t1);
  u0 = t0;
  u1 = t1;
  if (kPair) {
    const int peer_m0 = (2 * wk.q_tile + int(rank ^ 1)) * kBlockM;
    int p0 = 0, p1 = 0;
    if (peer_m0 < seq.len_q) key_tiles(p, mask, peer_m0, seq.len_q, wk.split, p0, p1);
    if (p0 < p1) {
      u0 = t0 < t1 ? min(t0, p0) : p0;
      u1 = t0 < t1 ? max(t1, p1) : p1;
    }
  }
}

/// This CTA's rank in its pair (0 without kPair); the other CTA's is rank ^ 1.
TS_DEVICE uint32_t pair_rank() { return kPair ? ts::cluster_rank() : 0; }

/// A ring position: slot index and the parity of its current phase.
struct Ring {
  int slot = 0;
  uint32_t phase = 0;
  TS_DEVICE void advance() {
    if (++slot == kStages) {
      slot = 0;
      phase ^= 1;
    }
  }
};

// ---- producer ------------------------------------------------------------------------------

/// Schedulers (CTAs, or with kPair clusters of two): scheduler s starts with item s; every later
/// item is one draw from the global counter, and the scheduler's next item is schedulers + draw.
/// A launch makes exactly work_items draws (the successful ones plus one failing draw per
/// scheduler), so the draw that returns work_items - 1 is the last one: finish_draw resets the
/// counter there. With kPair rank 0 draws and sends each item to rank 1 (send_work).
TS_DEVICE int first_item() { return kPair ? int(ts::cluster_index_x()) : int(blockIdx.x); }
TS_DEVICE unsigned start_draw(const HopperParams& hp) { return atomicAdd(hp.tile_counter, 1u); }
TS_DEVICE int finish_draw(const HopperParams& hp, unsigned draw) {
  if (draw == unsigned(hp.work_items - 1)) atomicExch(hp.tile_counter, 0u);
  return int((kPair ? ts::cluster_count_x() : gridDim.x) + draw);
}

/// kPair: rank 0's producer hands item w to rank 1's through a one-word mailbox in rank 1's shared
/// memory (st.async completing on rank 1's mail_full; rank 1 hands the word back on rank 0's
/// mail_empty once read).
TS_DEVICE void send_work(uint8_t* smem, uint64_t* mail_full, uint64_t* mail_empty, uint32_t& mail_phase, int w) {
  ts::mbar_wait_cluster(mail_empty, mail_phase ^ 1);
  mail_phase ^= 1;
  ts::st_async_cluster_u32(ts::map_shared_rank(ts::smem_addr(smem + Smem::mail), 1), uint32_t(w),
                           ts::map_shared_rank(ts::smem_addr(mail_full), 1));
}
TS_DEVICE int receive_work(uint8_t* smem, uint64_t* mail_full, uint64_t* mail_empty, uint32_t& mail_phase) {
  ts::mbar_arrive_expect_tx(mail_full, 4);
  ts::mbar_wait_cluster(mail_full, mail_phase);
  mail_phase ^= 1;
  const int w = *reinterpret_cast<volatile int*>(smem + Smem::mail);
  // The hand-back lets rank 0 store the next item into the word, so it must not overtake the
  // load. A plain remote arrival does not wait for it: rank 0's next store was caught landing
  // first (rank 1 then took that item twice, loaded tiles rank 0 never matched, and the pair
  // deadlocked; the varlen benchmark's back-to-back empty items made it likely). Release at
  // cluster scope performs the load first.
  ts::mbar_arrive_cluster_release(ts::map_shared_rank(ts::smem_addr(mail_empty), 0));
  return w;
}

/// kPair: whether neither query tile of pair item w starts inside its sequence (a short varlen
/// sequence's pairs past its end; padded batches have none).
TS_DEVICE bool pair_has_no_rows(const HopperParams& hp, int w) {
  const Work wk = decode_work(hp, w);
  return 2 * wk.q_tile * kBlockM >= ts::attn_seq(hp.p, wk.b, wk.h).len_q;
}

/// Loads key tile `row` of `map` into ring slot `tile`, completing on `full`: the whole tile, or
/// with kPair this CTA's half of its rows into both CTAs of the pair.
TS_DEVICE void load_kv_tile(uint8_t* tile, const ts::TensorMap* map, uint64_t* full, int row, int hk, int k_b,
                            uint32_t rank, uint64_t policy) {
  ts::mbar_arrive_expect_tx(full, kKVBytes);  // both halves land here with kPair
  constexpr int kRows = kPair ? kBlockN / 2 : kBlockN;
  const int r0 = kPair ? int(rank) * kRows : 0;
#pragma unroll
  for (int c = 0; c < kColBlocks; ++c) {
    uint8_t* dst = tile + c * kBlockN * 128 + r0 * 128;
    if (kPair) ts::tma_load_4d_multicast(dst, map, full, c * 64, row + r0, hk, k_b, uint16_t(0x3), policy);
    else ts::tma_load_4d(dst, map, full, c * 64, row + r0, hk, k_b, policy);
  }
}

/// Waits until ring slot `bar` is free: released by this CTA's consumers, with kPair by both
/// CTAs' (the other CTA's releases arrive from its shared memory, cluster scope).
TS_DEVICE void wait_slot_free(uint64_t* bar, uint32_t parity) {
  if (kPair) ts::mbar_wait_cluster(bar, parity);
  else ts::mbar_wait(bar, parity);
}

/// Publishes item w (-1: no more work) once the consumers released the previous Q tile; the
/// caller's arrival on full_q (with or without the Q tile) completes the publication.
TS_DEVICE void publish_work(const HopperParams& hp, uint64_t* empty_q, uint32_t& q_phase, int w) {
  ts::mbar_wait(empty_q, q_phase ^ 1);
  q_phase ^= 1;
  ts::st_relaxed_cta(hp.work_slots + blockIdx.x, w);
}

/// The producer (one thread).
TS_DEVICE void producer(const HopperParams& hp, uint8_t* smem, uint64_t* bars) {
  const ts::AttentionParams& p = hp.p;
  uint64_t* full_q = bars;
  uint64_t* empty_q = bars + 1;
  uint64_t* full_k = bars + 2;
  uint64_t* empty_k = full_k + kStages;
  uint64_t* full_v = empty_k + kStages;
  uint64_t* empty_v = full_v + kStages;
  uint64_t* mail_full = empty_v + kStages;
  uint64_t* mail_empty = mail_full + 1;
  const uint32_t rank = pair_rank();
  uint32_t mail_phase = 0;
  ts::tma_prefetch_map(&hp.q_map);
  ts::tma_prefetch_map(&hp.k_map);
  ts::tma_prefetch_map(&hp.v_map);
  Ring ring;
  uint32_t q_phase = 0;
  // L2 policies: every CTA of a section re-reads the K/V tiles of its heads, and without split-KV
  // each Q tile is read once (with it, once per split, by neighbouring items: the default
  // policy). With the loop order of mainloop_overlapped they gained a little on causal rows and
  // were level elsewhere (see this folder's NOTES.md); FlashAttention-3 loads the same way.
  const uint64_t kv_policy = ts::l2_policy<ts::L2Evict::kLast>();
  const uint64_t q_policy = ts::l2_policy<kSplit ? ts::L2Evict::kNormal : ts::L2Evict::kFirst>();
  int w = first_item();
  while (w < hp.work_items) {
    const Work wk = decode_work(hp, w);
    const ts::AttnSeq seq = ts::attn_seq(p, wk.b, wk.h);
    int m0, t0, t1, u0, u1;
    item_tiles(p, seq, wk, rank, m0, t0, t1, u0, u1);
    int q_row0, q_b, k_row0, k_b;
    map_rows(p.cu_seqlens_q, wk.b, q_row0, q_b);
    map_rows(p.cu_seqlens_k, wk.b, k_row0, k_b);
    const int hk = wk.h / (p.heads_q / p.heads_kv);
    // Items whose query tile starts past the sequence are not handed over, unless the other CTA
    // of the pair loads key tiles (which this CTA's consumers then pass over).
    if (m0 < seq.len_q || u0 < u1) {
      publish_work(hp, empty_q, q_phase, w);
      if (t0 >= t1) {
        ts::mbar_arrive(full_q);  // no visible key: the consumers store zeros and LSE = -inf
      } else {
        ts::mbar_arrive_expect_tx(full_q, kQBytes);
#pragma unroll
        for (int c = 0; c < kColBlocks; ++c)
          ts::tma_load_4d(smem + Smem::q + c * kBlockM * 128, &hp.q_map, full_q, c * 64, q_row0 + m0, wk.h, q_b,
                          q_policy);
      }
    }
    // Drawn after the Q load is issued and used after the K/V loads: the atomic's latency hides
    // behind them.
    const unsigned draw = rank == 0 ? start_draw(hp) : 0u;
    for (int t = u1 - 1; t >= u0; --t) {
      const int row = k_row0 + t * kBlockN;
      wait_slot_free(&empty_k[ring.slot], ring.phase ^ 1);
      load_kv_tile(smem + Smem::k + ring.slot * kKVBytes, &hp.k_map, &full_k[ring.slot], row, hk, k_b, rank,
                   kv_policy);
      wait_slot_free(&empty_v[ring.slot], ring.phase ^ 1);
      load_kv_tile(smem + Smem::v + ring.slot * kKVBytes, &hp.v_map, &full_v[ring.slot], row, hk, k_b, rank,
                   kv_policy);
      ring.advance();
    }
    if (rank == 0) {
      w = finish_draw(hp, draw);
      if (kPair) {
        // Items in which neither CTA has rows are done here: rank 1 never sees them.
        while (w < hp.work_items && pair_has_no_rows(hp, w)) w = finish_draw(hp, start_draw(hp));
        send_work(smem, mail_full, mail_empty, mail_phase, w);
      }
    } else {
      w = receive_work(smem, mail_full, mail_empty, mail_phase);
    }
  }
  publish_work(hp, empty_q, q_phase, -1);
  ts::mbar_arrive(full_q);
}

// ---- consumers -----------------------------------------------------------------------------

constexpr int kSRegs = kBlockN / 2;    // S accumulator registers per thread
constexpr int kORegs = kHeadDim / 2;   // O accumulator registers per thread
constexpr int kPSteps = kBlockN / 16;  // k-steps of O += P V

/// Named barriers of the consumer turn-taking (0 is __syncthreads): consumer i waits on
/// kTurnBarrier0 + i (its 128 threads plus the 128 arrivals of the consumer before it).
constexpr uint32_t kTurnBarrier0 = 1;
constexpr uint32_t kTurnThreads = 256;

/// Packs two floats into an Elem pair (lo in the low half).
TS_DEVICE uint32_t pack_pair(float lo, float hi) {
  if constexpr (ts::is_same_v<Elem, ts::f16>) return ts::pack_f16x2(lo, hi);
  else return ts::pack_bf16x2(lo, hi);
}

/// Shared address of the K or V tile in ring slot `slot` (`tiles` = smem_base + Smem::k or
/// Smem::v), read from lane 0. The slot index is warp-uniform but ptxas cannot prove it (the
/// work item comes from a global-memory slot), so without the broadcast it kept the wgmma
/// descriptors of these tiles in vector registers and moved them into uniform registers (R2UR)
/// before every wgmma: the shuffle keeps them in uniform registers, ~57 fewer issue cycles per
/// key tile at d128 while the consumer holds its GEMM turn (faster on causal, GQA and varlen
/// shapes: see this folder's NOTES.md).
TS_DEVICE uint32_t tile_addr(uint32_t tiles, int slot) {
  return __shfl_sync(0xffffffffu, tiles + slot * kKVBytes, 0);
}

/// S = Q K^T for this warpgroup's 64 rows: kHeadDim/16 wgmma k-steps.
TS_DEVICE void issue_qk(float (&s)[kSRegs], uint32_t q_base, uint32_t k_base) {
  const uint64_t da0 = ts::wgmma_desc_sw128(q_base, 16);
  const uint64_t db0 = ts::wgmma_desc_sw128(k_base, 16);
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    const uint32_t off = (kk % 4) * 32;
    const uint64_t da = ts::wgmma_desc_advance(da0, (kk / 4) * (kBlockM * 128) + off);
    const uint64_t db = ts::wgmma_desc_advance(db0, (kk / 4) * (kBlockN * 128) + off);
    ts::wgmma_ss<Elem, kBlockN, 0>(s, da, db, kk > 0 ? 1 : 0);
  }
}

/// O += P V: kBlockN/16 k-steps of 16 keys; V N-major, 64-column blocks kBlockN*128 bytes apart.
TS_DEVICE void issue_pv(float (&o)[kORegs], const uint32_t (&pa)[kPSteps][4], uint32_t v_base) {
  const uint64_t db0 = ts::wgmma_desc_sw128(v_base, kBlockN * 128);
#pragma unroll
  for (int kk = 0; kk < kPSteps; ++kk) {
    const uint64_t db = ts::wgmma_desc_advance(db0, kk * 16 * 128);
    ts::wgmma_rs<Elem, kHeadDim, 1>(o, pa[kk], db, 1);
  }
}

/// Running softmax state of this thread's two rows (log2 domain; l is this thread's share of
/// the row sum, reduced over the quad in the epilogue).
struct RowState {
  float m[2];
  float l[2];
};

/// Visible key range of this thread's two rows, the sequence's key count, and the key range
/// every row of the query tile sees (key tiles inside it need no per-element mask).
struct TileMask {
  int first0, first1, end0, end1, len_k, full_lo, full_hi;
};

/// The pipeline barriers a consumer uses.
struct Barriers {
  uint64_t *full_k, *empty_k, *full_v, *empty_v, *empty_q;
};

/// What a consumer warpgroup's main loop works with, fixed for the CTA's lifetime: the problem,
/// the ring's barriers, its Q tile and the shared-memory base, its turn barriers (the consumers
/// take turns issuing GEMMs), whether this thread is its warp's leader (arrives on barriers) and
/// its word of Smem::sink.
struct Consumer {
  const ts::AttentionParams& p;
  Barriers bs;
  uint32_t q_base, smem_base;
  uint32_t my_turn, next_turn;
  bool warp_leader;
  float* sink;
};

/// Overlap the S GEMM of the next key tile with the softmax of this one inside each consumer
/// warpgroup (FlashAttention-3's intra-warpgroup pipelining); false: one tile at a time.
#ifndef TS_ATTN_SIMPLE_MAINLOOP
constexpr bool kIntraOverlap = true;
#else
constexpr bool kIntraOverlap = false;
#endif

/// Lazy rescaling (ts::LazyStep): a row's reference max moves only when a key tile raises it by
/// more than 8 (log2 units), so after a row's first tiles O and l are almost never rescaled (64
/// multiplies per tile and thread less at D = 128). P <= 2^8 then, exact in f16/bf16 as any P.
/// Two consumers only: it gains there and costs three consumers (D = 64) time (see this folder's
/// NOTES.md). Off with a softcap: its exp2 keeps the clamp at 2^1 (see tile_exp). The factors
/// are computed every tile: computing them only where a row moved (as the Ampere kernel does, 9
/// instructions less per 176-key tile) measured no consistent gain by row, so not here.
constexpr bool kLazyRescale = kConsumers == 2 && !kSoftcap;

/// The factor that takes a tile's S to log2-domain logits in tile_max (row maxima) and tile_exp:
/// the softmax scale, or 1 with a softcap (tile_max has applied the scale and the cap to S then).
TS_DEVICE float exp_scale(const ts::AttentionParams& p) { return kSoftcap ? 1.0f : p.scale_log2; }

/// First half of the online softmax of key tile t: masks S (softcap first), moves each row's
/// reference max and rescales its l. Returns the factors 2^(m_old - m_new) that the output
/// accumulator must be multiplied by (exactly 1 where the reference max stayed) and the shifts
/// -m that tile_exp subtracts.
TS_DEVICE void tile_max(const ts::AttentionParams& p, float (&s)[kSRegs], RowState& st, const TileMask& tm, int t,
                        float (&factor)[2], float (&neg_shift)[2]) {
  const int lane = threadIdx.x % 32;
  const float scale = exp_scale(p);
  if (kSoftcap) {
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) s[i] = ts::attn_score_log2(p, s[i]);
  }
  const int j0 = t * kBlockN;
  const bool need_mask = j0 + kBlockN > tm.len_k || (kMasked && (j0 < tm.full_lo || j0 + kBlockN > tm.full_hi));
  if (need_mask) {
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) {
      const bool hi = (i % 4) >= 2;
      const int j = j0 + (i / 4) * 8 + (lane % 4) * 2 + (i % 2);
      const int first = hi ? tm.first1 : tm.first0;
      const int end = min(hi ? tm.end1 : tm.end0, tm.len_k);
      if (j < first || j >= end) s[i] = ts::kNegInf;
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = ts::kNegInf;
#pragma unroll
    for (int i = 0; i < kSRegs; ++i)
      if ((i % 4) / 2 == r) mx = ts::max_nan(mx, s[i]);  // NaN scores propagate
    mx = ts::warp_allreduce_max<4>(mx);
    const float m_cand = ts::max_nan(st.m[r], mx * scale);
    const float m_new = kLazyRescale ? ts::LazyStep::of(st.m[r], m_cand).max(st.m[r], m_cand) : m_cand;
    factor[r] = ts::exp2_shifted(st.m[r], ts::softmax_shift(m_new));
    st.m[r] = m_new;
    st.l[r] *= factor[r];
    neg_shift[r] = -ts::softmax_shift(m_new);
  }
}

/// Second half: turns S into P = 2^(S * scale - m) in place and adds it to the row sums l. The
/// FADDs stay: summing P on the tensor cores instead (l += P 1, an m64n8k16 wgmma per k-step)
/// took 76 instructions off a 176-key tile but measured slower on every row, the extra tensor
/// work costing its full time, and put bf16 LSEs over budget (see this folder's NOTES.md).
TS_DEVICE void tile_exp(const ts::AttentionParams& p, float (&s)[kSRegs], RowState& st, const float (&neg_shift)[2]) {
  const float scale = exp_scale(p);
#pragma unroll
  for (int i = 0; i < kSRegs; ++i) {
    const int r = (i % 4) / 2;
    // Softcapped scores are bounded, so the clamp of exp2_fma never acts there; those variants
    // keep it only because ptxas then allocates them without spills.
    s[i] = kSoftcap ? ts::exp2_fma(s[i], scale, neg_shift[r]) : ts::exp2_fma_unclamped(s[i], scale, neg_shift[r]);
    st.l[r] += s[i];
  }
}

/// Both halves: S of key tile t becomes P, `factor` the rescale of O (see tile_max).
TS_DEVICE void softmax_tile(const ts::AttentionParams& p, float (&s)[kSRegs], RowState& st, const TileMask& tm, int t,
                            float (&factor)[2]) {
  float neg_shift[2];
  tile_max(p, s, st, tm, t, factor, neg_shift);
  tile_exp(p, s, st, neg_shift);
}

/// o *= factor of its row; skipped when neither of the thread's rows moved its max (the
/// common case with kLazyRescale: a branch, taken by a warp only when one of its rows moved).
TS_DEVICE void rescale_o(float (&o)[kORegs], const float (&factor)[2]) {
  if (kLazyRescale && factor[0] == 1.0f && factor[1] == 1.0f) return;
#pragma unroll
  for (int i = 0; i < kORegs; ++i) o[i] *= factor[(i % 4) / 2];
}

/// P (S registers after tile_exp) packed to Elem pairs: the A fragments of O += P V.
TS_DEVICE void pack_p(const float (&s)[kSRegs], uint32_t (&pa)[kPSteps][4]) {
#pragma unroll
  for (int kk = 0; kk < kPSteps; ++kk) {
#pragma unroll
    for (int q = 0; q < 4; ++q) pa[kk][q] = pack_pair(s[8 * kk + 2 * q], s[8 * kk + 2 * q + 1]);
  }
}

/// Releases a K or V ring slot (`pred`: this thread is its warp's leader): one arrival on this
/// CTA's barrier and, with kPair, one on the other CTA's, whose producer writes half of the slot.
TS_DEVICE void release_slot(uint64_t* bar, bool pred) {
  ts::mbar_arrive_if(bar, pred);
  if (kPair) ts::mbar_arrive_cluster_if(ts::map_shared_rank(ts::smem_addr(bar), pair_rank() ^ 1), pred);
}

/// kPair: passes over `n` key tiles the pair loads for the other CTA only (outside this query
/// tile's range): waits for each to land (the next phase of the slot must not start before) and
/// releases it.
TS_DEVICE void skip_tiles(const Barriers& bs, Ring& ring, int n, bool warp_leader) {
  for (int i = 0; i < n; ++i) {
    ts::mbar_wait(&bs.full_k[ring.slot], ring.phase);
    release_slot(&bs.empty_k[ring.slot], warp_leader);
    ts::mbar_wait(&bs.full_v[ring.slot], ring.phase);
    release_slot(&bs.empty_v[ring.slot], warp_leader);
    ring.advance();
  }
}

/// S = Q K(t)^T in this consumer's turn, waited for; then the K slot (and after the last tile
/// the Q tile) is released and the online softmax turns S into P, with `factor` the rescale of O.
TS_DEVICE void score_tile(const Consumer& c, const Ring& ring, RowState& st, const TileMask& tm, int t, int t0,
                          float (&s)[kSRegs], float (&factor)[2]) {
  const uint32_t k_tile = tile_addr(c.smem_base + Smem::k, ring.slot);
  ts::mbar_wait(&c.bs.full_k[ring.slot], ring.phase);
  ts::named_barrier_sync(c.my_turn, kTurnThreads);
  ts::wgmma_fence_acc(s);
  ts::wgmma_fence();
  issue_qk(s, c.q_base, k_tile);
  ts::wgmma_commit();
  ts::named_barrier_arrive(c.next_turn, kTurnThreads);
  ts::wgmma_wait<0>();
  ts::wgmma_fence_acc(s);
  release_slot(&c.bs.empty_k[ring.slot], c.warp_leader);
  ts::mbar_arrive_if(c.bs.empty_q, c.warp_leader && t == t0);
  softmax_tile(c.p, s, st, tm, t, factor);
}

/// O += P V of ring slot `slot`, waited for; then the V slot is released.
TS_DEVICE void accumulate_pv(const Consumer& c, int slot, uint32_t phase, float (&o)[kORegs],
                             const uint32_t (&pa)[kPSteps][4]) {
  const uint32_t v_tile = tile_addr(c.smem_base + Smem::v, slot);
  ts::mbar_wait(&c.bs.full_v[slot], phase);
  ts::wgmma_fence_acc(o);
  ts::wgmma_fence();
  issue_pv(o, pa, v_tile);
  ts::wgmma_commit();
  ts::wgmma_wait<0>();
  ts::wgmma_fence_acc(o);
  release_slot(&c.bs.empty_v[slot], c.warp_leader);
}

/// One key tile at a time: S = Q K^T, softmax, O += P V, each GEMM waited for before the next
/// step. The consumers take turns issuing S.
TS_DEVICE void mainloop_simple(const Consumer& c, Ring& ring, RowState& st, float (&o)[kORegs], const TileMask& tm,
                               int t0, int t1) {
  for (int t = t1 - 1; t >= t0; --t) {
    float s[kSRegs];
    float factor[2];
    score_tile(c, ring, st, tm, t, t0, s, factor);
    rescale_o(o, factor);
    uint32_t pa[kPSteps][4];
    pack_p(s, pa);
    accumulate_pv(c, ring.slot, ring.phase, o, pa);
    ring.advance();
  }
}

/// Keeps the row maxima of a tile ahead of the wgmma_wait<0> that follows them. To ptxas the wait
/// is a scoreboard wait it may schedule anywhere after the commit, and it hoists it above the
/// max chains (the register fences of wgmma_fence_acc emit no PTX), so the warpgroup would wait
/// for the P V GEMM before doing any of the tile's work. A shared-memory store cannot cross the
/// wait, so storing a value that depends on both rows' maxima keeps the chains before it: one
/// FADD and one STS per tile, into this thread's own word of Smem::sink (never read).
TS_DEVICE void order_max_before_wait(float* sink, const float (&neg_shift)[2]) {
  *reinterpret_cast<volatile float*>(sink) = neg_shift[0] + neg_shift[1];
}

/// Whether the overlapped loop uses order_max_before_wait: everywhere but the split-KV variants
/// of three consumers (D = 64), where the store made ptxas spill (4 bytes in the masked one);
/// there the wait may come before the maxima, which then run while nothing else is in flight.
constexpr bool kOrderMaxBeforeWait = kConsumers == 2 || !kSplit;

/// Software-pipelined: while the tensor cores run S(t) = Q K(t)^T and O += P(t+1) V(t+1), the
/// warpgroup waits for S(t), finds its row maxima, then waits for the P V GEMM, rescales O,
/// computes P(t) = 2^(S - m) and packs it into the A fragments (FlashAttention-3's order: with the
/// wait before the exponentials, ptxas interleaves the packs with them, in the issue slots the
/// MUFU leaves free, instead of leaving 32 packs after the loop's last exponential: ~1169 -> ~1052
/// scheduled cycles per key tile at d128, and faster than the order that computed every
/// exponential before the wait: see this folder's NOTES.md). The consumers take turns issuing
/// each pair of GEMMs.
TS_DEVICE void mainloop_overlapped(const Consumer& c, Ring& ring, RowState& st, float (&o)[kORegs],
                                   const TileMask& tm, int t0, int t1) {
  uint32_t pa[kPSteps][4];
  {
    // First tile: S only (o is still 0: no rescale).
    float s[kSRegs];
    float factor[2];
    score_tile(c, ring, st, tm, t1 - 1, t0, s, factor);
    pack_p(s, pa);
  }
  int prev_slot = ring.slot;
  uint32_t prev_phase = ring.phase;
  ring.advance();
  for (int t = t1 - 2; t >= t0; --t) {
    float s[kSRegs];
    // Every wait and every release sits outside the window in which a wgmma is in flight: a
    // spin loop or a branch inside it makes ptxas serialise the wgmmas (C7520).
    const uint32_t k_tile = tile_addr(c.smem_base + Smem::k, ring.slot);
    const uint32_t v_tile = tile_addr(c.smem_base + Smem::v, prev_slot);
    ts::mbar_wait(&c.bs.full_k[ring.slot], ring.phase);
    ts::mbar_wait(&c.bs.full_v[prev_slot], prev_phase);
    ts::named_barrier_sync(c.my_turn, kTurnThreads);
    ts::wgmma_fence_acc(s);
    ts::wgmma_fence_acc(o);
    ts::wgmma_fence();
    issue_qk(s, c.q_base, k_tile);
    ts::wgmma_commit();
    issue_pv(o, pa, v_tile);
    ts::wgmma_commit();
    ts::named_barrier_arrive(c.next_turn, kTurnThreads);
    ts::wgmma_wait<1>();  // S(t) done; P V of the previous tile may still run
    ts::wgmma_fence_acc(s);
    float factor[2], neg_shift[2];
    tile_max(c.p, s, st, tm, t, factor, neg_shift);
    if (kOrderMaxBeforeWait) order_max_before_wait(c.sink, neg_shift);
    ts::wgmma_wait<0>();
    ts::wgmma_fence_acc(o);
    ts::wgmma_fence_operand(pa);  // P(t+1) retired: pack_p below may overwrite it
    release_slot(&c.bs.empty_k[ring.slot], c.warp_leader);
    ts::mbar_arrive_if(c.bs.empty_q, c.warp_leader && t == t0);
    release_slot(&c.bs.empty_v[prev_slot], c.warp_leader);
    rescale_o(o, factor);
    tile_exp(c.p, s, st, neg_shift);
    pack_p(s, pa);
    prev_slot = ring.slot;
    prev_phase = ring.phase;
    ring.advance();
  }
  accumulate_pv(c, prev_slot, prev_phase, o, pa);  // the last P V
}

TS_DEVICE void consumer(const HopperParams& hp, uint8_t* smem, uint64_t* bars, int wg) {
  const ts::AttentionParams& p = hp.p;
  uint64_t* full_q = bars;
  uint64_t* empty_q = bars + 1;
  uint64_t* full_k = bars + 2;
  uint64_t* empty_k = full_k + kStages;
  uint64_t* full_v = empty_k + kStages;
  uint64_t* empty_v = full_v + kStages;
  const int tid = threadIdx.x % 128;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const bool warp_leader = lane == 0;
  const uint32_t smem_base = ts::smem_addr(smem);
  const uint32_t q_base = smem_base + Smem::q + wg * kConsumerRows * 128;
  float* sink = reinterpret_cast<float*>(smem + Smem::sink) + wg * 128 + tid;
  const uint32_t my_turn = kTurnBarrier0 + wg;
  const uint32_t next_turn = kTurnBarrier0 + (wg + 1) % kConsumers;
  // The last consumer lets consumer 0 issue first.
  if (wg == kConsumers - 1) ts::named_barrier_arrive(kTurnBarrier0, kTurnThreads);

  const int* work_slot = hp.work_slots + blockIdx.x;
  const uint32_t rank = pair_rank();
  Ring ring;
  uint32_t q_phase = 0;
  for (;;) {
    // The producer publishes every item with rows to compute, then -1; each completes a phase of
    // full_q (with the Q tile, or by a plain arrival when no key is visible or the work is done).
    ts::mbar_wait(full_q, q_phase);
    q_phase ^= 1;
    // CTA-scope load: full_q's acquire orders it after the producer's store (memory_order.cuh).
    const int w = ts::ld_relaxed_cta(work_slot);
    if (w < 0) return;
    const Work wk = decode_work(hp, w);
    const ts::AttnSeq seq = ts::attn_seq(p, wk.b, wk.h);
    const ts::AttnMask mask = ts::AttnMask::of(p, seq);
    int m0, t0, t1, u0, u1;
    item_tiles(p, seq, wk, rank, m0, t0, t1, u0, u1);

    // This thread's two rows (sequence indices) and their visible key ranges.
    const int row[2] = {m0 + wg * kConsumerRows + warp * 16 + lane / 4, m0 + wg * kConsumerRows + warp * 16 + lane / 4 + 8};
    int first[2], end[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      first[r] = kMasked ? mask.first_key(row[r]) : 0;
      end[r] = kMasked ? mask.end_key(row[r]) : seq.len_k;
    }
    // Key range every row of the whole query tile sees (tiles inside it need no masking).
    const int tile_last = min(m0 + kBlockM, seq.len_q) - 1;
    const int full_lo = kMasked ? mask.first_key(tile_last) : 0;
    const int full_hi = kMasked ? mask.end_key(m0) : seq.len_k;

    float o[kORegs];
#pragma unroll
    for (int i = 0; i < kORegs; ++i) o[i] = 0.0f;
    RowState st;
    st.m[0] = st.m[1] = ts::kNegInf;
    st.l[0] = st.l[1] = 0.0f;
    const TileMask tm{first[0], first[1], end[0], end[1], seq.len_k, full_lo, full_hi};

    const Barriers bs{full_k, empty_k, full_v, empty_v, empty_q};
    const Consumer c{p, bs, q_base, smem_base, my_turn, next_turn, warp_leader, sink};
    if (t0 >= t1) {
      ts::mbar_arrive_if(empty_q, warp_leader);  // no Q tile to release
      if (kPair && u0 < u1) skip_tiles(bs, ring, u1 - u0, warp_leader);
    } else {
      // The pair's tiles run newest first: the other CTA's above this range, then this one's,
      // then the other's below it.
      if (kPair) skip_tiles(bs, ring, u1 - t1, warp_leader);
      if (kIntraOverlap)
        mainloop_overlapped(c, ring, st, o, tm, t0, t1);
      else
        mainloop_simple(c, ring, st, o, tm, t0, t1);
      if (kPair) skip_tiles(bs, ring, t0 - u0, warp_leader);
    }
    float (&m)[2] = st.m;
    float (&l)[2] = st.l;

    // Epilogue: normalise, store rows < len_q and columns < head_dim; LSE.
    float inv[2], lse[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float sum = ts::warp_allreduce_sum<4>(l[r]);
      const bool empty = m[r] == ts::kNegInf || !(sum > 0.0f);
      inv[r] = empty ? 0.0f : 1.0f / sum;
      lse[r] = empty ? ts::kNegInf : (m[r] + ts::log2_approx(sum)) * ts::kLn2;
    }
    const int cols = p.head_dim;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = row[r];
      // Tail launch: partial rows item-major (t * kBlockM + i - m0, no head dimension), and split
      // 0 names each row's place for the combine, rows past the sequence included (it skips them).
      const bool tail = kSplit && wk.tail >= 0;
      const long long tail_row = (long long)wk.tail * kBlockM + (i - m0);
      if (tail && wk.split == 0 && lane % 4 == 0) {
        int* meta = p.tail_meta + 3 * tail_row;
        meta[0] = wk.b;
        meta[1] = wk.h;
        meta[2] = i;
      }
      if (i >= seq.len_q) continue;
      if (kSplit) {
        const long long prow = tail ? wk.split * p.partial_rows + tail_row
                                    : (long long)(wk.split * p.heads_q + wk.h) * p.partial_rows + seq.row_q + i;
        float* dst = p.o_partial + prow * kHeadDim;
#pragma unroll
        for (int c = 0; c < kORegs / 4; ++c) {
          const int col = c * 8 + (lane % 4) * 2;
          *reinterpret_cast<float2*>(dst + col) = make_float2(o[4 * c + 2 * r] * inv[r], o[4 * c + 2 * r + 1] * inv[r]);
        }
        if (lane % 4 == 0) p.lse_partial[prow] = lse[r];
      } else {
        Elem* dst = static_cast<Elem*>(p.o) + seq.o_off + (long long)i * p.o_stride_n;
#pragma unroll
        for (int c = 0; c < kORegs / 4; ++c) {
          const int col = c * 8 + (lane % 4) * 2;
          if (col < cols)
            *reinterpret_cast<uint32_t*>(dst + col) = pack_pair(o[4 * c + 2 * r] * inv[r], o[4 * c + 2 * r + 1] * inv[r]);
        }
        if (p.lse != nullptr && lane % 4 == 0) {
          const long long off = p.cu_seqlens_q != nullptr ? seq.row_q : 0;
          p.lse[wk.h * p.lse_stride_h + wk.b * p.lse_stride_b + off + i] = lse[r];
        }
      }
    }
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1) flash_fwd_sm90(const __grid_constant__ HopperParams hp) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // The tiles need 1024-byte alignment (128-byte swizzle); the plan adds 1024 bytes of slack.
  uint8_t* smem = smem_raw + ((1024 - (ts::smem_addr(smem_raw) & 1023)) & 1023);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + Smem::bars);
  if (threadIdx.x == 0) {
    ts::mbar_init(&bars[0], 1);               // full_q: the producer's expect_tx
    ts::mbar_init(&bars[1], kConsumerWarps);  // empty_q
    // A pair's K/V slots are written by both producers, so both CTAs' consumers release them.
    constexpr uint32_t kSlotReleases = (kPair ? 2 : 1) * kConsumerWarps;
    for (int s = 0; s < kStages; ++s) {
      ts::mbar_init(&bars[2 + s], 1);                            // full_k
      ts::mbar_init(&bars[2 + kStages + s], kSlotReleases);      // empty_k
      ts::mbar_init(&bars[2 + 2 * kStages + s], 1);              // full_v
      ts::mbar_init(&bars[2 + 3 * kStages + s], kSlotReleases);  // empty_v
    }
    ts::mbar_init(&bars[2 + 4 * kStages], 1);      // mail_full: rank 1's expect_tx
    ts::mbar_init(&bars[3 + 4 * kStages], 1);      // mail_empty: rank 1's release
    ts::mbar_init_fence();
  }
  // A pair signals each other's barriers: both must be initialised first.
  if (kPair) ts::cluster_sync();
  else __syncthreads();
  // Broadcast from lane 0: the compiler then knows it is warp-uniform and keeps the wgmma
  // descriptor arithmetic that depends on it in uniform registers (no R2UR per wgmma).
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0);
  if (wg == 0) {
    ts::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) producer(hp, smem, bars);
    // The producer's warp meets again before the cluster barrier below: a lane that reached it
    // early could hold the warp there while lane 0 still spins in the producer (a hang seen while
    // bringing up CTA pairs).
    if (kPair) __syncwarp();
  } else {
    ts::setmaxnreg_inc<kConsumerRegs>();
    consumer(hp, smem, bars, wg - 1);
  }
  // No CTA of a pair leaves while the other may still arrive on its barriers.
  if (kPair) ts::cluster_sync();
}

#else

extern "C" __global__ void flash_fwd_sm90(const __grid_constant__ HopperParams hp) {
  // Built for a target without wgmma/TMA: the plan never launches this path there.
  __trap();
}

#endif
