"""The runtime must import and answer in a process where torch and transformers cannot be imported."""

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import laya_onnx

pytestmark = pytest.mark.runtime

BLOCKED = ("torch", "transformers", "aiohttp", "laya")

SCRIPT = textwrap.dedent("""
    import json, sys
    BLOCKED = %r

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError("blocked in this test: " + name)
            return None

    sys.meta_path.insert(0, Block())
    for name in BLOCKED:
        try:
            __import__(name)
        except ImportError:
            pass
        else:
            raise SystemExit(name + " was importable; the block did not work")

    from laya_onnx import ONNXAgent
    agent = ONNXAgent(sys.argv[1])
    result = agent.predict("I was charged twice", {
        "q": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "tech"]},
        "n": {"type": "noul", "instructions": "Refund?"}}, min_confidence=0.5)
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    print(json.dumps({"result": result, "loaded": loaded}))
""") % (BLOCKED,)


def test_runtime_answers_without_torch_or_transformers(bundle_factory):
    bundle = bundle_factory("tiny-english")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(bundle)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["loaded"] == []
    answers = out["result"]["answers"]
    assert answers["q"]["choice"] in ("billing", "tech")
    assert answers["n"]["abstention"] in ("passed", "abstained")
    assert abs(sum(answers["q"]["probabilities"].values()) - 1.0) < 2e-4


def test_core_modules_do_not_import_layers():
    """Nothing in the core imports torch, transformers, aiohttp, or the layers built on top."""
    code = (
        "import sys, laya_onnx.core.agent, laya_onnx.cli, laya_onnx.core.hub, laya_onnx.core.router, laya_onnx.core.lang; "
        "print([m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'aiohttp') "
        "or m.startswith(('laya_onnx.export', 'laya_onnx.serve', 'laya_onnx.parity', 'laya_onnx.checkpoints'))])"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def _imported_modules(path: Path) -> set[str]:
    """Every `laya_onnx` module a source file imports, at any depth (lazy imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update("%s.%s" % (node.module, alias.name) for alias in node.names)
    return {name for name in found if name.startswith("laya_onnx.")}


@pytest.mark.parametrize(
    ("layer", "above"),
    [
        ("core", ("export", "serve", "score", "bench", "parity", "checkpoints", "cli", "demo")),
        ("score", ("serve", "export", "bench", "parity", "checkpoints", "cli", "demo")),
    ],
)
def test_layer_imports_nothing_above_it(layer, above):
    """Read from the source, so a lazy import inside a function counts too."""
    package = Path(laya_onnx.__file__).parent
    wrong = {
        "%s: %s" % (path.relative_to(package), name)
        for path in sorted((package / layer).rglob("*.py"))
        for name in _imported_modules(path)
        if name.split(".")[1] in above
    }
    assert not wrong, sorted(wrong)
