"""The speculative decoding loop: one `step()` is one round.

A round: the gamma policy says how many guesses to ask for; the drafter proposes them with the exact q each was
drawn from; the target scores the last committed token plus every guess in one forward pass (gamma+1 rows of p,
warped as q was); the rule (`core.verify`) keeps a prefix and emits one repaired or bonus token; the stop rule
(`core.stop`) cuts what is committed at EOS and the token budget; both KV caches roll back to the committed text;
the round becomes a `Round` event (`loop.display`), which the policy and the running totals observe.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Iterator

import torch

from specdec.core.clock import Stopwatch
from specdec.core.errors import InvalidInputError
from specdec.core.events import DraftNote, Round, Totals
from specdec.core.static_cache import open_lm
from specdec.core.metrics import StepCosts
from specdec.core.record import RunRecord
from specdec.core.sampling import Probs, distribution, make_generator
from specdec.core.settings import TOP_DISPLAY, DecodeSettings, encode_prompt
from specdec.core.stop import StopReason, cut_at_stop
from specdec.core.verify import verify
from specdec.drafters import Draft, Drafter, make_drafter, no_draft
from specdec.loop.display import round_event
from specdec.loop.gamma import make_policy
from specdec.models.pair import ModelPair

# Plain steps timed beside a run (`plain_probe=True`): at least PLAIN_PROBE_MIN, then one more whenever the steps
# timed so far cost less than PLAIN_PROBE_SHARE of the rounds' own time. Each is one target pass over the last
# committed token at the run's current context (what a plain decoding step is), under whatever else the machine is
# doing at that moment, so the measured speedup divides two costs paid under the same load. The prompt, too: in this
# mode round one asks for no guesses, so it IS plain decoding's first step (the prompt alone through the target, one
# token from p; its pass timed as `plain_prompt_ms`), and plain decoding of the same tokens costs plain_prompt_ms +
# (n - 1) * the median step (core.metrics.plain_ms_for). (Timing the prompt alone and then scoring round one's guesses
# on top cost the run a second pass that a run without the probe does not make: ~6 % of a 2.5 s run;
# docs/performance.md.)
# A step due after a round is timed when the next round starts, after the round went to whoever reads it: where that
# is a page on the same machine, the step runs while the page draws the round, as plain decoding streamed to that
# page would run (the Race tab's plain lane steps at the same moment), rather than in the quiet before the update.
# None follows the run's first PLAIN_PROBE_SKIP updates: the first one replaces the page's whole view (the last run's
# tokens, empty charts) with this run's, a cost paid once per run, not once per token; a step timed while the page
# does that measured 2-4x the later ones in Chromium and inflated the headline (docs/performance.md).
PLAIN_PROBE_MIN = 2
PLAIN_PROBE_SHARE = 0.15
PLAIN_PROBE_SKIP = 1


class SpeculativeDecoder:
    """Stateful decoder: `step()` runs exactly one round; iterating runs rounds until EOS or max_new_tokens."""

    def __init__(self, pair: ModelPair, prompt, settings: DecodeSettings = DecodeSettings(), drafter: Drafter | None = None,
                 gamma_schedule: list[int] | None = None, top_k: int = TOP_DISPLAY, plain_probe: bool = False,
                 history=()):
        """`gamma_schedule` forces each round's gamma (e.g. the recorded gammas of a trace, to reproduce a run whose
        policy followed wall-clock timings); `top_k` is how many candidates per position each Round carries for
        display -- 0 skips building them (a top-k and a decode per position), for consumers that only want text
        and statistics (the benchmark's timed loop, the CLI). `plain_probe` times plain target steps between rounds
        (`time_plain_step`, outside the rounds' own times): the record's baseline for the measured speedup.
        `history`: texts of the visitor's own earlier runs, for the suffix drafter's index (make_drafter)."""
        self.settings = settings.validate()
        self.pair = pair
        self.tok = pair.tokenizer
        self.prompt = prompt
        self.prompt_ids = encode_prompt(self.tok, prompt, settings.chat)
        self.ids = list(self.prompt_ids)
        self.gen = make_generator(pair.device, settings.seed)
        self.drafter = drafter or make_drafter(pair, settings, self.prompt_ids, history=history,
                                               replay=gamma_schedule is not None)
        self.target = open_lm(pair.target, pair.vocab_size, engine=pair.engine,
                              max_len=len(self.prompt_ids) + self.settings.max_new_tokens)
        self.policy = make_policy(self.settings, gamma_schedule)
        self.top_k = top_k
        self.totals = Totals()
        self.rounds: list[Round] = []
        self.stop_reason: StopReason | None = None
        self._started: float | None = None  # perf_counter time the first round started
        self.plain_probe = plain_probe
        self.plain_step_ms: list[float] = []  # plain target steps timed between rounds (time_plain_step)
        self.plain_prompt_ms: float | None = None  # the prompt pass alone, timed in round one (plain_probe)

    # -- state -----------------------------------------------------------------------------------------------
    @property
    def generated_ids(self) -> list[int]:
        return self.ids[len(self.prompt_ids) :]

    @property
    def text(self) -> str:
        return self.tok.decode(self.generated_ids, skip_special_tokens=True)

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    def __iter__(self) -> Iterator[Round]:
        while not self.done:
            yield self.step()

    # -- one round -------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> Round:
        if self.done:
            raise InvalidInputError("generation has finished; start a new run")
        # No separate prefill: round one feeds the prompt together with its first draft step and its verification.
        # With plain_probe, round one asks for no guesses: it is plain decoding's first step (the prompt alone through
        # the target), and its pass is timed as the plain side's prompt pass (see PLAIN_PROBE_MIN).
        if self.plain_probe and self._plain_step_due():  # a step due after the last round, timed now
            self.time_plain_step()
        clock = Stopwatch(self.pair.device)
        self._started = self._started or clock.start
        opening = self.plain_probe and not self.rounds
        left = self.settings.max_new_tokens - len(self.generated_ids)
        asked = 0 if opening else self.policy.gamma
        if asked == 0:  # nothing asked (a probed run's round one, or a replay of one): one plain target step
            draft = no_draft(self.pair.vocab_size, self.pair.device, DraftNote(self.settings.drafter))
        else:
            gamma = max(1, min(asked, left - 1))  # guesses past the budget are wasted: at most left-1 + repair/bonus
            draft = self.drafter.propose(self.ids, gamma, self.settings.sampling, self.gen)
            if draft.asked is not None:  # the drafter chose the length itself (a copy cut by expected gain)
                asked = draft.asked
        draft_ms = clock.lap()
        p = self.score(draft)
        verify_ms = clock.lap()
        if opening:
            self.plain_prompt_ms = verify_ms
        verdict = verify(draft.tokens, draft.probs, p, self.gen, mode=self.settings.verify)
        rule_ms = clock.lap()
        committed, self.stop_reason = cut_at_stop(verdict.tokens, self.pair.eos_token_ids, left)
        self.ids += committed
        self.target.sync(self.ids)  # roll back: the target keeps the committed text only
        self.drafter.feedback(self.ids, verdict.n_accepted, len(draft.tokens))  # ... and so does the draft
        cache_ms = clock.lap()
        rnd = round_event(len(self.rounds), len(self.generated_ids) - len(committed), asked, draft.tokens,
                          draft.probs, draft.note, p, verdict, committed, self.stop_reason, draft_ms, verify_ms,
                          self.tok, self.top_k, self.settings.verify)
        rnd.rule_ms, rnd.cache_ms, rnd.display_ms = rule_ms, cache_ms, clock.lap()
        self.policy.observe(rnd)
        self.totals.observe(rnd)
        rnd.round_ms = clock.total()
        observe = getattr(self.drafter, "observe", None)
        if observe is not None:  # a drafter that learns from timings (drafters/gain.py)
            observe(rnd)
        self.totals.elapsed_ms = (clock.start - self._started) * 1e3 + rnd.round_ms - sum(self.plain_step_ms)
        rnd.totals = replace(self.totals)
        self.rounds.append(rnd)
        return rnd

    def _plain_step_due(self) -> bool:
        if len(self.rounds) <= PLAIN_PROBE_SKIP:
            return False
        spent = sum(self.plain_step_ms)
        return len(self.plain_step_ms) < PLAIN_PROBE_MIN or spent < PLAIN_PROBE_SHARE * self.totals.elapsed_ms

    @torch.inference_mode()
    def time_plain_step(self) -> float:
        """Time one plain decoding step here and now: the target fed the last committed token at the current context
        (the cache holds every committed token but that one), its logits computed as plain decoding computes them;
        then the token is dropped from the cache again, so the run goes on exactly as it would have. Returns ms."""
        clock = Stopwatch(self.pair.device)
        self.target.logits_after(self.ids, (), 1)
        ms = clock.lap()
        self.target.sync(self.ids)
        self.plain_step_ms.append(ms)
        return ms

    def score(self, draft: Draft) -> Probs:
        """p [g+1, V]: the target's warped distributions after the committed text and after each of the g guesses,
        from one forward pass (it also feeds any committed tokens the cache lacks)."""
        g = len(draft.tokens)
        return distribution(self.target.logits_after(self.ids, draft.tokens.tolist(), g + 1), self.settings.sampling)

    @property
    def plain_ms_per_token(self) -> float | None:
        """The median plain step timed beside this run (None before the first; of an even count, the mean of the
        middle two, so two steps do not stand for their slower one)."""
        return statistics.median(self.plain_step_ms) if self.plain_step_ms else None

    def record(self, costs: StepCosts | None = None, label: str = "") -> RunRecord:
        """The run so far as one typed RunRecord (what traces, the playground and the Learn tab consume)."""
        return RunRecord(self.prompt, list(self.prompt_ids), self.settings, self.pair.info(), list(self.rounds),
                         self.text, self.stop_reason, costs, self.plain_ms_per_token, len(self.plain_step_ms),
                         self.plain_prompt_ms if self.plain_step_ms else None, label=label)


def rerun(record: RunRecord, pair: ModelPair) -> SpeculativeDecoder:
    """Decode the recorded run again with its recorded gammas (what each round asked the drafter for); on the same
    pair, dtype and device this gives the same text for every gamma policy (the timing-driven 'expected' one too)."""
    dec = SpeculativeDecoder(pair, record.prompt, record.settings, gamma_schedule=record.gamma_schedule)
    for _ in dec:
        pass
    return dec
