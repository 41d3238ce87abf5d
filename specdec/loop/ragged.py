"""Ragged batched speculative decoding: B prompts decoded together, every row keeping its own accepted count.

Where the lockstep loop (specdec.loop.batched) commits the batch's smallest accepted count + 1 for every row, here
row b commits its own accepted guesses plus its own repair/bonus token each round, as a server batching requests
does. Rows therefore sit at different lengths, and the two models see them through per-row bookkeeping:

- Each model keeps ONE DynamicCache [B, heads, T, dim] for all rows (`RaggedLM`). Beside it, `valid` [B, T] says
  which cached columns hold the row's committed text (in order) and which are holes: a row's left padding, the
  guesses it discarded, columns fed while it was stopped. A row's text is exactly its valid columns.
- A forward pass feeds a block [B, n] with its own per-row validity. Position ids count a row's valid columns (a
  row sees the positions it would see alone), and the attention mask is a 4D additive float mask in the model's
  dtype ([B, 1, n, T + n]: 0 visible, finfo.min hidden) built here: a query sees its row's valid cached columns
  and the valid fed columns up to itself, never a hole, so no row ever attends to its padding or to a guess it
  threw away. A hole query sees only itself (its output is never read). A sliding window, when the model has one,
  is applied on those positions too (per layer kind when only some layers slide).
- A round: the draft's first pass feeds, per row, whatever committed tokens its draft cache lacks (right-aligned in
  one block: the prompt in round one, one or two tokens later, more after rounds with speculation off), then one
  pass per further guess over all rows. One target pass then scores, per row, its pending committed token(s) plus
  its γ guesses. `specdec.core.verify.verify_batch` -- the one implementation of the rule -- gives each row its
  accepted count and next token; row b commits d[:n_b] + [y_b], cut by the stop rule. The target columns of row
  b's rejected guesses (and the draft columns of guesses it did not keep) become holes.
- Trailing columns that are holes in every row are cropped (`DynamicCache.crop`). When compaction would free more
  than `compact_at` of the cache (the width beyond the longest row's text), it is compacted: every layer's keys
  and values are gathered so each row's text is right-aligned again (one index gather per layer; the mask and
  positions follow).
- A row that ends (EOS or its budget) keeps riding along as padding: its fed columns are holes, its cached
  columns all become holes (compaction then drops them), and nothing it feeds is visible to any other row, so it
  changes no other row's text.
- γ can change from round to round (`gamma_for(active rows)`, e.g. `specdec.loop.schedule`), γ = 0 being a plain
  batched step (the target pass alone; verify_batch with no guesses samples the target's p).

Every row is an exact sample of its target: a row's round is batch-1 speculative decoding on its own text (q is
exactly the distribution its guess was drawn from, p gets the same warp), and γ is fixed before a round's draws.

`batch_decode(..., schedule="lockstep" | "ragged" | "plain")` is the one entry point for the three batched loops.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicLayer

from specdec.core.clock import Stopwatch
from specdec.core.errors import InvalidInputError
from specdec.core.kvcache import ReducedHead, check_rollback, rollback_cache, sliding_window_of
from specdec.core.sampling import distribution, make_generator, stack_rows
from specdec.core.settings import DecodeSettings
from specdec.core.stop import StopReason, cut_at_stop
from specdec.core.verify import verify_batch
from specdec.drafters import resolve_draft_vocab
from specdec.drafters.model import draft_chain
from specdec.loop.batched import (
    BatchResult,
    BatchRound,
    _settings,
    encode_batch,
    plain_batch_decode,
    speculative_batch_decode,
)
from specdec.models.pair import ModelPair

SCHEDULES = ("lockstep", "ragged", "plain")
# Compact a cache once compaction would free more than this share of its columns. Measured on the tiny pair (one
# thread, 2 shared and loaded cores, B = 8, γ = 6, T = 1, median of interleaved runs): with long prompts of
# different lengths (96 new tokens) never / 0.5 / 0.25 / every round took 642 / 601 / 555 / 621 ms per run; with
# short prompts (200 new tokens) 912 / 989 / 840 / 1247 ms. A compaction (one gather per layer) cost 0.3-1.0 ms
# against 2.3 ms for one target pass: compacting every round costs more than the narrower cache saves, a quarter
# of the cache freed pays.
COMPACT_AT = 0.25


class RaggedLM:
    """A causal LM over B rows of different lengths in one KV cache, with per-column validity (module docstring)."""

    def __init__(self, model: torch.nn.Module, vocab_size: int, head_vocab: int = 0,
                 always_keep: tuple[int, ...] = ()):
        self.model = model
        self.vocab_size = vocab_size
        check_rollback(model.config)
        self.cache = rollback_cache()
        self.head = ReducedHead(model, vocab_size, head_vocab, always_keep)
        self.dtype = model.get_input_embeddings().weight.dtype
        self.device = next(model.parameters()).device
        self.window, self.mixed = sliding_window_of(model.config)
        self.valid: torch.Tensor | None = None  # [B, T] bool: the column holds the row's committed text
        self.kpos: torch.Tensor | None = None  # [B, T] position id of every cached column
        self.compactions = 0

    def keep_in_head(self, ids) -> None:
        self.head.keep(ids)

    @property
    def width(self) -> int:
        return 0 if self.valid is None else self.valid.shape[1]

    def counts(self, batch: int) -> list[int]:
        """Committed tokens cached per row."""
        return [0] * batch if self.valid is None else self.valid.sum(1).tolist()

    @property
    def holes(self) -> float:
        """Share of cached columns that hold no row's text (left padding included)."""
        if not self.width:
            return 0.0
        return 1.0 - float(self.valid.float().mean())

    @property
    def reclaimable(self) -> float:
        """Share of cached columns that compaction would free: the width beyond the longest row's text."""
        if not self.width:
            return 0.0
        return 1.0 - int(self.valid.sum(1).max()) / self.width

    def mask(self, new_valid: torch.Tensor, pos: torch.Tensor, window: int | None) -> torch.Tensor:
        """The additive mask [B, 1, n, T + n] for feeding a block with validity new_valid [B, n] at positions pos."""
        b, n = new_valid.shape
        t = self.width
        dev = new_valid.device
        keep = torch.zeros(b, n, t + n, dtype=torch.bool, device=dev)
        if t:
            keep[:, :, :t] = self.valid[:, None, :]
        causal = torch.ones(n, n, dtype=torch.bool, device=dev).tril_()
        keep[:, :, t:] = new_valid[:, None, :] & causal
        keep[:, :, t:] |= torch.eye(n, dtype=torch.bool, device=dev)  # a hole query sees itself (never read)
        if window is not None:
            kpos = pos if not t else torch.cat([self.kpos, pos], 1)
            keep &= (pos[:, :, None] - kpos[:, None, :]) < window
        return torch.zeros(keep.shape, dtype=self.dtype, device=dev).masked_fill_(
            ~keep, torch.finfo(self.dtype).min)[:, None]

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, new_valid: torch.Tensor, n_logits: int) -> torch.Tensor:
        """Feed ids [B, n] (new_valid [B, n]: which of them are text); logits [B, n_logits, V] of the last columns.
        The fed columns stay in the cache with that validity until `drop` or `finish_row` changes it."""
        b = ids.shape[0]
        base = (torch.zeros(b, dtype=torch.long, device=ids.device) if self.valid is None
                else self.valid.sum(1))
        pos = (base[:, None] + new_valid.long().cumsum(1) - 1).clamp_min(0)
        mask = self.mask(new_valid, pos, self.window)
        if self.mixed:
            mask = {"full_attention": self.mask(new_valid, pos, None), "sliding_attention": mask}
        if not self.head.cut:
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=self.cache, use_cache=True,
                             logits_to_keep=n_logits)
            logits = out.logits[:, -n_logits:, : self.vocab_size]
        else:
            hidden = self.model.base_model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=self.cache,
                                           use_cache=True).last_hidden_state[:, -n_logits:]
            logits = self.head.project(hidden)
        nv = new_valid.to(torch.bool)
        self.valid = nv.clone() if self.valid is None else torch.cat([self.valid, nv], 1)
        self.kpos = pos if self.kpos is None else torch.cat([self.kpos, pos], 1)
        return logits

    @torch.inference_mode()
    def drop(self, row: int, columns) -> None:
        """Make the given cached columns of one row holes."""
        if columns:
            self.valid[row, list(columns)] = False

    @torch.inference_mode()
    def finish_row(self, row: int) -> None:
        """A row that ended: every column it holds becomes a hole."""
        if self.valid is not None:
            self.valid[row] = False

    @torch.inference_mode()
    def trim(self) -> None:
        """Crop trailing columns that are holes in every row."""
        if not self.width:
            return
        used = self.valid.any(0).nonzero()
        keep = int(used[-1]) + 1 if used.numel() else 0
        if keep < self.width:
            self.cache.crop(keep - self.width)
            self.valid, self.kpos = self.valid[:, :keep], self.kpos[:, :keep]

    @torch.inference_mode()
    def compact(self) -> bool:
        """Gather every layer's keys/values so each row's valid columns are right-aligned, holes only on the left;
        the cache shrinks to the longest row. False when the cache's layers are not plain DynamicLayers."""
        layers = list(getattr(self.cache, "layers", ()))
        if not self.width or not all(type(layer) is DynamicLayer for layer in layers):
            return False
        t = self.width
        w = int(self.valid.sum(1).max())
        order = (self.valid.long() * t + torch.arange(t, device=self.valid.device)).argsort(1)  # holes first
        idx = order[:, t - w :]
        for layer in layers:
            if not layer.is_initialized:
                continue
            for name in ("keys", "values"):
                x = getattr(layer, name)  # [B, heads, T, dim]
                gather = idx[:, None, :, None].expand(x.shape[0], x.shape[1], w, x.shape[3])
                setattr(layer, name, x.gather(2, gather))
        self.valid, self.kpos = self.valid.gather(1, idx), self.kpos.gather(1, idx)
        self.compactions += 1
        return True


@dataclass
class RaggedRound(BatchRound):
    """One ragged round: as BatchRound, with rows committing different counts (`held` and `thrown` are always 0:
    no row waits for another). `lengths`: tokens each row has emitted after this round."""

    lengths: list[int] = field(default_factory=list)
    cache_width: int = 0  # target cache columns after the round
    holes: float = 0.0  # share of them that are holes


class RaggedBatchDecoder:
    """Speculative decoding of B prompts where every row keeps its own accepted count; `step()` runs one round.

    `gamma_for(active rows) -> γ` sets the draft length per round (None: settings.gamma every round); γ = 0 is a
    plain batched step. `compact_at`: compact a cache once that would free more than this share of its columns
    (1.0: never, 0.0: whenever anything can be freed).
    """

    def __init__(self, pair: ModelPair, prompts, settings: DecodeSettings = DecodeSettings(),
                 gamma_for: Callable[[int], int] | None = None, compact_at: float = COMPACT_AT):
        self.settings = s = _settings(settings)
        self.pair = pair
        self.prompts = list(prompts) if isinstance(prompts, (list, tuple)) else prompts
        self.prompt_ids = encode_batch(pair.tokenizer, prompts, s.chat)
        self.gamma_for = gamma_for
        self.compact_at = compact_at
        tok = pair.tokenizer
        self.pad = int(tok.pad_token_id if tok.pad_token_id is not None else (pair.eos_token_ids or (0,))[0])
        b = len(self.prompt_ids)
        self.out: list[list[int]] = [[] for _ in range(b)]
        self.active = [True] * b
        self.stop: list[StopReason | None] = [None] * b
        self.finish_ms: list[float | None] = [None] * b
        self.gen = make_generator(pair.device, s.seed)
        self.target = RaggedLM(pair.target, pair.vocab_size)
        self.draft = RaggedLM(pair.draft, pair.vocab_size, resolve_draft_vocab(pair, s.draft_vocab),
                              pair.eos_token_ids)
        for p in self.prompt_ids:
            self.draft.keep_in_head(p)
        self.rounds: list[RaggedRound] = []
        self._t0: float | None = None
        self.max_gamma = 0

    @property
    def batch(self) -> int:
        return len(self.prompt_ids)

    @property
    def done(self) -> bool:
        return not any(self.active)

    def text(self, b: int) -> list[int]:
        return self.prompt_ids[b] + self.out[b]

    def run(self) -> BatchResult:
        while not self.done:
            self.step()
        return self.result()

    def result(self) -> BatchResult:
        tok = self.pair.tokenizer
        gamma = self.settings.gamma if self.gamma_for is None else self.max_gamma
        return BatchResult(list(self.prompts), self.prompt_ids, self.out,
                           [tok.decode(o, skip_special_tokens=True) for o in self.out], self.stop,
                           [f if f is not None else 0.0 for f in self.finish_ms], self.rounds, gamma)

    def _gamma(self) -> int:
        n_active = sum(self.active)
        g = self.settings.gamma if self.gamma_for is None else int(self.gamma_for(n_active))
        left = max(self.settings.max_new_tokens - len(o) for o, a in zip(self.out, self.active) if a)
        return max(0, min(g, left - 1))  # guesses past every row's budget would be wasted work

    def _catch_up(self, lm: RaggedLM) -> tuple[torch.Tensor, torch.Tensor]:
        """The block of committed tokens each active row's cache lacks, right-aligned: ids and validity [B, w]."""
        have = lm.counts(self.batch)
        lack = [self.text(b)[have[b]:] if a else [] for b, a in enumerate(self.active)]
        w = max(1, max(len(x) for x in lack))
        ids = [[self.pad] * (w - len(x)) + x for x in lack]
        valid = [[False] * (w - len(x)) + [True] * len(x) for x in lack]
        dev = self.pair.device
        return torch.tensor(ids, device=dev), torch.tensor(valid, device=dev)

    @torch.inference_mode()
    def step(self) -> RaggedRound:
        if self.done:
            raise InvalidInputError("the batch has finished; start a new run")
        cfg = self.settings.sampling
        gamma = self._gamma()
        self.max_gamma = max(self.max_gamma, gamma)
        was_active = list(self.active)
        act = torch.tensor(was_active, device=self.pair.device)[:, None]
        clock = Stopwatch(self.pair.device)
        self._t0 = self._t0 or clock.start
        b_rows = self.batch

        # Draft: the first pass feeds what each row's draft cache lacks; each later pass the previous guesses.
        draft_start = self.draft.width
        if gamma:
            ids, valid = self._catch_up(self.draft)
            guess_start = self.draft.width + ids.shape[1]  # where the fed guesses g_1..g_{γ-1} land
            guesses, qs = draft_chain(self.draft.forward(ids, valid, 1)[:, -1],
                                      lambda prev: self.draft.forward(prev[:, None], act, 1)[:, -1], gamma, cfg,
                                      self.gen)
            draft_tokens, q = torch.stack(guesses, 1), stack_rows(qs, 1)  # [B, γ], [B, γ, V]
        else:
            guess_start = draft_start
            draft_tokens = torch.zeros(b_rows, 0, dtype=torch.long, device=self.pair.device)
            q = distribution(torch.zeros(b_rows, 0, self.pair.vocab_size, device=self.pair.device), cfg)
        draft_ms = clock.lap()

        # Verify: one target pass over every row's pending committed token(s) + its γ guesses.
        ids, valid = self._catch_up(self.target)
        verify_start = self.target.width + ids.shape[1]  # column of the first guess
        fed = torch.cat([ids, draft_tokens], 1)
        fed_valid = torch.cat([valid, act.expand(-1, gamma)], 1)
        p = distribution(self.target.forward(fed, fed_valid, gamma + 1), cfg)  # [B, γ+1, V], the warp of q
        bv = verify_batch(draft_tokens, q, p, self.gen, mode=self.settings.verify)
        n_acc = bv.n_accepted.tolist()
        verify_ms = clock.lap()

        now_ms = (clock.last - self._t0) * 1e3
        emitted: list[list[int]] = []
        d_list, y_list = draft_tokens.tolist(), bv.next_token.tolist()
        for b in range(b_rows):
            got: list[int] = []
            if was_active[b]:
                got, self.stop[b] = cut_at_stop(d_list[b][: n_acc[b]] + [y_list[b]], self.pair.eos_token_ids,
                                                self.settings.max_new_tokens - len(self.out[b]))
                self.out[b].extend(got)
                self.draft.keep_in_head(got)
                if self.stop[b] is not None:
                    self.active[b] = False
                    self.finish_ms[b] = now_ms
            emitted.append(got)
            if not self.active[b]:  # ended now or earlier: its columns are holes from here on
                self.target.finish_row(b)
                self.draft.finish_row(b)
                continue
            # The row's text now ends with `got`; its last token is pending (fed next round). Guesses beyond the
            # ones it committed become holes: in the target all γ guess columns were fed, in the draft γ - 1.
            kept = len(got) - 1
            self.target.drop(b, range(verify_start + kept, verify_start + gamma))
            if gamma:
                self.draft.drop(b, range(guess_start + kept, guess_start + gamma - 1))
        for lm in (self.target, self.draft):
            lm.trim()
            if lm.reclaimable > self.compact_at:
                lm.compact()

        tok = self.pair.tokenizer
        rnd = RaggedRound(
            index=len(self.rounds),
            gamma=gamma,
            active=was_active,
            n_accepted=[n if a and gamma else (0 if a else None) for n, a in zip(n_acc, was_active)],
            slowest=min((n for n, a in zip(n_acc, was_active) if a), default=0),
            committed=emitted,
            pieces=[tok.batch_decode([[t] for t in e]) if e else [] for e in emitted],
            own=[a and len(e) == n + 1 for n, a, e in zip(n_acc, was_active, emitted)],
            held=[0] * b_rows,
            thrown=0,
            draft_ms=draft_ms,
            verify_ms=verify_ms,
            lengths=[len(o) for o in self.out],
            cache_width=self.target.width,
            holes=self.target.holes,
        )
        rnd.round_ms = clock.total()
        rnd.elapsed_ms = (clock.start - self._t0) * 1e3 + rnd.round_ms
        self.rounds.append(rnd)
        return rnd


def ragged_batch_decode(pair: ModelPair, prompts, settings: DecodeSettings = DecodeSettings(), on_round=None,
                        gamma_for: Callable[[int], int] | None = None, compact_at: float = COMPACT_AT) -> BatchResult:
    """Run the ragged loop to the end; `on_round(RaggedRound)` is called after each round."""
    dec = RaggedBatchDecoder(pair, prompts, settings, gamma_for, compact_at)
    while not dec.done:
        rnd = dec.step()
        if on_round is not None:
            on_round(rnd)
    return dec.result()


def batch_decode(pair: ModelPair, prompts, settings: DecodeSettings = DecodeSettings(), schedule: str = "ragged",
                 on_round=None, gamma_for: Callable[[int], int] | None = None) -> BatchResult:
    """The batched loops behind one parameter: "ragged" (every row keeps its own accepted count), "lockstep" (every
    row commits the batch's smallest accepted count + 1; `gamma_for` is not used) or "plain" (target only)."""
    if schedule == "ragged":
        return ragged_batch_decode(pair, prompts, settings, on_round, gamma_for)
    if schedule == "lockstep":
        if gamma_for is not None:
            raise InvalidInputError("the lockstep loop uses a fixed gamma; a gamma schedule needs schedule='ragged'")
        return speculative_batch_decode(pair, prompts, settings, on_round)
    if schedule == "plain":
        return plain_batch_decode(pair, prompts, settings, on_round)
    raise InvalidInputError(f"unknown batch schedule {schedule!r}; choose from {', '.join(SCHEDULES)}")
