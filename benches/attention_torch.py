"""PyTorch's `scaled_dot_product_attention` on one attention cell of the bench runner.

The runner (`bench`, suite `attention`) embeds this script and runs it with the cell as
JSON, so that PyTorch is measured in the same run, on the same shapes and by the same
rules as our implementations (benches/src/measure.rs):
- warm-up runs first, then the median of the timed runs; short runs repeat until
  both add up to a floor of time;
- fresh inputs every run, made and synchronized before the clock starts;
- on the CPU every core is busy when the clock starts (`busy_cores`);
- the clock stops once a scalar of the result (of each gradient, for `fwd_bwd`) is read
  back to the host;
- forward+backward differentiates `(output * grad).sum()`, as the runner does.

On CUDA it asks for FlashAttention's kernel (f16/bf16) or the memory-efficient one (f32,
which the flash kernel does not take); on the CPU PyTorch picks. It prints one line,
`RESULT {json}`, with the timed runs (or a `failure`), and uses the CPU threads it may run
on, as the Rust backends do.

    python3 benches/attention_torch.py '{"batch":1,"heads":8,"seq":1024,"head_dim":64,
        "causal":true,"backward":false,"dtype":"F32","device":"cpu",
        "runs":{"warmup":1,"iters":3}}'
"""

import json
import os
import sys
import time

# Timed runs stop once they add up to this (ms); one warm-up only after a run this long.
TIMED_BUDGET_MS = 60_000.0
LONG_RUN_MS = 10_000.0
# Short runs repeat: warm-ups until they add up to this (ms), timed runs until this,
# each at most this many times.
WARMUP_FLOOR_MS = 200.0
TIMED_FLOOR_MS = 100.0
SHORT_RUNS_MAX = 50
# On the CPU, the cores are kept busy this long (ms) before each run, as the runner does
# (`busy_cores` in benches/src/measure.rs): an idle core runs the next milliseconds at
# about half speed on the machines these numbers come from.
BUSY_CORES_MS = 10.0


def vm_kib(field):
    """A `/proc/self/status` field in KiB, or None off Linux."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def busy_cores(work):
    """Keeps PyTorch's CPU threads busy for BUSY_CORES_MS: an elementwise op on `work`,
    a tensor large enough that every intra-op thread takes a share, repeated."""
    start = time.perf_counter()
    while (time.perf_counter() - start) * 1e3 < BUSY_CORES_MS:
        work.mul_(1.0)


def main():
    cell = json.loads(sys.argv[1])
    try:
        import torch
        import torch.nn.functional as F
    except Exception as error:  # a missing package, or one whose libraries do not load
        report(failure=f"PyTorch does not import in {sys.executable} ({error})")
        return
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    if cell["dtype"] not in dtypes:
        report(failure=f"no PyTorch dtype for {cell['dtype']}")
        return
    dtype = dtypes[cell["dtype"]]
    if cell["device"] == "cuda":
        if not torch.cuda.is_available():
            report(failure="PyTorch sees no CUDA device")
            return
        device = torch.device("cuda")
    else:
        device = torch.device("cpu")
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        if threads:
            torch.set_num_threads(threads)

    kernel = None
    backends = None
    if device.type == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if dtype == torch.float32:
            kernel, backends = "efficient", [SDPBackend.EFFICIENT_ATTENTION]
        else:
            kernel, backends = "flash", [SDPBackend.FLASH_ATTENTION]

    shape = (cell["batch"], cell["heads"], cell["seq"], cell["head_dim"])
    backward = cell["backward"]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def draw():
        tensor = torch.randn(shape, device=device, dtype=torch.float32).to(dtype)
        return tensor.requires_grad_(backward)

    def attend(q, k, v):
        if backends is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=cell["causal"])
        with sdpa_kernel(backends):
            return F.scaled_dot_product_attention(q, k, v, is_causal=cell["causal"])

    def run(q, k, v, grad):
        output = attend(q, k, v)
        if backward:
            (output * grad).sum().backward()
            for tensor in (q, k, v):
                tensor.grad[0, 0, 0, 0].item()
        else:
            output[0, 0, 0, 0].item()
        sync()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_reserved()
    else:
        baseline = vm_kib("VmRSS")

    busy_work = torch.ones(1 << 20) if device.type == "cpu" else None
    samples = []
    warmups, warmup_ms = 0, 0.0
    warming = cell["runs"]["warmup"] > 0
    iters = max(cell["runs"]["iters"], 1)
    try:
        while True:
            inputs = (draw(), draw(), draw(), torch.randn(shape, device=device).to(dtype))
            sync()
            if device.type == "cpu":
                busy_cores(busy_work)
            start = time.perf_counter()
            run(*inputs)
            elapsed = (time.perf_counter() - start) * 1e3
            del inputs
            if warming:
                warmups, warmup_ms = warmups + 1, warmup_ms + elapsed
                warming = elapsed <= LONG_RUN_MS and (
                    warmups < cell["runs"]["warmup"]
                    or (warmup_ms < WARMUP_FLOOR_MS and warmups < SHORT_RUNS_MAX)
                )
                continue
            samples.append(elapsed)
            timed_ms = sum(samples)
            enough = len(samples) >= iters and (
                timed_ms >= TIMED_FLOOR_MS or len(samples) >= SHORT_RUNS_MAX
            )
            if enough or timed_ms > TIMED_BUDGET_MS:
                break
    except (RuntimeError, torch.cuda.OutOfMemoryError) as error:
        # PyTorch's messages run over several lines; the first says what failed.
        report(failure=f"PyTorch: {str(error).splitlines()[0]}", kernel=kernel)
        return

    if device.type == "cuda":
        peak = torch.cuda.max_memory_reserved() - baseline
        method = "torch.cuda.max_memory_reserved growth (high-water)"
    else:
        hwm = vm_kib("VmHWM")
        peak = (hwm - baseline) * 1024 if hwm is not None and baseline is not None else None
        method = "process peak RSS growth (VmHWM)"

    # The first head of fresh inputs against PyTorch's own math, in f32.
    with torch.no_grad():
        q, k, v = (draw().detach() for _ in range(3))
        output = attend(q, k, v)[:1, :1].float()
        q, k, v = (t[:1, :1].float() for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / cell["head_dim"] ** 0.5
        if cell["causal"]:
            hidden = torch.ones_like(scores, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(hidden, float("-inf"))
        expected = scores.softmax(-1) @ v
        check_error = (output - expected).abs().max().item()

    report(
        samples_ms=samples,
        peak_bytes=peak,
        peak_method=method,
        kernel=kernel,
        check_error=check_error,
        checked_against=f"torch {torch.__version__} math, first head",
    )


def report(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


if __name__ == "__main__":
    main()
