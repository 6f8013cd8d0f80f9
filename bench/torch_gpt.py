#!/usr/bin/env python3
"""The PyTorch baseline for the GPU training benchmark: the same GPT as megatrain's, trained on random tokens.

Model (as src/megatrain/model with the default config): GPT-2 layout, learned positions, pre-LayerNorm with bias,
fused qkv, GeLU (tanh), biases in every linear, final LayerNorm, LM head tied to wte, vocabulary 50257 padded to a
multiple of 64 (50304) like ModelConfig::padded_vocab(). Training as a strong PyTorch user would run it: bf16
autocast, torch.compile, F.scaled_dot_product_attention(is_causal=True) (flash attention), fused AdamW (lr 6e-4,
betas (0.9, 0.95), weight decay 0.1 on matrices), grad-norm clipping at 1.0 (as megatrain's configs).

Prints ONE JSON line (the megatrain side, bench/bench_gpu_train, prints the same keys):
  {"framework": "torch", "model", "B", "T", "tokens_per_s", "step_ms", "mfu", "gpu_memory_gb", "gpu", ...}
gpu_memory_gb is torch.cuda.max_memory_allocated() over the timed steps, in 1e9 bytes (the allocator's peak: it
excludes the CUDA context and cached-but-free blocks, so it reads a little lower than device memory in use).
tokens_per_s is B*T over the median step time of the timed steps (each step bracketed by torch.cuda.synchronize).
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# Presets: (n_layer, d_model, n_head, T). gpt2-124m is configs/gpt2-124m.toml's model; the others follow GPT-2
# medium and GPT-3 XL's shapes (1.3B with a 2048 context).
PRESETS = {
    "gpt2-124m": (12, 768, 12, 1024),
    "gpt2-350m": (24, 1024, 16, 1024),
    "gpt-1.3b": (24, 2048, 16, 2048),
}
VOCAB = 50257
VOCAB_PAD_TO = 64
H100_BF16_PEAK = 989e12  # dense bf16 tensor-core FLOP/s of an H100 SXM


def padded_vocab(v=VOCAB, m=VOCAB_PAD_TO):
    return (v + m - 1) // m * m


def flops_per_token(n_layer, d_model, n_head, T):
    """The same formula as ModelConfig::flops_per_token (src/megatrain/model/config.cpp), which train/metrics uses:
         6 * (n_layer * (qkv*C + C*C + F*C + C*F) + padded_vocab * C)      (matmul params: fwd + bwd = 6 FLOP/param)
       + 12 * n_layer * n_head * head_dim * T                                (attention scores and weighted sum)
    with C = d_model, qkv = 3C (no GQA), F = 4C (GeLU MLP); embeddings' lookups are not counted, the LM head is."""
    C = d_model
    hd = C // n_head
    qkv = 3 * n_head * hd
    Fw = 4 * C
    per_layer = qkv * C + C * n_head * hd + Fw * C + C * Fw
    n_matmul = n_layer * per_layer + padded_vocab() * C
    return 6.0 * n_matmul + 12.0 * n_layer * n_head * hd * T


class Block(nn.Module):
    def __init__(self, C, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        shape = (B, T, self.n_head, C // self.n_head)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, n_layer, d_model, n_head, T):
        super().__init__()
        self.wte = nn.Embedding(padded_vocab(), d_model)
        self.wpe = nn.Embedding(T, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model, eps=1e-5)
        self.lm_head = nn.Linear(d_model, padded_vocab(), bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(PRESETS), default="gpt2-124m")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=0, help="sequence length (default: the preset's)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps (the first compiles)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--peak-flops", type=float, default=H100_BF16_PEAK)
    args = ap.parse_args()

    if not torch.cuda.is_available():
        sys.exit("torch_gpt.py: no CUDA device")
    n_layer, d_model, n_head, T_preset = PRESETS[args.model]
    T = args.seq or T_preset
    B = args.batch
    dev = torch.device("cuda")
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    model = GPT(n_layer, d_model, n_head, T).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    step_fn = model if args.no_compile else torch.compile(model)

    def step():
        idx = torch.randint(0, VOCAB, (B, T), device=dev)
        targets = torch.randint(0, VOCAB, (B, T), device=dev)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = step_fn(idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    loss = None
    for _ in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)

    step_s = statistics.median(times)
    tok_s = B * T / step_s
    fpt = flops_per_token(n_layer, d_model, n_head, T)
    print(json.dumps({
        "framework": "torch",
        "model": args.model,
        "B": B,
        "T": T,
        "tokens_per_s": round(tok_s, 1),
        "step_ms": round(1000 * step_s, 3),
        "mfu": round(tok_s * fpt / args.peak_flops, 4),
        "gpu_memory_gb": round(torch.cuda.max_memory_allocated() / 1e9, 3),
        "params": sum(p.numel() for p in model.parameters()),
        "flops_per_token": fpt,
        "peak_flops": args.peak_flops,
        "loss": round(float(loss), 4),
        "steps": args.steps,
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "compiled": not args.no_compile,
    }))


if __name__ == "__main__":
    main()
