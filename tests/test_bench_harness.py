"""The bench harness (specdec/bench/harness.py) on its own: schedule, warm-up, medians, formatting, the JSON tail."""

from __future__ import annotations

import json

import pytest

from specdec.bench import harness as h
from specdec.core.settings import DecodeSettings


def test_rotation_and_interleaving_order():
    assert h.rotated("ABCD", 0) == list("ABCD") and h.rotated("ABCD", 1) == list("BCDA")
    assert h.rotated("ABCD", 6) == list("CDAB")  # wraps around
    order = [(rep, job, "".join(o)) for rep, job, o in h.interleaved(["x", "y", "z"], "ABC", 2)]
    assert order == [(1, "x", "ABC"), (1, "y", "BCA"), (1, "z", "CAB"),
                     (2, "x", "BCA"), (2, "y", "CAB"), (2, "z", "ABC")]
    # over one repeat of as many jobs as contenders, each contender goes first once
    assert sorted(o[0] for _, _, o in h.interleaved(range(3), "ABC", 1)) == list("ABC")
    # an offset shifts the start (one job per call: rotated by offset + repeat - 1)
    assert ["".join(o) for _, _, o in h.interleaved(["t"], "PNQ", 3, offset=1)] == ["NQP", "QPN", "PNQ"]


class Fake:
    """A contender that records its calls and produces `n` tokens in `sec` seconds."""

    def __init__(self, name, n=4, sec=2.0):
        self.name, self.n, self.sec, self.calls = name, n, sec, []

    def __call__(self, prompt, s):
        self.calls.append((prompt, s))
        return h.Timed(list(range(self.n)), self.sec)


def test_warm_up_runs_every_contender_once_briefly():
    a, b = Fake("a"), Fake("b")
    h.warm_up([a, b], "p", DecodeSettings(gamma=7, max_new_tokens=64))
    assert [(p, s.max_new_tokens, s.gamma) for p, s in a.calls + b.calls] == [("p", h.WARM_UP_TOKENS, 7)] * 2


def test_run_interleaved_warms_up_then_records_every_run_with_its_settings():
    a, b = Fake("a", 6, 3.0), Fake("b", 4, 1.0)
    jobs = h.jobs_for({"code": [("def f", False)], "chat": [("hi", True)]}, ["greedy", "sampled"])
    assert [(j.mode, j.kind, j.chat) for j in jobs] == [("greedy", "code", False), ("greedy", "chat", True),
                                                        ("sampled", "code", False), ("sampled", "chat", True)]
    lines = []
    samples = h.run_interleaved(jobs, [h.Contender("a", a), h.Contender("b", b)], 2, DecodeSettings(gamma=3),
                                say=lines.append)
    assert len(a.calls) == len(b.calls) == 1 + 4 * 2  # warm-up, then 4 jobs x 2 repeats
    assert a.calls[0][1].max_new_tokens == h.WARM_UP_TOKENS
    assert [x.contender for x in samples[:4]] == ["a", "b", "b", "a"]  # rotated per job
    assert len(samples) == len(lines) == 16 and "tok/s" in lines[0]
    for (p, s), x in zip(a.calls[1:], [x for x in samples if x.contender == "a"]):
        assert p == x.prompt and s.gamma == 3 and s.chat == (x.kind == "chat")
        assert s.sampling.temperature == (0.7 if x.mode == "sampled" else 0.0)
    assert [s.seed for _, s in a.calls[1:]] == [1] * 4 + [2] * 4  # the seed is the repeat's number
    assert samples[0].tokens == 6 and samples[0].tok_s == pytest.approx(2.0)
    assert h.by_group(samples, ["greedy"], ["chat"]) == {"greedy/chat": [x for x in samples
                                                                         if (x.mode, x.kind) == ("greedy", "chat")]}


def test_medians_and_pooling():
    assert h.middle([3, 1, 2]) == 2 and h.middle([4, 1, 3, 2]) == 3  # the upper one of an even count
    assert h.upper_median([None, 5.0, 1.0]) == 5.0 and h.upper_median([None]) is None and h.upper_median([]) is None
    s = lambda prompt, tok, sec, mode="greedy": h.Sample("c", "code", mode, prompt, tok, sec)  # noqa: E731
    # prompt p: repeats at 10/2, 10/4, 10/5 tok/s -> the median run is 10 tokens in 4 s; prompt q: 30 tokens in 2 s
    xs = [s("p", 10, 2.0), s("p", 10, 4.0), s("p", 10, 5.0), s("q", 30, 2.0)]
    assert h.median_tok_s(xs) == pytest.approx(40 / 6)
    assert h.median_tok_s(xs + [s("p", 1, 1.0, "sampled")]) == pytest.approx(41 / 7)  # modes are medianed apart
    assert h.pooled_tok_s(xs) == pytest.approx(60 / 13) and h.pooled_tok_s([]) == 0.0
    assert h.ratio(3.0, 2.0) == 1.5 and h.ratio(3.0, 0.0) is None and h.ratio(None, 2.0) is None
    assert h.ratio(0.0, 2.0) == 0.0


def test_formatting_and_tables():
    assert h.fmt(None) == "-" and h.fmt(1.006) == "1.01" and h.fmt(0.1234, "{:.3f}") == "0.123"
    assert h.fmt(7, "{:d}") == "7" and h.fmt(0.834, "{:.0%}") == "83%"
    cols = [h.Column("name", 6, "name", "{}", left=True), h.Column("x", 5, "x"),
            h.Column("twice", 6, lambda r: None if r["x"] is None else 2 * r["x"], "{:.1f}")]
    lines = h.table(cols, [{"name": "ab", "x": 1.5}, {"name": "long name", "x": None}], rule=True)
    assert lines == ["name       x  twice",
                     "-------------------",
                     "ab      1.50    3.0",
                     "long name     -      -"]
    assert h.table(cols, [])[1:] == []  # no rule unless asked


def test_write_result_writes_the_file_and_says_where(tmp_path, monkeypatch, capsys):
    out = tmp_path / "a" / "b.json"
    assert h.write_result({"x": [1, 2]}, str(out), "ignored.json", note=" (3 s)") == out
    from specdec.models.pair import cpu_name

    cpu = cpu_name()
    assert json.loads(out.read_text()) == {"x": [1, 2], "cpu": cpu}  # every result says which CPU it came from
    assert cpu and json.loads(out.read_text())["cpu"] == cpu
    assert f"wrote {out} (3 s)" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)  # no --out: the file given as the default
    path = h.write_result({"y": 1}, None, "bench-results/mode.json")
    assert str(path) == "bench-results/mode.json" and json.loads((tmp_path / path).read_text()) == {"y": 1, "cpu": cpu}
    h.write_result({"z": 1}, None)
    assert json.loads((tmp_path / h.BENCH_OUT).read_text()) == {"z": 1, "cpu": cpu}
    h.write_result({"z": 1, "cpu": "the machine a GPU run named"}, None)
    assert json.loads((tmp_path / h.BENCH_OUT).read_text())["cpu"] == "the machine a GPU run named"


def test_every_bench_mode_reads_its_defaults_from_the_one_table():
    import argparse

    from specdec.bench import defaults as d
    from specdec.bench.cli import add_bench_args
    from specdec.core.errors import InvalidInputError

    ap = argparse.ArgumentParser()
    add_bench_args(ap)
    bare = ap.parse_args([])
    assert (bare.kinds, bare.modes, bare.out, bare.max_new_tokens, bare.repeats) == (None, None, None, None, None)
    run = d.resolve(bare, "engines")
    assert (run.kinds, run.modes, run.max_new_tokens, run.repeats, run.out) == (
        ["code", "prose"], ["greedy"], 48, 2, "bench-results/engines.json")
    quick = d.resolve(ap.parse_args(["--quick", "--gamma", "auto"]), "quant-draft")
    assert (quick.max_new_tokens, quick.repeats, quick.gamma, quick.fixed_gamma) == (20, 1, None, d.FIXED_GAMMA)
    assert quick.out == "bench-results/quant-draft.json" and "grounded" in quick.kinds
    given = d.resolve(ap.parse_args(["--kinds", "code,prose,chat", "--modes", "sampled", "--max-new-tokens", "7",
                                     "--repeats", "5", "--gamma", "3", "--out", "x.json"]), "engines")
    assert (given.kinds, given.modes, given.max_new_tokens, given.repeats, given.gamma, given.out) == (
        ["code", "prose", "chat"], ["sampled"], 7, 5, 3, "x.json")  # an explicit value is kept, even the usual one
    assert d.resolve(ap.parse_args(["--drafter", "ngram"]), "drafter").out == "bench-results/drafter-ngram.json"
    assert d.resolve(bare, "suite").kinds == list(d.SUITE)
    with pytest.raises(InvalidInputError, match="whole number or 'auto'"):
        d.resolve(ap.parse_args(["--gamma", "four"]), "speed")
    # Every mode the command dispatches has a row, and no mode module keeps defaults of its own.
    import inspect

    from specdec.bench import cli
    assert set(d.BENCH_DEFAULTS) == {"speed", "drafter", "batch", "tree", "suite", "engines", "quant-draft",
                                     "verify-modes", "predicted", "overhead"}
    assert inspect.getsource(cli.cmd_bench).count("import cmd_") == len(d.BENCH_DEFAULTS)


def test_sampling_modes():
    assert h.sampling_for("greedy").greedy and h.sampling_for("sampled").temperature == 0.7
    assert h.split_list("greedy,,sampled,") == ["greedy", "sampled"]
    assert h.hf_sampling(DecodeSettings()) == {"do_sample": False}
    kw = h.hf_sampling(DecodeSettings(sampling=h.sampling_for("sampled")))
    assert kw["do_sample"] and kw["temperature"] == 0.7 and kw["top_k"] is None


def test_timed_runs_on_the_tiny_pair(tiny_pair):
    s = DecodeSettings(gamma=3, max_new_tokens=6)
    plain, spec = h.timed_plain(tiny_pair, "def f(x):", s), h.timed_spec(tiny_pair, "def f(x):", s)
    assert plain.ids == spec.ids and plain.seconds > 0 and not plain.rounds
    assert spec.rounds and sum(len(r.committed_ids) for r in spec.rounds) == spec.tokens
    hf = h.timed_generate(tiny_pair, "def f(x):", s)
    assert 0 < hf.tokens <= 6 and hf.seconds > 0
    before = tiny_pair.draft.generation_config.to_dict()
    gc = h.constant_gamma(tiny_pair.draft.generation_config, 5)
    assert (gc.num_assistant_tokens, gc.num_assistant_tokens_schedule) == (5, "constant")
    assert tiny_pair.draft.generation_config.to_dict() == before
