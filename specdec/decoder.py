"""The speculative decoding loop and the plain target-only baseline it is measured against.

One round: the drafter proposes gamma tokens with their q rows; the target scores the last committed token plus
all gamma guesses in one forward pass (gamma+1 rows of p); `verify` keeps a prefix and emits one repaired or bonus
token; both KV caches are cropped back to the committed text. Each round becomes a `Round` event.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Iterator

import torch

from .drafters import Drafter, make_drafter
from .errors import InvalidInputError
from .events import Round, TokenProb, Totals
from .kvcache import PLAIN_HEAD_TYPES, CachedLM
from .metrics import StepCosts, loop_cost_ratio, predicted_speedup
from .models import ModelPair
from .record import RunRecord
from .sampling import OneHot, Probs, distribution, draw, prob_at
from .settings import (DRAFTERS, GAMMA_POLICIES, MAX_GAMMA, MAX_NEW_TOKENS, MAX_PROMPT_TOKENS,  # noqa: F401
                       TOP_DISPLAY, DecodeSettings)
from .verify import verify

AUTO_DRAFT_VOCAB = 65536  # draft head size when draft_vocab is None and the vocabulary is at least twice this


def encode_prompt(tokenizer, prompt, chat: bool = False) -> list[int]:
    """Token ids for a plain-text prompt, or for chat messages (a list of {role, content}) via the chat template."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise InvalidInputError("the prompt is empty; type some text to continue")
        if not chat:
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        else:
            prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, str):
        if not isinstance(prompt, list) or not prompt or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in prompt
        ):
            raise InvalidInputError("chat prompts must be a non-empty list of {'role': ..., 'content': ...} messages")
        if not any(m["content"].strip() for m in prompt):
            raise InvalidInputError("the prompt is empty; type some text to continue")
        if not getattr(tokenizer, "chat_template", None):
            raise InvalidInputError("this model's tokenizer has no chat template; turn chat mode off")
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
    ids = [int(i) for i in ids]
    if not ids:
        raise InvalidInputError("the prompt produced no tokens")
    if len(ids) > MAX_PROMPT_TOKENS:
        raise InvalidInputError(f"the prompt is {len(ids)} tokens long; the limit is {MAX_PROMPT_TOKENS}")
    return ids


def resolve_draft_vocab(pair: ModelPair, draft_vocab: int | None, model: torch.nn.Module | None = None) -> int:
    """The head size for a drafting model (default: the pair's draft): an explicit draft_vocab wins; None picks
    AUTO_DRAFT_VOCAB where it saves a large share of the drafter's projection -- a vocabulary at least twice as
    big, a plain lm_head architecture, and a CPU (on an H200 the sliced head measured slower than the full one,
    22.6 vs 19.4 ms per draft pass, docs/gpu-check-h200.json) -- else the full vocabulary."""
    if draft_vocab is not None:
        return draft_vocab
    model = pair.draft if model is None else model
    big = pair.vocab_size >= 2 * AUTO_DRAFT_VOCAB
    fits = big and model.config.model_type in PLAIN_HEAD_TYPES and pair.device.type == "cpu"
    return AUTO_DRAFT_VOCAB if fits else 0


def make_generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so a timer read after it measures the work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


TOPK_BLOCK = 128  # ids per block in top_rows' first pass


def top_rows(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, ids) of the k largest entries of each row of x [n, V], largest first: torch.topk's answer, faster.

    The k largest values all lie in the k blocks (of TOPK_BLOCK ids) with the largest maxima -- any other block
    has k larger values elsewhere -- so one vectorized max per block and a topk over k blocks' entries replace a
    topk over the whole row, which torch walks in ~0.5 ms per 152k-token row on a CPU. Equal values may come
    out in another order than torch.topk's.
    """
    n, vocab = x.shape
    blocks = vocab // TOPK_BLOCK
    k = min(k, vocab)
    if blocks <= k:
        return torch.topk(x, k, dim=-1)
    block_max = x[:, : blocks * TOPK_BLOCK].reshape(n, blocks, TOPK_BLOCK).amax(-1)
    best = torch.topk(block_max, k, dim=-1).indices  # [n, k]
    ids = (best.unsqueeze(-1) * TOPK_BLOCK + torch.arange(TOPK_BLOCK, device=x.device)).reshape(n, -1)
    tail = torch.arange(blocks * TOPK_BLOCK, vocab, device=x.device).expand(n, -1)  # the ids past the last block
    ids = torch.cat([ids, tail], -1)
    vals, pick = torch.topk(x.gather(-1, ids), k, dim=-1)
    return vals, ids.gather(-1, pick)


def _top(probs: Probs, tokenizer, k: int = TOP_DISPLAY) -> list[list[TokenProb]]:
    """Top-k (id, piece, prob) per row of probs [n, V], with one top_rows call and one batch decode."""
    if isinstance(probs, OneHot):  # one token with probability 1 per row (none for an all-zero row)
        ids = [[i] if i >= 0 else [] for i in probs.ids.tolist()]
        ps = [[1.0] * len(row) for row in ids]
    else:
        vals, idx = top_rows(probs.float(), k)
        ids, ps = idx.tolist(), vals.tolist()
    pieces = tokenizer.batch_decode([[i] for row in ids for i in row])
    out, j = [], 0
    for row_ids, row_ps in zip(ids, ps):
        out.append([TokenProb(i, pieces[j + n], p) for n, (i, p) in enumerate(zip(row_ids, row_ps)) if p > 0])
        j += len(row_ids)
    return out


class SpeculativeDecoder:
    """Stateful decoder: `step()` runs exactly one round; iterating runs rounds until EOS or max_new_tokens."""

    def __init__(self, pair: ModelPair, prompt, settings: DecodeSettings = DecodeSettings(), drafter: Drafter | None = None,
                 gamma_schedule: list[int] | None = None, top_k: int = TOP_DISPLAY):
        """`gamma_schedule` forces each round's gamma (e.g. the recorded gammas of a trace, to reproduce a run whose
        policy followed wall-clock timings); `top_k` is how many candidates per position each Round carries for
        display -- 0 skips building them (a top-k and a decode per position), for consumers that only want text
        and statistics (the benchmark's timed loop, the CLI)."""
        self.settings = settings.validate()
        self.pair = pair
        self.tok = pair.tokenizer
        self.prompt = prompt
        self.prompt_ids = encode_prompt(self.tok, prompt, settings.chat)
        self.ids = list(self.prompt_ids)
        self.gen = make_generator(pair.device, settings.seed)
        self.drafter = drafter or make_drafter(pair, settings, self.prompt_ids)
        self.target = CachedLM(pair.target, pair.vocab_size)
        self.gamma = settings.gamma
        self.gamma_schedule = list(gamma_schedule) if gamma_schedule is not None else None
        self.top_k = top_k
        self.totals = Totals()
        self.rounds: list[Round] = []
        self.stop_reason: str | None = None
        self._t_start: float | None = None
        # Decayed per-token acceptance counts and draft/target cost ratio for gamma_policy="expected" (priors:
        # alpha 0.7, c 0.5, worth a few rounds of evidence).
        self._kept, self._tested, self._c = 2.8, 4.0, 0.5

    # -- state -----------------------------------------------------------------------------------------------
    @property
    def generated_ids(self) -> list[int]:
        return self.ids[len(self.prompt_ids) :]

    @property
    def text(self) -> str:
        return self.tok.decode(self.generated_ids, skip_special_tokens=True)

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    def __iter__(self) -> Iterator[Round]:
        while not self.done:
            yield self.step()

    # -- one round -------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> Round:
        if self.done:
            raise InvalidInputError("generation has finished; start a new run")
        s, dev, cfg = self.settings, self.pair.device, self.settings.sampling
        # No separate prefill: round one feeds the prompt together with its first draft step and its verification
        # (one forward pass each, as for any round), and later rounds feed only tokens the caches lack.
        remaining = s.max_new_tokens - len(self.generated_ids)
        asked = self.gamma
        if self.gamma_schedule is not None and len(self.rounds) < len(self.gamma_schedule):
            asked = self.gamma_schedule[len(self.rounds)]
        # Drafting past the token budget is wasted work: at most remaining-1 guesses plus the repair/bonus.
        gamma = max(1, min(asked, remaining - 1))
        synchronize(dev)
        t0 = time.perf_counter()
        if self._t_start is None:
            self._t_start = t0
        draft = self.drafter.propose(self.ids, gamma, cfg, self.gen)
        synchronize(dev)
        t1 = time.perf_counter()
        g = int(draft.tokens.shape[0])
        p = distribution(self.target.logits_after(self.ids, draft.tokens.tolist(), g + 1), cfg)
        verdict = verify(draft.tokens, draft.probs, p, self.gen)
        synchronize(dev)
        t2 = time.perf_counter()

        committed = verdict.tokens[:remaining]
        for n, t in enumerate(committed):
            if t in self.pair.eos_token_ids:
                committed = committed[: n + 1]
                self.stop_reason = "eos"
                break
        self.ids.extend(committed)
        if self.stop_reason is None and len(self.generated_ids) >= s.max_new_tokens:
            self.stop_reason = "max_new_tokens"
        self.target.sync(self.ids)
        self.drafter.feedback(self.ids, verdict.n_accepted, g)
        self._adapt_gamma(verdict, g, (t1 - t0) * 1e3, (t2 - t1) * 1e3)

        tt = self.totals
        tt.rounds += 1
        tt.generated = len(self.generated_ids)
        tt.target_passes += 1
        tt.draft_ms += (t1 - t0) * 1e3
        tt.verify_ms += (t2 - t1) * 1e3
        rnd = self._event(draft, p, verdict, committed, (t1 - t0) * 1e3, (t2 - t1) * 1e3)
        tt.drafted += g
        tt.accepted += rnd.kept  # statistics count what was tested and committed (Round.fates)
        tt.tested += rnd.tested
        rnd.totals = replace(tt)
        t3 = time.perf_counter()
        rnd.round_ms = (t3 - t0) * 1e3
        tt.elapsed_ms = rnd.totals.elapsed_ms = (t3 - self._t_start) * 1e3
        self.rounds.append(rnd)
        return rnd

    def _adapt_gamma(self, verdict, drafted: int, draft_ms: float, verify_ms: float) -> None:
        policy, n_acc = self.settings.gamma_policy, verdict.n_accepted
        if policy == "heuristic":
            self.gamma = min(MAX_GAMMA, self.gamma + 2) if n_acc == drafted else max(1, self.gamma - 1)
        elif policy == "expected":
            decay = 0.8  # recent rounds count most: acceptance shifts with the content being written
            self._kept = decay * self._kept + n_acc
            self._tested = decay * self._tested + n_acc + (verdict.rejected_at is not None)
            c_round = loop_cost_ratio(draft_ms, drafted, verify_ms, 1)
            if self.totals.rounds > 0 and c_round is not None:  # round one also ran the prompt: its timing says little
                self._c = 0.7 * self._c + 0.3 * c_round
            alpha = min(0.99, max(0.01, self._kept / self._tested))
            self.gamma = max(range(1, MAX_GAMMA + 1), key=lambda g: predicted_speedup(alpha, g, self._c))

    def _event(self, draft, p, verdict, committed, draft_ms, verify_ms) -> Round:
        tok = self.tok
        g = int(draft.tokens.shape[0])
        ids = draft.tokens.tolist()
        emitted = verdict.tokens[-1]
        k = self.top_k
        top = (lambda probs: _top(probs, tok, k)) if k else (lambda probs: [[] for _ in range(probs.shape[0])])
        residual = top(verdict.residual[None])[0] if verdict.residual is not None else None
        return Round(
            index=self.totals.rounds - 1,
            position=len(self.generated_ids) - len(committed),
            gamma=g,
            draft_ids=ids,
            draft_pieces=tok.batch_decode([[i] for i in ids]),
            q_draft=prob_at(draft.probs, draft.tokens).tolist(),
            p_draft=prob_at(p, draft.tokens).tolist(),
            accept_probs=verdict.accept_probs.tolist(),
            uniforms=verdict.uniforms.tolist(),
            n_accepted=verdict.n_accepted,
            rejected_at=verdict.rejected_at,
            emitted_id=emitted,
            emitted_piece=tok.decode([emitted]),
            is_bonus=verdict.bonus,
            emitted_p=float(prob_at(p[verdict.n_accepted : verdict.n_accepted + 1], torch.tensor([emitted]))),
            q_top=top(draft.probs) if g else [],
            p_top=top(p),
            residual_top=residual,
            committed_ids=list(committed),
            committed_pieces=tok.batch_decode([[i] for i in committed]),
            draft_ms=draft_ms,
            verify_ms=verify_ms,
            stop_reason=self.stop_reason,
            top_k=k,
            note=draft.note,
        )

    def record(self, costs: StepCosts | None = None, label: str = "") -> RunRecord:
        """The run so far as one typed RunRecord (what traces, the playground and the Learn tab consume)."""
        return RunRecord.from_decoder(self, costs, label)


# ------------------------------------------------------------------------------------------------- baseline


@dataclass
class BaselineResult:
    ids: list[int]
    text: str
    token_ms: list[float]  # wall time of each decoding step (the first one includes the prompt)

    @property
    def tok_s(self) -> float:
        total = sum(self.token_ms)
        return 1e3 * len(self.token_ms) / total if total else 0.0

    @property
    def ms_per_token(self) -> float:
        return sum(self.token_ms) / len(self.token_ms) if self.token_ms else 0.0


@torch.inference_mode()
def plain_decode(pair: ModelPair, prompt, settings: DecodeSettings = DecodeSettings(), model: str = "target") -> BaselineResult:
    """Target-only (or draft-only) decoding with the same warps, caching and seed handling, timed per token."""
    s = settings.validate()
    prompt_ids = encode_prompt(pair.tokenizer, prompt, s.chat)
    if model == "target":
        lm = CachedLM(pair.target, pair.vocab_size)
    else:  # the draft as the drafter runs it, reduced head included
        lm = CachedLM(pair.draft, pair.vocab_size, resolve_draft_vocab(pair, s.draft_vocab), pair.eos_token_ids)
        lm.keep_in_head(prompt_ids)
    gen = make_generator(pair.device, s.seed)
    ids = list(prompt_ids)
    times = []  # the first step also runs the prompt, as generate() does
    for _ in range(s.max_new_tokens):
        synchronize(pair.device)
        t0 = time.perf_counter()
        tok = int(draw(lm.logits_after(ids, all_columns=False)[-1], s.sampling, gen, lm.columns, lm.vocab_size)[0])
        synchronize(pair.device)
        times.append((time.perf_counter() - t0) * 1e3)
        ids.append(tok)
        if tok in pair.eos_token_ids:
            break
    out = ids[len(prompt_ids) :]
    return BaselineResult(out, pair.tokenizer.decode(out, skip_special_tokens=True), times)


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0.0


def measure_step_costs(pair: ModelPair, n_tokens: int = 8, prompt: str = "The quick brown fox",
                       draft_vocab: int | None = None) -> StepCosts:
    """Time plain greedy decoding of n_tokens with the target and with the draft (first step dropped: it runs
    the prompt and pays one-time costs)."""
    s = DecodeSettings(max_new_tokens=n_tokens + 1, draft_vocab=draft_vocab)
    t = plain_decode(pair, prompt, s, model="target").token_ms[1:]
    d = plain_decode(pair, prompt, s, model="draft").token_ms[1:]
    return StepCosts(_median(t), _median(d))
