"""A torch model under Accelerator(mixed_precision="bf16"): its forward runs
under torch.autocast("cpu", torch.bfloat16) with float32 parameters and
gradients, so 2 ranks train as the plain autocast-bf16 run of one process
on the global batch does (to bf16's rounding flips, see the bounds); fp16, which torch's CPU autocast cannot do, is
refused with the reason."""

import pytest
import torch

from torch_models import launch, reference

STEPS, BATCH, CLIP = 4, 2, 0.05


def test_bf16_two_ranks_match_autocast(cli, tmp_path):
    cases = [{"opt": "adamw", "clip": CLIP, "grad_accum": 1, "config": {"zero": {"stage": stage}},
              "mixed_precision": "bf16", "steps": STEPS, "batch": BATCH} for stage in (0, 1)]
    results = launch(cli, 2, {"cases": cases}, tmp_path, timeout=240)
    losses, norms, _ = reference("adamw", STEPS, BATCH * 2, CLIP, autocast=True)
    f32_losses, _, _ = reference("adamw", STEPS, BATCH * 2, CLIP)
    for case, got in zip(cases, results):
        tag = "stage=%d" % case["config"]["zero"]["stage"]
        assert len(got["losses"]) == STEPS, tag
        # The first step is the one process's bitwise (each rank's rows go
        # through the same bf16 products, gradients reduced in float32).
        # After it, the float32 noise of the reduction order moves a few
        # weights across a bf16 rounding boundary, and a flipped operand
        # differs by 2^-8: measured up to 1e-4 relative on the losses of
        # 4 steps, held to 1e-3 (clip norms 1e-2).
        assert got["losses"][0] == losses[0], (tag, got["losses"], losses)
        for a, b in zip(got["losses"], losses):
            assert abs(a - b) <= 1e-3 * abs(b), (tag, got["losses"], losses)
        for a, b in zip(got["norms"], norms):
            assert abs(a - b) <= 1e-2 * abs(b), (tag, got["norms"], norms)
        assert not any(got["grads_bf16"]), (tag, "float32 reduction leaves float32 gradients")
    # The autocast run is not the float32 one: bf16 really ran.
    assert max(abs(a - b) / b for a, b in zip(losses, f32_losses)) > 1e-5, (losses, f32_losses)


def test_fp16_torch_model_refused_and_autocast_context():
    from tinyacc import Accelerator
    acc = Accelerator({}, mixed_precision="fp16")
    with pytest.raises(ValueError, match=r"mixed_precision=\"fp16\" cannot run a torch model on the CPU: torch's CPU autocast computes in bfloat16 only"):
        acc.prepare(torch.nn.Linear(2, 2))
    acc = Accelerator({}, mixed_precision="bf16")
    assert acc.mixed_precision == "bf16"
    with acc.autocast():
        assert torch.is_autocast_cpu_enabled()
        assert torch.get_autocast_cpu_dtype() == torch.bfloat16
    assert not torch.is_autocast_cpu_enabled()
    with pytest.raises(ValueError, match="mixed_precision='fp8' is not supported"):
        Accelerator({}, mixed_precision="fp8")


def test_bf16_reduce_dtype_two_ranks(cli, tmp_path):
    """ddp.reduce_dtype=bf16 on the torch path: every reduced gradient is a
    bfloat16 value (bucketed through the library's reducer, naive in
    Python), the first step's loss is the autocast run's bitwise (the
    reduction comes after it), and the run stays near it: each rank's
    gradients and their average rounded to bf16 (2^-9 relative) move the
    AdamW updates by about as much as bf16's rounding flips do (losses
    measured within 2e-4 relative over 4 steps, held to 1e-3; clip norms,
    taken after the rounding, 1e-2)."""
    cases = [{"opt": "adamw", "clip": CLIP, "grad_accum": 1,
              "config": {"zero": {"stage": 0}, "ddp": {"mode": mode, "reduce_dtype": "bf16"}},
              "mixed_precision": "bf16", "steps": STEPS, "batch": BATCH} for mode in ("bucketed", "naive")]
    results = launch(cli, 2, {"cases": cases}, tmp_path, timeout=240)
    losses, norms, _ = reference("adamw", STEPS, BATCH * 2, CLIP, autocast=True)
    for case, got in zip(cases, results):
        tag = case["config"]["ddp"]["mode"]
        assert got["grads_bf16"] == [True] * STEPS, (tag, got["grads_bf16"])
        assert got["losses"][0] == losses[0], (tag, got["losses"], losses)
        for a, b in zip(got["losses"], losses):
            assert abs(a - b) <= 1e-3 * abs(b), (tag, got["losses"], losses)
        for a, b in zip(got["norms"], norms):
            assert abs(a - b) <= 1e-2 * abs(b), (tag, got["norms"], norms)
    assert results[0]["losses"] == results[1]["losses"], "bucketed and naive reduce by the same rule"


def test_bf16_reduce_dtype_zero_stages_halve_the_reduce(cli, tmp_path):
    """ddp.reduce_dtype=bf16 under ZeRO 1, 2 and 3 for a torch model in
    mixed_precision="bf16": each stage's gradient reduce-scatters carry
    bfloat16, so a rank sends exactly half of the fp32 reduction's bytes
    for them and the rest (the parameter all-gathers, the used-flags
    all-reduce) unchanged. The model is torch_frozen's: its trainable
    tensors (T elements in P tensors, no padding) make the byte formula
    exact (test_torch_frozen.expected_bytes). At 2 ranks the fp32
    reduce-scatter sends 2T bytes (stages 1, 2) or 4T (stage 3, where each
    unit's tensor is one shard block), so bf16 saves T or 2T per step.

    Against the plain autocast-bf16 run of one process on the global
    batch: with fp32 reduction the float32 noise of the reduction order
    moves a few weights across a bf16 rounding boundary (as in
    test_bf16_two_ranks_match_autocast), measured 1.2e-4 relative on the
    losses of 3 steps; bf16 reduction also rounds each rank's gradients
    and their average to bf16 (2^-9 relative per element), measured
    1.5e-4. Both are held to 1e-3, the bound of the torch bf16 tests
    above."""
    from test_torch_frozen import BATCH, NPROC, STEPS, expected_bytes
    from torch_frozen import launch as launch_frozen, new_model, reference as frozen_reference
    stages = (1, 2, 3)
    cases = [{"zero": {"stage": s}, "ddp": {"reduce_dtype": rd}, "mixed_precision": "bf16"}
             for s in stages for rd in ("fp32", "bf16")]
    results = launch_frozen(cli, NPROC, {"cases": cases, "steps": STEPS, "batch": BATCH}, tmp_path, timeout=240)
    losses, _ = frozen_reference(STEPS, BATCH * NPROC, autocast=True)
    trainable = [p.numel() for p in new_model().parameters() if p.requires_grad]
    T = sum(trainable)
    for case, got in zip(cases, results):
        stage, rd = case["zero"]["stage"], case["ddp"]["reduce_dtype"]
        tag = "stage=%d reduce_dtype=%s" % (stage, rd)
        for a, b in zip(got["losses"], losses):
            assert abs(a - b) <= 1e-3 * abs(b), (tag, got["losses"], losses)
        reduce = 2 * T if stage < 3 else 4 * T  # bytes the fp32 reduce-scatter sends
        step = expected_bytes(stage, trainable) - (reduce // 2 if rd == "bf16" else 0)
        assert got["sent_per_rank"] == [[step] * NPROC] * STEPS, (tag, got["sent_per_rank"], step)
    for i in range(0, len(cases), 2):
        fp32, bf16 = results[i]["sent_per_rank"][0][0], results[i + 1]["sent_per_rank"][0][0]
        assert fp32 - bf16 == (2 * T if cases[i]["zero"]["stage"] < 3 else 4 * T) // 2, (cases[i], fp32, bf16)
