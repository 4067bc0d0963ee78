"""The runtime must import and answer in a process where torch and transformers cannot be imported."""

import json
import subprocess
import sys
import textwrap

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
