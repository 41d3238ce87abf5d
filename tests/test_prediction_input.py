"""The predicted drafter's input: a whitespace-only prediction is accepted, tokenizes and drafts, in the engine and
through the playground's controls; only the empty string is refused, with a clear message."""

from __future__ import annotations

import dataclasses

import pytest

from specdec.core.errors import InvalidInputError
from specdec.core.sampling import SamplingConfig
from specdec.core.settings import DecodeSettings, encode_prompt


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
