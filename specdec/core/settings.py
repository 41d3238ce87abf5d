"""What a run is asked to do: DecodeSettings and the limits every entry point (app, CLI, API, traces) checks.

One home for the rules, so the playground, the CLI and trace import refuse the same inputs with the same words.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.core.errors import InvalidInputError, whole_number
from specdec.core.sampling import SamplingConfig
from specdec.core.verify import VERIFY_MODES

MAX_GAMMA = 32
TREE_MODES = ("top-k", "sampled", "distinct", "dynamic")  # how a draft-model tree's children are chosen (drafters.tree)
MAX_TREE_NODES = 64  # nodes one token tree may hold: what the tree drafters build and a trace's tree round carries
# How chain passes run (specdec.core.static_cache): transformers' dynamic cache, a preallocated static cache with
# eager passes, or that cache with compiled passes.
ENGINES = ("eager", "static", "compiled")
MAX_NEW_TOKENS = 4096
MAX_PROMPT_TOKENS = 8192
TOP_DISPLAY = 8  # default number of candidates per position a Round carries for display (recorded in each Round)
# "fixed": gamma every round. "heuristic": +2 after a fully accepted round, -1 otherwise. "confidence": draft up
# to gamma tokens, ending after one the draft is unsure of. "expected": each round, the gamma with the best
# predicted speedup for running estimates of alpha and c -- it follows wall-clock timings, so the same seed can
# give different text; every round's gamma is in the trace, and a re-run from the trace reproduces the text.
GAMMA_POLICIES = ("fixed", "heuristic", "confidence", "expected")
SEED_REPRODUCIBLE_POLICIES = ("fixed", "heuristic", "confidence")
# Who proposes the guesses (specdec/drafters/): the draft model, n-gram prompt lookup, the target's own first
# layers (self-speculative early exit), a draft model with another tokenizer whose text is re-tokenized, or a
# text the user expects the output to be (predicted output), or "auto": a copy after a strong n-gram match, else
# (and past the copy) the draft model (drafters/hybrid.py), or "suffix": the most frequent continuation of the
# text's end in an index over the prompt, the output and the session's earlier runs (drafters/suffix.py).
DRAFTERS = ("model", "ngram", "early-exit", "cross", "predicted", "auto", "suffix")
# How people read a drafter's name: the one table every view uses (dropdowns, race lanes, the break-even map).
DRAFTER_LABELS = {"model": "draft model", "ngram": "n-gram lookup", "early-exit": "early exit",
                  "cross": "cross-tokenizer", "predicted": "predicted output", "auto": "hybrid (copy, else model)",
                  "suffix": "suffix index"}
# How the target checks the guesses (core.verify): "pq" keeps a guess x with probability min(1, p(x)/q(x)) and
# repairs from normalize(max(0, p - q)) (Leviathan et al.); "strict" draws the target's own token at each position
# and keeps a guess only if it is that token (the default of vLLM's strict sampler, TensorRT-LLM, llama.cpp);
# "block" verifies the guesses jointly (Sun et al. 2024), keeping at least as many as "pq" in expectation.
# All three are exact; with a one-hot q (greedy, copied text) "pq" and "strict" keep a guess equally often.
VERIFY_LABELS = {"pq": "min(1, p/q) per token", "strict": "strict (target samples, guess must match)",
                 "block": "block (joint over the draft)"}
MAX_PREDICTION_CHARS = 100_000
MAX_NGRAM = 8


@dataclass(frozen=True)
class DecodeSettings:
    gamma: int = 4
    max_new_tokens: int = 64
    sampling: SamplingConfig = SamplingConfig()
    seed: int = 0
    chat: bool = False
    gamma_policy: str = "fixed"
    confidence_threshold: float = 0.4  # used by gamma_policy="confidence"
    # > 0: the draft's head covers ids below this, EOS and the text's own tokens; 0 = full vocabulary;
    # None = AUTO_DRAFT_VOCAB for large vocabularies, else full
    draft_vocab: int | None = None
    drafter: str = "model"
    ngram_max: int = 4  # ngram: longest suffix matched against the text so far (tried first)
    ngram_min: int = 1  # ngram: shortest suffix worth copying from
    exit_layer: int = 0  # early-exit: the target's first k layers draft; 0 = a quarter of its layers
    prediction: str = ""  # predicted: the text the output is expected to be (drafts from it)
    verify: str = "pq"  # one of VERIFY_MODES

    def validate(self) -> "DecodeSettings":
        whole_number(self.gamma, "gamma (draft length)", 1, MAX_GAMMA)
        whole_number(self.max_new_tokens, "max_new_tokens", 1, MAX_NEW_TOKENS)
        whole_number(self.seed, "seed", 0, 2**63 - 1)
        if self.gamma_policy not in GAMMA_POLICIES:
            raise InvalidInputError(f"gamma policy must be one of {', '.join(GAMMA_POLICIES)}, got {self.gamma_policy!r}")
        if self.draft_vocab is not None:
            whole_number(self.draft_vocab, "draft vocabulary limit", 0)
        ct = self.confidence_threshold
        if isinstance(ct, bool) or not isinstance(ct, (int, float)) or not 0 <= ct < 1:
            raise InvalidInputError(f"confidence threshold must be in [0, 1), got {self.confidence_threshold!r}")
        if self.drafter not in DRAFTERS:
            raise InvalidInputError(f"drafter must be one of {', '.join(DRAFTERS)}, got {self.drafter!r}")
        whole_number(self.ngram_min, "ngram_min", 1, MAX_NGRAM)
        whole_number(self.ngram_max, "ngram_max", self.ngram_min, MAX_NGRAM)
        whole_number(self.exit_layer, "exit_layer", 0, 1024)
        if not isinstance(self.prediction, str) or len(self.prediction) > MAX_PREDICTION_CHARS:
            raise InvalidInputError(f"the prediction must be text of at most {MAX_PREDICTION_CHARS} characters")
        # Only the empty string: whitespace can be the expected output (an indentation-only edit).
        if self.drafter == "predicted" and not self.prediction:
            raise InvalidInputError("the 'predicted' drafter needs a prediction: the text you expect the output to be")
        if self.verify not in VERIFY_MODES:
            raise InvalidInputError(f"verification must be one of {', '.join(VERIFY_MODES)}, got {self.verify!r}")
        self.sampling.validate()
        return self

    @property
    def seed_reproducible(self) -> bool:
        """Whether the same seed gives the same text on the same machine and dtype (see GAMMA_POLICIES)."""
        return self.gamma_policy in SEED_REPRODUCIBLE_POLICIES


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
