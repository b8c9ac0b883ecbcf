#!/usr/bin/env python3
"""Write the PyTorch / Hugging Face fixtures that pin the semantics of burn-transformer.

Every fixture is a small float32 safetensors file in burn-transformer/tests/fixtures/
(`<name>.safetensors`), optionally with a `<name>.json` sidecar holding the Hugging Face
style configuration that produced it. The values come from transformers' own code
wherever it exists (rope init functions, `apply_rotary_pos_emb`, `LlamaRMSNorm`,
`LlamaMLP`, ...), so the Rust tests compare against the reference implementation, not
against a re-derivation.

Usage:
    python tools/make_fixtures.py            # every fixture
    python tools/make_fixtures.py rope_yarn rms_norm   # just these
    python tools/make_fixtures.py --list     # names and one-line descriptions

Adding a fixture: write a function that returns `Fixture(tensors, config)` and decorate
it with `@fixture("name")`. Seeds are fixed per fixture (`seeded(name)`), so adding one
never changes another.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "burn-transformer" / "tests" / "fixtures"
MAX_BYTES = 200 * 1024


@dataclass
class Fixture:
    """What a fixture function returns."""

    # Tensor name -> tensor; stored as float32 (integer tensors as int64).
    tensors: dict[str, torch.Tensor]
    # Written to `<name>.json` when not None (e.g. the HF config the values came from).
    config: dict | None = None
    # Stored in the safetensors header (strings only).
    notes: dict[str, str] = field(default_factory=dict)


REGISTRY: dict[str, tuple[Callable[[], Fixture], str]] = {}


def fixture(name: str):
    """Registers a fixture function under `name`; its docstring's first line describes it."""

    def register(function: Callable[[], Fixture]):
        if name in REGISTRY:
            raise ValueError(f"fixture {name} registered twice")
        doc = (function.__doc__ or "").strip().splitlines()
        REGISTRY[name] = (function, doc[0] if doc else "")
        return function

    return register


def seeded(name: str) -> torch.Generator:
    """A generator seeded from the fixture name: deterministic and independent per fixture."""
    generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    torch.manual_seed(zlib.crc32(name.encode()))
    return generator


def randn(generator: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=generator, dtype=torch.float32) * scale


def scalar(value: float) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.float32)


def write(name: str, result: Fixture) -> Path:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for key, tensor in result.tensors.items():
        tensor = tensor.detach().cpu().contiguous()
        if tensor.dtype.is_floating_point:
            tensor = tensor.to(torch.float32)
        elif tensor.dtype != torch.bool:
            tensor = tensor.to(torch.int64)
        tensors[key] = tensor
    path = OUT_DIR / f"{name}.safetensors"
    # One metadata key: safetensors writes its header map in arbitrary order, and a
    # single key keeps the files byte-for-byte reproducible.
    info = {"generator": "tools/make_fixtures.py", **result.notes}
    metadata = {"info": json.dumps(info, sort_keys=True)}
    save_file(tensors, str(path), metadata=metadata)
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise RuntimeError(f"fixture {name} is {size} bytes; keep fixtures under {MAX_BYTES}")
    if result.config is not None:
        (OUT_DIR / f"{name}.json").write_text(json.dumps(result.config, indent=2) + "\n")
    return path


# --------------------------------------------------------------------------------------
# Rotary position embedding
# --------------------------------------------------------------------------------------
#
# cos/sin come from a fresh GPTNeoXRotaryEmbedding per case: it computes the default
# frequencies with `partial_rotary_factor` (LlamaRotaryEmbedding's default ignores it) and
# every scaling type through `ROPE_INIT_FUNCTIONS`, including the dynamic / longrope
# updates in its forward. A fresh module per case keeps transformers' stateful dynamic
# cache out of the picture: each case is "the first call reaching these positions".
#
# Layouts:
# - half_split: gpt_neox `apply_rotary_pos_emb` (LLaMA's rotate_half, with a pass-through
#   tail for partial rotary); checked equal to llama's for full rotary.
# - interleaved: glm `apply_rotary_pos_emb` (GPT-J's rotate_every_two on pairs (x0,x1),
#   (x2,x3)..., output kept in place, pass-through tail); checked equal to GPT-J's.
# - interleaved_deepseek (full rotary only): deepseek_v3 `apply_rotary_pos_emb_interleave`,
#   which returns the rotated pairs de-interleaved (evens then odds): a fixed permutation
#   of `interleaved`, identical attention scores.

ROPE_BATCH, ROPE_HEADS = 2, 3


def rope_hf_config(head_dim: int, max_pos: int, rope_parameters: dict) -> dict:
    """A minimal HF config.json holding everything the RoPE needs."""
    return {
        "hidden_size": head_dim * ROPE_HEADS,
        "num_attention_heads": ROPE_HEADS,
        "head_dim": head_dim,
        "max_position_embeddings": max_pos,
        "rope_parameters": rope_parameters,
    }


def rope_cos_sin(config: dict, x: torch.Tensor, offset: int):
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding

    rope_parameters = copy.deepcopy(config["rope_parameters"])
    # GPTNeoXConfig defaults to partial_rotary_factor 0.25; the HF default elsewhere is 1.
    partial = rope_parameters.setdefault("partial_rotary_factor", 1.0)
    hf = GPTNeoXConfig(
        hidden_size=config["hidden_size"],
        num_attention_heads=config["num_attention_heads"],
        max_position_embeddings=config["max_position_embeddings"],
        partial_rotary_factor=partial,
        rope_parameters=rope_parameters,
    )
    rotary = GPTNeoXRotaryEmbedding(hf)
    # A proportional RoPE turns its fraction of the pairs over the whole head.
    if rope_parameters["rope_type"] == "proportional":
        rotary_dim = config["head_dim"]
    else:
        rotary_dim = int(config["head_dim"] * partial)
    assert rotary.inv_freq.shape == (rotary_dim // 2,), (rotary.inv_freq.shape, rotary_dim)
    seq = x.shape[2]
    position_ids = torch.arange(offset, offset + seq)[None].expand(x.shape[0], seq)
    cos, sin = rotary(x, position_ids)
    return cos, sin, rotary.inv_freq.clone(), float(rotary.attention_scaling)


def rope_apply_all(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> dict[str, torch.Tensor]:
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek
    from transformers.models.glm import modeling_glm as glm
    from transformers.models.gpt_neox import modeling_gpt_neox as neox
    from transformers.models.gptj import modeling_gptj as gptj
    from transformers.models.llama import modeling_llama as llama

    half_split, _ = neox.apply_rotary_pos_emb(x, x, cos, sin)
    interleaved, _ = glm.apply_rotary_pos_emb(x, x, cos, sin)
    out = {"half_split": half_split, "interleaved": interleaved}
    if cos.shape[-1] == x.shape[-1]:
        # Cross-checks: the other HF implementations of the same layouts agree.
        llama_out, _ = llama.apply_rotary_pos_emb(x, x, cos, sin)
        assert torch.equal(llama_out, half_split), "llama and gpt-neox RoPE differ"
        half = cos.shape[-1] // 2
        # GPT-J takes [batch, seq, heads, dim] and sin/cos of the pair angles only.
        gptj_out = gptj.apply_rotary_pos_emb(
            x.transpose(1, 2), sin[..., :half], cos[..., :half]
        ).transpose(1, 2)
        torch.testing.assert_close(gptj_out, interleaved, rtol=0, atol=1e-6)
        deepseek_out, _ = deepseek.apply_rotary_pos_emb_interleave(x, x, cos, sin)
        permuted = torch.cat([interleaved[..., 0::2], interleaved[..., 1::2]], dim=-1)
        torch.testing.assert_close(deepseek_out, permuted, rtol=0, atol=1e-6)
        out["interleaved_deepseek"] = deepseek_out
    return out


def rope_fixture(
    name: str,
    head_dim: int,
    max_pos: int,
    rope_parameters: dict,
    cases: list[tuple[int, int]],
) -> Fixture:
    """`cases`: (offset, seq) pairs; each gets its own input."""
    generator = seeded(name)
    config = rope_hf_config(head_dim, max_pos, rope_parameters)
    tensors: dict[str, torch.Tensor] = {}
    scaling = None
    for index, (offset, seq) in enumerate(cases):
        x = randn(generator, ROPE_BATCH, ROPE_HEADS, seq, head_dim)
        cos, sin, inv_freq, attention_scaling = rope_cos_sin(config, x, offset)
        if scaling is not None:
            assert scaling == attention_scaling
        scaling = attention_scaling
        prefix = f"case{index}"
        tensors[f"{prefix}.x"] = x
        tensors[f"{prefix}.offset"] = scalar(offset)
        tensors[f"{prefix}.inv_freq"] = inv_freq
        for layout, value in rope_apply_all(x, cos, sin).items():
            tensors[f"{prefix}.{layout}"] = value
    tensors["attention_scaling"] = scalar(scaling)
    config["cases"] = [{"offset": o, "seq": s} for o, s in cases]
    return Fixture(tensors, config, {"attention_scaling": repr(scaling)})


@fixture("rope_default")
def rope_default() -> Fixture:
    """RoPE, no scaling, theta 10000, both layouts, offsets 0 and 5."""
    return rope_fixture(
        "rope_default", 16, 64, {"rope_type": "default", "rope_theta": 10000.0},
        [(0, 12), (5, 3), (40, 7)],
    )


@fixture("rope_linear")
def rope_linear() -> Fixture:
    """RoPE with linear position interpolation (factor 2.5), theta 500000."""
    return rope_fixture(
        "rope_linear", 16, 64, {"rope_type": "linear", "factor": 2.5, "rope_theta": 500000.0},
        [(0, 12), (9, 4)],
    )


@fixture("rope_dynamic")
def rope_dynamic() -> Fixture:
    """Dynamic NTK RoPE (factor 2, max 16): within max, beyond it, and an offset beyond it."""
    return rope_fixture(
        "rope_dynamic", 16, 16, {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
        [(0, 10), (0, 24), (20, 4), (13, 3)],
    )


@fixture("rope_yarn")
def rope_yarn() -> Fixture:
    """YaRN (factor 4, original 16): default betas, derived attention factor 0.1 ln 4 + 1."""
    return rope_fixture(
        "rope_yarn", 16, 64,
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
         "rope_theta": 10000.0},
        [(0, 12), (30, 6)],
    )


@fixture("rope_yarn_deepseek")
def rope_yarn_deepseek() -> Fixture:
    """YaRN as DeepSeek uses it: mscale / mscale_all_dim, custom betas, no truncation."""
    return rope_fixture(
        "rope_yarn_deepseek", 32, 128,
        {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16,
         "beta_fast": 16, "beta_slow": 2, "mscale": 0.707, "mscale_all_dim": 1.0,
         "truncate": False, "rope_theta": 10000.0},
        [(0, 12), (50, 5)],
    )


@fixture("rope_yarn_attention_factor")
def rope_yarn_attention_factor() -> Fixture:
    """YaRN with an explicit attention_factor (0.8) overriding the derived one."""
    return rope_fixture(
        "rope_yarn_attention_factor", 16, 64,
        {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32,
         "attention_factor": 0.8, "rope_theta": 10000.0},
        [(0, 12), (20, 4)],
    )


@fixture("rope_llama3")
def rope_llama3() -> Fixture:
    """Llama 3.1 RoPE (factor 8, low 1, high 4, original 64): kept, smoothed and scaled bands."""
    return rope_fixture(
        "rope_llama3", 16, 256,
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 64, "rope_theta": 10000.0},
        [(0, 12), (37, 5)],
    )


@fixture("rope_longrope")
def rope_longrope() -> Fixture:
    """LongRoPE (original 16, max 64): short factors within 16 positions, long beyond."""
    short = [1.0, 1.05, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0]
    long = [1.0, 1.2, 1.8, 2.9, 4.4, 6.5, 8.8, 12.0]
    return rope_fixture(
        "rope_longrope", 16, 64,
        {"rope_type": "longrope", "short_factor": short, "long_factor": long,
         "original_max_position_embeddings": 16, "rope_theta": 10000.0},
        [(0, 12), (0, 20), (14, 4), (10, 3)],
    )


@fixture("rope_partial")
def rope_partial() -> Fixture:
    """RoPE on the first 40% of a 20-dim head (rotary dim 8), the rest passed through."""
    return rope_fixture(
        "rope_partial", 20, 64,
        {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.4},
        [(0, 12), (7, 5)],
    )


@fixture("rope_partial_yarn")
def rope_partial_yarn() -> Fixture:
    """YaRN with partial_rotary_factor 0.5 on a 32-dim head (ramp over 8 pairs)."""
    return rope_fixture(
        "rope_partial_yarn", 32, 64,
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
         "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        [(0, 12), (25, 4)],
    )


@fixture("rope_proportional")
def rope_proportional() -> Fixture:
    """Gemma-4's proportional RoPE on a 16-dim head: 3 of its 8 pairs turn
    (partial_rotary_factor 0.4), interpolated by 2 at base 100; the others pass through."""
    return rope_fixture(
        "rope_proportional", 16, 64,
        {"rope_type": "proportional", "factor": 2.0, "rope_theta": 100.0,
         "partial_rotary_factor": 0.4},
        [(0, 12), (21, 5)],
    )


# --------------------------------------------------------------------------------------
# Absolute positions
# --------------------------------------------------------------------------------------


@fixture("sinusoidal")
def sinusoidal() -> Fixture:
    """Sinusoidal positions: XLM's interleaved (paper) and Marian's concatenated layouts."""
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding
    from transformers.models.xlm.modeling_xlm import create_sinusoidal_embeddings

    tensors = {}
    for d_model in (16, 15):
        interleaved = torch.empty(40, d_model)
        create_sinusoidal_embeddings(40, d_model, interleaved)
        marian = MarianSinusoidalPositionalEmbedding(40, d_model)
        concatenated = marian.create_weight()
        # The paper's formula written out, as a check of XLM's table.
        position = torch.arange(40, dtype=torch.float64)[:, None]
        j = torch.arange(d_model, dtype=torch.float64)
        angle = position / torch.pow(10000.0, 2 * torch.div(j, 2, rounding_mode="floor") / d_model)
        paper = torch.where(j.long() % 2 == 0, torch.sin(angle), torch.cos(angle)).float()
        torch.testing.assert_close(paper, interleaved, rtol=0, atol=1e-6)
        tensors[f"d{d_model}.interleaved"] = interleaved
        tensors[f"d{d_model}.concatenated"] = concatenated
    return Fixture(tensors, notes={"positions": "0..40, computed in float64 by numpy"})


# --------------------------------------------------------------------------------------
# Normalisation
# --------------------------------------------------------------------------------------


@fixture("rms_norm")
def rms_norm() -> Fixture:
    """LlamaRMSNorm (eps 1e-6) in float32, plus a float16 input with float16 weight."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    generator = seeded("rms_norm")
    x = randn(generator, 2, 5, 32, scale=3.0)
    norm = LlamaRMSNorm(32, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(1.0 + randn(generator, 32, scale=0.2))
        y = norm(x)
    tensors = {"x": x, "weight": norm.weight, "y": y, "eps": scalar(1e-6)}
    # float16: statistics in float32, the result cast back; x and weight are exactly
    # representable in f16, y is upcast exactly.
    x16 = randn(generator, 2, 5, 32, scale=3.0).half()
    norm16 = copy.deepcopy(norm).half()
    with torch.no_grad():
        y16 = norm16(x16)
    assert y16.dtype == torch.float16
    tensors.update({"f16.x": x16.float(), "f16.weight": norm16.weight.float(), "f16.y": y16.float()})
    return Fixture(tensors)


@fixture("rms_norm_gemma")
def rms_norm_gemma() -> Fixture:
    """GemmaRMSNorm: scale by (1 + weight), computed in float32."""
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    generator = seeded("rms_norm_gemma")
    x = randn(generator, 2, 5, 32, scale=2.0)
    norm = GemmaRMSNorm(32, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(randn(generator, 32, scale=0.3))
        y = norm(x)
    return Fixture({"x": x, "weight": norm.weight, "y": y, "eps": scalar(1e-6)})


@fixture("layer_norm")
def layer_norm() -> Fixture:
    """torch.nn.LayerNorm (eps 1e-5) with and without bias."""
    generator = seeded("layer_norm")
    x = randn(generator, 2, 5, 24, scale=2.0) + 0.5
    tensors = {"x": x}
    for bias in (True, False):
        norm = torch.nn.LayerNorm(24, eps=1e-5, bias=bias)
        with torch.no_grad():
            norm.weight.copy_(1.0 + randn(generator, 24, scale=0.2))
            if bias:
                norm.bias.copy_(randn(generator, 24, scale=0.2))
            y = norm(x)
        prefix = "bias" if bias else "no_bias"
        tensors[f"{prefix}.weight"] = norm.weight
        if bias:
            tensors[f"{prefix}.bias"] = norm.bias
        tensors[f"{prefix}.y"] = y
    return Fixture(tensors)


# --------------------------------------------------------------------------------------
# Feed-forward
# --------------------------------------------------------------------------------------
#
# Weights are stored under the HF checkpoint names and layout: `<proj>.weight` is
# [out, in] (torch.nn.Linear); burn's Linear stores [in, out], so the tests transpose.


def linear_tensors(prefix: str, linear: torch.nn.Linear) -> dict[str, torch.Tensor]:
    out = {f"{prefix}.weight": linear.weight}
    if linear.bias is not None:
        out[f"{prefix}.bias"] = linear.bias
    return out


def swiglu_fixture(name: str, bias: bool, act: str) -> Fixture:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    generator = seeded(name)
    config = LlamaConfig(
        hidden_size=16, intermediate_size=40, num_attention_heads=4, num_key_value_heads=4,
        mlp_bias=bias, hidden_act=act,
    )
    mlp = LlamaMLP(config)
    with torch.no_grad():
        for linear in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            linear.weight.copy_(randn(generator, *linear.weight.shape, scale=0.3))
            if linear.bias is not None:
                linear.bias.copy_(randn(generator, *linear.bias.shape, scale=0.1))
        x = randn(generator, 2, 5, 16)
        y = mlp(x)
    tensors = {"x": x, "y": y}
    for proj in ("gate_proj", "up_proj", "down_proj"):
        tensors.update(linear_tensors(proj, getattr(mlp, proj)))
    return Fixture(tensors, {"hidden_size": 16, "intermediate_size": 40, "mlp_bias": bias,
                             "hidden_act": act})


@fixture("swiglu")
def swiglu() -> Fixture:
    """LlamaMLP: down(silu(gate(x)) * up(x)), no bias."""
    return swiglu_fixture("swiglu", bias=False, act="silu")


@fixture("swiglu_bias")
def swiglu_bias() -> Fixture:
    """LlamaMLP with mlp_bias=True."""
    return swiglu_fixture("swiglu_bias", bias=True, act="silu")


@fixture("geglu")
def geglu() -> Fixture:
    """LlamaMLP with hidden_act gelu_pytorch_tanh (Gemma's GeGLU)."""
    return swiglu_fixture("geglu", bias=False, act="gelu_pytorch_tanh")


def dense_ffn_fixture(name: str, act: str, bias: bool) -> Fixture:
    """fc1 -> ACT2FN[act] -> fc2, as in BART / Marian / OPT / Whisper layers."""
    from transformers.activations import ACT2FN

    generator = seeded(name)
    fc1 = torch.nn.Linear(16, 32, bias=bias)
    fc2 = torch.nn.Linear(32, 16, bias=bias)
    with torch.no_grad():
        for linear in (fc1, fc2):
            linear.weight.copy_(randn(generator, *linear.weight.shape, scale=0.4))
            if bias:
                linear.bias.copy_(randn(generator, *linear.bias.shape, scale=0.2))
        x = randn(generator, 2, 5, 16)
        y = fc2(ACT2FN[act](fc1(x)))
    tensors = {"x": x, "y": y, **linear_tensors("fc1", fc1), **linear_tensors("fc2", fc2)}
    return Fixture(tensors, {"d_model": 16, "ffn_dim": 32, "activation_function": act,
                             "bias": bias})


@fixture("ffn_gelu")
def ffn_gelu() -> Fixture:
    """Dense FFN with exact (erf) GELU and bias."""
    return dense_ffn_fixture("ffn_gelu", "gelu", bias=True)


@fixture("ffn_gelu_tanh")
def ffn_gelu_tanh() -> Fixture:
    """Dense FFN with tanh-approximated GELU (gelu_new / gelu_pytorch_tanh) and bias."""
    return dense_ffn_fixture("ffn_gelu_tanh", "gelu_pytorch_tanh", bias=True)


@fixture("ffn_relu")
def ffn_relu() -> Fixture:
    """Dense FFN with ReLU and no bias (T5's DenseReluDense shape)."""
    return dense_ffn_fixture("ffn_relu", "relu", bias=False)


@fixture("ffn_silu")
def ffn_silu() -> Fixture:
    """Dense FFN with SiLU and bias."""
    return dense_ffn_fixture("ffn_silu", "silu", bias=True)


# --------------------------------------------------------------------------------------
# Attention (GQA) with every mask type, and a Pre-LN decoder block
# --------------------------------------------------------------------------------------
#
# Masks come from transformers.masking_utils' mask functions (causal, sliding window,
# padding), expanded with torch.vmap-free loops; attention is PyTorch's
# scaled_dot_product_attention with enable_gqa. Projections are nn.Linear layers stored
# with HF's [out, in] weight layout.

ATTN_D_MODEL, ATTN_HEADS, ATTN_KV_HEADS, ATTN_HEAD_DIM = 24, 6, 2, 8


def hf_mask(kind: str, batch: int, seq: int, window: int | None, lengths: list[int] | None):
    """`[batch, 1, seq, seq]` boolean mask (True = may attend) from HF's mask functions."""
    from transformers import masking_utils as mu

    if kind == "causal":
        function = mu.causal_mask_function
    elif kind == "sliding_window":
        function = mu.sliding_window_causal_mask_function(window)
    elif kind == "none":
        function = mu.bidirectional_mask_function
    else:
        raise ValueError(kind)
    if lengths is not None:
        padding = torch.tensor([[j < length for j in range(seq)] for length in lengths])
        function = mu.and_masks(function, mu.padding_mask_function(padding))
    mask = torch.zeros(batch, 1, seq, seq, dtype=torch.bool)
    for b in range(batch):
        for i in range(seq):
            for j in range(seq):
                index = lambda value: torch.tensor(value)
                mask[b, 0, i, j] = bool(function(index(b), index(0), index(i), index(j)))
    return mask


def attention_fixture(name: str, kind: str, window: int | None, lengths: list[int] | None,
                      bias: bool) -> Fixture:
    generator = seeded(name)
    batch, seq = 2, 7
    q_proj = torch.nn.Linear(ATTN_D_MODEL, ATTN_HEADS * ATTN_HEAD_DIM, bias=bias)
    k_proj = torch.nn.Linear(ATTN_D_MODEL, ATTN_KV_HEADS * ATTN_HEAD_DIM, bias=bias)
    v_proj = torch.nn.Linear(ATTN_D_MODEL, ATTN_KV_HEADS * ATTN_HEAD_DIM, bias=bias)
    o_proj = torch.nn.Linear(ATTN_HEADS * ATTN_HEAD_DIM, ATTN_D_MODEL, bias=False)
    with torch.no_grad():
        for linear in (q_proj, k_proj, v_proj, o_proj):
            linear.weight.copy_(randn(generator, *linear.weight.shape, scale=0.3))
            if linear.bias is not None:
                linear.bias.copy_(randn(generator, *linear.bias.shape, scale=0.2))
        x = randn(generator, batch, seq, ATTN_D_MODEL)
        split = lambda t, heads: t.view(batch, seq, heads, ATTN_HEAD_DIM).transpose(1, 2)
        q = split(q_proj(x), ATTN_HEADS)
        k = split(k_proj(x), ATTN_KV_HEADS)
        v = split(v_proj(x), ATTN_KV_HEADS)
        mask = hf_mask(kind, batch, seq, window, lengths)
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=True
        )
        y = o_proj(out.transpose(1, 2).reshape(batch, seq, ATTN_HEADS * ATTN_HEAD_DIM))
    tensors = {
        "x": x,
        "y": y,
        **linear_tensors("q_proj", q_proj),
        **linear_tensors("k_proj", k_proj),
        **linear_tensors("v_proj", v_proj),
        **linear_tensors("o_proj", o_proj),
    }
    if lengths is not None:
        tensors["lengths"] = torch.tensor(lengths, dtype=torch.int64)
    config = {
        "hidden_size": ATTN_D_MODEL,
        "num_attention_heads": ATTN_HEADS,
        "num_key_value_heads": ATTN_KV_HEADS,
        "head_dim": ATTN_HEAD_DIM,
        "mask": kind,
        "sliding_window": window,
        "attention_bias": bias,
        "key_lengths": lengths,
    }
    return Fixture(tensors, config)


@fixture("attention_gqa_full")
def attention_gqa_full() -> Fixture:
    """GQA attention (6 query / 2 kv heads), no mask, q/k/v bias."""
    return attention_fixture("attention_gqa_full", "none", None, None, bias=True)


@fixture("attention_gqa_causal")
def attention_gqa_causal() -> Fixture:
    """GQA attention with HF's causal mask."""
    return attention_fixture("attention_gqa_causal", "causal", None, None, bias=False)


@fixture("attention_gqa_sliding_window")
def attention_gqa_sliding_window() -> Fixture:
    """GQA attention with HF's sliding-window causal mask (window 3)."""
    return attention_fixture("attention_gqa_sliding_window", "sliding_window", 3, None, bias=False)


@fixture("attention_gqa_padding")
def attention_gqa_padding() -> Fixture:
    """GQA attention, bidirectional, with a key padding mask (lengths 7 and 4)."""
    return attention_fixture("attention_gqa_padding", "none", None, [7, 4], bias=True)


@fixture("attention_gqa_causal_window_padding")
def attention_gqa_causal_window_padding() -> Fixture:
    """GQA attention combining sliding window 4 (causal) and key padding (lengths 7, 5)."""
    return attention_fixture(
        "attention_gqa_causal_window_padding", "sliding_window", 4, [7, 5], bias=False
    )


@fixture("attention_sinks")
def attention_sinks() -> Fixture:
    """Learned attention sinks (gpt-oss's eager attention): GQA 6/2, sliding window 3 with
    key padding (lengths 7, 5), a sink logit per head; the output and the gradients of
    q, k, v and the sinks for an upstream gradient `dout`."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    name = "attention_sinks"
    generator = seeded(name)
    batch, seq = 2, 7
    q = randn(generator, batch, ATTN_HEADS, seq, ATTN_HEAD_DIM).requires_grad_()
    k = randn(generator, batch, ATTN_KV_HEADS, seq, ATTN_HEAD_DIM).requires_grad_()
    v = randn(generator, batch, ATTN_KV_HEADS, seq, ATTN_HEAD_DIM).requires_grad_()
    # Sinks from well below to well above the scores, so that some rows give the sink
    # most of their weight.
    sinks = (randn(generator, ATTN_HEADS, scale=2.0) + 0.5).requires_grad_()
    allowed = hf_mask("sliding_window", batch, seq, 3, [7, 5])
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)

    class Module:
        num_key_value_groups = ATTN_HEADS // ATTN_KV_HEADS
        training = False

    module = Module()
    module.sinks = sinks
    out, _ = eager_attention_forward(
        module, q, k, v, additive, scaling=ATTN_HEAD_DIM**-0.5, dropout=0.0
    )
    out = out.transpose(1, 2)  # [batch, heads, seq, head_dim]
    dout = randn(generator, *out.shape)
    (out * dout).sum().backward()
    tensors = {
        "q": q.detach(),
        "k": k.detach(),
        "v": v.detach(),
        "sinks": sinks.detach(),
        "dout": dout,
        "out": out.detach(),
        "dq": q.grad,
        "dk": k.grad,
        "dv": v.grad,
        "dsinks": sinks.grad,
        "lengths": torch.tensor([7, 5], dtype=torch.int64),
    }
    return Fixture(tensors, notes={"mask": "sliding window 3, causal, key padding lengths 7 and 5"})


@fixture("moe_gpt_oss")
def moe_gpt_oss() -> Fixture:
    """gpt-oss's MoE (transformers' GptOssMLP): router with bias, softmax over the top-2
    logits, experts with biases and the clamped SwiGLU (alpha 1.702, limit 7), in
    transformers' layout (`gate_up_proj` [E, hidden, 2·I] with gate and up interleaved)."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    name = "moe_gpt_oss"
    generator = seeded(name)
    config = GptOssConfig(
        hidden_size=16, intermediate_size=8, num_local_experts=4, num_experts_per_tok=2
    )
    mlp = GptOssMLP(config).eval()
    with torch.no_grad():
        mlp.router.weight.copy_(randn(generator, 4, 16, scale=0.5))
        mlp.router.bias.copy_(randn(generator, 4, scale=0.5))
        # Large enough that some gates pass the limit of 7 and some ups its bounds.
        mlp.experts.gate_up_proj.copy_(randn(generator, 4, 16, 16, scale=2.0))
        mlp.experts.gate_up_proj_bias.copy_(randn(generator, 4, 16, scale=0.5))
        mlp.experts.down_proj.copy_(randn(generator, 4, 8, 16, scale=0.3))
        mlp.experts.down_proj_bias.copy_(randn(generator, 4, 16, scale=0.2))
        x = randn(generator, 2, 5, 16)
        y, _ = mlp(x)
        gate_up = x.reshape(-1, 16) @ mlp.experts.gate_up_proj[0]
    clamped = float((gate_up[..., ::2] > 7).float().mean())
    return Fixture(
        {
            "x": x,
            "y": y,
            "router.weight": mlp.router.weight.detach(),
            "router.bias": mlp.router.bias.detach(),
            "experts.gate_up_proj": mlp.experts.gate_up_proj.detach(),
            "experts.gate_up_proj_bias": mlp.experts.gate_up_proj_bias.detach(),
            "experts.down_proj": mlp.experts.down_proj.detach(),
            "experts.down_proj_bias": mlp.experts.down_proj_bias.detach(),
        },
        notes={"clamped_gates_expert0": repr(clamped)},
    )


# --------------------------------------------------------------------------------------
# The encoder-decoder Transformer
# --------------------------------------------------------------------------------------
#
# PyTorch's own nn.TransformerEncoderLayer / nn.TransformerDecoderLayer (ReLU, no
# dropout, batch first), stacked as "Attention Is All You Need" does: embeddings scaled
# by sqrt(d_model) plus the interleaved sinusoid, Post-LN without a final norm (or
# Pre-LN with one per stack), the output head tied to the target embedding. Padding on
# both sides (source padding hides keys from the encoder and from cross-attention),
# a causal decoder. The weights are stored under our parameter paths with a `w.`
# prefix, linear weights as PyTorch stores them `[out, in]`; q, k and v are the thirds
# of PyTorch's `in_proj`.

ED_D_MODEL, ED_HEADS, ED_D_FF, ED_LAYERS, ED_SRC_VOCAB, ED_TGT_VOCAB = 16, 2, 32, 2, 20, 24


def transformer_fixture(name: str, norm_first: bool) -> Fixture:
    import math

    generator = seeded(name)
    d = ED_D_MODEL
    layer = dict(dim_feedforward=ED_D_FF, dropout=0.0, activation="relu", batch_first=True)
    encoder = [
        torch.nn.TransformerEncoderLayer(d, ED_HEADS, norm_first=norm_first, **layer)
        for _ in range(ED_LAYERS)
    ]
    decoder = [
        torch.nn.TransformerDecoderLayer(d, ED_HEADS, norm_first=norm_first, **layer)
        for _ in range(ED_LAYERS)
    ]
    final_norms = [torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)]
    with torch.no_grad():
        for module in [*encoder, *decoder, *final_norms]:
            module.eval()
            for key, parameter in module.named_parameters():
                if "norm" in key and key.endswith("weight"):
                    parameter.copy_(1.0 + randn(generator, *parameter.shape, scale=0.2))
                else:
                    parameter.copy_(randn(generator, *parameter.shape, scale=0.3))
    src_embed = randn(generator, ED_SRC_VOCAB, d)
    tgt_embed = randn(generator, ED_TGT_VOCAB, d)

    def sinusoid(length: int) -> torch.Tensor:
        angle = torch.arange(length).float()[:, None] / 10000 ** (
            torch.arange(0, d, 2).float() / d
        )
        out = torch.zeros(length, d)
        out[:, 0::2], out[:, 1::2] = torch.sin(angle), torch.cos(angle)
        return out

    batch, src_len, tgt_len = 2, 7, 6
    src = torch.randint(0, ED_SRC_VOCAB, (batch, src_len), generator=generator)
    tgt = torch.randint(0, ED_TGT_VOCAB, (batch, tgt_len), generator=generator)
    # Right padding, so that every query sees a key (PyTorch gives NaN rows otherwise).
    src_padding = torch.zeros(batch, src_len, dtype=torch.bool)
    src_padding[1, 5:] = True
    tgt_padding = torch.zeros(batch, tgt_len, dtype=torch.bool)
    tgt_padding[0, 4:] = True
    causal = torch.nn.Transformer.generate_square_subsequent_mask(tgt_len) < 0
    with torch.no_grad():
        x = src_embed[src] * math.sqrt(d) + sinusoid(src_len)
        for block in encoder:
            x = block(x, src_key_padding_mask=src_padding)
        memory = final_norms[0](x) if norm_first else x
        y = tgt_embed[tgt] * math.sqrt(d) + sinusoid(tgt_len)
        for block in decoder:
            y = block(
                y,
                memory,
                tgt_mask=causal,
                tgt_key_padding_mask=tgt_padding,
                memory_key_padding_mask=src_padding,
            )
        y = final_norms[1](y) if norm_first else y
        logits = y @ tgt_embed.T

    weights = {"embed_tokens.weight": src_embed, "decoder_embed_tokens.weight": tgt_embed}

    def attention(prefix: str, mha: torch.nn.MultiheadAttention) -> None:
        for part, w, b in zip(
            ("q", "k", "v"), mha.in_proj_weight.chunk(3), mha.in_proj_bias.chunk(3)
        ):
            weights[f"{prefix}.{part}_proj.weight"], weights[f"{prefix}.{part}_proj.bias"] = w, b
        weights[f"{prefix}.o_proj.weight"] = mha.out_proj.weight
        weights[f"{prefix}.o_proj.bias"] = mha.out_proj.bias

    def norm(prefix: str, module: torch.nn.LayerNorm) -> None:
        weights[f"{prefix}.weight"], weights[f"{prefix}.bias"] = module.weight, module.bias

    def feed_forward(prefix: str, block) -> None:
        weights[f"{prefix}.mlp.fc1.weight"] = block.linear1.weight
        weights[f"{prefix}.mlp.fc1.bias"] = block.linear1.bias
        weights[f"{prefix}.mlp.fc2.weight"] = block.linear2.weight
        weights[f"{prefix}.mlp.fc2.bias"] = block.linear2.bias

    for index, block in enumerate(encoder):
        prefix = f"encoder.layers.{index}"
        attention(f"{prefix}.self_attn", block.self_attn)
        norm(f"{prefix}.input_layernorm", block.norm1)
        norm(f"{prefix}.post_attention_layernorm", block.norm2)
        feed_forward(prefix, block)
    for index, block in enumerate(decoder):
        prefix = f"decoder.layers.{index}"
        attention(f"{prefix}.self_attn", block.self_attn)
        attention(f"{prefix}.cross_attn", block.multihead_attn)
        norm(f"{prefix}.input_layernorm", block.norm1)
        norm(f"{prefix}.cross_attn_layernorm", block.norm2)
        norm(f"{prefix}.post_attention_layernorm", block.norm3)
        feed_forward(prefix, block)
    if norm_first:
        norm("encoder.norm", final_norms[0])
        norm("decoder.norm", final_norms[1])
    tensors = {f"w.{key}": value for key, value in weights.items()}
    tensors.update(
        src=src,
        tgt=tgt,
        src_padding=src_padding.long(),
        tgt_padding=tgt_padding.long(),
        logits=logits,
    )
    return Fixture(tensors, notes={"torch": torch.__version__})


@fixture("transformer_post_ln")
def transformer_post_ln() -> Fixture:
    """The paper's Post-LN encoder-decoder from PyTorch's nn.Transformer*Layer modules."""
    return transformer_fixture("transformer_post_ln", norm_first=False)


@fixture("transformer_pre_ln")
def transformer_pre_ln() -> Fixture:
    """A Pre-LN encoder-decoder (a final norm per stack) from PyTorch's layers."""
    return transformer_fixture("transformer_pre_ln", norm_first=True)


@fixture("block_pre_ln")
def block_pre_ln() -> Fixture:
    """A Pre-LN decoder block: HF LlamaDecoderLayer (RMSNorm, GQA + RoPE, SwiGLU), causal."""
    from transformers import LlamaConfig
    from transformers.masking_utils import causal_mask_function
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    name = "block_pre_ln"
    generator = seeded(name)
    config = LlamaConfig(
        hidden_size=ATTN_D_MODEL,
        intermediate_size=40,
        num_attention_heads=ATTN_HEADS,
        num_key_value_heads=ATTN_KV_HEADS,
        head_dim=ATTN_HEAD_DIM,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attention_bias=False,
        mlp_bias=False,
    )
    config._attn_implementation = "eager"
    layer = LlamaDecoderLayer(config, layer_idx=0).eval()
    tensors: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for key, parameter in layer.named_parameters():
            # Perturb every weight, norms included, so nothing is trivially 1 or 0.
            if key.endswith("layernorm.weight"):
                parameter.copy_(1.0 + randn(generator, *parameter.shape, scale=0.2))
            else:
                parameter.copy_(randn(generator, *parameter.shape, scale=0.2))
            tensors[key] = parameter.clone()
        batch, seq = 2, 6
        x = randn(generator, batch, seq, ATTN_D_MODEL)
        position_ids = torch.arange(seq)[None].expand(batch, seq)
        cos, sin = LlamaRotaryEmbedding(config)(x, position_ids)
        index = lambda value: torch.tensor(value)
        allowed = torch.tensor(
            [
                [bool(causal_mask_function(index(0), index(0), index(i), index(j))) for j in range(seq)]
                for i in range(seq)
            ]
        )
        additive = torch.zeros(seq, seq).masked_fill(~allowed, torch.finfo(torch.float32).min)
        y = layer(
            x,
            attention_mask=additive[None, None].expand(batch, 1, seq, seq),
            position_ids=position_ids,
            position_embeddings=(cos, sin),
        )
        y = y[0] if isinstance(y, tuple) else y
    tensors["x"] = x
    tensors["y"] = y
    return Fixture(tensors, config.to_dict())


@fixture("gated_delta_net")
def gated_delta_net() -> Fixture:
    """Qwen3.5's Gated DeltaNet (2 key heads serving 4 value heads, conv kernel 3), 70 positions."""
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    name = "gated_delta_net"
    generator = seeded(name)
    config = Qwen3_5TextConfig(
        hidden_size=24,
        num_hidden_layers=1,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=6,
        linear_conv_kernel_dim=3,
        rms_norm_eps=1e-6,
        hidden_act="silu",
    )
    layer = Qwen3_5GatedDeltaNet(config, layer_idx=0).eval()
    tensors: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for key, parameter in layer.named_parameters():
            if key == "norm.weight":
                parameter.copy_(1.0 + randn(generator, *parameter.shape, scale=0.2))
            elif key in ("dt_bias", "A_log"):
                parameter.copy_(randn(generator, *parameter.shape, scale=0.5))
            else:
                fan_in = parameter.shape[-1]
                parameter.copy_(randn(generator, *parameter.shape, scale=fan_in**-0.5))
            tensors[key] = parameter.clone()
        # Two chunks of transformers' 64 positions: the state crosses a boundary.
        x = randn(generator, 2, 70, 24)
        tensors["x"] = x
        tensors["y"] = layer(x)
    return Fixture(tensors, config.to_dict())


# --------------------------------------------------------------------------------------
# Multi-head latent attention (DeepSeek-V3) and mixture-of-experts (DeepSeek-V3, Mixtral)
# --------------------------------------------------------------------------------------
#
# Weights are stored under the keys of the transformers module's state_dict (the HF
# checkpoint names relative to the module: `q_a_proj.weight`, `gate.weight`,
# `gate.e_score_correction_bias`, ...). transformers 5 stores routed experts fused:
# `experts.gate_up_proj` [n_experts, 2 * d_ff, d_model] (gate rows first, then up) and
# `experts.down_proj` [n_experts, d_model, d_ff]; the Rust tests load them through the
# fused-expert loader. Every weight is perturbed, norm weights around 1 and the
# correction bias away from 0, so no term is trivially 1 or 0.


def perturb_module(module: torch.nn.Module, generator: torch.Generator, scale: float = 0.3):
    """Overwrites every parameter and buffer that is a weight: norms ~1 + noise, the rest noise."""
    with torch.no_grad():
        for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
            if "inv_freq" in name:
                continue
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                tensor.copy_(1.0 + randn(generator, *tensor.shape, scale=0.2))
            elif name.endswith("e_score_correction_bias"):
                tensor.copy_(randn(generator, *tensor.shape, scale=0.3))
            elif name.endswith("bias"):
                tensor.copy_(randn(generator, *tensor.shape, scale=0.1))
            else:
                tensor.copy_(randn(generator, *tensor.shape, scale=scale))


def module_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's weights under their state_dict keys (inv_freq buffers left out)."""
    return {k: v for k, v in module.state_dict().items() if "inv_freq" not in k}


def causal_additive_mask(batch: int, seq: int) -> torch.Tensor:
    """[batch, 1, seq, seq]: 0 where visible, float32 min where hidden (as transformers' eager)."""
    hidden = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
    mask = torch.zeros(seq, seq).masked_fill(hidden, torch.finfo(torch.float32).min)
    return mask[None, None].expand(batch, 1, seq, seq).contiguous()


def mla_fixture(name: str, hf: dict) -> Fixture:
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek

    generator = seeded(name)
    config = DeepseekV3Config(**hf)
    config._attn_implementation = "eager"
    attention = deepseek.DeepseekV3Attention(config, layer_idx=0).eval()
    perturb_module(attention, generator)
    rotary = deepseek.DeepseekV3RotaryEmbedding(config)
    batch, seq = 2, 7
    x = randn(generator, batch, seq, config.hidden_size)
    position_ids = torch.arange(seq)[None].expand(batch, seq)
    with torch.no_grad():
        position_embeddings = rotary(x, position_ids)
        y, _ = attention(x, position_embeddings, causal_additive_mask(batch, seq))
    tensors = {"x": x, "y": y, **module_tensors(attention)}
    tensors["scaling"] = scalar(attention.scaling)
    tensors["attention_scaling"] = scalar(float(rotary.attention_scaling))
    return Fixture(tensors, hf, {"scaling": repr(attention.scaling)})


MLA_BASE = {
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 8,
    "v_head_dim": 6,
    "max_position_embeddings": 64,
    "rope_interleave": True,
    "rms_norm_eps": 1e-6,
}


@fixture("mla_yarn")
def mla_yarn() -> Fixture:
    """DeepseekV3Attention: low-rank q (q_lora_rank 24), biases, YaRN with DeepSeek mscale."""
    return mla_fixture("mla_yarn", {
        **MLA_BASE,
        "q_lora_rank": 24,
        "attention_bias": True,
        "rope_parameters": {
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
            "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 1.0,
            "rope_theta": 10000.0,
        },
    })


@fixture("mla_q_proj")
def mla_q_proj() -> Fixture:
    """DeepseekV3Attention: direct q_proj (q_lora_rank None), no bias, default RoPE."""
    return mla_fixture("mla_q_proj", {
        **MLA_BASE,
        "q_lora_rank": None,
        "attention_bias": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    })


def moe_deepseek_fixture(name: str, norm_topk_prob: bool) -> Fixture:
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek

    generator = seeded(name)
    hf = {
        "hidden_size": 16, "intermediate_size": 40, "moe_intermediate_size": 12,
        "n_routed_experts": 8, "num_experts_per_tok": 3, "n_group": 4, "topk_group": 2,
        "n_shared_experts": 2, "routed_scaling_factor": 2.5, "norm_topk_prob": norm_topk_prob,
        "hidden_act": "silu", "num_attention_heads": 4,
    }
    config = DeepseekV3Config(**hf)
    config._experts_implementation = "eager"
    moe = deepseek.DeepseekV3MoE(config).eval()
    perturb_module(moe, generator)
    x = randn(generator, 2, 9, 16)
    with torch.no_grad():
        logits, weights, indices = moe.gate(x)
        y = moe(x)
    tensors = {"x": x, "y": y, "router_logits": logits, "topk_weights": weights,
               "topk_indices": indices, **module_tensors(moe)}
    return Fixture(tensors, hf)


@fixture("moe_deepseek_v3")
def moe_deepseek_v3() -> Fixture:
    """DeepseekV3MoE: sigmoid router, 4 groups (top 2), correction bias, shared experts."""
    return moe_deepseek_fixture("moe_deepseek_v3", norm_topk_prob=True)


@fixture("moe_deepseek_v3_unnormalized")
def moe_deepseek_v3_unnormalized() -> Fixture:
    """DeepseekV3MoE with norm_topk_prob=False (raw sigmoid weights times the scaling factor)."""
    return moe_deepseek_fixture("moe_deepseek_v3_unnormalized", norm_topk_prob=False)


@fixture("moe_mixtral")
def moe_mixtral() -> Fixture:
    """MixtralSparseMoeBlock (6 experts, top-2) and its load-balancing loss; ST-MoE z-loss."""
    from transformers import MixtralConfig
    from transformers.models.mixtral import modeling_mixtral as mixtral

    generator = seeded("moe_mixtral")
    hf = {"hidden_size": 16, "intermediate_size": 20, "num_local_experts": 6,
          "num_experts_per_tok": 2, "router_jitter_noise": 0.0, "hidden_act": "silu",
          "num_attention_heads": 4}
    config = MixtralConfig(**hf)
    config._experts_implementation = "eager"
    block = mixtral.MixtralSparseMoeBlock(config).eval()
    perturb_module(block, generator)
    x = randn(generator, 2, 9, 16)
    with torch.no_grad():
        logits, weights, indices = block.gate(x)
        y = block(x)
        aux = mixtral.load_balancing_loss_func((logits,), 6, 2)
        # ST-MoE (Zoph et al. 2022), eq. 5: mean over tokens of logsumexp(logits)^2.
        z = torch.logsumexp(logits.float(), dim=-1).square().mean()
    tensors = {"x": x, "y": y, "router_logits": logits, "topk_weights": weights,
               "topk_indices": indices, "aux_loss": aux.reshape(1), "z_loss": z.reshape(1),
               **module_tensors(block)}
    return Fixture(tensors, hf)


# --------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="fixtures to write (default: all)")
    parser.add_argument("--list", action="store_true", help="list the fixtures and exit")
    args = parser.parse_args(argv)
    if args.list:
        width = max(map(len, REGISTRY))
        for name, (_, description) in sorted(REGISTRY.items()):
            print(f"{name:<{width}}  {description}")
        return 0
    unknown = [name for name in args.names if name not in REGISTRY]
    if unknown:
        parser.error(f"unknown fixture(s): {', '.join(unknown)} (see --list)")
    torch.set_default_dtype(torch.float32)
    torch.use_deterministic_algorithms(True)
    for name in args.names or sorted(REGISTRY):
        function, _ = REGISTRY[name]
        path = write(name, function())
        print(f"{path.relative_to(ROOT)}  {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
