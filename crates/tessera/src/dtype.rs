//! Storage dtypes, the host element trait, the host type of each float dtype ([`host`]) and
//! the dtype-to-type dispatch ([`dispatch_float!`](crate::dispatch_float)).

use half::{bf16, f16};

/// Storage dtype of a tensor. Compute is always at least f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    F8E4M3,
    F8E5M2,
    F64,
    /// Raw bytes (workspaces, L2 flush buffers).
    U8,
    /// 8-bit signed integers (int8 GEMM operands).
    I8,
    /// 32-bit signed integers (offsets such as `cu_seqlens`, block tables; int8 GEMM outputs).
    I32,
    /// 64-bit signed integers (sparse offsets and indices beyond 2^31).
    I64,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F64 => 8,
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F8E4M3 | DType::F8E5M2 | DType::U8 | DType::I8 => 1,
            DType::I32 => 4,
            DType::I64 => 8,
        }
    }
    /// Short name used in CLI output, JSON (`"fp16"`) and kernel keys.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F64 => "fp64",
            DType::F32 => "fp32",
            DType::F16 => "fp16",
            DType::BF16 => "bf16",
            DType::F8E4M3 => "fp8e4m3",
            DType::F8E5M2 => "fp8e5m2",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }
    /// The device-library type name (`src/cuda/dtype.cuh`).
    pub const fn cuda_type(self) -> &'static str {
        match self {
            DType::F64 => "double",
            DType::F32 => "float",
            DType::F16 => "ts::f16",
            DType::BF16 => "ts::bf16",
            DType::F8E4M3 => "ts::fp8e4m3",
            DType::F8E5M2 => "ts::fp8e5m2",
            DType::U8 => "uint8_t",
            DType::I8 => "int8_t",
            DType::I32 => "int",
            DType::I64 => "long long",
        }
    }
    /// Relative-L2 error budget of DESIGN.md for outputs stored in this dtype.
    pub const fn rel_l2_budget(self) -> f64 {
        match self {
            DType::F64 => 1e-12,
            DType::F32 => 1e-5,
            DType::F16 => 2e-3,
            DType::BF16 => 1e-2,
            DType::F8E4M3 | DType::F8E5M2 => 6e-2,
            DType::U8 | DType::I8 | DType::I32 | DType::I64 => 0.0,
        }
    }
    /// Parses `fp32|f32|float32`, `fp16|f16|half|float16`, `bf16|bfloat16`.
    pub fn parse(s: &str) -> Option<DType> {
        Some(match s.to_ascii_lowercase().as_str() {
            "fp64" | "f64" | "float64" => DType::F64,
            "fp32" | "f32" | "float32" | "float" => DType::F32,
            "fp16" | "f16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "fp8e4m3" | "e4m3" => DType::F8E4M3,
            "fp8e5m2" | "e5m2" => DType::F8E5M2,
            "u8" | "uint8" => DType::U8,
            "i8" | "int8" => DType::I8,
            "i32" | "int32" => DType::I32,
            "i64" | "int64" => DType::I64,
            _ => return None,
        })
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The host element type of each float [`DType`], named as its variant, so that
/// [`dispatch_float!`](crate::dispatch_float) can write `$crate::dtype::host::$variant`.
pub mod host {
    /// [`DType::F64`](super::DType::F64).
    pub type F64 = f64;
    /// [`DType::F32`](super::DType::F32).
    pub type F32 = f32;
    /// [`DType::F16`](super::DType::F16): IEEE binary16.
    pub type F16 = half::f16;
    /// [`DType::BF16`](super::DType::BF16): bfloat16.
    pub type BF16 = half::bf16;
}

/// Calls generic code with the host element type of a run-time [`DType`](crate::DType): the one
/// `match` from a dtype to a type parameter, written once.
///
/// `dispatch_float!(dtype, [F16, BF16, F32], |T| run::<T>(ctx, case, seed))` expands to a
/// `match dtype` with one arm per listed variant, each binding `type T =` its host type
/// ([`dtype::host`](crate::dtype::host): `F64` f64, `F32` f32, `F16` `half::f16`, `BF16`
/// `half::bf16`) before evaluating the body, and for any other dtype evaluates to
/// `Err(Error::Unsupported(..))` naming the dtype and the supported list. The body must
/// therefore be a `Result<_>` (of [`crate::Error`]). An optional leading `"what";` names the
/// operation in the error: `"{what} dtype {dtype}; supported: fp16, bf16, fp32"` (default
/// `"this operation"`). Dispatches nest, e.g. for an input and an output dtype.
///
/// ```
/// use tessera::{dispatch_float, DType, Element, Result};
///
/// fn bytes_of<T: Element>(n: usize) -> Result<usize> {
///     Ok(n * std::mem::size_of::<T>())
/// }
/// fn bytes(dtype: DType, n: usize) -> Result<usize> {
///     dispatch_float!("bytes"; dtype, [F16, BF16, F32], |T| bytes_of::<T>(n))
/// }
/// assert_eq!(bytes(DType::BF16, 3).unwrap(), 6);
/// assert_eq!(bytes(DType::F32, 3).unwrap(), 12);
/// let e = bytes(DType::F8E4M3, 3).unwrap_err().to_string();
/// assert!(e.contains("bytes dtype fp8e4m3; supported: fp16, bf16, fp32"), "{e}");
///
/// // nested: every (input, output) pair of two lists
/// fn pair(i: DType, o: DType) -> Result<(usize, usize)> {
///     dispatch_float!(i, [F32, F16], |I| dispatch_float!(o, [F64, BF16], |O| Ok((
///         std::mem::size_of::<I>(),
///         std::mem::size_of::<O>()
///     ))))
/// }
/// assert_eq!(pair(DType::F16, DType::F64).unwrap(), (2, 8));
/// assert!(pair(DType::F16, DType::F32).is_err());
/// ```
#[macro_export]
macro_rules! dispatch_float {
    ($what:expr; $dtype:expr, [$($variant:ident),+ $(,)?], |$t:ident| $body:expr) => {
        match $dtype {
            $($crate::dtype::DType::$variant => {
                #[allow(dead_code)]
                type $t = $crate::dtype::host::$variant;
                $body
            })+
            #[allow(unreachable_patterns)]
            other => Err($crate::Error::Unsupported(format!(
                "{} dtype {}; supported: {}",
                $what,
                other,
                [$($crate::dtype::DType::$variant.name()),+].join(", ")
            ))),
        }
    };
    ($dtype:expr, [$($variant:ident),+ $(,)?], |$t:ident| $body:expr) => {
        $crate::dispatch_float!("this operation"; $dtype, [$($variant),+], |$t| $body)
    };
}

/// A host element type that has a device storage dtype.
///
/// # Safety
/// `Self` must have exactly the size and bit layout of `Self::DTYPE` on the device, and every
/// bit pattern must be a valid value (device memory is copied into it byte for byte).
pub unsafe trait Element: Copy + Send + Sync + Default + std::fmt::Debug + 'static {
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    fn to_f32(self) -> f32 {
        self.to_f64() as f32
    }
    fn from_f32(v: f32) -> Self {
        Self::from_f64(v as f64)
    }
}

// SAFETY: f32/f64 are IEEE binary32/64 on host and device; all bit patterns valid.
unsafe impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}
// SAFETY: as above.
unsafe impl Element for f64 {
    const DTYPE: DType = DType::F64;
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> Self {
        v
    }
}
// SAFETY: four bytes, every pattern valid.
unsafe impl Element for i32 {
    const DTYPE: DType = DType::I32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as i32
    }
}
// SAFETY: eight bytes, every pattern valid.
unsafe impl Element for i64 {
    const DTYPE: DType = DType::I64;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as i64
    }
}
// SAFETY: one byte, every pattern valid (two's complement on host and device).
unsafe impl Element for i8 {
    const DTYPE: DType = DType::I8;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as i8
    }
}
// SAFETY: one byte, every pattern valid.
unsafe impl Element for u8 {
    const DTYPE: DType = DType::U8;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as u8
    }
}
// SAFETY: `half::f16` is a `u16` holding IEEE binary16 bits, as `ts::f16` on the device.
unsafe impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
    fn to_f32(self) -> f32 {
        self.to_f32()
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}
// SAFETY: `half::bf16` is a `u16` holding bfloat16 bits, as `ts::bf16` on the device.
unsafe impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
    fn to_f32(self) -> f32 {
        self.to_f32()
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dtype_of<T: Element>() -> crate::Result<DType> {
        Ok(T::DTYPE)
    }

    #[test]
    fn dispatch_binds_each_variant_to_its_host_type() {
        for d in [DType::F64, DType::F32, DType::F16, DType::BF16] {
            // every float variant listed: the fallback arm is unreachable (and allowed)
            let got = crate::dispatch_float!(d, [F64, F32, F16, BF16], |T| dtype_of::<T>());
            assert_eq!(got.unwrap(), d);
        }
        for d in [DType::F8E4M3, DType::U8, DType::I32] {
            let e = crate::dispatch_float!(d, [F16, BF16], |T| dtype_of::<T>())
                .unwrap_err()
                .to_string();
            assert_eq!(
                e,
                format!("unsupported: this operation dtype {d}; supported: fp16, bf16")
            );
        }
        let e = crate::dispatch_float!("softmax bench"; DType::F64, [F16], |T| dtype_of::<T>())
            .unwrap_err()
            .to_string();
        assert!(e.contains("softmax bench dtype fp64; supported: fp16"), "{e}");
    }

    #[test]
    fn sizes_match_host_types() {
        assert_eq!(DType::F32.size(), std::mem::size_of::<f32>());
        assert_eq!(DType::F16.size(), std::mem::size_of::<f16>());
        assert_eq!(DType::BF16.size(), std::mem::size_of::<bf16>());
        for d in [DType::F32, DType::F16, DType::BF16, DType::F8E4M3, DType::F64] {
            assert_eq!(DType::parse(d.name()), Some(d));
        }
    }
}
