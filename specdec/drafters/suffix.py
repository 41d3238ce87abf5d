"""Suffix decoding (Oliaro et al. 2024, "SuffixDecoding"): copy the continuation that most often followed the end of
the text, from a frequency index over the prompt, the output so far and this visitor's earlier runs.

Written here in Python/numpy rather than taken from arctic-inference 0.3.0, whose sdist builds a C++/CMake
extension against torch>=2.10 (plus nanobind, grpcio-tools) at install and keeps one suffix tree shared by every
request.

The index (`SuffixIndex`) counts, for every context of 1..`depth` tokens that occurred in its texts, which token
followed it, how often, and where it last did: a suffix trie truncated at depth `depth`, stored as one dict keyed by
a 64-bit rolling hash of the context (a hash collision can only make a worse guess, never a wrong output: the
proposal stays a deterministic function of the text). Appending a token adds `depth` counts, so each round costs
(committed tokens + 1) * depth dict updates whatever the text's length; the prompt and the earlier runs are
indexed once, when the drafter first sees them.

A proposal (`SuffixDrafter.propose`):
- match: the longest context (up to `depth` tokens) at the end of the text that the index has seen followed by
  something; a full-depth match is measured further back against the place it was last seen (up to MAX_MATCH);
- walk: from that context take the token that followed it most often (the most recent one among equals), append
  it, and go on from the context one token longer (capped at `depth`: an order-`depth` model past that), as
  SuffixDecoding walks its tree from the matched node. Each step multiplies the path's empirical probability by
  count(next) / count(context); the walk stops when that falls below `min_prob` (SuffixDecoding's
  min_token_prob, 0.1), when the context was never followed by anything, or at the length limit;
- length limit: `spec_factor * match_len` tokens, at most gamma (SuffixDecoding's max_spec_factor rule: a longer
  match earns a longer draft). With `length="gain"` (the `expected` gamma policy) the walk runs to gamma and
  `gain.CopyGain` cuts it where the measured acceptance and width cost say another token stops paying;
  `length="asked"` copies up to gamma (a replay of such a run with its recorded lengths).

q is one-hot on the proposal (a deterministic function of the text, the history and the index), so the target
keeps a guess x with probability p(x) and repairs from p with x removed -- exact at every temperature, verified by
the same rule as the n-gram drafter's copies.

Texts are per drafter: the decoder's prompt and output, and the earlier runs passed in explicitly (`history`: the
app gives one browser session's own earlier outputs; nothing is shared between drafters, sessions or visitors).
Each proposal's DraftNote says where the first copied token came from: `source` ("prompt", "output" or
"earlier run"), `source_start` (its index in prompt + output ids, or in that earlier run's tokens) and
`match_len`.

`propose_tree` drafts a token tree (tree rounds): one branch per token that followed the matched context, most
frequent first, each continued by the walk; one-hot on every node.
"""

from __future__ import annotations

import numpy as np

from specdec.core.events import DraftNote
from specdec.core.tree import TokenTree
from specdec.drafters.base import Draft, no_draft, one_hot_draft
from specdec.drafters.tree import branch_tree

DEPTH = 8  # contexts indexed up to this many tokens
MAX_MATCH = 64  # a full-depth match is measured back this far against its source (longer matches copy more)
SPEC_FACTOR = 4.0  # draft at most SPEC_FACTOR * match length tokens: 4 after a 1-token match, gamma after 8
MIN_PROB = 0.1  # stop once the copied path's empirical probability falls below this (SuffixDecoding's default)
MAX_HISTORY_TOKENS = 16384  # earlier runs indexed at most (the most recent kept)
LENGTH_RULES = ("match", "gain", "asked")  # what limits a draft (the module docstring)

_MASK = (1 << 64) - 1
_BASE = 0x9E3779B97F4A7C15  # odd 64-bit multiplier of the rolling hash
_DOC_SHIFT = 32  # a source is packed as doc << 32 | position (larger = indexed later = more recent)


def context_hashes(tokens, depth: int) -> list[int]:
    """Hashes of the last 1..depth tokens of `tokens` (fewer if it is shorter): h_k = h_{k-1} * B + (t_{-k} + 1)
    mod 2^64, the same function `SuffixIndex` indexes with."""
    out, h = [], 0
    for k in range(1, min(depth, len(tokens)) + 1):
        h = (h * _BASE + int(tokens[-k]) + 1) & _MASK
        out.append(h)
    return out


class Context:
    """What followed one context: every follower's count and last source, and the most frequent one (the most
    recent among equals). A context with one follower keeps no dicts."""

    __slots__ = ("total", "best", "best_count", "best_src", "counts", "srcs")

    def __init__(self, tok: int, src: int):
        self.total, self.best, self.best_count, self.best_src = 1, tok, 1, src
        self.counts: dict[int, int] | None = None
        self.srcs: dict[int, int] | None = None

    def add(self, tok: int, src: int) -> None:
        self.total += 1
        if self.counts is None:
            if tok == self.best:
                self.best_count += 1
                self.best_src = src
                return
            self.counts, self.srcs = {self.best: self.best_count}, {self.best: self.best_src}
        c = self.counts.get(tok, 0) + 1
        self.counts[tok], self.srcs[tok] = c, src
        if c >= self.best_count:
            self.best, self.best_count, self.best_src = tok, c, src

    def ranked(self) -> list[tuple[int, int, int]]:
        """(token, count, source) of every follower, most frequent first, the most recent first among equals."""
        if self.counts is None:
            return [(self.best, self.best_count, self.best_src)]
        return sorted(((t, c, self.srcs[t]) for t, c in self.counts.items()), key=lambda x: (-x[1], -x[2]))


class SuffixIndex:
    """Follower counts for every context of 1..depth tokens in a set of growing texts ("docs")."""

    def __init__(self, depth: int = DEPTH):
        self.depth = depth
        self.docs: list[list[int]] = []
        self.table: dict[int, Context] = {}
        self.updates = 0  # counts added so far (the work done: `depth` per indexed token at most)

    def add_doc(self, tokens=()) -> int:
        self.docs.append([])
        doc = len(self.docs) - 1
        self.extend(doc, tokens)
        return doc

    def extend(self, doc: int, tokens) -> None:
        """Append tokens to a doc and index each as the follower of the contexts ending before it."""
        seq = self.docs[doc]
        start = len(seq)
        seq.extend(int(t) for t in tokens)
        if len(seq) - start > 4 * self.depth:
            self._bulk(doc, max(start, 1))
            return
        table, depth = self.table, self.depth
        for t in range(max(start, 1), len(seq)):
            tok, src, h = seq[t], doc << _DOC_SHIFT | t, 0
            for k in range(1, min(depth, t) + 1):
                h = (h * _BASE + seq[t - k] + 1) & _MASK
                ctx = table.get(h)
                if ctx is None:
                    table[h] = Context(tok, src)
                else:
                    ctx.add(tok, src)
            self.updates += min(depth, t)

    def _bulk(self, doc: int, start: int) -> None:
        """extend() for a long run of new tokens: the hashes computed with numpy, one pass per context length."""
        seq = np.asarray(self.docs[doc], dtype=np.uint64)
        pos = np.arange(start, len(seq))
        hashes = np.zeros((self.depth, pos.size), dtype=np.uint64)
        h = np.zeros(pos.size, dtype=np.uint64)
        with np.errstate(over="ignore"):
            for k in range(1, self.depth + 1):
                back = pos - k
                ok = back >= 0
                h = np.where(ok, h * np.uint64(_BASE) + seq[np.maximum(back, 0)] + np.uint64(1), h)
                hashes[k - 1] = h
        table, toks = self.table, self.docs[doc]
        rows = hashes.T.tolist()
        for i, t in enumerate(pos.tolist()):
            tok, src = toks[t], doc << _DOC_SHIFT | t
            for h in rows[i][: min(self.depth, t)]:
                ctx = table.get(h)
                if ctx is None:
                    table[h] = Context(tok, src)
                else:
                    ctx.add(tok, src)
            self.updates += min(self.depth, t)

    def get(self, h: int) -> Context | None:
        return self.table.get(h)

    def longest(self, tail: list[int]) -> tuple[int, Context] | None:
        """(k, context) for the longest of tail's last 1..depth tokens that was ever followed by a token."""
        best = None
        for k, h in enumerate(context_hashes(tail, self.depth), 1):
            ctx = self.table.get(h)
            if ctx is None:
                break  # a longer context that was followed contains this one, which then was too
            best = (k, ctx)
        return best

    def source(self, src: int) -> tuple[int, int]:
        return src >> _DOC_SHIFT, src & ((1 << _DOC_SHIFT) - 1)

    def match_back(self, tail: list[int], src: int, limit: int) -> int:
        """How many tokens before the follower at `src` agree with the end of `tail`, up to `limit`."""
        doc, pos = self.source(src)
        seq = self.docs[doc]
        n = 0
        while n < limit and n < len(tail) and pos - 1 - n >= 0 and seq[pos - 1 - n] == tail[-1 - n]:
            n += 1
        return n


class SuffixDrafter:
    """Copies the most frequent continuation of the longest matching context (see the module docstring)."""

    def __init__(self, vocab_size: int, device, eos_token_ids: tuple[int, ...] = (), history: list[list[int]] = (),
                 depth: int = DEPTH, spec_factor: float = SPEC_FACTOR, min_prob: float = MIN_PROB,
                 length: str = "match", gain=None):
        if length not in LENGTH_RULES:
            raise ValueError(f"length must be one of {LENGTH_RULES}, got {length!r}")
        if length == "gain" and gain is None:
            from specdec.drafters.gain import CopyGain

            gain = CopyGain()
        self.vocab_size, self.device = vocab_size, device
        self.eos = set(eos_token_ids)
        self.depth, self.spec_factor, self.min_prob = depth, spec_factor, min_prob
        self.length, self.gain = length, gain
        self.history = _cap_history(history)
        self._reset()

    def _reset(self) -> None:
        self.index = SuffixIndex(self.depth)
        for run in self.history:
            self.index.add_doc(run)
        self.text_doc = self.index.add_doc()
        self.prompt_len: int | None = None

    def _sync(self, committed: list[int]) -> list[int]:
        """Index what was committed since the last call; the first call's text is the prompt."""
        seq = self.index.docs[self.text_doc]
        if len(committed) < len(seq):  # a different (shorter) text: start over
            self._reset()
            seq = self.index.docs[self.text_doc]
        if self.prompt_len is None:
            self.prompt_len = len(committed)
        if len(committed) > len(seq):
            self.index.extend(self.text_doc, committed[len(seq):])
        return seq

    def where(self, src: int) -> tuple[str, int]:
        """(source name, index there) of a packed source: the prompt, the output, or an earlier run."""
        doc, pos = self.index.source(src)
        if doc != self.text_doc:
            return "earlier run", pos
        return ("prompt" if pos < (self.prompt_len or 0) else "output"), pos

    def walk(self, tail: list[int], match: int, limit: int, first: tuple[int, int] | None = None) -> tuple[list[int], list[float]]:
        """Follow the most frequent continuation from the end of `tail` (whose last `match` tokens matched), up to
        `limit` tokens, while the path's probability stays >= min_prob: (tokens, path probability after each).
        `first` = (token, its count) forces the first step (a tree's other branches)."""
        ctx = self.index.longest(tail[-match:]) if match else None
        if ctx is None or ctx[0] < min(match, self.depth):
            return [], []
        node = ctx[1]
        run = list(tail[-self.depth:])
        tokens, probs, prob = [], [], 1.0
        while len(tokens) < limit:
            tok, count = first if first is not None and not tokens else (node.best, node.best_count)
            prob *= count / node.total
            if prob < self.min_prob:
                break
            tokens.append(tok)
            probs.append(prob)
            if tok in self.eos:
                break
            run = (run + [tok])[-self.depth:]
            k = min(match + len(tokens), self.depth)
            node = self.index.get(context_hashes(run, k)[-1]) if len(run) >= k else None
            if node is None:
                break
        return tokens, probs

    def candidate(self, committed: list[int], gamma: int):
        """(tokens, probs, note) of this round's copy before any gain cut, or None when nothing matches."""
        seq = self._sync(committed)
        found = self.index.longest(seq)
        if found is None:
            return None
        m, ctx = found
        if m == self.depth:
            m = max(m, self.index.match_back(seq, ctx.best_src, MAX_MATCH))
        limit = gamma if self.length != "match" else min(gamma, max(1, int(self.spec_factor * m)))
        tokens, probs = self.walk(seq, min(m, self.depth), limit)
        if not tokens:
            return None
        source, start = self.where(ctx.best_src)
        return tokens, probs, DraftNote("suffix", one_hot=True, source_start=start, match_len=m, source=source)

    def propose(self, committed, gamma, cfg, gen) -> Draft:
        found = self.candidate(committed, gamma)
        if found is None:
            return no_draft(self.vocab_size, self.device, DraftNote("suffix", one_hot=True))
        tokens, probs, note = found
        asked = None
        if self.length == "gain":
            asked = self.gain.choose(note.match_len, len(tokens))
            tokens = tokens[:asked]
        draft = one_hot_draft(tokens, self.vocab_size, self.device, note, self.eos)
        draft.asked = asked
        return draft

    def propose_tree(self, committed, depth, budget, cfg, gen) -> TokenTree:
        """One branch per follower of the longest matching context, most frequent first, each continued by the walk
        (at most `depth` tokens, `budget` nodes); empty when nothing matches."""
        seq = self._sync(committed)
        found = self.index.longest(seq)
        if found is None:
            return branch_tree([], budget, self.vocab_size, self.device, self.eos)
        m, ctx = found
        branches = []
        for tok, count, _ in ctx.ranked():
            toks, _ = self.walk(seq, m, depth, first=(tok, count))
            if toks:
                branches.append(toks)
        return branch_tree(branches, budget, self.vocab_size, self.device, self.eos)

    def feedback(self, committed, n_accepted, n_drafted) -> None:
        pass  # the index follows the committed text in propose

    def observe(self, rnd) -> None:
        """Told each finished Round (its timings and fates): the gain rule learns from it."""
        if self.gain is not None:
            self.gain.observe(rnd)


def tokenize_history(tokenizer, texts) -> list[list[int]]:
    """Earlier runs' texts as the target tokenizes plain text (no special tokens), the empty ones left out; the
    last MAX_HISTORY_TOKENS characters of each at most (a token is at least one character)."""
    out = []
    for text in texts or ():
        if isinstance(text, str) and text:
            out.append([int(i) for i in tokenizer(text[-MAX_HISTORY_TOKENS:], add_special_tokens=False)["input_ids"]])
    return out


def _cap_history(history) -> list[list[int]]:
    """The earlier runs' token lists, the most recent last, at most MAX_HISTORY_TOKENS in all (older runs, then
    the start of the oldest kept one, are left out)."""
    runs, left = [], MAX_HISTORY_TOKENS
    for run in reversed([list(map(int, r)) for r in history if len(r)]):
        if left <= 0:
            break
        runs.append(run[-left:])
        left -= len(runs[-1])
    return runs[::-1]
