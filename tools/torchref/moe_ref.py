#!/usr/bin/python3
"""An independent PyTorch reference for tinyacc's mixture-of-experts layer.

Reads a safetensors input with the layer's input `x` [N, C], the gradient
`gout` [N, C] its output is contracted with, `router.weight` [C, E] and each
expert's GPT-2 MLP (`experts.{e}.c_fc.weight` ...), and the settings in the
metadata (top_k, capacity_factor, aux_loss_coef, z_loss_coef). In float64 it
computes the layer the plain way, with a dense loop over the experts (every
expert runs on every token; a mask keeps the routed ones):

    probs   = softmax(x @ router)
    top-k   = the k highest probs of each token; weights renormalised over them
    out     = sum_e  mask_e * weight_e * mlp_e(x)
    aux     = aux_loss_coef * E * sum_i f_i * P_i    (Switch Transformer)
              f_i = share of the N*k assignments that chose expert i
              P_i = mean over tokens of probs[:, i]
    z       = z_loss_coef * mean_t logsumexp(logits_t)^2

Capacity (capacity_factor > 0): an expert keeps at most
ceil(capacity_factor * N * k / E) assignments, taken in the order of every
token's first choice by token, then every token's second choice, and so on.

It differentiates L = sum(out * gout) + aux + z and writes `out`, `aux`,
`z`, `dropped` and `grad.<name>` for x and every parameter.

    /usr/bin/python3 tools/torchref/moe_ref.py --in in.safetensors --out out.safetensors
"""

import argparse
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np as st  # noqa: E402

EXPERT_PARAMS = ("c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias")


def reference(tensors, meta):
    k = int(meta["top_k"])
    cf = float(meta["capacity_factor"])
    aux_coef, z_coef = float(meta["aux_loss_coef"]), float(meta["z_loss_coef"])
    leaves = {name: torch.tensor(np.asarray(v, dtype=np.float64), requires_grad=name != "gout")
              for name, v in tensors.items()}
    x, gout, router = leaves["x"], leaves["gout"], leaves["router.weight"]
    N, E = x.shape[0], router.shape[1]

    logits = x @ router
    probs = torch.softmax(logits, dim=-1)
    top_p, top_i = torch.topk(probs, k, dim=-1)
    weights = top_p / top_p.sum(dim=-1, keepdim=True)

    # Which (token, slot) assignments an expert keeps.
    keep = torch.ones(N, k, dtype=torch.bool)
    dropped = 0
    if cf > 0:
        capacity = math.ceil(cf * N * k / E)
        taken = [0] * E
        for s in range(k):
            for t in range(N):
                e = int(top_i[t, s])
                if taken[e] >= capacity:
                    keep[t, s] = False
                    dropped += 1
                else:
                    taken[e] += 1

    out = torch.zeros_like(x)
    for e in range(E):
        p = "experts.%d." % e
        h = F.gelu(x @ leaves[p + "c_fc.weight"] + leaves[p + "c_fc.bias"], approximate="tanh")
        y = h @ leaves[p + "c_proj.weight"] + leaves[p + "c_proj.bias"]
        gate = ((top_i == e) & keep).to(x.dtype) * weights  # [N, k]
        out = out + gate.sum(dim=-1, keepdim=True) * y

    counts = torch.zeros(E, dtype=torch.float64)
    for e in range(E):
        counts[e] = float((top_i == e).sum())
    f = counts / (N * k)
    P = probs.mean(dim=0)
    aux = aux_coef * E * (f * P).sum()
    z = z_coef * (torch.logsumexp(logits, dim=-1) ** 2).mean()

    ((out * gout).sum() + aux + z).backward()
    result = {"out": out.detach().numpy(), "aux": np.array([aux.item()]), "z": np.array([z.item()]),
              "dropped": np.array([float(dropped)])}
    for name, leaf in leaves.items():
        if leaf.requires_grad:
            result["grad." + name] = leaf.grad.numpy()
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--in", dest="in_path", required=True, help="safetensors input")
    ap.add_argument("--out", dest="out_path", required=True, help="safetensors output")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    tensors, meta = st.load_file(args.in_path)
    st.save_file(args.out_path, reference(tensors, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
