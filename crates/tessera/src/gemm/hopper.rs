//! Host side of the Hopper (sm_90a) GEMM path (`gemm_sm90.cu`): the call's arguments
//! ([`HopperGemmArgs`]), what the path supports ([`hopper_supports`]), the tile choice, the TMA
//! tensor maps, the kernel parameter struct and the plan ([`HopperGemmPlan`]: built once per
//! shape key, run many times without allocating).
//!
//! Computes, per batch `b`: `D = act(alpha * sa sb * A B + beta * C + bias) + R` with
//! - A `[M, K]` row-major (leading dimension `lda`): f16, bf16, f32 (read as tf32 by the tensor
//!   cores: the caller opted in), fp8 e4m3 / e5m2 or int8 ([`HOPPER_OPERANDS`]);
//! - B `[N, K]` row-major (`b_nk`, K-major: how LLM weights are stored) or, for 16-bit operands
//!   only, `[K, N]` row-major (wgmma reads tf32, fp8 and int8 operands K-major only);
//! - C, R, D `[M, N]` row-major in the output dtype ([`hopper_outputs`]: 16-bit operands write
//!   their own dtype or f32, tf32 f32, fp8 f16 / bf16 / f32, int8 s32 or f16 / bf16 / f32);
//! - sa (f32 `[1]` or `[M]`) and sb (f32 `[1]` or `[N]`): the dequantisation scales of fp8 and
//!   int8 operands (torch._scaled_mm's per-tensor and row-wise scales), null = 1;
//! - s32 output (int8 operands, torch._int_mm): the exact int32 sums (wrapping past 2^31 as the
//!   tensor core's s32 accumulator does), with no epilogue term, alpha 1 and no scales;
//! - bias `[N]` in the output dtype (as the GEMM core's API has it), shared by every batch;
//! - act: epilogue.cuh's codes (0 none, 1 relu, 2 gelu erf, 3 gelu tanh, 4 silu);
//! - GLU (`glu`, 16-bit operands, a kernel variant of its own): B has `2N` columns interleaved
//!   at granularity 1 (column `2j` the gate, `2j + 1` the up projection of output column `j`)
//!   and `D[m, j] = act(alpha g + bias[2j]) * (alpha u + bias[2j + 1])` with act the call's
//!   activation (silu: SwiGLU; gelu erf / tanh: GeGLU); the bias has `2N` values, no C,
//!   residual or scales. `n` stays D's width N.
//!
//! Alignment ([`hopper_supports`]): every matrix's base address 16-byte aligned, every leading
//! dimension and batch stride a multiple of 16 bytes (TMA's rule, kept for C and R as well so the
//! epilogue's pair loads are aligned); the bias aligned to two elements. M, N, K >= 1 and below 2^31; any M, N, K otherwise (TMA
//! zero-fills loads past the tensor and clips stores). C is read only when given (then `beta`
//! applies; a null C ignores beta, as BLAS with beta = 0 does not read C). C may alias D exactly
//! (same address, leading dimension and batch stride): every element is read before its tile is
//! stored.

use std::sync::{Arc, Mutex};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::tma::{self, L2Promotion, OobFill, Swizzle, TensorMap, TiledMap, TmaError};
use crate::runtime::{Arch, Context, Kernel, KernelKey, KernelParams, KernelSpec, LaunchConfig};

/// The GEMM path's own device headers: the shared epilogue (owned by the GEMM core; see
/// epilogue.cuh).
pub(crate) const DEVICE_HEADERS: &[(&str, &str)] = &[("tessera/gemm_epilogue.cuh", include_str!("epilogue.cuh"))];

/// Output rows per CTA tile (two consumer warpgroups of 64 rows).
pub(crate) const BLOCK_M: usize = 128;
/// Bytes of one operand row per pipeline stage: one 128-byte swizzle row (64 16-bit elements,
/// 32 tf32, 128 fp8 / int8).
pub(crate) const BLOCK_K_BYTES: usize = 128;

/// Reduction depth of one pipeline stage for operands of `dtype`.
pub(crate) fn block_k(dtype: DType) -> usize {
    BLOCK_K_BYTES / dtype.size()
}

/// Operand dtypes of the path (F32 is read as tf32).
pub(crate) const HOPPER_OPERANDS: [DType; 6] = [
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F8E4M3,
    DType::F8E5M2,
    DType::I8,
];

/// The output dtypes of an operand dtype on this path (gemm_sm90.cu's static_assert).
pub(crate) fn hopper_outputs(dtype: DType) -> &'static [DType] {
    match dtype {
        DType::F16 => &[DType::F16, DType::F32],
        DType::BF16 => &[DType::BF16, DType::F32],
        DType::F32 => &[DType::F32],
        DType::F8E4M3 | DType::F8E5M2 => &[DType::BF16, DType::F16, DType::F32, DType::F8E4M3, DType::F8E5M2],
        DType::I8 => &[DType::I32, DType::BF16, DType::F16, DType::F32],
        _ => &[],
    }
}
/// Threads per CTA: one producer and two consumer warpgroups.
pub(crate) const THREADS: u32 = 384;
/// Largest activation code (epilogue.cuh: 0 none, 1 relu, 2 gelu erf, 3 gelu tanh, 4 silu).
pub(crate) const MAX_ACTIVATION: u32 = 4;
/// Shared memory one CTA may use on sm_90 (227 KiB).
const SHARED_LIMIT: u32 = 227 * 1024;
/// Bytes of the epilogue's staging buffers: 2 consumers x 2 buffers x 64 rows x 128 bytes.
const STAGING_BYTES: u32 = 2 * 2 * 64 * 128;

/// One GEMM call on the Hopper path. Pointers are device addresses; leading dimensions and
/// batch strides count elements. Batch strides are ignored when `batch == 1`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HopperGemmArgs {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    /// Operand dtype of A and B ([`HOPPER_OPERANDS`]).
    pub dtype: DType,
    /// Dtype of D (and of C, R and the bias): one of [`hopper_outputs`].
    pub out_dtype: DType,
    /// A `[M, K]` row-major.
    pub a: u64,
    pub lda: usize,
    pub stride_a: usize,
    /// B `[N, K]` (`b_nk`) or `[K, N]` row-major.
    pub b: u64,
    pub ldb: usize,
    pub stride_b: usize,
    pub b_nk: bool,
    /// C `[M, N]` (0 = none; then `beta` is ignored).
    pub c: u64,
    pub ldc: usize,
    pub stride_c: usize,
    pub beta: f32,
    /// D `[M, N]`.
    pub d: u64,
    pub ldd: usize,
    pub stride_d: usize,
    /// Bias `[N]` in `out_dtype` (0 = none).
    pub bias: u64,
    /// Residual R `[M, N]` (0 = none), added after the activation.
    pub residual: u64,
    pub ldr: usize,
    pub stride_r: usize,
    pub alpha: f32,
    /// Activation code 0..=[`MAX_ACTIVATION`] (with `glu`: the gate's).
    pub activation: u32,
    /// The GLU epilogue: B has `2 n` interleaved gate/up columns, D has `n` (module docs).
    pub glu: bool,
    /// f32 scale of A's rows (0 = none): `[M]` when `scale_a_rows`, else `[1]`. 8-bit operands.
    pub scale_a: u64,
    pub scale_a_rows: bool,
    /// f32 scale of B's columns (0 = none): `[N]` when `scale_b_cols`, else `[1]`. 8-bit operands.
    pub scale_b: u64,
    pub scale_b_cols: bool,
    /// f32 `[1]` result scale of an fp8 output (0 = 1): D = fp8(scale_result * d).
    pub scale_result: u64,
    /// f32 `[1]` the kernel raises to `max |d|` (0 = none; fp8 outputs only; zeroed by
    /// [`HopperGemmPlan::run`] right before the launch).
    pub amax: u64,
}

/// What a [`HopperGemmPlan`] is built for: everything but the pointers, leading dimensions and
/// epilogue values (which every run may change).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct HopperShapeKey {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub b_nk: bool,
    pub dtype: DType,
    pub out_dtype: DType,
    /// The GLU variant (B has 2N columns).
    pub glu: bool,
}

impl HopperShapeKey {
    /// Columns of B (the kernel's N): `n`, or `2 n` with a GLU.
    pub(crate) fn b_n(&self) -> usize {
        if self.glu {
            2 * self.n
        } else {
            self.n
        }
    }
}

impl HopperGemmArgs {
    /// Columns of B (and the kernel's N): `n`, or `2 n` with a GLU.
    pub(crate) fn b_n(&self) -> usize {
        if self.glu {
            2 * self.n
        } else {
            self.n
        }
    }
    /// The plan key of this call.
    pub(crate) fn shape_key(&self) -> HopperShapeKey {
        HopperShapeKey {
            m: self.m,
            n: self.n,
            k: self.k,
            batch: self.batch,
            b_nk: self.b_nk,
            dtype: self.dtype,
            out_dtype: self.out_dtype,
            glu: self.glu,
        }
    }
}

/// One matrix operand's description, for [`hopper_supports`]'s rules.
struct Operand {
    name: &'static str,
    ptr: u64,
    /// A null pointer is an error (else: the operand is absent).
    required: bool,
    /// Bytes per element.
    size: usize,
    ld: usize,
    /// Elements of one row (the smallest valid `ld`).
    row_len: usize,
    stride: usize,
    rows: usize,
}

impl Operand {
    /// TMA's rules (16-byte aligned base, leading dimension and batch stride multiples of 16
    /// bytes below 2^40), the leading dimension covering a row, and for D batches that do not
    /// overlap.
    fn check(&self, batch: usize) -> std::result::Result<(), String> {
        let (name, size, ld) = (self.name, self.size, self.ld);
        if self.ptr == 0 {
            return if self.required {
                Err(format!("{name}: null device pointer"))
            } else {
                Ok(())
            };
        }
        if self.ptr % 16 != 0 {
            return Err(format!(
                "{name}: base address {:#x} is not 16-byte aligned (TMA and vector epilogue rule)",
                self.ptr
            ));
        }
        if ld < self.row_len {
            return Err(format!(
                "{name}: leading dimension {ld} is below the row length {}",
                self.row_len
            ));
        }
        if (ld * size) % 16 != 0 || ld * size >= MAX_STRIDE_BYTES {
            return Err(format!(
                "{name}: leading dimension {ld} x {size} bytes is not a multiple of 16 bytes below 2^40"
            ));
        }
        if batch > 1 {
            let stride = self.stride;
            if (stride * size) % 16 != 0 || stride == 0 || stride * size >= MAX_STRIDE_BYTES {
                return Err(format!(
                    "{name}: batch stride {stride} x {size} bytes is not a positive multiple of 16 bytes below 2^40"
                ));
            }
            let extent = ld * (self.rows - 1) + self.row_len;
            if name == "d" && stride < extent {
                return Err(format!(
                    "d: batch stride {stride} is below one batch's extent {extent} (batches of D would overlap)"
                ));
            }
        }
        Ok(())
    }
}

/// Largest M, N, K, batch and tile count (the kernel indexes them with `int`).
const MAX_DIM: usize = i32::MAX as usize;
/// TMA strides must stay below 2^40 bytes.
const MAX_STRIDE_BYTES: usize = 1 << 40;

/// Whether the Hopper path can run `args`, or the first rule it breaks (naming the argument).
/// Does not look at the device (the caller dispatches here on sm_90 only).
pub(crate) fn hopper_supports(args: &HopperGemmArgs) -> std::result::Result<(), String> {
    let a = args;
    if !HOPPER_OPERANDS.contains(&a.dtype) {
        return Err(format!(
            "dtype: the Hopper GEMM takes fp16, bf16, fp32 (as tf32), fp8e4m3, fp8e5m2 or i8 operands, got {}",
            a.dtype
        ));
    }
    let outputs = hopper_outputs(a.dtype);
    if !outputs.contains(&a.out_dtype) {
        let names: Vec<&str> = outputs.iter().map(|d| d.name()).collect();
        return Err(format!(
            "out_dtype: the Hopper GEMM writes {} for {} operands, got {}",
            names.join(", "),
            a.dtype,
            a.out_dtype
        ));
    }
    if a.dtype.size() != 2 && !a.b_nk {
        return Err(format!(
            "b: {} operands need B stored [N, K] (K-major); wgmma reads only 16-bit B [K, N]",
            a.dtype
        ));
    }
    let eight_bit = a.dtype.size() == 1;
    let fp8_out = a.out_dtype.size() == 1;
    for (name, ptr) in [("scale_result", a.scale_result), ("amax", a.amax)] {
        if ptr != 0 && !fp8_out {
            return Err(format!("{name}: applies to fp8 outputs only, got {}", a.out_dtype));
        }
        if ptr % 4 != 0 {
            return Err(format!("{name}: address {ptr:#x} is not 4-byte aligned (f32)"));
        }
    }
    if fp8_out && (a.c != 0 || a.bias != 0 || a.residual != 0) {
        return Err(format!(
            "out_dtype: an {} output takes no C, bias or residual; ask for bf16, f16 or f32 output for those terms",
            a.out_dtype
        ));
    }
    for (name, ptr) in [("scale_a", a.scale_a), ("scale_b", a.scale_b)] {
        if ptr != 0 && !eight_bit {
            return Err(format!(
                "{name}: scales apply to fp8 and int8 operands only, got {}",
                a.dtype
            ));
        }
        if ptr % 4 != 0 {
            return Err(format!("{name}: address {ptr:#x} is not 4-byte aligned (f32 scales)"));
        }
    }
    if a.out_dtype == DType::I32
        && (a.c != 0
            || a.bias != 0
            || a.residual != 0
            || a.activation != 0
            || a.alpha != 1.0
            || a.scale_a != 0
            || a.scale_b != 0)
    {
        return Err(
            "out_dtype: an i32 output is the plain int8 product (torch._int_mm): no C, bias, residual, \
             activation, scales, and alpha 1; ask for f32, f16 or bf16 output to dequantise"
                .into(),
        );
    }
    for (name, v) in [("m", a.m), ("n", a.n), ("k", a.k), ("batch", a.batch)] {
        if v == 0 || v > MAX_DIM {
            return Err(format!("{name}: must be in 1..=2^31-1 on the Hopper path, got {v}"));
        }
    }
    if a.glu {
        if a.dtype.size() != 2 {
            return Err(format!(
                "glu: the GLU epilogue takes f16 or bf16 operands, got {}",
                a.dtype
            ));
        }
        if a.c != 0 || a.residual != 0 {
            return Err("glu: no C or residual with a GLU epilogue (D = act(gate) * up)".into());
        }
        if a.n > MAX_DIM / 2 {
            return Err(format!("n: 2N = {} columns of B exceed 2^31 - 1", 2 * a.n as u128));
        }
    }
    let tiles = a.m.div_ceil(BLOCK_M) as u128 * a.b_n().div_ceil(128) as u128 * a.batch as u128;
    if tiles > MAX_DIM as u128 {
        return Err(format!(
            "batch: {tiles} output tiles exceed the kernel's 32-bit tile index"
        ));
    }
    if a.activation > MAX_ACTIVATION {
        return Err(format!(
            "activation: code {} is not one of 0 none, 1 relu, 2 gelu_erf, 3 gelu_tanh, 4 silu",
            a.activation
        ));
    }
    let es = a.dtype.size();
    let os = a.out_dtype.size();
    let (b_rows, b_cols) = if a.b_nk { (a.b_n(), a.k) } else { (a.k, a.b_n()) };
    let operand = |name, ptr, required, size, ld, row_len, stride, rows| Operand {
        name,
        ptr,
        required,
        size,
        ld,
        row_len,
        stride,
        rows,
    };
    let operands = [
        operand("a", a.a, true, es, a.lda, a.k, a.stride_a, a.m),
        operand("b", a.b, true, es, a.ldb, b_cols, a.stride_b, b_rows),
        operand("d", a.d, true, os, a.ldd, a.n, a.stride_d, a.m),
        operand("c", a.c, false, os, a.ldc, a.n, a.stride_c, a.m),
        operand("residual", a.residual, false, os, a.ldr, a.n, a.stride_r, a.m),
    ];
    for o in &operands {
        o.check(a.batch)?;
    }
    if a.bias != 0 && a.bias % (2 * os as u64) != 0 {
        return Err(format!(
            "bias: base address {:#x} is not aligned to two elements ({} bytes: the epilogue loads pairs)",
            a.bias,
            2 * os
        ));
    }
    if a.c != 0 && a.c == a.d && (a.ldc != a.ldd || (a.batch > 1 && a.stride_c != a.stride_d)) {
        return Err("c: aliases d with a different leading dimension or batch stride".into());
    }
    Ok(())
}

/// A CTA tiling: 128 x `block_n` output tiles, `stages` k-blocks in the ring; `pingpong`: each
/// consumer warpgroup computes whole tiles of its own, in turns (gemm_sm90.cu), instead of both
/// sharing every tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct HopperTile {
    pub block_n: u32,
    pub stages: u32,
    pub pingpong: bool,
}

/// The kernel's tilings: 128 x 256 (what the fastest public Hopper GEMMs run on large shapes:
/// two m64n256 consumers, 85 flop per shared-memory byte), 128 x 128 (half the columns, for N
/// where 256-column tiles waste a large share of a wave) and 128 x 128 ping-pong (each consumer
/// its own tile as two m64n128 halves, so one's epilogue runs while the other's MMAs do). Each
/// takes the ring depth that fills 192 KiB, leaving 32 KiB for the epilogue's staging buffers.
pub(crate) const TILES: [HopperTile; 3] = [
    HopperTile {
        block_n: 256,
        stages: 4,
        pingpong: false,
    },
    HopperTile {
        block_n: 128,
        stages: 6,
        pingpong: false,
    },
    PINGPONG_TILE,
];

/// The ping-pong tiling (TILES[2]).
pub(crate) const PINGPONG_TILE: HopperTile = HopperTile {
    block_n: 128,
    stages: 6,
    pingpong: true,
};

/// Time of a 128 x 128 tile relative to half a 128 x 256 one: its k-blocks do half the MMA
/// work for two thirds of the bytes, and the tensor cores run m64n128 below their m64n256 rate.
const NARROW_TILE_COST: f64 = 1.1;

/// The tiling for an M x N x batch output on `sms` SMs: each candidate's time is modelled as
/// (tiles per CTA, rounded up: whole waves) x (time per tile); the 128-column tile costs
/// [`NARROW_TILE_COST`] / 2 of the 256-column one. 256 wins ties (fewer, larger tiles).
pub(crate) fn choose_tile(m: usize, n: usize, batch: usize, sms: u32) -> HopperTile {
    let sms = sms.max(1) as u64;
    let waves = |bn: usize| (m.div_ceil(BLOCK_M) as u64 * n.div_ceil(bn) as u64 * batch as u64).div_ceil(sms) as f64;
    let wide = waves(256) * 2.0;
    let narrow = waves(128) * NARROW_TILE_COST;
    if narrow < wide {
        TILES[1]
    } else {
        TILES[0]
    }
}

/// Dynamic shared memory of a tiling: the A and B rings, the staging buffers, the barriers and
/// 1024 bytes of slack to align the base to the 128-byte swizzle's period.
pub(crate) fn shared_bytes(tile: HopperTile) -> u32 {
    let bytes = tile.stages * (BLOCK_M * BLOCK_K_BYTES + tile.block_n as usize * BLOCK_K_BYTES) as u32
        + STAGING_BYTES
        + 16 * tile.stages
        + 1024;
    debug_assert!(bytes <= SHARED_LIMIT, "tile {tile:?} needs {bytes} B of shared memory");
    bytes
}

/// CTAs per cluster for `tiles_m` tile rows: 2 (vertically adjacent tiles sharing each B tile
/// by multicast, gemm_sm90.cu) when there are tile-row pairs to make and an odd count wastes at
/// most a ninth of them (the last pair's second tile lies past M), else 1.
pub(crate) fn choose_cluster(tiles_m: usize) -> u32 {
    if tiles_m >= 2 && (tiles_m % 2 == 0 || tiles_m >= 9) {
        2
    } else {
        1
    }
}

/// Tile rows per group of the tile order (gemm_sm90.cu tile_of): the `grid` tiles in flight
/// then cover about `group` x `grid / group` tiles, a square of D when `group` ~ sqrt(grid *
/// block_n / 128) (16 for 132 CTAs of 256 columns), so A and B are each read from HBM about once
/// per sqrt(grid) tiles. Clamped to the tile rows there are.
pub(crate) fn group_rows(tiles_m: usize, grid: u32, block_n: u32) -> u32 {
    let ideal = ((grid as f64) * block_n as f64 / BLOCK_M as f64).sqrt().round() as usize;
    ideal.clamp(1, tiles_m.max(1)) as u32
}

/// The kernel variant of an operand dtype, output dtype, B layout, tiling and GLU epilogue.
pub(crate) fn kernel_key(dtype: DType, out_dtype: DType, b_nk: bool, tile: HopperTile, glu: bool) -> KernelKey {
    KernelKey::new("gemm_sm90")
        .ty("Elem", dtype)
        .ty("OutT", out_dtype)
        .int("kBlockN", "n", tile.block_n)
        .int("kStages", "s", tile.stages)
        .flag("kBNK", "bnk", b_nk)
        .flag("kGlu", "glu", glu)
        .flag("kPingPong", "pp", tile.pingpong)
}

fn spec(key: &KernelKey) -> KernelSpec {
    key.spec(
        "gemm_sm90.cu",
        include_str!("gemm_sm90.cu"),
        "gemm_sm90",
        DEVICE_HEADERS,
    )
}

/// Every variant this path can launch on `arch`: on sm_90, each operand dtype x each of its
/// [`hopper_outputs`] x {B [N, K], and for 16-bit operands [K, N]} x [`TILES`] (69 kernels),
/// and the GLU variants of the 16-bit operands (24 more); none elsewhere. Activations, scales
/// and the epilogue's inputs are run-time values.
pub(crate) fn kernel_specs(arch: Arch) -> Vec<KernelSpec> {
    if arch != Arch::SM90 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for dtype in HOPPER_OPERANDS {
        for &out_dtype in hopper_outputs(dtype) {
            let layouts: &[bool] = if dtype.size() == 2 { &[true, false] } else { &[true] };
            for &b_nk in layouts {
                for tile in TILES {
                    out.push(spec(&kernel_key(dtype, out_dtype, b_nk, tile, false)));
                    if dtype.size() == 2 {
                        out.push(spec(&kernel_key(dtype, out_dtype, b_nk, tile, true)));
                    }
                }
            }
        }
    }
    out
}

/// The kernel parameter of `gemm_sm90`, mirrored by `GemmParams` in gemm_sm90.cu (576 bytes).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub(crate) struct GemmParams {
    pub a_map: TensorMap,
    pub b_map: TensorMap,
    pub d_map: TensorMap,
    pub c: u64,
    pub residual: u64,
    pub bias: u64,
    pub ldc: i64,
    pub c_batch_stride: i64,
    pub ldr: i64,
    pub r_batch_stride: i64,
    pub alpha: f32,
    pub beta: f32,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub batch: i32,
    pub tiles_m: i32,
    pub tiles_n: i32,
    pub k_blocks: i32,
    pub group_m: i32,
    pub activation: i32,
    pub pad_: i32,
    pub scale_a: u64,
    pub scale_b: u64,
    pub scale_a_rows: i32,
    pub scale_b_cols: i32,
    pub scale_result: u64,
    pub amax: u64,
    pub cluster_m: i32,
    pub cluster_rows: i32,
}

// SAFETY: plain data with the C layout of `GemmParams` in gemm_sm90.cu (the kernel
// static_asserts its size, 576 bytes; hopper_tests checks this side and the field offsets).
unsafe impl KernelParams for GemmParams {}

/// The geometry of one 2-D (batched) operand's tensor map: `(cols, rows, batch, 1)` with byte
/// strides, a box of `box_cols x box_rows`, 128-byte swizzle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MapShape {
    pub ptr: u64,
    pub dtype: DType,
    pub cols: usize,
    pub rows: usize,
    pub batch: usize,
    /// Elements between rows and between batches (the latter ignored when batch == 1).
    pub ld: usize,
    pub batch_stride: usize,
    pub box_cols: u32,
    pub box_rows: u32,
    /// Load maps promote to L2 in 256-byte lines; the store map does not promote.
    pub load: bool,
}

impl MapShape {
    /// `(dims, byte strides)` of the 4-D map; a batch of one gets the packed stride (any valid
    /// value would do) and the trailing extent-1 dimension the whole tensor's.
    pub(crate) fn geometry(&self) -> ([u64; 4], [u64; 3]) {
        let es = self.dtype.size() as u64;
        let row = self.ld as u64 * es;
        let batch = if self.batch > 1 {
            self.batch_stride as u64 * es
        } else {
            row * self.rows.max(1) as u64
        };
        let dims = [self.cols as u64, self.rows as u64, self.batch as u64, 1];
        (dims, [row, batch, batch * self.batch as u64])
    }

    pub(crate) fn encode(&self) -> std::result::Result<TensorMap, TmaError> {
        let (dims, strides) = self.geometry();
        tma::encode_tiled(&TiledMap {
            ptr: self.ptr,
            dtype: self.dtype,
            dims: &dims,
            byte_strides: &strides,
            stride_names: &["row", "batch", "tensor"],
            box_dims: &[self.box_cols, self.box_rows, 1, 1],
            element_strides: &[1, 1, 1, 1],
            swizzle: Swizzle::B128,
            l2_promotion: if self.load {
                L2Promotion::B256
            } else {
                L2Promotion::None
            },
            oob_fill: OobFill::Zeros,
        })
    }
}

/// The A, B and D tensor maps of a call on a tiling and cluster size (gemm_sm90.cu's header
/// lists their boxes; in a cluster of two, each CTA loads half of a B [N, K] tile's rows).
/// 8-bit operands are described to TMA as bytes (it has no fp8 or s8 type; a copy moves bits).
pub(crate) fn map_shapes(a: &HopperGemmArgs, tile: HopperTile, cluster_m: u32) -> [MapShape; 3] {
    let bk = block_k(a.dtype);
    let (b_cols, b_rows, b_box_rows, b_box_cols) = if a.b_nk {
        (a.k, a.b_n(), tile.block_n / cluster_m, bk as u32)
    } else {
        (a.b_n(), a.k, bk as u32, 64)
    };
    let map_dtype = if a.dtype.size() == 1 { DType::U8 } else { a.dtype };
    [
        MapShape {
            ptr: a.a,
            dtype: map_dtype,
            cols: a.k,
            rows: a.m,
            batch: a.batch,
            ld: a.lda,
            batch_stride: a.stride_a,
            box_cols: bk as u32,
            box_rows: BLOCK_M as u32,
            load: true,
        },
        MapShape {
            ptr: a.b,
            dtype: map_dtype,
            cols: b_cols,
            rows: b_rows,
            batch: a.batch,
            ld: a.ldb,
            batch_stride: a.stride_b,
            box_cols: b_box_cols,
            box_rows: b_box_rows,
            load: true,
        },
        MapShape {
            ptr: a.d,
            // fp8 outputs are stored as bytes (TMA has no fp8 type)
            dtype: if a.out_dtype.size() == 1 {
                DType::U8
            } else {
                a.out_dtype
            },
            cols: a.n,
            rows: a.m,
            batch: a.batch,
            ld: a.ldd,
            batch_stride: a.stride_d,
            box_cols: (128 / a.out_dtype.size()) as u32,
            box_rows: (BLOCK_M / 2) as u32,
            load: false,
        },
    ]
}

fn tma_error(e: TmaError) -> Error {
    match e {
        TmaError::Misaligned(w) => Error::invalid("tensor map", w),
        TmaError::Invalid(e) | TmaError::Driver(e) => e,
    }
}

/// A Hopper GEMM plan: the tiling, the loaded kernel and the persistent grid for one
/// [`HopperShapeKey`], and the tensor maps of the last pointers it ran on (a run on the same
/// operands reuses them; others are encoded on the host, which allocates nothing).
pub(crate) struct HopperGemmPlan {
    key: HopperShapeKey,
    tile: HopperTile,
    kernel: Arc<Kernel>,
    grid: u32,
    /// CTAs per cluster (1 or 2, [`choose_cluster`]); `grid` counts CTAs.
    cluster_m: u32,
    tiles_m: usize,
    tiles_n: usize,
    group_m: u32,
    /// Tensor maps of the last [`MAP_CACHE`] operand sets (capacity reserved at planning, so a
    /// run never allocates), replaced oldest first.
    maps: Mutex<MapCache>,
}

/// Operand sets whose tensor maps a plan keeps: a benchmark's rotated inputs, or a layer's
/// few weight matrices of one shape.
pub(crate) const MAP_CACHE: usize = 8;

struct MapCache {
    entries: Vec<([MapShape; 3], [TensorMap; 3])>,
    next: usize,
}

impl HopperGemmPlan {
    /// Plans `key` on `ctx` (an sm_90 device) with the tiling [`choose_tile`] picks.
    #[cfg(any(test, feature = "harness"))]
    pub(crate) fn new(ctx: &Context, key: &HopperShapeKey) -> Result<HopperGemmPlan> {
        let tile = choose_tile(key.m, key.b_n(), key.batch, ctx.info().sm_count);
        Self::with_tile(ctx, key, tile, None, None)
    }

    /// Plans `key` with a given tiling, cluster size and tile-order group (tests and benchmarks
    /// force each; `None`: [`choose_cluster`]'s and [`group_rows`]'s). A cluster of two falls
    /// back to one where the device cannot co-schedule any.
    pub(crate) fn with_tile(
        ctx: &Context,
        key: &HopperShapeKey,
        tile: HopperTile,
        cluster: Option<u32>,
        group: Option<u32>,
    ) -> Result<HopperGemmPlan> {
        if group == Some(0) {
            return Err(Error::invalid(
                "hopper_group_rows",
                "0: a group of the tile order holds at least one (cluster) tile row",
            ));
        }
        if ctx.arch() != Arch::SM90 {
            return Err(Error::Unsupported(format!(
                "the Hopper GEMM path runs on sm_90 only, this device is {}",
                ctx.arch()
            )));
        }
        if !TILES.contains(&tile) {
            return Err(Error::Unsupported(format!(
                "no Hopper GEMM tiling {tile:?}; tilings: {TILES:?}"
            )));
        }
        let kernel = ctx.kernel(&spec(&kernel_key(key.dtype, key.out_dtype, key.b_nk, tile, key.glu)))?;
        let tiles_m = key.m.div_ceil(BLOCK_M);
        let tiles_n = key.b_n().div_ceil(tile.block_n as usize);
        let mut cluster_m = match cluster {
            None => choose_cluster(tiles_m),
            Some(c @ (1 | 2)) => c,
            Some(c) => {
                return Err(Error::invalid(
                    "hopper_cluster",
                    format!("{c}: the Hopper GEMM runs clusters of 1 or 2 CTAs"),
                ))
            }
        };
        // persistent clusters: as many as the device co-schedules (a GPC's SM count need not be
        // even), at most one per cluster tile
        let mut slots = ctx.info().sm_count.max(1) as usize;
        if cluster_m == 2 {
            let cfg = LaunchConfig::clustered(2, THREADS, shared_bytes(tile), 2);
            match kernel.max_active_clusters(ctx, cfg)? {
                0 => cluster_m = 1,
                n => slots = n as usize,
            }
        }
        let cluster_rows = tiles_m.div_ceil(cluster_m as usize);
        let cluster_tiles = cluster_rows * tiles_n * key.batch;
        let clusters = cluster_tiles.min(slots) as u32;
        Ok(HopperGemmPlan {
            key: *key,
            tile,
            kernel,
            grid: clusters * cluster_m,
            cluster_m,
            tiles_m,
            tiles_n,
            // groups of cluster rows: a cluster tile is 128 cluster_m rows, so per 128 rows
            // it is block_n / cluster_m wide
            group_m: match group {
                Some(g) => g.min(cluster_rows.max(1) as u32),
                None => group_rows(cluster_rows, clusters, tile.block_n / cluster_m),
            },
            maps: Mutex::new(MapCache {
                entries: Vec::with_capacity(MAP_CACHE),
                next: 0,
            }),
        })
    }

    /// The tiling this plan runs.
    #[cfg(any(test, feature = "harness"))]
    pub(crate) fn tile(&self) -> HopperTile {
        self.tile
    }

    /// The loaded kernel.
    pub(crate) fn kernel(&self) -> &Arc<Kernel> {
        &self.kernel
    }

    /// CTAs per cluster.
    #[cfg(any(test, feature = "harness"))]
    pub(crate) fn cluster_m(&self) -> u32 {
        self.cluster_m
    }

    /// The launch: the persistent grid (of clusters of `cluster_m`), 384 threads, the tiling's
    /// shared memory; a programmatic dependent launch (the kernel waits for the previous grid
    /// after its barrier set-up).
    pub(crate) fn launch_config(&self) -> LaunchConfig {
        if self.cluster_m > 1 {
            LaunchConfig::clustered(self.grid, THREADS, shared_bytes(self.tile), self.cluster_m).with_dependent_launch()
        } else {
            LaunchConfig::linear(self.grid, THREADS, shared_bytes(self.tile)).with_dependent_launch()
        }
    }

    /// The tensor maps for `args`: cached ones when these operands ran recently, else encoded on
    /// the host (no allocation) and cached in place of the oldest entry.
    fn maps(&self, args: &HopperGemmArgs) -> Result<[TensorMap; 3]> {
        let shapes = map_shapes(args, self.tile, self.cluster_m);
        let mut cache = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, m)) = cache.entries.iter().find(|(s, _)| *s == shapes) {
            return Ok(*m);
        }
        let maps = [
            shapes[0].encode().map_err(tma_error)?,
            shapes[1].encode().map_err(tma_error)?,
            shapes[2].encode().map_err(tma_error)?,
        ];
        if cache.entries.len() < MAP_CACHE {
            cache.entries.push((shapes, maps));
        } else {
            let at = cache.next;
            cache.entries[at] = (shapes, maps);
        }
        cache.next = (cache.next + 1) % MAP_CACHE;
        Ok(maps)
    }

    /// Runs the GEMM for `args` (whose shape key must be the plan's) on `ctx`'s stream.
    pub(crate) fn run(&self, ctx: &Context, args: &HopperGemmArgs) -> Result<()> {
        if args.shape_key() != self.key {
            return Err(Error::invalid(
                "args",
                format!("shape {:?} differs from the plan's {:?}", args.shape_key(), self.key),
            ));
        }
        hopper_supports(args).map_err(|rule| Error::invalid("args", rule))?;
        let [a_map, b_map, d_map] = self.maps(args)?;
        let batched = args.batch > 1;
        let params = GemmParams {
            a_map,
            b_map,
            d_map,
            // BLAS rule: beta = 0 never reads C (a NaN there must not reach D).
            c: if args.beta == 0.0 { 0 } else { args.c },
            residual: args.residual,
            bias: args.bias,
            ldc: args.ldc as i64,
            c_batch_stride: if batched { args.stride_c as i64 } else { 0 },
            ldr: args.ldr as i64,
            r_batch_stride: if batched { args.stride_r as i64 } else { 0 },
            alpha: args.alpha,
            beta: args.beta,
            m: args.m as i32,
            // the kernel's N counts B's columns (2N with a GLU; D has N)
            n: args.b_n() as i32,
            k: args.k as i32,
            batch: args.batch as i32,
            tiles_m: self.tiles_m as i32,
            tiles_n: self.tiles_n as i32,
            k_blocks: args.k.div_ceil(block_k(args.dtype)) as i32,
            group_m: self.group_m as i32,
            activation: args.activation as i32,
            pad_: 0,
            scale_a: args.scale_a,
            scale_b: args.scale_b,
            scale_a_rows: i32::from(args.scale_a_rows),
            scale_b_cols: i32::from(args.scale_b_cols),
            scale_result: args.scale_result,
            amax: args.amax,
            cluster_m: self.cluster_m as i32,
            cluster_rows: self.tiles_m.div_ceil(self.cluster_m as usize) as i32,
        };
        let cfg = self.launch_config();
        if args.amax != 0 {
            zero_f32(ctx, args.amax)?;
        }
        // SAFETY: `params` mirrors the kernel's GemmParams; hopper_supports checked that every
        // operand is non-null, aligned and described with leading dimensions covering its rows,
        // and the tensor maps bound every TMA access to the tensors' extents (loads zero-fill,
        // stores clip); C and R are read only at rows < M, columns < N of their leading
        // dimensions; the caller guarantees the addresses are live device allocations of at
        // least those extents and that nothing else writes D meanwhile.
        unsafe { self.kernel.launch(ctx, cfg, &params) }
    }
}

/// Zeroes the f32 at device address `ptr` on the context's stream (the amax, before the kernel
/// raises it; after every check of the call, so that a refused call writes nothing).
pub(crate) fn zero_f32(ctx: &Context, ptr: u64) -> Result<()> {
    ctx.bind()?;
    // SAFETY: the caller passes a checked, 4-byte aligned f32 of this context's device
    // (hopper_supports / run_scaled_amax); the memset is ordered on the stream like the kernel.
    crate::runtime::context::check("cuMemsetD32Async", unsafe {
        cudarc::driver::sys::cuMemsetD32Async(ptr, 0, 1, ctx.cu_stream())
    })
}

// ---- GPU self-check and benchmark (`tessera verify gemm`'s Hopper jobs; tests) ----------------

#[cfg(any(test, feature = "harness"))]
pub(crate) use self_check::*;

/// The Hopper jobs of `tessera verify gemm`: the kernel against an f64 host reference, the
/// tf32/fp8/int8 contracts through `GemmPlan`, and the kernel beside cuBLAS.
#[cfg(any(test, feature = "harness"))]
mod self_check {
    use super::*;

    /// A small xorshift generator: uniform values in [-1, 1) for the self-check.
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> f32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    /// Host values of a device buffer: its dtype and little-endian storage.
    struct Host {
        dtype: DType,
        bytes: Vec<u8>,
    }

    impl Host {
        /// `len` random values in [-scale, scale) rounded to `dtype` (fp8 saturating); int8 takes
        /// the whole range -128..=127 whatever `scale`.
        fn random(dtype: DType, len: usize, scale: f32, rng: &mut Lcg) -> Host {
            let size = dtype.size();
            let mut bytes = vec![0u8; len * size];
            for i in 0..len {
                let x = rng.next();
                match dtype {
                    DType::I8 => bytes[i] = ((x * 128.0).floor().clamp(-128.0, 127.0) as i8) as u8,
                    DType::I32 => bytes[4 * i..4 * i + 4].copy_from_slice(&((x * 1000.0) as i32).to_le_bytes()),
                    d => crate::numeric::store(d, x * scale, &mut bytes[i * size..]),
                }
            }
            Host { dtype, bytes }
        }
        fn get(&self, i: usize) -> f64 {
            match self.dtype {
                DType::I8 => self.bytes[i] as i8 as f64,
                DType::I32 => i32::from_le_bytes(self.bytes[4 * i..4 * i + 4].try_into().unwrap_or([0; 4])) as f64,
                d => crate::numeric::load(d, &self.bytes, i),
            }
        }
    }

    /// A device buffer holding a [`Host`]'s bytes, kept alive with its address.
    struct Dev {
        dtype: DType,
        buf: crate::runtime::DeviceBuffer<u8>,
    }

    impl Dev {
        fn upload(ctx: &Context, h: &Host) -> Result<Dev> {
            Ok(Dev {
                dtype: h.dtype,
                buf: ctx.upload(&h.bytes)?,
            })
        }
        fn alloc(ctx: &Context, dtype: DType, len: usize) -> Result<Dev> {
            Ok(Dev {
                dtype,
                buf: ctx.alloc(len * dtype.size())?,
            })
        }
        fn ptr(&self) -> u64 {
            self.buf.device_ptr()
        }
        fn poison(&mut self) -> Result<()> {
            self.buf.fill_bytes(0xff)
        }
        fn download(&self) -> Result<Host> {
            Ok(Host {
                dtype: self.dtype,
                bytes: self.buf.to_host()?,
            })
        }
    }

    /// One self-check case.
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct CheckCase {
        pub m: usize,
        pub n: usize,
        pub k: usize,
        pub batch: usize,
        pub dtype: DType,
        pub out_dtype: DType,
        pub b_nk: bool,
        pub tile: Option<HopperTile>,
        /// CTAs per cluster forced (None: the plan's rule).
        pub cluster: Option<u32>,
        /// (Cluster) tile rows per group of the tile order forced (None: the plan's rule).
        pub group: Option<u32>,
        pub bias: bool,
        /// beta of C (None: no C); `c_is_d` reads C from D's buffer (filled with C first).
        pub beta: Option<f32>,
        pub c_is_d: bool,
        pub residual: bool,
        pub alpha: f32,
        pub activation: u32,
        /// Dequantisation scales of 8-bit operands: 0 none, 1 per-tensor, 2 per-row of A and
        /// per-column of B.
        pub scales: u8,
        /// The GLU epilogue: B has 2N interleaved gate/up columns, `activation` is the gate's.
        pub glu: bool,
    }

    impl CheckCase {
        const fn plain(m: usize, n: usize, k: usize, dtype: DType, b_nk: bool) -> CheckCase {
            CheckCase {
                m,
                n,
                k,
                batch: 1,
                dtype,
                out_dtype: dtype,
                b_nk,
                tile: None,
                cluster: None,
                group: None,
                bias: false,
                beta: None,
                c_is_d: false,
                residual: false,
                alpha: 1.0,
                activation: 0,
                scales: 0,
                glu: false,
            }
        }
        /// A plain case with another output dtype.
        const fn out(self, out_dtype: DType) -> CheckCase {
            CheckCase { out_dtype, ..self }
        }
        /// The rel-l2 budget: the output dtype's, widened for tf32 operands (10-bit mantissas) and
        /// fp8 operands (the tensor core adds fp8 products with fewer than f32's bits); s32 outputs
        /// must be exact.
        fn budget(&self) -> f64 {
            let out = self.out_dtype.rel_l2_budget();
            match self.dtype {
                DType::F32 => out.max(5e-3),
                DType::F8E4M3 | DType::F8E5M2 => out.max(1e-3),
                _ => out,
            }
        }
    }

    /// The self-check's cases: odd M/N/K tails (below, at and past a tile), both B layouts, both
    /// dtypes, f32 output, both tilings forced, batches, and every epilogue input and activation.
    pub(crate) fn check_cases() -> Vec<CheckCase> {
        use DType::{BF16, F16, F32, F8E4M3, F8E5M2, I32, I8};
        let narrow = Some(TILES[1]);
        let wide = Some(TILES[0]);
        let pingpong = Some(PINGPONG_TILE);
        vec![
            CheckCase::plain(256, 512, 256, BF16, true),
            CheckCase::plain(129, 257, 100, BF16, true),
            CheckCase::plain(129, 257, 100, F16, false),
            CheckCase::plain(1, 7, 13, F16, true),
            CheckCase::plain(7, 1, 1, BF16, false),
            CheckCase {
                tile: narrow,
                ..CheckCase::plain(127, 129, 4095 - 4000 + 64, BF16, false)
            },
            CheckCase {
                tile: wide,
                ..CheckCase::plain(300, 1000, 520, F16, true)
            },
            CheckCase {
                out_dtype: F32,
                bias: true,
                alpha: 0.5,
                activation: 2,
                ..CheckCase::plain(200, 130, 77, F16, false)
            },
            CheckCase {
                bias: true,
                activation: 3,
                tile: narrow,
                ..CheckCase::plain(300, 1000, 512, BF16, true)
            },
            CheckCase {
                beta: Some(0.7),
                residual: true,
                activation: 4,
                ..CheckCase::plain(64, 96, 1000, BF16, false)
            },
            CheckCase {
                beta: Some(-1.25),
                c_is_d: true,
                activation: 1,
                batch: 3,
                out_dtype: F32,
                ..CheckCase::plain(127, 300, 129, BF16, true)
            },
            CheckCase {
                batch: 2,
                bias: true,
                residual: true,
                activation: 2,
                ..CheckCase::plain(513, 640, 1024, F16, true)
            },
            // tf32, fp8 and int8 operands (B [N, K] only), with K tails inside their longer k-blocks
            CheckCase::plain(129, 257, 100, F32, true),
            CheckCase {
                bias: true,
                activation: 4,
                tile: narrow,
                ..CheckCase::plain(200, 130, 77, F32, true)
            },
            CheckCase::plain(256, 512, 256, F8E4M3, true).out(BF16),
            CheckCase {
                scales: 1,
                ..CheckCase::plain(129, 257, 100, F8E4M3, true).out(F32)
            },
            CheckCase {
                scales: 2,
                bias: true,
                activation: 2,
                tile: wide,
                ..CheckCase::plain(300, 1000, 520, F8E4M3, true).out(BF16)
            },
            CheckCase {
                scales: 2,
                beta: Some(0.5),
                residual: true,
                ..CheckCase::plain(127, 129, 300, F8E5M2, true).out(F16)
            },
            CheckCase::plain(256, 512, 256, I8, true).out(I32),
            CheckCase {
                batch: 2,
                ..CheckCase::plain(129, 257, 1000, I8, true).out(I32)
            },
            CheckCase {
                scales: 2,
                bias: true,
                tile: narrow,
                ..CheckCase::plain(1, 7, 13, I8, true).out(BF16)
            },
            CheckCase {
                scales: 1,
                alpha: 0.25,
                ..CheckCase::plain(200, 130, 4100, I8, true).out(F32)
            },
            // GLU (SwiGLU / GeGLU): B [2N, K] or [K, 2N] interleaved; odd N tails, both tilings,
            // bias [2N], f32 output, batches
            CheckCase {
                glu: true,
                activation: 4,
                ..CheckCase::plain(256, 512, 256, BF16, true)
            },
            CheckCase {
                glu: true,
                activation: 4,
                bias: true,
                alpha: 0.5,
                tile: narrow,
                ..CheckCase::plain(129, 257, 100, BF16, true)
            },
            CheckCase {
                glu: true,
                activation: 2,
                tile: wide,
                ..CheckCase::plain(300, 1000, 520, F16, false)
            },
            CheckCase {
                glu: true,
                activation: 3,
                bias: true,
                batch: 2,
                ..CheckCase::plain(127, 129, 300, BF16, false).out(F32)
            },
            CheckCase {
                glu: true,
                activation: 4,
                ..CheckCase::plain(1, 7, 13, F16, true).out(F32)
            },
            // clusters of two sharing B by multicast (the rule picks them for an even tile-row
            // count, as in the first case above): forced off, forced on an odd tile-row count
            // (the last pair's second tile past M) with both B layouts and tilings, a batch,
            // 8-bit operands, and more cluster tiles than co-resident clusters (several per
            // cluster, the ring continuing across them)
            CheckCase {
                cluster: Some(1),
                ..CheckCase::plain(256, 512, 256, BF16, true)
            },
            CheckCase {
                cluster: Some(2),
                tile: wide,
                ..CheckCase::plain(300, 1000, 520, F16, true)
            },
            CheckCase {
                cluster: Some(2),
                tile: narrow,
                bias: true,
                activation: 3,
                ..CheckCase::plain(300, 1000, 520, BF16, false)
            },
            CheckCase {
                cluster: Some(2),
                tile: wide,
                ..CheckCase::plain(300, 1000, 520, BF16, false)
            },
            CheckCase {
                cluster: Some(2),
                batch: 3,
                beta: Some(0.5),
                ..CheckCase::plain(300, 300, 129, BF16, true)
            },
            CheckCase {
                cluster: Some(2),
                scales: 2,
                tile: wide,
                ..CheckCase::plain(300, 1000, 520, F8E4M3, true).out(BF16)
            },
            CheckCase {
                cluster: Some(2),
                ..CheckCase::plain(300, 520, 1000, I8, true).out(I32)
            },
            CheckCase {
                tile: narrow,
                ..CheckCase::plain(2048, 2304, 200, F16, true)
            },
            // forced tile-order groups: one row per group (column-major order), and 3 rows, which
            // divides neither the 9 tile rows nor the 5 cluster rows (a short last group), with
            // and without clusters
            CheckCase {
                group: Some(1),
                ..CheckCase::plain(1100, 1304, 200, BF16, true)
            },
            CheckCase {
                group: Some(3),
                cluster: Some(1),
                ..CheckCase::plain(1100, 1304, 200, BF16, true)
            },
            CheckCase {
                group: Some(3),
                cluster: Some(2),
                tile: narrow,
                ..CheckCase::plain(1100, 1304, 200, F16, false)
            },
            // ping-pong: consumers alternate whole tiles (one tile per CTA, an odd count per CTA,
            // several per consumer), with and without clusters, both B layouts, every epilogue
            // form, 8-bit operands, GLU, fp8 output
            CheckCase {
                tile: pingpong,
                ..CheckCase::plain(128, 128, 64, BF16, true)
            },
            CheckCase {
                tile: pingpong,
                ..CheckCase::plain(129, 257, 100, F16, false)
            },
            CheckCase {
                tile: pingpong,
                cluster: Some(1),
                bias: true,
                activation: 3,
                ..CheckCase::plain(2048, 2304, 200, BF16, true)
            },
            CheckCase {
                tile: pingpong,
                cluster: Some(2),
                beta: Some(0.7),
                residual: true,
                activation: 4,
                ..CheckCase::plain(300, 1000, 520, BF16, false)
            },
            CheckCase {
                tile: pingpong,
                cluster: Some(2),
                batch: 3,
                beta: Some(-1.25),
                c_is_d: true,
                out_dtype: F32,
                ..CheckCase::plain(127, 300, 129, F16, true)
            },
            CheckCase {
                tile: pingpong,
                scales: 2,
                bias: true,
                activation: 2,
                ..CheckCase::plain(300, 1000, 520, F8E4M3, true).out(BF16)
            },
            CheckCase {
                tile: pingpong,
                cluster: Some(2),
                ..CheckCase::plain(300, 520, 1000, I8, true).out(I32)
            },
            CheckCase {
                tile: pingpong,
                ..CheckCase::plain(129, 257, 100, F32, true)
            },
            CheckCase {
                tile: pingpong,
                glu: true,
                activation: 4,
                bias: true,
                ..CheckCase::plain(1000, 1000, 300, BF16, true)
            },
        ]
    }

    /// Leading dimension of a row of `cols` elements padded by one 16-byte vector (so that ld != cols
    /// is exercised) and kept a multiple of 16 bytes.
    fn padded_ld(cols: usize, size: usize) -> usize {
        let per = 16 / size;
        cols.div_ceil(per) * per + per
    }

    /// Runs one case on the device against an f64 host reference; returns (max abs error, rel l2,
    /// budget, CTAs per cluster of the plan).
    pub(crate) fn check_case(ctx: &Context, case: &CheckCase, seed: u64) -> Result<(f64, f64, f64, u32)> {
        let cs = case;
        let mut rng = Lcg(seed | 1);
        let es = cs.dtype.size();
        let os = cs.out_dtype.size();
        let lda = padded_ld(cs.k, es);
        // B's columns: 2N interleaved gate/up with a GLU
        let bn = if cs.glu { 2 * cs.n } else { cs.n };
        let (b_rows, b_cols) = if cs.b_nk { (bn, cs.k) } else { (cs.k, bn) };
        let ldb = padded_ld(b_cols, es);
        let ldd = padded_ld(cs.n, os);
        let (sa, sb, sd) = (lda * cs.m, ldb * b_rows, ldd * cs.m);
        let a_h = Host::random(cs.dtype, sa * cs.batch, 1.0, &mut rng);
        let b_h = Host::random(cs.dtype, sb * cs.batch, 1.0, &mut rng);
        let c_h = cs
            .beta
            .map(|_| Host::random(cs.out_dtype, sd * cs.batch, 1.0, &mut rng));
        let r_h = cs
            .residual
            .then(|| Host::random(cs.out_dtype, sd * cs.batch, 1.0, &mut rng));
        let bias_h = cs.bias.then(|| Host::random(cs.out_dtype, bn, 1.0, &mut rng));
        // scales in [0.25, 1.75): per-tensor ones are [1]
        let (sa_len, sb_len) = if cs.scales == 2 { (cs.m, cs.n) } else { (1, 1) };
        let mut scale = |len: usize| -> Vec<f32> { (0..len).map(|_| 1.0 + 0.75 * rng.next()).collect() };
        let scales_h = (cs.scales > 0).then(|| (scale(sa_len), scale(sb_len)));
        let scales_d = match &scales_h {
            Some((sa_h, sb_h)) => Some((ctx.upload(sa_h)?, ctx.upload(sb_h)?)),
            None => None,
        };

        let a_d = Dev::upload(ctx, &a_h)?;
        let b_d = Dev::upload(ctx, &b_h)?;
        let c_d = match (&c_h, cs.c_is_d) {
            (Some(h), false) => Some(Dev::upload(ctx, h)?),
            _ => None,
        };
        let r_d = r_h.as_ref().map(|h| Dev::upload(ctx, h)).transpose()?;
        let bias_d = bias_h.as_ref().map(|h| Dev::upload(ctx, h)).transpose()?;
        let d_d = match (&c_h, cs.c_is_d) {
            (Some(h), true) => Dev::upload(ctx, h)?,
            _ => {
                let mut d = Dev::alloc(ctx, cs.out_dtype, sd * cs.batch)?;
                d.poison()?;
                d
            }
        };
        let args = HopperGemmArgs {
            m: cs.m,
            n: cs.n,
            k: cs.k,
            batch: cs.batch,
            dtype: cs.dtype,
            out_dtype: cs.out_dtype,
            a: a_d.ptr(),
            lda,
            stride_a: sa,
            b: b_d.ptr(),
            ldb,
            stride_b: sb,
            b_nk: cs.b_nk,
            c: if cs.c_is_d {
                d_d.ptr()
            } else {
                c_d.as_ref().map_or(0, Dev::ptr)
            },
            ldc: ldd,
            stride_c: sd,
            beta: cs.beta.unwrap_or(0.0),
            d: d_d.ptr(),
            ldd,
            stride_d: sd,
            bias: bias_d.as_ref().map_or(0, Dev::ptr),
            residual: r_d.as_ref().map_or(0, Dev::ptr),
            ldr: ldd,
            stride_r: sd,
            alpha: cs.alpha,
            activation: cs.activation,
            glu: cs.glu,
            scale_a: scales_d.as_ref().map_or(0, |s| s.0.device_ptr()),
            scale_a_rows: cs.scales == 2,
            scale_b: scales_d.as_ref().map_or(0, |s| s.1.device_ptr()),
            scale_b_cols: cs.scales == 2,
            scale_result: 0,
            amax: 0,
        };
        let key = args.shape_key();
        let tile = cs
            .tile
            .unwrap_or_else(|| choose_tile(key.m, key.b_n(), key.batch, ctx.info().sm_count));
        let plan = HopperGemmPlan::with_tile(ctx, &key, tile, cs.cluster, cs.group)?;
        plan.run(ctx, &args)?;
        let out = d_d.download()?;

        let mut err2 = 0.0f64;
        let mut ref2 = 0.0f64;
        let mut max_abs = 0.0f64;
        let mut acc_row = vec![0.0f64; bn];
        for bt in 0..cs.batch {
            for i in 0..cs.m {
                acc_row.iter_mut().for_each(|x| *x = 0.0);
                for kk in 0..cs.k {
                    let av = a_h.get(bt * sa + i * lda + kk);
                    for (j, acc) in acc_row.iter_mut().enumerate() {
                        let bv = if cs.b_nk {
                            b_h.get(bt * sb + j * ldb + kk)
                        } else {
                            b_h.get(bt * sb + kk * ldb + j)
                        };
                        *acc += av * bv;
                    }
                }
                if cs.glu {
                    // D[i, j] = act(alpha g + bias[2j]) * (alpha u + bias[2j + 1])
                    for j in 0..cs.n {
                        let at = bt * sd + i * ldd + j;
                        let bias = |c: usize| bias_h.as_ref().map_or(0.0, |b| b.get(c));
                        let g = cs.alpha as f64 * acc_row[2 * j] + bias(2 * j);
                        let u = cs.alpha as f64 * acc_row[2 * j + 1] + bias(2 * j + 1);
                        let v = activate(cs.activation, g) * u;
                        let got = out.get(at);
                        let e = if got.is_nan() { f64::INFINITY } else { (got - v).abs() };
                        max_abs = max_abs.max(e);
                        err2 += e * e;
                        ref2 += v * v;
                    }
                    continue;
                }
                for (j, &acc) in acc_row.iter().enumerate() {
                    let at = bt * sd + i * ldd + j;
                    let dequant = scales_h.as_ref().map_or(1.0, |(sa_h, sb_h)| {
                        sa_h[if cs.scales == 2 { i } else { 0 }] as f64
                            * sb_h[if cs.scales == 2 { j } else { 0 }] as f64
                    });
                    let mut v = cs.alpha as f64 * dequant * acc;
                    if let (Some(beta), Some(c)) = (cs.beta, &c_h) {
                        v += beta as f64 * c.get(at);
                    }
                    if let Some(b) = &bias_h {
                        v += b.get(j);
                    }
                    v = activate(cs.activation, v);
                    if let Some(r) = &r_h {
                        v += r.get(at);
                    }
                    let got = out.get(at);
                    let e = if got.is_nan() { f64::INFINITY } else { (got - v).abs() };
                    max_abs = max_abs.max(e);
                    err2 += e * e;
                    ref2 += v * v;
                }
            }
        }
        let rel = (err2 / ref2.max(f64::MIN_POSITIVE)).sqrt();
        Ok((max_abs, rel, cs.budget(), plan.cluster_m()))
    }

    /// One case of [`plan_self_check`]: precision, output dtype, scales, activation, bias, (M, N, K).
    pub(crate) type PlanCase = (
        crate::gemm::problem::Precision,
        DType,
        crate::gemm::problem::GemmScales,
        crate::gemm::problem::Activation,
        bool,
        (usize, usize, usize),
    );

    /// The cases of [`plan_self_check`] (a CPU test checks that each meets the Hopper path's rules).
    pub(crate) fn plan_check_cases() -> Vec<PlanCase> {
        use crate::gemm::problem::{Activation, GemmScales, Precision};
        const PLAIN: (usize, usize, usize) = (300, 392, 208);
        vec![
            (
                Precision::Tf32,
                DType::F32,
                GemmScales::None,
                Activation::None,
                false,
                PLAIN,
            ),
            (
                Precision::Tf32,
                DType::F32,
                GemmScales::None,
                Activation::Relu,
                true,
                PLAIN,
            ),
            (
                Precision::Fp8E4M3,
                DType::BF16,
                GemmScales::RowWise,
                Activation::GeluErf,
                true,
                PLAIN,
            ),
            (
                Precision::Fp8E5M2,
                DType::F32,
                GemmScales::PerTensor,
                Activation::None,
                false,
                PLAIN,
            ),
            (
                Precision::Fp8E4M3,
                DType::F16,
                GemmScales::None,
                Activation::Silu,
                false,
                PLAIN,
            ),
            (
                Precision::Int8,
                DType::I32,
                GemmScales::None,
                Activation::None,
                false,
                PLAIN,
            ),
            (
                Precision::Int8,
                DType::BF16,
                GemmScales::RowWise,
                Activation::None,
                true,
                PLAIN,
            ),
            (
                Precision::Int8,
                DType::F32,
                GemmScales::PerTensor,
                Activation::GeluTanh,
                false,
                PLAIN,
            ),
            // K-heavy shapes: split K into a batch of partial products and the f32 reduction
            // with the epilogue (hopper_splits), and one whose K cannot split evenly
            (
                Precision::BF16,
                DType::BF16,
                GemmScales::None,
                Activation::GeluTanh,
                true,
                (128, 200, 8192),
            ),
            (
                Precision::Fp8E4M3,
                DType::F32,
                GemmScales::RowWise,
                Activation::None,
                false,
                (64, 136, 16384),
            ),
            (
                Precision::F16,
                DType::F16,
                GemmScales::None,
                Activation::None,
                false,
                (200, 264, 1000),
            ),
            // fp8 outputs with the result scale (large enough that e4m3 saturates) and the amax
            (
                Precision::Fp8E4M3,
                DType::F8E4M3,
                GemmScales::RowWise,
                Activation::None,
                false,
                // N = 400: D's rows a multiple of 16 bytes (TMA), as fp8 outputs need
                (300, 400, 208),
            ),
            (
                Precision::Fp8E5M2,
                DType::F8E5M2,
                GemmScales::PerTensor,
                Activation::Silu,
                false,
                (129, 208, 256),
            ),
            (
                Precision::Fp8E4M3,
                DType::F8E5M2,
                GemmScales::None,
                Activation::GeluErf,
                false,
                (1, 16, 1008),
            ),
        ]
    }

    /// The tf32, fp8 and int8 contracts through the public API ([`GemmPlan::run_scaled`] with
    /// [`GemmProblem`]'s precision, scales and epilogue), against the same f64 reference as the
    /// self-check: checks the plan's mapping of problem and operands onto the kernel. One report
    /// line per case; an error when any fails.
    ///
    /// `path`: the dispatcher's choice ([`GemmPath::Auto`](crate::gemm::plan::GemmPath)), or a
    /// forced path; with [`GemmPath::Sm80`](crate::gemm::plan::GemmPath) forced, the cases that
    /// path cannot take on this device (fp8 before sm_89, fp16 -> f32 with a GLU...) are listed
    /// as skipped.
    pub(crate) fn plan_self_check(ctx: &Context, path: crate::gemm::plan::GemmPath) -> Result<String> {
        use crate::gemm::plan::{choose_path, GemmOptions, GemmPath, GemmPlan, GemmTuning};
        use crate::gemm::problem::{
            COperand, GemmOperands, GemmProblem, GemmScaleOperands, GemmScales, Layout, Precision,
        };
        let cases = plan_check_cases();
        let mut report = String::new();
        let mut failed = 0;
        let opts = GemmOptions {
            tuning: GemmTuning {
                path,
                ..GemmTuning::default()
            },
        };
        for (i, &(precision, out, scales, activation, bias, (m, n, k))) in cases.iter().enumerate() {
            let mut rng = Lcg(0x51ed_2701u64.wrapping_mul(i as u64 + 3) | 1);
            let problem = GemmProblem::new(precision, out, m, n, k)
                .b_layout(Layout::ColMajor)
                .scales(scales)
                .activation(activation)
                .bias(bias);
            let input = problem.input()?;
            if path != GemmPath::Auto {
                if let Err(e) = choose_path(&problem, ctx.arch(), path) {
                    report += &format!(
                        "SKIP plan {} {m}x{n}x{k} -> {out} on the {} path: {e}\n",
                        precision.name(),
                        path.name()
                    );
                    continue;
                }
            }
            let plan = GemmPlan::new(ctx, &problem, &opts)?;
            let a_h = Host::random(input, m * k, 1.0, &mut rng);
            let b_h = Host::random(input, n * k, 1.0, &mut rng);
            let bias_h = Host::random(if out == DType::I32 { DType::F32 } else { out }, n, 1.0, &mut rng);
            let (sa_len, sb_len) = if scales == GemmScales::RowWise { (m, n) } else { (1, 1) };
            let sa_h: Vec<f32> = (0..sa_len).map(|_| 1.0 + 0.75 * rng.next()).collect();
            let sb_h: Vec<f32> = (0..sb_len).map(|_| 1.0 + 0.75 * rng.next()).collect();
            let (a_d, b_d, bias_d) = (
                Dev::upload(ctx, &a_h)?,
                Dev::upload(ctx, &b_h)?,
                Dev::upload(ctx, &bias_h)?,
            );
            let (sa_d, sb_d) = (ctx.upload(&sa_h)?, ctx.upload(&sb_h)?);
            let mut d_d = Dev::alloc(ctx, out, m * n)?;
            d_d.poison()?;
            let ops = GemmOperands {
                a: a_d.buf.view_as(input, &[m, k], &[k, 1])?,
                b: b_d.buf.view_as(input, &[n, k], &[k, 1])?,
                c: COperand::None,
                bias: if bias {
                    Some(bias_d.buf.view_as(out, &[n], &[1])?)
                } else {
                    None
                },
                residual: None,
            };
            // fp8 outputs: a result scale of 16 (e4m3 inputs: some outputs saturate at 448) or
            // none (e5m2 inputs), and the amax
            let fp8_out = out.size() == 1;
            let result_scale = if fp8_out && precision == Precision::Fp8E4M3 {
                16.0f32
            } else {
                1.0
            };
            let sr_d = ctx.upload(&[result_scale])?;
            let mut amax_d = ctx.upload(&[f32::NAN])?;
            let mut scale_ops = GemmScaleOperands {
                result: (result_scale != 1.0).then(|| sr_d.view(&[1], &[1])).transpose()?,
                ..GemmScaleOperands::default()
            };
            if scales != GemmScales::None {
                scale_ops.a = Some(sa_d.view(&[sa_len], &[1])?);
                scale_ops.b = Some(sb_d.view(&[sb_len], &[1])?);
            }
            let alpha = if out == DType::I32 { 1.0 } else { 0.5 };
            let mut d_view = d_d.buf.view_mut_as(out, &[m, n], &[n, 1])?;
            if fp8_out {
                plan.run_scaled_amax(
                    alpha,
                    0.0,
                    &ops,
                    &scale_ops,
                    &mut d_view,
                    &mut amax_d.view_mut(&[1], &[1])?,
                )?;
            } else {
                plan.run_scaled(alpha, 0.0, &ops, &scale_ops, &mut d_view)?;
            }
            let got = d_d.download()?;
            let amax_got = amax_d.to_host()?[0] as f64;
            let mut amax_want = 0.0f64;
            let mut amax_slack = 0.0f64;
            let (mut err2, mut ref2) = (0.0f64, 0.0f64);
            for r in 0..m {
                for c in 0..n {
                    let acc: f64 = (0..k).map(|kk| a_h.get(r * k + kk) * b_h.get(c * k + kk)).sum();
                    let magnitude: f64 = (0..k).map(|kk| (a_h.get(r * k + kk) * b_h.get(c * k + kk)).abs()).sum();
                    let s = if scales == GemmScales::None {
                        1.0
                    } else {
                        sa_h[if sa_len > 1 { r } else { 0 }] as f64 * sb_h[if sb_len > 1 { c } else { 0 }] as f64
                    };
                    let mut v = alpha * s * acc + if bias { bias_h.get(c) } else { 0.0 };
                    v = activate(activation.code(), v);
                    // fp8 operands (all fp8 outputs): the tensor core adds products into an
                    // accumulator of about 13 mantissa bits, so d may differ from the f64 sum by
                    // ~2^-12 sum |a b| (x 1.2: the activations' slope)
                    if fp8_out {
                        amax_slack = amax_slack.max(1.2 * (alpha * s).abs() * magnitude / 4096.0);
                    }
                    if fp8_out {
                        // the reference rounded as the kernel stores it: fp8(sr * v), saturating
                        amax_want = amax_want.max(v.abs());
                        let mut q = [0u8; 1];
                        crate::numeric::store(out, (result_scale as f64 * v) as f32, &mut q);
                        v = crate::numeric::load(out, &q, 0);
                    }
                    let e = got.get(r * n + c) - v;
                    err2 += if e.is_nan() { f64::INFINITY } else { e * e };
                    ref2 += v * v;
                }
            }
            let rel = (err2 / ref2.max(f64::MIN_POSITIVE)).sqrt();
            let budget = CheckCase {
                out_dtype: out,
                ..CheckCase::plain(m, n, k, input, true)
            }
            .budget();
            // the amax of the kernel's sums against f64 ones (the accumulation's error only)
            let amax_ok = !fp8_out || (amax_got - amax_want).abs() <= 1e-4 * amax_want + amax_slack;
            let ok = rel.is_finite() && (rel < budget || rel == 0.0) && amax_ok;
            failed += usize::from(!ok);
            let amax_note = if fp8_out {
                format!(", result scale {result_scale}, amax {amax_got:.6e} (f64 {amax_want:.6e})")
            } else {
                String::new()
            };
            report += &format!(
                "{} plan {} {m}x{n}x{k} -> {} {scales:?} {} bias {bias} (kernel {}, {} splits): rel_l2 {rel:.3e} \
                 (budget {budget:.0e}){amax_note}\n",
                if ok { "PASS" } else { "FAIL" },
                precision.name(),
                out,
                activation.name(),
                plan.kernel_name(),
                plan.splits()
            );
        }
        if failed > 0 {
            return Err(Error::invalid(
                "gemm plan self-check",
                format!("{failed} cases failed:\n{report}"),
            ));
        }
        Ok(report)
    }

    /// The f64 activation of epilogue.cuh's code.
    pub(crate) fn activate(code: u32, x: f64) -> f64 {
        match code {
            1 => x.max(0.0),
            2 => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
            3 => {
                let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
                0.5 * x * (1.0 + u.tanh())
            }
            4 => x / (1.0 + (-x).exp()),
            _ => x,
        }
    }

    /// erf(x) to ~1e-13 (a series below 3, the continued-fraction tail above; the self-check's
    /// budgets are 1e-5 at the tightest).
    pub(crate) fn erf(x: f64) -> f64 {
        let a = x.abs();
        let r = if a < 3.0 {
            // erf(a) = 2/sqrt(pi) * sum_n (-1)^n a^(2n+1) / (n! (2n+1))
            let mut term = a;
            let mut sum = a;
            let a2 = a * a;
            let mut n = 0.0;
            while term.abs() > 1e-17 * sum.abs() {
                n += 1.0;
                term *= -a2 / n;
                sum += term / (2.0 * n + 1.0);
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            // erfc(a) = exp(-a^2) / sqrt(pi) * 1 / (a + 1/2 / (a + 1 / (a + 3/2 / (a + ...))))
            let mut f = a;
            for k in (1..60).rev() {
                f = a + (k as f64 / 2.0) / f;
            }
            1.0 - (-a * a).exp() / (std::f64::consts::PI.sqrt() * f)
        };
        if x < 0.0 {
            -r
        } else {
            r
        }
    }

    /// Runs every [`check_cases`] case on `ctx` against the f64 reference; the report has one line
    /// per case (max abs error, rel l2 against the output dtype's budget) and ends with the verdict.
    /// An error when any case fails.
    pub(crate) fn hopper_self_check(ctx: &Context) -> Result<String> {
        let mut report = String::new();
        let mut failed = 0;
        for (i, case) in check_cases().iter().enumerate() {
            let seed = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i as u64 + 1);
            let (max_abs, rel, budget, cluster) = check_case(ctx, case, seed)?;
            // a zero budget (s32 output) asks for the exact result
            let ok = rel.is_finite() && (rel < budget || rel == 0.0);
            failed += usize::from(!ok);
            report += &format!(
                "{} {:?} cluster {cluster} seed {seed:#x}: max_abs_err {max_abs:.3e} rel_l2 {rel:.3e} (budget {budget:.0e})\n",
                if ok { "PASS" } else { "FAIL" },
                case
            );
        }
        if failed > 0 {
            return Err(Error::Unsupported(format!(
                "Hopper GEMM self-check: {failed} case(s) failed\n{report}"
            )));
        }
        report += "Hopper GEMM self-check: all cases passed\n";
        Ok(report)
    }

    /// The benchmark shapes (M, N, K), B stored [N, K]: squares, then Llama projections
    /// (whose (4096, 4096, 4096) is the square 4096 already listed).
    pub(crate) const BENCH_SHAPES: [(usize, usize, usize); 7] = [
        (2048, 2048, 2048),
        (4096, 4096, 4096),
        (8192, 8192, 8192),
        (4096, 14336, 4096),
        (4096, 4096, 14336),
        (4096, 28672, 8192),
        (4096, 8192, 28672),
    ];

    /// cuBLAS `D[M, N] = A[M, K] B[N, K]^T` (row-major; column-major D^T = B^T' A^T), f32 compute.
    #[allow(clippy::too_many_arguments)]
    fn cublas_gemm_nt(ctx: &Context, dtype: DType, m: usize, n: usize, k: usize, a: u64, b: u64, d: u64) -> Result<()> {
        use cudarc::cublas::sys as cb;
        let blas = ctx.cublas()?;
        let ty = if dtype == DType::F16 {
            cb::cudaDataType::CUDA_R_16F
        } else {
            cb::cudaDataType::CUDA_R_16BF
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let dim = |v: usize| i32::try_from(v).map_err(|_| Error::invalid("shape", "must fit in i32 for cuBLAS"));
        let (mi, ni, ki) = (dim(m)?, dim(n)?, dim(k)?);
        // SAFETY: a holds M x K, b N x K and d M x N elements of `dtype`; the handle is bound to the
        // context's stream.
        let st = unsafe {
            cb::cublasGemmEx(
                *blas.handle(),
                cb::cublasOperation_t::CUBLAS_OP_T,
                cb::cublasOperation_t::CUBLAS_OP_N,
                ni,
                mi,
                ki,
                &alpha as *const f32 as *const _,
                b as *const _,
                ty,
                ki,
                a as *const _,
                ty,
                ki,
                &beta as *const f32 as *const _,
                d as *mut _,
                ty,
                ni,
                cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        if st != cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(Error::cuda("cublasGemmEx", format!("{st:?}")));
        }
        Ok(())
    }

    /// Times the Hopper path against cuBLAS on [`BENCH_SHAPES`] in fp16 and bf16 (B as [N, K], output
    /// in the operand dtype, no epilogue), sustained timing ([`crate::runtime::TimingOptions`]
    /// default), inputs rotated over enough copies to exceed the L2; checks first that our output
    /// matches cuBLAS's (rel l2 of the difference). One line per shape and dtype: ms and TFLOP/s of
    /// each and the ratio; then the geometric mean of the ratios.
    pub(crate) fn hopper_bench(ctx: &Context) -> Result<String> {
        use crate::runtime::{time_median, TimingOptions};
        let mut report = String::new();
        let mut log_ratio = 0.0;
        let mut rows = 0;
        for dtype in [DType::BF16, DType::F16] {
            for &(m, n, k) in &BENCH_SHAPES {
                let set_bytes = (m * k + n * k) * 2;
                let sets = (256usize << 20).div_ceil(set_bytes).clamp(1, 8);
                let mut rng = Lcg(0x5eed ^ (m * 31 + n * 7 + k) as u64);
                let mut inputs = Vec::with_capacity(sets);
                for _ in 0..sets {
                    let a = Dev::upload(ctx, &Host::random(dtype, m * k, 1.0, &mut rng))?;
                    let b = Dev::upload(ctx, &Host::random(dtype, n * k, 1.0, &mut rng))?;
                    inputs.push((a, b));
                }
                let mut d = Dev::alloc(ctx, dtype, m * n)?;
                let mut d_ref = Dev::alloc(ctx, dtype, m * n)?;
                let args = |i: usize, d: u64| HopperGemmArgs {
                    m,
                    n,
                    k,
                    batch: 1,
                    dtype,
                    out_dtype: dtype,
                    a: inputs[i % sets].0.ptr(),
                    lda: k,
                    stride_a: 0,
                    b: inputs[i % sets].1.ptr(),
                    ldb: k,
                    stride_b: 0,
                    b_nk: true,
                    scale_a: 0,
                    scale_a_rows: false,
                    scale_b: 0,
                    scale_b_cols: false,
                    scale_result: 0,
                    amax: 0,
                    c: 0,
                    ldc: n,
                    stride_c: 0,
                    beta: 0.0,
                    d,
                    ldd: n,
                    stride_d: 0,
                    bias: 0,
                    residual: 0,
                    ldr: n,
                    stride_r: 0,
                    alpha: 1.0,
                    activation: 0,
                    glu: false,
                };
                let plan = HopperGemmPlan::new(ctx, &args(0, d.ptr()).shape_key())?;
                // Verify before timing: ours against cuBLAS on the first input set.
                d.poison()?;
                d_ref.poison()?;
                plan.run(ctx, &args(0, d.ptr()))?;
                cublas_gemm_nt(ctx, dtype, m, n, k, inputs[0].0.ptr(), inputs[0].1.ptr(), d_ref.ptr())?;
                let (got, want) = (d.download()?, d_ref.download()?);
                let (mut e2, mut r2) = (0.0f64, 0.0f64);
                for i in 0..m * n {
                    let (g, w) = (got.get(i), want.get(i));
                    e2 += if g.is_nan() { f64::INFINITY } else { (g - w) * (g - w) };
                    r2 += w * w;
                }
                let diff = (e2 / r2.max(f64::MIN_POSITIVE)).sqrt();
                let ours = time_median(ctx, TimingOptions::default(), |i| plan.run(ctx, &args(i, d.ptr())))?;
                let theirs = time_median(ctx, TimingOptions::default(), |i| {
                    let (a, b) = &inputs[i % sets];
                    cublas_gemm_nt(ctx, dtype, m, n, k, a.ptr(), b.ptr(), d_ref.ptr())
                })?;
                let flops = 2.0 * m as f64 * n as f64 * k as f64;
                let tf = |ms: f64| flops / (ms * 1e-3) / 1e12;
                let ratio = theirs.median_ms / ours.median_ms;
                log_ratio += ratio.ln();
                rows += 1;
                report += &format!(
                    "{dtype} {m}x{n}x{k} (tile {}): tessera {:.3} ms {:.1} TFLOP/s | cublas {:.3} ms {:.1} TFLOP/s | {ratio:.3}x | rel_l2 vs cublas {diff:.2e}\n",
                    plan.tile().block_n,
                    ours.median_ms,
                    tf(ours.median_ms),
                    theirs.median_ms,
                    tf(theirs.median_ms)
                );
            }
        }
        report += &format!(
            "geometric mean speed-up over cuBLAS: {:.3}x ({rows} rows)\n",
            (log_ratio / rows.max(1) as f64).exp()
        );
        Ok(report)
    }
}
