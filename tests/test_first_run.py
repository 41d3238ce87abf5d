"""The parts of scripts/first_run.py (what a new visitor meets) and scripts/cli_first_run.py (the command line's first
run against a warm one): reading the stats panel and the race summary the
app really renders, and the /generate inputs it sends for the first example."""

from __future__ import annotations

import json
import time

import pytest

from components.stats import render_stats
from specdec.core.settings import DecodeSettings
from specdec.loop.decoder import SpeculativeDecoder
from specdec.loop.race import Race, parse_lanes
from specdec.prompts import GROUNDED
from tests.conftest import load_script

first_run = load_script("first_run")


def test_the_speedup_and_its_plain_cost_are_read_from_the_rendered_stats_panel(tiny_pair):
    dec = SpeculativeDecoder(tiny_pair, "hello hello hello", DecodeSettings(max_new_tokens=16), plain_probe=True)
    for _ in dec:
        pass
    rec = dec.record()
    m = rec.metrics
    panel = render_stats(m, rec.baseline_steps)
    assert first_run.speedup_of(panel) == round(m.speedup, 2)
    assert first_run.baseline_ms_of(panel) == round(m.baseline_step_ms)
    assert f"median of {rec.baseline_steps} plain decoding step" in panel
    assert f"its prompt pass ({rec.baseline_prompt_ms:.0f} ms, timed in this run)" in panel
    assert first_run.speedup_of(render_stats(None)) is None


def test_the_race_lane_of_the_examples_drafter_is_found(tiny_pair):
    example = GROUNDED[0]
    lanes = parse_lanes(f"model:2, {example['drafter']}:{example['gamma']}")
    race = Race(tiny_pair, "a b a b a b", DecodeSettings(max_new_tokens=8), lanes)
    for _ in race:
        pass
    summary = race.summary()
    want = next(lane["speedup"] for lane in summary["lanes"] if lane["drafter"] == example["drafter"])
    assert first_run.lane_speedup(summary, example["drafter"]) == want is not None
    assert first_run.lane_speedup(summary, "cross") is None


def test_the_race_lane_speedup_is_read_from_the_rendered_lane(tiny_pair):
    from components.race import render_race

    race = Race(tiny_pair, "a b a b a b", DecodeSettings(max_new_tokens=8), parse_lanes("ngram:4"))
    for _ in race:
        pass
    page = render_race(race.view())
    lane = page[page.index('data-lane="1"'):]
    assert first_run.race_lane_speedup_html(lane) == round(race.speedup(1), 2)
    assert first_run.race_lane_speedup_html(page[:page.index('data-lane="1"')]) == 1.0  # the plain lane: 1.00×
    assert first_run.race_lane_speedup_html("<span>speedup <b>–</b></span>") is None


def test_each_run_is_compared_with_the_race_lane():
    runs = [{"speedup_shown": 3.0}, {"speedup_shown": 4.5}, {"speedup_shown": None}]
    assert first_run.shown_over(runs, 4.0) == [0.75, 1.125, None]
    assert first_run.shown_over(runs, None) == [None, None, None]


def test_fewer_than_two_runs_are_refused():
    with pytest.raises(SystemExit):
        first_run.main(["--runs", "1"])


def test_the_first_example_is_sent_with_its_own_settings():
    example = GROUNDED[0]
    controls = first_run.example_controls(example, "default", 64)
    assert controls[:5] == [example["prompt"], example["chat"], example["gamma"], 64, example["temperature"]]
    assert controls[8] == "default" and controls[11] == example["drafter"]
    assert first_run.READY.search("[specdec]  3.1 s  default: models ready in 12.5 s").group(1) == "12.5"


def test_the_load_progress_only_moves_forward_and_ends_full():
    from ui.loader import progress_bar, progress_fraction

    steps = ([f"assembling qwen2.5-coder-1.5b-instruct.gguf: part {i}/22" for i in range(1, 23)]
             + ["converting qwen2.5-coder-1.5b-instruct.gguf to safetensors (one time, about a minute)"]
             + [f"assembling qwen2.5-coder-0.5b-instruct.gguf: part {i}/6" for i in range(1, 7)]
             + ["converting qwen2.5-coder-0.5b-instruct.gguf to safetensors (one time, about a minute)",
                "loading tokenizer (embedded:x)", "loading target embedded:x (bfloat16, cpu)", "loading draft x",
                "target and draft loaded", "prepacking the target's linear layers for the CPU",
                "checking the packed kernels on this CPU: [1536, 1536] at 64 pass widths (once)",
                "quantizing the draft (int4)",
                "measuring the plain per-token cost of both models", "models ready in 12.0 s"])
    fractions = [progress_fraction(m) for m in steps]
    assert None not in fractions and fractions == sorted(fractions) and fractions[-1] == 1.0
    assert progress_fraction("something else") is None
    assert progress_bar(0.5, 10) == "[#####.....]  50%"


def test_the_load_steps_are_read_from_the_apps_log():
    log = """[specdec] [........................]   0%   0.0 s  default-int4: loading model pair default-int4
[specdec] [################........]  65%   2.4 s  default-int4: loading tokenizer (embedded:x)
* Running on local URL:  http://0.0.0.0:36581
Loading weights: 100%|##########| 339/339 [00:00<00:00, 5945.26it/s]
[specdec] [###################.....]  78%   9.0 s  default-int4: loading draft embedded:y
[specdec] [#####################...]  88%  12.9 s  default-int4: quantizing the draft (int4)
[specdec] [########################] 100%  17.1 s  default-int4: models ready in 17.1 s
"""
    steps = first_run.load_steps(log)
    assert [x["step"] for x in steps] == ["loading model pair default-int4", "loading tokenizer (embedded:x)",
                                          "loading draft embedded:y", "quantizing the draft (int4)"]
    assert [x["s"] for x in steps] == [2.4, 6.6, 3.9, 4.2]
    assert first_run.load_steps("no progress here") == []


def test_the_badge_draws_a_bar_while_loading_only():
    from components.stats import render_model_status

    assert 'value="40"' in render_model_status("loading", "loading target", fraction=0.4)
    assert "<progress" not in render_model_status("ready", "Model pair: x", {"device": "cpu"}, fraction=1.0)


def _cli_first_run():
    return load_script("cli_first_run")


def test_the_cli_check_runs_the_examples_command_and_reads_its_summary():
    from specdec.cli import build_parser
    from specdec.prompts import GROUNDED

    cli = _cli_first_run()
    cmd = cli.command(GROUNDED[0], "tiny", 12)
    args = build_parser().parse_args(cmd)
    assert args.compare and args.json and args.chat == bool(GROUNDED[0].get("chat"))
    assert (args.drafter, args.gamma, args.max_new_tokens) == (GROUNDED[0]["drafter"], GROUNDED[0]["gamma"], 12)
    out = '{"round": 0}\n{"text": "x", "speedup": 1.5, "speculative_tok_s": 3.0}\n'
    assert cli.summary_of(out)["speedup"] == 1.5
    with pytest.raises(ValueError, match="--compare"):
        cli.summary_of('{"text": "x"}\n')


def test_the_cli_check_compares_a_fresh_process_with_a_warm_one_on_the_tiny_pair(tmp_path):
    out = tmp_path / "cli.json"
    assert _cli_first_run().main(["--pair", "tiny", "--examples", "1", "--max-new", "6", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["same_text"] and row["fresh_over_warm"] == row["fresh_speedup"] / row["warm_speedup"]


def test_the_cli_check_compares_medians_over_repeats():
    runs = lambda *speedups: [{"speedup": x, "speculative_tok_s": 10 * x, "text": "t"} for x in speedups]  # noqa: E731
    row = _cli_first_run().compare_row("ex", runs(2.0, 3.0, 9.0), runs(4.0, 2.5, 3.0))
    assert (row["fresh_speedup"], row["warm_speedup"], row["fresh_over_warm"]) == (3.0, 3.0, 1.0)
    assert row["fresh_over_warm_paired"] == 1.2  # the ratios repeat by repeat: 0.5, 1.2, 3.0
    assert row["same_text"] and row["fresh_speedups"] == [2.0, 3.0, 9.0] and row["fresh_tok_s"] == 30.0
    other = runs(2.0) + [{"speedup": 2.0, "speculative_tok_s": 1.0, "text": "u"}]
    assert not _cli_first_run().compare_row("ex", other, runs(2.0))["same_text"]


def test_compare_times_plain_decoding_before_and_after_and_keeps_the_faster(monkeypatch, capsys):
    """`generate --compare` decodes plainly once before the speculative run and once after it; the speedup is
    against the faster of the two (here the second, planted 4x faster), and both decodes are the full length."""
    from specdec import cli
    from specdec.loop import plain

    real, calls = plain.plain_decode, []

    def timed(pair, prompt, settings, model="target"):
        out = real(pair, prompt, settings, model)
        calls.append((model, settings.max_new_tokens))
        full = [c for c in calls if c == ("target", 12)]
        slow = 40.0 if len(full) == 1 else 10.0  # ms per step: the first full plain decode is the slow one
        return plain.BaselineResult(out.ids, out.text, [slow] * len(out.token_ms))

    monkeypatch.setattr(plain, "plain_decode", timed)
    assert cli.main(["generate", "--pair", "tiny", "--prompt", "hello hello", "--compare", "--json",
                     "--max-new-tokens", "12", "--temperature", "0"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert calls.count(("target", 12)) == 2
    assert summary["baseline_tok_s"] == pytest.approx(100.0)  # 10 ms a step, not 40
    assert summary["same_text"]


def test_cpu_seconds_are_read_past_a_command_name_with_spaces_and_parentheses():
    # /proc/<pid>/stat: pid (comm) state ppid ... utime (field 14) stime (field 15) ...; comm may hold ") ("
    line = "4242 (Web Content) (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 100 0 0"
    assert first_run.cpu_seconds(line, 100) == pytest.approx(3.0)


def test_browser_cpu_counts_the_cpu_of_every_process_that_names_it():
    import subprocess
    import sys
    import uuid

    marker = f"sd-cpu-probe-{uuid.uuid4().hex[:8]}"
    before = first_run.browser_cpu_s(marker)
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\ntime.sleep(5)"
    proc = subprocess.Popen([sys.executable, "-c", burn, marker])
    try:
        deadline = time.time() + 20
        while first_run.browser_cpu_s(marker) - before < 0.35 and time.time() < deadline:
            time.sleep(0.1)
        assert first_run.browser_cpu_s(marker) - before >= 0.35
    finally:
        proc.kill()
        proc.wait()
    assert before == 0.0  # no process named it before
