"""Rerunning a record reproduces its text: the gammas a run asked for are recorded, so a timing-driven gamma policy
and a cross draft whose guesses merge into fewer target tokens both replay exactly."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from specdec.core import clock as clock_mod
from specdec.core.sampling import SamplingConfig
from specdec.core.settings import DecodeSettings
from specdec.drafters.cross import CrossTokenizerDrafter
from specdec.loop.decoder import SpeculativeDecoder, rerun
from specdec.models.cross import CrossDraft, tiny_cross_draft


# gamma_policy="expected" follows wall-clock timings, so one seed could give different texts.
def test_expected_policy_reruns_from_its_record(tiny_pair, monkeypatch):
    s = DecodeSettings(gamma=4, max_new_tokens=40, sampling=SamplingConfig(1.0), seed=1, gamma_policy="expected")

    def run_with_clock(draft_s: float, verify_s: float) -> SpeculativeDecoder:
        # step() reads the clock four times a round: start, after drafting, after verifying, at the end.
        steps = itertools.cycle([0.001, draft_s, verify_s, 0.001])
        now = itertools.accumulate(steps)
        monkeypatch.setattr(clock_mod.time, "perf_counter", lambda: next(now))
        dec = SpeculativeDecoder(tiny_pair, "hello", s)
        list(dec)
        return dec

    fast, slow = run_with_clock(0.001, 0.1), run_with_clock(0.1, 0.1)  # a cheap draft, then a costly one
    monkeypatch.undo()
    assert not s.seed_reproducible
    assert [r.gamma for r in fast.rounds] != [r.gamma for r in slow.rounds]  # same seed, timing-driven gammas
    for dec in (fast, slow):
        record = dec.record()
        again = rerun(record, tiny_pair)  # real clock now: only the recorded gammas can reproduce the text
        assert again.generated_ids == dec.generated_ids
        assert [r.asked for r in again.rounds] == record.gamma_schedule  # what each round asked the drafter for


# --------------------------------------------------------------------------- a rerun asks for the gamma that was asked


@pytest.fixture(scope="module")
def merging_pair(tiny_pair):
    """A target whose tokenizer merges characters ("th", " t", "return", ...): the tiny cross draft's BPE model,
    with a character-level cross draft (the tiny draft and its tokenizer). A few drafted characters then
    re-tokenize into fewer target tokens than the gamma asked for."""
    bpe = tiny_cross_draft(tiny_pair)
    tok = bpe.tokenizer
    pair = dataclasses.replace(tiny_pair, target=bpe.model, draft=bpe.model, tokenizer=tok, name="merging",
                               target_id="test:merging", draft_id="test:merging", vocab_size=len(tok),
                               eos_token_ids=(tok.eos_token_id,))
    return pair, CrossDraft(tiny_pair.draft, tiny_pair.tokenizer, "character draft")


def test_rerun_reproduces_a_run_whose_drafts_merged(merging_pair, monkeypatch):
    pair, chars = merging_pair
    import specdec.models.cross as cross_mod

    monkeypatch.setattr(cross_mod, "load_cross_draft", lambda _pair: chars)
    s = DecodeSettings(gamma=6, max_new_tokens=40, drafter="cross", sampling=SamplingConfig(temperature=1.0), seed=0)
    dec = SpeculativeDecoder(pair, "the theme then", s)
    assert isinstance(dec.drafter, CrossTokenizerDrafter)
    list(dec)
    record = dec.record()
    merged = [r for r in record.rounds if 0 < r.gamma < r.asked]
    assert merged, "the test needs rounds whose characters merged into fewer target tokens"
    again = rerun(record, pair)
    assert again.generated_ids == dec.generated_ids
    assert [r.asked for r in again.rounds] == record.gamma_schedule
