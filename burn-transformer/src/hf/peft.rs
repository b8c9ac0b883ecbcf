//! LoRA adapters in PEFT's layout: `adapter_config.json` and
//! `adapter_model.safetensors` with keys
//! `base_model.model.<checkpoint key of the layer>.lora_A.weight` `[rank, in]` and
//! `….lora_B.weight` `[out, rank]`, so that adapters trained here load in PEFT and
//! PEFT's adapters load here.

use std::collections::BTreeMap;
use std::path::Path;

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{DType, Tensor, TensorData};
use serde_json::{Value, json};

use super::checkpoint::{
    KeyAction, KeyMap, causal_lm_key_map, fused_layer_parts, our_layer_name, own_names,
};
use super::config::HfConfig;
use super::error::HfError;
use super::tensors::{HostTensor, encode, host_parameters, read_safetensors, write_safetensors};
use crate::io::{read_text, write_atomically};
use crate::lora::{LORA_TARGETS, LoraConfig, LoraSummary, attach_lora};
use crate::model::CausalLm;
use crate::module_path::ParamPath;

/// PEFT's adapter configuration file.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// PEFT's adapter weights file.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// The prefix PEFT's `PeftModelForCausalLM` puts before the base model's keys.
const PEFT_PREFIX: &str = "base_model.model.";

/// Saves the LoRA adapters of `model` (attached with `lora`) into `dir` in PEFT's
/// layout, named by the checkpoint keys of `config`'s family; `base_model` goes to
/// `base_model_name_or_path`. Files are written under temporary names and renamed.
///
/// # Errors
/// [`HfError::Unsupported`] when the model has no adapters; [`HfError::Write`].
pub fn save_peft_adapters(
    model: &CausalLm,
    lora: &LoraConfig,
    config: &HfConfig,
    base_model: &str,
    dir: &Path,
) -> Result<usize, HfError> {
    let keys = causal_lm_key_map(config);
    let own = own_names(config);
    let mut tensors = Vec::new();
    let mut targets: Vec<String> = Vec::new();
    for (path, tensor) in host_parameters(model) {
        let (weight, factor) = match path.rsplit_once(".lora.") {
            Some((weight, "a")) => (weight, "lora_A"),
            Some((weight, "b")) => (weight, "lora_B"),
            _ => continue,
        };
        let layer = keys.checkpoint_key(weight);
        if let Some((fused, _, _)) = keys.fused(&layer) {
            return Err(HfError::Unsupported {
                what: dir.display().to_string(),
                reason: format!(
                    "{} checkpoints store `{layer}` fused into `{fused}`, which PEFT adapts \
                     as one layer: adapters of the separate projections would not apply \
                     to it; save the merged model instead (export-hf without \
                     --adapters-only), or train adapters on other layers only",
                    config.model_type
                ),
            });
        }
        let layer = layer.strip_suffix(".weight").unwrap_or(&layer);
        let name = match own {
            Some(names) => names.peft_target(layer),
            None => layer.rsplit('.').next().unwrap_or(layer).to_string(),
        };
        if !targets.contains(&name) {
            targets.push(name);
        }
        let key = format!("{PEFT_PREFIX}{layer}.{factor}.weight");
        tensors.push((key, tensor.shape, encode(&tensor.values, DType::F32)));
    }
    if tensors.is_empty() {
        return Err(HfError::Unsupported {
            what: dir.display().to_string(),
            reason: "the model has no LoRA adapters to save".into(),
        });
    }
    targets.sort();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let adapter_config = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "use_rslora": lora.rslora,
        "target_modules": targets,
        "bias": "none",
        // GPT-2's layers are `Conv1D`s, stored `[in, out]` (the factors keep
        // `nn.Linear`'s layout all the same).
        "fan_in_fan_out": config.model_type == "gpt2",
        "init_lora_weights": true,
        "inference_mode": true,
        "modules_to_save": null,
        "rank_pattern": {},
        "alpha_pattern": {},
        "use_dora": false,
    });
    let path = dir.join(ADAPTER_CONFIG_FILE);
    let text = serde_json::to_string_pretty(&adapter_config).expect("JSON values serialize");
    write_atomically(&path, format!("{text}\n")).map_err(|error| HfError::Write {
        path: path.clone(),
        message: error.to_string(),
    })?;
    write_safetensors(&dir.join(ADAPTER_WEIGHTS_FILE), &tensors, DType::F32)?;
    Ok(tensors.len() / 2)
}

/// Reads PEFT's `adapter_config.json` in `dir` as a [`LoraConfig`] for a model of
/// `config`'s family: its targets in our layer names (Phi's `dense` is our `o_proj`,
/// Phi-3's fused `qkv_proj` and GPT-2's `c_attn` the three projections they hold,
/// GPT-2's `c_proj` its attention's `o_proj` and its feed-forward's `fc2`).
///
/// # Errors
/// [`HfError`] naming the file and the key: not a LoRA adapter (`peft_type`),
/// missing `r` or `lora_alpha`, or a PEFT feature this crate does not implement
/// (DoRA, per-layer ranks or alphas, `fan_in_fan_out` outside GPT-2, trained biases, adapted
/// expert parameters (`target_parameters`), extra trained modules, regex targets,
/// targets that are not linear layers of our models).
pub fn read_peft_config(dir: &Path, config: &HfConfig) -> Result<LoraConfig, HfError> {
    let path = dir.join(ADAPTER_CONFIG_FILE);
    let text = read_text(&path).map_err(|error| HfError::Io {
        path: path.clone(),
        source: std::io::Error::other(error.to_string()),
    })?;
    let value: Value = serde_json::from_str(&text).map_err(|source| HfError::Json {
        path: path.clone(),
        source,
    })?;
    let unsupported = |key: &str, reason: String| HfError::Unsupported {
        what: format!("{}: `{key}`", path.display()),
        reason,
    };
    let get = |key: &str| value.get(key).filter(|v| !v.is_null());
    match get("peft_type").and_then(Value::as_str) {
        Some("LORA") => {}
        other => {
            return Err(unsupported(
                "peft_type",
                format!("{other:?}: only LoRA adapters (\"LORA\") load here"),
            ));
        }
    }
    let rank = get("r")
        .and_then(Value::as_u64)
        .ok_or_else(|| unsupported("r", "missing or not a positive integer".into()))?;
    let alpha = get("lora_alpha")
        .and_then(Value::as_f64)
        .ok_or_else(|| unsupported("lora_alpha", "missing or not a number".into()))?;
    let dropout = get("lora_dropout").and_then(Value::as_f64).unwrap_or(0.0);
    let flag = |key: &str| get(key).and_then(Value::as_bool).unwrap_or(false);
    let empty = |key: &str| match get(key) {
        None => true,
        Some(Value::Object(map)) => map.is_empty(),
        Some(Value::Array(list)) => list.is_empty(),
        Some(_) => false,
    };
    for key in ["use_dora", "fan_in_fan_out", "lora_bias"] {
        // PEFT sets `fan_in_fan_out` for GPT-2's `Conv1D` layers; it changes how a
        // merge transposes, not the factors' layout.
        if key == "fan_in_fan_out" && config.model_type == "gpt2" {
            continue;
        }
        if flag(key) {
            return Err(unsupported(key, "is true: not implemented here".into()));
        }
    }
    for key in [
        "rank_pattern",
        "alpha_pattern",
        "modules_to_save",
        "layers_to_transform",
        "target_parameters",
        "trainable_token_indices",
    ] {
        if !empty(key) {
            let reason = match key {
                "target_parameters" => "adapts parameters that are not linear layers (fused \
                    MoE experts); only adapters on linear layers load here"
                    .to_string(),
                _ => "is set: only one rank and alpha for every adapted linear layer, and \
                      no other trained modules, load here"
                    .to_string(),
            };
            return Err(unsupported(key, reason));
        }
    }
    if let Some(bias) = get("bias").and_then(Value::as_str)
        && bias != "none"
    {
        return Err(unsupported(
            "bias",
            format!("\"{bias}\": only \"none\" loads here"),
        ));
    }
    let targets: Vec<String> = match get("target_modules") {
        // PEFT matches a module whose path is a name or ends with `.name`, and saves
        // `"all-linear"` as the full paths it resolved to (`model.layers.0.mlp.down_proj`,
        // …): a path counts as its last name. A path list that leaves out some layers'
        // projections then fails on those layers' missing tensors, naming one.
        Some(Value::Array(names)) => {
            let mut targets: Vec<String> = Vec::new();
            for name in names {
                let name = name
                    .as_str()
                    .ok_or_else(|| unsupported("target_modules", "not a list of names".into()))?;
                let leaf = name.rsplit('.').next().unwrap_or(name);
                // A fused layer (Phi-3's `qkv_proj`, GPT-2's `c_attn`) is adapted as the
                // projections it holds: each with the same `A` and its own rows of `B`.
                // Families with names of their own name our layers by their paths.
                let own_layers = own_names(config)
                    .map(|names| names.adapted_layers(name))
                    .filter(|layers| !layers.is_empty());
                let leaves = match own_layers {
                    Some(layers) => layers,
                    None => fused_layer_parts(leaf).unwrap_or_else(|| vec![leaf]),
                };
                for leaf in leaves {
                    let ours = our_layer_name(config, leaf);
                    if !targets.contains(&ours) {
                        targets.push(ours);
                    }
                }
            }
            // In one order whatever the file's names (a saved adapter reads back equal).
            targets.sort();
            targets
        }
        Some(Value::String(name)) if name == "all-linear" => crate::lora::default_lora_targets(),
        Some(other) => {
            return Err(unsupported(
                "target_modules",
                format!(
                    "{other}: give a list of layer names ({})",
                    LORA_TARGETS.join(", ")
                ),
            ));
        }
        None => return Err(unsupported("target_modules", "missing".into())),
    };
    let lora = LoraConfig::new(rank as usize, alpha)
        .with_dropout(dropout)
        .with_targets(targets)
        .with_rslora(flag("use_rslora"));
    lora.validate()
        .map_err(|source| HfError::Config { path, source })?;
    Ok(lora)
}

/// Attaches the PEFT adapters in `dir` to `model` (a model of `config`'s family,
/// without adapters) and loads their weights.
///
/// # Errors
/// The errors of [`read_peft_config`]; [`HfError::UnexpectedTensor`] for an adapter
/// tensor of a layer the model does not adapt, [`HfError::MissingTensor`] for an
/// adapted layer without its tensors, [`HfError::ShapeMismatch`] for a wrong shape.
pub fn load_peft_adapters(
    model: CausalLm,
    config: &HfConfig,
    dir: &Path,
) -> Result<(CausalLm, LoraConfig, LoraSummary), HfError> {
    let lora = read_peft_config(dir, config)?;
    let file = dir.join(ADAPTER_WEIGHTS_FILE);
    let tensors = read_safetensors(&file)?;
    let (model, summary) = attach_lora(model, &lora).map_err(|source| HfError::Config {
        path: dir.join(ADAPTER_CONFIG_FILE),
        source,
    })?;
    let keys = causal_lm_key_map(config);
    let expected: BTreeMap<String, (Vec<usize>, Vec<usize>)> = host_parameters(&model)
        .into_iter()
        .filter(|(path, _)| path.ends_with(".lora.a") || path.ends_with(".lora.b"))
        .map(|(path, tensor)| (path, (tensor.shape.clone(), Vec::new())))
        .collect();
    let mut values: BTreeMap<String, HostTensor> = BTreeMap::new();
    for (key, tensor) in tensors {
        let unexpected = || HfError::UnexpectedTensor {
            file: file.clone(),
            key: key.clone(),
            found: tensor.shape.clone(),
            model_type: config.model_type.clone(),
            others: 0,
        };
        let (layer, factor) = match key
            .strip_prefix(PEFT_PREFIX)
            .and_then(|rest| rest.strip_suffix(".weight"))
            .and_then(|rest| rest.rsplit_once('.'))
        {
            Some((layer, "lora_A")) => (layer, "a"),
            Some((layer, "lora_B")) => (layer, "b"),
            _ => return Err(unexpected()),
        };
        let weight = format!("{layer}.weight");
        // GPT-NeoX's and Falcon's fused layer holds its blocks' rows group by group.
        let fused_heads = keys.fused_heads(&weight);
        let blocks = keys.split(&weight).unwrap_or_else(|| {
            let rows = tensor.shape.first().copied().unwrap_or(0);
            vec![(weight, rows)]
        });
        let rank = tensor.shape.get(1).copied().unwrap_or(0);
        let mut start = 0;
        for (block, rows) in blocks {
            let path = match keys.action(&block) {
                KeyAction::Load(path) => format!("{path}.lora.{factor}"),
                KeyAction::Ignore => return Err(unexpected()),
            };
            let Some((shape, _)) = expected.get(&path) else {
                return Err(unexpected());
            };
            // `A` is shared by the blocks; `B` has each block's rows.
            let source_row = |row: usize| fused_heads.map_or(row, |fused| fused.fused_row(row));
            let part = match factor {
                "a" => tensor.clone(),
                _ => HostTensor {
                    values: (start..start + rows)
                        .flat_map(|row| {
                            let from = source_row(row) * rank;
                            tensor.values.get(from..from + rank).unwrap_or_default()
                        })
                        .copied()
                        .collect(),
                    shape: vec![rows, rank],
                },
            };
            start += rows;
            if *shape != part.shape {
                return Err(HfError::ShapeMismatch {
                    file: file.clone(),
                    key,
                    expected: shape.clone(),
                    found: tensor.shape,
                    others: 0,
                });
            }
            values.insert(path, part);
        }
    }
    if let Some((path, (shape, _))) = expected
        .iter()
        .find(|(path, _)| !values.contains_key(*path))
    {
        let (weight, factor) = path.rsplit_once(".lora.").expect("an adapter path");
        let layer = keys.checkpoint_key(weight);
        let layer = layer.strip_suffix(".weight").unwrap_or(&layer);
        let factor = if factor == "a" { "lora_A" } else { "lora_B" };
        return Err(HfError::MissingTensor {
            dir: dir.to_path_buf(),
            key: format!("{PEFT_PREFIX}{layer}.{factor}.weight"),
            expected: shape.clone(),
            others: expected.len() - values.len() - 1,
        });
    }
    let model = model.map(&mut SetFactors {
        path: ParamPath::default(),
        values,
    });
    Ok((model, lora, summary))
}

/// Replaces adapter factors by path with loaded values (torch layout, transposed
/// back to ours).
struct SetFactors {
    path: ParamPath,
    values: BTreeMap<String, HostTensor>,
}

impl ModuleMapper for SetFactors {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.path.enter(name, container_type);
    }

    fn exit_module(&mut self, _name: &str, container_type: &str) {
        self.path.exit(container_type);
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let Some(tensor) = self.values.remove(&self.path.joined()) else {
            return param;
        };
        param.map(|value| {
            let data = TensorData::new(tensor.values, tensor.shape);
            let loaded = Tensor::<D>::from_data(data, (&value.device(), value.dtype()));
            loaded.transpose().set_require_grad(value.is_require_grad())
        })
    }
}
