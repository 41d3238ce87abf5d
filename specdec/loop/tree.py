"""Tree rounds: the draft model proposes a token tree, the target scores every node in one pass, `verify_tree`
walks it from the root, and both caches keep exactly the accepted path.

The engine's tree path so far: exact and tested (greedy equality with plain greedy, a joint chi-square of the first
tokens), not yet in the playground's views, traces or bench.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec.core.errors import InvalidInputError
from specdec.core.kvcache import CachedLM
from specdec.core.sampling import distribution, make_generator
from specdec.core.settings import DecodeSettings, encode_prompt
from specdec.core.stop import StopReason, cut_at_stop
from specdec.core.tree import TokenTree, TreeVerdict, verify_tree
from specdec.drafters.tree import check_widths, draft_tree
from specdec.models.pair import ModelPair


@dataclass
class TreeRound:
    tree: TokenTree
    verdict: TreeVerdict
    committed: list[int]
    stop_reason: StopReason | None = None


@dataclass
class TreeDecoder:
    """Speculative decoding with a draft-model tree each round (widths per depth, children chosen by `mode`)."""

    pair: ModelPair
    prompt: str
    settings: DecodeSettings = field(default_factory=DecodeSettings)
    widths: tuple[int, ...] = (2, 2, 1)
    mode: str = "top-k"

    def __post_init__(self) -> None:
        self.settings = self.settings.validate()
        self.widths = check_widths(self.widths, self.mode)
        self.prompt_ids = encode_prompt(self.pair.tokenizer, self.prompt, self.settings.chat)
        self.ids = list(self.prompt_ids)
        self.gen = make_generator(self.pair.device, self.settings.seed)
        self.target = CachedLM(self.pair.target, self.pair.vocab_size)
        self.draft = CachedLM(self.pair.draft, self.pair.vocab_size)
        self.rounds: list[TreeRound] = []
        self.stop_reason: StopReason | None = None

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
        cfg = self.settings.sampling
        left = self.settings.max_new_tokens - len(self.generated_ids)
        widths = self.widths[: max(1, left - 1)]  # deeper than the budget is wasted work
        tree = draft_tree(self.draft, self.ids, widths, self.mode, cfg, self.gen)
        p = distribution(self.target.logits_for_tree(self.ids, tree), cfg)  # [n + 1, V], warped as q
        verdict = verify_tree(tree, p, self.gen)
        committed, self.stop_reason = cut_at_stop(verdict.tokens, self.pair.eos_token_ids, left)
        self.ids += committed
        self.target.keep_path(self.ids, verdict.path)  # the accepted path's slots stay, the rest go
        self.draft.sync(self.ids)
        rnd = TreeRound(tree, verdict, committed, self.stop_reason)
        self.rounds.append(rnd)
        return rnd
