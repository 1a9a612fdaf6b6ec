"""safetensors.py — a small safetensors reader and writer with numpy + json (the format of
schema/README.md and schema/safetensors.h), for checking what ddpd writes and writing what
it reads. st_decode's `strict` checks what the reference implementation checks."""
import json
import struct
from pathlib import Path

import numpy as np


ST_DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}
_NP_TO_ST = {v: k for k, v in ST_DTYPES.items()}


def st_encode(tensors, metadata=None):
    """Bytes of a safetensors file holding `tensors` (name -> array, written in sorted
    name order) and optional `metadata` (str -> str)."""
    header = {}
    blobs = []
    off = 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        st = _NP_TO_ST[a.dtype]
        raw = a.tobytes(order="C")
        header[name] = {"dtype": st, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def st_save(path, tensors, metadata=None):
    Path(path).write_bytes(st_encode(tensors, metadata))


def st_decode(buf, strict=True):
    """(tensors, metadata) from safetensors bytes. With `strict`, checks what the
    reference implementation checks: header inside the file, JSON object, known dtypes,
    shapes matching byte sizes, and data offsets that tile the data section exactly
    (sorted, contiguous, no gaps, no overlap, ending at the end of the file)."""
    if len(buf) < 8:
        raise ValueError("safetensors: file shorter than 8 bytes")
    (n,) = struct.unpack("<Q", buf[:8])
    if 8 + n > len(buf):
        raise ValueError(f"safetensors: header length {n} runs past the file ({len(buf)} bytes)")
    hdr = json.loads(buf[8:8 + n].decode("utf-8"))
    if not isinstance(hdr, dict):
        raise ValueError("safetensors: header is not a JSON object")
    meta = hdr.pop("__metadata__", None)
    if meta is not None:
        if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            raise ValueError("safetensors: __metadata__ must map strings to strings")
    data = buf[8 + n:]
    out = {}
    spans = []
    for name, info in hdr.items():
        dt = ST_DTYPES[info["dtype"]]
        shape = tuple(int(s) for s in info["shape"])
        b, e = (int(v) for v in info["data_offsets"])
        if not (0 <= b <= e <= len(data)):
            raise ValueError(f"safetensors: {name}: offsets {b},{e} outside data of {len(data)} bytes")
        if (e - b) != int(np.prod(shape, dtype=np.int64)) * dt.itemsize:
            raise ValueError(f"safetensors: {name}: shape {shape} {info['dtype']} does not match {e - b} bytes")
        out[name] = np.frombuffer(data[b:e], dtype=dt).reshape(shape).copy()
        spans.append((b, e, name))
    if strict:
        pos = 0
        for b, e, name in sorted(spans):
            if b != pos:
                raise ValueError(f"safetensors: {name}: data starts at {b}, expected {pos} (gap or overlap)")
            pos = e
        if pos != len(data):
            raise ValueError(f"safetensors: tensors cover {pos} of {len(data)} data bytes")
    return out, (meta or {})


def st_load(path, strict=True):
    return st_decode(Path(path).read_bytes(), strict=strict)


def st_same_training(a, b):
    """Whether two checkpoint files (bytes) hold the same training state: every tensor bit
    for bit and the same metadata, but for `data_fingerprints`, which records the data
    files' mtimes — two runs on two copies of the same data differ there and only there."""
    (ta, ma), (tb, mb) = st_decode(a), st_decode(b)
    ma, mb = dict(ma), dict(mb)
    ma.pop("data_fingerprints", None)
    mb.pop("data_fingerprints", None)
    return ma == mb and ta.keys() == tb.keys() and all(
        ta[k].dtype == tb[k].dtype and ta[k].shape == tb[k].shape and ta[k].tobytes() == tb[k].tobytes() for k in ta)
