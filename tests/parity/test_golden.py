"""ONNXAgent answers every golden request as the reference did: the torch-free parity tier.

The golden files (`parity/golden/<preset>.json`, made by `python -m laya_onnx.parity.golden`)
hold the reference `laya.Agent`'s observations of the core suite on the deterministic tiny
checkpoints. Here a bundle of the same checkpoint answers the same requests on onnxruntime and
the parity rule (`laya_onnx.core.judge`) judges each one: no torch, no reference needed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

from laya_onnx.core.judge import judge
from laya_onnx.parity.golden import TINY_PRESETS
from laya_onnx.parity.observe import instrument_agent, observe_agent
from laya_onnx.parity.suite import load_suite, suite_sha256
from tests.parity_support import observation_from_json, read_golden

pytestmark = pytest.mark.runtime

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "parity" / "golden"
REGENERATE = "regenerate with `python -m laya_onnx.parity.golden` (needs torch and laya)"


def _agent_for(golden: dict, bundle: Path):
    """An instrumented ONNXAgent on `bundle`, after checking bundle and golden are of one checkpoint."""
    from laya_onnx import ONNXAgent

    assert golden["suite_sha256"] == suite_sha256(golden["suite"]), (
        f"suite {golden['suite']!r} changed since the golden answers were recorded; {REGENERATE}"
    )
    with warnings.catch_warnings():
        # tiny-typed-decisions ships out-of-range temperatures on purpose; the clamp warning is expected
        warnings.simplefilter("ignore", RuntimeWarning)
        agent = ONNXAgent(bundle)
    manifest = agent.bundle.manifest
    ckpt = golden["checkpoint"]
    assert manifest.source.weights_sha256 == ckpt["weights_sha256"], (
        f"bundle {bundle} was exported from other weights than golden {ckpt['preset']!r}; {REGENERATE}"
    )
    for name, sha in ckpt["files_sha256"].items():
        assert manifest.digest(name) == sha, f"bundle file {name} differs from the golden checkpoint's"
    return agent, instrument_agent(agent)


def _judge_all(golden: dict, agent, capture, names=None):
    """(failures, flips, rows) over the golden requests (all, or those in `names`)."""
    recorded = {r["name"]: r for r in golden["requests"]}
    suite = load_suite(golden["suite"], agent.tok.mask_token)
    assert [r["name"] for r in suite] == list(recorded), (
        f"golden requests differ from the suite; {REGENERATE}"
    )
    failures, flips, rows = [], 0, 0
    for req in suite:
        if names is not None and req["name"] not in names:
            continue
        # both sides as JSON carries them (the golden file already is), so labels compare alike
        ours = observation_from_json(observe_agent(agent, req, capture).as_json())
        verdict = judge(
            observation_from_json(recorded[req["name"]]), ours, expect_refusal=bool(req.get("expect_error"))
        )
        flips += len(verdict.flips)
        rows += verdict.rows
        if not verdict.passed:
            failures.append(f"{req['name']}: " + "; ".join(verdict.describe()))
    return failures, flips, rows


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_bundle_answers_as_the_golden_reference(preset, bundle_factory):
    golden = read_golden(GOLDEN_DIR / f"{preset}.json")
    agent, capture = _agent_for(golden, bundle_factory(preset))
    failures, flips, rows = _judge_all(golden, agent, capture)
    print(preset, json.dumps({"requests": len(golden["requests"]), "rows": rows, "rounding_flips": flips}))
    assert rows >= 70
    assert not failures, "\n".join(failures)


def test_golden_judgement_can_fail(bundle_factory):
    """Skewed logits (one option +0.01) must fail the rule against the golden answers."""
    golden = read_golden(GOLDEN_DIR / "tiny-english.json")
    agent, capture = _agent_for(golden, bundle_factory("tiny-english"))
    inner = agent.session.run

    def skewed(feeds, **options):
        logits, act = inner(feeds, **options)
        logits = logits.copy()
        logits[:, 0] += 0.01
        return logits, act

    agent.session.run = skewed
    capture = instrument_agent(agent)  # capture what the skewed session returns
    failures, _, _ = _judge_all(golden, agent, capture, names={"readme-support", "choice-5"})
    assert len(failures) == 2 and all("tolerance:" in f for f in failures), failures


def test_golden_tier_imports_without_torch_or_the_reference():
    """The rule, the observer, the suites and the golden reader load with torch and laya blocked."""
    script = textwrap.dedent("""
        import sys
        BLOCKED = ("torch", "transformers", "laya", "aiohttp")

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError("blocked in this test: " + name)

        sys.meta_path.insert(0, Block())
        import laya_onnx.parity.golden, laya_onnx.parity.observe, laya_onnx.core.judge
        from laya_onnx.parity.suite import load_suite
        assert load_suite("core", "[MASK]")
        print(sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"
