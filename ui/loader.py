"""Background loading of model pairs, so the page is up (and shows progress) while weights load.

Each requested pair gets one LoadJob: a thread that loads the pair through specdec's memoized `load_pair` and then
measures the plain per-token cost of both models once (for the measured speedup). Callers poll the job's message
or wait on it. A failed job is dropped, so asking again retries.

Loaded pairs are shared: `load_pair` memoizes one ModelPair per (ids, dtype, device), and every session's decoder
holds that object by reference, using the models read-only (inference mode; KV caches live in the decoder).

Custom ids (the Models accordion) are checked before anything is downloaded: their spelling at once
(`check_request`, raising InvalidInputError), then in the load thread `specdec.models.hub.validate_custom_pair`
(config, size cap, shared vocabulary) before `load_pair` fetches any weights.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
import traceback
import weakref
from dataclasses import dataclass, field

from specdec.loop.plain import measure_step_costs
from specdec.core.errors import InvalidInputError, SpecDecError
from specdec.models.hub import DEFAULT_MAX_PARAMS, check_model_id, check_size, inspect_model, validate_custom_pair
from specdec.core.metrics import StepCosts
from specdec.models import pair as models
from specdec.models.pair import PAIRS, ModelPair, load_pair, pair_ids

# How far a load has come, by the step its message names (specdec.models.pair and .embedded say each step): a first
# start assembles and converts both embedded models (most of its minutes), a later one starts at "loading tokenizer".
STEPS = (("assembling qwen2.5-coder-1.5b", 0.0, 0.10), ("converting qwen2.5-coder-1.5b", 0.10, 0.0),
         ("copy of qwen2.5-coder-1.5b", 0.40, 0.0),
         ("assembling qwen2.5-coder-0.5b", 0.45, 0.05), ("converting qwen2.5-coder-0.5b", 0.50, 0.0),
         ("copy of qwen2.5-coder-0.5b", 0.60, 0.0),
         ("loading tokenizer", 0.65, 0.0), ("loading target", 0.68, 0.0), ("loading draft", 0.78, 0.0),
         ("target and draft loaded", 0.81, 0.0), ("prepacking", 0.82, 0.0), ("checking the packed kernels", 0.84, 0.0),
         ("quantizing", 0.88, 0.0),
         ("waiting for the server", 0.94, 0.0), ("measuring", 0.95, 0.0), ("models ready in", 1.0, 0.0))


def progress_fraction(message: str) -> float | None:
    """The share of a pair load done when the loader says `message` (None: a step without a known place)."""
    for key, start, span in STEPS:
        if key in message:
            part = re.search(r"part (\d+)/(\d+)", message)
            return start + (span * int(part.group(1)) / int(part.group(2)) if span and part else 0.0)
    return None


def progress_bar(fraction: float, width: int = 24) -> str:
    done = round(max(0.0, min(1.0, fraction)) * width)
    return f"[{'#' * done}{'.' * (width - done)}] {100 * fraction:3.0f}%"


BUILTIN_PREFIXES = ("embedded:", "tiny:")  # preset ids that are not hub ids or folders (see specdec.models.pair.PAIRS)


@dataclass(frozen=True)
class PairRequest:
    name: str
    target: str = ""
    draft: str = ""

    @property
    def label(self) -> str:
        if self.target or self.draft:
            return f"custom ({self.target or 'preset target'} + {self.draft or 'preset draft'})"
        return self.name


@dataclass
class LoadJob:
    request: PairRequest
    message: str = "queued"
    pair: ModelPair | None = None
    costs: StepCosts | None = None
    error: str | None = None
    started: float = field(default_factory=time.time)
    loaded: threading.Event = field(default_factory=threading.Event)  # pair ready (or failed)
    measured: threading.Event = field(default_factory=threading.Event)  # costs ready (or failed)
    measured_at: float = 0.0  # time.time() when the costs were timed
    fraction: float = 0.0  # how far the load has come (progress_fraction), never going back

    @property
    def state(self) -> str:
        if self.error:
            return "error"
        # Ready only once the step costs are in too: the badge shows them and decoding waits for them.
        return "ready" if self.measured.is_set() else "loading"

    def wait(self, timeout: float | None = None) -> bool:
        return self.loaded.wait(timeout)


def check_request(req: PairRequest, allow_local: bool = True) -> None:
    """The cheap checks, run before a load is queued: a known preset, and well-spelled custom ids (no network)."""
    if req.name not in PAIRS:
        raise InvalidInputError(f"unknown model pair {req.name[:60]!r}; choose one of {', '.join(PAIRS)}")
    for model_id, role in ((req.target, "target"), (req.draft, "draft")):
        if model_id:
            check_model_id(model_id, role, allow_local)


def validate_request(req: PairRequest, max_params: float = DEFAULT_MAX_PARAMS, allow_local: bool = True) -> None:
    """Before any weights are fetched: config, parameter cap and shared vocabulary of the custom ids in `req`.

    Both ids typed (or a typed id next to a hub preset's): `validate_custom_pair` checks the whole pair. A typed id
    next to a built-in model (embedded or tiny) is checked on its own; `load_pair` compares the vocabularies from
    the tokenizers before it loads any weights.
    """
    if not (req.target or req.draft):
        return
    target, draft = pair_ids(req.name, req.target, req.draft)
    if not (target.startswith(BUILTIN_PREFIXES) or draft.startswith(BUILTIN_PREFIXES)):
        validate_custom_pair(target, draft, max_params=max_params, allow_local=allow_local)
        return
    for model_id, role in ((req.target, "target"), (req.draft, "draft")):
        if model_id:
            check_size(inspect_model(model_id, role, allow_local), max_params)


def measure_costs(pair: ModelPair, repeats: int = 1) -> StepCosts:
    """Plain per-token cost of each model; the minimum over repeats, since other load only ever adds time."""
    runs = [measure_step_costs(pair) for _ in range(repeats)]
    return StepCosts(min(r.target_ms for r in runs), min(r.draft_ms for r in runs))


class PairLoader:
    """Loads pairs in background threads, one job per PairRequest.

    max_params / allow_local: limits for custom ids (see validate_request); allow_local=False on a public Space.
    measure: time both models after loading. Off on ZeroGPU, where the main process must not run CUDA work; the
    GPU worker measures instead (ui/gpu_run.py).
    """

    def __init__(self, dtype: str = "auto", device: str = "auto", *, max_params: float = DEFAULT_MAX_PARAMS,
                 allow_local: bool = True, measure: bool = True, echo: bool = True):
        """echo: print each loading step on stderr too (the terminal's view of the page's progress)."""
        self.dtype, self.device = dtype, device
        self.echo = echo
        self.max_params, self.allow_local, self.measure = max_params, allow_local, measure
        self._jobs: dict[PairRequest, LoadJob] = {}
        self._lock = threading.Lock()
        # A job holds its pair; when the shared cache evicts that pair, forget the job so the memory can go once
        # the last session decoding on it lets go (sessions hold their own reference meanwhile).
        forget = weakref.WeakMethod(self._forget)  # the cache must not keep loaders alive
        models.PAIR_CACHE.on_evict(lambda pair: (f := forget()) and f(pair))
        # Set once the server is up: step costs timed during startup would include Gradio's own start-up work.
        self.quiet = threading.Event()
        self.quiet.set()

    def request(self, req: PairRequest) -> LoadJob:
        """The job for this pair, starting a load thread the first time (or after a failure)."""
        with self._lock:
            job = self._jobs.get(req)
            if job is None or job.error:
                job = LoadJob(req)
                self._jobs[req] = job
                threading.Thread(target=self._run, args=(job,), name=f"load-{req.label}", daemon=True).start()
            return job

    def _forget(self, pair: ModelPair) -> None:
        with self._lock:
            for req, job in list(self._jobs.items()):
                if job.pair is pair:
                    del self._jobs[req]

    def peek(self, req: PairRequest) -> LoadJob | None:
        """The job for this pair if one was ever requested; starts nothing."""
        with self._lock:
            return self._jobs.get(req)

    def _run(self, job: LoadJob) -> None:
        req = job.request
        t0 = time.time()

        def progress(msg: str) -> None:
            job.message = msg
            job.fraction = max(job.fraction, progress_fraction(msg) or 0.0)
            if self.echo:  # the terminal shows the same steps as the page's badge
                print(f"[specdec] {progress_bar(job.fraction)} {time.time() - t0:5.1f} s  {req.label}: {msg}",
                      file=sys.stderr, flush=True)

        try:
            if req.target or req.draft:
                job.message = "checking the custom model ids (config, size, vocabulary) before downloading"
                validate_request(req, self.max_params, self.allow_local)
            progress(f"loading model pair {req.label}")
            job.pair = load_pair(req.name, target=req.target or None, draft=req.draft or None,
                                 dtype=self.dtype, device=self.device, progress=progress)
            job.message = f"loaded in {time.time() - t0:.0f} s"
        except SpecDecError as exc:
            job.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - a load failure must become a message, not kill the app
            traceback.print_exc(file=sys.stderr)
            job.error = f"could not load {req.label}: {type(exc).__name__}: {exc}"
        finally:
            job.loaded.set()
        if job.pair is None or not self.measure:
            job.measured.set()
            return
        try:
            progress("waiting for the server to start before timing the models")
            self.quiet.wait(timeout=120)
            progress("measuring the plain per-token cost of both models")
            job.costs = measure_costs(job.pair)
            job.measured_at = time.time()
            progress(f"models ready in {time.time() - t0:.1f} s")
        except Exception:  # noqa: BLE001 - without costs the app still runs, only the speedup lines are missing
            traceback.print_exc(file=sys.stderr)
        finally:
            job.measured.set()


# ---------------------------------------------------------------------------------------------- the app's start


def default_pair_name() -> str:
    """The pair the app opens on: on a CPU with native bf16 matmuls (AVX512-BF16 or AMX), the embedded pair with its
    int4 draft (the packed draft reads a quarter of the bytes a step, at the bf16 draft's acceptance; `bench
    --quant-draft` measures it, docs/performance.md); elsewhere the plain embedded pair, which the "auto" dtype runs
    in float32 on a CPU without them, where a bf16 pass costs more with every row it multiplies and speculation
    cannot pay (docs/performance.md, "A CPU without native bf16"). On a GPU, or when float32 is asked for, also the
    plain pair."""
    import torch

    from specdec.models.pair import cpu_has_fast_bf16

    on_gpu = os.environ.get("SPECDEC_DEVICE", "auto") == "cuda" or torch.cuda.is_available()
    if on_gpu or os.environ.get("SPECDEC_DTYPE") == "float32" or not cpu_has_fast_bf16():
        return "default"
    return "default-int4"


def env_request() -> PairRequest:
    return PairRequest(os.environ.get("SPECDEC_PAIR") or default_pair_name())


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def detached_mode() -> bool:
    """Whether Generate runs decode the ZeroGPU way (ui/gpu_run.py): on a ZeroGPU Space, or SPECDEC_DETACHED=1."""
    from ui.zerogpu import zerogpu_active

    return zerogpu_active() or env_flag("SPECDEC_DETACHED")


def env_loader() -> PairLoader:
    """The app's loader as the environment configures it (app.py's docstring lists the variables), with the
    startup pair's load already started: app.py calls this before it imports the UI, so the weights load while
    Gradio's imports and the page build run (~5 s of a 2-core start)."""
    loader = PairLoader(dtype=os.environ.get("SPECDEC_DTYPE", "auto"), device=os.environ.get("SPECDEC_DEVICE", "auto"),
                        max_params=float(os.environ.get("SPECDEC_MAX_PARAMS", DEFAULT_MAX_PARAMS)),
                        allow_local=not env_flag("SPECDEC_PUBLIC"), measure=not detached_mode())
    loader.quiet.clear()  # time the models only once the server is up (see PairLoader.quiet)
    loader.request(env_request())
    return loader
