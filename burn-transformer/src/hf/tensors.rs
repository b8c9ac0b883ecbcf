//! A model's parameters in Hugging Face's layout (torch `[out, in]` linear weights),
//! by our parameter path, and safetensors files written from them.

use std::collections::HashMap;
use std::path::Path;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{DType, Tensor, TensorData};

use super::error::HfError;
use crate::io::write_atomically;
use crate::module_path::ParamPath;

/// One parameter, read back to the host.
#[derive(Clone, Default)]
pub(crate) struct HostTensor {
    /// Row-major values.
    pub values: Vec<f32>,
    /// Its shape, in Hugging Face's layout.
    pub shape: Vec<usize>,
}

impl HostTensor {
    fn from_data(data: TensorData) -> Self {
        let shape = data.shape().to_vec();
        let values = data
            .convert::<f32>()
            .try_into_vec::<f32>()
            .expect("float data converts to f32");
        Self { values, shape }
    }
}

/// Every float parameter of `module` by path (enum variants left out; adapters under
/// `….weight.lora.a` / `.b`), in the order the module visits them. Linear weights and
/// adapter factors are transposed to torch's layout (`[out, in]`; PEFT's `lora_A`
/// `[rank, in]`, `lora_B` `[out, rank]`).
pub(crate) fn host_parameters<M: Module>(module: &M) -> Vec<(String, HostTensor)> {
    let mut collect = Collect::default();
    module.visit(&mut collect);
    collect.tensors
}

#[derive(Default)]
struct Collect {
    path: ParamPath,
    tensors: Vec<(String, HostTensor)>,
}

impl ModuleVisitor for Collect {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.path.enter(name, container_type);
    }

    fn exit_module(&mut self, _name: &str, container_type: &str) {
        self.path.exit(container_type);
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let path = self.path.joined();
        let factor = path.ends_with(".lora.a") || path.ends_with(".lora.b");
        let value = param.val();
        let value = if D == 2 && (self.path.is_linear_weight() || factor) {
            value.transpose()
        } else {
            value
        };
        self.tensors
            .push((path, HostTensor::from_data(value.into_data())));
    }
}

/// The bytes of `values` in `dtype` (f32, bf16 or f16), little-endian.
pub(crate) fn encode(values: &[f32], dtype: DType) -> Vec<u8> {
    match dtype {
        DType::BF16 => values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        DType::F16 => values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// The safetensors name of `dtype`.
pub(crate) fn safetensors_dtype(dtype: DType) -> safetensors::Dtype {
    match dtype {
        DType::BF16 => safetensors::Dtype::BF16,
        DType::F16 => safetensors::Dtype::F16,
        _ => safetensors::Dtype::F32,
    }
}

/// Writes `tensors` (key, shape, bytes in `dtype`) as one safetensors file at `path`,
/// atomically, with the `{"format": "pt"}` metadata transformers checks for.
pub(crate) fn write_safetensors(
    path: &Path,
    tensors: &[(String, Vec<usize>, Vec<u8>)],
    dtype: DType,
) -> Result<(), HfError> {
    let views = tensors
        .iter()
        .map(|(key, shape, bytes)| {
            safetensors::tensor::TensorView::new(safetensors_dtype(dtype), shape.clone(), bytes)
                .map(|view| (key.clone(), view))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| HfError::Safetensors {
            path: path.to_path_buf(),
            message: error.to_string(),
        })?;
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    let bytes =
        safetensors::serialize(views, Some(metadata)).map_err(|error| HfError::Safetensors {
            path: path.to_path_buf(),
            message: error.to_string(),
        })?;
    write_atomically(path, bytes).map_err(|error| HfError::Write {
        path: path.to_path_buf(),
        message: error.to_string(),
    })
}

/// Reads every tensor of a safetensors file as f32 (from f32, bf16 or f16).
pub(crate) fn read_safetensors(path: &Path) -> Result<Vec<(String, HostTensor)>, HfError> {
    let bytes = std::fs::read(path).map_err(|source| HfError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let error = |message: String| HfError::Safetensors {
        path: path.to_path_buf(),
        message,
    };
    let file = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| error(e.to_string()))?;
    let mut tensors = Vec::new();
    for (key, view) in file.tensors() {
        let data = view.data();
        let values: Vec<f32> = match view.dtype() {
            safetensors::Dtype::F32 => data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            safetensors::Dtype::BF16 => data
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            safetensors::Dtype::F16 => data
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(error(format!(
                    "tensor `{key}` has dtype {other:?}, expected f32, bf16 or f16"
                )));
            }
        };
        let shape = view.shape().to_vec();
        tensors.push((key, HostTensor { values, shape }));
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(tensors)
}
