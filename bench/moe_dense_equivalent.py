#!/usr/bin/env python3
"""The dense model that matches a MoE config's active parameters per token (bench/moe_vs_dense.sh).

Same d_model, layers, heads, norm, positions and vocabulary; every layer a dense MLP (model.mlp) of one width d_ff,
chosen so that the dense model's MLP weights touched per token equal the MoE model's: on a MoE layer the router
(E x C) plus the top_k routed and the shared experts (3 x C x moe_d_ff each, SwiGLU), on its dense layers their MLP
(model.d_ff). When every layer is MoE this is the MoE layer's active width, (top_k + shared) x moe_d_ff + E/3 for a
SwiGLU; with dense layers in between it is the mean over the layers, since one d_ff serves them all.

Prints JSON: the dense d_ff, and per model its parameters (as megatrain's ModelConfig::num_params counts them),
its active parameters per token (the MoE model less its unchosen routed experts) and its model FLOPs per token
(ModelConfig::flops_per_token: 6 x the matmul weights touched, plus attention).
    bench/moe_dense_equivalent.py configs/moe-tiny.toml [--seq-len T]
"""
import argparse
import json
import tomllib

DEFAULTS = {"vocab_size": 50257, "vocab_pad_to": 64, "n_layer": 12, "n_head": 12, "n_kv_head": 0, "d_model": 768,
            "d_ff": 0, "max_seq_len": 1024, "norm": "layernorm", "mlp": "gelu", "pos": "learned",
            "tied_embeddings": True, "bias": True, "window": 0, "block": "sequential", "moe_experts": 0,
            "moe_top_k": 2, "moe_d_ff": 0, "moe_shared_experts": 0, "moe_every": 1, "moe_first_dense": 0,
            "moe_router": "softmax"}


def ff_dim(m):
    if m["d_ff"] > 0:
        return m["d_ff"]
    return (8 * m["d_model"] // 3 + 63) // 64 * 64 if m["mlp"] == "swiglu" else 4 * m["d_model"]


def moe_layer(m, layer):
    return m["moe_experts"] > 0 and layer >= m["moe_first_dense"] and (layer - m["moe_first_dense"]) % m["moe_every"] == 0


def mlp_weights(m):
    """Weights of one dense MLP: SwiGLU has gate, up and down; GeLU up and down."""
    return (3 if m["mlp"] == "swiglu" else 2) * m["d_model"] * ff_dim(m)


def moe_weights(m, experts):
    """Weights of one MoE layer touched with `experts` routed experts (all of them: its parameters)."""
    router = m["moe_experts"] * m["d_model"] + (m["moe_experts"] if m["moe_router"] == "sigmoid_bias" else 0)
    return router + 3 * m["d_model"] * m["moe_d_ff"] * (experts + m["moe_shared_experts"])


def attention_weights(m):
    C, hd = m["d_model"], m["d_model"] // m["n_head"]
    kv = m["n_kv_head"] or m["n_head"]
    return (m["n_head"] + 2 * kv) * hd * C + C * m["n_head"] * hd


def summary(m, seq_len):
    """Parameters, active parameters per token and model FLOPs per token, as megatrain counts them."""
    C, L = m["d_model"], m["n_layer"]
    fc = 2 * ff_dim(m) if m["mlp"] == "swiglu" else ff_dim(m)
    nb = 2 if m["norm"] == "layernorm" and m["bias"] else 1
    norms = (1 if m["block"] == "parallel" else 2) * nb * C
    qkv = (m["n_head"] + 2 * (m["n_kv_head"] or m["n_head"])) * (C // m["n_head"])
    per_layer = attention_weights(m) + norms + ((qkv + C) if m["bias"] else 0)  # the MLP's biases go with it
    params = L * per_layer + m["vocab_size"] * C + nb * C
    active = params
    padded = (m["vocab_size"] + m["vocab_pad_to"] - 1) // m["vocab_pad_to"] * m["vocab_pad_to"]
    matmul = padded * C + L * attention_weights(m)
    for layer in range(L):
        if moe_layer(m, layer):
            params += moe_weights(m, m["moe_experts"])
            active += moe_weights(m, m["moe_top_k"])
            matmul += m["moe_experts"] * C + 3 * C * m["moe_d_ff"] * (m["moe_top_k"] + m["moe_shared_experts"])
        else:
            mlp = mlp_weights(m) + ((fc + C) if m["bias"] else 0)
            params += mlp
            active += mlp
            matmul += mlp_weights(m)
    if m["pos"] == "learned":
        params += m["max_seq_len"] * C
        active += m["max_seq_len"] * C
    if not m["tied_embeddings"]:
        params += m["vocab_size"] * C
        active += m["vocab_size"] * C
    ctx = m["window"] if 0 < m["window"] < seq_len else seq_len
    flops = 6.0 * matmul + 12.0 * L * m["n_head"] * (C // m["n_head"]) * ctx
    return {"params": params, "active_params_per_token": active, "flops_per_token": flops}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config")
    ap.add_argument("--seq-len", type=int, default=0, help="the context for the FLOPs (default: data.seq_len)")
    a = ap.parse_args()
    with open(a.config, "rb") as f:
        cfg = tomllib.load(f)
    m = dict(DEFAULTS, **cfg.get("model", {}))
    if m["moe_experts"] <= 0:
        raise SystemExit(f"{a.config}: not a MoE model (model.moe_experts = 0)")
    seq_len = a.seq_len or cfg.get("data", {}).get("seq_len", m["max_seq_len"])
    active_mlp = sum(moe_weights(m, m["moe_top_k"]) if moe_layer(m, l) else mlp_weights(m) for l in range(m["n_layer"]))
    per_unit = (3 if m["mlp"] == "swiglu" else 2) * m["d_model"] * m["n_layer"]  # MLP weights per unit of d_ff
    dense = dict(m, moe_experts=0, d_ff=round(active_mlp / per_unit))
    print(json.dumps({"config": a.config, "seq_len": seq_len, "dense_d_ff": dense["d_ff"],
                      "moe_layers": [l for l in range(m["n_layer"]) if moe_layer(m, l)],
                      "active_mlp_weights_per_token": {"moe": active_mlp, "dense": per_unit * dense["d_ff"]},
                      "moe": summary(m, seq_len), "dense": summary(dense, seq_len)}, indent=2))


if __name__ == "__main__":
    main()
