"""Background loading of model pairs, so the page is up (and shows progress) while weights load.

Each requested pair gets one LoadJob: a thread that loads the pair through specdec's memoized `load_pair` and then
measures the plain per-token cost of both models once (for the measured speedup). Callers poll the job's message
or wait on it. A failed job is dropped, so asking again retries.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

from specdec.decoder import StepCosts, measure_step_costs
from specdec.errors import SpecDecError
from specdec.models import ModelPair, load_pair


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

    @property
    def state(self) -> str:
        if self.error:
            return "error"
        # Ready only once the step costs are in too: the badge shows them and decoding waits for them.
        return "ready" if self.measured.is_set() else "loading"

    def wait(self, timeout: float | None = None) -> bool:
        return self.loaded.wait(timeout)


def measure_costs(pair: ModelPair, repeats: int = 2) -> StepCosts:
    """Plain per-token cost of each model; the minimum over repeats, since other load only ever adds time."""
    runs = [measure_step_costs(pair) for _ in range(repeats)]
    return StepCosts(min(r.target_ms for r in runs), min(r.draft_ms for r in runs))


class PairLoader:
    def __init__(self, dtype: str = "auto", device: str = "auto"):
        self.dtype, self.device = dtype, device
        self._jobs: dict[PairRequest, LoadJob] = {}
        self._lock = threading.Lock()
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

    def peek(self, req: PairRequest) -> LoadJob | None:
        """The job for this pair if one was ever requested; starts nothing."""
        with self._lock:
            return self._jobs.get(req)

    def _run(self, job: LoadJob) -> None:
        req = job.request
        t0 = time.time()

        def progress(msg: str) -> None:
            job.message = msg

        try:
            job.message = f"loading model pair {req.label}"
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
        if job.pair is None:
            job.measured.set()
            return
        try:
            job.message = "waiting for the server to start before timing the models"
            self.quiet.wait(timeout=120)
            job.message = "measuring the plain per-token cost of both models"
            job.costs = measure_costs(job.pair)
            job.message = f"models ready in {time.time() - t0:.0f} s"
        except Exception:  # noqa: BLE001 - without costs the app still runs, only the speedup lines are missing
            traceback.print_exc(file=sys.stderr)
        finally:
            job.measured.set()
