"""The parity suite over HTTP, for any front end that serves `/v1/systemone` (the aiohttp server
in tests/serve/test_serve_e2e.py, Ray Serve in tests/serve/test_ray.py): each request of the `core` suite as
a wire body, what `ONNXAgent` answers in-process for it, and the check that the served answer is
that answer (plus the wire's routing block and `x_jev_confidence`) or the same 422 refusal.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

CONTROLS = ("max_len", "head_max_len", "min_confidence")
#: laya-serve words one refusal itself, before the model sees it (docs/http-api.md#refusals-in-order)
SERVER_WORDED = {
    "error-null-level": "score question 'q' has a null level at index 1; give every level a description"
}


def http_json(url: str, body: Any = None, headers: dict[str, str] | None = None, timeout: float = 30):
    """(status, headers, parsed JSON) of one GET (no body) or POST."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(
        url, data=data, headers=headers or {}, method="GET" if body is None else "POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), json.loads(err.read())


def core_suite_exchanges(agent: Any) -> Iterator[tuple[str, str, dict[str, Any], Any]]:
    """(name, route, body, the agent's answer or its ValueError) per request of the core suite."""
    from laya_onnx.parity import load_suite

    for req in load_suite("core", agent.tok.mask_token):
        kw = {k: req[k] for k in CONTROLS if k in req}
        body = dict(kw, questions=req["questions"])
        if "states" in req:
            body.update(
                states=req["states"], **{k: req[k] for k in ("batch_size", "sort_by_length") if k in req}
            )
        else:
            body["state"] = req["state"]
        try:
            if "states" in req:
                local = agent.predict_batch(
                    req["states"],
                    req["questions"],
                    batch_size=req.get("batch_size"),
                    sort_by_length=req.get("sort_by_length", False),
                    **kw,
                )
            else:
                local = agent.predict(req["state"], req["questions"], **kw)
        except ValueError as exc:
            local = exc
        route = "/v1/systemone/batch" if "states" in req else "/v1/systemone"
        yield req["name"], route, body, local


def check_served(name: str, route: str, status: int, served: Any, local: Any) -> int:
    """Assert the served answer is the agent's; returns how many results were compared."""
    if isinstance(local, ValueError):
        assert (status, served) == (422, {"detail": SERVER_WORDED.get(name, str(local))}), name
        return 0
    assert status == 200, (name, served)
    local = json.loads(json.dumps(local))  # the wire's types: label keys become strings
    batch = route.endswith("/batch")
    results = served["results"] if batch else [served]
    wanted = local if batch else [local]
    assert len(results) == len(wanted), name
    for got, want in zip(results, wanted, strict=True):
        got.pop("routing")
        for answer in got["answers"].values():
            answer.pop("x_jev_confidence", None)
        assert got == want, name
    return len(results)


def assert_close(got: Any, want: Any, where: str = "", tol: float = 1e-5) -> None:
    """Equal, except that floats may differ by `tol` (the parity rule's 1e-5): how answers of
    the same states compare when they were padded into different passes."""
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        assert abs(got - want) <= tol, (where, got, want)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), (where, got, want)
        for key in want:
            assert_close(got[key], want[key], "%s.%s" % (where, key), tol)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (where, got, want)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_close(g, w, "%s[%d]" % (where, i), tol)
    else:
        assert got == want, (where, got, want)
