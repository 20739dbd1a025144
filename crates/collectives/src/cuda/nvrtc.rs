//! Compiling the kernels to PTX with NVRTC, through cudarc.
//!
//! [`compile_ptx`] is the one code path that turns [`kernel_source`] into PTX: the library's
//! [`KernelCache`](super::KernelCache) calls it on a cache miss, and `scripts/check-kernels`
//! calls it through the `compile_kernels` example, so CI checks exactly what users run.
//! NVRTC is probed before cudarc touches it (see the `libs` module), so a machine without it
//! gets [`CudaError::NoNvrtc`], never a panic.

use std::ffi::{CString, c_char};
use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use cudarc::nvrtc::{result, sys};

use super::CudaError;
use super::kernel_sources::{kernel_source, missing_entries, stale_entries};
use super::libs::{self, Found, LibKind, LibSpec};

/// The NVRTC functions relaycc calls through cudarc; the probe checks each one resolves, since
/// cudarc panics on a missing symbol.
const NVRTC_SYMBOLS: &[&str] = &[
    "nvrtcVersion",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcDestroyProgram",
];

/// Options every compilation uses besides the architecture (they are part of the cache key).
/// `--fmad=false` keeps `(a + b) * scale` and friends unfused, so GPU results match the host
/// backend's arithmetic bit for bit where the host does the same operations; the kernels are
/// memory-bound, so fused multiply-adds would buy nothing.
pub const COMPILE_OPTIONS: &[&str] = &["--fmad=false"];

/// The name NVRTC gives the program in its messages.
const PROGRAM_NAME: &str = "relaycc_kernels.cu";

/// A virtual GPU architecture the kernels are compiled for (`compute_XY`), from a device's
/// compute capability X.Y.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arch {
    major: u32,
    minor: u32,
}

impl Arch {
    /// Volta (V100): the oldest architecture relaycc targets.
    pub const SM70: Arch = Arch { major: 7, minor: 0 };
    /// Ampere (A100).
    pub const SM80: Arch = Arch { major: 8, minor: 0 };
    /// Hopper (H100, H200).
    pub const SM90: Arch = Arch { major: 9, minor: 0 };
    /// The architectures `scripts/check-kernels` compiles and assembles for.
    pub const CHECKED: [Arch; 3] = [Arch::SM70, Arch::SM80, Arch::SM90];

    /// The architecture of compute capability `major.minor`; below 7.0 is unsupported.
    pub fn new(major: u32, minor: u32) -> Result<Arch, CudaError> {
        if major < 7 || minor > 9 {
            return Err(CudaError::UnsupportedArch { major, minor });
        }
        Ok(Arch { major, minor })
    }
    /// Compute capability major version.
    pub fn major(self) -> u32 {
        self.major
    }
    /// Compute capability minor version.
    pub fn minor(self) -> u32 {
        self.minor
    }
    /// The two-digit form, e.g. 80.
    pub fn number(self) -> u32 {
        self.major * 10 + self.minor
    }
    /// The NVRTC virtual architecture name, e.g. `compute_80`.
    pub fn compute_name(self) -> String {
        format!("compute_{}", self.number())
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}", self.number())
    }
}

impl FromStr for Arch {
    type Err = String;
    /// Accepts `80`, `sm_80`, `compute_80` and `8.0`.
    fn from_str(s: &str) -> Result<Arch, String> {
        let bad = || format!("bad architecture {s:?} (expected e.g. 80, sm_80, compute_80 or 8.0)");
        let digits = s.trim_start_matches("sm_").trim_start_matches("compute_");
        let (major, minor) = match digits.split_once('.') {
            Some((major, minor)) => (major, minor),
            None if digits.len() >= 2 => digits.split_at(digits.len() - 1),
            None => return Err(bad()),
        };
        let major: u32 = major.parse().map_err(|_| bad())?;
        let minor: u32 = minor.parse().map_err(|_| bad())?;
        Arch::new(major, minor).map_err(|e| e.to_string())
    }
}

/// Where NVRTC was found: the name cudarc loads it by and, when it was not on the loader's
/// path, the file relaycc preloaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvrtcInfo {
    /// The bare library name cudarc resolves (e.g. `libnvrtc.so.12`).
    pub library: String,
    /// The file preloaded from `RELAYCC_NVRTC_LIB`, a CUDA toolkit or a pip wheel, if any.
    pub preloaded_from: Option<std::path::PathBuf>,
    /// NVRTC's version, (major, minor).
    pub version: (i32, i32),
}

/// Finds NVRTC (once per process): `RELAYCC_NVRTC_LIB` (a file or a directory) first, then the
/// loader's path (`LD_LIBRARY_PATH`, `ldconfig`), then `CUDA_HOME`/`CUDA_PATH`/`CUDA_ROOT`/
/// `CUDA_TOOLKIT_ROOT_DIR`, the `scripts/check-kernels` tools directory (`RELAYCC_TOOLS`, else
/// `~/.cache/relaycc-tools`) and pip wheels (`site-packages/nvidia/cuda_nvrtc/lib` of
/// `VIRTUAL_ENV`, `CONDA_PREFIX`, `~/.local`, `/usr/local`, `/usr`).
///
/// The answer is cached for the life of the process, so environment changes after the first
/// call are not seen.
pub fn nvrtc() -> Result<&'static NvrtcInfo, CudaError> {
    static PROBED: OnceLock<Result<NvrtcInfo, CudaError>> = OnceLock::new();
    PROBED
        .get_or_init(|| {
            let env = |k: &str| std::env::var_os(k);
            let spec = LibSpec {
                kind: LibKind::Nvrtc,
                stem: "nvrtc",
                file_names: &["libnvrtc.so.12", "libnvrtc.so"],
                explicit: env("RELAYCC_NVRTC_LIB").map(Into::into),
                dirs: libs::nvrtc_dirs(&env),
                symbols: NVRTC_SYMBOLS,
            };
            let Found {
                name,
                preloaded_from,
            } = libs::probe(&spec)?;
            let version = loaded_version()?;
            Ok(NvrtcInfo {
                library: name,
                preloaded_from,
                version,
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Asks the loaded NVRTC its version; only called once the probe succeeded.
fn loaded_version() -> Result<(i32, i32), CudaError> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the probe found NVRTC under one of cudarc's names with nvrtcVersion in it, so
    // cudarc's lazy loader succeeds; both pointers are valid for the call.
    let status = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    status.result().map_err(|e| CudaError::Nvrtc {
        call: "nvrtcVersion",
        status: format!("{e:?}"),
    })?;
    Ok((major, minor))
}

/// An NVRTC program, destroyed when dropped.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the handle came from nvrtcCreateProgram and is destroyed only here. A failed
        // destroy leaks the program's memory, which is all that could be done about it; Drop
        // must not panic.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

/// Converts a NUL-terminated buffer from NVRTC into a String (lossy: NVRTC writes ASCII).
fn c_buffer_to_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Compiles the embedded kernels ([`kernel_source`]) to PTX for `arch` and checks that every
/// expected entry point is in it. Needs NVRTC, not a GPU.
///
/// Wraps [nvrtcCreateProgram](https://docs.nvidia.com/cuda/nvrtc/index.html#group__compilation_1g9ae65f68911d1cf0adda2af4ad8cb458),
/// [nvrtcCompileProgram](https://docs.nvidia.com/cuda/nvrtc/index.html#group__compilation_1g1f3136029db1413e362154b567297e8b)
/// and [nvrtcGetPTX](https://docs.nvidia.com/cuda/nvrtc/index.html#group__compilation_1g4d3a5c8a8ba1b9e4bcd1b8cfe3e6a1c2).
pub fn compile_ptx(arch: Arch) -> Result<String, CudaError> {
    nvrtc()?;
    let source = kernel_source();
    // The sources are embedded files relaycc ships; a NUL in them is a packaging bug, reported
    // rather than passed to cudarc, whose CString conversions would panic on it.
    let src = CString::new(source).map_err(|_| CudaError::Compile {
        arch: arch.compute_name(),
        status: "kernel source contains a NUL byte".into(),
        log: String::new(),
    })?;
    let name = CString::new(PROGRAM_NAME).map_err(|_| CudaError::Nvrtc {
        call: "nvrtcCreateProgram",
        status: "program name contains a NUL byte".into(),
    })?;
    let options: Vec<String> =
        std::iter::once(format!("--gpu-architecture={}", arch.compute_name()))
            .chain(COMPILE_OPTIONS.iter().map(|o| (*o).to_owned()))
            .collect();
    let prog = result::create_program(&src, Some(&name))
        .map(Program)
        .map_err(|e| CudaError::Nvrtc {
            call: "nvrtcCreateProgram",
            status: format!("{e:?}"),
        })?;
    // SAFETY: `prog` is a live program (destroyed only by its Drop, after this), `src` and
    // `name` outlive it, and no option contains a NUL (they are built from ASCII literals and
    // digits), so cudarc's CString conversion of them cannot panic.
    let compiled = unsafe { result::compile_program(prog.0, &options) };
    if let Err(status) = compiled {
        // SAFETY: `prog` is live; a program whose compilation failed still has a log.
        let log = unsafe { result::get_program_log(prog.0) }
            .map(|buf| c_buffer_to_string(&buf))
            .unwrap_or_else(|e| format!("(no log: {e:?})"));
        return Err(CudaError::Compile {
            arch: arch.compute_name(),
            status: format!("{status:?}"),
            log,
        });
    }
    // SAFETY: `prog` is live and compiled successfully.
    let ptx = unsafe { result::get_ptx(prog.0) }.map_err(|e| CudaError::Nvrtc {
        call: "nvrtcGetPTX",
        status: format!("{e:?}"),
    })?;
    let ptx = c_buffer_to_string(&ptx);
    check_entries(&ptx, arch, "nvrtc")?;
    Ok(ptx)
}

/// Checks that `ptx` defines every expected entry point, each with the parameters this
/// library launches it with; `origin` names where it came from.
pub fn check_entries(ptx: &str, arch: Arch, origin: &str) -> Result<(), CudaError> {
    let missing = missing_entries(ptx);
    if !missing.is_empty() {
        return Err(CudaError::MissingEntryPoints {
            origin: origin.to_owned(),
            arch: arch.compute_name(),
            missing,
        });
    }
    let stale = stale_entries(ptx);
    if !stale.is_empty() {
        return Err(CudaError::StaleEntryPoints {
            origin: origin.to_owned(),
            arch: arch.compute_name(),
            stale,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_parsing() {
        assert_eq!("80".parse::<Arch>(), Ok(Arch::SM80));
        assert_eq!("sm_90".parse::<Arch>(), Ok(Arch::SM90));
        assert_eq!("compute_70".parse::<Arch>(), Ok(Arch::SM70));
        assert_eq!("8.6".parse::<Arch>().map(Arch::number), Ok(86));
        assert_eq!(
            "120".parse::<Arch>().map(Arch::compute_name),
            Ok("compute_120".to_owned())
        );
        assert!("6.1".parse::<Arch>().is_err_and(|e| e.contains("7.0")));
        assert!("x".parse::<Arch>().is_err());
        assert!("".parse::<Arch>().is_err());
        assert_eq!(
            Arch::new(6, 0),
            Err(CudaError::UnsupportedArch { major: 6, minor: 0 })
        );
        assert_eq!(Arch::SM80.to_string(), "sm_80");
    }

    /// On a machine without NVRTC (CI), compiling is the clear NoNvrtc error; with NVRTC (a
    /// developer who ran scripts/check-kernels, a GPU box) it yields PTX with every entry point.
    /// Either way the public entry point agrees with the probe and does not panic.
    #[test]
    fn compile_agrees_with_the_probe() {
        match nvrtc() {
            Err(probe_err) => {
                assert!(
                    matches!(probe_err, CudaError::NoNvrtc { .. }),
                    "{probe_err}"
                );
                assert_eq!(compile_ptx(Arch::SM80), Err(probe_err));
            }
            Ok(info) => {
                assert!(info.version.0 >= 11, "{info:?}");
                let ptx = compile_ptx(Arch::SM80).unwrap_or_else(|e| panic!("{e}"));
                assert!(missing_entries(&ptx).is_empty());
            }
        }
    }

    #[test]
    fn missing_entries_are_reported_with_origin() {
        let err =
            check_entries(".visible .entry relaycc_forward(\n", Arch::SM90, "test").unwrap_err();
        let CudaError::MissingEntryPoints {
            origin,
            arch,
            missing,
        } = &err
        else {
            panic!("{err}")
        };
        assert_eq!(
            (origin.as_str(), arch.as_str(), missing.len()),
            ("test", "compute_90", 45)
        );
    }
}
