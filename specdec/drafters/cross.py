"""A draft model with ANOTHER tokenizer: it writes a few tokens of text in its own vocabulary, and the text is
re-tokenized into target tokens for verification.

Each round:
1. the committed target ids are decoded to text (special tokens kept, so a chat template reads the same) and
   encoded with the draft's tokenizer; the draft's KV cache keeps the longest prefix that still matches;
2. the draft proposes up to gamma tokens of ITS vocabulary, greedily: with a one-hot q a guess x is kept with
   probability p(x), so the likeliest guess is the best one (sampling the draft would only lower E[p(x)]);
3. the proposal's text is re-tokenized into target tokens after the committed text (`retokenize`): a look-behind
   window of committed tokens is encoded together with the proposal, and when the window comes back unchanged the
   tokens after it are the proposal's; when the target's tokenizer would merge the boundary (the window comes back
   different), the proposal is encoded on its own, which still spells the same text after the committed tokens;
4. the target tokens are cut at gamma and after the first target EOS (the draft's text can spell it before its
   own end), and q is one-hot on them. The proposal is a function of the committed text alone (the draft is
   greedy), so the rule keeps x with probability p(x) and repairs from p without x: exact at every temperature.

The shipped cross draft is SmolLM2-135M-Instruct (vocabulary 49152); `specdec.models.cross` loads it, and the tiny
test pair's cross draft with a character+merges BPE tokenizer (`tiny_cross_draft`).
"""

from __future__ import annotations

import torch

from specdec.core.events import DraftNote
from specdec.core.kvcache import CachedLM
from specdec.core.sampling import argmax
from specdec.core.stop import cut_at_stop
from specdec.drafters.base import Draft, no_draft, one_hot_draft
from specdec.models.cross import CrossDraft

LOOKBEHIND = 4  # committed target tokens re-encoded with a proposal to see whether the boundary holds


def retokenize(target_tok, committed: list[int], text: str, lookbehind: int = LOOKBEHIND) -> tuple[list[int], bool]:
    """Target token ids that spell `text` right after `committed`; and whether the boundary held.

    Encoding the proposal together with the last committed tokens gives the target's own tokenization of the
    join; it is used when it leaves those committed tokens as they are (they cannot change: they are in the text).
    """
    for b in dict.fromkeys((min(lookbehind, len(committed)), 1)):
        if b <= 0:
            continue
        window = committed[-b:]
        ids = target_tok(target_tok.decode(window, skip_special_tokens=False) + text,
                         add_special_tokens=False)["input_ids"]
        if ids[:b] == window:
            return list(ids[b:]), True
    return list(target_tok(text, add_special_tokens=False)["input_ids"]), False


class CrossTokenizerDrafter:
    """Drafts with a model of another vocabulary and re-tokenizes its text (see the module docstring)."""

    def __init__(self, target_tok, draft: CrossDraft, vocab_size: int, prompt_ids: list[int],
                 confidence_threshold: float = 0.0, eos_token_ids: tuple[int, ...] | None = None):
        """`eos_token_ids`: the TARGET's stop ids (the pair's eos_token_ids); a proposal ends after the first one.
        None: the target tokenizer's EOS token."""
        self.target_tok = target_tok
        self.draft = draft
        self.dtok = draft.tokenizer
        self.vocab_size = vocab_size
        self.lm = CachedLM(draft.model, draft.vocab_size)
        self.device = self.lm.device
        self.confidence_threshold = confidence_threshold
        self.draft_eos = draft.eos_ids
        if eos_token_ids is None:
            eos = getattr(target_tok, "eos_token_id", None)
            eos_token_ids = () if eos is None else (int(eos),)
        self.eos = set(eos_token_ids)
        self.prompt_ids = list(prompt_ids)
        # The prompt is encoded once; each round re-encodes only the generated text (a few hundred tokens at most).
        self._prompt_draft_ids = self._encode(self._decode(self.prompt_ids))
        self.last_boundary_held = True

    def _decode(self, ids: list[int]) -> str:
        return self.target_tok.decode(ids, skip_special_tokens=False)

    def _encode(self, text: str) -> list[int]:
        return list(self.dtok(text, add_special_tokens=False)["input_ids"]) if text else []

    def draft_context(self, committed: list[int]) -> list[int]:
        """The committed text in draft tokens."""
        n = len(self.prompt_ids)
        if committed[:n] != self.prompt_ids:
            return self._encode(self._decode(committed))
        return self._prompt_draft_ids + self._encode(self._decode(committed[n:]))

    @torch.inference_mode()
    def propose(self, committed, gamma, cfg, gen) -> Draft:
        context = self.draft_context(committed)
        logits = self.lm.logits_after(context)[-1]
        guesses: list[int] = []
        for i in range(gamma):
            if i > 0:
                logits = self.lm.feed([guesses[-1]])[-1]
            guesses.append(int(argmax(logits)))
            if guesses[-1] in self.draft_eos:
                break
            threshold = self.confidence_threshold
            if threshold > 0 and float(torch.softmax(logits.float(), -1).max()) < threshold:
                break
        pieces = [self.dtok.decode([t], skip_special_tokens=False) for t in guesses]
        text = self.dtok.decode(guesses, skip_special_tokens=False)  # whole: a character may span two pieces
        ids, self.last_boundary_held = retokenize(self.target_tok, committed, text)
        # The draft's text may spell the target's EOS before its end (e.g. "<|endoftext|>" is no EOS to the draft):
        # nothing after an end of text could be committed, so the proposal ends there, as the other drafters' do.
        ids, _ = cut_at_stop(ids[:gamma], self.eos)
        note = DraftNote("cross", one_hot=True, draft_pieces=pieces)
        if not ids or any(i >= self.vocab_size for i in ids):
            return no_draft(self.vocab_size, self.device, note)
        return one_hot_draft(ids, self.vocab_size, self.device, note, self.eos)

    def feedback(self, committed, n_accepted, n_drafted) -> None:
        pass
