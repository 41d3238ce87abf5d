"""Playground wiring helpers: the per-browser Session, reading the controls, and turning a Session into outputs.

The handlers here are what app.py binds to buttons. Streaming handlers are generators that yield after every round.
Each browser session keeps its own decoder in a gr.State; Gradio stores State values by reference (only the initial
value is deep-copied), so the decoder holds the shared, read-only models by reference and nothing is copied.

Concurrency: a Session's rounds run under its lock, and every new action (Generate, Step, Stop, Reset, trace
import) bumps `run_id`; a generator whose run id is stale stops before its next round. That keeps one decoder from
being stepped by two events at once even when Gradio's cancellation lets an in-flight round finish.

A session shows either a live run (`decoder`, which Step and Run to end continue) or a RunLog (`log`): a replayed
trace, or on ZeroGPU a run decoded in the GPU worker (see `detached` and ui/gpu_run.py). Both render the same way.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

import gradio as gr

from components import (
    empty_figure,
    pq_figure,
    render_model_status,
    render_phases,
    render_round,
    render_prompt,
    render_stats,
    render_status,
    speedup_figure,
)
from components.tokens import quoted
from specdec.decoder import DecodeSettings, SpeculativeDecoder, encode_prompt, resolve_draft_vocab
from specdec.errors import InvalidInputError, ModelLoadError, SpecDecError, TraceError
from specdec.events import Round
from specdec.metrics import summarize
from specdec.sampling import SamplingConfig
from specdec.trace import load_trace_file

from . import gpu_run
from .loader import LoadJob, PairLoader, PairRequest, check_request
from .trace_io import RunLog, describe_replay, log_from_trace, prompt_text, trace_json, write_trace

LOCK_TIMEOUT_S = 60.0  # longest wait for an in-flight round (the default pair needs ~1 s per round on CPU)
# While streaming, the two Plotly charts are redrawn at most this often. Gradio rebuilds a Plotly chart from
# scratch on every update (hundreds of ms of browser main thread on a slow machine); with fast rounds (tiny pair,
# GPU) redrawing both every round backs the browser up until the page stops responding. Tokens, status and stats
# still update every round, and the last update of a run always carries the charts.
CHART_INTERVAL_S = 1.0
# Rounds faster than this (tiny pair, GPUs) are paced for display: a browser needs ~0.1 s to draw an update on a
# slow machine, and queued updates make Stop look ignored. The wait is outside Decoder.step, so round_ms, tok/s
# and the measured speedup are unaffected.
MIN_ROUND_INTERVAL_S = float(os.environ.get("SPECDEC_MIN_ROUND_S", "0.2"))
# Longest prompt accepted, in characters, checked before tokenizing: the decoder's own limit is 8192 tokens, and a
# megabyte of text would only be tokenized to be refused. 100k characters is over 10 characters per token.
MAX_PROMPT_CHARS = 100_000
DETACHED_STEP_MESSAGE = ("Step and Run to end are off on this ZeroGPU Space: the GPU is lent for one call at a time, "
                         "so a decoder cannot stay on it between clicks. Generate streams a whole run on the GPU; to "
                         "step round by round, run the app locally or on a CPU or dedicated-GPU Space.")


# --------------------------------------------------------------------------------------------------- session


@dataclass
class Session:
    decoder: SpeculativeDecoder | None = None
    log: RunLog | None = None  # a run without a decoder (replayed trace, ZeroGPU run); never set with decoder
    job: LoadJob | None = None  # the loaded pair the decoder runs on (for its step costs)
    prompt: str = ""
    run_id: int = 0
    round_html: list[str] = field(default_factory=list)  # rendered once per round; rounds never change
    round_dicts: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    ui_ms: list[float] = field(default_factory=list)  # time spent rendering outputs after each round
    charts_at: float = 0.0  # perf_counter time of the last chart update sent while streaming
    round_at: float = 0.0  # perf_counter time the last round started (for pacing)
    streamer: int | None = None  # run id of the Generate / Run-to-end handler that is running, if any
    interrupt: tuple[str, int] | None = None  # ("stop" | "reset", run id) left for the streamer to carry out

    @property
    def run(self) -> SpeculativeDecoder | RunLog | None:
        """What the views show: the live decoder, else the run log, else None."""
        return self.decoder or self.log

    @property
    def rounds(self) -> list[Round]:
        run = self.run
        return run.rounds if run is not None else []

    def new_run(self) -> int:
        """Invalidate whatever run is streaming; return the id of the run that starts now."""
        self.run_id += 1
        return self.run_id

    def start(self, decoder: SpeculativeDecoder | None, job: LoadJob | None, prompt: str,
              log: RunLog | None = None) -> None:
        # Under the lock: a superseded run's in-flight round must not land in the new run's lists.
        self.acquire()
        try:
            self.decoder, self.log, self.job, self.prompt = decoder, log, job, prompt
            self.round_html, self.round_dicts, self.ui_ms = [], [], []
            for rnd in log.rounds if log is not None else []:  # a replay arrives with all its rounds
                self.record(rnd)
        finally:
            self.lock.release()

    def clear(self) -> None:
        self.decoder, self.log, self.job, self.prompt = None, None, None, ""
        self.round_html, self.round_dicts, self.ui_ms = [], [], []

    def record(self, rnd: Round) -> None:
        self.round_html.append(render_round(rnd))
        self.round_dicts.append(rnd.to_dict())

    def acquire(self) -> None:
        if not self.lock.acquire(timeout=LOCK_TIMEOUT_S):
            raise SpecDecError("the previous round is still running; try again in a moment")


# ---------------------------------------------------------------------------------------------- controls


@dataclass
class Controls:
    """The playground inputs, in the order app.py passes them."""

    prompt: str
    chat: bool
    gamma: float
    max_new_tokens: float
    temperature: float
    top_k: float
    top_p: float
    seed: float
    pair: str
    target: str
    draft: str

    def settings(self) -> DecodeSettings:
        sampling = SamplingConfig(temperature=_number(self.temperature, "temperature"),
                                  top_k=_whole(self.top_k, "top-k"), top_p=_number(self.top_p, "top-p"))
        return DecodeSettings(gamma=_whole(self.gamma, "γ (draft length)"),
                              max_new_tokens=_whole(self.max_new_tokens, "max new tokens"),
                              sampling=sampling, seed=_whole(self.seed, "seed"), chat=bool(self.chat))

    def check_prompt(self) -> None:
        if self.prompt is None:  # an API call without a prompt: the decoder says "the prompt is empty"
            self.prompt = ""
        if not isinstance(self.prompt, str):
            raise InvalidInputError(f"the prompt must be text, got {type(self.prompt).__name__}")
        if len(self.prompt) > MAX_PROMPT_CHARS:
            raise InvalidInputError(f"the prompt is {len(self.prompt):,} characters long; the limit is "
                                    f"{MAX_PROMPT_CHARS:,}")

    def pair_request(self, allow_local: bool = True) -> PairRequest:
        """The pair to load; unknown presets and badly spelled custom ids are refused here, before any loading."""
        for value, name in ((self.pair, "model pair"), (self.target, "custom target"), (self.draft, "custom draft")):
            if value is not None and not isinstance(value, str):
                raise InvalidInputError(f"{name} must be text, got {type(value).__name__}")
        req = PairRequest(self.pair or "default", (self.target or "").strip(), (self.draft or "").strip())
        check_request(req, allow_local)
        return req


def _number(x, name: str) -> float:
    if x is None or x == "":
        raise InvalidInputError(f"{name} is empty; enter a number")
    if isinstance(x, bool):
        raise InvalidInputError(f"{name} must be a number, got {x!r}")
    try:
        v = float(x)
    except (TypeError, ValueError, OverflowError):
        raise InvalidInputError(f"{name} must be a number, got {_short(x)}") from None
    if v != v or v in (float("inf"), float("-inf")):
        raise InvalidInputError(f"{name} must be a finite number, got {_short(x)}")
    return v


def _whole(x, name: str) -> int:
    v = _number(x, name)
    if v != int(v):
        raise InvalidInputError(f"{name} must be a whole number, got {_short(x)}")
    return int(v)


def _short(x, limit: int = 40) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------------------------------------- views


class Playground:
    """Handlers bound to one PairLoader; app.py wires their outputs in the order of OUTPUTS below.

    detached: decode each Generate run inside one call of ui/gpu_run.decode_rounds (the ZeroGPU path: the decoder
    lives in the GPU worker, the session keeps a RunLog of the rounds it yields); Step and Run to end are off.
    allow_local: custom ids may name local folders (False on a public Space).
    """

    OUTPUTS = ("session", "status", "tokens", "phases", "stats", "pq_plot", "speed_plot", "round_dd", "pos_dd",
               "text", "recorded", "model")

    def __init__(self, loader: PairLoader, startup: PairRequest, *, detached: bool = False, allow_local: bool = True):
        self.loader = loader
        self.startup = startup
        self.detached = detached
        self.allow_local = allow_local
        self.startup_job = loader.request(startup)

    # -- rendering -------------------------------------------------------------------------------------------
    def costs(self, session: Session) -> tuple[float | None, float | None]:
        if session.log is not None and session.log.costs[0] is not None:
            return session.log.costs
        c = session.job.costs if session.job else None
        return (c.target_ms, c.draft_ms) if c else (None, None)

    def model_badge(self, job: LoadJob | None) -> str:
        job = job or self.startup_job
        if job.state == "error":
            return render_model_status("error", f"Model load failed: {job.error}")
        if job.state == "loading":
            return render_model_status("loading", f"Loading {job.request.label}… {job.message} "
                                                   f"({time.time() - job.started:.0f} s)")
        d = job.pair.describe()
        details = {"target": d["target"], "draft": d["draft"], "device": d["device"], "dtype": d["dtype"]}
        head = resolve_draft_vocab(job.pair, None)
        if head:  # q is zero outside the draft's head: say so where the charts' q = 0 bars can be explained
            details["draft head"] = f"ids < {head} + EOS + the text's tokens"
        if job.costs:
            details["plain target"] = f"{job.costs.target_ms:.0f} ms/token"
            details["c"] = f"{job.costs.c:.2f}"
        return render_model_status("ready", f"Model pair: {d['name']}", details)

    def view(self, session: Session, kind: str, message: str, *, recorded: bool = False,
             charts: bool = True) -> tuple:
        """All playground outputs for the session's current state.

        recorded: also refresh the Learn tab's state (only at the end of a run or step: it has listeners).
        charts: False leaves both charts and their selectors as they are (see CHART_INTERVAL_S).
        """
        t0 = time.perf_counter()
        rounds = session.rounds
        target_ms, draft_ms = self.costs(session)
        tokens = (render_prompt(session.prompt) if session.prompt else "") + "".join(session.round_html)
        text = session.run.text if session.run is not None else ""
        if rounds and not charts:
            pq = speed = round_dd = pos_dd = gr.skip()
        elif rounds:
            r, p = default_selection(rounds[-1])
            pq = pq_figure(rounds[r], p)
            speed = speedup_figure(rounds, target_ms, draft_ms)
            round_dd = gr.Dropdown(choices=round_choices(rounds), value=r, interactive=True)
            pos_dd = gr.Dropdown(choices=position_choices(rounds[r]), value=p, interactive=True)
        else:
            pq = empty_figure("p vs q appears after the first round")
            speed = empty_figure("speedup appears after the first round")
            round_dd = gr.Dropdown(choices=[], value=None, interactive=False)
            pos_dd = gr.Dropdown(choices=[], value=None, interactive=False)
        out = (
            session,
            render_status(kind, message),
            tokens,
            render_phases(rounds[-1] if rounds else None),
            render_stats(rounds, target_ms, draft_ms),
            pq,
            speed,
            round_dd,
            pos_dd,
            text,
            self.recorded(session) if recorded else gr.skip(),
            self.model_badge(session.job),
        )
        if rounds:
            session.ui_ms.append((time.perf_counter() - t0) * 1e3)
        return out

    def recorded(self, session: Session) -> dict:
        """What the Learn tab reads: this run's round dicts plus its measured speedup and step cost ratio."""
        target_ms, draft_ms = self.costs(session)
        rounds = session.rounds
        m = summarize(rounds, target_ms, draft_ms) if rounds else None
        if session.log is not None and session.log.trace is not None:
            label = session.log.label
        else:
            label = session.job.request.label if session.job else None
        return {
            "rounds": list(session.round_dicts),
            "speedup": m.speedup if m else None,
            "c": m.c if m else None,
            "pair": label,
        }

    def error_view(self, session: Session, message: str) -> tuple:
        gr.Warning(message)
        return self.view(session, "error", message, recorded=True)

    # -- model loading ---------------------------------------------------------------------------------------
    def wait_for_pair(self, session: Session, controls: Controls, run: int):
        """Yield loading views until the requested pair is loaded and its step costs are measured."""
        job = self.loader.request(controls.pair_request(self.allow_local))
        while not job.wait(0.5):
            if session.run_id != run:
                return None
            yield self.view(session, "busy", f"Loading models: {job.message} ({time.time() - job.started:.0f} s)")
        if job.error:
            raise ModelLoadError(job.error)
        # Step costs are timed on an otherwise idle machine; decoding next to the timing would skew both.
        while not job.measured.wait(0.5):
            if session.run_id != run:
                return None
            yield self.view(session, "busy", "Measuring plain per-token cost of both models (once per pair)…")
        return job

    def new_decoder(self, session: Session, controls: Controls, run: int):
        """Build a fresh decoder from the controls (loading models first); yields progress views.

        Returns False if a newer action superseded this one while the models loaded.
        """
        controls.check_prompt()
        settings = controls.settings()  # validate before any loading, so bad input fails at once
        job = yield from self.wait_for_pair(session, controls, run)
        if job is None or session.run_id != run:
            return False
        decoder = SpeculativeDecoder(job.pair, controls.prompt, settings)
        session.start(decoder, job, controls.prompt)
        return True

    # -- stepping --------------------------------------------------------------------------------------------
    def pace(self, session: Session) -> None:
        """Wait out MIN_ROUND_INTERVAL_S since the last round (see there); call under the session lock."""
        time.sleep(max(0.0, session.round_at + MIN_ROUND_INTERVAL_S - time.perf_counter()))

    def step_once(self, session: Session, run: int) -> Round | None:
        """One round under the session lock, unless the run was superseded or the decoder is done."""
        session.acquire()
        try:
            if session.run_id != run or session.decoder is None or session.decoder.done:
                return None
            # Pacing (see MIN_ROUND_INTERVAL_S) also keeps queued Steps' updates from overtaking each other.
            self.pace(session)
            if session.run_id != run:
                return None
            session.round_at = time.perf_counter()
            rnd = session.decoder.step()
            session.record(rnd)
            return rnd
        finally:
            session.lock.release()

    def charts_due(self, session: Session) -> bool:
        now = time.perf_counter()
        if now - session.charts_at >= CHART_INTERVAL_S:
            session.charts_at = now
            return True
        return False

    def stream(self, session: Session, run: int):
        """Run rounds until the end (or until superseded), yielding a view after each."""
        dec = session.decoder
        while not dec.done:
            rnd = self.step_once(session, run)
            if rnd is None or session.run_id != run:
                yield from self.interrupted(session)
                return
            yield self.view(session, "busy", progress_message(dec, rnd), charts=self.charts_due(session))
        yield self.view(session, "ok", finished_message(dec), recorded=True)
        log_run(session)

    def stream_detached(self, session: Session, controls: Controls, run: int):
        """The ZeroGPU Generate: load (in this process), then decode in one gpu_run.decode_rounds call, recording
        the rounds it yields into a RunLog. Stop and Reset end the stream at the next round, as for a live run."""
        controls.check_prompt()
        settings = controls.settings()
        job = yield from self.wait_for_pair(session, controls, run)
        if job is None or session.run_id != run:
            yield from self.interrupted(session)
            return
        pair, req = job.pair, job.request
        # The tokenizer is all this needs, so a bad prompt fails here without asking for a GPU.
        prompt_ids = encode_prompt(pair.tokenizer, controls.prompt, settings.chat)
        log = RunLog(settings=settings, models=pair.describe(), prompt_ids=prompt_ids, prompt=controls.prompt)
        if job.costs:
            log.costs = (job.costs.target_ms, job.costs.draft_ms)
        session.start(None, job, controls.prompt, log=log)
        yield self.view(session, "busy", "Waiting for a GPU, then decoding…")
        events = gpu_run.decode_rounds(req.name, req.target, req.draft, self.loader.dtype, self.loader.device,
                                       controls.prompt, settings, job.costs is None)
        try:
            for event in events:
                if event[0] == "costs":
                    job.costs = event[1]
                    log.costs = (job.costs.target_ms, job.costs.draft_ms)
                    continue
                _, rnd, text = event
                session.acquire()
                try:
                    if session.run_id != run:
                        break
                    self.pace(session)
                    session.round_at = time.perf_counter()
                    log.rounds.append(rnd)
                    log.text, log.stop_reason = text, rnd.stop_reason
                    session.record(rnd)
                finally:
                    session.lock.release()
                if session.run_id != run:
                    break
                if not log.done:
                    yield self.view(session, "busy", progress_message(log, rnd), charts=self.charts_due(session))
        finally:
            events.close()
        if session.run_id != run:
            yield from self.interrupted(session)
            return
        yield self.view(session, "ok", finished_message(log), recorded=True)
        log_run(session)

    def interrupted(self, session: Session):
        """A stream was superseded. Stop, Reset and trace import leave it their request: carrying it out here, as
        the stream's own last update, keeps it ordered after every update the stream sent (no stale
        'Generating…' afterwards). After Step or a new Generate the stream just ends; that action renders."""
        what, run = session.interrupt or ("", -1)
        if run != session.run_id:
            return
        session.interrupt = None
        if what == "stop":
            yield self.stopped_view(session)
        elif what == "reset":
            yield self.reset_view(session)
        elif what == "replay":
            yield self.replay_view(session)

    def streaming(self, session: Session, handler):
        """Run a streaming handler with session.streamer set, so Stop and Reset know to leave it a request."""
        run = session.new_run()
        session.streamer = run
        try:
            yield from handler(run)
        finally:
            if session.streamer == run:
                session.streamer = None

    # -- handlers (bound in app.py) --------------------------------------------------------------------------
    def generate(self, session: Session | None, *inputs):
        """Start a new run from the controls and stream it round by round."""
        session = session or Session()
        controls = Controls(*inputs)

        def run_(run: int):
            yield self.view(session, "busy", "Starting…")
            if self.detached:
                yield from self.stream_detached(session, controls, run)
            elif (yield from self.new_decoder(session, controls, run)):
                yield self.view(session, "busy", "Prefilling the prompt…")
                yield from self.stream(session, run)
            else:
                yield from self.interrupted(session)

        yield from self.streaming(session, run_)

    def run_to_end(self, session: Session | None, *inputs):
        """Continue the current run to its end (starting one from the controls if there is none)."""
        session = session or Session()
        if self.detached:
            yield self.view(session, "info", DETACHED_STEP_MESSAGE)
            return

        def run_(run: int):
            if session.decoder is None:
                if not (yield from self.new_decoder(session, Controls(*inputs), run)):
                    yield from self.interrupted(session)
                    return
            elif session.decoder.done:
                yield self.view(session, "info", finished_message(session.decoder)
                                + " Press Generate or Reset to start over.")
                return
            yield from self.stream(session, run)

        yield from self.streaming(session, run_)

    def step(self, session: Session | None, *inputs):
        """Run exactly one round (starting a run from the controls if there is none).

        Step ends a running stream, but not another Step: presses queued quickly (the S key) each run one round,
        one after another under the session lock.
        """
        session = session or Session()
        if self.detached:
            yield self.view(session, "info", DETACHED_STEP_MESSAGE)
            return
        run = session.new_run() if session.streamer is not None else session.run_id
        if session.decoder is None and not (yield from self.new_decoder(session, Controls(*inputs), run)):
            return
        dec = session.decoder
        if dec.done:
            yield self.view(session, "info", finished_message(dec) + " Press Generate or Reset to start over.",
                            recorded=True)
            return
        rnd = self.step_once(session, run)
        if rnd is None:  # superseded by a newer action while waiting for the lock
            return
        msg = f"Stepped round {rnd.index + 1}: {describe_round(rnd)}."
        msg += " " + (finished_message(dec) if dec.done else "Press Step (S) again, or Run to end.")
        yield self.view(session, "ok" if dec.done else "info", msg, recorded=True)

    def stop(self, session: Session | None):
        """Stop a streaming run after its in-flight round; the stream itself renders the stopped state."""
        session = session or Session()
        run = session.new_run()
        if session.streamer is not None:
            session.interrupt = ("stop", run)
            return tuple(gr.skip() for _ in self.OUTPUTS)
        return self.stopped_view(session)

    def reset(self, session: Session | None):
        """Drop the current run; the next Step or Generate starts from the controls."""
        session = session or Session()
        run = session.new_run()
        if session.streamer is not None:
            session.interrupt = ("reset", run)
            return tuple(gr.skip() for _ in self.OUTPUTS)
        return self.reset_view(session)

    def import_trace(self, session: Session | None, path):
        """Replay an uploaded trace file: validate it, then show its rounds as a run; no model is loaded.

        A malformed file raises TraceError, which `guarded` shows as the status message; the current run stays.
        """
        session = session or Session()
        if not path:
            raise TraceError("no trace file was uploaded; choose a .json file exported by specdec")
        if not isinstance(path, (str, os.PathLike)):
            raise TraceError(f"expected an uploaded trace file, got {type(path).__name__}")
        log = log_from_trace(load_trace_file(path))
        run = session.new_run()
        session.start(None, None, prompt_text(log.prompt), log=log)
        if session.streamer is not None:  # the stream renders the replay as its last update (see interrupted)
            session.interrupt = ("replay", run)
            return tuple(gr.skip() for _ in self.OUTPUTS)
        return self.replay_view(session)

    def replay_view(self, session: Session) -> tuple:
        return self.view(session, "ok", describe_replay(session.log), recorded=True)

    def export_trace(self, session: Session | None) -> str | None:
        """Write the session's run as a trace file; returns its path, or None when there is no run to export.

        A live run is read under the session lock, so a round in flight never lands half-way into the file.
        """
        if session is None or not session.rounds:
            return None
        session.acquire()
        try:
            run = session.run
            text = trace_json(run, self.costs(session), session.prompt, bool(run.settings.chat))
            label = run.pair.describe().get("name", "run")
        finally:
            session.lock.release()
        return str(write_trace(text, label))

    def stopped_view(self, session: Session) -> tuple:
        run = session.run
        if run is None:
            return self.view(session, "info", "Nothing is running.", recorded=True)
        if run.done:
            return self.view(session, "ok", finished_message(run), recorded=True)
        if session.decoder is None:  # a RunLog: nothing to continue
            return self.view(session, "info", f"Stopped after {len(run.rounds)} rounds ({len(run.generated_ids)} "
                                              "tokens). Generate starts a new run.", recorded=True)
        return self.view(session, "info", f"Stopped after {len(run.rounds)} rounds ({len(run.generated_ids)} tokens). "
                                          "Step or Run to end continues; Generate starts over.", recorded=True)

    def reset_view(self, session: Session) -> tuple:
        session.acquire()
        try:
            session.clear()
        finally:
            session.lock.release()
        return self.view(session, "info", "Reset. Press Generate to stream a run, or Step (S) to go one round at a time.",
                         recorded=True)

    def select(self, session: Session | None, r, p) -> tuple:
        """Point the p-vs-q chart at round r, position p (clamped); returns (round_dd, pos_dd, figure)."""
        rounds = session.rounds if session else []
        if not rounds:
            return gr.skip(), gr.skip(), gr.skip()
        r = min(max(int(r if r is not None else len(rounds) - 1), 0), len(rounds) - 1)
        rnd = rounds[r]
        p = min(max(int(p if p is not None else default_selection(rnd)[1]), 0), rnd.gamma)
        return (gr.Dropdown(choices=round_choices(rounds), value=r),
                gr.Dropdown(choices=position_choices(rnd), value=p), pq_figure(rnd, p))

    def select_round(self, session: Session | None, r):
        rounds = session.rounds if session else []
        if not rounds or r is None:
            return gr.skip(), gr.skip(), gr.skip()
        r = min(max(int(r), 0), len(rounds) - 1)
        return self.select(session, r, default_selection(rounds[r])[1])

    def token_clicked(self, session: Session | None, evt: gr.EventData):
        data = getattr(evt, "_data", None) or {}
        if "round" not in data:
            return gr.skip(), gr.skip(), gr.skip()
        return self.select(session, data.get("round"), data.get("pos"))

    def current_pair(self):
        """The startup pair for the Learn tab: None while loading, a ModelLoadError if loading failed."""
        if self.startup_job.error:
            raise ModelLoadError(self.startup_job.error)
        return self.startup_job.pair if self.startup_job.loaded.is_set() else None

    def model_tick(self, pair: str, target: str, draft: str):
        """Timer: refresh the model badge while the selected (or startup) pair loads; stop ticking once done."""
        job = self.loader.peek(PairRequest(pair or "default", (target or "").strip(), (draft or "").strip()))
        job = job or self.startup_job
        return self.model_badge(job), gr.Timer(active=job.state == "loading")

    def preload(self, pair: str):
        """Start loading a preset as soon as it is picked, so Generate does not wait for it."""
        job = self.loader.request(PairRequest(pair or "default"))
        return self.model_badge(job), gr.Timer(active=job.state == "loading")


# --------------------------------------------------------------------------------------------- labelling


def default_selection(rnd: Round) -> tuple[int, int]:
    """Chart the most telling position of a round: its rejection, else the bonus position."""
    return rnd.index, rnd.rejected_at if rnd.rejected_at is not None else rnd.gamma


def describe_round(rnd: Round) -> str:
    kept = f"{rnd.n_accepted}/{rnd.gamma} guesses kept"
    if rnd.is_bonus:
        return f"{kept}, bonus {quoted(rnd.emitted_piece)}"
    return f"{kept}, {quoted(rnd.draft_pieces[rnd.rejected_at])} rejected → {quoted(rnd.emitted_piece)}"


def round_choices(rounds: list[Round]) -> list[tuple[str, int]]:
    return [(f"Round {r.index + 1}: {r.n_accepted}/{r.gamma} kept" + (" + bonus" if r.is_bonus else ", repaired"),
             r.index) for r in rounds]


def position_choices(rnd: Round) -> list[tuple[str, int]]:
    out = []
    for i in range(rnd.gamma):
        if i < rnd.n_accepted:
            fate = "accepted"
        elif i == rnd.rejected_at:
            fate = f"rejected → {quoted(rnd.emitted_piece)}"
        else:
            fate = "discarded"
        out.append((f"{i}: {quoted(rnd.draft_pieces[i])} {fate}", i))
    bonus = f"bonus {quoted(rnd.emitted_piece)}" if rnd.is_bonus else "not reached"
    out.append((f"{rnd.gamma}: after the last guess ({bonus})", rnd.gamma))
    return out


def progress_message(dec: SpeculativeDecoder | RunLog, rnd: Round) -> str:
    return (f"Generating… round {rnd.index + 1} · {len(dec.generated_ids)}/{dec.settings.max_new_tokens} tokens · "
            f"last round: {describe_round(rnd)}")


def finished_message(dec: SpeculativeDecoder | RunLog) -> str:
    why = {"eos": "end of text", "max_new_tokens": "token limit reached"}.get(dec.stop_reason, "finished")
    return f"Done: {len(dec.generated_ids)} tokens in {len(dec.rounds)} rounds ({why})."


def log_run(session: Session) -> None:
    """One line per finished run on stderr: engine time per round vs time spent rendering the UI per round."""
    rounds, ui = session.rounds, session.ui_ms
    if not rounds or not ui:
        return
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print(f"[specdec] run: {len(rounds)} rounds, {len(session.run.generated_ids)} tokens; median round_ms "
          f"{med([r.round_ms for r in rounds]):.1f} (engine), median render {med(ui):.1f} ms/update (UI)",
          file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------- safety net


def guarded(handler, n_outputs: int | None = None):
    """Turn any exception from a handler into a message, never a traceback: SpecDecError text is shown as is.

    View handlers (n_outputs None) answer with the full error view; small handlers with n_outputs skips + a toast.
    """
    pg = handler.__self__

    def failure(args, exc: Exception):
        if not isinstance(exc, SpecDecError):
            traceback.print_exc(file=sys.stderr)
        message = str(exc) if isinstance(exc, SpecDecError) else f"Unexpected error ({type(exc).__name__}): {exc}"
        if n_outputs is not None:
            gr.Warning(message)
            return gr.skip() if n_outputs == 1 else tuple(gr.skip() for _ in range(n_outputs))
        session = args[0] if args and isinstance(args[0], Session) else Session()
        return pg.error_view(session, message)

    if inspect.isgeneratorfunction(handler):
        @functools.wraps(handler)
        def gen_wrapper(*args):
            try:
                yield from handler(*args)
            except Exception as exc:  # noqa: BLE001 - see docstring
                yield failure(args, exc)
        return gen_wrapper

    @functools.wraps(handler)
    def wrapper(*args):
        try:
            return handler(*args)
        except Exception as exc:  # noqa: BLE001 - see docstring
            return failure(args, exc)
    return wrapper


def env_request() -> PairRequest:
    return PairRequest(os.environ.get("SPECDEC_PAIR", "default"))
