"""Read and write safetensors files with numpy alone.

The PyTorch reference exchanges tensors with the Go engine through
safetensors files, the same format the engine uses for checkpoints. The
`safetensors` Python package is not available everywhere the reference runs,
so this module implements the (small) format directly:

    8 bytes   little-endian u64 N, the length of the JSON header
    N bytes   JSON: {"name": {"dtype": "F32", "shape": [...],
                              "data_offsets": [begin, end]}, ...,
                     "__metadata__": {"key": "value", ...}}
    rest      the data section; offsets are relative to its start

Files written here list tensors sorted by name, store them back to back in
that order, and pad the header with spaces to a multiple of 8 bytes so the
data section starts aligned for any element type.

numpy has no bfloat16, so BF16 tensors are widened to float32 on reading
(exact) and narrowed from float32 with round-to-nearest-even on writing.
"""

import json
import struct

import numpy as np

# Element types the format names, mapped to little-endian numpy dtypes.
# BF16 is absent on purpose: it has no numpy dtype and is handled apart.
_NP_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_ITEMSIZE = {name: dt.itemsize for name, dt in _NP_DTYPES.items()}
_ITEMSIZE["BF16"] = 2

# A header larger than this is almost surely a corrupt length field; the
# reference implementation of the format uses the same 100 MB bound.
_MAX_HEADER = 100 * 1000 * 1000


class SafetensorsError(ValueError):
    """A file or a tensor that does not follow the safetensors format."""


def _dtype_name(arr):
    """Return the safetensors dtype name for a numpy array's element type."""
    for name, dt in _NP_DTYPES.items():
        if arr.dtype.newbyteorder("<") == dt:
            return name
    raise SafetensorsError(
        "unsupported numpy dtype %s; use one of float64, float32, float16, "
        "int64, int32, int16, int8, uint8, bool (or name the tensor in bf16=)"
        % arr.dtype
    )


def bf16_bits_to_f32(bits):
    """Widen raw bfloat16 bit patterns (uint16) to float32; this is exact."""
    bits = np.asarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(values):
    """Narrow float32 values to bfloat16 bit patterns, rounding to nearest even.

    Plain truncation would bias every value toward zero; rounding to nearest
    even is what PyTorch and the Go engine do, so files agree bit for bit.
    NaNs stay NaNs (rounding could otherwise carry them into infinity).
    """
    f = np.ascontiguousarray(values, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    out = rounded.astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        out[nan] = ((u[nan] >> 16) | 0x0040).astype(np.uint16)
    return out


def save_file(path, tensors, metadata=None, bf16=()):
    """Write `tensors` (name -> numpy array) and string `metadata` to `path`.

    Names listed in `bf16` are stored as BF16 after rounding to float32 and
    then to bfloat16. Everything else keeps its numpy element type.
    """
    with open(path, "wb") as f:
        f.write(dumps(tensors, metadata, bf16))


def dumps(tensors, metadata=None, bf16=()):
    """Serialize tensors and metadata to safetensors bytes (see save_file)."""
    bf16 = set(bf16)
    unknown = bf16 - set(tensors)
    if unknown:
        raise SafetensorsError("bf16= names tensors that are not given: %s" % sorted(unknown))
    header = {}
    chunks = []
    offset = 0
    for name in sorted(tensors):
        if name == "__metadata__":
            raise SafetensorsError('"__metadata__" is reserved and cannot name a tensor')
        arr = np.asarray(tensors[name])
        if name in bf16:
            dtype = "BF16"
            data = f32_to_bf16_bits(arr).astype("<u2").tobytes()
        else:
            dtype = _dtype_name(arr)
            data = np.ascontiguousarray(arr, dtype=_NP_DTYPES[dtype]).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": [int(d) for d in arr.shape],
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    if metadata:
        for key, value in metadata.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise SafetensorsError(
                    "metadata must map str to str; got %r: %r (convert values with str())"
                    % (key, value)
                )
        header["__metadata__"] = dict(metadata)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def load_file(path):
    """Read a safetensors file; return (tensors: name -> numpy array, metadata)."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return loads(raw)
    except SafetensorsError as e:
        raise SafetensorsError("%s: %s" % (path, e)) from None


def loads(raw):
    """Parse safetensors bytes; return (tensors, metadata) like load_file.

    Every entry is checked against the data section (offsets in range, size
    equal to shape times element size, no overlaps or gaps) because a wrong
    file would otherwise surface much later as a baffling numeric mismatch.
    """
    raw = memoryview(raw)
    if len(raw) < 8:
        raise SafetensorsError("file is %d bytes, too short for the 8-byte header length" % len(raw))
    (n,) = struct.unpack("<Q", raw[:8])
    if n > _MAX_HEADER or 8 + n > len(raw):
        raise SafetensorsError(
            "header length %d does not fit a file of %d bytes (truncated or not safetensors)"
            % (n, len(raw))
        )
    try:
        header = json.loads(bytes(raw[8 : 8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise SafetensorsError("header is not valid UTF-8 JSON: %s" % e) from None
    if not isinstance(header, dict):
        raise SafetensorsError("header must be a JSON object, got %s" % type(header).__name__)
    data = raw[8 + n :]
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise SafetensorsError("__metadata__ must map strings to strings")

    spans = []
    tensors = {}
    for name, info in header.items():
        tensors[name] = _read_tensor(name, info, data)
        begin, end = info["data_offsets"]
        if end > begin:
            spans.append((begin, end, name))
    spans.sort()
    pos = 0
    for begin, end, name in spans:
        if begin != pos:
            what = "overlaps the previous tensor" if begin < pos else "leaves a gap before it"
            raise SafetensorsError("tensor %r at offset %d %s (expected %d)" % (name, begin, what, pos))
        pos = end
    if pos != len(data):
        raise SafetensorsError(
            "data section is %d bytes but tensors cover %d (trailing bytes)" % (len(data), pos)
        )
    return tensors, dict(metadata)


def _read_tensor(name, info, data):
    """Decode one header entry into a numpy array, validating it first."""
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise SafetensorsError(
            "tensor %r: entry must have exactly dtype, shape, data_offsets; got %r" % (name, info)
        )
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if dtype not in _ITEMSIZE:
        raise SafetensorsError(
            "tensor %r: unsupported dtype %r (known: %s)" % (name, dtype, ", ".join(sorted(_ITEMSIZE)))
        )
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise SafetensorsError("tensor %r: shape must be a list of non-negative ints, got %r" % (name, shape))
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= len(data)
    ):
        raise SafetensorsError(
            "tensor %r: data_offsets %r outside the %d-byte data section" % (name, offsets, len(data))
        )
    count = 1
    for d in shape:
        count *= d
    begin, end = offsets
    if end - begin != count * _ITEMSIZE[dtype]:
        raise SafetensorsError(
            "tensor %r: %d bytes for shape %s of %s, expected %d"
            % (name, end - begin, shape, dtype, count * _ITEMSIZE[dtype])
        )
    buf = bytes(data[begin:end])
    if dtype == "BF16":
        return bf16_bits_to_f32(np.frombuffer(buf, dtype="<u2")).reshape(shape)
    # Native byte order and a writable copy, so callers can hand the
    # arrays straight to torch.from_numpy.
    native = _NP_DTYPES[dtype].newbyteorder("=")
    return np.frombuffer(buf, dtype=_NP_DTYPES[dtype]).astype(native, copy=True).reshape(shape)
