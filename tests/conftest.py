"""Shared fixtures: the tiny random-weight pair, the real default pair, and the app running in a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
DEBIAN_CHROMIUM = "/usr/bin/chromium"  # SPECDEC_CHROMIUM replaces it (a path that is missing hides it)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


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


@pytest.fixture(scope="session")
def real_pair_fp32():
    from specdec.models.pair import load_pair

    return load_pair("default", dtype="float32", device="cpu")


REFERENCE_TOKENS = 24  # the longest reference the real-pair tests compare against


@pytest.fixture(scope="session")
def real_greedy(real_pair_fp32):
    """greedy(prompt, n, chat=False): the first n token ids of plain greedy decoding (loop.plain) on the real fp32
    pair, decoded once per prompt for the whole run. Greedy decoding is deterministic and its first n tokens do
    not depend on how many follow, so one decode of REFERENCE_TOKENS serves every test on that prompt (each plain
    decode costs ~1 s a token on 2 CPU cores, and a dozen tests share a few prompts)."""
    from specdec.core.settings import DecodeSettings
    from specdec.loop.plain import plain_decode

    done: dict[tuple[str, bool], tuple[list[int], int]] = {}

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
    """Start `python app.py` on a free port; return (process, url) once the page answers."""
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
