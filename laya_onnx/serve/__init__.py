"""HTTP serving of laya-onnx bundles over TypeSafe Jev's `/v1/systemone` (docs/http-api.md).

`create_app(agent)` builds the aiohttp app, `run_server(bundle, ...)` is `laya-onnx serve`,
`serve_agent(agent, ...)` serves an agent already built. aiohttp loads on first use of one of
them, so a front end on another framework (Ray Serve) imports `serve.contract` without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from laya_onnx.serve.app import create_app
    from laya_onnx.serve.server import run_server, serve_agent

__all__ = ["create_app", "run_server", "serve_agent"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        module = "laya_onnx.serve.app" if name == "create_app" else "laya_onnx.serve.server"
        return getattr(importlib.import_module(module), name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
