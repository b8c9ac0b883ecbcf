//! Trains the encoder-decoder Transformer of "Attention Is All You Need" on a
//! generated digit task (reverse, sort or add digit strings) with burn-train:
//! teacher forcing, label smoothing, the Noam schedule and padding masks. At the
//! end, held-out examples are decoded greedily and with beam search and the
//! exact-match accuracy is reported.
//!
//! ```text
//! cargo run --release -p examples --bin train-seq2seq
//! cargo run --release -p examples --bin train-seq2seq -- --task add --max-len 5 --steps 3000
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use burn_transformer::block::BlockKind;
use burn_transformer::io::write_atomically;
use burn_transformer::model::TransformerConfig;
use burn_transformer::train::digits::VOCAB_SIZE;
use burn_transformer::train::{
    DigitTask, Seq2SeqTrainingConfig, evaluate_exact_match, test_examples, train_seq2seq,
};
use clap::Parser;
use examples::device::open_device;
use examples::run::{load_settings, options, save_outputs, save_settings, start_new_run};
use serde::{Deserialize, Serialize};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug, Clone, Serialize, Deserialize)]
#[command(
    version,
    about = "Train an encoder-decoder Transformer on a digit task"
)]
struct Args {
    /// The task: reverse, sort or add.
    #[arg(long, default_value = "reverse")]
    task: String,
    /// Fewest digits per number.
    #[arg(long, default_value_t = 3)]
    min_len: usize,
    /// Most digits per number.
    #[arg(long, default_value_t = 10)]
    max_len: usize,
    /// Backend: flex, ndarray, wgpu or cuda.
    #[arg(long, default_value = "flex")]
    device: String,
    /// The run's folder.
    #[arg(long, default_value = "runs/train-seq2seq")]
    out: PathBuf,
    /// Continue the run in --out from its newest checkpoint, with its saved settings.
    #[arg(long)]
    resume: bool,
    /// Start a new run in an --out that holds one, removing that run's checkpoints and
    /// outputs first (without it, a new run there is refused).
    #[arg(long, conflicts_with = "resume")]
    #[serde(default)]
    overwrite: bool,

    /// Model width.
    #[arg(long, default_value_t = 64)]
    d_model: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Encoder layers and decoder layers (each).
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Feed-forward width.
    #[arg(long, default_value_t = 256)]
    d_ff: usize,
    /// Dropout.
    #[arg(long, default_value_t = 0.0)]
    dropout: f64,
    /// Norm placement: post (the paper), pre, or residual (ResiDual).
    #[arg(long, default_value = "pre")]
    norm: String,

    /// Optimizer steps.
    #[arg(long, default_value_t = 1200)]
    steps: usize,
    /// Examples per batch.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Label smoothing.
    #[arg(long, default_value_t = 0.1)]
    label_smoothing: f64,
    /// Scale of the Noam schedule.
    #[arg(long, default_value_t = 1.0)]
    noam_factor: f64,
    /// Warm-up steps of the Noam schedule.
    #[arg(long, default_value_t = 200)]
    warmup: usize,
    /// Validate (and checkpoint) every this many steps.
    #[arg(long, default_value_t = 200)]
    eval_interval: usize,
    /// Seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Print a training line every this many steps.
    #[arg(long, default_value_t = 100)]
    log_every: usize,

    /// Held-out examples decoded at the end.
    #[arg(long, default_value_t = 500)]
    test_examples: usize,
    /// Beams of the beam-search evaluation (1: greedy only).
    #[arg(long, default_value_t = 4)]
    beams: usize,
}

fn main() -> ExitCode {
    examples::exit_with(run(Args::parse()))
}

fn run(args: Args) -> Result<(), String> {
    let device = open_device(&args.device)?;
    let out = args.out.clone();
    let args = if args.resume {
        let saved: Args = load_settings(&out)?;
        Args {
            device: args.device,
            out: args.out,
            resume: true,
            overwrite: false,
            log_every: args.log_every,
            test_examples: args.test_examples,
            beams: args.beams,
            ..saved
        }
    } else {
        args
    };

    let task = DigitTask::parse(&args.task).map_err(|e| e.to_string())?;
    let norm = match args.norm.to_ascii_lowercase().as_str() {
        "post" => BlockKind::PostNorm,
        "pre" => BlockKind::PreNorm,
        "residual" => BlockKind::ResiDual,
        other => {
            return Err(format!(
                "unknown --norm `{other}`: expected post, pre or residual"
            ));
        }
    };
    let model = TransformerConfig::new(VOCAB_SIZE, VOCAB_SIZE)
        .with_d_model(args.d_model)
        .with_n_heads(args.heads)
        .with_d_ff(args.d_ff)
        .with_n_encoder_layers(args.layers)
        .with_n_decoder_layers(args.layers)
        .with_dropout(args.dropout)
        .with_block_kind(norm)
        .with_share_embeddings(true)
        .with_max_positions(2 * args.max_len + 8);
    let training = Seq2SeqTrainingConfig::new()
        .with_task(task)
        .with_min_len(args.min_len)
        .with_max_len(args.max_len)
        .with_batch_size(args.batch_size)
        .with_steps(args.steps)
        .with_eval_interval(args.eval_interval.min(args.steps.max(1)))
        .with_noam_factor(args.noam_factor)
        .with_warmup_steps(args.warmup)
        .with_label_smoothing(args.label_smoothing)
        .with_seed(args.seed);
    training.validate().map_err(|e| e.to_string())?;
    model.validate().map_err(|e| e.to_string())?;
    println!(
        "task: {:?} of {}..={} digits; model: {} + {} layers, width {}, {} heads, {:?}; device: {}",
        task,
        args.min_len,
        args.max_len,
        args.layers,
        args.layers,
        args.d_model,
        args.heads,
        norm,
        args.device
    );
    if !args.resume {
        start_new_run(&out, args.overwrite)?;
        save_settings(&out, &args)?;
    }

    let options = options(&out, args.resume, args.overwrite, args.log_every);
    let result = train_seq2seq(&model, &training, &device, &options).map_err(|e| e.to_string())?;
    // The architecture beside the weights, so that other programs (attention-plot) can
    // rebuild the model without this program's flags.
    let architecture = serde_json::to_string_pretty(&model).map_err(|e| e.to_string())?;
    write_atomically(&out.join("model.json"), architecture).map_err(|e| e.to_string())?;
    save_outputs(
        result.model.clone(),
        &result.history,
        &out,
        "train-seq2seq: cross entropy",
    )?;

    let examples = test_examples(
        task,
        args.min_len,
        args.max_len,
        args.test_examples,
        args.seed,
    );
    let started = std::time::Instant::now();
    let evaluation = evaluate_exact_match(
        &result.model,
        &examples,
        task.max_target_len(args.max_len),
        args.beams,
        100,
    )
    .map_err(|e| e.to_string())?;
    println!(
        "held-out exact match on {} examples: greedy {:.1}%{} ({:.1} s of decoding, {:.1} s of training)",
        evaluation.examples,
        100.0 * evaluation.greedy,
        evaluation
            .beam
            .map(|beam| format!(", beam search ({} beams) {:.1}%", args.beams, 100.0 * beam))
            .unwrap_or_default(),
        started.elapsed().as_secs_f64(),
        result.history.train_seconds
    );
    for (source, expected, got) in &evaluation.mistakes {
        println!("  {source} -> expected {expected}, decoded {got}");
    }
    Ok(())
}
