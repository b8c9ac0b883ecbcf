//! Tokenizes a corpus once into memory-mapped shards, for corpora larger than memory
//! (or too large to tokenize at every run): `train-lm --data OUT` then trains on the
//! shards.
//!
//! ```text
//! cargo run --release -p examples --bin prepare-data -- --data corpus/ --out shards/ --tokenizer bpe:8192
//! cargo run --release -p examples --bin train-lm -- --data shards/ --preset 50m
//! ```
//!
//! The text is read a chunk at a time; a progress line shows bytes, ids, shards, speed
//! and the time left. An interrupted preparation, run again with the same flags,
//! continues from its last shard.

use std::io::{IsTerminal, Read, Write};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use burn_transformer::io::read_bytes;
use burn_transformer::train::{
    ByteTokenizer, CharTokenizer, PrepareConfig, PrepareProgress, SourceFile, Tokenizer,
    check_prepare_folder, prepare_shards, text_files,
};
use clap::Parser;
use examples::hf_tokenizer::HfTokenizer;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Tokenize a text file or folder into memory-mapped shards for train-lm --data"
)]
struct Args {
    /// A UTF-8 text file, or a folder whose UTF-8 files are read in path order.
    #[arg(long)]
    data: PathBuf,
    /// The folder the shards go to (created; it must be empty, or hold an unfinished
    /// preparation of the same data to continue).
    #[arg(long)]
    out: PathBuf,
    /// `char` (one id per character of the corpus), `bytes` (256 ids), `bpe:VOCAB` (a
    /// byte-level BPE trained on the head of the training text, see
    /// --bpe-sample-mb) or a Hugging Face tokenizer.json file.
    #[arg(long, default_value = "char")]
    tokenizer: String,
    /// Ids per shard file (a shard closes at the first chunk end past it).
    #[arg(long, default_value_t = 1 << 26)]
    shard_tokens: usize,
    /// Fraction of the ids (the stream's end) held out for validation.
    #[arg(long, default_value_t = 0.1)]
    validation_fraction: f64,
    /// Megabytes of text (from the head of the training part) a `bpe:VOCAB` tokenizer
    /// is trained on.
    #[arg(long, default_value_t = 64)]
    bpe_sample_mb: usize,
    /// Prepare again in an --out that holds a complete preparation, or an unfinished
    /// one of other data (its shards are removed first).
    #[arg(long)]
    overwrite: bool,
}

fn main() -> ExitCode {
    examples::exit_with(run(Args::parse()))
}

/// A tokenizer, how the folder keeps it (`bytes` or a file name), and that file's
/// content.
type KeptTokenizer = (Box<dyn Tokenizer>, String, Option<Vec<u8>>);

/// The tokenizer of `--tokenizer` (an unfinished preparation's, when `reuse`).
fn tokenizer(args: &Args, sources: &[SourceFile], reuse: bool) -> Result<KeptTokenizer, String> {
    let err = |e: burn_transformer::train::TrainError| e.to_string();
    let saved = |name: &str| reuse.then(|| args.out.join(name)).filter(|p| p.is_file());
    Ok(match args.tokenizer.as_str() {
        "bytes" => (Box::new(ByteTokenizer), "bytes".into(), None),
        "char" => {
            let chars = match saved("vocab.json") {
                Some(path) => CharTokenizer::load(&path).map_err(err)?,
                None => {
                    let mut seen = std::collections::BTreeSet::new();
                    // Two files are joined by a newline (where the first lacks one).
                    if sources.iter().filter(|s| s.bytes > 0).count() > 1 {
                        seen.insert('\n');
                    }
                    for source in sources {
                        let text = std::fs::read_to_string(&source.path)
                            .map_err(|e| format!("{}: {e}", source.path.display()))?;
                        seen.extend(text.chars());
                    }
                    CharTokenizer::from_text(&seen.into_iter().collect::<String>()).map_err(err)?
                }
            };
            let json = serde_json::to_vec_pretty(&chars).map_err(|e| e.to_string())?;
            (Box::new(chars), "vocab.json".into(), Some(json))
        }
        spec if spec.starts_with("bpe:") => {
            let vocab = spec["bpe:".len()..].parse::<usize>().map_err(|_| {
                format!("--tokenizer {spec}: expected bpe:VOCAB with a number, e.g. bpe:8192")
            })?;
            let bpe = match saved("tokenizer.json") {
                Some(path) => HfTokenizer::load(&path).map_err(err)?,
                None => {
                    let total: u64 = sources.iter().map(|s| s.bytes).sum();
                    let head = ((total as f64 * (1.0 - args.validation_fraction)) as u64)
                        .min((args.bpe_sample_mb as u64) << 20);
                    let sample = read_head(sources, head)?;
                    let started = Instant::now();
                    let bpe =
                        HfTokenizer::train_bpe(&sample, vocab, &args.out.join("tokenizer.json"))
                            .map_err(err)?;
                    println!(
                        "trained a byte-level BPE of {} tokens on {:.1} MB in {:.1} s",
                        bpe.vocab_size(),
                        sample.len() as f64 / 1e6,
                        started.elapsed().as_secs_f64()
                    );
                    bpe
                }
            };
            let json = bpe.to_json().map_err(err)?.into_bytes();
            (Box::new(bpe), "tokenizer.json".into(), Some(json))
        }
        file => {
            let path = PathBuf::from(file);
            let hf = HfTokenizer::load(&path).map_err(err)?;
            let bytes = read_bytes(&path).map_err(|e| e.to_string())?;
            (Box::new(hf), "tokenizer.json".into(), Some(bytes))
        }
    })
}

/// The first `bytes` of the concatenated sources, cut after the last whole line.
fn read_head(sources: &[SourceFile], bytes: u64) -> Result<String, String> {
    let mut head = Vec::new();
    for source in sources {
        let left = bytes.saturating_sub(head.len() as u64);
        if left == 0 {
            break;
        }
        std::fs::File::open(&source.path)
            .and_then(|file| file.take(left).read_to_end(&mut head))
            .map_err(|e| format!("{}: {e}", source.path.display()))?;
        if !head.ends_with(b"\n") && (head.len() as u64) < bytes {
            head.push(b'\n');
        }
    }
    if let Some(newline) = head.iter().rposition(|&b| b == b'\n') {
        head.truncate(newline + 1);
    }
    String::from_utf8(head).map_err(|e| format!("the corpus' head is not UTF-8: {e}"))
}

/// A progress line on stderr: rewritten in place on a terminal, one line every ten
/// percent elsewhere (logs).
struct ProgressLine {
    started: Instant,
    last: Option<Instant>,
    last_tenth: u64,
    terminal: bool,
    /// Bytes done before this process started (a continued preparation).
    bytes_at_start: u64,
}

impl ProgressLine {
    fn new(bytes_at_start: u64) -> Self {
        Self {
            started: Instant::now(),
            last: None,
            last_tenth: 0,
            terminal: std::io::stderr().is_terminal(),
            bytes_at_start,
        }
    }

    fn show(&mut self, progress: &PrepareProgress, last: bool) {
        let first = self.bytes_at_start;
        let now = Instant::now();
        let fraction = progress.bytes_done as f64 / progress.bytes_total.max(1) as f64;
        let tenth = (fraction * 10.0) as u64;
        let due = if self.terminal {
            self.last
                .is_none_or(|t| now.duration_since(t).as_secs_f64() >= 0.25)
        } else {
            tenth > self.last_tenth
        };
        if !(due || last) {
            return;
        }
        self.last = Some(now);
        self.last_tenth = tenth;
        let seconds = now.duration_since(self.started).as_secs_f64().max(1e-3);
        let speed = (progress.bytes_done - first) as f64 / seconds;
        let left = (progress.bytes_total - progress.bytes_done) as f64 / speed.max(1.0);
        let line = format!(
            "{:5.1}% | {:.1} of {:.1} MB | {} ids | {} shards | {:.1} MB/s | {}",
            100.0 * fraction,
            progress.bytes_done as f64 / 1e6,
            progress.bytes_total as f64 / 1e6,
            progress.tokens,
            progress.shards,
            speed / 1e6,
            if last {
                format!("{seconds:.1} s")
            } else {
                format!("{left:.0} s left")
            }
        );
        let mut stderr = std::io::stderr();
        if self.terminal {
            let _ = write!(stderr, "\r{line}\x1b[K");
            if last {
                let _ = writeln!(stderr);
            }
        } else {
            let _ = writeln!(stderr, "{line}");
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    if !(args.validation_fraction > 0.0 && args.validation_fraction < 1.0) {
        return Err(format!(
            "--validation-fraction must be between 0 and 1, got {}",
            args.validation_fraction
        ));
    }
    if args.shard_tokens == 0 || args.bpe_sample_mb == 0 {
        return Err("--shard-tokens and --bpe-sample-mb must be at least 1".into());
    }
    let sources = text_files(&args.data).map_err(|e| e.to_string())?;
    let total: u64 = sources.iter().map(|s| s.bytes).sum();
    // A folder that cannot take this preparation is refused before a tokenizer is
    // trained; an unfinished preparation's tokenizer is reused.
    let before = check_prepare_folder(&args.out, args.overwrite)
        .map_err(|e| e.to_string())?
        .filter(|manifest| !manifest.is_complete() && !args.overwrite);
    let (tokenizer, kept, file) = tokenizer(&args, &sources, before.is_some())?;
    println!(
        "{}: {} files, {:.1} MB of text; tokenizer: {}",
        args.data.display(),
        sources.len(),
        total as f64 / 1e6,
        tokenizer.describe()
    );
    if let Some(before) = &before
        && before.sources == sources
    {
        println!(
            "continuing the unfinished preparation in {}: {} shards ({} ids) written",
            args.out.display(),
            before.shards.len(),
            before.tokens
        );
    }
    let config = PrepareConfig {
        shard_tokens: args.shard_tokens,
        validation_fraction: args.validation_fraction,
        tokenizer: kept,
        tokenizer_file: file,
        overwrite: args.overwrite,
        ..PrepareConfig::new("bytes")
    };
    let done_before = before
        .as_ref()
        .and_then(|manifest| manifest.cursor)
        .map_or(0, |cursor| {
            sources[..cursor.source.min(sources.len())]
                .iter()
                .map(|s| s.bytes)
                .sum::<u64>()
                + cursor.offset
        });
    let mut line = ProgressLine::new(done_before);
    let mut last = None;
    let manifest = prepare_shards(&sources, tokenizer.as_ref(), &args.out, &config, |p| {
        line.show(p, false);
        last = Some(*p);
        ControlFlow::Continue(())
    })
    .map_err(|e| e.to_string())?;
    if let Some(progress) = last {
        // The last shard is written after the last chunk's report.
        let finished = PrepareProgress {
            tokens: manifest.tokens,
            shards: manifest.shards.len(),
            ..progress
        };
        line.show(&finished, true);
    }
    let train = manifest.train_tokens.unwrap_or(0);
    println!(
        "{}: {} ids in {} {} shards ({} training, {} validation); train with \
         train-lm --data {}",
        args.out.display(),
        manifest.tokens,
        manifest.shards.len(),
        manifest.dtype,
        train,
        manifest.tokens - train,
        args.out.display()
    );
    Ok(())
}
