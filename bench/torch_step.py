#!/usr/bin/python3
"""PyTorch timing peer for tinyacc's GPT-2 (or, with --arch llama, Llama) training step.

Builds the reference GPT-2 from tools/torchref (same architecture, names and
AdamW setup the engine is checked against), gives it the GPT-2
initialization, trains on random token batches and prints one JSON line:

    {"impl": "pytorch", "threads": N, "ms_per_step": median, "ms_all": [...],
     "torch": version, "loss_first": ..., "loss_last": ...}

ms_per_step is the median over the timed steps, because the median shrugs off
the occasional step slowed by the OS. Warmup steps run first and are not
timed (first-touch allocations and lazy initialization land there).
loss_first is the loss of the very first step, warmup included, and
loss_last that of the final step.

Debian's PyTorch does its matrix products in OpenBLAS, whose own thread pool
ignores torch.set_num_threads and starts one thread per core. Left alone,
"--threads 1" would not be single-threaded and "--threads 2" would run four
threads on two cores, so the script pins OpenBLAS (and OpenMP) to --threads
before torch is imported.
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "torchref"))


def main(argv=None):
    ap = argparse.ArgumentParser(description="Time the PyTorch GPT-2 training step.")
    ap.add_argument("--n_layer", type=int, default=4)
    ap.add_argument("--n_head", type=int, default=4)
    ap.add_argument("--n_embd", type=int, default=256)
    ap.add_argument("--block_size", type=int, default=256, help="also the sequence length of each batch")
    ap.add_argument("--vocab_size", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps run first")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight_decay", type=float, default=0.1)
    ap.add_argument("--grad_clip", type=float, default=1.0, help="global grad-norm clip; 0 disables")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2")
    ap.add_argument("--n_kv_head", type=int, default=0, help="llama: key/value heads (0: n_head)")
    ap.add_argument("--intermediate_size", type=int, default=0, help="llama: SwiGLU width (required for llama)")
    ap.add_argument("--rope_theta", type=float, default=10000.0)
    ap.add_argument("--norm_eps", type=float, default=1e-5)
    ap.add_argument("--autocast", choices=["none", "bf16"], default="none",
                    help="bf16: forward under torch.autocast(\"cpu\", torch.bfloat16), parameters float32")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.threads < 1:
        ap.error("need --steps >= 1, --warmup >= 0 and --threads >= 1")

    # Thread pools read these once, when their libraries load (see above).
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    import torch
    import gpt2_ref

    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(args.seed)
    cfg = {k: getattr(args, k) for k in gpt2_ref.MODEL_KEYS}
    if args.arch == "llama":
        import llama_ref

        if args.intermediate_size < 1:
            ap.error("--arch llama needs --intermediate_size")
        cfg.update(n_kv_head=args.n_kv_head or args.n_head, intermediate_size=args.intermediate_size,
                   rope_theta=args.rope_theta, norm_eps=args.norm_eps, tie_embeddings=False)
        model = llama_ref.Llama(cfg, torch.float32)
        with torch.no_grad():  # Hugging Face's init: matrices N(0, 0.02), norms 1
            for _, p in model.named_parameters():
                if p.dim() >= 2:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    else:
        model = gpt2_ref.GPT2(cfg, torch.float32)
        gpt2_ref.init_gpt2_(model, gen)
    opt = gpt2_ref.make_optimizer(model, args.lr, args.beta1, args.beta2, args.eps, args.weight_decay)

    # All batches are drawn before timing so the RNG stays out of the steps.
    total = args.warmup + args.steps
    shape = (total, args.batch, args.block_size)
    xs = torch.randint(0, args.vocab_size, shape, generator=gen)
    ys = torch.randint(0, args.vocab_size, shape, generator=gen)

    losses, ms_all = [], []
    for s in range(total):
        t0 = time.perf_counter()
        loss, _ = gpt2_ref.train_step(model, opt, xs[s], ys[s], args.grad_clip,
                                      autocast=None if args.autocast == "none" else args.autocast)
        elapsed = (time.perf_counter() - t0) * 1e3
        losses.append(loss)
        if s >= args.warmup:
            ms_all.append(round(elapsed, 3))

    print(json.dumps({
        "impl": "pytorch",
        "threads": args.threads,
        "autocast": args.autocast,
        "ms_per_step": round(statistics.median(ms_all), 3),
        "ms_all": ms_all,
        "torch": torch.__version__,
        "loss_first": losses[0],
        "loss_last": losses[-1],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
