"""Batched speculative decoding: B prompts decoded together, and the plain batched baseline with the same padding.

Design (lockstep rows, rectangular caches):

- Prompts are left-padded to one length; an attention mask marks the pads and position ids count only real
  tokens (cumsum of the mask - 1), as transformers' own `generate` does for left padding. Each model keeps ONE
  DynamicCache of shape [B, heads, T, dim] for all rows.
- A round makes one draft forward pass per draft step for all rows (the first one also feeds whatever committed
  tokens the draft cache lacks), then ONE target forward pass over the last committed token plus the γ guesses of
  every row (B×(γ+1) tokens). The acceptance rule is applied per row by `specdec.core.verify.verify_batch`, the only
  implementation of the rule in the project; q is exactly the warped draft distribution each guess was sampled
  from and p gets the same warp.
- Rows keep different numbers of guesses. Every active row then commits k = m + 1 tokens, where m is the smallest
  accepted count over the active rows whose round output does not end the text: row b emits the first k tokens of
  its own round output (its accepted guesses plus its own repair/bonus token when it is a slowest row, else k
  accepted guesses), cut after its EOS. A row whose output (accepted guesses + repair/bonus) holds an EOS ends
  this round whatever k is, so it does not hold the others back. Each row's emitted stream is still an exact
  sample of the target: the row commits position i iff no EOS came before i, its round reached i (guesses 0..i-1
  accepted) and i < k of the OTHER rows -- never a function of the token values still to come. So the cut is a
  stopping time and the stream follows p token by token.
- Because every row advances by the same count, both caches stay rectangular and are cut back together with
  `DynamicCache.crop` (no ragged caches, no per-row bookkeeping on the models).
- The cost of this design: tokens that batch-1 decoding would have emitted but lockstep throws away, i.e.
  Σ over active rows of what it could have committed alone minus what it committed (`BatchRound.thrown`). A batch moves at the pace
  of its least-accepted row, and with more rows the minimum shrinks (about 1 + Σ_k α^(kB) tokens per row per
  round for i.i.d. acceptances α).
- A row that reaches EOS or the token budget stops emitting; it keeps riding along as padding (mask 0, output
  ignored, excluded from the minimum) so the tensors stay rectangular.

Timing is synchronized on CUDA (`torch.cuda.synchronize`) so per-pass costs are real on GPUs as well.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from specdec.core.clock import Stopwatch
from specdec.core.errors import InvalidInputError
from specdec.core.events import Totals, draft_fates
from specdec.core.kvcache import ReducedHead, check_rollback, rollback_cache
from specdec.core.sampling import distribution, draw, make_generator, stack_rows
from specdec.core.settings import DecodeSettings, encode_prompt
from specdec.core.stop import StopReason, cut_at_stop
from specdec.core.verify import verify_batch
from specdec.drafters import resolve_draft_vocab
from specdec.drafters.model import draft_chain
from specdec.models.pair import ModelPair

MAX_BATCH = 16


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


class BatchLM:
    """A causal LM over B left-padded rows with one rectangular KV cache.

    `head_vocab` > 0 gives the draft the same `ReducedHead` as batch-1 decoding (ids below it, EOS and every token
    of any row's text); q is then exactly the distribution over that subset that the draft samples from.
    """

    def __init__(self, model: torch.nn.Module, vocab_size: int, head_vocab: int = 0, always_keep: tuple[int, ...] = ()):
        self.model = model
        self.vocab_size = vocab_size
        check_rollback(model.config)
        self.cache = rollback_cache()  # rows are cropped back after every round (kvcache.rollback_cache)
        self.length = 0  # columns held in the cache (the same for every row)
        self.head = ReducedHead(model, vocab_size, head_vocab, always_keep)

    def keep_in_head(self, ids) -> None:
        self.head.keep(ids)

    def crop(self, n: int) -> None:
        """Keep the first n cached columns of every row."""
        if n < self.length:
            self.cache.crop(n - self.length)  # transformers 5: a negative count of columns to drop
            self.length = n

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, mask: torch.Tensor, n_logits: int) -> torch.Tensor:
        """Feed ids [B, n] whose full attention mask (cached columns + these) is mask [B, length + n]; return
        logits [B, n_logits, V] for the last n_logits fed columns."""
        n = ids.shape[1]
        if mask.shape[1] != self.length + n:
            raise ValueError(f"mask covers {mask.shape[1]} columns, cache {self.length} + fed {n}")
        # Positions count real tokens only, so a left-padded row sees the same positions as it would alone.
        pos = (mask.cumsum(-1) - 1).clamp_min(0)[:, -n:]
        if not self.head.cut:
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=self.cache, use_cache=True,
                             logits_to_keep=n_logits)
            self.length += n
            return out.logits[:, -n_logits:, : self.vocab_size]
        hidden = self.model.base_model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=self.cache,
                                       use_cache=True).last_hidden_state[:, -n_logits:]
        self.length += n
        return self.head.project(hidden)


@dataclass
class BatchRound:
    """One lockstep round (speculative) or one step (plain) of a batch. Per-row lists have B entries."""

    index: int
    gamma: int  # draft tokens per row this round (0 for a plain step)
    active: list[bool]  # rows still emitting when the round started
    n_accepted: list[int | None]  # guesses the rule accepted per row (None: inactive row, or a plain step)
    slowest: int  # m: the smallest accepted count over the active rows that go on (every such row commits m + 1)
    committed: list[list[int]]  # tokens each row emitted this round (empty once a row has stopped)
    pieces: list[list[str]]  # the same tokens as text
    own: list[bool]  # the row's last emitted token is its own repair/bonus (a slowest row), not an accepted guess
    held: list[int]  # per row: tokens of its own round output it could not emit (the lockstep cut)
    thrown: int  # sum of held: tokens batch-1 would have emitted but lockstep threw away
    draft_ms: float = 0.0
    verify_ms: float = 0.0  # target pass (plain: the whole step)
    round_ms: float = 0.0
    elapsed_ms: float = 0.0  # since the batch started, at the end of this round

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


class _Rows:
    """The committed text of B left-padded rows as one rectangular tensor plus its attention mask; who is active."""

    def __init__(self, pair: ModelPair, prompt_ids: list[list[int]], max_new_tokens: int):
        self.pair = pair
        self.prompt_ids = prompt_ids
        self.max_new = max_new_tokens
        tok = pair.tokenizer
        self.pad = int(tok.pad_token_id if tok.pad_token_id is not None else (pair.eos_token_ids or (0,))[0])
        width = max(len(p) for p in prompt_ids)
        dev = pair.device
        self.tokens = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompt_ids], device=dev)
        self.mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], device=dev)
        b = len(prompt_ids)
        self.out: list[list[int]] = [[] for _ in range(b)]
        self.active = [True] * b
        self.stop: list[StopReason | None] = [None] * b
        self.finish_ms: list[float | None] = [None] * b

    @property
    def width(self) -> int:
        return self.tokens.shape[1]

    @property
    def done(self) -> bool:
        return not any(self.active)

    @property
    def remaining(self) -> int:
        """Tokens left in the budget; every active row has emitted the same count (lockstep)."""
        return self.max_new - max(len(o) for o, a in zip(self.out, self.active) if a)

    def active_col(self) -> torch.Tensor:
        """Mask column for fed guesses: 1 for active rows, 0 for rows riding along as padding."""
        return torch.tensor(self.active, dtype=self.mask.dtype, device=self.mask.device)[:, None]

    def commit(self, chunks: list[list[int]], k: int, now_ms: float) -> list[list[int]]:
        """Append k columns: row b's chunk cut by the stop rule (EOS, its token budget); pads elsewhere.
        Returns what each row emitted."""
        emitted, cols, mcols = [], [], []
        for b, chunk in enumerate(chunks):
            got: list[int] = []
            if self.active[b]:
                got, self.stop[b] = cut_at_stop(chunk[:k], self.pair.eos_token_ids, self.max_new - len(self.out[b]))
                self.out[b].extend(got)
                if self.stop[b] is not None:
                    self.active[b] = False
                    self.finish_ms[b] = now_ms
            emitted.append(got)
            cols.append(got + [self.pad] * (k - len(got)))
            mcols.append([1] * len(got) + [0] * (k - len(got)))
        dev = self.tokens.device
        self.tokens = torch.cat([self.tokens, torch.tensor(cols, device=dev)], 1)
        self.mask = torch.cat([self.mask, torch.tensor(mcols, dtype=self.mask.dtype, device=dev)], 1)
        return emitted

    def result(self, prompts, rounds, gamma) -> BatchResult:
        tok = self.pair.tokenizer
        return BatchResult(list(prompts), self.prompt_ids, self.out,
                           [tok.decode(o, skip_special_tokens=True) for o in self.out], self.stop,
                           [f if f is not None else 0.0 for f in self.finish_ms], rounds, gamma)


def _settings(settings: DecodeSettings) -> DecodeSettings:
    s = settings.validate()
    if s.gamma_policy != "fixed":
        raise InvalidInputError("batched decoding uses a fixed gamma; adaptive gamma policies are batch-1 only")
    if s.drafter != "model":
        raise InvalidInputError(f"batched decoding drafts with the draft model only, not {s.drafter!r}")
    return s


class BatchedSpeculativeDecoder:
    """Speculative decoding of B prompts in lockstep (see the module docstring); `step()` runs one round."""

    def __init__(self, pair: ModelPair, prompts, settings: DecodeSettings = DecodeSettings()):
        self.settings = s = _settings(settings)
        self.pair = pair
        self.prompts = list(prompts) if isinstance(prompts, (list, tuple)) else prompts
        self.rows = _Rows(pair, encode_batch(pair.tokenizer, prompts, s.chat), s.max_new_tokens)
        self.gen = make_generator(pair.device, s.seed)
        self.target = BatchLM(pair.target, pair.vocab_size)
        self.draft = BatchLM(pair.draft, pair.vocab_size, resolve_draft_vocab(pair, s.draft_vocab), pair.eos_token_ids)
        for p in self.rows.prompt_ids:
            self.draft.keep_in_head(p)
        self.rounds: list[BatchRound] = []
        self._t0: float | None = None

    @property
    def done(self) -> bool:
        return self.rows.done

    def run(self) -> BatchResult:
        while not self.done:
            self.step()
        return self.result()

    def result(self) -> BatchResult:
        return self.rows.result(self.prompts, self.rounds, self.settings.gamma)

    @torch.inference_mode()
    def step(self) -> BatchRound:
        if self.done:
            raise InvalidInputError("the batch has finished; start a new run")
        rows, cfg = self.rows, self.settings.sampling
        remaining = rows.remaining
        gamma = max(1, min(self.settings.gamma, remaining - 1))  # guesses past the budget would be wasted work
        width = rows.width
        act = rows.active_col()
        was_active = list(rows.active)
        clock = Stopwatch(self.pair.device)
        self._t0 = self._t0 or clock.start

        # Draft: the first pass feeds the committed columns the draft cache lacks (the prompts in round one, two
        # columns after an all-accepted round); each later pass feeds the previous guess of every row.
        mask = rows.mask

        def feed(prev: torch.Tensor) -> torch.Tensor:
            nonlocal mask
            mask = torch.cat([mask, act], 1)
            return self.draft.forward(prev[:, None], mask, 1)[:, -1]

        guesses, qs = draft_chain(self.draft.forward(rows.tokens[:, self.draft.length :], mask, 1)[:, -1], feed,
                                  gamma, cfg, self.gen)  # each q [B, V]: exactly what its guesses were drawn from
        draft_tokens, q = torch.stack(guesses, 1), stack_rows(qs, 1)  # [B, g], [B, g, V]
        draft_ms = clock.lap()

        # Verify: one target pass over (last committed column + g guesses) for every row.
        vmask = torch.cat([rows.mask, act.expand(-1, gamma)], 1)
        fed = torch.cat([rows.tokens[:, self.target.length :], draft_tokens], 1)
        p = distribution(self.target.forward(fed, vmask, gamma + 1), cfg)  # [B, g+1, V], same warp as q
        bv = verify_batch(draft_tokens, q, p, self.gen, mode=self.settings.verify)
        n_acc = bv.n_accepted.tolist()
        verify_ms = clock.lap()

        # Row b's round output is its accepted guesses + its repair/bonus token, ended by its own EOS if it has one.
        outputs = [cut_at_stop(d[:n] + [y], self.pair.eos_token_ids)
                   for d, n, y in zip(draft_tokens.tolist(), n_acc, bv.next_token.tolist())]
        going_on = [n for n, (_, why), a in zip(n_acc, outputs, was_active) if a and why is None]
        m = min(going_on) if going_on else max(len(o) for (o, _), a in zip(outputs, was_active) if a) - 1
        k = min(m + 1, remaining)  # every row that goes on commits k tokens
        emitted = rows.commit([o for o, _ in outputs], k, (clock.last - self._t0) * 1e3)
        held = [min(len(o), remaining) - len(e) if a else 0 for (o, _), e, a in zip(outputs, emitted, was_active)]
        # Keep what every row still agrees with: all columns but the newest (its last token is not fed yet);
        # the draft never fed its last guess, so after an all-kept round it lacks one column (caught up next round).
        # A row that ended this round rides along as padding from now on; its stale columns are never read.
        self.target.crop(width + k - 1)
        self.draft.crop(min(width + k - 1, self.draft.length))
        for e in emitted:
            self.draft.keep_in_head(e)

        tok = self.pair.tokenizer
        rnd = BatchRound(
            index=len(self.rounds),
            gamma=gamma,
            active=was_active,
            n_accepted=[n if a else None for n, a in zip(n_acc, was_active)],
            slowest=m,
            committed=emitted,
            pieces=[tok.batch_decode([[t] for t in e]) if e else [] for e in emitted],
            own=[a and len(e) == n + 1 for n, a, e in zip(n_acc, was_active, emitted)],
            held=held,
            thrown=sum(held),
            draft_ms=draft_ms,
            verify_ms=verify_ms,
        )
        rnd.round_ms = clock.total()
        rnd.elapsed_ms = (clock.start - self._t0) * 1e3 + rnd.round_ms
        self.rounds.append(rnd)
        return rnd


@torch.inference_mode()
def plain_batch_decode(pair: ModelPair, prompts, settings: DecodeSettings = DecodeSettings(),
                       on_step=None) -> BatchResult:
    """Target-only decoding of B prompts with the same left padding, masks, warps and caching, one token per row per
    step: the baseline the batched speculative loop is measured against. `on_step(BatchRound)` is called per step."""
    s = _settings(settings)
    rows = _Rows(pair, encode_batch(pair.tokenizer, prompts, s.chat), s.max_new_tokens)
    lm = BatchLM(pair.target, pair.vocab_size)
    gen = make_generator(pair.device, s.seed)
    tok = pair.tokenizer
    rounds: list[BatchRound] = []
    clock = Stopwatch(pair.device)
    while not rows.done:
        was_active = list(rows.active)
        y = draw(lm.forward(rows.tokens[:, lm.length :], rows.mask, 1)[:, -1], s.sampling, gen)[0].tolist()
        step_ms = clock.lap()
        elapsed_ms = (clock.last - clock.start) * 1e3
        emitted = rows.commit([[t] for t in y], 1, elapsed_ms)
        rnd = BatchRound(len(rounds), 0, was_active, [None] * len(y), 0, emitted,
                         [tok.batch_decode([[t] for t in e]) if e else [] for e in emitted],
                         [bool(e) for e in emitted], [0] * len(y), 0, 0.0, step_ms, step_ms, elapsed_ms)
        rounds.append(rnd)
        if on_step is not None:
            on_step(rnd)
    return rows.result(prompts, rounds, 0)


def speculative_batch_decode(pair: ModelPair, prompts, settings: DecodeSettings = DecodeSettings(),
                             on_round=None) -> BatchResult:
    """Run the batched speculative loop to the end; `on_round(BatchRound)` is called after each round."""
    dec = BatchedSpeculativeDecoder(pair, prompts, settings)
    while not dec.done:
        rnd = dec.step()
        if on_round is not None:
            on_round(rnd)
    return dec.result()
