//! `generate`: text generation with a Hugging Face model or a model trained by
//! `train-lm`, streamed as it is decoded.
//!
//! ```text
//! generate --model DIR --prompt TEXT [--tokenizer tokenizer.json] [--max-new-tokens N]
//!          [--temperature T [--top-k K] [--top-p P] [--min-p P] [--seed S]]
//!          [--repetition-penalty R] [--num-beams B [--length-penalty L]] [--speculative]
//!          [--device flex|ndarray|wgpu|cuda] [--dtype f32|f16|bf16]
//! ```
//!
//! `DIR` is a Hugging Face model folder (its `tokenizer.json`, or `--tokenizer`) or the
//! `--out` folder of a finished `train-lm` run (its own tokenizer). A Hugging Face model
//! decodes as transformers' `generate` does by default: with the settings of its
//! `generation_config.json` (sampling or not, temperature, top-k, top-p, min-p,
//! repetition penalty, beams, end-of-text tokens) and transformers' defaults for the
//! rest (top-k 50 when sampling); each flag overrides one setting. A run decodes
//! greedily by default. `--temperature 0` is greedy decoding; above 0 it samples
//! (top-k, top-p and min-p filter the candidates), reproducibly for a given `--seed`.
//! The decoding used is printed on stderr first. `--num-beams` above 1 runs beam
//! search and prints the best hypothesis at the end. `--speculative` decodes greedily with self-speculative
//! decoding: the model's multi-token-prediction module (a DeepSeek-V3 checkpoint that
//! has one, or a `train-lm --mtp-depth 1` run) drafts the token after next and the
//! model verifies it; the tokens are greedy decoding's, and the acceptance rate and
//! speed are printed at the end. Generation stops at a Hugging Face model's `eos_token_id`s
//! (`generation_config.json`'s, else `config.json`'s) or after `--max-new-tokens`; a run's tokens are each predicted from at most the
//! `--context` it was trained with. Every flag is checked before anything is loaded.

use std::path::PathBuf;
use std::process::ExitCode;

use burn_transformer::generate::{
    BeamSearchConfig, EarlyStopping, GenerationConfig, SamplingConfig, beam_search, generate,
    generate_speculative,
};
use burn_transformer::hf::{GENERATION_CONFIG_FILE, HfGenerationConfig};
use clap::Parser;
use examples::trained::{ModelFolder, TextTokenizer};
use examples::{ModelFlags, StreamedText};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Generates text with a Hugging Face model or a model trained by train-lm.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    #[command(flatten)]
    model: ModelFlags,
    /// The text to continue.
    #[arg(long)]
    prompt: String,
    /// The tokenizer file of a Hugging Face model. Default: DIR/tokenizer.json (a
    /// train-lm run always uses its own).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// At most this many new tokens.
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy decoding. Default: the model's
    /// generation_config.json (greedy without one).
    #[arg(long, allow_negative_numbers = true)]
    temperature: Option<f32>,
    /// Sample among the K most likely tokens only; 0: no such filter. Default: the
    /// model's generation_config.json, else 50 for a Hugging Face model (transformers'
    /// default) and none for a train-lm run.
    #[arg(long)]
    top_k: Option<usize>,
    /// Sample among the most likely tokens that make up probability P; 1: no such
    /// filter. Default: the model's generation_config.json, else none.
    #[arg(long, allow_negative_numbers = true)]
    top_p: Option<f32>,
    /// Sample among the tokens at least P times as likely as the most likely one
    /// (min-p); 0: no such filter. Default: the model's generation_config.json, else
    /// none.
    #[arg(long, allow_negative_numbers = true)]
    min_p: Option<f32>,
    /// Seed of the sampler (when sampling). Default: 0.
    #[arg(long)]
    seed: Option<u64>,
    /// Penalize repeated tokens (greedy, sampled or beam search); 1: none. Default: the
    /// model's generation_config.json, else 1.
    #[arg(long, allow_negative_numbers = true)]
    repetition_penalty: Option<f32>,
    /// Beam search with this many beams (no streaming); 1 is one sequence. Default: the
    /// model's generation_config.json, else 1.
    #[arg(long)]
    num_beams: Option<usize>,
    /// Length penalty of beam search (with more than one beam). Default: the model's
    /// generation_config.json, else 1.
    #[arg(long, allow_negative_numbers = true)]
    length_penalty: Option<f32>,
    /// Greedy decoding drafted by the model's multi-token-prediction module and
    /// verified by the model (same tokens as greedy decoding).
    #[arg(long)]
    speculative: bool,
}

/// How tokens are chosen, as the flags ask.
enum Decoding {
    /// One token at a time, printed as it comes.
    Stream(SamplingConfig),
    /// Greedy, drafted by the multi-token-prediction module, printed as it comes.
    Speculative,
    /// Beam search, printed at the end.
    Beams {
        num_beams: usize,
        length_penalty: f32,
        early_stopping: EarlyStopping,
        repetition_penalty: f32,
    },
}

impl Decoding {
    /// The decoding in words, for the line printed before the text.
    fn describe(&self) -> String {
        match self {
            Self::Speculative => "greedy, self-speculative".into(),
            Self::Beams {
                num_beams,
                length_penalty,
                repetition_penalty,
                ..
            } => format!(
                "beam search, {num_beams} beams, length penalty {length_penalty}, repetition \
                 penalty {repetition_penalty}"
            ),
            Self::Stream(config) if !config.do_sample => match config.repetition_penalty {
                1.0 => "greedy".into(),
                penalty => format!("greedy, repetition penalty {penalty}"),
            },
            Self::Stream(config) => {
                let mut settings = vec![format!("temperature {}", config.temperature)];
                if let Some(k) = config.top_k {
                    settings.push(format!("top-k {k}"));
                }
                if let Some(p) = config.top_p {
                    settings.push(format!("top-p {p}"));
                }
                if let Some(p) = config.min_p {
                    settings.push(format!("min-p {p}"));
                }
                settings.push(format!("repetition penalty {}", config.repetition_penalty));
                settings.push(format!("seed {}", config.seed));
                format!("sampling, {}", settings.join(", "))
            }
        }
    }
}

fn main() -> ExitCode {
    examples::exit_with(run(&Args::parse()))
}

/// Checks every decoding flag, alone and together, and merges them with the model's
/// `defaults` (each flag replaces one setting, as transformers' `generate` arguments
/// replace the file's): a Hugging Face model's `generation_config.json` or
/// transformers' defaults without one; `None` for a run (greedy, no filters). A value
/// out of range, or a flag that would have no effect with the others (`--top-k` on
/// greedy decoding), is an error rather than ignored. Settings of the model's file that
/// the decoding cannot use are returned as notes.
fn decoding(
    args: &Args,
    defaults: Option<&HfGenerationConfig>,
) -> Result<(Decoding, Vec<String>), String> {
    if args.max_new_tokens == 0 {
        return Err("--max-new-tokens must be at least 1".into());
    }
    if let Some(temperature) = args.temperature
        && !(temperature.is_finite() && temperature >= 0.0)
    {
        return Err(format!(
            "--temperature must be 0 (greedy) or a finite positive number, got {temperature}"
        ));
    }
    if let Some(p) = args.top_p
        && !(p > 0.0 && p <= 1.0)
    {
        return Err(format!(
            "--top-p must be in (0, 1] (1: no top-p filter), got {p}"
        ));
    }
    if let Some(p) = args.min_p
        && !(0.0..=1.0).contains(&p)
    {
        return Err(format!(
            "--min-p must be in [0, 1] (0: no min-p filter), got {p}"
        ));
    }
    if let Some(penalty) = args.repetition_penalty
        && !(penalty.is_finite() && penalty > 0.0)
    {
        return Err(format!(
            "--repetition-penalty must be a finite positive number (1 disables it), got \
             {penalty}"
        ));
    }
    if args.num_beams == Some(0) {
        return Err("--num-beams must be at least 1 (1 is one sequence)".into());
    }
    if let Some(penalty) = args.length_penalty
        && !penalty.is_finite()
    {
        return Err(format!("--length-penalty must be finite, got {penalty}"));
    }

    let model = defaults.map_or_else(SamplingConfig::greedy, |file| file.sampling.clone());
    let asked_sampling = args.temperature.is_some_and(|t| t > 0.0);
    let sampling = args.temperature.map_or(model.do_sample, |t| t > 0.0);
    let repetition_penalty = args.repetition_penalty.unwrap_or(model.repetition_penalty);
    let mut notes = Vec::new();
    if args.speculative {
        let others = [
            ("--temperature", asked_sampling),
            ("--repetition-penalty", args.repetition_penalty.is_some()),
            ("--num-beams", args.num_beams.is_some_and(|beams| beams > 1)),
        ];
        if let Some((flag, _)) = others.iter().find(|(_, given)| *given) {
            return Err(format!(
                "--speculative decodes greedily: it cannot be combined with {flag}"
            ));
        }
        if model.do_sample || model.repetition_penalty != 1.0 {
            notes.push(format!(
                "{GENERATION_CONFIG_FILE} asks for {}: --speculative decodes greedily \
                 without it",
                Decoding::Stream(model.clone()).describe()
            ));
        }
    }
    let sampling_flags = [
        ("--top-k", args.top_k.is_some()),
        ("--top-p", args.top_p.is_some()),
        ("--min-p", args.min_p.is_some()),
        ("--seed", args.seed.is_some()),
    ];
    if !sampling && let Some((flag, _)) = sampling_flags.iter().find(|(_, given)| *given) {
        return Err(if args.temperature.is_some() {
            format!("{flag} applies to sampling, and --temperature 0 decodes greedily")
        } else {
            format!(
                "{flag} applies to sampling: add --temperature T (T > 0); without it \
                 decoding is greedy (as the model's defaults are)"
            )
        });
    }
    let file_beams = defaults.map_or(1, |file| file.num_beams);
    let num_beams = args
        .num_beams
        .unwrap_or(if args.speculative { 1 } else { file_beams });
    if num_beams > 1 {
        if asked_sampling && args.num_beams.is_some() {
            return Err(
                "--num-beams searches deterministically: it cannot be combined with \
                 --temperature (sampling)"
                    .into(),
            );
        }
        if sampling && args.num_beams.is_none() {
            // transformers would sample within the beams, which beam_search does not.
            notes.push(format!(
                "{GENERATION_CONFIG_FILE} asks for {file_beams} beams, and sampling makes \
                 that beam sampling, which this program does not do: sampling one \
                 sequence (--num-beams {file_beams} --temperature 0 searches the beams \
                 deterministically)"
            ));
        } else {
            if sampling {
                notes.push(format!(
                    "{GENERATION_CONFIG_FILE} asks for sampling: --num-beams searches \
                     deterministically without it"
                ));
            }
            return Ok((
                Decoding::Beams {
                    num_beams,
                    length_penalty: args
                        .length_penalty
                        .unwrap_or(defaults.map_or(1.0, |file| file.length_penalty)),
                    early_stopping: defaults
                        .map_or(EarlyStopping::Heuristic, |file| file.early_stopping),
                    repetition_penalty,
                },
                notes,
            ));
        }
    }
    if args.length_penalty.is_some() {
        return Err("--length-penalty applies to beam search: add --num-beams B (B > 1)".into());
    }
    if args.speculative {
        return Ok((Decoding::Speculative, notes));
    }
    let config = SamplingConfig {
        do_sample: sampling,
        temperature: args
            .temperature
            .filter(|&t| t > 0.0)
            .unwrap_or(model.temperature),
        top_k: args.top_k.map_or(model.top_k, |k| (k > 0).then_some(k)),
        top_p: args.top_p.map_or(model.top_p, |p| (p < 1.0).then_some(p)),
        min_p: args.min_p.map_or(model.min_p, |p| (p > 0.0).then_some(p)),
        repetition_penalty,
        seed: args.seed.unwrap_or(0),
    };
    config.validate().map_err(|error| error.to_string())?;
    Ok((Decoding::Stream(config), notes))
}

/// Prints the streamed text's rest once decoding has ended (a last incomplete
/// character, which waited for a token that did not come).
fn finish(stream: &mut StreamedText, tokenizer: &TextTokenizer, error: &mut Option<String>) {
    match stream.finish(|tokens| tokenizer.decode(tokens)) {
        Ok(text) => examples::print_now(&text),
        Err(decode_error) => *error = error.take().or(Some(decode_error)),
    }
}

fn run(args: &Args) -> Result<(), String> {
    // Everything that can be refused is refused before the model loads and before
    // the prompt is printed.
    let folder = args.model.folder()?;
    let file = folder.generation_config()?;
    let has_file = file.is_some();
    let defaults = match (&folder, file) {
        (ModelFolder::HuggingFace(_), file) => Some(file.unwrap_or_default()),
        (ModelFolder::Run(_), _) => None,
    };
    let (decoding, notes) = decoding(args, defaults.as_ref())?;
    let tokenizer = folder.tokenizer(args.tokenizer.as_deref())?;
    let prompt = tokenizer
        .encode(&args.prompt)
        .map_err(|error| format!("--prompt: {error}"))?;
    if prompt.is_empty() {
        return Err("--prompt is empty after tokenization".into());
    }
    let loaded = args.model.load(&folder)?;
    let vocab = loaded.model.vocab_size();
    if let Some(token) = prompt.iter().find(|&&token| token as usize >= vocab) {
        return Err(format!(
            "--prompt: the tokenizer gives token {token}, outside the model's vocabulary \
             (0..{vocab})"
        ));
    }

    if matches!(decoding, Decoding::Speculative) {
        if loaded.model.mtp_depth() == 0 {
            return Err(
                "--speculative: the model has no multi-token-prediction module to draft \
                 with (train one with train-lm --mtp-depth 1, or use a DeepSeek-V3 \
                 checkpoint that holds its MTP layer)"
                    .into(),
            );
        }
        if let Some(context) = loaded.max_context
            && prompt.len() + args.max_new_tokens > context
        {
            return Err(format!(
                "--speculative keeps the whole context, and the model was trained on \
                 windows of {context} tokens: the prompt ({} tokens) and \
                 --max-new-tokens ({}) must fit in them",
                prompt.len(),
                args.max_new_tokens
            ));
        }
    }

    let source = match (&folder, has_file) {
        (ModelFolder::Run(_), _) => "",
        (ModelFolder::HuggingFace(_), true) => {
            " (the model's generation_config.json and the flags)"
        }
        (ModelFolder::HuggingFace(_), false) => " (transformers' defaults and the flags)",
    };
    eprintln!("decoding{source}: {}", decoding.describe());
    for note in notes {
        eprintln!("note: {note}");
    }
    print!("{}", args.prompt);
    examples::flush();
    let (stop_tokens, pad_token) = loaded.stop_and_pad_tokens(defaults.as_ref());
    let generation = match decoding {
        Decoding::Beams {
            num_beams,
            length_penalty,
            early_stopping,
            repetition_penalty,
        } => {
            let beam = BeamSearchConfig::new(num_beams, args.max_new_tokens)
                .with_length_penalty(length_penalty)
                .with_early_stopping(early_stopping)
                .with_repetition_penalty(repetition_penalty)
                .with_stop_tokens(stop_tokens)
                .with_pad_token(pad_token);
            let hypotheses =
                beam_search(&loaded.model, &[prompt], &beam).map_err(|error| error.to_string())?;
            if let Some(best) = hypotheses.first().and_then(|h| h.first()) {
                let text = tokenizer
                    .decode(&best.tokens)
                    .map_err(|error| format!("cannot decode: {error}"))?;
                println!("{text}");
            }
            return Ok(());
        }
        Decoding::Speculative => GenerationConfig::greedy(args.max_new_tokens)
            .with_stop_tokens(stop_tokens)
            .with_pad_token(pad_token),
        Decoding::Stream(sampling) => GenerationConfig::greedy(args.max_new_tokens)
            .with_stop_tokens(stop_tokens)
            .with_pad_token(pad_token)
            .with_sampling(sampling)
            .with_max_context(loaded.max_context),
    };

    let mut stream = StreamedText::default();
    let mut decode_error = None;
    let mut print = |token| match stream.push(token, |tokens| tokenizer.decode(tokens)) {
        Ok(text) => examples::print_now(&text),
        Err(error) => decode_error = Some(error),
    };
    if args.speculative {
        let start = std::time::Instant::now();
        let output = generate_speculative(&loaded.model, &prompt, &generation, &mut print)
            .map_err(|error| error.to_string())?;
        let seconds = start.elapsed().as_secs_f64();
        finish(&mut stream, &tokenizer, &mut decode_error);
        println!();
        eprintln!(
            "speculative: {} tokens in {} passes of the model, {} of {} drafts accepted \
             ({:.0}%), {:.1} tokens/s",
            output.generated.tokens.len(),
            output.model_passes,
            output.accepted,
            output.drafted,
            100.0 * output.acceptance_rate(),
            output.generated.tokens.len() as f64 / seconds.max(1e-9)
        );
    } else {
        generate(&loaded.model, &[prompt], &generation, |event| {
            print(event.token)
        })
        .map_err(|error| error.to_string())?;
        finish(&mut stream, &tokenizer, &mut decode_error);
        println!();
    }
    match decode_error {
        Some(error) => Err(format!("cannot decode: {error}")),
        None => Ok(()),
    }
}
