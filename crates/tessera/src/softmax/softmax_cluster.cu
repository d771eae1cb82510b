// softmax_cluster.cu: softmax / log_softmax of long rows, a row split across a thread-block
// cluster, each CTA's share of the row cached in shared memory in the input dtype.
//
// What. The same function as softmax.cu (see its header for the exact semantics of special
// values): x = in (InT), s = scale * log2(e); m = max_j round(x_j * s) (min over x when s < 0);
// d_j = fma(x_j, s, -m) clamped at 1 (ts::shifted_fma); softmax = 2^d_j / sum, log_softmax =
// d_j ln 2 - ln(sum). All -inf row: zeros / -inf. NaN anywhere: the row is NaN.
//
// Why. A row too long for one CTA's shared memory (fp16 131072 = 256 KB) otherwise has to be read
// twice from HBM (block-uncached path, ~2/3 of copy bandwidth). Here a cluster of kCluster CTAs
// (1, 2, 4 or 8; launched with a cluster dimension, scheduled together on one GPC) holds the row:
// rank k owns columns [k * chunk, min(cols, (k + 1) * chunk)), chunk a multiple of kPack. Each CTA
// reads its share from HBM exactly once, with cp.async 16-byte copies (every copy of the share in
// flight at once), reduces it, and the CTAs exchange two floats per row (the extreme of x and the
// sum) through distributed shared memory. Storing the input dtype (not f32) halves the shared
// memory of 16-bit rows, so more CTAs fit per SM and their loads overlap other CTAs' stores.
//
// Mapping. grid = kCluster * clusters CTAs of kBlockThreads threads; cluster c handles rows c,
// c + clusters, ... (every CTA of a cluster runs the same rows, so they reach each cluster_sync
// together). Plain schedule: thread t of a CTA copies packs t, t + kBlockThreads, ... of the
// CTA's share, and after a __syncthreads the passes over shared memory read elements t,
// t + kBlockThreads, ... (any thread may read any element). Pipelined schedule: packs t,
// t + kBlockThreads, ... in every pass (below).
//
// Shared memory (dynamic): round_up(chunk * sizeof(InT), 16) bytes for the share (both
// schedules); static: the exchange slots (2 floats) and 2 * kBlockThreads / 32 floats of block
// reduction. Per row, plain schedule: 2 cluster barriers (after publishing the extreme, after
// publishing the sum) and a __syncthreads before the next row's copies overwrite the share;
// pipelined schedule: one pass over the share folds (max, sum) into a ts::OnlineSoftmax per
// thread, then one block reduction and one cluster barrier (the states exchanged; static
// buffers of 2 x kWarps + 2 states, used by row parity), or in clusters of 8 the states sent by
// st.async into every CTA's inbox (static: 2 x 8 states and 2 mbarriers), completing on its
// mbarrier (kAsyncExchange below: no cluster barrier per row). One final cluster barrier keeps
// every CTA's shared memory alive until the others have read (or written) it.
//
// Launch contract (Rust: softmax/plan.rs):
//   * kPipeline: any grid is correct; the Rust side launches one wave of resident clusters for
//     it (each cluster runs several rows), eight for the plain schedule.
//   * kGlobalExchange (split-row): gridDim.x a multiple of kCluster, every CTA resident at once
//     (a cooperative launch), p.exchange / p.counters as described at SoftmaxClusterParams.
//   * kPack = 16 / sizeof(InT) requires in 16-byte aligned and in_stride a multiple of kPack
//     (then every share starts 16-byte aligned); kPack = 1 takes scalar loads. Output stores are
//     scalar or packed by the same rule on out/out_stride (kOutPack).
//   * kCluster > 1 (not kGlobalExchange) needs sm_90+ and a cluster launch with clusterDim.x == kCluster.
//   * chunk (p.chunk) = round_up(ceil(cols / kCluster), kPack); dynamic shared memory as above.
//   * kCopyGroups == 8 (pipelined schedule) needs at most 8 full packs per thread:
//     chunk / kPack <= 8 * kBlockThreads (else the kernel traps); kCopyGroups == 1 takes any.
//   * cols < 2^31; rows any (kClaimRows: rows < 2^31, row indices are 32-bit).
//
// Roofline: memory-bound; bytes = rows * cols * (sizeof(InT) + sizeof(OutT)), read and written
// once. Target: >= 90% of the device copy bandwidth. The long 16-bit rows are partly issue-bound
// (two exp2 and ~13 instructions per element against 4 bytes of traffic), so the pipelined
// passes leave out the clamp of d_j where it cannot act (ts::clamp_may_act, one branch per pack
// in the reduction and, kClampFreeStores, per row in the store pass) and fp16 outputs skip the
// +1 of kProbBias: fewer instructions per element, which the issue-bound 16-bit rows gain from
// (the fp32 rows stay level). Neither keeping the terms 2^d_j of the reduction pass in shared
// memory (as fp16: one exp2 per element, every output rounded twice) nor folding 1 / sum into
// the exponent (one FMUL less) gained more (see this folder's NOTES.md).
//
// Pipelined variant (kPipeline, Rust path "cluster-pipe"; needs kPack > 1, else it is the plain
// variant). The plain variant alternates, per CTA, a load phase (all copies of the share in flight,
// then wait) and a store phase, and stays well short of copy bandwidth on 1024 x 131072 and
// 256 x 262144 (see this folder's NOTES.md): with 1-3 CTAs per SM and waves of 16-48 clusters, HBM
// idles in one direction most of the time. Here every thread owns the same packs of the share in
// every pass (pack q = tid + k * kBlockThreads, the tail element tid): the copy, the one online
// (max, sum) pass (16-byte shared-memory reads) and the store pass. Ownership makes the per-row
// __syncthreads unnecessary (a thread's cp.async.wait_group makes its own copies visible to it),
// and lets the store pass refill each pack with the next row's copy as soon as the pack has been
// read and its outputs stored: the next row's loads overlap this row's stores, with no extra
// shared memory (a ring of one share). Write-after-read on a pack stays inside one thread: the
// ld.shared is program-ordered before the cp.async (asm volatile with a memory clobber), and
// the global store that consumes the loaded value is issued before the copy. Where a cluster
// thread holds at most 8 packs (kCopyGroups == 8: every 512-thread share and 1024-thread shares
// up to 128 KB), each pack's copy is its own commit group and the (max, sum) pass reads each
// pack as soon as its group has landed (CopyGroups below); larger shares commit one group per
// row. It gains on rows of 256-512 KB and loses on 64-128 KB rows (see this folder's NOTES.md);
// Auto now takes the split-row variant below for rows of 256 KB and more.

// Split-row variant (kGlobalExchange, Rust path "split-row"; pipelined schedule only). A hardware
// cluster holds at most 8 CTAs, so a row of more than 8 x 64 KB needs shares over 64 KB: one
// 1024-thread CTA per SM, too few to keep HBM busy (e.g. fp32 256 x 262144). Here the
// kCluster CTAs of a row (2..32) are ordinary CTAs blockIdx.x / kCluster * kCluster + rank, of
// one wave of resident CTAs on every SM (no GPC placement), and they exchange their per-row
// (max, sum) states through global memory instead of distributed shared memory: every row has
// a slot per CTA, written once per launch by the CTA's thread 0 as two relaxed 64-bit words that
// each carry the launch's tag, and threads r < kCluster poll rank r's slot until both words
// carry it (global_combine; no release / acquire fence: memory_order.cuh). Every CTA of a group
// is resident while any polls (a cooperative launch of at most one wave), so the waits end. The
// tag (epoch + 1) lives in device memory beside the slots and the last CTA of a launch advances
// the epoch, so consecutive launches never share tags, also when a captured graph replays one
// launch's parameters. Row schedule: group g takes rows g, g + groups, ... (static), or, in the
// kClaimRows variant, row g and then the rows its rank 0 claims from a counter (one atomic per
// row, issued at the top of the row; the claimed row travels to the other ranks in rank 0's
// slot), so every resident group works and faster groups take more rows; rank 0 also starts an
// L2 prefetch of the claimed row while its group waits in the exchange (prefetch_claimed_row).
// The plan takes the claiming variant where the static schedule would leave many resident groups unused (plan.rs
// split_claims_rows: it gains where the static schedule leaves groups idle, e.g. fp16 256 x 262144
// with 43 of 49 groups, but falls behind static where that uses every group, as the claim only
// adds work to each row; see this folder's NOTES.md). Workspace: three counters and
// rows * kCluster slots of 32 bytes, zeroed once by the plan (tag 0 is never valid).

#include "tessera/common.cuh"
#include "tessera/dtype.cuh"
#include "tessera/vec.cuh"
#include "tessera/math.cuh"
#include "tessera/reduce.cuh"
#include "tessera/online_softmax.cuh"
#include "tessera/async_copy.cuh"
#include "tessera/cluster.cuh"
#include "tessera/mbarrier.cuh"
#include "tessera/memory_order.cuh"

#ifndef TS_GENERATED_PREAMBLE
using InT = ts::f16;
using OutT = ts::f16;
constexpr bool kLogSoftmax = false;
constexpr int kBlockThreads = 512;
constexpr int kPack = 8;
constexpr int kOutPack = 8;
constexpr int kCluster = 8;
constexpr bool kPipeline = true;
constexpr bool kGlobalExchange = false;
constexpr int kCopyGroups = 8;
constexpr bool kClaimRows = false;
#endif

static_assert(kBlockThreads % 32 == 0 && kBlockThreads >= 64 && kBlockThreads <= 1024, "kBlockThreads");
static_assert(kPack == 1 || kPack * (int)sizeof(InT) == 16, "kPack: 1 or a 16-byte pack");
static_assert(kOutPack == 1 || kOutPack * (int)sizeof(OutT) <= 16, "kOutPack");
static_assert(kGlobalExchange || kCluster == 1 || kCluster == 2 || kCluster == 4 || kCluster == 8,
              "kCluster: 1, 2, 4 or 8 (a hardware cluster)");
static_assert(!kGlobalExchange || (kCluster >= 2 && kCluster <= 32 && kPipeline && kPack > 1),
              "split-row (global exchange): 2..32 CTAs per row, the pipelined schedule, 16-byte packs");
static_assert(kCopyGroups == 1 || kCopyGroups == 8, "kCopyGroups: one group per row, or one per pack (up to 8)");
#if defined(__CUDA_ARCH__) && !defined(TS_HAS_CLUSTERS)
static_assert(kCluster == 1 || kGlobalExchange, "clusters of CTAs need sm_90 or newer");
#endif

/// The parameters: SoftmaxParams of softmax.cu plus the share length.
struct SoftmaxClusterParams {
  const void* in;
  void* out;
  long long rows;
  long long cols;
  long long in_stride;
  long long out_stride;
  float scale_log2e;
  float scale;
  long long chunk;  // columns per CTA of a cluster, a multiple of kPack
  // Split-row path only (kGlobalExchange): the exchange slots, rows * kCluster of them (one per
  // row and CTA of its group), and three counters: the launch epoch (every slot word carries
  // epoch + 1; the last CTA of a launch advances it, so every launch, graph replays included,
  // tags its slots differently from the one before), the CTAs done and (kClaimRows) the rows
  // claimed past each group's first; the last CTA of a launch resets the last two. All zeroed
  // once by the plan.
  void* exchange;
  unsigned* counters;  // [0] epoch, [1] CTAs done in this launch, [2] rows claimed past the first
};
static_assert(sizeof(SoftmaxClusterParams) == 80, "mirror of the Rust struct");

namespace softmax_cluster {

constexpr int kWarps = kBlockThreads / ts::kWarpSize;
/// The pipelined schedule needs 16-byte copies (cp.async); scalar variants use the plain one.
constexpr bool kPipe = kPipeline && kPack > 1;
using InPack = ts::Pack<InT, kPack>;
/// Softmax outputs are 2^(d + kProbBias) * (kProbScale / sum) (ts::softmax_prob_bias: 1, or 0
/// for fp16 outputs, one instruction less per element).
constexpr float kProbBias = ts::softmax_prob_bias<OutT>;
constexpr float kProbScale = ts::softmax_prob_scale<OutT>;
/// The pipelined store pass has a clamp-free copy (see Roofline) only for 16-bit inputs with
/// per-pack copy groups: the second copy made the 1024-thread one-group kernels spill under their
/// 32-register cap and an fp32 split-row kernel under its 40 (sm_86).
constexpr bool kClampFreeStores = kCopyGroups > 1 && sizeof(InT) == 2;

#if defined(TS_HAS_CLUSTERS)
/// *p in the shared memory of cluster CTA `rank`.
TS_DEVICE float ld_rank(const float* p, uint32_t rank) {
  return ts::ld_shared_cluster(ts::map_shared_rank(ts::shared_address(p), rank));
}
TS_DEVICE ts::OnlineSoftmax ld_rank(const ts::OnlineSoftmax* p, uint32_t rank) {
  return ts::OnlineSoftmax{ld_rank(&p->m, rank), ld_rank(&p->d, rank)};
}
#endif

/// Combines a per-CTA value (a float, or an online-softmax state) over the cluster through the
/// exchange slots (after publishing it), in rank order, so every CTA gets the same bits. The
/// pipelined schedule uses two slots alternately (by row): no CTA passes the next exchange's
/// cluster barrier before every CTA has finished reading this one.
template <typename T, typename Op>
TS_DEVICE T cluster_combine(T mine, T* slot, Op op) {
  if constexpr (kCluster == 1) {
    return mine;
  } else {
#if defined(TS_HAS_CLUSTERS)
    if (threadIdx.x == 0) *slot = mine;
    ts::cluster_sync();  // every CTA's slot is written
    T v = ld_rank(slot, 0);
#pragma unroll
    for (int r = 1; r < kCluster; ++r) v = op(v, ld_rank(slot, r));
    return v;
#else
    return mine;  // not reached: kCluster > 1 is compiled for sm_90+ only
#endif
  }
}

/// The row state from the kCluster CTAs' states, merged in rank order (the same bits in every
/// CTA of the row).
TS_DEVICE ts::OnlineSoftmax merge_in_rank_order(const ts::OnlineSoftmax (&states)[kCluster]) {
  ts::OnlineSoftmax v = states[0];
#pragma unroll
  for (int r = 1; r < kCluster; ++r) v = ts::OnlineSoftmaxMergeOp{}(v, states[r]);
  return v;
}

#if defined(TS_HAS_CLUSTERS)
/// The pipelined schedule's exchange for clusters of 8 (kAsyncExchange): no cluster barrier.
/// Each CTA keeps an inbox of kCluster states and an mbarrier per row parity. Per row, thread r
/// < kCluster sends this CTA's state with st.async into slot `rank` of CTA r's inbox, which
/// completes 8 bytes on CTA r's mbarrier of that parity; thread `rank` writes its own slot and
/// announces the kCluster - 1 remote states (arrive.expect_tx, one arrival per phase). One warp
/// polls the barrier and the others wait at a CTA barrier (every thread polling measured the
/// same), then every thread merges the inbox in rank order (the same bits in every CTA).
/// Reuse: a CTA sends row i + 2 into a peer's inbox of parity i & 1 only after receiving the
/// peer's row i + 1, which the peer sent after the block reduction that follows its reads of row
/// i; and row i + 2's bytes land on the peer's barrier after its phase of row i completed.
/// With the inbox on every pipelined cluster, clusters of 8 gained or held (64 KB shares of 512
/// threads and 128 KB shares of 1024) and a cluster of 4 lost (see this folder's NOTES.md), so
/// smaller clusters keep the cluster barrier (cluster_combine).
constexpr bool kAsyncExchange = kPipeline && kPack > 1 && kCluster == 8 && !kGlobalExchange;
static_assert(!kAsyncExchange || kWarps > 1, "the inbox reuse argument needs the block reduction's barriers");
struct AsyncInbox {
  ts::OnlineSoftmax state[2][kCluster];
  uint64_t bar[2];
};
TS_DEVICE AsyncInbox& async_inbox() {
  __shared__ AsyncInbox inbox;
  return inbox;
}
/// Before the first row: the barriers exist in every CTA before any st.async signals them.
TS_DEVICE void async_exchange_init() {
  if (threadIdx.x == 0) {
    ts::mbar_init(&async_inbox().bar[0], 1);
    ts::mbar_init(&async_inbox().bar[1], 1);
    ts::mbar_init_fence();
  }
  ts::cluster_sync();
}
TS_DEVICE ts::OnlineSoftmax async_exchange(ts::OnlineSoftmax mine, unsigned iter, int rank) {
  AsyncInbox& in = async_inbox();
  const int p = (int)(iter & 1);
  const int t = threadIdx.x;
  if (t < kCluster) {
    if (t == rank) {
      in.state[p][rank] = mine;
      ts::mbar_arrive_expect_tx(&in.bar[p], (kCluster - 1) * (uint32_t)sizeof(ts::OnlineSoftmax));
    } else {
      ts::st_async_cluster(ts::map_shared_rank(ts::shared_address(&in.state[p][rank]), (uint32_t)t), mine.m, mine.d,
                           ts::map_shared_rank(ts::shared_address(&in.bar[p]), (uint32_t)t));
    }
  }
  if (t < ts::kWarpSize) ts::mbar_wait_cluster(&in.bar[p], (iter >> 1) & 1);  // phase iter / 2 of this parity
  __syncthreads();  // also orders the other warps' reads after warp 0's acquire
  return merge_in_rank_order(in.state[p]);
}
#else
constexpr bool kAsyncExchange = false;  // (stubs: the calls below are discarded branches)
TS_DEVICE void async_exchange_init() {}
TS_DEVICE ts::OnlineSoftmax async_exchange(ts::OnlineSoftmax mine, unsigned, int) { return mine; }
#endif

static_assert(!kClaimRows || kGlobalExchange, "kClaimRows: split-row kernels only");

/// One CTA's published state of one row (split-row path): two 64-bit words, (tag << 32) | bits
/// of m and (tag << 32) | bits of d, each single-copy atomic, so a reader that sees this
/// launch's tag in both holds the whole state (memory_order.cuh); in rank 0's slot of a
/// kClaimRows launch also (tag << 32) | the group's next row, twice. 32 bytes: with the 32-byte
/// counter header of the workspace every slot is a sector of its own.
struct ExchangeSlot {
  unsigned long long m_word, d_word;
  unsigned long long next_word, spare_word;  // rank 0 only: (tag << 32) | the group's next row
};
static_assert(sizeof(ExchangeSlot) == 32, "mirror of the Rust workspace size");

/// The split-row launch's tag: the epoch counter + 1 (1 .. 2^32 - 1; the counter runs over
/// 0 .. 2^32 - 2, so the zeroed slots of a new plan never carry a valid tag). Read by every
/// thread before its first copies, after the previous grid completed (ts::wait_prior_grids),
/// and changed only after every CTA of this launch finished. Every launch writes every slot of
/// the plan's shape, so a slot this launch has not written yet holds the previous launch's tag
/// (or 0 before the first): never this launch's.
TS_DEVICE unsigned split_tag(const SoftmaxClusterParams& p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  return *reinterpret_cast<const volatile unsigned*>(p.counters) + 1u;
#else
  return 0;
#endif
}

/// The split-row groups of this launch (gridDim.x / kCluster), read afresh where it is used:
/// hoisted out of the row loop it took a register and spilled the 40-register kernels.
TS_DEVICE unsigned split_groups() {
  unsigned n;
  asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(n));
  return n / (unsigned)kCluster;
}

/// Ends a split-row launch: the last CTA to finish resets the done count and advances the
/// epoch (no CTA of this launch reads it again; the next launch reads it after this one
/// completed).
TS_DEVICE void split_finish(const SoftmaxClusterParams& p) {
  __syncthreads();  // every thread of this CTA is past its last exchange
  if (threadIdx.x == 0) {
    __threadfence();  // (release side: this CTA's epoch read is ordered before its count)
    if (atomicAdd(&p.counters[1], 1u) == gridDim.x - 1) {
      __threadfence();  // (acquire side: every CTA's epoch read and claims are ordered before these)
      p.counters[1] = 0;
      p.counters[2] = 0;  // every claim of this launch is made (each CTA claimed before finishing)
      const unsigned next = p.counters[0] + 1u;
      p.counters[0] = next == 0xFFFFFFFFu ? 0u : next;  // the tag (epoch + 1) is never 0
    }
  }
}

/// The split-row path's exchange (kGlobalExchange): CTAs blockIdx.x / kCluster * kCluster + r,
/// r < kCluster, hold one row between them. Every row has its own kCluster slots (written once
/// per launch: no slot is reused within a launch, so a reader never races a later write).
/// Thread 0 publishes this CTA's state in its slot of the row with two relaxed 64-bit stores,
/// no fence; threads r < kCluster poll rank r's slot until both words carry this launch's tag;
/// every thread merges the kCluster states in rank order (the same bits in every CTA). `got`
/// alternates by row parity: one buffer would be race-free (the next row's block reduction has a
/// barrier every thread reaches after merging this row) but measured slower on fp16
/// 256 x 262144 and fp32 1024 x 131072 (see this folder's NOTES.md).
TS_DEVICE ts::OnlineSoftmax global_combine(ts::OnlineSoftmax mine, const SoftmaxClusterParams& p, int rank,
                                           long long row, int parity, unsigned tag, const unsigned* claim,
                                           unsigned* got_next) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  __shared__ ts::OnlineSoftmax got[2][kCluster];
  ExchangeSlot* slots = static_cast<ExchangeSlot*>(p.exchange) + row * kCluster;
  const unsigned long long tag_hi = (unsigned long long)tag << 32;
  if (threadIdx.x == 0) {
    if (kClaimRows && rank == 0) ts::st_relaxed_gpu_v2(&slots[0].next_word, tag_hi | *claim, tag_hi | *claim);
    ts::st_relaxed_gpu_v2(&slots[rank].m_word, tag_hi | __float_as_uint(mine.m), tag_hi | __float_as_uint(mine.d));
  }
  if (threadIdx.x < kCluster) {
    // kClaimRows: thread 0 of ranks > 0 also polls rank 0's claim, in the same round trips
    const bool want_next = kClaimRows && threadIdx.x == 0 && rank != 0;
    unsigned long long m_word, d_word, n_word = 0, spare;
    for (;;) {
      ts::ld_relaxed_gpu_v2(&slots[threadIdx.x].m_word, m_word, d_word);
      if (want_next) ts::ld_relaxed_gpu_v2(&slots[0].next_word, n_word, spare);
      if ((m_word >> 32) == tag && (d_word >> 32) == tag && (!want_next || (n_word >> 32) == tag)) break;
      ts::nanosleep(64);
    }
    got[parity][threadIdx.x] = ts::OnlineSoftmax{__uint_as_float((unsigned)m_word), __uint_as_float((unsigned)d_word)};
    if (kClaimRows && threadIdx.x == 0) got_next[parity] = rank == 0 ? *claim : (unsigned)n_word;
  }
  __syncthreads();
  return merge_in_rank_order(got[parity]);
#else
  static_assert(!kGlobalExchange, "the split-row exchange needs sm_70+ (strong relaxed accesses)");
  return mine;
#endif
}

/// The extreme of x that gives the row max of x * s: max for s > 0, min for s < 0.
struct Extreme {
  bool positive;
  TS_DEVICE float identity() const { return positive ? ts::kNegInf : ts::kPosInf; }
  TS_DEVICE float operator()(float a, float b) const { return positive ? ts::max_nan(a, b) : ts::min_nan(a, b); }
};

/// The row's output coefficient once m and the sum are known: softmax 2^-kProbBias / sum,
/// log_softmax -ln(sum); 0 for an all -inf row (sum 0), NaN for a NaN row.
TS_DEVICE float row_coef(float m, float sum) {
  float coef;
  if constexpr (kLogSoftmax) {
    coef = sum == 0.0f ? 0.0f : -logf(sum);
  } else {
    coef = sum == 0.0f ? 0.0f : kProbScale * ts::fast_rcp(sum);
  }
  return ts::is_nan(m) ? m : coef;
}

/// One output from its input x. kClamp false: the row's max m has !ts::clamp_may_act(m), so the
/// clamp of ts::shifted_fma cannot act and is left out (the same value).
template <bool kClamp = true>
TS_DEVICE float finish(float x, float s, float neg_shift, float coef) {
  const float d = kClamp ? ts::shifted_fma(x, s, neg_shift) : fmaf(x, s, neg_shift);
  if constexpr (kLogSoftmax) {
    return fmaf(d, ts::kLn2, coef);
  } else if constexpr (kProbBias != 0.0f) {
    return ts::exp2_approx(d + kProbBias) * coef;
  } else {
    return ts::exp2_approx(d) * coef;
  }
}

/// Pipelined schedule: a row's copies of this thread's packs k = 0, 1, ... (pack q = tid + k *
/// kBlockThreads) in kCopyGroups commit groups. kCopyGroups == 8 (shares of at most 8 packs per
/// thread, e.g. 64 KB of 512 threads): pack k is group k (groups past the thread's last pack are
/// empty, committed all the same: the waits count groups), and the reduction pass waits for
/// group k before reading pack k, so it reduces the first packs while the last are still
/// arriving: faster on the long rows of the default dispatch and on forced cluster-pipe, level
/// elsewhere (see this folder's NOTES.md). kCopyGroups == 1 (larger shares): one group per row,
/// waited for before the pass. One kernel holding both schedules behind a runtime test spilled
/// under the 40-register cap, so the plan picks the variant.
struct CopyGroups {
  int packs;  // the CTA's full packs; this thread's are tid, tid + kBlockThreads, ... < packs

  /// Calls f(q) for this thread's packs q, closing each commit group after its packs.
  template <typename F>
  TS_DEVICE void copy(F&& f) const {
    if constexpr (kCopyGroups == 1 && kGlobalExchange) {
      // (unrolled twice: the compiler's choice spilled the fp32 split-row kernel of 32 CTAs
      // per row under the 40-register cap)
#pragma unroll 2
      for (int q = threadIdx.x; q < packs; q += kBlockThreads) f(q);
      ts::cp_async_commit();
    } else if constexpr (kCopyGroups == 1) {
      for (int q = threadIdx.x; q < packs; q += kBlockThreads) f(q);
      ts::cp_async_commit();
    } else {
#pragma unroll
      for (int k = 0; k < kCopyGroups; ++k) {
        const int q = threadIdx.x + k * kBlockThreads;
        if (q < packs) f(q);
        ts::cp_async_commit();
      }
    }
  }

  /// Calls f(q) for this thread's packs q, each once its copy group has landed.
  template <typename F>
  TS_DEVICE void read(F&& f) const {
    if constexpr (kCopyGroups == 1) {
      ts::cp_async_wait_all();
      for (int q = threadIdx.x; q < packs; q += kBlockThreads) f(q);
    } else {
#pragma unroll
      for (int k = 0; k < kCopyGroups; ++k) {
        ts::cp_async_wait_pending(kCopyGroups - 1 - k);  // groups 0..k of this row have landed
        const int q = threadIdx.x + k * kBlockThreads;
        if (q < packs) f(q);
      }
    }
  }
};

/// kClaimRows, rank 0's thread 0 after its reduction pass: one L2 prefetch of the row its group
/// claimed (up to 1 MB of it), so HBM reads the row while the group waits in the exchange and
/// the other ranks learn which row it is (they copy it in the store pass). It gains on fp16
/// 256 x 262144, whose mostly empty last round of claimed rows leaves HBM idle; issued at the top
/// of the row instead, it lost. Not in the static schedule: every placement tried there (each CTA
/// its next share, rank 0 the group's whole next row, only the second row, only the last one or
/// two rows) was level or slower on fp16 / fp32 1024 x 131072 and fp32 256 x 262144: its full
/// rounds keep HBM busy and the prefetched lines compete with the copies for L2 (see this
/// folder's NOTES.md).
/// Split-row kernels read their input and write their output evict-first: the input copies take
/// an evict-first L2 policy and the outputs are stored with st.global.cs (kPipeStore): both
/// together gain on the fp16 split rows and hold on the fp32 ones, while either alone loses. The
/// cluster and cluster-pipe kernels keep the default policies: there both together are level and
/// evict-first stores alone lose, unlike in softmax.cu's kernels (see this folder's NOTES.md).
constexpr bool kStreamingSplit = kGlobalExchange;
constexpr ts::CacheStore kPipeStore = kStreamingSplit ? ts::CacheStore::kStreaming : ts::CacheStore::kDefault;

TS_DEVICE void prefetch_claimed_row(const SoftmaxClusterParams& p, unsigned next) {
  if ((long long)next >= p.rows) return;
  long long bytes = (p.cols * (long long)sizeof(InT)) & ~15ll;  // (the row starts 16-byte aligned)
  if (bytes > (1ll << 20)) bytes = 1ll << 20;
  if (bytes > 0) ts::prefetch_l2_bulk(static_cast<const InT*>(p.in) + (long long)next * p.in_stride, (uint32_t)bytes);
}

/// The pipelined schedule (kPipe) of one cluster's rows, its copies in kCopyGroups groups per
/// row (CopyGroups). rank, cluster, clusters, c0, n: as in rows().
TS_DEVICE void pipelined_rows(const SoftmaxClusterParams& p, InT* share, int rank, int cluster, int clusters,
                              int c0, int n) {
  __shared__ ts::OnlineSoftmax red_state[2][kWarps];  // block reduction, by row parity
  __shared__ ts::OnlineSoftmax slot_state[2];         // cluster exchange, by row parity
  const InT* in = static_cast<const InT*>(p.in);
  OutT* out = static_cast<OutT*>(p.out);
  const float s = p.scale_log2e;
  const Extreme ext_op{s > 0.0f};
  const int tid = threadIdx.x;
  const int packs = n / kPack;             // full packs (n % kPack only at the row end)
  const int tail = packs * kPack + tid;   // this thread's tail element (n - packs * kPack < kPack)
  const bool has_tail = tail < n;
  const InPack* spk = reinterpret_cast<const InPack*>(share);
  const CopyGroups groups{packs};
  if (kCopyGroups > 1 && packs > kCopyGroups * kBlockThreads) __trap();  // launch contract (Rust: plan.rs)
  // Split-row: the launch tag in a register of every thread, read before the first copies.
  // Thread 0 reading it after the prologue into shared memory (commit 6e2074a) slowed every
  // split-row shape (see this folder's NOTES.md).
  const unsigned tag = kGlobalExchange ? split_tag(p) : 0u;
  // One 16-byte input copy into the share (kStreamingSplit: evict-first in L2).
  const uint64_t in_policy = kStreamingSplit ? ts::l2_policy<ts::L2Evict::kFirst>() : 0;
  auto copy_in = [&](InT* dst, const InT* src) {
    if constexpr (kStreamingSplit) {
      ts::cp_async_16_hint(ts::smem_addr(dst), src, in_policy);
    } else {
      ts::cp_async_16(dst, src);
    }
  };

  // Prologue: the first row's copies.
  if (cluster < p.rows) {
    const InT* src = in + cluster * p.in_stride + c0;
    groups.copy([&](int q) { copy_in(share + q * kPack, src + q * kPack); });
    if (has_tail) share[tail] = ts::load_scalar(src + tail);
  }
  if constexpr (kAsyncExchange) async_exchange_init();

  // Rows: cluster, cluster + clusters, ... (hardware clusters); split-row groups start on row
  // `cluster` and then take the rows their rank 0 claims (see global_combine).
  __shared__ unsigned split_claim;    // split-row rank 0: the row it claimed for its group
  __shared__ unsigned split_next[2];  // split-row: the group's next row, by row parity
  unsigned iter = 0;                  // this CTA's row iteration
  // (claimed rows are 32-bit: fewer live registers under the 40-register cap; the plan claims
  // only below 2^31 rows)
  using RowIndex = ts::conditional_t<kClaimRows, unsigned, long long>;
  for (RowIndex row = (RowIndex)cluster; row < p.rows;
       row = kClaimRows ? (RowIndex)split_next[iter & 1] : row + (RowIndex)clusters, ++iter) {
    OutT* dst = out + row * p.out_stride + c0;
    // Split-row: rank 0 claims the group's next row now (an atomic on a global counter; only
    // warp 0 waits for it, while the others start the pass), and it travels to the other ranks
    // with rank 0's state in the exchange.
    if (kClaimRows && rank == 0 && threadIdx.x == 0) split_claim = split_groups() + atomicAdd(&p.counters[2], 1u);

    // ---- one pass: (max, sum) of the share as an online-softmax state (each pack as soon as it
    // has landed; only this thread reads it), then the CTA's and the cluster's (one block
    // reduction and one cluster exchange per row; buffers by row parity) ----
    ts::OnlineSoftmax st = ts::OnlineSoftmax::empty();
    groups.read([&](int q) {
      const ts::Array<float, kPack> f = ts::to_floats(spk[q]);
      float e = ext_op.identity();
#pragma unroll
      for (int k = 0; k < kPack; ++k) e = ext_op(e, f[k]);
      st.update_chunk_fma(f, s, __fmul_rn(e, s));  // clamp-free terms where they cannot need it
    });
    if (has_tail) {
      ts::Array<float, 1> t;
      t[0] = ts::to_float(share[tail]);
      st.update_chunk_fma(t, s, __fmul_rn(t[0], s));
    }
    if (kClaimRows && rank == 0 && threadIdx.x == 0) prefetch_claimed_row(p, split_claim);
    const int parity = (int)(iter & 1);
    st = ts::block_allreduce_softmax<kBlockThreads>(st, red_state[parity]);
    if constexpr (kGlobalExchange) {
      st = global_combine(st, p, rank, row, parity, tag, &split_claim, split_next);
    } else if constexpr (kAsyncExchange) {
      st = async_exchange(st, iter, rank);
    } else {
      st = cluster_combine(st, &slot_state[parity], ts::OnlineSoftmaxMergeOp{});
    }
    const float m = st.m;
    const float neg_shift = -ts::softmax_shift(m);
    const float coef = row_coef(m, st.d);

    // ---- store the outputs; refill each pack with the next row as soon as it is consumed ----
    // (two forms of one computation: each keeps its kernels spill-free under the register caps)
    bool more;
    const InT* next;
    if constexpr (kClaimRows) {
      const RowIndex next_row = (RowIndex)split_next[parity];
      more = next_row < p.rows;
      next = in + (more ? next_row : row) * p.in_stride + c0;
    } else {
      more = row + clusters < p.rows;
      next = in + (more ? row + clusters : row) * p.in_stride + c0;
    }
    // the clamp of finish only where it can act (ts::clamp_may_act, uniform across the row's
    // CTAs): two copies of the store loop, so no branch per pack
    auto store_row = [&](auto clamp) {
      groups.copy([&](int q) {
        const ts::Array<float, kPack> f = ts::to_floats(spk[q]);
        ts::Array<float, kPack> o;
#pragma unroll
        for (int k = 0; k < kPack; ++k) o[k] = finish<decltype(clamp)::value>(f[k], s, neg_shift, coef);
        if constexpr (kOutPack > 1) {
          ts::store_floats<kPipeStore>(dst + q * kPack, o);   // aligned: see the launch contract
        } else {
#pragma unroll
          for (int k = 0; k < kPack; ++k) ts::store_scalar<kPipeStore>(dst + q * kPack + k, ts::from_float<OutT>(o[k]));
        }
        if (more) copy_in(share + q * kPack, next + q * kPack);
      });
    };
    if (!kClampFreeStores || ts::clamp_may_act(m)) {
      store_row(ts::bool_constant<true>{});
    } else {
      store_row(ts::bool_constant<false>{});
    }
    if (has_tail) {
      const float v = ts::to_float(share[tail]);
      ts::store_scalar<kPipeStore>(dst + tail, ts::from_float<OutT>(finish(v, s, neg_shift, coef)));
      if (more) share[tail] = ts::load_scalar(next + tail);
    }
  }
  if constexpr (kGlobalExchange) split_finish(p);
#if defined(TS_HAS_CLUSTERS)
  if constexpr (kCluster > 1 && !kGlobalExchange) ts::cluster_sync();  // keep our slots / inboxes alive for the last remote accesses
#endif
}

/// One cluster's rows. Two schedules (see the header): plain (kPipe false) and pipelined.
TS_DEVICE void rows(const SoftmaxClusterParams& p) {
  __shared__ float red_ext[kWarps];
  __shared__ float red_sum[kWarps];
  __shared__ float slots[2];                  // cluster exchange: the extreme, the sum
  float* const slot_ext = &slots[0];
  float* const slot_sum = &slots[1];
  InT* share = ts::dynamic_smem<InT>();
#if defined(TS_HAS_CLUSTERS)
  const int rank = kGlobalExchange ? (int)(blockIdx.x % kCluster) : kCluster > 1 ? (int)ts::cluster_rank() : 0;
  const int cluster = kGlobalExchange ? (int)(blockIdx.x / kCluster)
                      : kCluster > 1  ? (int)ts::cluster_index_x()
                                      : (int)blockIdx.x;
  const int clusters = kGlobalExchange ? (int)(gridDim.x / kCluster)
                       : kCluster > 1  ? (int)ts::cluster_count_x()
                                       : (int)gridDim.x;
#else
  const int rank = kGlobalExchange ? (int)(blockIdx.x % kCluster) : 0;
  const int cluster = kGlobalExchange ? (int)(blockIdx.x / kCluster) : (int)blockIdx.x;
  const int clusters = kGlobalExchange ? (int)(gridDim.x / kCluster) : (int)gridDim.x;
#endif
  const InT* in = static_cast<const InT*>(p.in);
  OutT* out = static_cast<OutT*>(p.out);
  const int cols = (int)p.cols;
  const int chunk = (int)p.chunk;
  const float s = p.scale_log2e;
  const Extreme ext_op{s > 0.0f};
  const int tid = threadIdx.x;
  const int c0 = rank * chunk;                               // first column of this CTA's share
  const int n = c0 < cols ? (cols - c0 < chunk ? cols - c0 : chunk) : 0;  // its length (may be 0)
  const int packs = n / kPack;                                // full packs (n % kPack only at the row end)

  if constexpr (kPipe) {
    // ---- pipelined: every pass over this thread's own packs; the store pass refills them ----
    pipelined_rows(p, share, rank, cluster, clusters, c0, n);
    return;  // pipelined_rows ends with its own final cluster barrier
  } else {
    // ---- plain: copy the share (all copies in flight), barrier, reduce, store ----
    for (long long row = cluster; row < p.rows; row += clusters) {
      const InT* src = in + row * p.in_stride + c0;
      OutT* dst = out + row * p.out_stride + c0;

      // ---- copy the share to shared memory: every copy in flight before the first wait ----
      __syncthreads();  // the previous row's reads of the share are done
      if constexpr (kPack > 1) {
        for (int q = tid; q < packs; q += kBlockThreads) ts::cp_async_16(share + q * kPack, src + q * kPack);
        ts::cp_async_commit();
        for (int i = packs * kPack + tid; i < n; i += kBlockThreads) share[i] = ts::load_scalar(src + i);
        ts::cp_async_wait_all();
      } else {
        for (int i = tid; i < n; i += kBlockThreads) share[i] = ts::load_scalar<ts::CacheLoad::kStreaming>(src + i);
      }
      __syncthreads();

      // ---- extreme of x over the share, the CTA, the cluster ----
      float e = ext_op.identity();
      for (int i = tid; i < n; i += kBlockThreads) e = ext_op(e, ts::to_float(share[i]));
      e = ts::block_allreduce<kBlockThreads>(e, ext_op, ext_op.identity(), red_ext);
      e = cluster_combine(e, slot_ext, ext_op);
      const float m = __fmul_rn(e, s);                         // = max_j round(x_j * s)
      const float neg_shift = -ts::softmax_shift(m);

      // ---- sum of 2^d over the share, the CTA, the cluster ----
      float sum = 0.0f;
      for (int i = tid; i < n; i += kBlockThreads) sum += ts::exp2_approx(ts::shifted_fma(ts::to_float(share[i]), s, neg_shift));
      sum = ts::block_allreduce_sum<kBlockThreads>(sum, red_sum);
      sum = cluster_combine(sum, slot_sum, ts::SumOp{});

      const float coef = row_coef(m, sum);

      // ---- write the share's outputs ----
      auto finish = [&](float x) { return softmax_cluster::finish(x, s, neg_shift, coef); };
      if constexpr (kOutPack > 1) {
        const int opacks = n / kOutPack;
        for (int q = tid; q < opacks; q += kBlockThreads) {
          ts::Array<float, kOutPack> o;
#pragma unroll
          for (int k = 0; k < kOutPack; ++k) o[k] = finish(ts::to_float(share[q * kOutPack + k]));
          ts::store_floats(dst + q * kOutPack, o);
        }
        for (int i = opacks * kOutPack + tid; i < n; i += kBlockThreads) {
          ts::store_scalar(dst + i, ts::from_float<OutT>(finish(ts::to_float(share[i]))));
        }
      } else {
        for (int i = tid; i < n; i += kBlockThreads) {
          ts::store_scalar(dst + i, ts::from_float<OutT>(finish(ts::to_float(share[i]))));
        }
      }
    }
  }
#if defined(TS_HAS_CLUSTERS)
  if constexpr (kCluster > 1 && !kGlobalExchange) ts::cluster_sync();  // keep our slots alive for the last remote reads
#endif
}

}  // namespace softmax_cluster

// Occupancy: shares of up to 64 KB (512 threads) allow three CTAs per SM, larger ones (1024
// threads, up to ~113 KB) two. Without a minimum, ptxas gave the pipelined fp32 variant 48
// registers at kCluster = 8 (two CTAs of 512 threads per SM instead of three), so the pipelined
// schedule asks for 1536 (512 threads) or, on sm_90+, 2048 (1024 threads) resident threads:
// caps of 40 and 32 registers (on sm_80 the 32-register cap spilled 8 bytes: one CTA there).
// The plain schedule keeps the heuristic (32-40 registers).
#if defined(TS_HAS_CLUSTERS)
constexpr int kPipeMinBlocks1024 = 2;
#else
constexpr int kPipeMinBlocks1024 = 1;
#endif
constexpr int kMinBlocksPerSm = !softmax_cluster::kPipe    ? 0
                                : kBlockThreads >= 1024    ? kPipeMinBlocks1024
                                : 1536 / kBlockThreads > 0 ? 1536 / kBlockThreads
                                                           : 1;

extern "C" __global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSm)
    softmax_cluster_kernel(const __grid_constant__ SoftmaxClusterParams p) {
  ts::wait_prior_grids();  // programmatic dependent launch: no global access before this
  ts::allow_dependent_grids();
  softmax_cluster::rows(p);
}
