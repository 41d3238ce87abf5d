"""Trace files on disk for the playground's download button (format: docs/trace-schema.md, code: specdec/io/trace.py).

Export is `specdec.io.trace.dumps_trace(session.current())`; this module only gives the text a file that a
gr.DownloadButton can serve, and clears out old ones. Import is `specdec.io.trace.load_trace_file`, which returns the
RunRecord a replay renders directly.
"""

from __future__ import annotations

import re
import tempfile
import threading
import time
from pathlib import Path

KEEP_FILES_S = 3600.0  # exported files older than this are deleted at the next export (Gradio serves its own copy)

_dir_lock = threading.Lock()
_trace_dir: Path | None = None


def trace_dir() -> Path:
    global _trace_dir
    with _dir_lock:
        if _trace_dir is None or not _trace_dir.is_dir():
            _trace_dir = Path(tempfile.mkdtemp(prefix="specdec-traces-"))
        return _trace_dir


def _prune(folder: Path, keep_s: float = KEEP_FILES_S) -> None:
    cutoff = time.time() - keep_s
    for f in folder.glob("*.json"):
        try:
            if f.stat().st_mtime < cutoff:
                f.unlink()
        except OSError:
            pass


def write_trace(text: str, label: str) -> Path:
    """Write trace JSON to a fresh file in this process's trace folder; returns its path."""
    folder = trace_dir()
    _prune(folder)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-")[:40] or "run"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=folder, suffix=".json", delete=False,
                                     prefix=f"specdec-trace-{slug}-{stamp}-") as fh:
        fh.write(text)
    return Path(fh.name)
