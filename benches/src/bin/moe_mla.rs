//! Mixture-of-experts and multi-head latent attention benchmarks.
//!
//! ```text
//! cargo run --release -p benches --bin moe_mla -- [--quick] [--json PATH]
//!     [--backends flex,wgpu] [--only moe|mla] [--iters N] [--warmup N]
//! ```
//!
//! - **moe**: one MoE layer's forward on the same tokens with 8 and 64 experts and top-k
//!   1, 2 and 4, next to the dense reference (every expert on every token) at top-2. The
//!   sparse dispatch runs `tokens · top_k` expert evaluations whatever the number of
//!   experts, so its time should follow top-k; the dense reference follows the number
//!   of experts.
//! - **mla**: one decoding step (batch 4, one new token) over a cache of `seq` positions
//!   for MLA (absorbed and expanded paths) and for GQA and MHA attention of the same
//!   `d_model` and query heads; the cache bytes per token are reported in `peak_bytes`'s
//!   neighbour `cache_bytes_per_token` (`peak_bytes` is the whole cache after the step).
//!
//! Times are medians over `--iters` runs after `--warmup`, each ending with a read of
//! one output value (so the device finished the work). Inputs are drawn once per cell.
//! Nothing asserts a time. `--json PATH` receives this run's JSON lines (the file is
//! replaced once every backend has run, never left half-written).

use std::path::Path;
use std::time::Instant;

use benches::machine::{adapter_name, emulates_gpu_on_cpu};
use burn::tensor::{Device, DeviceKind, Distribution, Tensor};
use burn_transformer::attention::{
    KvCache, LatentAttentionConfig, LatentKvCache, LatentPath, MultiHeadAttentionConfig,
};
use burn_transformer::ffn::MoeConfig;
use burn_transformer::ffn::moe::ExpertDispatch;
use burn_transformer::io::write_atomically;
use burn_transformer::position::{RopeConfig, RopeLayout};
use serde_json::{Value, json};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Args {
    quick: bool,
    json: Option<String>,
    backends: Vec<String>,
    only: Option<String>,
    iters: usize,
    warmup: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        quick: false,
        json: None,
        backends: vec!["flex".into(), "wgpu".into()],
        only: None,
        iters: 10,
        warmup: 2,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match flag.as_str() {
            "--quick" => args.quick = true,
            "--json" => args.json = Some(value("--json")?),
            "--backends" => {
                args.backends = value("--backends")?
                    .split(',')
                    .map(str::to_string)
                    .collect()
            }
            "--only" => args.only = Some(value("--only")?),
            "--iters" => {
                args.iters = value("--iters")?
                    .parse()
                    .map_err(|_| "--iters expects a number".to_string())?
            }
            "--warmup" => {
                args.warmup = value("--warmup")?
                    .parse()
                    .map_err(|_| "--warmup expects a number".to_string())?
            }
            "--help" | "-h" => {
                println!(
                    "moe_mla [--quick] [--json PATH] [--backends flex,wgpu] [--only moe|mla] \
                     [--iters N] [--warmup N]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown flag {other} (see --help)")),
        }
    }
    if args.iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    if let Some(only) = &args.only
        && !matches!(only.as_str(), "moe" | "mla")
    {
        return Err(format!("--only takes moe or mla, got `{only}`"));
    }
    if args.quick {
        args.iters = args.iters.min(3);
        args.warmup = args.warmup.min(1);
    }
    Ok(args)
}

fn device_named(name: &str) -> Result<Device, String> {
    match name {
        "wgpu" => Ok(Device::wgpu(DeviceKind::DefaultDevice)),
        other => burn_transformer::device::parse_device(other).map_err(|e| e.to_string()),
    }
}

/// Forces the computation of `tensor` by reading one value; NaN when the device
/// failed to compute it.
fn read_one(tensor: Tensor<3>) -> f32 {
    tensor
        .slice([0..1, 0..1, 0..1])
        .try_into_data()
        .ok()
        .and_then(|data| data.convert::<f32>().try_to_vec::<f32>().ok())
        .map_or(f32::NAN, |v| v[0])
}

/// Cells that could not be measured (the device failed, or gave a non-finite value).
static FAILED_CELLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Median and minimum milliseconds of `iters` runs of `step` after `warmup` runs, or
/// `None` (reported on stderr as the cell `what`) when a run fails.
fn time(
    what: &str,
    iters: usize,
    warmup: usize,
    mut step: impl FnMut() -> f32,
) -> Option<(f64, f64)> {
    let mut run = || {
        let start = Instant::now();
        let value = step();
        let elapsed = start.elapsed().as_secs_f64() * 1e3;
        value.is_finite().then_some(elapsed)
    };
    let warm = (0..warmup).all(|_| run().is_some());
    let times: Option<Vec<f64>> = warm
        .then(|| (0..iters.max(1)).map(|_| run()).collect())
        .flatten();
    let Some(mut times) = times else {
        eprintln!("moe_mla: {what} failed (the device failed or gave a non-finite value)");
        FAILED_CELLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        return None;
    };
    times.sort_by(|a, b| a.total_cmp(b));
    Some((times[times.len() / 2], times[0]))
}

/// The JSON lines of this run: printed as they come, written to `--json` at the end.
#[derive(Default)]
struct Output {
    lines: Vec<String>,
}

impl Output {
    fn emit(&mut self, record: Value) {
        println!("{record}");
        self.lines.push(record.to_string());
    }

    fn write(&self, path: &Path) -> Result<(), String> {
        let text: String = self.lines.iter().map(|line| format!("{line}\n")).collect();
        write_atomically(path, text).map_err(|e| e.to_string())
    }
}

fn bench_moe(args: &Args, backend: &str, device: &Device, out: &mut Output) {
    let (batch, seq, d_model, d_ff) = if args.quick {
        (2, 128, 128, 256)
    } else {
        (4, 256, 256, 512)
    };
    let tokens = batch * seq;
    println!(
        "\n## MoE forward, {backend}: {tokens} tokens, d_model {d_model}, expert d_ff {d_ff}\n"
    );
    println!(
        "| impl | experts | top-k | expert rows (+padding) | ms median | ms min | ratio to per-expert 8/top-2 |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut baseline = None;
    let mut cases: Vec<(&str, usize, usize)> = Vec::new();
    for top_k in [2, 1, 4] {
        for n_experts in [8, 64] {
            cases.push(("sparse_per_expert", n_experts, top_k));
            cases.push(("sparse_batched", n_experts, top_k));
        }
    }
    cases.push(("dense_reference", 8, 2));
    cases.push(("dense_reference", 64, 2));
    for (implementation, n_experts, top_k) in cases {
        device.seed(1);
        let dispatch = if implementation == "sparse_per_expert" {
            ExpertDispatch::PerExpert
        } else {
            ExpertDispatch::Batched
        };
        let moe = MoeConfig::mixtral(d_model, d_ff, n_experts, top_k)
            .with_dispatch(dispatch)
            .init(device);
        let x = Tensor::<3>::random(
            [batch, seq, d_model],
            Distribution::Normal(0.0, 1.0),
            device,
        );
        let dense = implementation == "dense_reference";
        let probe = moe.forward(x.clone());
        let padded = if dense { 0 } else { probe.padded_rows };
        // The dense reference does n_experts / top_k times the work: fewer repetitions.
        let (iters, warmup) = if dense {
            (args.iters.min(3), args.warmup.min(1))
        } else {
            (args.iters, args.warmup)
        };
        let cell = format!("moe {implementation} {n_experts} experts top-{top_k} on {backend}");
        let Some((median, min)) = time(&cell, iters, warmup, || {
            if dense {
                read_one(moe.forward_dense_reference(x.clone()))
            } else {
                read_one(moe.forward(x.clone()).output)
            }
        }) else {
            continue;
        };
        if implementation == "sparse_per_expert" && n_experts == 8 && top_k == 2 {
            baseline = Some(median);
        }
        let rows = if dense {
            tokens * n_experts
        } else {
            tokens * top_k
        };
        println!(
            "| {implementation} | {n_experts} | {top_k} | {rows} (+{padded}) | {median:.2} | {min:.2} | {:.2}x |",
            median / baseline.unwrap_or(median)
        );
        out.emit(json!({
            "bench": "moe", "impl": implementation, "backend": backend,
            "batch": batch, "heads": 0, "kv_heads": 0, "seq": seq, "head_dim": 0,
            "causal": false, "pass": "fwd", "ms_median": median, "ms_min": min,
            "peak_bytes": null, "d_model": d_model, "d_ff": d_ff, "n_experts": n_experts,
            "top_k": top_k, "tokens": tokens, "expert_rows": rows, "padded_rows": padded,
        }));
    }
}

fn bench_mla(args: &Args, backend: &str, device: &Device, out: &mut Output) {
    // DeepSeek-V2-Lite's attention shapes: d_model 2048, 16 heads, kv rank 512, head
    // dims 128 + 64 (q·k) and 128 (v); GQA/MHA with the same d_model and 16 heads of 128.
    let (d_model, heads, head_dim) = (2048, 16, 128);
    let batch = 4;
    let seqs: &[usize] = if args.quick {
        &[256, 1024]
    } else {
        &[256, 1024, 4096]
    };
    let mla_config = LatentAttentionConfig::new(d_model, heads, 512, 128, 64, 128).with_rope(Some(
        RopeConfig::new(64)
            .with_layout(RopeLayout::Interleaved)
            .with_max_position_embeddings(8192),
    ));
    let footprint = mla_config.cache_bytes_per_token(burn::tensor::DType::F32, 4);
    // The expanded path rebuilds every cached key and value each step: seconds a step
    // on an adapter that emulates the GPU on the CPU (lavapipe), so only short caches
    // there (the quick mode keeps the shortest).
    let emulated = adapter_name(device).is_some_and(|adapter| emulates_gpu_on_cpu(&adapter));
    let expanded_limit = match (emulated, args.quick) {
        (false, _) => usize::MAX,
        (true, false) => 1024,
        (true, true) => 256,
    };
    println!(
        "\n## MLA decode step, {backend}: batch {batch}, d_model {d_model}, {heads} query heads\n"
    );
    println!("{footprint}  (f32, per layer)\n");
    println!(
        "| impl | kv heads | d_qk / d_v | cache len | ms median | ms min | cache bytes/token | cache MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    device.seed(2);
    let mla = mla_config.init(device);
    let gqa = MultiHeadAttentionConfig::new(d_model, heads)
        .with_n_kv_heads(Some(4))
        .with_causal(true)
        .with_rope(Some(
            RopeConfig::new(head_dim).with_max_position_embeddings(8192),
        ))
        .init(device);
    let mha = MultiHeadAttentionConfig::new(d_model, heads)
        .with_causal(true)
        .with_rope(Some(
            RopeConfig::new(head_dim).with_max_position_embeddings(8192),
        ))
        .init(device);
    let random4 =
        |shape: [usize; 4]| Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), device);
    let mut left_out = Vec::new();
    for &seq in seqs {
        let x = Tensor::<3>::random([batch, 1, d_model], Distribution::Normal(0.0, 1.0), device);
        let mut rows: Vec<(String, usize, String, f64, f64, usize, usize)> = Vec::new();
        // MLA: a cache of `seq` random latents (the values do not change the work).
        let mut latent = LatentKvCache::new();
        latent.append(random4([batch, 1, seq, 512 + 64]), None);
        for (name, path) in [
            ("mla_absorbed", LatentPath::Absorbed),
            ("mla_expanded", LatentPath::Expanded),
        ] {
            if path == LatentPath::Expanded && seq > expanded_limit {
                left_out.push(seq);
                continue;
            }
            // Warm the absorbed weights into the template cache once, as a generation does.
            let mut template = latent.clone();
            mla.forward_cached_path(x.clone(), &mut template, None, path);
            let mut after = None;
            let cell = format!("mla_decode {name} seq {seq} on {backend}");
            let Some((median, min)) = time(&cell, args.iters, args.warmup, || {
                let mut cache = latent_with_weights(&latent, &template);
                let y = mla.forward_cached_path(x.clone(), &mut cache, None, path);
                let value = read_one(y);
                after = Some(cache.bytes());
                value
            }) else {
                continue;
            };
            rows.push((
                name.into(),
                1,
                if path == LatentPath::Absorbed {
                    "576 / 512".into()
                } else {
                    "192 / 128".into()
                },
                median,
                min,
                footprint.latent,
                after.unwrap_or(0),
            ));
        }
        for (name, attention, kv_heads) in [("gqa", &gqa, 4), ("mha", &mha, heads)] {
            let mut cache = KvCache::new();
            cache.append(
                random4([batch, kv_heads, seq, head_dim]),
                random4([batch, kv_heads, seq, head_dim]),
                None,
            );
            let mut after = None;
            let cell = format!("mla_decode {name} seq {seq} on {backend}");
            let Some((median, min)) = time(&cell, args.iters, args.warmup, || {
                let mut step_cache = cache.clone();
                let y = attention.forward_cached(x.clone(), &mut step_cache, None);
                let value = read_one(y);
                after = Some(step_cache.bytes());
                value
            }) else {
                continue;
            };
            rows.push((
                name.into(),
                kv_heads,
                "128 / 128".into(),
                median,
                min,
                kv_heads * 2 * head_dim * 4,
                after.unwrap_or(0),
            ));
        }
        for (name, kv_heads, dims, median, min, per_token, bytes) in rows {
            println!(
                "| {name} | {kv_heads} | {dims} | {seq} | {median:.2} | {min:.2} | {per_token} | {:.1} |",
                bytes as f64 / (1024.0 * 1024.0)
            );
            out.emit(json!({
                "bench": "mla_decode", "impl": name, "backend": backend, "batch": batch,
                "heads": heads, "kv_heads": kv_heads, "seq": seq,
                "head_dim": if name.starts_with("mla") { 192 } else { head_dim },
                "causal": true, "pass": "fwd", "ms_median": median, "ms_min": min,
                "peak_bytes": bytes, "cache_bytes_per_token": per_token, "d_model": d_model,
                "dims": dims,
            }));
        }
    }
    if !left_out.is_empty() {
        println!(
            "\nmla_expanded left out at cache length {} on {backend}'s CPU-emulated adapter: \
             it expands the whole cache every step (seconds there); the absorbed path is the \
             one decoding uses.",
            left_out
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// A copy of `cache` (its positions) carrying the absorbed weights already split in
/// `warmed`, as every step of a real generation after the first has them.
fn latent_with_weights(cache: &LatentKvCache, warmed: &LatentKvCache) -> LatentKvCache {
    let mut copy = cache.clone();
    copy.set_absorbed_weights(warmed.absorbed_weights().cloned());
    copy
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("moe_mla: {message}");
            std::process::exit(2);
        }
    };
    // A backend named that this build lacks is an error before anything runs.
    let devices: Result<Vec<Device>, String> = args
        .backends
        .iter()
        .map(|name| device_named(name))
        .collect();
    let devices = match devices {
        Ok(devices) => devices,
        Err(message) => {
            eprintln!("moe_mla: --backends: {message}");
            std::process::exit(2);
        }
    };
    let mut out = Output::default();
    for (backend, device) in args.backends.iter().zip(devices) {
        if args.only.as_deref() != Some("mla") {
            bench_moe(&args, backend, &device, &mut out);
        }
        if args.only.as_deref() != Some("moe") {
            bench_mla(&args, backend, &device, &mut out);
        }
    }
    if let Some(path) = &args.json
        && let Err(message) = out.write(Path::new(path))
    {
        eprintln!("moe_mla: {message}");
        std::process::exit(1);
    }
    let failed = FAILED_CELLS.load(std::sync::atomic::Ordering::SeqCst);
    if failed > 0 {
        eprintln!("moe_mla: {failed} cells could not be measured (see above)");
        std::process::exit(1);
    }
}
