"""The bug zoo: faithful reproductions of exactness bugs that real speculative-decoding code shipped, run as lab
variants of the rule.

Every entry builds, at one position, the four rows a (possibly wrong) implementation works with:

- `drawn`: the distribution the draft's guess is actually sampled from,
- `q`: what is handed to the rule as the draft's distribution,
- `p`: what is handed to the rule as the target's distribution,
- `promised`: warp(target logits) with the user's sampling settings -- what the output must follow,

plus the repair the rule uses after a rejection. The engine is never touched: the guess is drawn here, and the
rows and the repair go into `specdec.core.verify.verify_batch` through its arguments (`repair=` is the seam the lab
already uses for wrong repairs). The correct construction is drawn = q = warp(draft logits), p = promised, repair =
the residual; a bug changes one or more of those (a wrong warp for one row, a request setting such as a logit bias
that only `promised` honours, or a sampler that returns the argmax for every row it draws from).

Because the first emitted token depends only on those rows, its distribution has a closed form:
out(y) = drawn(y) a(y) + (1 - sum_x drawn(x) a(x)) r(y), with a = min(1, p/q) and r = repair(p, q) normalized. The
zoo reports that exact distribution, its total-variation distance to `promised`, a chi-square test of N sampled
rounds, and the N at which the chi-square test would catch the bug with a given probability (its power, from the
noncentral chi-square distribution).

One entry (`TreeConstruction`) is a token-tree bug that only shows on the token after an accepted leaf, so it is
scored on ordered pairs of the first two emitted tokens instead: the tree is drawn here and walked by
`specdec.core.tree.verify_tree` with the target rows it is handed (the wrong row is the seam), and a round that
emits only one token gets its second from the target's row after it, which is what the next round of an exact
rule delivers. The exact pair distribution is summed over every tree the draft can draw.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
import torch

from specdec.core.errors import InvalidInputError, whole_number
from specdec.learn.lab import (LEVEL, MAX_LAB_ROUNDS, ChiSquare, FirstTokenLogits, HundredPoints, LabInputError,
                               chi_square, resolve_repair, sample_rounds, total_variation)
from specdec.core.sampling import SamplingConfig, warp
from specdec.core import tree as tree_mod
from specdec.core.verify import accept_ratio, residual_distribution

EXACT_TV = 1e-6  # below this TV the construction is exact up to float32 rounding of the warps
OTHER = -1  # id of the pooled "all other tokens" cell in a reduced real-model row


@dataclass(frozen=True)
class Construction:
    """The rows one implementation builds at one position (1-D float64 tensors over the same tokens)."""

    drawn: torch.Tensor
    q: torch.Tensor
    p: torch.Tensor
    promised: torch.Tensor
    repair: str = "correct"  # a key of specdec.learn.lab.REPAIRS


Builder = Callable[[torch.Tensor, torch.Tensor, SamplingConfig], Construction]


def _f64(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64)


def _raw(logits: torch.Tensor) -> torch.Tensor:
    """softmax of the logits with no temperature, top-k or top-p: the model's own distribution."""
    return _f64(warp(logits, SamplingConfig(1.0, 0, 1.0)))


def _normalize(x: torch.Tensor) -> torch.Tensor:
    return x / x.sum()


def build_correct(lp, lq, cfg) -> Construction:
    """What the engine does: the draft samples from warp(q) and the rule reads that very row; p uses the same warp."""
    qw = _f64(warp(lq, cfg))
    pw = _f64(warp(lp, cfg))
    return Construction(qw, qw, pw, pw)


def build_greedy_draft(lp, lq, cfg) -> Construction:
    """The draft takes its argmax, but the rule is told the guess came from the draft's softmax."""
    q_soft = _raw(lq)
    drawn = torch.zeros_like(q_soft)
    drawn[int(torch.argmax(lq))] = 1.0
    pw = _f64(warp(lp, cfg))
    return Construction(drawn, q_soft, pw, pw)


def build_q_before_warp(lp, lq, cfg) -> Construction:
    """The draft samples after the warp (and p is warped), but q is read from the draft's raw logits."""
    pw = _f64(warp(lp, cfg))
    return Construction(_f64(warp(lq, cfg)), _raw(lq), pw, pw)


def build_target_not_warped(lp, lq, cfg) -> Construction:
    """The draft samples from its warped q (and the rule reads it), but p is the target's raw softmax."""
    qw = _f64(warp(lq, cfg))
    return Construction(qw, qw, _raw(lp), _f64(warp(lp, cfg)))


def build_fresh_p(lp, lq, cfg) -> Construction:
    """Everything right except the repair: a fresh draw from p instead of normalize(max(0, p - q))."""
    return replace(build_correct(lp, lq, cfg), repair="fresh-p")


def build_bf16_draw(lp, lq, cfg) -> Construction:
    """The draft samples from probabilities computed in bfloat16; the rule reads the float32 q of the same logits."""
    q32 = _f64(warp(lq, cfg))
    q16 = warp(lq.to(torch.bfloat16).float(), cfg).to(torch.bfloat16)  # logits and probabilities in bf16
    pw = _f64(warp(lp, cfg))
    return Construction(_normalize(_f64(q16)), q32, pw, pw)


def _top_p_then_top_k(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Temperature, then the top-p cutoff on the full distribution, then the top k of what is left, renormalized:
    the support is the nucleus intersected with the top k. Built from the engine's warp in two passes (the second
    pass reads the first one's probabilities as logits), where the engine's own order is top-k, renormalize, top-p."""
    nucleus = warp(logits, SamplingConfig(cfg.temperature, 0, cfg.top_p))
    return _f64(warp(torch.log(nucleus), SamplingConfig(1.0, cfg.top_k, 1.0)))


def _argmax_row(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """One-hot on the most likely token of warp(logits, cfg): the engine's greedy warp, since temperature, top-k and
    top-p never move the argmax."""
    return _f64(warp(logits, replace(cfg, temperature=0.0)))


LOGIT_BIAS = -100.0  # the bias the logit-bias entry adds to one token's logit (the value in its reference)


def logit_bias_row(lp: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """The additive logit bias the logit-bias entry's request carries: LOGIT_BIAS on the target's most likely token
    under the warp, 0 elsewhere."""
    bias = torch.zeros_like(lp)
    bias[int(torch.argmax(warp(lp, cfg)))] = LOGIT_BIAS
    return bias


def build_sampler_order(lp, lq, cfg) -> Construction:
    """The draft samples from warp(q) and the rule reads it; the verifier builds p with top-p and top-k in the other
    order (nucleus of the full row, intersected with the top k) than the sampler that defines the output."""
    qw = _f64(warp(lq, cfg))
    return Construction(qw, qw, _top_p_then_top_k(lp, cfg), _f64(warp(lp, cfg)))


def build_verify_argmax(lp, lq, cfg) -> Construction:
    """The draft samples from warp(q); the verifier checks each guess against the target's argmax and emits it on a
    mismatch, which is the rule with p one-hot on that argmax."""
    qw = _f64(warp(lq, cfg))
    return Construction(qw, qw, _argmax_row(lp, cfg), _f64(warp(lp, cfg)))


def build_logit_bias_skipped(lp, lq, cfg) -> Construction:
    """The request's logit bias reaches the plain sampler (promised = warp(target logits + bias)) but not the
    verifier's p, which is warp(target logits)."""
    qw = _f64(warp(lq, cfg))
    return Construction(qw, qw, _f64(warp(lp, cfg)), _f64(warp(lp + logit_bias_row(lp, cfg), cfg)))


def build_argmax_sampler(lp, lq, cfg) -> Construction:
    """Every token the speculative path samples is the argmax of the filtered distribution: the draft proposes its
    argmax and the target's token is its argmax. A deterministic guess that is kept iff it equals the target's token
    is the rule with a one-hot q on the guess, so drawn = q = one-hot on the draft's argmax, p = one-hot on the
    target's."""
    guess = _argmax_row(lq, cfg)
    return Construction(guess, guess, _argmax_row(lp, cfg), _f64(warp(lp, cfg)))


@dataclass(frozen=True)
class TreeConstruction:
    """A token tree of two candidates for the next token, both leaves, drawn from q without replacement; scored on
    ordered pairs (first emitted token, second), cell = first * V + second (1-D float64 rows over the same V tokens).

    The target's row after any first token is `p_next` (the lab's rows describe a model whose next-token distribution
    does not depend on the context). After the second candidate is accepted, the bonus token is drawn from
    `bonus_after_second`: p_next in a correct walk.
    """

    q: torch.Tensor
    p: torch.Tensor  # the target's warped row at the root
    p_next: torch.Tensor
    bonus_after_second: torch.Tensor
    repair: str = "correct"

    @property
    def promised(self) -> torch.Tensor:
        return torch.outer(self.p, self.p_next).flatten()

    @property
    def tokens(self) -> int:
        return int(self.p.shape[0])


def second_child_q(q: torch.Tensor, first: int) -> torch.Tensor | None:
    """What the second candidate is drawn from after `first`: q without it, renormalized (None when nothing is left)."""
    rest = q.clone()
    rest[first] = 0.0
    mass = float(rest.sum())
    return rest / mass if mass > 0 else None


def build_eagle_tree(lp, lq, cfg, bug: bool = True) -> TreeConstruction:
    """Two leaf candidates drawn without replacement from warp(q). With the bug, the bonus after the second candidate
    comes from the residual the first candidate's refusal left, normalize(max(0, p - q)), instead of the target's row
    after the accepted candidate."""
    qw = _normalize(_f64(warp(lq, cfg)))  # renormalized in float64 so the pair distribution sums to 1 exactly
    pw = _normalize(_f64(warp(lp, cfg)))
    after = residual_distribution(pw[None], qw[None])[0] if bug else pw
    return TreeConstruction(qw, pw, pw, after)


@dataclass(frozen=True)
class Reference:
    """A thread (or paper) where the bug, or the rule it breaks, is written down."""

    url: str
    name: str  # where it is: project and number, or the paper's authors
    title: str  # its title, as published
    summary: str  # one line: what the thread says


@dataclass(frozen=True)
class ZooEntry:
    key: str
    title: str
    explanation: str
    references: tuple[Reference, ...]  # the first is the report the entry reproduces
    build: Builder
    lab_sampling: SamplingConfig  # settings for the hand-made lab rows (read as temperature-1 distributions)
    needs: Callable[[SamplingConfig], tuple[SamplingConfig, str | None]] = lambda c: (c, None)
    lab_only: bool = False  # needs the target's row after each first token, which the real-rows check does not have

    @property
    def is_bug(self) -> bool:
        return self.key != "none"


def _needs_sampling(cfg: SamplingConfig) -> tuple[SamplingConfig, str | None]:
    if cfg.greedy:
        return replace(cfg, temperature=1.0), ("temperature was 0 (greedy); this bug needs sampling, so temperature 1 "
                                               "was used")
    return cfg, None


def _needs_top_k(cfg):
    cfg, note = _needs_sampling(cfg)
    if cfg.top_k == 0:
        return replace(cfg, top_k=40), "top-k was off; this entry needs it, so top-k 40 was used"
    return cfg, note


def _needs_temperature(cfg):
    cfg, note = _needs_sampling(cfg)
    if cfg.temperature == 1.0:
        return replace(cfg, temperature=0.7), "temperature was 1; this entry needs another, so 0.7 was used"
    return cfg, note


def _needs_top_p(cfg):
    cfg, note = _needs_sampling(cfg)
    if cfg.top_p >= 1.0:
        return replace(cfg, top_p=0.9), "top-p was off; this entry needs it, so top-p 0.9 was used"
    return cfg, note


def _needs_top_k_and_top_p(cfg):
    cfg, note = _needs_sampling(cfg)
    turned = []
    if cfg.top_k == 0:
        cfg = replace(cfg, top_k=40)
        turned.append("top-k 40")
    if cfg.top_p >= 1.0:
        cfg = replace(cfg, top_p=0.9)
        turned.append("top-p 0.9")
    if turned:
        extra = "this entry needs both top-k and top-p, so " + " and ".join(turned) + " was used"
        note = f"{note}; {extra}" if note else extra
    return cfg, note


def _needs_any_warp(cfg):
    cfg, note = _needs_sampling(cfg)
    if cfg.temperature == 1.0 and cfg.top_k == 0 and cfg.top_p >= 1.0:
        return replace(cfg, top_p=0.9), "no warp was on, so target and raw target agree; top-p 0.9 was used"
    return cfg, note


def _t47932(summary: str) -> Reference:
    return Reference("https://github.com/huggingface/transformers/issues/47932", "transformers #47932",
                     "Speculative decoding: candidate generators return a `q` they did not sample from, breaking "
                     "losslessness with `do_sample=True`", summary)
_Q_BEFORE = (
    "The draft samples its guess from its warped distribution, and the target's p is warped the same way, but the "
    "q handed to the rule is the softmax of the draft's raw logits, taken before {what}. The rule's acceptance "
    "ratio p(x)/q(x) and its residual max(0, p - q) are then computed for a distribution the guess never came "
    "from, and the output drifts from the warped target."
)

ENTRIES: dict[str, ZooEntry] = {e.key: e for e in [
    ZooEntry(
        "none", "No bug: the engine's construction",
        "The draft samples from warp(q) and the rule reads exactly that row; the target's p uses the same warp and "
        "a rejection is repaired from normalize(max(0, p - q)). The output follows the warped target exactly: this "
        "is the control every bug below is compared with.",
        (Reference("https://arxiv.org/abs/2211.17192", "Leviathan et al. 2022",
                   "Fast Inference from Transformers via Speculative Decoding",
                   "Algorithm 1: keep each guess with chance min(1, p/q) and replace the first refused one by a draw "
                   "from normalize(max(0, p - q)); the output then follows the target exactly."),),
        build_correct, SamplingConfig(1.0, 0, 1.0)),
    ZooEntry(
        "greedy-draft", "Greedy draft, softmax q",
        "The draft decodes greedily (it always proposes its most likely token) while the rule is told the guess was "
        "drawn from the draft's softmax. The draft's top token is then proposed far more often than q says, the "
        "acceptance test keeps it with chance min(1, p/q) as if it were rare, and every other token can only come "
        "out through the residual: the output over-weights the draft's favourite token. Found in Hugging Face "
        "transformers' assisted generation, and in jaymody/speculative-sampling.",
        (Reference("https://github.com/huggingface/transformers/issues/32867", "transformers #32867",
                   "Speculative sampling does not maintain probability distribution of main model",
                   "With do_sample=True the assistant drafts greedily while the main model samples, so the output "
                   "no longer follows the main model's distribution."),
         Reference("https://github.com/huggingface/transformers/pull/33534", "transformers PR #33534",
                   "Generate: assistant should sample when the main model samples",
                   "The fix: the assistant samples whenever the main model does, reverting PR #30778, which had "
                   "made it greedy for speed."),
         Reference("https://github.com/jaymody/speculative-sampling/issues/3", "jaymody/speculative-sampling #3",
                   "Question about the code",
                   "The author agrees that drafting by argmax breaks the guarantee: the rule recovers the target "
                   "only if the guess is drawn from the q it is handed.")),
        build_greedy_draft, SamplingConfig(1.0, 0, 1.0), _needs_sampling),
    ZooEntry(
        "q-before-topk", "q taken before top-k",
        _Q_BEFORE.format(what="top-k") + " Top-k keeps only the k most likely tokens, so the raw q spreads mass over "
        "tokens the draft can never propose, and the kept tokens look rarer to the rule than they are (their "
        "acceptance ratio is inflated by 1 / (raw mass inside the top k)).",
        (_t47932("The candidate generators hand the rule the draft's raw q; with top_k=50 on SmolLM2-135M drafting "
                 "for SmolLM2-360M the output is off by a median total-variation distance of about 0.05 per "
                 "position (worst 0.31). Fixed by PR #48007, \"Align logit distributions for CandidateGenerators "
                 "using sampling\"."),),
        build_q_before_warp, SamplingConfig(1.0, 2, 1.0), _needs_top_k),
    ZooEntry(
        "q-before-temperature", "q taken before temperature",
        _Q_BEFORE.format(what="the temperature") + " A temperature below 1 sharpens the draft's sampling "
        "distribution, so the raw q under-states how often the top tokens are proposed; above 1 it is the reverse.",
        (_t47932("The q handed to the rule is read before the logits processors that shaped the draft's sample; "
                 "the temperature is one of them (the report measures the mismatch under top-k)."),),
        build_q_before_warp, SamplingConfig(0.5, 0, 1.0), _needs_temperature),
    ZooEntry(
        "q-before-topp", "q taken before top-p",
        _Q_BEFORE.format(what="top-p") + " Top-p keeps the smallest set of tokens whose mass reaches p, so as with "
        "top-k the raw q wastes mass on tokens that are never proposed.",
        (_t47932("The q handed to the rule is read before every logits processor the candidate generators apply "
                 "to their sample, top-p among them."),),
        build_q_before_warp, SamplingConfig(1.0, 0, 0.85), _needs_top_p),
    ZooEntry(
        "target-not-warped", "Target not warped",
        "The draft samples from its warped q and the rule reads that same q, but the target's p is scored with "
        "default settings (temperature 1, no top-k, no top-p). The rule is still exact -- for the distribution it "
        "was given -- so the output follows the target's raw softmax instead of the warped one the user asked for: "
        "tokens that top-k/top-p should exclude come out, and a temperature has no effect on the target side. "
        "Fixed in vLLM by PR #10198.",
        (Reference("https://github.com/vllm-project/vllm/pull/10198", "vLLM PR #10198",
                   "[Bugfix][SpecDecode] apply sampling parameters to target probabilities for consistency in "
                   "rejection sampling.",
                   "Fixes issue #9834: the target probabilities were computed with default sampling parameters "
                   "(top_p=1.0, temperature=1.0, repetition_penalty=1.0) while the draft's were filtered by top_p."),),
        build_target_not_warped, SamplingConfig(1.0, 0, 0.7), _needs_any_warp),
    ZooEntry(
        "fresh-p", "Repair drawn from p",
        "After a rejection the token is drawn afresh from the target's p instead of from normalize(max(0, p - q)). "
        "The accepted guesses already deliver min(p, q) of every token, so tokens the draft covers well get their "
        "share twice and tokens the draft under-rates stay short: the output is min(p, q) + (1 - α) p, not p.",
        (Reference("https://github.com/SafeAILab/EAGLE/issues/329", "SafeAILab/EAGLE #329",
                   "Non‑greedy rejection sampling ignores draft (q); not lossless per Speculative Decoding",
                   "Reports that the non-greedy path samples the replacement token from the target's distribution "
                   "rather than from normalize(max(0, p - q))."),
         Reference("https://github.com/NJUNLP/MCSD/issues/5", "NJUNLP/MCSD #5",
                   "Questions on sampling from residual distribution",
                   "The same suspicion, answered: the acceptance check had already turned the target row into the "
                   "residual in place, so a repair line that reads 'sample from p' is not by itself this bug.")),
        build_fresh_p, SamplingConfig(1.0, 0, 1.0), _needs_sampling),
    ZooEntry(
        "bf16-draw", "Draft sampled in bfloat16, q read in float32",
        "The draft samples its guess through a bfloat16 path (logits and softmax in the model's native dtype) while "
        "the rule reads the float32 softmax of the same logits. bfloat16 keeps 8 significant bits, so each "
        "probability the draft actually sampled from is off by up to ~0.4 % of itself: the output error is real "
        "but tiny, usually far below what a chi-square test on a few thousand rounds can see. (A q computed in "
        "bfloat16 that the draft also samples from is harmless: the rule only needs the two to be the same row.)",
        (Reference("https://github.com/deepseek-ai/DeepSpec/issues/31", "deepseek-ai/DeepSpec #31",
                   "Draft sampling uses a different distribution than speculative rejection",
                   "The draft samples from bf16 probabilities while the rejection reads float32 ones; the fix (PR "
                   "#30) casts the logits to float32 before temperature and softmax in sample_tokens."),),
        build_bf16_draw, SamplingConfig(1.0, 0, 1.0), _needs_sampling),
    ZooEntry(
        "sampler-order", "Verifier applies top-k and top-p in another order",
        "The draft samples from warp(q) and the rule reads that row, but the verifier builds the target's p with "
        "top-k and top-p applied in a different order from the sampler that defines the output. Here the sampler "
        "(this engine's warp) keeps the top k tokens, renormalizes them and then cuts the nucleus; the verifier "
        "cuts the nucleus on the full distribution and intersects it with the top k. Renormalizing first inflates "
        "the kept tokens, so that nucleus closes sooner, and the two supports can differ whenever the top k hold "
        "less than all the mass. The rule is exact for the p it is given, so the output follows the verifier's "
        "truncation, including tokens the sampler cuts. (In SGLang the roles were the other way round, the "
        "verifier renormalizing first; exactness breaks on the disagreement, whichever order is the reference.)",
        (Reference("https://github.com/sgl-project/sglang/pull/36173", "SGLang PR #36173",
                   "[Bugfix] Make top-k/top-p filtering consistent across sampling paths",
                   "The regular sampler cuts top-p on the original distribution and intersects it with top-k, while "
                   "the speculative verifiers, the FlashInfer min-p path and the DFlash / DSpark / UNO target "
                   "builder applied top-k, renormalized, then top-p."),),
        build_sampler_order, SamplingConfig(1.0, 2, 0.6), _needs_top_k_and_top_p),
    ZooEntry(
        "verify-argmax", "Verifier takes the target's argmax at any temperature",
        "The draft samples from warp(q), but the verification path checks every guess against the target's most "
        "likely token and emits that token at the first mismatch, as greedy decoding does, whatever temperature, "
        "top-k or top-p the request asked for. That is the rule with p one-hot on the target's argmax: the output "
        "is that one token every time, and all the mass the warped target gives the other tokens is missing. "
        "Nothing raises an error; the text just turns greedy. (A p scored at temperature 1 is the 'Target not "
        "warped' entry.)",
        (Reference("https://github.com/sgl-project/sglang/pull/39253", "SGLang PR #39253",
                   "[AMD][SPEC]Fix DeepSeek-V4 benchmark accuracy gap by supporting temperature sampling in EAGLE "
                   "verify",
                   "On ROCm every request took the all-greedy (argmax) verify branch, ignoring the temperature "
                   "without a warning (30.6 % of Simple-QA requests ended without a parseable answer, 0.9 % once "
                   "it was honoured); the fix draws the target's token from softmax(logits / temperature)."),),
        build_verify_argmax, SamplingConfig(1.0, 0, 1.0), _needs_sampling),
    ZooEntry(
        "logit-bias-skipped", "logit_bias not applied on the speculative path",
        f"The request carries a logit bias (here {LOGIT_BIAS:g} on the target's most likely token, which all but "
        "bans it) and the plain sampler adds it to the logits before the warp, but the speculative verifier scores "
        "p from the unbiased logits. The rule delivers the unbiased target: the banned token comes out as often as "
        "the model likes it, and the other tokens are short by that mass between them. The same report found "
        "min_p missing from that path; this engine's warp has no min_p, so the entry reproduces the logit bias.",
        (Reference("https://github.com/sgl-project/sglang/issues/10617", "SGLang #10617",
                   "[Bug] Sampling settings (logit_bias, min_p) not applied correctly with EAGLE",
                   "With EAGLE, a logit_bias of -100 on GLM's ' the' token (id 279) did not keep it out of the "
                   "output and min_p did not apply to every token, while top_p did."),
         Reference("https://github.com/sgl-project/sglang/pull/11555", "SGLang PR #11555",
                   "make sure logit bias is applied during eagle spec decoding verification",
                   "The fix: the EAGLE verify function checks for the request's logit biases and applies them.")),
        build_logit_bias_skipped, SamplingConfig(1.0, 0, 1.0)),
    ZooEntry(
        "argmax-sampler", "Speculative sampler returns the argmax",
        "The function that draws every token on the speculative path builds the filtered distribution "
        "(temperature, top-k, top-p, min-p) and then returns its most likely token instead of a sample. The "
        "draft's guess is the draft's argmax, the target's token is the target's argmax, and a guess is kept only "
        "if it matches (a deterministic guess checked that way is the rule with a one-hot q). The output is the "
        "target's argmax every time: the same wrong output as the ROCm verifier entry, reached through the sampler "
        "instead of the verifier, and neither model's temperature or filters change anything.",
        (Reference("https://github.com/EricLBuehler/mistral.rs/pull/2424", "mistral.rs PR #2424",
                   "fix(sampler): make speculative sampling actually sample",
                   "sample_speculative_top_kp_min_p applied the filters and then returned argmax_f32(&probs), so "
                   "with a temperature set the speculative path always emitted the most probable token."),),
        build_argmax_sampler, SamplingConfig(1.0, 0, 1.0), _needs_sampling),
    ZooEntry(
        "eagle-tree-bonus", "Tree: bonus token drawn from a sibling's residual",
        "A token tree with two candidates for the next token, drawn from the draft without replacement, both "
        "leaves. The rule tries the first; if it is refused, p becomes the residual normalize(max(0, p - q)) and "
        "the second candidate is tried against that. Once the second is accepted the path is complete, and the "
        "bonus token after it must come from the target's distribution after that candidate; the bug draws it from "
        "the residual, which was meant for the candidate's own position. The first emitted token stays exact and "
        "the second does not, so this entry scores pairs (first → second), with the lab's p as the target's "
        "distribution after every token. The wrong mass lands on the tokens the residual favours. A depth-1 tree is "
        "the smallest one that shows it.",
        (Reference("https://github.com/SafeAILab/EAGLE/pull/47", "SafeAILab/EAGLE PR #47", "fix: update verify process",
                   "When every candidate of a path is accepted, the bonus token must come from the last accepted "
                   "node's logits (the SpecInfer proof), but evaluate_posterior drew it from the sibling-adjusted "
                   "row whenever a sibling had been refused at the last level; the fix adds accept_length != "
                   "candidates.shape[1] to that condition."),
         Reference("https://github.com/SafeAILab/EAGLE/issues/50", "SafeAILab/EAGLE #50", "Generation quality loss",
                   "The maintainer names PR #47 as the non-greedy bug behind a reported drop in generation "
                   "quality.")),
        build_eagle_tree, SamplingConfig(1.0, 0, 1.0), _needs_sampling, lab_only=True),
]}
BUG_KEYS = [k for k in ENTRIES if k != "none"]


def get_entry(key: str) -> ZooEntry:
    if key not in ENTRIES:
        raise LabInputError(f"unknown zoo entry '{key}'; choose one of {', '.join(ENTRIES)}")
    return ENTRIES[key]


# ------------------------------------------------------------------------------------------ exact output


def acceptance(c: Construction) -> torch.Tensor:
    """min(1, p/q) per token of the vocabulary: the engine's own rule (verify.accept_ratio)."""
    return accept_ratio(c.p, c.q)


def repair_row(c: Construction) -> torch.Tensor:
    """The distribution a rejection draws from: the lab's repair (the engine's residual for 'correct')."""
    r = resolve_repair(c.repair)(c.p[None], c.q[None])[0]
    return _normalize(_f64(r))


def output_distribution(c: Construction | TreeConstruction) -> np.ndarray:
    """The exact distribution of the first emitted token: drawn * a + (chance of a rejection) * repair (for a tree,
    of the first two emitted tokens: tree_output_distribution)."""
    if isinstance(c, TreeConstruction):
        return tree_output_distribution(c)
    kept = c.drawn * acceptance(c)
    out = kept + (1.0 - float(kept.sum())) * repair_row(c)
    return out.clamp_min(0.0).numpy()


def tree_output_distribution(c: TreeConstruction) -> np.ndarray:
    """Exact distribution of the pair (first, second emitted token), summed over every two-candidate tree the draft
    can draw, with the tree module's own pieces: a candidate x is kept with accept_ratio(r(x), q_x(x)) where r is the
    residual so far, and a refusal turns r into residual_distribution(r, q_x)."""
    q, p, nxt = c.q, c.p, c.p_next
    v = c.tokens
    out = torch.zeros(v, v, dtype=torch.float64)
    r1 = residual_distribution(p[None], q[None])[0]  # after the first candidate (drawn from q itself) is refused
    for a in torch.nonzero(q > 0).flatten().tolist():
        keep_a = float(accept_ratio(p[a], q[a]))
        out[a] += q[a] * keep_a * nxt
        q_b = second_child_q(q, a)
        if q_b is None:  # a one-candidate tree: a refusal is repaired from r1
            out += q[a] * (1 - keep_a) * torch.outer(r1, nxt)
            continue
        for b in torch.nonzero(q_b > 0).flatten().tolist():
            w = q[a] * (1 - keep_a) * q_b[b]
            keep_b = float(accept_ratio(r1[b], q_b[b]))
            out[b] += w * keep_b * c.bonus_after_second
            r2 = residual_distribution(r1[None], q_b[None])[0]
            out += w * (1 - keep_b) * torch.outer(r2, nxt)
    return out.flatten().clamp_min(0.0).numpy()


# ------------------------------------------------------------------------------------------ sampling


def sample_construction(c: Construction | TreeConstruction, n: int, generator: torch.Generator | None = None,
                        time_budget_s: float | None = None) -> torch.Tensor:
    """Token index emitted first by n one-guess rounds: x ~ drawn, then verify_batch(x, q, p, repair) (for a tree,
    the pair cell of each round: sample_tree_rounds).

    Through lab.sample_rounds, the lab's own loop; q is passed as built, never renormalized: a wrong q is part of
    what is reproduced.
    """
    if isinstance(c, TreeConstruction):
        return sample_tree_rounds(c, n, generator, time_budget_s)
    return sample_rounds(c.drawn.float(), c.q.float(), c.p.float(), n, generator, c.repair, time_budget_s)


def sample_tree_rounds(c: TreeConstruction, n: int, generator: torch.Generator | None = None,
                       time_budget_s: float | None = None) -> torch.Tensor:
    """Pair cell (first * V + second) of n rounds: two candidates drawn from q without replacement, walked by
    verify_tree with the target rows [p, p_next, bonus_after_second] (root, after the first candidate, after the
    second). A round that emits one token takes its second from p_next, as the next round of an exact rule would.
    With time_budget_s, rounds stop once the budget is spent (checked every 1 000 rounds). verify_tree is looked up
    on its module at call time, as the chain's verify_batch is."""
    n = whole_number(n, "the number of rounds", 1, MAX_LAB_ROUNDS, LabInputError)
    v = c.tokens
    q = c.q.float()
    rows = torch.stack([c.p, c.p_next, c.bonus_after_second]).float()
    firsts = torch.multinomial(q, n, replacement=True, generator=generator)
    seconds = torch.full((n,), -1, dtype=torch.long)
    trees: dict[tuple[int, int], tree_mod.TokenTree] = {}
    for a in torch.unique(firsts).tolist():
        q_b = second_child_q(c.q, a)
        where = torch.nonzero(firsts == a).flatten()
        if q_b is not None:
            seconds[where] = torch.multinomial(q_b.float(), len(where), replacement=True, generator=generator)
            for b in torch.nonzero(q_b > 0).flatten().tolist():
                trees[(a, b)] = tree_mod.TokenTree(torch.tensor([a, b]), [-1, -1], torch.stack([q, q_b.float()]))
        else:
            trees[(a, -1)] = tree_mod.TokenTree(torch.tensor([a]), [-1], q[None])
    fallback = torch.multinomial(c.p_next.float(), n, replacement=True, generator=generator)
    out = torch.empty(n, dtype=torch.long)
    t0 = time.perf_counter()
    done = n
    for i in range(n):
        if i and i % 1000 == 0 and time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
            done = i
            break
        a, b = int(firsts[i]), int(seconds[i])
        tokens = tree_mod.verify_tree(trees[(a, b)], rows if b >= 0 else rows[:2], generator).tokens
        out[i] = tokens[0] * v + (tokens[1] if len(tokens) > 1 else int(fallback[i]))
    return out[:done]


# ------------------------------------------------------------------------------------------ power


@dataclass
class Power:
    """How many rounds the chi-square test (at LEVEL) needs to catch the difference."""

    n50: float  # rounds for a 50 % chance of a failing verdict (inf: never; the distributions are equal)
    n95: float
    at_n: float  # chance of a failing verdict at the N that was run
    impossible_mass: float  # output mass on tokens the promised distribution gives probability 0


def detection_probability(out: np.ndarray, promised: np.ndarray, n: float) -> float:
    """P(the test fails) after n rounds whose output follows `out`, tested against `promised`.

    Two ways to fail: a draw on a token `promised` rules out (lab.chi_square fails outright; chance 1 - (1 - m)^n
    for output mass m there), or the chi-square statistic over the allowed tokens exceeds its critical value. Under
    the alternative that statistic is approximately noncentral chi-square with noncentrality equal to the statistic
    of the expected counts, which lab.chi_square computes with the same pooling of small cells as the real test.
    """
    out = np.asarray(out, dtype=np.float64)
    promised = np.asarray(promised, dtype=np.float64)
    allowed = promised > 0
    m = float(out[~allowed].sum())
    inside = np.where(allowed, out, 0.0)
    p_chi = 0.0
    n_in = round(n * (1 - m))  # lab.chi_square reads the sample size off the counts' sum: keep it whole
    if inside.sum() > 0 and n_in >= 1:
        test = chi_square(inside / inside.sum() * n_in, promised)
        if test.testable and test.dof > 0:
            from scipy import stats  # here, not at import: scipy.stats costs the app's start ~0.7 s

            crit = stats.chi2.isf(LEVEL, test.dof)
            p_chi = float(stats.ncx2.sf(crit, test.dof, max(test.statistic, 1e-12)))
            p_chi = max(p_chi, LEVEL)  # under the null it still fails at the level's rate
    no_impossible = math.exp(n * math.log1p(-m)) if m < 1 else 0.0
    return 1.0 - no_impossible * (1.0 - p_chi)


def rounds_needed(out: np.ndarray, promised: np.ndarray, power: float, n_max: float = 1e13) -> float:
    """Smallest N (to ~1 %) with detection_probability >= power; inf when even n_max rounds are not enough."""
    if total_variation(out, promised) < EXACT_TV:
        return math.inf
    f = lambda log_n: detection_probability(out, promised, math.exp(log_n)) - power  # noqa: E731
    lo, hi = 0.0, math.log(n_max)
    if f(lo) >= 0:
        return 1.0
    if f(hi) < 0:
        return math.inf
    from scipy import optimize

    return float(math.exp(optimize.brentq(f, lo, hi, xtol=0.01)))


def power_of(out: np.ndarray, promised: np.ndarray, n: int) -> Power:
    m = float(np.asarray(out)[np.asarray(promised) <= 0].sum())
    return Power(rounds_needed(out, promised, 0.5), rounds_needed(out, promised, 0.95),
                 detection_probability(out, promised, n), m)


# ------------------------------------------------------------------------------------------ results


@dataclass
class ZooResult:
    entry: ZooEntry
    labels: list[str]  # one per cell (token text, or "all other tokens")
    ids: list[int]  # vocabulary id per cell (lab: position; OTHER for the pooled cell)
    construction: Construction | TreeConstruction
    exact: np.ndarray  # exact output distribution of the wrong construction
    counts: np.ndarray  # sampled first tokens through verify_batch
    n: int
    test: ChiSquare  # counts vs promised
    tv_exact: float  # TV(exact output, promised)
    tv_sampled: float
    power: Power
    sampling: SamplingConfig
    seconds: float
    notes: list[str] = field(default_factory=list)
    requested_n: int = 0

    @property
    def promised(self) -> np.ndarray:
        return self.construction.promised.numpy()

    @property
    def rule_function(self) -> str:
        """The engine function the sampled rounds went through."""
        return "verify_tree" if isinstance(self.construction, TreeConstruction) else "verify_batch"

    @property
    def failed(self) -> bool:
        return self.test.testable and self.test.p_value < LEVEL

    @property
    def verdict(self) -> str:
        """'caught', 'hidden' (wrong, but not visible at this N), 'exact', or 'false alarm' (a correct one failed)."""
        if self.tv_exact < EXACT_TV:
            return "false alarm" if self.failed else "exact"
        return "caught" if self.failed else "hidden"


def _result(entry, labels, ids, c, n, seed, cfg, notes, time_budget_s=None) -> ZooResult:
    gen = torch.Generator().manual_seed(int(seed))
    t0 = time.perf_counter()
    samples = sample_construction(c, n, gen, time_budget_s)
    secs = time.perf_counter() - t0
    v = c.promised.shape[0]
    cnt = torch.bincount(samples, minlength=v).numpy().astype(np.float64)
    exact = output_distribution(c)
    promised = c.promised.numpy()
    m = int(samples.shape[0])
    if m < n:
        notes = notes + [f"the time budget allowed {m:,} of the {n:,} requested rounds"]
    return ZooResult(entry, labels, ids, c, exact, cnt, m, chi_square(cnt, promised), total_variation(exact, promised),
                     total_variation(cnt, promised), power_of(exact, promised, m), cfg, secs, notes, int(n))


def lab_logits(hp: HundredPoints) -> tuple[torch.Tensor, torch.Tensor]:
    """The hand-made p and q read as the models' temperature-1 distributions: logits = log p, log q (-inf at 0)."""
    return (torch.log(torch.as_tensor(hp.p, dtype=torch.float64)).float(),
            torch.log(torch.as_tensor(hp.q, dtype=torch.float64)).float())


def run_zoo_lab(hp: HundredPoints, key: str, n: int, seed: int = 0) -> ZooResult:
    """One zoo entry on the lab's p and q (with the entry's own warp), N sampled rounds and the exact output."""
    entry = get_entry(key)
    lp, lq = lab_logits(hp)
    cfg = entry.lab_sampling
    c = entry.build(lp, lq, cfg)
    notes = []
    if cfg != SamplingConfig(1.0, 0, 1.0):
        notes.append(f"sampling settings for this entry: {describe_sampling(cfg)} (p and q above are the models' "
                     "distributions at temperature 1; the output must follow the warped p)")
    labels = list(hp.tokens)
    if isinstance(c, TreeConstruction):
        labels = [f"{a}→{b}" for a in hp.tokens for b in hp.tokens]
        notes.append("cells are pairs first→second of emitted tokens; the target's distribution after any token is "
                     "the p above, so the output must follow p(first) · p(second)")
    return _result(entry, labels, list(range(len(labels))), c, n, seed, cfg, notes)


def describe_sampling(cfg: SamplingConfig) -> str:
    parts = [f"temperature {cfg.temperature:g}"]
    if cfg.top_k:
        parts.append(f"top-k {cfg.top_k}")
    if cfg.top_p < 1:
        parts.append(f"top-p {cfg.top_p:g}")
    return ", ".join(parts)


# ------------------------------------------------------------------------------------------ real models


def reduce_construction(c: Construction, keep_top: int = 40) -> tuple[Construction, torch.Tensor]:
    """Restrict the rows to the tokens that matter, pooling the rest into one cell, without changing the output.

    A token the draft never proposes (drawn = 0) and for which q = 0 or p = 0 can only come out through the
    repair, with weight p(y) (residual with q = 0, or a fresh draw from p) or 0 (p = 0). Such tokens pool exactly
    into one cell with the summed p and promised mass and q = drawn = 0. Every other token, and the `keep_top` most
    likely under promised and under p, keep their own cell. Returns the reduced construction and the vocabulary id
    of each cell (OTHER for the pool, last).
    """
    if c.repair not in ("correct", "fresh-p"):
        raise ValueError(f"pooling is exact only for the residual and fresh-p repairs, not {c.repair!r}")
    passive = (c.drawn == 0) & ((c.q == 0) | (c.p == 0))
    keep = ~passive
    for row in (c.promised, c.p):
        top = torch.topk(row, min(keep_top, row.shape[0])).indices
        keep[top[row[top] > 0]] = True
    ids = torch.nonzero(keep).squeeze(-1)
    pool = ~keep

    def cut(row, pooled):
        return torch.cat([row[ids], row.new_tensor([float(row[pool].sum()) if pooled else 0.0])])

    reduced = Construction(cut(c.drawn, False), cut(c.q, False), cut(c.p, True), cut(c.promised, True), c.repair)
    return reduced, torch.cat([ids, ids.new_tensor([OTHER])])


def run_zoo_real(logits: FirstTokenLogits, key: str, cfg: SamplingConfig, n: int, seed: int = 0,
                 decode: Callable[[int], str] | None = None, time_budget_s: float = 8.0) -> ZooResult:
    """One zoo entry on the real models' rows at a prefix, with the user's sampling settings (adjusted where the
    entry needs a warp that is off, and said so in the notes)."""
    entry = get_entry(key)
    if entry.lab_only:
        raise LabInputError(f"'{entry.title}' runs on the lab's rows only: it needs the target's distribution after "
                            "each first token, and the real-rows check has the first-token rows alone")
    cfg, note = entry.needs(cfg.validate())
    c_full = entry.build(logits.target, logits.draft, cfg)
    c, ids = reduce_construction(c_full)
    decode = decode or str
    labels = [decode(int(i)) if i != OTHER else "all other tokens" for i in ids.tolist()]
    notes = [note] if note else []
    if len(ids) > 5000:
        notes.append(f"{len(ids) - 1:,} tokens have their own cell (no top-k/top-p), so sampling is slow; set top-k "
                     "to sample more rounds")
    res = _result(entry, labels, ids.tolist(), c, n, seed, cfg, notes, time_budget_s)
    return res


def chart_cells(res: ZooResult, top: int = 10) -> list[int]:
    """Indices of the cells a chart names: where the promised and the wrong output put the most mass, and where
    they differ most; the rest is shown as one remainder bar."""
    promised, exact = res.promised, res.exact
    if len(promised) <= top + 2:
        return list(range(len(promised)))
    picks: list[int] = []
    for order in (np.argsort(-np.abs(exact - promised)), np.argsort(-promised), np.argsort(-exact)):
        for i in order[: top // 2 + 1]:
            if int(i) not in picks and len(picks) < top:
                picks.append(int(i))
    return sorted(picks, key=lambda i: -promised[i])


def check_key(key: str) -> str:
    if not isinstance(key, str) or key not in ENTRIES:
        raise InvalidInputError(f"choose a zoo entry: {', '.join(ENTRIES)}")
    return key
