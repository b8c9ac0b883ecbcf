//! Picking a backend at run time (the same model code runs on every `Device`), and
//! running work on the compute pool of the CPU backend.

use burn::tensor::Device;
use thiserror::Error;

/// The backends this build of the library can run on.
pub const COMPILED_BACKENDS: &[&str] = &[
    #[cfg(feature = "flex")]
    "flex",
    #[cfg(feature = "ndarray")]
    "ndarray",
    #[cfg(feature = "wgpu")]
    "wgpu",
    #[cfg(feature = "cuda")]
    "cuda",
];

/// A device name that this build cannot run on.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DeviceError {
    /// The name is not a backend this library knows.
    #[error("unknown device `{name}`: expected one of flex, ndarray, wgpu, cuda")]
    Unknown {
        /// The name as given.
        name: String,
    },
    /// An index on a backend that has one device: flex and ndarray compute on the CPU,
    /// wgpu on the system's default adapter.
    #[error(
        "device `{name}`: `{backend}` has one device and takes no index (use `{backend}`); \
         only cuda picks a device by number (`cuda:1`)"
    )]
    IndexNotSupported {
        /// The name as given.
        name: String,
        /// The backend part of the name.
        backend: String,
    },
    /// The backend exists but this build was compiled without its feature.
    #[error(
        "device `{name}` needs the `{name}` feature of burn-transformer; this build has: {}",
        COMPILED_BACKENDS.join(", ")
    )]
    NotCompiled {
        /// The name as given.
        name: String,
    },
}

/// Parses a device name (`flex`, `ndarray`, `wgpu`, `cuda`, `cuda:1`).
///
/// This is what the example programs' `--device` flag and `BURN_DEVICE` accept.
pub fn parse_device(name: &str) -> Result<Device, DeviceError> {
    let lower = name.trim().to_ascii_lowercase();
    let (backend, index) = match lower.split_once(':') {
        Some((backend, index)) => (backend, Some(index)),
        None => (lower.as_str(), None),
    };
    let index: usize = match index {
        None => 0,
        Some(text) => text.parse().map_err(|_| DeviceError::Unknown {
            name: name.to_string(),
        })?,
    };
    if index != 0 && matches!(backend, "flex" | "cpu" | "ndarray" | "wgpu" | "vulkan") {
        return Err(DeviceError::IndexNotSupported {
            name: name.to_string(),
            backend: backend.to_string(),
        });
    }
    let device = match backend {
        "flex" | "cpu" => flex_device(index),
        "ndarray" => ndarray_device(index),
        "wgpu" | "vulkan" => wgpu_device(index),
        "cuda" => cuda_device(index),
        _ => {
            return Err(DeviceError::Unknown {
                name: name.to_string(),
            });
        }
    };
    device.ok_or_else(|| DeviceError::NotCompiled {
        name: backend.to_string(),
    })
}

/// `fn $name($index) -> Option<Device>`: the device, or `None` where this build lacks
/// the backend's feature.
macro_rules! backend_device {
    ($name:ident, $feature:literal, |$index:ident| $make:expr) => {
        #[cfg(feature = $feature)]
        #[allow(deprecated)] // ndarray is deprecated upstream; we keep supporting it.
        fn $name($index: usize) -> Option<Device> {
            Some($make)
        }
        #[cfg(not(feature = $feature))]
        fn $name(_: usize) -> Option<Device> {
            None
        }
    };
}

backend_device!(flex_device, "flex", |_index| Device::flex());
backend_device!(ndarray_device, "ndarray", |_index| Device::ndarray());
backend_device!(wgpu_device, "wgpu", |_index| Device::wgpu(
    burn::tensor::DeviceKind::DefaultDevice
));
backend_device!(cuda_device, "cuda", |index| Device::cuda(index));

/// The device named by `BURN_DEVICE`, or flex when it is unset.
pub fn device_from_env() -> Result<Device, DeviceError> {
    match std::env::var("BURN_DEVICE") {
        Ok(name) if !name.trim().is_empty() => parse_device(&name),
        _ => parse_device(COMPILED_BACKENDS.first().copied().unwrap_or("flex")),
    }
}

/// A short name for the backend a device runs on: `flex`, `ndarray`, `wgpu`, `cuda`.
pub fn backend_name(device: &Device) -> &'static str {
    use burn::backend::DispatchDevice;
    match device.clone().inner().as_dispatch() {
        #[cfg(feature = "flex")]
        DispatchDevice::Flex(_) => "flex",
        #[cfg(feature = "ndarray")]
        DispatchDevice::NdArray(_) => "ndarray",
        #[cfg(feature = "cube")]
        DispatchDevice::Cube(cube) => {
            // One CubeCL backend covers every runtime; its device says which.
            if format!("{cube:?}").to_ascii_lowercase().contains("cuda") {
                "cuda"
            } else {
                "wgpu"
            }
        }
        #[allow(unreachable_patterns)]
        _ => "other",
    }
}

/// Whether a device runs on a CubeCL runtime (wgpu, cuda), where the fused
/// attention kernel is available.
pub fn is_cube_device(device: &Device) -> bool {
    matches!(backend_name(device), "wgpu" | "cuda")
}

/// Runs `work` on a thread of the rayon pool that flex computes on, when `device` is
/// flex; elsewhere on the calling thread.
///
/// Flex splits large matrix products and elementwise ops over that pool. Called from
/// an outside thread, each split wakes the pool's threads and puts the caller to sleep
/// until they finish: two context switches per op, thousands per training step. From a
/// pool thread the caller takes a share of the work itself and the split costs little.
pub fn on_compute_pool<R: Send>(device: &Device, work: impl FnOnce() -> R + Send) -> R {
    #[cfg(feature = "flex")]
    {
        use burn::backend::DispatchDevice;
        if matches!(
            device.clone().inner().as_dispatch(),
            DispatchDevice::Flex(_)
        ) && rayon::current_thread_index().is_none()
        {
            return rayon::join(work, || ()).0;
        }
    }
    let _ = device;
    work()
}

/// `tensor` (a module's constant, such as a RoPE table) in the autodiff context of
/// `device`, where that device checkpoints gradients: operations refuse operands of
/// different checkpointing strategies, and a constant moved with the module keeps the
/// context it was made in. Elsewhere `tensor` is returned as it is.
pub fn with_checkpointing_of<const D: usize>(
    tensor: burn::tensor::Tensor<D>,
    device: &Device,
) -> burn::tensor::Tensor<D> {
    use burn::tensor::GradientCheckpointingStrategy;
    match device.gradient_checkpointing_strategy() {
        Some(strategy)
            if strategy != GradientCheckpointingStrategy::Disabled
                && tensor.gradient_checkpointing_strategy() != Some(strategy) =>
        {
            let tensor = match tensor.is_autodiff() {
                true => tensor,
                false => tensor.autodiff(),
            };
            tensor.with_gradient_checkpointing_strategy(strategy)
        }
        _ => tensor,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_device_names_the_choices() {
        let error = parse_device("tpu").unwrap_err();
        assert_eq!(error, DeviceError::Unknown { name: "tpu".into() });
        assert!(error.to_string().contains("flex, ndarray, wgpu, cuda"));
    }

    #[test]
    fn an_index_is_refused_where_the_backend_has_one_device() {
        for name in ["wgpu:7", "flex:1", "ndarray:2"] {
            let error = parse_device(name).unwrap_err();
            assert!(
                matches!(&error, DeviceError::IndexNotSupported { name: given, .. } if given == name),
                "{error}"
            );
            assert!(error.to_string().contains("takes no index"), "{error}");
        }
        assert_eq!(backend_name(&parse_device("flex:0").unwrap()), "flex");
        assert!(matches!(
            parse_device("tpu:3"),
            Err(DeviceError::Unknown { .. })
        ));
    }

    #[test]
    fn flex_parses_in_any_case() {
        let device = parse_device(" FLEX ").unwrap();
        assert_eq!(backend_name(&device), "flex");
    }
}
