"""The cross-tokenizer drafter's proposal ends after the first target EOS in its re-tokenized text."""

from __future__ import annotations

import torch

from specdec.core.sampling import SamplingConfig, dense
from specdec.core.settings import DecodeSettings, encode_prompt


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
