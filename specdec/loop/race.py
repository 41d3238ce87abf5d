"""The race: plain target decoding and one or more speculative lanes on the same prompt, settings and seed,
interleaved step by step in one process.

Each turn every unfinished lane advances once (the plain lane by one token, a speculative lane by one round), so
all lanes see the same machine load as it drifts; no two lanes ever run at the same moment. Each lane's time is
the sum of its own steps, and its speedup is against the plain lane OF THIS RACE: the plain lane's time for the
same number of tokens over the lane's time (estimated from the plain lane's rate so far while it is behind).

At temperature 0 every lane's text is the plain lane's text (greedy is deterministic and every drafter is exact).
At T > 0 each lane is an exact sample from the target at these settings, but the lanes consume their seeded random
stream differently (draft samples, acceptance draws, repairs), so the same seed gives different texts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Iterator

from specdec.core.clock import Stopwatch
from specdec.core.errors import InvalidInputError
from specdec.core.events import KEPT, DraftNote, Round
from specdec.core.metrics import StepCosts, alpha_estimate
from specdec.core.settings import (DRAFTER_LABELS, DRAFTERS, GAMMA_POLICIES, MAX_GAMMA, VERIFY_MODES, DecodeSettings,
                                   encode_prompt)
from specdec.core.stop import StopReason
from specdec.drafters import make_drafter
from specdec.loop.decoder import SpeculativeDecoder
from specdec.loop.plain import BaselineResult, PlainDecoder
from specdec.loop.tree import TreeDecoder
from specdec.loop.tree_display import TreeRun

PLAIN = "plain"
MAX_LANES = 6  # speculative lanes per race (plus the plain one)


@dataclass(frozen=True)
class LaneSpec:
    drafter: str = "model"  # one of DRAFTERS, or PLAIN
    gamma: int = 4
    gamma_policy: str = "fixed"
    verify: str = "pq"  # one of VERIFY_MODES
    tree: tuple[int, ...] = ()  # children per node at each depth: a token-tree lane (loop.tree); (): a chain

    @property
    def label(self) -> str:
        if self.drafter == PLAIN:
            return "plain target"
        if self.tree:
            how = "tree " + ",".join(map(str, self.tree))
        elif self.gamma_policy == "fixed":
            how = f"γ={self.gamma}"
        else:
            how = f"γ {self.gamma_policy} (from {self.gamma})"
        rule = "" if self.verify == "pq" else f" · {self.verify}"
        return f"{DRAFTER_LABELS.get(self.drafter, self.drafter)} · {how}{rule}"


_LANE_RE = re.compile(r"^\s*([a-z-]+)\s*((?::\s*[a-z0-9]+\s*){0,3})$")


def parse_lanes(text: str) -> list[LaneSpec]:
    """'model:4, ngram:8, ngram:expected, cross:4:confidence, model:4:strict, model:tree321' -> LaneSpecs: drafter,
    then a gamma, a gamma policy ("auto" = expected) and a verification mode, in any order; or, for the draft model
    and the copying drafters, `tree` + one digit per depth (children per node) for a token-tree lane. The plain
    lane is always added by the race itself."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInputError("name at least one speculative lane, e.g. 'model:4, ngram:8'")
    lanes = []
    for part in text.split(","):
        m = _LANE_RE.match(part.lower())
        usage = (f"lane {part.strip()[:40]!r}: write drafter[:gamma][:policy][:verification], each at most once, "
                 f"with a drafter from {', '.join(DRAFTERS)}, e.g. 'ngram:8', 'model:expected' or 'model:4:strict'; "
                 f"or drafter:treeWIDTHS[:verification] for a token tree, e.g. 'model:tree321'")
        if not m or m.group(1) not in DRAFTERS:
            raise InvalidInputError(usage)
        gamma, policy, rule, tree = 4, "fixed", "pq", ()
        opts = [o.strip() for o in m.group(2).split(":") if o.strip()]
        kinds = ["gamma" if o.isdigit() else "rule" if o in VERIFY_MODES else "tree" if o.startswith("tree")
                 else "policy" for o in opts]
        if len(set(kinds)) < len(kinds) or ("tree" in kinds and {"gamma", "policy"} & set(kinds)):
            raise InvalidInputError(usage)
        for opt in opts:
            if opt.startswith("tree"):
                tree = _tree_widths(opt, part, m.group(1))
            elif opt.isdigit():
                gamma = int(opt)
            elif opt in GAMMA_POLICIES or opt == "auto":
                policy = "expected" if opt == "auto" else opt
            elif opt in VERIFY_MODES:
                rule = opt
            else:
                raise InvalidInputError(f"lane {part.strip()[:40]!r}: {opt!r} is neither a gamma (1-{MAX_GAMMA}), a "
                                        f"gamma policy ({', '.join(GAMMA_POLICIES)}) nor a verification mode "
                                        f"({', '.join(VERIFY_MODES)})")
        lanes.append(LaneSpec(m.group(1), gamma, policy, rule, tree))
    if len(lanes) > MAX_LANES:
        raise InvalidInputError(f"at most {MAX_LANES} speculative lanes per race, got {len(lanes)}")
    return lanes


def _tree_widths(opt: str, part: str, drafter: str) -> tuple[int, ...]:
    """'tree321' -> (3, 2, 1), checked as the tree loop checks a drafter and a shape (drafters.tree)."""
    from specdec.drafters.tree import check_tree_drafter, check_widths

    digits = opt[len("tree"):]
    if not digits.isdigit():
        raise InvalidInputError(f"lane {part.strip()[:40]!r}: write a tree as 'tree' and one digit per depth, the "
                                "children per node, e.g. tree321")
    try:
        check_tree_drafter(drafter)
    except InvalidInputError as exc:
        raise InvalidInputError(f"lane {part.strip()[:40]!r}: {exc}") from None
    return tuple(check_widths([int(d) for d in digits], "top-k"))


@dataclass
class Lane:
    """One lane's progress. `origins` says per committed token who wrote it: "guess" (a kept draft token) or
    "target" (a repair, a bonus, or a plain step)."""

    index: int
    spec: LaneSpec
    ids: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    cum_ms: list[float] = field(default_factory=list)  # lane time when each committed token arrived
    elapsed_ms: float = 0.0
    target_passes: int = 0
    steps: int = 0
    stop_reason: StopReason | None = None
    rounds: list[Round] = field(default_factory=list)
    last_note: DraftNote | None = None  # the most recent round's note that carried a proposal
    last_round: Round | None = None

    @property
    def plain(self) -> bool:
        return self.spec.drafter == PLAIN

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    @property
    def tokens(self) -> int:
        return len(self.ids)

    @property
    def tok_s(self) -> float:
        return 1e3 * self.tokens / self.elapsed_ms if self.elapsed_ms else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / self.target_passes if self.target_passes else 0.0

    @property
    def alpha(self) -> float | None:
        if self.plain:
            return None
        return alpha_estimate(sum(r.kept for r in self.rounds), sum(r.tested for r in self.rounds))


@dataclass
class RaceUpdate:
    lane: int
    label: str
    new_ids: list[int]
    new_text: str
    tokens: int
    elapsed_ms: float
    tok_s: float
    tokens_per_pass: float
    speedup: float | None
    done: bool
    round: Round | None = None  # the round a speculative lane just ran


@dataclass
class RaceView:
    """Everything a renderer needs after a step (components/race.py): plain data, no models."""

    prompt_pieces: list[str]
    lanes: list[Lane]
    speedups: list[float | None]
    estimated: list[bool]  # speedup estimated from the plain lane's rate (it has fewer tokens yet)
    note: str
    done: bool
    max_new_tokens: int


class Race:
    """Plain lane 0 plus one lane per LaneSpec; `step()` advances the next unfinished lane, `for u in race` runs all."""

    def __init__(self, pair, prompt, settings: DecodeSettings, lanes: list[LaneSpec], costs: StepCosts | None = None,
                 cross_draft=None):
        self.settings = settings.validate()
        if not lanes:
            raise InvalidInputError("a race needs at least one speculative lane besides the plain one")
        if len(lanes) > MAX_LANES:
            raise InvalidInputError(f"at most {MAX_LANES} speculative lanes per race, got {len(lanes)}")
        self.pair = pair
        self.prompt = prompt
        self.costs = costs
        self.prompt_ids = encode_prompt(pair.tokenizer, prompt, settings.chat)
        self.lanes = [Lane(0, LaneSpec(PLAIN))]
        self._runners: list = [PlainDecoder(pair, self.prompt_ids, self.settings)]
        for spec in lanes:
            if spec.drafter == PLAIN:
                raise InvalidInputError("the plain lane is always in the race; list only speculative lanes")
            s = replace(self.settings, drafter=spec.drafter, gamma=spec.gamma, gamma_policy=spec.gamma_policy,
                        verify=spec.verify)
            try:
                drafter = None
                if spec.tree:  # a token-tree lane: TreeRun steps like a decoder and yields chain-view Rounds
                    dec = TreeRun(TreeDecoder(pair, prompt, s, spec.tree, "top-k"))
                else:
                    if spec.drafter == "cross" and cross_draft is not None:
                        drafter = make_drafter(pair, s.validate(), self.prompt_ids, cross_draft=cross_draft)
                    dec = SpeculativeDecoder(pair, prompt, s, drafter=drafter)
            except InvalidInputError as exc:
                raise InvalidInputError(f"lane '{spec.label}': {exc}") from exc
            self.lanes.append(Lane(len(self.lanes), spec))
            self._runners.append(dec)
        self._turn = 0

    # -- running ---------------------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return all(lane.done for lane in self.lanes)

    def __iter__(self) -> Iterator[RaceUpdate]:
        while not self.done:
            yield self.step()

    def step(self) -> RaceUpdate:
        """Advance the next unfinished lane in turn by one step (round-robin over the lanes)."""
        if self.done:
            raise InvalidInputError("the race has finished; start a new one")
        while self.lanes[self._turn % len(self.lanes)].done:
            self._turn += 1
        lane = self.lanes[self._turn % len(self.lanes)]
        self._turn += 1
        runner = self._runners[lane.index]
        clock = Stopwatch(self.pair.device)
        if lane.plain:
            new, rnd = runner.step(), None
            origins = ["target"]
        else:
            rnd = runner.step()
            new = list(rnd.committed_ids)
            origins = ["guess" if f == KEPT else "target" for f in rnd.fates[: len(new)]]
            origins += ["target"] * (len(new) - len(origins))  # the repair or bonus token
        lane.elapsed_ms += clock.lap()
        lane.steps += 1
        lane.target_passes += 1
        lane.ids += new
        lane.pieces += self.pair.tokenizer.batch_decode([[t] for t in new])
        lane.origins += origins
        lane.cum_ms += [lane.elapsed_ms] * len(new)
        lane.stop_reason = runner.stop_reason
        if rnd is not None:
            lane.rounds.append(rnd)
            lane.last_round = rnd
            if rnd.gamma > 0 or lane.last_note is None:
                lane.last_note = rnd.note
        return RaceUpdate(lane.index, lane.spec.label, new, self.pair.tokenizer.decode(new, skip_special_tokens=True),
                          lane.tokens, lane.elapsed_ms, lane.tok_s, lane.tokens_per_pass, self.speedup(lane.index),
                          lane.done, rnd)

    # -- results ---------------------------------------------------------------------------------------------
    def plain_ms_for(self, n: int) -> tuple[float, bool] | None:
        """The plain lane's time for n tokens, and whether it is an estimate (the plain lane has fewer tokens yet,
        or stopped earlier at EOS: its rate so far times n)."""
        plain = self.lanes[0]
        if n <= 0 or not plain.cum_ms:
            return None
        if n <= len(plain.cum_ms):
            return plain.cum_ms[n - 1], False
        return plain.elapsed_ms / plain.tokens * n, True

    def speedup(self, index: int) -> float | None:
        lane = self.lanes[index]
        if lane.plain:
            return 1.0 if lane.tokens else None
        base = self.plain_ms_for(lane.tokens)
        return base[0] / lane.elapsed_ms if base and lane.elapsed_ms else None

    def text(self, index: int) -> str:
        return self.pair.tokenizer.decode(self.lanes[index].ids, skip_special_tokens=True)

    @property
    def texts_identical(self) -> bool:
        return len({tuple(lane.ids) for lane in self.lanes}) == 1

    @property
    def note(self) -> str:
        if self.settings.sampling.greedy:
            if not self.done or self.texts_identical:
                return ("Temperature 0: every lane writes the plain lane's text token for token — speculative "
                        "decoding changes the speed, not the output.")
            return ("Temperature 0, yet the texts differ: on this device and dtype, scoring several tokens in one "
                    "pass rounds differently from one at a time, and an exact tie or near-tie can flip the argmax "
                    "(in bf16 on a CPU, 4 of 9 48-token runs of the embedded pair drifted from plain greedy, the "
                    "first time at token 18 or later; fp32 on a CPU is bit-exact).")
        return ("Temperature > 0: each lane is an exact sample from the target at these settings. The texts differ "
                "because each lane spends its seeded random numbers differently (draft samples, acceptance draws, "
                "repairs), so the same seed gives different, equally valid samples.")

    def view(self) -> RaceView:
        if not hasattr(self, "_prompt_pieces"):
            self._prompt_pieces = self.pair.tokenizer.batch_decode([[t] for t in self.prompt_ids])
        estimated = []
        for lane in self.lanes:
            base = self.plain_ms_for(lane.tokens)
            estimated.append(bool(base and base[1]) and not lane.plain)
        return RaceView(self._prompt_pieces, self.lanes, [self.speedup(i) for i in range(len(self.lanes))], estimated,
                        self.note, self.done, self.settings.max_new_tokens)

    def plain_result(self) -> BaselineResult:
        lane = self.lanes[0]
        steps = [b - a for a, b in zip([0.0] + lane.cum_ms[:-1], lane.cum_ms)]
        return BaselineResult(list(lane.ids), self.text(0), steps)

    def records(self) -> list:
        """Each speculative lane as a RunRecord whose baseline is the plain lane of this race (same token count)."""
        out = []
        for lane, runner in zip(self.lanes[1:], self._runners[1:]):
            rec = runner.record(self.costs, label=lane.spec.label)
            base = self.plain_ms_for(lane.tokens)
            rec.baseline_ms_per_token = base[0] / lane.tokens if base else None
            out.append(rec)
        return out

    def summary(self) -> dict:
        """JSON-ready results (what the /race endpoint returns)."""
        lanes = []
        for lane in self.lanes:
            base = self.plain_ms_for(lane.tokens)
            lanes.append({
                "lane": lane.index, "label": lane.spec.label, "drafter": lane.spec.drafter, "gamma": lane.spec.gamma,
                "gamma_policy": lane.spec.gamma_policy, "verify": lane.spec.verify, "tree": list(lane.spec.tree),
                "text": self.text(lane.index), "tokens": lane.tokens,
                "target_passes": lane.target_passes, "elapsed_ms": round(lane.elapsed_ms, 2),
                "tok_s": round(lane.tok_s, 3), "tokens_per_pass": round(lane.tokens_per_pass, 3),
                "speedup": None if self.speedup(lane.index) is None else round(self.speedup(lane.index), 3),
                "speedup_estimated": bool(base and base[1]) and not lane.plain,
                "alpha": None if lane.alpha is None else round(lane.alpha, 4), "stop_reason": lane.stop_reason,
            })
        return {"done": self.done, "temperature": self.settings.sampling.temperature, "seed": self.settings.seed,
                "texts_identical": self.texts_identical, "note": self.note, "lanes": lanes}
