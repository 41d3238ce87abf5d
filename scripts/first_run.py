"""What a new visitor meets: start `python app.py` as a user does and measure the first minutes.

Reports (JSON on stdout, and to --out):
- seconds until the page answers and until the model pair is ready (the loader's "models ready" line), the
  app's RSS at that moment, and the seconds each step of the load took (from the loader's progress lines);
- the playground's first example (its prompt and settings, through /generate), run twice (--runs N: N times):
  wall time of each run, and the measured speedup the stats panel shows (against plain steps timed between the
  run's rounds);
- the Race tab on the same prompt and settings (/race, a plain lane and the example's drafter taking turns):
  that lane's stopwatch speedup over the plain lane;
- with --browser, the CPU seconds Chromium spent during each run and each race (all its processes: what drawing
  the page took from the cores the decoding shares; it should not grow from one run to the next).

    python scripts/first_run.py                 # the app's default pair
    python scripts/first_run.py --pair tiny     # the random-weight test pair (seconds)
    python scripts/first_run.py --browser       # the same runs clicked in headless Chromium, with screenshots
    python scripts/first_run.py --browser --runs 5 --races 3   # more of each: both figures vary from run to run

With --browser the runs go through the page as a visitor's do (Chromium on the same machine, so its drawing shares
the cores with the decoding): Generate on the example the page opens with, twice, reading the speedup the stats panel
shows, then the Race tab with that example's drafter; screenshots of both go next to --out.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
READY = re.compile(r"models ready in ([0-9.]+) s")
# While a run or race streams, the script checks the page this often. Checked every frame (Playwright's default),
# reading the status's innerText forced a style and layout pass per frame on the cores the decoding uses; a visitor
# does not poll. The run's wall time is read to within this.
POLL_MS = 50
TEXT, STATS = 8, 3  # positions of the text and the stats panel among /generate's API outputs (app.py `outputs`, less its gr.State ones)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def stat_value(stats_html: str, key: str) -> str | None:
    """The value of one cell of the stats panel (components.stats: data-stat="key")."""
    m = re.search(rf'data-stat="{re.escape(key)}"[^>]*>\s*<div class="sd-stat-value">([^<]*)</div>', stats_html)
    return html.unescape(m.group(1)) if m else None


def speedup_of(stats_html: str) -> float | None:
    value = stat_value(stats_html, "speedup")
    return float(value.rstrip("×")) if value else None


def baseline_ms_of(stats_html: str) -> float | None:
    """The plain ms per token the stats panel's measured speedup divided by (its footer says it)."""
    m = re.search(r"plain target cost: [^:<]*: ([0-9.]+) ms/token", html.unescape(stats_html))
    return float(m.group(1)) if m else None


PROGRESS = re.compile(r"^\[specdec\] \[[#.]*\]\s+\d+%\s+([0-9.]+) s\s+[^:]*: (.*)$", re.M)


def load_steps(log_text: str) -> list[dict]:
    """Where the pair's load went, from the loader's progress lines in the app's log: each step (the line that
    announces it) with the seconds until the next line; the last line ("models ready in ...") ends the list."""
    marks = [(float(t), msg.strip()) for t, msg in PROGRESS.findall(log_text)]
    return [{"step": msg, "s": round(t_next - t, 2)} for (t, msg), (t_next, _) in zip(marks, marks[1:])]


def lane_speedup(summary: dict, drafter: str) -> float | None:
    for lane in summary.get("lanes", []):
        if lane.get("drafter") == drafter and lane.get("lane", 0) > 0:
            return lane.get("speedup")
    return None


def race_ms_per_token(summary: dict) -> dict:
    """Each race lane's own ms per token (its elapsed time over its tokens), keyed by drafter."""
    return {lane.get("drafter") or "plain": round(lane["elapsed_ms"] / lane["tokens"], 1)
            for lane in summary.get("lanes", []) if lane.get("tokens")}


RACE_SPEEDUP = re.compile(r"speedup <b>([0-9.]+)×</b>")


def race_lane_speedup_html(lane_html: str) -> float | None:
    """The speedup a rendered race lane shows (components.race: "speedup <b>1.68×</b>"); None while it has none."""
    m = RACE_SPEEDUP.search(lane_html)
    return float(m.group(1)) if m else None


def cpu_seconds(stat_line: str, ticks_per_s: float) -> float:
    """User plus system CPU seconds of one process from its /proc/<pid>/stat line (fields 14 and 15; the command
    name in parentheses may hold spaces, so fields are counted after its closing parenthesis)."""
    fields = stat_line.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks_per_s


def browser_cpu_s(name: str = "chrom") -> float:
    """CPU seconds used so far by every process whose command line names the browser (all of Chromium's processes:
    the page's renderer, the compositor, the browser itself). Read before and after a run, it is what drawing that
    run cost on the cores the decoding shares."""
    total, ticks = 0.0, os.sysconf("SC_CLK_TCK")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if name in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                total += cpu_seconds(Path(f"/proc/{pid}/stat").read_text(), ticks)
        except OSError:  # the process ended meanwhile
            continue
    return total


def wait_ready(proc: subprocess.Popen, log: Path, url: str, timeout: float) -> tuple[float, float]:
    """(seconds until the page answered, seconds until the loader said the models are ready)."""
    t0, page = time.time(), None
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"app.py exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if page is None:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        page = time.time() - t0
            except OSError:
                pass
        if READY.search(log.read_text(errors="replace")):
            return page if page is not None else time.time() - t0, time.time() - t0
        time.sleep(0.25)
    raise RuntimeError(f"not ready within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def example_controls(example: dict, pair: str, max_new: int) -> list:
    """/generate's inputs for an example: the first eleven controls and the drafter (app.py `control_inputs`)."""
    return [example["prompt"], example["chat"], example["gamma"], max_new, example["temperature"], 0, 1.0, 0,
            pair, "", "", example["drafter"]]


def measure(pair: str | None, max_new: int, timeout: float, log: Path, shots: Path | None = None,
            runs: int = 2, races: int = 1, reduced_motion: bool = False) -> dict:
    from gradio_client import Client

    from specdec.prompts import GROUNDED

    example = GROUNDED[0]
    port = free_port()
    env = dict(os.environ, GRADIO_SERVER_PORT=str(port), GRADIO_ANALYTICS_ENABLED="False")
    if pair:
        env["SPECDEC_PAIR"] = pair
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        page_s, ready_s = wait_ready(proc, log, url, timeout)
        ready_rss = rss_mib(proc.pid)
        name = pair or re.search(r"loading model pair (\S+)", log.read_text()).group(1)
        started = {"pair": name, "example": example["label"], "max_new_tokens": max_new, "page_s": round(page_s, 1),
                   "ready_s": round(ready_s, 1), "rss_ready_mib": round(ready_rss),
                   "load_steps": load_steps(log.read_text(errors="replace"))}
        if shots is not None:  # through the page instead of the API
            shots.mkdir(parents=True, exist_ok=True)
            seen = browser_runs(url, example, max_new, shots, runs, races, reduced_motion)
            return {**started, "browser": seen, "rss_after_mib": round(rss_mib(proc.pid)), "cpu": cpu_name(),
                    "engine_log": re.findall(r"\[specdec\] run: .*", log.read_text(errors="replace"))}
        client = Client(url, verbose=False)
        done = []
        for _ in range(runs):
            t = time.perf_counter()
            outs = client.predict(*example_controls(example, name, max_new), api_name="/generate")
            wall = time.perf_counter() - t
            done.append({"wall_s": round(wall, 3), "speedup_shown": speedup_of(outs[STATS]),
                         "plain_ms_per_token": baseline_ms_of(outs[STATS]), "text": outs[TEXT]})
        lanes = f"{example['drafter']}:{example['gamma']}"
        race = client.predict(example["prompt"], example["chat"], lanes, max_new, example["temperature"], 0,
                              api_name="/race")[2]
        rss_after = rss_mib(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    first, second = done[0], done[1]
    race_speedup = lane_speedup(race, example["drafter"])
    return {
        **started,
        "rss_after_mib": round(rss_after),
        "first_run": {k: v for k, v in first.items() if k != "text"},
        "second_run": {k: v for k, v in second.items() if k != "text"},
        "first_over_second_wall": round(first["wall_s"] / second["wall_s"], 3) if second["wall_s"] else None,
        "same_text": first["text"] == second["text"],
        "race_lane_speedup": race_speedup,
        "race_ms_per_token": race_ms_per_token(race),
        "shown_over_race": (round(second["speedup_shown"] / race_speedup, 3)
                            if race_speedup and second["speedup_shown"] else None),
        **({"runs": [{k: v for k, v in r.items() if k != "text"} for r in done],
            "shown_over_race_by_run": shown_over(done, race_speedup)} if runs > 2 else {}),
        "cpu": cpu_name(),
    }


def browser_runs(url: str, example: dict, max_new: int, shots: Path, runs: int = 2, races: int = 1,
                 reduced_motion: bool = False) -> dict:
    """The first example through the page in headless Chromium: Generate twice on the settings the page opens with
    (the first example's), then the Race tab on that example's prompt with its drafter. Returns what each showed."""
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT))
    from tests.conftest import CHROMIUM_ARGS, chromium_executable

    lanes = f"{example['drafter']}:{example['gamma']}"
    out: dict = {"playground": []}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium_executable(os.environ, os.path.exists, pw.chromium.executable_path),
            args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1440, "height": 1100},
                                reduced_motion="reduce" if reduced_motion else "no-preference")
        page.goto(url)
        page.wait_for_selector('#sd-model-badge [data-state="ready"]', timeout=600_000)
        page.wait_for_function("() => document.querySelector('#sd-drafter input').value === 'n-gram lookup'",
                               timeout=60_000)
        page.fill("#sd-max-new input[type=number]", str(max_new))
        page.press("#sd-max-new input[type=number]", "Enter")
        for _ in range(runs):
            page.click("#sd-reset")
            page.wait_for_function("() => document.querySelector('#sd-status').innerText.trim().startsWith('Reset')")
            # a visitor reads the page before pressing Generate again; clicked at once, the click waited for the
            # page to finish drawing the reset (0.06 s after the first reset, 0.65 s after the fourth)
            page.wait_for_timeout(2500)
            t, cpu = time.perf_counter(), browser_cpu_s()
            page.click("#sd-generate")
            page.wait_for_function("() => document.querySelector('#sd-status').innerText.trim().startsWith('Done')",
                                   timeout=600_000, polling=POLL_MS)
            wall, cpu = time.perf_counter() - t, browser_cpu_s() - cpu
            stats = page.inner_html("#sd-stats")
            out["playground"].append({"wall_s": round(wall, 3), "speedup_shown": speedup_of(stats),
                                      "plain_ms_per_token": baseline_ms_of(stats), "browser_cpu_s": round(cpu, 2)})
        page.wait_for_timeout(1500)  # the arrival animations, before the picture
        page.screenshot(path=str(shots / "browser-playground.png"), full_page=True)
        page.get_by_role("tab", name="Race").click()
        page.wait_for_selector("#race-run", state="visible")
        page.fill("#race-prompt textarea", example["prompt"])
        if page.locator("#race-chat input[type=checkbox]").is_checked() != example["chat"]:
            page.locator("#race-chat input[type=checkbox]").click()
        page.fill("#race-lanes textarea, #race-lanes input", lanes)
        for sel, value in (("#race-max-new input[type=number]", max_new),
                           ("#race-temperature input[type=number]", example["temperature"])):
            page.fill(sel, str(value))
            page.press(sel, "Enter")
        lanes_done = "[...document.querySelectorAll('#race-view .race-lane')].every(x => x.dataset.state === 'done')"
        out["races"], out["race_browser_cpu_s"] = [], []
        for i in range(races):
            cpu = browser_cpu_s()
            page.click("#race-run")
            if i:  # the last race's lanes read done until this one's first update replaces them
                page.wait_for_function(f"() => !({lanes_done})", timeout=60_000, polling=POLL_MS)
            page.wait_for_function("() => document.querySelectorAll('#race-view .race-lane').length === 2 && "
                                   f"{lanes_done}", timeout=900_000, polling=POLL_MS)
            out["race_browser_cpu_s"].append(round(browser_cpu_s() - cpu, 2))
            out["races"].append(race_lane_speedup_html(page.inner_html('#race-view .race-lane[data-lane="1"]')))
        out["race_lane_speedup"] = statistics.median(out["races"]) if None not in out["races"] else None
        page.locator("#race-view").scroll_into_view_if_needed()
        page.screenshot(path=str(shots / "browser-race.png"), full_page=True)
        browser.close()
    shown = out["playground"][-1]["speedup_shown"]
    out["shown_over_race"] = round(shown / out["race_lane_speedup"], 3) if shown and out["race_lane_speedup"] else None
    out["shown_over_race_by_run"] = shown_over(out["playground"], out["race_lane_speedup"])
    return out


def shown_over(runs: list[dict], race_speedup: float | None) -> list[float | None]:
    """Each run's shown speedup over the race lane's (None where either is missing)."""
    return [round(r["speedup_shown"] / race_speedup, 3) if race_speedup and r["speedup_shown"] else None
            for r in runs]


def cpu_name() -> str:
    sys.path.insert(0, str(ROOT))
    from specdec.models.pair import cpu_name as name

    return name()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default=None, help="SPECDEC_PAIR for the app (default: the app's own default)")
    ap.add_argument("--max-new", type=int, default=64, help="tokens per run (the playground's default: 64)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for the pair to be ready")
    ap.add_argument("--out", default=str(ROOT / "bench-results" / "first-run.json"))
    ap.add_argument("--log", default=str(ROOT / "bench-results" / "first-run-app.log"))
    ap.add_argument("--browser", action="store_true",
                    help="run the example and the race through the page in headless Chromium (screenshots beside --out)")
    ap.add_argument("--runs", type=int, default=2,
                    help="playground runs of the example (at least 2: the first and the second are compared)")
    ap.add_argument("--races", type=int, default=1,
                    help="with --browser: races run in the Race tab (the median lane speedup is compared)")
    ap.add_argument("--reduced-motion", action="store_true",
                    help="with --browser: the page is asked for reduced motion (no arrival animations)")
    args = ap.parse_args(argv)
    if args.runs < 2:
        ap.error("--runs must be at least 2")
    result = measure(args.pair, args.max_new, args.timeout, Path(args.log),
                     Path(args.out).parent if args.browser else None, args.runs, args.races,
                     args.reduced_motion)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
