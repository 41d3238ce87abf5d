"""Regression tests for the second audit's defects, one block per defect:

b. `sampling.argmax` on bf16/fp16 agrees with torch.argmax on rows holding NaN (NaN is the maximum, first index);
d. the cross drafter's proposal ends after the first target EOS in its re-tokenized text;
e. a whitespace-only prediction is accepted, tokenizes and drafts (only the empty string is refused);
h. the browser fixture picks Debian's Chromium, else Playwright's own, else skips -- and fails under CI.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specdec.core.errors import InvalidInputError
from specdec.core.sampling import SamplingConfig, argmax, dense
from specdec.core.settings import DecodeSettings, encode_prompt

# --------------------------------------------------------------------------------- b. argmax with NaN (bf16/fp16)

# Raw NaN patterns: positive and negative sign, quiet and signalling-style payloads, the lowest and highest ones.
NAN_BITS = {torch.bfloat16: [0x7FC0, 0x7F81, 0x7FFF, 0xFFC0, 0xFF81, 0xFFFF],
            torch.float16: [0x7E00, 0x7C01, 0x7FFF, 0xFE00, 0xFC01, 0xFFFF]}


def _signed16(u: int) -> int:
    return u - 0x10000 if u >= 0x8000 else u


def _plant_nan(row: torch.Tensor, col: int, pattern: int) -> None:
    row.view(torch.int16)[col] = _signed16(pattern)


def _any_nan(dtype, g: torch.Generator) -> int:
    return NAN_BITS[dtype][int(torch.randint(len(NAN_BITS[dtype]), (1,), generator=g))]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_argmax_treats_nan_as_the_maximum_like_torch(dtype):
    g = torch.Generator().manual_seed(11)
    rows, width = 600, 64
    x = (torch.randn(rows, width, generator=g) * 4).to(dtype)
    kinds = []
    for r in range(rows):
        kind = r % 10
        kinds.append(kind)
        cols = torch.randperm(width, generator=g).tolist()
        if kind == 0:  # one NaN, any sign
            _plant_nan(x[r], cols[0], _any_nan(dtype, g))
        elif kind == 1:  # several NaNs of different signs/payloads: the first one wins
            for c in cols[:4]:
                _plant_nan(x[r], c, _any_nan(dtype, g))
        elif kind == 2:  # NaN next to +inf (NaN still wins) and -inf
            x[r, cols[0]], x[r, cols[1]] = float("inf"), float("-inf")
            _plant_nan(x[r], cols[2], _any_nan(dtype, g))
        elif kind == 3:  # NaN in an all-negative row
            x[r] = -x[r].abs() - 1
            _plant_nan(x[r], cols[0], _any_nan(dtype, g))
        elif kind == 4:  # negative NaN only (torch's own bf16 NaN), larger positive values about
            _plant_nan(x[r], cols[0], 0xFFFF)
            _plant_nan(x[r], cols[1], 0xFFC0)
        elif kind == 5:  # ties of the top value, no NaN
            x[r, cols[:3]] = 8.0
        elif kind == 6:  # +inf ties, no NaN
            x[r, cols[:2]] = float("inf")
        elif kind == 7:  # -0 and +0 only: equal values, the first wins
            x[r] = 0.0
            x[r, cols[:5]] = -0.0
        elif kind == 8:  # all -inf
            x[r] = float("-inf")
        # kind 9: a plain random row
    want = x.argmax(-1)
    got = argmax(x)
    bad = [(r, kinds[r], int(got[r]), int(want[r])) for r in range(rows) if got[r] != want[r]]
    assert not bad, f"{len(bad)} rows disagree with torch.argmax (row, kind, ours, torch): {bad[:8]}"
    for r in range(0, rows, 7):  # one row at a time (a 1-D input) gives the same answers
        assert int(argmax(x[r])) == int(want[r]), (r, kinds[r])


def test_argmax_float32_rows_with_nan_agree_with_torch():
    x = torch.randn(4, 50)
    x[0, 7] = float("nan")
    x[1, [3, 9]] = float("nan")
    x[2, 5], x[2, 6] = float("inf"), float("nan")
    x[3, 1] = -float("nan")
    for t in (x, x.double()):
        assert torch.equal(argmax(t), t.argmax(-1))


# --------------------------------------------------------------------------- d. cross drafter stops at target EOS


class _ScriptedLM:
    """Stands in for the draft's CachedLM: its logits put the next scripted draft token on top, one per call."""

    def __init__(self, script: list[int], vocab: int):
        self.script, self.vocab, self.i = script, vocab, 0
        self.device = torch.device("cpu")

    def _next(self) -> torch.Tensor:
        row = torch.zeros(1, self.vocab)
        row[0, self.script[min(self.i, len(self.script) - 1)]] = 10.0
        self.i += 1
        return row

    def logits_after(self, committed, extra=(), n_logits=1, all_columns=True):
        self.i = 0
        return self._next()

    def feed(self, ids, n_logits=1, all_columns=True):
        return self._next()


def test_cross_drafter_proposal_ends_at_the_target_eos(tiny_pair):
    from specdec.drafters import make_drafter
    from specdec.drafters.cross import CrossTokenizerDrafter
    from specdec.models.cross import tiny_cross_draft

    draft = tiny_cross_draft(tiny_pair)
    dtok, ttok = draft.tokenizer, tiny_pair.tokenizer
    # The draft writes "ab<|im_end|>cd" in single characters: none of them is the draft's EOS, but the target
    # re-tokenizes the text with its end-of-text token in the middle.
    script = [dtok.convert_tokens_to_ids(c) for c in "ab<|im_end|>cd"]
    assert not set(script) & draft.eos_ids
    eos = tiny_pair.eos_token_ids[0]
    assert ttok("ab<|im_end|>cd", add_special_tokens=False)["input_ids"].count(eos) == 1
    prompt_ids = encode_prompt(ttok, "the cat")
    def built():  # as the app builds it
        return make_drafter(tiny_pair, DecodeSettings(drafter="cross"), prompt_ids, cross_draft=draft)

    def direct():  # given the target's stop ids explicitly
        return CrossTokenizerDrafter(ttok, draft, tiny_pair.vocab_size, prompt_ids,
                                     eos_token_ids=tiny_pair.eos_token_ids)

    for make in (built, direct):
        d = make()
        assert isinstance(d, CrossTokenizerDrafter)
        d.lm = _ScriptedLM(script, draft.vocab_size)
        out = d.propose(prompt_ids, len(script), SamplingConfig(), None)
        toks = out.tokens.tolist()
        assert toks == ttok("ab", add_special_tokens=False)["input_ids"] + [eos], (
            f"the proposal goes on past the target EOS: {ttok.convert_ids_to_tokens(toks)}")
        assert torch.equal(dense(out.probs), torch.nn.functional.one_hot(out.tokens, tiny_pair.vocab_size).float())
    # A pair with its EOS switched off (no stop ids) keeps the whole proposal, as the other drafters do.
    no_stop = CrossTokenizerDrafter(ttok, draft, tiny_pair.vocab_size, prompt_ids, eos_token_ids=())
    no_stop.lm = _ScriptedLM(script, draft.vocab_size)
    assert no_stop.propose(prompt_ids, len(script), SamplingConfig(), None).tokens.tolist() == \
        ttok("ab<|im_end|>cd", add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------------------ e. whitespace-only predictions


WHITESPACE = ["    ", "\n", " \n\t  \n"]


@pytest.mark.parametrize("text", WHITESPACE)
def test_whitespace_prediction_is_accepted_and_drafts(tiny_pair, text):
    from specdec.drafters import make_drafter
    from specdec.drafters.predicted import tokenize_prediction
    from specdec.loop.decoder import SpeculativeDecoder

    s = DecodeSettings(drafter="predicted", prediction=text, max_new_tokens=6).validate()
    ids = tokenize_prediction(tiny_pair.tokenizer, text)
    assert ids and tiny_pair.tokenizer.decode(ids) == text
    pair = dataclasses.replace(tiny_pair, eos_token_ids=())
    d = make_drafter(pair, s, encode_prompt(pair.tokenizer, "def f():"))
    out = d.propose(encode_prompt(pair.tokenizer, "def f():"), 4, SamplingConfig(), None)
    assert out.tokens.tolist() == ids[:4] and out.note.source_start == 0
    rnd = SpeculativeDecoder(pair, "def f():", s).step()  # a round drafts from the whitespace prediction
    assert rnd.gamma > 0


def test_whitespace_prediction_passes_the_playground_controls():
    from ui.controls import Controls

    c = Controls(prompt="def f():", chat=False, gamma=4, max_new_tokens=8, temperature=0, top_k=0, top_p=1,
                 seed=0, pair="default", target="", draft="", drafter="predicted", prediction="    ")
    assert c.settings().prediction == "    "
    with pytest.raises(InvalidInputError, match="needs a prediction"):
        dataclasses.replace(c, prediction="").settings()
    with pytest.raises(InvalidInputError, match="needs a prediction"):
        dataclasses.replace(c, prediction=None).settings()


def test_empty_prediction_is_still_refused_clearly(tiny_pair):
    from specdec.drafters.predicted import tokenize_prediction

    with pytest.raises(InvalidInputError, match="the 'predicted' drafter needs a prediction"):
        DecodeSettings(drafter="predicted", prediction="").validate()
    with pytest.raises(InvalidInputError, match="the 'predicted' drafter needs a prediction"):
        tokenize_prediction(tiny_pair.tokenizer, "")


# ------------------------------------------------------------------------------- h. which Chromium the tests use

DEBIAN = "/usr/bin/chromium"
BUNDLED = "/root/.cache/ms-playwright/chromium-9999/chrome-linux64/chrome"


def _pick(env: dict, present: set[str], bundled: str | None = BUNDLED) -> str:
    from tests.conftest import chromium_executable

    return chromium_executable(env, lambda p: p in present, bundled)


def test_browser_fixture_selects_debian_then_playwright_then_skips_or_fails_under_ci():
    # Debian's Chromium wins when present, even with Playwright's own installed.
    assert _pick({}, {DEBIAN, BUNDLED}) == DEBIAN
    assert _pick({}, {DEBIAN}) == DEBIAN
    # Without it, Playwright's own Chromium.
    assert _pick({}, {BUNDLED}) == BUNDLED
    assert _pick({"CI": "true"}, {BUNDLED}) == BUNDLED
    # SPECDEC_CHROMIUM replaces the Debian path (and a missing one falls through the same way).
    assert _pick({"SPECDEC_CHROMIUM": "/opt/chrome"}, {"/opt/chrome", DEBIAN}) == "/opt/chrome"
    assert _pick({"SPECDEC_CHROMIUM": "/nowhere"}, {DEBIAN, BUNDLED}) == BUNDLED
    # Neither: a skip that names both ways to get a browser...
    for env, bundled in (({}, BUNDLED), ({}, None), ({"CI": "false"}, BUNDLED), ({"CI": ""}, None)):
        with pytest.raises(pytest.skip.Exception) as skipped:
            _pick(env, set(), bundled)
        msg = str(skipped.value)
        assert "apt-get install" in msg and "chromium" in msg and "python -m playwright install chromium" in msg, msg
    # ...except under CI, where a missing browser fails the run.
    for ci in ("true", "TRUE", "1", "yes"):
        with pytest.raises(pytest.fail.Exception) as failed:
            _pick({"CI": ci}, set())
        msg = str(failed.value)
        assert "apt-get install" in msg and "python -m playwright install chromium" in msg and "CI" in msg, msg
