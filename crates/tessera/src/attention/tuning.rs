//! [`AttentionTuning`]: the knobs that force a kernel choice, kept apart from the options that
//! change what attention computes ([`super::AttentionOptions`]).

use super::plan::AttentionPath;

/// Tuning knobs of an attention plan, reached as [`super::AttentionOptions::tuning`]: for
/// benchmarks and experiments; the defaults are what the dispatcher would choose. None of them
/// changes the result beyond rounding (a different tiling or split count sums in another
/// order); each one that does not apply to the chosen kernel is ignored by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionTuning {
    /// Kernel path. Default [`AttentionPath::Auto`]: Hopper on `sm_90`, else the Ampere kernel.
    pub path: AttentionPath,
    /// Split-KV count. Default `None`: the plan chooses from B, H, N and the SM count
    /// ([`super::plan::choose_splits`]); `Some(1)` disables split-KV. At most
    /// [`super::plan::MAX_SPLITS`].
    pub num_splits: Option<usize>,
    /// Keys per tile of the Ampere kernel for head dims 65..=128 without softcap. Default
    /// `None`: the plan chooses by the GPU's shared memory per SM (64 where two of its 96 KiB
    /// CTAs fit, as on Hopper; else 32; [`super::ampere::tiles`]); `Some(32)` or `Some(64)`
    /// forces it, for tests and benchmarks of the other GPUs' tiling (`Some(64)` where two such
    /// CTAs do not fit an SM runs one per SM, a tiling CI does not compile for those GPUs). An
    /// error elsewhere (other head dims, softcap, other values); the Hopper kernel ignores it.
    pub sm80_block_n: Option<u32>,
    /// Batch-heads per section of the Ampere kernel's work order. Default `None`: the plan
    /// chooses ([`super::ampere::sm80_head_group`]: sections where the heads' K/V together
    /// exceed L2); `Some(n)` (n >= 1) forces sections of n, for tests and benchmarks. The Hopper
    /// kernel ignores it.
    pub sm80_heads_per_section: Option<usize>,
    /// Keys per tile of the Hopper kernel for head dims 65..=128. Default `None`: the plan
    /// chooses ([`super::hopper::choose_block_n`]: 176 for long sequences of at least 2048
    /// queries where its padding costs little, 128 otherwise); `Some(128)` or `Some(176)` forces
    /// it, for tests and benchmarks. An error for other head dims or values; the Ampere kernel
    /// ignores it.
    pub hopper_block_n: Option<u32>,
    /// The Hopper plan's tail split. Default `true`: where a problem without masks or varlen,
    /// for which the plan chose no split-KV itself (`num_splits: None`), leaves its persistent
    /// CTAs a short last wave of equal work items, the plan runs those last items in a second
    /// launch after the first, each split along the keys over the whole GPU, and merges them
    /// ([`super::hopper::tail_split`]). `false` runs every item whole. The Ampere kernel ignores
    /// it.
    pub hopper_tail_split: bool,
    /// Caps the Hopper kernel's persistent grid. Default `None`: one CTA per SM. `Some(n)`
    /// (n >= 1) lets tests reach the tail split and other whole-wave effects on small problems.
    /// The Ampere kernel ignores it.
    pub hopper_max_ctas: Option<usize>,
    /// CTA pairs on the Hopper kernel: clusters of two CTAs on neighbouring query tiles of one
    /// head, each loading half of every K/V tile into both by TMA multicast (half the L2 reads
    /// of K and V). Default `None`: the plan chooses ([`super::hopper::use_cta_pairs`]: padded
    /// batches with sequences of at least [`super::hopper::PAIR_MIN_SEQLEN`] queries and keys);
    /// `Some(true)` runs pairs wherever the kernel has them (no split-KV, head dims 65..=256),
    /// varlen batches included, `Some(false)` never. `AttentionPlan::describe` says whether a
    /// plan took them. The Ampere kernel ignores it. (`tessera bench` sets it from
    /// `TESSERA_ATTN_HOPPER_PAIRS` where it is `None`.)
    pub hopper_cta_pairs: Option<bool>,
    /// Debugging aid: builds the Hopper kernel without intra-warpgroup pipelining (one key tile
    /// at a time, `TS_ATTN_SIMPLE_MAINLOOP`), to tell a pipelining bug from any other. Default
    /// `false`. The Ampere kernel ignores it. (`tessera bench` sets it from
    /// `TESSERA_ATTN_HOPPER_SIMPLE=1`.)
    pub hopper_simple_mainloop: bool,
}

impl Default for AttentionTuning {
    fn default() -> Self {
        AttentionTuning {
            path: AttentionPath::Auto,
            num_splits: None,
            sm80_block_n: None,
            sm80_heads_per_section: None,
            hopper_block_n: None,
            hopper_tail_split: true,
            hopper_max_ctas: None,
            hopper_cta_pairs: None,
            hopper_simple_mainloop: false,
        }
    }
}
