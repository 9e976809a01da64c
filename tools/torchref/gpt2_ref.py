#!/usr/bin/python3
"""PyTorch reference GPT-2 that tinyacc's Go engine is checked against.

The model is written out by hand (no transformers package) so each step of
the forward pass is visible and matches the engine one for one. Parameters
carry the Hugging Face GPT-2 names and layouts (Conv1D weights are
[in, out]; the LM head is tied to wte), which lets the same safetensors file
feed both implementations without any renaming.

Command line:

    gpt2_ref.py --in IN.safetensors --out OUT.safetensors [--threads N]

IN holds every parameter (all F32 or all F64; the run uses that dtype), the
token batches `batch.x` and `batch.y` (I32, [S, B, T]: S steps of batch B)
and string metadata: n_layer, n_head, n_embd, block_size, vocab_size, lr,
beta1, beta2, eps, weight_decay, grad_clip. The script trains S steps with
AdamW and writes OUT with

    loss          F64 [S]  loss of each step, computed before its update
    grad_norm     F64 [S]  global L2 norm of each step's gradients, pre-clip
    grad.<name>   gradients of the first step (or of step grad_step, when
                  the metadata names one), before clipping, of every
                  parameter that takes one
    param.<name>  parameters after all S steps

LoRA: metadata lora_rank > 0 (with lora_alpha, lora_targets, a comma list
of module names matched as PEFT matches target_modules, and optionally
lora_train_biases=all) freezes every base parameter and gives each
targeted Conv1D a LoRA adapter: lora_A, lora_B as nn.Linear without bias
(weights [r, in] and [out, r]), adding lora_B(lora_A(x)) * alpha / r.
IN then holds the adapters' initial weights too.

and IN's metadata plus `torch_version`.
"""

import argparse
import math
import os
import re
import sys

import numpy as np


def _threads_arg(argv):
    """The --threads value from a command line, ignoring everything else."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--threads", type=int, default=1)
    known, _ = ap.parse_known_args(argv)
    return max(1, known.threads)


if __name__ == "__main__":
    # Debian's torch multiplies matrices in OpenBLAS, whose thread pool
    # ignores torch.set_num_threads and reads these variables once, when it
    # loads; so they are set from --threads before torch is imported.
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[_var] = str(_threads_arg(sys.argv[1:]))

import torch  # noqa: E402  (after the thread settings above)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402  (needs the path set above)

LN_EPS = 1e-5

MODEL_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")
TRAIN_KEYS = ("lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip")

# Hugging Face GPT-2 files carry the causal mask as buffers under these
# suffixes; they are not parameters, so a file that has them still loads.
_MASK_SUFFIXES = (".attn.bias", ".attn.masked_bias")


def gelu_tanh(x):
    """GELU with the tanh approximation, the variant GPT-2 was trained with."""
    return F.gelu(x, approximate="tanh")


class Conv1D(nn.Module):
    """Affine map y = x @ weight + bias with weight stored [in, out].

    This is the transpose of nn.Linear's layout; keeping GPT-2's layout means
    checkpoints move between PyTorch and the engine without transposes.
    """

    def __init__(self, n_in, n_out, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_in, n_out, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(n_out, dtype=dtype))
        self.scaling = None

    def add_lora(self, r, alpha):
        """Give the layer a LoRA adapter as PEFT's lora.Linear does."""
        n_in, n_out = self.weight.shape
        self.lora_A = nn.Linear(n_in, r, bias=False, dtype=self.weight.dtype)
        self.lora_B = nn.Linear(r, n_out, bias=False, dtype=self.weight.dtype)
        self.scaling = alpha / r

    def forward(self, x):
        y = x @ self.weight + self.bias
        if self.scaling is not None:
            y = y + self.lora_B(self.lora_A(x)) * self.scaling
        return y


def apply_lora_(model, r, alpha, targets, train_biases=False, layer=None):
    """Freeze the base and add adapters to the layers `targets` names.

    layer is the class of the linear layers (Conv1D here; llama_ref's
    Linear), each with an add_lora method. A module is targeted when its
    dotted name inside its block (after h.<i>. or model.layers.<i>.) equals
    a target or ends with "." and one, PEFT's rule for target_modules."""
    hit = set()
    for name, mod in model.named_modules():
        m = re.match(r"^(?:h|model\.layers)\.\d+\.(.+)$", name)
        if not isinstance(mod, layer or Conv1D) or m is None:
            continue
        local = m.group(1)  # h.0.attn.c_attn -> attn.c_attn
        for t in targets:
            if local == t or local.endswith("." + t):
                mod.add_lora(r, alpha)
                hit.add(t)
    if hit != set(targets):
        raise ValueError("lora_targets %s name no Conv1D module" % sorted(set(targets) - hit))
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name or (train_biases and name.endswith(".bias")))


class Embedding(nn.Module):
    """A lookup table with a single `weight` parameter, [rows, n_embd]."""

    def __init__(self, rows, n_embd, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(rows, n_embd, dtype=dtype))


class Attention(nn.Module):
    """Causal multi-head self-attention with fused q, k, v projection."""

    def __init__(self, cfg, dtype):
        super().__init__()
        self.n_head = cfg["n_head"]
        self.c_attn = Conv1D(cfg["n_embd"], 3 * cfg["n_embd"], dtype)
        self.c_proj = Conv1D(cfg["n_embd"], cfg["n_embd"], dtype)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        # Head h owns columns h*hs:(h+1)*hs of each of q, k and v.
        q, k, v = (t.view(B, T, self.n_head, hs).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    """Position-wise feed-forward: C -> 4C -> GELU(tanh) -> C."""

    def __init__(self, cfg, dtype):
        super().__init__()
        self.c_fc = Conv1D(cfg["n_embd"], 4 * cfg["n_embd"], dtype)
        self.c_proj = Conv1D(4 * cfg["n_embd"], cfg["n_embd"], dtype)

    def forward(self, x):
        return self.c_proj(gelu_tanh(self.c_fc(x)))


class Block(nn.Module):
    """Pre-LayerNorm transformer block with residual connections."""

    def __init__(self, cfg, dtype):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg["n_embd"], eps=LN_EPS, dtype=dtype)
        self.attn = Attention(cfg, dtype)
        self.ln_2 = nn.LayerNorm(cfg["n_embd"], eps=LN_EPS, dtype=dtype)
        self.mlp = MLP(cfg, dtype)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """GPT-2 whose named_parameters() are exactly the Hugging Face names.

    The module tree (wte, wpe, h.<i>.ln_1, ..., ln_f) is arranged so that
    PyTorch's own dotted naming produces "h.0.attn.c_attn.weight" and so on;
    no name mapping exists anywhere that could drift from the engine's.
    Parameters start at zero (LayerNorm at 1): load a file or call init_gpt2_.
    """

    def __init__(self, cfg, dtype=torch.float32):
        super().__init__()
        if cfg["n_embd"] % cfg["n_head"] != 0:
            raise ValueError(
                "n_embd=%d is not divisible by n_head=%d; pick n_embd a multiple of n_head"
                % (cfg["n_embd"], cfg["n_head"])
            )
        self.cfg = dict(cfg)
        self.wte = Embedding(cfg["vocab_size"], cfg["n_embd"], dtype)
        self.wpe = Embedding(cfg["block_size"], cfg["n_embd"], dtype)
        self.h = nn.ModuleList(Block(cfg, dtype) for _ in range(cfg["n_layer"]))
        self.ln_f = nn.LayerNorm(cfg["n_embd"], eps=LN_EPS, dtype=dtype)

    def forward(self, idx, targets=None):
        """Return (logits [B, T, V], mean cross-entropy or None)."""
        T = idx.shape[1]
        if T > self.cfg["block_size"]:
            raise ValueError("sequence length %d exceeds block_size %d" % (T, self.cfg["block_size"]))
        x = self.wte.weight[idx] + self.wpe.weight[:T]
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss


def init_gpt2_(model, generator=None, std=0.02):
    """GPT-2 initialization: N(0, std) weights, zero biases, LayerNorm 1/0.

    The residual output projections (attn.c_proj, mlp.c_proj) use
    std / sqrt(2 * n_layer) so the residual stream's variance does not grow
    with depth, as in the GPT-2 paper.
    """
    resid_std = std / math.sqrt(2 * model.cfg["n_layer"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                s = resid_std if name.endswith("c_proj.weight") else std
                p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) * s)
            elif ".ln_" in "." + name:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            else:
                p.zero_()


def make_optimizer(model, lr, beta1, beta2, eps, weight_decay):
    """AdamW with decay on matrices only (dim >= 2); biases and norms exempt."""
    decay = [p for p in model.parameters() if p.dim() >= 2 and p.requires_grad]
    no_decay = [p for p in model.parameters() if p.dim() < 2 and p.requires_grad]
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(beta1, beta2), eps=eps)


def global_grad_norm(model):
    """L2 norm of all gradients together, computed the way clip_grad_norm_ does."""
    norms = [p.grad.detach().norm(2) for p in model.parameters() if p.grad is not None]
    return torch.norm(torch.stack(norms), 2)


def train_step(model, opt, x, y, grad_clip, on_grads=None, autocast=None, param_copies=None):
    """One step: zero_grad, forward, backward, optional clip, AdamW update.

    `on_grads`, if given, sees the model after backward and before clipping,
    which is where the reference records the first step's raw gradients.
    `autocast="bf16"` runs the forward under torch.autocast("cpu",
    torch.bfloat16) (matrix products in bf16, softmax, LayerNorm and the
    loss in float32; parameters and gradients stay float32).
    `param_copies="bf16"` runs forward and backward on the parameters
    rounded to bfloat16, Megatron's model parameters: every op reads the
    copy, the embeddings, LayerNorm and the biases too (autocast alone
    rounds only the operands of the products), while the float32 values
    are the masters the optimizer updates with the copies' gradients.
    Returns (loss, pre-clip global grad norm) as Python floats.
    """
    if autocast not in (None, "bf16"):
        raise ValueError("autocast=%r: use None or \"bf16\" (torch's CPU autocast is bf16 only)" % (autocast,))
    if param_copies not in (None, "bf16"):
        raise ValueError("param_copies=%r: use None or \"bf16\"" % (param_copies,))
    opt.zero_grad(set_to_none=True)
    params = list(model.parameters())
    masters = None
    if param_copies == "bf16":
        with torch.no_grad():
            masters = [p.detach().clone() for p in params]
            for p in params:
                p.copy_(p.to(torch.bfloat16).to(p.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast == "bf16"):
        _, loss = model(x, y)
    loss.backward()
    if masters is not None:
        with torch.no_grad():
            for p, m in zip(params, masters):
                p.copy_(m)
    if on_grads is not None:
        on_grads(model)
    if grad_clip > 0:
        norm = nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], grad_clip)
    else:
        norm = global_grad_norm(model)
    opt.step()
    return loss.item(), norm.item()


def _parse_metadata(metadata):
    """Pull the model and optimizer settings out of string metadata."""
    missing = [k for k in MODEL_KEYS + TRAIN_KEYS if k not in metadata]
    if missing:
        raise ValueError("metadata lacks %s (all of %s are required)" % (missing, MODEL_KEYS + TRAIN_KEYS))
    cfg, train = {}, {}
    for key in MODEL_KEYS:
        try:
            cfg[key] = int(metadata[key])
        except ValueError:
            raise ValueError("metadata %s=%r is not an integer" % (key, metadata[key])) from None
        if cfg[key] <= 0:
            raise ValueError("metadata %s=%d must be positive" % (key, cfg[key]))
    for key in TRAIN_KEYS:
        try:
            train[key] = float(metadata[key])
        except ValueError:
            raise ValueError("metadata %s=%r is not a number" % (key, metadata[key])) from None
    return cfg, train


def load_params_(model, tensors):
    """Copy parameters from `tensors` (name -> array) into `model`, strictly.

    Every parameter must be present with its exact shape; names that are
    neither parameters, batches nor known mask buffers are rejected, since a
    misspelled name would otherwise leave a parameter silently at zero.
    """
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(tensors))
    extra = sorted(
        n for n in tensors if n not in params and not n.startswith("batch.") and not n.endswith(_MASK_SUFFIXES)
    )
    if missing or extra:
        raise ValueError("parameter names differ from the model: missing %s, unexpected %s" % (missing, extra))
    with torch.no_grad():
        for name, p in params.items():
            arr = tensors[name]
            if tuple(arr.shape) != tuple(p.shape):
                raise ValueError("%s has shape %s, the model needs %s" % (name, list(arr.shape), list(p.shape)))
            p.copy_(torch.from_numpy(np.ascontiguousarray(arr)))


def _batches(tensors, cfg):
    """Validate batch.x / batch.y and return them as int64 tensors [S, B, T]."""
    for key in ("batch.x", "batch.y"):
        if key not in tensors:
            raise ValueError("input lacks %s (I32 tokens shaped [steps, batch, seq])" % key)
    x, y = tensors["batch.x"], tensors["batch.y"]
    if x.ndim != 3 or x.shape != y.shape:
        raise ValueError(
            "batch.x %s and batch.y %s must both be [steps, batch, seq]" % (list(x.shape), list(y.shape))
        )
    if x.shape[0] == 0:
        raise ValueError("batch.x has 0 steps; give at least one")
    if x.shape[2] > cfg["block_size"]:
        raise ValueError("sequence length %d exceeds block_size %d" % (x.shape[2], cfg["block_size"]))
    for key, arr in (("batch.x", x), ("batch.y", y)):
        if arr.dtype.kind not in "iu":
            raise ValueError("%s has dtype %s; tokens must be integers (I32)" % (key, arr.dtype))
        if arr.size and (arr.min() < 0 or arr.max() >= cfg["vocab_size"]):
            raise ValueError(
                "%s holds tokens in [%d, %d], outside [0, vocab_size=%d)"
                % (key, arr.min(), arr.max(), cfg["vocab_size"])
            )
    return torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))


def run_reference(tensors, metadata, autocast=None, param_copies=None):
    """Train on the batches in `tensors`; return (out tensors, out metadata).

    `autocast` and `param_copies` are train_step's: None, or "bf16"."""
    cfg, train = _parse_metadata(metadata)
    if "wte.weight" not in tensors:
        raise ValueError("input lacks wte.weight, so the parameter dtype is unknown")
    np_dtype = tensors["wte.weight"].dtype
    dtypes = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}
    if np_dtype not in dtypes:
        raise ValueError("parameters are %s; give them as F32 or F64" % np_dtype)
    dtype = dtypes[np_dtype]
    model = GPT2(cfg, dtype)
    if int(metadata.get("lora_rank", "0")) > 0:
        apply_lora_(model, int(metadata["lora_rank"]), float(metadata["lora_alpha"]),
                    [t.strip() for t in metadata["lora_targets"].split(",") if t.strip()],
                    metadata.get("lora_train_biases", "none") == "all")
    for name, _ in model.named_parameters():
        if name in tensors and tensors[name].dtype != np_dtype:
            raise ValueError("%s is %s but wte.weight is %s; use one dtype for all parameters"
                             % (name, tensors[name].dtype, np_dtype))
    load_params_(model, tensors)
    return train_and_record(model, tensors, metadata, cfg, train, autocast, param_copies)


def train_and_record(model, tensors, metadata, cfg, train, autocast=None, param_copies=None):
    """Train `model` with AdamW on the batches in `tensors`; return (out, meta).

    out holds loss and grad_norm per step, grad.<name> of every trainable
    parameter at step grad_step (metadata, default 0) before clipping, and
    param.<name> after the last step; meta is the input metadata with the
    torch version. Shared by every reference model, so all are trained and
    recorded by one loop."""
    xs, ys = _batches(tensors, cfg)
    opt = make_optimizer(model, train["lr"], train["beta1"], train["beta2"], train["eps"], train["weight_decay"])

    out = {}

    def record_grads(m):
        for name, p in m.named_parameters():
            if p.requires_grad:
                out["grad." + name] = p.grad.detach().numpy().copy()

    grad_step = int(metadata.get("grad_step", "0"))

    losses, norms = [], []
    for s in range(xs.shape[0]):
        loss, norm = train_step(model, opt, xs[s], ys[s], train["grad_clip"], record_grads if s == grad_step else None,
                                autocast, param_copies)
        losses.append(loss)
        norms.append(norm)
    for name, p in model.named_parameters():
        out["param." + name] = p.detach().numpy().copy()
    out["loss"] = np.array(losses, dtype=np.float64)
    out["grad_norm"] = np.array(norms, dtype=np.float64)
    meta = dict(metadata)
    meta["torch_version"] = torch.__version__
    return out, meta


def main(argv=None):
    ap = argparse.ArgumentParser(description="Train the reference GPT-2 on a safetensors input; record the results.")
    ap.add_argument("--in", dest="in_path", required=True,
                    help="input safetensors: parameters, batch.x, batch.y, metadata")
    ap.add_argument("--out", dest="out_path", required=True,
                    help="output safetensors: loss, grad_norm, grad.*, param.*")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (default 1, for repeatable runs)")
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
        print("gpt2_ref: %s: %s" % (args.in_path, e), file=sys.stderr)
        return 2
    # Write then rename, so a reader never sees a half-written file.
    tmp = args.out_path + ".tmp"
    safetensors_np.save_file(tmp, out, meta)
    os.replace(tmp, args.out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
