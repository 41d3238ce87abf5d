"""Shared fixtures: the tiny random-weight pair, the real default pair, and the app running in a subprocess; and the
check that a test using what a tier costs (the app in a subprocess, Chromium, the real pair) carries its marker."""

from __future__ import annotations

import importlib.util
import inspect
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_script(name: str):
    """scripts/<name>.py as a module, for testing its parts (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
ARTIFACTS = ROOT / "test-artifacts"
# Where the browser tests put the pictures the docs show: test-artifacts/ unless SPECDEC_SCREENSHOTS names another
# folder (SPECDEC_SCREENSHOTS=docs/screenshots refreshes the docs' copies), so a test run leaves the tree clean.
SCREENSHOTS = Path(os.environ.get("SPECDEC_SCREENSHOTS") or ARTIFACTS)
DEBIAN_CHROMIUM = "/usr/bin/chromium"  # SPECDEC_CHROMIUM replaces it (a path that is missing hides it)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


# ------------------------------------------------------------------------------------------------ test tiers

# pyproject.toml's markers say what a test costs, and its default -m filter leaves all of them out (the fast tier).
# A test that uses one of these fixtures, directly or through another fixture, must carry the marker; so must one
# whose fixture calls start_app. The check runs on every collected test before -m deselects any: a test missing a
# marker fails at setup, before its fixtures start anything, and tests/test_tiers.py fails when any collected test
# (run or deselected) misses one. At run time start_app and the embedded models' loading refuse to work for a test
# without the marker, which catches what no fixture name shows (a call from a test body, a new fixture).
TIER_FIXTURES: dict[str, frozenset[str]] = {
    "slow": frozenset({"real_pair_fp32", "real_greedy"}),
    "browser": frozenset({"browser", "page"}),
    "app": frozenset({"app_url"}),
}
TIER_MISSING = pytest.StashKey[dict]()  # nodeid -> the markers that test lacks, over everything collected
_running: list = []  # the test whose setup, call or teardown runs now


def decode_choices(pair, prompt: str, settings) -> tuple[list[int], list[int]]:
    """A speculative run's generated ids and each round's kept count: what two runs that must agree compare."""
    from specdec.loop.decoder import SpeculativeDecoder

    dec = SpeculativeDecoder(pair, prompt, settings)
    list(dec)
    return dec.generated_ids, [r.n_accepted for r in dec.rounds]


def fixture_tiers(name: str, func) -> set[str]:
    """The markers a test using fixture `name` (whose function is `func`) must carry."""
    tiers = {tier for tier, names in TIER_FIXTURES.items() if name in names}
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError):  # a fixture without Python source (a plugin's, built in C): none of ours
        source = ""
    if "start_app(" in source:
        tiers.add("app")
    return tiers


def missing_tier_markers(item) -> list[str]:
    """The tier markers `item` lacks for the fixtures it uses (all of them, through other fixtures too)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:  # not a Python test function: no fixtures
        return []
    need: set[str] = set()
    for name in item.fixturenames:
        for fixturedef in info.name2fixturedefs.get(name, ()):
            need |= fixture_tiers(name, fixturedef.func)
    return sorted(tier for tier in need if item.get_closest_marker(tier) is None)


def require_tier(tier: str, what: str) -> None:
    """Fail the running test unless it is marked `tier`; `what` says what it was about to do."""
    item = _running[0] if _running else None
    if item is not None and item.get_closest_marker(tier) is None:
        pytest.fail(f"{item.nodeid} {what} but is not marked {tier}: add @pytest.mark.{tier} "
                    "(pyproject.toml's markers say what each tier costs)", pytrace=False)


def _guard_embedded_models() -> None:
    """Make the pair loader's embedded-model lookup (the real Qwen pair's weights) call require_tier("slow")."""
    from specdec.models import pair

    if getattr(pair.embedded_folder, "tier_guard", False):
        return

    def embedded_folder(slug, progress=None, *args, **kwargs):
        require_tier("slow", f"loads the embedded model {slug!r}")
        return embedded_folder.wrapped(slug, progress, *args, **kwargs)

    embedded_folder.tier_guard, embedded_folder.wrapped = True, pair.embedded_folder
    pair.embedded_folder = embedded_folder


@pytest.hookimpl(tryfirst=True)  # before the -m filter deselects anything
def pytest_collection_modifyitems(config, items):
    config.stash[TIER_MISSING] = {item.nodeid: missing for item in items if (missing := missing_tier_markers(item))}


def pytest_collection_finish(session):
    _guard_embedded_models()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    _running[:] = [item]


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures are set up
def pytest_runtest_setup(item):
    missing = item.config.stash.get(TIER_MISSING, {}).get(item.nodeid)
    if missing:
        pytest.fail(f"{item.nodeid} uses what the {', '.join(missing)} tier costs but is not marked "
                    f"{' and '.join(missing)}: add {' '.join(f'@pytest.mark.{m}' for m in missing)}", pytrace=False)


@pytest.fixture(scope="session")
def tiny_pair():
    from specdec.models.pair import load_pair

    return load_pair("tiny", dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def no_eos(tiny_pair):
    """The tiny pair with EOS switched off: runs have a known length, and the first 3 tokens are always 3."""
    import dataclasses

    return dataclasses.replace(tiny_pair, eos_token_ids=())


@pytest.fixture
def one_thread():
    """Thousands of tiny forward passes: one thread avoids paying thread hand-offs on every small matmul."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def real_pair_fp32():
    """The embedded pair in float32 (~8 GB), loaded per module and dropped after it (see release_real_pairs)."""
    from specdec.models.pair import load_pair

    return load_pair("default", dtype="float32", device="cpu")


@pytest.fixture(scope="module", autouse=True)
def release_real_pairs():
    """After each module, drop every real (non-tiny) pair from the shared pair cache and trim the heap. The suite
    starts the app on the embedded pair in a subprocess too (~8 GB): pairs kept in this process from earlier
    modules (an fp32 pair, a bf16 one, quantized ones) would leave it no room on a 24 GB machine."""
    yield
    from specdec.models.pair import PAIR_CACHE

    PAIR_CACHE.evict(lambda pair: not pair.target_id.startswith("tiny:"))


REFERENCE_TOKENS = 24  # the longest reference the real-pair tests compare against
# Code that repeats itself, the real-pair copy tests' shared prompt (one greedy reference serves them all)
REPEATING_CODE = ("def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n\n\n"
                  "def area_of_square(s):\n")
_GREEDY_REFERENCES: dict[tuple[str, bool], tuple[list[int], int]] = {}  # kept for the run; the pair is not


@pytest.fixture(scope="module")
def real_greedy(real_pair_fp32):
    """greedy(prompt, n, chat=False): the first n token ids of plain greedy decoding (loop.plain) on the real fp32
    pair, decoded once per prompt for the whole run. Greedy decoding is deterministic and its first n tokens do
    not depend on how many follow, so one decode of REFERENCE_TOKENS serves every test on that prompt (each plain
    decode costs ~1 s a token on 2 CPU cores, and a dozen tests share a few prompts)."""
    from specdec.core.settings import DecodeSettings
    from specdec.loop.plain import plain_decode

    done = _GREEDY_REFERENCES

    def greedy(prompt: str, n: int, chat: bool = False) -> list[int]:
        ids, asked = done.get((prompt, chat), ([], 0))
        if asked < n and len(ids) == asked:  # shorter than asked only where the decode ended (end of text)
            asked = max(n, REFERENCE_TOKENS)
            ids = plain_decode(real_pair_fp32, prompt, DecodeSettings(max_new_tokens=asked, chat=chat)).ids
            done[(prompt, chat)] = ids, asked
        return list(ids[:n])

    return greedy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(env_extra: dict, log_path: Path, timeout: float = 180.0):
    """Start `python app.py` on a free port; return (process, url) once the page answers. Only for tests marked app."""
    require_tier("app", "boots the app in a subprocess")
    port = free_port()
    env = dict(os.environ, GRADIO_SERVER_PORT=str(port), **env_extra)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"app.py exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"app.py did not answer within {timeout}s:\n{log_path.read_text()[-3000:]}")


def stop_app(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="session")
def app_url():
    """The app on the tiny test pair, shared by all browser and API tests of a session."""
    proc, url = start_app({"SPECDEC_PAIR": "tiny"}, ARTIFACTS / "app-tiny.log")
    yield url
    stop_app(proc)


def under_ci(env) -> bool:
    return env.get("CI", "").strip().lower() in ("true", "1", "yes")


def chromium_executable(env, exists, playwright_chromium: str | None) -> str:
    """The Chromium the browser tests launch: Debian's (/usr/bin/chromium, or SPECDEC_CHROMIUM) when present, else
    Playwright's own (`playwright_chromium`, where Playwright would put it) when installed. With neither, the tests
    are skipped with the two ways to get one -- except under CI (CI=true), where a missing browser fails the run:
    .ci/run installs Debian's chromium, so a skip there would hide a broken setup."""
    system = env.get("SPECDEC_CHROMIUM", DEBIAN_CHROMIUM)
    if exists(system):
        return system
    if playwright_chromium and exists(playwright_chromium):
        return playwright_chromium
    why = (f"no Chromium for the browser tests: {system} is missing (install Debian's: apt-get install -y chromium) "
           "and Playwright's own Chromium is not installed (python -m playwright install chromium)")
    if under_ci(env):
        pytest.fail(f"{why}; under CI (CI={env.get('CI')}) the browser tests must run, not skip", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def browser():
    pw_mod = pytest.importorskip("playwright.sync_api")
    with pw_mod.sync_playwright() as pw:
        try:
            bundled = pw.chromium.executable_path  # where Playwright's own Chromium is, installed or not
        except Exception:  # noqa: BLE001 -- no known path for this platform: there is none to use
            bundled = None
        b = pw.chromium.launch(executable_path=chromium_executable(os.environ, os.path.exists, bundled),
                               args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    yield pg
    ctx.close()
