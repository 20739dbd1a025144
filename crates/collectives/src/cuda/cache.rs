//! Where PTX comes from: memory, a directory of precompiled PTX, the on-disk cache, NVRTC.
//!
//! [`KernelCache::ptx`] looks, in order:
//! 1. in memory (one entry per architecture, for the life of the cache);
//! 2. in `RELAYCC_PTX_DIR`, if set: `relaycc_kernels.compute_XY.ptx` for the device's
//!    architecture, else the newest older one (the driver JIT-compiles older PTX for newer
//!    GPUs). When the variable is set, NVRTC is never used: a missing or stale file is an error;
//! 3. in the disk cache (`RELAYCC_CACHE_DIR`, else `$XDG_CACHE_HOME/relaycc`, else
//!    `~/.cache/relaycc`), under a key hashing the sources, the architecture, the compile options
//!    and NVRTC's version, so an edit or an NVRTC upgrade never reuses stale PTX;
//! 4. NVRTC ([`compile_ptx`]), writing the result to the disk cache.
//!
//! Every PTX, whatever its origin, is checked for all expected entry points before use.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::CudaError;
use super::kernel_sources::kernel_source;
use super::nvrtc::{Arch, COMPILE_OPTIONS, check_entries, compile_ptx, nvrtc};

/// The file name of the PTX for one architecture, in `RELAYCC_PTX_DIR` and as the
/// `compile_kernels` example writes it.
pub fn ptx_file_name(arch: Arch) -> String {
    format!("relaycc_kernels.{}.ptx", arch.compute_name())
}

/// Where a [`KernelPtx`] came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PtxOrigin {
    /// Compiled by NVRTC in this process.
    Compiled,
    /// Read from the on-disk cache.
    DiskCache(PathBuf),
    /// Read from `RELAYCC_PTX_DIR` (possibly for an older architecture than asked).
    Precompiled(PathBuf),
}

/// The kernels' PTX for one architecture, with every expected entry point checked present.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelPtx {
    /// The architecture the PTX targets (may be older than the device's, for precompiled PTX).
    pub arch: Arch,
    /// The PTX text.
    pub ptx: String,
    /// Where it came from.
    pub origin: PtxOrigin,
}

/// Where a [`KernelCache`] looks; [`CacheConfig::from_env`] reads the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheConfig {
    /// The on-disk cache directory; `None` keeps PTX in memory only. Default: from the
    /// environment (see [`CacheConfig::from_env`]).
    pub cache_dir: Option<PathBuf>,
    /// A directory of precompiled PTX used instead of NVRTC. Default: `RELAYCC_PTX_DIR`.
    pub ptx_dir: Option<PathBuf>,
}

impl CacheConfig {
    /// `cache_dir` from `RELAYCC_CACHE_DIR`, else `$XDG_CACHE_HOME/relaycc`, else
    /// `$HOME/.cache/relaycc`; `ptx_dir` from `RELAYCC_PTX_DIR`. Empty values count as unset.
    pub fn from_env() -> CacheConfig {
        Self::from_lookup(&|k| std::env::var_os(k).filter(|v| !v.is_empty()))
    }

    fn from_lookup(env: &dyn Fn(&str) -> Option<std::ffi::OsString>) -> CacheConfig {
        let cache_dir = env("RELAYCC_CACHE_DIR")
            .map(PathBuf::from)
            .or_else(|| env("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("relaycc")))
            .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache/relaycc")));
        CacheConfig {
            cache_dir,
            ptx_dir: env("RELAYCC_PTX_DIR").map(PathBuf::from),
        }
    }
}

/// The cache of compiled kernels, shared by all devices of a process (one entry per
/// architecture). Cheap to query once warm; thread-safe.
#[derive(Debug)]
pub struct KernelCache {
    config: CacheConfig,
    memory: Mutex<HashMap<Arch, Arc<KernelPtx>>>,
}

impl KernelCache {
    /// A cache looking where `config` says.
    pub fn new(config: CacheConfig) -> KernelCache {
        KernelCache {
            config,
            memory: Mutex::new(HashMap::new()),
        }
    }

    /// A cache configured from the environment ([`CacheConfig::from_env`]).
    pub fn from_env() -> KernelCache {
        KernelCache::new(CacheConfig::from_env())
    }

    /// The configuration in use.
    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// The kernels' PTX for `arch`, from the first source that has it (see the module docs).
    pub fn ptx(&self, arch: Arch) -> Result<Arc<KernelPtx>, CudaError> {
        if let Some(hit) = self.lock().get(&arch) {
            return Ok(Arc::clone(hit));
        }
        // Compiling takes about a second, so the lock is not held meanwhile; two threads
        // racing on a cold cache both compile and the second insert wins, harmlessly.
        let found = Arc::new(self.load(arch)?);
        self.lock().insert(arch, Arc::clone(&found));
        Ok(found)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arch, Arc<KernelPtx>>> {
        // A poisoned map is still a valid map of checked PTX.
        self.memory
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn load(&self, arch: Arch) -> Result<KernelPtx, CudaError> {
        if let Some(dir) = &self.config.ptx_dir {
            return precompiled(dir, arch);
        }
        let nvrtc_version = nvrtc()?.version;
        let cache_file = self.config.cache_dir.as_ref().map(|dir| {
            dir.join(format!(
                "{}.{}.ptx",
                arch.compute_name(),
                cache_key(arch, nvrtc_version)
            ))
        });
        if let Some(file) = &cache_file
            && let Ok(ptx) = std::fs::read_to_string(file)
            // A damaged cache file is recompiled and overwritten rather than trusted.
            && check_entries(&ptx, arch, "the disk cache").is_ok()
        {
            return Ok(KernelPtx {
                arch,
                ptx,
                origin: PtxOrigin::DiskCache(file.clone()),
            });
        }
        let ptx = compile_ptx(arch)?;
        if let Some(file) = &cache_file {
            // The disk cache only saves the next process a compile; failing to write it (a
            // read-only home, a full disk) must not fail the collective.
            let _ = write_atomically(file, &ptx);
        }
        Ok(KernelPtx {
            arch,
            ptx,
            origin: PtxOrigin::Compiled,
        })
    }
}

/// Reads `relaycc_kernels.compute_XY.ptx` for `arch` or the newest older architecture of the
/// same or lower major version present in `dir`.
fn precompiled(dir: &Path, arch: Arch) -> Result<KernelPtx, CudaError> {
    let mut candidates: Vec<Arch> = Vec::new();
    for major in (7..=arch.major()).rev() {
        let top = if major == arch.major() {
            arch.minor()
        } else {
            9
        };
        for minor in (0..=top).rev() {
            if let Ok(a) = Arch::new(major, minor) {
                candidates.push(a);
            }
        }
    }
    for candidate in candidates {
        let path = dir.join(ptx_file_name(candidate));
        if !path.is_file() {
            continue;
        }
        let ptx = std::fs::read_to_string(&path).map_err(|e| CudaError::PtxFile {
            path: path.clone(),
            message: e.to_string(),
        })?;
        check_entries(&ptx, candidate, &path.display().to_string())?;
        return Ok(KernelPtx {
            arch: candidate,
            ptx,
            origin: PtxOrigin::Precompiled(path),
        });
    }
    Err(CudaError::PtxFile {
        path: dir.join(ptx_file_name(arch)),
        message: format!(
            "RELAYCC_PTX_DIR has no PTX for {} or an older architecture (write it with \
             `cargo run -p relaycc-collectives --example compile_kernels -- --arch {} --out DIR`)",
            arch,
            arch.number()
        ),
    })
}

/// A stable 64-bit FNV-1a hash (std's hasher may change between Rust releases, which would
/// needlessly invalidate the disk cache).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in part.iter().chain(b"\0") {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

/// The disk-cache key: sources, architecture, options and NVRTC version.
fn cache_key(arch: Arch, nvrtc_version: (i32, i32)) -> String {
    let source = kernel_source();
    let arch_name = arch.compute_name();
    let options = COMPILE_OPTIONS.join(" ");
    let version = format!("{}.{}", nvrtc_version.0, nvrtc_version.1);
    let hash = fnv1a(&[
        source.as_bytes(),
        arch_name.as_bytes(),
        options.as_bytes(),
        version.as_bytes(),
    ]);
    format!("{hash:016x}")
}

/// Writes through a temporary file and a rename, so a reader never sees half a file.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;
    use crate::cuda::kernel_sources::expected_entries;

    /// PTX text with every entry point and the parameters the library launches it with.
    fn fake_ptx() -> String {
        use crate::cuda::kernel_sources::{
            COPY_BATCH_ARGS_BYTES, FORWARD_BATCH_ENTRY, FORWARD_ENTRY, REDUCE_ARGS_BYTES,
        };
        expected_entries()
            .map(|e| {
                let params = if e == FORWARD_ENTRY {
                    format!(
                        "\t.param .u64 {e}_param_0,\n\t.param .u64 {e}_param_1,\n\t.param .u64 {e}_param_2\n"
                    )
                } else if e == FORWARD_BATCH_ENTRY {
                    format!("\t.param .align 8 .b8 {e}_param_0[{COPY_BATCH_ARGS_BYTES}]\n")
                } else {
                    format!("\t.param .align 8 .b8 {e}_param_0[{REDUCE_ARGS_BYTES}]\n")
                };
                format!(".visible .entry {e}(\n{params})\n{{\n\tret;\n}}\n")
            })
            .collect()
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("relaycc-cache-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn config_from_environment() {
        let env = |k: &str| match k {
            "XDG_CACHE_HOME" => Some(OsString::from("/xdg")),
            "HOME" => Some(OsString::from("/home/u")),
            _ => None,
        };
        let config = CacheConfig::from_lookup(&env);
        assert_eq!(config.cache_dir, Some(PathBuf::from("/xdg/relaycc")));
        assert_eq!(config.ptx_dir, None);
        let env = |k: &str| match k {
            "RELAYCC_CACHE_DIR" => Some(OsString::from("/c")),
            "RELAYCC_PTX_DIR" => Some(OsString::from("/p")),
            "HOME" => Some(OsString::from("/home/u")),
            _ => None,
        };
        let config = CacheConfig::from_lookup(&env);
        assert_eq!(
            (config.cache_dir, config.ptx_dir),
            (Some("/c".into()), Some("/p".into()))
        );
        let home_only = |k: &str| (k == "HOME").then(|| OsString::from("/home/u"));
        assert_eq!(
            CacheConfig::from_lookup(&home_only).cache_dir,
            Some("/home/u/.cache/relaycc".into())
        );
    }

    #[test]
    fn precompiled_ptx_is_used_without_nvrtc_and_older_arch_serves_newer_gpus() {
        let dir = temp_dir("precompiled");
        std::fs::write(dir.join(ptx_file_name(Arch::SM80)), fake_ptx()).unwrap();
        let cache = KernelCache::new(CacheConfig {
            cache_dir: None,
            ptx_dir: Some(dir.clone()),
        });
        let got = cache.ptx(Arch::SM90).unwrap();
        assert_eq!(got.arch, Arch::SM80);
        assert_eq!(
            got.origin,
            PtxOrigin::Precompiled(dir.join("relaycc_kernels.compute_80.ptx"))
        );
        // Second call: from memory, the same Arc.
        assert!(Arc::ptr_eq(&got, &cache.ptx(Arch::SM90).unwrap()));
        // Nothing for Volta: a clear error naming the file and how to make it.
        let err = cache.ptx(Arch::SM70).unwrap_err();
        assert!(matches!(&err, CudaError::PtxFile { .. }), "{err}");
        assert!(err.to_string().contains("compile_kernels"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn stale_precompiled_ptx_is_rejected() {
        let dir = temp_dir("stale");
        std::fs::write(
            dir.join(ptx_file_name(Arch::SM70)),
            ".visible .entry relaycc_forward(\n",
        )
        .unwrap();
        let cache = KernelCache::new(CacheConfig {
            cache_dir: None,
            ptx_dir: Some(dir.clone()),
        });
        let err = cache.ptx(Arch::SM70).unwrap_err();
        assert!(
            matches!(&err, CudaError::MissingEntryPoints { missing, .. } if missing.len() == 45),
            "{err}"
        );
        // Every entry point present, but the reduce and batched forward kernels with the
        // two-value parameters of an older relaycc: refused, never launched with the wrong
        // arguments.
        let old: String = fake_ptx()
            .lines()
            .map(|l| match l.split_once(" .b8 ") {
                Some((_, rest)) => format!(
                    "\t.param .u64 {},\n\t.param .u64 x",
                    rest.split('[').next().unwrap_or("")
                ),
                None => l.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(dir.join(ptx_file_name(Arch::SM70)), old).unwrap();
        let fresh = KernelCache::new(cache.config().clone());
        let err = fresh.ptx(Arch::SM70).unwrap_err();
        assert!(
            matches!(&err, CudaError::StaleEntryPoints { stale, .. } if stale.len() == 45),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn without_precompiled_ptx_the_cache_needs_nvrtc() {
        let dir = temp_dir("disk");
        let cache = KernelCache::new(CacheConfig {
            cache_dir: Some(dir.clone()),
            ptx_dir: None,
        });
        match (nvrtc(), cache.ptx(Arch::SM80)) {
            (Err(probe), result) => assert_eq!(result.unwrap_err(), probe.clone()),
            (Ok(_), result) => {
                let first = result.unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(first.origin, PtxOrigin::Compiled);
                // A fresh cache (another process, in effect) finds it on disk.
                let again = KernelCache::new(cache.config().clone())
                    .ptx(Arch::SM80)
                    .unwrap();
                assert!(
                    matches!(again.origin, PtxOrigin::DiskCache(_)),
                    "{:?}",
                    again.origin
                );
                assert_eq!(again.ptx, first.ptx);
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn cache_key_changes_with_every_input() {
        let base = cache_key(Arch::SM80, (12, 9));
        assert_eq!(base, cache_key(Arch::SM80, (12, 9)));
        assert_ne!(base, cache_key(Arch::SM90, (12, 9)));
        assert_ne!(base, cache_key(Arch::SM80, (12, 8)));
        assert_eq!(fnv1a(&[b"a"]), fnv1a(&[b"a"]));
        assert_ne!(fnv1a(&[b"ab", b""]), fnv1a(&[b"a", b"b"]));
    }
}
