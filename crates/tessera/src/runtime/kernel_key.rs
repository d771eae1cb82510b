//! One list of specialisation constants per kernel variant, from which its name, its NVRTC
//! preamble and (through the preamble) its cache hash are all produced, so they cannot drift.
//!
//! ```
//! use tessera::runtime::KernelKey;
//! use tessera::DType;
//! let key = KernelKey::new("softmax")
//!     .ty("InT", DType::F16)
//!     .int("kBlockThreads", "t", 128)
//!     .flag("kLogSoftmax", "log", false);
//! assert_eq!(key.name(), "softmax_fp16_t128");
//! assert!(key.preamble().contains("using InT = ts::f16;"));
//! assert!(key.preamble().contains("constexpr bool kLogSoftmax = false;"));
//! ```

use super::jit::KernelSpec;
use crate::dtype::DType;

/// How one constant appears in the preamble and in the name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Value {
    /// `constexpr int NAME = v;`, name part `{label}{v}`.
    Int(i64),
    /// `constexpr bool NAME = v;`, name part `{label}` when true.
    Flag(bool),
    /// `using NAME = <C++ type>;`, name part the dtype's short name.
    Type(DType),
    /// `constexpr int NAME = v;` for an enumerated choice, name part `{label}` (the choice's name).
    Choice(i64),
    /// `#define NAME 1` when on (a compile switch read with `#ifdef`), name part `{label}`.
    Define(bool),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Constant {
    name: &'static str,
    label: String,
    value: Value,
}

/// The specialisation of one kernel variant: a family name and an ordered list of
/// (constant, value) pairs. [`KernelKey::name`], [`KernelKey::preamble`] and
/// [`KernelKey::spec`] all read this one list.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelKey {
    family: &'static str,
    constants: Vec<Constant>,
}

impl KernelKey {
    /// A key of the kernel family `family` (the first part of every variant's name).
    pub fn new(family: &'static str) -> KernelKey {
        KernelKey {
            family,
            constants: Vec::new(),
        }
    }

    fn push(mut self, name: &'static str, label: impl Into<String>, value: Value) -> KernelKey {
        debug_assert!(
            self.constants.iter().all(|c| c.name != name),
            "kernel key {}: constant {name} given twice",
            self.family
        );
        self.constants.push(Constant {
            name,
            label: label.into(),
            value,
        });
        self
    }

    /// `constexpr int name = value;`, named `{label}{value}` (`t128`).
    pub fn int(self, name: &'static str, label: &'static str, value: impl Into<i64>) -> KernelKey {
        self.push(name, label, Value::Int(value.into()))
    }

    /// `constexpr bool name = value;`, named `label` when true and not at all when false.
    pub fn flag(self, name: &'static str, label: &'static str, value: bool) -> KernelKey {
        self.push(name, label, Value::Flag(value))
    }

    /// `using name = <dtype's device type>;`, named by the dtype (`fp16`).
    pub fn ty(self, name: &'static str, dtype: DType) -> KernelKey {
        self.push(name, dtype.to_string(), Value::Type(dtype))
    }

    /// `constexpr int name = index;` for one of several named choices (a kernel path), named
    /// `label` (`warp`).
    pub fn choice(self, name: &'static str, label: impl Into<String>, index: impl Into<i64>) -> KernelKey {
        self.push(name, label, Value::Choice(index.into()))
    }

    /// `#define name 1` when `on` (a switch the source tests with `#ifdef`), named `label` then.
    pub fn define(self, name: &'static str, label: &'static str, on: bool) -> KernelKey {
        self.push(name, label, Value::Define(on))
    }

    /// The variant's readable name: the family and each constant's part, joined by `_`.
    pub fn name(&self) -> String {
        let mut s = self.family.to_string();
        for c in &self.constants {
            let part = match c.value {
                Value::Int(v) => format!("{}{v}", c.label),
                Value::Flag(true) | Value::Define(true) | Value::Type(_) | Value::Choice(_) => c.label.clone(),
                Value::Flag(false) | Value::Define(false) => continue,
            };
            s.push('_');
            s.push_str(&part);
        }
        s
    }

    /// The source lines that specialise the kernel: the dtype header, one line per constant,
    /// and `TS_GENERATED_PREAMBLE` (which kernel files check to refuse compiling without one).
    pub fn preamble(&self) -> String {
        let mut s = String::from("#include \"tessera/dtype.cuh\"\n");
        for c in &self.constants {
            let line = match c.value {
                Value::Int(v) | Value::Choice(v) => format!("constexpr int {} = {v};\n", c.name),
                Value::Flag(b) => format!("constexpr bool {} = {b};\n", c.name),
                Value::Type(t) => format!("using {} = {};\n", c.name, t.cuda_type()),
                Value::Define(true) => format!("#define {} 1\n", c.name),
                Value::Define(false) => continue,
            };
            s.push_str(&line);
        }
        s.push_str("#define TS_GENERATED_PREAMBLE 1\n");
        s
    }

    /// The kernel spec of this variant: `source` (from `file`, embedded with `include_str!`)
    /// specialised by this key, entered at `entry`, compiled with the operator's own device
    /// `headers` beside the shared device library.
    pub fn spec(
        &self,
        file: &'static str,
        source: &'static str,
        entry: &'static str,
        headers: &'static [(&'static str, &'static str)],
    ) -> KernelSpec {
        KernelSpec {
            name: self.name(),
            file,
            source,
            preamble: self.preamble(),
            entry,
            headers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_and_preamble_come_from_the_same_list() {
        let key = KernelKey::new("flash_fwd")
            .choice("kPath", "hopper", 2)
            .ty("Elem", DType::BF16)
            .int("kHeadDim", "d", 128)
            .flag("kMasked", "mask", true)
            .flag("kSplit", "split", false)
            .define("TS_SIMPLE", "simple", true)
            .define("TS_OTHER", "other", false);
        assert_eq!(key.name(), "flash_fwd_hopper_bf16_d128_mask_simple");
        let p = key.preamble();
        for line in [
            "constexpr int kPath = 2;",
            "using Elem = ts::bf16;",
            "constexpr int kHeadDim = 128;",
            "constexpr bool kMasked = true;",
            "constexpr bool kSplit = false;",
            "#define TS_SIMPLE 1",
            "#define TS_GENERATED_PREAMBLE 1",
        ] {
            assert!(p.contains(line), "{line} missing from\n{p}");
        }
        assert!(!p.contains("TS_OTHER"));
    }

    #[test]
    fn a_different_value_changes_name_and_preamble() {
        let a = KernelKey::new("k").int("kX", "x", 1);
        let b = KernelKey::new("k").int("kX", "x", 2);
        assert_ne!(a.name(), b.name());
        assert_ne!(a.preamble(), b.preamble());
        assert_ne!(a, b);
    }
}
