//! `export-hf`: a `train-lm` run (trained from scratch or fine-tuned with
//! `--init-from`, with or without LoRA) or any model folder the crate loads, saved as
//! a Hugging Face model folder that transformers, vLLM and `generate` load.
//!
//! ```text
//! export-hf --checkpoint RUN_DIR --out DIR [--dtype f32|bf16|f16] [--max-shard-size 5GB]
//!           [--adapters-only] [--overwrite]
//! ```
//!
//! The folder holds `config.json` (the base model's for a fine-tuned run; the LLaMA,
//! Qwen2 or Qwen3 configuration that computes the same function for a model trained
//! from scratch), `model.safetensors` (shards and `model.safetensors.index.json` above
//! `--max-shard-size`) in transformers' names and layouts, LoRA adapters merged into
//! the weights, and the run's tokenizer files. `--adapters-only` writes a LoRA run's
//! adapters in PEFT's layout (`adapter_config.json`, `adapter_model.safetensors`)
//! instead. The folder is written under a temporary name and renamed when complete:
//! an interrupted export leaves no half-written folder at `--out`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use burn::tensor::{DType, Device};
use burn_transformer::hf::{
    CONFIG_FILE, ExportOptions, HfConfig, dtype_name, hf_config_json, save_causal_lm,
    save_peft_adapters,
};
use burn_transformer::io::{read_bytes, read_text, write_atomically};
use clap::Parser;
use examples::parse_dtype;
use examples::trained::{BASE_CONFIG_FILE, BASE_EXTRA_FILES, ModelFolder, TOKENIZER_FILE};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Saves a train-lm run (or a model folder) as a Hugging Face model folder.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// The train-lm run's folder (its --out), or a Hugging Face model folder to
    /// re-save (another dtype or shard size).
    #[arg(long)]
    checkpoint: PathBuf,
    /// The folder to write; it must not exist (or be empty) unless --overwrite.
    #[arg(long)]
    out: PathBuf,
    /// Float type of the saved weights: f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Largest shard, like transformers' max_shard_size: bytes, or with a unit (KB,
    /// MB, GB; 1000-based).
    #[arg(long, default_value = "5GB")]
    max_shard_size: String,
    /// Write only a LoRA run's adapters, in PEFT's layout.
    #[arg(long)]
    adapters_only: bool,
    /// Replace the contents of a non-empty --out.
    #[arg(long)]
    overwrite: bool,
}

fn main() -> ExitCode {
    examples::exit_with(run(&Args::parse()))
}

/// Parses `5GB`, `500MB`, `2000000`.
fn parse_size(text: &str) -> Result<usize, String> {
    let upper = text.trim().to_ascii_uppercase();
    let (number, unit) = match upper.find(|c: char| c.is_ascii_alphabetic()) {
        Some(at) => upper.split_at(at),
        None => (upper.as_str(), "B"),
    };
    let factor: f64 = match unit.trim() {
        "B" => 1.0,
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "KIB" => 1024.0,
        "MIB" => 1024.0 * 1024.0,
        "GIB" => 1024.0 * 1024.0 * 1024.0,
        _ => f64::NAN,
    };
    let value: f64 = number.trim().parse().unwrap_or(f64::NAN);
    let bytes = value * factor;
    if !(bytes.is_finite() && bytes >= 1.0) {
        return Err(format!(
            "--max-shard-size {text}: expected a size such as 5GB, 500MB or 2000000"
        ));
    }
    Ok(bytes as usize)
}

fn run(args: &Args) -> Result<(), String> {
    let dtype = parse_dtype(&args.dtype)?;
    let max_shard_bytes = parse_size(&args.max_shard_size)?;
    let folder = ModelFolder::open(&args.checkpoint)?;
    if args.out.exists() && !args.overwrite {
        let empty = std::fs::read_dir(&args.out).is_ok_and(|mut entries| entries.next().is_none());
        if !empty {
            return Err(format!(
                "{} exists and is not empty: choose another --out, or --overwrite replaces it",
                args.out.display()
            ));
        }
    }
    let run = match &folder {
        ModelFolder::Run(run) => Some(run.as_ref()),
        ModelFolder::HuggingFace(_) => None,
    };
    if args.adapters_only && run.and_then(|run| run.lora()).is_none() {
        return Err(format!(
            "--adapters-only: {} holds no LoRA adapters (a train-lm run with --lora-rank does)",
            args.checkpoint.display()
        ));
    }
    // The configuration first: a model that cannot be exported is refused before
    // anything is loaded.
    let (config_json, base_model) = match (&folder, run) {
        (ModelFolder::HuggingFace(dir), _) => (read_json(&dir.join(CONFIG_FILE))?, dir.clone()),
        (_, Some(run)) if run.dir().join(BASE_CONFIG_FILE).is_file() => {
            let base =
                read_settings_init_from(run.dir()).unwrap_or_else(|| run.dir().to_path_buf());
            (read_json(&run.dir().join(BASE_CONFIG_FILE))?, base)
        }
        (_, Some(run)) => {
            let json = hf_config_json(run.config()).map_err(|e| {
                format!(
                    "{}: cannot export this model: {e}",
                    args.checkpoint.display()
                )
            })?;
            (json, run.dir().to_path_buf())
        }
        _ => unreachable!("a folder is a run or a Hugging Face model"),
    };
    let hf_config = HfConfig::from_value(&config_json, args.checkpoint.join(CONFIG_FILE))
        .map_err(|e| e.to_string())?;

    let device = Device::flex();
    let model = match run {
        Some(run) => run.load_unmerged(&device)?,
        None => folder.load(&device, DType::F32)?.model,
    };

    // Written beside --out, renamed into place when complete.
    let parent = match args.out.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    let name = args
        .out
        .file_name()
        .map_or_else(|| "export".into(), |n| n.to_string_lossy().to_string());
    let staging = parent.join(format!(".{name}.partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(|e| format!("{}: {e}", staging.display()))?;
    let written = write_folder(
        args,
        run,
        &model,
        &hf_config,
        &config_json,
        &base_model,
        dtype,
        max_shard_bytes,
        &staging,
    );
    if let Err(error) = written {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(error);
    }
    if args.out.exists() {
        std::fs::remove_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    }
    std::fs::rename(&staging, &args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    println!("{}: written", args.out.display());
    Ok(())
}

/// The `init_from` a fine-tuning run recorded in its run.json, if any.
fn read_settings_init_from(dir: &Path) -> Option<PathBuf> {
    let text = read_text(&dir.join(examples::run::RUN_FILE)).ok()?;
    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
    value
        .pointer("/args/init_from")?
        .as_str()
        .map(PathBuf::from)
}

fn read_json(path: &Path) -> Result<serde_json::Value, String> {
    let text = read_text(path).map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))
}

#[allow(clippy::too_many_arguments)]
fn write_folder(
    args: &Args,
    run: Option<&examples::trained::RunFolder>,
    model: &burn_transformer::model::CausalLm,
    hf_config: &HfConfig,
    config_json: &serde_json::Value,
    base_model: &Path,
    dtype: DType,
    max_shard_bytes: usize,
    dir: &Path,
) -> Result<(), String> {
    if args.adapters_only {
        let run = run.expect("checked: a LoRA run");
        let lora = run.lora().expect("checked: a LoRA run");
        let pairs = save_peft_adapters(
            model,
            lora,
            hf_config,
            &base_model.display().to_string(),
            dir,
        )
        .map_err(|e| e.to_string())?;
        println!(
            "LoRA adapters of {} layers (rank {}, alpha {}) in PEFT's layout; base model: {}",
            pairs,
            lora.rank,
            lora.alpha,
            base_model.display()
        );
        return Ok(());
    }
    let options = ExportOptions {
        dtype,
        max_shard_bytes,
    };
    let report = save_causal_lm(model, config_json, dir, &options).map_err(|e| e.to_string())?;
    println!(
        "{} ({}): {} tensors, {:.1} MB in {}, {} file{}{}",
        report.model_type,
        dtype_name(dtype),
        report.tensors,
        report.bytes as f64 / 1e6,
        dtype_name(dtype),
        report.files.len() - 1,
        if report.files.len() > 2 { "s" } else { "" },
        match run.and_then(|run| run.lora()) {
            Some(_) => "; LoRA adapters merged into the weights",
            None => "",
        }
    );
    // The tokenizer's files travel with the model.
    let source = match run {
        Some(run) => run.dir().to_path_buf(),
        None => args.checkpoint.clone(),
    };
    let mut copied = Vec::new();
    for name in std::iter::once(TOKENIZER_FILE).chain(BASE_EXTRA_FILES) {
        let path = source.join(name);
        if path.is_file() {
            read_bytes(&path)
                .and_then(|bytes| write_atomically(&dir.join(name), bytes))
                .map_err(|e| e.to_string())?;
            copied.push(name);
        }
    }
    if let Some(vocabulary) = run
        .and_then(|run| run.tokenizer_file())
        .filter(|file| file.ends_with("vocab.json"))
    {
        read_bytes(vocabulary)
            .and_then(|bytes| write_atomically(&dir.join("vocab.json"), bytes))
            .map_err(|e| e.to_string())?;
        println!(
            "tokenizer: the run's character vocabulary is copied as vocab.json (id → \
             character); transformers has no tokenizer for it"
        );
    } else if !copied.is_empty() {
        println!("tokenizer: {}", copied.join(", "));
    }
    Ok(())
}
