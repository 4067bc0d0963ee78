"""A deliberately slow fake agent, and `python tests/slow_agent.py PORT SECONDS [PAD_BYTES]` serving it.

The drain tests need passes long enough to have requests in flight when a signal arrives; the
tiny bundle answers in milliseconds. The server is `laya_onnx.serve.app.serve_agent`, the
same code `laya-onnx serve` runs once its bundle is loaded.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

# run as a script, the repository root must be importable for `tests.serve_support`
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.serve_support import FakeAgent


class SlowAgent(FakeAgent):
    """FakeAgent whose every pass takes `seconds` on the worker thread."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def predict(self, state, questions, **kw):
        time.sleep(self.seconds)
        return super().predict(state, questions, **kw)

    def predict_batch(self, states, questions, **kw):
        time.sleep(self.seconds)
        return super().predict_batch(states, questions, **kw)


if __name__ == "__main__":
    from laya_onnx.serve.app import serve_agent

    agent = SlowAgent(float(sys.argv[2]))
    pad = int(sys.argv[3]) if len(sys.argv) > 3 else 0  # bytes added to every answer
    if pad:
        agent.result_hook = lambda result: {**result, "x_pad": "p" * pad}
    serve_agent(agent, "127.0.0.1", int(sys.argv[1]))
