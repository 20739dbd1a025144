//! Finding libcuda and libnvrtc before cudarc does.
//!
//! cudarc loads its libraries lazily and panics when none of its candidate names loads, or when a
//! symbol is missing (cudarc 0.19 `src/lib.rs` `panic_no_lib_found`, `src/driver/sys/mod.rs`
//! `load`). relaycc therefore probes first, with the same names in the same order, and checks
//! that every symbol it will call is there; only then does it call cudarc. A probe that fails
//! becomes [`CudaError::NoDriver`] / [`CudaError::NoNvrtc`], never a panic.
//!
//! NVRTC is often not on the loader's path (a pip wheel, a toolkit outside `ldconfig`), so the
//! probe may load it by full path first. The dynamic loader then answers cudarc's later
//! `dlopen("libnvrtc.so.12")` with that same library, because glibc matches a bare name against
//! the `DT_SONAME` of libraries already loaded. The probe only counts success once one of cudarc's
//! own bare names loads, so cudarc's search is known to succeed.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use libloading::Library;

use super::CudaError;

/// Which library a probe looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LibKind {
    /// The CUDA driver API, `libcuda`.
    Driver,
    /// The run-time compiler, `libnvrtc`.
    Nvrtc,
    /// NVIDIA's collective library, `libnccl` (only for comparisons with it).
    #[cfg(feature = "nccl")]
    Nccl,
}

/// What to look for and where, besides the loader's own path.
#[derive(Debug, Clone)]
pub(crate) struct LibSpec {
    /// Which library (selects the error variant).
    pub(crate) kind: LibKind,
    /// The stem cudarc builds its candidate names from (`cuda`, `nvrtc`).
    pub(crate) stem: &'static str,
    /// File names to try inside `dirs` and inside a directory given by `explicit`.
    pub(crate) file_names: &'static [&'static str],
    /// A file or directory the user named (`RELAYCC_NVRTC_LIB`); tried first.
    pub(crate) explicit: Option<PathBuf>,
    /// Directories to try, in order, when no bare name loads.
    pub(crate) dirs: Vec<PathBuf>,
    /// Functions relaycc will call through cudarc; each must resolve.
    pub(crate) symbols: &'static [&'static str],
}

/// A library the probe found, with the name cudarc will load it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    /// The bare name that loaded (the first of cudarc's candidates that did).
    pub(crate) name: String,
    /// The full path it was preloaded from, when it is not on the loader's path.
    pub(crate) preloaded_from: Option<PathBuf>,
}

/// Libraries loaded by the probe, kept open for the life of the process: cudarc's own `dlopen`
/// by bare name must find them already loaded, and unloading NVIDIA's libraries is never safe
/// once their functions may have been called.
static KEPT_OPEN: Mutex<Vec<Library>> = Mutex::new(Vec::new());

fn keep_open(lib: Library) {
    // A poisoned lock only means another thread panicked while pushing; the Vec is still valid.
    let mut kept = KEPT_OPEN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    kept.push(lib);
}

/// cudarc 0.19's candidate names for `stem` under the `cuda-12080` feature, in its order
/// (mirrors `get_lib_name_candidates` in cudarc's `src/lib.rs`, which is only public when
/// cudarc uses dynamic loading; duplicates kept so the order matches exactly).
pub(crate) fn cudarc_candidates(stem: &str) -> Vec<String> {
    use std::env::consts::{DLL_PREFIX as P, DLL_SUFFIX as S};
    // The CUDA version of the bindings chosen in the workspace Cargo.toml (cuda-12080).
    const MAJOR: &str = "12";
    const MINOR: &str = "8";
    let w = if cfg!(target_pointer_width = "32") {
        "32"
    } else {
        "64"
    };
    vec![
        format!("{P}{stem}{S}"),
        format!("{P}{stem}{w}{S}"),
        format!("{P}{stem}{w}_{MAJOR}{S}"),
        format!("{P}{stem}{w}_{MAJOR}{MINOR}{S}"),
        format!("{P}{stem}{w}_{MAJOR}{MINOR}_0{S}"),
        format!("{P}{stem}{w}_{MAJOR}0_{MINOR}{S}"),
        format!("{P}{stem}{w}_10{S}"),
        format!("{P}{stem}{w}_11{S}"),
        format!("{P}{stem}{w}_12{S}"),
        format!("{P}{stem}{w}_{MAJOR}0_0{S}"),
        format!("{P}{stem}{w}_9{S}"),
        format!("{P}{stem}{S}.{MAJOR}"),
        format!("{P}{stem}{S}.12"),
        format!("{P}{stem}{S}.11"),
        format!("{P}{stem}{S}.10"),
        format!("{P}{stem}{S}.9"),
        format!("{P}{stem}{S}.1"),
    ]
}

/// Loads one library by name or path; `None` when the loader refuses it.
fn try_load(name: &std::ffi::OsStr) -> Option<Library> {
    // SAFETY: loading a shared library runs its initialisers. The names tried are those of
    // NVIDIA's driver, NVRTC and NCCL libraries (or a path the user chose for NVRTC), whose
    // initialisers only set up their own state; cudarc would load the very same libraries.
    unsafe { Library::new(name) }.ok()
}

/// True when the loader finds a library by `name` (it stays loaded only while checked).
#[cfg(feature = "nccl")]
pub(crate) fn loads(name: &str) -> bool {
    try_load(OsString::from(name).as_os_str()).is_some()
}

/// Finds the first of cudarc's bare names that loads and checks its symbols.
fn check_bare_names(
    spec: &LibSpec,
    searched: &mut Vec<String>,
) -> Result<Option<Found>, CudaError> {
    for name in cudarc_candidates(spec.stem) {
        let Some(lib) = try_load(OsString::from(&name).as_os_str()) else {
            if !searched.contains(&name) {
                searched.push(name);
            }
            continue;
        };
        for symbol in spec.symbols {
            // SAFETY: the symbol is only looked up, never called, so its type does not matter;
            // a pointer-sized `*const ()` is what dlsym returns.
            let found = unsafe { lib.get::<*const ()>(symbol.as_bytes()) };
            if found.is_err() {
                return Err(CudaError::MissingSymbol {
                    library: name,
                    symbol: (*symbol).to_owned(),
                });
            }
        }
        keep_open(lib);
        return Ok(Some(Found {
            name,
            preloaded_from: None,
        }));
    }
    Ok(None)
}

/// The files a path names: itself when it is a file, else each of `file_names` inside it.
fn files_in(path: &Path, file_names: &[&str]) -> Vec<PathBuf> {
    if path.is_dir() {
        file_names.iter().map(|f| path.join(f)).collect()
    } else {
        vec![path.to_path_buf()]
    }
}

/// Looks for a library as described above; the error lists every name and path tried.
pub(crate) fn probe(spec: &LibSpec) -> Result<Found, CudaError> {
    let mut searched = Vec::new();
    let mut preloaded = None;
    // A library the user named wins: preload it so cudarc's bare-name dlopen resolves to it.
    if let Some(explicit) = &spec.explicit {
        for file in files_in(explicit, spec.file_names) {
            searched.push(file.display().to_string());
            if let Some(lib) = try_load(file.as_os_str()) {
                keep_open(lib);
                preloaded = Some(file);
                break;
            }
        }
    }
    if let Some(found) = check_bare_names(spec, &mut searched)? {
        return Ok(Found {
            preloaded_from: preloaded,
            ..found
        });
    }
    for dir in &spec.dirs {
        for file in spec.file_names.iter().map(|name| dir.join(name)) {
            searched.push(file.display().to_string());
            if !file.is_file() {
                continue;
            }
            let Some(lib) = try_load(file.as_os_str()) else {
                continue;
            };
            keep_open(lib);
            if let Some(found) = check_bare_names(spec, &mut searched)? {
                return Ok(Found {
                    preloaded_from: Some(file),
                    ..found
                });
            }
        }
    }
    Err(match spec.kind {
        LibKind::Driver => CudaError::NoDriver { searched },
        LibKind::Nvrtc => CudaError::NoNvrtc { searched },
        #[cfg(feature = "nccl")]
        LibKind::Nccl => CudaError::NoNccl { searched },
    })
}

/// Directories where NVRTC commonly lives outside the loader's path: a CUDA toolkit named by
/// the usual variables, the tools directory `scripts/check-kernels` fills, and pip wheels
/// (`nvidia-cuda-nvrtc-cu12` puts the library in `site-packages/nvidia/cuda_nvrtc/lib`).
pub(crate) fn nvrtc_dirs(env: &dyn Fn(&str) -> Option<OsString>) -> Vec<PathBuf> {
    const WHEEL_LIB: &str = "nvidia/cuda_nvrtc/lib";
    let mut dirs = Vec::new();
    for var in [
        "CUDA_HOME",
        "CUDA_PATH",
        "CUDA_ROOT",
        "CUDA_TOOLKIT_ROOT_DIR",
    ] {
        if let Some(root) = env(var) {
            let root = PathBuf::from(root);
            dirs.push(root.join("lib64"));
            dirs.push(root.join("lib"));
        }
    }
    let home = env("HOME").map(PathBuf::from);
    let tools = env("RELAYCC_TOOLS")
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| h.join(".cache/relaycc-tools")));
    if let Some(tools) = tools {
        dirs.push(tools.join("pip").join(WHEEL_LIB));
    }
    let mut python_roots: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(prefix) = env(var) {
            python_roots.push(PathBuf::from(prefix).join("lib"));
        }
    }
    if let Some(home) = &home {
        python_roots.push(home.join(".local/lib"));
    }
    python_roots.push(PathBuf::from("/usr/local/lib"));
    python_roots.push(PathBuf::from("/usr/lib"));
    for root in python_roots {
        let Ok(entries) = std::fs::read_dir(&root) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .collect();
        pythons.sort();
        for python in pythons {
            for packages in ["site-packages", "dist-packages"] {
                let dir = python.join(packages).join(WHEEL_LIB);
                if dir.is_dir() {
                    dirs.push(dir);
                }
            }
        }
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn absent(kind: LibKind) -> LibSpec {
        LibSpec {
            kind,
            stem: "relaycc_test_absent_library",
            file_names: &["librelaycc_test_absent_library.so"],
            explicit: Some(PathBuf::from("/nonexistent/relaycc")),
            dirs: vec![PathBuf::from("/nonexistent/dir")],
            symbols: &["nothing"],
        }
    }

    #[test]
    fn absent_driver_is_a_clear_error_listing_what_was_searched() {
        let Err(CudaError::NoDriver { searched }) = probe(&absent(LibKind::Driver)) else {
            panic!("expected NoDriver");
        };
        assert!(searched.iter().any(|s| s == "/nonexistent/relaycc"));
        assert!(
            searched
                .iter()
                .any(|s| s.ends_with("librelaycc_test_absent_library.so.1"))
        );
        assert!(searched.iter().any(|s| s.starts_with("/nonexistent/dir/")));
    }

    #[test]
    fn absent_nvrtc_is_a_clear_error() {
        let err = probe(&absent(LibKind::Nvrtc)).unwrap_err();
        assert!(matches!(err, CudaError::NoNvrtc { .. }));
        assert!(err.to_string().contains("RELAYCC_NVRTC_LIB"));
    }

    #[test]
    fn candidates_match_cudarc_for_cuda_12_8() {
        let names = cudarc_candidates("nvrtc");
        assert_eq!(names.len(), 17);
        if cfg!(target_os = "linux") {
            assert_eq!(names[0], "libnvrtc.so");
            assert!(names.contains(&"libnvrtc.so.12".to_owned()));
            assert_eq!(
                cudarc_candidates("cuda").last().map(String::as_str),
                Some("libcuda.so.1")
            );
        }
    }

    #[test]
    fn nvrtc_dirs_follow_the_environment() {
        let env = |k: &str| match k {
            "CUDA_HOME" => Some(OsString::from("/opt/cuda")),
            "RELAYCC_TOOLS" => Some(OsString::from("/tools")),
            _ => None,
        };
        let dirs = nvrtc_dirs(&env);
        assert_eq!(dirs[0], PathBuf::from("/opt/cuda/lib64"));
        assert!(dirs.contains(&PathBuf::from("/tools/pip/nvidia/cuda_nvrtc/lib")));
    }
}
