"""Self-checks of the PyTorch Llama reference: `/usr/bin/python3 -m pytest`.

The reference is held to a naive float64 numpy Llama written with loops
(no code shared): per-head attention over explicit key/value head indices,
RoPE by explicit pair rotation, RMSNorm and SwiGLU by their formulas.
"""

import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402

CFG = {"n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 8, "intermediate_size": 12, "block_size": 5,
       "vocab_size": 11, "rope_theta": 100.0, "norm_eps": 1e-6, "tie_embeddings": False}


def expected_names(cfg):
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    for i in range(cfg["n_layer"]):
        p = "model.layers.%d." % i
        names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        names |= {p + "self_attn.%s_proj.weight" % k for k in "qkvo"}
        names |= {p + "mlp.%s_proj.weight" % k for k in ("gate", "up", "down")}
    if not cfg["tie_embeddings"]:
        names.add("lm_head.weight")
    return names


def naive_logits(params, idx, cfg):
    C, H, K, T = cfg["n_embd"], cfg["n_head"], cfg["n_kv_head"], idx.shape[0]
    hs, eps, theta = C // H, cfg["norm_eps"], cfg["rope_theta"]

    def rms(x, w):
        return np.array([row / math.sqrt(np.mean(row * row) + eps) * w for row in x])

    def rope(v, pos):  # v: [hs]
        out = v.copy()
        for d in range(hs // 2):
            a = pos * theta ** (-2.0 * d / hs)
            x1, x2 = v[d], v[d + hs // 2]
            out[d], out[d + hs // 2] = x1 * math.cos(a) - x2 * math.sin(a), x2 * math.cos(a) + x1 * math.sin(a)
        return out

    x = params["model.embed_tokens.weight"][idx]
    for i in range(cfg["n_layer"]):
        p = lambda n: params["model.layers.%d.%s" % (i, n)]  # noqa: E731
        h = rms(x, p("input_layernorm.weight"))
        q, k, v = h @ p("self_attn.q_proj.weight").T, h @ p("self_attn.k_proj.weight").T, h @ p("self_attn.v_proj.weight").T
        att = np.zeros((T, H * hs))
        for head in range(H):
            g = head // (H // K)
            for t in range(T):
                qt = rope(q[t, head * hs:(head + 1) * hs], t)
                s = [qt @ rope(k[j, g * hs:(g + 1) * hs], j) / math.sqrt(hs) for j in range(t + 1)]
                w = np.exp(np.array(s) - max(s))
                w /= w.sum()
                att[t, head * hs:(head + 1) * hs] = sum(w[j] * v[j, g * hs:(g + 1) * hs] for j in range(t + 1))
        x = x + att @ p("self_attn.o_proj.weight").T
        h = rms(x, p("post_attention_layernorm.weight"))
        gate, up = h @ p("mlp.gate_proj.weight").T, h @ p("mlp.up_proj.weight").T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ p("mlp.down_proj.weight").T
    x = rms(x, params["model.norm.weight"])
    head = params["model.embed_tokens.weight"] if cfg["tie_embeddings"] else params["lm_head.weight"]
    return x @ head.T


def test_reference_matches_naive_llama():
    for tied in (False, True):
        cfg = dict(CFG, tie_embeddings=tied)
        model = llama_ref.Llama(cfg, torch.float64)
        assert set(n for n, _ in model.named_parameters()) == expected_names(cfg)
        gen = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for _, p in model.named_parameters():
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.5)
        idx = torch.tensor([[3, 1, 4, 1, 5]])
        logits, _ = model(idx)
        params = {n: p.detach().numpy() for n, p in model.named_parameters()}
        want = naive_logits(params, idx[0].numpy(), cfg)
        np.testing.assert_allclose(logits[0].detach().numpy(), want, rtol=1e-10, atol=1e-12)
