"""ZeRO-1/2/3 engines for torch models, driven directly (not through the
Accelerator, whose equivalence tests are in test_torch_ddp.py): a world of
one against plain PyTorch, misuse, accumulation, gradients leaving during
backward, clipping, and under `tinyacc launch` an nn.Sequential with an
in-place ReLU and zero.wrap (see torch_zero_equiv.py)."""

import os
import subprocess
import sys

import pytest

from conftest import PKG

HERE = os.path.dirname(os.path.abspath(__file__))


def launch(cli, nproc, script, *args):
    env = dict(os.environ, PYTHONPATH=PKG)
    out = subprocess.run([cli, "launch", "--nproc", str(nproc), "--", sys.executable, os.path.join(HERE, script)]
                         + list(args), env=env, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    return text


def test_zero3_sequential_and_wrap(cli):
    # The stage × optimizer × accumulation matrix runs through the
    # Accelerator in test_torch_ddp.py; this launch covers what it does not.
    text = launch(cli, 2, "torch_zero_equiv.py")
    assert text.count("ok sequential stage=3 world=2") == 2, text
    assert text.count("ok modulelist stage=3 world=2") == 2, text
    for reentrant in (False, True):
        assert text.count("ok checkpoint reentrant=%s stage=3 world=2" % reentrant) == 2, text
    assert text.count("ok wrap=Linear stage=3 world=2") == 2, text
    for opt in ("adamw", "sgd"):
        for stage in (1, 2):
            for shard in ("auto", "params"):
                assert text.count("ok %s stage=%d shard=%s world=2" % (opt, stage, shard)) == 2, text


def _engine(model, opt, stage=2, bucket_mb=25, wrap=None):
    import types
    from tinyacc.torch_zero import ZeroEngine
    acc = types.SimpleNamespace(process_index=0, num_processes=1,
                                config={"zero": {"stage": stage, "wrap": wrap}, "ddp": {"bucket_mb": bucket_mb}})
    return ZeroEngine(acc, model, opt, stage)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_world_of_one_matches_plain_torch(stage):
    import torch_zero_equiv as t
    for opt, accum in (("adamw", 3), ("sgd", 1)):
        ref = t.reference(opt, 1, accum)
        got = t.run(stage, opt, accum, 0, 1)
        t.check_run("stage=%d opt=%s accum=%d world=1" % (stage, opt, accum), got, *ref)
    # zero.wrap by class name: the Head module is one unit, the rest the root's.
    got = t.run(3, "adamw", 3, 0, 1, wrap=["Head"])
    t.check_run("wrap=Head", got, *t.reference("adamw", 1, 3))


def test_misuse_is_refused_naming_the_parameter():
    import torch
    import torch.nn as nn

    m = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2).double())
    with pytest.raises(TypeError, match=r"parameter 1\.weight is torch\.float64; only float32"):
        _engine(m, torch.optim.SGD(m.parameters(), lr=0.1))
    m = nn.Linear(3, 4)
    m.weight = nn.Parameter(torch.randn(3, 4).t())
    with pytest.raises(ValueError, match="parameter weight is not contiguous"):
        _engine(m, torch.optim.SGD(m.parameters(), lr=0.1))
    m = nn.Linear(3, 4)
    with pytest.raises(ValueError, match="zero.stage 1, 2 or 3, got 4"):
        _engine(m, torch.optim.SGD(m.parameters(), lr=0.1), stage=4)
    other = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"optimizer holds a tensor of shape \(2, 2\) that is not a parameter"):
        _engine(m, torch.optim.SGD(list(m.parameters()) + list(other.parameters()), lr=0.1))
    seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    with pytest.raises(ValueError, match=r"zero.wrap=\['Block'\] names no module class of the model below its "
                                         r"root; its classes are Linear, ReLU"):
        _engine(seq, torch.optim.SGD(seq.parameters(), lr=0.1), stage=3, wrap=["Block"])
    eng = _engine(m, torch.optim.SGD(m.parameters(), lr=0.1))
    with pytest.raises(RuntimeError, match=r"optimizer.step\(\) was called before any backward"):
        eng.wrap_optimizer().step()
    with pytest.raises(ValueError, match=r"clip_grad_norm_ got a tensor of shape \(2, 2\)"):
        eng.clip_grad_norm_(other.parameters(), 1.0)


def test_grad_accumulation_steps_only_when_syncing():
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    m = nn.Linear(3, 2)
    eng = _engine(m, torch.optim.SGD(m.parameters(), lr=0.1), stage=2)
    opt = eng.wrap_optimizer()
    before = m.weight.detach().clone()
    eng.set_sync(False)
    m(torch.ones(1, 3)).sum().backward()
    eng.after_backward()
    opt.step()
    opt.zero_grad()
    assert torch.equal(m.weight, before)
    # The first micro-batch's gradient survived the no-op zero_grad.
    eng.set_sync(True)
    m(torch.ones(1, 3)).sum().backward()
    eng.after_backward()
    opt.step()
    assert torch.allclose(m.weight, before - 0.1 * 2 * torch.ones(2, 3))


@pytest.mark.parametrize("stage", [2, 3])
def test_gradients_leave_during_backward(stage):
    """At ZeRO-2 and 3, buckets (units) whose gradients are final are
    reduce-scattered while backward runs: when loss.backward() returns,
    some have already gone (started, at ZeRO-2) and their whole gradients
    are dropped."""
    import torch
    import torch.nn.functional as F
    import torch_zero_equiv as t

    model, opt = t.make("sgd")
    eng = _engine(model, opt, stage, bucket_mb=t.BUCKET_MB)  # buckets of 64 elements
    queue = eng.queue if stage == 2 else eng.z3.queue
    assert len(queue.items) >= 5
    x, y = t.data(1, 4)
    F.cross_entropy(model(x, True), y).backward()
    reduced = queue.items[:queue.next]
    assert len(reduced) >= 3, (len(reduced), len(queue.items))
    for item in reduced:
        for i in (item.indices if stage == 2 else item.members):
            assert eng.params[i].grad is None, eng.names[i]
    eng.after_backward()
    assert queue.next == 0 and all(p.grad is None for p in eng.params)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_clip_grad_norm_returns_and_clips_as_torch(stage):
    import torch
    import torch.nn.functional as F
    import torch_zero_equiv as t

    for norm_type, max_norm in ((2.0, 0.1), (float("inf"), 0.05), (1.0, 1e6)):
        ref, _ = t.make("sgd")
        model, opt = t.make("sgd")
        eng = _engine(model, opt, stage)
        x, y = t.data(3, 6)
        F.cross_entropy(ref(x, True), y).backward()
        F.cross_entropy(model(x, True), y).backward()
        eng.after_backward()
        want = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm, norm_type)
        got = eng.clip_grad_norm_(model.parameters(), max_norm, norm_type)
        assert isinstance(got, torch.Tensor) and abs(float(got) - float(want)) <= 1e-5 * float(want), (norm_type, got, want)
        for name, p in ref.named_parameters():
            i = eng.aliases[name]
            if p.grad is None:
                assert not eng.has_grad[i], name
                continue
            got = eng._shard_view(i) if not eng.ranges else torch.cat([eng._piece_grad(pc) for pc in eng._pieces_of[i]])
            err = t.norm_err(got.reshape(-1), p.grad.reshape(-1))
            assert err <= 1e-5, (norm_type, name, err)


def test_range_group_cuts_parameters_at_equal_ranges():
    """13 elements on 3 ranks: ranges of ceil(13 / 3) = 5, the last one
    short (its padding exists in transit only); a parameter crossing a
    boundary is cut into one piece per owner."""
    import torch
    from tinyacc.torch_zero_range import RangeGroup, elementwise

    params = [torch.zeros(5), torch.zeros(1), torch.zeros(7)]
    groups = [RangeGroup([0, 1, 2], params, r, 3) for r in range(3)]
    assert groups[0].block == 5
    assert [g.layout[g.rank] for g in groups] == [[(0, 0, 5, 0)], [(1, 0, 1, 0), (2, 1, 4, 0)], [(2, 0, 3, 4)]]
    assert [g.shard.numel() for g in groups] == groups[0].fill == [5, 5, 3]
    assert [g.owned for g in groups] == [[0], [1, 2], [2]]
    # Columns [2, 5) of rank 1: the last 3 of parameter 2's first piece.
    assert list(groups[0].pieces(1, 2, 5)) == [(2, 1, 2, 5)]

    class MyAdam(torch.optim.Adam):
        pass
    p = [torch.nn.Parameter(torch.zeros(2))]
    assert elementwise(torch.optim.AdamW(p)) and elementwise(torch.optim.SGD(p, lr=0.1))
    assert not elementwise(MyAdam(p)) and not elementwise(torch.optim.Adagrad(p)) and not elementwise(None)
