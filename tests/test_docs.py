"""The README and docs/ say what the code does: the quick-start Python example runs, the CLI page lists every flag of
the parsers, the two contractual commands are the ones CI runs, every relative link resolves, and the pages
describe the software only."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import tomllib
from pathlib import Path

import pytest
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CLI_PAGE = DOCS / "cli.md"
MAX_README_LINES = 200
APP_COMMAND = ("python3 -m venv .venv && . .venv/bin/activate && pip install -r requirements.txt && "
               "pip install --no-deps -r requirements-nodeps.txt && python app.py")
TEST_COMMAND = ("python3 -m venv .venv && . .venv/bin/activate && pip install -r requirements-dev.txt && "
                "pip install --no-deps -r requirements-nodeps.txt && python -m pytest -m \"\"")
# The example loads the embedded pair; the test runs the same lines on the random-weight tiny pair in float32.
EXAMPLE_PAIR = 'load_pair("default")'
TINY_PAIR = 'load_pair("tiny", dtype="float32", device="cpu")'


def _code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _cli_docs():
    return load_script("cli_docs")


# ------------------------------------------------------------------------------------------------ the README


def test_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; the front page keeps to {MAX_README_LINES}"
    # The Hugging Face Spaces front matter comes first: a Gradio SDK Space reads it to run app.py.
    assert lines[0] == "---"
    end = lines.index("---", 1)
    front = dict(line.split(": ", 1) for line in lines[1:end])
    assert front["sdk"] == "gradio" and front["app_file"] == "app.py" and front["title"] == "specdec"
    body = "\n".join(lines[end + 1:])
    first_screen = body.split("\n## ", 1)[0]
    assert re.search(r'src="docs/screenshots/default-light[^"]*\.png"|\]\(docs/screenshots/default-light', first_screen), \
        "the screenshot belongs before the first section"


def test_the_two_commands_are_in_the_readme_and_ci_runs_the_test_command():
    blocks = [b.strip() for b in _code_blocks(README.read_text(encoding="utf-8"), "bash")]
    assert APP_COMMAND in blocks, "the one-line command that starts the app on a fresh machine"
    assert TEST_COMMAND in blocks, "the one-line command that runs every test tier"
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    ci = [line for line in ci if line and not line.startswith("#")]
    assert TEST_COMMAND in ci, ".ci/run must run exactly the README's test command"


def test_the_quick_start_example_runs_on_the_tiny_pair(tiny_pair):
    examples = [b for b in _code_blocks(README.read_text(encoding="utf-8"), "python") if "SpeculativeDecoder" in b]
    assert len(examples) == 1, "one Python example with SpeculativeDecoder in the README"
    code = examples[0]
    assert len(code.strip().splitlines()) <= 12, "the quick-start example keeps to 12 lines"
    scope, text = _run_on_tiny(code, "README.md example")
    decoder = scope["decoder"]
    printed = text.splitlines()
    assert len(decoder.rounds) >= 2
    rounds = [line for line in printed if line.startswith("round ")]
    assert len(rounds) == len(decoder.rounds), "one line per round"
    assert rounds[0].startswith("round 0: drafted [")
    assert text.endswith(decoder.text + "\n"), "the text is printed last"
    assert len(decoder.generated_ids) == decoder.settings.max_new_tokens or decoder.stop_reason == "eos"


def _run_on_tiny(code: str, where: str) -> tuple[dict, str]:
    """Run a documented example with the embedded pair swapped for the tiny one; its scope and what it printed."""
    assert code.count(EXAMPLE_PAIR) == 1, f"{where}: the example loads its pair with {EXAMPLE_PAIR}"
    out = io.StringIO()
    scope: dict = {}
    with contextlib.redirect_stdout(out):
        exec(compile(code.replace(EXAMPLE_PAIR, TINY_PAIR), where, "exec"), scope)
    return scope, out.getvalue()


def test_the_api_pages_python_examples_run_on_the_tiny_pair(tiny_pair):
    blocks = [b for b in _code_blocks((DOCS / "api.md").read_text(encoding="utf-8"), "python") if EXAMPLE_PAIR in b]
    assert len(blocks) >= 2
    for number, code in enumerate(blocks, 1):
        _, printed = _run_on_tiny(code, f"docs/api.md example {number}")
        assert printed.strip(), f"docs/api.md example {number} printed nothing"


def test_the_round_in_architecture_md_is_the_decoders_own_code():
    import inspect

    from specdec.loop.decoder import SpeculativeDecoder

    source = {line.strip() for line in inspect.getsource(SpeculativeDecoder.step).splitlines()}
    source |= {line.split("  #", 1)[0].strip() for line in source}
    page = (DOCS / "architecture.md").read_text(encoding="utf-8")
    block = next(b for b in _code_blocks(page, "python") if "self.drafter.propose" in b)
    for line in block.splitlines():
        code = line.split("  #", 1)[0].strip()
        if code.endswith("(...)"):
            assert any(s.startswith(code[:-4]) for s in source), line
        elif code:
            assert code in source, f"docs/architecture.md shows a line SpeculativeDecoder.step no longer has: {code}"


# ------------------------------------------------------------------------------------------------ docs/cli.md


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from specdec.cli import build_parser

    return _cli_docs().subcommands(build_parser())


@pytest.mark.parametrize("command", ["generate", "bench"])
def test_every_flag_is_on_the_cli_page(command):
    page = CLI_PAGE.read_text(encoding="utf-8")
    section = page.split(f"## `python -m specdec {command}`", 1)
    assert len(section) == 2, f"docs/cli.md has no section for {command}"
    body = section[1].split("\n## ", 1)[0]
    missing = [f for f in _cli_docs().flags(_parsers()[command]) if f"`{f}`" not in body]
    assert not missing, f"docs/cli.md lacks {missing} of `{command}`: run python scripts/cli_docs.py"


@pytest.mark.parametrize("command", ["generate", "bench"])
def test_every_flag_says_what_it_does(command):
    bare = [a.option_strings[0] for a in _parsers()[command]._actions
            if a.option_strings and a.dest != "help" and not (a.help or "").strip()]
    assert not bare, f"`{command}` flags without a help text: {bare}"


def test_the_cli_page_is_what_the_generator_writes():
    assert CLI_PAGE.read_text(encoding="utf-8") == _cli_docs().render(), \
        "docs/cli.md is out of date: run python scripts/cli_docs.py"


def _documented_commands(prefix: str, min_words: int) -> list[str]:
    """Every `prefix ...` command on the README and the docs pages: the lines of bash blocks, and the inline code
    spans of at least `min_words` words (a span may wrap onto the next line; a bare `python -m specdec generate`
    names the subcommand); placeholders like <drafter> left out."""
    found = []
    for page in _pages():
        text = page.read_text(encoding="utf-8")
        lines = [line.split(" #")[0].strip() for block in _code_blocks(text, "bash") for line in block.splitlines()]
        prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
        spans = [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose, re.S)]
        lines += [span for span in spans if len(span.split()) >= min_words]
        found += [line for line in lines if line.startswith(prefix) and "<" not in line]
    return sorted(set(found))


class _Parsed(Exception):
    pass


def test_every_documented_specdec_command_parses():
    from specdec.cli import build_parser

    commands = _documented_commands("python -m specdec ", 5)
    assert any("generate" in c for c in commands) and any("--suite" in c for c in commands)
    for line in commands:
        build_parser().parse_args(shlex.split(line)[3:])  # argparse exits on a flag it does not know


def test_every_documented_script_command_parses(monkeypatch):
    """Each `python scripts/NAME.py ...` on a page names a script that exists and whose parser takes the flags."""
    commands = _documented_commands("python scripts/", 2)
    assert commands
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        parse(self, args, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    for line in commands:
        words = shlex.split(line)
        name = Path(words[1]).stem
        assert (ROOT / "scripts" / f"{name}.py").is_file(), line
        with pytest.raises(_Parsed):
            load_script(name).main(words[2:])


# ------------------------------------------------------------------------------------------------ every page


def test_relative_links_resolve():
    broken = []
    for page in _pages():
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'(?:src|href)="([^"]+)"', text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_every_docs_page_is_linked_from_the_readme_another_page_or_the_code():
    linked = set()
    for page in _pages():
        for target in re.findall(r"\]\(([^)\s#]+\.md)", page.read_text(encoding="utf-8")):
            linked.add((page.parent / target).resolve())
    code = " ".join(f.read_text(encoding="utf-8") for folder in ("specdec", "ui", "components")
                    for f in (ROOT / folder).rglob("*.py")) + (ROOT / "app.py").read_text(encoding="utf-8")
    orphans = [p.name for p in DOCS.glob("*.md") if p.resolve() not in linked and f"docs/{p.name}" not in code]
    assert not orphans, f"pages no one links to: {orphans}"


# Words about how the text was made rather than about the software.
NOT_ABOUT_THE_SOFTWARE = [r"\bmeasured this round\b", r"\bthis round's (measurements|numbers|changes)\b",
                          r"\bthis session's machine\b", r"\bto this session\b", r"\bagents?\b", r"\blent\b",
                          r"\bread in the .* repository\b", r"\bwe (measured|looked)\b"]


def test_pages_describe_the_software():
    found = []
    for page in _pages():
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for pattern in NOT_ABOUT_THE_SOFTWARE:
                if re.search(pattern, line, re.I):
                    found.append(f"{page.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not found, found


def test_the_readme_names_every_test_tier():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    markers = [m.split(":", 1)[0].strip() for m in config["tool"]["pytest"]["ini_options"]["markers"]]
    development = README.read_text(encoding="utf-8").split("## Development", 1)[1].split("\n## ", 1)[0]
    missing = [m for m in markers if f"`{m}`" not in development]
    assert not missing, f"README's Development section does not name the markers {missing}"


def test_every_environment_variable_the_code_reads_is_in_deploy_md():
    code = " ".join(f.read_text(encoding="utf-8") for folder in ("specdec", "ui", "components")
                    for f in (ROOT / folder).rglob("*.py")) + (ROOT / "app.py").read_text(encoding="utf-8")
    names = set(re.findall(r"\bSPECDEC_[A-Z_]+[A-Z]\b", code))
    page = (DOCS / "deploy.md").read_text(encoding="utf-8")
    missing = sorted(n for n in names if f"`{n}`" not in page)
    assert not missing, f"docs/deploy.md's table of environment variables lacks {missing}"


def test_the_readme_and_the_app_page_name_every_choice_the_engine_offers():
    from specdec.core.settings import DRAFTERS, ENGINES, GAMMA_POLICIES
    from specdec.core.verify import VERIFY_MODES
    from specdec.models.quant import QUANT_MODES

    features = README.read_text(encoding="utf-8").split("## Features", 1)[1].split("\n## ", 1)[0]
    playground = (DOCS / "playground.md").read_text(encoding="utf-8")
    for name in (*DRAFTERS, *VERIFY_MODES, *ENGINES, *QUANT_MODES, *GAMMA_POLICIES):
        assert f"`{name}`" in features, f"README's Features do not name `{name}`"
    for name in (*DRAFTERS, *VERIFY_MODES, *GAMMA_POLICIES):
        assert f"`{name}`" in playground, f"docs/playground.md does not name `{name}`"
