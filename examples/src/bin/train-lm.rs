//! Trains a LLaMA-style language model (RMSNorm, RoPE, GQA, SwiGLU) on any UTF-8
//! text with burn-train, then prints a sample and plots the loss curves.
//!
//! ```text
//! cargo run --release -p examples --bin train-lm                     # this repository's own text
//! cargo run --release -p examples --bin train-lm -- --data shakespeare.txt --steps 2000
//! cargo run --release -p examples --bin train-lm -- --resume          # continue the run in --out
//! ```
//!
//! With no `--data`, the corpus is this checkout's documentation and library
//! sources, so the command works anywhere. The defaults for `--data` runs are
//! nanoGPT's CPU recipe for character-level Shakespeare.

use std::path::PathBuf;
use std::process::ExitCode;

use burn_transformer::generate::{GenerationConfig, SamplingConfig, generate};
use burn_transformer::io::{read_bytes, write_atomically};
use burn_transformer::model::CausalLmConfig;
use burn_transformer::position::RopeConfig;
use burn_transformer::train::{
    CharTokenizer, Corpus, LmTrainingConfig, TokenSplit, Tokenizer, train_language_model,
};
use clap::Parser;
use examples::StreamedText;
use examples::device::open_device;
use examples::hf_tokenizer::HfTokenizer;
use examples::run::{load_settings, options, save_outputs, save_settings, start_new_run};
use serde::{Deserialize, Serialize};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug, Clone, Serialize, Deserialize)]
#[command(
    version,
    about = "Train a LLaMA-style language model on a text file or folder"
)]
struct Args {
    /// A UTF-8 text file, or a folder whose UTF-8 files are concatenated. Default:
    /// this repository's README, docs and library sources.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Backend: flex, ndarray, wgpu or cuda.
    #[arg(long, default_value = "flex")]
    device: String,
    /// A Hugging Face tokenizer.json (BPE); default: one token per character.
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

    /// Decoder layers.
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Query heads.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Key/value heads: fewer than --heads is GQA (1 is MQA). Default: half of
    /// --heads when it is even (GQA), else --heads.
    #[arg(long)]
    kv_heads: Option<usize>,
    /// Model width.
    #[arg(long, default_value_t = 128)]
    d_model: usize,
    /// SwiGLU hidden width; default: 8/3 · d_model rounded up to 32 (the parameter
    /// count of a 4 · d_model GELU MLP).
    #[arg(long)]
    d_ff: Option<usize>,

    /// Optimizer steps; default: 2000 with --data, 600 on the default corpus.
    #[arg(long)]
    steps: Option<usize>,
    /// Windows per batch.
    #[arg(long, default_value_t = 12)]
    batch_size: usize,
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

    /// Tokens to sample at the end (0: none).
    #[arg(long, default_value_t = 400)]
    sample_tokens: usize,
    /// Text the sample continues; default: a newline (or the corpus' first token).
    #[arg(long)]
    prompt: Option<String>,
    /// Sampling temperature.
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// Sample among the k most likely tokens (0: all).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
}

/// What `--resume` reads back: the settings that shape the training.
#[derive(Debug, Serialize, Deserialize)]
struct SavedRun {
    args: Args,
    model: CausalLmConfig,
    training: LmTrainingConfig,
}

fn main() -> ExitCode {
    examples::exit_with(run(Args::parse()))
}

fn run(args: Args) -> Result<(), String> {
    let out = args.out.clone();
    let device = open_device(&args.device)?;

    // A resumed run takes everything that shapes training from its run.json.
    let args = if args.resume {
        let saved: SavedRun = load_settings(&out)?;
        Args {
            device: args.device,
            out: args.out,
            resume: true,
            overwrite: false,
            sample_tokens: args.sample_tokens,
            prompt: args.prompt,
            temperature: args.temperature,
            top_k: args.top_k,
            log_every: args.log_every,
            ..saved.args
        }
    } else {
        args
    };

    let corpus = match &args.data {
        Some(path) => Corpus::load(path),
        None => Corpus::repository_text(),
    }
    .map_err(|e| e.to_string())?;
    let tokenizer: Box<dyn Tokenizer> = match (&args.tokenizer, args.resume) {
        (Some(path), false) => Box::new(HfTokenizer::load(path).map_err(|e| e.to_string())?),
        (Some(_), true) => {
            Box::new(HfTokenizer::load(&out.join("tokenizer.json")).map_err(|e| e.to_string())?)
        }
        (None, false) => {
            Box::new(CharTokenizer::from_text(&corpus.text).map_err(|e| e.to_string())?)
        }
        (None, true) => {
            Box::new(CharTokenizer::load(&out.join("vocab.json")).map_err(|e| e.to_string())?)
        }
    };
    let split = TokenSplit::new(&corpus.text, tokenizer.as_ref(), args.validation_fraction)
        .map_err(|e| e.to_string())?;
    split
        .check_context(args.context)
        .map_err(|e| e.to_string())?;

    let default_corpus = args.data.is_none();
    let steps = args
        .steps
        .unwrap_or(if default_corpus { 600 } else { 2000 });
    let eval_interval = args
        .eval_interval
        .unwrap_or(if default_corpus { 100 } else { 250 })
        .min(steps);
    let heads = args.heads.max(1);
    let head_dim = args.d_model / heads;
    let d_ff = args
        .d_ff
        .unwrap_or((8 * args.d_model / 3).div_ceil(32) * 32);
    let model = CausalLmConfig::new(
        tokenizer.vocab_size(),
        args.d_model,
        args.layers,
        heads,
        d_ff,
        RopeConfig::new(head_dim).with_max_position_embeddings(args.context.max(2048)),
    )
    .with_n_kv_heads(Some(args.kv_heads.unwrap_or(if heads % 2 == 0 {
        heads / 2
    } else {
        heads
    })))
    .with_norm_eps(1e-5)
    .with_tie_word_embeddings(true);
    let training = LmTrainingConfig::new()
        .with_batch_size(args.batch_size)
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
    training.validate().map_err(|e| e.to_string())?;
    model.validate().map_err(|e| e.to_string())?;

    println!(
        "corpus: {} ({} files, {} characters); tokenizer: {}",
        args.data.as_ref().map_or_else(
            || "this repository's docs and sources".into(),
            |p| p.display().to_string()
        ),
        corpus.files.len(),
        corpus.text.chars().count(),
        tokenizer.describe()
    );
    println!(
        "split: {} training and {} validation tokens; model: {} layers, width {}, {} heads \
         ({} kv), SwiGLU {}; device: {}",
        split.train.len(),
        split.validation.len(),
        model.n_layers,
        model.d_model,
        model.n_heads,
        model.kv_heads(),
        model.d_ff,
        args.device
    );

    if !args.resume {
        start_new_run(&out, args.overwrite)?;
        let saved = SavedRun {
            args: args.clone(),
            model: model.clone(),
            training: training.clone(),
        };
        save_settings(&out, &saved)?;
        match &args.tokenizer {
            Some(path) => read_bytes(path)
                .and_then(|bytes| write_atomically(&out.join("tokenizer.json"), bytes))
                .map_err(|e| e.to_string())?,
            None => CharTokenizer::from_text(&corpus.text)
                .and_then(|t| t.save(&out.join("vocab.json")))
                .map_err(|e| e.to_string())?,
        }
    }

    let options = options(&out, args.resume, args.overwrite, args.log_every);
    let result = train_language_model(&model, &training, &split, &device, &options)
        .map_err(|e| e.to_string())?;
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
        let prompt_text = args.prompt.clone().unwrap_or_else(|| "\n".into());
        let prompt = match tokenizer.encode(&prompt_text) {
            Ok(ids) if !ids.is_empty() => ids,
            _ => split.train[..1].to_vec(),
        };
        // The model saw windows of --context tokens: each sampled token is predicted
        // from at most that many.
        let sampling = SamplingConfig::sample(args.temperature, args.seed)
            .with_top_k((args.top_k > 0).then_some(args.top_k));
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
        generate(&result.model, &[prompt], &generation, |event| {
            let _ = stream.push(event.token, |tokens| {
                Ok::<_, std::convert::Infallible>(tokenizer.decode(tokens))
            });
        })
        .map_err(|e| e.to_string())?;
        println!("\n----");
        let text = format!("{prompt_text}{}", tokenizer.decode(stream.tokens()));
        write_atomically(&out.join("sample.txt"), text).map_err(|e| e.to_string())?;
    }
    Ok(())
}
