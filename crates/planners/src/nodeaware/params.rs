//! Lassen's measured communication parameters from [Lockhart-2023 §3, Tables 2-4], and the
//! machine shape it models (§2.1, §4.2, §4.4).
//!
//! Arrays are indexed `[protocol][placement]`: protocol as in [`MpiProtocol`], placement as in
//! [`ProcessPlacement`] ([Lockhart-2023]'s column order: on-socket, on-node, off-node).

use serde::{Deserialize, Serialize};

/// MPI messaging protocol ([Lockhart-2023 §3]): which one a message uses depends on its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MpiProtocol {
    /// The message fits in the envelope and is sent directly (inter-CPU only).
    Short,
    /// The receiver is assumed to have buffer space already.
    Eager,
    /// The receiver allocates buffer space before the data is sent.
    Rendezvous,
}

/// Where two communicating processes sit relative to each other ([Lockhart-2023, Table 2] columns).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessPlacement {
    /// Same socket.
    OnSocket,
    /// Different sockets of one node.
    OnNode,
    /// Different nodes.
    OffNode,
}

/// Inter-CPU postal latency alpha, seconds, `[short, eager, rendezvous][on-socket, on-node,
/// off-node]`. Source: [Lockhart-2023, Table 2] (Spectrum MPI on Lassen, least-squares fit to
/// ping-pong).
pub const LASSEN_CPU_ALPHA_S: [[f64; 3]; 3] = [
    [3.67e-07, 9.25e-07, 1.89e-06],
    [4.61e-07, 1.17e-06, 2.44e-06],
    [3.15e-06, 6.77e-06, 7.76e-06],
];
/// Inter-CPU postal inverse bandwidth beta, seconds per byte, indexed as
/// [`LASSEN_CPU_ALPHA_S`]. Source: [Lockhart-2023, Table 2].
pub const LASSEN_CPU_BETA_S_PER_BYTE: [[f64; 3]; 3] = [
    [1.32e-10, 1.19e-09, 6.88e-10],
    [7.12e-11, 2.18e-10, 3.79e-10],
    [3.40e-11, 1.49e-10, 7.97e-11],
];
/// Inter-GPU (device-aware, CUDA-aware MPI over GPUDirect) latency alpha, seconds,
/// `[eager, rendezvous][on-socket, on-node, off-node]`; the short protocol is not used for
/// device-aware messages on Lassen. Source: [Lockhart-2023, Table 2].
pub const LASSEN_GPU_ALPHA_S: [[f64; 3]; 2] = [
    [1.87e-06, 2.02e-05, 8.95e-06],
    [1.82e-05, 1.93e-05, 1.10e-05],
];
/// Inter-GPU inverse bandwidth beta, seconds per byte, indexed as [`LASSEN_GPU_ALPHA_S`].
/// Source: [Lockhart-2023, Table 2].
pub const LASSEN_GPU_BETA_S_PER_BYTE: [[f64; 3]; 2] = [
    [5.79e-11, 2.15e-10, 1.72e-10],
    [1.46e-11, 2.39e-11, 1.72e-10],
];
/// cudaMemcpyAsync latency, seconds, `[1 process, 4 processes][host-to-device,
/// device-to-host]`. Source: [Lockhart-2023, Table 3].
pub const LASSEN_COPY_ALPHA_S: [[f64; 2]; 2] = [[1.30e-05, 1.27e-05], [1.52e-05, 1.47e-05]];
/// cudaMemcpyAsync inverse bandwidth, seconds per byte, indexed as [`LASSEN_COPY_ALPHA_S`].
/// Source: [Lockhart-2023, Table 3].
pub const LASSEN_COPY_BETA_S_PER_BYTE: [[f64; 2]; 2] = [[1.85e-11, 1.96e-11], [5.52e-10, 1.50e-10]];
/// Inter-CPU network injection limit as an inverse rate (1 / R_N), seconds per byte.
/// [Lockhart-2023]'s table heads the column `[bytes/sec]` but prints 4.19e-11, which is only
/// meaningful as seconds per byte (R_N = 23.9 GB/s); we read it so. Source: [Lockhart-2023, Table
/// 4].
pub const LASSEN_CPU_INJECTION_S_PER_BYTE: f64 = 4.19e-11;
/// Largest message (bytes) sent with the short protocol. Source: none stored;
/// [Lockhart-2023 §3] names the protocol but the text used here lost the cutoff, so 512 bytes is
/// assumed (a common MPI envelope size); calibratable through [`ModelParams`].
pub const LASSEN_SHORT_MAX_BYTES: u64 = 512;
/// Largest message (bytes) sent eagerly; above it rendezvous is used. Source: none stored; the
/// text of [Lockhart-2023] used here lost the cutoff, so 8192 bytes is assumed; calibratable.
pub const LASSEN_EAGER_MAX_BYTES: u64 = 8192;
/// Split strategies' message cap, bytes. Source: [Lockhart-2023 §4.6], "the message cap used for
/// switching to the rendezvous protocol on Lassen" (after its reference \[16\]), i.e. the eager
/// limit.
pub const LASSEN_SPLIT_MESSAGE_CAP_BYTES: u64 = LASSEN_EAGER_MAX_BYTES;
/// GPUs per Lassen node (two per POWER9 socket). Source: [Lockhart-2023 §2.1].
pub const LASSEN_GPUS_PER_NODE: u32 = 4;
/// Sockets per Lassen node. Source: [Lockhart-2023 §2.1].
pub const LASSEN_SOCKETS_PER_NODE: u32 = 2;
/// CPU processes per Lassen node available to split strategies (40 cores).
/// Source: [Lockhart-2023 §4.2].
pub const LASSEN_PROCS_PER_NODE: u32 = 40;
/// Host processes per GPU copying with duplicate device pointers in Split+DD. Source:
/// [Lockhart-2023 §4.4] ("we set the number of processes copying data simultaneously to four").
pub const LASSEN_DD_PROCS_PER_GPU: u32 = 4;

/// Every parameter the node-aware models read; [`ModelParams::LASSEN`] holds [Lockhart-2023]'s.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ModelParams {
    /// Inter-CPU alpha, seconds, `[protocol][placement]`.
    pub cpu_alpha_s: [[f64; 3]; 3],
    /// Inter-CPU beta, seconds per byte, `[protocol][placement]`.
    pub cpu_beta_s_per_byte: [[f64; 3]; 3],
    /// Inter-GPU alpha, seconds, `[eager, rendezvous][placement]`.
    pub gpu_alpha_s: [[f64; 3]; 2],
    /// Inter-GPU beta, seconds per byte, `[eager, rendezvous][placement]`.
    pub gpu_beta_s_per_byte: [[f64; 3]; 2],
    /// Copy alpha, seconds, `[1 proc, 4 procs][h2d, d2h]`.
    pub copy_alpha_s: [[f64; 2]; 2],
    /// Copy beta, seconds per byte, `[1 proc, 4 procs][h2d, d2h]`.
    pub copy_beta_s_per_byte: [[f64; 2]; 2],
    /// Inter-CPU injection inverse rate 1 / R_N, seconds per byte.
    pub injection_s_per_byte: f64,
    /// Largest short-protocol message, bytes.
    pub short_max_bytes: u64,
    /// Largest eager message, bytes.
    pub eager_max_bytes: u64,
    /// Split message cap, bytes.
    pub split_cap_bytes: u64,
    /// Host processes per GPU in Split+DD.
    pub dd_procs_per_gpu: u32,
}

impl ModelParams {
    /// Lassen, as [Lockhart-2023] measured it (Tables 2-4).
    pub const LASSEN: ModelParams = ModelParams {
        cpu_alpha_s: LASSEN_CPU_ALPHA_S,
        cpu_beta_s_per_byte: LASSEN_CPU_BETA_S_PER_BYTE,
        gpu_alpha_s: LASSEN_GPU_ALPHA_S,
        gpu_beta_s_per_byte: LASSEN_GPU_BETA_S_PER_BYTE,
        copy_alpha_s: LASSEN_COPY_ALPHA_S,
        copy_beta_s_per_byte: LASSEN_COPY_BETA_S_PER_BYTE,
        injection_s_per_byte: LASSEN_CPU_INJECTION_S_PER_BYTE,
        short_max_bytes: LASSEN_SHORT_MAX_BYTES,
        eager_max_bytes: LASSEN_EAGER_MAX_BYTES,
        split_cap_bytes: LASSEN_SPLIT_MESSAGE_CAP_BYTES,
        dd_procs_per_gpu: LASSEN_DD_PROCS_PER_GPU,
    };

    /// The protocol an inter-CPU message of `bytes` uses.
    pub fn cpu_protocol(&self, bytes: f64) -> MpiProtocol {
        if bytes <= self.short_max_bytes as f64 {
            MpiProtocol::Short
        } else if bytes <= self.eager_max_bytes as f64 {
            MpiProtocol::Eager
        } else {
            MpiProtocol::Rendezvous
        }
    }

    /// (alpha s, beta s/B) of one inter-CPU message of `bytes` at `place` ([Lockhart-2023, Table
    /// 2]).
    pub fn cpu(&self, place: ProcessPlacement, bytes: f64) -> (f64, f64) {
        let p = self.cpu_protocol(bytes) as usize;
        let c = place as usize;
        (self.cpu_alpha_s[p][c], self.cpu_beta_s_per_byte[p][c])
    }

    /// (alpha s, beta s/B) of one device-aware inter-GPU message of `bytes` at `place`
    /// ([Lockhart-2023, Table 2]; short-size messages use the eager row).
    pub fn gpu(&self, place: ProcessPlacement, bytes: f64) -> (f64, f64) {
        let p = usize::from(self.cpu_protocol(bytes) == MpiProtocol::Rendezvous);
        let c = place as usize;
        (self.gpu_alpha_s[p][c], self.gpu_beta_s_per_byte[p][c])
    }
}

impl Default for ModelParams {
    fn default() -> Self {
        ModelParams::LASSEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lassen_table_lookups() {
        let p = ModelParams::LASSEN;
        assert_eq!(
            p.cpu(ProcessPlacement::OffNode, 100.0),
            (1.89e-06, 6.88e-10)
        );
        assert_eq!(
            p.cpu(ProcessPlacement::OnSocket, 4096.0),
            (4.61e-07, 7.12e-11)
        );
        assert_eq!(p.cpu(ProcessPlacement::OnNode, 1e6), (6.77e-06, 1.49e-10));
        assert_eq!(
            p.gpu(ProcessPlacement::OffNode, 100.0),
            (8.95e-06, 1.72e-10)
        );
        assert_eq!(p.gpu(ProcessPlacement::OnSocket, 1e6), (1.82e-05, 1.46e-11));
        assert_eq!(ModelParams::default(), ModelParams::LASSEN);
    }
}
