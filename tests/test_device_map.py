"""A target sharded by accelerate's device_map decodes exactly like the same model on one device.

CI has only a CPU, so `max_memory` forces the split: the input embeddings stay in RAM and the rest of the target is
offloaded to disk (accelerate streams those weights in per forward pass). Greedy and seeded sampled output must
equal the unsplit model's token for token.
"""

from __future__ import annotations

import gc
import os

import pytest

from specdec.cli import build_parser
from specdec.loop.decoder import SpeculativeDecoder
from specdec.loop.plain import plain_decode
from specdec.core.errors import ModelLoadError
from specdec.models.pair import load_pair, resolve_device_map
from specdec.core.sampling import SamplingConfig
from specdec.core.settings import DecodeSettings
from specdec.models.tiny import tiny_models, tiny_tokenizer

# bytes of RAM for the target: its embeddings and head fit, its decoder layers go to disk (accelerate also keeps
# room for the largest layer, so far less than this leaves even the embeddings on disk)
RAM_FOR_EMBEDDINGS = 200_000
# A hand-written map that cuts between the two decoder layers: each forward crosses from RAM to disk and back
MID_LAYER_SPLIT = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
                   "model.layers.1": "disk", "model.norm": "disk", "lm_head": "cpu"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-folders")
    tok = tiny_tokenizer()
    target, draft = tiny_models(len(tok), seed=3)
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return str(root / "target"), str(root / "draft")


def _pair(folders, **placement):
    t, d = folders
    return load_pair(target=t, draft=d, dtype="float32", device="cpu", shared=False, **placement)


@pytest.fixture(scope="module")
def whole(folders):
    return _pair(folders, device_map="none")


@pytest.fixture(scope="module", params=["auto+max_memory", "mid-layer dict"])
def split_and_whole(request, folders, whole):
    if request.param == "auto+max_memory":
        return _pair(folders, device_map="auto", max_memory={"cpu": RAM_FOR_EMBEDDINGS}), whole
    return _pair(folders, device_map=MID_LAYER_SPLIT), whole


def test_max_memory_forces_a_cpu_disk_split(split_and_whole):
    split, whole = split_and_whole
    placed = set(split.device_map.values())
    assert {"cpu", "disk"} <= placed, split.device_map
    assert split.device_map["model.embed_tokens"] == "cpu"
    assert str(split.device) == "cpu" and whole.device_map is None


def test_embeddings_on_disk_are_refused(folders):
    with pytest.raises(ModelLoadError, match="input embeddings"):
        _pair(folders, device_map="auto", max_memory={"cpu": 60_000})


@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_output_equals_the_unsplit_model(split_and_whole, gamma):
    split, whole = split_and_whole
    s = DecodeSettings(gamma=gamma, max_new_tokens=24)
    expected = plain_decode(whole, "def f(x):", s).ids
    assert plain_decode(split, "def f(x):", s).ids == expected
    dec = SpeculativeDecoder(split, "def f(x):", s)
    for _ in dec:
        pass
    assert dec.generated_ids == expected
    assert dec.totals.kept < dec.totals.drafted, "the test pair must reject some guesses (cache rollback)"


def test_sampled_output_equals_the_unsplit_model(split_and_whole):
    split, whole = split_and_whole
    s = DecodeSettings(gamma=4, max_new_tokens=24, sampling=SamplingConfig(temperature=1.0), seed=11)
    runs = []
    for pair in (whole, split):
        dec = SpeculativeDecoder(pair, "hello", s)
        for _ in dec:
            pass
        runs.append(dec.generated_ids)
    assert runs[0] == runs[1]


def test_offloaded_weights_are_deleted_with_the_model(folders):
    pair = _pair(folders, device_map="sequential", max_memory={"cpu": RAM_FOR_EMBEDDINGS})
    folder = pair.target._specdec_offload_dir.name
    # (safetensors checkpoints are read in place, so the folder may stay empty; other formats are copied here)
    assert os.path.isdir(folder)
    del pair
    gc.collect()
    assert not os.path.exists(folder)


def test_device_map_setting_and_refusals(monkeypatch):
    monkeypatch.delenv("SPECDEC_DEVICE_MAP", raising=False)
    assert resolve_device_map(None) is None
    monkeypatch.setenv("SPECDEC_DEVICE_MAP", "auto")
    assert resolve_device_map(None) == "auto"
    assert resolve_device_map("none") is None  # an explicit argument wins over the environment
    with pytest.raises(ModelLoadError, match="unknown device map"):
        resolve_device_map("everywhere")
    with pytest.raises(ModelLoadError, match="tiny pair"):
        load_pair("tiny", device="cpu", device_map="auto", shared=False)


def test_cli_flag(monkeypatch):
    args = build_parser().parse_args(["generate", "--prompt", "x", "--device-map", "auto"])
    assert args.device_map == "auto"
    args = build_parser().parse_args(["generate", "--prompt", "x"])
    assert args.device_map is None  # falls back to SPECDEC_DEVICE_MAP in load_pair
