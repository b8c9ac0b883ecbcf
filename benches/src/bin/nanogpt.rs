//! nanoGPT's CPU recipe for character-level Shakespeare, trained with this
//! library on each backend: prints time per iteration, tokens/s and the final
//! validation loss, for the "Training" table of docs/benchmarks.md.
//!
//! ```text
//! cargo run --release -p benches --bin nanogpt -- --data ../shared/data/tinyshakespeare.txt
//! cargo run --release -p benches --bin nanogpt -- --devices flex,ndarray,wgpu --steps 200
//! cargo run --release -p benches --bin nanogpt -- --quick   # 100 steps (the runner's quick mode)
//! ```
//!
//! Without `--data` it trains on `../shared/data/tinyshakespeare.txt` (from the repository
//! root) where the machine has it, else on this checkout's own text, and says so.
//!
//! The bench runner runs it as a companion program (`bench --suites nanogpt`). Without
//! `--steps`, a wgpu adapter that emulates Vulkan on the CPU (lavapipe, llvmpipe) runs
//! 1/20 of the steps: the whole recipe would take an hour there.
//!
//! The recipe (`train-lm`'s defaults with `--kv-heads 4`: multi-head attention, as
//! nanoGPT): 4 layers, 4 heads, width 128 (SwiGLU 352, tied embeddings), context 64,
//! batch 12, AdamW lr 1e-3 with 100 warm-up steps and a cosine decay to 1e-4, betas
//! (0.9, 0.99), weight decay 0.1, global gradient clipping 1.0, 90/10 split,
//! validation every 250 steps on 20 batches. The PyTorch reference is
//! `benches/nanogpt_torch.py`; compare timings of runs made one after the other on
//! the same machine.

use std::path::PathBuf;
use std::process::ExitCode;

use benches::machine::{adapter_name, emulates_gpu_on_cpu};
use burn_transformer::device::parse_device;
use burn_transformer::io::write_atomically;
use burn_transformer::model::CausalLmConfig;
use burn_transformer::position::RopeConfig;
use burn_transformer::train::{
    CharTokenizer, LmTrainingConfig, RunOptions, TokenSplit, Tokenizer, train_language_model,
};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Args {
    /// `None`: Shakespeare where this machine has it, else this checkout's own text.
    data: Option<PathBuf>,
    devices: Vec<String>,
    /// `None`: the recipe's 2000 (100 with `--quick`).
    steps: Option<usize>,
    quick: bool,
    eval_interval: usize,
    json: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        data: None,
        devices: vec!["flex".into()],
        steps: None,
        quick: false,
        eval_interval: 250,
        json: None,
    };
    let mut iter = std::env::args().skip(1);
    while let Some(flag) = iter.next() {
        let mut value = || iter.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--data" => args.data = Some(PathBuf::from(value()?)),
            // `--backends` is the bench runner's name for the same list.
            "--devices" | "--backends" => {
                args.devices = value()?.split(',').map(str::to_string).collect()
            }
            "--steps" => args.steps = Some(value()?.parse().map_err(|e| format!("--steps: {e}"))?),
            "--quick" => args.quick = true,
            "--eval-interval" => {
                args.eval_interval = value()?
                    .parse()
                    .map_err(|e| format!("--eval-interval: {e}"))?
            }
            "--json" => args.json = Some(PathBuf::from(value()?)),
            "-h" | "--help" => {
                println!(
                    "nanogpt [--data FILE] [--devices flex,ndarray,wgpu] [--steps N] [--quick] \
                     [--eval-interval N] [--json FILE]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown flag `{other}`")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    // Every flag is checked before anything is printed or trained.
    if args.steps == Some(0) {
        return Err("invalid setting `steps`: must be greater than 0".into());
    }
    if args.eval_interval == 0 {
        return Err("invalid setting `eval-interval`: must be greater than 0".into());
    }
    let devices = args
        .devices
        .iter()
        .map(|name| parse_device(name).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let (corpus, corpus_name) = benches::corpus::load(args.data.as_deref(), "nanogpt")?;
    println!(
        "Corpus: {corpus_name}, {} characters.\n",
        corpus.text.chars().count()
    );
    // The PyTorch reference (`nanogpt_torch.py`) names its lines the same way.
    let bench = if corpus_name == "tinyshakespeare" {
        "nanogpt-shakespeare-char"
    } else {
        "nanogpt-char"
    };
    let tokenizer = CharTokenizer::from_text(&corpus.text).map_err(|e| e.to_string())?;
    let split = TokenSplit::new(&corpus.text, &tokenizer, 0.1).map_err(|e| e.to_string())?;
    let model = CausalLmConfig::new(
        tokenizer.vocab_size(),
        128,
        4,
        4,
        352,
        RopeConfig::new(32).with_max_position_embeddings(2048),
    )
    .with_norm_eps(1e-5)
    .with_tie_word_embeddings(true);
    let mut lines = Vec::new();
    println!(
        "| backend | steps | ms/iter | tokens/s | final val loss | wall s |\n|---|---|---|---|---|---|"
    );
    for (name, device) in args.devices.iter().zip(devices) {
        let recipe_steps = if args.quick { 100 } else { 2000 };
        let emulated = adapter_name(&device).is_some_and(|adapter| emulates_gpu_on_cpu(&adapter));
        let steps = args.steps.unwrap_or(if emulated {
            recipe_steps / 20
        } else {
            recipe_steps
        });
        let training = LmTrainingConfig::new()
            .with_steps(steps)
            .with_eval_interval(args.eval_interval.min(steps))
            .with_warmup_steps(100.min(steps / 2));
        let directory =
            std::env::temp_dir().join(format!("nanogpt-bench-{name}-{}", std::process::id()));
        let started = std::time::Instant::now();
        let result = train_language_model(
            &model,
            &training,
            &split,
            &device,
            &RunOptions::quiet(&directory),
        )
        .map_err(|e| e.to_string())?;
        let wall = started.elapsed().as_secs_f64();
        let _ = std::fs::remove_dir_all(&directory);
        let history = result.history;
        let steps = history.train.len();
        let ms = 1e3 * history.train_seconds / steps.max(1) as f64;
        let tokens = training.tokens_per_step() as f64 / (ms / 1e3);
        let val = history.last_validation_loss().unwrap_or(f64::NAN);
        println!("| {name} | {steps} | {ms:.1} | {tokens:.0} | {val:.4} | {wall:.0} |");
        // Rounded as the table shows them; a missing loss is `null`, never `NaN`.
        let round = |value: f64, digits: i32| {
            let scale = 10f64.powi(digits);
            (value * scale).round() / scale
        };
        lines.push(
            serde_json::json!({
                "bench": bench, "data": corpus_name, "impl": "burn-transformer",
                "backend": name, "iters": steps, "ms_per_iter": round(ms, 2),
                "tokens_per_s": tokens.round(), "val_loss": round(val, 4),
                "wall_s": round(wall, 1),
            })
            .to_string(),
        );
    }
    for line in &lines {
        println!("{line}");
    }
    if let Some(path) = args.json {
        write_atomically(&path, lines.join("\n") + "\n").map_err(|e| e.to_string())?;
    }
    Ok(())
}
