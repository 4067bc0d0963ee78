"""HTTP serving for a laya-onnx bundle over TypeSafe Jev's `/v1/systemone` wire protocol.

`create_app(agent, **settings)` builds the aiohttp application around one loaded
`ONNXAgent`; `run_server(bundle, host, port, providers)` is what `laya-onnx serve` runs, and
`serve_agent(agent, host, port)` serves an agent that is already built the same way.
The contract (routes, error texts, limits, check order) is laya-serve 0.4.15's, written
down in docs/http-api.md and implemented once, framework-neutral, in `service.py`.

The three names load aiohttp on first use, not on `import laya_onnx.serve.contract`, so a
front end on another framework (the Ray Serve ingress) imports the contract without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from laya_onnx.serve.app import create_app
    from laya_onnx.serve.server import run_server, serve_agent

__all__ = ["create_app", "run_server", "serve_agent"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from laya_onnx.serve.app import create_app

        return create_app
    if name in ("run_server", "serve_agent"):
        from laya_onnx.serve import server

        return getattr(server, name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
