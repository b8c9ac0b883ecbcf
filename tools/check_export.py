#!/usr/bin/env python3
"""Check that Hugging Face transformers loads a model folder exported by burn-transformer
and computes the same logits and greedy continuation as our `hf-logits` program.

    /work/venv/bin/python tools/check_export.py EXPORT_DIR OURS.safetensors \\
        --input INPUT.json [--tolerance 1e-4]

- EXPORT_DIR: a folder `AutoModelForCausalLM.from_pretrained` can read (or, for the
  text models transformers maps only there, `AutoModelForImageTextToText`; `config.json`,
  `model.safetensors` or shards with their index). It is loaded in float32 whatever
  dtype its weights are stored in, with eager attention, on the CPU.
- INPUT.json: `{"tokens": [[...], ...], "max_new_tokens": n}`, rows of equal length.
- OURS.safetensors: what `hf-logits` writes for that input: `logits` f32
  [batch, seq, vocab] (one full forward pass of the tokens) and `greedy` i64 [batch, n]
  (argmax decoding through the KV cache, no stop token); `tokens`, if present, must
  equal the input's.

transformers' greedy continuation is `model.generate(do_sample=False,
max_new_tokens=n, min_new_tokens=n)` under a fresh `GenerationConfig` with no EOS token
(so nothing stops or masks it, and no `generation_config.json` of the folder adds
penalties or other logits processors); the script also runs its own argmax loop through
transformers' KV cache and reports if the two disagree.

Prints the model class, the dtype the folder stores (config and weight files), loading
problems, max |Δlogits| and where it occurs, and whether the greedy tokens are equal (at
the first difference: both tokens and transformers' logits for them, to tell a near tie
from a bug). Exits 0 when max |Δlogits| <= tolerance, the greedy tokens are equal and
transformers found every weight it needs; 1 otherwise; 2 on bad arguments or inputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import transformers
from safetensors import safe_open


def fail_usage(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def stored_dtypes(folder: Path) -> list[str]:
    """The dtypes of the tensors in the folder's safetensors weight files."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        files = [p.name for p in sorted(folder.glob("model*.safetensors"))]
    dtypes = set()
    for file in files:
        with safe_open(folder / file, "pt") as f:
            for key in f.keys():
                dtypes.add(f.get_slice(key).get_dtype())
    return sorted(dtypes)


def config_dtype(folder: Path) -> str | None:
    raw = json.loads((folder / "config.json").read_text())
    return raw.get("dtype", raw.get("torch_dtype"))


def manual_greedy(model, tokens: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Argmax decoding through transformers' KV cache, one token at a time."""
    output = model(tokens, use_cache=True)
    cache, logits, chosen = output.past_key_values, output.logits[:, -1].float(), []
    for _ in range(new_tokens):
        token = logits.argmax(-1, keepdim=True)
        chosen.append(token)
        output = model(token, past_key_values=cache, use_cache=True)
        cache, logits = output.past_key_values, output.logits[:, -1].float()
    return torch.cat(chosen, 1)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("export_dir", type=Path, help="folder written by our exporter")
    parser.add_argument("ours", type=Path, help="safetensors file written by hf-logits")
    parser.add_argument("--input", type=Path, required=True, help="hf-logits input JSON")
    parser.add_argument(
        "--tolerance", type=float, default=1e-4, help="largest accepted max |Δlogits|"
    )
    parser.add_argument(
        "--peft-base",
        type=Path,
        help="EXPORT_DIR holds LoRA adapters (export-hf --adapters-only): load this base "
        "model folder and the adapters on top with peft",
    )
    args = parser.parse_args()

    if args.peft_base is None and not (args.export_dir / "config.json").is_file():
        fail_usage(f"{args.export_dir} has no config.json")
    if args.peft_base is not None and not (args.export_dir / "adapter_config.json").is_file():
        fail_usage(f"{args.export_dir} has no adapter_config.json")
    request = json.loads(args.input.read_text())
    try:
        tokens = torch.tensor(request["tokens"], dtype=torch.int64)
        new_tokens = int(request["max_new_tokens"])
    except (KeyError, ValueError, TypeError) as error:
        fail_usage(f"{args.input}: expected tokens (equal-length rows) and max_new_tokens: {error}")
    if tokens.dim() != 2:
        fail_usage(f"{args.input}: tokens must be [batch, seq], got shape {list(tokens.shape)}")
    with safe_open(args.ours, "pt") as f:
        ours = {key: f.get_tensor(key) for key in f.keys()}
    for key in ("logits", "greedy"):
        if key not in ours:
            fail_usage(f"{args.ours} has no `{key}` (it holds {sorted(ours)})")

    # transformers maps a few text models only under the image-text auto class (Mistral-4,
    # the text model of Mistral-Small-4's multimodal checkpoints).
    auto_config = transformers.AutoConfig.from_pretrained(args.peft_base or args.export_dir)
    auto = transformers.AutoModelForCausalLM
    if type(auto_config) not in auto._model_mapping:
        auto = transformers.AutoModelForImageTextToText
    model, info = auto.from_pretrained(
        args.peft_base or args.export_dir,
        dtype=torch.float32,
        attn_implementation="eager",
        output_loading_info=True,
    )
    if args.peft_base is not None:
        import peft

        model = peft.PeftModel.from_pretrained(model, args.export_dir)
        print(f"adapters: {args.export_dir} loaded by peft {peft.__version__} on {args.peft_base}")
    model.eval()
    config = model.config
    print(f"model: {type(model).__name__} (model_type {config.model_type})")
    weights_dir = args.peft_base or args.export_dir
    print(
        f"stored dtype: config {config_dtype(weights_dir)}, weight files "
        f"{', '.join(stored_dtypes(weights_dir))}; compared in float32"
    )

    problems = []
    for kind in ("missing_keys", "mismatched_keys", "error_msgs"):
        entries = info.get(kind) or []
        if entries:
            shown = sorted(str(e) for e in entries)
            problems.append(f"{kind} ({len(shown)}): {shown[:8]}{' ...' if len(shown) > 8 else ''}")
    unexpected = sorted(info.get("unexpected_keys") or [])
    if unexpected:
        print(
            f"note: transformers ignores {len(unexpected)} key(s) of the checkpoint: "
            f"{unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}"
        )
    for problem in problems:
        print(f"loading: {problem}")

    if "tokens" in ours and not torch.equal(ours["tokens"].to(torch.int64), tokens):
        problems.append(f"{args.ours}'s tokens are not {args.input}'s")
        print(f"tokens: {args.ours}'s tokens differ from {args.input}'s")

    with torch.no_grad():
        logits = model(tokens).logits.float()
    our_logits = ours["logits"].float()
    if our_logits.shape != logits.shape:
        problems.append(
            f"logits shape: ours {list(our_logits.shape)}, transformers {list(logits.shape)}"
        )
        print(f"logits: shapes differ, ours {list(our_logits.shape)}, transformers {list(logits.shape)}")
        max_diff = float("inf")
    else:
        diff = (our_logits - logits).abs()
        max_diff = diff.max().item()
        where = [int(i) for i in torch.unravel_index(diff.argmax(), diff.shape)]
        scale = logits.abs().max().item()
        print(
            f"logits: max |Δ| {max_diff:.3e} at [batch, position, token] {where} "
            f"(max |logit| {scale:.3f}, tolerance {args.tolerance:.1e})"
        )
        if not max_diff <= args.tolerance:
            problems.append(f"max |Δlogits| {max_diff:.3e} > tolerance {args.tolerance:.1e}")

    pad = config.pad_token_id if config.pad_token_id is not None else 0
    # A clean generation config: no EOS (nothing stops, nothing masks it) and none of the
    # folder's generation_config.json (penalties and the like).
    model.generation_config = transformers.GenerationConfig(
        do_sample=False, num_beams=1, eos_token_id=None, pad_token_id=pad
    )
    with torch.no_grad():
        generated = model.generate(
            tokens,
            attention_mask=torch.ones_like(tokens),
            do_sample=False,
            num_beams=1,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            eos_token_id=None,
            pad_token_id=pad,
            return_dict_in_generate=True,
            output_logits=True,
        )
        greedy = generated.sequences[:, tokens.shape[1] :]
        step_logits = torch.stack(generated.logits, 1).float()  # [batch, n, vocab]
        looped = manual_greedy(model, tokens, new_tokens)
    if not torch.equal(looped, greedy):
        print(
            f"note: transformers' generate {greedy.tolist()} and its own argmax loop "
            f"{looped.tolist()} disagree; comparing with generate"
        )
    our_greedy = ours["greedy"].to(torch.int64)
    if our_greedy.shape != greedy.shape:
        problems.append(
            f"greedy shape: ours {list(our_greedy.shape)}, transformers {list(greedy.shape)}"
        )
        print(f"greedy: shapes differ, ours {list(our_greedy.shape)}, transformers {list(greedy.shape)}")
    elif torch.equal(our_greedy, greedy):
        print(f"greedy: equal ({new_tokens} tokens per row) {greedy.tolist()}")
    else:
        problems.append("greedy tokens differ")
        print("greedy: DIFFERENT")
        for row in range(greedy.shape[0]):
            mismatch = (our_greedy[row] != greedy[row]).nonzero()
            if len(mismatch) == 0:
                continue
            step = int(mismatch[0])
            ours_token, theirs_token = int(our_greedy[row, step]), int(greedy[row, step])
            step_row = step_logits[row, step]
            print(
                f"  row {row}: first difference at step {step}: ours {ours_token}, transformers "
                f"{theirs_token}; transformers' logits there {step_row[ours_token].item():.6f} vs "
                f"{step_row[theirs_token].item():.6f} (gap "
                f"{(step_row[theirs_token] - step_row[ours_token]).item():.2e})"
            )
            print(f"    ours         {our_greedy[row].tolist()}")
            print(f"    transformers {greedy[row].tolist()}")

    if problems:
        print("FAIL: " + "; ".join(problems))
        return 1
    print("OK: transformers reproduces our logits and greedy tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
