"""The plain loop: one model alone, one token per forward pass, with the same warps, caching, seed handling and
stop rule as the speculative loop -- the baseline every speedup is measured against (and the race's plain lane).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.core.clock import Stopwatch
from specdec.core.static_cache import open_lm
from specdec.core.metrics import StepCosts
from specdec.core.sampling import draw, make_generator
from specdec.core.settings import DecodeSettings, encode_prompt
from specdec.core.stop import StopReason, cut_at_stop
from specdec.drafters import resolve_draft_vocab
from specdec.models.pair import ModelPair


class PlainDecoder:
    """One model decoding alone: `step()` appends one token. `model="draft"` runs the draft as the drafter runs
    it, reduced head included."""

    def __init__(self, pair: ModelPair, prompt_ids: list[int], settings: DecodeSettings, model: str = "target"):
        self.pair = pair
        self.settings = settings
        budget = len(prompt_ids) + settings.max_new_tokens
        if model == "target":
            self.lm = open_lm(pair.target, pair.vocab_size, engine=pair.engine, max_len=budget)
        else:
            self.lm = open_lm(pair.draft, pair.vocab_size, resolve_draft_vocab(pair, settings.draft_vocab),
                              pair.eos_token_ids, engine=pair.engine, max_len=budget)
            self.lm.keep_in_head(prompt_ids)
        self.gen = make_generator(pair.device, settings.seed)
        self.prompt_len = len(prompt_ids)
        self.ids = list(prompt_ids)
        self.stop_reason: StopReason | None = None

    @property
    def generated_ids(self) -> list[int]:
        return self.ids[self.prompt_len :]

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    @torch.inference_mode()
    def step(self) -> list[int]:
        lm = self.lm
        logits = lm.logits_after(self.ids, all_columns=False)[-1]
        tok = int(draw(logits, self.settings.sampling, self.gen, lm.columns, lm.vocab_size)[0])
        left = self.settings.max_new_tokens - len(self.generated_ids)
        new, self.stop_reason = cut_at_stop([tok], self.pair.eos_token_ids, left)
        self.ids += new
        return new


@dataclass
class BaselineResult:
    ids: list[int]
    text: str
    token_ms: list[float]  # wall time of each decoding step (the first one includes the prompt)

    @property
    def tok_s(self) -> float:
        total = sum(self.token_ms)
        return 1e3 * len(self.token_ms) / total if total else 0.0

    @property
    def ms_per_token(self) -> float:
        return sum(self.token_ms) / len(self.token_ms) if self.token_ms else 0.0


def plain_decode(pair: ModelPair, prompt, settings: DecodeSettings = DecodeSettings(), model: str = "target") -> BaselineResult:
    """Target-only (or draft-only) decoding to the end, timed per token (the first step also runs the prompt, as
    generate() does)."""
    s = settings.validate()
    dec = PlainDecoder(pair, encode_prompt(pair.tokenizer, prompt, s.chat), s, model)
    clock, times = Stopwatch(pair.device), []
    while not dec.done:
        dec.step()
        times.append(clock.lap())
    out = dec.generated_ids
    return BaselineResult(out, pair.tokenizer.decode(out, skip_special_tokens=True), times)


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0.0


def measure_step_costs(pair: ModelPair, n_tokens: int = 8, prompt: str = "The quick brown fox",
                       draft_vocab: int | None = None) -> StepCosts:
    """Time plain greedy decoding of n_tokens with the target and with the draft (first step dropped: it runs
    the prompt and pays one-time costs)."""
    s = DecodeSettings(max_new_tokens=n_tokens + 1, draft_vocab=draft_vocab)
    t = plain_decode(pair, prompt, s, model="target").token_ms[1:]
    d = plain_decode(pair, prompt, s, model="draft").token_ms[1:]
    return StepCosts(median(t), median(d))
