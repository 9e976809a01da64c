"""Loading libtinyacc.so and calling it: status codes become exceptions."""

import ctypes
import os

_HERE = os.path.dirname(os.path.abspath(__file__))

# Status codes of tinyacc.h.
STATUS_NAMES = {
    -1: "invalid argument",
    -2: "bad handle",
    -3: "config error",
    -4: "size mismatch",
    -5: "I/O error",
    -6: "wrong state",
    -7: "communication error",
    -8: "runtime error",
    -9: "unsupported",
    -10: "internal error",
}
ERR_HANDLE = -2
ERR_CONFIG = -3
ABI_VERSION = 5


class TinyaccError(RuntimeError):
    """A tinyacc call failed; the message is the engine's own.

    ``status`` is the negative status code of tinyacc.h, ``kind`` its name.
    """

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status
        self.kind = STATUS_NAMES.get(status, "error")


class ConfigError(TinyaccError, ValueError):
    """The configuration is invalid; the message names the key."""


class HandleError(TinyaccError):
    """An object was used after being freed (or is of the wrong kind)."""


def _library_path():
    env = os.environ.get("TINYACC_LIB")
    if env:
        return env
    return os.path.join(_HERE, "libtinyacc.so")


def _load():
    path = _library_path()
    if not os.path.exists(path):
        raise ImportError(
            "tinyacc: the native library %s is missing. Build it with\n"
            "    go build -buildmode=c-shared -o python/tinyacc/libtinyacc.so ./capi\n"
            "(or `make python`) from the tinyacc repository, install the package with\n"
            "    pip install --no-build-isolation ./python\n"
            "or point TINYACC_LIB at an existing libtinyacc.so." % path
        )
    try:
        # CDLL, not PyDLL: the GIL is released during calls, so other
        # Python threads run while a step trains.
        return ctypes.CDLL(path)
    except OSError as e:
        raise ImportError("tinyacc: cannot load %s: %s" % (path, e)) from e


lib = _load()

i64 = ctypes.c_int64
i32 = ctypes.c_int32
f64 = ctypes.c_double
P = ctypes.POINTER
_c = ctypes.c_int
_s = ctypes.c_char_p
_f32p = P(ctypes.c_float)
_i32p = P(ctypes.c_int32)

_SIGNATURES = {
    "tinyacc_version": (_s, []),
    "tinyacc_abi_version": (_c, []),
    "tinyacc_last_error": (_s, []),
    "tinyacc_free": (_c, [i64]),
    "tinyacc_config_new": (_c, [_s, P(i64)]),
    "tinyacc_config_from_env": (_c, [_s, P(i64)]),
    "tinyacc_config_json": (_c, [i64, ctypes.c_char_p, i64, P(i64)]),
    "tinyacc_model_new": (_c, [i64, P(i64)]),
    "tinyacc_model_save": (_c, [i64, _s]),
    "tinyacc_model_load": (_c, [i64, _s]),
    "tinyacc_param_count": (_c, [i64, P(i64)]),
    "tinyacc_param_name": (_c, [i64, i64, ctypes.c_char_p, i64, P(i64)]),
    "tinyacc_param_shape": (_c, [i64, _s, P(i64), i64, P(i64)]),
    "tinyacc_param_get": (_c, [i64, _s, _f32p, i64]),
    "tinyacc_param_set": (_c, [i64, _s, _f32p, i64]),
    "tinyacc_grad_get": (_c, [i64, _s, _f32p, i64]),
    "tinyacc_generate": (_c, [i64, _i32p, i64, i64, f64, i64, i64, _i32p]),
    "tinyacc_optimizer_new": (_c, [i64, i64, P(i64)]),
    "tinyacc_optimizer_save": (_c, [i64, _s]),
    "tinyacc_optimizer_load": (_c, [i64, _s]),
    "tinyacc_loader_new": (_c, [i64, P(i64)]),
    "tinyacc_loader_info": (_c, [i64, P(i64), P(i64), P(i64), P(i64)]),
    "tinyacc_loader_batch": (_c, [i64, i64, i64, _i32p, _i32p, i64]),
    "tinyacc_prepare": (_c, [i64, i64, i64, i64, P(i64)]),
    "tinyacc_forward": (_c, [i64, _i32p, _i32p, i64, i64, P(i64), P(f64)]),
    "tinyacc_loss_value": (_c, [i64, P(f64)]),
    "tinyacc_backward": (_c, [i64]),
    "tinyacc_step": (_c, [i64, P(i32)]),
    "tinyacc_zero_grad": (_c, [i64]),
    "tinyacc_train_step": (_c, [i64, _i32p, _i32p, i64, P(f64)]),
    "tinyacc_run_step": (_c, [i64, P(f64)]),
    "tinyacc_evaluate": (_c, [i64, P(f64)]),
    "tinyacc_clip_grad_norm": (_c, [i64, f64, P(f64)]),
    "tinyacc_metrics": (_c, [i64, P(f64), i64]),
    "tinyacc_session_state": (_c, [i64, P(i64), P(i64)]),
    "tinyacc_set_step": (_c, [i64, i64]),
    "tinyacc_save_checkpoint": (_c, [i64, _s]),
    "tinyacc_load_checkpoint": (_c, [i64, _s, P(i64)]),
    "tinyacc_dist_init": (_c, [P(i64), P(i64)]),
    "tinyacc_dist_init_config": (_c, [i64, P(i64), P(i64)]),
    "tinyacc_dist_finalize": (_c, []),
    "tinyacc_all_reduce": (_c, [_f32p, i64, i32]),
    "tinyacc_all_gather": (_c, [_f32p, i64, _f32p, i64]),
    "tinyacc_reduce_scatter": (_c, [_f32p, i64, _f32p, i64, i32]),
    "tinyacc_reduce_scatter_start": (_c, [_f32p, i64, _f32p, i64, i32, P(i64)]),
    "tinyacc_reduce_scatter_as": (_c, [_f32p, i64, _f32p, i64, i32, _s]),
    "tinyacc_reduce_scatter_start_as": (_c, [_f32p, i64, _f32p, i64, i32, _s, P(i64)]),
    "tinyacc_collective_wait": (_c, [i64]),
    "tinyacc_broadcast": (_c, [_f32p, i64, i32]),
    "tinyacc_barrier": (_c, []),
    "tinyacc_comm_sent_bytes": (_c, [P(i64)]),
    "tinyacc_buffer_register": (_c, [ctypes.c_void_p, i64, P(i64)]),
    "tinyacc_reducer_new": (_c, [P(i64), i64, f64, i32, P(i64)]),
    "tinyacc_bucket_ready": (_c, [i64, i64]),
    "tinyacc_buckets_wait": (_c, [i64]),
    "tinyacc_reducer_trace": (_c, [i64, _s]),
    "tinyacc_reducer_reduce_dtype": (_c, [i64, _s]),
}

for _name, (_res, _args) in _SIGNATURES.items():
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args

if lib.tinyacc_abi_version() != ABI_VERSION:
    raise ImportError(
        "tinyacc: %s has ABI version %d but this package needs %d; rebuild the library"
        % (_library_path(), lib.tinyacc_abi_version(), ABI_VERSION)
    )


def check(status):
    """Raises the exception matching a non-zero status."""
    if status == 0:
        return
    msg = lib.tinyacc_last_error().decode("utf-8", "replace")
    cls = {ERR_HANDLE: HandleError, ERR_CONFIG: ConfigError}.get(status, TinyaccError)
    raise cls(msg, status)


def encode(s):
    return s.encode("utf-8") if isinstance(s, str) else s


def read_string(fn, *args):
    """Calls a tinyacc_* function that writes a NUL-terminated string
    (buf, cap, need): first for the size, then for the text."""
    need = i64()
    check(fn(*args, None, 0, ctypes.byref(need)))
    buf = ctypes.create_string_buffer(need.value)
    check(fn(*args, buf, need.value, None))
    return buf.value.decode("utf-8")


class Handle:
    """Owner of a tinyacc handle; frees it when garbage-collected.

    ``free()`` releases it explicitly. The number is kept afterwards, so a
    later use reaches the library and raises HandleError instead of
    touching freed memory.
    """

    __slots__ = ("_h", "_freed", "__weakref__")

    def __init__(self, h):
        self._h = h
        self._freed = False

    @property
    def handle(self):
        return self._h

    def free(self):
        self._freed = True
        check(lib.tinyacc_free(self._h))

    def __del__(self):
        if not self._freed and lib is not None:
            try:
                lib.tinyacc_free(self._h)
            except Exception:
                pass
