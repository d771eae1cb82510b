//! GPU unit tests of the header-free device library (`src/cuda/*.cuh`), run by
//! `tessera verify` as an operator of their own ([`verify::cases`], [`verify::verify_case`]).
//!
//! Each primitive group the GEMM and sparse families will reuse has a small test kernel here
//! (one `.cu` file each, embedded with `include_str!`, opening with a comment that says what it
//! checks), run on fresh seeded random inputs with NaN-poisoned outputs and compared with an
//! independent CPU reference ([`reference`]) through [`crate::check::compare`]:
//!
//! | kernel              | wrappers under test                                          | arch    |
//! |---------------------|--------------------------------------------------------------|---------|
//! | `mma_sync.cu`       | `mma.cuh`: `mma_m16n8k16<f16/bf16>`, `pack2`, `ldmatrix_x4`, `ldmatrix_x4_trans`, `movmatrix_trans` | sm_80+ |
//! | `wgmma.cu`          | `wgmma.cuh`: `wgmma_desc_sw128`, `wgmma_desc_advance`, `wgmma_ss` / `wgmma_rs` at N = 64 (K-major and N-major B), fence/commit/wait | sm_90a |
//! | `tma_tile.cu`       | `tma.cuh` + `mbarrier.cuh`: `tma_load_4d` (2-D map, zero-filled out-of-bounds box parts at both edges, no swizzle and 128-byte swizzle), `tma_store_4d` (clipped) | sm_90a |
//! | `tma_multicast.cu`  | `tma_load_4d_multicast` in clusters of 2 (`cluster.cuh`)     | sm_90a  |
//! | `mbarrier_ring.cu`  | `mbar_init`, `mbar_arrive_expect_tx`, `mbar_arrive`, `mbar_wait` parity over several phases of a TMA-fed producer/consumer ring | sm_90a |
//! | `cp_async.cu`       | `async_copy.cuh`: `cp_async_16`, `cp_async_16_zfill`, commit / `cp_async_wait<N>` / `wait_all` in a 3- and 4-stage ring | sm_80+ |
//! | `convert.cu`        | `dtype.cuh`: fp8 e4m3 / e5m2 and f16 / bf16 conversions both ways (hardware and portable paths) | sm_80+ |
//!
//! What is not covered, and why:
//! * `ldmatrix` `.x1` / `.x2`: `mma.cuh` wraps only `.x4` (plain and `.trans`); the `.x4` tests
//!   exercise the same per-lane row addressing and transposition.
//! * 2-D TMA wrappers: `tma.cuh` has only the 4-D forms; the 2-D tiles are 4-D maps with two
//!   extents of 1 (how the attention kernels use them too).
//! * `mbarrier` without TMA bytes is covered through the ring's "empty" barriers (plain
//!   arrivals); `st_async_cluster` / `mbar_arrive_cluster_*` / `mbar_wait_cluster` (the softmax
//!   cluster exchange) are left to the softmax and attention verification that use them.
//! * `wgmma` shapes other than N = 64, `setmaxnreg`, `reduce.cuh`, `vec.cuh`, `math.cuh`,
//!   `online_softmax.cuh` and `memory_order.cuh`: covered only through the operators built on them.
//!
//! Without a GPU, `cargo test` checks the CPU references (every fp8 code round-trips, the
//! references agree with dtype.cuh's portable device code over the whole float sweep) and emulates
//! `mma_sync.cu`'s fragment handling from the PTX definitions of ldmatrix / movmatrix / mma
//! (`emulate.rs`).
//!
//! The kernels that need sm_90a are listed by [`ci_variants_for`] only for [`Arch::SM90`] and are
//! reported as skipped by [`verify::verify_case`] on other GPUs. `compile_tests.rs` compiles every
//! kernel for every CI architecture and requires it to spill nothing.

#[cfg(test)]
mod compile_tests;
#[cfg(test)]
mod emulate;
#[cfg(feature = "harness")]
mod operator;
#[cfg(feature = "harness")]
pub mod reference;
#[cfg(feature = "harness")]
pub mod verify;

use crate::dtype::DType;
use crate::runtime::{Arch, KernelKey, KernelSpec};

#[cfg(feature = "harness")]
pub use operator::OPERATOR;
#[cfg(feature = "harness")]
pub use verify::{cases, verify_case, Case};

const MMA_SYNC_SOURCE: &str = include_str!("mma_sync.cu");
const WGMMA_SOURCE: &str = include_str!("wgmma.cu");
const TMA_TILE_SOURCE: &str = include_str!("tma_tile.cu");
const TMA_MULTICAST_SOURCE: &str = include_str!("tma_multicast.cu");
const MBARRIER_RING_SOURCE: &str = include_str!("mbarrier_ring.cu");
const CP_ASYNC_SOURCE: &str = include_str!("cp_async.cu");
const CONVERT_SOURCE: &str = include_str!("convert.cu");

/// One compiled test kernel (its specialisation constants).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TestKernel {
    /// `mma_sync.cu` for `elem` (f16 or bf16); the fragment mode is a launch parameter.
    MmaSync { elem: DType },
    /// `wgmma.cu` for `elem` (f16 or bf16): A from shared memory (`wgmma_ss`, K-major B) or from
    /// registers (`wgmma_rs`, N-major B).
    Wgmma { elem: DType, a_in_registers: bool },
    /// `tma_tile.cu`: f32 boxes of 32 x 16 without swizzle, or f16 boxes of 64 x 32 with the
    /// 128-byte swizzle.
    TmaTile { elem: DType },
    /// `tma_multicast.cu` (f16, 128-byte swizzle, clusters of 2).
    TmaMulticast,
    /// `mbarrier_ring.cu` with `stages` slots.
    MbarrierRing { stages: u32 },
    /// `cp_async.cu` with `stages` slots.
    CpAsync { stages: u32 },
    /// `convert.cu`.
    Convert,
}

/// The TMA tile kernel's box (columns, rows) for its element type.
pub fn tma_tile_box(elem: DType) -> (u32, u32) {
    if elem == DType::F16 {
        (64, 32)
    } else {
        (32, 16)
    }
}

impl TestKernel {
    /// Whether the kernel needs sm_90a (wgmma, TMA, mbarrier, clusters).
    pub fn needs_sm90a(self) -> bool {
        matches!(
            self,
            TestKernel::Wgmma { .. }
                | TestKernel::TmaTile { .. }
                | TestKernel::TmaMulticast
                | TestKernel::MbarrierRing { .. }
        )
    }

    /// The kernel spec of this test kernel (its name and preamble from one [`KernelKey`]).
    pub fn spec(self) -> KernelSpec {
        match self {
            TestKernel::MmaSync { elem } => KernelKey::new("devicelib_mma_sync").ty("Elem", elem).spec(
                "mma_sync.cu",
                MMA_SYNC_SOURCE,
                "devicelib_mma_sync",
                &[],
            ),
            TestKernel::Wgmma { elem, a_in_registers } => KernelKey::new("devicelib_wgmma")
                .ty("Elem", elem)
                .int("kRegsA", "rs", a_in_registers as i64)
                .spec("wgmma.cu", WGMMA_SOURCE, "devicelib_wgmma", &[]),
            TestKernel::TmaTile { elem } => {
                let (cols, rows) = tma_tile_box(elem);
                KernelKey::new("devicelib_tma_tile")
                    .ty("Elem", elem)
                    .int("kBoxCols", "c", cols as i64)
                    .int("kBoxRows", "r", rows as i64)
                    .flag("kSwizzle128", "swizzle128", elem == DType::F16)
                    .spec("tma_tile.cu", TMA_TILE_SOURCE, "devicelib_tma_tile", &[])
            }
            TestKernel::TmaMulticast => KernelKey::new("devicelib_tma_multicast").spec(
                "tma_multicast.cu",
                TMA_MULTICAST_SOURCE,
                "devicelib_tma_multicast",
                &[],
            ),
            TestKernel::MbarrierRing { stages } => KernelKey::new("devicelib_mbarrier_ring")
                .int("kStages", "s", stages as i64)
                .spec("mbarrier_ring.cu", MBARRIER_RING_SOURCE, "devicelib_mbarrier_ring", &[]),
            TestKernel::CpAsync { stages } => KernelKey::new("devicelib_cp_async")
                .int("kStages", "s", stages as i64)
                .spec("cp_async.cu", CP_ASYNC_SOURCE, "devicelib_cp_async", &[]),
            TestKernel::Convert => {
                KernelKey::new("devicelib_convert").spec("convert.cu", CONVERT_SOURCE, "devicelib_convert", &[])
            }
        }
    }
}

/// Every test kernel the cases of [`verify::cases`] use on `arch`: the sm_90a-only ones only for
/// [`Arch::SM90`]. What CI compiles (compile_tests.rs) for each of [`Arch::CI_TARGETS`].
pub fn ci_variants_for(arch: Arch) -> Vec<TestKernel> {
    all_kernels()
        .into_iter()
        .filter(|k| !k.needs_sm90a() || arch == Arch::SM90)
        .collect()
}

/// [`ci_variants_for`] as kernel specs.
pub fn ci_specs_for(arch: Arch) -> Vec<KernelSpec> {
    ci_variants_for(arch).into_iter().map(TestKernel::spec).collect()
}

/// Every test kernel, whatever the architecture.
pub fn all_kernels() -> Vec<TestKernel> {
    let mut out = Vec::new();
    for elem in [DType::F16, DType::BF16] {
        out.push(TestKernel::MmaSync { elem });
    }
    for elem in [DType::F16, DType::BF16] {
        for a_in_registers in [false, true] {
            out.push(TestKernel::Wgmma { elem, a_in_registers });
        }
    }
    out.push(TestKernel::TmaTile { elem: DType::F32 });
    out.push(TestKernel::TmaTile { elem: DType::F16 });
    out.push(TestKernel::TmaMulticast);
    for stages in [2, 3] {
        out.push(TestKernel::MbarrierRing { stages });
    }
    for stages in [3, 4] {
        out.push(TestKernel::CpAsync { stages });
    }
    out.push(TestKernel::Convert);
    out
}
