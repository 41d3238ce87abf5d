"""The Learn tab: layout and event wiring only. Math lives in specdec/learn/lab.py, the built-in rounds in
specdec/learn/examples.py, drawing in components/learn.py and components/charts.py.

app.py calls `build_learn_tab(recorded, get_pair=...)` inside `with gr.Tab("Learn"):`. `recorded` is the
playground's gr.State: a list of RunRecords, the run on screen first (empty before any run); `get_pair` returns
the loaded ModelPair, or None while it is still loading.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

import gradio as gr

from components import learn as view
from components.charts import speedup_curves_figure
from components.labels import round_label
from specdec.learn import lab
from specdec.core.errors import SpecDecError
from specdec.core.events import Round
from specdec.learn.examples import example_rounds
from specdec.core.record import RunRecord
from specdec.core.sampling import SamplingConfig
from ui.zerogpu import gpu

from .controls import Number, Slider
from .learn_extras import build_breakeven, build_zoo_lab, build_zoo_real, zoo_css

CSS_PATH = Path(__file__).resolve().parent.parent / "assets" / "learn.css"
EXTRA_ROWS = (("fox", 10.0, 10.0), ("bee", 10.0, 10.0), ("elk", 10.0, 10.0))  # rows 4-6 when switched on
BUILTIN_LABELS = {
    "builtin:reject": "Example: “The cat sat down”, the target prefers “nearby”",
    "builtin:bonus": "Example: every guess passes, bonus token",
    "builtin:tree": "Example: a token tree, “ cat” refused and “ dog ran” kept",
}
REAL_DEFAULT_PREFIX = "def fibonacci(n):\n    "


# ------------------------------------------------------------------------------------------ model access


def await_pair(get_pair: Callable):
    """For streaming handlers: yields (no change, warning) updates while the pair loads; returns the pair or None."""
    pair = None
    for pair, problem in wait_for_pair(get_pair):
        if problem:
            yield gr.update(), view.message_html(problem, "warn")
    return pair


def wait_for_pair(get_pair: Callable, timeout_s: float = 300.0, poll_s: float = 1.0):
    """Yield (None, progress message) while the pair loads, then (pair, None) or (None, error message).

    get_pair returns the pair, None while it is loading, or raises if loading failed.
    """
    t0 = time.time()
    while True:
        try:
            pair = get_pair()
        except Exception as exc:  # a failed load is shown as its message
            yield None, str(exc)
            return
        if pair is not None:
            yield pair, None
            return
        waited = time.time() - t0
        if waited > timeout_s:
            yield None, f"The models are still loading after {waited:.0f} s; try again later."
            return
        yield None, f"The models are still loading ({waited:.0f} s so far); this run starts as soon as they are ready."
        time.sleep(poll_s)


# ------------------------------------------------------------------------------------- recorded rounds


def _recorded_rounds(records: Sequence[RunRecord] | None) -> list[Round]:
    """The rounds of the run on screen in the playground (the first record)."""
    return list(records[0].rounds) if records else []


def round_choices(records: Sequence[RunRecord] | None) -> list[tuple[str, str]]:
    choices = [(label, key) for key, label in BUILTIN_LABELS.items()]
    for rnd in _recorded_rounds(records):
        choices.append((f"Your run: {round_label(rnd)}", f"run:{rnd.index}"))
    return choices


def round_for(choice: str | None, records: Sequence[RunRecord] | None) -> tuple[Round, str | None, str | None]:
    """(round, context text, problem) for a selector value; falls back to the first example."""
    examples = example_rounds()
    fallback = examples["builtin:reject"]
    if choice in examples:
        return examples[choice].round, examples[choice].context, None
    if isinstance(choice, str) and choice.startswith("run:"):
        rounds = _recorded_rounds(records)
        i = int(choice.split(":", 1)[1])
        if i < len(rounds):
            return rounds[i], None, None
        return fallback.round, fallback.context, "That recorded round is gone (the playground started a new run)."
    return fallback.round, fallback.context, None


def render_walkthrough(choice, step, records) -> str:
    rnd, context, problem = round_for(choice, records)
    page = view.walkthrough_html if rnd.tree is None else view.tree_walkthrough_html  # a tree round walks its tree
    body = page(rnd, int(step or 0), context)
    return (view.message_html(problem, "warn") if problem else "") + body


# ----------------------------------------------------------------------------------------- 100 points


def read_editor(n_tokens, *cells) -> lab.HundredPoints:
    """The editor rows in use -> HundredPoints; raises LabInputError with a message for bad input."""
    k = int(n_tokens or lab.MIN_TOKENS)
    k = max(lab.MIN_TOKENS, min(lab.MAX_TOKENS, k))
    toks, ps, qs = cells[: lab.MAX_TOKENS], cells[lab.MAX_TOKENS : 2 * lab.MAX_TOKENS], cells[2 * lab.MAX_TOKENS :]
    return lab.hundred_points(list(ps[:k]), list(qs[:k]), list(toks[:k]))


def update_hundred(n_tokens, *cells):
    try:
        hp = read_editor(n_tokens, *cells)
    except SpecDecError as exc:
        return gr.update(), view.message_html(str(exc), "error")
    return view.hundred_points_figure(hp), view.hundred_points_summary(hp)


def show_rows(n_tokens):
    k = int(n_tokens or lab.MIN_TOKENS)
    return [gr.update(visible=i < k) for i in range(lab.MAX_TOKENS)]


def reset_editor():
    toks = list(lab.DEFAULT_TOKENS) + [r[0] for r in EXTRA_ROWS]
    ps = list(lab.DEFAULT_P) + [r[1] for r in EXTRA_ROWS]
    qs = list(lab.DEFAULT_Q) + [r[2] for r in EXTRA_ROWS]
    return [len(lab.DEFAULT_TOKENS), *toks, *ps, *qs]


# ------------------------------------------------------------------------------------------------ lab


def _whole(value, name: str, lo: int, hi: int) -> int:
    if value is None:
        raise lab.LabInputError(f"{name} is empty; enter a whole number from {lo:,} to {hi:,}")
    v = float(value)
    if v != v or v != int(v) or not lo <= v <= hi:
        raise lab.LabInputError(f"{name} must be a whole number from {lo:,} to {hi:,}, got {value:g}")
    return int(v)


def run_lab(n, seed, repair, n_tokens, *cells):
    try:
        hp = read_editor(n_tokens, *cells)
        rounds = _whole(n, "N (rounds)", 1, lab.MAX_LAB_ROUNDS)
        s = _whole(seed, "seed", 0, 2**31 - 1)
        res = lab.run_lab(hp, rounds, s, repair or "correct")
    except SpecDecError as exc:
        return gr.update(), view.message_html(str(exc), "error")
    notes = "".join(view.message_html(x, "warn") for x in hp.notes)
    return gr.update(value=view.lab_figure(res), visible=True), notes + view.lab_result_html(res)


# ---------------------------------------------------------------------------------------- real models


def run_real(get_pair, prefix, temperature, top_k, top_p, gamma, n, k, seed):
    """Generator: p0/q0 and the vectorized draws first (seconds), then the K real rounds with progress."""
    pair = yield from await_pair(get_pair)
    if pair is None:
        return
    try:
        cfg = SamplingConfig(float(temperature), _whole(top_k, "top-k", 0, 10**6), float(top_p)).validate()
        rounds = _whole(n, "N (vectorized rounds)", 1, lab.MAX_LAB_ROUNDS)
        k_real = _whole(k, "K (real decoder rounds)", 0, 500)
        g = _whole(gamma, "γ", 1, 16)
        s = _whole(seed, "seed", 0, 2**31 - 1)
        yield gr.update(), view.message_html("Computing the target's p0 and the draft's q0 at this prefix…", "info")
        rows = lab.first_token_rows(pair, prefix, cfg)
        draws = lab.sample_on_support(rows, rounds, s)
        chk = lab.real_check(rows, draws, [])
        pieces = _pieces(pair, chk)
        name = getattr(pair, "name", "?")
        if k_real:
            running = view.message_html(f"Running {k_real} real decoder rounds…", "info")
            partial = view.real_result_html(chk, name, 0) + running
            yield gr.update(value=view.real_figure(chk, pieces), visible=True), partial
        ids: list[int] = []
        t0 = time.perf_counter()
        for i in range(k_real):
            ids += lab.engine_first_tokens(pair, prefix, cfg, 1, g, seed0=s * 1000 + i + 1)
            if (i + 1) % max(1, k_real // 10) == 0 and i + 1 < k_real:
                eta = (time.perf_counter() - t0) / (i + 1) * (k_real - i - 1)
                yield gr.update(), view.real_result_html(chk, name, 0) + view.message_html(
                    f"Real decoder rounds: {i + 1} of {k_real} done, about {eta:.0f} s left…", "info")
        chk = lab.real_check(rows, draws, ids)
        pieces.update(_pieces(pair, chk))
        yield gr.update(value=view.real_figure(chk, pieces), visible=True), view.real_result_html(chk, name, k_real)
    except SpecDecError as exc:
        yield gr.update(), view.message_html(str(exc), "error")


# Each Learn tab's get_pair, by a number run_real_gpu receives. A module global, not an argument: on ZeroGPU the
# decorated call runs in a worker forked from the app, which has these (and the loaded pair) already, while its
# arguments must be pickled.
_PAIR_SOURCES: dict[int, Callable] = globals().get("_PAIR_SOURCES", {})  # kept across importlib.reload


@gpu(duration=120)
def run_real_gpu(source: int, prefix, temperature, top_k, top_p, gamma, n, k, seed):
    """run_real on the app's pair, as the one GPU call of the real-model check (see ui.zerogpu)."""
    yield from run_real(_PAIR_SOURCES[source], prefix, temperature, top_k, top_p, gamma, n, k, seed)


def _pieces(pair, chk: lab.RealCheck) -> dict[int, str]:
    """Decoded text of the tokens the chart names (components.learn.real_chart_ids decides which)."""
    return {i: pair.tokenizer.decode([i]) for i in view.real_chart_ids(chk)}


# -------------------------------------------------------------------------------------------- speedup


def run_points(records: Sequence[RunRecord] | None) -> list[lab.RunPoint]:
    """The recorded runs as chart points; the first is the run on screen in the playground."""
    points = lab.run_points(records or [])
    if points and records and records[0].metrics.drafted:
        points[0] = replace(points[0], label=f"your last run: {points[0].label}")
    return points


def update_speedup(c, records):
    c = float(c if c is not None else 0.1)
    points = run_points(records)
    return speedup_curves_figure(c, points), view.speedup_summary(c, points)


def c_from_run(c, records):
    """The run's cost ratio: c_plain (the pair's plain step costs, timed at load) for a run drafted by the draft
    model, else c_loop (what the loop paid, from the rounds' own timings: the only c of the n-gram, early-exit and
    cross drafters); both are defined in specdec/core/metrics.py."""
    for p in lab.run_points(records or []):
        best = p.c_plain if p.c_plain is not None and p.drafter == "model" else p.c_loop
        if best is not None:
            return round(min(1.0, best), 2)
    gr.Info("No recorded run with timings yet; generate text in the playground first.")
    return c


# --------------------------------------------------------------------------------------------- layout


def _css() -> str:
    try:
        return CSS_PATH.read_text()
    except OSError:
        return ""


VERIFY_MODES_TEXT = (
    "Three rules decide which guesses survive, and all three give exactly the target's text. **pq** keeps a guess x "
    "with chance min(1, p(x)/q(x)); **strict** (what vLLM, TensorRT-LLM and llama.cpp do by default) lets the target "
    "draw its own token and keeps the guess only if it is the same one, chance p(x); **block** judges the guesses "
    "together and can keep a guess whose own test failed when a later one passed. With copied guesses (one-hot q) "
    "or at temperature 0, pq and strict keep exactly as many. With a sampled draft, strict's chance is Σ p·q rather "
    "than Σ min(p, q), so it falls fast as the temperature rises. The chart was measured on the same drafts for all "
    "three rules; the round anatomy in the playground shows the three verdicts for every round.")


def build_verify_modes() -> None:
    """Section 7: the shipped measurement of the three rules against temperature (specdec.bench.verify_modes)."""
    from components.charts import verify_modes_figure
    from specdec.bench.verify_modes import load

    gr.Markdown("### 7. Three exact ways to verify")
    gr.Markdown(VERIFY_MODES_TEXT, elem_id="learn-verify-text")
    shipped = load()
    label, points = shipped if shipped else ("", [])
    gr.Plot(verify_modes_figure(points, label), show_label=False, elem_id="learn-verify-plot")


def build_learn_tab(recorded_rounds: gr.State, get_pair: Callable) -> None:
    """Lay out the five Learn sections and wire their events; call inside `with gr.Tab("Learn"):`."""
    from .loader import env_request  # the pair the app opens on: one rule, in the loader

    pair_name = env_request().name
    gr.HTML(f"<style>{_css()}</style>", elem_id="learn-style", padding=False)
    gr.HTML(zoo_css(), elem_id="learn-zoo-style", padding=False)
    gr.Markdown(
        "A small draft model guesses a few tokens; the large target model checks them all in one pass, keeps the "
        "good prefix, repairs the first bad guess, and the output still follows the target's own probabilities. "
        "Each section below lets you run one part of that with the same code the playground uses.",
        elem_classes=["learn-intro"],
    )

    # 1. Walkthrough --------------------------------------------------------------------------------
    gr.Markdown("### 1. One round, step by step")
    with gr.Column(elem_id="learn-walkthrough-section"):
        with gr.Row(equal_height=True):
            round_dd = gr.Dropdown(round_choices(recorded_rounds.value), value="builtin:reject",
                                   label="Round to replay", scale=4, elem_id="learn-round")
            back = gr.Button("◀ Back", elem_id="learn-back", scale=1, min_width=90)
            nxt = gr.Button("Next ▶", elem_id="learn-next", variant="primary", scale=1, min_width=90)
        step = gr.State(0)
        walk = gr.HTML(render_walkthrough("builtin:reject", 0, recorded_rounds.value), elem_id="learn-walkthrough")

    def move(delta):
        def fn(choice, s, state):
            s = max(0, min(view.walk_steps(round_for(choice, state)[0]) - 1, int(s) + delta))
            return s, render_walkthrough(choice, s, state)

        return fn

    quiet = dict(show_progress="hidden")  # instant updates: a loading overlay would only flicker
    nxt.click(move(+1), [round_dd, step, recorded_rounds], [step, walk], **quiet)
    back.click(move(-1), [round_dd, step, recorded_rounds], [step, walk], **quiet)
    round_dd.change(lambda c, st: (0, render_walkthrough(c, 0, st)), [round_dd, recorded_rounds], [step, walk],
                    **quiet)

    # 2. The 100-point picture ------------------------------------------------------------------------
    gr.Markdown("### 2. The 100-point picture")
    init = reset_editor()
    with gr.Row(elem_id="learn-100-section"):
        with gr.Column(scale=2, min_width=300):
            n_tok = Slider(lab.MIN_TOKENS, lab.MAX_TOKENS, value=init[0], step=1, label="tokens",
                           elem_id="learn-ntok")
            toks, ps, qs, rows = [], [], [], []
            for i in range(lab.MAX_TOKENS):
                with gr.Row(visible=i < init[0], equal_height=True) as row:
                    toks.append(gr.Textbox(init[1 + i], label="token" if i == 0 else None, show_label=i == 0,
                                           elem_id=f"learn-tok-{i}", min_width=70, max_length=24))
                    ps.append(Number(init[7 + i], label="target p" if i == 0 else None, show_label=i == 0,
                                     elem_id=f"learn-p-{i}", min_width=70))
                    qs.append(Number(init[13 + i], label="draft q" if i == 0 else None, show_label=i == 0,
                                     elem_id=f"learn-q-{i}", min_width=70))
                rows.append(row)
            reset = gr.Button("Reset to cat / dog / owl", size="sm", elem_id="learn-reset")
        with gr.Column(scale=5):
            hp0 = read_editor(*init)
            bars = gr.Plot(view.hundred_points_figure(hp0), show_label=False, elem_id="learn-100-plot")
            summary = gr.HTML(view.hundred_points_summary(hp0), elem_id="learn-100-summary")
    editor = [n_tok, *toks, *ps, *qs]
    gr.on([c.change for c in editor], update_hundred, editor, [bars, summary], **quiet)
    n_tok.change(show_rows, n_tok, rows)
    reset.click(reset_editor, None, editor)

    # 3. Exactness lab ---------------------------------------------------------------------------------
    gr.Markdown(
        "### 3. Exactness lab\nEach round drafts one guess from q and sends it through the engine's `verify_batch`. "
        "The chart shows how often each token came out first, next to p and q, with a chi-square goodness-of-fit test "
        "against p. Switch to a wrong repair and watch the output drift away from p."
    )
    with gr.Column(elem_id="learn-lab-section"):
        with gr.Row(equal_height=True):
            lab_n = Number(20_000, label=f"N rounds (up to {lab.MAX_LAB_ROUNDS:,})", precision=0, minimum=1,
                           maximum=lab.MAX_LAB_ROUNDS, elem_id="learn-lab-n")
            lab_seed = Number(0, label="seed", precision=0, minimum=0, elem_id="learn-lab-seed")
            lab_repair = gr.Radio([(view.REPAIR_LABELS[key], key) for key in lab.REPAIRS], value="correct",
                                  label="repair after a rejection", elem_id="learn-lab-repair", scale=3)
            lab_run = gr.Button("Sample N rounds", variant="primary", elem_id="learn-lab-run")
        lab_plot = gr.Plot(show_label=False, visible=False, elem_id="learn-lab-plot")
        lab_out = gr.HTML(view.message_html("Press “Sample N rounds” to run the rule on the p and q above.", "info"),
                          elem_id="learn-lab-result")
    lab_inputs = [lab_n, lab_seed, lab_repair, *editor]
    lab_run.click(run_lab, lab_inputs, [lab_plot, lab_out], concurrency_id="learn-lab", api_name="lab")
    lab_repair.change(run_lab, lab_inputs, [lab_plot, lab_out], concurrency_id="learn-lab")
    build_zoo_lab(editor, lab_n, lab_seed)  # the bug zoo, on the same editor rows, N and seed

    # 4. Exactness on the real models ------------------------------------------------------------------
    gr.Markdown(
        "### 4. Exactness on the real models\nFrom your prefix the engine computes the target's next-token "
        "distribution p0 and the draft's q0 (same warp for both). The first token a round emits depends only on those "
        "two rows, so N cheap rounds run through `verify_batch` on them; K full decoder rounds (draft model, target "
        "pass, verify) with different seeds run as well. Both are tested against p0."
    )
    tiny = pair_name == "tiny"
    with gr.Column(elem_id="learn-real-section"):
        with gr.Row():
            prefix = gr.Textbox(REAL_DEFAULT_PREFIX, label="prefix", lines=2, scale=3, elem_id="learn-real-prefix")
            with gr.Column(scale=2):
                with gr.Row():
                    temp = Slider(0.0, 2.0, value=1.0, step=0.05, label="temperature", elem_id="learn-real-temp")
                    top_p = Slider(0.05, 1.0, value=1.0, step=0.01, label="top-p", elem_id="learn-real-topp")
                with gr.Row():
                    top_k = Number(40, label="top-k (0 = off)", precision=0, minimum=0, elem_id="learn-real-topk")
                    gamma = Number(1, label="γ for the real rounds", precision=0, minimum=1, maximum=16,
                                   elem_id="learn-real-gamma")
        with gr.Row(equal_height=True):
            real_n = Number(20_000, label="N vectorized rounds", precision=0, minimum=1,
                            maximum=lab.MAX_LAB_ROUNDS, elem_id="learn-real-n")
            real_k = Number(100 if tiny else 10, label="K real decoder rounds", precision=0, minimum=0, maximum=500,
                            elem_id="learn-real-k")
            real_seed = Number(0, label="seed", precision=0, minimum=0, elem_id="learn-real-seed")
            real_run = gr.Button("Run on the real models", variant="primary", elem_id="learn-real-run")
        real_plot = gr.Plot(show_label=False, visible=False, elem_id="learn-real-plot")
        real_out = gr.HTML(
            view.message_html(
                f"Uses the app's model pair ({pair_name}). The N vectorized rounds take well under a second; each of "
                "the K real rounds builds a fresh decoder and runs both models, which on 2 CPU cores takes a few "
                "seconds with the default pair, so keep K small there.", "info"),
            elem_id="learn-real-result",
        )

    source = len(_PAIR_SOURCES)
    _PAIR_SOURCES[source] = get_pair

    def real_handler(*args):
        # Wait for loading models here, in the app's process, so a ZeroGPU call never holds a GPU while waiting.
        if (yield from await_pair(get_pair)) is not None:
            yield from run_real_gpu(source, *args)

    # The handler streams its own progress messages, so no overlay hides them.
    real_run.click(real_handler, [prefix, temp, top_k, top_p, gamma, real_n, real_k, real_seed], [real_plot, real_out],
                   concurrency_id="learn-real", concurrency_limit=1, show_progress="hidden")
    build_zoo_real(get_pair, prefix, temp, top_k, top_p, real_n, real_seed)

    # 5. When it is faster ------------------------------------------------------------------------------
    gr.Markdown("### 5. When is it faster?")
    with gr.Column(elem_id="learn-speedup-section"):
        with gr.Row(equal_height=True):
            c_slider = Slider(0.0, 1.0, value=0.1, step=0.01, scale=4, elem_id="learn-c",
                              label="c = cost of one draft step ÷ cost of one target step")
            use_c = gr.Button("Use my run's c", size="sm", elem_id="learn-use-c", scale=1)
        fig0, text0 = update_speedup(0.1, recorded_rounds.value)
        sp_plot = gr.Plot(fig0, show_label=False, elem_id="learn-speedup-plot")
        sp_out = gr.HTML(text0, elem_id="learn-speedup-summary")
    c_slider.change(update_speedup, [c_slider, recorded_rounds], [sp_plot, sp_out], **quiet)
    use_c.click(c_from_run, [c_slider, recorded_rounds], c_slider)

    def on_recorded(state, choice):
        keys = [v for _, v in round_choices(state)]
        return gr.update(choices=round_choices(state), value=choice if choice in keys else "builtin:reject")

    recorded_rounds.change(on_recorded, [recorded_rounds, round_dd], round_dd)
    recorded_rounds.change(update_speedup, [c_slider, recorded_rounds], [sp_plot, sp_out])

    # 6. Break-even measured on this machine (ui/learn_extras.py) ------------------------------------------
    build_breakeven(recorded_rounds, get_pair)

    # 7. Three exact rules ------------------------------------------------------------------------------------
    build_verify_modes()
