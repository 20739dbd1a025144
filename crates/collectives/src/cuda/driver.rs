//! The CUDA driver, probed before use: which GPUs exist, what they are, which can reach which.
//!
//! [`driver`] loads libcuda (by the names cudarc uses) and initialises it once; every function
//! here calls it first, so on a machine without an NVIDIA driver they all return
//! [`CudaError::NoDriver`] instead of reaching cudarc, which would panic.

use std::ffi::c_int;
use std::sync::OnceLock;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys::{self, CUdevice_attribute as Attr};

use super::CudaError;
use super::libs::{self, LibKind, LibSpec};
use super::nvrtc::Arch;

/// The driver functions relaycc calls through cudarc, directly or inside cudarc's safe types
/// (contexts, streams, events, allocations, modules, launches, copies, error formatting); the
/// probe checks each one resolves, since cudarc panics on a missing symbol. Every one exists
/// in any driver new enough for CUDA 12 (`cuMemAllocAsync` since 11.2, `cuGraphInstantiateWithFlags`
/// since 11.4).
const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem_v2",
    "cuDeviceCanAccessPeer",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxSynchronize",
    "cuCtxEnablePeerAccess",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventElapsedTime",
    "cuEventDestroy_v2",
    "cuMemAlloc_v2",
    "cuMemAllocAsync",
    "cuMemFree_v2",
    "cuMemFreeAsync",
    "cuMemsetD8Async",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyAsync",
    "cuMemcpyPeerAsync",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
];

/// The loaded CUDA driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverInfo {
    /// The library name cudarc loads it by (e.g. `libcuda.so.1`).
    pub library: String,
    /// The CUDA version the driver supports, (major, minor), e.g. (12, 4): PTX from a newer
    /// NVRTC than this cannot be loaded.
    pub cuda_version: (i32, i32),
    /// False when the driver loaded but reports no CUDA device (`CUDA_ERROR_NO_DEVICE`).
    pub has_devices: bool,
}

fn driver_error(call: &'static str) -> impl Fn(DriverError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        status: format!("{e:?}"),
    }
}

/// Loads and initialises the CUDA driver once per process
/// ([cuInit](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__INITIALIZE.html)).
///
/// Only the loader's path is searched (`LD_LIBRARY_PATH`, `ldconfig`): the driver library comes
/// with the kernel driver and must match it, so relaycc never looks for copies elsewhere.
pub fn driver() -> Result<&'static DriverInfo, CudaError> {
    static PROBED: OnceLock<Result<DriverInfo, CudaError>> = OnceLock::new();
    PROBED
        .get_or_init(|| {
            let spec = LibSpec {
                kind: LibKind::Driver,
                stem: if cfg!(windows) { "nvcuda" } else { "cuda" },
                file_names: &[],
                explicit: None,
                dirs: Vec::new(),
                symbols: DRIVER_SYMBOLS,
            };
            let found = libs::probe(&spec)?;
            let has_devices = match result::init() {
                Ok(()) => true,
                // A driver without a GPU (a container without devices passed in) is not an
                // error: the machine simply has no CUDA devices.
                Err(DriverError(sys::CUresult::CUDA_ERROR_NO_DEVICE)) => false,
                Err(e) => return Err(driver_error("cuInit")(e)),
            };
            let mut version: c_int = 0;
            // SAFETY: the probe found libcuda under one of cudarc's names with this symbol;
            // the pointer is valid for the call.
            unsafe { sys::cuDriverGetVersion(&mut version) }
                .result()
                .map_err(driver_error("cuDriverGetVersion"))?;
            Ok(DriverInfo {
                library: found.name,
                cuda_version: (version / 1000, (version % 1000) / 10),
                has_devices,
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// One CUDA device as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The driver's ordinal (after `CUDA_VISIBLE_DEVICES`).
    pub ordinal: usize,
    /// The product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Compute capability (major, minor), e.g. (9, 0).
    pub compute_capability: (u32, u32),
    /// Streaming multiprocessors (sizes full-GPU kernel launches).
    pub multiprocessor_count: u32,
    /// Device memory in bytes.
    pub total_memory_bytes: u64,
    /// PCI address `domain:bus:device.0`, as nvidia-smi prints it (lowercase hex), which links
    /// the device to the topology's GPU nodes.
    pub pci_bus_id: String,
    /// `can_access_peer[j]`: this device can map device `j`'s memory
    /// ([cuDeviceCanAccessPeer](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__PEER__ACCESS.html));
    /// false for itself.
    pub can_access_peer: Vec<bool>,
}

impl DeviceInfo {
    /// The architecture to compile kernels for.
    pub fn arch(&self) -> Result<Arch, CudaError> {
        Arch::new(self.compute_capability.0, self.compute_capability.1)
    }
}

fn attribute(dev: sys::CUdevice, attr: Attr) -> Result<i32, CudaError> {
    // SAFETY: `dev` came from cuDeviceGet after a successful cuInit.
    unsafe { result::device::get_attribute(dev, attr) }
        .map_err(driver_error("cuDeviceGetAttribute"))
}

/// Non-negative driver integers as u32 (the attributes read here are never negative; a
/// negative one would be a driver bug and reads as 0).
fn non_negative(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

/// Every CUDA device: name, compute capability, memory, PCI address and the peer-access matrix.
/// Without a driver: [`CudaError::NoDriver`]; with a driver and no GPU: an empty list.
pub fn devices() -> Result<Vec<DeviceInfo>, CudaError> {
    if !driver()?.has_devices {
        return Ok(Vec::new());
    }
    let count = result::device::get_count().map_err(driver_error("cuDeviceGetCount"))?;
    let mut handles = Vec::new();
    for ordinal in 0..count {
        handles.push(result::device::get(ordinal).map_err(driver_error("cuDeviceGet"))?);
    }
    let mut out = Vec::with_capacity(handles.len());
    for (ordinal, &dev) in handles.iter().enumerate() {
        let name = result::device::get_name(dev).map_err(driver_error("cuDeviceGetName"))?;
        let major = attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sms = attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let domain = attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?;
        let bus = attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?;
        let device = attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?;
        // SAFETY: `dev` came from cuDeviceGet after a successful cuInit.
        let total =
            unsafe { result::device::total_mem(dev) }.map_err(driver_error("cuDeviceTotalMem"))?;
        let mut can_access_peer = Vec::with_capacity(handles.len());
        for (peer_ordinal, &peer) in handles.iter().enumerate() {
            if peer_ordinal == ordinal {
                can_access_peer.push(false);
                continue;
            }
            let mut can: c_int = 0;
            // SAFETY: both handles came from cuDeviceGet; the pointer is valid for the call.
            unsafe { sys::cuDeviceCanAccessPeer(&mut can, dev, peer) }
                .result()
                .map_err(driver_error("cuDeviceCanAccessPeer"))?;
            can_access_peer.push(can != 0);
        }
        out.push(DeviceInfo {
            ordinal,
            name,
            compute_capability: (non_negative(major), non_negative(minor)),
            multiprocessor_count: non_negative(sms),
            total_memory_bytes: total as u64,
            pci_bus_id: format!(
                "{:04x}:{:02x}:{:02x}.0",
                non_negative(domain),
                non_negative(bus),
                non_negative(device)
            ),
            can_access_peer,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver (CI) both entry points give NoDriver listing libcuda.so.1; with one,
    /// they agree with each other. Never a panic.
    #[test]
    fn entry_points_give_no_driver_or_agree() {
        match driver() {
            Err(err) => {
                let CudaError::NoDriver { searched } = &err else {
                    panic!("{err}")
                };
                if cfg!(target_os = "linux") {
                    assert!(searched.iter().any(|s| s == "libcuda.so.1"), "{searched:?}");
                }
                assert!(err.to_string().starts_with("no CUDA driver"));
                assert_eq!(devices(), Err(err.clone()));
            }
            Ok(info) => {
                let devices = devices().unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(info.has_devices, !devices.is_empty());
                for d in &devices {
                    assert_eq!(d.can_access_peer.len(), devices.len());
                    assert!(!d.can_access_peer[d.ordinal]);
                }
            }
        }
    }

    #[test]
    fn device_arch() {
        let d = DeviceInfo {
            ordinal: 0,
            name: "test".into(),
            compute_capability: (9, 0),
            multiprocessor_count: 132,
            total_memory_bytes: 80 << 30,
            pci_bus_id: "0000:18:00.0".into(),
            can_access_peer: vec![false],
        };
        assert_eq!(d.arch(), Ok(Arch::SM90));
        let old = DeviceInfo {
            compute_capability: (6, 0),
            ..d
        };
        assert!(matches!(
            old.arch(),
            Err(CudaError::UnsupportedArch { major: 6, minor: 0 })
        ));
    }
}
