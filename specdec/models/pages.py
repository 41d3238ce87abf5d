"""Resident pages of weights that live in a file: hand them back to the system while they are not read.

transformers maps a safetensors checkpoint into memory rather than copying it, so a weight loaded in its stored dtype
is a view of the file's pages: they count in the process's RSS once read, and reading them again after they were
handed back faults them in from the page cache (or the disk) with the same bytes. `drop_resident(t)` does that
hand-back (madvise MADV_DONTNEED) for the pages that lie wholly inside `t`, and only where it cannot change a
number: the range lies in one private file mapping of which no page was ever written (smaps: Anonymous 0 kB), so
every page dropped reads back as the file's bytes, which are the tensor's. Anywhere else (a tensor in anonymous
memory, a written page, no /proc, no libc) it does nothing and says 0.

Linux only; elsewhere every call is a no-op.
"""

from __future__ import annotations

import ctypes
import mmap
from pathlib import Path

import torch

MADV_DONTNEED = 4
PAGE = mmap.PAGESIZE


def clean_file_mappings() -> list[tuple[int, int]]:
    """(start, end) of this process's private file mappings none of whose pages was ever written."""
    out = []
    try:
        text = Path("/proc/self/smaps").read_text()
    except OSError:
        return out
    current = None
    for line in text.splitlines():
        head = line.split(None, 5)
        if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's header line
            start, end = (int(v, 16) for v in head[0].split("-"))
            path = head[5].strip() if len(head) > 5 else ""
            private_file = head[1].endswith("p") and head[4] != "0" and path.startswith("/")
            current = (start, end) if private_file else None
        elif current and line.startswith("Anonymous:"):
            if int(line.split()[1]) == 0:
                out.append(current)
            current = None
    return out


def _madvise():
    try:
        fn = ctypes.CDLL("libc.so.6", use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


def drop_resident(tensors: list[torch.Tensor]) -> int:
    """Hand back the resident pages wholly inside each CPU tensor of `tensors` that is a view of a clean private
    file mapping; returns the bytes of the ranges advised (what RSS can shed: pages never read were not resident)."""
    madvise = _madvise()
    if madvise is None:
        return 0
    mappings = clean_file_mappings()
    dropped = 0
    for t in tensors:
        if t.device.type != "cpu" or not t.is_contiguous() or t.numel() == 0:
            continue
        lo = t.data_ptr()
        hi = lo + t.numel() * t.element_size()
        start, end = -(-lo // PAGE) * PAGE, hi // PAGE * PAGE  # inward: never a page another tensor shares
        if end <= start or not any(a <= lo and hi <= b for a, b in mappings):
            continue
        if madvise(start, end - start, MADV_DONTNEED) == 0:
            dropped += end - start
    return dropped
