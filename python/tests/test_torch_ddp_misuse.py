"""Torch objects through Accelerator.prepare in one process: what is
refused and how, the loader's sharding, sync_gradients, state round trips."""

import os

import pytest
import torch
import torch.nn.functional as F

from tinyacc import Accelerator
from tinyacc.torch_prepare import ShardedBatchSampler

from torch_models import RefModel, dataset, make_optimizer, new_model


def test_float64_parameter_is_refused_by_name():
    m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).double())
    with pytest.raises(TypeError) as e:
        Accelerator().prepare(m)
    assert str(e.value) == "tinyacc: parameter '1.weight' is float64; only float32 parameters are supported (call model.float() before prepare)"


def test_non_contiguous_parameter_is_refused_by_name():
    m = torch.nn.Linear(3, 2)
    m.weight = torch.nn.Parameter(torch.randn(3, 2).t())
    with pytest.raises(TypeError) as e:
        Accelerator().prepare(m)
    assert str(e.value) == "tinyacc: parameter 'weight' is not contiguous (strides (1, 2) for shape (2, 3)); make it contiguous before prepare"


def test_model_changed_after_prepare_is_refused():
    m = torch.nn.Sequential(torch.nn.Linear(2, 2))
    acc = Accelerator()
    pm = acc.prepare(m)
    m.append(torch.nn.Linear(2, 2))
    with pytest.raises(RuntimeError) as e:
        acc.backward(pm(torch.ones(1, 2)).sum())
    assert str(e.value) == "tinyacc: the model changed after prepare: parameter '1.weight' is new; prepare the model again after changing it"


def test_replaced_parameter_is_refused():
    m = torch.nn.Linear(2, 2)
    acc = Accelerator()
    pm = acc.prepare(m)
    m.weight = torch.nn.Parameter(torch.zeros(2, 2))
    with pytest.raises(RuntimeError) as e:
        acc.backward(pm(torch.ones(1, 2)).sum())
    assert "parameter 'weight' is new" in str(e.value) or "'weight' is gone" in str(e.value)


def test_step_before_backward_is_refused():
    m = torch.nn.Linear(2, 2)
    acc = Accelerator()
    pm, opt = acc.prepare(m, torch.optim.SGD(m.parameters(), lr=0.1))
    with pytest.raises(RuntimeError) as e:
        opt.step()
    assert str(e.value) == "tinyacc: optimizer.step() before any accelerator.backward(loss): there are no gradients to apply"


def test_prepare_keeps_kinds_and_names():
    m = new_model()
    opt = make_optimizer("adamw", m.parameters())
    dl = torch.utils.data.DataLoader(dataset(8), batch_size=2)
    acc = Accelerator()
    pdl, pm, popt = acc.prepare(dl, m, opt)
    assert isinstance(pm, torch.nn.Module) and isinstance(popt, torch.optim.Optimizer)
    assert isinstance(pdl, torch.utils.data.DataLoader) and pdl.batch_size == 2
    assert list(pm.state_dict()) == list(m.state_dict())
    assert acc.unwrap_model(pm) is m
    # A parameter no rank used keeps grad None; used ones are bucket views.
    x, flag, y = dataset(4)[0:4]
    acc.backward(F.cross_entropy(pm(x, flag), y))
    assert m.extra.weight.grad is None and m.fc1.weight.grad is not None


def test_grad_accum_sync_rule_and_no_communication():
    """Accelerate's rule: sync on every 3rd micro-batch and on the loader's
    last; step and zero_grad act only then."""
    m = torch.nn.Linear(2, 1)
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(5, 2)), batch_size=1)
    acc = Accelerator(gradient_accumulation_steps=3)
    pm, popt, pdl = acc.prepare(m, torch.optim.SGD(m.parameters(), lr=0.0), dl)
    syncs = []
    for (x,) in pdl:
        with acc.accumulate(pm):
            acc.backward(pm(x).sum())
            syncs.append((acc.sync_gradients, float(m.bias.grad)))
            popt.step()
            popt.zero_grad()
    # Bias gradient: 1/3 per micro-batch, summed until a sync zeroes it.
    assert syncs == [(False, pytest.approx(1 / 3)), (False, pytest.approx(2 / 3)), (True, pytest.approx(1.0)),
                     (False, pytest.approx(1 / 3)), (True, pytest.approx(2 / 3))]


def test_sharded_loader_reads_what_one_process_reads():
    """N ranks' micro-batch j together are one process's batch j of size
    B·N, the same shuffled permutation, padded from the start."""
    n, B, N = 11, 2, 3
    one = list(ShardedBatchSampler(n, B * N, 1, 0, True, 42, False))
    ranks = [list(ShardedBatchSampler(n, B, N, r, True, 42, False)) for r in range(N)]
    assert [len(r) for r in ranks] == [2, 2, 2]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(42)).tolist()
    for j in range(2):
        assert sum((ranks[r][j] for r in range(N)), []) == one[j]
    assert sum(one, []) == perm + perm[:1]
    assert ShardedBatchSampler(n, B, N, 0, True, 42, False).remainder == 5


def test_save_state_then_load_state_resumes_exactly(tmp_path):
    def run(steps, load=None, save=None):
        torch.manual_seed(3)
        m = RefModel()
        opt = make_optimizer("adamw", m.parameters())
        dl = torch.utils.data.DataLoader(dataset(16), batch_size=2, shuffle=True)
        acc = Accelerator({"train": {"seed": 5}})
        pm, popt, pdl = acc.prepare(m, opt, dl)
        if load:
            acc.load_state(load)
        losses = []
        for x, flag, y in pdl:
            loss = F.cross_entropy(pm(x, flag), y)
            acc.backward(loss)
            popt.step()
            popt.zero_grad()
            losses.append(loss.item())
            if len(losses) == steps:
                break
        if save:
            acc.save_state(save)
        return losses, m.state_dict()
    full, w_full = run(6)
    first, _ = run(3, save=str(tmp_path / "ck"))
    assert sorted(os.listdir(tmp_path / "ck")) == ["model.safetensors", "optimizer.bin", "random_states_0.pkl", "state.json"]
    rest, w_rest = run(3, load=str(tmp_path / "ck"))
    assert first + rest == full
    for k in w_full:
        assert torch.equal(w_full[k], w_rest[k]), k


def test_gpt_path_sync_gradients_follows_the_same_rule():
    """Before any torch object: sync_gradients is True outside accumulate()
    and, inside, True on every grad_accum-th block only."""
    acc = Accelerator(gradient_accumulation_steps=2)
    assert acc.sync_gradients
    seen = []
    for _ in range(4):
        with acc.accumulate():
            seen.append(acc.sync_gradients)
    assert seen == [False, True, False, True]


def test_memory_rows_count_what_the_engine_holds():
    """params and grads: every parameter once (the tied one too); AdamW:
    two moments per parameter plus a 4-byte step each; activations: the
    input a Linear saves for its weight gradient (its weight is a parameter
    and not counted)."""
    m = torch.nn.Linear(4, 3)
    acc = Accelerator()
    pm, opt = acc.prepare(m, torch.optim.AdamW(m.parameters()))
    acc.backward(pm(torch.ones(5, 4)).sum())
    opt.step()
    mem = acc.memory()
    assert mem["params_bytes"] == mem["grads_bytes"] == 4 * (12 + 3)
    assert mem["optim_bytes"] == 2 * 4 * (12 + 3) + 2 * 4
    assert mem["activations_peak_bytes"] == 5 * 4 * 4
    assert mem["rss_peak_bytes"] > 0
