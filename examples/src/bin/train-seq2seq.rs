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
    DigitTask, RunOptions, Seq2SeqTrainingConfig, evaluate_exact_match, test_examples,
    train_seq2seq,
};
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};
use examples::device::open_devices;
use examples::run::{
    changed_flags, load_settings, options, record_run, refuse_changes, save_outputs,
};
use serde::{Deserialize, Serialize};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug, Clone, Serialize, Deserialize)]
// Negative numbers are values (`--grad-clip -1`), so that they get this program's
// message about the range, not a parse error.
#[command(
    version,
    allow_negative_numbers = true,
    about = "Train an encoder-decoder Transformer on a digit task"
)]
struct Args {
    /// Several devices sharing every training step, comma-separated, instead of
    /// --device: `cuda:0,cuda:1` (all-reduced with collective operations), or
    /// `flex,flex`, `wgpu,wgpu` (two workers on one backend). Each takes an equal part
    /// of every batch (--batch-size must divide evenly); the first validates and runs
    /// the optimizer.
    #[arg(long, value_delimiter = ',', conflicts_with = "device")]
    #[serde(default)]
    devices: Vec<String>,
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

/// What `--resume` reads back: the run's identity and its flags.
#[derive(Debug, Serialize, Deserialize)]
struct SavedRun {
    /// `None` in runs saved by older versions (their checkpoints are then not checked
    /// against it).
    #[serde(default)]
    run_id: Option<String>,
    #[serde(flatten)]
    args: Args,
}

/// The flags a resumed run may change: where it runs, what it prints and evaluates
/// at the end. `--steps` may change too: it moves the run's end.
const FREE_ON_RESUME: [&str; 8] = [
    "device",
    "devices",
    "out",
    "resume",
    "overwrite",
    "log_every",
    "test_examples",
    "beams",
];

fn main() -> ExitCode {
    let matches = Args::command().get_matches();
    let args = Args::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    examples::exit_with(run(args, &matches))
}

/// Checks the flags the library's configurations do not see by these names, so that
/// every bad flag is reported before any work.
fn check_flags(args: &Args) -> Result<(), String> {
    let positive = [
        ("d-model", args.d_model),
        ("heads", args.heads),
        ("layers", args.layers),
        ("d-ff", args.d_ff),
        ("steps", args.steps),
        ("batch-size", args.batch_size),
        ("eval-interval", args.eval_interval),
        ("min-len", args.min_len),
    ];
    if let Some((flag, _)) = positive.iter().find(|(_, value)| *value == 0) {
        return Err(format!("--{flag} must be at least 1, got 0"));
    }
    if !args.d_model.is_multiple_of(args.heads) {
        return Err(format!(
            "--d-model {} is not a multiple of --heads {}: each head gets d_model / heads \
             dimensions",
            args.d_model, args.heads
        ));
    }
    if args.beams == 0 {
        return Err("--beams must be at least 1 (1: greedy only)".into());
    }
    Ok(())
}

/// The saved run in `args.out` with what this resumption may change applied: the
/// flags of [`FREE_ON_RESUME`] and a new end (`--steps`). Any other flag that differs
/// is refused.
fn resumed(args: &Args, matches: &clap::ArgMatches) -> Result<SavedRun, String> {
    let mut saved: SavedRun = load_settings(&args.out)?;
    let mut free = FREE_ON_RESUME.to_vec();
    free.push("steps");
    refuse_changes(
        &args.out,
        &changed_flags(matches, args, &saved.args, &free)?,
    )?;
    let steps = match matches.value_source("steps") {
        Some(ValueSource::CommandLine) if args.steps != saved.args.steps => {
            println!(
                "extending the run from {} to {} steps: the Noam schedule depends on the \
                 step only, so it continues unchanged",
                saved.args.steps, args.steps
            );
            args.steps
        }
        _ => saved.args.steps,
    };
    saved.args = Args {
        device: args.device.clone(),
        devices: args.devices.clone(),
        out: args.out.clone(),
        resume: true,
        overwrite: false,
        log_every: args.log_every,
        test_examples: args.test_examples,
        beams: args.beams,
        // The rounds keep the length they were planned with.
        eval_interval: saved.args.eval_interval.min(saved.args.steps.max(1)),
        steps,
        ..saved.args.clone()
    };
    Ok(saved)
}

fn run(args: Args, matches: &clap::ArgMatches) -> Result<(), String> {
    check_flags(&args)?;
    let out = args.out.clone();
    let saved = if args.resume {
        Some(resumed(&args, matches)?)
    } else {
        None
    };
    let args = match &saved {
        Some(saved) => saved.args.clone(),
        None => args,
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
    let (device, extra_devices) = open_devices(&args.device, &args.devices)?;
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
    let resumed = saved.map(|saved| {
        let run_id = saved.run_id.clone();
        (saved, run_id)
    });
    let run_id = record_run(&out, args.overwrite, resumed, |run_id| SavedRun {
        run_id: Some(run_id),
        args: args.clone(),
    })?;

    let options = RunOptions {
        extra_devices,
        ..options(&out, run_id, args.resume, args.overwrite, args.log_every)
    };
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
