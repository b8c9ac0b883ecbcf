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
# It writes PACK_DIR/cuda-binaries.tar.xz (stripped and compressed: a few tens of MiB).
#
# Offline: cubecl-cuda build-depends on CubeCL's LLVM backend, whose build script
# downloads an LLVM bundle. DOCS_RS=1 skips that download (as on docs.rs), the linker
# is told to leave the LLVM symbols unresolved, and a small library of stubs packed
# with the binaries (preloaded by `run`) defines them: the NVRTC path never calls them.
# The build uses a target dir of its own (CARGO_TARGET_DIR, suffixed `-cuda`), so the
# usual one stays warm; copying the usual one there first saves most of a cold build.
#
# `run` unpacks the binaries and writes into OUT:
# - gpu.txt: the GPU as nvidia-smi names it;
# - tests.log: `ops::flash_attention::tests::cuda` through the default kernels (autotuned
#   on a GPU; the fragment forward's grid in bf16 among them), then again with
#   BURN_TRANSFORMER_FLASH_KERNEL=tensor-cores;
# - bench.tar.gz: docs/benchmarks/ and docs/benchmarks.md with the attention suite's
#   CUDA records added (results.jsonl) and the report redrawn, plus bench.log. Unpack it
#   over docs/ to commit the rows. Set BENCH_ARGS for more (for example `--full`); by
#   default the quick CUDA grid, with room for the score-materializing peers.
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
    binaries=$(mktemp -d)
    tar -C "$binaries" -xJf "$pack/cuda-binaries.tar.xz"
    export LD_PRELOAD="$binaries/libllvm_stubs.so"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/gpu.txt" || true
    {
        echo "=== kernel tests, default kernels"
        BURN_TRANSFORMER_TEST_DEVICES=cuda "$binaries/burn_transformer_tests" \
            ops::flash_attention::tests::cuda || echo "FAILED: default kernels"
        echo "=== kernel tests, BURN_TRANSFORMER_FLASH_KERNEL=tensor-cores"
        BURN_TRANSFORMER_TEST_DEVICES=cuda BURN_TRANSFORMER_FLASH_KERNEL=tensor-cores \
            "$binaries/burn_transformer_tests" ops::flash_attention::tests::cuda \
            || echo "FAILED: tensor cores"
    } >"$out/tests.log" 2>&1
    # The committed records and page, so that the report keeps every other backend.
    cp -r docs/benchmarks "$out/bench/benchmarks"
    cp docs/benchmarks.md "$out/bench/benchmarks.md"
    # shellcheck disable=SC2086 # BENCH_ARGS is a list of arguments
    "$binaries/bench" --backends cuda --suites attention --out "$out/bench/benchmarks" \
        --docs "$out/bench/benchmarks.md" --memory-budget-mib 60000 ${BENCH_ARGS:-} \
        >"$out/bench/bench.log" 2>&1 || echo "bench failed: see bench.log in bench.tar.gz"
    tar -C "$out/bench" -czf "$out/bench.tar.gz" .
    rm -rf "$out/bench"
    ;;
*)
    usage
    ;;
esac
