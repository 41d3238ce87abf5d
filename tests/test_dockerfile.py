"""The Dockerfile builds the app the way a Hugging Face Docker Space runs it.

Docker is not available where these tests run, so the Dockerfile is parsed into instructions and checked for
what matters: the base image, the uid-1000 user, the port, layer order for caching, the build-time model
conversion, the health check and the start command. Commands that can be run here (the conversion one-liner,
the health check) are run, against stand-ins.
"""

from __future__ import annotations

import ast
import fnmatch
import http.server
import json
import re
import shlex
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


# ---------------------------------------------------------------------------------------------- the parser


@dataclass
class Instruction:
    line: int  # 1-based line where the instruction starts
    keyword: str  # upper case: FROM, RUN, COPY, ...
    args: str  # the rest, continuation lines joined with spaces

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form RUN/CMD/ENTRYPOINT, or None for shell form."""
        text = self.args.strip()
        if not text.startswith("["):
            return None
        value = json.loads(text)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), f"line {self.line}: bad exec form"
        return value

    def flags_and_rest(self) -> tuple[dict[str, str], list[str]]:
        """Split `--flag=value` options (COPY --chown=user, HEALTHCHECK --interval=30s) from the other words."""
        words = shlex.split(self.args, posix=True) if not self.args.lstrip().startswith("[") else []
        flags = {}
        while words and words[0].startswith("--"):
            name, _, value = words.pop(0)[2:].partition("=")
            flags[name] = value
        return flags, words


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions in order: comments and blank lines dropped, backslash continuations joined."""
    out: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction are ignored by Docker too
        if not pending:
            start = number
        continued = stripped.endswith("\\")
        pending.append(stripped[:-1].strip() if continued else stripped)
        if not continued:
            keyword, _, args = " ".join(p for p in pending if p).partition(" ")
            out.append(Instruction(start, keyword.upper(), args.strip()))
            pending = []
    assert not pending, "the Dockerfile ends inside a continued instruction"
    return out


def env_of(instructions: list[Instruction], upto: int | None = None) -> dict[str, str]:
    """ENV (and ARG defaults) in effect before instruction index `upto`, with $VAR / ${VAR} expanded."""
    env: dict[str, str] = {}
    for ins in instructions[:upto]:
        if ins.keyword not in ("ENV", "ARG"):
            continue
        for word in shlex.split(ins.args):
            if "=" not in word:
                continue
            key, _, value = word.partition("=")
            env[key] = expand(value, env)
    return env


def expand(value: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), m.group(0)), value)


def test_parser_handles_continuations_comments_and_exec_form():
    ins = parse_dockerfile(
        "# comment\nFROM python:3.11-slim\n\nRUN a \\\n    # inside\n    && b\nCMD [\"python\", \"app.py\"]\n"
        "ENV A=1 \\\n    B=$A/x\n"
    )
    assert [(i.keyword, i.line) for i in ins] == [("FROM", 2), ("RUN", 4), ("CMD", 7), ("ENV", 8)]
    assert ins[1].args == "a && b"
    assert ins[2].exec_form() == ["python", "app.py"]
    assert env_of(ins) == {"A": "1", "B": "1/x"}


# ----------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    assert DOCKERFILE.is_file(), "Dockerfile is missing at the repository root"
    return parse_dockerfile(DOCKERFILE.read_text())


def find(instructions, keyword, pattern=".*") -> list[tuple[int, Instruction]]:
    return [(n, i) for n, i in enumerate(instructions) if i.keyword == keyword and re.search(pattern, i.args)]


def one(instructions, keyword, pattern=".*") -> tuple[int, Instruction]:
    hits = find(instructions, keyword, pattern)
    assert len(hits) == 1, f"expected exactly one {keyword} matching {pattern!r}, found {len(hits)}"
    return hits[0]


def conversion_step(instructions) -> tuple[int, Instruction]:
    return one(instructions, "RUN", r"embedded_folder")


# ----------------------------------------------------------------------------------------------- the checks


def test_slim_python_311_base(instructions):
    froms = find(instructions, "FROM")
    assert len(froms) == 1 and froms[0][0] == 0, "one stage, starting FROM the base image"
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", froms[0][1].args.split()[0])


def test_runs_as_uid_1000_with_home_and_app_dir(instructions):
    _, useradd = one(instructions, "RUN", r"useradd")
    assert re.search(r"(--uid|-u)[ =]1000\b", useradd.args), "Spaces run containers as uid 1000"
    command = re.search(r"useradd\b[^&;|]*", useradd.args).group(0)  # this command only, not what && follows
    name = command.split()[-1]
    assert re.search(rf"install -d -o {name}\b.* /home/user/app|chown .*{name}.* /home/user/app", useradd.args), \
        "the app folder must belong to the user (WORKDIR alone may create it as root)"
    users = find(instructions, "USER")
    assert users and users[-1][1].args in (name, "1000"), "the last USER must be the uid-1000 user, not root"
    n_cmd, _ = one(instructions, "CMD")
    assert users[-1][0] < n_cmd
    env = env_of(instructions)
    assert env["HOME"] == "/home/user"
    workdirs = find(instructions, "WORKDIR")
    assert expand(workdirs[-1][1].args, env_of(instructions, workdirs[-1][0])) == "/home/user/app"


def test_port_7860(instructions):
    assert [i.args for _, i in find(instructions, "EXPOSE")] == ["7860"]
    env = env_of(instructions)
    assert env["GRADIO_SERVER_NAME"] == "0.0.0.0" and env["GRADIO_SERVER_PORT"] == "7860"


def test_hub_access_is_not_switched_off(instructions):
    assert "HF_HUB_OFFLINE" not in env_of(instructions), "hub presets must keep working on Spaces"


def test_requirements_install_in_its_own_cached_layer(instructions):
    n_req, req = one(instructions, "COPY", r"requirements\.txt")
    n_pip, pip = one(instructions, "RUN", r"pip install")
    copies = find(instructions, "COPY")
    n_src = next(n for n, c in copies if c.flags_and_rest()[1][0] == ".")
    assert n_req < n_pip < n_src, "COPY requirements.txt, then pip install, then the rest of the source"
    assert all(c.flags_and_rest()[1][0] != "." for n, c in copies if n < n_pip)
    assert "--no-cache-dir" in pip.args and re.search(r"-r \S*requirements\.txt", pip.args)
    # The requirements copied must be the ones installed (they may be copied to another path).
    dest = req.flags_and_rest()[1][-1]
    assert dest.rstrip("/").endswith("requirements.txt") or dest.endswith("/"), dest


def test_torch_comes_from_the_cpu_index_by_default(instructions):
    n_pip, pip = one(instructions, "RUN", r"pip install")
    env = env_of(instructions, n_pip)
    index_args = expand(pip.args.replace('"', ""), env)
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in index_args, index_args


def test_models_are_converted_at_build_time_as_the_user(instructions):
    n_conv, conv = conversion_step(instructions)
    n_pip, _ = one(instructions, "RUN", r"pip install")
    users = find(instructions, "USER")
    assert n_pip < n_conv
    assert any(n < n_conv for n, _ in users), "convert as the app user so it owns the cache"
    env = env_of(instructions, n_conv)
    assert env.get("SPECDEC_CACHE", "").startswith("/home/user/"), "cache inside the user's home"


def test_conversion_step_builds_every_embedded_model(instructions, monkeypatch):
    import specdec.models.embedded

    _, conv = conversion_step(instructions)
    words = shlex.split(conv.args)
    assert words[:2] == ["python", "-c"], conv.args
    code = words[2]
    called = []
    monkeypatch.setattr(specdec.models.embedded, "embedded_folder",
                        lambda slug, progress=None, dtype=torch.float32: called.append((slug, dtype)))
    exec(compile(code, "<Dockerfile RUN>", "exec"), {})
    # Every embedded model, in float32 and in bfloat16 (the CPU app's dtype: its copy is what a start reads).
    assert sorted(called, key=str) == sorted(((slug, dtype) for slug in specdec.models.embedded.EMBEDDED
                                              for dtype in (torch.float32, torch.bfloat16)), key=str)


def test_conversion_layer_has_the_code_it_imports(instructions):
    """Only the converter is copied before the conversion step; it must be everything embedded.py imports."""
    n_conv, _ = conversion_step(instructions)
    copied = set()
    for n, c in find(instructions, "COPY"):
        if n < n_conv:
            *sources, dest = c.flags_and_rest()[1]
            for src in sources:  # each source file must land in its own package folder (COPY flattens)
                if src.startswith("specdec/"):
                    assert dest.rstrip("/") == src.rpartition("/")[0], f"COPY {src} -> {dest}"
            copied.update(sources)
    assert "." not in copied, "copying the whole source before the conversion would rerun it on every edit"

    def files_of(module: str) -> set[str]:
        parts = module.split(".")
        return {"/".join(parts[:i]) + "/__init__.py" for i in range(1, len(parts))} | {"/".join(parts) + ".py"}

    tree = ast.parse((ROOT / "specdec" / "models" / "embedded.py").read_text())
    needed = files_of("specdec.models.embedded")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specdec."):
            needed |= files_of(node.module)
    assert needed <= copied, f"missing before the conversion step: {sorted(needed - copied)}"


def test_copied_files_exist_and_are_not_dockerignored(instructions):
    ignored = dockerignore_patterns()
    for _, c in find(instructions, "COPY"):
        for src in c.flags_and_rest()[1][:-1]:
            if src == ".":
                continue
            assert (ROOT / src).exists(), f"COPY {src}: no such file"
            assert not is_ignored(src, ignored), f"COPY {src}: excluded by .dockerignore"
    for needed in ("app.py", "specdec/models/pair.py", "requirements.txt", "components", "ui", "assets"):
        assert not is_ignored(needed, ignored), f"{needed} must reach the image"


def test_healthcheck_polls_the_app_port(instructions):
    _, hc = one(instructions, "HEALTHCHECK")
    flags, _ = _healthcheck_flags(hc)
    assert "start-period" in flags, "the first start may take a while; give it a grace period"
    assert re.search(r"http://(127\.0\.0\.1|localhost):7860/", hc.args)


def _healthcheck_flags(hc: Instruction) -> tuple[dict[str, str], list[str]]:
    """The --options before HEALTHCHECK's CMD."""
    head, _, _ = hc.args.partition("CMD")
    return Instruction(hc.line, "HEALTHCHECK", head).flags_and_rest()


def _healthcheck_command(hc: Instruction, port: int) -> list[str]:
    _, _, cmd = hc.args.partition("CMD")
    cmd = cmd.strip().replace("7860", str(port))
    argv = json.loads(cmd) if cmd.startswith("[") else ["sh", "-c", cmd]
    return [sys.executable if a == "python" else a for a in argv]


def test_healthcheck_command_passes_when_up_and_fails_when_down(instructions):
    from tests.conftest import free_port

    _, hc = one(instructions, "HEALTHCHECK")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        up = subprocess.run(_healthcheck_command(hc, server.server_address[1]), capture_output=True, timeout=30)
        assert up.returncode == 0, up.stderr.decode()
    finally:
        server.shutdown()
        server.server_close()
    down = subprocess.run(_healthcheck_command(hc, free_port()), capture_output=True, timeout=30)
    assert down.returncode != 0


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def test_cmd_starts_the_app(instructions):
    _, cmd = one(instructions, "CMD")
    assert cmd.exec_form() == ["python", "app.py"]
    assert (ROOT / "app.py").is_file()


# ------------------------------------------------------------------------------------------------ .dockerignore


def dockerignore_patterns() -> list[str]:
    assert DOCKERIGNORE.is_file(), ".dockerignore is missing"
    lines = [ln.strip() for ln in DOCKERIGNORE.read_text().splitlines()]
    return [ln.rstrip("/") for ln in lines if ln and not ln.startswith("#")]


def is_ignored(path: str, patterns: list[str]) -> bool:
    """Docker's matching, enough for plain patterns: a pattern matches the path or any folder above it."""
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        bare = pattern.removeprefix("**/")
        for prefix in prefixes:
            if fnmatch.fnmatch(prefix, pattern):
                return True
            if pattern.startswith("**/") and fnmatch.fnmatch(Path(prefix).name, bare):  # at any depth
                return True
    return False


@pytest.mark.parametrize("path", [".venv", ".venv/lib/python3.11/site-packages/torch/__init__.py", ".git",
                                  ".git/HEAD", "test-artifacts/app.log", "bench-results/bench.json",
                                  "specdec/__pycache__/models.cpython-311.pyc"])
def test_dockerignore_keeps_local_clutter_out(path):
    assert is_ignored(path, dockerignore_patterns())
