"""Differential check against the reference: laya 0.4.15's `laya.serve` (FastAPI) and our
`laya_onnx.serve` (aiohttp) get the same ~350 requests, in both LAYA_JEV_STRICT modes, over the
same deterministic fake model; status, body, timing-header presence and the controls that reach
the model must agree.

The one intended difference: with one checkpoint behind it, our "unknown model" 422 lists that
checkpoint and its aliases rather than laya's whole registry.

Needs `fastapi` and `httpx` beside the `laya==0.4.15` dev dependency; skipped without them
(imported inside the test, so the module collects in the runtime tier, which has aiohttp).
"""

from __future__ import annotations

import asyncio
import json
import re
import warnings

import pytest

from tests.serve_support import BATCH, BODY, URL, FakeAgent, Q, served

pytestmark = [pytest.mark.serve, pytest.mark.reference]

ROUTING = {
    "model": "english",
    "repo": "convaiinnovations/laya",
    "reason": "served bundle",
    "detection": None,
    "workflow": None,
}
AGENT_KEYS = ("max_len", "head_max_len", "lang", "min_confidence")


class FakeRouter:
    """laya's Router surface, answering with the same fake model as our FakeAgent."""

    loaded = ["english"]
    loaded_revisions = {"english": "0123456789abcdef"}

    def __init__(self):
        self.agent = FakeAgent()
        self.forwarded = []

    @staticmethod
    def _task(task):
        if task is not None:
            from laya.router import normalise_name

            normalise_name(task)  # the core's "unknown model" ValueError

    def predict(self, state, questions, model=None, **kw):
        self._task(kw.get("task"))
        kw = {k: v for k, v in kw.items() if k in AGENT_KEYS}
        self.forwarded.append(kw)
        result = self.agent.predict(state, questions, **kw)
        result["routing"] = dict(ROUTING)
        return result

    def predict_batch(self, requests, **call):
        self._task(requests[0].get("task"))
        item = {k: v for k, v in requests[0].items() if k in AGENT_KEYS}
        self.forwarded.append({**item, **call})
        out = self.agent.predict_batch(
            [r["state"] for r in requests], requests[0]["questions"], **item, **call
        )
        for r in out:
            r["routing"] = dict(ROUTING)
        return out


def _forwarded_to_our_router(client) -> list[dict]:
    """What our server asks of the Router it serves (one bundle is a Router of one), recorded as
    `FakeRouter.forwarded` records laya-serve's: the agent's controls of each call."""
    from laya_onnx.serve.app import DECIDER

    router, forwarded = client.server.app[DECIDER].served.router, []
    predict, predict_batch = router.predict, router.predict_batch

    def spy_predict(state, questions, **kw):
        forwarded.append({k: v for k, v in kw.items() if k in AGENT_KEYS and v is not None})
        return predict(state, questions, **kw)

    def spy_batch(requests, **call):
        item = {k: v for k, v in requests[0].items() if k in AGENT_KEYS and v is not None}
        forwarded.append({**item, **call})
        return predict_batch(requests, **call)

    router.predict, router.predict_batch = spy_predict, spy_batch
    return forwarded


def _requests():
    def single(**kw):
        return URL, json.dumps({**BODY, **kw})

    def batch(**kw):
        return BATCH, json.dumps({"states": ["a", "b"], "questions": Q, **kw})

    raws = [
        "not json",
        "",
        "[1,2]",
        '"x"',
        "null",
        '{"state": "x"}',
        '{"questions": {}}',
        '{"state": null, "questions": {}}',
        '{"state": "x", "questions": []}',
        '{"state": "' + "x" * 50001 + '", "questions": {}}',
        '{"state": {"body": "' + '\\"' * 49988 + '"}, "questions": {}}',
        '{"state": "\\ud800", "questions": {}}',
        '{"state": 1' + "0" * 4300 + ', "questions": {}}',
        "[" * 100000,
        '\ufeff{"state": "x", "questions": {}}',
        '{"state": "x", "questions": {}, "min_confidence": 1e999}',
        '{"state": "x", "questions": {}, "min_confidence": NaN}',
        '{"state": NaN, "questions": {}}',
        '{"state": null, "questions": {}, "state": "second"}',
        '{"state": "x", "questions": {"a": 5, "b": "s", "c": {"type": "choice", "criteria": "x"}}}',
    ]
    for raw in raws:
        yield URL, raw
        if '"state": ' in raw:
            yield (
                BATCH,
                raw.replace('"state": ', '"states": [', 1).replace(', "questions"', '], "questions"', 1),
            )
        else:
            yield BATCH, raw
    many = {"q%d" % i: {"type": "noul", "instructions": "x"} for i in range(65)}
    controls = (
        [
            dict(model=m)
            for m in [
                "jev-1",
                "/x",
                "org/repo",
                ["a/b"],
                "~/m",
                ".\\c",
                "C:\\m",
                True,
                5,
                "",
                None,
                "english",
                " EN ",
                "convaiinnovations/laya",
            ]
        ]
        + [dict(max_len=v) for v in ["fast", True, 3.14, 1.0, 0, -10, 9000, 256, None]]
        + [dict(head_max_len=v) for v in [0, 9000, 100]]
        + [dict(lang=v) for v in [5, True, "", "de"]]
        + [dict(lang_guess=v) for v in [5, "pt"]]
        + [
            dict(min_confidence=v)
            for v in [1.5, -0.1, True, "0.9", {}, {"x": 0.5}, {"default": 0.5, "noul:2": 0.9}, 0.0, 0.7]
        ]
        + [{k: 1} for k in ["hooks", "on_predict_start", "on_predict_end", "hooks_raise", "hooks_timeout"]]
        + [
            dict(hooks=1, hooks_timeout=2),
            dict(hooks=None),
            dict(task="invoice"),
            dict(task="en"),
            dict(diagnostics={}),
            dict(batch_size="x", sort_by_length="y"),
            dict(questions=many),
            dict(questions={k: many[k] for k in list(many)[:64]}),
            dict(
                questions={
                    "c": {"type": "choice", "instructions": "x", "criteria": list(map(str, range(101)))}
                }
            ),
            dict(
                questions={"s": {"type": "score", "instructions": "x", "criteria": list(map(str, range(33)))}}
            ),
            dict(questions={"s": {"type": "score", "instructions": "x", "criteria": ["a", None]}}),
            dict(
                questions={
                    "c%d" % i: {"type": "choice", "instructions": "x", "criteria": list(map(str, range(100)))}
                    for i in range(6)
                }
            ),
            dict(questions={"r": {"type": "X", "instructions": "x"}}),
            dict(questions={}),
            dict(state="\U0001f600", hooks=None),
        ]
    )
    for kw in controls:
        yield single(**kw)
        yield batch(
            **{("states" if k == "state" else k): ([v] if k == "state" else v) for k, v in kw.items()}
        )
    for kw in _large_choice_bodies():
        yield single(**kw)
        yield batch(**kw)
    for kw in (
        [dict(batch_size=v) for v in [True, 2.0, "2", 0, -5, 2, 100]]
        + [dict(sort_by_length=v) for v in ["yes", 1, True, False]]
        + [
            dict(diagnostics=None),
            dict(states=[]),
            dict(states="x"),
            dict(states=["x"] * 65),
            dict(states=["x", None]),
            dict(states=["s"] * 9, questions={k: many[k] for k in list(many)[:32]}),
            dict(states=["s"] * 64, questions={k: many[k] for k in list(many)[:64]}, batch_size=7),
            dict(states=["s"] * 64, questions={k: many[k] for k in list(many)[:64]}, max_len=8192),
        ]
    ):
        yield batch(**kw)


def _large_choice_bodies():
    """Choices around the one-pass cap (100) and the tournament cap (255), and the cases that
    keep or drop `option_order`, or refuse non-string labels, when a choice is narrowed."""

    def choice(n, **extra):
        return {"type": "choice", "instructions": "x", "criteria": ["opt %d" % i for i in range(n)], **extra}

    described = {"opt %d" % i: "about %d" % i for i in range(120)}
    for n in (17, 100, 101, 255, 256):
        yield dict(questions={"c": choice(n)})
    yield dict(questions={"c": {"type": "choice", "instructions": "x", "criteria": described}, **Q})
    yield dict(questions={"c": choice(40, option_order=list(range(40))[::-1])})
    yield dict(questions={"c": choice(120, option_order=list(range(120))[::-1]), "d": choice(20)})
    yield dict(questions={"c": {"type": "choice", "instructions": "x", "criteria": list(range(40))}})
    yield dict(questions={"c": {"type": "choice", "instructions": "x", "criteria": list(range(120))}})
    yield dict(questions={"c": choice(120), "d": choice(30), **Q}, min_confidence=0.5, max_len=400)


_REGISTRY = re.compile(r"choose one of \[.*?\] \(or an alias: \[.*?\]\)")


_OVER_CAP = re.compile(r"too many choice options for '(.+)' \((\d+) > 100\)")


def _elimination_instead_of_413(theirs, mine, raw) -> bool:
    """The one intended difference beyond the registry: a choice over laya-serve's one-pass cap
    of 100 options, which laya-serve refuses unless LAYA_TOURNAMENT_GROUP is set, is answered by
    elimination up to Jev's 255 (or refused for a non-string label), and over 255 gets our 413."""
    match = _OVER_CAP.fullmatch(theirs[1]["detail"]) if theirs[0] == 413 else None
    if match is None:
        return False
    qid, n = match.group(1), int(match.group(2))
    if n > 255:
        return mine == (413, {"detail": "too many choice options for '%s' (%d > 255)" % (qid, n)}, False)
    if mine[0] == 422:
        return "needs every label to be a string" in mine[1]["detail"]
    results = mine[1].get("results", [mine[1]]) if mine[0] == 200 else []
    return bool(results) and all(len(r["answers"][qid]["probabilities"]) == n for r in results)


@pytest.mark.parametrize("tournament_group", ["", "16", "2"])
def test_wire_behaviour_matches_laya_serve(monkeypatch, tournament_group):
    """Unset, the only differences are the registry text and `_elimination_instead_of_413`; with
    LAYA_TOURNAMENT_GROUP set on both servers, answers (tournament rounds included) are equal."""
    pytest.importorskip("fastapi")  # laya.serve's own server stack, beside laya
    pytest.importorskip("httpx")
    import laya.serve as reference
    from fastapi.testclient import TestClient

    for key in ("LAYA_API_KEY", "LAYA_MAX_TOKEN_BUDGET", "LAYA_MAX_BATCH_TOKENS", "LAYA_MAX_CONCURRENT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("LAYA_TOURNAMENT_GROUP", tournament_group)
    router = FakeRouter()

    async def compare():
        mismatches, registry_only, eliminated, n = [], 0, 0, 0
        for strict in ("0", "1"):
            monkeypatch.setenv("LAYA_JEV_STRICT", strict)  # ours reads it when the app is built
            async with served() as ours:
                forwarded = _forwarded_to_our_router(ours)
                with TestClient(reference.create_app(router)) as ref:
                    for path, raw in _requests():
                        n += 1
                        data = raw.encode("utf-8", "surrogatepass")
                        before_ref, before_ours = len(router.forwarded), len(forwarded)
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore", RuntimeWarning)  # dropped option_order
                            rr = ref.post(path, content=data)
                            r = await ours.post(path, data=data)
                        theirs = (rr.status_code, rr.json(), "server-timing" in rr.headers)
                        mine = (r.status, await r.json(content_type=None), "Server-Timing" in r.headers)
                        sent_ref = router.forwarded[before_ref:]
                        sent_ours = forwarded[before_ours:]
                        if theirs == mine and sent_ref == sent_ours:
                            continue
                        if (
                            theirs[0] == mine[0] == 422
                            and "unknown model" in theirs[1]["detail"]
                            and _REGISTRY.sub("", theirs[1]["detail"]) == _REGISTRY.sub("", mine[1]["detail"])
                        ):
                            registry_only += 1
                            continue
                        if not tournament_group and _elimination_instead_of_413(theirs, mine, raw):
                            eliminated += 1
                            continue
                        mismatches.append((strict, path, raw[:100], theirs, mine, sent_ref, sent_ours))
        return n, registry_only, eliminated, mismatches

    n, registry_only, eliminated, mismatches = asyncio.run(compare())
    assert n > 300
    assert registry_only > 0  # the path-like models and unknown tasks above
    assert not mismatches, "\n".join(repr(m)[:1500] for m in mismatches[:5])
    # 101 (twice), 255, 256, 120 described, 120 ordered, 120 ints, 120 + min_confidence:
    # 8 bodies x 2 routes x 2 strict modes
    assert eliminated == (32 if not tournament_group else 0)
