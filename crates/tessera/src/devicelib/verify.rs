//! `tessera verify devicelib`: the device-library test kernels of this folder against their CPU
//! references ([`super::reference`]), on fresh seeded random inputs, with every output poisoned
//! (NaN bytes) before the launch so that an unwritten element fails. Cases that need sm_90a
//! (wgmma, TMA, mbarrier rings, clusters) are reported as skipped on other GPUs.
//!
//! Budgets: copies and conversions must be exact (rel-L2 0, and the conversions bit for bit,
//! any NaN matching NaN); tensor-core products (f16 / bf16 inputs, f32 accumulators, 16 or 64
//! terms) are held to [`TENSOR_CORE_BUDGET`] and, element by element, to [`TENSOR_CORE_ATOL`] +
//! [`TENSOR_CORE_RTOL`] |want|.

use half::{bf16, f16};
use serde_json::json;

use super::reference::{box_of, e5m2_to_f32, f32_to_e5m2, float_sweep, matmul};
use super::{tma_tile_box, TestKernel};
use crate::check::{compare, Comparison};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::harness::VerifyOutcome;
use crate::numeric::{e4m3_to_f32, f32_to_e4m3};
use crate::runtime::tma::{encode_tiled, L2Promotion, OobFill, Swizzle, TensorMap, TiledMap, TmaError};
use crate::runtime::{Arch, Context, DeviceBuffer, KernelParams, LaunchConfig};
use crate::testdata::{random_matrix, Dist};

/// rel-L2 budget of the tensor-core products: the f32 accumulation of 16 or 64 products may be
/// ordered (and on some GPUs rounded) differently from the f64 reference, ~1e-7 relative; a
/// fragment-layout error is of order 1.
pub const TENSOR_CORE_BUDGET: f64 = 1e-4;

/// Element-wise tolerance of the tensor-core products, `atol + rtol |want|`: the outputs are sums
/// of 16 or 64 products of N(0, 1) values (|want| up to ~30), whose f32 accumulation errs by
/// ~1e-5; a misplaced fragment element errs by ~1.
pub const TENSOR_CORE_ATOL: f64 = 2e-3;
pub const TENSOR_CORE_RTOL: f64 = 1e-3;

/// How the mma.sync test forms its fragments (`mma_sync.cu`, `p.mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmaMode {
    /// From global memory by the PTX fragment layout, packed with `ts::pack2`.
    Fragments = 0,
    /// A `[m][k]` and B `[n][k]` in shared memory through `ldmatrix_x4`.
    Ldmatrix = 1,
    /// A `[k][m]` and B `[k][n]` in shared memory through `ldmatrix_x4_trans`.
    LdmatrixTrans = 2,
    /// A as `Ldmatrix`; B `[k][n]` through plain `ldmatrix_x4` and `movmatrix_trans`.
    Movmatrix = 3,
}

impl MmaMode {
    pub fn name(self) -> &'static str {
        match self {
            MmaMode::Fragments => "fragments",
            MmaMode::Ldmatrix => "ldmatrix.x4",
            MmaMode::LdmatrixTrans => "ldmatrix.x4.trans",
            MmaMode::Movmatrix => "ldmatrix.x4+movmatrix",
        }
    }
}

/// What one case runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Test {
    /// `tiles` independent 16x16x16 products (two m16n8k16 MMAs each), f16 or bf16.
    MmaSync { elem: DType, mode: MmaMode, tiles: usize },
    /// One 64x64x64 product as four m64n64k16 wgmma k-steps.
    Wgmma { elem: DType, a_in_registers: bool },
    /// TMA boxes over a `rows x cols` matrix (f32 unswizzled, f16 128-byte swizzle), loaded and
    /// stored back.
    TmaTile { elem: DType, rows: usize, cols: usize },
    /// Multicast half tiles in clusters of two over a `rows x 64` f16 matrix.
    TmaMulticast { rows: usize },
    /// A TMA-fed producer/consumer ring of `stages` slots over `tiles` tiles of 16 x 64 f32 (the
    /// last one 5 rows short).
    MbarrierRing { stages: u32, tiles: usize },
    /// A cp.async ring of `stages` slots over `n` floats.
    CpAsync { stages: u32, n: usize },
    /// Every fp8 / f16 / bf16 conversion of dtype.cuh.
    Convert,
}

/// One verification case.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    pub test: Test,
}

impl Case {
    pub fn name(&self) -> String {
        match self.test {
            Test::MmaSync { elem, mode, tiles } => {
                format!("mma.sync m16n8k16 {elem} {} {tiles} tiles", mode.name())
            }
            Test::Wgmma { elem, a_in_registers } => format!(
                "wgmma m64n64k16 {elem} {} 64x64x64",
                if a_in_registers {
                    "rs (A registers, B N-major)"
                } else {
                    "ss (A, B K-major)"
                }
            ),
            Test::TmaTile { elem, rows, cols } => {
                let (bc, br) = tma_tile_box(elem);
                format!(
                    "tma load+store {elem} {rows}x{cols} box {br}x{bc} {}",
                    if elem == DType::F16 {
                        "swizzle-128B"
                    } else {
                        "no-swizzle"
                    }
                )
            }
            Test::TmaMulticast { rows } => format!("tma multicast cluster 2 fp16 {rows}x64"),
            Test::MbarrierRing { stages, tiles } => format!("mbarrier ring {stages} stages {tiles} tiles"),
            Test::CpAsync { stages, n } => format!("cp.async ring {stages} stages {n} floats"),
            Test::Convert => "dtype conversions fp8/f16/bf16".into(),
        }
    }

    fn params(&self) -> serde_json::Value {
        match self.test {
            Test::MmaSync { elem, mode, tiles } => {
                json!({"test": "mma_sync", "dtype": elem.name(), "mode": mode.name(), "tiles": tiles})
            }
            Test::Wgmma { elem, a_in_registers } => {
                json!({"test": "wgmma", "dtype": elem.name(), "a_in_registers": a_in_registers, "M": 64, "N": 64, "K": 64})
            }
            Test::TmaTile { elem, rows, cols } => {
                json!({"test": "tma_tile", "dtype": elem.name(), "rows": rows, "cols": cols})
            }
            Test::TmaMulticast { rows } => json!({"test": "tma_multicast", "dtype": "fp16", "rows": rows, "cols": 64}),
            Test::MbarrierRing { stages, tiles } => json!({"test": "mbarrier_ring", "stages": stages, "tiles": tiles}),
            Test::CpAsync { stages, n } => json!({"test": "cp_async", "stages": stages, "n": n}),
            Test::Convert => json!({"test": "convert"}),
        }
    }

    /// The test kernel this case launches.
    pub fn kernel(&self) -> TestKernel {
        match self.test {
            Test::MmaSync { elem, .. } => TestKernel::MmaSync { elem },
            Test::Wgmma { elem, a_in_registers } => TestKernel::Wgmma { elem, a_in_registers },
            Test::TmaTile { elem, .. } => TestKernel::TmaTile { elem },
            Test::TmaMulticast { .. } => TestKernel::TmaMulticast,
            Test::MbarrierRing { stages, .. } => TestKernel::MbarrierRing { stages },
            Test::CpAsync { stages, .. } => TestKernel::CpAsync { stages },
            Test::Convert => TestKernel::Convert,
        }
    }
}

/// The verification matrix: every test kernel in each of its modes. All cases are tiny (one
/// launch of at most a few dozen CTAs); `quick` only trims the mma.sync tile count.
pub fn cases(quick: bool) -> Vec<Case> {
    let mut out = Vec::new();
    for elem in [DType::F16, DType::BF16] {
        for mode in [
            MmaMode::Fragments,
            MmaMode::Ldmatrix,
            MmaMode::LdmatrixTrans,
            MmaMode::Movmatrix,
        ] {
            out.push(Test::MmaSync {
                elem,
                mode,
                tiles: if quick { 2 } else { 8 },
            });
        }
    }
    for elem in [DType::F16, DType::BF16] {
        for a_in_registers in [false, true] {
            out.push(Test::Wgmma { elem, a_in_registers });
        }
    }
    for elem in [DType::F32, DType::F16] {
        out.push(Test::TmaTile {
            elem,
            rows: 100,
            cols: 80,
        });
    }
    out.push(Test::TmaMulticast { rows: 120 });
    for stages in [2, 3] {
        out.push(Test::MbarrierRing { stages, tiles: 11 });
    }
    for stages in [3, 4] {
        out.push(Test::CpAsync {
            stages,
            n: 37 * 512 - 300,
        });
    }
    out.push(Test::Convert);
    out.into_iter().map(|test| Case { test }).collect()
}

/// Runs one case on the GPU and compares it with the CPU reference.
pub fn verify_case(ctx: &Context, case: &Case, seed: u64) -> Result<VerifyOutcome> {
    let kernel = case.kernel();
    if kernel.needs_sm90a() && ctx.arch() != Arch::SM90 {
        return Ok(VerifyOutcome::skipped(
            case.name(),
            case.params(),
            format!("needs sm_90a; this GPU is {}", ctx.arch()),
        ));
    }
    let checked = match case.test {
        Test::MmaSync { elem, mode, tiles } => {
            crate::dispatch_float!("mma.sync test"; elem, [F16, BF16], |T| run_mma::<T>(ctx, kernel, mode, tiles, seed))?
        }
        Test::Wgmma {
            elem,
            a_in_registers: _,
        } => crate::dispatch_float!("wgmma test"; elem, [F16, BF16], |T| run_wgmma::<T>(ctx, kernel, seed))?,
        Test::TmaTile { elem, rows, cols } => {
            crate::dispatch_float!("TMA tile test"; elem, [F32, F16], |T| run_tma_tile::<T>(ctx, kernel, rows, cols, seed))?
        }
        Test::TmaMulticast { rows } => run_tma_multicast(ctx, kernel, rows, seed)?,
        Test::MbarrierRing { stages, tiles } => run_mbarrier_ring(ctx, kernel, stages, tiles, seed)?,
        Test::CpAsync { stages: _, n } => run_cp_async(ctx, kernel, n, seed)?,
        Test::Convert => run_convert(ctx, kernel, seed)?,
    };
    let passed = checked.comparison.passes(checked.budget) && checked.note.is_none();
    Ok(VerifyOutcome {
        case: case.name(),
        params: case.params(),
        path: kernel.spec().name,
        comparison: checked.comparison,
        budget: checked.budget,
        passed,
        note: checked.note,
        skipped: None,
    })
}

/// The outcome of one test's run: the comparison, its budget, and any other failed check.
struct Checked {
    comparison: Comparison,
    budget: f64,
    note: Option<String>,
}

impl Checked {
    /// A tensor-core product: rel-L2 within [`TENSOR_CORE_BUDGET`] and every element within
    /// [`TENSOR_CORE_ATOL`] + [`TENSOR_CORE_RTOL`] |want| (a single misplaced element fails).
    fn tensor_core(got: &[f64], want: &[f64]) -> Checked {
        let comparison = compare(got, want, TENSOR_CORE_ATOL, TENSOR_CORE_RTOL);
        let note = (!comparison.all_close()).then(|| {
            format!(
                "{} elements outside {TENSOR_CORE_ATOL:e} + {TENSOR_CORE_RTOL:e} |want|",
                comparison.mismatch_count
            )
        });
        Checked {
            comparison,
            budget: TENSOR_CORE_BUDGET,
            note,
        }
    }

    fn exact(got: &[f64], want: &[f64]) -> Checked {
        Checked {
            comparison: compare(got, want, 0.0, 0.0),
            budget: 0.0,
            note: None,
        }
    }
}

/// A device buffer of `len` elements filled with NaN bytes (0xff), the output poison.
fn poisoned<T: Element>(ctx: &Context, len: usize) -> Result<DeviceBuffer<T>> {
    let mut b = ctx.alloc::<T>(len)?;
    b.fill_bytes(0xff)?;
    Ok(b)
}

fn to_f64<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// Random N(0, 1) values rounded to `T`, never all zeros (testdata).
fn random<T: Element>(seed: u64, rows: usize, cols: usize) -> Vec<T> {
    random_matrix(seed, rows, cols, cols, Dist::Normal { std: 1.0 })
}

// ---- mma.sync -------------------------------------------------------------------------------

/// `struct MmaTestParams` of mma_sync.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct MmaTestParams {
    a: u64,
    b: u64,
    c: u64,
    tiles: i32,
    mode: i32,
}
const _: () = assert!(std::mem::size_of::<MmaTestParams>() == 32);
// SAFETY: #[repr(C)] plain data with the layout of `struct MmaTestParams` in mma_sync.cu (three
// pointers, two ints; the kernel static_asserts 32 bytes).
unsafe impl KernelParams for MmaTestParams {}

fn run_mma<E: Element>(ctx: &Context, kernel: TestKernel, mode: MmaMode, tiles: usize, seed: u64) -> Result<Checked> {
    let a: Vec<E> = random(seed, tiles * 16, 16);
    let b: Vec<E> = random(seed ^ 0xb, tiles * 16, 16);
    let da = ctx.upload(&a)?;
    let db = ctx.upload(&b)?;
    let dc = poisoned::<f32>(ctx, tiles * 256)?;
    let k = ctx.kernel(&kernel.spec())?;
    let params = MmaTestParams {
        a: da.device_ptr(),
        b: db.device_ptr(),
        c: dc.device_ptr(),
        tiles: tiles as i32,
        mode: mode as i32,
    };
    // SAFETY: grid = tiles CTAs of one warp; CTA t reads 256 elements of A and B and writes 256
    // floats of C at offset 256 t, all inside the buffers (tiles * 256 elements each).
    unsafe { k.launch(ctx, LaunchConfig::linear(tiles as u32, 32, 0), &params)? };
    let got = to_f64(&dc.to_host()?);
    let (a, b) = (to_f64(&a), to_f64(&b));
    let want: Vec<f64> = (0..tiles)
        .flat_map(|t| matmul(&a[t * 256..(t + 1) * 256], &b[t * 256..(t + 1) * 256], 16, 16, 16))
        .collect();
    Ok(Checked::tensor_core(&got, &want))
}

// ---- wgmma ----------------------------------------------------------------------------------

/// `struct WgmmaTestParams` of wgmma.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct WgmmaTestParams {
    a: u64,
    b: u64,
    d: u64,
}
const _: () = assert!(std::mem::size_of::<WgmmaTestParams>() == 24);
// SAFETY: #[repr(C)] plain data with the layout of `struct WgmmaTestParams` in wgmma.cu (three
// pointers; the kernel static_asserts 24 bytes).
unsafe impl KernelParams for WgmmaTestParams {}

/// Dynamic shared memory of wgmma.cu (`kSmemBytes`: two 8 KiB tiles and 1 KiB of alignment).
const WGMMA_SMEM: u32 = 2 * 64 * 128 + 1024;

fn run_wgmma<E: Element>(ctx: &Context, kernel: TestKernel, seed: u64) -> Result<Checked> {
    let a: Vec<E> = random(seed, 64, 64);
    let b: Vec<E> = random(seed ^ 0xb, 64, 64);
    let da = ctx.upload(&a)?;
    let db = ctx.upload(&b)?;
    let dd = poisoned::<f32>(ctx, 64 * 64)?;
    let k = ctx.kernel(&kernel.spec())?;
    let params = WgmmaTestParams {
        a: da.device_ptr(),
        b: db.device_ptr(),
        d: dd.device_ptr(),
    };
    // SAFETY: one warpgroup reads the 64 x 64 A and B and writes the 64 x 64 D, the buffers'
    // sizes; WGMMA_SMEM is the kernel's kSmemBytes.
    unsafe { k.launch(ctx, LaunchConfig::linear(1, 128, WGMMA_SMEM), &params)? };
    let got = to_f64(&dd.to_host()?);
    let want = matmul(&to_f64(&a), &to_f64(&b), 64, 64, 64);
    Ok(Checked::tensor_core(&got, &want))
}

// ---- TMA --------------------------------------------------------------------------------------

/// A 2-D row-major `rows x cols` matrix of `dtype` at `ptr` as a 4-D tensor map (cols, rows, 1, 1)
/// with boxes of `box_cols x box_rows`, zero out-of-bounds fill, no swizzle or the 128-byte one.
fn encode_2d(
    ptr: u64,
    dtype: DType,
    rows: usize,
    cols: usize,
    box_cols: u32,
    box_rows: u32,
    swizzle128: bool,
) -> Result<TensorMap> {
    let row_bytes = (cols * dtype.size()) as u64;
    let dims: [u64; 4] = [cols as u64, rows as u64, 1, 1];
    // the extent-1 dimensions get the whole matrix as their (valid, unused) stride
    let strides: [u64; 3] = [row_bytes, row_bytes * rows as u64, row_bytes * rows as u64];
    let map = TiledMap {
        ptr,
        dtype,
        dims: &dims,
        byte_strides: &strides,
        stride_names: &["row", "plane", "batch"],
        box_dims: &[box_cols, box_rows, 1, 1],
        element_strides: &[1; 4],
        swizzle: if swizzle128 { Swizzle::B128 } else { Swizzle::None },
        l2_promotion: L2Promotion::None,
        oob_fill: OobFill::Zeros,
    };
    encode_tiled(&map).map_err(|e| match e {
        TmaError::Misaligned(why) => Error::invalid("tensor map", why),
        TmaError::Invalid(e) | TmaError::Driver(e) => e,
    })
}

/// `struct TmaTileParams` of tma_tile.cu.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
struct TmaTileParams {
    in_map: TensorMap,
    out_map: TensorMap,
    boxes: u64,
    boxes_x: i32,
    col0: i32,
    row0: i32,
}
const _: () = assert!(std::mem::size_of::<TmaTileParams>() == 320);
// SAFETY: #[repr(C, align(64))] plain data with the layout of `struct TmaTileParams` in
// tma_tile.cu (two 128-byte 64-aligned tensor maps, a pointer, three ints, padded to 320 bytes;
// the kernel static_asserts the size).
unsafe impl KernelParams for TmaTileParams {}

/// Where the TMA tile test's box grid starts: left of and above the matrix, so the first boxes
/// have negative coordinates.
const TMA_COL0: i64 = -16;
const TMA_ROW0: i64 = -8;

/// Dynamic shared memory of a kernel holding one TMA tile of `tile_bytes`, an 8-byte mbarrier
/// (16 reserved) and 1 KiB to align the tile (tma_tile.cu / tma_multicast.cu `kSmemBytes`).
fn tma_smem(tile_bytes: usize) -> u32 {
    (tile_bytes + 16 + 1024) as u32
}

fn run_tma_tile<E: Element>(ctx: &Context, kernel: TestKernel, rows: usize, cols: usize, seed: u64) -> Result<Checked> {
    let (box_cols, box_rows) = tma_tile_box(E::DTYPE);
    let boxes_x = ((cols as i64 - TMA_COL0) as usize).div_ceil(box_cols as usize);
    let boxes_y = ((rows as i64 - TMA_ROW0) as usize).div_ceil(box_rows as usize);
    let grid = boxes_x * boxes_y;
    let box_elems = (box_cols * box_rows) as usize;
    let x: Vec<E> = random(seed, rows, cols);
    let dx = ctx.upload(&x)?;
    let dout = poisoned::<E>(ctx, rows * cols)?;
    let dboxes = poisoned::<E>(ctx, grid * box_elems)?;
    let swizzle = E::DTYPE == DType::F16;
    let params = TmaTileParams {
        in_map: encode_2d(dx.device_ptr(), E::DTYPE, rows, cols, box_cols, box_rows, swizzle)?,
        out_map: encode_2d(dout.device_ptr(), E::DTYPE, rows, cols, box_cols, box_rows, swizzle)?,
        boxes: dboxes.device_ptr(),
        boxes_x: boxes_x as i32,
        col0: TMA_COL0 as i32,
        row0: TMA_ROW0 as i32,
    };
    let k = ctx.kernel(&kernel.spec())?;
    let smem = tma_smem(box_elems * E::DTYPE.size());
    // SAFETY: the maps describe exactly the rows x cols input and output buffers (TMA clips and
    // zero-fills at their edges); CTA b writes box_elems elements at b * box_elems of `boxes`
    // (grid * box_elems long); smem is the kernel's kSmemBytes for this box.
    unsafe { k.launch(ctx, LaunchConfig::linear(grid as u32, 128, smem), &params)? };
    let xf = to_f64(&x);
    let mut want: Vec<f64> = (0..grid)
        .flat_map(|b| {
            let col0 = TMA_COL0 + ((b % boxes_x) * box_cols as usize) as i64;
            let row0 = TMA_ROW0 + ((b / boxes_x) * box_rows as usize) as i64;
            box_of(&xf, rows, cols, row0, col0, box_rows as usize, box_cols as usize)
        })
        .collect();
    want.extend_from_slice(&xf);
    let mut got = to_f64(&dboxes.to_host()?);
    got.extend(to_f64(&dout.to_host()?));
    Ok(Checked::exact(&got, &want))
}

/// `struct TmaMulticastParams` of tma_multicast.cu.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
struct TmaMulticastParams {
    map: TensorMap,
    out: u64,
}
const _: () = assert!(std::mem::size_of::<TmaMulticastParams>() == 192);
// SAFETY: #[repr(C, align(64))] plain data with the layout of `struct TmaMulticastParams` in
// tma_multicast.cu (a tensor map and a pointer, 192 bytes; the kernel static_asserts the size).
unsafe impl KernelParams for TmaMulticastParams {}

fn run_tma_multicast(ctx: &Context, kernel: TestKernel, rows: usize, seed: u64) -> Result<Checked> {
    const TILE_ROWS: usize = 32;
    let clusters = rows.div_ceil(TILE_ROWS);
    let grid = 2 * clusters;
    let x: Vec<f16> = random(seed, rows, 64);
    let dx = ctx.upload(&x)?;
    let dout = poisoned::<f16>(ctx, grid * TILE_ROWS * 64)?;
    let params = TmaMulticastParams {
        map: encode_2d(dx.device_ptr(), DType::F16, rows, 64, 64, (TILE_ROWS / 2) as u32, true)?,
        out: dout.device_ptr(),
    };
    let k = ctx.kernel(&kernel.spec())?;
    let smem = tma_smem(TILE_ROWS * 128);
    // SAFETY: clusters of 2 CTAs (grid even); the map describes the rows x 64 input (TMA
    // zero-fills past it); CTA b writes 32 x 64 elements at offset b * 2048 of `out` (grid * 2048
    // long); smem is the kernel's kSmemBytes.
    unsafe { k.launch(ctx, LaunchConfig::clustered(grid as u32, 128, smem, 2), &params)? };
    let xf = to_f64(&x);
    let want: Vec<f64> = (0..grid)
        .flat_map(|b| box_of(&xf, rows, 64, ((b / 2) * TILE_ROWS) as i64, 0, TILE_ROWS, 64))
        .collect();
    let got = to_f64(&dout.to_host()?);
    Ok(Checked::exact(&got, &want))
}

// ---- mbarrier ring ----------------------------------------------------------------------------

/// `struct MbarrierRingParams` of mbarrier_ring.cu.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
struct MbarrierRingParams {
    map: TensorMap,
    out: u64,
    tiles: i32,
}
const _: () = assert!(std::mem::size_of::<MbarrierRingParams>() == 192);
// SAFETY: #[repr(C, align(64))] plain data with the layout of `struct MbarrierRingParams` in
// mbarrier_ring.cu (a tensor map, a pointer, an int, 192 bytes; the kernel static_asserts it).
unsafe impl KernelParams for MbarrierRingParams {}

fn run_mbarrier_ring(ctx: &Context, kernel: TestKernel, stages: u32, tiles: usize, seed: u64) -> Result<Checked> {
    const TILE_ROWS: usize = 16;
    let rows = tiles * TILE_ROWS - 5;
    let x: Vec<f32> = random(seed, rows, 64);
    let dx = ctx.upload(&x)?;
    let dout = poisoned::<f32>(ctx, tiles * TILE_ROWS * 64)?;
    let params = MbarrierRingParams {
        map: encode_2d(dx.device_ptr(), DType::F32, rows, 64, 64, TILE_ROWS as u32, false)?,
        out: dout.device_ptr(),
        tiles: tiles as i32,
    };
    let k = ctx.kernel(&kernel.spec())?;
    // kSmemBytes: the slots, a full and an empty barrier per slot, 1 KiB of alignment
    let smem = (stages as usize * TILE_ROWS * 64 * 4 + 2 * stages as usize * 8 + 1024) as u32;
    // SAFETY: the map describes the rows x 64 input (the last tile runs past it: zero fill); the
    // consumers write tiles * 1024 floats, the size of `out`; smem is the kernel's kSmemBytes.
    unsafe { k.launch(ctx, LaunchConfig::linear(1, 96, smem), &params)? };
    let want = box_of(&to_f64(&x), rows, 64, 0, 0, tiles * TILE_ROWS, 64);
    let got = to_f64(&dout.to_host()?);
    Ok(Checked::exact(&got, &want))
}

// ---- cp.async -------------------------------------------------------------------------------

/// `struct CpAsyncParams` of cp_async.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct CpAsyncParams {
    input: u64,
    out: u64,
    n: i32,
    tiles: i32,
}
const _: () = assert!(std::mem::size_of::<CpAsyncParams>() == 24);
// SAFETY: #[repr(C)] plain data with the layout of `struct CpAsyncParams` in cp_async.cu (two
// pointers, two ints; the kernel static_asserts 24 bytes).
unsafe impl KernelParams for CpAsyncParams {}

fn run_cp_async(ctx: &Context, kernel: TestKernel, n: usize, seed: u64) -> Result<Checked> {
    const TILE: usize = 512;
    if n % 4 != 0 {
        return Err(Error::invalid(
            "n",
            "the cp.async test copies 16-byte chunks: n % 4 == 0",
        ));
    }
    let tiles = n.div_ceil(TILE);
    let x: Vec<f32> = random(seed, 1, n);
    let dx = ctx.upload(&x)?;
    let dout = poisoned::<f32>(ctx, tiles * TILE)?;
    let params = CpAsyncParams {
        input: dx.device_ptr(),
        out: dout.device_ptr(),
        n: n as i32,
        tiles: tiles as i32,
    };
    let k = ctx.kernel(&kernel.spec())?;
    // SAFETY: the kernel reads only the n floats of `input` (chunks past n are zero-filled
    // without a read) and writes tiles * 512 floats, the size of `out`; static shared memory.
    unsafe { k.launch(ctx, LaunchConfig::linear(1, 128, 0), &params)? };
    let mut want = to_f64(&x);
    want.resize(tiles * TILE, 0.0);
    let got = to_f64(&dout.to_host()?);
    Ok(Checked::exact(&got, &want))
}

// ---- conversions ----------------------------------------------------------------------------

/// `struct ConvertParams` of convert.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct ConvertParams {
    x: u64,
    fp8_enc: u64,
    half_enc: u64,
    fp8_dec: u64,
    fp8_f16: u64,
    half_dec: u64,
    n: i32,
}
const _: () = assert!(std::mem::size_of::<ConvertParams>() == 56);
// SAFETY: #[repr(C)] plain data with the layout of `struct ConvertParams` in convert.cu (six
// pointers and an int, 56 bytes; the kernel static_asserts the size).
unsafe impl KernelParams for ConvertParams {}

/// Outputs of convert.cu per group (see its header comment).
const FP8_ENC_WAYS: usize = 6;
const HALF_ENC_WAYS: usize = 4;
const FP8_DEC_WAYS: usize = 5;
const FP8_F16_WAYS: usize = 3;
const HALF_DEC_WAYS: usize = 4;

/// Bit-exact comparison of conversion outputs: values for [`compare`] and the count of bit
/// mismatches (a NaN matches any NaN), with the first few described.
#[derive(Default)]
struct BitCheck {
    got: Vec<f64>,
    want: Vec<f64>,
    mismatches: usize,
    first: Vec<String>,
}

impl BitCheck {
    /// One output: its bits and value, and the reference's.
    fn push(&mut self, what: &dyn Fn() -> String, got: (u32, f64), want: (u32, f64)) {
        self.got.push(got.1);
        self.want.push(want.1);
        let both_nan = got.1.is_nan() && want.1.is_nan();
        if got.0 != want.0 && !both_nan {
            self.mismatches += 1;
            if self.first.len() < 8 {
                self.first
                    .push(format!("{}: got {:#x} want {:#x}", what(), got.0, want.0));
            }
        }
    }
}

fn run_convert(ctx: &Context, kernel: TestKernel, seed: u64) -> Result<Checked> {
    let x = float_sweep(seed);
    let n = x.len();
    let dx = ctx.upload(&x)?;
    let fp8_enc = poisoned::<u8>(ctx, FP8_ENC_WAYS * n)?;
    let half_enc = poisoned::<f16>(ctx, HALF_ENC_WAYS * n)?;
    let fp8_dec = poisoned::<f32>(ctx, FP8_DEC_WAYS * 256)?;
    let fp8_f16 = poisoned::<f16>(ctx, FP8_F16_WAYS * 256)?;
    let half_dec = poisoned::<f32>(ctx, HALF_DEC_WAYS * 65536)?;
    let params = ConvertParams {
        x: dx.device_ptr(),
        fp8_enc: fp8_enc.device_ptr(),
        half_enc: half_enc.device_ptr(),
        fp8_dec: fp8_dec.device_ptr(),
        fp8_f16: fp8_f16.device_ptr(),
        half_dec: half_dec.device_ptr(),
        n: n as i32,
    };
    let k = ctx.kernel(&kernel.spec())?;
    let grid = n.max(65536).div_ceil(256).min(1024) as u32;
    // SAFETY: the grid-stride loop reads x[0..n] and writes exactly the documented extents of the
    // five outputs ([6][n], [4][n], [5][256], [3][256], [4][65536]), the sizes allocated above.
    unsafe { k.launch(ctx, LaunchConfig::linear(grid, 256, 0), &params)? };

    let mut c = BitCheck::default();
    let e4m3 = |b: u8| (b as u32, e4m3_to_f32(b) as f64);
    let e5m2 = |b: u8| (b as u32, e5m2_to_f32(b) as f64);
    let enc = fp8_enc.to_host()?;
    for (j, way) in enc.chunks(n).enumerate() {
        for (i, (&g, &xi)) in way.iter().zip(&x).enumerate() {
            let what = || format!("fp8 encode way {j} of x[{i}] = {xi:e} ({:#x})", xi.to_bits());
            if j < 3 {
                c.push(&what, e4m3(g), e4m3(f32_to_e4m3(xi)));
            } else {
                c.push(&what, e5m2(g), e5m2(f32_to_e5m2(xi)));
            }
        }
    }
    let henc = half_enc.to_host()?;
    for (j, way) in henc.chunks(n).enumerate() {
        for (i, (&g, &xi)) in way.iter().zip(&x).enumerate() {
            let what = || format!("f16/bf16 encode way {j} of x[{i}] = {xi:e} ({:#x})", xi.to_bits());
            let g = g.to_bits();
            if j < 2 {
                let w = f16::from_f32(xi);
                c.push(
                    &what,
                    (g as u32, f16::from_bits(g).to_f64()),
                    (w.to_bits() as u32, w.to_f64()),
                );
            } else {
                let w = bf16::from_f32(xi);
                c.push(
                    &what,
                    (g as u32, bf16::from_bits(g).to_f64()),
                    (w.to_bits() as u32, w.to_f64()),
                );
            }
        }
    }
    let f32_bits = |v: f32| (v.to_bits(), v as f64);
    let dec = fp8_dec.to_host()?;
    for (j, way) in dec.chunks(256).enumerate() {
        for (i, &g) in way.iter().enumerate() {
            let what = || format!("fp8 decode way {j} of code {i:#04x}");
            let want = if j < 3 {
                e4m3_to_f32(i as u8)
            } else {
                e5m2_to_f32(i as u8)
            };
            c.push(&what, f32_bits(g), f32_bits(want));
        }
    }
    let to_f16 = fp8_f16.to_host()?;
    for (j, way) in to_f16.chunks(256).enumerate() {
        for (i, &g) in way.iter().enumerate() {
            let code = if j < 2 {
                i
            } else {
                // block i / 8; element 2q + h is byte q of row x (h = 0: codes 8b..) or y (8b + 4..)
                (i & !7) + (i % 8) / 2 + 4 * (i % 2)
            };
            let what = || format!("e4m3 -> f16 way {j} at {i} (code {code:#04x})");
            let w = f16::from_f32(e4m3_to_f32(code as u8));
            c.push(
                &what,
                (g.to_bits() as u32, g.to_f64()),
                (w.to_bits() as u32, w.to_f64()),
            );
        }
    }
    let hdec = half_dec.to_host()?;
    for (j, way) in hdec.chunks(65536).enumerate() {
        for (i, &g) in way.iter().enumerate() {
            let what = || format!("f16/bf16 decode way {j} of code {i:#06x}");
            let want = if j < 2 {
                f16::from_bits(i as u16).to_f32()
            } else {
                bf16::from_bits(i as u16).to_f32()
            };
            c.push(&what, f32_bits(g), f32_bits(want));
        }
    }
    let mut checked = Checked::exact(&c.got, &c.want);
    if c.mismatches > 0 {
        checked.note = Some(format!(
            "{} outputs differ from the reference in their bits:\n  {}",
            c.mismatches,
            c.first.join("\n  ")
        ));
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_cover_every_kernel_and_mode() {
        for quick in [false, true] {
            let c = cases(quick);
            let used: std::collections::HashSet<TestKernel> = c.iter().map(|k| k.kernel()).collect();
            for k in super::super::all_kernels() {
                assert!(used.contains(&k), "{k:?} has no case");
            }
            for elem in [DType::F16, DType::BF16] {
                for mode in [
                    MmaMode::Fragments,
                    MmaMode::Ldmatrix,
                    MmaMode::LdmatrixTrans,
                    MmaMode::Movmatrix,
                ] {
                    assert!(c
                        .iter()
                        .any(|k| matches!(k.test, Test::MmaSync { elem: e, mode: m, .. } if e == elem && m == mode)));
                }
            }
            let names: std::collections::HashSet<String> = c.iter().map(|k| k.name()).collect();
            assert_eq!(names.len(), c.len(), "case names are unique");
        }
    }

    #[test]
    fn ring_cases_wrap_the_ring_several_times() {
        for c in cases(false) {
            match c.test {
                Test::MbarrierRing { stages, tiles } => assert!(tiles > 2 * stages as usize + 1),
                Test::CpAsync { stages, n } => {
                    assert!(n % 4 == 0 && n % 512 != 0 && n / 512 > 2 * stages as usize)
                }
                _ => {}
            }
        }
    }

    #[test]
    fn tma_box_grid_covers_the_matrix_from_negative_coordinates() {
        for elem in [DType::F32, DType::F16] {
            let (bc, br) = tma_tile_box(elem);
            let (rows, cols) = (100i64, 80i64);
            let bx = ((cols - TMA_COL0) as usize).div_ceil(bc as usize) as i64;
            let by = ((rows - TMA_ROW0) as usize).div_ceil(br as usize) as i64;
            // the last box reaches past the matrix, the one before does not reach its end
            assert!(TMA_COL0 + bx * bc as i64 >= cols && TMA_COL0 + (bx - 1) * (bc as i64) < cols);
            assert!(TMA_ROW0 + by * br as i64 >= rows && TMA_ROW0 + (by - 1) * (br as i64) < rows);
            // 128-byte swizzle needs 128-byte box rows
            if elem == DType::F16 {
                assert_eq!(bc as usize * elem.size(), 128);
            }
        }
    }

    #[test]
    fn params_layouts() {
        assert_eq!(std::mem::offset_of!(TmaTileParams, out_map), 128);
        assert_eq!(std::mem::offset_of!(TmaTileParams, boxes), 256);
        assert_eq!(std::mem::offset_of!(TmaTileParams, row0), 272);
        assert_eq!(std::mem::offset_of!(MbarrierRingParams, tiles), 136);
        assert_eq!(std::mem::offset_of!(ConvertParams, n), 48);
    }
}
