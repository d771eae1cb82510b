//! Run-time compilation of kernels with NVRTC, and the on-disk CUBIN cache.
//!
//! A kernel is a [`KernelSpec`]: one `.cu` file embedded with `include_str!`, a generated
//! preamble of `constexpr` specialisation constants, and the name of its `extern "C"` entry.
//! [`compile_uncached`] turns it into CUBIN for one exact architecture ([`Arch`]), handing NVRTC the
//! header-free device library of `src/cuda/` as named headers (`#include "tessera/vec.cuh"`).
//!
//! The cache key is the SHA-256 of the preamble, the source, every device header, the options,
//! the target architecture and the NVRTC version. Entries live in memory (per [`JitCache`]) and
//! on disk under [`default_cache_dir`]; writes go to a temporary file and are renamed into place,
//! a corrupt entry (bad magic or checksum) is recompiled and rewritten, and an unwritable
//! directory degrades to memory only with one warning.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use cudarc::nvrtc::sys as nv;
use sha2::{Digest, Sha256};

use super::probe;
use crate::error::{Error, Result};

/// The shared device library handed to NVRTC as named headers: `(include name, contents)`.
/// An operator's own headers travel with its kernels ([`KernelSpec::headers`]).
pub const DEVICE_HEADERS: &[(&str, &str)] = &[
    ("tessera/common.cuh", include_str!("../cuda/common.cuh")),
    ("tessera/dtype.cuh", include_str!("../cuda/dtype.cuh")),
    ("tessera/vec.cuh", include_str!("../cuda/vec.cuh")),
    ("tessera/reduce.cuh", include_str!("../cuda/reduce.cuh")),
    ("tessera/math.cuh", include_str!("../cuda/math.cuh")),
    ("tessera/online_softmax.cuh", include_str!("../cuda/online_softmax.cuh")),
    ("tessera/cluster.cuh", include_str!("../cuda/cluster.cuh")),
    ("tessera/memory_order.cuh", include_str!("../cuda/memory_order.cuh")),
    ("tessera/async_copy.cuh", include_str!("../cuda/async_copy.cuh")),
    ("tessera/mbarrier.cuh", include_str!("../cuda/mbarrier.cuh")),
    ("tessera/tma.cuh", include_str!("../cuda/tma.cuh")),
    ("tessera/wgmma_ops.cuh", include_str!("../cuda/wgmma_ops.cuh")),
    ("tessera/wgmma.cuh", include_str!("../cuda/wgmma.cuh")),
    ("tessera/mma.cuh", include_str!("../cuda/mma.cuh")),
];

/// A GPU architecture to compile for, e.g. `sm_90a`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Arch {
    pub major: u32,
    pub minor: u32,
}

impl Arch {
    pub const SM80: Arch = Arch { major: 8, minor: 0 };
    pub const SM86: Arch = Arch { major: 8, minor: 6 };
    pub const SM89: Arch = Arch { major: 8, minor: 9 };
    pub const SM90: Arch = Arch { major: 9, minor: 0 };
    /// The architectures CI compiles every kernel for.
    pub const CI_TARGETS: [Arch; 4] = [Arch::SM80, Arch::SM86, Arch::SM89, Arch::SM90];

    /// NVRTC target name. Hopper gets the arch-specific `sm_90a` so `wgmma`/`setmaxnreg` are
    /// available.
    pub fn target(self) -> String {
        let suffix = if self.major == 9 && self.minor == 0 { "a" } else { "" };
        format!("sm_{}{}{}", self.major, self.minor, suffix)
    }

    /// Parses `sm_90a`, `sm_90`, `90`, `9.0`.
    pub fn parse(s: &str) -> Option<Arch> {
        let t = s.trim().trim_start_matches("sm_").trim_end_matches('a');
        let (major, minor) = if let Some((a, b)) = t.split_once('.') {
            (a.parse().ok()?, b.parse().ok()?)
        } else {
            let n: u32 = t.parse().ok()?;
            (n / 10, n % 10)
        };
        (major >= 7).then_some(Arch { major, minor })
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.target())
    }
}

/// One kernel variant to compile.
#[derive(Clone, Debug)]
pub struct KernelSpec {
    /// A readable name of the variant, used in logs and errors (`softmax_fp16_warp_c8`).
    pub name: String,
    /// The file the source came from (for error messages and NVRTC's program name).
    pub file: &'static str,
    /// The kernel source (`include_str!`).
    pub source: &'static str,
    /// Specialisation constants prepended to the source.
    pub preamble: String,
    /// The `extern "C"` entry point to load.
    pub entry: &'static str,
    /// The operator's own device headers (`(include name, contents)`), handed to NVRTC beside
    /// [`DEVICE_HEADERS`].
    pub headers: &'static [(&'static str, &'static str)],
}

impl KernelSpec {
    /// Every header this kernel may include: the shared library, then the operator's own.
    pub fn all_headers(&self) -> impl Iterator<Item = &(&'static str, &'static str)> {
        DEVICE_HEADERS.iter().chain(self.headers)
    }

    fn full_source(&self) -> String {
        format!(
            "// tessera kernel {}\n{}\n#line 1 \"{}\"\n{}",
            self.name, self.preamble, self.file, self.source
        )
    }
}

/// NVRTC options used for every kernel (besides `-arch`).
pub fn base_options() -> Vec<String> {
    [
        "--std=c++17",
        "--device-as-default-execution-space",
        "--ptxas-options=-v",
        "-lineinfo",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// What ptxas reported for the entry function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelResources {
    pub registers: u32,
    /// Static shared memory in bytes.
    pub shared_bytes: u32,
    pub stack_bytes: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
}

impl KernelResources {
    /// Parses NVRTC's program log produced with `--ptxas-options=-v`.
    pub fn parse(log: &str) -> KernelResources {
        fn num_before(line: &str, unit: &str) -> Option<u32> {
            let idx = line.find(unit)?;
            line[..idx]
                .split(|c: char| !c.is_ascii_digit())
                .rfind(|s| !s.is_empty())?
                .parse()
                .ok()
        }
        let mut r = KernelResources::default();
        for line in log.lines() {
            if line.contains("stack frame") {
                r.stack_bytes += num_before(line, "bytes stack frame").unwrap_or(0);
                r.spill_store_bytes += num_before(line, "bytes spill stores").unwrap_or(0);
                r.spill_load_bytes += num_before(line, "bytes spill loads").unwrap_or(0);
            }
            if line.contains("Used") && line.contains("registers") {
                r.registers = r.registers.max(num_before(line, " registers").unwrap_or(0));
                r.shared_bytes = r.shared_bytes.max(num_before(line, " bytes smem").unwrap_or(0));
            }
        }
        r
    }
    /// True when ptxas spilled nothing and used no stack.
    pub fn spill_free(&self) -> bool {
        self.spill_store_bytes == 0 && self.spill_load_bytes == 0 && self.stack_bytes == 0
    }
}

/// A compiled kernel: the CUBIN and what ptxas said about it.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub cubin: Arc<Vec<u8>>,
    pub log: String,
    pub resources: KernelResources,
    /// Whether this came from the cache rather than a fresh compile.
    pub cached: bool,
}

struct Program(nv::nvrtcProgram);
impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram and destroyed exactly once.
        unsafe {
            nv::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

fn cstring(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Unsupported(format!("{what} contains a NUL byte")))
}

/// Compiles `spec` for `arch` with NVRTC, bypassing every cache. Needs no GPU.
pub fn compile_uncached(spec: &KernelSpec, arch: Arch, extra_options: &[String]) -> Result<Compiled> {
    probe::nvrtc()?;
    let src = cstring(&spec.full_source(), "kernel source")?;
    let prog_name = cstring(spec.file, "file name")?;
    let header_src: Vec<CString> = spec
        .all_headers()
        .map(|(_, s)| cstring(s, "device header"))
        .collect::<Result<_>>()?;
    let header_names: Vec<CString> = spec
        .all_headers()
        .map(|(n, _)| cstring(n, "header name"))
        .collect::<Result<_>>()?;
    let hs: Vec<*const std::ffi::c_char> = header_src.iter().map(|c| c.as_ptr()).collect();
    let hn: Vec<*const std::ffi::c_char> = header_names.iter().map(|c| c.as_ptr()).collect();

    let mut options = base_options();
    options.push(format!("--gpu-architecture={}", arch.target()));
    options.extend(extra_options.iter().cloned());
    let opt_c: Vec<CString> = options.iter().map(|o| cstring(o, "option")).collect::<Result<_>>()?;
    let opt_p: Vec<*const std::ffi::c_char> = opt_c.iter().map(|c| c.as_ptr()).collect();

    let nvrtc_err = |call: &'static str, r: nv::nvrtcResult| Error::cuda(call, format!("{r:?}"));
    let mut raw = std::ptr::null_mut();
    // SAFETY: all pointers point to NUL-terminated strings that outlive the call; the header
    // arrays have one entry per header each.
    let r = unsafe {
        nv::nvrtcCreateProgram(
            &mut raw,
            src.as_ptr(),
            prog_name.as_ptr(),
            hs.len() as i32,
            hs.as_ptr(),
            hn.as_ptr(),
        )
    };
    if r != nv::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_err("nvrtcCreateProgram", r));
    }
    let prog = Program(raw);
    // SAFETY: valid program and option array.
    let compile_result = unsafe { nv::nvrtcCompileProgram(prog.0, opt_p.len() as i32, opt_p.as_ptr()) };
    let log = program_log(&prog)?;
    if compile_result != nv::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Compile {
            kernel: spec.name.clone(),
            arch: arch.target(),
            options,
            log,
        });
    }
    let mut size = 0usize;
    // SAFETY: valid program, out-parameter.
    let r = unsafe { nv::nvrtcGetCUBINSize(prog.0, &mut size) };
    if r != nv::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_err("nvrtcGetCUBINSize", r));
    }
    let mut cubin = vec![0u8; size];
    // SAFETY: the buffer holds `size` bytes as NVRTC asked.
    let r = unsafe { nv::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr() as *mut std::ffi::c_char) };
    if r != nv::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_err("nvrtcGetCUBIN", r));
    }
    let resources = KernelResources::parse(&log);
    Ok(Compiled {
        cubin: Arc::new(cubin),
        log,
        resources,
        cached: false,
    })
}

fn program_log(prog: &Program) -> Result<String> {
    let mut size = 0usize;
    // SAFETY: valid program, out-parameter.
    unsafe { nv::nvrtcGetProgramLogSize(prog.0, &mut size) };
    let mut buf = vec![0u8; size.max(1)];
    // SAFETY: buffer of the size NVRTC reported.
    unsafe { nv::nvrtcGetProgramLog(prog.0, buf.as_mut_ptr() as *mut std::ffi::c_char) };
    Ok(CStr::from_bytes_until_nul(&buf)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default())
}

/// The cache directory: `$TESSERA_CACHE_DIR`, else `$XDG_CACHE_HOME/tessera`, else
/// `~/.cache/tessera`. `None` when none can be named.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("TESSERA_CACHE_DIR").filter(|s| !s.is_empty()) {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|s| !s.is_empty()) {
        return Some(PathBuf::from(d).join("tessera"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tessera"))
}

const MAGIC: &[u8; 8] = b"TSCUBIN1";

/// In-memory and on-disk cache of compiled kernels.
pub struct JitCache {
    dir: Option<PathBuf>,
    memory: RwLock<HashMap<[u8; 32], Compiled>>,
    warned: AtomicBool,
}

impl JitCache {
    /// A cache backed by `dir` (memory only when `None`).
    pub fn new(dir: Option<PathBuf>) -> JitCache {
        JitCache {
            dir,
            memory: RwLock::new(HashMap::new()),
            warned: AtomicBool::new(false),
        }
    }

    /// The on-disk directory, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The cache key of `spec` for `arch` with this NVRTC.
    pub fn key(spec: &KernelSpec, arch: Arch, extra_options: &[String]) -> Result<[u8; 32]> {
        let nvrtc = probe::nvrtc()?;
        let mut h = Sha256::new();
        let mut field = |b: &[u8]| {
            h.update((b.len() as u64).to_le_bytes());
            h.update(b);
        };
        field(spec.preamble.as_bytes());
        field(spec.source.as_bytes());
        field(spec.file.as_bytes());
        field(spec.entry.as_bytes());
        for (n, s) in spec.all_headers() {
            field(n.as_bytes());
            field(s.as_bytes());
        }
        for o in base_options().iter().chain(extra_options) {
            field(o.as_bytes());
        }
        field(arch.target().as_bytes());
        field(format!("nvrtc {}.{}", nvrtc.version.0, nvrtc.version.1).as_bytes());
        Ok(h.finalize().into())
    }

    /// Returns the CUBIN of `spec` for `arch`, compiling only on a miss.
    /// `TESSERA_DISABLE_JIT=1` turns a miss into an error (for production deployments).
    pub fn get(&self, spec: &KernelSpec, arch: Arch) -> Result<Compiled> {
        let key = Self::key(spec, arch, &[])?;
        if let Some(c) = self.memory.read().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(c.clone());
        }
        let path = self.dir.as_ref().map(|d| d.join(format!("{}.cubin", hex(&key))));
        if let Some(c) = path.as_deref().and_then(read_entry) {
            self.memory
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, c.clone());
            return Ok(c);
        }
        if matches!(std::env::var("TESSERA_DISABLE_JIT").as_deref(), Ok("1")) {
            return Err(Error::Unsupported(format!(
                "kernel {} for {arch} is not in the cache and TESSERA_DISABLE_JIT=1 forbids compiling",
                spec.name
            )));
        }
        let compiled = compile_uncached(spec, arch, &[])?;
        if let Some(p) = &path {
            if let Err(e) = write_entry(p, &compiled) {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    eprintln!(
                        "tessera: warning: kernel cache {} is not writable ({e}); caching in memory only",
                        p.parent().map(|d| d.display().to_string()).unwrap_or_default()
                    );
                }
            }
        }
        self.memory
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, compiled.clone());
        Ok(compiled)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Entry layout: MAGIC | u32 log length | log | cubin | sha256(everything before).
fn encode_entry(c: &Compiled) -> Vec<u8> {
    let mut out = Vec::with_capacity(c.cubin.len() + c.log.len() + 48);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(c.log.len() as u32).to_le_bytes());
    out.extend_from_slice(c.log.as_bytes());
    out.extend_from_slice(&c.cubin);
    let sum: [u8; 32] = Sha256::digest(&out).into();
    out.extend_from_slice(&sum);
    out
}

fn decode_entry(bytes: &[u8]) -> Option<Compiled> {
    if bytes.len() < MAGIC.len() + 4 + 32 || &bytes[..8] != MAGIC {
        return None;
    }
    let (body, sum) = bytes.split_at(bytes.len() - 32);
    if Sha256::digest(body).as_slice() != sum {
        return None;
    }
    let log_len = u32::from_le_bytes(body[8..12].try_into().ok()?) as usize;
    let log = std::str::from_utf8(body.get(12..12 + log_len)?).ok()?.to_string();
    let cubin = body.get(12 + log_len..)?.to_vec();
    if cubin.is_empty() {
        return None;
    }
    let resources = KernelResources::parse(&log);
    Some(Compiled {
        cubin: Arc::new(cubin),
        log,
        resources,
        cached: true,
    })
}

fn read_entry(path: &Path) -> Option<Compiled> {
    let bytes = std::fs::read(path).ok()?;
    decode_entry(&bytes) // None (corrupt or missing) means: recompile and overwrite
}

fn write_entry(path: &Path, c: &Compiled) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        path.file_name().and_then(|s| s.to_str()).unwrap_or("entry"),
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::write(&tmp, encode_entry(c))?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Compiles `spec` for `arch` without a GPU (tests and CI), through the default disk cache.
/// Returns the CUBIN and ptxas's resource usage.
pub fn compile_only(spec: &KernelSpec, arch: Arch) -> Result<Compiled> {
    static CACHE: std::sync::OnceLock<JitCache> = std::sync::OnceLock::new();
    let cache = CACHE.get_or_init(|| JitCache::new(default_cache_dir()));
    let c = cache.get(spec, arch)?;
    if c.cached && c.log.is_empty() {
        // Entries always carry the ptxas log; an empty one means an older format.
        return compile_uncached(spec, arch, &[]);
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::probe::nvrtc_or_skip;

    #[test]
    fn parses_ptxas_log() {
        let log = "ptxas info    : 0 bytes gmem\nptxas info    : Compiling entry function 'k' for 'sm_90a'\n\
                   ptxas info    : Function properties for k\n    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
                   ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem, 412 bytes cmem[0]\n";
        let r = KernelResources::parse(log);
        assert_eq!(
            r,
            KernelResources {
                registers: 40,
                shared_bytes: 2048,
                stack_bytes: 8,
                spill_store_bytes: 4,
                spill_load_bytes: 12
            }
        );
        assert!(!r.spill_free());
    }

    #[test]
    fn arch_names() {
        assert_eq!(Arch::SM90.target(), "sm_90a");
        assert_eq!(Arch::SM86.target(), "sm_86");
        assert_eq!(Arch::parse("sm_90a"), Some(Arch::SM90));
        assert_eq!(Arch::parse("8.9"), Some(Arch::SM89));
        assert_eq!(Arch::parse("80"), Some(Arch::SM80));
        assert_eq!(Arch::parse("x"), None);
    }

    #[test]
    fn entry_roundtrip_and_corruption() {
        let c = Compiled {
            cubin: Arc::new(vec![1, 2, 3, 4]),
            log: "ptxas info : Used 3 registers".into(),
            resources: Default::default(),
            cached: false,
        };
        let mut bytes = encode_entry(&c);
        let d = decode_entry(&bytes).expect("roundtrip");
        assert_eq!(*d.cubin, vec![1, 2, 3, 4]);
        assert_eq!(d.resources.registers, 3);
        assert!(d.cached);
        let n = bytes.len();
        bytes[n / 2] ^= 0xff;
        assert!(decode_entry(&bytes).is_none(), "a flipped byte must be detected");
        assert!(decode_entry(&bytes[..10]).is_none());
        assert!(decode_entry(b"not a cache entry at all, but long enough to be read........").is_none());
    }

    const TINY: &str =
        "#include \"tessera/common.cuh\"\nextern \"C\" __global__ void tiny(float* p) { p[threadIdx.x] = kValue; }\n";

    fn tiny(value: f32) -> KernelSpec {
        KernelSpec {
            name: format!("tiny_{value}"),
            file: "tiny.cu",
            source: TINY,
            preamble: format!("constexpr float kValue = {value:?}f;"),
            entry: "tiny",
            headers: &[],
        }
    }

    #[test]
    fn disk_cache_hits_recovers_from_corruption_and_tolerates_unwritable_dirs() {
        if !nvrtc_or_skip("disk_cache") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let spec = tiny(1.5);
        let first = JitCache::new(Some(dir.path().to_path_buf()))
            .get(&spec, Arch::SM80)
            .unwrap();
        assert!(!first.cached && !first.cubin.is_empty());
        assert!(first.resources.registers > 0, "ptxas log parsed: {}", first.log);
        let files: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(files.len(), 1, "one entry, no temporary left behind: {files:?}");

        // A fresh cache (another process) finds it on disk.
        let second = JitCache::new(Some(dir.path().to_path_buf()))
            .get(&spec, Arch::SM80)
            .unwrap();
        assert!(second.cached);
        assert_eq!(second.cubin, first.cubin);

        // Another arch, options or preamble is another key.
        let k80 = JitCache::key(&spec, Arch::SM80, &[]).unwrap();
        assert_ne!(k80, JitCache::key(&spec, Arch::SM90, &[]).unwrap());
        assert_ne!(k80, JitCache::key(&tiny(2.5), Arch::SM80, &[]).unwrap());
        assert_ne!(k80, JitCache::key(&spec, Arch::SM80, &["-G".into()]).unwrap());

        // A corrupt entry is recompiled and rewritten.
        let mut bytes = std::fs::read(&files[0]).unwrap();
        let n = bytes.len();
        bytes[n / 2] ^= 0x55;
        std::fs::write(&files[0], &bytes).unwrap();
        let third = JitCache::new(Some(dir.path().to_path_buf()))
            .get(&spec, Arch::SM80)
            .unwrap();
        assert!(!third.cached, "corrupt entry must be recompiled");
        assert!(
            decode_entry(&std::fs::read(&files[0]).unwrap()).is_some(),
            "and rewritten"
        );

        // An unwritable directory (a path below a regular file) degrades to memory only.
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, b"x").unwrap();
        let mem_only = JitCache::new(Some(blocker.join("cache")));
        assert!(!mem_only.get(&spec, Arch::SM86).unwrap().cached);
        assert!(mem_only.get(&spec, Arch::SM86).is_ok(), "served from memory");
    }

    #[test]
    fn compile_errors_carry_the_log_kernel_and_options() {
        if !nvrtc_or_skip("compile_errors") {
            return;
        }
        let spec = KernelSpec {
            name: "broken".into(),
            file: "broken.cu",
            source: "extern \"C\" __global__ void broken() { this_is_not_defined(); }",
            preamble: String::new(),
            entry: "broken",
            headers: &[],
        };
        match compile_uncached(&spec, Arch::SM90, &[]) {
            Err(Error::Compile {
                kernel,
                arch,
                options,
                log,
            }) => {
                assert_eq!(kernel, "broken");
                assert_eq!(arch, "sm_90a");
                assert!(options.iter().any(|o| o.contains("sm_90a")));
                assert!(log.contains("this_is_not_defined"), "{log}");
            }
            other => panic!("expected a compile error, got {other:?}"),
        }
    }

    /// Every shared device header compiles together on every
    /// CI architecture, and the cluster wrappers assemble on Hopper.
    #[test]
    fn device_library_compiles_on_every_ci_arch() {
        if !nvrtc_or_skip("device_library") {
            return;
        }
        let mut src = String::new();
        for (name, _) in DEVICE_HEADERS {
            src += &format!("#include \"{name}\"\n");
        }
        src += r#"
extern "C" __global__ void library_smoke(float* out, const ts::f16* in) {
  float v = ts::to_float(in[threadIdx.x]);
  v = ts::warp_allreduce_max(v);
#ifdef TS_HAS_CLUSTERS
  __shared__ float slot;
  slot = v;
  ts::cluster_sync();
  v += ts::ld_shared_cluster(ts::map_shared_rank(ts::shared_address(&slot), ts::cluster_rank() ^ 1u));
  ts::cluster_sync();
#endif
  out[threadIdx.x] = ts::exp2_approx(v);
}
"#;
        let source: &'static str = Box::leak(src.into_boxed_str());
        let spec = KernelSpec {
            name: "library_smoke".into(),
            file: "smoke.cu",
            source,
            preamble: String::new(),
            entry: "library_smoke",
            headers: &[],
        };
        for arch in Arch::CI_TARGETS {
            let c = compile_uncached(&spec, arch, &[]).unwrap_or_else(|e| panic!("{arch}: {e}"));
            assert!(c.resources.spill_free(), "{arch}: {:?}", c.resources);
        }
    }
}
