#!/usr/bin/env python3
"""GPU resources of the CubeCL flash-attention kernels on sm_90 (H100), without a GPU.

Every kernel the fused attention launches on CUDA (each kernel family's forward,
flash-decoding merge, backward pre-pass, dQ, dK/dV; f32, f16, bf16; each head size)
is written as CUDA C++ by the `kernel_source`
program (CubeCL's own C++ backend, as CubeCL's CUDA runtime runs it before NVRTC).
This script compiles each file to PTX with NVRTC, as that runtime does, assembles it
with `ptxas -v -arch=sm_90`, and reads what ptxas reports: registers per thread,
spill stores and loads, shared memory. From those and the units per cube it computes
the theoretical occupancy on an H100 (the CUDA occupancy calculator's rules for
compute capability 9.0). It writes one JSON line per kernel and prints a markdown table.

The CUDA tools come from NVIDIA's PyPI wheels, in a virtual environment of their own
(not a dependency of the project):

    python3 -m venv V && V/bin/pip install nvidia-cuda-nvcc-cu12 nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12
    python3 tools/kernel_resources.py --venv V

Without `--sources`, the script runs
`cargo run --release -p benches --features kernel-source --bin kernel_source` into a
temporary folder first (no GPU or CUDA toolkit needed for that step).

Standard library only (NVRTC through ctypes).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "docs" / "benchmarks" / "kernel_resources.jsonl"
ALIBI_OUT = REPO / "docs" / "benchmarks" / "kernel_resources_alibi.jsonl"
WHEELS = "nvidia-cuda-nvcc-cu12 nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12"
INSTALL_HINT = (
    "Install NVIDIA's CUDA tool wheels into a virtual environment of their own:\n"
    f"    python3 -m venv V && V/bin/pip install {WHEELS}\n"
    "then pass --venv V (or set CUDA_TOOLS_VENV=V); --ptxas, --nvrtc and --cuda-include "
    "(PTXAS, NVRTC_LIB, CUDA_INCLUDE) name the pieces one by one."
)

# H100 (compute capability 9.0), as the CUDA occupancy calculator describes it.
WARP_SIZE = 32
REGISTERS_PER_SM = 65536
# Registers are allocated per warp, in units of 256, and in each of the SM's four
# sub-partitions (a warp's registers come from one sub-partition's quarter of the file).
REGISTER_UNIT = 256
SUB_PARTITIONS = 4
MAX_REGISTERS_PER_THREAD = 255
MAX_WARPS_PER_SM = 64
MAX_BLOCKS_PER_SM = 32
SHARED_PER_SM = 228 * 1024
SHARED_MAX_PER_BLOCK = 227 * 1024
# Every block also takes 1 KiB of shared memory for the system, and allocations are
# rounded up to 128 bytes.
SHARED_RESERVED_PER_BLOCK = 1024
SHARED_UNIT = 128

# The JSON keys, in order, of each line of the output.
KEYS = [
    "kernel",
    "variant",
    "dtype",
    "d_qk",
    "d_v",
    "tile",
    "arch",
    "registers",
    "spill_stores_bytes",
    "spill_loads_bytes",
    "shared_bytes",
    "occupancy",
    "units_per_cube",
    "lanes",
]


class ToolError(Exception):
    """A failure to report to the user as one message (exit status 1)."""


@dataclass
class Tools:
    ptxas: Path
    nvrtc: Path
    include: Path
    # A CUDA toolkit keeps the compiler's headers (crt/mma.h, which the tensor-core
    # kernels' mma.h includes) in the same folder; the wheels split them into the
    # nvcc wheel.
    compiler_include: Path | None = None


def site_packages_nvidia(venv: Path) -> Path:
    """The `nvidia` package folder of the wheels inside a virtual environment."""
    found = sorted(glob.glob(str(venv / "lib" / "python3*" / "site-packages" / "nvidia")))
    found += sorted(glob.glob(str(venv / "Lib" / "site-packages" / "nvidia")))
    if not found:
        raise ToolError(f"{venv} holds no NVIDIA wheels (no site-packages/nvidia).\n{INSTALL_HINT}")
    return Path(found[0])


def find_tools(args: argparse.Namespace) -> Tools:
    """ptxas, libnvrtc and the CUDA runtime headers, from flags, environment or venv."""
    venv = args.venv or os.environ.get("CUDA_TOOLS_VENV")
    nvidia = site_packages_nvidia(Path(venv)) if venv else None

    def pick(flag, env, relative, what):
        value = flag or os.environ.get(env)
        if value:
            path = Path(value)
        elif nvidia is not None:
            path = nvidia / relative
        else:
            raise ToolError(f"{what} not found: no --venv, nor a path of its own.\n{INSTALL_HINT}")
        if not path.exists():
            raise ToolError(f"{what} not found at {path}.\n{INSTALL_HINT}")
        return path

    ptxas = pick(args.ptxas, "PTXAS", Path("cuda_nvcc/bin/ptxas"), "ptxas")
    nvrtc = pick(args.nvrtc, "NVRTC_LIB", Path("cuda_nvrtc/lib/libnvrtc.so.12"), "libnvrtc")
    include = pick(
        args.cuda_include, "CUDA_INCLUDE", Path("cuda_runtime/include"), "the CUDA headers"
    )
    if not (include / "cuda_fp16.h").exists():
        raise ToolError(
            f"{include} has no cuda_fp16.h: not the CUDA runtime's include folder.\n{INSTALL_HINT}"
        )
    if not os.access(ptxas, os.X_OK):
        raise ToolError(f"{ptxas} is not executable (chmod +x it, or reinstall the nvcc wheel)")
    compiler_include = nvidia / "cuda_nvcc" / "include" if nvidia is not None else None
    if compiler_include is not None and not (compiler_include / "crt" / "mma.h").exists():
        compiler_include = None
    return Tools(ptxas=ptxas, nvrtc=nvrtc, include=include, compiler_include=compiler_include)


class Nvrtc:
    """NVRTC through ctypes: CUDA C++ source to PTX."""

    def __init__(self, library: Path):
        # The builtins library sits next to libnvrtc; loading it first, globally, lets
        # NVRTC find it without LD_LIBRARY_PATH.
        for builtins in sorted(library.parent.glob("libnvrtc-builtins.so*")):
            try:
                ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
                break
            except OSError:
                continue
        try:
            self.lib = ctypes.CDLL(str(library))
        except OSError as err:
            raise ToolError(f"cannot load {library}: {err}\n{INSTALL_HINT}") from err
        lib = self.lib
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        lib.nvrtcCreateProgram.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        lib.nvrtcCompileProgram.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_char_p),
        ]
        for name in ("nvrtcGetProgramLogSize", "nvrtcGetPTXSize"):
            getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        for name in ("nvrtcGetProgramLog", "nvrtcGetPTX"):
            getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]

    def version(self) -> str:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        return f"{major.value}.{minor.value}"

    def _check(self, status: int, call: str):
        if status != 0:
            message = self.lib.nvrtcGetErrorString(status).decode()
            raise ToolError(f"{call} failed: {message}")

    def _text(self, program, size_call, get_call) -> bytes:
        size = ctypes.c_size_t()
        self._check(size_call(program, ctypes.byref(size)), size_call.__name__)
        buffer = ctypes.create_string_buffer(size.value)
        self._check(get_call(program, buffer), get_call.__name__)
        return buffer.value

    def compile(self, source: str, name: str, options: list[str]) -> str:
        program = ctypes.c_void_p()
        self._check(
            self.lib.nvrtcCreateProgram(
                ctypes.byref(program), source.encode(), name.encode(), 0, None, None
            ),
            "nvrtcCreateProgram",
        )
        try:
            encoded = [option.encode() for option in options]
            array = (ctypes.c_char_p * len(encoded))(*encoded)
            status = self.lib.nvrtcCompileProgram(program, len(encoded), array)
            if status != 0:
                log = self._text(
                    program, self.lib.nvrtcGetProgramLogSize, self.lib.nvrtcGetProgramLog
                )
                raise ToolError(f"NVRTC could not compile {name}:\n{log.decode(errors='replace')}")
            return self._text(program, self.lib.nvrtcGetPTXSize, self.lib.nvrtcGetPTX).decode()
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(program))


PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
PTXAS_SPILLS = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
PTXAS_REGISTERS = re.compile(r"Used (\d+) registers")
PTXAS_SHARED = re.compile(r"(\d+) bytes smem")


def ptxas_resources(ptxas: Path, ptx_path: Path, arch: str, entry_point: str) -> dict:
    """Registers, spills and static shared memory of the one kernel in a PTX file."""
    result = subprocess.run(
        [str(ptxas), "-v", f"-arch={arch}", "-o", os.devnull, str(ptx_path)],
        capture_output=True,
        text=True,
    )
    report = result.stderr + result.stdout
    if result.returncode != 0:
        raise ToolError(f"ptxas failed on {ptx_path}:\n{report}")
    entries = PTXAS_ENTRY.findall(report)
    if [name for name, _ in entries] != [entry_point]:
        raise ToolError(
            f"ptxas reported entry functions {entries} for {ptx_path}, "
            f"expected '{entry_point}':\n{report}"
        )
    spills = PTXAS_SPILLS.search(report)
    registers = PTXAS_REGISTERS.search(report)
    if not spills or not registers:
        raise ToolError(f"cannot read ptxas's report for {ptx_path}:\n{report}")
    shared = PTXAS_SHARED.search(report)
    return {
        "registers": int(registers.group(1)),
        "stack_bytes": int(spills.group(1)),
        "spill_stores_bytes": int(spills.group(2)),
        "spill_loads_bytes": int(spills.group(3)),
        "static_shared_bytes": int(shared.group(1)) if shared else 0,
    }


def round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def occupancy(registers: int, shared_bytes: int, units: int) -> tuple[float, int, str]:
    """Theoretical occupancy on an H100: (active warps / 64, blocks per SM, limiter)."""
    warps = -(-units // WARP_SIZE)
    if registers > MAX_REGISTERS_PER_THREAD or shared_bytes > SHARED_MAX_PER_BLOCK:
        return 0.0, 0, "does not launch"
    limits = {
        "warps": MAX_WARPS_PER_SM // warps,
        "blocks": MAX_BLOCKS_PER_SM,
    }
    registers_per_warp = round_up(max(registers, 1) * WARP_SIZE, REGISTER_UNIT)
    warps_per_partition = (REGISTERS_PER_SM // SUB_PARTITIONS) // registers_per_warp
    limits["registers"] = warps_per_partition * SUB_PARTITIONS // warps
    shared_per_block = round_up(shared_bytes + SHARED_RESERVED_PER_BLOCK, SHARED_UNIT)
    limits["shared memory"] = SHARED_PER_SM // shared_per_block
    blocks = min(limits.values())
    # Name every limit that binds (ties included), most specific first.
    limiter = ", ".join(
        name
        for name in ("registers", "shared memory", "warps", "blocks")
        if limits[name] == blocks
    )
    return blocks * warps / MAX_WARPS_PER_SM, blocks, limiter


def generate_sources(folder: Path, alibi: bool):
    """Runs the `kernel_source` program into `folder` (`--alibi`: the kernels of calls
    with ALiBi)."""
    command = [
        "cargo",
        "run",
        "--release",
        "-p",
        "benches",
        "--features",
        "kernel-source",
        "--bin",
        "kernel_source",
        "--",
        "--out",
        str(folder),
    ] + (["--alibi"] if alibi else [])
    print("$ " + " ".join(command), file=sys.stderr)
    try:
        result = subprocess.run(command, cwd=REPO)
    except FileNotFoundError as err:
        raise ToolError(
            "cargo not found: install Rust, or pass --sources with kernel_source's output"
        ) from err
    if result.returncode != 0:
        raise ToolError("kernel_source failed (its message is above)")


def measure(
    variant: dict, sources: Path, work: Path, tools: Tools, nvrtc: Nvrtc, arch: str
) -> dict:
    """One kernel: NVRTC, ptxas, occupancy; the JSON line plus what the table shows."""
    source_path = sources / variant["file"]
    try:
        source = source_path.read_text()
    except OSError as err:
        raise ToolError(f"cannot read {source_path}: {err}") from err
    # The options CubeCL's CUDA runtime gives NVRTC: the architecture, the CUDA
    # headers (cuda_fp16.h, cuda_bf16.h), line information.
    options = [
        f"--gpu-architecture={arch.replace('sm_', 'compute_')}",
        f"--include-path={tools.include}",
        "-lineinfo",
    ]
    if tools.compiler_include is not None:
        options.append(f"--include-path={tools.compiler_include}")
    ptx = nvrtc.compile(source, variant["file"], options)
    ptx_path = work / (Path(variant["file"]).stem + ".ptx")
    ptx_path.write_text(ptx)
    resources = ptxas_resources(tools.ptxas, ptx_path, arch, variant["entry_point"])
    shared = resources["static_shared_bytes"] + int(variant["dynamic_shared_bytes"])
    units = int(variant["units_per_cube"])
    fraction, blocks, limiter = occupancy(resources["registers"], shared, units)
    line = {
        "kernel": variant["kernel"],
        "variant": variant["variant"],
        "dtype": variant["dtype"],
        "d_qk": variant["d_qk"],
        "d_v": variant["d_v"],
        # Query rows (keys, for dK/dV) × keys (queries) of a tiled kernel's cube.
        "tile": tile(variant),
        "arch": arch,
        "registers": resources["registers"],
        "spill_stores_bytes": resources["spill_stores_bytes"],
        "spill_loads_bytes": resources["spill_loads_bytes"],
        "shared_bytes": shared,
        "occupancy": round(fraction, 4),
        "units_per_cube": units,
        # Units that share each row (the register tiles' split rows; 1 elsewhere).
        "lanes": int(variant.get("lanes", 1)),
    }
    return {"line": {key: line[key] for key in KEYS}, "blocks": blocks, "limiter": limiter}


def tile(variant: dict) -> str | None:
    """`rows×block` of a staged or fragment kernel's cube tile (`None` for the others,
    whose launch shape `units_per_cube` says)."""
    tiled = variant["variant"].startswith("staged") or "fragments" in variant["variant"]
    if tiled and variant.get("block") is not None:
        return f"{variant['rows_per_unit']}x{variant['block']}"
    return None


def markdown(rows: list[dict]) -> str:
    lines = [
        "| kernel | variant | tile | dtype | d_qk × d_v | units/cube | lanes | registers "
        "| spill stores / loads (B) | shared (B) | blocks/SM | occupancy | limited by |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        line = row["line"]
        lines.append(
            f"| {line['kernel']} | {line['variant']} | {line['tile'] or '–'} | {line['dtype']} "
            f"| {line['d_qk']} × {line['d_v']} | {line['units_per_cube']} | {line['lanes']} "
            f"| {line['registers']} "
            f"| {line['spill_stores_bytes']} / {line['spill_loads_bytes']} "
            f"| {line['shared_bytes']} "
            f"| {row['blocks']} | {line['occupancy'] * 100:.1f}% | {row['limiter']} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=INSTALL_HINT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sources",
        type=Path,
        help="kernel_source's output folder (variants.json and the .cu files); "
        "without it, kernel_source is run through cargo into a temporary folder",
    )
    parser.add_argument(
        "--venv",
        type=Path,
        help="virtual environment with the three CUDA wheels (or CUDA_TOOLS_VENV)",
    )
    parser.add_argument("--ptxas", type=Path, help="the ptxas executable (or PTXAS)")
    parser.add_argument("--nvrtc", type=Path, help="libnvrtc.so.12 (or NVRTC_LIB)")
    parser.add_argument(
        "--cuda-include",
        type=Path,
        help="the CUDA runtime's include folder, with cuda_fp16.h (or CUDA_INCLUDE)",
    )
    parser.add_argument(
        "--arch",
        default="sm_90",
        choices=["sm_90", "sm_90a"],
        help="target of NVRTC (compute_*) and ptxas (default sm_90; CubeCL's CUDA runtime "
        "compiles for sm_90a, which adds only instructions these kernels do not use)",
    )
    parser.add_argument(
        "--alibi",
        action="store_true",
        help="the kernels of calls with ALiBi (the bias compiled into every score: "
        "forward, dQ, dK/dV), written by default to "
        f"{ALIBI_OUT.relative_to(REPO)}",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help=f"JSON lines to write (default {DEFAULT_OUT.relative_to(REPO)})",
    )
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="kernels compiled at once"
    )
    return parser.parse_args(argv)


def run(args: argparse.Namespace):
    if args.out is None:
        args.out = ALIBI_OUT if args.alibi else DEFAULT_OUT
    tools = find_tools(args)
    nvrtc = Nvrtc(tools.nvrtc)
    version = subprocess.run(
        [str(tools.ptxas), "--version"], capture_output=True, text=True
    ).stdout
    release = re.search(r"release [^\n]*", version)
    ptxas_release = release.group(0) if release else "?"
    print(f"NVRTC {nvrtc.version()}, ptxas {ptxas_release}, {args.arch}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="kernel_resources-") as temporary:
        work = Path(temporary)
        sources = args.sources
        if sources is None:
            sources = work / "sources"
            generate_sources(sources, args.alibi)
        manifest_path = sources / "variants.json"
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError) as err:
            raise ToolError(
                f"cannot read {manifest_path} ({err}): run `cargo run --release -p benches "
                f"--features kernel-source --bin kernel_source -- --out {sources}` first"
            ) from err
        variants = manifest["variants"]
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
            futures = [
                pool.submit(measure, variant, sources, work, tools, nvrtc, args.arch)
                for variant in variants
            ]
            rows = []
            for index, future in enumerate(futures):
                rows.append(future.result())
                print(f"[{index + 1}/{len(variants)}] {variants[index]['file']}", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(row["line"]) + "\n" for row in rows)
    temporary_out = args.out.with_suffix(args.out.suffix + ".tmp")
    temporary_out.write_text(text)
    temporary_out.replace(args.out)
    print(markdown(rows))
    print(f"\nwrote {len(rows)} lines to {args.out}", file=sys.stderr)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except ToolError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
