"""Token trees as ragged batch rows: B prompts, each row drafting its own tree every round, the target scoring every
row's tree in ONE batched pass on the one scorer, each row walking its own tree from the root and committing its own
accepted path (the ragged commit rule, `loop.batched`).

A round:
- draft: each active row proposes its tree after its own text. A draft-model tree of fixed widths (top-k, sampled,
  distinct) grows for all rows at once on the batched draft cache, one pass per depth over every row's frontier
  (`drafters.tree.draft_tree_rows`: a node sees its row's text and its ancestors' slots only); a dynamic tree or a
  copy drafter's tree comes from one batch-1 `TreeDecoder.propose` per row (the row's draft cache or drafter; its
  target cache never used);
- verify: one target pass over a block [B, W]: per row, the committed tokens its cache lacks (the tail, causal)
  then its n_b nodes, right-aligned behind padding. Node i of row b sits at position (last committed position +
  depth) and sees the row's cached text, its tail, its ancestors and itself (`kvcache.tail_and_nodes`), never a
  sibling, a cousin, the padding or another row (the scorer's mask: a row sees only its own valid slots);
- each row: `verify_tree` on its own p rows (row 0 after its text, row i + 1 after node i, warped as its q), the
  stop rule, and its node slots off the committed path become holes (`CachedLM.drop`), so the path's keys stay
  where they were written -- at their positions, in slot order -- and the next round feeds only the row's new
  last token.

Every row is an exact sample of its target: its round is batch-1 tree decoding on its own text, verified from the
root with the rule matching how its children were chosen (a deterministic choice carries a one-hot q), and nothing
of another row reaches its attention (nor its draft's). The eager engine only, as every batch.
"""

from __future__ import annotations

import dataclasses

import torch

from specdec.core.clock import Stopwatch
from specdec.core.errors import InvalidInputError
from specdec.core.kvcache import tail_and_nodes
from specdec.core.sampling import distribution
from specdec.core.settings import DecodeSettings
from specdec.core.stop import cut_at_stop
from specdec.core.tree import TokenTree, verify_tree
from specdec.drafters.tree import COPY_TREE_DRAFTERS, check_widths, draft_tree_rows
from specdec.loop.batched import COMPACT_AT, BatchDecoder, BatchResult, BatchRound
from specdec.loop.tree import TreeDecoder, judged
from specdec.models.pair import ModelPair


def tree_block(tails: list[list[int]], trees: list[TokenTree | None], lengths: list[int], pad: int):
    """The target's fed block for one round of tree rows: ids [B, W], positions [B, W], visible [B, W, W] and real
    [B, W] (False: padding), and where each row's tail starts. Row b holds its tail (causal) then its tree's nodes
    (each seeing the tail, its ancestors and itself), right-aligned; lengths[b]: text slots row b has cached. A row
    with no tree (stopped) is all padding."""
    b_rows = len(tails)
    sizes = [len(t) + (tr.size if tr is not None else 0) for t, tr in zip(tails, trees)]
    w = max(1, max(sizes))
    ids = torch.full((b_rows, w), pad, dtype=torch.long)
    positions = torch.zeros(b_rows, w, dtype=torch.long)
    visible = torch.zeros(b_rows, w, w, dtype=torch.bool)
    real = torch.zeros(b_rows, w, dtype=torch.bool)
    starts = []
    for b, (tail, tree) in enumerate(zip(tails, trees)):
        start = w - sizes[b]
        starts.append(start)
        if tree is None:
            continue
        nt = len(tail)
        ids[b, start:] = torch.tensor(tail + tree.tokens.tolist(), dtype=torch.long)
        positions[b, start : start + nt] = torch.arange(lengths[b], lengths[b] + nt)
        positions[b, start + nt :] = lengths[b] + nt - 1 + torch.tensor(tree.depths, dtype=torch.long)
        visible[b, start:, start:] = tail_and_nodes(nt, tree.ancestors_mask())
        real[b, start:] = True
    return ids, positions, visible, real, starts


class TreeBatchDecoder(BatchDecoder):
    """Ragged batch rows that each draft and verify a token tree (module docstring); `step()` runs one round.

    widths / mode as for `TreeDecoder` (the draft model's tree; settings.drafter "ngram", "predicted" or "suffix":
    a copied tree within the widths' bounds, top-k mode)."""

    def __init__(self, pair: ModelPair, prompts, settings: DecodeSettings = DecodeSettings(),
                 widths=(2, 2, 1), mode: str = "top-k", compact_at: float = COMPACT_AT,
                 batched_draft: bool | None = None):
        s = settings.validate()
        if s.drafter != "model" and s.drafter not in COPY_TREE_DRAFTERS:
            raise InvalidInputError(f"tree rows draft with the draft model or {', '.join(COPY_TREE_DRAFTERS)}, not "
                                    f"{s.drafter!r}")
        if s.verify == "block":
            raise InvalidInputError("block verification judges one chain of guesses; tree rows are verified with pq "
                                    "or strict")
        if pair.engine != "eager":
            raise InvalidInputError("batched decoding runs on the eager engine")
        plain = dataclasses.replace(s, drafter="model")  # the chain loop's own checks on the rest
        super().__init__(pair, prompts, plain, compact_at=compact_at)
        self.settings = s
        self.widths = check_widths(widths, mode)
        self.mode = mode
        # A draft-model tree of fixed widths grows for every row at once on the batched draft cache (one pass per
        # depth, `draft_tree_rows`); a dynamic tree or a copied one is proposed per row by a batch-1 tree decoder
        # (its draft cache or copy drafter; its target side never used), every row drawing from the one generator.
        self.batched_draft = s.drafter == "model" and mode != "dynamic" if batched_draft is None else batched_draft
        if self.batched_draft and (s.drafter != "model" or mode == "dynamic"):
            raise InvalidInputError("only a draft-model tree of fixed widths is drafted for all rows at once")
        self.rows: list[TreeDecoder] = []
        if not self.batched_draft:
            self.rows = [TreeDecoder(pair, p, s, tuple(self.widths), mode) for p in self.prompts]
            for row in self.rows:
                row.gen = self.gen
            self.draft = None  # the rows' own drafts stand in for the batched one

    @torch.inference_mode()
    def step(self) -> BatchRound:
        if self.done:
            raise InvalidInputError("the batch has finished; start a new run")
        cfg, b_rows, eos = self.settings.sampling, self.batch, self.pair.eos_token_ids
        was_active = list(self.active)
        clock = Stopwatch(self.pair.device)
        self._t0 = self._t0 or clock.start

        # Deeper than a row's budget is wasted work.
        depths = [min(len(self.widths), max(1, self.settings.max_new_tokens - len(o) - 1)) if a else 0
                  for o, a in zip(self.out, was_active)]
        trees: list[TokenTree | None] = [None] * b_rows
        columns: list[list[int | None]] = [[] for _ in range(b_rows)]
        if self.batched_draft:
            tails, real = self._catch_up(self.draft)
            trees, columns = draft_tree_rows(self.draft, tails, real, depths, self.widths, self.mode, cfg, self.gen)
        else:
            for b, row in enumerate(self.rows):
                if was_active[b]:
                    trees[b], _ = row.propose(self.widths[: depths[b]])
        trees = [judged(t, self.settings.verify, self.pair.vocab_size) if t is not None else None for t in trees]
        draft_ms = clock.lap()

        have = self.target.counts(b_rows)
        text_tails = [self.text(b)[have[b] :] if a else [] for b, a in enumerate(was_active)]
        ids, positions, visible, real, starts = tree_block(text_tails, trees, have, self.pad)
        dev = self.pair.device
        col0 = self.target.width
        logits = self.target.score(ids.to(dev), positions.to(dev), visible.to(dev), pad=~real.to(dev))
        verdicts = [None] * b_rows
        for b, tree in enumerate(trees):
            if tree is not None:
                first = starts[b] + len(text_tails[b]) - 1  # the row's last committed token: row 0 of its p
                p = distribution(logits[b, first : first + tree.size + 1], cfg)  # [n + 1, V], warped as q
                verdicts[b] = verify_tree(tree, p, self.gen)
        verify_ms = clock.lap()

        now_ms = (clock.last - self._t0) * 1e3
        emitted: list[list[int]] = []
        for b in range(b_rows):
            got: list[int] = []
            if was_active[b]:
                verdict, tree = verdicts[b], trees[b]
                budget = self.settings.max_new_tokens - len(self.out[b])
                got, self.stop[b] = cut_at_stop(verdict.tokens, eos, budget)
                self.out[b].extend(got)
                # The path's first len(got) - 1 nodes are committed text now (the last token is pending: fed next
                # round); every other node's slot becomes a hole, in the target and in the batched draft (whose
                # path slots stay only up to the first node it never fed: the rest is fed again next round).
                kept = set(verdict.path[: len(got) - 1])
                nodes = starts[b] + len(text_tails[b])
                self.target.drop(b, [col0 + nodes + j for j in range(tree.size) if j not in kept])
                if self.batched_draft:
                    path = verdict.path[: len(got) - 1]
                    fed = next((i for i, j in enumerate(path) if columns[b][j] is None), len(path))
                    on_path = {columns[b][j] for j in path[:fed]}
                    self.draft.drop(b, [c for c in columns[b] if c is not None and c not in on_path])
                    self.draft.keep_in_head(got)
                else:
                    self.rows[b].ids += got
                    self.rows[b].draft_follows(got)
                if self.stop[b] is not None:
                    self.active[b] = False
                    self.finish_ms[b] = now_ms
            emitted.append(got)
            if not self.active[b]:
                self.target.finish_row(b)
                if self.batched_draft:
                    self.draft.finish_row(b)
        accepted = [len(v.path) if v is not None else None for v in verdicts]
        return self._close_round(clock, (self.target, self.draft) if self.batched_draft else (self.target,),
                                 gamma=len(self.widths),  # the trees' depth: a row tests at most this many tokens
                                 active=was_active, n_accepted=accepted,
                                 slowest=min((n for n in accepted if n is not None), default=0),
                                 committed=emitted,
                                 own=[a and len(e) == (n or 0) + 1 for n, a, e in zip(accepted, was_active, emitted)],
                                 held=[0] * b_rows, thrown=0, draft_ms=draft_ms, verify_ms=verify_ms)


def tree_batch_decode(pair: ModelPair, prompts, settings: DecodeSettings = DecodeSettings(), widths=(2, 2, 1),
                      mode: str = "top-k", on_round=None) -> BatchResult:
    """Run tree rows to the end; `on_round(BatchRound)` after each round."""
    dec = TreeBatchDecoder(pair, prompts, settings, widths, mode)
    while not dec.done:
        rnd = dec.step()
        if on_round is not None:
            on_round(rnd)
    return dec.result()
