"""The playground's handlers (what app.py binds to buttons) and the view they all answer with.

Streaming handlers are generators that yield a view after every round. The session and its run protocol are in
ui/session.py, reading the controls in ui/controls.py, the words in components/labels.py. Everything a view
shows comes from one RunRecord (`Session.current()`): the live decoder's record, a replayed trace, or a run
decoded in a ZeroGPU worker (`detached`, ui/gpu_run.py).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import time
import traceback

import gradio as gr

from components import empty_figure, pq_figure, render_model_status, render_phases, render_prompt, render_stats
from components import render_status, speedup_figure
from components.charts import acceptance_histogram_figure, time_breakdown_figure
from components.tree import render_tree, tree_pq_figure
from components.labels import (default_selection, describe_replay, describe_round, finished_message,
                               position_choices, progress_message, prompt_text, round_choices, stopped_message)
from specdec.loop.decoder import SpeculativeDecoder
from specdec.loop.tree import TreeDecoder
from specdec.loop.tree_display import TreeRun
from specdec.core.settings import encode_prompt
from specdec.drafters.head import resolve_draft_vocab
from specdec.core.errors import InvalidInputError, ModelLoadError, SpecDecError, TraceError
from specdec.core.record import PairInfo, RunRecord
from specdec.core.metrics import time_breakdown
from specdec.io import server_metrics
from specdec.io.trace import dumps_trace, load_trace_file

from . import gpu_run
from .controls import Controls
from .loader import LoadJob, PairLoader, PairRequest
from .session import Session
from .trace_io import write_trace

# While streaming, the two Plotly charts (and the Race tab's chart) are redrawn at most this often. Gradio rebuilds
# a Plotly chart from scratch on every update (hundreds of ms of browser main thread on a slow machine); with fast
# rounds (tiny pair, GPU) redrawing both every round backs the browser up until the page stops responding. Tokens,
# status and stats still update every round, and the last update of a run always carries the charts.
CHART_INTERVAL_S = 1.0
DETACHED_STEP_MESSAGE = ("Step and Run to end are off on this ZeroGPU Space: the GPU is lent for one call at a time, "
                         "so a decoder cannot stay on it between clicks. Generate streams a whole run on the GPU; to "
                         "step round by round, run the app locally or on a CPU or dedicated-GPU Space.")
AGAIN = " Press Generate or Reset to start over."
DETACHED_TREE_MESSAGE = ("Token trees are off on this ZeroGPU Space: its runs decode in a GPU worker that only runs "
                         "chains. Turn “Token tree” off, or run the app locally for tree rounds.")


class Playground:
    """Handlers bound to one PairLoader; app.py wires their outputs in the order of OUTPUTS below.

    detached: decode each Generate run inside one call of ui/gpu_run.decode_rounds (the ZeroGPU path: the decoder
    lives in the GPU worker, the session keeps a RunRecord of the rounds it yields); Step and Run to end are off.
    allow_local: custom ids may name local folders (False on a public Space).
    """

    OUTPUTS = ("session", "status", "tokens", "phases", "stats", "pq_plot", "speed_plot", "round_dd", "pos_dd",
               "text", "recorded", "model", "tree", "tree_plot", "time_plot", "hist_plot")

    def __init__(self, loader: PairLoader, startup: PairRequest, *, detached: bool = False, allow_local: bool = True):
        self.loader = loader
        self.startup = startup
        self.detached = detached
        self.allow_local = allow_local
        self.startup_job = loader.request(startup)

    # -- rendering -------------------------------------------------------------------------------------------
    def model_badge(self, job: LoadJob | None) -> str:
        job = job or self.startup_job
        if job.state == "error":
            return render_model_status("error", f"Model load failed: {job.error}")
        if job.state == "loading":
            return render_model_status("loading", f"Loading {job.request.label}… {job.message} "
                                                   f"({time.time() - job.started:.0f} s)", fraction=job.fraction)
        info = job.pair.info()
        details = {"target": info.target, "draft": info.draft, "device": info.device, "dtype": info.dtype}
        if info.draft_quant:
            details["draft weights"] = info.draft_quant
        head = resolve_draft_vocab(job.pair, None)  # the engine's rule for the default draft head
        if head:  # q is zero outside the draft's head: say so where the charts' q = 0 bars can be explained
            details["draft head"] = f"ids < {head} + EOS + the text's tokens"
        if job.costs:
            details["plain target"] = (f"{job.costs.target_ms:.0f} ms/token (timed at load, "
                                       f"{time.strftime('%H:%M', time.localtime(job.measured_at))}; each run's "
                                       "speedup divides by plain steps timed beside it)")
            details["c_plain"] = f"{job.costs.c_plain:.2f}"
        return render_model_status("ready", f"Model pair: {info.name}", details)

    def view(self, session: Session, kind: str, message: str, *, recorded: bool = False,
             charts: bool = True) -> tuple:
        """All playground outputs for the session's current run.

        recorded: also refresh the Learn tab's state (only at the end of a run or step: it has listeners).
        charts: False leaves both charts and their selectors as they are (see CHART_INTERVAL_S).
        """
        t0 = time.perf_counter()
        rec = session.current()
        rounds = rec.rounds if rec is not None else []
        tokens = (render_prompt(prompt_text(rec.prompt)) if rec is not None else "") + "".join(session.round_html)
        if rounds and not charts:
            pq = speed = round_dd = pos_dd = time_fig = hist_fig = gr.skip()
        elif rounds:
            r, p = default_selection(rounds[-1])
            pq = pq_figure(rounds[r], p)
            speed = speedup_figure(rounds, rec.costs, rec.baseline_ms_per_token,
                                   baseline_prompt_ms=rec.baseline_prompt_ms)
            # Drawn when a run or step ends, not while streaming: building and sending more figures per round
            # competes with the decoding for this machine's cores (and the time chart would measure that).
            if recorded:
                time_fig = time_breakdown_figure(time_breakdown(rounds, rec.costs, rec.baseline_ms_per_token,
                                                                         rec.baseline_prompt_ms))
                hist_fig = acceptance_histogram_figure(server_metrics.per_request(rec, detailed=False))
            else:
                time_fig = hist_fig = gr.skip()
            round_dd = gr.Dropdown(choices=round_choices(rounds), value=r, interactive=True)
            pos_dd = gr.Dropdown(choices=position_choices(rounds[r]), value=p, interactive=True)
        else:
            pq = empty_figure("p vs q appears after the first round")
            speed = empty_figure("speedup appears after the first round")
            time_fig = empty_figure("the time breakdown appears after the first round")
            hist_fig = empty_figure("the acceptance histogram appears after the first round")
            round_dd = gr.Dropdown(choices=[], value=None, interactive=False)
            pos_dd = gr.Dropdown(choices=[], value=None, interactive=False)
        out = (
            session,
            render_status(kind, message),
            tokens,
            render_phases(rounds[-1] if rounds else None),
            render_stats(rec.metrics if rounds else None, rec.baseline_steps if rounds else 0),
            pq,
            speed,
            round_dd,
            pos_dd,
            rec.text if rec is not None else "",
            # What the Learn tab reads: the runs on screen as RunRecords (today the one run of this session).
            ([rec] if rounds else []) if recorded else gr.skip(),
            self.model_badge(session.job),
            *self.tree_view(rounds, len(rounds) - 1, charts),
            time_fig,
            hist_fig,
        )
        if rounds:
            session.ui_ms.append((time.perf_counter() - t0) * 1e3)
        return out

    @staticmethod
    def tree_view(rounds, r: int, charts: bool = True) -> tuple:
        """(tree HTML, per-node chart) of round r: shown for a tree run, hidden for a chain run; with no rounds yet
        the placeholders, visibility left to the Token tree switch."""
        if not rounds:
            return render_tree(None), tree_pq_figure(None) if charts else gr.skip()
        rnd = rounds[r]
        if rnd.tree is None:
            return gr.HTML(visible=False), gr.Plot(visible=False) if charts else gr.skip()
        html_ = gr.HTML(render_tree(rnd.tree, rnd.index, "".join(rnd.committed_pieces)), visible=True)
        return html_, gr.Plot(tree_pq_figure(rnd.tree, rnd.index), visible=True) if charts else gr.skip()

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

    def new_run(self, session: Session, controls: Controls, run: int):
        """Start a run from the controls (loading models first), yielding progress views; returns the rounds to
        stream, or None if a newer action superseded this one meanwhile.

        Live: a SpeculativeDecoder in this process. Detached (ZeroGPU): an empty RunRecord that the GPU call's
        rounds fill in.
        """
        controls.check_prompt()
        settings = controls.settings()  # validate before any loading, so bad input fails at once
        tree = controls.tree_shape()
        if tree is not None and self.detached:
            raise InvalidInputError(DETACHED_TREE_MESSAGE)
        job = yield from self.wait_for_pair(session, controls, run)
        if job is None or session.run_id != run:
            return None
        if tree is not None:
            widths, mode = tree
            session.start(TreeRun(TreeDecoder(job.pair, controls.prompt, settings, widths, mode)), job)
            return session.live_rounds(run)
        if not self.detached:
            # plain_probe: the measured speedup divides by plain steps timed beside this run, under the same load
            # history: this session's own earlier outputs, for the suffix drafter (ui/session.Session.earlier_texts)
            session.start(SpeculativeDecoder(job.pair, controls.prompt, settings, plain_probe=True,
                                             history=session.earlier_texts()), job)
            return session.live_rounds(run)
        pair, req = job.pair, job.request
        # The tokenizer is all this needs, so a bad prompt fails here without asking for a GPU.
        prompt_ids = encode_prompt(pair.tokenizer, controls.prompt, settings.chat)
        history = session.earlier_texts()
        session.start(None, job, RunRecord(controls.prompt, prompt_ids, settings, pair.info(), costs=job.costs))
        events = gpu_run.decode_rounds(req.name, req.target, req.draft, self.loader.dtype, self.loader.device,
                                       controls.prompt, settings, job.costs is None, history)
        return session.worker_rounds(run, events)

    # -- streaming -------------------------------------------------------------------------------------------
    def stream(self, session: Session, run: int, rounds):
        """The one stream loop: a view after each round until the run ends or is superseded."""
        try:
            for rnd in rounds:
                if session.run_id != run:
                    break
                if not session.current().stop_reason:
                    charts = session.charts_due(CHART_INTERVAL_S)
                    yield self.view(session, "busy", progress_message(session.current(), rnd), charts=charts)
        finally:
            rounds.close()
        if session.run_id != run:
            yield from self.interrupted(session)
            return
        yield self.view(session, "ok", finished_message(session.current()), recorded=True)
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
            rounds = yield from self.new_run(session, controls, run)
            if rounds is None:
                yield from self.interrupted(session)
                return
            wait = "Waiting for a GPU, then decoding…" if self.detached else "Running the prompt and the first round…"
            yield self.view(session, "busy", wait)
            yield from self.stream(session, run, rounds)

        yield from self.streaming(session, run_)

    def run_to_end(self, session: Session | None, *inputs):
        """Continue the current run to its end (starting one from the controls if there is none)."""
        session = session or Session()
        if self.detached:
            yield self.view(session, "info", DETACHED_STEP_MESSAGE)
            return

        def run_(run: int):
            if session.decoder is None:
                rounds = yield from self.new_run(session, Controls(*inputs), run)
                if rounds is None:
                    yield from self.interrupted(session)
                    return
            elif session.decoder.done:
                yield self.view(session, "info", finished_message(session.current()) + AGAIN)
                return
            else:
                rounds = session.live_rounds(run)
            yield from self.stream(session, run, rounds)

        yield from self.streaming(session, run_)

    def step(self, session: Session | None, *inputs):
        """Run exactly one round (starting a run from the controls if there is none).

        Step ends a running stream. Steps never overlap in the browser: a press made while one runs queues one more
        (app.py wires it so), which starts once this one's updates have landed.
        """
        session = session or Session()
        if self.detached:
            yield self.view(session, "info", DETACHED_STEP_MESSAGE)
            return
        run = session.new_run() if session.streamer is not None else session.run_id
        if session.decoder is None and (yield from self.new_run(session, Controls(*inputs), run)) is None:
            return
        if session.decoder.done:
            yield self.view(session, "info", finished_message(session.current()) + AGAIN, recorded=True)
            return
        rnd = session.step_once(run)
        if rnd is None:  # superseded by a newer action while waiting for the lock
            return
        rec = session.current()
        msg = f"Stepped round {rnd.index + 1}: {describe_round(rnd)}."
        msg += " " + (finished_message(rec) if rec.stop_reason else "Press Step (S) again, or Run to end.")
        yield self.view(session, "ok" if rec.stop_reason else "info", msg, recorded=True)

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
        record = load_trace_file(path)
        run = session.new_run()
        session.start(record=record)
        if session.streamer is not None:  # the stream renders the replay as its last update (see interrupted)
            session.interrupt = ("replay", run)
            return tuple(gr.skip() for _ in self.OUTPUTS)
        return self.replay_view(session)

    def replay_view(self, session: Session) -> tuple:
        return self.view(session, "ok", describe_replay(session.record), recorded=True)

    def export_trace(self, session: Session | None) -> str | None:
        """Write the session's run as a trace file; returns its path, or None when there is no run to export.

        A live run is read under the session lock, so a round in flight never lands half-way into the file.
        """
        if session is None or not session.rounds:
            return None
        session.acquire()
        try:
            record = session.current()
            text = dumps_trace(record)
        finally:
            session.lock.release()
        return str(write_trace(text, record.pair.name or "run"))

    def stopped_view(self, session: Session) -> tuple:
        rec = session.current()
        if rec is None:
            return self.view(session, "info", "Nothing is running.", recorded=True)
        if rec.stop_reason:
            return self.view(session, "ok", finished_message(rec), recorded=True)
        return self.view(session, "info", stopped_message(rec, session.decoder is not None), recorded=True)

    def reset_view(self, session: Session) -> tuple:
        session.clear()
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

    def select_tree(self, session: Session | None, r):
        """Point the tree view at round r (the round dropdown); returns (tree HTML, per-node chart)."""
        rounds = session.rounds if session else []
        if not rounds or r is None or rounds[-1].tree is None:
            return gr.skip(), gr.skip()
        return self.tree_view(rounds, min(max(int(r), 0), len(rounds) - 1))

    def token_clicked(self, session: Session | None, evt: gr.EventData):
        """A click on a token chip points the chart at it; the last click wins.

        Clicks are answered side by side (app.py wires them with trigger_mode "multiple": with Gradio's "once" a
        click made while the previous one was answered was dropped, so the highlighted chip and the chart
        disagreed). The page numbers its clicks; one answered after a newer one changes nothing.
        """
        data = getattr(evt, "_data", None) or {}
        if "round" not in data or session is None:
            return gr.skip(), gr.skip(), gr.skip()
        seq = int(data.get("seq") or 0)
        with session.click_lock:  # held while the chart is built, so answers leave in the order they were taken
            if seq and seq <= session.last_click:
                return gr.skip(), gr.skip(), gr.skip()
            session.last_click = max(session.last_click, seq)
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


def log_run(session: Session) -> None:
    """One line per finished run on stderr: engine time per round vs time spent rendering the UI per round."""
    rounds, ui = session.rounds, session.ui_ms
    if not rounds or not ui:
        return
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print(f"[specdec] run: {len(rounds)} rounds, {sum(len(r.committed_ids) for r in rounds)} tokens; median "
          f"round_ms {med([r.round_ms for r in rounds]):.1f} (engine), median render {med(ui):.1f} ms/update (UI)",
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
