//! Self-speculative decoding against plain greedy decoding, same model, same run:
//! trains the nanoGPT-sized character model (4 layers, width 128) with one
//! multi-token-prediction module on flex, then on each backend decodes the same
//! prompts both ways and prints tokens/s, the draft acceptance rate and passes of the
//! model per token, for the "Generation" section of docs/benchmarks.md.
//!
//! ```text
//! cargo run --release -p benches --bin speculative -- --quick   # 300 training steps
//! cargo run --release -p benches --bin speculative -- --backends flex,wgpu --steps 2000
//! ```
//!
//! Without `--data` it trains on `../shared/data/tinyshakespeare.txt` (from the
//! repository root) where the machine has it, else on this checkout's own text, and
//! says so. The two decodings must give the same tokens: a difference is an error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use burn::module::Module;
use burn::tensor::Device;
use burn_transformer::device::parse_device;
use burn_transformer::generate::{GenerationConfig, generate, generate_speculative};
use burn_transformer::io::write_atomically;
use burn_transformer::model::{CausalLm, CausalLmConfig};
use burn_transformer::position::RopeConfig;
use burn_transformer::train::{
    CharTokenizer, LmTrainingConfig, RunOptions, TokenSplit, Tokenizer, train_language_model,
};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Prompts (taken from the validation text) and tokens decoded from each.
const PROMPTS: usize = 4;
const PROMPT_TOKENS: usize = 16;
/// The model's context: prompt and continuation fit in it.
const CONTEXT: usize = 128;

struct Args {
    data: Option<PathBuf>,
    backends: Vec<String>,
    steps: Option<usize>,
    new_tokens: usize,
    quick: bool,
    json: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        data: None,
        backends: vec!["flex".into()],
        steps: None,
        new_tokens: 96,
        quick: false,
        json: None,
    };
    let mut iter = std::env::args().skip(1);
    while let Some(flag) = iter.next() {
        let mut value = || iter.next().ok_or_else(|| format!("{flag} needs a value"));
        let count = |text: String, flag: &str| {
            text.parse::<usize>()
                .map_err(|e| format!("{flag}: {e}"))
                .and_then(|n| match n {
                    0 => Err(format!("{flag} must be at least 1")),
                    n => Ok(n),
                })
        };
        match flag.as_str() {
            "--data" => args.data = Some(PathBuf::from(value()?)),
            "--backends" | "--devices" => {
                args.backends = value()?.split(',').map(str::to_string).collect()
            }
            "--steps" => args.steps = Some(count(value()?, "--steps")?),
            "--new-tokens" => args.new_tokens = count(value()?, "--new-tokens")?,
            "--quick" => args.quick = true,
            "--json" => args.json = Some(PathBuf::from(value()?)),
            "-h" | "--help" => {
                println!(
                    "speculative [--data FILE] [--backends flex,ndarray,wgpu] [--steps N] \
                     [--new-tokens N] [--quick] [--json FILE]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown flag `{other}`")),
        }
    }
    if PROMPT_TOKENS + args.new_tokens > CONTEXT {
        return Err(format!(
            "--new-tokens must be at most {} (prompt and continuation fit in the model's \
             context of {CONTEXT})",
            CONTEXT - PROMPT_TOKENS
        ));
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

/// Decoding times and counts over the prompts.
struct Decoded {
    tokens: usize,
    plain_seconds: f64,
    speculative_seconds: f64,
    drafted: usize,
    accepted: usize,
    passes: usize,
}

/// Decodes every prompt both ways (each once before timing, to warm caches and
/// kernels), checking that the tokens agree.
fn decode(model: &CausalLm, prompts: &[Vec<u32>], new_tokens: usize) -> Result<Decoded, String> {
    let config = GenerationConfig::greedy(new_tokens);
    let mut decoded = Decoded {
        tokens: 0,
        plain_seconds: 0.0,
        speculative_seconds: 0.0,
        drafted: 0,
        accepted: 0,
        passes: 0,
    };
    for (index, prompt) in prompts.iter().enumerate() {
        let plain_run = || {
            generate(model, std::slice::from_ref(prompt), &config, |_| {})
                .map(|mut rows| rows.remove(0).tokens)
                .map_err(|e| e.to_string())
        };
        let speculative_run =
            || generate_speculative(model, prompt, &config, |_| {}).map_err(|e| e.to_string());
        plain_run()?;
        speculative_run()?;
        let started = Instant::now();
        let plain = plain_run()?;
        decoded.plain_seconds += started.elapsed().as_secs_f64();
        let started = Instant::now();
        let speculative = speculative_run()?;
        decoded.speculative_seconds += started.elapsed().as_secs_f64();
        if speculative.generated.tokens != plain {
            return Err(format!(
                "prompt {index}: speculative decoding gave other tokens than greedy decoding"
            ));
        }
        decoded.tokens += plain.len();
        decoded.drafted += speculative.drafted;
        decoded.accepted += speculative.accepted;
        decoded.passes += speculative.model_passes;
    }
    Ok(decoded)
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    let devices = args
        .backends
        .iter()
        .map(|name| parse_device(name).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let (corpus, corpus_name) = benches::corpus::load(args.data.as_deref(), "speculative")?;
    let tokenizer = CharTokenizer::from_text(&corpus.text).map_err(|e| e.to_string())?;
    let split = TokenSplit::new(&corpus.text, &tokenizer, 0.1).map_err(|e| e.to_string())?;
    split.check_context(CONTEXT).map_err(|e| e.to_string())?;
    // Prompts spread over the validation text.
    let stride = (split.validation.len() - PROMPT_TOKENS) / PROMPTS;
    let prompts: Vec<Vec<u32>> = (0..PROMPTS)
        .map(|i| {
            split
                .validation
                .to_vec(i * stride..i * stride + PROMPT_TOKENS)
        })
        .collect();
    let model = CausalLmConfig::new(
        tokenizer.vocab_size(),
        128,
        4,
        4,
        352,
        RopeConfig::new(32).with_max_position_embeddings(2048),
    )
    .with_norm_eps(1e-5)
    .with_tie_word_embeddings(true)
    .with_mtp_depth(1);
    println!(
        "Corpus: {corpus_name}; {PROMPTS} prompts of {PROMPT_TOKENS} tokens, {} new tokens \
         each, greedy.\n",
        args.new_tokens
    );
    println!(
        "| backend | training steps | drafts accepted | passes per token | greedy tokens/s | \
         speculative tokens/s | speculative / greedy |\n|---|---|---|---|---|---|---|"
    );
    // One model for every backend: decoding is what is measured.
    let steps = args.steps.unwrap_or(if args.quick { 300 } else { 2000 });
    let training = LmTrainingConfig::new()
        .with_steps(steps)
        .with_context(CONTEXT)
        .with_eval_interval(steps)
        .with_warmup_steps(100.min(steps / 2));
    let directory = std::env::temp_dir().join(format!("speculative-bench-{}", std::process::id()));
    let trained = train_language_model(
        &model,
        &training,
        &split,
        &Device::flex(),
        &RunOptions::quiet(&directory),
    )
    .map_err(|e| e.to_string())?
    .model;
    let _ = std::fs::remove_dir_all(&directory);
    let mut lines = Vec::new();
    for (name, device) in args.backends.iter().zip(devices) {
        let decoded = decode(
            &trained.clone().to_device(&device),
            &prompts,
            args.new_tokens,
        )?;
        let plain = decoded.tokens as f64 / decoded.plain_seconds.max(1e-9);
        let speculative = decoded.tokens as f64 / decoded.speculative_seconds.max(1e-9);
        let acceptance = decoded.accepted as f64 / decoded.drafted.max(1) as f64;
        let passes = decoded.passes as f64 / decoded.tokens.max(1) as f64;
        println!(
            "| {name} | {steps} | {:.0}% | {passes:.2} | {plain:.0} | {speculative:.0} | {:.2}× |",
            100.0 * acceptance,
            speculative / plain
        );
        let round = |value: f64, digits: i32| {
            let scale = 10f64.powi(digits);
            (value * scale).round() / scale
        };
        lines.push(
            serde_json::json!({
                "bench": "speculative-decoding", "data": corpus_name, "backend": name,
                "train_steps": steps, "prompts": PROMPTS, "new_tokens": args.new_tokens,
                "acceptance": round(acceptance, 3), "passes_per_token": round(passes, 3),
                "greedy_tokens_per_s": plain.round(),
                "speculative_tokens_per_s": speculative.round(),
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
