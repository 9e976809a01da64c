"""Host tensors: a flat ctypes buffer plus a shape, convertible to lists and
NumPy arrays. They are what the engine reads from and writes into, so
passing one to a call copies nothing on the Python side."""

import ctypes

try:  # NumPy is optional; conversions use it when present.
    import numpy as _np
except ImportError:  # pragma: no cover - exercised only without numpy
    _np = None

_CTYPES = {"float32": ctypes.c_float, "int32": ctypes.c_int32}
_NP = {"float32": "float32", "int32": "int32"}


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _flatten(obj, shape_out, depth=0):
    """Flattens nested lists, recording the shape; ragged input is an error."""
    if isinstance(obj, (list, tuple)):
        if len(shape_out) <= depth:
            shape_out.append(len(obj))
        elif shape_out[depth] != len(obj):
            raise ValueError("tinyacc: ragged nested list: cannot make a tensor of it")
        out = []
        for item in obj:
            out.extend(_flatten(item, shape_out, depth + 1))
        return out
    return [obj]


class Tensor:
    """A dense float32 or int32 array on the host."""

    __slots__ = ("_buf", "shape", "dtype")

    def __init__(self, data, shape=None, dtype="float32"):
        if dtype not in _CTYPES:
            raise ValueError("tinyacc: dtype %r is not supported: use 'float32' or 'int32'" % dtype)
        ct = _CTYPES[dtype]
        if isinstance(data, Tensor):
            data = data.numpy() if _np is not None else data.tolist()
        if _np is not None and isinstance(data, _np.ndarray):
            arr = _np.ascontiguousarray(data, dtype=_NP[dtype])
            shape = tuple(arr.shape) if shape is None else tuple(shape)
            buf = (ct * arr.size)()
            ctypes.memmove(buf, arr.ctypes.data, arr.nbytes)
        elif isinstance(data, ctypes.Array):
            buf = data
            shape = (len(data),) if shape is None else tuple(shape)
        else:
            found = []
            flat = _flatten(data, found)
            shape = tuple(found) if shape is None else tuple(shape)
            buf = (ct * len(flat))(*flat)
        if _numel(shape) != len(buf):
            raise ValueError("tinyacc: %d elements do not fit shape %s" % (len(buf), shape))
        self._buf = buf
        self.shape = shape
        self.dtype = dtype

    @classmethod
    def empty(cls, shape, dtype="float32"):
        shape = tuple(shape)
        return cls((_CTYPES[dtype] * _numel(shape))(), shape, dtype)

    @classmethod
    def of(cls, obj, dtype):
        """obj as a tensor of dtype, without copying when it already is one."""
        if isinstance(obj, Tensor) and obj.dtype == dtype:
            return obj
        if hasattr(obj, "numpy") and not isinstance(obj, Tensor) and _np is not None:
            obj = obj.numpy()  # e.g. a torch tensor
        return cls(obj, dtype=dtype)

    @property
    def ptr(self):
        """The buffer as a ctypes pointer, for library calls."""
        return ctypes.cast(self._buf, ctypes.POINTER(_CTYPES[self.dtype]))

    def numel(self):
        return len(self._buf)

    def __len__(self):
        return self.shape[0] if self.shape else 1

    def numpy(self):
        """A NumPy array sharing this tensor's memory."""
        if _np is None:
            raise ImportError("tinyacc: Tensor.numpy() needs numpy; use tolist() without it")
        return _np.ctypeslib.as_array(self._buf).reshape(self.shape)

    def __array__(self, dtype=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def tolist(self):
        flat = list(self._buf)
        if not self.shape:
            return flat[0]
        for d in reversed(self.shape[1:]):
            flat = [flat[i:i + d] for i in range(0, len(flat), d)]
        return flat

    def item(self):
        if len(self._buf) != 1:
            raise ValueError("tinyacc: item() needs a tensor of one element, this one has %d" % len(self._buf))
        return self._buf[0]

    def __float__(self):
        return float(self.item())

    def __repr__(self):
        return "tinyacc.Tensor(%s, shape=%s, dtype=%s)" % (self.tolist(), self.shape, self.dtype)
