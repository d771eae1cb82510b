//! TMA tensor maps (`CUtensorMap`): host-side encoding of the descriptors that Hopper kernels
//! take as `const __grid_constant__` parameters for `cp.async.bulk.tensor` (DESIGN.md, Kernels).
//!
//! A map describes a tiled view of a tensor of rank 1 to 5: the extent of every dimension
//! (innermost first), the byte strides of the outer ones (the innermost is contiguous), the box
//! one copy moves, the shared-memory swizzle, the L2 promotion and what out-of-bounds elements
//! read as. Interleaving is always none. [`encode_tiled`] checks what TMA requires of the
//! addresses (16-byte aligned base, strides positive multiples of 16 bytes below 2^40) before
//! the driver is called, so that a caller can fall back to another kernel on
//! [`TmaError::Misaligned`]; the driver checks the rest.

use cudarc::driver::sys;

use crate::dtype::DType;
use crate::error::Error;

/// A `CUtensorMap` (128 opaque bytes, 64-byte aligned), as `ts::TensorMap` on the device.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default)]
pub struct TensorMap {
    pub opaque: [u64; 16],
}

/// Why a view cannot be described by a tensor map.
#[derive(Debug)]
pub enum TmaError {
    /// Base address or a stride is not a multiple of 16 bytes (or a stride is 0, negative or
    /// 2^40 bytes or more): TMA cannot describe this view.
    Misaligned(String),
    /// The description is malformed (rank, array lengths, a dtype TMA has no type for).
    Invalid(Error),
    /// The driver rejected the map.
    Driver(Error),
}

/// Shared-memory swizzle of a box (`CUtensorMapSwizzle`): the inner box dimension must span at
/// most the swizzle width.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Swizzle {
    #[default]
    None,
    B32,
    B64,
    B128,
}

/// How far each TMA load promotes its lines in L2 (`CUtensorMapL2promotion`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum L2Promotion {
    #[default]
    None,
    B64,
    B128,
    B256,
}

/// What elements outside the tensor read as (`CUtensorMapFloatOOBfill`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum OobFill {
    /// Zeros.
    #[default]
    Zeros,
    /// NaN, and the FMA of a NaN request reads zero (`..._NAN_REQUEST_ZERO_FMA`).
    NanRequestZeroFma,
}

/// The geometry of one tiled tensor map. Slices are indexed innermost dimension first.
#[derive(Clone, Copy, Debug)]
pub struct TiledMap<'a> {
    /// Device address of element 0 (16-byte aligned).
    pub ptr: u64,
    pub dtype: DType,
    /// Extent of each dimension (rank 1..=5 entries, each >= 1).
    pub dims: &'a [u64],
    /// Byte strides of dimensions 1.. (rank - 1 entries): positive multiples of 16 below 2^40.
    pub byte_strides: &'a [u64],
    /// Names of the strided dimensions for error messages (`byte_strides.len()` entries, or
    /// empty for "dimension i").
    pub stride_names: &'a [&'a str],
    /// Elements of the box one copy moves, per dimension (rank entries, each 1..=256).
    pub box_dims: &'a [u32],
    /// Traversal stride per dimension (rank entries, usually all 1).
    pub element_strides: &'a [u32],
    pub swizzle: Swizzle,
    pub l2_promotion: L2Promotion,
    pub oob_fill: OobFill,
}

/// The TMA element type of a dtype; `None` for one TMA has no type for (fp8, int8: describe it as
/// bytes, [`DType::U8`]).
pub fn data_type(dtype: DType) -> Option<sys::CUtensorMapDataType> {
    use sys::CUtensorMapDataType as T;
    Some(match dtype {
        DType::F16 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::BF16 => T::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        DType::F32 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        DType::F64 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT64,
        DType::I32 => T::CU_TENSOR_MAP_DATA_TYPE_INT32,
        DType::I64 => T::CU_TENSOR_MAP_DATA_TYPE_INT64,
        DType::U8 => T::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        DType::F8E4M3 | DType::F8E5M2 | DType::I8 => return None,
    })
}

/// Checks a map's description without the driver: rank and array lengths, the dtype, and TMA's
/// alignment rules (base address, then each stride in order).
pub fn check(m: &TiledMap) -> Result<sys::CUtensorMapDataType, TmaError> {
    let rank = m.dims.len();
    if !(1..=5).contains(&rank)
        || m.byte_strides.len() != rank - 1
        || m.box_dims.len() != rank
        || m.element_strides.len() != rank
        || !(m.stride_names.is_empty() || m.stride_names.len() == rank - 1)
    {
        return Err(TmaError::Invalid(Error::invalid(
            "tensor map",
            format!(
                "a tensor map has rank 1..=5 with one extent, box size and element stride per \
                 dimension and one byte stride per dimension after the first, got {} extents, {} \
                 strides, {} box sizes, {} element strides",
                rank,
                m.byte_strides.len(),
                m.box_dims.len(),
                m.element_strides.len()
            ),
        )));
    }
    let Some(data_type) = data_type(m.dtype) else {
        return Err(TmaError::Invalid(Error::Unsupported(format!(
            "TMA tensor maps have no element type for {}",
            m.dtype
        ))));
    };
    if m.ptr % 16 != 0 {
        return Err(TmaError::Misaligned(format!(
            "base address {:#x} is not 16-byte aligned",
            m.ptr
        )));
    }
    for (i, &b) in m.byte_strides.iter().enumerate() {
        if b == 0 || b % 16 != 0 || b >= 1 << 40 {
            let name = match m.stride_names.get(i) {
                Some(n) => n.to_string(),
                None => format!("dimension {}", i + 1),
            };
            return Err(TmaError::Misaligned(format!(
                "{name} stride of {b} bytes is not a positive multiple of 16 below 2^40"
            )));
        }
    }
    Ok(data_type)
}

/// Encodes a tiled tensor map (`cuTensorMapEncodeTiled`) after [`check`].
pub fn encode_tiled(m: &TiledMap) -> Result<TensorMap, TmaError> {
    let data_type = check(m)?;
    let swizzle = match m.swizzle {
        Swizzle::None => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
        Swizzle::B32 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
        Swizzle::B64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
        Swizzle::B128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
    };
    let l2 = match m.l2_promotion {
        L2Promotion::None => sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_NONE,
        L2Promotion::B64 => sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
        L2Promotion::B128 => sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        L2Promotion::B256 => sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
    };
    let oob = match m.oob_fill {
        OobFill::Zeros => sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        OobFill::NanRequestZeroFma => sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA,
    };
    let mut map = TensorMap::default();
    // SAFETY: `map` is 128 writable bytes with 64-byte alignment (what the driver writes); the
    // arrays outlive the call and have `rank` entries (strides rank - 1; checked above); the
    // address is only recorded, never dereferenced on the host.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map as *mut TensorMap as *mut sys::CUtensorMap,
            data_type,
            m.dims.len() as u32,
            m.ptr as *mut std::ffi::c_void,
            m.dims.as_ptr(),
            m.byte_strides.as_ptr(),
            m.box_dims.as_ptr(),
            m.element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            l2,
            oob,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(TmaError::Driver(Error::cuda(
            "cuTensorMapEncodeTiled",
            format!(
                "{r:?} for dims {:?} byte strides {:?} box {:?}",
                m.dims, m.byte_strides, m.box_dims
            ),
        )));
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map<'a>(ptr: u64, dims: &'a [u64], strides: &'a [u64], boxes: &'a [u32], ones: &'a [u32]) -> TiledMap<'a> {
        TiledMap {
            ptr,
            dtype: DType::F16,
            dims,
            byte_strides: strides,
            stride_names: &[],
            box_dims: boxes,
            element_strides: ones,
            swizzle: Swizzle::B128,
            l2_promotion: L2Promotion::B256,
            oob_fill: OobFill::Zeros,
        }
    }

    #[test]
    fn tensor_map_is_the_drivers_size() {
        assert_eq!(std::mem::size_of::<TensorMap>(), 128);
        assert_eq!(std::mem::align_of::<TensorMap>(), 64);
    }

    /// The checks that run before the driver: alignment (base, then each stride, named) and
    /// the shape of the description.
    #[test]
    fn check_follows_tmas_alignment_rules() {
        let ones = [1u32; 4];
        let dims = [128u64, 100, 8, 2];
        let ok = map(0x1000, &dims, &[2048, 256, 204800], &[64, 128, 1, 1], &ones);
        assert!(check(&ok).is_ok());
        let e = check(&TiledMap { ptr: 0x1008, ..ok });
        assert!(
            matches!(&e, Err(TmaError::Misaligned(w)) if w.contains("base address 0x1008")),
            "{e:?}"
        );
        for strides in [[2048u64, 8, 204800], [2048, 0, 204800], [2048, 256, 1 << 40]] {
            let e = check(&TiledMap {
                byte_strides: &strides,
                stride_names: &["row", "head", "batch"],
                ..ok
            });
            assert!(
                matches!(&e, Err(TmaError::Misaligned(w)) if w.contains("stride of")),
                "{e:?}"
            );
        }
        let e = check(&TiledMap {
            byte_strides: &[2048, 24, 204800],
            stride_names: &["row", "head", "batch"],
            ..ok
        });
        assert!(
            matches!(&e, Err(TmaError::Misaligned(w)) if w.starts_with("head stride of 24 bytes")),
            "{e:?}"
        );
        let e = check(&TiledMap {
            byte_strides: &[2048, 24, 204800],
            ..ok
        });
        assert!(
            matches!(&e, Err(TmaError::Misaligned(w)) if w.starts_with("dimension 2 stride")),
            "{e:?}"
        );
        // rank 1 (no strides) and 5 are fine; 0 and 6, or mismatched lengths, are not
        assert!(check(&map(0, &[64], &[], &[64], &[1])).is_ok());
        assert!(check(&map(0, &[2; 5], &[16, 32, 64, 128], &[1; 5], &[1; 5])).is_ok());
        assert!(matches!(check(&map(0, &[], &[], &[], &[])), Err(TmaError::Invalid(_))));
        assert!(matches!(
            check(&map(0, &[2; 6], &[16; 5], &[1; 6], &[1; 6])),
            Err(TmaError::Invalid(_))
        ));
        assert!(matches!(
            check(&map(0, &dims, &[2048, 256], &[64, 128, 1, 1], &ones)),
            Err(TmaError::Invalid(_))
        ));
        assert!(matches!(
            check(&TiledMap {
                dtype: DType::F8E4M3,
                ..ok
            }),
            Err(TmaError::Invalid(Error::Unsupported(_)))
        ));
    }

    #[test]
    fn every_dtype_but_fp8_has_a_tma_type() {
        for d in [DType::F16, DType::BF16, DType::F32, DType::F64, DType::I32, DType::U8] {
            assert!(data_type(d).is_some(), "{d}");
        }
        assert!(data_type(DType::F8E5M2).is_none());
    }
}
