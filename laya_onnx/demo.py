"""`laya-onnx demo`: the whole path on the built-in tiny checkpoint, in one command.

make-checkpoint -> export (validated) -> ONNXAgent.predict on the README's request. Reuses what an
earlier run left in the work directory, so the second run is quick.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

README_REQUEST: dict[str, Any] = {
    "state": "I was charged twice this month, I want my money back",
    "questions": {
        "queue": {
            "type": "choice",
            "instructions": "Which team?",
            "criteria": {
                "billing": "billing and refunds",
                "tech": "login and app issues",
                "other": "everything else",
            },
        },
        "urgency": {
            "type": "score",
            "instructions": "How urgent is this?",
            "criteria": ["not urgent", "soon", "blocking"],
        },
        "refund": {"type": "noul", "instructions": "Does the user ask for a refund?"},
    },
}


def run_demo(workdir: Path, preset: str = "tiny-english") -> int:
    from laya_onnx import ONNXAgent
    from laya_onnx.checkpoints import make_checkpoint
    from laya_onnx.core.bundle import WEIGHTS_FILE
    from laya_onnx.export import export_bundle

    checkpoint, bundle = workdir / preset / "checkpoint", workdir / preset / "bundle"
    if not (checkpoint / WEIGHTS_FILE).exists():
        make_checkpoint(preset, checkpoint, seed=0, force=True)
    if not (bundle / "manifest.json").exists():
        export_bundle(checkpoint, bundle, force=True, name=preset)
    agent = ONNXAgent(bundle)
    started = time.perf_counter()
    result = agent.predict(README_REQUEST["state"], README_REQUEST["questions"])
    ms = (time.perf_counter() - started) * 1000
    print(
        f"\nONNXAgent({str(bundle)!r}) on {', '.join(agent.providers)} answered in {ms:.1f} ms "
        f"(a tiny random checkpoint: the answers exercise the pipeline, they mean nothing):"
    )
    print(json.dumps(result, indent=2, ensure_ascii=False))
    print(f"\nserve it:  laya-onnx serve {bundle} --port 8000")
    return 0
