"""GPT-2 and Llama models trained by the engine."""

import ctypes
from dataclasses import dataclass, fields
from typing import Optional

from ._lib import Handle, check, encode, i64, lib, read_string
from .config import Config
from .session import Session
from .tensor import Tensor


@dataclass
class GPTConfig:
    """The model.* keys; None takes the run config's (or built-in) value.

    ``arch="llama"`` builds a Llama (Hugging Face Llama names) shaped by the
    llama keys below; with the default ``"gpt2"`` they stay None.
    """

    n_layer: Optional[int] = None
    n_head: Optional[int] = None
    n_embd: Optional[int] = None
    block_size: Optional[int] = None
    vocab_size: Optional[int] = None
    arch: Optional[str] = None
    n_kv_head: Optional[int] = None
    intermediate_size: Optional[int] = None
    rope_theta: Optional[float] = None
    norm_eps: Optional[float] = None
    tie_embeddings: Optional[bool] = None

    @classmethod
    def from_config(cls, config):
        """The model shape of a run config (a Config, dict, file or text)."""
        m = Config.coerce(config).model
        return cls(**{f.name: m[f.name] for f in fields(cls)})

    def to_dict(self):
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


class Parameter:
    """A named parameter of a model; ``data`` and ``grad`` are copies."""

    __slots__ = ("model", "name", "shape")

    def __init__(self, model, name, shape):
        self.model, self.name, self.shape = model, name, shape

    @property
    def data(self):
        t = Tensor.empty(self.shape)
        check(lib.tinyacc_param_get(self.model.handle, encode(self.name), t.ptr, t.numel()))
        return t

    @property
    def grad(self):
        t = Tensor.empty(self.shape)
        check(lib.tinyacc_grad_get(self.model.handle, encode(self.name), t.ptr, t.numel()))
        return t

    def copy_(self, values):
        """Overwrites the parameter with values (same number of elements)."""
        t = Tensor.of(values, "float32")
        check(lib.tinyacc_param_set(self.model.handle, encode(self.name), t.ptr, t.numel()))

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __repr__(self):
        return "Parameter(%s, shape=%s)" % (self.name, self.shape)


class GPT:
    """A GPT-2 model (Hugging Face parameter names) living in the engine.

    ``GPT(GPTConfig(n_layer=2))`` builds one over the defaults,
    ``GPT(run_config)`` takes the shape, seed and init_from of a run
    config. ``loss = model(x, y)`` runs forward on [batch, seq] int32
    tokens and returns a Loss for ``backward``.
    """

    def __init__(self, config=None, seed=None):
        if config is None or isinstance(config, GPTConfig):
            overrides = {"model": (config or GPTConfig()).to_dict()}
            if seed is not None:
                overrides["train"] = {"seed": int(seed)}
            # The shape given here is an explicit argument: the top layer,
            # over TINYACC_* variables (keys it leaves None come from them).
            cfg = Config.resolve(overrides=overrides)
        else:
            cfg = Config.coerce(config)
            if seed is not None:
                cfg = cfg.with_overrides({"train": {"seed": int(seed)}})
        h = i64()
        check(lib.tinyacc_model_new(cfg.handle, ctypes.byref(h)))
        self._handle = Handle(h.value)
        self._cfg = cfg
        self.config = GPTConfig.from_config(cfg)
        self._session = None
        self._params = None
        self.training = True

    @property
    def handle(self):
        return self._handle.handle

    def free(self):
        """Releases the model's handle; later calls raise HandleError."""
        self._handle.free()

    # -- parameters ---------------------------------------------------------

    def named_parameters(self):
        if self._params is None:
            n = i64()
            check(lib.tinyacc_param_count(self.handle, ctypes.byref(n)))
            params = []
            for i in range(n.value):
                name = read_string(lib.tinyacc_param_name, self.handle, i)
                dims = (ctypes.c_int64 * 8)()
                nd = i64()
                check(lib.tinyacc_param_shape(self.handle, encode(name), dims, 8, ctypes.byref(nd)))
                params.append(Parameter(self, name, tuple(dims[:nd.value])))
            self._params = params
        else:
            # Reach the library even when cached, so a freed model raises.
            check(lib.tinyacc_param_count(self.handle, ctypes.byref(i64())))
        return [(p.name, p) for p in self._params]

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def num_parameters(self):
        return sum(p.numel() for p in self.parameters())

    def state_dict(self):
        return {name: p.data for name, p in self.named_parameters()}

    def load_state_dict(self, state):
        params = dict(self.named_parameters())
        missing = sorted(set(params) - set(state))
        unknown = sorted(set(state) - set(params))
        if missing or unknown:
            raise KeyError("tinyacc: state dict does not fit the model: missing %s, unknown %s" % (missing, unknown))
        for name, values in state.items():
            params[name].copy_(values)

    def save(self, path):
        """Writes safetensors that `tinyacc sample --from` reads. Once the
        model is prepared data-parallel, every rank must call it (ZeRO-3
        gathers the shards) and rank 0 writes."""
        check(lib.tinyacc_model_save(self.handle, encode(str(path))))

    def load(self, path):
        """Reads safetensors (tinyacc's or Hugging Face GPT-2's). Once the
        model is prepared, each rank reads only the parts it holds."""
        check(lib.tinyacc_model_load(self.handle, encode(str(path))))

    # -- running --------------------------------------------------------------

    def _ensure_session(self):
        if self._session is None:
            self._session = Session(self._cfg, self)
        return self._session

    def __call__(self, x, y):
        return self.forward(x, y)

    def forward(self, x, y):
        """Mean cross-entropy of next-token targets y given inputs x."""
        from . import _grad_enabled
        return self._ensure_session().forward(x, y, grad=_grad_enabled())

    def train(self, mode=True):
        self.training = mode
        return self

    def eval(self):
        return self.train(False)

    def generate(self, prompt, max_new_tokens, temperature=1.0, top_k=0, seed=0):
        """Samples tokens after prompt (a str or token ids); returns the new
        tokens, or the new text when prompt is a str."""
        as_text = isinstance(prompt, str)
        ids = list(prompt.encode("utf-8")) if as_text else list(prompt)
        p = (ctypes.c_int32 * max(1, len(ids)))(*ids)
        out = (ctypes.c_int32 * max(1, max_new_tokens))()
        check(lib.tinyacc_generate(self.handle, p, len(ids), max_new_tokens, float(temperature), int(top_k), int(seed), out))
        toks = list(out[:max_new_tokens])
        return bytes(t for t in toks if t < 256).decode("utf-8", "replace") if as_text else toks

    def __repr__(self):
        return "tinyacc.models.GPT(%s)" % self.config
