"""Prompt lookup: guess that the text repeats itself (no draft model, so drafting costs ~nothing).

The last n committed tokens (n from `n_max` down to `n_min`) are looked up in the prompt plus the text so far; the
tokens that followed their MOST RECENT earlier occurrence are proposed, up to gamma of them. Recent matches are
preferred because edits and answers copy the passage being worked on, and the nearest earlier copy of a phrase is
the best predictor of how it goes on (transformers' prompt lookup takes the leftmost match instead).

How many tokens to copy depends on how long the match is (`copy_length`): gamma after a strong match, fewer after
a one- or two-token match, which is often a coincidence (a common word, a bracket). Every guess widens the target's
verification pass, so weak guesses are not free even though drafting them is. Under the `expected` gamma policy
the copy's length is chosen instead by expected gain (`gain.CopyGain`: this run's acceptance by match length and
position in the copy against the measured cost of width).

The proposal is a deterministic function of the committed text, so q is one-hot on it: verification keeps a guess x
with probability p(x) and repairs from p with x removed, which is exact at every temperature. No match means no
draft: the round is a plain target step.

`propose_tree` drafts a token tree instead (tree rounds, `loop.tree`): what followed EVERY earlier match becomes a
branch (`find_continuations`: longer matches first, the most recent first among equally long ones, so the first
branch is the chain's proposal), merged where branches agree; still one-hot on every node.
"""

from __future__ import annotations

import numpy as np

from specdec.core.events import DraftNote
from specdec.core.tree import TokenTree
from specdec.drafters.base import Draft, no_draft, one_hot_draft
from specdec.drafters.tree import branch_tree


def find_continuation(seq: np.ndarray, n_max: int, n_min: int, gamma: int) -> tuple[int, int, list[int]] | None:
    """Look the suffix of `seq` up in `seq` itself; return (source_start, match_len, proposal) or None.

    For n = n_max .. n_min, find the last start i < len - n with seq[i:i+n] == seq[-n:]; the proposal is what
    followed, seq[i+n : i+n+gamma]. A match that runs into the suffix itself (text in a loop, "abab|ab") continues
    periodically past the end, as an LZ77 copy does: the guess is that the loop goes on.
    """
    length = len(seq)
    if length < 2:
        return None
    ends, match = suffix_matches(seq, seq, min(n_max, length - 1))
    if ends.size == 0:
        return None
    n = min(int(match.max()), n_max)
    if n < n_min:
        return None
    src = int(ends[np.flatnonzero(match >= n)[-1]]) + 1  # after the most recent match of the longest length found
    return src, n, copy_from(seq, src, gamma)


def suffix_matches(text: np.ndarray, suffix: np.ndarray, n_cap: int) -> tuple[np.ndarray, np.ndarray]:
    """Where the end of `suffix` occurs earlier in `text`: (ends, match) with `ends` the positions before text's
    last that hold suffix's last token (ascending) and `match` [same size] how many tokens agree backwards from
    each, up to n_cap. One vectorized pass per extra token."""
    ends = np.flatnonzero(text[: len(text) - 1] == suffix[-1])
    match = np.ones(ends.size, dtype=np.int64)
    alive = np.ones(ends.size, dtype=bool)
    for d in range(1, n_cap):
        back = ends - d
        alive &= back >= 0
        alive[alive] &= text[back[alive]] == suffix[-1 - d]
        match += alive
    return ends, match


def copy_from(seq: np.ndarray, src: int, n: int) -> list[int]:
    """n tokens of seq from src on; past the end the copy continues periodically, as an LZ77 copy does."""
    out: list[int] = []
    for j in range(n):
        k = src + j
        out.append(int(seq[k]) if k < len(seq) else out[k - len(seq)])
    return out


MAX_BRANCH_SCAN = 256  # find_continuations reads at most this many earlier matches (a common token recurs often)


def find_continuations(seq: np.ndarray, n_max: int, n_min: int, depth: int,
                       limit: int = MAX_BRANCH_SCAN) -> list[tuple[int, int, list[int]]]:
    """Every earlier match of the suffix of `seq`, as find_continuation's (source_start, match_len, proposal) with
    proposals of `depth` tokens: the longest matches (capped at n_max) first, the most recent first among equally
    long ones -- so the first entry is find_continuation's answer -- at most `limit` of them, none shorter than
    n_min."""
    length = len(seq)
    if length < 2:
        return []
    ends, match = suffix_matches(seq, seq, min(n_max, length - 1))
    match = np.minimum(match, n_max)
    keep = match >= n_min
    ends, match = ends[keep], match[keep]
    order = np.lexsort((-ends, -match))[:limit]  # match length descending, then the most recent first
    return [(int(ends[i]) + 1, int(match[i]), copy_from(seq, int(ends[i]) + 1, depth)) for i in order]


STRONG_MATCH = 3  # a match this long (or n_max, if smaller) copies the full gamma
WEAK_COPY = 4  # a shorter one copies WEAK_COPY ** match_len tokens: 4 after one token, 16 after two


def copy_length(match_len: int, n_max: int, gamma: int) -> int:
    """Tokens to copy after a match of match_len tokens: gamma after a strong match, 4 after a one-token match (often a
    coincidence: a common word, a bracket), 16 after a two-token one. Each guess widens the target's verification
    pass (~2-4 ms per position on top of ~200 ms for the embedded 1.5B target on 2 CPU cores), so junk copies are
    cheap but not free, and a copy that stays right is worth the width. Measured on the grounded prompts (our loop,
    64 tokens, best of 2 per prompt, summed): at gamma 32 this rule took 10.0 s against 10.4 s for the earlier
    gamma-halving rule (same rounds, 91 vs 107 guesses on the first prompt); in another run the halving rule took
    10.4 s at gamma 32 against 10.9 s at gamma 16 (the summary in 4 rounds instead of 6)."""
    if match_len >= min(STRONG_MATCH, n_max):
        return gamma
    return min(gamma, WEAK_COPY**match_len)


class NgramDrafter:
    """Prompt-lookup drafter: copies what followed the most recent earlier match of the text's last n tokens, more of it
    the longer the match."""

    def __init__(self, vocab_size: int, device, n_max: int = 4, n_min: int = 1, eos_token_ids: tuple[int, ...] = (),
                 length: str = "match", gain=None):
        """`length`: what limits a copy -- "match" (`copy_length`), "gain" (`gain.CopyGain` cuts the gamma tokens
        found where one more stops paying; the `expected` policy) or "asked" (gamma: a replay of a "gain" run)."""
        if length not in ("match", "gain", "asked"):
            raise ValueError(f"length must be match, gain or asked, got {length!r}")
        if length == "gain" and gain is None:
            from specdec.drafters.gain import CopyGain

            gain = CopyGain()
        self.vocab_size = vocab_size
        self.device = device
        self.n_max, self.n_min = n_max, n_min
        self.eos = set(eos_token_ids)
        self.length, self.gain = length, gain
        # The committed ids as a growing numpy buffer: the text only ever grows, so each round appends its new tokens
        # instead of converting the whole list again.
        self._buf = np.zeros(1024, dtype=np.int64)
        self._len = 0

    def _sync(self, committed: list[int]) -> np.ndarray:
        n = len(committed)
        if n < self._len:  # a different (shorter) text: start over
            self._len = 0
        if n > self._buf.shape[0]:
            grown = np.zeros(max(n, 2 * self._buf.shape[0]), dtype=np.int64)
            grown[: self._len] = self._buf[: self._len]
            self._buf = grown
        if n > self._len:
            self._buf[self._len : n] = committed[self._len :]
            self._len = n
        return self._buf[:n]

    def lookup(self, committed: list[int], gamma: int, guesses: list[int] = ()) -> tuple[int, int, list[int]] | None:
        """find_continuation on `committed` followed by `guesses` (a draft's tokens so far, which the buffer never
        holds): (source_start, match_len, gamma tokens) or None."""
        seq = self._sync(committed)
        if len(guesses):
            seq = np.concatenate([seq, np.asarray(guesses, dtype=np.int64)])
        return find_continuation(seq, self.n_max, self.n_min, gamma)

    def propose(self, committed, gamma, cfg, gen) -> Draft:
        found = self.lookup(committed, gamma)
        if found is None:
            return no_draft(self.vocab_size, self.device, DraftNote("ngram", one_hot=True))
        src, n, tokens = found
        asked = None
        if self.length == "match":
            tokens = tokens[: copy_length(n, self.n_max, gamma)]
        elif self.length == "gain":
            asked = self.gain.choose(n, len(tokens))
            tokens = tokens[:asked]
        draft = one_hot_draft(tokens, self.vocab_size, self.device,
                              DraftNote("ngram", one_hot=True, source_start=src, match_len=n), self.eos)
        draft.asked = asked
        return draft

    def propose_tree(self, committed, depth, budget, cfg, gen) -> TokenTree:
        """A tree of the continuations of every earlier match (see the module docstring), each branch as long as
        `copy_length` allows for its match, at most `budget` nodes; empty when nothing matches."""
        found = find_continuations(self._sync(committed), self.n_max, self.n_min, depth)
        branches = [toks[: copy_length(n, self.n_max, depth)] for _, n, toks in found]
        return branch_tree(branches, budget, self.vocab_size, self.device, self.eos)

    def feedback(self, committed, n_accepted, n_drafted) -> None:
        pass

    def observe(self, rnd) -> None:
        """Told each finished Round (its timings and fates): the gain rule learns from it."""
        if self.gain is not None:
            self.gain.observe(rnd)
