"""The test tiers: pyproject.toml's markers say what a test costs (the real pair, Chromium, the app in a subprocess,
10^4 rounds or more of statistics), the default run leaves all of them out, CI runs every tier, and a test that uses
what a tier costs without its marker fails (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TIER_MISSING, fixture_tiers, start_app

ROOT = Path(__file__).resolve().parent.parent
TIERS = ("slow", "browser", "app", "stat", "compile")
FAST_TIER = "not slow and not browser and not app and not stat and not compile"


def test_every_collected_test_carries_the_markers_of_what_it_uses(request):
    """Over everything this session collected, deselected tests included."""
    missing = request.config.stash[TIER_MISSING]
    assert not missing, "tests that use what a tier costs without its marker: " + "; ".join(
        f"{nodeid} needs {', '.join(tiers)}" for nodeid, tiers in sorted(missing.items()))


def _boots_the_app(tmp_path):
    proc, url = start_app({}, tmp_path / "app.log")  # noqa: F841 -- only its source matters here
    yield url


def _tiny(tiny_pair):
    return tiny_pair


def test_the_fixture_check_knows_what_each_tier_costs():
    assert fixture_tiers("real_pair_fp32", _tiny) == {"slow"} and fixture_tiers("real_greedy", _tiny) == {"slow"}
    assert fixture_tiers("page", _tiny) == fixture_tiers("browser", _tiny) == {"browser"}
    assert fixture_tiers("app_url", _tiny) == {"app"}
    assert fixture_tiers("a_new_fixture", _boots_the_app) == {"app"}  # any fixture that calls start_app
    assert fixture_tiers("tiny_pair", _tiny) == set() and fixture_tiers("tmp_path", len) == set()


def test_start_app_refuses_a_test_not_marked_app(tmp_path):
    log = tmp_path / "app.log"
    with pytest.raises(pytest.fail.Exception, match="boots the app in a subprocess but is not marked app"):
        start_app({}, log)
    assert not log.exists(), "nothing may start before the check"


def test_the_embedded_models_refuse_a_test_not_marked_slow(monkeypatch):
    from specdec.models import pair

    assert getattr(pair.embedded_folder, "tier_guard", False), "the pair loader's embedded lookup is not guarded"
    monkeypatch.setattr(pair.embedded_folder, "wrapped",
                        lambda slug, progress=None: pytest.fail("the guard let the real loader run"))
    with pytest.raises(pytest.fail.Exception, match="loads the embedded model .* but is not marked slow"):
        pair.embedded_folder("qwen2.5-coder-0.5b-instruct")
    with pytest.raises(pytest.fail.Exception, match="but is not marked slow"):
        pair.load_pair("default", dtype="float32", device="cpu", shared=False)


def test_the_default_run_is_the_fast_tier_and_ci_runs_every_tier(request):
    registered = [line.split(":", 1)[0].strip() for line in request.config.getini("markers")]
    assert set(TIERS) <= set(registered), registered
    addopts = request.config.getini("addopts")
    assert "-m" in addopts and addopts[addopts.index("-m") + 1] == FAST_TIER, addopts
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    commands = [line for line in lines if line and not line.startswith("#")]
    # an empty mark expression clears the default filter: every tier runs
    assert commands[-1].endswith('&& python -m pytest -m ""'), commands[-1]
