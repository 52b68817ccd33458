"""The shape of the core: layered imports without cycles (import-linter contracts in
pyproject.toml), imports at module level, small files, no method named in the core, and a public
API that plug-ins can live on."""

import ast
import re
from pathlib import Path

import creditlab
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "framework" / "creditlab"
#: Modules a core function may import when it runs: optional dependencies (extras), and the
#: CLI's subcommands (the training stack imports Lightning, ~11 s: `creditlab plugins` and a
#: config mistake must answer in seconds; creditlab/cli/__init__.py says so).
LATE_IMPORTS = {
    "vllm", "peft", "deepspeed", "safetensors", "trl",  # optional extras
    "creditlab.run.hydra_main", "creditlab.analysis.compare", "creditlab.analysis.report", "creditlab.creditbench",
    "creditlab.run.evaluate",  # the CLI's subcommands
}


def test_import_contracts_hold():
    """Layers errors -> types -> interfaces -> registry -> step | analysis -> accel -> run ->
    backends | creditbench | testing -> cli, and layers inside step/, run/, analysis/ and cli/;
    the core never imports a plug-in; no cycles (`lint-imports` prints why)."""
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True) == 0


def _late_imports(path: Path) -> list[str]:
    """``module (line)`` of every import inside a function of ``path`` not in LATE_IMPORTS."""
    out = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                if not any(name == m or name.startswith(m + ".") for m in LATE_IMPORTS):
                    out.append(f"{name} (line {node.lineno})")
    return out


def test_no_function_level_imports_in_the_core():
    found = {str(p.relative_to(ROOT)): _late_imports(p) for p in sorted(CORE.rglob("*.py"))}
    assert {k: v for k, v in found.items() if v} == {}, "import at module level (or add an optional dependency to LATE_IMPORTS)"


def test_no_core_file_over_400_lines():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in CORE.rglob("*.py")}
    assert {k: n for k, n in sizes.items() if n > 400} == {}


def test_the_core_names_no_method():
    """A method lives in its plug-in folder: no core module names one (the ResetSelector
    interface may say which methods reset)."""
    pattern = re.compile(r"\b(srpo|rrpo|ibpo|rredcot|oar_g|oar_p|vineppo|SRPO|RRPO|IBPO|RREDCoT|OAR|VinePPO)\b")
    hits = []
    for path in sorted(CORE.rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    allowed = [h for h in hits if h.startswith("framework/creditlab/interfaces/parts.py")]
    assert hits == allowed and len(allowed) <= 2, hits


def test_the_public_api():
    """Plug-ins import from ``creditlab`` only: every exported name exists, and the in-repo plug-ins
    and the example plug-in import nothing else of the core (``creditlab.testing`` in tests)."""
    assert creditlab.__version__ and creditlab.__version__ != "0+unknown"
    for name in creditlab.__all__:
        assert hasattr(creditlab, name), name
    private = []
    for folder in (ROOT / "plugins", ROOT / "examples"):
        for path in sorted(folder.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("creditlab."):
                    if not node.module.startswith("creditlab.testing"):
                        private.append(f"{path.relative_to(ROOT)}: from {node.module}")
                elif isinstance(node, ast.Import):
                    private += [f"{path.relative_to(ROOT)}: import {a.name}" for a in node.names
                                if a.name.startswith("creditlab.")]
    assert private == []
