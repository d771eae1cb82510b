//! Finding the CUDA libraries without panicking.
//!
//! cudarc's loaders panic when a library is missing, so tessera looks for each library first
//! and loads it by absolute path. Once a library is loaded, the dynamic linker matches later
//! `dlopen("libnvrtc.so.13")` calls from cudarc against its SONAME, so cudarc finds the same
//! copy. Nothing here panics; each probe returns where it looked when it fails.
//!
//! Search order for NVRTC (and cuBLAS):
//! 1. `$TESSERA_NVRTC` (a path to `libnvrtc.so.13`) / `$TESSERA_CUBLAS`;
//! 2. the directories of `$LD_LIBRARY_PATH`;
//! 3. `.cuda-tools/python/nvidia/cu13/lib` under the working directory and under each ancestor
//!    of the executable (what `scripts/setup-cuda-tools.sh` installs);
//! 4. `nvidia/cu13/lib` in the site-packages of the `python3` on `PATH` (the PyPI wheels);
//! 5. `$CUDA_HOME/lib64`, `/usr/local/cuda/lib64`, `/usr/lib/x86_64-linux-gnu`;
//! 6. the plain SONAME, resolved by the dynamic linker (ldconfig cache).

use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// Libraries kept loaded for the life of the process, so cudarc's own `dlopen` by SONAME finds
/// them.
static KEPT: OnceLock<std::sync::Mutex<Vec<libloading::Library>>> = OnceLock::new();

fn keep(lib: libloading::Library) {
    KEPT.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(lib);
}

/// Where a library was found.
#[derive(Clone, Debug)]
pub struct LibraryInfo {
    /// The path it was loaded from (or the bare SONAME when the dynamic linker found it).
    pub path: String,
}

fn search_dirs(env_var: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(p) = std::env::var(env_var) {
        if let Some(parent) = Path::new(&p).parent() {
            dirs.push(parent.to_path_buf());
        }
    }
    if let Ok(ld) = std::env::var("LD_LIBRARY_PATH") {
        dirs.extend(ld.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    let local = Path::new(".cuda-tools/python/nvidia/cu13/lib");
    if let Ok(cwd) = std::env::current_dir() {
        for a in cwd.ancestors() {
            dirs.push(a.join(local));
        }
    }
    if let Ok(exe) = std::env::current_exe() {
        for a in exe.ancestors().skip(1) {
            dirs.push(a.join(local));
        }
    }
    dirs.extend(python_site_dirs().iter().map(|s| s.join("nvidia/cu13/lib")));
    if let Ok(home) = std::env::var("CUDA_HOME") {
        dirs.push(Path::new(&home).join("lib64"));
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs.push(PathBuf::from("/usr/lib/x86_64-linux-gnu"));
    dirs
}

/// site-packages of the `python3` on PATH, asked once (empty when there is no python3).
fn python_site_dirs() -> &'static [PathBuf] {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DIRS.get_or_init(|| {
        if std::env::var_os("TESSERA_NO_PYTHON_PROBE").is_some() {
            return Vec::new();
        }
        let out = std::process::Command::new("python3")
            .args([
                "-c",
                "import site,sys; print('\\n'.join(site.getsitepackages()+[site.getusersitepackages()]))",
            ])
            .stderr(std::process::Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| !l.is_empty())
                .map(PathBuf::from)
                .collect(),
            _ => Vec::new(),
        }
    })
}

/// Loads `sonames` in order (dependencies first) from the first directory holding the first
/// of them; falls back to the dynamic linker. Returns the directory or SONAME used.
fn load_family(env_var: &str, sonames: &[&str]) -> std::result::Result<LibraryInfo, String> {
    let main = sonames[sonames.len() - 1];
    let mut tried = Vec::new();
    // An explicit path wins.
    if let Ok(p) = std::env::var(env_var) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            return Err(format!("${env_var}={} is not a file", p.display()));
        }
    }
    for dir in search_dirs(env_var) {
        let candidate = dir.join(main);
        if !candidate.is_file() {
            continue;
        }
        let mut loaded = Vec::new();
        let mut ok = true;
        for name in sonames {
            let path = dir.join(name);
            if !path.is_file() {
                continue; // e.g. builtins shipped elsewhere: let the linker resolve it
            }
            // SAFETY: loading a vendor library runs its initialisers; these are NVIDIA's
            // documented shared libraries found by name.
            match unsafe { libloading::Library::new(&path) } {
                Ok(lib) => loaded.push(lib),
                Err(e) => {
                    tried.push(format!("{}: {e}", path.display()));
                    ok = false;
                    break;
                }
            }
        }
        if ok {
            loaded.into_iter().for_each(keep);
            return Ok(LibraryInfo {
                path: candidate.display().to_string(),
            });
        }
    }
    // SAFETY: as above.
    match unsafe { libloading::Library::new(main) } {
        Ok(lib) => {
            keep(lib);
            Ok(LibraryInfo { path: main.to_string() })
        }
        Err(e) => {
            tried.push(format!("{main} via the dynamic linker: {e}"));
            Err(format!(
                "{main} not found (set ${env_var} to its path, or put its folder on LD_LIBRARY_PATH; \
                 scripts/setup-cuda-tools.sh installs NVRTC from PyPI); tried: {}",
                tried.join("; ")
            ))
        }
    }
}

/// NVRTC found and loaded, with its version.
#[derive(Clone, Debug)]
pub struct NvrtcInfo {
    pub library: LibraryInfo,
    pub version: (i32, i32),
}

/// Loads NVRTC (once per process) and reports its version.
pub fn nvrtc() -> Result<&'static NvrtcInfo> {
    static NVRTC: OnceLock<std::result::Result<NvrtcInfo, String>> = OnceLock::new();
    NVRTC
        .get_or_init(|| {
            let library = load_family("TESSERA_NVRTC", &["libnvrtc-builtins.so.13.0", "libnvrtc.so.13"])?;
            // SAFETY: the library is loaded (checked above), so cudarc's loader finds it.
            if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                return Err(format!(
                    "loaded {} but cudarc cannot open libnvrtc by name",
                    library.path
                ));
            }
            let (mut major, mut minor): (c_int, c_int) = (0, 0);
            // SAFETY: plain out-parameters.
            let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
            if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(format!("nvrtcVersion failed: {r:?}"));
            }
            Ok(NvrtcInfo {
                library,
                version: (major, minor),
            })
        })
        .as_ref()
        .map_err(|e| Error::NoNvrtc(e.clone()))
}

/// The CUDA driver library (`libcuda.so.1`), loaded and initialised once.
#[derive(Clone, Debug)]
pub struct DriverInfo {
    pub library: LibraryInfo,
    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
    pub version: i32,
    pub device_count: i32,
}

/// Loads and initialises the driver. An error, never a panic, when it is absent.
pub fn driver() -> Result<&'static DriverInfo> {
    static DRIVER: OnceLock<std::result::Result<DriverInfo, Error>> = OnceLock::new();
    let r = DRIVER.get_or_init(|| {
        let mut found = None;
        let mut tried = Vec::new();
        for name in ["libcuda.so.1", "libcuda.so"] {
            // SAFETY: loading the vendor driver library by its documented name.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => {
                    keep(lib);
                    found = Some(name);
                    break;
                }
                Err(e) => tried.push(format!("{name}: {e}")),
            }
        }
        let Some(name) = found else {
            return Err(Error::NoDriver(format!(
                "no NVIDIA driver library (libcuda.so.1) on this machine; tried {}",
                tried.join("; ")
            )));
        };
        // SAFETY: the library is loaded, so cudarc's symbol lookups succeed.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::NoDriver(format!("loaded {name} but cudarc cannot open it")));
        }
        use cudarc::driver::sys;
        // SAFETY: cuInit has no preconditions.
        let r = unsafe { sys::cuInit(0) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(Error::NoDevice(format!("cuInit failed: {r:?}")));
        }
        let mut version = 0;
        let mut count = 0;
        // SAFETY: out-parameters after a successful cuInit.
        unsafe {
            sys::cuDriverGetVersion(&mut version);
            sys::cuDeviceGetCount(&mut count);
        }
        if count == 0 {
            return Err(Error::NoDevice("the driver reports no CUDA device".into()));
        }
        Ok(DriverInfo {
            library: LibraryInfo { path: name.into() },
            version,
            device_count: count,
        })
    });
    match r {
        Ok(d) => Ok(d),
        Err(Error::NoDriver(s)) => Err(Error::NoDriver(s.clone())),
        Err(Error::NoDevice(s)) => Err(Error::NoDevice(s.clone())),
        Err(e) => Err(Error::NoDevice(e.to_string())),
    }
}

/// Loads cuBLAS (and cuBLASLt) for the in-process GEMM roofline.
pub fn cublas() -> Result<&'static LibraryInfo> {
    static CUBLAS: OnceLock<std::result::Result<LibraryInfo, String>> = OnceLock::new();
    CUBLAS
        .get_or_init(|| {
            let info = load_family("TESSERA_CUBLAS", &["libcublasLt.so.13", "libcublas.so.13"])?;
            // SAFETY: loaded above.
            if !unsafe { cudarc::cublas::sys::is_culib_present() } {
                return Err(format!("loaded {} but cudarc cannot open libcublas by name", info.path));
            }
            Ok(info)
        })
        .as_ref()
        .map_err(|e| Error::Unsupported(format!("cuBLAS unavailable: {e}")))
}

/// The oldest NCCL tessera uses (2.14.0, `ncclGetVersion`'s code): it has every function
/// tessera calls (`ncclCommFinalize` came last).
pub const NCCL_MIN_VERSION: i32 = 21400;

/// NCCL as cudarc opens it, with its version (`ncclGetVersion`, e.g. 23007 for 2.30.7).
#[derive(Clone, Debug)]
pub struct NcclInfo {
    /// Where tessera found the library (cudarc opens it by its own names, see [`nccl`]).
    pub library: LibraryInfo,
    pub version: i32,
}

/// The file names under which cudarc 0.19 opens NCCL (`cudarc::get_lib_name_candidates("nccl")`
/// with CUDA 13): `libnccl.so` first, then `libnccl.so.13`, `.12`, ... `.9`, `.1` and a few
/// `libnccl64*` forms; never `libnccl.so.2`, the SONAME that NCCL itself ships (the PyPI wheel
/// `nvidia-nccl-cu13` holds only `nvidia/nccl/lib/libnccl.so.2`).
pub const CUDARC_NCCL_NAMES: &str = "libnccl.so, libnccl.so.13 (and other forms, not libnccl.so.2)";

/// Folders that may hold NCCL: `$TESSERA_NCCL`'s, `$LD_LIBRARY_PATH`, `nvidia/nccl/lib` in the
/// site-packages of `python3` (PyTorch's NCCL wheel), `$CUDA_HOME/lib64`, `/usr/local/cuda/lib64`,
/// `/usr/lib/x86_64-linux-gnu`.
fn nccl_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(p) = std::env::var("TESSERA_NCCL") {
        if let Some(parent) = Path::new(&p).parent() {
            dirs.push(parent.to_path_buf());
        }
    }
    if let Ok(ld) = std::env::var("LD_LIBRARY_PATH") {
        dirs.extend(ld.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    dirs.extend(python_site_dirs().iter().map(|s| s.join("nvidia/nccl/lib")));
    if let Ok(home) = std::env::var("CUDA_HOME") {
        dirs.push(Path::new(&home).join("lib64"));
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs.push(PathBuf::from("/usr/lib/x86_64-linux-gnu"));
    dirs
}

/// Finds NCCL for cudarc's `nccl` bindings (once per process), without panicking: cudarc's
/// loader panics when none of its names opens, so this asks cudarc's own presence check first.
/// When cudarc cannot open NCCL but a `libnccl.so.2` exists (`$TESSERA_NCCL`, the folders of
/// `$LD_LIBRARY_PATH`, PyTorch's `site-packages/nvidia/nccl/lib`, the CUDA folders), the error
/// says where it is and how to make it visible: a link named `libnccl.so` to it in a folder on
/// `LD_LIBRARY_PATH` (set before the process starts; the dynamic linker reads it once).
pub fn nccl() -> Result<&'static NcclInfo> {
    static NCCL: OnceLock<std::result::Result<NcclInfo, String>> = OnceLock::new();
    NCCL.get_or_init(|| {
        // SAFETY: opens and closes candidate libraries by name; no symbol is used.
        if unsafe { cudarc::nccl::sys::is_culib_present() } {
            // cudarc's loader finds the library now (checked above), and ncclGetVersion
            // exists in every NCCL 2 release, so its lazy symbol lookup cannot panic.
            let version =
                cudarc::nccl::result::get_nccl_version().map_err(|e| format!("ncclGetVersion failed: {:?}", e.0))?;
            // cudarc looks every symbol up when it is first called and panics if it is missing:
            // refuse NCCL older than the newest function tessera calls (ncclCommFinalize, 2.14).
            // (Versions before 2.9 encode as major * 1000 + minor * 100 + patch: all below this.)
            if version < NCCL_MIN_VERSION {
                return Err(format!(
                    "NCCL version code {version} is older than 2.14 (code {NCCL_MIN_VERSION}), the oldest \
                     with every function tessera calls (ncclCommFinalize)"
                ));
            }
            return Ok(NcclInfo {
                library: LibraryInfo {
                    path: "libnccl.so (found by cudarc)".into(),
                },
                version,
            });
        }
        let mut found = Vec::new();
        if let Ok(p) = std::env::var("TESSERA_NCCL") {
            if Path::new(&p).is_file() {
                found.push(PathBuf::from(p));
            }
        }
        for dir in nccl_dirs() {
            for name in ["libnccl.so.2", "libnccl.so"] {
                let path = dir.join(name);
                if path.is_file() && !found.contains(&path) {
                    found.push(path);
                }
            }
        }
        Err(match found.first() {
            Some(path) => {
                let dir = path.parent().map(|d| d.display().to_string()).unwrap_or_default();
                format!(
                    "found {} but cudarc opens NCCL only as {CUDARC_NCCL_NAMES}: make a link named \
                     libnccl.so to it in a folder on LD_LIBRARY_PATH before starting, e.g. \
                     `mkdir -p /tmp/nccl-link && ln -sf {} /tmp/nccl-link/libnccl.so && export \
                     LD_LIBRARY_PATH=/tmp/nccl-link:{dir}:$LD_LIBRARY_PATH`",
                    path.display(),
                    path.display()
                )
            }
            None => format!(
                "no NCCL library found (cudarc tried {CUDARC_NCCL_NAMES}; tessera looked for libnccl.so.2 \
                 in $TESSERA_NCCL, $LD_LIBRARY_PATH, site-packages/nvidia/nccl/lib of python3, \
                 $CUDA_HOME/lib64, /usr/local/cuda/lib64, /usr/lib/x86_64-linux-gnu); install NCCL \
                 (pip install nvidia-nccl-cu13, or the distribution's libnccl2) and link it as libnccl.so"
            ),
        })
    })
    .as_ref()
    .map_err(|e| Error::Unsupported(format!("NCCL unavailable: {e}")))
}

/// Whether tests must fail (not skip) when NVRTC is missing: `TESSERA_REQUIRE_NVRTC=1`, set by CI.
pub fn nvrtc_required() -> bool {
    matches!(std::env::var("TESSERA_REQUIRE_NVRTC").as_deref(), Ok("1") | Ok("true"))
}

/// For tests that need NVRTC: true when it is present; otherwise prints that `test` is skipped
/// and returns false, or panics when CI demands NVRTC ([`nvrtc_required`]).
#[cfg(test)]
pub(crate) fn nvrtc_or_skip(test: &str) -> bool {
    match nvrtc() {
        Ok(_) => true,
        Err(e) if nvrtc_required() => panic!("{test}: TESSERA_REQUIRE_NVRTC is set but {e}"),
        Err(e) => {
            eprintln!("{test}: skipped, {e}");
            false
        }
    }
}
