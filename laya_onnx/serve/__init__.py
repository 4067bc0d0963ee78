"""HTTP serving of laya-onnx bundles over TypeSafe Jev's `/v1/systemone` (docs/http-api.md):
`create_app(agent)`, `run_server(bundle, ...)` (`laya-onnx serve`), `serve_agent(agent, ...)`.
aiohttp loads on first use of one of them, so Ray Serve's front end imports without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from laya_onnx.serve.app import create_app, run_server, serve_agent

__all__ = ["create_app", "run_server", "serve_agent"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("laya_onnx.serve.app"), name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
