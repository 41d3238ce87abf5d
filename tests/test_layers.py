"""The layers of the code base, written down once, and a check that every import respects them.

Each module's imports are read with `ast` (nothing is imported or run). A module may import from its own layer
and from the layers listed for it below; anything else is an import that goes up (or across) a layer. Imports of
the project's own modules must also form no circle. Imports under `if TYPE_CHECKING:` are annotations only and
are left out, as are third-party and standard-library modules.

    specdec.core       settings, errors, sampling, verify, kvcache, events, metrics, record, stop, clock
    specdec.prompts    prompt sets (data only)
    specdec.models     pairs, pair cache, embedded GGUF pair, tiny models, hub loading, the cross draft's loading
    specdec.drafters   who proposes guesses (the two-method Drafter and its five implementations)
    specdec.loop       the decoder and its round, the plain loop, gamma policies, batched decoding, the race
    specdec.io         traces and server-metrics exports (records in, files out)
    specdec.learn      the lab, the bug zoo, the break-even map, worked examples
    specdec.bench      the benchmark harness and its modes
    specdec.cli        the command line
    components         pure rendering: result types in, HTML / Plotly out
    ui                 Gradio handlers
    app                wiring
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORE = {"specdec.core"}
LAYERS: dict[str, set[str]] = {  # layer -> the layers below it that it may import
    "specdec.core": set(),
    "specdec.prompts": set(),
    "specdec.models": CORE,
    "specdec.drafters": CORE | {"specdec.models"},
    "specdec.loop": CORE | {"specdec.models", "specdec.drafters"},
    "specdec.io": CORE,
    "specdec.learn": CORE | {"specdec.models", "specdec.drafters", "specdec.loop", "specdec.prompts"},
    "specdec.bench": CORE | {"specdec.models", "specdec.drafters", "specdec.loop", "specdec.prompts"},
    "specdec.cli": CORE | {"specdec.models", "specdec.drafters", "specdec.loop", "specdec.io", "specdec.bench",
                           "specdec.prompts"},
    "components": CORE | {"specdec.loop", "specdec.learn", "specdec.io"},
    "ui": {"specdec", "components"},
    "app": {"specdec", "components", "ui"},
}
PACKAGES = ("specdec", "components", "ui", "app")


def layer_of(module: str) -> str | None:
    """The most specific layer a module belongs to (None: not one of the project's modules)."""
    best = None
    for layer in LAYERS:
        if module == layer or module.startswith(layer + "."):
            if best is None or len(layer) > len(best):
                best = layer
    if best is None and module in ("specdec", "specdec.__main__"):
        return "specdec.cli"  # the package root only starts the CLI
    return best


def allowed(src_layer: str, dst_module: str) -> bool:
    dst_layer = layer_of(dst_module)
    if dst_layer is None or dst_layer == src_layer:
        return True
    return any(dst_module == ok or dst_module.startswith(ok + ".") for ok in LAYERS[src_layer])


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _type_checking_lines(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                skip.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return skip


def project_imports(path: pathlib.Path, root: pathlib.Path) -> list[tuple[int, str]]:
    """(line, absolute module) for every import of a project module in one file (submodules named in a
    `from package import module` count as that submodule)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_lines(tree)
    out = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                sub = f"{mod}.{a.name}"
                is_sub = (root / (sub.replace(".", "/") + ".py")).exists() or (root / sub.replace(".", "/")).is_dir()
                out.append((node.lineno, sub if is_sub else mod))
    return list(dict.fromkeys((line, m) for line, m in out if m.split(".")[0] in PACKAGES))


def source_files(root: pathlib.Path) -> list[pathlib.Path]:
    files = [root / "app.py"] if (root / "app.py").exists() else []
    for pkg in PACKAGES[:-1]:
        files += sorted((root / pkg).rglob("*.py"))
    return files


def layer_violations(root: pathlib.Path) -> list[str]:
    out = []
    for path in source_files(root):
        src = module_name(path, root)
        src_layer = layer_of(src)
        for line, dst in project_imports(path, root):
            if src_layer is not None and not allowed(src_layer, dst):
                text = path.read_text().splitlines()[line - 1].strip()
                out.append(f"{path.relative_to(root)}:{line}: {src} ({src_layer}) imports {dst} "
                           f"({layer_of(dst)}), a layer it may not use: {text}")
    return out


def import_cycles(root: pathlib.Path) -> list[list[str]]:
    """Circles among the project's modules (an import of a package counts as an import of its __init__)."""
    graph: dict[str, set[str]] = {}
    files = {module_name(p, root): p for p in source_files(root)}
    for mod, path in files.items():
        graph[mod] = {dst for _, dst in project_imports(path, root) if dst in files and dst != mod}
    cycles, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_every_module_has_a_layer():
    missing = [module_name(p, ROOT) for p in source_files(ROOT) if layer_of(module_name(p, ROOT)) is None]
    assert not missing, f"modules outside every layer (add them to LAYERS): {missing}"


def test_no_import_goes_up_a_layer():
    bad = layer_violations(ROOT)
    assert not bad, "imports that go up a layer:\n" + "\n".join(bad)


def test_no_import_circles():
    cycles = import_cycles(ROOT)
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.fixture
def planted(tmp_path):
    """A copy of the source tree to plant bad imports in."""
    import shutil

    for name in PACKAGES[:-1]:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "app.py", tmp_path / "app.py")
    return tmp_path


def test_a_planted_upward_import_is_named_with_its_line(planted):
    verify = planted / "specdec" / "core" / "verify.py"
    lines = verify.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("from "))
    lines.insert(at, "from specdec.loop.decoder import SpeculativeDecoder")
    verify.write_text("\n".join(lines) + "\n")
    bad = [b for b in layer_violations(planted) if b not in set(layer_violations(ROOT))]
    assert len(bad) == 1
    assert bad[0].startswith(f"specdec/core/verify.py:{at + 1}: specdec.core.verify (specdec.core) imports "
                             "specdec.loop.decoder (specdec.loop)")


def test_a_planted_circle_is_found(planted):
    sampling = planted / "specdec" / "core" / "sampling.py"
    sampling.write_text("from specdec.core import verify\n" + sampling.read_text())
    assert not any("specdec.core.sampling" in c for c in import_cycles(ROOT))
    cycles = import_cycles(planted)
    assert any("specdec.core.sampling" in c and "specdec.core.verify" in c for c in cycles)


def test_components_cannot_reach_ui_or_the_bench(planted):
    charts = planted / "components" / "charts.py"
    charts.write_text("import ui.session\nfrom specdec.bench import speed\n" + charts.read_text())
    bad = [b for b in layer_violations(planted) if b.startswith("components/charts.py:") and int(b.split(":")[1]) <= 2]
    assert [b.split(":")[1] for b in bad] == ["1", "2"]
    assert "imports ui.session (ui)" in bad[0] and "imports specdec.bench.speed (specdec.bench)" in bad[1]
