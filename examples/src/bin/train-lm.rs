//! Trains a LLaMA-style language model (RMSNorm, RoPE, GQA, SwiGLU) on any UTF-8
//! text with burn-train, then prints a sample and plots the loss curves.
//!
//! ```text
//! cargo run --release -p examples --bin train-lm                     # this repository's own text
//! cargo run --release -p examples --bin train-lm -- --data shakespeare.txt --steps 2000
//! cargo run --release -p examples --bin train-lm -- --resume          # continue the run in --out
//! cargo run --release -p examples --bin train-lm -- --init-from MODEL_DIR --lora-rank 8
//! ```
//!
//! `--init-from` fine-tunes a Hugging Face model folder (any family the crate loads)
//! with its own tokenizer; `--lora-rank` trains low-rank adapters instead of every
//! weight, `--freeze` leaves chosen weights unchanged. `export-hf` turns the run into
//! a Hugging Face folder.
//!
//! With no `--data`, the corpus is this checkout's documentation and library
//! sources, so the command works anywhere. The defaults for `--data` runs are
//! nanoGPT's CPU recipe for character-level Shakespeare.

use std::path::PathBuf;
use std::process::ExitCode;

use burn::tensor::Device;
use burn_transformer::attention::{QkNormConfig, QkNormPlacement};
use burn_transformer::block::BlockKind;
use burn_transformer::ffn::moe::{ExpertGlu, RouterConfig};
use burn_transformer::ffn::{Activation, MoeConfig};
use burn_transformer::generate::{GenerationConfig, SamplingConfig, generate};
use burn_transformer::hf::{
    CONFIG_FILE, HfConfig, KeyMap, causal_lm_key_map, hf_config_json, load_causal_lm,
};
use burn_transformer::io::{read_bytes, write_atomically};
use burn_transformer::lora::{LoraConfig, attach_lora, freeze_matching};
use burn_transformer::model::{CausalLm, CausalLmConfig};
use burn_transformer::position::RopeConfig;
use burn_transformer::train::{
    ByteTokenizer, CharTokenizer, Corpus, LmTrainingConfig, Precision, RunOptions, ShardManifest,
    TokenSplit, Tokenizer, host_init, is_prepared, mtp_validation_loss, open_shards,
    train_language_model_from, validation_loss,
};
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};
use examples::StreamedText;
use examples::device::open_devices;
use examples::hf_tokenizer::HfTokenizer;
use examples::run::{
    absolute, changed_flags, load_settings, options, record_run, refuse_changes, save_outputs,
};
use examples::trained::{BASE_CONFIG_FILE, BASE_EXTRA_FILES};
use serde::{Deserialize, Serialize};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug, Clone, Serialize, Deserialize)]
// Negative numbers are values (`--grad-clip -1`), so that they get this program's
// message about the range, not a parse error.
#[command(
    version,
    allow_negative_numbers = true,
    about = "Train a LLaMA-style language model on a text file or folder"
)]
struct Args {
    /// A UTF-8 text file, a folder whose UTF-8 files are concatenated, or a folder of
    /// token shards made by `prepare-data` (corpora larger than memory). Default: this
    /// repository's README, docs and library sources.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Backend: flex, ndarray, wgpu or cuda.
    #[arg(long, default_value = "flex")]
    device: String,
    /// Several devices sharing every training step, comma-separated, instead of
    /// --device: `cuda:0,cuda:1` (all-reduced with collective operations), or
    /// `flex,flex`, `wgpu,wgpu` (two workers on one backend). Each takes an equal part
    /// of every batch (--batch-size must divide evenly); the first validates and runs
    /// the optimizer.
    #[arg(long, value_delimiter = ',', conflicts_with = "device")]
    #[serde(default)]
    devices: Vec<String>,
    /// The tokenizer: `char` (one token per character of the corpus, the default),
    /// `bytes` (256 byte tokens), `bpe:VOCAB` (a byte-level BPE of at most VOCAB tokens
    /// trained on the training text, saved in the run as tokenizer.json) or a Hugging
    /// Face tokenizer.json file.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// The run's folder: checkpoints, history.json, loss.png, sample.txt.
    #[arg(long, default_value = "runs/train-lm")]
    out: PathBuf,
    /// Continue the run in --out from its newest checkpoint, with its saved settings.
    #[arg(long)]
    resume: bool,
    /// Start a new run in an --out that holds one, removing that run's checkpoints and
    /// outputs first (without it, a new run there is refused).
    #[arg(long, conflicts_with = "resume")]
    #[serde(default)]
    overwrite: bool,

    /// The block design: llama (Pre-LN, SwiGLU), qwen3 (llama with QK-norm per head),
    /// olmo2 (norms on the sublayers' outputs, QK-norm across heads), gemma (sandwich
    /// norms with Gemma's RMSNorm, GeGLU, scaled embeddings, QK-norm, soft-capped
    /// logits, a sliding window of context/4 on every other layer), gemma4 (sandwich
    /// norms with plain RMSNorms, GeGLU, scaled embeddings, QK-norm and value norms,
    /// unscaled attention, soft-capped logits, a sliding window of context/4 on five
    /// layers in six with the last layer global; the global layers' heads twice as wide
    /// with half the key/value heads, their values from the keys' projection, rotated
    /// by a proportional RoPE on a quarter of their pairs; exports as transformers'
    /// gemma4_text), qwen3_5 (Qwen3.5's hybrid: every fourth layer and the last gated
    /// attention with QK-norm and RoPE on a quarter of each head, the others Gated
    /// DeltaNet linear attention; RMSNorms scaling by 1 + weight; exports as
    /// transformers' qwen3_5_text), gpt-oss
    /// (attention sinks and biases, gemma's windows, 4 experts per layer, top-2, with
    /// router and expert biases and the clamped SwiGLU) or gpt2 (nanoGPT's model:
    /// --context learned positions instead of RoPE, LayerNorms with a shift, biases,
    /// an ungated GELU feed-forward 4 × --d-model wide by default, one key/value head
    /// per head by default).
    #[arg(
        long,
        default_value = "llama",
        value_parser = ["llama", "qwen3", "olmo2", "gemma", "gemma4", "qwen3_5", "gpt-oss", "gpt2"]
    )]
    #[serde(default = "default_arch")]
    arch: String,
    /// A named model size instead of --layers, --heads, --kv-heads, --d-model and
    /// --d-ff: `50m` (10 layers, width 640, 10 heads sharing 5 key/value heads, SwiGLU
    /// 1728: 50.7M parameters with a vocabulary of 8192, e.g. `--tokenizer bpe:8192`).
    #[arg(long, value_parser = ["50m"], conflicts_with_all = ["layers", "heads", "kv_heads", "d_model", "d_ff"])]
    #[serde(default)]
    preset: Option<String>,
    /// Decoder layers.
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Query heads.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Key/value heads: fewer than --heads is GQA (1 is MQA). Default: half of
    /// --heads when it is even (GQA), else --heads (always --heads with --arch gpt2).
    #[arg(long)]
    kv_heads: Option<usize>,
    /// Model width.
    #[arg(long, default_value_t = 128)]
    d_model: usize,
    /// SwiGLU hidden width; default: 8/3 · d_model rounded up to 32 (the parameter
    /// count of a 4 · d_model GELU MLP), or 4 · d_model for --arch gpt2's GELU MLP.
    #[arg(long)]
    d_ff: Option<usize>,
    /// Multi-token-prediction modules (DeepSeek-V3): module k also learns the token
    /// k + 1 ahead; the first one drafts tokens for `generate --speculative`.
    #[arg(long, default_value_t = 0)]
    #[serde(default)]
    mtp_depth: usize,
    /// Weight λ of the multi-token-prediction loss, λ/D · Σₖ CEₖ.
    #[arg(long, default_value_t = 0.3)]
    #[serde(default = "default_mtp_weight")]
    mtp_weight: f64,
    /// Per-layer embeddings of this width (Gemma-4 E2B/E4B): every layer also reads
    /// an input of its own, from a second embedding table and a projection of the
    /// token embeddings, through a gated branch at its end.
    #[arg(long)]
    #[serde(default)]
    per_layer_inputs: Option<usize>,
    /// The last N layers project no keys or values: each attends over those of the
    /// last earlier layer of its kind (sliding or global), and caches nothing while
    /// generating (Gemma-4 E2B/E4B's shared keys and values).
    #[arg(long, default_value_t = 0)]
    #[serde(default)]
    kv_shared_layers: usize,
    /// Chunked local attention (Llama 4): every layer without a sliding window attends
    /// only within chunks of this many positions, counted from the first token.
    #[arg(long)]
    #[serde(default)]
    attention_chunk: Option<usize>,

    /// Optimizer steps; default: 2000 with --data, 600 on the default corpus.
    #[arg(long)]
    steps: Option<usize>,
    /// Windows per batch.
    #[arg(long, default_value_t = 12)]
    batch_size: usize,
    /// Micro-batches per optimizer step (gradient accumulation): each step trains on
    /// --batch-size × N windows, backpropagated --batch-size at a time, so the update
    /// is the large batch's with the memory of a small one.
    #[arg(long, default_value_t = 1)]
    #[serde(default = "one")]
    grad_accum: usize,
    /// Recompute cheap activations in the backward pass instead of storing them
    /// (Burn's balanced gradient checkpointing): less memory, more time.
    #[arg(long)]
    #[serde(default)]
    checkpoint_activations: bool,
    /// The floating-point type of the forward and backward passes: f32, bf16 or f16
    /// (mixed precision: f32 master weights and optimizer state; f16 with dynamic loss
    /// scaling). wgpu has f16 only; flex and cuda have both.
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16", "f16"])]
    #[serde(default = "default_precision")]
    precision: String,
    /// Context length (tokens per window).
    #[arg(long, default_value_t = 64)]
    context: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Final learning rate of the cosine decay; default: lr / 10.
    #[arg(long)]
    min_lr: Option<f64>,
    /// Warm-up steps.
    #[arg(long, default_value_t = 100)]
    warmup: usize,
    /// AdamW weight decay (matrices and embeddings only).
    #[arg(long, default_value_t = 0.1)]
    weight_decay: f64,
    /// Clip the gradient's global norm; 0 disables.
    #[arg(long, default_value_t = 1.0)]
    grad_clip: f64,
    /// Label smoothing of the training loss.
    #[arg(long, default_value_t = 0.0)]
    label_smoothing: f64,
    /// Validate (and checkpoint) every this many steps; default: 250 with --data,
    /// 100 on the default corpus.
    #[arg(long)]
    eval_interval: Option<usize>,
    /// Batches per validation.
    #[arg(long, default_value_t = 20)]
    eval_batches: usize,
    /// Fraction of the corpus (its end) held out for validation.
    #[arg(long, default_value_t = 0.1)]
    validation_fraction: f64,
    /// Seed of initialization, batches and sampling.
    #[arg(long, default_value_t = 1337)]
    seed: u64,
    /// Print a training line every this many steps.
    #[arg(long, default_value_t = 50)]
    log_every: usize,

    /// Fine-tune this Hugging Face model folder (config.json and safetensors weights,
    /// any family the crate loads) instead of training a new model. Its tokenizer.json
    /// is the tokenizer unless --tokenizer is given; the model flags (--arch, --layers,
    /// --heads, --kv-heads, --d-model, --d-ff, --mtp-depth, --per-layer-inputs,
    /// --kv-shared-layers, --attention-chunk) do not apply.
    #[arg(long)]
    #[serde(default)]
    init_from: Option<PathBuf>,
    /// Weights to keep unchanged, as comma-separated globs over their checkpoint keys
    /// (`model.embed_tokens.weight,model.layers.0.*`); the rest trains.
    #[arg(long, value_delimiter = ',')]
    #[serde(default)]
    freeze: Vec<String>,
    /// Train LoRA adapters of this rank on the model's linear layers instead of its
    /// weights (which stay frozen).
    #[arg(long)]
    #[serde(default)]
    lora_rank: Option<usize>,
    /// LoRA alpha: the adapters' update is scaled by alpha / rank. Default: 2 · rank.
    #[arg(long, requires = "lora_rank")]
    #[serde(default)]
    lora_alpha: Option<f64>,
    /// Dropout on the adapters' input features while training.
    #[arg(long, default_value_t = 0.0, requires = "lora_rank")]
    #[serde(default)]
    lora_dropout: f64,
    /// The linear layers to adapt, comma-separated, by Hugging Face name. Default:
    /// q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj and the latent-attention
    /// projections (q_a_proj,q_b_proj,kv_a_proj_with_mqa,kv_b_proj).
    #[arg(long, value_delimiter = ',', requires = "lora_rank")]
    #[serde(default)]
    lora_targets: Vec<String>,

    /// Tokens to sample at the end (0: none).
    #[arg(long, default_value_t = 400)]
    sample_tokens: usize,
    /// Text the sample continues; default: a newline (or the corpus' first token).
    #[arg(long)]
    prompt: Option<String>,
    /// Sampling temperature of the sample; 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// Sample among the k most likely tokens (0: all); needs a --temperature above 0.
    #[arg(long, default_value_t = 40)]
    top_k: usize,
}

/// The `--arch` of runs saved before the flag existed.
fn default_arch() -> String {
    "llama".into()
}

/// The `--precision` of runs saved before the flag existed.
fn default_precision() -> String {
    "f32".into()
}

/// The `--grad-accum` of runs saved before the flag existed.
fn one() -> usize {
    1
}

/// The `--mtp-weight` of runs saved before the flag existed.
fn default_mtp_weight() -> f64 {
    0.3
}

/// `model` with the block design of `--arch` (see [`Args::arch`]).
/// `model` with chunked attention of `chunk` positions on every layer that has no
/// sliding window.
fn with_attention_chunk(model: CausalLmConfig, chunk: Option<usize>) -> CausalLmConfig {
    let Some(chunk) = chunk else {
        return model;
    };
    let chunked: Vec<bool> = (0..model.n_layers)
        .map(|layer| model.window_of(layer).is_none())
        .collect();
    let every_layer = chunked.iter().all(|&chunked| chunked);
    model
        .with_attention_chunk(Some(chunk))
        .with_chunked_layers((!every_layer).then_some(chunked))
}

fn with_arch(model: CausalLmConfig, arch: &str, context: usize) -> CausalLmConfig {
    let eps = model.norm_eps;
    match arch {
        "qwen3" => model.with_qk_norm(Some(QkNormConfig::new().with_eps(eps))),
        "olmo2" => model
            .with_block_kind(BlockKind::OutputNorm)
            .with_qk_norm(Some(
                QkNormConfig::new()
                    .with_placement(QkNormPlacement::AcrossHeads)
                    .with_eps(eps),
            )),
        "gemma" => {
            let layers = model.n_layers;
            let d_model = model.d_model;
            model
                .with_block_kind(BlockKind::Sandwich)
                .with_norm_unit_offset(true)
                .with_activation(Activation::GeluTanh)
                .with_embed_scale(Some((d_model as f64).sqrt()))
                .with_qk_norm(Some(
                    QkNormConfig::new().with_eps(eps).with_unit_offset(true),
                ))
                .with_attention_softcap(Some(50.0))
                .with_final_logit_softcap(Some(30.0))
                .with_sliding_window(Some((context / 4).max(1)))
                .with_sliding_layers(Some((0..layers).map(|layer| layer % 2 == 0).collect()))
        }
        "gemma4" => model.with_gemma4_design((context / 4).max(1)),
        "qwen3_5" => model.with_qwen3_5_design(),
        "gpt2" => model.with_gpt2_design(context),
        "gpt-oss" => {
            let layers = model.n_layers;
            let (d_model, d_ff) = (model.d_model, model.d_ff);
            let router = RouterConfig::new(d_model, 4, 2).with_bias(true);
            let moe = MoeConfig::new(router, d_ff / 2)
                .with_expert_bias(true)
                .with_expert_glu(ExpertGlu::Clamped {
                    alpha: 1.702,
                    limit: 7.0,
                });
            model
                .with_attention_sinks(true)
                .with_qkv_bias(true)
                .with_o_bias(true)
                .with_moe(Some(moe))
                .with_sliding_window(Some((context / 4).max(1)))
                .with_sliding_layers(Some((0..layers).map(|layer| layer % 2 == 0).collect()))
        }
        _ => model,
    }
}

/// What `--resume` reads back: the run's identity and the settings that shape the
/// training.
#[derive(Debug, Serialize, Deserialize)]
struct SavedRun {
    /// `None` in runs saved by older versions (their checkpoints are then not checked
    /// against it).
    #[serde(default)]
    run_id: Option<String>,
    args: Args,
    model: CausalLmConfig,
    training: LmTrainingConfig,
    /// The LoRA adapters the run trains (`--lora-rank`), if any.
    #[serde(default)]
    lora: Option<LoraConfig>,
}

/// The flags a resumed run may change: where it runs, what it prints and samples at
/// the end. `--steps` may change too: it moves the run's end.
const FREE_ON_RESUME: [&str; 11] = [
    "device",
    "devices",
    "out",
    "resume",
    "overwrite",
    "log_every",
    "sample_tokens",
    "prompt",
    "temperature",
    "top_k",
    "steps",
];

fn main() -> ExitCode {
    let matches = Args::command().get_matches();
    let args = Args::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    examples::exit_with(run(args, &matches))
}

/// Checks the flags that the library's configurations do not see by these names, so
/// that every bad flag is reported before any work.
fn check_flags(args: &Args, matches: &clap::ArgMatches) -> Result<(), String> {
    let positive = [
        ("layers", Some(args.layers)),
        ("heads", Some(args.heads)),
        ("d-model", Some(args.d_model)),
        ("kv-heads", args.kv_heads),
        ("d-ff", args.d_ff),
        ("steps", args.steps),
        ("eval-interval", args.eval_interval),
        ("batch-size", Some(args.batch_size)),
        ("grad-accum", Some(args.grad_accum)),
        ("context", Some(args.context)),
        ("eval-batches", Some(args.eval_batches)),
    ];
    if let Some((flag, _)) = positive.iter().find(|(_, value)| *value == Some(0)) {
        return Err(format!("--{flag} must be at least 1, got 0"));
    }
    if !args.d_model.is_multiple_of(args.heads) {
        return Err(format!(
            "--d-model {} is not a multiple of --heads {}: each head gets d_model / heads \
             dimensions",
            args.d_model, args.heads
        ));
    }
    if let Some(kv_heads) = args.kv_heads
        && !args.heads.is_multiple_of(kv_heads)
    {
        return Err(format!(
            "--heads {} is not a multiple of --kv-heads {kv_heads}: each key/value head \
             serves the same number of query heads",
            args.heads
        ));
    }
    if !(args.grad_clip.is_finite() && args.grad_clip >= 0.0) {
        return Err(format!(
            "--grad-clip must be a non-negative number (0 disables clipping), got {}",
            args.grad_clip
        ));
    }
    if !(args.mtp_weight.is_finite() && args.mtp_weight >= 0.0) {
        return Err(format!(
            "--mtp-weight must be a non-negative number, got {}",
            args.mtp_weight
        ));
    }
    if !(args.validation_fraction > 0.0 && args.validation_fraction < 1.0) {
        return Err(format!(
            "--validation-fraction must be between 0 and 1, got {}",
            args.validation_fraction
        ));
    }
    if !(args.temperature.is_finite() && args.temperature >= 0.0) {
        return Err(format!(
            "--temperature must be a non-negative number (0: greedy), got {}",
            args.temperature
        ));
    }
    if args.init_from.is_some() {
        let model_flags = [
            "arch",
            "layers",
            "heads",
            "kv_heads",
            "d_model",
            "d_ff",
            "mtp_depth",
            "per_layer_inputs",
            "kv_shared_layers",
            "attention_chunk",
        ];
        if let Some(flag) = model_flags
            .iter()
            .find(|flag| matches.value_source(flag) == Some(ValueSource::CommandLine))
        {
            return Err(format!(
                "--{} does not apply with --init-from: the model is the one in that folder",
                flag.replace('_', "-")
            ));
        }
    }
    if let Some(dir) = args.data.as_deref().filter(|dir| is_prepared(dir)) {
        for flag in ["tokenizer", "validation_fraction"] {
            if matches.value_source(flag) == Some(ValueSource::CommandLine) && !args.resume {
                return Err(format!(
                    "--{} does not apply to {}: a prepared corpus keeps the tokenizer and \
                     the validation split it was prepared with (prepare it again to change \
                     them)",
                    flag.replace('_', "-"),
                    dir.display()
                ));
            }
        }
    }
    let on_wgpu = std::iter::once(&args.device)
        .chain(&args.devices)
        .any(|name| name.starts_with("wgpu") || name.starts_with("vulkan"));
    if on_wgpu && args.precision == "bf16" && !args.resume {
        return Err(
            "--precision bf16: wgpu has no bf16 type; use --precision f16 there (bf16 runs \
             on flex and cuda)"
                .into(),
        );
    }
    if args.lora_rank.is_some() && !args.freeze.is_empty() {
        return Err(
            "--freeze applies to training the model's weights: with --lora-rank only \
                    the adapters train, every weight is frozen"
                .into(),
        );
    }
    if let Some(lora) = lora_config(args) {
        lora.validate().map_err(|e| format!("--lora-*: {e}"))?;
    }
    if args.temperature == 0.0 && matches.value_source("top_k") == Some(ValueSource::CommandLine) {
        return Err("--top-k applies to sampling: give a --temperature above 0 with it".into());
    }
    Ok(())
}

/// What `--tokenizer` names.
enum TokenizerChoice {
    Char,
    Bytes,
    Bpe(usize),
    File(PathBuf),
}

impl TokenizerChoice {
    /// Reads `--tokenizer` (`char`, `bytes`, `bpe:VOCAB`; anything else is a file).
    fn of(arg: Option<&std::path::Path>) -> Result<Self, String> {
        let Some(arg) = arg else {
            return Ok(Self::Char);
        };
        Ok(match arg.to_str() {
            Some("char") => Self::Char,
            Some("bytes") => Self::Bytes,
            Some(spec) if spec.starts_with("bpe:") => {
                let vocab = spec["bpe:".len()..].parse::<usize>().map_err(|_| {
                    format!("--tokenizer {spec}: expected bpe:VOCAB with a number, e.g. bpe:4096")
                })?;
                Self::Bpe(vocab)
            }
            _ => Self::File(arg.to_path_buf()),
        })
    }
}

/// `--tokenizer` with a file made absolute (a run resumed elsewhere finds it).
fn absolute_tokenizer(arg: Option<&std::path::Path>) -> Result<Option<PathBuf>, String> {
    match TokenizerChoice::of(arg)? {
        TokenizerChoice::File(path) => absolute(&path).map(Some),
        _ => Ok(arg.map(std::path::Path::to_path_buf)),
    }
}

/// The LoRA adapters of `--lora-rank`, `--lora-alpha`, `--lora-dropout` and
/// `--lora-targets`.
fn lora_config(args: &Args) -> Option<LoraConfig> {
    let rank = args.lora_rank?;
    let mut lora = LoraConfig::new(rank, args.lora_alpha.unwrap_or(2.0 * rank as f64))
        .with_dropout(args.lora_dropout);
    if !args.lora_targets.is_empty() {
        lora = lora.with_targets(args.lora_targets.clone());
    }
    Some(lora)
}

/// The checkpoint key of each parameter path, for `--freeze` and for messages: the
/// key of the model's Hugging Face family (the folder's, or the family a model built
/// here exports as), else the path itself.
fn checkpoint_names(
    model: &CausalLmConfig,
    base: Option<&HfConfig>,
) -> Box<dyn Fn(&str) -> String> {
    let config = base.cloned().or_else(|| {
        let json = hf_config_json(model).ok()?;
        HfConfig::from_value(&json, CONFIG_FILE).ok()
    });
    match config {
        Some(config) => {
            let keys = causal_lm_key_map(&config);
            Box::new(move |path: &str| keys.checkpoint_key(path))
        }
        None => Box::new(str::to_string),
    }
}

/// `model` ready to train as the flags say: adapters attached (everything else
/// frozen), or the `--freeze` weights frozen. Prints what trains.
fn trainable(
    model: CausalLm,
    args: &Args,
    lora: Option<&LoraConfig>,
    names: &dyn Fn(&str) -> String,
    seed: u64,
) -> Result<CausalLm, String> {
    let total: usize = burn::module::Module::num_params(&model);
    if let Some(lora) = lora {
        let mut summary = None;
        // Adapters are drawn on the host from the run's seed, as a new model is.
        let model = host_init(seed, |host| {
            attach_lora(burn::module::Module::to_device(model, host), lora).map(|(model, s)| {
                summary = Some(s);
                model
            })
        })
        .map_err(|e| format!("--lora-*: {e}"))?;
        let summary = summary.expect("attach_lora ran");
        let mut layers: Vec<&str> = summary
            .adapted
            .iter()
            .filter_map(|path| path.rsplit('.').nth(1))
            .collect();
        layers.sort_unstable();
        layers.dedup();
        println!(
            "LoRA: rank {}, alpha {} (scale {:.3}), dropout {}, on {} linear layers ({}): \
             {} trainable parameters of {} ({:.2}%)",
            lora.rank,
            lora.alpha,
            lora.scale(),
            lora.dropout,
            summary.adapted.len(),
            layers.join(","),
            summary.trainable,
            summary.total,
            100.0 * summary.trainable as f64 / summary.total as f64
        );
        return Ok(model);
    }
    if args.freeze.is_empty() {
        return Ok(model);
    }
    let (model, frozen, elements) = freeze_matching(model, &args.freeze, names)?;
    println!(
        "frozen: {} weights ({} parameters); {} of {} parameters train",
        frozen.len(),
        elements,
        total - elements,
        total
    );
    Ok(model)
}

/// The configurations of a new run: the model for `vocab_size` ids and the training.
fn configs(args: &Args, vocab_size: usize) -> (CausalLmConfig, LmTrainingConfig) {
    let default_corpus = args.data.is_none();
    let steps = args
        .steps
        .unwrap_or(if default_corpus { 600 } else { 2000 });
    let eval_interval = args
        .eval_interval
        .unwrap_or(if default_corpus { 100 } else { 250 })
        .min(steps);
    let head_dim = args.d_model / args.heads;
    // GPT-2's feed-forward is ungated, 4× wide; its attention one key/value head per
    // head.
    let gpt2 = args.arch == "gpt2";
    let d_ff = args.d_ff.unwrap_or(match gpt2 {
        true => 4 * args.d_model,
        false => (8 * args.d_model / 3).div_ceil(32) * 32,
    });
    let kv_heads = args
        .kv_heads
        .unwrap_or(if args.heads.is_multiple_of(2) && !gpt2 {
            args.heads / 2
        } else {
            args.heads
        });
    let model = CausalLmConfig::new(
        vocab_size,
        args.d_model,
        args.layers,
        args.heads,
        d_ff,
        RopeConfig::new(head_dim).with_max_position_embeddings(args.context.max(2048)),
    )
    .with_n_kv_heads(Some(kv_heads))
    .with_norm_eps(1e-5)
    .with_tie_word_embeddings(true);
    let model = match args.preset.as_deref() {
        Some("50m") => {
            let mut preset = CausalLmConfig::llama_50m(vocab_size);
            preset.rope.max_position_embeddings = args.context.max(2048);
            preset
        }
        _ => model,
    };
    let model = with_arch(model, &args.arch, args.context)
        .with_mtp_depth(args.mtp_depth)
        .with_mtp_loss_weight(args.mtp_weight)
        .with_per_layer_input_width(args.per_layer_inputs)
        .with_kv_shared_layers(args.kv_shared_layers);
    let model = with_attention_chunk(model, args.attention_chunk);
    let training = LmTrainingConfig::new()
        .with_batch_size(args.batch_size)
        .with_grad_accumulation(args.grad_accum)
        .with_checkpoint_activations(args.checkpoint_activations)
        .with_precision(Precision::parse(&args.precision).unwrap_or_default())
        .with_context(args.context)
        .with_steps(steps)
        .with_eval_interval(eval_interval)
        .with_eval_batches(args.eval_batches)
        .with_lr(args.lr)
        .with_min_lr(args.min_lr)
        .with_warmup_steps(args.warmup.min(steps.saturating_sub(1)))
        .with_weight_decay(args.weight_decay)
        .with_grad_clip((args.grad_clip > 0.0).then_some(args.grad_clip))
        .with_label_smoothing(args.label_smoothing)
        .with_seed(args.seed);
    (model, training)
}

/// The saved run in `args.out` with what this resumption may change applied: the
/// flags of [`FREE_ON_RESUME`] and a new end (`--steps`). Any other flag that differs
/// is refused.
fn resumed(args: &Args, matches: &clap::ArgMatches) -> Result<SavedRun, String> {
    let mut saved: SavedRun = load_settings(&args.out)?;
    let mut given = args.clone();
    given.data = given.data.as_deref().map(absolute).transpose()?;
    given.tokenizer = absolute_tokenizer(given.tokenizer.as_deref())?;
    given.init_from = given.init_from.as_deref().map(absolute).transpose()?;
    refuse_changes(
        &args.out,
        &changed_flags(matches, &given, &saved.args, &FREE_ON_RESUME)?,
    )?;
    if let Some(steps) = args.steps
        && steps != saved.training.steps
    {
        println!(
            "extending the run from {} to {steps} steps: the cosine schedule is re-laid \
             over {steps} steps (warm-up unchanged), so the learning rate continues on \
             the new curve from the step the run stopped at",
            saved.training.steps
        );
        saved.training.steps = steps;
        saved.args.steps = Some(steps);
        saved.training.validate().map_err(|e| e.to_string())?;
    }
    saved.args = Args {
        device: args.device.clone(),
        devices: args.devices.clone(),
        out: args.out.clone(),
        resume: true,
        overwrite: false,
        sample_tokens: args.sample_tokens,
        prompt: args.prompt.clone(),
        temperature: args.temperature,
        top_k: args.top_k,
        log_every: args.log_every,
        ..saved.args.clone()
    };
    Ok(saved)
}

/// What `--data` names: text, read whole, or a folder `prepare-data` made.
enum Data {
    Text(Corpus),
    Prepared {
        dir: PathBuf,
        manifest: Box<ShardManifest>,
        split: TokenSplit,
    },
}

impl Data {
    /// Reads `--data` (this checkout's text without it).
    fn open(path: Option<&std::path::Path>) -> Result<Self, String> {
        match path {
            Some(dir) if is_prepared(dir) => {
                let (manifest, split) = open_shards(dir).map_err(|e| e.to_string())?;
                Ok(Self::Prepared {
                    dir: dir.to_path_buf(),
                    manifest: Box::new(manifest),
                    split,
                })
            }
            Some(path) => Corpus::load(path).map(Self::Text),
            None => Corpus::repository_text().map(Self::Text),
        }
        .map_err(|e| e.to_string())
    }

    /// What the corpus is, for the log.
    fn describe(&self, path: Option<&std::path::Path>) -> String {
        let name = path.map_or_else(
            || "this repository's docs and sources".into(),
            |p| p.display().to_string(),
        );
        match self {
            Self::Text(corpus) => format!(
                "{name} ({} files, {} characters)",
                corpus.files.len(),
                corpus.text.chars().count()
            ),
            Self::Prepared { manifest, .. } => format!(
                "{name} (prepared: {} ids in {} {} shards from {} files)",
                manifest.tokens,
                manifest.shards.len(),
                manifest.dtype,
                manifest.sources.len()
            ),
        }
    }
}

/// The tokenizer a prepared folder's shards were made with.
fn prepared_tokenizer(
    dir: &std::path::Path,
    manifest: &ShardManifest,
) -> Result<Box<dyn Tokenizer>, String> {
    let file = dir.join(&manifest.tokenizer);
    Ok(match manifest.tokenizer.as_str() {
        "bytes" => Box::new(ByteTokenizer),
        "vocab.json" => Box::new(CharTokenizer::load(&file).map_err(|e| e.to_string())?),
        _ => Box::new(HfTokenizer::load(&file).map_err(|e| e.to_string())?),
    })
}

fn run(args: Args, matches: &clap::ArgMatches) -> Result<(), String> {
    check_flags(&args, matches)?;
    // A fine-tuned model brings its configuration and tokenizer.
    let base = match (&args.init_from, args.resume) {
        (Some(dir), false) => Some(dir.join(CONFIG_FILE)),
        // A resumed run reads the copy it made (its folder may have moved).
        (_, true) if args.out.join(BASE_CONFIG_FILE).is_file() => {
            Some(args.out.join(BASE_CONFIG_FILE))
        }
        _ => None,
    }
    .map(|path| HfConfig::from_file(path).map_err(|e| e.to_string()))
    .transpose()?;
    let args = match (&args.init_from, &args.tokenizer, args.resume) {
        (Some(dir), None, false) => {
            let path = dir.join("tokenizer.json");
            if !path.is_file() {
                return Err(format!(
                    "--init-from {}: no tokenizer.json in the model folder: give the model's \
                     tokenizer with --tokenizer FILE",
                    dir.display()
                ));
            }
            Args {
                tokenizer: Some(path),
                ..args
            }
        }
        _ => args,
    };
    let out = args.out.clone();
    // A resumed run takes everything that shapes training from its run.json.
    let saved = if args.resume {
        Some(resumed(&args, matches)?)
    } else {
        let (_, training) = configs(&args, 1);
        training.validate().map_err(|e| e.to_string())?;
        None
    };
    let args = match &saved {
        Some(saved) => saved.args.clone(),
        None => Args {
            data: args.data.as_deref().map(absolute).transpose()?,
            tokenizer: absolute_tokenizer(args.tokenizer.as_deref())?,
            init_from: args.init_from.as_deref().map(absolute).transpose()?,
            ..args
        },
    };
    let (device, extra_devices) = open_devices(&args.device, &args.devices)?;

    let data = Data::open(args.data.as_deref())?;
    let choice = TokenizerChoice::of(args.tokenizer.as_deref())?;
    // A trained BPE is saved with the run, once it is recorded.
    let mut trained_bpe = None;
    let tokenizer: Box<dyn Tokenizer> = match (&data, &choice, args.resume) {
        (Data::Prepared { dir, manifest, .. }, _, _) => prepared_tokenizer(dir, manifest)?,
        (Data::Text(corpus), TokenizerChoice::Char, false) => {
            Box::new(CharTokenizer::from_text(&corpus.text).map_err(|e| e.to_string())?)
        }
        (_, TokenizerChoice::Char, true) => {
            Box::new(CharTokenizer::load(&out.join("vocab.json")).map_err(|e| e.to_string())?)
        }
        (_, TokenizerChoice::Bytes, _) => Box::new(ByteTokenizer),
        (Data::Text(corpus), TokenizerChoice::Bpe(vocab), false) => {
            // Trained on the training part only: validation text stays unseen.
            let chars = corpus.text.chars().count();
            let kept = (chars as f64 * (1.0 - args.validation_fraction)) as usize;
            let end = corpus
                .text
                .char_indices()
                .nth(kept)
                .map_or(corpus.text.len(), |(i, _)| i);
            let started = std::time::Instant::now();
            let bpe =
                HfTokenizer::train_bpe(&corpus.text[..end], *vocab, &out.join("tokenizer.json"))
                    .map_err(|e| e.to_string())?;
            println!(
                "trained a byte-level BPE of {} tokens on {} characters in {:.1} s",
                bpe.vocab_size(),
                kept,
                started.elapsed().as_secs_f64()
            );
            trained_bpe = Some(bpe.to_json().map_err(|e| e.to_string())?);
            Box::new(bpe)
        }
        (_, TokenizerChoice::File(path), false) => {
            Box::new(HfTokenizer::load(path).map_err(|e| e.to_string())?)
        }
        (_, TokenizerChoice::Bpe(_) | TokenizerChoice::File(_), true) => {
            Box::new(HfTokenizer::load(&out.join("tokenizer.json")).map_err(|e| e.to_string())?)
        }
    };
    // The sample's prompt is checked now, not after training.
    let prompt = match &args.prompt {
        Some(text) => Some(
            tokenizer
                .encode(text)
                .map_err(|e| format!("--prompt: {e}"))?,
        ),
        None => None,
    };
    let split = match &data {
        Data::Text(corpus) => {
            TokenSplit::new(&corpus.text, tokenizer.as_ref(), args.validation_fraction)
                .map_err(|e| e.to_string())?
        }
        Data::Prepared { split, .. } => split.clone(),
    };
    split
        .check_context(args.context)
        .map_err(|e| e.to_string())?;

    let (model, training) = match (&saved, &base) {
        (Some(saved), _) => (saved.model.clone(), saved.training.clone()),
        (None, Some(base)) => (base.model.clone(), configs(&args, tokenizer.vocab_size()).1),
        (None, None) => configs(&args, tokenizer.vocab_size()),
    };
    let lora = match &saved {
        Some(saved) => saved.lora.clone(),
        None => lora_config(&args),
    };
    training.validate().map_err(|e| e.to_string())?;
    model.validate().map_err(|e| e.to_string())?;

    println!(
        "corpus: {}; tokenizer: {}",
        data.describe(args.data.as_deref()),
        tokenizer.describe()
    );
    let family = match (&args.init_from, &base) {
        (Some(dir), Some(base)) => format!("{} from {}", base.model_type, dir.display()),
        (Some(dir), None) => format!("fine-tuned from {}", dir.display()),
        (None, _) => args.arch.clone(),
    };
    let per_layer_inputs = model
        .per_layer_input_width
        .map_or_else(String::new, |width| format!(", per-layer inputs {width}"));
    let kv_shared = match model.kv_shared_layers {
        0 => String::new(),
        layers => format!(", the last {layers} reusing keys and values"),
    };
    let chunks = model.attention_chunk.map_or_else(String::new, |chunk| {
        format!(", attention in chunks of {chunk}")
    });
    println!(
        "split: {} training and {} validation tokens; model ({}): {} layers{kv_shared}, \
         width {}, {} heads ({} kv){chunks}, feed-forward {}{per_layer_inputs}; device: {}",
        split.train.len(),
        split.validation.len(),
        family,
        model.n_layers,
        model.d_model,
        model.n_heads,
        model.kv_heads(),
        model.d_ff,
        args.device
    );

    // The model is made ready before anything is written, so that a bad --freeze or
    // --lora-* leaves no run behind.
    let initial = match (&args.init_from, args.resume) {
        (Some(dir), false) => {
            let (model, _) = load_causal_lm(dir, &Device::flex()).map_err(|e| e.to_string())?;
            model
        }
        // A resumed run's weights come from its checkpoint.
        _ => host_init(training.seed, |host| model.try_init(host)).map_err(|e| e.to_string())?,
    };
    let names = checkpoint_names(&model, base.as_ref());
    let initial = trainable(initial, &args, lora.as_ref(), &*names, training.seed)?;
    let resumed = saved.map(|saved| {
        let run_id = saved.run_id.clone();
        (saved, run_id)
    });
    let run_id = record_run(&out, args.overwrite, resumed, |run_id| SavedRun {
        run_id: Some(run_id),
        args: args.clone(),
        model: model.clone(),
        training: training.clone(),
        lora: lora.clone(),
    })?;
    if !args.resume {
        match (&choice, &trained_bpe) {
            // A prepared folder's tokenizer file (if it has one) goes with the run.
            _ if matches!(data, Data::Prepared { .. }) => {
                if let Data::Prepared { dir, manifest, .. } = &data
                    && manifest.tokenizer != "bytes"
                {
                    read_bytes(&dir.join(&manifest.tokenizer))
                        .and_then(|bytes| write_atomically(&out.join(&manifest.tokenizer), bytes))
                        .map_err(|e| e.to_string())?;
                }
            }
            (TokenizerChoice::File(path), _) => read_bytes(path)
                .and_then(|bytes| write_atomically(&out.join("tokenizer.json"), bytes))
                .map_err(|e| e.to_string())?,
            (TokenizerChoice::Bpe(_), Some(json)) => {
                write_atomically(&out.join("tokenizer.json"), json).map_err(|e| e.to_string())?
            }
            (TokenizerChoice::Char, _) => {
                if let Data::Text(corpus) = &data {
                    CharTokenizer::from_text(&corpus.text)
                        .and_then(|t| t.save(&out.join("vocab.json")))
                        .map_err(|e| e.to_string())?
                }
            }
            // Bytes need no file: the run's settings name them.
            _ => {}
        }
        // What `export-hf` writes beside the weights: the base model's configuration
        // and its tokenizer's other files.
        if let Some(dir) = &args.init_from {
            read_bytes(&dir.join(CONFIG_FILE))
                .and_then(|bytes| write_atomically(&out.join(BASE_CONFIG_FILE), bytes))
                .map_err(|e| e.to_string())?;
            for name in BASE_EXTRA_FILES {
                let path = dir.join(name);
                if path.is_file() {
                    read_bytes(&path)
                        .and_then(|bytes| write_atomically(&out.join(name), bytes))
                        .map_err(|e| e.to_string())?;
                }
            }
        }
    }

    let options = RunOptions {
        extra_devices,
        ..options(&out, run_id, args.resume, args.overwrite, args.log_every)
    };
    // Initialized here rather than by `train_language_model`, so that the
    // multi-token-prediction loss of the initial model can show it fall.
    // A fine-tuning run states where it starts from.
    if args.init_from.is_some() && !args.resume {
        let loss =
            validation_loss(&initial, &split, &training, &device).map_err(|e| e.to_string())?;
        println!("validation loss of the loaded model: {loss:.4}");
    }
    let initial_mtp_loss = match args.resume {
        false => {
            mtp_validation_loss(&initial, &split, &training, &device).map_err(|e| e.to_string())?
        }
        true => None,
    };
    let result = train_language_model_from(initial, &training, &split, &device, &options)
        .map_err(|e| e.to_string())?;
    let final_mtp_loss = mtp_validation_loss(&result.model, &split, &training, &device)
        .map_err(|e| e.to_string())?;
    if let Some(last) = final_mtp_loss {
        let start = initial_mtp_loss.map_or_else(String::new, |first| format!("{first:.4} -> "));
        println!(
            "multi-token prediction ({} modules): validation loss {start}{last:.4}",
            model.mtp_depth
        );
    }
    let history = &result.history;
    if let (Some(first), Some(last)) = (history.validation.first(), history.validation.last()) {
        println!(
            "validation loss: {:.4} at step {} -> {:.4} at step {} ({:.1} s of training, {:.0} tokens/s)",
            first.loss,
            first.step,
            last.loss,
            last.step,
            history.train_seconds,
            (history.train.len() * training.tokens_per_step()) as f64
                / history.train_seconds.max(1e-9)
        );
    }
    save_outputs(
        result.model.clone(),
        history,
        &out,
        "train-lm: cross entropy",
    )?;

    if args.sample_tokens > 0 {
        // Without --prompt: a newline, or the corpus' first token where the vocabulary
        // has no newline.
        let prompt = match prompt.filter(|ids| !ids.is_empty()) {
            Some(ids) => ids,
            None => tokenizer
                .encode("\n")
                .ok()
                .filter(|ids| !ids.is_empty())
                .unwrap_or_else(|| split.train.to_vec(0..1)),
        };
        // The model saw windows of --context tokens: each sampled token is predicted
        // from at most that many.
        let sampling = if args.temperature > 0.0 {
            SamplingConfig::sample(args.temperature, args.seed)
                .with_top_k((args.top_k > 0).then_some(args.top_k))
        } else {
            SamplingConfig::greedy()
        };
        let generation = GenerationConfig::greedy(args.sample_tokens)
            .with_sampling(sampling)
            .with_max_context(Some(args.context));
        println!(
            "---- sample ({} tokens, temperature {}) ----",
            args.sample_tokens, args.temperature
        );
        let prompt_text = tokenizer.decode(&prompt);
        print!("{prompt_text}");
        let mut stream = StreamedText::default();
        let decode = |tokens: &[u32]| Ok::<_, std::convert::Infallible>(tokenizer.decode(tokens));
        generate(&result.model, &[prompt], &generation, |event| {
            let Ok(text) = stream.push(event.token, decode);
            examples::print_now(&text);
        })
        .map_err(|e| e.to_string())?;
        let Ok(text) = stream.finish(decode);
        examples::print_now(&text);
        println!("\n----");
        let text = format!("{prompt_text}{}", tokenizer.decode(stream.tokens()));
        write_atomically(&out.join("sample.txt"), text).map_err(|e| e.to_string())?;
    }
    Ok(())
}
