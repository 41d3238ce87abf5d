"""The disk cache of pure-function results (specdec.models.disk_cache) and its users: the quantized draft's codes and
built layers (read or mapped back: the same layers, bit for bit; a corrupted or foreign entry ignored and
recomputed) and the plain steps a decoder times beside its rounds (they leave the run exactly as it was)."""

from __future__ import annotations

import copy

import pytest
import torch

from specdec.core.sampling import SamplingConfig
from specdec.core.settings import DecodeSettings
from specdec.loop.decoder import PLAIN_PROBE_MIN, PLAIN_PROBE_SKIP, SpeculativeDecoder
from specdec.models import disk_cache, quant
from specdec.models.quant import Int4Linear, Int8Linear, quantize

BF16 = torch.bfloat16


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setenv("SPECDEC_DISK_CACHE", "1")
    return tmp_path


def test_json_entries_round_trip_and_refuse_foreign_or_corrupted_ones(store):
    path = store / "verdicts" / "x.json"
    ident = {"cpu": "a", "torch": "1"}
    assert disk_cache.read_json(path, ident) is None
    assert disk_cache.write_json(path, ident, {"k": True})
    assert disk_cache.read_json(path, ident) == {"k": True}
    assert disk_cache.read_json(path, {"cpu": "b", "torch": "1"}) is None  # another machine's entry
    path.write_text(path.read_text().replace("true", "false"))  # content no longer matches its checksum
    assert disk_cache.read_json(path, ident) is None
    path.write_text("{not json")
    assert disk_cache.read_json(path, ident) is None


def test_tensor_entries_round_trip_and_refuse_foreign_or_corrupted_ones(store):
    path = store / "t.safetensors"
    ident = {"source": "abc"}
    tensors = {"a/q": torch.arange(12, dtype=torch.uint8).view(3, 4), "a/scales": torch.ones(3, dtype=BF16)}
    assert disk_cache.write_tensors(path, ident, tensors)
    back = disk_cache.read_tensors(path, ident)
    assert back is not None and all(torch.equal(back[k], v) for k, v in tensors.items())
    assert disk_cache.read_tensors(path, {"source": "abd"}) is None
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF  # one flipped bit in the last tensor's data
    path.write_bytes(bytes(raw))
    assert disk_cache.read_tensors(path, ident) is None


def test_mapped_entries_round_trip_aligned_and_refuse_foreign_or_corrupted_ones(store):
    path = store / "m.bin"
    ident = {"source": "abc"}
    tensors = {"a/dense": torch.randn(5, 7).to(BF16), "a/q": torch.arange(12, dtype=torch.uint8).view(3, 4),
               "b/empty": torch.zeros(0, 4, dtype=torch.int8), "b/scales": torch.rand(3)}
    assert disk_cache.write_mapped(path, ident, tensors)
    back = disk_cache.read_mapped(path, ident)
    assert back is not None and set(back) == set(tensors)
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
        assert back[k].data_ptr() % 64 == 0, k  # the int8/int4 kernels need aligned weights
    back["a/q"][0, 0] = 99  # copy-on-write: the file keeps its bytes
    assert torch.equal(disk_cache.read_mapped(path, ident)["a/q"], tensors["a/q"])
    assert disk_cache.read_mapped(path, {"source": "abd"}) is None
    raw = bytearray(path.read_bytes())
    raw[bytes(raw).rfind(tensors["b/scales"].numpy().tobytes())] ^= 0x01  # one flipped bit in a tensor's bytes
    path.write_bytes(bytes(raw))
    assert disk_cache.read_mapped(path, ident) is None
    path.write_bytes(raw[:100])  # a torn file
    assert disk_cache.read_mapped(path, ident) is None


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_built_layers_are_mapped_back_bit_for_bit_without_rebuilding(tiny_pair, store, monkeypatch, mode):
    fresh = quantize(copy.deepcopy(tiny_pair.draft).to(BF16), mode, cache=False)
    quantize(copy.deepcopy(tiny_pair.draft).to(BF16), mode)  # computes codes and layers, writes both
    assert list((store / "quant").glob(f"{mode}-built-*.bin"))

    def refuse(*_, **__):
        raise AssertionError("layers rebuilt although the cache holds them")

    for kind in (Int8Linear, Int4Linear):
        monkeypatch.setattr(kind, "from_codes", classmethod(refuse))
    mapped = quantize(copy.deepcopy(tiny_pair.draft).to(BF16), mode)
    for a, b in zip(_outputs(fresh), _outputs(mapped)):
        if a is not None:
            assert torch.equal(a, b)
    for (na, ta), (nb, tb) in zip(fresh.state_dict().items(), mapped.state_dict().items()):
        assert na == nb and ta.dtype == tb.dtype and torch.equal(ta, tb), na


def test_a_corrupted_or_foreign_built_entry_is_rebuilt(tiny_pair, store, monkeypatch):
    fresh = quantize(copy.deepcopy(tiny_pair.draft).to(BF16), "int4", cache=False)
    quantize(copy.deepcopy(tiny_pair.draft).to(BF16), "int4")
    (entry,) = (store / "quant").glob("int4-built-*.bin")
    raw = bytearray(entry.read_bytes())
    magic = len(disk_cache.MAPPED_MAGIC)
    start = disk_cache._aligned(magic + 8 + int.from_bytes(raw[magic : magic + 8], "little"))
    raw[start + 3] ^= 0x04  # a bit of the first stored tensor
    entry.write_bytes(bytes(raw))
    calls = []
    real = Int4Linear.from_codes.__func__
    monkeypatch.setattr(Int4Linear, "from_codes", classmethod(lambda cls, *a: calls.append(1) or real(cls, *a)))
    again = quantize(copy.deepcopy(tiny_pair.draft).to(BF16), "int4")
    assert calls, "a corrupted built entry was trusted"
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), again.state_dict().values()))
    # Another CPU or torch build packs for its own kernels: its entry is not this machine's.
    from specdec.models import prepack

    real_identity = prepack.kernel_identity
    monkeypatch.setattr(prepack, "kernel_identity", lambda dtype: {**real_identity(dtype), "cpu": {"model": "x"}})
    calls.clear()
    quantize(copy.deepcopy(tiny_pair.draft).to(BF16), "int4")
    assert calls


def _outputs(model, seed=0):
    x = torch.randn(3, 5, model.config.hidden_size, generator=torch.Generator().manual_seed(seed)).to(BF16)
    layers = [m for m in model.modules() if isinstance(m, (Int8Linear, Int4Linear))]
    return [m(x[..., : m.in_features]) if m.in_features <= x.shape[-1] else None for m in layers]


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_cached_codes_rebuild_the_same_layers_and_are_really_read(tiny_pair, store, monkeypatch, mode):
    fresh = quantize(copy.deepcopy(tiny_pair.draft).to(BF16), mode, cache=False)
    first = quantize(copy.deepcopy(tiny_pair.draft).to(BF16), mode)  # computes and writes the entry
    assert list((store / "quant").glob(f"{mode}-*.safetensors"))

    def refuse(*_):
        raise AssertionError("codes recomputed although the cache holds them")

    monkeypatch.setattr(Int8Linear, "codes", staticmethod(refuse))
    monkeypatch.setattr(Int4Linear, "codes", staticmethod(refuse))
    second = quantize(copy.deepcopy(tiny_pair.draft).to(BF16), mode)  # must come from the disk
    for a, b, c in zip(_outputs(fresh), _outputs(first), _outputs(second)):
        if a is not None:
            assert torch.equal(a, b) and torch.equal(a, c)
    for (na, ta), (nb, tb) in zip(fresh.state_dict().items(), second.state_dict().items()):
        assert na == nb and torch.equal(ta, tb), na
        # read codes are fresh allocations: the packed int8 kernel faults on the file's unaligned offsets
        assert tb.data_ptr() % 64 == 0, na


def test_a_corrupted_or_foreign_codes_entry_is_recomputed(tiny_pair, store, monkeypatch):
    fresh = quantize(copy.deepcopy(tiny_pair.draft).to(BF16), "int4", cache=False)
    quantize(copy.deepcopy(tiny_pair.draft).to(BF16), "int4")
    (entry,) = (store / "quant").glob("int4-*.safetensors")
    for built in (store / "quant").glob("*-built-*.bin"):
        built.unlink()  # the layers built from the codes: without them the next load reads the codes
    raw = bytearray(entry.read_bytes())
    raw[-3] ^= 0x10
    entry.write_bytes(bytes(raw))
    calls = []
    real = Int4Linear.codes
    monkeypatch.setattr(Int4Linear, "codes", staticmethod(lambda *a: calls.append(1) or real(*a)))
    again = quantize(copy.deepcopy(tiny_pair.draft).to(BF16), "int4")
    assert calls, "a corrupted entry was trusted"
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), again.state_dict().values()))
    # Other weights (a draft with one weight changed) have another identity: the entry above is not theirs.
    other = copy.deepcopy(tiny_pair.draft).to(BF16)
    with torch.no_grad():
        next(m for m in other.modules() if isinstance(m, torch.nn.Linear)).weight[0, 0] += 1
    calls.clear()
    quantize(other, "int4")
    assert calls


# --------------------------------------------------------------------------------- plain steps beside a run


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_plain_steps_timed_beside_a_run_leave_it_unchanged(tiny_pair, temperature):
    s = DecodeSettings(max_new_tokens=24, gamma=3, sampling=SamplingConfig(temperature=temperature), seed=5)
    # round one of a probed run asks for no guesses (plain decoding's first step): the same run without the
    # probe is the one whose round one is scheduled to ask for none
    plain = SpeculativeDecoder(tiny_pair, "hello world", s, gamma_schedule=[0])
    probed = SpeculativeDecoder(tiny_pair, "hello world", s, plain_probe=True)
    a, b = list(plain), list(probed)
    assert b[0].gamma == 0 and b[0].asked == 0 and b[0].asked_nothing and len(b[0].committed_ids) == 1
    assert not any(r.asked_nothing for r in b[1:])
    assert plain.generated_ids == probed.generated_ids
    assert [r.committed_ids for r in a] == [r.committed_ids for r in b]
    assert len(probed.plain_step_ms) >= min(PLAIN_PROBE_MIN, len(b) - 1 - PLAIN_PROBE_SKIP) and not plain.plain_step_ms
    rec = probed.record()
    assert rec.baseline_steps == len(probed.plain_step_ms)
    assert rec.baseline_ms_per_token == probed.plain_ms_per_token
    assert rec.metrics.speedup is not None  # the measured speedup needs no load-time costs now
    # the timed plain steps are not part of the run's own time
    assert probed.totals.elapsed_ms <= sum(r.round_ms for r in b) + 50
    # round one's pass is the prompt alone, timed as plain decoding's first step (both sides pay the prompt once)
    assert rec.baseline_prompt_ms and rec.baseline_prompt_ms == b[0].verify_ms
    assert plain.record().baseline_prompt_ms is None
    # a probed run replays from its record (round one's "asked nothing" included) to the same text
    from specdec.loop.decoder import rerun

    assert rerun(rec, tiny_pair).generated_ids == probed.generated_ids


def test_a_due_plain_step_is_timed_when_the_next_round_starts_not_before_the_round_is_handed_over(no_eos):
    """A page on the same machine draws a round while the next one runs: the plain step is timed then (as plain
    decoding streamed to that page would run), not in the quiet between a round's end and its update."""
    s = DecodeSettings(max_new_tokens=12, gamma=2, sampling=SamplingConfig(temperature=0.0))
    dec = SpeculativeDecoder(no_eos, "a b c", s, plain_probe=True)
    seen = []
    timed = dec.time_plain_step
    dec.time_plain_step = lambda: (seen.append(len(dec.rounds)), timed())[1]
    assert PLAIN_PROBE_SKIP == 1
    dec.step()
    dec.step()
    # none after the run's first update (the page swaps its whole view then: a cost paid once per run)
    assert seen == [] and dec.plain_step_ms == []
    dec.step()
    assert seen == [2] and len(dec.plain_step_ms) == 1  # due after round two, timed as round three started
    assert dec.rounds[2].round_ms >= 0 and dec.totals.elapsed_ms <= sum(r.round_ms for r in dec.rounds) + 50
    rest = list(dec)
    assert seen[0] == 2 and all(b > a for a, b in zip(seen, seen[1:]))
    assert not rest or len(seen) <= len(dec.rounds) - 1  # the last round never leaves a step behind


def test_two_plain_steps_stand_for_their_mean_not_their_slower_one(no_eos):
    s = DecodeSettings(max_new_tokens=12, gamma=2, sampling=SamplingConfig(temperature=0.0))
    dec = SpeculativeDecoder(no_eos, "a b c", s, plain_probe=True)
    dec.plain_step_ms = [400.0, 200.0]
    assert dec.plain_ms_per_token == 300.0
    dec.plain_step_ms = [400.0, 100.0, 200.0]
    assert dec.plain_ms_per_token == 200.0


def test_plain_cost_of_the_same_tokens_pays_the_prompt_once():
    from specdec.core.metrics import plain_ms_for

    assert plain_ms_for(0, 10.0, 200.0) == 0.0
    assert plain_ms_for(1, 10.0, 200.0) == 200.0  # the first token is the prompt pass's
    assert plain_ms_for(5, 10.0, 200.0) == 240.0
    assert plain_ms_for(5, 10.0) == 50.0  # no prompt pass timed: every token one step


def test_the_measured_speedup_counts_the_prompt_on_both_sides(tiny_pair):
    s = DecodeSettings(max_new_tokens=16, gamma=3, sampling=SamplingConfig(temperature=0.0))
    dec = SpeculativeDecoder(tiny_pair, "hello world", s, plain_probe=True)
    rounds = list(dec)
    rec = dec.record()
    m = rec.metrics
    plain_ms = rec.baseline_prompt_ms + (m.generated - 1) * rec.baseline_ms_per_token
    assert m.baseline_tok_s == pytest.approx(1e3 * m.generated / plain_ms)
    assert m.speedup == pytest.approx(plain_ms / sum(r.round_ms for r in rounds), rel=1e-6)
    from specdec.core.metrics import running_speedup, time_breakdown

    assert running_speedup(rounds, rec.baseline_ms_per_token, rec.baseline_prompt_ms)[-1] == pytest.approx(
        plain_ms / sum(r.round_ms for r in rounds))
    plain = time_breakdown(rounds, None, rec.baseline_ms_per_token, rec.baseline_prompt_ms).plain_ms
    assert sum(plain) == pytest.approx(plain_ms) and plain[0] >= rec.baseline_prompt_ms


def test_plain_steps_stay_within_their_share_of_the_run(no_eos):
    s = DecodeSettings(max_new_tokens=60, gamma=1, sampling=SamplingConfig(temperature=0.0))
    dec = SpeculativeDecoder(no_eos, "a b c", s, plain_probe=True)
    rounds = list(dec)
    spent = sum(dec.plain_step_ms)
    one = max(dec.plain_step_ms)
    assert len(dec.plain_step_ms) < len(rounds)
    assert spent <= 0.15 * sum(r.round_ms for r in rounds) + one + PLAIN_PROBE_MIN * one


# ------------------------------------------------------------------------- kernel verdicts kept between processes
# float32 layers: oneDNN packs them on every x86 CPU (bf16 packing needs AVX-512 or AVX-NE-CONVERT), and the
# verdict machinery does not depend on the dtype.


def _packed_model(n=80, k=128, layers=2, seed=0):
    from torch import nn

    from specdec.models.prepack import PrepackedLinear

    torch.manual_seed(seed)
    return nn.Sequential(*[PrepackedLinear.from_linear(nn.Linear(k, n if i % 2 == 0 else k, bias=False))
                           for i in range(layers)])


def test_kernel_verdicts_are_probed_once_then_read_and_give_the_same_bits(store, monkeypatch):
    from specdec.models import prepack

    monkeypatch.setattr(prepack, "_PROBED", {})
    model = _packed_model()
    first = prepack.check_widths(model, widths=[1, 2, 3])
    assert first["probed"] == 6 and first["read"] == 0 and first["layers"] == 2
    fresh = dict(prepack._PROBED)
    monkeypatch.setattr(prepack, "_PROBED", {})  # a new process: only the disk remembers
    monkeypatch.setattr(prepack, "widths_agree", lambda *a, **k: pytest.fail("probed again"))
    again = _packed_model(seed=1)
    second = prepack.check_widths(again, widths=[1, 2, 3])
    assert second["probed"] == 0 and second["read"] == 6
    assert prepack._PROBED == fresh
    x = torch.randn(3, 128)
    for layer in again:  # whichever kernel the verdicts pick, the bits are F.linear's
        for rows in (1, 2, 3):
            assert torch.equal(layer(x[:rows]), torch.nn.functional.linear(x[:rows], layer.weight))


def test_a_shape_whose_kernels_rarely_agree_frees_its_packed_copies_and_keeps_linears_bits(store, monkeypatch):
    """A shape whose packed kernel agrees with F.linear at fewer than half of the common widths (here planted: only
    at 12-16 rows of the first shape) drops its packed copies for good; every width then runs on F.linear, and a
    shape that agrees at most widths keeps its packing."""
    from specdec.models import prepack

    monkeypatch.setattr(prepack, "_PROBED", {})
    model = _packed_model()  # [80, 128] then [128, 128]
    planted = lambda n, k, widths, bias, dtype: {w: n != 80 or w >= 12 for w in widths}  # noqa: E731
    monkeypatch.setattr(prepack, "widths_agree", planted)
    counts = prepack.check_widths(model, widths=range(1, 17))
    rare, common = model
    assert counts["freed"] == 1 and rare.packing_freed and not common.packing_freed
    assert rare.packed is None and common.packed is not None
    x = torch.randn(16, 128)
    for rows in (1, 5, 12, 16):
        assert not rare.same_bits(rows) and rare.packed is None  # never packed again
        assert torch.equal(rare(x[:rows]), torch.nn.functional.linear(x[:rows], rare.weight))
    monkeypatch.setattr(prepack, "widths_agree", lambda *a, **k: pytest.fail("probed again"))
    monkeypatch.setattr(prepack, "_PROBED", {})  # a new process reads the same verdicts and frees the same layer
    again = _packed_model(seed=1)
    assert prepack.check_widths(again, widths=range(1, 17))["freed"] == 1 and again[0].packing_freed


def test_a_corrupted_or_foreign_verdict_file_is_probed_again(store, monkeypatch):
    from specdec.models import prepack

    monkeypatch.setattr(prepack, "_PROBED", {})
    prepack.check_widths(_packed_model(), widths=[1, 2])
    (entry,) = (store / "kernels").glob("*.json")
    doc = entry.read_text()
    flipped = doc.replace("false", "TRUE_").replace("true", "false").replace("TRUE_", "true")
    assert flipped != doc
    entry.write_text(flipped)  # verdicts changed without their checksum: a corrupted entry
    monkeypatch.setattr(prepack, "_PROBED", {})
    assert prepack.check_widths(_packed_model(), widths=[1, 2])["probed"] == 4
    # Another CPU or torch build has another identity, so another file: ours is not read for it.
    real = prepack.kernel_identity
    monkeypatch.setattr(prepack, "kernel_identity", lambda dtype: {**real(dtype), "torch": "0.0-elsewhere"})
    monkeypatch.setattr(prepack, "_PROBED", {})
    assert prepack.check_widths(_packed_model(), widths=[1, 2])["probed"] == 4
    assert len(list((store / "kernels").glob("*.json"))) == 2


def test_the_dense_crossover_is_measured_once_per_shape_then_read(store, monkeypatch):
    """settle_dense_rows times each (kind, shape) once, writes it, and a second model reads it; each layer then
    takes the dense matmul exactly above its crossover (bits of F.linear on the dense weight) and the packed kernel
    at or below it."""
    gen = torch.Generator().manual_seed(0)

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(Int8Linear.from_weight(torch.randn(48, 64, generator=gen).to(BF16)),
                                   Int8Linear.from_weight(torch.randn(48, 64, generator=gen).to(BF16)),
                                   Int4Linear.from_weight(torch.randn(64, 64, generator=gen).to(BF16)))

    timed = []
    real = quant.measure_dense_rows
    monkeypatch.setattr(quant, "measure_dense_rows", lambda layers: timed.append(len(layers)) or real(layers))
    first = model()
    assert quant.settle_dense_rows(first) == {"read": 0, "measured": 2} and timed == [2, 1]
    second = model()
    assert quant.settle_dense_rows(second) == {"read": 2, "measured": 0} and timed == [2, 1]
    assert [m.dense_rows for m in first] == [m.dense_rows for m in second]
    layer = second[0]
    x = torch.randn(5, 64, generator=gen).to(BF16)
    for cut, want in ((0, torch.nn.functional.linear(x, layer.dense)), (16, layer.packed(x))):
        layer.dense_rows = cut
        assert torch.equal(layer(x), want)
    layer.dense_rows = 3
    assert layer.select_rows(slice(0, 8)).dense_rows == 3  # a reduced head keeps its layer's crossover


def test_a_corrupted_crossover_file_is_measured_again(store):
    layer = Int8Linear.from_weight(torch.randn(32, 64).to(BF16))
    quant.settle_dense_rows(torch.nn.Sequential(layer))
    (path,) = (store / "kernels").glob("crossover-*.json")
    path.write_text("{not json")
    assert quant.settle_dense_rows(torch.nn.Sequential(layer)) == {"read": 0, "measured": 1}
