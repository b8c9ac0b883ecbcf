#!/usr/bin/env python3
"""nanoGPT's CPU recipe for character-level Shakespeare, in plain PyTorch.

The reference point of `benches/src/bin/nanogpt.rs`: run both in the same session on
the same machine and compare time per iteration and the final validation loss.

Recipe (nanoGPT README, "I only have a macbook"): 4 layers, 4 heads, width 128,
context 64, batch 12, AdamW lr 1e-3 with 100 warm-up steps and cosine decay to 1e-4
over 2000 iterations, betas (0.9, 0.99), weight decay 0.1 on matrices, gradient
clipping 1.0, dropout 0, char-level tokens, 90/10 split, validation every 250 steps
on 20 batches.

--arch gpt   nanoGPT's GPT-2 model (LayerNorm, learned positions, GELU MLP 4x, tied
             embeddings) -- the published reference;
--arch llama the model train-lm builds (RMSNorm, RoPE, SwiGLU of width 352, tied
             embeddings) -- the same computation as ours, for a like-for-like time.

Usage (a venv with `pip install torch`): python benches/nanogpt_torch.py --data ../shared/data/tinyshakespeare.txt
Prints one line per validation and a final JSON line.
"""

import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, d, heads, rope):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(d, 3 * d, bias=False)
        self.c_proj = nn.Linear(d, d, bias=False)
        self.rope = rope

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.rope is not None:
            q, k = self.rope(q), self.rope(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))


class Rope(nn.Module):
    """Half-split rotary embedding (LLaMA / Hugging Face layout)."""

    def __init__(self, head_dim, max_len, theta=10000.0):
        super().__init__()
        inv = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.outer(torch.arange(max_len).float(), inv)
        emb = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x):
        t = x.shape[-2]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * self.cos[:t] + rotated * self.sin[:t]


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    def __init__(self, d, heads, arch, d_ff, rope):
        super().__init__()
        self.arch = arch
        if arch == "gpt":
            self.ln_1 = nn.LayerNorm(d, bias=False)
            self.ln_2 = nn.LayerNorm(d, bias=False)
            self.c_fc = nn.Linear(d, 4 * d, bias=False)
            self.c_proj = nn.Linear(4 * d, d, bias=False)
        else:
            self.ln_1 = RMSNorm(d)
            self.ln_2 = RMSNorm(d)
            self.gate = nn.Linear(d, d_ff, bias=False)
            self.up = nn.Linear(d, d_ff, bias=False)
            self.c_proj = nn.Linear(d_ff, d, bias=False)
        self.attn = CausalSelfAttention(d, heads, rope)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        h = self.ln_2(x)
        if self.arch == "gpt":
            h = self.c_proj(F.gelu(self.c_fc(h)))
        else:
            h = self.c_proj(F.silu(self.gate(h)) * self.up(h))
        return x + h


class Model(nn.Module):
    def __init__(self, vocab, d, layers, heads, context, arch, d_ff):
        super().__init__()
        self.arch = arch
        self.wte = nn.Embedding(vocab, d)
        rope = Rope(d // heads, context) if arch == "llama" else None
        self.wpe = nn.Embedding(context, d) if arch == "gpt" else None
        self.blocks = nn.ModuleList(Block(d, heads, arch, d_ff, rope) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, bias=False) if arch == "gpt" else RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        self.apply(self._init)
        if arch == "gpt":  # GPT-2's scaled residual projections
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, 0.02)

    def forward(self, idx, targets):
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="../shared/data/tinyshakespeare.txt")
    parser.add_argument("--arch", choices=["gpt", "llama"], default="gpt")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--eval-interval", type=int, default=250)
    parser.add_argument("--eval-iters", type=int, default=20)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    text = open(args.data, encoding="utf-8").read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n = int(0.9 * len(data))
    train, val = data[:n], data[n:]
    batch, context = 12, 64
    layers, heads, d, d_ff = 4, 4, 128, 352

    def get_batch(split):
        src = train if split == "train" else val
        ix = torch.randint(len(src) - context, (batch,))
        x = torch.stack([src[i : i + context] for i in ix])
        y = torch.stack([src[i + 1 : i + 1 + context] for i in ix])
        return x, y

    model = Model(len(chars), d, layers, heads, context, args.arch, d_ff)
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-3,
        betas=(0.9, 0.99),
    )
    warmup, lr_max, lr_min = 100, 1e-3, 1e-4

    def lr_at(it):
        if it < warmup:
            return lr_max * (it + 1) / (warmup + 1)
        if it >= args.iters:
            return lr_min
        ratio = (it - warmup) / (args.iters - warmup)
        return lr_min + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr_max - lr_min)

    @torch.no_grad()
    def estimate_val():
        model.eval()
        losses = [model(*get_batch("val")).item() for _ in range(args.eval_iters)]
        model.train()
        return sum(losses) / len(losses)

    train_seconds = 0.0
    last_val = None
    started = time.time()
    for it in range(args.iters):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(it)
        t0 = time.perf_counter()
        x, y = get_batch("train")
        loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss_value = loss.item()
        train_seconds += time.perf_counter() - t0
        if (it + 1) % args.eval_interval == 0 or it + 1 == args.iters:
            last_val = estimate_val()
            print(
                f"step {it + 1}: train loss {loss_value:.4f}, val loss {last_val:.4f}, "
                f"{1e3 * train_seconds / (it + 1):.1f} ms/iter",
                flush=True,
            )
    ms = 1e3 * train_seconds / args.iters
    result = {
        "bench": "nanogpt-shakespeare-char",
        "impl": f"pytorch-{args.arch}",
        "backend": f"torch {torch.__version__} cpu, {args.threads} threads",
        "iters": args.iters,
        "ms_per_iter": round(ms, 2),
        "tokens_per_s": round(batch * context / (ms / 1e3)),
        "val_loss": round(last_val, 4),
        "wall_s": round(time.time() - started, 1),
        "params": sum(p.numel() for p in params),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
