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

/// Read and parse a topology file of any supported format.
pub fn from_path(path: &Path) -> Result<Topology> {
    let bytes = std::fs::read(path).map_err(|source| TopoError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let name = path.display().to_string();
    let text = String::from_utf8(bytes).map_err(|e| {
        TopoError::parse(
            &name,
            0,
            format!(
                "not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })?;
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

/// What `--topology` accepts: a preset or cluster name, `auto` for NVML discovery of this
/// machine, or a path to a topology file.
pub fn load(spec: &str) -> Result<Topology> {
    if spec == "auto" {
        return nvml::discover();
    }
    let path = Path::new(spec);
    if spec.starts_with("cluster:") || !path.exists() {
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
    fn unknown_spec_is_an_error_naming_presets() {
        let err = load("no-such-machine").unwrap_err().to_string();
        assert!(err.contains("dgx1-v100"), "{err}");
    }
}
