//! Importers: `nvidia-smi topo -m` text, NCCL topology XML, NVML discovery, relaycc JSON.
//!
//! [`load`] takes what `--topology` takes: a preset name, `auto` (NVML), or a file whose format
//! is detected from its content.

pub mod json;
pub mod nccl_xml;
pub mod nvml;
pub mod smi;

use std::path::Path;

use crate::error::{Result, TopoError};
use crate::graph::Topology;

/// The formats a topology file can be in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// relaycc's own JSON.
    Json,
    /// NCCL topology XML (NCCL_TOPO_FILE or NCCL_TOPO_DUMP_FILE).
    NcclXml,
    /// `nvidia-smi topo -m` output.
    Smi,
}

/// Guess a file's format from its first non-blank character: `{` JSON, `<` XML, else the
/// nvidia-smi matrix.
pub fn detect(text: &str) -> Format {
    match text
        .trim_start_matches('\u{feff}')
        .trim_start()
        .chars()
        .next()
    {
        Some('{') => Format::Json,
        Some('<') => Format::NcclXml,
        _ => Format::Smi,
    }
}

/// Parse topology text of any supported format; `source_name` labels errors.
pub fn parse_str(text: &str, source_name: &str) -> Result<Topology> {
    match detect(text) {
        Format::Json => json::parse(text, source_name),
        Format::NcclXml => nccl_xml::parse(text, source_name),
        Format::Smi => smi::parse(text, source_name),
    }
}

/// The largest topology or calibration file read, bytes. Real inputs are far smaller (an
/// `nvidia-smi topo -m` matrix of 64 devices is about 30 KiB, an NCCL topology dump of a
/// 16-GPU node under 100 KiB); the cap keeps a wrong path (a disk image, a log) from filling
/// memory before the parser refuses it.
pub const MAX_INPUT_BYTES: u64 = 16 << 20;

/// The text of the input file at `path`, after checking that it is a regular file (not a FIFO
/// that would block, nor a device such as `/dev/zero` that never ends) of at most
/// [`MAX_INPUT_BYTES`], and that it is UTF-8.
pub fn read_input(path: &Path) -> Result<String> {
    let io_err = |source: std::io::Error| TopoError::Io {
        path: path.to_path_buf(),
        source,
    };
    let refuse = |message: String| {
        io_err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            message,
        ))
    };
    // `metadata` does not open the file, so a FIFO is refused before anything can block on it.
    let meta = std::fs::metadata(path).map_err(io_err)?;
    if !meta.is_file() {
        return Err(refuse(
            "not a regular file (a directory, FIFO or device)".into(),
        ));
    }
    let too_big = |len: u64| {
        refuse(format!(
            "{len} bytes or more, larger than the {} MiB an input file may have",
            MAX_INPUT_BYTES >> 20
        ))
    };
    if meta.len() > MAX_INPUT_BYTES {
        return Err(too_big(meta.len()));
    }
    let file = std::fs::File::open(path).map_err(io_err)?;
    // The file may have grown since `metadata`: read one byte past the cap to notice.
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    std::io::Read::read_to_end(
        &mut std::io::Read::take(file, MAX_INPUT_BYTES + 1),
        &mut bytes,
    )
    .map_err(io_err)?;
    if bytes.len() as u64 > MAX_INPUT_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| {
        TopoError::parse(
            &path.display().to_string(),
            0,
            format!(
                "not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

/// Read and parse a topology file of any supported format.
pub fn from_path(path: &Path) -> Result<Topology> {
    let text = read_input(path)?;
    let name = path.display().to_string();
    let mut topo = parse_str(&text, &name)?;
    if topo.name().is_empty() {
        topo.set_name(
            path.file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or(name),
        );
    }
    Ok(topo)
}

/// True when `spec` reads as a file path rather than a preset name: presets have neither path
/// separators nor file extensions.
fn looks_like_path(spec: &str) -> bool {
    spec.contains(['/', '\\', '.'])
}

/// What `--topology` accepts: a preset or cluster name, `auto` for NVML discovery of this
/// machine, or a path to a topology file. A spec that names no existing file is a preset name,
/// unless it looks like a path (a `/`, `\` or `.` in it): then the error is the missing file.
pub fn load(spec: &str) -> Result<Topology> {
    if spec == "auto" {
        return nvml::discover();
    }
    let path = Path::new(spec);
    if spec.starts_with("cluster:") || !(path.exists() || looks_like_path(spec)) {
        return crate::preset::preset(spec);
    }
    from_path(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_formats() {
        assert_eq!(detect("  {\"a\":1}"), Format::Json);
        assert_eq!(detect("\n<system>"), Format::NcclXml);
        assert_eq!(detect("\tGPU0\tGPU1"), Format::Smi);
    }

    #[test]
    fn missing_files_are_missing_files_not_unknown_presets() {
        for spec in ["my-node.txt", "./nope", "dir/topo.xml"] {
            let err = load(spec).unwrap_err();
            assert!(
                matches!(&err, TopoError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
                "{spec}: {err}"
            );
        }
    }

    #[cfg(unix)]
    #[test]
    fn devices_directories_and_fifos_are_refused_without_reading() {
        for spec in ["/dev/zero", "/dev/null", "/"] {
            let err = load(spec).unwrap_err().to_string();
            assert!(err.contains("not a regular file"), "{spec}: {err}");
        }
        let dir = std::env::temp_dir().join(format!("relaycc-topo-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("topo.fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let err = from_path(&fifo).unwrap_err().to_string();
            assert!(err.contains("not a regular file"), "{err}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn files_over_the_cap_are_refused() {
        let path =
            std::env::temp_dir().join(format!("relaycc-topo-big-{}.txt", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        // A sparse file: its length is past the cap without writing the bytes.
        file.set_len(MAX_INPUT_BYTES + 1).unwrap();
        let err = from_path(&path).unwrap_err().to_string();
        let _ = std::fs::remove_file(&path);
        assert!(err.contains("larger than the 16 MiB"), "{err}");
    }

    #[test]
    fn unknown_spec_is_an_error_naming_presets() {
        let err = load("no-such-machine").unwrap_err().to_string();
        assert!(err.contains("dgx1-v100"), "{err}");
    }
}
