"""validate_custom_pair: id spelling, config-only checks, the size cap and the shared vocabulary, before weights.

Everything here runs on small local folders (configs and tokenizer files, no weights) or on a stand-in for the
hub API, so it needs no network; conftest sets HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import specdec.models.hub as hub
from specdec.core.errors import InvalidInputError, ModelLoadError, UnsupportedModelError, VocabularyMismatchError
from specdec.models.hub import check_model_id, estimate_parameters, human_count, validate_custom_pair
from specdec.models.tiny import tiny_tokenizer


def _qwen_config(vocab_size: int, **overrides):
    from transformers import Qwen2Config

    kw = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
              architectures=["Qwen2ForCausalLM"])
    kw.update(overrides)
    return Qwen2Config(**kw)


def _save(folder, config=None, tokenizer=None):
    folder.mkdir(parents=True, exist_ok=True)
    if config is not None:
        config.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory, tok):
    """A target and a draft folder: configs and the tiny tokenizer, no weights."""
    root = tmp_path_factory.mktemp("pair")
    target = _save(root / "target", _qwen_config(len(tok)), tok)
    draft = _save(root / "draft", _qwen_config(len(tok), num_hidden_layers=1), tok)
    return target, draft


def _no_weights_anywhere(*folders):
    from pathlib import Path

    return not any(p.suffix in (".safetensors", ".bin") for f in folders for p in Path(f).iterdir())


# ---------------------------------------------------------------------------------------------- accepted


def test_local_pair_passes_without_weights(tiny_folders):
    assert _no_weights_anywhere(*tiny_folders)
    assert validate_custom_pair(*tiny_folders) is None
    assert _no_weights_anywhere(*tiny_folders)  # nothing was written or fetched


def test_same_folder_for_both_passes(tiny_folders):
    validate_custom_pair(tiny_folders[0], tiny_folders[0])


# ------------------------------------------------------------------------------------------------ id spelling


@pytest.mark.parametrize(
    "bad, message",
    [
        ("", "empty"),
        ("   ", "empty"),
        (None, "empty"),
        (42, "empty"),
        (" Qwen/Qwen2.5-0.5B", "contains spaces"),
        ("Qwen/Qwen2.5 0.5B", "contains spaces"),
        ("Qwen/Qwen2.5-0.5B\n", "contains spaces"),
        ("../../etc", "'..' path parts"),
        ("models/../../secrets", "'..' path parts"),
        ("a" * 201, "limit is 200"),
        ("gpt2;rm -rf", "contains"),
        ("org/mo$del", r"contains '\$'"),
        ("embedded:qwen", "contains ':'"),
        ("https://huggingface.co/gpt2", "contains ':'"),
        ("~/models/x", "contains '~'"),
        ("Qwen/Qwen2.5\x00", "contains"),
        ("owner/name/extra", "not a local folder or a hub id"),
        ("-leading-dash", "not a local folder or a hub id"),
        ("/definitely/not/a/folder", "not a local folder or a hub id"),
        ("x" * 97, "not a local folder or a hub id"),  # hub names stop at 96 characters
    ],
)
def test_bad_ids_are_refused_before_anything_is_fetched(monkeypatch, bad, message):
    monkeypatch.setattr(hub, "hub_lookup", _fail("the hub must not be asked about a malformed id"))
    monkeypatch.setattr(hub, "check_config", _fail("no config may be read for a malformed id"))
    with pytest.raises(InvalidInputError, match=message):
        validate_custom_pair(bad, "Qwen/Qwen2.5-0.5B-Instruct")
    with pytest.raises(InvalidInputError, match=message):
        validate_custom_pair("Qwen/Qwen2.5-0.5B-Instruct", bad)


def _fail(why):
    def boom(*args, **kwargs):
        raise AssertionError(why)

    return boom


@pytest.mark.parametrize("good", ["gpt2", "Qwen/Qwen2.5-Coder-0.5B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct",
                                  "distilgpt2", "a.b_c-d/e.f_g-h"])
def test_hub_id_spelling_is_accepted(good):
    assert check_model_id(good) is False  # not a local folder: a hub id


def test_local_folders_can_be_turned_off(tiny_folders):
    assert check_model_id(tiny_folders[0]) is True
    with pytest.raises(InvalidInputError, match="is not a hub id"):
        check_model_id(tiny_folders[0], allow_local=False)


# --------------------------------------------------------------------------------------------- config checks


def test_not_a_causal_lm(tmp_path, tiny_folders):
    from transformers import BertConfig

    bert = _save(tmp_path / "bert", BertConfig(vocab_size=101, hidden_size=32, num_hidden_layers=1,
                                               num_attention_heads=2, intermediate_size=64))
    with pytest.raises(UnsupportedModelError, match="not a causal language model"):
        validate_custom_pair(tiny_folders[0], bert)


def test_remote_code_is_refused(tmp_path, tiny_folders, tok):
    folder = _save(tmp_path / "remote", _qwen_config(len(tok)), tok)
    cfg_path = tmp_path / "remote" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="trust_remote_code"):
        validate_custom_pair(folder, tiny_folders[1])


def test_folder_without_config(tmp_path, tiny_folders):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match="draft folder '.*empty' has no config.json"):
        validate_custom_pair(tiny_folders[0], str(empty))


# ------------------------------------------------------------------------------------------------- size cap


def test_big_config_is_too_large(tmp_path, tiny_folders):
    from transformers import LlamaConfig

    # Llama-2-7B's shape: 32000 x 4096 embeddings (untied), 32 layers, MLP 11008. Config only, no weights.
    big = _save(tmp_path / "llama7b", LlamaConfig(hidden_size=4096, num_hidden_layers=32,
                                                  architectures=["LlamaForCausalLM"]))
    with pytest.raises(UnsupportedModelError,
                       match=r"target '.*llama7b' is too large for this shared machine: ~6\.7B parameters, cap 4B"):
        validate_custom_pair(big, tiny_folders[1])
    with pytest.raises(UnsupportedModelError, match=r"draft '.*' is too large .*~6\.7B parameters, cap 4B"):
        validate_custom_pair(tiny_folders[0], big)


def test_cap_is_a_parameter(tiny_folders):
    n = estimate_parameters(_qwen_config(100))
    with pytest.raises(UnsupportedModelError, match="too large for this shared machine"):
        validate_custom_pair(*tiny_folders, max_params=1000)
    validate_custom_pair(*tiny_folders, max_params=10 * n)


def test_size_is_checked_before_tokenizers_are_loaded(tmp_path, tiny_folders):
    from transformers import LlamaConfig

    big = _save(tmp_path / "big-no-tokenizer", LlamaConfig(hidden_size=4096, num_hidden_layers=32))
    with pytest.raises(UnsupportedModelError, match="too large"):  # not a tokenizer error: there is none
        validate_custom_pair(big, tiny_folders[1])


@pytest.mark.parametrize(
    "name, make, expected, tolerance",
    [
        # Published totals: GPT-2 124M, Qwen2.5-1.5B 1.54B, Qwen2.5-0.5B 0.49B, Llama-2-7B 6.74B, SmolLM2-135M.
        ("gpt2", lambda: _cfg("GPT2Config"), 124_439_808, 0.01),
        ("qwen2.5-1.5b", lambda: _cfg("Qwen2Config", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                                      num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                                      tie_word_embeddings=True), 1_543_714_304, 0.01),
        ("qwen2.5-0.5b", lambda: _cfg("Qwen2Config", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                      num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                      tie_word_embeddings=True), 494_032_768, 0.01),
        ("llama-2-7b", lambda: _cfg("LlamaConfig", hidden_size=4096, num_hidden_layers=32), 6_738_415_616, 0.01),
        ("smollm2-135m", lambda: _cfg("LlamaConfig", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                      num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                      tie_word_embeddings=True), 134_515_008, 0.01),
    ],
)
def test_estimate_matches_published_sizes(name, make, expected, tolerance):
    assert abs(estimate_parameters(make()) - expected) / expected < tolerance


def _cfg(cls_name, **kw):
    import transformers

    return getattr(transformers, cls_name)(**kw)


def test_estimate_needs_the_basics():
    assert estimate_parameters(SimpleNamespace(model_type="mystery")) is None


@pytest.mark.parametrize("n, text", [(7_615_616_512, "7.6B"), (4e9, "4B"), (135_000_000, "135M"),
                                     (494_032_768, "494M"), (1_543_714_304, "1.5B"), (52_000, "52K"), (12, "12")])
def test_human_count(n, text):
    assert human_count(n) == text


# -------------------------------------------------------------------------------------------------- hub path


def _hub_config_from(folder):
    """check_config stand-in: hub ids resolve to a local folder's config, as if fetched."""
    from specdec.models.pair import check_config

    return lambda model_id: check_config(folder)


def test_hub_safetensors_metadata_wins_over_the_estimate(monkeypatch, tiny_folders):
    monkeypatch.setattr(hub, "check_config", _hub_config_from(tiny_folders[0]))
    info = SimpleNamespace(safetensors=SimpleNamespace(total=7_615_616_512, parameters={"BF16": 7_615_616_512}))
    calls = []

    class FakeApi:
        def model_info(self, repo_id, **kwargs):
            calls.append((repo_id, kwargs))
            return info

    monkeypatch.setattr("huggingface_hub.HfApi", FakeApi)
    expected = r"target 'Qwen/Qwen2.5-7B' is too large .*~7\.6B parameters, cap 4B"
    with pytest.raises(UnsupportedModelError, match=expected):
        validate_custom_pair("Qwen/Qwen2.5-7B", tiny_folders[1])
    assert calls[0][0] == "Qwen/Qwen2.5-7B" and calls[0][1]["expand"] == ["safetensors"]


def test_hub_without_safetensors_falls_back_to_the_config(monkeypatch, tiny_folders):
    monkeypatch.setattr(hub, "check_config", _hub_config_from(tiny_folders[0]))

    class FakeApi:
        def model_info(self, repo_id, **kwargs):
            return SimpleNamespace(safetensors=None)

    monkeypatch.setattr("huggingface_hub.HfApi", FakeApi)
    check = hub.inspect_model("someone/small-model", "target")
    assert not check.exact and check.parameters == estimate_parameters(check.config)


def test_unknown_hub_repo(monkeypatch):
    from huggingface_hub.errors import RepositoryNotFoundError

    class FakeApi:
        def model_info(self, repo_id, **kwargs):
            err = RepositoryNotFoundError.__new__(RepositoryNotFoundError)
            Exception.__init__(err, "404 Client Error")
            raise err

    monkeypatch.setattr("huggingface_hub.HfApi", FakeApi)
    monkeypatch.setattr(hub, "check_config", _fail("no config fetch for a repo the hub says does not exist"))
    with pytest.raises(ModelLoadError, match="'nobody/no-such-model' was not found on the Hugging Face hub"):
        validate_custom_pair("nobody/no-such-model", "gpt2")


def test_unreachable_hub_gives_an_offline_message(monkeypatch):
    class FakeApi:
        def model_info(self, repo_id, **kwargs):
            raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr("huggingface_hub.HfApi", FakeApi)
    with pytest.raises(ModelLoadError, match="hub cannot be reached from here") as exc:
        validate_custom_pair("specdec-tests/never-cached-model", "gpt2")
    assert not isinstance(exc.value, UnsupportedModelError)


def test_hub_offline_mode_gives_the_offline_message():
    # conftest sets HF_HUB_OFFLINE=1, so this goes through the real HfApi and transformers, offline.
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE"):
        validate_custom_pair("specdec-tests/never-cached-model", "specdec-tests/never-cached-draft")


# ----------------------------------------------------------------------------------------------- vocabulary


def test_different_vocabularies(tmp_path, tiny_folders):
    other = tiny_tokenizer()
    other.add_tokens(["<extra_token>"])
    draft = _save(tmp_path / "other-vocab", _qwen_config(len(other)), other)
    with pytest.raises(VocabularyMismatchError, match="use different vocabularies"):
        validate_custom_pair(tiny_folders[0], draft)


def test_same_size_different_entries(tmp_path, tiny_folders, tok):
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(reversed(list(tok.get_vocab())))}  # same tokens, other ids
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    shuffled = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>")
    assert len(shuffled) == len(tok)
    draft = _save(tmp_path / "shuffled", _qwen_config(len(tok)), shuffled)
    with pytest.raises(VocabularyMismatchError, match="same size with different entries"):
        validate_custom_pair(tiny_folders[0], draft)


def test_tokenizer_larger_than_the_logits(tmp_path, tok):
    target = _save(tmp_path / "narrow-target", _qwen_config(len(tok) - 5), tok)
    draft = _save(tmp_path / "narrow-draft", _qwen_config(len(tok)), tok)
    with pytest.raises(VocabularyMismatchError, match=f"tokenizer has {len(tok)} tokens but a model has only"):
        validate_custom_pair(target, draft)


def test_folder_without_tokenizer(tmp_path, tiny_folders, tok):
    bare = _save(tmp_path / "no-tokenizer", _qwen_config(len(tok)))
    with pytest.raises(ModelLoadError, match="tokenizer"):
        validate_custom_pair(tiny_folders[0], bare)


def test_identical_tokenizer_files_are_recognised_and_any_difference_is_not(tmp_path, tiny_folders):
    from specdec.models.pair import same_tokenizer_files

    target, draft = tiny_folders
    assert same_tokenizer_files(target, draft)  # saved from one tokenizer: the draft's load can be skipped
    other = tiny_tokenizer()
    other.add_tokens(["<extra_token>"])
    changed = _save(tmp_path / "other-vocab", _qwen_config(len(other)), other)
    assert not same_tokenizer_files(target, changed)
    assert not same_tokenizer_files(target, "Qwen/Qwen2.5-0.5B")  # a hub id: never assumed, loaded and compared
    bare = _save(tmp_path / "bare", _qwen_config(8))
    assert not same_tokenizer_files(target, bare) and not same_tokenizer_files(bare, bare)


def test_a_pair_of_folders_with_one_tokenizer_loads_it_once(tmp_path, tok, monkeypatch):
    import torch
    from transformers import Qwen2ForCausalLM

    import specdec.models.pair as pairs

    folders = []
    for name, layers in (("t", 2), ("d", 1)):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(_qwen_config(len(tok), num_hidden_layers=layers))
        model.save_pretrained(tmp_path / name)
        folders.append(_save(tmp_path / name, None, tok))
    loads = []
    real = pairs._load_tokenizer
    monkeypatch.setattr(pairs, "_load_tokenizer", lambda src: loads.append(src) or real(src))
    pair = pairs.load_pair("custom", target=folders[0], draft=folders[1], dtype="float32", device="cpu", shared=False)
    assert loads == [folders[0]] and len(pair.tokenizer) == len(tok)
