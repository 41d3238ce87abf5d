"""The ragged batched loop (every row keeps its own accepted count): per-row exactness (greedy equality with batch-1
decoding, chi-square of each row's first three tokens), caches holding each row's text through holes and
compaction, rows that stop early, the draft-length schedule by batch size, and the one-parameter entry point.
Fast tests use the tiny random-weight pair; one slow test uses the real pair in fp32."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from specdec.core.errors import InvalidInputError
from specdec.core.speedup import expected_tokens_per_round, tokens_per_row
from specdec.core.sampling import SamplingConfig, warp
from specdec.core.settings import DecodeSettings
from specdec.core.verify import verify_batch
from specdec.learn.lab import chi_square
from specdec.loop import batched
from specdec.core.kvcache import CachedLM
from specdec.loop import schedule as sch
from specdec.loop.plain import plain_decode
from specdec.loop.batched import BatchDecoder, batch_decode, ragged_batch_decode

# Different lengths on purpose: rows start at different positions and the short ones are padded.
PROMPTS = ["def fibonacci(n):", "Hi", "The quick brown fox jumps over the lazy dog", "x = 1\ny"]
CHI_CFG = SamplingConfig(temperature=1.5, top_k=12)  # a spread-out p, so a wrong row shows quickly


@pytest.fixture(scope="module")
def refs30(tiny_pair):
    s = DecodeSettings(max_new_tokens=30)
    return [plain_decode(tiny_pair, p, s).ids for p in PROMPTS]


@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("compact_at", [0.0, 1.0])  # compact after every round / never
def test_greedy_rows_equal_batch1_greedy(tiny_pair, refs30, gamma, compact_at, one_thread):
    s = DecodeSettings(gamma=gamma, max_new_tokens=30)
    res = ragged_batch_decode(tiny_pair, PROMPTS, s, compact_at=compact_at)
    assert res.ids == refs30
    if gamma > 1:  # rows really advanced at different paces (not a trivial lockstep run)
        assert any(len({len(c) for c, a in zip(r.committed, r.active) if a}) > 1 for r in res.rounds)
        assert all(r.thrown == 0 and not any(r.held) for r in res.rounds)
    if compact_at == 1.0 and gamma > 1:
        assert max(r.holes for r in res.rounds) > 0  # discarded guesses stayed in the cache as masked holes


def test_rows_stop_early_and_ride_along(tiny_pair):
    s = DecodeSettings(gamma=3, max_new_tokens=25)
    free = ragged_batch_decode(tiny_pair, PROMPTS, s)
    stop = free.ids[1][4]  # make a token of row 1 an EOS: row 1 ends there, the others go on unchanged
    pair = dataclasses.replace(tiny_pair, eos_token_ids=(stop,))
    res = ragged_batch_decode(pair, PROMPTS, s)
    assert res.ids == [plain_decode(pair, p, s).ids for p in PROMPTS]
    assert res.ids[1] == free.ids[1][: free.ids[1].index(stop) + 1] and res.stop_reasons[1] == "eos"
    assert res.latency_ms[1] < max(res.latency_ms)
    # a small budget: every row stops at exactly its budget, in rounds that draft fewer guesses near the end
    s3 = DecodeSettings(gamma=5, max_new_tokens=3)
    short = ragged_batch_decode(tiny_pair, PROMPTS, s3)
    assert short.ids == [plain_decode(tiny_pair, p, s3).ids for p in PROMPTS]
    assert short.stop_reasons == ["max_new_tokens"] * len(PROMPTS)
    assert all(r.gamma <= 2 for r in short.rounds)


def test_caches_hold_each_rows_text(no_eos):
    """After rejections (holes) and compaction, both caches give every row the logits of a fresh forward on its text."""
    s = DecodeSettings(gamma=5, max_new_tokens=60, sampling=SamplingConfig(temperature=1.0), seed=4)
    for compact_at in (1.0, 0.0):
        dec = BatchDecoder(no_eos, PROMPTS, s, compact_at=compact_at)
        for _ in range(6):
            dec.step()
        assert len({len(o) for o in dec.out}) > 1  # rows at different lengths
        if compact_at == 1.0:
            assert dec.target.holes > 0 and dec.target.compactions == 0
        else:
            assert dec.target.compactions > 0
        for lm, model in ((dec.target, no_eos.target), (dec.draft, no_eos.draft)):
            assert lm.counts(len(PROMPTS)) == [len(dec.text(b)) - len(lm_lack) for b, lm_lack in
                                               enumerate(_lacking(dec, lm))]
            ids, valid = dec._catch_up(lm)
            cont = lm.score(ids, pad=~valid, n_logits=1)[:, -1]
            for b in range(len(PROMPTS)):
                with torch.inference_mode():
                    fresh = model(input_ids=torch.tensor([dec.text(b)])).logits[0, -1, : no_eos.vocab_size]
                assert (cont[b] - fresh).abs().max().item() < 1e-4


def _lacking(dec, lm):
    have = lm.counts(dec.batch)
    return [dec.text(b)[have[b]:] for b in range(dec.batch)]


def test_gamma_schedule_follows_active_rows(tiny_pair):
    """γ per round from the number of active rows; γ = 0 (speculation off) is a plain step; still exact."""
    s = DecodeSettings(gamma=4, max_new_tokens=20)
    free = ragged_batch_decode(tiny_pair, PROMPTS, s).ids
    pair = dataclasses.replace(tiny_pair, eos_token_ids=(free[0][3], free[1][8]))  # two rows end early
    table = {1: 4, 2: 3, 3: 0, 4: 0}
    res = ragged_batch_decode(pair, PROMPTS, s, gamma_for=sch.schedule_fn(table, 4))
    assert res.ids == [plain_decode(pair, p, s).ids for p in PROMPTS]
    before = [0] * len(PROMPTS)
    for r in res.rounds:
        left = max(20 - n for n, a in zip(before, r.active) if a)
        assert r.gamma == max(0, min(table[sum(r.active)], left - 1))
        before = r.lengths
    gammas = {r.gamma for r in res.rounds}
    assert 0 in gammas and gammas - {0}  # off with many rows, on with few
    assert all(len(c) == 1 for r in res.rounds if r.gamma == 0 for c, a in zip(r.committed, r.active) if a)


def test_entry_point_selects_the_loop(tiny_pair):
    s = DecodeSettings(gamma=3, max_new_tokens=12)
    out = {k: batch_decode(tiny_pair, PROMPTS[:3], s, schedule=k) for k in batched.SCHEDULES}
    assert out["ragged"].ids == out["lockstep"].ids == out["plain"].ids
    assert all(r.thrown == 0 for r in out["ragged"].rounds) and out["plain"].gamma == 0
    with pytest.raises(InvalidInputError, match="unknown batch schedule"):
        batch_decode(tiny_pair, ["a"], s, schedule="zigzag")
    with pytest.raises(InvalidInputError, match="fixed gamma"):
        batch_decode(tiny_pair, ["a"], s, schedule="lockstep", gamma_for=lambda n: 2)
    with pytest.raises(InvalidInputError, match="list of prompts"):
        BatchDecoder(tiny_pair, "one string")
    dec = BatchDecoder(tiny_pair, ["a"], DecodeSettings(max_new_tokens=1))
    dec.run()
    with pytest.raises(InvalidInputError, match="finished"):
        dec.step()


def test_sampled_runs_are_reproducible(tiny_pair):
    s = DecodeSettings(gamma=4, max_new_tokens=20, sampling=SamplingConfig(temperature=0.7), seed=9)
    a = ragged_batch_decode(tiny_pair, PROMPTS, s).ids
    assert a == ragged_batch_decode(tiny_pair, PROMPTS, s).ids
    assert a != ragged_batch_decode(tiny_pair, PROMPTS, dataclasses.replace(s, seed=10)).ids


# ------------------------------------------------------------------------------------------ chi-square


CHI_PROMPTS = ["ab", "hello wo", "x = 1\nyz", "The quick"]


def _exact_first_three(pair, prompt, cfg):
    """The exact marginals of the first three tokens under the target, by enumerating the warped support."""
    ids = pair.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    v = pair.vocab_size
    with torch.inference_mode():
        p1 = warp(pair.target(input_ids=torch.tensor([ids])).logits[0, -1, :v], cfg).double()
        s1 = torch.nonzero(p1 > 0).flatten().tolist()
        p2_given = warp(pair.target(input_ids=torch.tensor([ids + [x] for x in s1])).logits[:, -1, :v], cfg).double()
        seqs, w = [], []
        for i, x in enumerate(s1):
            for y in torch.nonzero(p2_given[i] > 0).flatten().tolist():
                seqs.append(ids + [x, y])
                w.append(float(p1[x] * p2_given[i, y]))
        p3_given = warp(pair.target(input_ids=torch.tensor(seqs)).logits[:, -1, :v], cfg).double()
    p2 = (p1[s1, None] * p2_given).sum(0)
    p3 = (torch.tensor(w, dtype=torch.float64)[:, None] * p3_given).sum(0)
    return p1.numpy(), p2.numpy(), p3.numpy()


def _chi_pvalues(pair, runs=100, copies=4, gamma=2, verify="pq"):
    """Per prompt, the chi-square p-value of each of its first three tokens over many ragged runs; each prompt sits
    in `copies` rows of every batch; `verify` is the rule the rows are judged by."""
    v = pair.vocab_size
    counts = np.zeros((3, len(CHI_PROMPTS), v))
    batch = [p for p in CHI_PROMPTS for _ in range(copies)]
    for seed in range(runs):
        res = ragged_batch_decode(pair, batch, DecodeSettings(gamma=gamma, max_new_tokens=3, sampling=CHI_CFG,
                                                              seed=seed, verify=verify))
        for row, out in enumerate(res.ids):
            for j in range(3):
                counts[j, row // copies, out[j]] += 1
    out = []
    for i, prompt in enumerate(CHI_PROMPTS):
        exact = _exact_first_three(pair, prompt, CHI_CFG)
        out.append([chi_square(counts[j, i], exact[j]).p_value for j in range(3)])
    return out


@pytest.mark.stat
def test_chi_square_per_row_first_three_tokens(no_eos, one_thread):
    """Every row's first three tokens follow its own target (marginally), although rows commit different counts
    per round and sit at different lengths in one cache."""
    for prompt, pvs in zip(CHI_PROMPTS, _chi_pvalues(no_eos)):
        assert min(pvs) > 1e-3, (prompt, pvs)


@pytest.mark.stat
@pytest.mark.parametrize("verify", ["strict", "block"])
def test_chi_square_per_row_under_the_other_rules(no_eos, one_thread, verify, monkeypatch):
    """The rows are judged by the rule the settings name (strict, block), and each row still follows its target."""
    seen = set()

    def spy(*a, mode="pq", **kw):
        seen.add(mode)
        return verify_batch(*a, mode=mode, **kw)

    monkeypatch.setattr(batched, "verify_batch", spy)
    for prompt, pvs in zip(CHI_PROMPTS, _chi_pvalues(no_eos, runs=60, verify=verify)):
        assert min(pvs) > 1e-3, (prompt, verify, pvs)
    assert seen == {verify}


def test_lockstep_rows_are_judged_by_the_settings_rule(tiny_pair, monkeypatch):
    seen = set()

    def spy(*a, mode="pq", **kw):
        seen.add(mode)
        return verify_batch(*a, mode=mode, **kw)

    monkeypatch.setattr(batched, "verify_batch", spy)
    batched.speculative_batch_decode(tiny_pair, PROMPTS[:2], DecodeSettings(gamma=2, max_new_tokens=6,
                                                                            verify="strict"))
    assert seen == {"strict"}


@pytest.mark.stat
def test_chi_square_catches_a_row_verified_against_another_rows_p(no_eos, monkeypatch, one_thread):
    """Planted bug: every row is verified against the p of the row before it. The same test must reject."""

    def crossed(draft_tokens, draft_probs, target_probs, *a, **kw):
        return verify_batch(draft_tokens, draft_probs, target_probs.roll(1, dims=0), *a, **kw)

    monkeypatch.setattr(batched, "verify_batch", crossed)
    firsts = [pvs[0] for pvs in _chi_pvalues(no_eos, runs=40)]
    assert min(firsts) < 1e-6, firsts


@pytest.mark.stat
def test_chi_square_catches_a_mask_that_shows_discarded_guesses(no_eos, monkeypatch, one_thread):
    """Planted bug: rejected guesses stay visible in both caches (never made holes). The first token is still
    right (nothing was discarded before it); the later tokens must be rejected."""
    monkeypatch.setattr(CachedLM, "drop", lambda self, row, slots: None)
    later = [min(pvs[1:]) for pvs in _chi_pvalues(no_eos, runs=40)]
    assert min(later) < 1e-6, later


# ------------------------------------------------------------------------------------------ the schedule


def _costs(target_fixed, per_token, draft_fixed=0.2, draft_per_row=0.01, knee=0):
    """A machine whose target pass costs `target_fixed` ms up to `knee` tokens and then `per_token` per token."""
    pts = [(n, target_fixed + per_token * max(0, n - knee)) for n in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    return sch.BatchCosts.from_points(pts, [(b, draft_fixed + draft_per_row * b) for b in (1, 4, 16)])


def test_schedule_costs_and_interpolation():
    c = sch.BatchCosts.from_points([(1, 10.0), (3, 14.0), (3, 16.0), (5, None)], [(1, 2.0)])
    assert c.target == ((1.0, 10.0), (3.0, 15.0))  # repeated x merged by the mean, missing values dropped
    assert c.target_ms(2) == pytest.approx(12.5) and c.target_ms(5) == pytest.approx(20.0)  # past the end: the line
    assert c.draft_ms(9) == 2.0  # one point: flat
    assert c.to_dict()["draft"] == [[1.0, 2.0]]
    with pytest.raises(ValueError):
        sch.BatchCosts((), ()).target_ms(1)


def test_schedule_tokens_per_row():
    for a in (0.2, 0.6, 0.9):
        assert tokens_per_row(a, 4, 1, "lockstep") == pytest.approx(expected_tokens_per_round(a, 4))
        assert tokens_per_row(a, 4, 8, "ragged") == pytest.approx(expected_tokens_per_round(a, 4))
        assert tokens_per_row(a, 4, 8, "lockstep") < tokens_per_row(a, 4, 2, "lockstep")
    with pytest.raises(ValueError):
        tokens_per_row(0.5, 2, 2, "zigzag")


def test_schedule_turns_speculation_off_where_it_stops_paying():
    # memory-bound up to 16 tokens per pass, then every token is paid: long drafts pay at small B only
    c = _costs(10.0, 1.0, knee=16)
    table = sch.gamma_table(0.8, c, up_to=16, gamma_max=8)
    assert table[1] >= 4  # at B = 1 a pass over γ + 1 tokens costs one step: long drafts pay
    gammas = [table[b] for b in range(1, 17)]
    assert all(a >= b for a, b in zip(gammas, gammas[1:]))  # shorter drafts as B grows
    off = sch.off_from(table)
    assert off is not None and all(table[b] == 0 for b in range(off, 17)) and table[off - 1] > 0
    g, s = sch.gamma_for_batch(16, 0.8, c)
    assert (g, s) == (0, 1.0)
    assert sch.batch_speedup(1, 0.8, 0, c) == 1.0
    # a free draft on a machine that never runs out of compute: speculation always pays, up to gamma_max
    free = _costs(10.0, 0.0, draft_fixed=0.0, draft_per_row=0.0)
    assert set(sch.gamma_table(0.9, free, up_to=16, gamma_max=6).values()) == {6}
    assert sch.off_from({1: 3, 2: 0, 3: 2}) is None and sch.off_from({1: 3, 2: 0, 3: 0}) == 2
    # a low acceptance turns it off everywhere; lockstep turns off no later than ragged
    assert set(sch.gamma_table(0.01, c, up_to=8).values()) == {0}
    lock = sch.gamma_table(0.8, c, up_to=16, kind="lockstep")
    assert (sch.off_from(lock) or 17) <= (off or 17)
    with pytest.raises(ValueError):
        sch.gamma_for_batch(0, 0.5, c)


def test_fitted_costs_give_a_table_that_only_shortens_the_draft():
    """Costs measured with a few % of noise: read through the points the table may zig-zag; on the fitted lines
    the draft only gets shorter as B grows (and turns off for good)."""
    rng = np.random.default_rng(0)
    noisy = lambda y: y * (1 + 0.05 * rng.standard_normal())  # noqa: E731
    batches = (1, 2, 4, 8, 16)
    target = [(b * k, noisy(240 + 6.3 * b * k)) for b in batches for k in (1, 2, 3, 5, 9)]
    draft = [(b, noisy(80 + 4.0 * b)) for b in batches]
    fitted = sch.BatchCosts.from_points(target, draft).fitted()
    a0, a1 = sch.line_fit([x for x, _ in fitted.target], [y for _, y in fitted.target])
    assert all(abs(y - (a0 + a1 * x)) < 1e-6 for x, y in fitted.target)  # every point on its line
    assert abs(a0 - 240) < 30 and abs(a1 - 6.3) < 1.0
    for alpha in (0.6, 0.75, 0.82, 0.9):
        table = sch.gamma_table(alpha, fitted, up_to=16)
        gs = [table[b] for b in range(1, 17)]
        assert all(x >= y for x, y in zip(gs, gs[1:])), (alpha, gs)


def test_schedule_fn_reads_the_table():
    f = sch.schedule_fn({1: 5, 4: 2, 8: 0}, fallback=3)
    assert [f(n) for n in (1, 2, 4, 6, 8, 16)] == [5, 5, 2, 2, 0, 0]
    assert sch.schedule_fn({}, fallback=3)(7) == 3


# ------------------------------------------------------------------------------------------ bench and tab


def test_bench_measures_the_loops_side_by_side(tiny_pair, one_thread):
    from components import batch as view
    from specdec.bench import batch as bb
    from ui import batch_tab

    res = bb.run_batches(tiny_pair, [1, 2], ["greedy", "sampled"], gamma=3, max_new=5, repeats=1,
                         log=lambda m: None, loops="ragged,lockstep,scheduled,tree", gamma_max=3)
    assert res["loops"] == list(bb.LOOPS) and res["reference_loop"] == "lockstep"
    for r in res["rows"]:
        for n in bb.LOOPS:
            assert r[f"{n}_speedup"] == pytest.approx(r[f"{n}_tok_s"] / r["plain_tok_s"])
            assert r[f"{n}_p90_latency_ms"] > 0 and r[f"{n}_wasted_per_round"] >= 0
            assert 1 <= r[f"{n}_tokens_per_round_per_row"] <= 4
        assert r["spec_tok_s"] == r["lockstep_tok_s"]  # the legacy figures are lockstep's
        table = {e["batch"]: e["gamma"] for e in res["schedule"][r["mode"]]["table"]}
        assert r["scheduled_gamma"] == table[r["batch"]] and 0 <= r["scheduled_gamma"] <= 3
    for mode in ("greedy", "sampled"):
        assert set(res["loop_crossover"][mode]) == set(bb.LOOPS)
        sc = res["schedule"][mode]
        assert 0 <= sc["alpha"] <= 1 and sc["costs"]["target"] and sc["costs"]["draft"]
    text = bb.format_table(res)
    assert "loops side by side" in text and "stops beating plain at" in text and "γ by B" in text
    ex = res["example"]
    assert ex["ragged_rounds"] and ex["lockstep_rounds"] and ex["scheduled_rounds"] and ex["tree_rounds"]
    # the views: one line per loop and mode, each request's pace in both loops, both token grids
    names = [t.name for t in view.loop_figure(res).data]
    assert {"ragged · greedy", "lockstep · T = 0.7", "plain · greedy", "ragged, scheduled γ · greedy"} <= set(names)
    pace = view.pace_figure(ex)
    assert len(pace.data) == 2 * ex["batch"] and "own pace" in pace.layout.title.text
    both = view.render_both_views(ex)
    assert both.count("sdb-grid") == 2 and "ragged: every row commits its own" in both
    assert "appear" in view.render_ragged_view(None) and view.loop_figure(None).layout.annotations
    # a ragged grid: rows of one round may commit different counts, and each cell shows the row's length so far
    rnd = {"index": 0, "gamma": 3, "active": [True, True], "n_accepted": [0, 3], "committed": [[5], [6, 7, 8, 9]],
           "pieces": [["a"], ["b", "c", "d", "<e>"]], "own": [True, True]}
    grid = view.render_ragged_view([rnd], ["x", "y"])
    assert "sdb-rep" in grid and "sdb-bonus" in grid and "&lt;e&gt;" in grid and ">4</span>" in grid
    # the tab: loops as a control, two more outputs, a bad loop name refused clearly
    out = batch_tab.run_handler(lambda: tiny_pair)(["1", "2"], ["greedy"], 2, 4, ["ragged"],
                                                   progress=lambda *a, **k: None)
    assert "Measured" in out[0] and len(out) == 9 and out[6].endswith(".json")
    bad = batch_tab.run_handler(lambda: tiny_pair)(["1"], ["greedy"], 2, 4, ["zigzag"], progress=lambda *a, **k: None)
    assert "unknown loop" in bad[0] and len(bad) == 9
    with pytest.raises(InvalidInputError, match="at least one"):
        bb.parse_loops("")


# ------------------------------------------------------------------------------------------ real pair


@pytest.mark.slow
def test_real_pair_ragged_greedy_equals_batch1(real_pair_fp32, real_greedy):
    """The embedded pair in fp32: each row of a ragged batch equals that prompt's batch-1 greedy output."""
    prompts = ["def fibonacci(n):", "The history of the printing press begins",
               "import numpy as np\n\ndef moving_average(x, k):"]
    s = DecodeSettings(gamma=4, max_new_tokens=16)
    refs = [real_greedy(p, s.max_new_tokens) for p in prompts]
    assert ragged_batch_decode(real_pair_fp32, prompts, s).ids == refs
