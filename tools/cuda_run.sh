#!/usr/bin/env bash
# Runs the CUDA checks on a GPU machine that has no Rust toolchain, from binaries built
# on one that has no GPU.
#
#   tools/cuda_run.sh build PACK_DIR      # here: build, strip and pack the binaries
#   tools/cuda_run.sh run PACK_DIR OUT    # there, from the repository root: tests + bench
#
# `build` compiles, with the `cuda-nvrtc` feature (kernels compiled at run time by
# NVRTC, so the GPU machine needs only its driver and CUDA's libnvrtc):
# - the library's test binary (`--lib`, with `train`), for the flash-attention kernel
#   tests on CUDA;
# - the bench runner, for the attention suite on CUDA with its peers (Burn's
#   `attention`, PyTorch's `scaled_dot_product_attention` through python3).
# It writes PACK_DIR/cuda-binaries.tar.xz (stripped and compressed: about 28 MiB). A
# cold build takes about 40 minutes on two cores (its linker setting rebuilds every
# crate), so start it before anything else.
#
# What the stages of `run` took on an H100 and an H200 (16-core hosts): each bench job
# 2–13 s, most of it NVRTC compiling in the job's own process and PyTorch's import, so
# the fragment batch 141–200 s for 36 jobs and the wide family's 12 another 49 s (the
# stage's cap is 300 s, with the one-pass family's 6 jobs); the kernel tests but the f32 grid 150–266 s on a fresh
# machine (`parity_grid_fragments` alone 52 s), the f32 grid about 260 s.
#
# Offline: cubecl-cuda build-depends on CubeCL's LLVM backend, whose build script
# downloads an LLVM bundle. DOCS_RS=1 skips that download (as on docs.rs), the linker
# is told to leave the LLVM symbols unresolved, and a small library of stubs packed
# with the binaries (preloaded by `run`) defines them: the NVRTC path never calls them.
# The build uses a target dir of its own (CARGO_TARGET_DIR, suffixed `-cuda`), so the
# usual one stays warm; copying the usual one there first saves most of a cold build.
#
# `run` unpacks the binaries, checks that the CUDA device starts (and stops there if
# not), and writes into OUT, every stage capped so that all of it ends within
# CUDA_RUN_SECONDS (560 by default: a lease is short), in the order CUDA_RUN_STAGES
# names them (see below):
# - gpu.txt: the GPU as nvidia-smi names it, and where NVRTC was found;
# - profile.txt, profile.ncu-rep, profile.log: Nsight Compute's details of the fragment
#   kernels (forward, dQ, dK/dV) at seq 4096, head dim 128, bf16 (stage `profile`);
# - tests.log: `ops::flash_attention::tests::cuda` through the default kernels (autotuned
#   on a GPU; the fragment kernels' grid in bf16, with `ldmatrix` loads, among them),
#   then again with BURN_TRANSFORMER_FLASH_KERNEL=tensor-cores; the fragment grid and
#   the half-type subset with BURN_TRANSFORMER_FLASH_LDMATRIX=0 (stage `element-loads`,
#   which also times those kernels as the column fused[fragments]);
# - bench.tar.gz: docs/benchmarks/ and docs/benchmarks.md with the attention suite's
#   CUDA records added (results.jsonl) and the report redrawn, plus bench.log. Unpack it
#   over docs/ to commit the rows. The quick CUDA grid runs in batches, the fastest
#   fused family with Burn and PyTorch first, each job stopped after JOB_SECONDS (60);
#   a batch stopped by the deadline keeps the jobs it finished. Set BENCH_ARGS for more
#   (for example `--full`). The stage `only` runs the cells CUDA_RUN_ONLY names instead
#   (bench `--only` texts, for example `fused[fragments] cuda fwd 4×16 seq 4096 d 64
#   bf16$`, with BENCH_ARGS=--full for cells outside the quick grid), for at most
#   CUDA_RUN_ONLY_SECONDS (300).
set -euo pipefail

usage() {
    sed -n '2,6p' "$0" >&2
    exit 2
}

[ $# -ge 2 ] || usage
command=$1
pack=$2

case "$command" in
build)
    mkdir -p "$pack"
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/burn-transformer-target}-cuda"
    export DOCS_RS=1
    # A linker that leaves unresolved symbols be (a wrapper rather than RUSTFLAGS, which
    # would rebuild every crate where the target dir was seeded from the usual one).
    # It lives at a fixed path: cargo relinks what a changed linker path links.
    linker="$CARGO_TARGET_DIR/unresolved-symbols-linker"
    mkdir -p "$linker"
    printf '#!/bin/sh\nexec cc "$@" -Wl,--unresolved-symbols=ignore-all\n' >"$linker/cc"
    chmod +x "$linker/cc"
    export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER="$linker/cc"
    # The paths of the binaries cargo built, from its JSON messages.
    executables() {
        python3 -c '
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    if message.get("reason") == "compiler-artifact" and message.get("executable"):
        print(message["executable"])'
    }
    tests=$(cargo test --release -p burn-transformer --features cuda-nvrtc,train --lib \
        --no-run --message-format=json | executables | tail -n1)
    bench=$(cargo build --release -p benches --bin bench \
        --features burn-transformer/cuda-nvrtc,benches/cuda --message-format=json \
        | executables | tail -n1)
    staging=$(mktemp -d)
    trap 'rm -rf "$staging"' EXIT
    cp "$tests" "$staging/burn_transformer_tests"
    cp "$bench" "$staging/bench"
    strip "$staging/burn_transformer_tests" "$staging/bench"
    # The loader resolves every symbol at start: a library that defines the LLVM
    # backend's symbols (each aborts if called, which the NVRTC path never does) lets
    # the binaries start.
    nm -D --undefined-only "$staging/burn_transformer_tests" "$staging/bench" \
        | awk '$2 ~ /^(LLVM|cubecl_)/ { print $2 }' | sort -u \
        | awk 'BEGIN { print "#include <stdlib.h>" } { printf "void %s(void) { abort(); }\n", $1 }' \
            >"$staging/llvm_stubs.c"
    cc -shared -fPIC -o "$staging/libllvm_stubs.so" "$staging/llvm_stubs.c"
    tar -C "$staging" -cJf "$pack/cuda-binaries.tar.xz" burn_transformer_tests bench \
        libllvm_stubs.so
    ls -l "$pack/cuda-binaries.tar.xz"
    ;;
run)
    [ $# -eq 3 ] || usage
    out=$3
    mkdir -p "$out/bench"
    out=$(cd "$out" && pwd)
    # Every stage ends by this deadline (CUDA_RUN_SECONDS after the start, 560 by
    # default), so a lease that has a fixed length always gets its results back.
    deadline=$(($(date +%s) + ${CUDA_RUN_SECONDS:-560}))
    # `within CAP COMMAND...`: runs COMMAND for at most CAP seconds or what is left.
    within() {
        local cap=$1 left
        shift
        left=$((deadline - $(date +%s)))
        if [ "$left" -lt 15 ]; then
            echo "skipped (out of time): $*"
            return 0
        fi
        [ "$cap" -lt "$left" ] || cap=$left
        timeout --kill-after=5 "$cap" "$@" || echo "exit $? (cap ${cap} s): $*"
        # A runner stopped part-way leaves its job processes behind.
        pkill -f -- '--job ' 2>/dev/null || true
    }
    binaries=$(mktemp -d)
    tar -C "$binaries" -xJf "$pack/cuda-binaries.tar.xz"
    export LD_PRELOAD="$binaries/libllvm_stubs.so"
    # NVRTC is loaded at run time: the CUDA toolkit's copy, or the one in a Python wheel.
    nvrtc_dirs=$({ find /usr/local/cuda*/ /usr/lib/x86_64-linux-gnu /opt /usr/local/lib \
        -name 'libnvrtc.so*' -not -path '*/stubs/*' -printf '%h\n' 2>/dev/null || true; } | sort -u | tr '\n' ':')
    export LD_LIBRARY_PATH="${nvrtc_dirs}${LD_LIBRARY_PATH:-}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/gpu.txt" || true
    echo "NVRTC in: $nvrtc_dirs" >>"$out/gpu.txt"
    # A device that does not start fails here, in seconds, not in every later stage.
    if ! timeout 120 "$binaries/bench" --probe cuda >>"$out/gpu.txt" 2>&1; then
        echo "the cuda probe failed: see gpu.txt"
        cat "$out/gpu.txt"
        exit 1
    fi
    tests=(env BURN_TRANSFORMER_TEST_DEVICES=cuda "$binaries/burn_transformer_tests")
    # Every filter of the test binary selects tests (a test runs if it contains any),
    # so a subset names each test by its whole path.
    cuda_tests=ops::flash_attention::tests::cuda
    # The committed records and page, so that the report keeps every other backend.
    cp -r docs/benchmarks "$out/bench/benchmarks"
    cp docs/benchmarks.md "$out/bench/benchmarks.md"
    # `bench_batch CAP TEXTS`: the attention cells whose progress line contains one of
    # TEXTS (comma separated). Each job's records reach results.jsonl as it ends.
    bench_batch() {
        # shellcheck disable=SC2086 # BENCH_ARGS is a list of arguments
        within "$1" "$binaries/bench" --backends cuda --suites attention \
            --out "$out/bench/benchmarks" --docs "$out/bench/benchmarks.md" \
            --memory-budget-mib 60000 --timeout "${JOB_SECONDS:-60}" --only "$2" \
            ${BENCH_ARGS:-} >>"$out/bench/bench.log" 2>&1
    }
    # The stages, in the order CUDA_RUN_STAGES names them (by default the acceptance's
    # columns first: the fastest fused family against Burn and PyTorch, and the
    # kernels with overlapped copies beside it; the kernel tests but the f32 grid; a
    # profile of the fastest family's kernels; the fragment kernels with element loads
    # beside them; the other families; the f32 grid last).
    # The first run on a machine compiles every kernel (NVRTC, then the driver's PTX
    # compiler, whose cache on the machine makes later runs faster), hence the caps.
    : >"$out/tests.log"
    for stage in ${CUDA_RUN_STAGES:-fragments overlapped tests profile element-loads tensor-cores tests-tc families grid-f32}; do
        case "$stage" in
        # The fragment families beside Burn and PyTorch (the one-pass backward's
        # family times forward+backward cells only: 6 more jobs).
        fragments)
            bench_batch 300 'fused[fragments+ldmatrix],fused[wide-fragments+ldmatrix],fused[fragments-atomic-dq+ldmatrix],burn cuda,torch_sdpa'
            ;;
        element-loads)
            # The fragment kernels loading element by element instead of with
            # `ldmatrix`: their tests first, then their cells beside the batch above
            # (column fused[fragments]).
            echo "=== kernel tests, BURN_TRANSFORMER_FLASH_LDMATRIX=0" >>"$out/tests.log"
            within 120 env BURN_TRANSFORMER_FLASH_LDMATRIX=0 "${tests[@]}" \
                "$cuda_tests::parity_grid_fragments" "$cuda_tests::half_precision_subset" \
                >>"$out/tests.log" 2>&1
            export BURN_TRANSFORMER_FLASH_LDMATRIX=0
            bench_batch 120 'fused[fragments]'
            unset BURN_TRANSFORMER_FLASH_LDMATRIX
            ;;
        overlapped)
            # The fragment kernels with their tile copies overlapped (`cp.async`)
            # beside the fragments batch above. Its parity test is in the `tests` stage.
            bench_batch 150 'fused[fragments-overlapped+ldmatrix]'
            ;;
        tensor-cores) bench_batch 70 'fused[tensor-cores]' ;;
        tf32)
            # The TF32 fragment kernels (f32) beside the staged kernels, Burn and
            # PyTorch at head dim 128: f32 cells only (a text ending in `$` ends the
            # line; bf16 cells end in `bf16`). Their tests are in the `tests` stage.
            only=""
            for impl in 'fused[fragments-tf32]' 'fused[staged]' burn torch_sdpa; do
                for pass in fwd fwd_bwd; do
                    for seq in 1024 4096 16384; do
                        for mask in '' ' causal'; do
                            only="$only,$impl cuda $pass 4×16 seq $seq d 128$mask\$"
                        done
                    done
                done
            done
            BENCH_ARGS="--full ${BENCH_ARGS:-}" bench_batch 300 "${only#,}"
            ;;
        only)
            # The cells CUDA_RUN_ONLY names (`--only` texts; add `--full` to BENCH_ARGS
            # for cells outside the quick grid, such as head dim 64 or f32).
            bench_batch "${CUDA_RUN_ONLY_SECONDS:-300}" "${CUDA_RUN_ONLY:?the only stage needs CUDA_RUN_ONLY}"
            ;;
        families) bench_batch 400 'fused[staged],fused[register],reference cuda' ;;
        tests)
            echo "=== kernel tests, default kernels, all but the f32 grid" >>"$out/tests.log"
            within 300 "${tests[@]}" "$cuda_tests" --skip parity_grid_f32 >>"$out/tests.log" 2>&1
            ;;
        tests-tc)
            echo "=== kernel tests, BURN_TRANSFORMER_FLASH_KERNEL=tensor-cores" >>"$out/tests.log"
            within 90 env BURN_TRANSFORMER_FLASH_KERNEL=tensor-cores "${tests[@]}" \
                "$cuda_tests" --skip parity_grid_f32 >>"$out/tests.log" 2>&1
            ;;
        profile)
            # Nsight Compute on the fragment kernels of one forward+backward cell: the
            # first launch of each (forward, dQ, dK/dV), their speed of light,
            # occupancy, warp stalls and memory traffic, as text and as a report.
            ncu=$(command -v ncu || find /opt/nvidia /usr/local/cuda*/ -name ncu -type f \
                2>/dev/null | head -n1 || true)
            if [ -z "$ncu" ]; then
                echo "no ncu on this machine" >"$out/profile.txt"
            else
                within 120 "$ncu" --target-processes all --kernel-name regex:fragment_ \
                    --launch-count 3 --section SpeedOfLight --section Occupancy \
                    --section LaunchStats --section WarpStateStats \
                    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
                    --section InstructionStats -o "$out/profile" \
                    "$binaries/bench" --backends cuda --suites attention \
                    --out "$(mktemp -d)" --docs "$(mktemp)" --timeout 100 \
                    --only 'fused[fragments+ldmatrix] cuda fwd_bwd 4×16 seq 4096 d 128 bf16' \
                    >"$out/profile.log" 2>&1
                "$ncu" --import "$out/profile.ncu-rep" --page details \
                    >"$out/profile.txt" 2>&1 || true
            fi
            ;;
        grid-f32)
            echo "=== kernel tests, the f32 grid (register tiles)" >>"$out/tests.log"
            within 400 "${tests[@]}" "$cuda_tests::parity_grid_f32" >>"$out/tests.log" 2>&1
            ;;
        *) echo "unknown stage $stage" ;;
        esac
    done
    # The report, redrawn from every record the batches left.
    "$binaries/bench" --report-only --out "$out/bench/benchmarks" \
        --docs "$out/bench/benchmarks.md" >>"$out/bench/bench.log" 2>&1 || true
    # The end of the output: every cell's line, then the tests' verdicts.
    grep -E "^\[" "$out/bench/bench.log" | cut -c 1-150 || true
    tar -C "$out/bench" -czf "$out/bench.tar.gz" .
    rm -rf "$out/bench"
    grep -E "^test |test result|FAILED|panicked|^exit|^skipped" "$out/tests.log" | tail -n 30 || true
    ;;
*)
    usage
    ;;
esac
