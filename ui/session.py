"""One browser tab's run, and the protocol that keeps two events from stepping it at once.

A Session shows one run: a live `decoder` (which Step and Run to end continue), or a `record` with no decoder
behind it (a replayed trace, or on ZeroGPU a run decoded in the GPU worker). Either way `current()` is the run as
a RunRecord, the one thing the views, trace export and the Learn tab read.

Concurrency: a session's rounds run under its lock, and every new action (Generate, Step, Stop, Reset, trace
import) bumps `run_id`; a stream whose run id is stale stops before its next round. That keeps one decoder from
being stepped by two events at once even when Gradio's cancellation lets an in-flight round finish. Gradio keeps
gr.State values by reference (only the initial value is deep-copied), so a session holds the shared, read-only
models by reference and nothing is copied.

History: the texts of this session's earlier runs (`earlier_texts`), which a new run's suffix drafter indexes besides
its prompt and output. They live in this Session only -- one browser tab's gr.State -- and reach a decoder only as
the `history` argument the playground passes; no other session, module or cache ever holds them.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

from components import render_round
from specdec.loop.decoder import SpeculativeDecoder
from specdec.core.errors import SpecDecError
from specdec.core.events import Round
from specdec.models.pair import pair_lease
from specdec.core.record import RunRecord

from .loader import LoadJob

MAX_HISTORY_RUNS = 8  # earlier runs a session remembers for the suffix drafter (the most recent)
LOCK_TIMEOUT_S = 60.0  # longest wait for an in-flight round (the default pair needs ~1 s per round on CPU)
# Rounds faster than this (tiny pair, GPUs) are paced for display: a browser needs ~0.1 s to draw an update on a
# slow machine, and queued updates make Stop look ignored. The wait is outside Decoder.step, so round_ms, tok/s
# and the measured speedup are unaffected.
MIN_ROUND_INTERVAL_S = float(os.environ.get("SPECDEC_MIN_ROUND_S", "0.2"))


@dataclass
class Session:
    decoder: SpeculativeDecoder | None = None
    record: RunRecord | None = None  # a run without a decoder (replayed trace, ZeroGPU run); never set with decoder
    job: LoadJob | None = None  # the loaded pair the run decodes on (its step costs)
    run_id: int = 0
    round_html: list[str] = field(default_factory=list)  # rendered once per round; rounds never change
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    ui_ms: list[float] = field(default_factory=list)  # time spent rendering outputs after each round
    charts_at: float = 0.0  # perf_counter time of the last chart update sent while streaming
    round_at: float = 0.0  # perf_counter time the last round started (for pacing)
    streamer: int | None = None  # run id of the Generate / Run-to-end handler that is running, if any
    interrupt: tuple[str, int] | None = None  # ("stop" | "reset" | "replay", run id) left for the streamer
    last_click: int = 0  # number of the newest token click answered (the page numbers its clicks 1, 2, ...)
    click_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    history: list[str] = field(default_factory=list, repr=False)  # earlier runs' output texts, oldest first

    # -- what is on screen -------------------------------------------------------------------------------------
    def current(self) -> RunRecord | None:
        """The run on screen as a RunRecord (a live decoder's record carries the pair's measured step costs)."""
        if self.decoder is not None:
            return self.decoder.record(self.job.costs if self.job else None)
        return self.record

    @property
    def rounds(self) -> list[Round]:
        if self.decoder is not None:
            return self.decoder.rounds
        return self.record.rounds if self.record is not None else []

    @property
    def live(self) -> bool:
        """A decoder that Step and Run to end can continue."""
        return self.decoder is not None and not self.decoder.done

    def earlier_texts(self) -> list[str]:
        """This session's earlier runs' outputs, the one on screen included: what a new run's suffix drafter may
        index (at most MAX_HISTORY_RUNS, oldest first)."""
        text = self._shown_text()
        return (self.history + ([text] if text else []))[-MAX_HISTORY_RUNS:]

    def _shown_text(self) -> str:
        rec = self.current() if (self.decoder is not None or self.record is not None) else None
        return rec.text if rec is not None else ""

    def _remember(self) -> None:
        """Keep the run on screen's output in the history before it leaves the screen."""
        self.history = self.earlier_texts()

    # -- run protocol ------------------------------------------------------------------------------------------
    def new_run(self) -> int:
        """Invalidate whatever run is streaming; return the id of the run that starts now."""
        self.run_id += 1
        return self.run_id

    def start(self, decoder: SpeculativeDecoder | None = None, job: LoadJob | None = None,
              record: RunRecord | None = None) -> None:
        # Under the lock: a superseded run's in-flight round must not land in the new run's lists.
        self.acquire()
        try:
            self._remember()
            self.decoder, self.record, self.job = decoder, record, job
            self.round_html, self.ui_ms = [], []
            for rnd in record.rounds if record is not None else []:  # a replay arrives with all its rounds
                self.add(rnd)
        finally:
            self.lock.release()

    def clear(self) -> None:
        self.acquire()
        try:
            self._remember()
            self.decoder, self.record, self.job = None, None, None
            self.round_html, self.ui_ms = [], []
        finally:
            self.lock.release()

    def add(self, rnd: Round) -> None:
        self.round_html.append(render_round(rnd))

    def acquire(self) -> None:
        if not self.lock.acquire(timeout=LOCK_TIMEOUT_S):
            raise SpecDecError("the previous round is still running; try again in a moment")

    def pace(self) -> None:
        """Wait out MIN_ROUND_INTERVAL_S since the last round (see there); call under the session lock."""
        time.sleep(max(0.0, self.round_at + MIN_ROUND_INTERVAL_S - time.perf_counter()))
        self.round_at = time.perf_counter()

    def charts_due(self, interval_s: float) -> bool:
        now = time.perf_counter()
        if now - self.charts_at >= interval_s:
            self.charts_at = now
            return True
        return False

    # -- round sources (what a stream consumes) ------------------------------------------------------------------
    def step_once(self, run: int) -> Round | None:
        """One round of the live decoder under the lock, unless the run was superseded or the decoder is done."""
        self.acquire()
        try:
            if self.run_id != run or not self.live:
                return None
            self.pace()  # see MIN_ROUND_INTERVAL_S
            if self.run_id != run:
                return None
            with pair_lease(self.decoder.pair):  # the shared cache keeps the pair while a round runs on it
                rnd = self.decoder.step()
            self.add(rnd)
            return rnd
        finally:
            self.lock.release()

    def live_rounds(self, run: int) -> Iterator[Round]:
        """The live decoder's rounds, one at a time, until it is done or the run is superseded."""
        while (rnd := self.step_once(run)) is not None:
            yield rnd

    def worker_rounds(self, run: int, events: Iterator[tuple]) -> Iterator[Round]:
        """Rounds decoded elsewhere (ui/gpu_run.decode_rounds' events) added to this session's record.

        The events are awaited outside the lock (a GPU call can queue), and each round is added under it.
        """
        record = self.record
        try:
            for event in events:
                if event[0] == "costs":
                    self.job.costs = record.costs = event[1]
                    continue
                _, rnd, text = event
                self.acquire()
                try:
                    if self.run_id != run:
                        return
                    self.pace()
                    record.rounds.append(rnd)
                    record.text, record.stop_reason = text, rnd.stop_reason
                    self.add(rnd)
                finally:
                    self.lock.release()
                yield rnd
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()
