"""Batched speculative decoding: B prompts decoded together on the one scorer, under one of two commit rules.

Every row is its own text in ONE KV cache per model (`core.kvcache.CachedLM`, the scorer every loop calls): beside
the cache, `valid` [B, T] says which cached slots hold the row's committed text (in order) and which are holes (a
row's left padding, guesses it discarded, slots fed while it was stopped). A pass feeds a block [B, n] with its
own padding (`CachedLM.score(ids, pad=...)`); position ids count a row's text slots, so a row sees the positions
it would see alone, and the additive mask (`visibility_mask`, n x (T + n) in the model's dtype) lets a query see
its row's text and the fed tokens up to itself, never a hole.

A round: the draft's first pass feeds, per row, whatever committed tokens its draft cache lacks (right-aligned in
one block), then one pass per further guess over all rows; one target pass scores, per row, its pending committed
token(s) plus its γ guesses; `core.verify.verify_batch` -- the one implementation of the rule -- gives each row
its accepted count and next token. Then the commit rule:

- **ragged** (`commit="ragged"`): row b commits its own d[:n_b] + [y_b], cut by the stop rule, as a server
  batching requests does; rows sit at different lengths.
- **lockstep** (`commit="lockstep"`): every active row commits the first k = m + 1 tokens of its own round output,
  m the smallest accepted count over the active rows whose output holds no EOS (a row that ends this round does not
  hold the others back). Each row's stream is still an exact sample of the target: the row commits position i iff
  no EOS came before i, its round reached i (guesses 0..i-1 accepted) and i < k of the OTHER rows -- never a
  function of the token values still to come, so the cut is a stopping time. Its cost is `BatchRound.thrown`:
  tokens batch-1 decoding would have emitted (about 1 + Σ_k α^(kB) tokens per row per round for i.i.d. α).

Either way the target slots of each row's rejected or cut guesses (and the draft slots of guesses it did not keep)
become holes; trailing all-hole slots are cropped, and once compaction would free more than `compact_at` of a
cache, each layer's keys and values are gathered so every row's text is right-aligned again. A row that ends
(EOS or its budget) rides along as padding, seen by no other row. γ can change per round (`gamma_for(active
rows)`, e.g. `specdec.loop.schedule`; ragged only), γ = 0 being a plain batched step: `plain_batch_decode` is the
same loop with γ = 0 every round, the baseline both are measured against.

Every row is an exact sample of its target: a row's round is batch-1 speculative decoding on its own text (q is
exactly the distribution its guess was drawn from, p gets the same warp), and γ is fixed before a round's draws.
`batch_decode(..., schedule="ragged" | "lockstep" | "plain")` is the one entry point. Timing is synchronized on
CUDA so per-pass costs are real on GPUs as well.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from specdec.core.clock import Stopwatch
from specdec.core.errors import InvalidInputError
from specdec.core.events import Totals, draft_fates
from specdec.core.kvcache import CachedLM
from specdec.core.sampling import distribution, make_generator, stack_rows
from specdec.core.settings import DecodeSettings, encode_prompt
from specdec.core.stop import StopReason, cut_at_stop
from specdec.core.verify import verify_batch
from specdec.drafters import resolve_draft_vocab
from specdec.drafters.model import draft_chain
from specdec.models.pair import ModelPair

MAX_BATCH = 16
SCHEDULES = ("lockstep", "ragged", "plain")
COMMITS = ("ragged", "lockstep")

# Compact a cache once compaction would free more than this share of its columns. Measured on the tiny pair (one
# thread, 2 shared and loaded cores, B = 8, γ = 6, T = 1, median of interleaved runs): with long prompts of
# different lengths (96 new tokens) never / 0.5 / 0.25 / every round took 642 / 601 / 555 / 621 ms per run; with
# short prompts (200 new tokens) 912 / 989 / 840 / 1247 ms. A compaction (one gather per layer) cost 0.3-1.0 ms
# against 2.3 ms for one target pass: compacting every round costs more than the narrower cache saves, a quarter
# of the cache freed pays.
COMPACT_AT = 0.25




def encode_batch(tokenizer, prompts, chat: bool = False) -> list[list[int]]:
    """Token ids for each prompt of a batch; refuses a non-list, an empty batch, more than MAX_BATCH prompts and
    any empty prompt (naming which one)."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (list, tuple)):
        raise InvalidInputError(f"a batch must be a list of prompts (strings), got {type(prompts).__name__}")
    if not prompts:
        raise InvalidInputError("the batch is empty; give between 1 and 16 prompts")
    if len(prompts) > MAX_BATCH:
        raise InvalidInputError(f"the batch has {len(prompts)} prompts; the limit is {MAX_BATCH}")
    out = []
    for i, p in enumerate(prompts, 1):
        if not isinstance(p, str):
            raise InvalidInputError(f"prompt {i} of the batch is not text ({type(p).__name__})")
        try:
            out.append(encode_prompt(tokenizer, p, chat))
        except InvalidInputError as exc:
            raise InvalidInputError(f"prompt {i} of the batch: {exc}") from None
    return out



@dataclass
class BatchRound:
    """One round of a batch (γ = 0: a plain step). Per-row lists have B entries."""

    index: int
    gamma: int  # draft tokens per row this round (0 for a plain step)
    active: list[bool]  # rows still emitting when the round started
    n_accepted: list[int | None]  # guesses the rule accepted per row (None: inactive row, or a plain step)
    slowest: int  # m: the smallest accepted count over the active rows that go on (lockstep: each commits m + 1)
    committed: list[list[int]]  # tokens each row emitted this round (empty once a row has stopped)
    pieces: list[list[str]]  # the same tokens as text
    own: list[bool]  # the row's last emitted token is its own repair/bonus (a slowest row), not an accepted guess
    held: list[int]  # per row: tokens of its own round output it could not emit (the lockstep cut; ragged: 0)
    thrown: int  # sum of held: tokens batch-1 would have emitted but lockstep threw away
    draft_ms: float = 0.0
    verify_ms: float = 0.0  # target pass (plain: the whole step)
    round_ms: float = 0.0
    elapsed_ms: float = 0.0  # since the batch started, at the end of this round
    lengths: list[int] = field(default_factory=list)  # tokens each row has emitted after this round
    cache_width: int = 0  # target cache slots after the round
    holes: float = 0.0  # share of them that hold no row's text

    def to_dict(self) -> dict:
        return asdict(self)

    def row_fates(self, b: int) -> list[str]:
        """What became of row b's guesses (`events.draft_fates`): a guess the rule accepted but the lockstep cut or
        the row's EOS kept out of the text is CUT, exactly as in batch-1 statistics."""
        n = self.n_accepted[b]
        if n is None:
            return []
        return draft_fates(self.gamma, n, n if n < self.gamma else None, len(self.committed[b]))


@dataclass
class BatchResult:
    prompts: list[str]
    prompt_ids: list[list[int]]
    ids: list[list[int]]  # generated tokens per row
    texts: list[str]
    stop_reasons: list[str | None]
    latency_ms: list[float]  # per request: time from the batch start until its text was done
    rounds: list[BatchRound] = field(default_factory=list)
    gamma: int = 0  # 0 for the plain baseline

    @property
    def batch(self) -> int:
        return len(self.ids)

    @property
    def tokens(self) -> int:
        return sum(len(x) for x in self.ids)

    @property
    def elapsed_ms(self) -> float:
        return self.rounds[-1].elapsed_ms if self.rounds else 0.0

    @property
    def tok_s(self) -> float:
        """Emitted tokens over all rows per second of wall time (the prompt pass included, as for any request)."""
        return 1e3 * self.tokens / self.elapsed_ms if self.elapsed_ms else 0.0

    def stats(self) -> dict:
        """Totals for the benchmark: tokens per round per row, per-token alpha, thrown tokens, pass costs."""
        spec = self.gamma > 0
        totals = Totals()  # per row-round, by the guesses' fates: the convention of batch-1 statistics
        for r in self.rounds:
            for b, a in enumerate(r.active):
                if a:
                    totals.count(r.row_fates(b), len(r.committed[b]))
        # Round one also runs the prompts; later rounds with the full gamma give the steady per-pass costs (short
        # runs may have none: their later rounds draft fewer guesses near the budget, so those stand in).
        steady = [r for r in self.rounds[1:] if r.gamma == self.gamma] or self.rounds[1:]
        g_steady = _median([r.gamma for r in steady]) if spec else 0
        return {
            "batch": self.batch,
            "gamma": self.gamma,
            "tokens": self.tokens,
            "elapsed_ms": self.elapsed_ms,
            "tok_s": self.tok_s,
            "rounds": len(self.rounds),
            "tokens_per_round_per_row": totals.generated / totals.rounds if totals.rounds else None,
            "alpha": totals.kept / totals.tested if totals.tested else None,
            "kept": totals.kept,  # guesses accepted and committed (the bench's JSON calls it "accepted")
            "tested": totals.tested,
            "thrown_per_round": sum(r.thrown for r in self.rounds) / len(self.rounds) if spec and self.rounds else None,
            "latency_ms": list(self.latency_ms),
            "verify_ms": _median([r.verify_ms for r in steady]),
            "verify_tokens": self.batch * (g_steady + 1) if spec and steady else None,  # tokens each pass scores
            "draft_pass_ms": _median([r.draft_ms / r.gamma for r in steady if r.gamma]) if spec else None,
            "step_ms": None if spec else _median([r.round_ms for r in self.rounds[1:]]),
        }


def _median(xs: list[float]) -> float | None:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None



def _settings(settings: DecodeSettings) -> DecodeSettings:
    s = settings.validate()
    if s.gamma_policy != "fixed":
        raise InvalidInputError("batched decoding uses a fixed gamma; adaptive gamma policies are batch-1 only")
    if s.drafter != "model":
        raise InvalidInputError(f"batched decoding drafts with the draft model only, not {s.drafter!r}")
    return s



class BatchDecoder:
    """Speculative decoding of B prompts on the one scorer (`core.kvcache.CachedLM`); `step()` runs one round.

    `commit`: "ragged" (every row commits its own accepted guesses + its repair/bonus) or "lockstep" (every row
    commits the count of the batch's slowest going-on row; module docstring). `gamma_for(active rows) -> γ` sets the
    draft length per round (None: settings.gamma every round; ragged only); γ = 0 is a plain batched step.
    `compact_at`: compact a cache once that would free more than this share of its slots (1.0: never, 0.0:
    whenever anything can be freed).
    """

    def __init__(self, pair: ModelPair, prompts, settings: DecodeSettings = DecodeSettings(),
                 gamma_for: Callable[[int], int] | None = None, compact_at: float = COMPACT_AT,
                 commit: str = "ragged"):
        if commit not in COMMITS:
            raise InvalidInputError(f"unknown commit rule {commit!r}; choose from {', '.join(COMMITS)}")
        if commit == "lockstep" and gamma_for is not None:
            raise InvalidInputError("the lockstep loop uses a fixed gamma; a gamma schedule needs schedule='ragged'")
        self.commit = commit
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
        self.target = CachedLM(pair.target, pair.vocab_size)
        self.draft = CachedLM(pair.draft, pair.vocab_size, resolve_draft_vocab(pair, s.draft_vocab),
                              pair.eos_token_ids)
        for p in self.prompt_ids:
            self.draft.keep_in_head(p)
        self.rounds: list[BatchRound] = []
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

    def _catch_up(self, lm: CachedLM) -> tuple[torch.Tensor, torch.Tensor]:
        """The block of committed tokens each active row's cache lacks, right-aligned: ids and validity [B, w]."""
        have = lm.counts(self.batch)
        lack = [self.text(b)[have[b]:] if a else [] for b, a in enumerate(self.active)]
        w = max(1, max(len(x) for x in lack))
        ids = [[self.pad] * (w - len(x)) + x for x in lack]
        valid = [[False] * (w - len(x)) + [True] * len(x) for x in lack]
        dev = self.pair.device
        return torch.tensor(ids, device=dev), torch.tensor(valid, device=dev)

    def _lockstep_cut(self, to_eos: list[tuple[list[int], StopReason | None]], n_acc: list[int],
                      active: list[bool]) -> tuple[int, int]:
        """The lockstep commit rule: (k, m), every active row committing the first k = m + 1 tokens of its round
        output, m the smallest accepted count over the active rows whose output holds no EOS (a row that ends this
        round does not hold the others back; when every row ends, the longest output sets k). to_eos: each row's
        round output cut at its EOS (`cut_at_stop` without a budget)."""
        going_on = [n for n, (_, why), a in zip(n_acc, to_eos, active) if a and why is None]
        m = min(going_on) if going_on else max(len(o) for (o, _), a in zip(to_eos, active) if a) - 1
        left = min(self.settings.max_new_tokens - len(o) for o, a in zip(self.out, active) if a)
        return min(m + 1, left), m

    @torch.inference_mode()
    def step(self) -> BatchRound:
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
            guesses, qs = draft_chain(self.draft.score(ids, pad=~valid, n_logits=1)[:, -1],
                                      lambda prev: self.draft.score(prev[:, None], pad=~act, n_logits=1)[:, -1],
                                      gamma, cfg, self.gen)
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
        p = distribution(self.target.score(fed, pad=~fed_valid, n_logits=gamma + 1), cfg)  # [B, γ+1, V], q's warp
        bv = verify_batch(draft_tokens, q, p, self.gen, mode=self.settings.verify)
        n_acc = bv.n_accepted.tolist()
        verify_ms = clock.lap()

        now_ms = (clock.last - self._t0) * 1e3
        emitted: list[list[int]] = []
        d_list, y_list = draft_tokens.tolist(), bv.next_token.tolist()
        outputs = [d[:n] + [y] for d, n, y in zip(d_list, n_acc, y_list)]  # each row's own round output
        k = slowest = None
        if self.commit == "lockstep":
            to_eos = [cut_at_stop(o, self.pair.eos_token_ids) for o in outputs]
            k, slowest = self._lockstep_cut(to_eos, n_acc, was_active)
        held = [0] * b_rows
        for b in range(b_rows):
            got: list[int] = []
            if was_active[b]:
                budget = self.settings.max_new_tokens - len(self.out[b])
                got, self.stop[b] = cut_at_stop(outputs[b][:k], self.pair.eos_token_ids, budget)
                if k is not None:  # what the row would have emitted alone, less what the cut let through
                    held[b] = min(len(to_eos[b][0]), budget) - len(got)
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
        return self._close_round(clock, (self.target, self.draft),
                                 gamma=gamma, active=was_active,
                                 n_accepted=[n if a and gamma else (0 if a else None) for n, a in zip(n_acc, was_active)],
                                 slowest=slowest if slowest is not None else min(
                                     (n for n, a in zip(n_acc, was_active) if a), default=0),
                                 committed=emitted,
                                 own=[a and len(e) == n + 1 for n, a, e in zip(n_acc, was_active, emitted)],
                                 held=held, thrown=sum(held), draft_ms=draft_ms, verify_ms=verify_ms)

    def _close_round(self, clock: Stopwatch, caches, **fields) -> BatchRound:
        """End a round of any batch loop: trim the caches (and compact those past compact_at), then record the
        BatchRound from the loop's own `fields` plus what every loop reports alike (index, pieces, lengths, cache
        width and holes, times)."""
        for lm in caches:
            lm.trim()
            if lm.reclaimable > self.compact_at:
                lm.compact()
        tok = self.pair.tokenizer
        rnd = BatchRound(index=len(self.rounds),
                         pieces=[tok.batch_decode([[t] for t in e]) if e else [] for e in fields["committed"]],
                         lengths=[len(o) for o in self.out], cache_width=self.target.width,
                         holes=self.target.holes, **fields)
        rnd.round_ms = clock.total()
        rnd.elapsed_ms = (clock.start - self._t0) * 1e3 + rnd.round_ms
        self.rounds.append(rnd)
        return rnd


def ragged_batch_decode(pair: ModelPair, prompts, settings: DecodeSettings = DecodeSettings(), on_round=None,
                        gamma_for: Callable[[int], int] | None = None, compact_at: float = COMPACT_AT) -> BatchResult:
    """Run the loop to the end, every row committing its own count; `on_round(BatchRound)` after each round."""
    return _run(BatchDecoder(pair, prompts, settings, gamma_for, compact_at), on_round)


def speculative_batch_decode(pair: ModelPair, prompts, settings: DecodeSettings = DecodeSettings(),
                             on_round=None) -> BatchResult:
    """Run the loop to the end in lockstep (every row commits the slowest going-on row's count)."""
    return _run(BatchDecoder(pair, prompts, settings, commit="lockstep"), on_round)


def plain_batch_decode(pair: ModelPair, prompts, settings: DecodeSettings = DecodeSettings(),
                       on_step=None) -> BatchResult:
    """Target-only decoding of B prompts: the same loop, padding, masks, warps and caches with γ = 0 every round
    (one token per row per step), the baseline the speculative rules are measured against."""
    return _run(BatchDecoder(pair, prompts, settings, gamma_for=lambda active: 0), on_step)


def _run(dec: BatchDecoder, on_round) -> BatchResult:
    while not dec.done:
        rnd = dec.step()
        if on_round is not None:
            on_round(rnd)
    return dec.result()


def batch_decode(pair: ModelPair, prompts, settings: DecodeSettings = DecodeSettings(), schedule: str = "ragged",
                 on_round=None, gamma_for: Callable[[int], int] | None = None) -> BatchResult:
    """The batched loop behind one parameter: "ragged" (every row keeps its own accepted count), "lockstep" (every
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
