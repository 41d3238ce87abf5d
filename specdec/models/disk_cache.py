"""Results that are a pure function of their inputs, kept on disk between processes.

What a pair load would otherwise recompute on every start lives here: the quantized draft's codes
(`specdec.models.quant`, a function of the source weights and the mode), its built layers (the codes dequantized
and packed for the kernels: a function of the codes, the CPU and the torch build) and the prepacked kernels'
per-(shape, width) verdicts (`specdec.models.prepack`, a function of the CPU, the torch build and the dtype).

Built layers are stored as a mapped entry (`write_mapped`): every tensor at a page-aligned offset of one file, read
back as copy-on-write views of the file (`read_mapped`), so a start maps them instead of allocating and filling
memory it never touched before, and processes on one machine share their pages through the page cache.

Every entry carries its identity (the inputs it was computed from) and a checksum of its content. A reader
recomputes both and ignores an entry whose identity or checksum differs -- another machine's verdicts, a torch
upgrade, a torn or corrupted file -- so a cache entry is never trusted beyond what it can prove; the caller then
recomputes and writes it again. SPECDEC_DISK_CACHE=0 turns the store off (every start recomputes).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

import torch

from specdec.models.embedded import cache_dir

FORMAT = 1  # bump when an entry's layout changes: older entries then fail their identity check


def enabled() -> bool:
    return os.environ.get("SPECDEC_DISK_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def store_dir(kind: str) -> Path:
    return cache_dir() / kind


def digest(*parts) -> str:
    """A stable hex digest of JSON-able parts (the identity of an entry)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def tensor_digest(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """A digest of tensors' names, dtypes, shapes and bytes: one blake2b per tensor (hashlib lets go of the GIL on
    large buffers, so a thread per core hashes in parallel: ~1 GB/s a core), then one over those in order."""
    items = list(named)

    def one(item: tuple[str, torch.Tensor]) -> bytes:
        name, t = item
        t = t.detach().contiguous().cpu()
        h = hashlib.blake2b(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode(), digest_size=32)
        if t.numel():
            h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))  # the bytes in place, not a copy
        return h.digest()

    outer = hashlib.blake2b(b"specdec-tensors-2", digest_size=32)
    with ThreadPoolExecutor(max_workers=max(1, min(len(items), os.cpu_count() or 1, 8))) as pool:
        for part in pool.map(one, items):
            outer.update(part)
    return outer.hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # readers see the old entry or the new one, never half of one
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path, identity: dict) -> dict | None:
    """The payload stored at path for exactly this identity, or None (missing, foreign, corrupted)."""
    if not enabled():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        payload = doc["payload"]
        if (doc.get("format") != FORMAT or doc.get("identity") != json.loads(json.dumps(identity, default=str))
                or doc.get("checksum") != digest(payload) or not isinstance(payload, dict)):
            return None
        return payload
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_json(path: Path, identity: dict, payload: dict) -> bool:
    """Store payload for identity; False (and nothing raised) when the disk refuses."""
    if not enabled():
        return False
    doc = {"format": FORMAT, "identity": identity, "checksum": digest(payload), "payload": payload}
    try:
        _write_atomic(path, json.dumps(doc, sort_keys=True, default=str).encode())
        return True
    except OSError:
        return False


def read_tensors(path: Path, identity: dict) -> dict[str, torch.Tensor] | None:
    """The tensors stored at path for exactly this identity, their bytes checked; else None."""
    if not enabled() or not path.is_file():
        return None
    from safetensors import SafetensorError
    from safetensors.torch import load_file, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        if meta.get("identity") != digest(FORMAT, identity):
            return None
        # Fresh, aligned copies: load_file's tensors view the file's bytes at the offsets safetensors packed them,
        # and the int8/int4 kernels fault on a weight that is not aligned as an allocation is.
        tensors = {k: v.clone() for k, v in load_file(str(path)).items()}
        if meta.get("checksum") != tensor_digest(sorted(tensors.items())):
            return None
        return tensors
    except (OSError, ValueError, RuntimeError, SafetensorError):
        return None


MAPPED_MAGIC = b"specdec-mapped\n"
MAPPED_ALIGN = 4096  # every tensor starts on a page: the kernels need aligned weights, and pages map whole


def _aligned(n: int) -> int:
    return -(-n // MAPPED_ALIGN) * MAPPED_ALIGN


def write_mapped(path: Path, identity: dict, tensors: dict[str, torch.Tensor]) -> bool:
    """Store tensors for identity as one file of page-aligned tensors (see read_mapped); False when the disk
    refuses. Layout: MAPPED_MAGIC, the header's length (8 bytes, little endian), the JSON header (format, identity,
    checksum, and per tensor its dtype, shape, offset and byte count), then the tensors' bytes."""
    if not enabled():
        return False
    tensors = {k: v.detach().contiguous().cpu() for k, v in sorted(tensors.items())}
    table, offset = {}, 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        table[name] = [str(t.dtype).removeprefix("torch."), list(t.shape), offset, nbytes]
        offset = _aligned(offset + nbytes)
    header = json.dumps({"format": FORMAT, "identity": digest(FORMAT, identity),
                         "checksum": tensor_digest(tensors.items()), "tensors": table}).encode()
    start = _aligned(len(MAPPED_MAGIC) + 8 + len(header))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAPPED_MAGIC + len(header).to_bytes(8, "little") + header)
            for name, t in tensors.items():
                f.seek(start + table[name][2])
                if t.numel():
                    f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
            f.truncate(start + offset)
        os.replace(tmp, path)
        return True
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        return False


def read_mapped(path: Path, identity: dict) -> dict[str, torch.Tensor] | None:
    """The tensors write_mapped stored at path for exactly this identity, as copy-on-write views of the file (a
    write to one stays in this process); None when missing, foreign, malformed or not matching its checksum. The
    checksum reads every byte once, which also brings the file's pages in."""
    if not enabled() or not path.is_file():
        return None
    import numpy as np

    try:
        with open(path, "rb") as f:
            if f.read(len(MAPPED_MAGIC)) != MAPPED_MAGIC:
                return None
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        if header.get("format") != FORMAT or header.get("identity") != digest(FORMAT, identity):
            return None
        start = _aligned(len(MAPPED_MAGIC) + 8 + size)
        mm = np.memmap(path, dtype=np.uint8, mode="c")
        tensors = {}
        for name, (dtype, shape, offset, nbytes) in header["tensors"].items():
            kind = getattr(torch, str(dtype), None)
            if not isinstance(kind, torch.dtype) or offset % MAPPED_ALIGN or start + offset + nbytes > mm.size:
                return None
            raw = torch.from_numpy(mm[start + offset : start + offset + nbytes])
            tensors[name] = raw.view(kind).view(shape) if nbytes else torch.empty(shape, dtype=kind)
        if header.get("checksum") != tensor_digest(sorted(tensors.items())):
            return None
        return tensors
    except (OSError, ValueError, KeyError, TypeError, RuntimeError):
        return None


def write_tensors(path: Path, identity: dict, tensors: dict[str, torch.Tensor]) -> bool:
    if not enabled():
        return False
    from safetensors.torch import save

    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    meta = {"identity": digest(FORMAT, identity), "checksum": tensor_digest(sorted(tensors.items()))}
    try:
        _write_atomic(path, save(tensors, metadata=meta))
        return True
    except OSError:
        return False
