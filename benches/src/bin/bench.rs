//! The benchmark runner: every suite on every available backend, one child process
//! per job, then the report in `docs/benchmarks/` and `docs/benchmarks.md`.
//!
//! ```text
//! cargo run --release -p benches --bin bench -- --quick
//! cargo run --release -p benches --bin bench -- --full --backends wgpu --suites attention
//! cargo run --release -p benches --bin bench -- --quick --suites moe_mla,nanogpt   # companions only
//! cargo run --release -p benches --bin bench -- --report-only   # redraw from results.jsonl
//! ```
//!
//! The quick mode takes about five minutes on two cores. On a GPU emulated on the CPU
//! (Mesa's lavapipe) it leaves out each suite's largest cells, which take seconds a run
//! there, and the report lists them under "Not measured"; `--full` measures everything.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use benches::machine::{Machine, adapter_name, emulates_gpu_on_cpu};
use benches::record::{Record, parse_lines};
use benches::report;
use benches::suites::{Job, Mode, SUITES, device_named};
use burn_transformer::io::write_atomically;
use clap::Parser;
use clap::builder::PossibleValuesParser;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs burn-transformer's benchmarks on every available backend and writes the report.
#[derive(Parser, Debug)]
#[command(name = "bench")]
struct Args {
    /// The small grid: about five minutes on two cores (the default). On a GPU emulated
    /// on the CPU (lavapipe) it leaves out each suite's largest cells unless `--only`
    /// names them.
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// The whole grid: sequences up to 8192, both head sizes, more runs.
    #[arg(long)]
    full: bool,
    /// Backends to run (default: every backend this build has and the machine runs). A
    /// backend named here that this build lacks or this machine cannot run is an error.
    #[arg(long, value_delimiter = ',', value_parser = PossibleValuesParser::new(BACKENDS))]
    backends: Option<Vec<String>>,
    /// Suites to run (default: all: the runner's own and its companion programs). A run
    /// keeps the earlier records of every benchmark and backend it does not measure in
    /// results.jsonl and the report.
    #[arg(long, value_delimiter = ',', value_parser = PossibleValuesParser::new(all_suites()))]
    suites: Option<Vec<String>>,
    /// Run only the jobs whose progress line contains one of these texts (comma
    /// separated, for example `seq 2048` or `reference wgpu fwd_bwd 2×8`; a text that ends
    /// in `$` must end the line, so `d 128$` names the f32 cells and not `d 128 bf16`);
    /// their records replace those of the same cells in results.jsonl and every other
    /// record stays.
    #[arg(long, value_delimiter = ',')]
    only: Option<Vec<String>>,
    /// Where results.jsonl, the tables and the plots go.
    #[arg(long, default_value = "docs/benchmarks")]
    out: PathBuf,
    /// The Markdown page whose generated section is replaced.
    #[arg(long, default_value = "docs/benchmarks.md")]
    docs: PathBuf,
    /// Seconds one job may run before it is stopped and reported as timed out.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Memory the naive attention path may use for its scores, MiB; larger cells are
    /// reported as skipped instead of run.
    #[arg(long, default_value_t = 4096)]
    memory_budget_mib: u64,
    /// Do not run anything: redraw tables and plots from `<out>/results.jsonl`.
    #[arg(long)]
    report_only: bool,
    /// Internal: run one job (JSON) in this process and print its records.
    #[arg(long, hide = true)]
    job: Option<String>,
    /// Internal: check that a backend runs and print its adapter.
    #[arg(long, hide = true)]
    probe: Option<String>,
}

/// The backend names `--backends` takes.
const BACKENDS: [&str; 4] = ["flex", "ndarray", "wgpu", "cuda"];

/// The runner's suites, then its companion programs: what `--suites` takes.
fn all_suites() -> Vec<&'static str> {
    SUITES
        .iter()
        .copied()
        .chain(COMPANIONS.iter().map(|(name, _)| *name))
        .collect()
}

fn main() {
    let args = Args::parse();
    if let Some(job) = &args.job {
        std::process::exit(run_job(job));
    }
    if let Some(backend) = &args.probe {
        std::process::exit(probe(backend));
    }
    if let Err(error) = run(&args) {
        eprintln!("bench: {error}");
        std::process::exit(1);
    }
}

/// Child side of a job: prints `RESULT <json>` per record.
fn run_job(text: &str) -> i32 {
    let job: Job = match serde_json::from_str(text) {
        Ok(job) => job,
        Err(error) => {
            eprintln!("bench: bad --job: {error}");
            return 2;
        }
    };
    match job.run() {
        Ok(records) => {
            for record in records {
                match serde_json::to_string(&record) {
                    Ok(line) => println!("RESULT {line}"),
                    Err(error) => eprintln!("bench: cannot encode a record: {error}"),
                }
            }
            0
        }
        Err(error) => {
            eprintln!("bench: {error}");
            1
        }
    }
}

/// Child side of a probe: runs a tiny computation, prints `ADAPTER <name>`.
fn probe(backend: &str) -> i32 {
    let device = match device_named(backend) {
        Ok(device) => device,
        Err(error) => {
            eprintln!("{error}");
            return 1;
        }
    };
    let total: f32 = burn::tensor::Tensor::<1>::from_floats([1.0, 2.0], &device)
        .sum()
        .into_scalar();
    if total != 3.0 {
        eprintln!("{backend} computed 1 + 2 = {total}");
        return 1;
    }
    println!(
        "ADAPTER {}",
        adapter_name(&device).unwrap_or_else(|| "cpu".into())
    );
    0
}

/// What a child process left behind.
struct ChildOutput {
    status: Option<i32>,
    stdout: String,
    stderr: String,
    timed_out: bool,
}

/// Runs this binary with `arguments`, stopping it after `timeout`.
fn run_child(arguments: &[&str], timeout: Duration) -> Result<ChildOutput, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
    run_program(&exe, arguments, timeout)
}

/// Benchmarks that are programs of their own, built beside this runner (`benches/src/bin`).
/// The runner runs each in quick or full mode on the measured backends and keeps its
/// output next to its own: `<out>/<name>.jsonl` (JSON lines) and `<out>/<name>.md` (the
/// program's tables). To add one, give it `--quick`, `--backends a,b` and `--json PATH`,
/// and list it here.
const COMPANIONS: &[(&str, &str)] = &[
    ("moe_mla", "MoE dispatch and MLA decoding"),
    ("nanogpt", "nanoGPT training recipe"),
    ("speculative", "Self-speculative decoding"),
];

/// Runs the companion benchmark `name` and writes its results into `out`.
fn run_companion(
    (name, title): (&str, &str),
    machine: &Machine,
    mode: Mode,
    backends: &[String],
    out: &Path,
    timeout: Duration,
) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
    let program = exe.with_file_name(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if !program.is_file() {
        build_companion(name, &exe)?;
    }
    let json = out.join(format!("{name}.jsonl"));
    let json_arg = json.to_string_lossy().into_owned();
    let backend_list = backends.join(",");
    let mut arguments = vec!["--backends", &backend_list, "--json", &json_arg];
    if mode == Mode::Quick {
        arguments.push("--quick");
    }
    eprintln!("bench: running {name} on {backend_list}");
    let output = run_program(&program, &arguments, timeout)?;
    if output.status != Some(0) || output.timed_out {
        return Err(format!(
            "{name} failed{}: {}",
            if output.timed_out { " (timed out)" } else { "" },
            stderr_tail(&output.stderr)
        ));
    }
    // Its tables, without the JSON lines it also prints.
    let tables: String = output
        .stdout
        .lines()
        .filter(|line| !line.starts_with('{'))
        .map(|line| format!("{line}\n"))
        .collect();
    write_atomically(
        &out.join(format!("{name}.md")),
        format!(
            "# {title}\n\nMeasured on:\n\n{}\nTables of `{name}{}`, run by the bench runner.\n\n{}\n",
            machine.markdown(),
            if mode == Mode::Quick { " --quick" } else { "" },
            tables.trim()
        ),
    )
    .map_err(|e| e.to_string())
}

/// Builds the companion program `name` beside the runner `exe`: `cargo run --bin bench`
/// builds only the runner, and cargo tells the programs it runs where it is (`CARGO`).
///
/// # Errors
/// Why it could not be built, and the command that builds it.
fn build_companion(name: &str, exe: &Path) -> Result<(), String> {
    let by_hand = format!("`cargo build --release -p benches --bin {name}`");
    let cargo = std::env::var_os("CARGO")
        .ok_or_else(|| format!("{name} is not built: build it with {by_hand}"))?;
    // The runner's own profile folder (`target/release`) says which profile to build.
    let release = exe
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|profile| profile == "release");
    eprintln!("bench: building {name}");
    let mut command = Command::new(cargo);
    command.args(["build", "-p", "benches", "--bin", name]);
    if release {
        command.arg("--release");
    }
    let status = command.status().map_err(|e| {
        format!("cannot start cargo to build {name} ({e}): build it with {by_hand}")
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("building {name} failed: build it with {by_hand}"))
    }
}

/// Runs `program` with `arguments`, stopping it after `timeout`.
fn run_program(
    program: &Path,
    arguments: &[&str],
    timeout: Duration,
) -> Result<ChildOutput, String> {
    let mut child = Command::new(program)
        .args(arguments)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start a child process: {e}"))?;
    // Readers on their own threads, so a chatty child never blocks on a full pipe.
    let mut stdout = child.stdout.take().ok_or("no child stdout")?;
    let mut stderr = child.stderr.take().ok_or("no child stderr")?;
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let start = Instant::now();
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status.code(),
            Ok(None) if start.elapsed() > timeout => {
                timed_out = true;
                let _ = child.kill();
                break child.wait().ok().and_then(|s| s.code());
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(error) => return Err(format!("waiting for a child: {error}")),
        }
    };
    Ok(ChildOutput {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
        timed_out,
    })
}

/// The last meaningful stderr lines of a failed child: a panic's message and its
/// innermost causes, without the backtrace that follows under RUST_BACKTRACE, Burn's
/// "Caused by" scaffolding, or Mesa's runtime-dir noise.
fn stderr_tail(stderr: &str) -> String {
    const NOISE: &[&str] = &[
        "XDG_RUNTIME_DIR",
        "No backtrace available",
        "Asked at:",
        "Caused by:",
        "note: run with `RUST_BACKTRACE",
    ];
    let lines: Vec<&str> = stderr
        .lines()
        .take_while(|line| !line.starts_with("stack backtrace:"))
        .map(str::trim)
        .filter(|line| !line.is_empty() && !NOISE.iter().any(|noise| line.contains(noise)))
        // Operations skipped because an earlier one failed repeat the failure.
        .filter(|line| !line.starts_with("skipped `"))
        .collect();
    lines[lines.len().saturating_sub(2)..].join(" | ")
}

fn run(args: &Args) -> Result<(), String> {
    let mode = if args.full { Mode::Full } else { Mode::Quick };
    if let Some(requested) = &args.backends {
        check_compiled(requested)?;
    }
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let results = args.out.join("results.jsonl");
    let machine_path = args.out.join("machine.json");

    let saved_machine = || -> Option<Machine> {
        serde_json::from_str(&std::fs::read_to_string(&machine_path).ok()?).ok()
    };
    let mut failed_companions = Vec::new();
    let (machine, records) = if args.report_only {
        let text =
            std::fs::read_to_string(&results).map_err(|e| format!("{}: {e}", results.display()))?;
        let records = parse_lines(&text).map_err(|e| format!("{}: {e}", results.display()))?;
        let machine = saved_machine().unwrap_or_else(|| Machine::detect(mode.name()));
        (machine, records)
    } else {
        let (machine, records, backends) = measure(args, mode)?;
        let wanted = args.suites.clone();
        for &(name, title) in COMPANIONS {
            // `--only` names jobs of the runner's own suites, never a companion.
            let requested =
                args.only.is_none() && wanted.as_ref().is_none_or(|s| s.iter().any(|s| s == name));
            if requested
                && let Err(error) = run_companion(
                    (name, title),
                    &machine,
                    mode,
                    &backends,
                    &args.out,
                    Duration::from_secs(args.timeout),
                )
            {
                eprintln!("bench: {error}");
                failed_companions.push(name);
            }
        }
        // A run of companion programs alone measured none of the runner's cells, and an
        // `--only` run re-measured a few (its records name their machine, which the
        // attention tables show): the pages keep the machine of the run that measured
        // the rest (the companions' pages name theirs).
        let machine = if records.is_empty() || args.only.is_some() {
            saved_machine().unwrap_or(machine)
        } else {
            machine
        };
        (
            machine,
            keep_unmeasured(&results, records, args.only.is_some()),
        )
    };

    let json = serde_json::to_string_pretty(&machine).map_err(|e| e.to_string())?;
    write_atomically(&machine_path, format!("{json}\n")).map_err(|e| e.to_string())?;
    write_records(&results, &records)?;

    let sections = report::sections(&records, &args.out)?;
    for section in &sections {
        let text = format!(
            "# {}\n\nMeasured on:\n\n{}\n{}",
            section.title,
            machine.markdown(),
            section.body
        );
        write_atomically(&args.out.join(format!("{}.md", section.stem)), text)
            .map_err(|e| e.to_string())?;
    }
    let prefix = args
        .out
        .strip_prefix(args.docs.parent().unwrap_or(Path::new("")))
        .unwrap_or(&args.out)
        .to_string_lossy()
        .into_owned();
    let companions: Vec<(&str, &str)> = COMPANIONS
        .iter()
        .filter(|(name, _)| args.out.join(format!("{name}.md")).is_file())
        .map(|&(name, title)| (title, name))
        .collect();
    let block = report::combined(&machine, &records, &sections, &prefix, &companions);
    let document = std::fs::read_to_string(&args.docs).unwrap_or_else(|_| {
        "# Benchmarks\n\nNumbers produced by `cargo run --release -p benches --bin bench`.\n".into()
    });
    write_atomically(&args.docs, report::splice(&document, &block)).map_err(|e| e.to_string())?;
    eprintln!(
        "bench: {} records; report in {} and {}",
        records.len(),
        args.out.display(),
        args.docs.display()
    );
    if failed_companions.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "requested suites did not run: {} (see above)",
            failed_companions.join(", ")
        ))
    }
}

/// Whether `--only`'s `text` names the job whose progress line is `line`: the text
/// appears in it, or, where it ends in `$`, ends it.
fn names(line: &str, text: &str) -> bool {
    match text.strip_suffix('$') {
        Some(end) => line.ends_with(end),
        None => line.contains(text),
    }
}

fn measure(args: &Args, mode: Mode) -> Result<(Machine, Vec<Record>, Vec<String>), String> {
    let mut machine = Machine::detect(mode.name());
    let wanted: Vec<String> = args.backends.clone().unwrap_or_else(|| {
        burn_transformer::device::COMPILED_BACKENDS
            .iter()
            .map(|b| b.to_string())
            .collect()
    });
    let mut backends = Vec::new();
    let mut emulated = Vec::new();
    for backend in wanted {
        let output = run_child(&["--probe", &backend], Duration::from_secs(120))?;
        let adapter = output
            .stdout
            .lines()
            .find_map(|line| line.strip_prefix("ADAPTER "))
            .map(str::to_string);
        match (output.status, adapter) {
            (Some(0), Some(adapter)) => {
                if adapter != "cpu" {
                    machine.adapters.push(format!("{backend}: {adapter}"));
                }
                if emulates_gpu_on_cpu(&adapter) {
                    emulated.push(backend.clone());
                }
                backends.push(backend);
            }
            _ => {
                let reason = stderr_tail(&output.stderr);
                if args.backends.is_some() {
                    return Err(format!(
                        "backend {backend} does not run on this machine: {reason}"
                    ));
                }
                eprintln!("bench: backend {backend} unavailable, skipped: {reason}");
                machine
                    .adapters
                    .push(format!("{backend}: unavailable, not measured ({reason})"));
            }
        }
    }
    if backends.is_empty() {
        return Err("no backend runs on this machine: nothing was measured".into());
    }
    let suites: Vec<String> = args
        .suites
        .clone()
        .unwrap_or_else(|| SUITES.iter().map(|s| s.to_string()).collect());
    let jobs: Vec<Job> = suites
        .iter()
        .filter(|suite| SUITES.contains(&suite.as_str()))
        .flat_map(|suite| {
            backends
                .iter()
                .flat_map(move |backend| Job::all(suite, mode, backend))
        })
        .filter(|job| {
            let line = job.describe();
            args.only
                .as_ref()
                .is_none_or(|texts| texts.iter().any(|text| names(&line, text)))
        })
        .collect();
    if let Some(texts) = &args.only
        && jobs.is_empty()
    {
        return Err(format!(
            "no {} job's progress line contains any of `{}`",
            mode.name(),
            texts.join("`, `")
        ));
    }
    eprintln!(
        "bench: {} mode, {} jobs on {}",
        mode.name(),
        jobs.len(),
        backends.join(", ")
    );
    // Cells named with `--only` always run: the user asked for them.
    let left_out = |job: &Job| {
        mode == Mode::Quick
            && args.only.is_none()
            && emulated.iter().any(|backend| backend == job.backend())
            && job.left_out_of_quick_on_emulated_gpu()
    };
    if jobs.iter().any(left_out) {
        eprintln!(
            "bench: {} runs on a GPU emulated on the CPU: the quick mode leaves out its \
             largest cells (forward attention at 2048, generation at context 2048, the \
             medium training step); --full measures them",
            emulated.join(", ")
        );
    }
    let start = Instant::now();
    let mut records = Vec::new();
    let budget = args.memory_budget_mib << 20;
    for (index, job) in jobs.iter().enumerate() {
        let produced = if left_out(job) {
            job.failed(QUICK_LEFT_OUT)
        } else {
            match job.skip_reason(budget) {
                Some(reason) => job.failed(&reason),
                None => run_one(job, Duration::from_secs(args.timeout)),
            }
        };
        for record in &produced {
            eprintln!(
                "[{:>3}/{}] {:>5.0}s {} {}{} {}: {}{}",
                index + 1,
                jobs.len(),
                start.elapsed().as_secs_f64(),
                job.describe(),
                // A job of several benchmarks (prefill and decode) names each record's.
                if job.describe().starts_with(&record.bench) {
                    String::new()
                } else {
                    format!("{} ", record.bench)
                },
                record.implementation,
                record.pass,
                record
                    .ms_median
                    .map_or("–".into(), |ms| format!("{ms:.2} ms")),
                record
                    .failure
                    .as_ref()
                    .map(|f| format!(" ({f})"))
                    .unwrap_or_default()
            );
        }
        records.extend(produced.into_iter().map(|record| Record {
            run: Some(machine.date_utc.clone()),
            machine: Some(machine.label(&record.backend)),
            ..record
        }));
        // Each job's records reach results.jsonl as it ends, so that a run stopped
        // part-way (a lease that ends, a killed runner) keeps what it measured.
        let results = args.out.join("results.jsonl");
        write_records(
            &results,
            &keep_unmeasured(&results, records.clone(), args.only.is_some()),
        )?;
    }
    eprintln!("bench: measured in {:.0}s", start.elapsed().as_secs_f64());
    Ok((machine, records, backends))
}

/// Writes `records` to `results` (JSON lines), replacing it whole.
///
/// # Errors
/// Why the file could not be written.
fn write_records(results: &Path, records: &[Record]) -> Result<(), String> {
    let lines: String = records
        .iter()
        .filter_map(|r| serde_json::to_string(r).ok())
        .map(|line| line + "\n")
        .collect();
    write_atomically(results, lines).map_err(|e| format!("{}: {e}", results.display()))
}

/// Why a quick run has no number for a cell it left out on a CPU-emulated adapter.
const QUICK_LEFT_OUT: &str = "left out of the quick mode on a GPU emulated on the CPU \
    (seconds a run there); `--full` measures it";

/// Checks that this build has every backend in `requested`.
///
/// # Errors
/// The device error naming the backend and the feature it needs.
fn check_compiled(requested: &[String]) -> Result<(), String> {
    for backend in requested {
        burn_transformer::device::parse_device(backend)
            .map_err(|error| format!("--backends {backend}: {error}"))?;
    }
    Ok(())
}

/// The earlier records of `results` that this run did not measure stay in the report
/// beside the new ones: no run replaces what it did not measure (another backend's rows,
/// another suite, anything at all when nothing ran). A run replaces whole benchmarks per
/// backend (a table never mixes two grids); an `--only` run (`by_cell`) replaces just
/// the cells it measured.
fn keep_unmeasured(results: &Path, measured: Vec<Record>, by_cell: bool) -> Vec<Record> {
    let Some(earlier) = std::fs::read_to_string(results)
        .ok()
        .and_then(|text| parse_lines(&text).ok())
    else {
        return measured;
    };
    let remeasured = |r: &Record| {
        measured.iter().any(|m| {
            if by_cell {
                m.same_cell(r)
            } else {
                m.bench == r.bench && m.backend == r.backend
            }
        })
    };
    let mut records: Vec<Record> = earlier.into_iter().filter(|r| !remeasured(r)).collect();
    records.extend(measured);
    records
}

/// Runs one job in a child process and collects its records.
fn run_one(job: &Job, timeout: Duration) -> Vec<Record> {
    let text = match serde_json::to_string(job) {
        Ok(text) => text,
        Err(error) => return job.failed(&format!("cannot encode the job: {error}")),
    };
    match run_child(&["--job", &text], timeout) {
        Ok(output) if output.timed_out => {
            job.failed(&format!("timed out after {} s", timeout.as_secs()))
        }
        Ok(output) => {
            let records: Vec<Record> = output
                .stdout
                .lines()
                .filter_map(|line| line.strip_prefix("RESULT "))
                .filter_map(|line| serde_json::from_str(line).ok())
                .collect();
            if records.is_empty() {
                job.failed(&format!(
                    "exit {:?}: {}",
                    output.status,
                    stderr_tail(&output.stderr)
                ))
            } else {
                records
            }
        }
        Err(error) => job.failed(&error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use benches::record::Record;

    fn record(bench: &str, backend: &str, ms: f64) -> Record {
        let mut record = Record::new(bench, "fused", backend);
        record.ms_median = Some(ms);
        record
    }

    /// `--only` texts match anywhere in a progress line; one ending in `$` only at its end,
    /// which tells an f32 cell (no dtype in its line) from its bf16 twin.
    #[test]
    fn only_texts_ending_in_a_dollar_sign_must_end_the_line() {
        let f32 = "attention burn cuda fwd 4×16 seq 4096 d 64";
        let bf16 = "attention burn cuda fwd 4×16 seq 4096 d 64 bf16";
        assert!(names(f32, "seq 4096 d 64") && names(bf16, "seq 4096 d 64"));
        assert!(names(f32, "seq 4096 d 64$"));
        assert!(!names(bf16, "seq 4096 d 64$"));
        assert!(names(bf16, "d 64 bf16$"));
        assert!(!names(f32, "seq 1024$"));
    }

    /// A run keeps every earlier record it did not measure: other backends' rows,
    /// other benchmarks, and everything when it measured nothing.
    #[test]
    fn a_run_replaces_only_what_it_measured() {
        let dir = tempfile::TempDir::with_prefix("bench-keep").unwrap();
        let results = dir.path().join("results.jsonl");
        let earlier = [
            record("attention", "cuda", 1.0),
            record("attention", "flex", 2.0),
            record("rope", "flex", 3.0),
        ];
        let lines: String = earlier
            .iter()
            .map(|r| serde_json::to_string(r).unwrap() + "\n")
            .collect();
        std::fs::write(&results, lines).unwrap();

        let kept = keep_unmeasured(&results, vec![record("attention", "flex", 5.0)], false);
        let times: Vec<(String, String, Option<f64>)> = kept
            .iter()
            .map(|r| (r.bench.clone(), r.backend.clone(), r.ms_median))
            .collect();
        assert_eq!(
            times,
            [
                ("attention".into(), "cuda".into(), Some(1.0)),
                ("rope".into(), "flex".into(), Some(3.0)),
                ("attention".into(), "flex".into(), Some(5.0)),
            ]
        );
        assert_eq!(keep_unmeasured(&results, Vec::new(), false).len(), 3);
    }

    #[test]
    fn unknown_or_missing_backends_are_errors() {
        let error = Args::try_parse_from(["bench", "--backends", "tpu"]).unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("tpu") && message.contains("flex"),
            "{message}"
        );
        let error = Args::try_parse_from(["bench", "--suites", "everything"]).unwrap_err();
        assert!(error.to_string().contains("moe_mla"), "{error}");
        #[cfg(not(feature = "cuda"))]
        {
            let error = check_compiled(&["cuda".to_string()]).unwrap_err();
            assert!(
                error.contains("cuda") && error.contains("feature"),
                "{error}"
            );
        }
        assert!(check_compiled(&["flex".to_string()]).is_ok());
    }

    #[test]
    fn a_failure_reads_as_its_innermost_cause() {
        let stderr = "thread 'main' panicked at benches/src/measure.rs:116:10:\n\
            Error while reading data\nCaused by:\n  Several failures at once\n\
            Caused by:\n  skipped `SliceKernel`: it needed memory 21\nCaused by:\n  \
            An IO error happened\nCaused by:\n  can't allocate buffer of size: 268435456\n\
            No backtrace available\nAsked at:\nNo backtrace available\n\
            stack backtrace:\n   0: __rustc::rust_begin_unwind\n   8: bench::main\n";
        assert_eq!(
            stderr_tail(stderr),
            "An IO error happened | can't allocate buffer of size: 268435456"
        );
    }
}
