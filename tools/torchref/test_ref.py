"""Self-checks for the PyTorch reference: run with `/usr/bin/python3 -m pytest`.

The Go engine is judged against this reference, so the reference itself is
held against things it does not share code with: a naive float64 numpy
forward pass, central finite differences, a numpy AdamW, the closed-form
GELU, and safetensors bytes assembled by hand.
"""

import json
import math
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_ref  # noqa: E402
import safetensors_np as st  # noqa: E402

TINY = {"n_layer": 2, "n_head": 2, "n_embd": 8, "block_size": 6, "vocab_size": 11}


def expected_shapes(cfg):
    """The Hugging Face GPT-2 parameter layout, written out independently."""
    V, C, L = cfg["vocab_size"], cfg["n_embd"], cfg["block_size"]
    shapes = {"wte.weight": (V, C), "wpe.weight": (L, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for i in range(cfg["n_layer"]):
        p = "h.%d." % i
        shapes.update({
            p + "ln_1.weight": (C,), p + "ln_1.bias": (C,),
            p + "attn.c_attn.weight": (C, 3 * C), p + "attn.c_attn.bias": (3 * C,),
            p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
            p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
            p + "mlp.c_fc.weight": (C, 4 * C), p + "mlp.c_fc.bias": (4 * C,),
            p + "mlp.c_proj.weight": (4 * C, C), p + "mlp.c_proj.bias": (C,),
        })
    return shapes


def random_params(cfg, seed, std, dtype=np.float64):
    """Random values for every parameter, LayerNorm weights around 1."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in expected_shapes(cfg).items():
        v = rng.normal(0.0, std, shape)
        if ".ln_" in "." + name and name.endswith("weight"):
            v += 1.0
        params[name] = v.astype(dtype)
    return params


def torch_model(cfg, params, dtype=torch.float64):
    model = gpt2_ref.GPT2(cfg, dtype)
    gpt2_ref.load_params_(model, params)
    return model


def numpy_loss(P, cfg, x, y):
    """Naive float64 GPT-2 loss: explicit loops over batch, head and position."""
    C, nh = cfg["n_embd"], cfg["n_head"]
    hs = C // nh

    def ln(v, w, b):
        mu = v.mean(-1, keepdims=True)
        var = ((v - mu) ** 2).mean(-1, keepdims=True)
        return (v - mu) / np.sqrt(var + 1e-5) * w + b

    def gelu(v):
        return 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))

    B, T = x.shape
    h = P["wte.weight"][x] + P["wpe.weight"][:T]
    for i in range(cfg["n_layer"]):
        p = lambda n: P["h.%d.%s" % (i, n)]  # noqa: E731
        qkv = ln(h, p("ln_1.weight"), p("ln_1.bias")) @ p("attn.c_attn.weight") + p("attn.c_attn.bias")
        q, k, v = qkv[..., :C], qkv[..., C : 2 * C], qkv[..., 2 * C :]
        att = np.zeros((B, T, C))
        for b in range(B):
            for hd in range(nh):
                sl = slice(hd * hs, (hd + 1) * hs)
                for t in range(T):
                    s = np.array([q[b, t, sl] @ k[b, u, sl] for u in range(t + 1)]) / math.sqrt(hs)
                    w = np.exp(s - s.max())
                    w /= w.sum()
                    att[b, t, sl] = sum(w[u] * v[b, u, sl] for u in range(t + 1))
        h = h + att @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
        m = ln(h, p("ln_2.weight"), p("ln_2.bias")) @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias")
        h = h + gelu(m) @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
    logits = ln(h, P["ln_f.weight"], P["ln_f.bias"]) @ P["wte.weight"].T
    mx = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - mx).sum(-1)) + mx[..., 0]
    picked = np.take_along_axis(logits, y[..., None], -1)[..., 0]
    return float((lse - picked).mean())


# ---------------------------------------------------------------- safetensors


def test_safetensors_round_trip():
    rng = np.random.default_rng(0)
    tensors = {
        "b.f64": rng.normal(size=(3, 2)),
        "a.f32": rng.normal(size=(4,)).astype(np.float32),
        "c.i32": np.arange(-6, 6, dtype=np.int32).reshape(2, 3, 2),
        "d.i64": np.array([2**40, -1], dtype=np.int64),
        "e.scalar": np.array(7.5, dtype=np.float32),
        "f.empty": np.zeros((0, 3), dtype=np.float32),
        "g.bf16": np.array([1.0, -2.5, 3.140625], dtype=np.float32),
    }
    meta = {"n_layer": "2", "note": "ünïcode"}
    raw = st.dumps(tensors, meta, bf16=["g.bf16"])
    back, back_meta = st.loads(raw)
    assert back_meta == meta
    assert set(back) == set(tensors)
    for name, arr in tensors.items():
        assert back[name].shape == arr.shape, name
        np.testing.assert_array_equal(back[name], arr, err_msg=name)
    assert back["g.bf16"].dtype == np.float32
    assert back["c.i32"].dtype == np.int32

    # Layout, parsed by hand: header padded to 8, tensors sorted and packed.
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    header = json.loads(raw[8 : 8 + n].decode())
    names = [k for k in header if k != "__metadata__"]
    assert names == sorted(tensors)
    assert [header[k]["dtype"] for k in names] == ["F32", "F64", "I32", "I64", "F32", "F32", "BF16"]
    pos = 0
    for k in names:
        assert header[k]["data_offsets"][0] == pos
        pos = header[k]["data_offsets"][1]
    assert pos == len(raw) - 8 - n
    b, e = header["a.f32"]["data_offsets"]
    np.testing.assert_array_equal(np.frombuffer(raw[8 + n + b : 8 + n + e], "<f4"), tensors["a.f32"])


def test_safetensors_reads_hand_built_file(tmp_path):
    header = {
        "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "t": {"dtype": "BF16", "shape": [2], "data_offsets": [16, 20]},
        "__metadata__": {"k": "v"},
    }
    text = json.dumps(header).encode()
    data = struct.pack("<4f", 1, 2, 3, 4) + struct.pack("<2H", 0x3F80, 0xC040)  # bf16 1.0, -3.0
    path = tmp_path / "hand.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    tensors, meta = st.load_file(str(path))
    assert meta == {"k": "v"}
    np.testing.assert_array_equal(tensors["w"], [[1, 2], [3, 4]])
    np.testing.assert_array_equal(tensors["t"], [1.0, -3.0])


def test_bf16_rounding_matches_torch():
    bits = np.array([0x3F800000, 0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF, 0xC0490FDB, 0x00000001],
                    dtype=np.uint32)
    values = np.concatenate([bits.view(np.float32), np.random.default_rng(1).normal(size=1000).astype(np.float32)])
    want = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(st.f32_to_bf16_bits(values), want)
    assert np.isnan(st.bf16_bits_to_f32(st.f32_to_bf16_bits(np.array([np.nan], np.float32))))[0]


@pytest.mark.parametrize("mutate, message", [
    (lambda raw: raw[:-1], "data_offsets [0, 8] outside the 7-byte data section"),
    (lambda raw: raw[:5], "file is 5 bytes, too short for the 8-byte header length"),
    (lambda raw: raw.replace(b'"F32"', b'"F99"'), "unsupported dtype 'F99'"),
    (lambda raw: raw.replace(b"[2]", b"[3]"), "tensor 'x': 8 bytes for shape [3] of F32, expected 12"),
    (lambda raw: raw + b"junk", "data section is 12 bytes but tensors cover 8 (trailing bytes)"),
])
def test_safetensors_rejects_bad_files(mutate, message):
    raw = st.dumps({"x": np.array([1, 2], np.float32)})
    with pytest.raises(st.SafetensorsError) as err:
        st.loads(mutate(raw))
    assert message in str(err.value)


# ---------------------------------------------------------------- model


def test_parameter_names_and_shapes_are_hugging_face_gpt2():
    model = gpt2_ref.GPT2(TINY)
    got = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert got == expected_shapes(TINY)


def test_gelu_tanh_equals_formula():
    x = np.linspace(-8, 8, 2001)
    want = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    got = gpt2_ref.gelu_tanh(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_loss_at_small_init_is_log_vocab():
    cfg = dict(TINY, vocab_size=50, n_embd=16)
    model = torch_model(cfg, random_params(cfg, seed=2, std=1e-3))
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(0, 50, (4, 6), generator=gen)
    y = torch.randint(0, 50, (4, 6), generator=gen)
    _, loss = model(x, y)
    assert abs(loss.item() - math.log(50)) < 1e-3


def test_forward_matches_naive_numpy():
    P = random_params(TINY, seed=4, std=0.3)
    rng = np.random.default_rng(5)
    x = rng.integers(0, 11, (2, 6))
    y = rng.integers(0, 11, (2, 6))
    _, loss = torch_model(TINY, P)(torch.from_numpy(x), torch.from_numpy(y))
    assert loss.item() == pytest.approx(numpy_loss(P, TINY, x, y), rel=1e-12)


def test_gradients_match_central_differences():
    P = random_params(TINY, seed=6, std=0.3)
    rng = np.random.default_rng(7)
    x = torch.from_numpy(rng.integers(0, 11, (2, 5)))
    y = torch.from_numpy(rng.integers(0, 11, (2, 5)))
    model = torch_model(TINY, P)
    _, loss = model(x, y)
    loss.backward()
    params = dict(model.named_parameters())
    h = 1e-6
    checked = 0
    for name in ["wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.ln_1.bias", "h.0.attn.c_attn.weight",
                 "h.1.attn.c_attn.bias", "h.0.attn.c_proj.weight", "h.1.ln_2.weight", "h.1.mlp.c_fc.weight",
                 "h.0.mlp.c_fc.bias", "h.1.mlp.c_proj.weight", "ln_f.weight", "ln_f.bias"]:
        p = params[name]
        flat = p.detach().view(-1)
        idxs = list(rng.choice(flat.numel(), size=4, replace=False))
        if "c_attn" in name:
            # One coordinate in each of the q, k and v thirds of every row's columns.
            C = TINY["n_embd"]
            cols = [1, C + 2, 2 * C + 3]
            if p.dim() == 2:  # rows 2, 3, 4 of the [C, 3C] weight
                cols = [3 * C * (r + 2) + c for r, c in enumerate(cols)]
            idxs += cols
        for i in idxs:
            with torch.no_grad():
                orig = flat[i].item()
                flat[i] = orig + h
                up = model(x, y)[1].item()
                flat[i] = orig - h
                down = model(x, y)[1].item()
                flat[i] = orig
            numeric = (up - down) / (2 * h)
            analytic = p.grad.view(-1)[i].item()
            assert analytic == pytest.approx(numeric, rel=1e-5, abs=1e-8), "%s[%d]" % (name, i)
            checked += 1
    assert checked == 13 * 4 + 2 * 3


# ---------------------------------------------------------------- CLI + AdamW


def numpy_adamw(P, cfg, xs, ys, hp):
    """Train with a float64 numpy AdamW; gradients come from autograd on a fresh model.

    Returns (losses, first-step grads, pre-clip norms, final params).
    """
    P = {k: v.copy() for k, v in P.items()}
    m = {k: np.zeros_like(v) for k, v in P.items()}
    v2 = {k: np.zeros_like(v) for k, v in P.items()}
    losses, norms, first = [], [], None
    for s in range(xs.shape[0]):
        model = torch_model(cfg, P)
        _, loss = model(torch.from_numpy(xs[s]).long(), torch.from_numpy(ys[s]).long())
        loss.backward()
        g = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
        first = first or {k: a.copy() for k, a in g.items()}
        norm = math.sqrt(sum(float((a ** 2).sum()) for a in g.values()))
        if hp["grad_clip"] > 0 and norm > hp["grad_clip"]:
            g = {k: a * (hp["grad_clip"] / (norm + 1e-6)) for k, a in g.items()}
        t = s + 1
        for k in P:
            wd = hp["weight_decay"] if P[k].ndim >= 2 else 0.0
            P[k] *= 1 - hp["lr"] * wd
            m[k] = hp["beta1"] * m[k] + (1 - hp["beta1"]) * g[k]
            v2[k] = hp["beta2"] * v2[k] + (1 - hp["beta2"]) * g[k] ** 2
            mhat = m[k] / (1 - hp["beta1"] ** t)
            vhat = v2[k] / (1 - hp["beta2"] ** t)
            P[k] -= hp["lr"] * mhat / (np.sqrt(vhat) + hp["eps"])
        losses.append(loss.item())
        norms.append(norm)
    return losses, first, norms, P


@pytest.mark.parametrize("grad_clip", [0.0, 0.5])
def test_cli_matches_numpy_adamw(tmp_path, grad_clip):
    hp = {"lr": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "grad_clip": grad_clip}
    P = random_params(TINY, seed=8, std=0.2)
    rng = np.random.default_rng(9)
    xs = rng.integers(0, 11, (3, 2, 6)).astype(np.int32)
    ys = rng.integers(0, 11, (3, 2, 6)).astype(np.int32)
    meta = {k: str(v) for k, v in list(TINY.items()) + list(hp.items())}
    st.save_file(str(tmp_path / "in.safetensors"), dict(P, **{"batch.x": xs, "batch.y": ys}), meta)
    rc = gpt2_ref.main(["--in", str(tmp_path / "in.safetensors"), "--out", str(tmp_path / "out.safetensors")])
    assert rc == 0
    out, out_meta = st.load_file(str(tmp_path / "out.safetensors"))

    losses, grads, norms, final = numpy_adamw(P, TINY, xs, ys, hp)
    if grad_clip:
        assert norms[0] > grad_clip, "the clip must actually bite for this test to mean anything"
    assert out_meta == dict(meta, torch_version=torch.__version__)
    np.testing.assert_allclose(out["loss"], losses, rtol=1e-12)
    np.testing.assert_allclose(out["grad_norm"], norms, rtol=1e-12)
    for name in P:
        assert out["grad." + name].dtype == np.float64
        np.testing.assert_allclose(out["grad." + name], grads[name], rtol=1e-10, atol=1e-14, err_msg=name)
        np.testing.assert_allclose(out["param." + name], final[name], rtol=1e-9, atol=1e-12, err_msg=name)


def test_cli_keeps_float32(tmp_path):
    P = random_params(TINY, seed=10, std=0.02, dtype=np.float32)
    xs = np.zeros((1, 1, 4), np.int32)
    meta = {k: str(v) for k, v in TINY.items()}
    meta.update(lr="1e-3", beta1="0.9", beta2="0.999", eps="1e-8", weight_decay="0", grad_clip="0")
    st.save_file(str(tmp_path / "in.st"), dict(P, **{"batch.x": xs, "batch.y": xs}), meta)
    assert gpt2_ref.main(["--in", str(tmp_path / "in.st"), "--out", str(tmp_path / "out.st")]) == 0
    out, _ = st.load_file(str(tmp_path / "out.st"))
    assert out["grad.wte.weight"].dtype == np.float32
    assert out["param.h.1.mlp.c_fc.weight"].dtype == np.float32
    assert out["loss"].dtype == np.float64 and out["loss"].shape == (1,)


@pytest.mark.parametrize("change, message", [
    (lambda t, m: m.pop("beta2"), "metadata lacks ['beta2']"),
    (lambda t, m: m.update(n_head="three"), "metadata n_head='three' is not an integer"),
    (lambda t, m: t.update({"h.0.attn.c_attn.w": t.pop("h.0.attn.c_attn.weight")}),
     "missing ['h.0.attn.c_attn.weight'], unexpected ['h.0.attn.c_attn.w']"),
    (lambda t, m: t.update({"batch.y": t["batch.y"] + 11}), "batch.y holds tokens in [11, 11], outside"),
])
def test_cli_reports_bad_input(tmp_path, capsys, change, message):
    tensors = random_params(TINY, seed=11, std=0.02)
    tensors["batch.x"] = np.zeros((1, 1, 3), np.int32)
    tensors["batch.y"] = np.zeros((1, 1, 3), np.int32)
    meta = {k: str(v) for k, v in TINY.items()}
    meta.update(lr="1e-3", beta1="0.9", beta2="0.999", eps="1e-8", weight_decay="0", grad_clip="0")
    change(tensors, meta)
    st.save_file(str(tmp_path / "in.st"), tensors, meta)
    assert gpt2_ref.main(["--in", str(tmp_path / "in.st"), "--out", str(tmp_path / "out.st")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out.st").exists()


def test_script_runs_as_a_program(tmp_path):
    """The Go test starts the script as a process; check that path end to end."""
    P = random_params(TINY, seed=12, std=0.02, dtype=np.float32)
    xs = np.ones((2, 1, 3), np.int32)
    meta = {k: str(v) for k, v in TINY.items()}
    meta.update(lr="1e-3", beta1="0.9", beta2="0.999", eps="1e-8", weight_decay="0.1", grad_clip="1")
    st.save_file(str(tmp_path / "in.st"), dict(P, **{"batch.x": xs, "batch.y": xs}), meta)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt2_ref.py")
    done = subprocess.run([sys.executable, script, "--in", str(tmp_path / "in.st"), "--out", str(tmp_path / "out.st"),
                           "--threads", "2"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out, _ = st.load_file(str(tmp_path / "out.st"))
    assert out["loss"].shape == (2,)
    assert out["loss"][1] < out["loss"][0]  # same batch twice: the update must help


def test_param_copies_read_bf16_and_keep_float32_masters():
    """train_step(param_copies="bf16") computes the loss and the gradients of
    a model whose parameters were rounded to bfloat16 beforehand, and steps
    the float32 masters: after a step at learning rate 0 they are bitwise
    the values given, not their rounding."""
    params = random_params(TINY, seed=7, std=0.3, dtype=np.float32)
    rounded = {k: torch.from_numpy(v).to(torch.bfloat16).float().numpy() for k, v in params.items()}
    rng = np.random.default_rng(8)
    x = torch.from_numpy(rng.integers(0, TINY["vocab_size"], (2, 5)))
    y = torch.from_numpy(rng.integers(0, TINY["vocab_size"], (2, 5)))
    runs = []
    for values, copies in ((params, "bf16"), (rounded, None)):
        model = torch_model(TINY, values, torch.float32)
        opt = gpt2_ref.make_optimizer(model, 0.0, 0.9, 0.95, 1e-8, 0.0)
        grads = {}

        def grab(m, grads=grads):
            grads.update({n: p.grad.detach().clone() for n, p in m.named_parameters()})

        loss, _ = gpt2_ref.train_step(model, opt, x, y, 0.0, grab, param_copies=copies)
        runs.append((loss, grads, {n: p.detach().numpy().copy() for n, p in model.named_parameters()}))
    (loss, grads, after), (want_loss, want_grads, _) = runs
    assert loss == want_loss
    for name in grads:
        assert torch.equal(grads[name], want_grads[name]), name
        np.testing.assert_array_equal(after[name], params[name])
    assert any(not np.array_equal(params[n], rounded[n]) for n in params)
