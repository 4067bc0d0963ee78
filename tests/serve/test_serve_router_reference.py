"""The routing suite over HTTP: `laya-onnx serve` in front of our Router (tiny bundles) against
laya 0.4.15's `laya.serve` in front of `laya.Router` (the checkpoints they were exported from).

tests/serve/test_serve_reference.py compares the wire behaviour of one checkpoint over a fake model;
this extends it to routing with real models: every request of laya_onnx/parity/suites/routing.json
that the HTTP API can express (a batch shares one question set and one set of controls) is posted
to both servers, built from the same Router configurations; the status must be equal, an error
body identical, and an answer equal by the parity rule, its `routing` block included (its rows
and unrounded values observed in-process, where both servers run). `/health` agrees on what is
resident and where.

Needs fastapi and httpx beside laya==0.4.15 (the dev extra); skipped without them.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from laya_onnx.parity.routing import (
    ITEM_CONTROLS,
    ROUTING_CONTROLS,
    RouterSide,
    judge_routing,
    our_side,
    reference_side,
    routing_suite,
)
from tests.parity.test_router_parity import PRESETS, Rerouted

pytestmark = [
    pytest.mark.torch,
    pytest.mark.reference,
    pytest.mark.serve,
    pytest.mark.usefixtures("no_laya_env"),
]

BODY_CONTROLS = (*ROUTING_CONTROLS, "max_len", "head_max_len", "min_confidence")


def http_form(req):
    """`req` as the HTTP API can send it, or None: a batch keeps the items that add nothing to
    the shared questions and controls."""
    if req.get("call"):  # predict_long and decide have no HTTP route
        return None
    req = {k: v for k, v in req.items() if k != "expect_error"}  # HTTP refuses other things
    if "batch" not in req:
        return req
    shared = [
        i for i in req["batch"] if i.get("questions") == req["questions"] and not set(i) & set(ITEM_CONTROLS)
    ]
    if not shared or any(i["state"] is None for i in shared):
        return None
    return {**req, "batch": shared}


def body_of(req):
    if "batch" in req:
        body = {"states": [i["state"] for i in req["batch"]], "questions": req["questions"]}
        body.update({k: req[k] for k in ("batch_size", "min_confidence") if k in req})
        return "/v1/systemone/batch", body
    return "/v1/systemone", {
        "state": req["state"],
        "questions": req["questions"],
        **{k: req[k] for k in BODY_CONTROLS if k in req},
    }


def _without_jev(result):
    """The answer as the Router gave it: `x_jev_confidence` is recomputed by each server from
    rounded probabilities (a rounding flip would move it), so it is compared by presence only."""
    answers = {
        q: {k: v for k, v in a.items() if k != "x_jev_confidence"} for q, a in result["answers"].items()
    }
    return {**result, "answers": answers}


class HttpSide(RouterSide):
    """A RouterSide whose calls go over HTTP, to one server per Router configuration."""

    def __init__(self, side, post):
        super().__init__(side.routers, side.captures, side.rows_for, side.calibrations)
        self.post = post  # (config, path, body) -> (status, parsed body)
        self.jev_keys = []

    def call(self, router, req):
        config = next(name for name, r in self.routers.items() if r is router)
        path, body = body_of(req)
        status, payload = self.post(config, path, body)
        if status != 200:
            raise ValueError("%d %s" % (status, json.dumps(payload, sort_keys=True)))
        results = payload["results"] if "batch" in req else [payload]
        self.jev_keys.append(
            [sorted(q for q, a in r["answers"].items() if "x_jev_confidence" in a) for r in results]
        )
        if "batch" in req:
            total = payload["total_usage"]
            assert total == {
                k: sum(r["usage"][k] for r in results) for k in ("input_tokens", "output_tokens")
            }
            return [_without_jev(r) for r in results]
        return _without_jev(payload)


class OurServers:
    """Our apps (one per Router configuration) on loopback ports, on a loop in a thread."""

    def __init__(self, routers):
        from laya_onnx.serve import create_app

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.apps = {name: create_app(router) for name, router in routers.items()}
        self.runners, self.ports = [], {}
        for name, app in self.apps.items():
            self.ports[name] = self._run(self._start(app))

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    async def _start(self, app):
        from aiohttp import web

        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.runners.append(runner)
        return runner.addresses[0][1]

    def close(self):
        for runner in self.runners:
            self._run(runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def servers(checkpoint_factory, bundle_factory):
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    import laya.serve as reference
    from fastapi.testclient import TestClient

    routers, requests = routing_suite()
    ours = our_side({name: bundle_factory(p) for name, p in PRESETS.items()}, routers)
    repos = {name: next(iter(ours.routers.values())).repo(name) for name in PRESETS}
    ref = reference_side(
        {name: checkpoint_factory(p) for name, p in PRESETS.items()}, repos, routers, ours.calibrations
    )
    mine = OurServers(ours.routers)
    theirs = {name: TestClient(reference.create_app(router)) for name, router in ref.routers.items()}
    for client in theirs.values():
        client.__enter__()
    http = httpx.Client(timeout=60, trust_env=False)

    def post_ours(config, path, body):
        r = http.post("http://127.0.0.1:%d%s" % (mine.ports[config], path), content=json.dumps(body))
        return r.status_code, r.json()

    def post_theirs(config, path, body):
        r = theirs[config].post(path, content=json.dumps(body))
        return r.status_code, r.json()

    def health(config):
        return (
            http.get("http://127.0.0.1:%d/health" % mine.ports[config]).json(),
            theirs[config].get("/health").json(),
        )

    try:
        yield HttpSide(ref, post_theirs), HttpSide(ours, post_ours), requests, health
    finally:
        http.close()
        for client in theirs.values():
            client.__exit__(None, None, None)
        mine.close()


def test_the_routing_suite_over_http_equals_laya_serve(servers):
    ref, ours, requests, health = servers
    sent = [r for r in map(http_form, requests) if r is not None]
    assert len(sent) >= 60
    cases = judge_routing(ref, ours, sent)
    failed = [f"{c.name}: {'; '.join(c.details)}" for c in cases if not c.passed]
    assert not failed, "\n".join(failed)
    assert ours.jev_keys == ref.jev_keys and any(any(k) for k in ours.jev_keys)
    named = {r["name"]: r for r in sent}
    for name, status in (
        ("model-path", 422),
        ("model-unknown", 200),
        ("task-unknown", 422),
        ("state-none", 400),
    ):
        assert ours.post("default", *body_of(named[name]))[0] == status, name  # laya-serve's model rules
    for config in ours.routers:
        mine, theirs = health(config)
        for key in (
            "status",
            "loaded",
            "device",
            "device_is_preference",
            "checkpoint_devices",
            "cpu_fallbacks",
        ):
            assert mine[key] == theirs[key], (config, key)
        assert mine["memory"]["rss_bytes"] > 0 and "memory" not in theirs


def test_the_comparison_sees_another_route_over_http(servers):
    ref, ours, requests, _ = servers
    req = next(r for r in requests if r["name"] == "detect-undecided-short")
    (case,) = judge_routing(ref, Rerouted(ours, "english_default"), [req])
    assert not case.passed and "json" in case.failed
