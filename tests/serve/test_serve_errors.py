"""What a failed pass answers: a caller's mistake (`LayaInputError`) is a 422 with its text,
anything else a logged 500 "inference failed"; a non-finite number in the answer is the 422
JSON refusal."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from laya_onnx.core.agent import ONNXAgent
from laya_onnx.core.errors import InvalidRequest, InvalidRequestType
from laya_onnx.serve.contract import NonFiniteNumber, render
from tests.serve_support import BATCH, BODY, URL, FakeAgent, Q, aio, post, served

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]


@aio
async def test_question_value_error_is_422_not_logged(caplog):
    bad = {"refund": {"type": "X", "instructions": "x"}}
    async with served() as c:
        with caplog.at_level(logging.ERROR):
            r, out = await post(c, URL, {"state": "x", "questions": bad})
        assert r.status == 422
        assert out == {
            "detail": "question 'refund': unknown type 'X'; use one of ['choice', 'noul', 'score']"
        }
        assert "Server-Timing" not in r.headers
        assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


@pytest.mark.parametrize("path,body", [(URL, BODY), (BATCH, {"states": ["x"], "questions": Q})])
@aio
async def test_unexpected_error_is_500_without_leak(caplog, path, body):
    agent = FakeAgent(error=RuntimeError("CUDA OOM at /secret/path"))
    async with served(agent) as c:
        with caplog.at_level(logging.ERROR):
            r, out = await post(c, path, body)
    assert (r.status, out) == (500, {"detail": "inference failed"})
    errors = [rec for rec in caplog.records if rec.levelno == logging.ERROR]
    assert errors and errors[0].exc_info and "secret" not in json.dumps(out)
    assert "Server-Timing" not in r.headers


@aio
async def test_non_finite_result_is_422():
    def poison(result):
        result["answers"]["queue"]["confidence"] = float("nan")
        return result

    async with served(FakeAgent(result_hook=poison)) as c:
        r, out = await post(c, URL, BODY)
        assert (r.status, out) == (422, {"detail": "Out of range float values are not JSON compliant"})
        assert "Server-Timing" not in r.headers


@aio
async def test_strict_projection_of_a_broken_answer_is_500(monkeypatch, caplog):
    def broken(result):
        del result["answers"]["queue"]["choice"]
        return result

    monkeypatch.setenv("LAYA_JEV_STRICT", "1")
    async with served(FakeAgent(result_hook=broken)) as c:
        with caplog.at_level(logging.ERROR):
            r, out = await post(c, URL, BODY)
    assert (r.status, out) == (500, {"detail": "inference failed"})
    assert "Server-Timing" not in r.headers and caplog.records


def _numpy_error() -> ValueError:
    """A genuine numpy ValueError (shapes that do not broadcast), as a pass might raise one."""
    try:
        np.zeros(2) + np.zeros(3)
    except ValueError as exc:
        return exc
    raise AssertionError("numpy broadcast two different lengths")


def _error_records(caplog):
    return [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


@pytest.mark.parametrize(
    "error",
    [ValueError("hook 'audit' refused: no tenant id"), _numpy_error(), RuntimeError("at /secret/path")],
    ids=["hook-value-error", "numpy-value-error", "runtime-error"],
)
@pytest.mark.parametrize("path,body", [(URL, BODY), (BATCH, {"states": ["x"], "questions": Q})])
@aio
async def test_anything_but_a_caller_mistake_is_a_logged_500(caplog, path, body, error):
    async with served(FakeAgent(error=error)) as c:
        with caplog.at_level(logging.ERROR):
            r, out = await post(c, path, body)
    assert (r.status, out) == (500, {"detail": "inference failed"})
    logged = _error_records(caplog)
    assert logged and logged[0].exc_info[1] is error
    assert str(error) not in json.dumps(out)


@pytest.mark.parametrize(
    "error",
    [
        InvalidRequest("question 'q': only 1 of its 3 option markers fit in max_len=8"),
        InvalidRequestType("state must not be None; pass a string, dict, or list"),
    ],
    ids=["InvalidRequest", "InvalidRequestType"],
)
@pytest.mark.parametrize("path,body", [(URL, BODY), (BATCH, {"states": ["x"], "questions": Q})])
@aio
async def test_a_caller_mistake_is_a_422_with_its_text_not_logged(caplog, path, body, error):
    async with served(FakeAgent(error=error)) as c:
        with caplog.at_level(logging.ERROR):
            r, out = await post(c, path, body)
    assert (r.status, out) == (422, {"detail": str(error)})
    assert "Server-Timing" not in r.headers and not _error_records(caplog)


@pytest.mark.parametrize(
    "spoil",
    [
        lambda result: result["answers"]["queue"].update(loop=result),  # json: circular reference
        lambda result: result["usage"].update(input_tokens=np.int64(3)),  # json: not serializable
    ],
    ids=["circular", "numpy-scalar"],
)
@aio
async def test_a_result_that_cannot_be_rendered_is_a_logged_500_not_non_finite(caplog, spoil):
    def hook(result):
        spoil(result)
        return result

    async with served(FakeAgent(result_hook=hook)) as c:
        with caplog.at_level(logging.ERROR):
            r, out = await post(c, URL, BODY)
    assert (r.status, out) == (500, {"detail": "inference failed"})
    assert _error_records(caplog)


def test_render_names_only_a_non_finite_number_as_such():
    for value in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(NonFiniteNumber):
            render({"a": [1, {"b": value}]})
    with pytest.raises(NonFiniteNumber):
        render({float("nan"): 1})  # a float key is rendered as a number too
    circular: dict = {}
    circular["self"] = circular
    with pytest.raises(ValueError, match="Circular reference") as caught:
        render(circular)
    assert not isinstance(caught.value, NonFiniteNumber)
    assert render({"a": 1.5, "b": "é"}) == '{"a":1.5,"b":"é"}'.encode()


class _RefusingHook:
    """An operator's hook installed on the agent that refuses every call with its own ValueError."""

    def on_predict_start(self, ctx):
        raise ValueError("audit hook: no tenant id on this call")


@aio
async def test_real_agent_hook_value_error_is_500_and_question_mistake_is_422(caplog, bundle_factory):
    agent = ONNXAgent(bundle_factory("tiny-english"))
    async with served(agent) as c:
        bad = {"r": {"type": "X", "instructions": "x"}}
        r, out = await post(c, URL, {"state": "x", "questions": bad})
        assert (r.status, out) == (
            422,
            {"detail": "question 'r': unknown type 'X'; use one of ['choice', 'noul', 'score']"},
        )
        r, out = await post(c, BATCH, {"states": ["x"], "questions": Q, "max_len": 8})
        assert r.status == 422 and out["detail"].startswith("question 'queue': only ")
        agent.add_hook(_RefusingHook())
        with caplog.at_level(logging.ERROR):
            for path, body in ((URL, BODY), (BATCH, {"states": ["x"], "questions": Q})):
                r, out = await post(c, path, body)
                assert (r.status, out) == (500, {"detail": "inference failed"})
    logged = _error_records(caplog)
    assert len(logged) == 2 and "no tenant id" in str(logged[0].exc_info[1])
