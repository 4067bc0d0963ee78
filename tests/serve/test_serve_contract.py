"""The HTTP contract module is framework-neutral: the Ray Serve ingress imports it without aiohttp."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.serve


def test_contract_imports_no_web_framework():
    code = (
        "import sys, laya_onnx.serve.contract\n"
        "loaded = sorted(m for m in ('aiohttp', 'yarl', 'starlette', 'ray') if m in sys.modules)\n"
        "print(','.join(loaded))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
