"""Run configurations, resolved and validated by the engine."""

import copy
import ctypes
import json
import os

from ._lib import Handle, check, encode, i64, lib, read_string

# tinyacc_config_resolve(file, text, args, *config): every layer of the
# command line, resolved by the engine's one loader.
lib.tinyacc_config_resolve.restype = ctypes.c_int
lib.tinyacc_config_resolve.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(i64)]


class Section(dict):
    """A config section whose keys are also attributes (cfg.train.lr)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError("config has no key %r (known: %s)" % (name, ", ".join(sorted(self)))) from None


def _sections(d):
    return Section({k: _sections(v) if isinstance(v, dict) else v for k, v in d.items()})


def _flag_value(v):
    """A value spelled as the command line takes it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return ",".join(_flag_value(x) for x in v)
    if isinstance(v, float):
        return repr(v)
    return str(v)


def flags(overrides, prefix=""):
    """The nested overrides dict as command-line flags ("--train.lr=0.001"),
    one per key; None values are skipped (they mean "not given")."""
    out = []
    for k, v in overrides.items():
        if v is None:
            continue
        key = prefix + k
        if isinstance(v, dict):
            out.extend(flags(v, key + "."))
        else:
            out.append("--%s=%s" % (key, _flag_value(v)))
    return out


def merge(base, overrides):
    """A deep copy of base with the nested overrides dict laid over it;
    None values in overrides are skipped (they mean "not given")."""
    out = copy.deepcopy(dict(base))
    for k, v in overrides.items():
        if v is None:
            continue
        if isinstance(v, dict):
            out[k] = merge(out.get(k, {}), v)
        else:
            out[k] = v
    return out


class Config:
    """A validated run configuration: every key of `tinyacc config show`.

    Every entry point layers like the command line, through the engine's
    one loader: ``Config.load(file)`` is defaults < file < TINYACC_*
    environment, ``Config.from_dict`` and ``Config.from_text`` are
    defaults < dict or text < environment, and ``with_overrides`` lays
    explicit arguments (keyword arguments, a prepared model's shape,
    optimizer arguments) over all of them, as flags are laid over a
    `tinyacc train` run. Values read as attributes or items:
    ``cfg.train.lr``, ``cfg["model"]["n_layer"]``. Invalid keys or values,
    and TINYACC_ variables that are no key, raise ConfigError naming them.
    """

    def __init__(self, handle):
        self._handle = Handle(handle)
        self._values = _sections(json.loads(read_string(lib.tinyacc_config_json, handle)))

    @classmethod
    def from_text(cls, text):
        h = i64()
        check(lib.tinyacc_config_new(encode(text or ""), ctypes.byref(h)))
        return cls(h.value)

    @classmethod
    def from_dict(cls, values):
        return cls.from_text(json.dumps(values))

    @classmethod
    def resolve(cls, file=None, text=None, overrides=None):
        """defaults < file or text < TINYACC_* environment < overrides (a
        nested dict, the top layer), as `tinyacc train --config file
        --key=value...` resolves them."""
        if file is not None and not os.path.exists(file):
            raise FileNotFoundError("tinyacc: config file %s does not exist" % file)
        args = "\n".join(flags(overrides or {}))
        h = i64()
        check(lib.tinyacc_config_resolve(encode(file or ""), encode(text or ""), encode(args), ctypes.byref(h)))
        return cls(h.value)

    @classmethod
    def load(cls, file=None):
        if file is not None and not os.path.exists(file):
            raise FileNotFoundError("tinyacc: config file %s does not exist" % file)
        h = i64()
        check(lib.tinyacc_config_from_env(encode(file or ""), ctypes.byref(h)))
        return cls(h.value)

    @classmethod
    def coerce(cls, config):
        """A Config from None (defaults + environment), a file name, a dict,
        YAML/JSON text or a Config."""
        if config is None:
            return cls.load(None)
        if isinstance(config, Config):
            return config
        if isinstance(config, dict):
            return cls.from_dict(config)
        if isinstance(config, (str, os.PathLike)):
            s = os.fspath(config)
            if os.path.exists(s) or (("\n" not in s) and s.endswith((".yaml", ".yml", ".json"))):
                return cls.load(s)
            return cls.from_text(s)
        raise TypeError("tinyacc: config must be a file name, a dict, YAML text or a Config, not %s" % type(config).__name__)

    def with_overrides(self, overrides):
        """A new Config: this one with the nested overrides laid over it as
        the top layer (the environment, already in this config's values,
        does not win over them)."""
        return Config.resolve(text=json.dumps(self.to_dict()), overrides=overrides)

    @property
    def handle(self):
        return self._handle.handle

    def to_dict(self):
        return json.loads(json.dumps(self._values))

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._values, name)

    def __getitem__(self, key):
        return self._values[key]

    def __repr__(self):
        return "tinyacc.Config(%s)" % json.dumps(self._values, sort_keys=True)
