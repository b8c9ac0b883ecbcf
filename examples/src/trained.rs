//! The model folders the programs run: a Hugging Face model (`config.json` beside
//! safetensors weights) or the folder of a `train-lm` run (`run.json`, `model.bpk` and
//! the tokenizer the run trained with).
//!
//! A folder is opened in two steps, so that a program refuses a wrong folder before it
//! loads anything: [`ModelFolder::open`] reads what kind of folder it is and its
//! settings, [`ModelFolder::load`] the weights.

use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{DType, Device, Tensor};
use burn_transformer::hf::{
    CONFIG_FILE, GENERATION_CONFIG_FILE, HfGenerationConfig, LoadOptions, LoadReport,
    load_causal_lm_with, non_finite_parameters, read_generation_config,
};
use burn_transformer::io::{read_bytes, read_text};
use burn_transformer::lora::{LoraConfig, attach_lora};
use burn_transformer::model::{CausalLm, CausalLmConfig};
use burn_transformer::train::{ByteTokenizer, CharTokenizer, Tokenizer, TrainError, load_module};
use serde_json::Value;

use crate::hf_tokenizer::HfTokenizer;
use crate::run::RUN_FILE;

/// The trained weights of a run, as `train-lm` saves them at the end.
const RUN_WEIGHTS: &str = "model.bpk";
/// A run's character vocabulary (`train-lm` without `--tokenizer`).
const RUN_VOCABULARY: &str = "vocab.json";
/// A run's copy of its `--tokenizer`, and a Hugging Face model's tokenizer.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// A fine-tuning run's copy of its base model's `config.json` (`train-lm
/// --init-from`), under another name so that the run folder is not taken for a
/// Hugging Face model.
pub const BASE_CONFIG_FILE: &str = "hf-config.json";
/// The base model's other files a fine-tuning run keeps for its export.
pub const BASE_EXTRA_FILES: [&str; 3] = [
    "tokenizer_config.json",
    "special_tokens_map.json",
    GENERATION_CONFIG_FILE,
];

/// A model folder whose kind and settings are known, its weights not yet loaded.
#[derive(Debug, Clone)]
pub enum ModelFolder {
    /// A Hugging Face model: `config.json` and `model.safetensors` (or a sharded
    /// index).
    HuggingFace(PathBuf),
    /// A `train-lm` run.
    Run(Box<RunFolder>),
}

/// The folder of a finished `train-lm` run.
#[derive(Debug, Clone)]
pub struct RunFolder {
    dir: PathBuf,
    /// The model's configuration (`run.json`'s `model`).
    config: CausalLmConfig,
    /// The window the model was trained on (`run.json`'s `training.context`).
    context: Option<usize>,
    /// The run's tokenizer file: `vocab.json` or `tokenizer.json`; `None` for a run
    /// on bytes (`--tokenizer bytes`), which needs no file.
    tokenizer: Option<PathBuf>,
    /// The LoRA adapters the run trained (`run.json`'s `lora`), if any.
    lora: Option<LoraConfig>,
}

/// A loaded model with what generation needs to know about it.
#[derive(Debug)]
pub struct LoadedModel {
    /// The model.
    pub model: CausalLm,
    /// Tokens that end a continuation: a Hugging Face model's `config.json`
    /// `eos_token_id`s; none for a run (its vocabulary has no end-of-text token). See
    /// [`LoadedModel::stop_and_pad_tokens`] for the ones generation uses.
    pub stop_tokens: Vec<u32>,
    /// A Hugging Face model's `config.json` `pad_token_id`.
    pub pad_token: Option<u32>,
    /// The most tokens each prediction should see: a run's training window (the
    /// model never saw more); `None` for Hugging Face models.
    pub max_context: Option<usize>,
}

impl LoadedModel {
    /// The tokens generation stops at and pads with: those of the model's
    /// `generation_config.json` (`file`), which transformers' `generate` uses, else
    /// [`LoadedModel::stop_tokens`] and [`LoadedModel::pad_token`]; padding falls back
    /// to the first stop token, then 0.
    pub fn stop_and_pad_tokens(&self, file: Option<&HfGenerationConfig>) -> (Vec<u32>, u32) {
        let stop_tokens = file
            .and_then(|file| file.eos_token_ids.clone())
            .unwrap_or_else(|| self.stop_tokens.clone());
        let pad_token = file
            .and_then(|file| file.pad_token_id)
            .or(self.pad_token)
            .or(stop_tokens.first().copied())
            .unwrap_or(0);
        (stop_tokens, pad_token)
    }
}

impl ModelFolder {
    /// Reads what kind of model folder `dir` is, and its settings.
    ///
    /// # Errors
    /// A message saying what the folder should hold; for a run, that it is not a
    /// language model's run, has not finished training, or lacks its tokenizer.
    pub fn open(dir: &Path) -> Result<Self, String> {
        if !dir.is_dir() {
            return Err(format!("{}: no such model folder", dir.display()));
        }
        if dir.join(CONFIG_FILE).is_file() {
            Ok(Self::HuggingFace(dir.to_path_buf()))
        } else if dir.join(RUN_FILE).is_file() {
            RunFolder::open(dir).map(|run| Self::Run(Box::new(run)))
        } else {
            Err(format!(
                "{} is not a model folder: expected a Hugging Face model ({CONFIG_FILE} and \
                 model.safetensors) or a train-lm run ({RUN_FILE}, {RUN_WEIGHTS} and \
                 {RUN_VOCABULARY} or {TOKENIZER_FILE})",
                dir.display()
            ))
        }
    }

    /// The decoding settings of a Hugging Face model's `generation_config.json`, with a
    /// warning on stderr for each setting it holds that decoding does not apply;
    /// `None` for a Hugging Face model without the file and for a run.
    ///
    /// # Errors
    /// A message naming the file and the key that is not valid.
    pub fn generation_config(&self) -> Result<Option<HfGenerationConfig>, String> {
        let Self::HuggingFace(dir) = self else {
            return Ok(None);
        };
        let config = read_generation_config(dir).map_err(|error| error.to_string())?;
        for note in config.iter().flat_map(|config| &config.unapplied_keys) {
            eprintln!(
                "warning: {}: {note}",
                dir.join(GENERATION_CONFIG_FILE).display()
            );
        }
        Ok(config)
    }

    /// Loads the model on `device` with parameters of type `dtype`, printing a warning
    /// on stderr that names the tensors holding NaN or infinite values.
    ///
    /// # Errors
    /// A message naming the file that could not be loaded.
    pub fn load(&self, device: &Device, dtype: DType) -> Result<LoadedModel, String> {
        let (loaded, report, dir) = match self {
            Self::HuggingFace(dir) => {
                let options = LoadOptions::default().with_dtype(dtype);
                let (model, config, report) =
                    load_causal_lm_with(dir, device, &options).map_err(|e| e.to_string())?;
                for note in &config.unread_keys {
                    eprintln!("warning: {}: {note}", dir.join(CONFIG_FILE).display());
                }
                let loaded = LoadedModel {
                    model,
                    stop_tokens: config.eos_token_ids,
                    pad_token: config.pad_token_id,
                    max_context: None,
                };
                (loaded, report, dir)
            }
            Self::Run(run) => {
                let (model, report) = run.load(device, dtype)?;
                let loaded = LoadedModel {
                    model,
                    stop_tokens: Vec::new(),
                    pad_token: None,
                    max_context: run.context,
                };
                (loaded, report, &run.dir)
            }
        };
        if let Some(warning) = report.warning() {
            eprintln!("warning: {}: {warning}", dir.display());
        }
        Ok(loaded)
    }

    /// The tokenizer of the model: a Hugging Face model's `tokenizer.json` (or
    /// `path`), a run's own tokenizer.
    ///
    /// # Errors
    /// A message naming the file that is missing or not a tokenizer, or saying that a
    /// run takes no other tokenizer than its own.
    pub fn tokenizer(&self, path: Option<&Path>) -> Result<TextTokenizer, String> {
        match self {
            Self::HuggingFace(dir) => {
                let path = path.map_or_else(|| dir.join(TOKENIZER_FILE), Path::to_path_buf);
                let bytes = read_bytes(&path).map_err(|e| e.to_string())?;
                let tokenizer = tokenizers::Tokenizer::from_bytes(bytes).map_err(|error| {
                    format!("{}: not a tokenizer.json: {error}", path.display())
                })?;
                Ok(TextTokenizer::HuggingFace(Box::new(tokenizer)))
            }
            Self::Run(run) => match path {
                Some(path) => Err(format!(
                    "--tokenizer {}: a train-lm run uses the tokenizer it was trained with \
                     ({})",
                    path.display(),
                    run.tokenizer
                        .as_ref()
                        .map_or_else(|| "bytes".into(), |file| file.display().to_string())
                )),
                None => run.tokenizer().map(TextTokenizer::Run),
            },
        }
    }
}

impl RunFolder {
    /// Reads the settings of the run in `dir` and checks that it finished.
    fn open(dir: &Path) -> Result<Self, String> {
        let path = dir.join(RUN_FILE);
        let text = read_text(&path).map_err(|e| e.to_string())?;
        let settings: Value = serde_json::from_str(&text)
            .map_err(|e| format!("{}: not a run file: {e}", path.display()))?;
        // train-seq2seq's settings name its task; its model is an encoder-decoder.
        let seq2seq = settings.get("task").is_some()
            || settings.pointer("/args/task").is_some()
            || settings.pointer("/model/n_encoder_layers").is_some();
        if seq2seq {
            return Err(format!(
                "{} holds a train-seq2seq run, an encoder-decoder: not a language model \
                 (a train-lm run or a Hugging Face model)",
                dir.display()
            ));
        }
        let model = settings.get("model").ok_or_else(|| {
            format!(
                "{}: no `model` (the model's configuration, which train-lm writes)",
                path.display()
            )
        })?;
        let config: CausalLmConfig =
            serde_json::from_value(current_model_keys(model)).map_err(|e| {
                format!(
                    "{}: `model` is not a language model's configuration: {e}",
                    path.display()
                )
            })?;
        config
            .validate()
            .map_err(|e| format!("{}: `model`: {e}", path.display()))?;
        let lora = match settings.get("lora").filter(|lora| !lora.is_null()) {
            Some(lora) => Some(serde_json::from_value::<LoraConfig>(lora.clone()).map_err(
                |e| {
                    format!(
                        "{}: `lora` is not a LoRA configuration: {e}",
                        path.display()
                    )
                },
            )?),
            None => None,
        };
        let context = settings
            .pointer("/training/context")
            .and_then(Value::as_u64)
            .and_then(|context| usize::try_from(context).ok());

        if !dir.join(RUN_WEIGHTS).is_file() {
            return Err(format!(
                "{}: no {RUN_WEIGHTS}: the run has not finished training (`train-lm \
                 --resume --out {}` finishes it)",
                dir.display(),
                dir.display()
            ));
        }
        let on_bytes = settings.pointer("/args/tokenizer").and_then(Value::as_str) == Some("bytes");
        let tokenizer = [RUN_VOCABULARY, TOKENIZER_FILE]
            .into_iter()
            .map(|name| dir.join(name))
            .find(|path| path.is_file());
        let tokenizer = match (tokenizer, on_bytes) {
            (_, true) => None,
            (Some(path), false) => Some(path),
            (None, false) => {
                return Err(format!(
                    "{}: no tokenizer: a train-lm run holds {RUN_VOCABULARY} (its characters) \
                     or {TOKENIZER_FILE} (its --tokenizer)",
                    dir.display()
                ));
            }
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            config,
            context,
            tokenizer,
            lora,
        })
    }

    /// The run's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The model's configuration.
    pub fn config(&self) -> &CausalLmConfig {
        &self.config
    }

    /// The LoRA adapters the run trained, if any.
    pub fn lora(&self) -> Option<&LoraConfig> {
        self.lora.as_ref()
    }

    /// The run's tokenizer file (`vocab.json` or `tokenizer.json`); `None` for a run
    /// on bytes.
    pub fn tokenizer_file(&self) -> Option<&Path> {
        self.tokenizer.as_deref()
    }

    /// The trained model with its adapters unmerged, in f32.
    ///
    /// # Errors
    /// A message naming the file that could not be loaded.
    pub fn load_unmerged(&self, device: &Device) -> Result<CausalLm, String> {
        let path = self.dir.join(RUN_FILE);
        let model = self
            .config
            .try_init(device)
            .map_err(|e| format!("{}: `model`: {e}", path.display()))?;
        // The adapters' values come from the weights file.
        let model = match &self.lora {
            Some(lora) => {
                attach_lora(model, lora)
                    .map_err(|e| format!("{}: `lora`: {e}", path.display()))?
                    .0
            }
            None => model,
        };
        load_module(model, &self.dir.join(RUN_WEIGHTS)).map_err(|e| e.to_string())
    }

    /// The trained model in `dtype`, and its non-finite parameters.
    fn load(&self, device: &Device, dtype: DType) -> Result<(CausalLm, LoadReport), String> {
        // Adapters are merged: generation runs the plain weights.
        let model = self.load_unmerged(device)?.materialize();
        // Runs are saved in f32; a narrower type is a conversion after loading.
        let model = if dtype == DType::F32 {
            model
        } else {
            model.map(&mut CastFloats(dtype))
        };
        let report = LoadReport {
            non_finite: non_finite_parameters(&model),
        };
        Ok((model, report))
    }

    /// The run's tokenizer.
    fn tokenizer(&self) -> Result<Box<dyn Tokenizer>, String> {
        let tokenizer: Box<dyn Tokenizer> = match &self.tokenizer {
            None => Box::new(ByteTokenizer),
            Some(path) if path.ends_with(RUN_VOCABULARY) => {
                Box::new(CharTokenizer::load(path).map_err(|e| e.to_string())?)
            }
            Some(path) => Box::new(HfTokenizer::load(path).map_err(|e| e.to_string())?),
        };
        Ok(tokenizer)
    }
}

/// Converts every float parameter to one type.
struct CastFloats(DType);

impl ModuleMapper for CastFloats {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let dtype = self.0;
        param.map(|tensor| tensor.cast(dtype))
    }
}

/// Text to token ids and back, as the model's own tooling does it.
pub enum TextTokenizer {
    /// A Hugging Face model's tokenizer: the prompt gets the special tokens the
    /// tokenizer adds (a BOS token) and the output is decoded without them, as
    /// transformers' pipelines do.
    HuggingFace(Box<tokenizers::Tokenizer>),
    /// The tokenizer a run trained with, used as in training (no special tokens).
    Run(Box<dyn Tokenizer>),
}

impl TextTokenizer {
    /// The ids of `text`.
    ///
    /// # Errors
    /// The tokenizer's message, e.g. a character outside a run's vocabulary.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        match self {
            Self::HuggingFace(tokenizer) => tokenizer
                .encode(text, true)
                .map(|encoding| encoding.get_ids().to_vec())
                .map_err(|error| error.to_string()),
            Self::Run(tokenizer) => tokenizer.encode(text).map_err(|error| match error {
                TrainError::Tokenizer(message) => message,
                other => other.to_string(),
            }),
        }
    }

    /// The text of `tokens`.
    ///
    /// # Errors
    /// The tokenizer's message.
    pub fn decode(&self, tokens: &[u32]) -> Result<String, String> {
        match self {
            Self::HuggingFace(tokenizer) => tokenizer
                .decode(tokens, true)
                .map_err(|error| error.to_string()),
            Self::Run(tokenizer) => Ok(tokenizer.decode(tokens)),
        }
    }
}

/// A run's `model` settings under today's names: runs written before
/// `CausalLmConfig::norm_scale` call it `layer_norm_scale` (an unknown key would be
/// dropped, and a model without norm scales built with them).
fn current_model_keys(model: &serde_json::Value) -> serde_json::Value {
    let mut model = model.clone();
    if let Some(object) = model.as_object_mut()
        && !object.contains_key("norm_scale")
        && let Some(value) = object.remove("layer_norm_scale")
    {
        object.insert("norm_scale".into(), value);
    }
    model
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_run_keeps_its_norm_scale() {
        let older = serde_json::json!({"layer_norm_scale": false, "d_model": 8});
        let current = current_model_keys(&older);
        assert_eq!(
            current,
            serde_json::json!({"norm_scale": false, "d_model": 8})
        );
        let today = serde_json::json!({"norm_scale": true});
        assert_eq!(current_model_keys(&today), today);
    }
}
