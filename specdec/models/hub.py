"""Check a custom draft/target pair before any weights are downloaded.

Loading a pair someone typed into a public app can cost minutes of download and gigabytes of memory, and fail
only at the end. `validate_custom_pair` answers the questions that decide it from small files alone:

1. Is each id a local folder or a well-formed hub id (and nothing that walks out of a folder)?
2. Is it a causal LM built into transformers (config.json only, no remote code)?
3. Does it fit this machine? Hub safetensors metadata gives the exact parameter count when the hub answers;
   otherwise it is estimated from the config.
4. Do draft and target share one vocabulary (tokenizer files only)?

It raises the same errors `load_pair` would, just earlier: InvalidInputError for a malformed id, ModelLoadError
(missing model, hub unreachable), UnsupportedModelError (not a causal LM, remote code, too large) and
VocabularyMismatchError.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from specdec.core.errors import InvalidInputError, ModelLoadError, UnsupportedModelError, VocabularyMismatchError
from specdec.models.pair import _load_tokenizer, check_config, same_vocabulary

DEFAULT_MAX_PARAMS = 4e9
MAX_ID_LENGTH = 200  # hub ids are at most 96 characters; local paths get some room beyond that
ID_CHARS = re.compile(r"[A-Za-z0-9._/-]+")
HUB_TIMEOUT_S = 10.0

# Families whose MLP is two matrices (up, down); the llama-style default is gated: gate, up and down.
UNGATED_MLP = {
    "gpt2", "gpt_neox", "gpt_neox_japanese", "gptj", "gpt_bigcode", "codegen", "opt", "bloom", "falcon", "phi",
    "starcoder2", "mpt", "biogpt", "xglm", "gpt_neo", "ctrl", "openai-gpt", "persimmon", "stablelm",
}


# ------------------------------------------------------------------------------------------------ public


def validate_custom_pair(
    target_id: str,
    draft_id: str,
    max_params: float = DEFAULT_MAX_PARAMS,
    *,
    allow_local: bool = True,
) -> None:
    """Raise a SpecDecError, with a message for the person who typed the ids, if the pair cannot be loaded here.

    Downloads nothing but configs, tokenizer files and hub metadata. `max_params` caps each model's parameter
    count; `allow_local=False` accepts hub ids only (for a public deployment that should not read its own disk).
    """
    pair = ((target_id, "target"), (draft_id, "draft"))
    for model_id, role in pair:  # both spellings first: a typo in the draft should not wait on the hub
        check_model_id(model_id, role, allow_local)
    models = [inspect_model(model_id, role, allow_local) for model_id, role in pair]
    for m in models:
        check_size(m, max_params)
    check_shared_vocabulary(*models)


def check_size(m: "ModelCheck", max_params: float = DEFAULT_MAX_PARAMS) -> None:
    """Refuse a model over the parameter cap of this machine (counted or estimated before any download)."""
    if m.parameters > max_params:
        raise UnsupportedModelError(
            f"{m.role} '{m.model_id}' is too large for this shared machine: ~{human_count(m.parameters)} "
            f"parameters, cap {human_count(max_params)}"
        )


@dataclass
class ModelCheck:
    model_id: str
    role: str  # "target" or "draft", for messages
    source: str  # what transformers loads: the expanded local path or the hub id
    config: object
    parameters: int
    exact: bool  # True when counted from hub safetensors metadata, False when estimated from the config


def inspect_model(model_id: str, role: str = "model", allow_local: bool = True) -> ModelCheck:
    """Syntax, config and size of one model; the hub is asked for metadata only when the id is a hub id."""
    local = check_model_id(model_id, role, allow_local)
    source = str(Path(model_id).expanduser()) if local else model_id
    if local and not (Path(source) / "config.json").is_file():
        raise ModelLoadError(
            f"{role} folder '{model_id}' has no config.json; a model folder holds config.json, the tokenizer "
            "files and the weights, as save_pretrained writes them"
        )
    hub = None if local else hub_lookup(model_id)
    if hub is not None and hub.missing:
        raise ModelLoadError(
            f"{role} '{model_id}' was not found on the Hugging Face hub; check the spelling (private and gated "
            "models need a token the app does not have)"
        )
    try:
        config = check_config(source)
    except UnsupportedModelError:
        raise
    except ModelLoadError as exc:
        if hub is not None and not hub.reachable:
            raise ModelLoadError(
                f"the Hugging Face hub cannot be reached from here (offline, or HF_HUB_OFFLINE is set), so {role} "
                f"'{model_id}' cannot be checked or downloaded; pick the built-in pair or a local folder"
            ) from exc
        raise
    if hub is not None and hub.parameters:
        return ModelCheck(model_id, role, source, config, hub.parameters, exact=True)
    estimate = estimate_parameters(config)
    if estimate is None:
        raise UnsupportedModelError(
            f"the size of {role} '{model_id}' cannot be worked out from its config (no hidden size, layer count or "
            "vocabulary size), so it cannot be checked against this machine's limit"
        )
    return ModelCheck(model_id, role, source, config, estimate, exact=False)


def check_model_id(model_id, role: str = "model", allow_local: bool = True) -> bool:
    """Validate the spelling of an id; return True for an existing local folder, False for a hub id."""
    if not isinstance(model_id, str) or not model_id.strip():
        raise InvalidInputError(f"the {role} model id is empty; type a hub id such as Qwen/Qwen2.5-0.5B-Instruct")
    shown = model_id if len(model_id) <= 60 else model_id[:57] + "..."
    if len(model_id) > MAX_ID_LENGTH:
        raise InvalidInputError(f"the {role} model id is {len(model_id)} characters long; the limit is {MAX_ID_LENGTH}")
    if any(ch.isspace() for ch in model_id):
        raise InvalidInputError(f"the {role} model id '{shown}' contains spaces; hub ids look like owner/name")
    if not ID_CHARS.fullmatch(model_id):
        bad = sorted({ch for ch in model_id if not ID_CHARS.fullmatch(ch)})
        raise InvalidInputError(
            f"the {role} model id '{shown}' contains {', '.join(repr(c) for c in bad)}; only letters, digits and "
            ". _ - / are allowed"
        )
    if ".." in model_id.split("/"):
        raise InvalidInputError(f"the {role} model id '{shown}' may not contain '..' path parts")
    if allow_local and Path(model_id).is_dir():
        return True
    if not _hub_id_syntax(model_id):
        where = "a local folder or a hub id" if allow_local else "a hub id"
        raise InvalidInputError(
            f"the {role} model id '{shown}' is not {where}; hub ids look like owner/name, e.g. "
            "Qwen/Qwen2.5-0.5B-Instruct"
        )
    return False


def _hub_id_syntax(model_id: str) -> bool:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(model_id)
    except HFValidationError:
        return False
    return True


# ------------------------------------------------------------------------------------------------- hub


@dataclass
class HubLookup:
    reachable: bool
    missing: bool = False
    parameters: int | None = None  # safetensors total, when the repository has safetensors weights


def hub_lookup(model_id: str) -> HubLookup:
    """Ask the hub for the model's safetensors metadata (a small JSON answer, no files)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled, RepositoryNotFoundError

    try:
        info = HfApi().model_info(model_id, expand=["safetensors"], timeout=HUB_TIMEOUT_S)
    except RepositoryNotFoundError:
        return HubLookup(reachable=True, missing=True)
    except OfflineModeIsEnabled:
        return HubLookup(reachable=False)
    except HfHubHTTPError:
        # The hub answered, with an error that is not "no such repo" (rate limit, server trouble): fall back
        # to the config estimate rather than refusing a model that may be fine.
        return HubLookup(reachable=True)
    except Exception:  # noqa: BLE001 - DNS, refused connections and timeouts surface as several client types
        return HubLookup(reachable=False)
    st = getattr(info, "safetensors", None)
    total = getattr(st, "total", None)
    return HubLookup(reachable=True, parameters=int(total) if isinstance(total, int) and total > 0 else None)


# ------------------------------------------------------------------------------------------------ size


def _first(cfg, *names):
    for name in names:
        value = getattr(cfg, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def estimate_parameters(config) -> int | None:
    """Parameter count of a decoder-only transformer from its config, or None when the config lacks the basics.

    embeddings (vocab x hidden, twice when the output head is untied) + layers x (attention + MLP), with
    grouped-query attention, gated (3-matrix) or plain (2-matrix) MLPs and mixture-of-experts counted in.
    Norms and biases are left out: they are well under 1% of any model this guards against.
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = _first(text, "hidden_size", "n_embd", "d_model")
    layers = _first(text, "num_hidden_layers", "n_layer", "num_layers")
    vocab = _first(text, "vocab_size")
    if not (hidden and layers and vocab):
        return None
    heads = _first(text, "num_attention_heads", "n_head", "num_heads")
    head_dim = _first(text, "head_dim") or (hidden // heads if heads else None)
    if heads and head_dim:
        kv_heads = _first(text, "num_key_value_heads", "num_kv_heads") or heads
        if getattr(text, "multi_query", False):  # GPT-BigCode, Falcon: one shared key/value head
            kv_heads = 1
        attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q and o, k and v
    else:
        attention = 4 * hidden * hidden
    intermediate = _first(text, "intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size") or 4 * hidden
    matrices = 2 if getattr(text, "model_type", "") in UNGATED_MLP else 3
    experts = _first(text, "num_local_experts", "num_experts", "n_routed_experts") or 1
    expert_size = _first(text, "moe_intermediate_size") if experts > 1 else None
    mlp = matrices * hidden * (expert_size or intermediate) * experts
    tied = getattr(config, "tie_word_embeddings", getattr(text, "tie_word_embeddings", True))
    embeddings = vocab * hidden * (1 if tied else 2)
    positions = (_first(text, "n_positions") or 0) * hidden  # learned absolute positions (GPT-2 style)
    return embeddings + positions + layers * (attention + mlp)


def human_count(n: float) -> str:
    """7_615_616_512 -> '7.6B', 4e9 -> '4B', 135_000_000 -> '135M'."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            value = n / scale
            return f"{value:.1f}".rstrip("0").rstrip(".") + suffix if value < 100 else f"{value:.0f}{suffix}"
    return f"{n:.0f}"


# ------------------------------------------------------------------------------------------- vocabulary


def check_shared_vocabulary(target: ModelCheck, draft: ModelCheck) -> None:
    """Draft and target must index the same tokens, and both models must have a logit for every one of them."""
    target_tok = _load_tokenizer(target.source)
    draft_tok = target_tok if draft.source == target.source else _load_tokenizer(draft.source)
    if not same_vocabulary(target_tok, draft_tok):
        raise VocabularyMismatchError(
            f"draft '{draft.model_id}' and target '{target.model_id}' use different vocabularies "
            f"({len(draft_tok)} vs {len(target_tok)} tokens, or the same size with different entries); "
            "speculative decoding needs one shared tokenizer"
        )
    logits = [v for v in (_vocab_size(target.config), _vocab_size(draft.config)) if v]
    if logits and len(target_tok) > min(logits):
        raise VocabularyMismatchError(
            f"the tokenizer has {len(target_tok)} tokens but a model has only {min(logits)} logits; "
            "some tokens could never be scored"
        )


def _vocab_size(config) -> int | None:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return _first(text, "vocab_size")
