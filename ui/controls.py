"""The playground's controls: the input components that refuse what the API can send, and `Controls`, which turns
the values app.py passes into DecodeSettings and a PairRequest with a message for every bad value.

Number and Slider: from the browser these fields only ever hold numbers. Through the API (gradio_client, raw HTTP)
they can receive strings, booleans, NaN, infinities and 40-digit integers; Gradio's own preprocessing then fails
with a TypeError or ValueError, which reaches the caller only as "the app has raised an exception". These
subclasses check the payload first and answer with a gr.Error naming the field; valid numbers go on to Gradio's
own preprocessing unchanged. The class names stay Number and Slider, because Gradio picks the browser component
by class name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import gradio as gr

from specdec.drafters import check_combination
from specdec.drafters.tree import TREE_MODES, check_widths
from specdec.core.errors import InvalidInputError
from specdec.core.sampling import SamplingConfig
from specdec.core.settings import DRAFTER_LABELS, DRAFTERS, GAMMA_POLICIES, VERIFY_LABELS, VERIFY_MODES, DecodeSettings

from .loader import PairRequest, check_request

# Longest prompt accepted, in characters, checked before tokenizing: the decoder's own limit is 8192 tokens, and a
# megabyte of text would only be tokenized to be refused. 100k characters is over 10 characters per token.
MAX_PROMPT_CHARS = 100_000
# What the gamma-policy dropdown shows (values are DecodeSettings' names; drafters: settings.DRAFTER_LABELS).
DRAFTER_INFO = ("who proposes the guesses; n-gram, cross-tokenizer and predicted-output guesses have a one-hot q; "
                "predicted output drafts from the text you expect (the box under the prompt)")
POLICY_LABELS = {
    "fixed": "fixed γ",
    "heuristic": "heuristic (+2 / −1)",
    "confidence": "confidence",
    "expected": "expected speedup",
}
POLICY_INFO = "how γ changes per round; \"expected\" follows timings, so it is not seed-reproducible"
TREE_WIDTHS_DEFAULT = "3,2,1"
TREE_INFO = ("each round drafts a tree and the target checks every node in one pass; γ and the γ policy are then "
             "unused")
TREE_WIDTHS_INFO = "children per node at each depth, e.g. 3,2,1 (at most 64 nodes)"
TREE_MODE_INFO = "top-k: the likeliest ids (one-hot q); sampled: i.i.d. draws; distinct: draws without replacement"


def drafter_choices() -> list[tuple[str, str]]:
    return [(DRAFTER_LABELS.get(d, d), d) for d in DRAFTERS]


def policy_choices() -> list[tuple[str, str]]:
    return [(POLICY_LABELS.get(p, p), p) for p in GAMMA_POLICIES]


VERIFY_INFO = ("how the target checks the guesses; all three are exact (the round anatomy shows what the other two "
               "would have kept)")


def verify_choices() -> list[tuple[str, str]]:
    return [(VERIFY_LABELS.get(m, m), m) for m in VERIFY_MODES]


def tree_mode_choices() -> list[str]:
    return list(TREE_MODES)


# ------------------------------------------------------------------------------------------ components


def _field(component) -> str:
    return component.label or component.elem_id or "a number field"


def _shown(x) -> str:
    try:
        return f"{x:g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else repr(x)[:40]
    except OverflowError:  # an integer too large for a float
        return f"a {len(str(abs(x)))}-digit number"


def check_number(component, payload, minimum=None, maximum=None) -> None:
    """Raise gr.Error unless payload is None or a finite number within [minimum, maximum]."""
    if payload is None:
        return
    name = _field(component)
    if isinstance(payload, bool) or not isinstance(payload, (int, float)):
        raise gr.Error(f"{name} must be a number, got {_shown(payload)}", print_exception=False)
    if isinstance(payload, float) and not math.isfinite(payload):
        raise gr.Error(f"{name} must be a finite number, got {payload}", print_exception=False)
    if minimum is not None and payload < minimum:
        raise gr.Error(f"{name}: {_shown(payload)} is less than the minimum, {_shown(minimum)}",
                       print_exception=False)
    if maximum is not None and payload > maximum:
        raise gr.Error(f"{name}: {_shown(payload)} is more than the maximum, {_shown(maximum)}",
                       print_exception=False)


class Number(gr.Number):
    def preprocess(self, payload):
        check_number(self, payload, self.minimum, self.maximum)
        return super().preprocess(payload)


class Slider(gr.Slider):
    def preprocess(self, payload):
        if payload is None:
            raise gr.Error(f"{_field(self)} is empty; send a number", print_exception=False)
        check_number(self, payload, self.minimum, self.maximum)
        return super().preprocess(payload)


# ------------------------------------------------------------------------------------------ input values


@dataclass
class Controls:
    """The playground inputs, in the order app.py passes them (those after `draft` are optional for API callers)."""

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
    drafter: str = "model"
    gamma_policy: str = "fixed"
    prediction: str = ""  # the predicted drafter's expected output
    tree: bool = False  # draft a token tree each round (TreeDecoder) instead of a chain
    tree_widths: str = TREE_WIDTHS_DEFAULT  # children per node at each depth, "3,2,1"
    tree_mode: str = "top-k"
    verify: str = "pq"  # one of VERIFY_MODES

    def settings(self) -> DecodeSettings:
        """Checked settings, so bad input is refused before any model loads."""
        sampling = SamplingConfig(temperature=number(self.temperature, "temperature"),
                                  top_k=whole(self.top_k, "top-k"), top_p=number(self.top_p, "top-p"))
        settings = DecodeSettings(gamma=whole(self.gamma, "γ (draft length)"),
                              max_new_tokens=whole(self.max_new_tokens, "max new tokens"),
                              sampling=sampling, seed=whole(self.seed, "seed"), chat=bool(self.chat),
                              drafter=choice(self.drafter, "drafter", DRAFTERS),
                              gamma_policy=choice(self.gamma_policy, "γ policy", GAMMA_POLICIES),
                              prediction=self.prediction if self.prediction is not None else "",
                              verify=choice(self.verify, "verification", VERIFY_MODES)).validate()
        check_combination(settings)  # e.g. the ngram drafter has no confidence to stop on
        return settings

    def tree_shape(self) -> tuple[list[int], str] | None:
        """(widths, mode) when token trees are on, None when off; a clear message for a bad shape or mode."""
        if self.tree is None or self.tree is False:
            return None
        if self.tree is not True:
            raise InvalidInputError(f"the token-tree switch must be true or false, got {_short(self.tree)}")
        return parse_widths(self.tree_widths, choice(self.tree_mode, "tree mode", TREE_MODES))

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


def parse_widths(text, mode: str) -> tuple[list[int], str]:
    """"3,2,1" (commas or spaces) -> ([3, 2, 1], mode), checked by the engine's own rule (drafters.tree)."""
    if text is None or (isinstance(text, str) and not text.strip()):
        raise InvalidInputError("the tree widths are empty; enter children per depth, e.g. 3,2,1")
    if not isinstance(text, str):
        raise InvalidInputError(f"the tree widths must be text such as 3,2,1, got {_short(text)}")
    parts = [t for t in text.replace(",", " ").split() if t]
    widths = []
    for t in parts:
        if not (t.isascii() and t.isdigit()) or len(t) > 3:
            raise InvalidInputError(f"the tree widths must be whole numbers separated by commas, e.g. 3,2,1; "
                                    f"got {_short(text)}")
        widths.append(int(t))
    return check_widths(widths, mode), mode


def choice(x, name: str, allowed: tuple[str, ...]) -> str:
    if x is None or x == "":
        return allowed[0]
    if not isinstance(x, str) or x not in allowed:
        raise InvalidInputError(f"{name} must be one of {', '.join(allowed)}, got {_short(x)}")
    return x


def number(x, name: str) -> float:
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


def whole(x, name: str) -> int:
    v = number(x, name)
    if v != int(v):
        raise InvalidInputError(f"{name} must be a whole number, got {_short(x)}")
    return int(v)


def _short(x, limit: int = 40) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."
