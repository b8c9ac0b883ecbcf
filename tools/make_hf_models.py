#!/usr/bin/env python3
"""Write tiny random Hugging Face models of every family burn-transformer loads, with
their reference logits and greedy continuations, for the model and `hf-logits` tests.

Each model lands in burn-transformer/tests/fixtures/hf/<name>/ as transformers saves it
(`config.json`, `model.safetensors` or shards with `model.safetensors.index.json`),
plus:
- `input.json`: `{"tokens": [[...], ...], "max_new_tokens": n}` (the `hf-logits` input);
- `reference.safetensors`: `tokens` i64 [batch, seq], `logits` f32 [batch, seq, vocab]
  (one full forward pass) and `greedy` i64 [batch, n] (argmax decoding through
  transformers' KV cache, no stop token).

Every weight, norm weight, bias and MoE routing bias is drawn at random (no 1s and 0s
left from initialization), with scales that keep activations O(1). Seeds are fixed per
model. A model is rejected and redrawn with the next seed when a greedy step's top-2
logits or a router's top-k scores are nearly tied, so that float32 rounding in another
implementation cannot flip a token or an expert choice.

`deepseek_v3_mtp` is `deepseek_v3`'s config with the checkpoint also holding DeepSeek-V3's
multi-token-prediction (MTP) layer at `model.layers.{num_hidden_layers}.*` (transformers
ignores those keys), saved in shards that each stay under 200 KiB; `glm4_moe_mtp` is
`glm4_moe`'s with GLM-4.5's MTP layer, stored the same way. Their references add
`mtp_hidden` f32 [batch, seq - 1, hidden] and `mtp_logits` f32 [batch, seq - 1, vocab]
(see `mtp_forward`).

`llama_lora` and `deepseek_v3_lora` are PEFT LoRA adapters over the saved `llama` and
`deepseek_v3` fixtures (built after them; needs `peft`), as `PeftModel.save_pretrained`
writes them (`adapter_config.json` with `base_model_name_or_path` "../<base>",
`adapter_model.safetensors` in float32) with A ~ N(0, 1/in) and B ~ N(0, std) drawn from
seeded generators (PEFT starts B at 0), plus the base's `input.json` and a
`reference.safetensors` with `tokens`, `logits` (adapter on), `merged_logits` (after
`merge_and_unload`), `base_logits` (adapter disabled) and `greedy` (adapter on). The script
checks merged against unmerged logits, reloads the folder with PEFT, and applies the file's
adapter to the base by hand (`apply_adapter_by_hand`, which spells out the layout).

`gradients` writes `gradients.json` (built after the models): for each model, the
next-token cross-entropy of its reference tokens and the norm of every parameter's
gradient (see `build_gradients`).

`processors` writes `processors.json`: logits before and after transformers' logit
processors for settings a `generation_config.json` may hold (see `build_processors`).
`generation_files` writes `tokenizer/generation.json`: transformers' `generate` on the
`tokenizer` model with `generation_config.json` files (see `build_generation_files`).

`longrope_crossing` writes `phi3/crossing.json`: greedy and beam search on `phi3` across
LongRoPE's original context (see `build_longrope_crossing`).

`llama_beams` writes `llama/beams.json` (built after `llama`): transformers' best beam
search hypothesis (new tokens and score) for each prompt of `llama/input.json` and each
setting of BEAM_SETTINGS (beams, length penalty, repetition penalty, stop token).

The `tokenizer` fixture is a small byte-level BPE `tokenizer.json` trained with the
`tokenizers` library, with the ids it gives for a few texts (`cases.json`) and a tiny
llama over its vocabulary (for the `generate` program).

Usage:
    /work/venv/bin/python tools/make_hf_models.py            # everything
    /work/venv/bin/python tools/make_hf_models.py llama mixtral   # just these
    /work/venv/bin/python tools/make_hf_models.py llama_lora deepseek_v3_lora
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
import zlib
from pathlib import Path

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers.masking_utils import create_causal_mask
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3DecoderLayer,
    DeepseekV3RMSNorm,
)
from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeDecoderLayer, Glm4MoeRMSNorm

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "burn-transformer" / "tests" / "fixtures" / "hf"

BATCH, SEQ, NEW_TOKENS = 2, 9, 6
# Smallest accepted gap between the best and second-best greedy logit, and between
# the last chosen and first rejected router score.
MIN_LOGIT_GAP = 2e-3
MIN_ROUTER_GAP = 2e-3

# Shared by every family: 2 layers, width 32, 4 query heads, tiny vocabulary.
COMMON = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


# COMMON's special tokens, and its sizes under GPT-2's names (GPT-2, GPT-J).
TOKENS = {k: COMMON[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
# COMMON without the RMSNorm epsilon, for classes that do not take it.
COMMON_NO_RMS = {k: v for k, v in COMMON.items() if k != "rms_norm_eps"}
GPT2_SIZES = dict(
    vocab_size=COMMON["vocab_size"],
    n_embd=COMMON["hidden_size"],
    n_layer=COMMON["num_hidden_layers"],
    n_head=COMMON["num_attention_heads"],
    n_positions=COMMON["max_position_embeddings"],
    **TOKENS,
)
# COMMON's sizes under the names most families share, without `intermediate_size`
# (OPT and Falcon name it otherwise).
SIZES = {
    k: COMMON[k]
    for k in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "max_position_embeddings",
    )
}


def llama():
    return transformers.LlamaConfig(
        **COMMON,
        num_key_value_heads=2,
        rope_parameters=dict(
            rope_type="llama3",
            rope_theta=10000.0,
            factor=4.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=16,
        ),
        tie_word_embeddings=False,
    )


def llama_sharded():
    # Biases everywhere, YaRN, tied embeddings; saved in several shards.
    return transformers.LlamaConfig(
        **COMMON,
        num_key_value_heads=1,
        attention_bias=True,
        mlp_bias=True,
        rope_parameters=dict(
            rope_type="yarn",
            rope_theta=10000.0,
            factor=2.0,
            original_max_position_embeddings=32,
        ),
        tie_word_embeddings=True,
    )


def mistral():
    return transformers.MistralConfig(
        **COMMON, num_key_value_heads=2, sliding_window=4, tie_word_embeddings=False
    )


def qwen2():
    # q/k/v biases, tied embeddings, a sliding window on the second layer only.
    return transformers.Qwen2Config(
        **COMMON,
        num_key_value_heads=2,
        use_sliding_window=True,
        sliding_window=3,
        max_window_layers=1,
        tie_word_embeddings=True,
    )


def qwen2_bf16():
    return transformers.Qwen2Config(**COMMON, num_key_value_heads=4, tie_word_embeddings=False)


def qwen3():
    # QK-norm per head, a head width other than hidden / heads, a sliding window
    # shorter than the prompt on the second layer only, untied embeddings.
    return transformers.Qwen3Config(
        **COMMON,
        num_key_value_heads=2,
        head_dim=12,
        use_sliding_window=True,
        sliding_window=3,
        max_window_layers=1,
        tie_word_embeddings=False,
    )


def qwen3_mqa():
    # One key/value head, attention biases, tied embeddings, no window.
    return transformers.Qwen3Config(
        **COMMON,
        num_key_value_heads=1,
        head_dim=8,
        attention_bias=True,
        tie_word_embeddings=True,
    )


def olmo():
    # The first OLMo: LLaMA with LayerNorms without parameters, q, k and v clamped to
    # clip_qkv (small enough to bite), attention biases, GQA.
    return transformers.OlmoConfig(
        **{k: v for k, v in COMMON.items() if k != "rms_norm_eps"},
        num_key_value_heads=2,
        attention_bias=True,
        clip_qkv=0.6,
    )


def olmo2():
    # Norms on the sublayers' outputs, QK-norm across heads, GQA, untied embeddings.
    return transformers.Olmo2Config(**COMMON, num_key_value_heads=2, tie_word_embeddings=False)


def olmo2_mqa():
    # One key/value head, attention biases, tied embeddings.
    return transformers.Olmo2Config(
        **COMMON, num_key_value_heads=1, attention_bias=True, tie_word_embeddings=True
    )


def olmo3():
    # OLMo-2's layout over four layers, of which transformers' default makes the first
    # three slide (a window shorter than the prompt) and the last full; YaRN on the
    # full layer only (its attention factor scales the rotation), at the class's base.
    return transformers.Olmo3Config(
        **{**COMMON, "num_hidden_layers": 4},
        num_key_value_heads=2,
        sliding_window=4,
        rope_parameters={
            "full_attention": {
                "rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0,
                "original_max_position_embeddings": 16,
            },
            "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0},
        },
    )


def smollm3():
    # LLaMA's layers over four, two of them without RoPE; with use_sliding_window the
    # class makes those two slide (a window shorter than the prompt); tied embeddings.
    return transformers.SmolLM3Config(
        **{**COMMON, "num_hidden_layers": 4},
        num_key_value_heads=2,
        no_rope_layers=[1, 0, 1, 0],
        use_sliding_window=True,
        sliding_window=4,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )


def phi3():
    # Fused q/k/v and gate/up projections, GQA, a rotary embedding over half of each
    # head with LongRoPE (the prompt is longer than its original context, so the long
    # factors apply), a window on every layer shorter than the prompt.
    return transformers.Phi3Config(
        **COMMON,
        num_key_value_heads=2,
        original_max_position_embeddings=8,
        partial_rotary_factor=0.5,
        sliding_window=5,
        rope_parameters={
            "rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [1.0, 1.3], "long_factor": [2.0, 3.5],
        },
    )


def glm4():
    # Norms before and after both sublayers, q/k/v biases (none on o_proj), a fused
    # gate/up projection, the rotary embedding interleaved over half of each head, GQA.
    return transformers.Glm4Config(**COMMON, num_key_value_heads=2, head_dim=8)


def seed_oss():
    # Biases on q, k and v but not on the output projection (separate switches), GQA.
    return transformers.SeedOssConfig(
        **COMMON, num_key_value_heads=2, head_dim=8, attention_bias=True, attention_out_bias=False
    )


def ernie4_5():
    # Biases on every projection, the rotary embedding on neighbouring pairs, tied
    # embeddings (the class's default).
    return transformers.Ernie4_5Config(**COMMON, num_key_value_heads=2, head_dim=8, use_bias=True)


def exaone4():
    # OLMo-2's output norms, QK-norm per head; over four layers the class's pattern 4
    # makes three slide (a window shorter than the prompt) and the last full, which
    # goes without RoPE.
    return transformers.Exaone4Config(
        **{**COMMON, "num_hidden_layers": 4},
        num_key_value_heads=2,
        sliding_window=4,
        sliding_window_pattern=4,
    )


def cohere():
    # Attention and feed-forward in parallel after one LayerNorm without a shift, the
    # rotary embedding on neighbouring pairs, logits scaled, tied embeddings, GQA.
    return transformers.CohereConfig(**COMMON, num_key_value_heads=2, logit_scale=0.5)


def cohere_qk_norm():
    # Command R+'s QK-norm (`use_qk_norm`): a LayerNorm without a shift over each
    # head, with weights of its own per head (`q_norm.weight` [heads, head_dim]).
    return transformers.CohereConfig(
        **COMMON, num_key_value_heads=2, logit_scale=0.5, use_qk_norm=True
    )


def cohere2():
    # Cohere's layers over four: three slide (a window shorter than the prompt) and
    # rotate, the fourth attends to everything without RoPE.
    return transformers.Cohere2Config(
        **{**COMMON, "num_hidden_layers": 4},
        num_key_value_heads=2,
        head_dim=8,
        sliding_window=4,
        logit_scale=0.25,
    )


def granite():
    # LLaMA's layers with Granite's multipliers on the embeddings, the attention scores
    # and the sublayers' outputs, and logits divided by logits_scaling; attention biases.
    return transformers.GraniteConfig(
        **COMMON,
        num_key_value_heads=2,
        attention_bias=True,
        embedding_multiplier=3.0,
        attention_multiplier=0.15,
        residual_multiplier=0.4,
        logits_scaling=2.0,
    )


def ministral3():
    # Mistral's layers with YaRN and the queries scaled by position past an original
    # context of 4 (llama_4_scaling_beta), so that the prompt's last five positions
    # take factors 1 + 0.5 ln 2 and 1 + 0.5 ln 3.
    return transformers.Ministral3Config(
        **COMMON,
        num_key_value_heads=2,
        head_dim=8,
        rope_parameters={
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 16.0,
            "original_max_position_embeddings": 4, "beta_fast": 32.0, "beta_slow": 1.0,
            "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.5,
        },
    )


def hyperclovax():
    # Granite's four multipliers (the logits multiplied, not divided) with a norm after
    # each sublayer's output (use_post_norm, the class's default); attention biases.
    return transformers.HyperCLOVAXConfig(
        **COMMON,
        num_key_value_heads=2,
        attention_bias=True,
        embedding_multiplier=3.0,
        attention_multiplier=0.2,
        residual_multiplier=0.5,
        logits_scaling=0.25,
    )


def granite_swa():
    # Granite's multipliers with attention sinks, a window (4) on all layers but the
    # first of four (the class's default) and a RoPE base per layer, the second layer
    # without RoPE (base 0).
    return transformers.GraniteSWAConfig(
        **{**COMMON, "num_hidden_layers": 4},
        num_key_value_heads=2,
        head_dim=8,
        sliding_window=4,
        layer_rope_theta=[10000.0, 0, 500000.0, 10000.0],
        embedding_multiplier=2.0,
        attention_multiplier=0.3,
        residual_multiplier=0.6,
        logits_scaling=2.0,
    )


def arcee():
    # LLaMA with an ungated feed-forward of squared ReLU (up_proj, down_proj), YaRN,
    # feed-forward biases.
    return transformers.ArceeConfig(
        **COMMON,
        num_key_value_heads=2,
        mlp_bias=True,
        rope_parameters=dict(
            rope_type="yarn",
            rope_theta=10000.0,
            factor=4.0,
            original_max_position_embeddings=16,
        ),
        tie_word_embeddings=False,
    )


def apertus():
    # Apertus' layout: LLaMA with QK-norm per head, an ungated xIELU feed-forward
    # (`up_proj`, `down_proj`; the activation's learned `act_fn.alpha_p`, `alpha_n`
    # and fixed `beta`, `eps` in the checkpoint), its norms named `attention_layernorm`
    # and `feedforward_layernorm`, the class's LLaMA-3 rotary scaling at base 1.2e7, GQA.
    return transformers.ApertusConfig(**COMMON, num_key_value_heads=2)


def nanochat():
    # nanochat's layout: norms without parameters (one more on the embeddings), QK-norm
    # (also without parameters) after a rotary embedding that turns the other way, an
    # ungated squared-ReLU feed-forward (`fc1`, `fc2`), logits soft-capped at 15 (the
    # class's default), GQA.
    return transformers.NanoChatConfig(**COMMON, num_key_value_heads=2)


def helium():
    # LLaMA with the rotary embedding on neighbouring pairs, biases on q, k, v (none on
    # the output projection) and on the feed-forward.
    return transformers.HeliumConfig(
        **COMMON,
        num_key_value_heads=2,
        head_dim=8,
        attention_bias=True,
        mlp_bias=True,
    )


def starcoder2():
    # LayerNorms with a shift, biases on every projection, an ungated GELU-tanh
    # feed-forward (c_fc, c_proj), a window of 4 on every layer, tied embeddings.
    return transformers.Starcoder2Config(
        **{k: v for k, v in COMMON.items() if k != "rms_norm_eps"},
        norm_epsilon=1e-5,
        num_key_value_heads=2,
        sliding_window=4,
    )


def ministral():
    # Mistral's layers, the window (4) on the layers `layer_types` names only. (Its
    # class leaves head_dim unset, which its attention cannot take: files set it.)
    return transformers.MinistralConfig(
        **COMMON,
        num_key_value_heads=2,
        head_dim=8,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
    )


def hunyuan_v1_dense():
    # LLaMA with QK-norm per head after RoPE, attention biases, and RoPE's base stretched
    # by a fixed NTK alpha (a "dynamic" embedding with `alpha`, as its files say).
    return transformers.HunYuanDenseV1Config(
        **COMMON,
        num_key_value_heads=2,
        head_dim=8,
        attention_bias=True,
        rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=1.0, alpha=50.0),
    )


def hunyuan_v1_moe():
    # Hunyuan's attention (QK-norm after RoPE, NTK-alpha RoPE); 4 experts, top-2 (given
    # per layer, as its files do), renormalized, beside a shared expert.
    common = {k: v for k, v in COMMON.items() if k != "intermediate_size"}
    return transformers.HunYuanMoEV1Config(
        **common,
        intermediate_size=16,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=4,
        moe_topk=[2, 2],
        rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=1.0, alpha=50.0),
        tie_word_embeddings=False,
    )


def gemma():
    # LLaMA's blocks with Gemma's RMSNorm (1 + w), GeGLU (tanh), embeddings scaled by
    # sqrt(hidden_size) and tied; one key/value head (the 2B's multi-query attention),
    # heads wider than hidden_size / heads (as the 7B's).
    return transformers.GemmaConfig(**COMMON, num_key_value_heads=1, head_dim=16)


def gemma2():
    # Sandwich norms, scaled embeddings, GeGLU (tanh), an attention scale other than
    # head_dim^-1/2, attention and final logit soft-capping small enough to bite, a
    # sliding window shorter than the prompt on the first layer, tied embeddings.
    return transformers.Gemma2Config(
        **COMMON,
        num_key_value_heads=2,
        head_dim=8,
        query_pre_attn_scalar=10,
        attn_logit_softcapping=4.0,
        final_logit_softcapping=10.0,
        sliding_window=3,
        layer_types=["sliding_attention", "full_attention"],
    )


def gemma3_text():
    # Gemma-2's layout with QK-norm, one key/value head, a RoPE base per layer type
    # and no soft-capping; untied embeddings.
    return transformers.Gemma3TextConfig(
        **COMMON,
        num_key_value_heads=1,
        head_dim=8,
        query_pre_attn_scalar=8,
        sliding_window=3,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 2.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        },
        tie_word_embeddings=False,
    )


# Gemma-4's dense layout (the 31B's): sliding layers of head_dim 8 with two key/value
# heads, global layers of head_dim 16 with one, whose values are the keys' projection
# (attention_k_eq_v) and whose RoPE is proportional (half of the pairs turn,
# interpolated by 2); plain-RMSNorm QK-norm, a norm of the values, unscaled attention,
# a fixed factor per layer, final logit soft-capping. The third layer is listed
# sliding: transformers makes the last layer global.
GEMMA4_TEXT = dict(
    **{k: v for k, v in COMMON.items() if k != "num_hidden_layers"},
    num_hidden_layers=3,
    num_key_value_heads=2,
    head_dim=8,
    global_head_dim=16,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
    hidden_size_per_layer_input=0,
    sliding_window=3,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    rope_parameters={
        "full_attention": {
            "rope_type": "proportional", "partial_rotary_factor": 0.5,
            "rope_theta": 100.0, "factor": 2.0,
        },
        "sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
    },
    final_logit_softcapping=10.0,
)


def gemma4_text():
    return transformers.Gemma4TextConfig(**GEMMA4_TEXT)


def gemma4_moe():
    # Gemma-4's sparse layout (the 26B-A4B's) on `gemma4_text`'s: every layer runs its
    # dense feed-forward beside 4 experts of width 16 (top 2), which route the residual
    # stream through the router's own norm and scale; each output normed on its own.
    return transformers.Gemma4TextConfig(
        **GEMMA4_TEXT,
        enable_moe_block=True,
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=16,
    )


def gemma4_e2b():
    # Gemma-4's small layout (E2B, E4B) on `gemma4_text`'s: per-layer embeddings of
    # width 4 (a table over the whole vocabulary), and the last two of five layers
    # reusing the keys and values of the last earlier layer of their kind (layer 2 for
    # the sliding layer 3, layer 1 for the global layer 4), with a feed-forward twice
    # as wide.
    return transformers.Gemma4TextConfig(
        **{
            **GEMMA4_TEXT,
            "num_hidden_layers": 5,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                            "sliding_attention", "full_attention"],
            "hidden_size_per_layer_input": 4,
            "vocab_size_per_layer_input": COMMON["vocab_size"],
        },
        num_kv_shared_layers=2,
        use_double_wide_mlp=True,
    )


# The vision towers beside the multimodal checkpoints' text models: one layer, width 16,
# 8-pixel patches. They are never loaded, only skipped.
TINY_VISION = dict(
    hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, patch_size=8
)


def gemma4_vision():
    # Gemma-4's multimodal checkpoint (Gemma4ForConditionalGeneration): `gemma4_text`'s
    # text model under `language_model.` beside a tiny vision tower and its embedder;
    # no audio tower. The image tokens sit at the top of the vocabulary.
    vision = transformers.Gemma4VisionConfig(
        **TINY_VISION, num_key_value_heads=2, head_dim=8, position_embedding_size=64
    )
    return transformers.Gemma4Config(
        text_config=gemma4_text().to_dict(),
        vision_config=vision.to_dict(),
        audio_config=None,
        boi_token_id=93,
        eoi_token_id=94,
        image_token_id=95,
        video_token_id=92,
        boa_token_id=91,
        eoa_token_index=90,
        audio_token_id=89,
    )


def llama4_vision():
    # Llama 4's multimodal checkpoint (Llama4ForConditionalGeneration, as Scout and
    # Maverick ship): `llama4_text`'s text model beside a tiny vision tower and its
    # projector. The image tokens sit at the top of the vocabulary.
    vision = transformers.Llama4VisionConfig(
        **TINY_VISION, image_size=16, vision_output_dim=16, projector_input_dim=16,
        projector_output_dim=32,
    )
    return transformers.Llama4Config(
        text_config=llama4_text().to_dict(),
        vision_config=vision.to_dict(),
        boi_token_index=93,
        eoi_token_index=94,
        image_token_index=95,
    )


def gemma3_vision():
    # Gemma-3's multimodal checkpoint (Gemma3ForConditionalGeneration, as the 4B and
    # larger models ship): the text model under `language_model.`, a tiny SigLIP vision
    # tower and projector beside it, and (see `sparse_text_config`) a text_config that
    # holds only the keys that differ from Gemma3TextConfig's defaults, as the Hub's
    # files do: three sliding layers per full one by `sliding_window_pattern`, the full
    # layers' linear scaling in `rope_scaling`.
    common = {k: v for k, v in COMMON.items() if k not in ("num_hidden_layers",)}
    text = transformers.Gemma3TextConfig(
        **common,
        num_hidden_layers=4,
        num_key_value_heads=2,
        head_dim=8,
        query_pre_attn_scalar=8,
        sliding_window=3,
        sliding_window_pattern=4,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
        rope_local_base_freq=100.0,
    )
    vision = transformers.SiglipVisionConfig(**TINY_VISION, image_size=16)
    return transformers.Gemma3Config(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        mm_tokens_per_image=4,
        boi_token_index=93,
        eoi_token_index=94,
        image_token_index=95,
    )


def mistral3_vision():
    # Mistral-Small-3's multimodal checkpoint (Mistral3ForConditionalGeneration): a
    # Mistral text model (no window, as those checkpoints) beside a tiny Pixtral
    # vision tower and projector; the image token at the top of the vocabulary.
    text = transformers.MistralConfig(**COMMON, num_key_value_heads=2, sliding_window=None)
    vision = transformers.PixtralVisionConfig(**TINY_VISION, head_dim=8, image_size=16)
    return transformers.Mistral3Config(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        image_token_index=95,
        spatial_merge_size=1,
    )


def mistral4_vision():
    # Mistral-Small-4's multimodal checkpoint: `mistral4`'s text model beside
    # `mistral3_vision`'s vision tower and projector.
    return transformers.Mistral3Config(
        text_config=mistral4().to_dict(),
        vision_config=mistral3_vision().vision_config.to_dict(),
        image_token_index=95,
        spatial_merge_size=1,
    )


# The hybrid layers of Qwen3-Next and Qwen3.5: layers 0-2 Gated DeltaNet (2 query/key
# heads serving 4 value heads, a convolution of 4 taps), layer 3 gated attention (a
# sigmoid gate beside the queries in q_proj) with QK-norm and RoPE on a quarter of each
# 16-wide head; every RMSNorm but the DeltaNet's scales by 1 + weight.
HYBRID_LAYERS = dict(
    {k: v for k, v in COMMON.items() if k != "num_hidden_layers"},
    num_hidden_layers=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
    tie_word_embeddings=False,
)
HYBRID_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}


def qwen3_5_text():
    # Qwen3.5's text model: HYBRID_LAYERS, the rotary embedding written as the published
    # files write it (multimodal sections, interleaved).
    return transformers.Qwen3_5TextConfig(
        **HYBRID_LAYERS,
        rope_parameters={**HYBRID_ROPE, "mrope_section": [1, 1, 0], "mrope_interleaved": True},
    )


def qwen3_next():
    # Qwen3-Next: HYBRID_LAYERS with the DeltaNet's projections stored fused key head by
    # key head (`in_proj_qkvz`: each head's q, k, v and z rows; `in_proj_ba`), and
    # Qwen2-MoE's experts: 4 of width 16, top-2 renormalized, beside a shared expert of
    # width 24 behind a sigmoid gate; layer 1 dense (mlp_only_layers).
    return transformers.Qwen3NextConfig(
        **HYBRID_LAYERS,
        rope_parameters=HYBRID_ROPE,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=24,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        router_aux_loss_coef=0.01,
    )


# The tiny vision tower of the Qwen3.5 (and Qwen3.5-MoE) checkpoints, and the wrapper's
# vision tokens, which sit at the top of the vocabulary.
QWEN3_5_VISION = dict(
    depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=8,
    out_hidden_size=32, num_position_embeddings=16,
)
QWEN3_5_VISION_TOKENS = dict(
    image_token_id=95, video_token_id=94, vision_start_token_id=93, vision_end_token_id=92
)


def qwen3_5_vision():
    # Qwen3.5's checkpoint as every Qwen3.5 model ships (Qwen3_5ForConditionalGeneration):
    # `qwen3_5_text`'s text model under `model.language_model.` beside a tiny vision
    # tower (`model.visual.`).
    vision = transformers.models.qwen3_5.configuration_qwen3_5.Qwen3_5VisionConfig(**QWEN3_5_VISION)
    return transformers.Qwen3_5Config(
        text_config=qwen3_5_text().to_dict(),
        vision_config=vision.to_dict(),
        **QWEN3_5_VISION_TOKENS,
    )


def qwen3_5_moe():
    # Qwen3.5-MoE's checkpoint as every one ships (Qwen3_5MoeForConditionalGeneration):
    # HYBRID_LAYERS with Qwen3-Next's experts on every layer (4 of width 16, top-2, always
    # renormalized, stored expert by expert) beside a shared expert of width 24 behind a
    # sigmoid gate, under `model.language_model.` beside `qwen3_5_vision`'s vision tower.
    text = transformers.Qwen3_5MoeTextConfig(
        **HYBRID_LAYERS,
        rope_parameters={**HYBRID_ROPE, "mrope_section": [1, 1, 0], "mrope_interleaved": True},
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=24,
        router_aux_loss_coef=0.01,
    )
    vision = transformers.models.qwen3_5_moe.configuration_qwen3_5_moe.Qwen3_5MoeVisionConfig(
        **QWEN3_5_VISION
    )
    return transformers.Qwen3_5MoeConfig(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        **QWEN3_5_VISION_TOKENS,
    )


def sparse_text_config(out: Path) -> None:
    """Keeps only the keys of `config.json`'s text_config that differ from
    Gemma3TextConfig's defaults (and its model_type), as transformers 4 saved them."""
    path = out / "config.json"
    config = json.loads(path.read_text())
    defaults = json.loads(transformers.Gemma3TextConfig().to_json_string(use_diff=False))
    text = config["text_config"]
    # The pattern lives in layer_types once loaded; the Hub's files give the pattern.
    text.pop("layer_types", None)
    text.pop("_sliding_window_pattern", None)
    text["sliding_window_pattern"] = 4
    # transformers 4's rotary keys: the full layers' scaling and base, the sliding
    # layers' base.
    rope = text.pop("rope_parameters")
    text["rope_scaling"] = {"rope_type": "linear", "factor": rope["full_attention"]["factor"]}
    text["rope_theta"] = rope["full_attention"]["rope_theta"]
    text["rope_local_base_freq"] = rope["sliding_attention"]["rope_theta"]
    config["text_config"] = {
        key: value
        for key, value in text.items()
        if key == "model_type" or key not in defaults or defaults[key] != value
    }
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def mixtral():
    return transformers.MixtralConfig(
        **COMMON,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        router_aux_loss_coef=0.02,
        tie_word_embeddings=False,
    )


def olmoe():
    # OLMo-2's QK-norm across heads in pre-norm blocks, then q, k and v clamped to
    # clip_qkv (small enough to bite), attention biases; 4 experts of width
    # intermediate_size, top-2, softmax weights not renormalized.
    common = {k: v for k, v in COMMON.items() if k != "intermediate_size"}
    return transformers.OlmoeConfig(
        **common,
        intermediate_size=16,
        num_key_value_heads=2,
        attention_bias=True,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        router_aux_loss_coef=0.02,
        tie_word_embeddings=False,
        clip_qkv=0.6,
    )


def qwen2_moe():
    # Qwen2's q/k/v biases; 4 experts, top-2 with softmax weights not renormalized, and a
    # shared expert of its own width behind a sigmoid gate; layer 1 dense
    # (mlp_only_layers); with use_sliding_window, transformers 5 slides on every other
    # layer below max_window_layers (layer 0 here).
    common = {k: v for k, v in COMMON.items() if k != "num_hidden_layers"}
    return transformers.Qwen2MoeConfig(
        **common,
        num_hidden_layers=3,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=24,
        norm_topk_prob=False,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        router_aux_loss_coef=0.01,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=2,
        tie_word_embeddings=False,
    )


def llama4_text():
    # Llama 4's text model: four layers, the last without RoPE (no_rope_layer_interval
    # 4), whose queries are scaled by position (attn_temperature_tuning, floor_scale 4:
    # factors from position 3 on); the rotating layers attend within chunks of 4
    # positions (the prompt of 9 and its continuation cross three chunk boundaries),
    # with the parameterless L2 QK-norm; llama3 RoPE scaling over an original context
    # of 8. Layers 1 and 3 are sparse (interleave_moe_layer_step 2): 4 experts of width
    # 16, one per token, whose input is scaled by the sigmoid of its router logit, plus
    # a shared expert; the dense layers are 48 wide (intermediate_size_mlp).
    common = {k: v for k, v in COMMON.items() if k not in ("num_hidden_layers", "intermediate_size")}
    return transformers.Llama4TextConfig(
        **common,
        num_hidden_layers=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=16,
        intermediate_size_mlp=48,
        num_local_experts=4,
        num_experts_per_tok=1,
        interleave_moe_layer_step=2,
        attention_chunk_size=4,
        floor_scale=4,
        attn_scale=0.5,
        rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8,
        },
    )


def qwen3_moe():
    # Qwen3 attention; 6 experts, 2 per token with renormalized weights, no shared
    # expert; layer 0 sparse, layer 1 dense (mlp_only_layers), a third sparse layer by
    # decoder_sparse_step 1; a window on the last layer.
    common = {k: v for k, v in COMMON.items() if k != "num_hidden_layers"}
    return transformers.Qwen3MoeConfig(
        **common,
        num_hidden_layers=3,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=6,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        router_aux_loss_coef=0.01,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=2,
        tie_word_embeddings=False,
    )


def glm4_moe():
    # GLM-4.5: q/k/v biases, QK-norm per head, the rotary embedding over half of each
    # head (heads wider than hidden_size / heads); a dense first layer, then 8 experts in
    # 4 groups (2 groups kept), top-2 by bias-corrected sigmoid scores, renormalized and
    # scaled, and a shared expert.
    return transformers.Glm4MoeConfig(
        **COMMON,
        num_key_value_heads=2,
        head_dim=16,
        attention_bias=True,
        use_qk_norm=True,
        partial_rotary_factor=0.5,
        moe_intermediate_size=16,
        n_routed_experts=8,
        n_shared_experts=1,
        n_group=4,
        topk_group=2,
        num_experts_per_tok=2,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        first_k_dense_replace=1,
        num_nextn_predict_layers=1,
        tie_word_embeddings=False,
    )


def glm4_moe_lite():
    # GLM-4.7-Flash: DeepSeek-V3's latent attention (interleaved rotary) and routing
    # (8 experts in 2 groups, 1 group kept, top-2, scaled by 1.8, a shared expert), with
    # the layer kinds listed: a sparse first layer, then a dense one.
    common = {k: v for k, v in COMMON.items() if k != "intermediate_size"}
    return transformers.Glm4MoeLiteConfig(
        **common,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=8,
        routed_scaling_factor=1.8,
        kv_lora_rank=16,
        q_lora_rank=24,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=12,
        n_group=2,
        topk_group=1,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        mlp_layer_types=["sparse", "dense"],
        tie_word_embeddings=False,
    )


def dots1():
    # dots.llm1: Qwen3's attention (per-head QK-norm) with biases, a window of 4 on the
    # layers from max_window_layers on (layer 1); a dense first layer, then DeepSeek-V3's
    # routing: 8 experts in 4 groups (2 kept), top-2, renormalized, scaled by 2.5, and
    # two shared experts.
    return transformers.Dots1Config(
        **COMMON,
        num_key_value_heads=2,
        attention_bias=True,
        moe_intermediate_size=16,
        n_routed_experts=8,
        n_shared_experts=2,
        num_experts_per_tok=2,
        n_group=4,
        topk_group=2,
        first_k_dense_replace=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        sliding_window=4,
        max_window_layers=1,
        tie_word_embeddings=False,
    )


def minimax_m2():
    # QK-norm across heads, the rotary embedding over half of each head (as the Hub's
    # files say it: rotary_dim); 8 experts, top-2 by bias-corrected sigmoid scores,
    # renormalized.
    common = {k: v for k, v in COMMON.items() if k != "intermediate_size"}
    return transformers.MiniMaxM2Config(
        **common,
        intermediate_size=16,
        num_key_value_heads=2,
        head_dim=8,
        rotary_dim=4,
        num_local_experts=8,
        num_experts_per_tok=2,
        router_aux_loss_coef=0.02,
        tie_word_embeddings=False,
    )


def ernie4_5_moe():
    # ERNIE-4.5's attention (biases on every projection: use_bias, which here also puts
    # a bias on the tied output head); 4 experts, top-2 chosen by softmax scores plus
    # the correction bias (stored [1, experts]), weighted by the uncorrected scores,
    # renormalized; two shared experts as one MLP; sparse layers 1 and 2 of 4 (the
    # start and end indices), the others dense.
    common = {k: v for k, v in COMMON.items() if k != "num_hidden_layers"}
    return transformers.Ernie4_5_MoeConfig(
        **common,
        num_hidden_layers=4,
        num_key_value_heads=2,
        head_dim=8,
        use_bias=True,
        moe_num_experts=4,
        moe_k=2,
        moe_intermediate_size=16,
        moe_num_shared_experts=2,
        moe_layer_start_index=1,
        moe_layer_end_index=2,
        moe_layer_interval=1,
    )


def internlm3():
    # LLaMA with biases on the four attention projections and the feed-forward, switched
    # by the names its class maps (`qkv_bias`, `bias`), GQA, heads wider than
    # hidden_size / heads.
    return transformers.InternLM3Config(
        **COMMON, num_key_value_heads=2, head_dim=16, qkv_bias=True, bias=True
    )


def cwm():
    # LLaMA's blocks with a window on the layers layer_types names (by default every
    # layer but each fourth from the first: layers 1 to 3 of 4 here, window 4), GQA,
    # LLaMA-3 RoPE (the class's default, at a small original context), feed-forward
    # biases.
    return transformers.CwmConfig(
        **{**COMMON, "num_hidden_layers": 4},
        num_key_value_heads=2,
        head_dim=8,
        sliding_window=4,
        mlp_bias=True,
        rope_parameters=dict(
            rope_type="llama3",
            rope_theta=1_000_000.0,
            factor=16.0,
            high_freq_factor=4.0,
            low_freq_factor=1.0,
            original_max_position_embeddings=8,
        ),
    )


def gpt2():
    # GPT-2's layout: learned positions, shifted LayerNorms, biases everywhere, an
    # ungated GELU (tanh) feed-forward 4× the width (`n_inner` null), tied embeddings;
    # stored as Conv1D layers with q, k and v fused in `c_attn`.
    return transformers.GPT2Config(**GPT2_SIZES)


def gpt_neo():
    # GPT-Neo's layout: GPT-2's learned positions, shifted LayerNorms and GELU (tanh)
    # feed-forward (4× the width, `intermediate_size` null), attention alternating
    # global and local (a window of 3: `attention_types` [[["global", "local"], 1]]
    # over 2 layers) with unscaled scores, q/k/v without biases, an output bias, tied
    # embeddings; stored as nn.Linear layers.
    return transformers.GPTNeoConfig(
        vocab_size=COMMON["vocab_size"],
        hidden_size=COMMON["hidden_size"],
        num_layers=COMMON["num_hidden_layers"],
        num_heads=COMMON["num_attention_heads"],
        max_position_embeddings=COMMON["max_position_embeddings"],
        attention_types=[[["global", "local"], 1]],
        window_size=3,
        **TOKENS,
    )


def falcon():
    # Falcon-40B's layout (`new_decoder_architecture`): attention and an ungated GELU
    # feed-forward in parallel, each after its own shifted LayerNorm (`ln_attn`,
    # `ln_mlp`); 4 query heads in 2 groups, each group's q heads, k and v fused in
    # `query_key_value`; biases (`bias`); tied embeddings.
    return transformers.FalconConfig(
        **SIZES,
        **TOKENS,
        num_kv_heads=2,
        new_decoder_architecture=True,
        bias=True,
        ffn_hidden_size=COMMON["intermediate_size"],
    )


def falcon_7b():
    # Falcon-7B's layout: multi-query attention (q heads, then one k and one v head,
    # fused), parallel sublayers after one LayerNorm, no biases, a feed-forward 4× the
    # width.
    return transformers.FalconConfig(**SIZES, **TOKENS, multi_query=True, parallel_attn=True)


def falcon_sequential():
    # Falcon's sequential blocks (`parallel_attn` false): Pre-LN with
    # `input_layernorm` and `post_attention_layernorm`, q, k, v fused head by head.
    config = falcon_7b()
    config.multi_query = False
    config.parallel_attn = False
    config.bias = True
    return config


def bloom():
    # BLOOM's layout: ALiBi (6 heads: not a power of two, so the slopes' rule for the
    # other heads counts), a LayerNorm on the embeddings, Pre-LN blocks of shifted
    # LayerNorms, biases everywhere, an ungated GELU (tanh) feed-forward 4× the width,
    # q, k and v fused head by head in `query_key_value`, tied embeddings.
    return transformers.BloomConfig(
        vocab_size=COMMON["vocab_size"],
        hidden_size=36,
        n_layer=COMMON["num_hidden_layers"],
        n_head=6,
        **TOKENS,
    )


def mpt():
    # MPT's layout: ALiBi over 6 heads (MPT's statement of the slopes, for the keys
    # counted back from the last), LayerNorms without a shift, no biases, an ungated
    # exact-GELU feed-forward 4× the width, q, k and v fused one after the other in
    # `Wqkv` and clamped to 0.5 (`attn_config.clip_qkv`), its softmax scale set
    # (`attn_config.softmax_scale`), tied embeddings.
    return transformers.MptConfig(
        vocab_size=COMMON["vocab_size"],
        d_model=36,
        n_layers=COMMON["num_hidden_layers"],
        n_heads=6,
        max_seq_len=COMMON["max_position_embeddings"],
        attn_config=dict(clip_qkv=0.5, softmax_scale=0.3),
        **TOKENS,
    )


def biogpt():
    # BioGPT's layout: OPT's learned positions (two rows before position 0),
    # embeddings times √hidden_size (`scale_embedding`), Pre-LN blocks of shifted
    # LayerNorms at PyTorch's default epsilon (its `layer_norm_eps` is unread), biases
    # everywhere, an ungated exact-GELU feed-forward, tied embeddings
    # (`output_projection`).
    return transformers.BioGptConfig(**COMMON_NO_RMS, scale_embedding=True)


def opt():
    # OPT's layout (125M and 1.3B+): learned positions whose table starts 2 rows in,
    # Pre-LN blocks of shifted LayerNorms (`self_attn_layer_norm`, `final_layer_norm`),
    # biases everywhere, an ungated ReLU feed-forward `ffn_dim` wide, tied embeddings.
    return transformers.OPTConfig(
        **SIZES,
        **TOKENS,
        ffn_dim=COMMON["intermediate_size"],
        word_embed_proj_dim=COMMON["hidden_size"],
    )


def opt_post_norm():
    # OPT's post-norm blocks (350M's, without its embedding projections): each
    # LayerNorm after its sublayer's residual add, no final norm.
    config = opt()
    config.do_layer_norm_before = False
    return config


def gpt_bigcode():
    # StarCoder 1's and SantaCoder's layout: GPT-2's layers and names as `nn.Linear`,
    # multi-query attention (`c_attn` holds q, then one k and one v head), GELU-tanh.
    return transformers.GPTBigCodeConfig(**GPT2_SIZES)


def gpt_bigcode_mha():
    # GPT-BigCode without `multi_query`: `c_attn` holds q, k and v head by head.
    return transformers.GPTBigCodeConfig(**GPT2_SIZES, multi_query=False)


def gptj():
    # GPT-J's layout: attention (no biases) and an ungated GELU-tanh feed-forward (with
    # biases) in parallel after one shifted LayerNorm; the rotary embedding on pairs of
    # neighbouring features over the first `rotary_dim` (4 of 8) of each head, at base
    # 10000; an untied head with a bias; GPT-2's names for the sizes.
    return transformers.GPTJConfig(**GPT2_SIZES, rotary_dim=4)


def codegen():
    # CodeGen's layout: GPT-J's (parallel blocks, `rotary_dim` 4 of 8 rotated in
    # neighbouring pairs, an untied head with a bias) with q, k and v fused in
    # `qkv_proj` in four blocks of q, v and k rows.
    return transformers.CodeGenConfig(**GPT2_SIZES, rotary_dim=4)


def gpt_neox():
    # Pythia's layout: attention and feed-forward in parallel, each after its own
    # shifted LayerNorm; q, k, v fused per head in `query_key_value`; the rotary
    # embedding over a quarter of each head (rotary_pct, the class's default; heads of
    # 16 here); an ungated exact-GELU feed-forward with biases; an untied head.
    common = {k: v for k, v in COMMON.items() if k not in ("rms_norm_eps", "num_attention_heads")}
    return transformers.GPTNeoXConfig(**common, num_attention_heads=2, rotary_emb_base=1000.0)


def gpt_neox_sequential():
    # GPT-NeoX without the parallel residual: Pre-LN blocks; 4 heads of 8, half rotated.
    return transformers.GPTNeoXConfig(
        **{k: v for k, v in COMMON.items() if k != "rms_norm_eps"},
        use_parallel_residual=False,
        rotary_pct=0.5,
    )


def phi():
    # Phi-2's layout: attention and an ungated GELU (tanh) feed-forward in parallel after
    # one LayerNorm, biases on every projection and on the output head, the rotary
    # embedding over half of each head (the class's default).
    return transformers.PhiConfig(**{k: v for k, v in COMMON.items() if k != "rms_norm_eps"})


def stablelm():
    # StableLM-2's layout: LLaMA with LayerNorms, q/k/v biases, the rotary embedding
    # over a quarter of each head (the class's default; heads of 16 here), GQA.
    common = {k: v for k, v in COMMON.items() if k != "rms_norm_eps"}
    return transformers.StableLmConfig(
        **{**common, "num_attention_heads": 2}, num_key_value_heads=1, use_qkv_bias=True
    )


def phi_qk_layernorm():
    # Phi with `qk_layernorm`: one LayerNorm with a shift over each head's queries (and
    # keys), shared by the heads, before the partial rotary embedding.
    return transformers.PhiConfig(
        **{k: v for k, v in COMMON.items() if k != "rms_norm_eps"}, qk_layernorm=True
    )


def stablelm_qk_layernorm():
    # StableLM-2-12B's `qk_layernorm`: a LayerNorm without a shift per head, each head
    # its own (`q_layernorm.norms.{h}.weight`); 4 query heads over 2 key heads.
    common = {k: v for k, v in COMMON.items() if k != "rms_norm_eps"}
    return transformers.StableLmConfig(
        **common, num_key_value_heads=2, use_qkv_bias=True, qk_layernorm=True
    )


def persimmon():
    # Persimmon's layout: Pre-LN blocks of shifted LayerNorms; q, k and v fused head by
    # head in `query_key_value` (with biases); a shifted LayerNorm of each head's queries
    # and keys shared by the heads (`qk_layernorm`, the class's default) before the
    # rotary embedding over half of each head; an ungated squared-ReLU feed-forward
    # (`dense_h_to_4h`, `dense_4h_to_h`) with biases; an untied head without a bias;
    # Persimmon-8B's rotary base.
    return transformers.PersimmonConfig(
        **{k: v for k, v in COMMON.items() if k != "rms_norm_eps"},
        rope_parameters={"rope_type": "default", "rope_theta": 25000.0, "partial_rotary_factor": 0.5},
    )


def nemotron():
    # LLaMA's attention with biases, LayerNorm1P (a shifted LayerNorm scaling by
    # 1 + weight), an ungated squared-ReLU feed-forward with biases, the rotary
    # embedding over half of each head (the class's default), GQA.
    return transformers.NemotronConfig(
        **{k: v for k, v in COMMON.items() if k != "rms_norm_eps"},
        num_key_value_heads=2,
        attention_bias=True,
        mlp_bias=True,
    )


def glm():
    # GLM-4's first transformers port: LLaMA's pre-norm blocks with q/k/v biases (none
    # on o_proj), a fused gate/up projection, the rotary embedding interleaved over half
    # of each head (the class's default), GQA.
    return transformers.GlmConfig(**COMMON, num_key_value_heads=2, head_dim=8)


def jais2():
    # LLaMA with LayerNorms (a shift too), an ungated squared-ReLU feed-forward
    # (up_proj, down_proj), biases on every projection (the class's defaults).
    return transformers.Jais2Config(**{k: v for k, v in COMMON.items() if k != "rms_norm_eps"},
                                    num_key_value_heads=2, layer_norm_eps=1e-5)


def vaultgemma():
    # Gemma-2 in pre-norm blocks (input_layernorm, pre_feedforward_layernorm): scaled
    # embeddings, GeGLU (tanh), an attention scale other than head_dim^-1/2, attention
    # and final soft-capping small enough to bite, a window shorter than the prompt on
    # the first layer.
    return transformers.VaultGemmaConfig(
        **COMMON,
        num_key_value_heads=2,
        head_dim=8,
        query_pre_attn_scalar=10,
        attn_logit_softcapping=4.0,
        final_logit_softcapping=10.0,
        sliding_window=3,
        layer_types=["sliding_attention", "full_attention"],
    )


def minicpm3():
    # DeepSeek-V2's latent attention rotating the halves of each head (value heads of
    # hidden_size / heads, the class's default), LongRoPE as the published checkpoint
    # (short factors for this prompt), embeddings times scale_emb, each sublayer's output
    # times scale_depth / sqrt(layers), logits times dim_model_base / hidden_size; tied
    # embeddings (the class's default).
    return transformers.MiniCPM3Config(
        **COMMON,
        num_key_value_heads=4,
        kv_lora_rank=16,
        q_lora_rank=24,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8,
        scale_emb=3.0,
        scale_depth=1.4,
        dim_model_base=16,
        rope_parameters=dict(
            rope_type="longrope",
            rope_theta=10000.0,
            short_factor=[1.0, 1.3, 2.1, 3.5],
            long_factor=[1.2, 2.0, 4.5, 9.0],
            original_max_position_embeddings=16,
        ),
    )


def youtu():
    # DeepSeek-V3's latent attention (interleaved rotary, compressed queries) in LLaMA's
    # pre-norm blocks with a dense feed-forward on every layer; tied embeddings (the
    # class's default).
    return transformers.YoutuConfig(
        **COMMON,
        num_key_value_heads=4,
        kv_lora_rank=16,
        q_lora_rank=24,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=12,
        rope_interleave=True,
    )


def flex_olmo():
    # OLMo-2's blocks (norms on the sublayers' outputs, QK-norm across heads) with
    # OLMoE's experts: 4 of width intermediate_size, top-2, softmax weights not
    # renormalized; attention biases.
    common = {k: v for k, v in COMMON.items() if k != "intermediate_size"}
    return transformers.FlexOlmoConfig(
        **common,
        intermediate_size=16,
        num_key_value_heads=2,
        attention_bias=True,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        router_aux_loss_coef=0.02,
    )


def solar_open():
    # LLaMA's attention with q/k/v biases, every layer GLM-4.5's experts: 8 in 4 groups
    # (2 kept), top-2 by bias-corrected sigmoid scores, renormalized and scaled, beside a
    # shared expert.
    common = {k: v for k, v in COMMON.items() if k != "intermediate_size"}
    return transformers.SolarOpenConfig(
        **common,
        num_key_value_heads=2,
        head_dim=8,
        attention_bias=True,
        moe_intermediate_size=16,
        n_routed_experts=8,
        n_shared_experts=1,
        n_group=4,
        topk_group=2,
        num_experts_per_tok=2,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
    )


def exaone_moe():
    # EXAONE-4's attention (QK-norm per head; with a window, two sliding layers of
    # three, the full one without RoPE) in pre-norm blocks; a dense first layer
    # (first_k_dense_replace, the class's default), then 8 experts in 4 groups (2 kept),
    # top-2 by bias-corrected sigmoid scores (the bias stored beside the router),
    # renormalized and scaled, and a shared expert (num_shared_experts).
    common = {k: v for k, v in COMMON.items() if k != "num_hidden_layers"}
    return transformers.ExaoneMoeConfig(
        **common,
        num_hidden_layers=3,
        num_key_value_heads=2,
        head_dim=8,
        sliding_window=4,
        sliding_window_pattern=3,
        moe_intermediate_size=16,
        num_experts=8,
        num_shared_experts=1,
        n_group=4,
        topk_group=2,
        num_experts_per_tok=2,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
    )


def granitemoe():
    # Granite's four multipliers; 4 experts, top-2 (softmax over the chosen logits),
    # stored as 3-D input_linear / output_linear tensors; attention biases.
    common = {k: v for k, v in COMMON.items() if k != "intermediate_size"}
    return transformers.GraniteMoeConfig(
        **common,
        intermediate_size=16,
        num_key_value_heads=2,
        attention_bias=True,
        embedding_multiplier=3.0,
        attention_multiplier=0.15,
        residual_multiplier=0.4,
        logits_scaling=2.0,
        num_local_experts=4,
        num_experts_per_tok=2,
        router_aux_loss_coef=0.02,
        tie_word_embeddings=False,
    )


def granitemoeshared():
    # GraniteMoE with a shared expert of width 24 beside the experts (gate and up
    # fused in shared_mlp.input_linear).
    config = granitemoe()
    return transformers.GraniteMoeSharedConfig(
        **{k: v for k, v in config.to_dict().items() if k in GRANITEMOE_KEYS},
        shared_intermediate_size=24,
    )


GRANITEMOE_KEYS = [
    *COMMON,
    "num_key_value_heads",
    "attention_bias",
    "embedding_multiplier",
    "attention_multiplier",
    "residual_multiplier",
    "logits_scaling",
    "num_local_experts",
    "num_experts_per_tok",
    "router_aux_loss_coef",
    "tie_word_embeddings",
]


def gpt_oss():
    # Attention sinks and biases, a window of 4 on the first layer only, YaRN; 4 experts
    # top-2 with router and expert biases and the clamped SwiGLU.
    common = {k: v for k, v in COMMON.items() if k != "intermediate_size"}
    return transformers.GptOssConfig(
        **common,
        intermediate_size=16,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters=dict(
            rope_type="yarn",
            rope_theta=150000.0,
            factor=4.0,
            original_max_position_embeddings=16,
            beta_fast=32.0,
            beta_slow=1.0,
            truncate=False,
        ),
        router_aux_loss_coef=0.02,
        tie_word_embeddings=False,
    )


# DeepSeek-V3's shape at fixture size, shared by the families that copy its layout:
# latent attention (low-rank queries), 8 experts in 4 groups (2 kept), top-2,
# renormalized, a shared expert, a dense first layer.
LATENT_MOE_SIZES = dict(
    intermediate_size=64,
    moe_intermediate_size=16,
    num_key_value_heads=4,
    n_shared_experts=1,
    n_routed_experts=8,
    kv_lora_rank=16,
    q_lora_rank=24,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=12,
    n_group=4,
    topk_group=2,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    norm_topk_prob=True,
    rope_interleave=True,
)
# YaRN with DeepSeek's mscale (its attention factor cancels; the softmax scale takes it).
LATENT_YARN = dict(
    rope_type="yarn", rope_theta=10000.0, factor=4.0, beta_fast=32.0, beta_slow=1.0,
    mscale=1.0, mscale_all_dim=1.0,
)


def deepseek_v3():
    common = {k: v for k, v in COMMON.items() if k != "intermediate_size"}
    return transformers.DeepseekV3Config(
        **common,
        **LATENT_MOE_SIZES,
        routed_scaling_factor=2.5,
        rope_parameters=dict(**LATENT_YARN, original_max_position_embeddings=16),
        tie_word_embeddings=False,
    )


def mistral4():
    # Mistral-Small-4's layout on DeepSeek-V3's sizes: latent attention (YaRN with its
    # mscale) with Llama 4's query temperature past an original context of 4 (beta 0.3,
    # so the 9-token prompts cross two steps), softmax routing through the groups by
    # their two best scores without a correction bias, scaled by 1.5; the experts stored
    # stacked (`experts.gate_up_proj`).
    common = {k: v for k, v in COMMON.items() if k != "intermediate_size"}
    return transformers.Mistral4Config(
        **common,
        **LATENT_MOE_SIZES,
        routed_scaling_factor=1.5,
        rope_parameters=dict(
            **LATENT_YARN, original_max_position_embeddings=4, llama_4_scaling_beta=0.3
        ),
    )


def deepseek_v2():
    common = {k: v for k, v in COMMON.items() if k != "intermediate_size"}
    return transformers.DeepseekV2Config(
        **common,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_key_value_heads=4,
        n_shared_experts=2,
        n_routed_experts=4,
        routed_scaling_factor=1.0,
        kv_lora_rank=16,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=12,
        topk_method="greedy",
        n_group=1,
        topk_group=1,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        norm_topk_prob=False,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        tie_word_embeddings=False,
    )


# name -> (config builder, options: `dtype` and `max_shard_size` for saving, `mtp` to
# add DeepSeek-V3's multi-token-prediction layer to the checkpoint and the reference,
# `sparse_text_config` to write a multimodal text_config as the Hub's files do)
MODELS = {
    "llama": (llama, {}),
    "llama_sharded": (llama_sharded, {"max_shard_size": "20KB"}),
    "mistral": (mistral, {}),
    "qwen2": (qwen2, {}),
    "qwen2_bf16": (qwen2_bf16, {"dtype": torch.bfloat16}),
    "qwen3": (qwen3, {}),
    "qwen3_mqa": (qwen3_mqa, {}),
    "olmo": (olmo, {}),
    "olmo2": (olmo2, {}),
    "olmo2_mqa": (olmo2_mqa, {}),
    "olmo3": (olmo3, {}),
    "smollm3": (smollm3, {}),
    "phi3": (phi3, {}),
    "glm4": (glm4, {}),
    "seed_oss": (seed_oss, {}),
    "ernie4_5": (ernie4_5, {}),
    "exaone4": (exaone4, {}),
    "cohere": (cohere, {}),
    "cohere_qk_norm": (cohere_qk_norm, {}),
    "cohere2": (cohere2, {}),
    "granite": (granite, {}),
    "ministral3": (ministral3, {}),
    "hyperclovax": (hyperclovax, {}),
    "granite_swa": (granite_swa, {}),
    "arcee": (arcee, {}),
    "apertus": (apertus, {}),
    "nanochat": (nanochat, {}),
    "helium": (helium, {}),
    "ministral": (ministral, {}),
    "starcoder2": (starcoder2, {}),
    "hunyuan_v1_dense": (hunyuan_v1_dense, {}),
    "hunyuan_v1_moe": (hunyuan_v1_moe, {}),
    "gemma": (gemma, {}),
    "gemma2": (gemma2, {}),
    "gemma3_text": (gemma3_text, {}),
    "gemma3_vision": (gemma3_vision, {"sparse_text_config": True}),
    "gemma4_text": (gemma4_text, {}),
    "gemma4_vision": (gemma4_vision, {}),
    "gemma4_moe": (gemma4_moe, {}),
    "gemma4_e2b": (gemma4_e2b, {"max_shard_size": "150KB"}),
    "mistral3_vision": (mistral3_vision, {}),
    "mixtral": (mixtral, {}),
    "olmoe": (olmoe, {}),
    "qwen2_moe": (qwen2_moe, {}),
    "qwen3_moe": (qwen3_moe, {}),
    "llama4_text": (llama4_text, {}),
    "llama4_vision": (llama4_vision, {}),
    "qwen3_5_text": (qwen3_5_text, {}),
    "qwen3_next": (qwen3_next, {"max_shard_size": "150KB"}),
    "qwen3_5_vision": (qwen3_5_vision, {"max_shard_size": "150KB"}),
    "qwen3_5_moe": (qwen3_5_moe, {"max_shard_size": "150KB"}),
    "glm4_moe": (glm4_moe, {}),
    "glm4_moe_mtp": (glm4_moe, {"mtp": True, "max_shard_size": "150KB"}),
    "glm4_moe_lite": (glm4_moe_lite, {}),
    "dots1": (dots1, {}),
    "minimax_m2": (minimax_m2, {}),
    "ernie4_5_moe": (ernie4_5_moe, {}),
    "internlm3": (internlm3, {}),
    "cwm": (cwm, {}),
    "gpt2": (gpt2, {}),
    "gpt_bigcode": (gpt_bigcode, {}),
    "gpt_bigcode_mha": (gpt_bigcode_mha, {}),
    "gptj": (gptj, {}),
    "gpt_neo": (gpt_neo, {}),
    "codegen": (codegen, {}),
    "falcon": (falcon, {}),
    "falcon_7b": (falcon_7b, {}),
    "falcon_sequential": (falcon_sequential, {}),
    "bloom": (bloom, {}),
    "mpt": (mpt, {}),
    "biogpt": (biogpt, {}),
    "opt": (opt, {}),
    "opt_post_norm": (opt_post_norm, {}),
    "gpt_neox": (gpt_neox, {}),
    "gpt_neox_sequential": (gpt_neox_sequential, {}),
    "phi": (phi, {}),
    "phi_qk_layernorm": (phi_qk_layernorm, {}),
    "stablelm": (stablelm, {}),
    "stablelm_qk_layernorm": (stablelm_qk_layernorm, {}),
    "persimmon": (persimmon, {}),
    "nemotron": (nemotron, {}),
    "glm": (glm, {}),
    "jais2": (jais2, {}),
    "vaultgemma": (vaultgemma, {}),
    "youtu": (youtu, {}),
    "minicpm3": (minicpm3, {}),
    "flex_olmo": (flex_olmo, {}),
    "solar_open": (solar_open, {}),
    "exaone_moe": (exaone_moe, {}),
    "granitemoe": (granitemoe, {}),
    "granitemoeshared": (granitemoeshared, {}),
    "gpt_oss": (gpt_oss, {}),
    "deepseek_v3": (deepseek_v3, {}),
    # The MTP layer makes the checkpoint ~270 KiB: two shards keep each file < 200 KiB.
    "deepseek_v3_mtp": (deepseek_v3, {"mtp": True, "max_shard_size": "150KB"}),
    "deepseek_v2": (deepseek_v2, {}),
    "mistral4": (mistral4, {}),
    "mistral4_vision": (mistral4_vision, {}),
}


def seed_of(name: str, attempt: int) -> int:
    return zlib.crc32(f"{name}/{attempt}".encode())


def perturb(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Redraws every parameter and saved floating-point buffer (but RoPE's inv_freq)."""

    def normal(shape, std):
        return torch.randn(shape, generator=generator, dtype=torch.float32) * std

    with torch.no_grad():
        for name, param in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            owner = model.get_submodule(name.rsplit(".", 1)[0])
            # Command R+'s QK-norms hold a row of weights per head.
            per_head_norm = name.endswith(("q_norm.weight", "k_norm.weight"))
            # Apertus' xIELU factors (before softplus): around their initial values.
            if name.endswith(("act_fn.alpha_p", "act_fn.alpha_n")):
                param.copy_(param + normal(param.shape, 0.3))
            # Gemma-4's router scales (of its input, and of each expert's weights).
            elif name.endswith(("router.scale", "router.per_expert_scale")):
                param.copy_(1.0 + normal(param.shape, 0.3))
            # Gemma-4's router reads a vector of norm 1 (d_model^-1/2 times a normed
            # one): a projection 4 times the usual scale spreads its logits over O(1).
            elif name.endswith("router.proj.weight"):
                param.copy_(normal(param.shape, 4.0 / math.sqrt(param.shape[-1])))
            # GPT-2's LayerNorms are `ln_1`, `ln_2`, `ln_f`.
            elif ("norm" in name or ".ln_" in name) and (param.dim() == 1 or per_head_norm):
                param.copy_(1.0 + normal(param.shape, 0.2))
            elif leaf == "bias" or param.dim() == 1:
                param.copy_(normal(param.shape, 0.1))
            elif "embed_tokens" in name:
                param.copy_(normal(param.shape, 1.0))
            else:
                # GPT-2's Conv1D stores its weight [in, out].
                fan_in = param.shape[0] if type(owner).__name__ == "Conv1D" else param.shape[-1]
                param.copy_(normal(param.shape, 1.0 / math.sqrt(fan_in)))
        # Buffers the checkpoint does not save (Gemma's embedding scale) are the
        # architecture's, not weights: a loader computes them from config.json.
        saved = set(model.state_dict())
        for name, buffer in model.named_buffers():
            if "inv_freq" in name or not buffer.is_floating_point() or name not in saved:
                continue
            # xIELU's `beta` and `eps` are constants of the activation, saved as buffers.
            if name.endswith(("act_fn.beta", "act_fn.eps")):
                continue
            # Gemma-4's factor on each layer's output: around its initial 1.
            if name.endswith("layer_scalar"):
                buffer.copy_(1.0 + normal(buffer.shape, 0.3))
                continue
            # MoE balancing biases (DeepSeek-V3's e_score_correction_bias).
            buffer.copy_(normal(buffer.shape, 0.1))


class RouterGaps:
    """Records the smallest margin of every top-k routing decision."""

    def __init__(self, model, config):
        # A multimodal model routes with its text model's settings.
        self.config = config.get_text_config()
        self.smallest = math.inf
        self.handles = []
        for name, module in model.named_modules():
            if name.endswith(("mlp.gate", "block_sparse_moe.gate", "block_sparse_moe.router")):
                self.handles.append(module.register_forward_hook(self.hook(module)))
            # Llama 4's router is the linear layer itself: top-k of its logits.
            if type(module).__name__ == "Llama4Router":
                self.handles.append(module.register_forward_hook(self.hook(module)))
            # Gemma-4's router returns its softmax probabilities first.
            if type(module).__name__ == "Gemma4TextRouter":
                top_k = self.config.top_k_experts
                self.handles.append(module.register_forward_hook(
                    lambda _module, _inputs, output: self.record(gap(output[0].float(), top_k))
                ))

    def hook(self, module):
        def record(_module, inputs, _output):
            hidden = inputs[0].reshape(-1, inputs[0].shape[-1]).float()
            # Hunyuan's router keeps its projection as `wg`.
            weight = module.wg.weight if hasattr(module, "wg") else module.weight
            logits = hidden @ weight.float().t()
            # MiniMax-M2's router takes its block's correction bias as an argument.
            bias = inputs[1] if len(inputs) > 1 else None
            self.smallest = min(self.smallest, self.margin(module, logits, bias))

        return record

    def margin(self, module, logits, bias=None):
        config = self.config
        k = config.num_experts_per_tok
        if isinstance(k, list):  # Hunyuan's per-layer top-k
            k = module.top_k
        if config.model_type == "llama4_text":
            return gap(logits.sigmoid(), k)
        if config.model_type == "minimax_m2":
            scores = logits.sigmoid() + bias.float()
            return gap(scores, k)
        if config.model_type == "ernie4_5_moe":
            # Softmax scores plus the correction bias choose; stored [1, experts].
            scores = logits.softmax(-1) + module.moe_statics.e_score_correction_bias.float()
            return gap(scores, k)
        if config.model_type in ("deepseek_v3", "glm4_moe", "glm4_moe_lite", "dots1", "solar_open",
                                 "exaone_moe", "mistral4"):
            # DeepSeek-V3's routing (and of the families that copy it): bias-corrected
            # sigmoid scores (Mistral-4: softmax scores, no bias), groups ranked by their
            # two best experts.
            if config.model_type == "mistral4":
                scores = logits.softmax(-1)
            else:
                scores = logits.sigmoid() + module.e_score_correction_bias.float()
            groups = scores.view(scores.shape[0], config.n_group, -1)
            group_scores = groups.topk(2, dim=-1)[0].sum(-1)
            gaps = [gap(group_scores, config.topk_group)]
            chosen = group_scores.topk(config.topk_group, dim=-1)[1]
            mask = torch.zeros_like(group_scores).scatter_(1, chosen, 1).bool()
            mask = mask.unsqueeze(-1).expand_as(groups).reshape(scores.shape)
            gaps.append(gap(scores.masked_fill(~mask, -1e9), k))
            return min(gaps)
        return gap(logits.softmax(-1), k)

    def record(self, margin):
        self.smallest = min(self.smallest, margin)

    def close(self):
        for handle in self.handles:
            handle.remove()


def text_runner(model):
    """The module that runs `model` on text: the model itself, but for Llama 4's
    multimodal class, whose forward in transformers 5.24 fails on a text-only call
    after computing its logits (it reads `image_outputs`, which its language model
    does not return); its language model computes those same logits."""
    if type(model).__name__ == "Llama4ForConditionalGeneration":
        return model.language_model
    return model


def greedy_with_cache(model, tokens, new_tokens):
    """Greedy continuation through transformers' KV cache (no stop token).

    Returns the tokens `[batch, new_tokens]` and each step's logits
    `[batch, new_tokens, vocab]`."""
    output = model(tokens, use_cache=True)
    cache, step_logits, chosen = output.past_key_values, [], []
    logits = output.logits[:, -1].float()
    for _ in range(new_tokens):
        step_logits.append(logits)
        token = logits.argmax(-1, keepdim=True)
        chosen.append(token)
        output = model(token, past_key_values=cache, use_cache=True)
        cache, logits = output.past_key_values, output.logits[:, -1].float()
    return torch.cat(chosen, 1), torch.stack(step_logits, 1)


def gap(scores: torch.Tensor, k: int) -> float:
    """Smallest difference between the k-th and (k+1)-th largest score of a row."""
    top = scores.topk(min(k + 1, scores.shape[-1]), dim=-1)[0]
    if top.shape[-1] <= k:
        return math.inf
    return float((top[:, k - 1] - top[:, k]).min())


# The decoder layer and RMSNorm of each family whose checkpoints hold MTP layers.
MTP_FAMILIES = {
    "deepseek_v3": (DeepseekV3DecoderLayer, DeepseekV3RMSNorm),
    "glm4_moe": (Glm4MoeDecoderLayer, Glm4MoeRMSNorm),
}


def mtp_layer(config, layer_idx: int):
    """A multi-token-prediction (MTP) module, as DeepSeek-V3's and GLM-4.5's checkpoints
    store it.

    transformers' own decoder layer of the family for index `layer_idx =
    num_hidden_layers` (input_layernorm, self_attn.*, post_attention_layernorm, mlp.*:
    an MoE layer since layer_idx >= first_k_dense_replace) plus the MTP's own weights,
    under the names of the published checkpoints (and of vLLM's / SGLang's MTP loaders):
    - `enorm`, `hnorm`: RMSNorms of the next token's embedding and of the main model's
      hidden state;
    - `eh_proj`: Linear 2d -> d without bias, over `cat([enorm(embedding), hnorm(hidden)])`;
    - `embed_tokens`, `shared_head.head`: copies of the main model's `embed_tokens` and
      `lm_head` (shared, stored again in the checkpoint);
    - `shared_head.norm`: the RMSNorm before the head.

    Appended to `model.model.layers`, it is saved by `save_pretrained` like any layer (same
    key names, experts stored per expert as transformers writes them); transformers'
    forward only runs `layers[:num_hidden_layers]`, so the main model is unchanged.
    """
    layer_cls, norm_cls = MTP_FAMILIES[config.model_type]
    layer = layer_cls(config, layer_idx)
    d, eps = config.hidden_size, config.rms_norm_eps
    layer.enorm = norm_cls(d, eps=eps)
    layer.hnorm = norm_cls(d, eps=eps)
    layer.eh_proj = torch.nn.Linear(2 * d, d, bias=False)
    layer.embed_tokens = torch.nn.Embedding(config.vocab_size, d)
    layer.shared_head = torch.nn.Module()
    layer.shared_head.norm = norm_cls(d, eps=eps)
    layer.shared_head.head = torch.nn.Linear(d, config.vocab_size, bias=False)
    return layer.eval()


def add_mtp_layer(model):
    """Appends an MTP layer at index num_hidden_layers to `model.model.layers`."""
    config = model.config
    mtp = mtp_layer(config, config.num_hidden_layers)
    model.model.layers.append(mtp)
    assert len(model.model.layers) == config.num_hidden_layers + 1
    return mtp


def share_mtp_weights(model, mtp) -> None:
    """The MTP's embedding and head are exact copies of the main model's (not tied)."""
    with torch.no_grad():
        mtp.embed_tokens.weight.copy_(model.model.embed_tokens.weight)
        mtp.shared_head.head.weight.copy_(model.lm_head.weight)


def mtp_forward(model, mtp, tokens: torch.Tensor):
    """An MTP layer over a prompt (depth 1, no cache), as vLLM / SGLang run DeepSeek-V3's
    and GLM-4.5's.

    With `hidden = model.model(tokens).last_hidden_state` (after the final norm),
    [batch, T, d], for i in 0..T-2:
        u_i = eh_proj(cat([enorm(embed_tokens(tokens[:, i + 1])), hnorm(hidden[:, i])], -1))
    (the embedding first). The decoder layer runs over u (length T-1) at positions
    0..T-2 with a causal mask and the main model's rotary embedding (eager attention):
        h1 = layer(u);  mtp_logits = shared_head.head(shared_head.norm(h1))
    so that mtp_logits[:, i] predicts tokens[:, i + 2]. (vLLM also zeroes the
    embedding at position 0; this reference does not.)

    Returns (h1 [batch, T-1, d], mtp_logits [batch, T-1, vocab]).
    """
    config = model.config
    hidden = model.model(tokens).last_hidden_state
    embedding = mtp.embed_tokens(tokens[:, 1:])
    u = mtp.eh_proj(torch.cat([mtp.enorm(embedding), mtp.hnorm(hidden[:, :-1])], dim=-1))
    positions = torch.arange(u.shape[1]).unsqueeze(0)
    mask = create_causal_mask(
        config=config,
        inputs_embeds=u,
        attention_mask=None,
        past_key_values=None,
        position_ids=positions,
    )
    position_embeddings = model.model.rotary_emb(u, positions)
    h1 = mtp(
        u, attention_mask=mask, position_ids=positions, position_embeddings=position_embeddings
    )
    mtp_logits = mtp.shared_head.head(mtp.shared_head.norm(h1))
    return h1.float(), mtp_logits.float()


def read_checkpoint(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a saved model, single file or shards, read with safetensors."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for file in files:
        with safe_open(folder / file, "pt") as f:
            assert f.metadata() == {"format": "pt"}, (file, f.metadata())
            for key in f.keys():
                assert key not in tensors, key
                tensors[key] = f.get_tensor(key)
    return tensors


def check_mtp(out: Path) -> None:
    """Reloads a saved MTP model and recomputes its reference from the files alone.

    transformers must load the folder (reporting the MTP keys as unexpected and nothing
    missing) and reproduce `logits`; an MTP layer filled from a second, independent read
    of the safetensors files (per-expert weights fused by hand) must reproduce
    `mtp_hidden` and `mtp_logits` exactly."""
    reference = {}
    with safe_open(out / "reference.safetensors", "pt") as f:
        for key in f.keys():
            reference[key] = f.get_tensor(key)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, attn_implementation="eager", output_loading_info=True
    )
    model.eval()
    config = model.config
    layer = config.num_hidden_layers
    prefix = f"model.layers.{layer}."
    assert not info["missing_keys"], info["missing_keys"]
    assert info["unexpected_keys"] and all(
        key.startswith(prefix) for key in info["unexpected_keys"]
    ), info["unexpected_keys"]

    stored = read_checkpoint(out)
    own = {k[len(prefix) :]: v for k, v in stored.items() if k.startswith(prefix)}
    assert torch.equal(own["embed_tokens.weight"], stored["model.embed_tokens.weight"])
    assert torch.equal(own["shared_head.head.weight"], stored["lm_head.weight"])
    # The file keeps one tensor per expert; transformers' module fuses them.
    experts = config.n_routed_experts
    expert = "mlp.experts.{}.{}.weight"
    own["mlp.experts.gate_up_proj"] = torch.stack(
        [
            torch.cat([own.pop(expert.format(e, proj)) for proj in ("gate_proj", "up_proj")])
            for e in range(experts)
        ]
    )
    own["mlp.experts.down_proj"] = torch.stack(
        [own.pop(expert.format(e, "down_proj")) for e in range(experts)]
    )
    mtp = mtp_layer(config, layer)
    mtp.load_state_dict(own, strict=True)

    with torch.no_grad():
        tokens = reference["tokens"]
        assert torch.equal(model(tokens).logits.float(), reference["logits"])
        mtp_hidden, mtp_logits = mtp_forward(model, mtp, tokens)
    assert torch.equal(mtp_hidden, reference["mtp_hidden"])
    assert torch.equal(mtp_logits, reference["mtp_logits"])
    assert mtp_logits.shape == (tokens.shape[0], tokens.shape[1] - 1, config.vocab_size)
    print(f"{out.name}: reloaded; logits and MTP reference reproduced from the files")


def build(name: str) -> None:
    make_config, save_options = MODELS[name]
    for attempt in range(50):
        seed = seed_of(name, attempt)
        torch.manual_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        config = make_config()
        config._attn_implementation = "eager"
        model = auto_class(config).from_config(config).eval()
        mtp = add_mtp_layer(model) if save_options.get("mtp") else None
        perturb(model, generator)
        if mtp is not None:
            share_mtp_weights(model, mtp)
        if config.model_type == "youtu" and config.pad_token_id is not None:
            # transformers' Youtu loader zeroes the padding token's embedding row of
            # whatever checkpoint it reads (its weight init runs on loaded weights):
            # the fixture holds the row every load ends with.
            with torch.no_grad():
                model.model.embed_tokens.weight[config.pad_token_id].zero_()
        dtype = save_options.get("dtype")
        if dtype is not None:
            # The reference is the f32 model whose weights went through the file's
            # dtype (parameters only: RoPE's inv_freq buffer stays exact).
            with torch.no_grad():
                for param in model.parameters():
                    param.copy_(param.to(dtype).to(torch.float32))

        # Text tokens only: a multimodal model's image tokens sit at the top of its
        # vocabulary.
        top = min(
            [config.get_text_config().vocab_size]
            + [
                getattr(config, key)
                for key in (
                    "boi_token_index", "image_token_index", "audio_token_id",
                    "vision_end_token_id",
                )
                if hasattr(config, key)
            ]
        )
        tokens = torch.randint(3, top, (BATCH, SEQ), generator=generator)
        gaps = RouterGaps(model, config)
        with torch.no_grad():
            logits = text_runner(model)(tokens).logits.float()
            greedy, steps = greedy_with_cache(text_runner(model), tokens, NEW_TOKENS)
            # The MTP layer's router is hooked too (it is one of model.model.layers).
            if mtp is not None:
                mtp_hidden, mtp_logits = mtp_forward(model, mtp, tokens)
        gaps.close()
        logit_gap = gap(steps.reshape(-1, steps.shape[-1]), 1)
        full_gap = gap(logits.reshape(-1, logits.shape[-1]), 1)
        if mtp is not None:
            full_gap = min(full_gap, gap(mtp_logits.reshape(-1, mtp_logits.shape[-1]), 1))
        if min(logit_gap, full_gap) < MIN_LOGIT_GAP or gaps.smallest < MIN_ROUTER_GAP:
            print(
                f"{name}: seed {seed} has near ties (logits {min(logit_gap, full_gap):.2e}, "
                f"router {gaps.smallest:.2e}); redrawing"
            )
            continue
        break
    else:
        raise SystemExit(f"{name}: no seed without near ties")

    out = OUT_DIR / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    to_save = model.to(dtype) if dtype is not None else model
    to_save.save_pretrained(out, max_shard_size=save_options.get("max_shard_size", "50MB"))
    # transformers writes a generation_config.json we do not read.
    (out / "generation_config.json").unlink(missing_ok=True)
    if save_options.get("sparse_text_config"):
        sparse_text_config(out)
    reference = {
        "tokens": tokens.to(torch.int64).contiguous(),
        "logits": logits.contiguous(),
        "greedy": greedy.to(torch.int64).contiguous(),
    }
    if mtp is not None:
        reference["mtp_hidden"] = mtp_hidden.contiguous()
        reference["mtp_logits"] = mtp_logits.contiguous()
    save_file(
        reference,
        out / "reference.safetensors",
        metadata={
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "seed": str(seed),
        },
    )
    (out / "input.json").write_text(
        json.dumps({"tokens": tokens.tolist(), "max_new_tokens": NEW_TOKENS}) + "\n"
    )
    for file in out.iterdir():
        if file.stat().st_size >= 200 * 1024:
            raise SystemExit(f"{name}: {file.name} is {file.stat().st_size} bytes (>= 200 KiB)")
    if mtp is not None:
        check_mtp(out)
    size = sum(f.stat().st_size for f in out.iterdir())
    print(
        f"{name}: seed {seed}, logit gap {min(logit_gap, full_gap):.2e}, router gap "
        f"{gaps.smallest:.2e}, {size / 1024:.0f} KiB, files {sorted(f.name for f in out.iterdir())}"
    )


# PEFT LoRA adapters over saved base fixtures: name -> (base fixture, LoraConfig arguments
# beyond task_type CAUSAL_LM / lora_dropout 0 / bias "none", std of the random lora_B).
LORA_ADAPTERS = {
    "llama_lora": (
        "llama",
        dict(
            r=4,
            lora_alpha=8,
            target_modules=[
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ],
        ),
        0.003,
    ),
    # Phi-3's fused projections: one adapter on qkv_proj and one on gate_up_proj.
    "phi3_lora": (
        "phi3",
        dict(r=2, lora_alpha=6, target_modules=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),
        0.01,
    ),
    # Phi's names of the output projection (`dense`) and its ungated feed-forward's
    # (`fc1`, `fc2`, ours too).
    "phi_lora": (
        "phi",
        dict(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj", "dense", "fc1", "fc2"]),
        0.01,
    ),
    # GPT-2's Conv1D layers (PEFT sets fan_in_fan_out): the fused `c_attn`, and
    # `mlp.c_proj` but not the attention's `c_proj`.
    "gpt2_lora": (
        "gpt2",
        dict(r=2, lora_alpha=4, target_modules=["c_attn", "mlp.c_proj", "c_fc"], fan_in_fan_out=True),
        0.01,
    ),
    # GPT-NeoX's q, k and v fused head by head in `query_key_value`, its output
    # projection `dense` and feed-forward `dense_4h_to_h`.
    "gpt_neox_lora": (
        "gpt_neox",
        dict(r=2, lora_alpha=4, target_modules=["query_key_value", "attention.dense", "dense_4h_to_h"]),
        0.01,
    ),
    # Falcon's q, k and v fused group by group (4 query heads in 2 groups).
    "falcon_lora": (
        "falcon",
        dict(r=2, lora_alpha=4, target_modules=["query_key_value", "dense_h_to_4h"]),
        0.01,
    ),
    # BLOOM's q, k and v fused head by head (PEFT's default target for BLOOM).
    "bloom_lora": (
        "bloom",
        dict(r=2, lora_alpha=4, target_modules=["query_key_value", "dense_4h_to_h"]),
        0.01,
    ),
    # CodeGen's q, k and v fused in four blocks of q, v, k rows (PEFT's default target
    # for CodeGen) and the feed-forward's first layer.
    "codegen_lora": (
        "codegen",
        dict(r=2, lora_alpha=4, target_modules=["qkv_proj", "fc_in"]),
        0.01,
    ),
    # MPT's q, k and v fused one after the other in `Wqkv` (PEFT's default target for
    # MPT), its output projection and the feed-forward's first layer.
    "mpt_lora": (
        "mpt",
        dict(r=2, lora_alpha=4, target_modules=["Wqkv", "out_proj", "up_proj"]),
        0.01,
    ),
    # GPT-J's and OPT's names of the output projection (`out_proj`) and feed-forward.
    "gptj_lora": (
        "gptj",
        dict(r=2, lora_alpha=4, target_modules=["q_proj", "out_proj", "fc_in"]),
        0.01,
    ),
    "opt_lora": (
        "opt",
        dict(r=2, lora_alpha=4, target_modules=["v_proj", "out_proj", "fc2"]),
        0.01,
    ),
    # Qwen3.5's hybrid layers: the Gated DeltaNet's projections (`linear_attn.in_proj_qkv`,
    # `in_proj_z`, `in_proj_b`, `out_proj`) beside the gated attention's (`q_proj`, twice
    # as wide for its gate) and the feed-forward's.
    "qwen3_5_lora": (
        "qwen3_5_text",
        dict(
            r=2,
            lora_alpha=4,
            target_modules=["in_proj_qkv", "in_proj_z", "in_proj_b", "out_proj", "q_proj", "down_proj"],
        ),
        0.01,
    ),
    # An ungated feed-forward's `up_proj` / `down_proj` (our `fc1` / `fc2`).
    "nemotron_lora": (
        "nemotron",
        dict(r=2, lora_alpha=4, target_modules=["k_proj", "o_proj", "up_proj", "down_proj"]),
        0.01,
    ),
    # With transformers 5, PEFT turns gate_proj / up_proj / down_proj into
    # `target_parameters` on the fused routed experts (gate_up_proj with rank and alpha
    # doubled) and drops them from `target_modules`, so the dense MLP of layer 0 and the
    # shared experts get no adapter; see `check_lora_files` and tools/README.md.
    "deepseek_v3_lora": (
        "deepseek_v3",
        dict(
            r=2,
            lora_alpha=4,
            use_rslora=True,
            target_modules=[
                "q_a_proj",
                "q_b_proj",
                "kv_a_proj_with_mqa",
                "kv_b_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ],
        ),
        0.0005,
    ),
}
# Largest accepted difference between the PEFT model's logits and those of the merged
# model, or of the base model with the file's adapter applied by hand.
LORA_TOLERANCE = 1e-5
# The hybrid models' f32 logits move by more under any reordering of their sums (the
# `qwen3_5_text` fixture's f32 logits differ from its f64 ones by 2.4e-5).
HYBRID_LORA_TOLERANCE = 5e-5


def lora_tolerance(name: str) -> float:
    return HYBRID_LORA_TOLERANCE if name == "qwen3_5_lora" else LORA_TOLERANCE


def auto_class(config):
    """The auto class that builds `config`'s model with its language-model head:
    `AutoModelForCausalLM`, or for a multimodal model it does not map (Mistral-3) or
    maps to its text model (Llama 4, Qwen3.5) `AutoModelForImageTextToText`."""
    causal = transformers.AutoModelForCausalLM
    # `AutoModelForCausalLM` maps Llama 4's and Qwen3.5's multimodal configs to their
    # text-only classes.
    text_only = (transformers.Llama4Config, transformers.Qwen3_5Config, transformers.Qwen3_5MoeConfig)
    if type(config) in causal._model_mapping and not isinstance(config, text_only):
        return causal
    return transformers.AutoModelForImageTextToText


def load_base(folder: Path):
    """A saved fixture model in float32 with eager attention, in eval mode."""
    config = transformers.AutoConfig.from_pretrained(folder)
    return auto_class(config).from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(path, "pt") as f:
        return {key: f.get_tensor(key) for key in f.keys()}


def lora_scale(config: dict, target: str, rank: int) -> float:
    """PEFT's scaling of one adapted module or parameter: alpha / r, or alpha / sqrt(r)
    with `use_rslora`; alpha from the first `alpha_pattern` regex that matches the
    target's full name, else `lora_alpha`."""
    alpha = config["lora_alpha"]
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.fullmatch(pattern, target):
            alpha = value
            break
    return alpha / math.sqrt(rank) if config["use_rslora"] else alpha / rank


def apply_adapter_by_hand(model, folder: Path) -> list[str]:
    """Adds the adapter in `folder` to `model`'s weights, from the files alone.

    Keys are `base_model.model.<module>.lora_A.weight` / `.lora_B.weight`. For an
    `nn.Linear` (weight [out, in]): A [r, in], B [out, r], W += scale * B @ A; for
    GPT-2's `Conv1D` (weight [in, out]) the same factors, W += scale * (B @ A)ᵀ.
    For a targeted 3-D parameter of fused MoE experts (`target_parameters`, weight
    [E, out, in] in transformers 5), A is [E * r, in] with expert-major rows and B is
    [out, r * E] with expert-minor columns:
        W[e] += scale * B.view(out, r, E)[:, :, e] @ A.view(E, r, in)[e].
    Several parameters of one module nest: `<module>.base_layer.lora_A` adapts the one
    registered first (`gate_up_proj`), `<module>.lora_A` the next (`down_proj`).
    Returns the names of the adapted parameters."""
    config = json.loads((folder / "adapter_config.json").read_text())
    weights = read_safetensors(folder / "adapter_model.safetensors")
    targeted = set(config.get("target_parameters") or [])
    adapted = []
    with torch.no_grad():
        for key in sorted(k for k in weights if k.endswith(".lora_A.weight")):
            a = weights[key]
            b = weights[key.replace(".lora_A.", ".lora_B.")]
            path = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            depth = 0
            while path.endswith(".base_layer"):
                path, depth = path.removesuffix(".base_layer"), depth + 1
            module = model.get_submodule(path)
            if isinstance(module, torch.nn.Linear):
                name, weight = f"{path}.weight", module.weight
                rank = a.shape[0]
                delta = b @ a
            elif type(module).__name__ == "Conv1D":
                # GPT-2's Conv1D stores its weight [in, out]; A and B keep Linear's layout.
                name, weight = f"{path}.weight", module.weight
                rank = a.shape[0]
                delta = (b @ a).t()
            else:
                params = [n for n, _ in module.named_parameters(recurse=False) if n in targeted]
                param = params[len(params) - 1 - depth]
                name, weight = f"{path}.{param}", getattr(module, param)
                experts, out, inp = weight.shape
                rank = a.shape[0] // experts
                delta = torch.einsum(
                    "ore,eri->eoi", b.view(out, rank, experts), a.view(experts, rank, inp)
                )
            assert delta.shape == weight.shape, (key, delta.shape, weight.shape)
            weight.add_(lora_scale(config, name, rank) * delta)
            adapted.append(name)
    assert len(adapted) * 2 == len(weights), sorted(weights)
    return adapted


def check_lora_files(name: str, base: Path, out: Path) -> None:
    """Recomputes the reference from the saved files: PEFT's own loader must reproduce
    `logits` exactly, and the adapter applied by hand (`apply_adapter_by_hand`) within
    `lora_tolerance`; the base model alone gives `base_logits` exactly."""
    from peft import PeftModel

    reference = read_safetensors(out / "reference.safetensors")
    tokens = reference["tokens"]
    with torch.no_grad():
        peft_model = PeftModel.from_pretrained(load_base(base), out).eval()
        assert torch.equal(peft_model(tokens).logits.float(), reference["logits"])
        model = load_base(base)
        assert torch.equal(model(tokens).logits.float(), reference["base_logits"])
        adapted = apply_adapter_by_hand(model, out)
        by_hand = (model(tokens).logits.float() - reference["logits"]).abs().max().item()
    assert by_hand <= lora_tolerance(name), by_hand
    layer0 = sorted(n.removeprefix("model.layers.0.") for n in adapted if ".layers.0." in n)
    layer1 = sorted(n.removeprefix("model.layers.1.") for n in adapted if ".layers.1." in n)
    print(
        f"{name}: reloaded with PEFT (logits reproduced), applied by hand "
        f"(max |Δ| {by_hand:.1e}); adapted in layer 0: {layer0}; layer 1: {layer1}"
    )


def build_lora(name: str) -> None:
    """A PEFT LoRA adapter with random A and B over the saved base fixture (see the
    module docstring)."""
    from peft import LoraConfig, __version__ as peft_version, get_peft_model

    base_name, lora_options, b_std = LORA_ADAPTERS[name]
    base = OUT_DIR / base_name
    base_reference = read_safetensors(base / "reference.safetensors")
    tokens = base_reference["tokens"]
    for attempt in range(50):
        seed = seed_of(name, attempt)
        generator = torch.Generator().manual_seed(seed)
        model = load_base(base)
        config = model.config
        lora_config = LoraConfig(
            task_type="CAUSAL_LM", lora_dropout=0.0, bias="none", **lora_options
        )
        peft_model = get_peft_model(model, lora_config).eval()
        with torch.no_grad():
            for param_name, param in peft_model.named_parameters():
                if ".lora_A." in param_name:
                    fan_in = param.shape[-1]
                    std = 1.0 / math.sqrt(fan_in)
                elif ".lora_B." in param_name:
                    std = b_std
                else:
                    continue
                param.copy_(torch.randn(param.shape, generator=generator) * std)
        gaps = RouterGaps(peft_model, config)
        with torch.no_grad():
            logits = peft_model(tokens).logits.float()
            greedy, steps = greedy_with_cache(peft_model, tokens, NEW_TOKENS)
        gaps.close()
        logit_gap = min(
            gap(steps.reshape(-1, steps.shape[-1]), 1),
            gap(logits.reshape(-1, logits.shape[-1]), 1),
        )
        if logit_gap < MIN_LOGIT_GAP or gaps.smallest < MIN_ROUTER_GAP:
            print(
                f"{name}: seed {seed} has near ties (logits {logit_gap:.2e}, "
                f"router {gaps.smallest:.2e}); redrawing"
            )
            continue
        break
    else:
        raise SystemExit(f"{name}: no seed without near ties")

    with torch.no_grad():
        with peft_model.disable_adapter():
            base_logits = peft_model(tokens).logits.float()
    # Not bit for bit: the base reference came from the model before it was saved.
    moved = (base_logits - base_reference["logits"]).abs().max().item()
    assert moved <= lora_tolerance(name), f"{name}: base logits moved by {moved:.1e}"
    change = (logits - base_logits).abs().max().item()
    assert change > 1e-3, f"{name}: the adapter changes the logits by only {change:.1e}"

    out = OUT_DIR / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    peft_model.save_pretrained(out)
    # PEFT's model card carries nothing we read.
    (out / "README.md").unlink(missing_ok=True)
    # PEFT writes the path the base was loaded from and its sets in hash order.
    adapter_config = json.loads((out / "adapter_config.json").read_text())
    adapter_config["base_model_name_or_path"] = f"../{base_name}"
    for key in ("target_modules", "target_parameters"):
        if isinstance(adapter_config.get(key), list):
            adapter_config[key] = sorted(adapter_config[key])
    (out / "adapter_config.json").write_text(
        json.dumps(adapter_config, indent=2, sort_keys=True) + "\n"
    )
    adapter = read_safetensors(out / "adapter_model.safetensors")
    assert all(t.dtype == torch.float32 for t in adapter.values())
    with safe_open(out / "adapter_model.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt"}, f.metadata()

    with torch.no_grad():
        merged_logits = peft_model.merge_and_unload()(tokens).logits.float()
    merge_error = (merged_logits - logits).abs().max().item()
    assert merge_error <= lora_tolerance(name), f"{name}: merged logits differ by {merge_error:.1e}"

    save_file(
        {
            "tokens": tokens.to(torch.int64).contiguous(),
            "logits": logits.contiguous(),
            "merged_logits": merged_logits.contiguous(),
            "base_logits": base_logits.contiguous(),
            "greedy": greedy.to(torch.int64).contiguous(),
        },
        out / "reference.safetensors",
        metadata={
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "peft": peft_version,
            "seed": str(seed),
        },
    )
    shutil.copyfile(base / "input.json", out / "input.json")
    for file in out.iterdir():
        if file.stat().st_size >= 200 * 1024:
            raise SystemExit(f"{name}: {file.name} is {file.stat().st_size} bytes (>= 200 KiB)")
    check_lora_files(name, base, out)
    size = sum(f.stat().st_size for f in out.iterdir())
    print(
        f"{name}: seed {seed}, logits vs base max |Δ| {change:.2e}, merged vs unmerged "
        f"{merge_error:.1e}, logit gap {logit_gap:.2e}, router gap {gaps.smallest:.2e}, "
        f"{size / 1024:.0f} KiB, files {sorted(f.name for f in out.iterdir())}"
    )


TOKENIZER_TEXTS = [
    "Hello, world! Transformers generate text one token at a time.",
    "Burn runs the same model on flex, ndarray and wgpu.",
    "Ünïcödé and emoji 🦀 survive a byte-level round trip.",
]


def build_tokenizer() -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = TOKENIZER_TEXTS * 20 + [
        "the quick brown fox jumps over the lazy dog " * 5,
        "a model, a cache, a token; the attention sees the past.",
    ]
    tokenizer.train_from_iterator(corpus, trainer)
    out = OUT_DIR / "tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    cases = [
        {"text": text, "ids": tokenizer.encode(text).ids}
        for text in TOKENIZER_TEXTS + ["an unseen sentence, zebra-quartz!"]
    ]
    for case in cases:
        assert tokenizer.decode(case["ids"]) == case["text"], case
    (out / "cases.json").write_text(json.dumps(cases, ensure_ascii=False, indent=1) + "\n")
    # A tiny llama over this vocabulary, so that the `generate` program can run on it.
    torch.manual_seed(seed_of("tokenizer", 0))
    generator = torch.Generator().manual_seed(seed_of("tokenizer", 0))
    config = transformers.LlamaConfig(
        **{**COMMON, "vocab_size": tokenizer.get_vocab_size()},
        num_key_value_heads=2,
    )
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    perturb(model, generator)
    model.save_pretrained(out)
    (out / "generation_config.json").unlink(missing_ok=True)
    print(f"tokenizer: vocab {tokenizer.get_vocab_size()}, {len(cases)} cases, with a model")


# Beam searches of the saved `llama` fixture, one prompt at a time (no padding): beams,
# length penalty, repetition penalty, the token that ends a hypothesis (HF's
# eos_token_id; tokens the model often picks, so that some hypotheses end early).
BEAM_SETTINGS = [
    dict(num_beams=3, length_penalty=1.0, repetition_penalty=1.0, stop=16),
    dict(num_beams=4, length_penalty=0.5, repetition_penalty=1.3, stop=65),
    dict(num_beams=2, length_penalty=2.0, repetition_penalty=0.8, stop=95),
    dict(num_beams=3, length_penalty=1.0, repetition_penalty=1.5, stop=None),
]
BEAM_NEW_TOKENS = 8


def build_beams() -> None:
    """`hf/llama/beams.json`: transformers' best beam (tokens and score) per prompt and
    setting of BEAM_SETTINGS, with HF's default early stopping (False)."""
    folder = OUT_DIR / "llama"
    model = load_base(folder)
    prompts = json.loads((folder / "input.json").read_text())["tokens"]
    cases = []
    for setting in BEAM_SETTINGS:
        for prompt in prompts:
            with torch.no_grad():
                out = model.generate(
                    torch.tensor([prompt]),
                    max_new_tokens=BEAM_NEW_TOKENS,
                    do_sample=False,
                    num_beams=setting["num_beams"],
                    length_penalty=setting["length_penalty"],
                    repetition_penalty=setting["repetition_penalty"],
                    eos_token_id=setting["stop"],
                    pad_token_id=0,
                    return_dict_in_generate=True,
                    output_scores=True,
                )
            tokens = out.sequences[0, len(prompt):].tolist()
            cases.append(
                {
                    **setting,
                    "prompt": prompt,
                    "max_new_tokens": BEAM_NEW_TOKENS,
                    "tokens": tokens,
                    "score": float(out.sequences_scores[0]),
                }
            )
    (folder / "beams.json").write_text(json.dumps(cases, indent=1) + "\n")
    stopped = sum(1 for case in cases if case["stop"] in case["tokens"])
    print(f"llama_beams: {len(cases)} searches, {stopped} ended by their stop token")


def build_longrope_crossing() -> None:
    """`hf/phi3/crossing.json`: transformers' greedy and beam search (3 beams) on the
    `phi3` fixture from its prompts cut to 5 tokens, for 8 new tokens: the sequences
    grow past LongRoPE's original context (8), where Phi-3's `generate` rebuilds its
    cache with the long factors. The greedy tokens are checked against argmax decoding
    without a cache."""
    folder = OUT_DIR / "phi3"
    model = load_base(folder)
    prompts = [row[:5] for row in json.loads((folder / "input.json").read_text())["tokens"]]
    cases = []
    for prompt in prompts:
        row = {"prompt": prompt}
        for name, beams in [("greedy", 1), ("beams", 3)]:
            with torch.no_grad():
                out = model.generate(
                    torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8,
                    do_sample=False, num_beams=beams, eos_token_id=None, pad_token_id=0,
                )
            row[name] = out[0, len(prompt):].tolist()
        sequence = list(prompt)
        for _ in range(8):
            with torch.no_grad():
                sequence.append(int(model(torch.tensor([sequence])).logits[0, -1].argmax()))
        assert sequence[len(prompt):] == row["greedy"], (sequence, row)
        cases.append(row)
    (folder / "crossing.json").write_text(json.dumps(cases, indent=1) + "\n")
    print(f"longrope_crossing: {len(cases)} prompts")


# Settings of `generation_config.json` files whose logit processors `processors`
# records: greedy with a repetition penalty, sampling with transformers' default top-k
# (50), published checkpoints' choices, min-p, and warpers a greedy file ignores.
PROCESSOR_SETTINGS = [
    {"repetition_penalty": 1.3},
    {"do_sample": True},
    {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05},
    {"do_sample": True, "temperature": 0.6, "top_p": 0.9},
    {"do_sample": True, "top_k": 0, "min_p": 0.1, "temperature": 1.5},
    {"do_sample": True, "top_k": 64, "top_p": 0.95, "min_p": 0.05, "temperature": 0.8,
     "repetition_penalty": 0.9},
    {"do_sample": True, "top_k": 5, "temperature": 2.0},
    {"do_sample": True, "top_k": 0, "top_p": 0.5},
    {"do_sample": False, "temperature": 0.6, "top_p": 0.9},
]
PROCESSOR_VOCAB, PROCESSOR_ROWS = 64, 3


def build_processors() -> None:
    """`hf/processors.json`: for each setting of PROCESSOR_SETTINGS and a few random rows
    of logits with a token history, the logits after transformers' `generate` applies
    its processors (built by `_get_logits_processor` from the setting filled with
    transformers' global defaults, as `generate` fills a model's generation config).
    Removed tokens (`-inf`) are written as `null`."""
    model = load_base(OUT_DIR / "llama")
    generator = torch.Generator().manual_seed(seed_of("processors", 0))
    defaults = transformers.GenerationConfig._get_default_generation_params()
    cases = []
    for settings in PROCESSOR_SETTINGS:
        config = transformers.GenerationConfig(**settings)
        config.update(**defaults, defaults_only=True)
        for _ in range(PROCESSOR_ROWS):
            logits = torch.randn(1, PROCESSOR_VOCAB, generator=generator) * 2.5
            history = torch.randint(0, PROCESSOR_VOCAB, (1, 12), generator=generator)
            processors = model._get_logits_processor(
                generation_config=config, input_ids_seq_length=history.shape[1], model_kwargs={}
            )
            processed = processors(history, logits.clone())[0]
            cases.append(
                {
                    "generation_config": settings,
                    "history": history[0].tolist(),
                    "logits": logits[0].tolist(),
                    "processed": [None if math.isinf(x) else x for x in processed.tolist()],
                }
            )
    (OUT_DIR / "processors.json").write_text(json.dumps(cases, indent=1) + "\n")
    kept = [sum(x is not None for x in case["processed"]) for case in cases]
    print(f"processors: {len(cases)} rows, {min(kept)}-{max(kept)} of {PROCESSOR_VOCAB} tokens kept")


# `generation_config.json` files for the `tokenizer` model, each with the prompt that
# `generate_with_files` continues; `stop_at` picks an end-of-text token the greedy
# continuation reaches after that many tokens.
GENERATION_FILES = [
    ({"do_sample": False, "repetition_penalty": 1.4, "eos_token_id": 2}, 3),
    ({"do_sample": False, "num_beams": 3, "length_penalty": 0.7, "eos_token_id": 2}, None),
]
GENERATION_PROMPT = "the quick brown fox"
GENERATION_NEW_TOKENS = 10


def build_generation_files() -> None:
    """`hf/tokenizer/generation.json`: transformers' `generate` on the `tokenizer` model
    with a `generation_config.json` in its folder and no other setting, for each file of
    GENERATION_FILES: the file, the prompt's ids and the new tokens. A greedy file gets
    a second end-of-text token, the one its continuation reaches after `stop_at` tokens,
    so that the case ends early."""
    import tempfile

    from tokenizers import Tokenizer

    folder = OUT_DIR / "tokenizer"
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    prompt = tokenizer.encode(GENERATION_PROMPT).ids

    def generate(settings: dict) -> list[int]:
        with tempfile.TemporaryDirectory() as tmp:
            for name in ("config.json", "model.safetensors"):
                shutil.copy(folder / name, tmp)
            (Path(tmp) / "generation_config.json").write_text(json.dumps(settings))
            model = load_base(Path(tmp))
            with torch.no_grad():
                out = model.generate(torch.tensor([prompt]), max_new_tokens=GENERATION_NEW_TOKENS)
        return out[0, len(prompt):].tolist()

    cases = []
    for settings, stop_at in GENERATION_FILES:
        if stop_at is not None:
            tokens = generate(settings)
            first = [t for i, t in enumerate(tokens) if t not in tokens[:i]]
            stop = next(t for t in first if tokens.index(t) >= stop_at)
            settings = {**settings, "eos_token_id": [settings["eos_token_id"], stop]}
        tokens = generate(settings)
        cases.append({"generation_config": settings, "prompt": GENERATION_PROMPT,
                      "prompt_ids": prompt, "tokens": tokens})
    (folder / "generation.json").write_text(json.dumps(cases, indent=1) + "\n")
    print(f"generation files: {[len(case['tokens']) for case in cases]} new tokens")


def build_gradients() -> None:
    """`hf/gradients.json`: per saved model of MODELS, the next-token cross-entropy of
    its reference tokens (mean over the `batch × (seq − 1)` predictions, in float32,
    eager attention) and the Frobenius norm of its gradient for every parameter, named
    as transformers names the parameter in memory."""
    result = {}
    for name in MODELS:
        model = load_base(OUT_DIR / name)
        tokens = read_safetensors(OUT_DIR / name / "reference.safetensors")["tokens"]
        logits = text_runner(model)(tokens[:, :-1]).logits.float()
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
        )
        loss.backward()
        norms = {
            key: float(param.grad.double().norm())
            for key, param in model.named_parameters()
            if param.grad is not None
        }
        result[name] = {"loss": float(loss), "gradient_norms": norms}
    (OUT_DIR / "gradients.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"gradients: {len(result)} models")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    extras = ["llama_beams", "gradients", "processors", "generation_files", "longrope_crossing"]
    choices = [*MODELS, "tokenizer", *LORA_ADAPTERS, *extras]
    parser.add_argument("names", nargs="*", help=f"any of {', '.join(choices)}")
    args = parser.parse_args()
    # The adapters read their base fixtures from disk, so they come after them.
    names = args.names or [*MODELS, "tokenizer", *LORA_ADAPTERS, *extras]
    for name in names:
        if name == "tokenizer":
            build_tokenizer()
        elif name == "gradients":
            build_gradients()
        elif name == "llama_beams":
            build_beams()
        elif name == "processors":
            build_processors()
        elif name == "generation_files":
            build_generation_files()
        elif name == "longrope_crossing":
            build_longrope_crossing()
        elif name in MODELS:
            build(name)
        elif name in LORA_ADAPTERS:
            build_lora(name)
        else:
            sys.exit(f"unknown fixture {name}; choose from {', '.join(choices)}")


if __name__ == "__main__":
    main()
