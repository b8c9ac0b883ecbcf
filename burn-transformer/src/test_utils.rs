//! Helpers shared by the unit tests: the devices every tensor test runs on,
//! value comparisons and the PyTorch fixtures.

use std::collections::HashMap;
use std::path::PathBuf;

use burn::tensor::{Device, Int, Tensor, TensorData};

/// The devices every tensor test runs on: flex, wgpu when the `wgpu` feature is on
/// (lavapipe on CPU-only machines) and CUDA when the `cuda` feature is on (CI never
/// turns it on: it has no GPU).
///
/// `BURN_TRANSFORMER_TEST_DEVICES=flex,cuda` (a comma-separated list of backend names)
/// narrows the list explicitly, for a machine that has a GPU but no Vulkan driver.
///
/// # Panics
/// When the `wgpu` feature is on but no adapter exists: a wgpu test never passes
/// silently without running. Likewise on CUDA without a GPU.
pub fn test_devices() -> Vec<Device> {
    let wanted = std::env::var("BURN_TRANSFORMER_TEST_DEVICES").ok();
    let wanted = |backend: &str| {
        wanted
            .as_deref()
            .is_none_or(|list| list.split(',').any(|name| name.trim() == backend))
    };
    let mut devices = Vec::new();
    if wanted("flex") {
        devices.push(Device::flex());
    }
    #[cfg(feature = "wgpu")]
    if wanted("wgpu") {
        devices.push(wgpu_device());
    }
    #[cfg(feature = "cuda")]
    if wanted("cuda") {
        devices.push(cuda_device());
    }
    assert!(
        !devices.is_empty(),
        "BURN_TRANSFORMER_TEST_DEVICES leaves no device this build has"
    );
    devices
}

/// [`test_devices`] plus ndarray: model-level and training tests run on all three.
#[allow(dead_code)] // used by the model and training tests
pub fn model_test_devices() -> Vec<Device> {
    #[allow(unused_mut)]
    let mut devices = test_devices();
    #[cfg(feature = "ndarray")]
    #[allow(deprecated)] // ndarray is deprecated upstream; we keep supporting it.
    devices.push(Device::ndarray());
    devices
}

/// The wgpu device, checked once to have a working adapter.
#[cfg(feature = "wgpu")]
pub fn wgpu_device() -> Device {
    use std::sync::OnceLock;
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    let device = Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
    let probe = device.clone();
    let status = CHECKED.get_or_init(move || {
        std::panic::catch_unwind(move || {
            let total: f32 = Tensor::<1>::from_floats([1.0, 2.0], &probe)
                .sum()
                .into_scalar();
            total
        })
        .map(|_| ())
        .map_err(|panic| {
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        })
    });
    if let Err(reason) = status {
        panic!(
            "no wgpu adapter: wgpu tests need a Vulkan driver. On a CPU-only Debian/Ubuntu \
             machine install Mesa's lavapipe: `apt-get install -y mesa-vulkan-drivers`. ({reason})"
        );
    }
    device
}

/// The first CUDA device. A test that asks for it fails, never skips, where the
/// `cuda` feature is on but no GPU answers.
#[cfg(feature = "cuda")]
pub fn cuda_device() -> Device {
    Device::cuda(0)
}

/// Token ids from rows of equal length.
///
/// # Shapes
/// - output: `[rows.len(), rows[0].len()]`
pub fn tokens(rows: &[&[i64]], device: &Device) -> Tensor<2, Int> {
    let seq = rows[0].len();
    let values: Vec<i64> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Tensor::from_data(TensorData::new(values, [rows.len(), seq]), device)
}

/// The largest absolute difference between two tensors of the same shape.
pub fn max_abs_diff<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f32 {
    assert_eq!(a.dims(), b.dims(), "shapes differ");
    let a = a.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
    let b = b.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
    a.iter()
        .zip(&b)
        .map(|(x, y)| {
            if x.is_nan() || y.is_nan() {
                f32::INFINITY
            } else {
                (x - y).abs()
            }
        })
        .fold(0.0, f32::max)
}

/// Relative error of Burn's f32 matrix products on CUDA: cubek-matmul runs f32 inputs
/// on TF32 tensor cores where the device has them (10-bit mantissa), so model
/// outputs there carry errors of ~1e-3 of their magnitude, compounded over layers.
const CUDA_TF32_RELATIVE: f32 = 2e-2;

/// The rounding error, relative to the magnitude of the values, that Burn's matrix
/// products may add on `device`: [`CUDA_TF32_RELATIVE`] on CUDA, 0 elsewhere (f32
/// products).
pub fn matmul_relative_rounding(device: &Device) -> f32 {
    if crate::device::backend_name(device) == "cuda" {
        CUDA_TF32_RELATIVE
    } else {
        0.0
    }
}

/// Asserts that `actual` and `expected` differ by at most `tolerance` everywhere.
///
/// On CUDA the tolerance is at least [`CUDA_TF32_RELATIVE`] of the largest expected
/// magnitude (Burn's TF32 matrix products); on every other device it is `tolerance`.
pub fn assert_close<const D: usize>(
    actual: Tensor<D>,
    expected: Tensor<D>,
    tolerance: f32,
    what: &str,
) {
    let device = format!("{:?}", actual.device());
    let relative = matmul_relative_rounding(&actual.device());
    let tolerance = if relative > 0.0 {
        tolerance.max(relative * expected.clone().abs().max().into_scalar::<f32>())
    } else {
        tolerance
    };
    let diff = max_abs_diff(actual, expected);
    assert!(
        diff <= tolerance,
        "{what} on {device}: max abs error {diff:e} exceeds {tolerance:e}"
    );
}

/// Tensors written by `tools/make_fixtures.py`, loaded from
/// `burn-transformer/tests/fixtures/<name>.safetensors`.
pub struct Fixture {
    name: String,
    tensors: HashMap<String, TensorData>,
}

impl Fixture {
    /// Loads a fixture file.
    ///
    /// # Panics
    /// If the file is missing or malformed (run `tools/make_fixtures.py`).
    pub fn load(name: &str) -> Self {
        let path = fixture_dir().join(format!("{name}.safetensors"));
        let bytes = std::fs::read(&path).unwrap_or_else(|error| {
            panic!(
                "fixture {}: {error} (regenerate with tools/make_fixtures.py)",
                path.display()
            )
        });
        let file = safetensors::SafeTensors::deserialize(&bytes)
            .unwrap_or_else(|error| panic!("fixture {}: {error}", path.display()));
        let mut tensors = HashMap::new();
        for (key, view) in file.tensors() {
            let shape: Vec<usize> = view.shape().to_vec();
            let data = match view.dtype() {
                safetensors::Dtype::F32 => {
                    let values: Vec<f32> = view
                        .data()
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect();
                    TensorData::new(values, shape)
                }
                safetensors::Dtype::I64 => {
                    let values: Vec<i64> = view
                        .data()
                        .chunks_exact(8)
                        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
                        .collect();
                    TensorData::new(values, shape)
                }
                safetensors::Dtype::BOOL | safetensors::Dtype::U8 => {
                    let values: Vec<bool> = view.data().iter().map(|b| *b != 0).collect();
                    TensorData::new(values, shape)
                }
                other => panic!("fixture {name}: tensor {key} has unsupported dtype {other:?}"),
            };
            tensors.insert(key, data);
        }
        Self {
            name: name.to_string(),
            tensors,
        }
    }

    /// The raw data of one tensor.
    pub fn data(&self, key: &str) -> TensorData {
        self.tensors
            .get(key)
            .unwrap_or_else(|| {
                let mut keys: Vec<_> = self.tensors.keys().collect();
                keys.sort();
                panic!("fixture {}: no tensor `{key}` (has {keys:?})", self.name)
            })
            .clone()
    }

    /// Whether the fixture holds `key`.
    pub fn contains(&self, key: &str) -> bool {
        self.tensors.contains_key(key)
    }

    /// One float tensor on `device`.
    pub fn tensor<const D: usize>(&self, key: &str, device: &Device) -> Tensor<D> {
        let data = self.data(key);
        assert_eq!(
            data.shape().len(),
            D,
            "fixture {}: `{key}` has rank {}",
            self.name,
            data.shape().len()
        );
        Tensor::from_data(data, device)
    }

    /// A burn `Linear` holding a PyTorch `nn.Linear`'s `<prefix>.weight` (`[out, in]`,
    /// transposed to burn's `[in, out]`) and `<prefix>.bias`, if present.
    pub fn linear(&self, prefix: &str, device: &Device) -> burn::nn::Linear {
        let weight = self.tensor::<2>(&format!("{prefix}.weight"), device);
        let [d_output, d_input] = weight.dims();
        let bias_key = format!("{prefix}.bias");
        let mut linear = burn::nn::LinearConfig::new(d_input, d_output)
            .with_bias(self.contains(&bias_key))
            .init(device);
        linear.weight = burn::module::Param::from_tensor(weight.transpose());
        if self.contains(&bias_key) {
            linear.bias = Some(burn::module::Param::from_tensor(
                self.tensor(&bias_key, device),
            ));
        }
        linear
    }

    /// A scalar stored as a 0-d or 1-element tensor.
    pub fn scalar(&self, key: &str) -> f32 {
        self.data(key).convert::<f32>().try_to_vec::<f32>().unwrap()[0]
    }

    /// All keys starting with `prefix`, sorted.
    pub fn keys_with_prefix(&self, prefix: &str) -> Vec<String> {
        let mut keys: Vec<String> = self
            .tensors
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect();
        keys.sort();
        keys
    }
}

/// `burn-transformer/tests/fixtures`.
///
/// The crate folder this binary was compiled from, or, where that is gone, the one cargo
/// names when it runs the tests: a target directory shared between clones (`.ci/run`
/// keeps one outside the clone) can hold a test binary compiled in a clone since deleted.
pub fn fixture_dir() -> PathBuf {
    let compiled = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let crate_dir = match std::env::var_os("CARGO_MANIFEST_DIR") {
        Some(running) if !compiled.exists() => PathBuf::from(running),
        _ => compiled,
    };
    crate_dir.join("tests").join("fixtures")
}
