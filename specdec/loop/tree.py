"""Tree rounds: a drafter proposes a token tree, the target scores every node in one pass, `verify_tree` walks it
from the root, and the target's cache (and the draft model's, when it drafted) keeps exactly the accepted path.

Who drafts follows `settings.drafter`: "model" grows the tree from the draft model (`drafters.tree.draft_tree`, children
per depth from `widths`, chosen by `mode`; mode "dynamic" shapes it by the draft's confidence instead,
`draft_dynamic_tree`, keeping as many nodes as `TreeBudget` measures to pay); "ngram", "predicted" and "suffix" copy it
from the text or the prediction (their `propose_tree`: a branch per distinct continuation, one-hot q), the widths then
bounding its depth and node count (`drafters.tree.copy_tree_bounds`).

Each round also becomes display events (`loop.tree_display`): `TreeRound.event`, the whole tree with p, q, the
residual and u at every node, and `TreeRound.round`, the chain `Round` (accepted path as the guesses, the event
attached) that the playground, statistics and traces read.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from specdec.core.clock import Stopwatch
from specdec.core.errors import InvalidInputError
from specdec.core.events import Round, Totals
from specdec.core.static_cache import open_lm
from specdec.core.sampling import OneHot, distribution, make_generator
from specdec.core.settings import MAX_TREE_NODES, TOP_DISPLAY, DecodeSettings, encode_prompt
from specdec.core.stop import StopReason, cut_at_stop
from specdec.core.tree import TokenTree, TreeVerdict, verify_tree
from specdec.core.tree_events import TreeRoundEvent
from specdec.drafters import make_drafter, resolve_draft_vocab
from specdec.drafters.tree import (TreeBudget, TreeDrafter, check_tree_drafter, check_widths, copy_tree_bounds,
                                   draft_dynamic_tree, draft_tree)
from specdec.loop.tree_display import tree_chain_round, tree_round_event
from specdec.models.pair import ModelPair


def judged(tree: TokenTree, verify: str, vocab_size: int) -> TokenTree:
    """The tree as the rule reads it: under strict verification every child is judged as if chosen
    deterministically (one-hot q), which is, in law, the target drawing its own token at each node and moving to
    the child that matches it (emitting its draw when none does)."""
    if verify != "strict":
        return tree
    return TokenTree(tree.tokens, tree.parents, OneHot(tree.tokens, vocab_size))


@dataclass
class TreeRound:
    tree: TokenTree
    verdict: TreeVerdict
    committed: list[int]
    stop_reason: StopReason | None = None
    event: TreeRoundEvent | None = None  # the tree as the views draw it (loop.tree_display)
    round: Round | None = None  # the chain view of the round, `event` attached as Round.tree


@dataclass
class TreeDecoder:
    """Speculative decoding with a token tree each round: a draft-model tree (widths per depth, children chosen by
    `mode`), or, with `drafter` (a `TreeDrafter`; made from settings.drafter "ngram", "predicted" or "suffix" when
    None), a copied tree within the widths' depth and node count."""

    pair: ModelPair
    prompt: str
    settings: DecodeSettings = field(default_factory=DecodeSettings)
    widths: tuple[int, ...] = (2, 2, 1)
    mode: str = "top-k"
    drafter: TreeDrafter | None = None  # None with settings.drafter "model": the draft model grows the tree
    top_k: int = TOP_DISPLAY  # candidates per position the chain Round carries for display (0: none)

    def __post_init__(self) -> None:
        self.settings = self.settings.validate()
        if self.settings.verify == "block":
            raise InvalidInputError("block verification judges one chain of guesses; a token tree is verified with "
                                    "pq or strict")
        self.widths = check_widths(self.widths, self.mode)
        self.prompt_ids = encode_prompt(self.pair.tokenizer, self.prompt, self.settings.chat)
        name = self.settings.drafter
        if self.drafter is None and name != "model":
            check_tree_drafter(name)
            self.drafter = make_drafter(self.pair, self.settings, self.prompt_ids)
        if self.drafter is not None and self.mode != "top-k":
            raise InvalidInputError(f"a copied tree's children are chosen deterministically (one-hot q), not "
                                    f"{self.mode}: use the top-k tree mode")
        self.ids = list(self.prompt_ids)
        self.gen = make_generator(self.pair.device, self.settings.seed)
        # Both caches on the pair's engine (eager, static or compiled: a tree pass of up to BUCKETS[-1] fed tokens is
        # padded to a bucket there), sized for the prompt, the budget and one tree past it.
        engine, max_len = self.pair.engine, len(self.prompt_ids) + self.settings.max_new_tokens + MAX_TREE_NODES
        self.target = open_lm(self.pair.target, self.pair.vocab_size, engine=engine, max_len=max_len)
        # The draft's reduced head, as the chain drafter runs it (ids below the cut, EOS and the text's own tokens):
        # each depth's pass projects onto fewer rows; q is exactly the distribution over the kept ids it scores.
        self.draft = open_lm(self.pair.draft, self.pair.vocab_size,
                             resolve_draft_vocab(self.pair, self.settings.draft_vocab), self.pair.eos_token_ids,
                             engine=engine, max_len=max_len)
        self.draft.keep_in_head(self.prompt_ids)
        self.budget = TreeBudget() if self.mode == "dynamic" else None  # how many candidates pay, as measured
        self.rounds: list[TreeRound] = []
        self.stop_reason: StopReason | None = None
        self.totals = Totals()
        self._started: float | None = None  # perf_counter time the first round started

    @property
    def generated_ids(self) -> list[int]:
        return self.ids[len(self.prompt_ids) :]

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    def __iter__(self):
        while not self.done:
            yield self.step()

    @torch.inference_mode()
    def step(self) -> TreeRound:
        if self.done:
            raise InvalidInputError("generation has finished; start a new run")
        clock = Stopwatch(self.pair.device)
        self._started = self._started or clock.start
        cfg = self.settings.sampling
        left = self.settings.max_new_tokens - len(self.generated_ids)
        widths = self.widths[: max(1, left - 1)]  # deeper than the budget is wasted work
        tree, passes = self.propose(widths)
        draft_ms = clock.lap()
        p = distribution(self.target.logits_for_tree(self.ids, tree), cfg)  # [n + 1, V], warped as q
        tree = judged(tree, self.settings.verify, self.pair.vocab_size)
        verdict = verify_tree(tree, p, self.gen)
        verify_ms = clock.lap()
        committed, self.stop_reason = cut_at_stop(verdict.tokens, self.pair.eos_token_ids, left)
        self.ids += committed
        self.target.keep_path(self.ids, verdict.path)  # the accepted path's slots stay, the rest go
        self.draft_follows(committed)
        rnd = TreeRound(tree, verdict, committed, self.stop_reason)
        self._display(rnd, p, widths, draft_ms, verify_ms, clock)
        if self.budget is not None:
            self.budget.observe(rnd.round, tree.size, passes)
        self.rounds.append(rnd)
        return rnd

    def propose(self, widths: list[int]) -> tuple[TokenTree, int]:
        """This round's tree after the committed text (self.ids), and the draft passes a dynamic tree ran (0
        otherwise): the draft model's tree in `mode`, or the copy drafter's within the widths' bounds."""
        cfg = self.settings.sampling
        if self.budget is not None:
            tree, _, passes = draft_dynamic_tree(self.draft, self.ids, widths, cfg, self.budget,
                                                 self.pair.eos_token_ids)
            return tree, passes
        if self.drafter is None:
            return draft_tree(self.draft, self.ids, widths, self.mode, cfg, self.gen), 0
        return self.drafter.propose_tree(self.ids, *copy_tree_bounds(widths), cfg, self.gen), 0

    def draft_follows(self, committed: list[int]) -> None:
        """After self.ids gained `committed`: the draft's cache drops the tree it grew and its head keeps the new
        tokens (a copy drafter reads self.ids itself)."""
        if self.drafter is None:
            self.draft.sync(self.ids)
            self.draft.keep_in_head(committed)

    def _display(self, rnd: TreeRound, p, widths: list[int], draft_ms: float, verify_ms: float,
                 clock: Stopwatch) -> None:
        """Attach the round's display events and count it in the running totals."""
        tok, drafter = self.pair.tokenizer, self.settings.drafter
        mode = self.mode if self.drafter is None else f"copied ({drafter})"
        rnd.event = tree_round_event(rnd.tree, p, rnd.verdict, tok, mode, widths, len(rnd.committed))
        position = len(self.generated_ids) - len(rnd.committed)
        rnd.round = tree_chain_round(len(self.rounds), position, rnd.tree, p, rnd.verdict, rnd.event, rnd.committed,
                                     rnd.stop_reason, draft_ms, verify_ms, tok, self.top_k, drafter)
        self.totals.observe(rnd.round)
        rnd.round.round_ms = clock.total()
        self.totals.elapsed_ms = (clock.start - self._started) * 1e3 + rnd.round.round_ms
        rnd.round.totals = replace(self.totals)
