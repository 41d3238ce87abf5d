"""Playground wiring helpers: the per-browser Session, reading the controls, and turning a Session into outputs.

The handlers here are what app.py binds to buttons. Streaming handlers are generators that yield after every round.
Each browser session keeps its own decoder in a gr.State; Gradio stores State values by reference (only the initial
value is deep-copied), so the decoder holds the shared, read-only models by reference and nothing is copied.

Concurrency: a Session's rounds run under its lock, and every new action (Generate, Step, Stop, Reset) bumps
`run_id`; a generator whose run id is stale stops before its next round. That keeps one decoder from being
stepped by two events at once even when Gradio's cancellation lets an in-flight round finish.
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
from specdec.decoder import DecodeSettings, SpeculativeDecoder
from specdec.errors import InvalidInputError, ModelLoadError, SpecDecError
from specdec.events import Round
from specdec.metrics import summarize
from specdec.sampling import SamplingConfig

from .loader import LoadJob, PairLoader, PairRequest

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


# --------------------------------------------------------------------------------------------------- session


@dataclass
class Session:
    decoder: SpeculativeDecoder | None = None
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
    def rounds(self) -> list[Round]:
        return self.decoder.rounds if self.decoder else []

    def new_run(self) -> int:
        """Invalidate whatever run is streaming; return the id of the run that starts now."""
        self.run_id += 1
        return self.run_id

    def start(self, decoder: SpeculativeDecoder, job: LoadJob, prompt: str) -> None:
        # Under the lock: a superseded run's in-flight round must not land in the new run's lists.
        self.acquire()
        try:
            self.decoder, self.job, self.prompt = decoder, job, prompt
            self.round_html, self.round_dicts, self.ui_ms = [], [], []
        finally:
            self.lock.release()

    def clear(self) -> None:
        self.decoder, self.job, self.prompt = None, None, ""
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

    def pair_request(self) -> PairRequest:
        return PairRequest(self.pair or "default", (self.target or "").strip(), (self.draft or "").strip())


def _number(x, name: str) -> float:
    if x is None or x == "":
        raise InvalidInputError(f"{name} is empty; enter a number")
    try:
        return float(x)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{name} must be a number, got {x!r}") from None


def _whole(x, name: str) -> int:
    v = _number(x, name)
    if v != int(v):
        raise InvalidInputError(f"{name} must be a whole number, got {x!r}")
    return int(v)


# ------------------------------------------------------------------------------------------------- views


class Playground:
    """Handlers bound to one PairLoader; app.py wires their outputs in the order of OUTPUTS below."""

    OUTPUTS = ("session", "status", "tokens", "phases", "stats", "pq_plot", "speed_plot", "round_dd", "pos_dd",
               "text", "recorded", "model")

    def __init__(self, loader: PairLoader, startup: PairRequest):
        self.loader = loader
        self.startup = startup
        self.startup_job = loader.request(startup)

    # -- rendering -------------------------------------------------------------------------------------------
    def costs(self, session: Session) -> tuple[float | None, float | None]:
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
        text = session.decoder.text if session.decoder else ""
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
        return {
            "rounds": list(session.round_dicts),
            "speedup": m.speedup if m else None,
            "c": m.c if m else None,
            "pair": session.job.request.label if session.job else None,
        }

    def error_view(self, session: Session, message: str) -> tuple:
        gr.Warning(message)
        return self.view(session, "error", message, recorded=True)

    # -- model loading ---------------------------------------------------------------------------------------
    def wait_for_pair(self, session: Session, controls: Controls, run: int):
        """Yield loading views until the requested pair is loaded and its step costs are measured."""
        job = self.loader.request(controls.pair_request())
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
        settings = controls.settings()  # validate before any loading, so bad input fails at once
        job = yield from self.wait_for_pair(session, controls, run)
        if job is None or session.run_id != run:
            return False
        decoder = SpeculativeDecoder(job.pair, controls.prompt, settings)
        session.start(decoder, job, controls.prompt)
        return True

    # -- stepping --------------------------------------------------------------------------------------------
    def step_once(self, session: Session, run: int) -> Round | None:
        """One round under the session lock, unless the run was superseded or the decoder is done."""
        session.acquire()
        try:
            if session.run_id != run or session.decoder is None or session.decoder.done:
                return None
            # Pacing (see MIN_ROUND_INTERVAL_S) also keeps queued Steps' updates from overtaking each other.
            time.sleep(max(0.0, session.round_at + MIN_ROUND_INTERVAL_S - time.perf_counter()))
            if session.run_id != run:
                return None
            session.round_at = time.perf_counter()
            rnd = session.decoder.step()
            session.record(rnd)
            return rnd
        finally:
            session.lock.release()

    def stream(self, session: Session, run: int):
        """Run rounds until the end (or until superseded), yielding a view after each."""
        dec = session.decoder
        while not dec.done:
            rnd = self.step_once(session, run)
            if rnd is None or session.run_id != run:
                yield from self.interrupted(session)
                return
            now = time.perf_counter()
            charts = now - session.charts_at >= CHART_INTERVAL_S
            if charts:
                session.charts_at = now
            yield self.view(session, "busy", progress_message(dec, rnd), charts=charts)
        yield self.view(session, "ok", finished_message(dec), recorded=True)
        log_run(session)

    def interrupted(self, session: Session):
        """A stream was superseded. Stop and Reset leave it their request: carrying it out here, as the stream's own
        last update, keeps it ordered after every update the stream sent (no stale 'Generating…' afterwards).
        After Step or a new Generate the stream just ends; that action renders."""
        what, run = session.interrupt or ("", -1)
        if run != session.run_id:
            return
        session.interrupt = None
        if what == "stop":
            yield self.stopped_view(session)
        elif what == "reset":
            yield self.reset_view(session)

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
            if (yield from self.new_decoder(session, controls, run)):
                yield self.view(session, "busy", "Prefilling the prompt…")
                yield from self.stream(session, run)
            else:
                yield from self.interrupted(session)

        yield from self.streaming(session, run_)

    def run_to_end(self, session: Session | None, *inputs):
        """Continue the current run to its end (starting one from the controls if there is none)."""
        session = session or Session()

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

    def stopped_view(self, session: Session) -> tuple:
        dec = session.decoder
        if dec is None:
            return self.view(session, "info", "Nothing is running.", recorded=True)
        if dec.done:
            return self.view(session, "ok", finished_message(dec), recorded=True)
        return self.view(session, "info", f"Stopped after {len(dec.rounds)} rounds ({len(dec.generated_ids)} tokens). "
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


def progress_message(dec: SpeculativeDecoder, rnd: Round) -> str:
    return (f"Generating… round {rnd.index + 1} · {len(dec.generated_ids)}/{dec.settings.max_new_tokens} tokens · "
            f"last round: {describe_round(rnd)}")


def finished_message(dec: SpeculativeDecoder) -> str:
    why = {"eos": "end of text", "max_new_tokens": "token limit reached"}.get(dec.stop_reason, "finished")
    return f"Done: {len(dec.generated_ids)} tokens in {len(dec.rounds)} rounds ({why})."


def log_run(session: Session) -> None:
    """One line per finished run on stderr: engine time per round vs time spent rendering the UI per round."""
    rounds, ui = session.rounds, session.ui_ms
    if not rounds or not ui:
        return
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print(f"[specdec] run: {len(rounds)} rounds, {len(session.decoder.generated_ids)} tokens; median round_ms "
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
            return tuple(gr.skip() for _ in range(n_outputs))
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
