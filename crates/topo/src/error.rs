//! The one error type of relaycc-topo.

use std::path::PathBuf;

/// Everything that can go wrong while building, importing, masking or exporting a topology.
///
/// Each variant names the step that failed and where: the file or source, the line, the GPU.
#[derive(Debug, thiserror::Error)]
pub enum TopoError {
    /// A topology text (nvidia-smi matrix, NCCL XML, relaycc JSON) could not be read.
    #[error("{source_name}:{line}: {message}")]
    Parse {
        /// The file name, or a label such as `<stdin>` or `preset dgx1-v100`.
        source_name: String,
        /// The 1-based line the problem was found on (0 when it concerns the whole input).
        line: usize,
        /// What is wrong, in a lowercase sentence without final period.
        message: String,
    },
    /// A file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path that was being read.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A preset or cluster name is not known.
    #[error("unknown topology {name:?}: no such file, and not a preset; presets: {known}")]
    UnknownPreset {
        /// The name that was asked for.
        name: String,
        /// The accepted names, comma separated.
        known: String,
    },
    /// A topology being built breaks a rule of the model (duplicate names, GPU indices with gaps,
    /// a link to itself, a rate that is not positive).
    #[error("invalid topology {topology:?}: {message}")]
    Invalid {
        /// The topology's name.
        topology: String,
        /// Which rule was broken and by what.
        message: String,
    },
    /// A GPU index outside the topology.
    #[error("GPU {index} does not exist; the topology has {count} GPUs (0..{count})")]
    UnknownGpu {
        /// The index that was asked for.
        index: u32,
        /// How many GPUs the topology has.
        count: u32,
    },
    /// A node name (as printed by `topo show --format json`) that the topology does not have.
    #[error("no node named {name:?} in the topology")]
    UnknownNode {
        /// The name that was asked for.
        name: String,
    },
    /// A calibration file entry that does not apply to this topology.
    #[error("calibration {source_name}: {message}")]
    Calibration {
        /// The calibration file or label.
        source_name: String,
        /// What does not fit.
        message: String,
    },
    /// NVML (the NVIDIA management library) is missing or failed while discovering a live machine.
    #[error("nvml discovery failed at {step}: {message}")]
    Nvml {
        /// The NVML step that failed, such as `init` or `device 3 nvlink 2 remote pci info`.
        step: String,
        /// NVML's own message.
        message: String,
    },
}

/// The result type of relaycc-topo.
pub type Result<T, E = TopoError> = std::result::Result<T, E>;

impl TopoError {
    /// A parse error for `source_name` at `line`.
    pub fn parse(source_name: &str, line: usize, message: impl Into<String>) -> Self {
        TopoError::Parse {
            source_name: source_name.to_string(),
            line,
            message: message.into(),
        }
    }
}
