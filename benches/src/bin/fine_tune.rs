//! Two ways to train the same model, same run: peak memory and time of AdamW training
//! steps. `--compare lora` (the default): full fine-tuning against LoRA, with the
//! trainable parameters and the optimizer state each keeps, for the "Fine-tuning"
//! section of docs/benchmarks.md. `--compare checkpointing`: stored activations against
//! activation checkpointing (Burn's balanced strategy) on a 6-layer model at context
//! 1024, for the "Training" section. `--compare precision`: f32 against bf16 and f16
//! mixed precision (f32 master weights; wgpu has no bf16), same model as LoRA's.
//! `--compare devices`: the backend's device alone against two of its devices sharing
//! every batch (`RunOptions::extra_devices`, burn-train's multi-device strategy, DDP on
//! CUDA), trained through burn-train as `train-lm --devices` does, on a 4-layer model
//! with batches of 8 × 256 tokens.
//!
//! ```text
//! cargo run --release -p benches --bin fine_tune                      # flex
//! cargo run --release -p benches --bin fine_tune -- --backend wgpu --rank 16
//! cargo run --release -p benches --bin fine_tune -- --compare checkpointing
//! cargo run --release -p benches --bin fine_tune -- --compare precision --backend wgpu
//! cargo run --release -p benches --bin fine_tune -- --compare devices --backend cuda
//! ```
//!
//! Each variant runs in a process of its own, so that on CPU backends the peak is the
//! growth of that process's peak resident set (on wgpu and cuda: the device pool's
//! high-water mark). The model is LLaMA-style, width 512, vocabulary 8192 (8 layers,
//! 31.6M parameters, for LoRA; 6 layers for checkpointing), trained on windows of
//! random tokens.

use std::process::{Command, ExitCode};

use benches::measure::{PeakMemory, Runs};
use benches::suites::train_step::{random_tokens, time_train_steps};
use burn::module::Module;
use burn::tensor::Device;
use burn_transformer::lora::{LoraConfig, attach_lora};
use burn_transformer::model::CausalLmConfig;
use burn_transformer::position::RopeConfig;
use burn_transformer::train::{
    LmTrainingConfig, Precision, RunOptions, TokenSplit, host_init, train_language_model_from,
};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const VOCAB: usize = 8192;
/// What `--compare` takes.
const COMPARISONS: [&str; 4] = ["lora", "checkpointing", "precision", "devices"];

/// Layers, batch and context of a comparison.
fn shape(compare: &str) -> (usize, usize, usize) {
    match compare {
        "checkpointing" => (6, 2, 1024),
        "devices" => (4, 8, 256),
        _ => (8, 4, 256),
    }
}

fn config(layers: usize, context: usize) -> CausalLmConfig {
    CausalLmConfig::new(
        VOCAB,
        512,
        layers,
        8,
        1376,
        RopeConfig::new(64).with_max_position_embeddings(context),
    )
    .with_n_kv_heads(Some(4))
    .with_norm_eps(1e-5)
}

fn main() -> ExitCode {
    let result = match std::env::args().nth(1).as_deref() {
        Some("--child") => child(),
        _ => parent(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Flags: `--backend NAME` (flex), `--rank R` (8), `--steps N` (5 timed, 2 warm-up),
/// `--compare lora|checkpointing|precision|devices` (lora).
fn flags(args: &[String]) -> Result<(String, usize, usize, String), String> {
    let (mut backend, mut rank, mut steps) = ("flex".to_string(), 8, 5);
    let mut compare = "lora".to_string();
    let mut iter = args.iter();
    while let Some(flag) = iter.next() {
        let mut value = || {
            iter.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--backend" => backend = value()?,
            "--rank" => rank = value()?.parse().map_err(|e| format!("--rank: {e}"))?,
            "--steps" => steps = value()?.parse().map_err(|e| format!("--steps: {e}"))?,
            "--compare" => {
                compare = value()?;
                if !COMPARISONS.contains(&compare.as_str()) {
                    return Err(format!(
                        "--compare {compare}: expected one of {}",
                        COMPARISONS.join(", ")
                    ));
                }
            }
            "-h" | "--help" => {
                println!(
                    "fine_tune [--backend flex|ndarray|wgpu|cuda] [--rank R] [--steps N] \
                     [--compare lora|checkpointing|precision|devices]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown flag `{other}`")),
        }
    }
    if rank == 0 || steps == 0 {
        return Err("--rank and --steps must be at least 1".into());
    }
    Ok((backend, rank, steps, compare))
}

fn parent() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (backend, rank, _, compare) = flags(&args)?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let (layers, batch, context) = shape(&compare);
    let two_devices = format!("{backend},{}", second_device(&backend));
    let variants: Vec<&str> = match compare.as_str() {
        "checkpointing" => vec!["stored", "checkpointed"],
        "precision" if backend.starts_with("wgpu") => vec!["f32", "f16"],
        "precision" => vec!["f32", "bf16", "f16"],
        "devices" => vec![backend.as_str(), two_devices.as_str()],
        _ => vec!["full", "lora"],
    };
    println!(
        "training steps on {backend}: LLaMA-style, {layers} layers, width 512, vocab {VOCAB}, \
         batch {batch} × {context} tokens, AdamW; {}",
        match compare.as_str() {
            "checkpointing" =>
                "activations stored vs recomputed (balanced checkpointing)".to_string(),
            "precision" => "f32 vs mixed precision (f32 master weights)".to_string(),
            "devices" => "one device vs two sharing each batch, through burn-train".to_string(),
            _ => format!("full fine-tuning vs LoRA rank {rank} on q,k,v,o,gate,up,down"),
        }
    );
    println!(
        "| variant | trainable parameters | AdamW state | ms/step ({}) | tokens/s | peak memory | measured as |",
        match compare.as_str() {
            "devices" => "mean",
            _ => "median",
        }
    );
    println!("|---|---:|---:|---:|---:|---:|---|");
    let mut rows = Vec::new();
    for &variant in &variants {
        let output = Command::new(&exe)
            .arg("--child")
            .arg(variant)
            .args(&args)
            .output()
            .map_err(|e| e.to_string())?;
        if !output.status.success() {
            return Err(format!(
                "{variant}: {}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        let line = String::from_utf8_lossy(&output.stdout).trim().to_string();
        let fields: Vec<&str> = line.split('\t').collect();
        let [trainable, total, ms, peak, how] = fields[..] else {
            return Err(format!("{variant}: unexpected output {line}"));
        };
        let trainable: usize = trainable.parse().map_err(|e| format!("{e}"))?;
        let total: usize = total.parse().map_err(|e| format!("{e}"))?;
        let peak: f64 = peak.parse().map_err(|e| format!("{e}"))?;
        let ms: f64 = ms.parse().map_err(|e| format!("{e}"))?;
        println!(
            "| {variant} | {trainable} of {total} | {:.1} MiB | {ms:.1} | {:.0} | {:.0} MiB | {how} |",
            // Adam keeps two f32 moments per trainable parameter.
            (2 * 4 * trainable) as f64 / (1 << 20) as f64,
            (batch * context) as f64 / ms * 1e3,
            peak / (1 << 20) as f64
        );
        rows.push((variant, peak, ms));
    }
    if let [(first, first_peak, first_ms), rest @ ..] = &rows[..] {
        for (other, peak, ms) in rest {
            println!(
                "{other} / {first}: peak memory {:.2}×, time per step {:.2}×, tokens/s {:.2}×",
                peak / first_peak,
                ms / first_ms,
                first_ms / ms
            );
        }
    }
    Ok(())
}

/// The second device of `--compare devices`: the next CUDA device, elsewhere the same
/// device again (a second worker on it, which is what two devices of one CPU backend
/// are).
fn second_device(backend: &str) -> String {
    match backend.split(':').next() {
        Some("cuda") => "cuda:1".to_string(),
        _ => backend.to_string(),
    }
}

/// One variant: prints `trainable \t total \t ms \t peak bytes \t how`.
fn child() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(2).collect();
    let variant = args.first().cloned().ok_or("--child needs a variant")?;
    let (backend, rank, steps, compare) = flags(&args[1..])?;
    let (layers, batch, context) = shape(&compare);
    if compare == "devices" {
        return devices_child(&variant, steps, [layers, batch, context]);
    }
    let device = burn_transformer::device::parse_device(&backend)
        .map_err(|e| e.to_string())?
        .autodiff();
    let device = match variant.as_str() {
        "checkpointed" => device.gradient_checkpointing(),
        _ => device,
    };
    let mut memory = PeakMemory::start(&device);
    let model =
        host_init(0, |host| config(layers, context).try_init(host)).map_err(|e| e.to_string())?;
    let total = model.num_params();
    let (model, trainable) = match variant.as_str() {
        "lora" => {
            let (model, summary) = attach_lora(model, &LoraConfig::new(rank, 2.0 * rank as f64))
                .map_err(|e| e.to_string())?;
            (model, summary.trainable)
        }
        _ => (model, total),
    };
    let precision = Precision::parse(&variant).unwrap_or_default();
    let timing = time_train_steps(
        model,
        precision,
        &device,
        VOCAB,
        [batch, context],
        Runs::new(2, steps),
        || memory.sample(),
    )?;
    let (peak, how) = memory.peak();
    println!(
        "{trainable}\t{}\t{:.1}\t{}\t{how}",
        total + if variant == "lora" { trainable } else { 0 },
        timing.median_ms,
        peak.unwrap_or(0)
    );
    Ok(())
}

/// One `--compare devices` variant (`variant` lists its devices): trains through
/// burn-train as `train-lm --devices` does, first two steps to compile and allocate,
/// then `steps` timed steps in a new run of the same process. Prints the same line as
/// [`child`], the time being the mean of the timed run's steps (validation excluded).
fn devices_child(
    variant: &str,
    steps: usize,
    [layers, batch, context]: [usize; 3],
) -> Result<(), String> {
    let devices = variant
        .split(',')
        .map(|name| burn_transformer::device::parse_device(name).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let (device, extra_devices) = devices.split_first().ok_or("--child needs devices")?;
    // One tracker per distinct device: two workers on one device share its pool.
    let mut distinct: Vec<Device> = Vec::new();
    for candidate in &devices {
        if !distinct.contains(candidate) {
            distinct.push(candidate.clone());
        }
    }
    let mut memory: Vec<PeakMemory> = distinct.iter().map(PeakMemory::start).collect();
    let model =
        host_init(0, |host| config(layers, context).try_init(host)).map_err(|e| e.to_string())?;
    let total = model.num_params();
    // Random tokens, as the other comparisons train on; enough for every window.
    let split = TokenSplit {
        train: random_tokens(batch * context * 16, VOCAB, 0).into(),
        validation: random_tokens(batch * context * 2, VOCAB, 1 << 20).into(),
    };
    let mut run = |steps: usize| -> Result<f64, String> {
        let training = LmTrainingConfig::new()
            .with_batch_size(batch)
            .with_context(context)
            .with_steps(steps)
            .with_eval_interval(steps)
            .with_eval_batches(1)
            .with_warmup_steps(0);
        let folder =
            tempfile::TempDir::with_prefix("fine-tune-devices").map_err(|e| e.to_string())?;
        let options = RunOptions {
            extra_devices: extra_devices.to_vec(),
            ..RunOptions::quiet(folder.path())
        };
        let result = train_language_model_from(model.clone(), &training, &split, device, &options)
            .map_err(|e| e.to_string())?;
        memory.iter_mut().for_each(PeakMemory::sample);
        Ok(result.history.train_seconds)
    };
    run(2)?;
    let seconds = run(steps)?;
    // Every device's pool on GPUs; on CPU backends the process's peak, counted once.
    let peaks: Vec<_> = memory.iter_mut().map(PeakMemory::peak).collect();
    let how = peaks[0].1;
    let peak: u64 = match device.memory_pool_usage() {
        Some(_) => peaks.iter().filter_map(|(bytes, _)| *bytes).sum(),
        None => peaks[0].0.unwrap_or(0),
    };
    println!(
        "{total}\t{total}\t{:.1}\t{peak}\t{how}",
        seconds / steps as f64 * 1e3
    );
    Ok(())
}
