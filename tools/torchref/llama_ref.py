#!/usr/bin/python3
"""PyTorch reference Llama that tinyacc's Go engine is checked against.

Written out by hand (no transformers package), like gpt2_ref.py, so each
step of the forward pass is visible: RMSNorm, rotary position embeddings in
Hugging Face's rotate_half convention, grouped-query attention (here with
the key/value heads repeated for their query heads, the plain way), the
SwiGLU MLP and an lm_head that is either its own matrix or the embedding.
Parameters carry the Hugging Face Llama names and nn.Linear's [out, in]
layout, so the same safetensors file feeds both implementations.

Command line:

    llama_ref.py --in IN.safetensors --out OUT.safetensors [--threads N]
                 [--autocast bf16] [--param_copies bf16]

IN holds every parameter (all F32 or all F64), the batches `batch.x` and
`batch.y` (I32, [S, B, T]) and string metadata: n_layer, n_head, n_kv_head,
n_embd, intermediate_size, block_size, vocab_size, rope_theta, norm_eps,
tie_embeddings ("true"/"false"), lr, beta1, beta2, eps, weight_decay,
grad_clip. OUT is laid out as gpt2_ref.py's: loss, grad_norm, grad.<name>
(first step, or step grad_step, before clipping) and param.<name> (after
all S steps). The lora_* metadata adds adapters as gpt2_ref.py's does, to
the Linear layers of the blocks. --autocast and --param_copies are
gpt2_ref.py's: the forward under torch.autocast("cpu", torch.bfloat16),
and forward and backward on the parameters rounded to bfloat16 with
float32 masters.
"""

import argparse
import math
import os
import sys

if __name__ == "__main__":
    # OpenBLAS reads its thread count once, when torch loads it.
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[_var] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_ref  # noqa: E402  (the model-independent training loop and checks)
import safetensors_np  # noqa: E402

INT_KEYS = ("n_layer", "n_head", "n_kv_head", "n_embd", "intermediate_size", "block_size", "vocab_size")
FLOAT_KEYS = ("rope_theta", "norm_eps")


class Linear(nn.Module):
    """y = x @ weight.T, weight [out, in] as in nn.Linear, no bias."""

    def __init__(self, n_in, n_out, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_out, n_in, dtype=dtype))
        self.scaling = None

    def add_lora(self, r, alpha):
        """Give the layer a LoRA adapter as PEFT's lora.Linear does."""
        n_out, n_in = self.weight.shape
        self.lora_A = nn.Linear(n_in, r, bias=False, dtype=self.weight.dtype)
        self.lora_B = nn.Linear(r, n_out, bias=False, dtype=self.weight.dtype)
        self.scaling = alpha / r

    def forward(self, x):
        y = x @ self.weight.t()
        if self.scaling is not None:
            y = y + self.lora_B(self.lora_A(x)) * self.scaling
        return y


class Embedding(nn.Module):
    def __init__(self, rows, n_embd, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(rows, n_embd, dtype=dtype))


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension."""

    def __init__(self, n, eps, dtype):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n, dtype=dtype))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    """[x1, x2] -> [-x2, x1] on the last dimension's halves."""
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope(x, theta):
    """Turn x [B, heads, T, hs] at positions 0..T-1; angles in float64."""
    T, hs = x.shape[-2], x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    emb = torch.cat((ang, ang), dim=-1)
    return x * emb.cos().to(x.dtype) + rotate_half(x) * emb.sin().to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg, dtype):
        super().__init__()
        C, H, K = cfg["n_embd"], cfg["n_head"], cfg["n_kv_head"]
        self.H, self.K, self.hs, self.theta = H, K, C // H, cfg["rope_theta"]
        self.q_proj = Linear(C, H * self.hs, dtype)
        self.k_proj = Linear(C, K * self.hs, dtype)
        self.v_proj = Linear(C, K * self.hs, dtype)
        self.o_proj = Linear(H * self.hs, C, dtype)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.hs).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.K, self.hs).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.K, self.hs).transpose(1, 2)
        q, k = rope(q, self.theta), rope(k, self.theta)
        # Query head h uses key/value head h // (H/K).
        k = k.repeat_interleave(self.H // self.K, dim=1)
        v = v.repeat_interleave(self.H // self.K, dim=1)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.hs)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, self.H * self.hs)
        return self.o_proj(y)


class MLP(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg, dtype):
        super().__init__()
        C, I = cfg["n_embd"], cfg["intermediate_size"]
        self.gate_proj = Linear(C, I, dtype)
        self.up_proj = Linear(C, I, dtype)
        self.down_proj = Linear(I, C, dtype)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg, dtype):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg["n_embd"], cfg["norm_eps"], dtype)
        self.self_attn = Attention(cfg, dtype)
        self.post_attention_layernorm = RMSNorm(cfg["n_embd"], cfg["norm_eps"], dtype)
        self.mlp = MLP(cfg, dtype)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg, dtype):
        super().__init__()
        self.embed_tokens = Embedding(cfg["vocab_size"], cfg["n_embd"], dtype)
        self.layers = nn.ModuleList(DecoderLayer(cfg, dtype) for _ in range(cfg["n_layer"]))
        self.norm = RMSNorm(cfg["n_embd"], cfg["norm_eps"], dtype)


class Llama(nn.Module):
    """Llama whose named_parameters() are exactly the Hugging Face names."""

    def __init__(self, cfg, dtype=torch.float32):
        super().__init__()
        if cfg["n_head"] % cfg["n_kv_head"] or cfg["n_embd"] % cfg["n_head"]:
            raise ValueError("n_embd, n_head and n_kv_head must divide: %s" % cfg)
        self.cfg = dict(cfg)
        self.model = LlamaModel(cfg, dtype)
        self.lm_head = None if cfg["tie_embeddings"] else Linear(cfg["n_embd"], cfg["vocab_size"], dtype)

    def forward(self, idx, targets=None):
        if idx.shape[1] > self.cfg["block_size"]:
            raise ValueError("sequence length %d exceeds block_size %d" % (idx.shape[1], self.cfg["block_size"]))
        x = self.model.embed_tokens.weight[idx]
        for layer in self.model.layers:
            x = layer(x)
        x = self.model.norm(x)
        head = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = x @ head.t()
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def parse_metadata(metadata):
    cfg, train = {}, {}
    missing = [k for k in INT_KEYS + FLOAT_KEYS + ("tie_embeddings",) + gpt2_ref.TRAIN_KEYS if k not in metadata]
    if missing:
        raise ValueError("metadata lacks %s" % missing)
    for k in INT_KEYS:
        cfg[k] = int(metadata[k])
        if cfg[k] <= 0:
            raise ValueError("metadata %s=%d must be positive" % (k, cfg[k]))
    for k in FLOAT_KEYS:
        cfg[k] = float(metadata[k])
    if metadata["tie_embeddings"] not in ("true", "false"):
        raise ValueError("metadata tie_embeddings=%r is not true or false" % metadata["tie_embeddings"])
    cfg["tie_embeddings"] = metadata["tie_embeddings"] == "true"
    for k in gpt2_ref.TRAIN_KEYS:
        train[k] = float(metadata[k])
    return cfg, train


def run_reference(tensors, metadata, autocast=None, param_copies=None):
    """`autocast` and `param_copies` are gpt2_ref.train_step's: None, or "bf16"."""
    cfg, train = parse_metadata(metadata)
    name = "model.embed_tokens.weight"
    if name not in tensors:
        raise ValueError("input lacks %s, so the parameter dtype is unknown" % name)
    dtypes = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}
    if tensors[name].dtype not in dtypes:
        raise ValueError("parameters are %s; give them as F32 or F64" % tensors[name].dtype)
    model = Llama(cfg, dtypes[tensors[name].dtype])
    if int(metadata.get("lora_rank", "0")) > 0:
        gpt2_ref.apply_lora_(model, int(metadata["lora_rank"]), float(metadata["lora_alpha"]),
                             [t.strip() for t in metadata["lora_targets"].split(",") if t.strip()], layer=Linear)
    gpt2_ref.load_params_(model, tensors)
    return gpt2_ref.train_and_record(model, tensors, metadata, cfg, train, autocast, param_copies)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Train the reference Llama on a safetensors input; record the results.")
    ap.add_argument("--in", dest="in_path", required=True)
    ap.add_argument("--out", dest="out_path", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--autocast", choices=["none", "bf16"], default="none",
                    help="run the forward under torch.autocast(\"cpu\", torch.bfloat16)")
    ap.add_argument("--param_copies", choices=["none", "bf16"], default="none",
                    help="run forward and backward on the parameters rounded to bfloat16 (float32 masters)")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    torch.use_deterministic_algorithms(True)
    try:
        tensors, metadata = safetensors_np.load_file(args.in_path)
        out, meta = run_reference(tensors, metadata, None if args.autocast == "none" else args.autocast,
                                  None if args.param_copies == "none" else args.param_copies)
    except (OSError, ValueError) as e:
        print("llama_ref: %s: %s" % (args.in_path, e), file=sys.stderr)
        return 2
    tmp = args.out_path + ".tmp"
    safetensors_np.save_file(tmp, out, meta)
    os.replace(tmp, args.out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
