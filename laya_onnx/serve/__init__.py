"""HTTP serving for a laya-onnx bundle over TypeSafe Jev's `/v1/systemone` wire protocol.

`create_app(agent, **settings)` builds the aiohttp application around one loaded
`ONNXAgent`; `run_server(bundle, host, port, providers)` is what `laya-onnx serve` runs, and
`serve_agent(agent, host, port)` serves an agent that is already built the same way.
The contract (routes, error texts, limits, check order) is laya-serve 0.4.15's, written
down in the project's http.md.
"""

from laya_onnx.serve.app import create_app
from laya_onnx.serve.server import run_server, serve_agent

__all__ = ["create_app", "run_server", "serve_agent"]
