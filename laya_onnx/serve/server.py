"""`laya-onnx serve BUNDLE`: load the bundle once, then serve it until SIGINT/SIGTERM."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from laya_onnx.serve.settings import resolve_host, resolve_log_level, resolve_port, threads_from_env

log = logging.getLogger("laya_onnx.serve")


def run_server(
    bundle: os.PathLike | str,
    host: str | None = None,
    port: int | None = None,
    providers: Sequence[str] | None = None,
) -> None:
    """Serve `bundle` over the /v1/systemone wire protocol.

    `host`/`port` win over LAYA_HOST/LAYA_PORT (default 0.0.0.0:8000). The configuration is
    checked before the bundle is loaded, so a typo exits in milliseconds with a message rather
    than after the model is up; a bundle that cannot be loaded exits with the loader's message.
    """
    host = resolve_host(host)
    port = resolve_port(port)
    level = resolve_log_level()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("laya_onnx").setLevel(level)

    from aiohttp import web

    from laya_onnx import ONNXAgent
    from laya_onnx.serve.app import create_app

    options = {}
    threads = threads_from_env()
    if threads is not None:
        options["threads"] = threads
    try:
        agent = ONNXAgent(bundle, providers=list(providers) if providers else None, **options)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"laya-onnx: cannot serve {str(bundle)!r}: {exc}") from None
    app = create_app(agent)
    log.info(
        "serving checkpoint %r (revision %s) from %s on http://%s:%d with %s",
        getattr(agent, "name", None),
        getattr(agent, "revision", None),
        bundle,
        host,
        port,
        ", ".join(getattr(agent, "providers", None) or []) or "default providers",
    )
    web.run_app(
        app,
        host=host,
        port=port,
        print=None,
        access_log=logging.getLogger("laya_onnx.serve.access"),
        handle_signals=True,
    )
