"""`/openapi.json` and `/docs`: complete, gated like laya-serve's, and true of real answers.

The fuzz test (test_serve_fuzz.py) checks the document against thousands of generated
requests; here real answers of the fake agent are validated against it directly, so a schema
that drifted from the handlers fails in milliseconds with the offending payload named.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("jsonschema_rs")

import jsonschema_rs

from laya_onnx.serve import create_app
from laya_onnx.serve.app import SERVICE
from laya_onnx.serve.openapi import openapi_document
from tests.serve_support import BATCH, BODY, URL, FakeAgent, aio, post, served

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]

DECISION_ERRORS = {"400", "401", "408", "413", "415", "422", "500", "501", "503", "504"}


def validator(doc, component):
    """A JSON Schema validator for one component, with the document's refs resolvable."""
    schema = {"$ref": "#/components/schemas/" + component, "components": doc["components"]}
    return jsonschema_rs.Draft202012Validator(schema)


def assert_valid(doc, component, instance):
    errors = [e.message for e in validator(doc, component).iter_errors(instance)]
    assert not errors, (component, errors[:5], json.dumps(instance)[:500])


def app_routes(app) -> set[tuple[str, str]]:
    """The (method, path) pairs the app's pipeline routes (its route table)."""
    return {(method.lower(), path) for method, path in app[SERVICE].routes}


def doc_routes(doc) -> set[tuple[str, str]]:
    return {(method, path) for path, item in doc["paths"].items() for method in item}


@aio
async def test_openapi_document_describes_exactly_the_routes_served():
    async with served() as c:
        r = await c.get("/openapi.json")
        assert r.status == 200 and r.content_type == "application/json"
        doc = await r.json()
    assert doc == json.loads(json.dumps(openapi_document()))
    assert doc["openapi"].startswith("3.1") and doc["info"]["title"] == "laya-onnx"
    assert doc_routes(doc) == app_routes(create_app(FakeAgent()))
    for path in ("/v1/systemone", "/v1/systemone/batch"):
        op = doc["paths"][path]["post"]
        assert set(op["responses"]) == {"200"} | DECISION_ERRORS
        headers = op["responses"]["200"]["headers"]
        assert set(headers) == {"Server-Timing", "X-Inference-Time-Ms", "X-Model-Fallback"}
        assert headers["X-Model-Fallback"]["required"] is False
        assert set(op["responses"]["503"]["headers"]) == {"Retry-After"}
        for status in DECISION_ERRORS:
            ref = op["responses"][status]["content"]["application/json"]["schema"]["$ref"]
            assert ref == "#/components/schemas/Error"


@aio
async def test_root_path_is_the_documents_server_and_both_forms_answer():
    """As laya-serve's FastAPI: LAYA_ROOT_PATH=/laya gives `servers: [{"url": "/laya"}]`."""
    async with served(root_path="/laya") as c:
        docs = [await (await c.get(path)).json() for path in ("/openapi.json", "/laya/openapi.json")]
        assert (await c.get("/laya/docs")).status == 200
    assert docs[0] == docs[1] and docs[0]["servers"] == [{"url": "/laya"}]
    assert "/v1/systemone" in docs[0]["paths"]  # the paths themselves stay unprefixed
    assert "servers" not in openapi_document()


@aio
async def test_docs_and_openapi_are_absent_when_a_key_is_set():
    """As laya-serve: with LAYA_API_KEY the API description is not served at all (404)."""
    async with served(api_key="s3cret") as c:
        for path in ("/openapi.json", "/docs"):
            for headers in ({}, {"Authorization": "Bearer s3cret"}):
                r = await c.get(path, headers=headers)
                assert (r.status, await r.json()) == (404, {"detail": "Not Found"})


@pytest.mark.parametrize("profile", [{}, {"jev_profile": "typesafe"}])
@aio
async def test_the_index_names_every_route_and_the_documents(profile):
    """`GET /`: 200 with every served route and its summary (laya-serve 404s here; a person or a
    probe at the bare URL learns what answers); no version and no doc links with a key set."""
    doc = openapi_document()
    async with served(**profile) as c:
        r = await c.get("/")
        index = await r.json()
    assert r.status == 200 and r.content_type == "application/json"
    assert_valid(doc, "Index", index)
    assert index["name"] == "laya-onnx" and index["version"] == doc["info"]["version"]
    assert (index["docs"], index["openapi"]) == ("/docs", "/openapi.json")
    served_routes = app_routes(create_app(FakeAgent(), **profile))
    assert {tuple(route.split(" ")) for route in index["routes"]} == {
        (m.upper(), p) for m, p in served_routes
    }
    assert index["routes"]["POST /v1/systemone"] == doc["paths"]["/v1/systemone"]["post"]["summary"]
    async with served(api_key="s3cret", **profile) as c:
        r = await c.get("/")
        keyed = await r.json()
    assert r.status == 200 and "version" not in keyed and "docs" not in keyed and "openapi" not in keyed
    assert "GET /docs" not in keyed["routes"] and "GET /health" in keyed["routes"]


@aio
async def test_docs_page_is_self_contained_and_names_every_route():
    async with served() as c:
        r = await c.get("/docs")
        assert r.status == 200 and r.content_type == "text/html"
        page = await r.text()
    for path in openapi_document()["paths"]:
        assert "<code>%s</code>" % path in page
    for schema in ("DecisionRequest", "BatchResponse", "ModelList", "Error"):
        assert "id='schema-%s'" % schema in page
    # Nothing fetched from anywhere: no scripts, no external stylesheets or images, no URLs.
    lowered = page.lower()
    for marker in ("<script", "<link", "src=", "http://", "https://", "@import"):
        assert marker not in lowered, marker


def test_request_schemas_accept_what_the_server_answers_and_refuse_what_it_refuses():
    doc = openapi_document()
    assert_valid(doc, "DecisionRequest", BODY)
    assert_valid(doc, "DecisionRequest", {**BODY, "max_len": 256, "min_confidence": {"choice:3-5": 0.5}})
    assert_valid(doc, "BatchRequest", {"states": ["a", {"k": 1}], "questions": BODY["questions"]})
    refused = [
        {"questions": BODY["questions"]},  # no state: 400
        {"state": None, "questions": {}},  # null state: 400
        {"state": "x", "questions": []},  # questions not an object: 400
        {"state": "x", "questions": {"q": {"type": "pick", "instructions": "?"}}},  # type: 422
        {"state": "x", "questions": {"q": {"type": "score", "instructions": "?", "criteria": [None]}}},
        {"state": "x", "questions": {" ": {"type": "noul", "instructions": "?"}}},  # blank id: 422
        {"state": "x", "questions": {}, "max_len": 0},  # 422
        {"state": "x", "questions": {}, "hooks": ["mod:fn"]},  # 422
        {"state": "x", "questions": {}, "min_confidence": {"choice:4": 0.5}},  # bad bucket: 422
        {"state": "x" * 50001, "questions": {}},  # 413
    ]
    check = validator(doc, "DecisionRequest")
    for body in refused:
        assert not check.is_valid(body), json.dumps(body)[:200]
    assert not validator(doc, "BatchRequest").is_valid({"states": [], "questions": {}})


@aio
async def test_real_answers_validate_against_the_document(monkeypatch):
    doc = openapi_document()
    async with served(api_key=None) as c:
        r, body = await post(c, URL, {**BODY, "min_confidence": 0.7})
        assert r.status == 200
        assert_valid(doc, "DecisionResponse", body)
        r, body = await post(c, BATCH, {"states": ["a", "b"], "questions": BODY["questions"]})
        assert r.status == 200
        assert_valid(doc, "BatchResponse", body)
        assert_valid(doc, "Health", await (await c.get("/health")).json())
        assert_valid(doc, "ModelList", await (await c.get("/v1/models")).json())
        r, body = await post(c, URL, b"{not json")
        assert r.status == 400
        assert_valid(doc, "Error", body)
    monkeypatch.setenv("LAYA_JEV_STRICT", "1")  # read when the app is built
    async with served(api_key=None) as c:
        r, body = await post(c, URL, BODY)
        assert r.status == 200 and "routing" not in body
        assert_valid(doc, "DecisionResponse", body)
    monkeypatch.delenv("LAYA_JEV_STRICT")
    async with served(api_key="k") as c:
        assert_valid(doc, "Health", await (await c.get("/health")).json())
        assert_valid(doc, "ModelList", await (await c.get("/v1/models")).json())


def test_response_schemas_catch_a_contract_break():
    """The validators used above are not vacuous: a broken answer fails them."""
    doc = openapi_document()
    good = {
        "model": "m",
        "answers": {"q": {"type": "noul", "noul": 0.5}},
        "usage": {"input_tokens": 1, "output_tokens": 0},
    }
    assert validator(doc, "DecisionResponse").is_valid(good)
    for broken in (
        {**good, "answers": {"q": {"type": "noul", "noul": 1.5}}},
        {**good, "answers": {"q": {"type": "choice", "choice": "a", "probabilities": {"a": 1.0}}}},
        {**good, "usage": {"input_tokens": -1, "output_tokens": 0}},
        {k: v for k, v in good.items() if k != "usage"},
    ):
        assert not validator(doc, "DecisionResponse").is_valid(broken), broken


@aio
async def test_collapsed_options_and_tournament_answers_validate(bundle_factory):
    """The tiny bundle's own answers where the fake has nothing to say: options shrunk until they
    collapse (`usage.options`, `tokens_per_option` an int) and a 150-option choice answered by
    elimination (`x_tournament`, probabilities over every option)."""
    from laya_onnx import ONNXAgent

    doc = openapi_document()
    agent = ONNXAgent(bundle_factory("tiny-english"))
    same_start = ["the customer is asking about topic number %d" % i for i in range(60)]
    many = ["queue %d" % i for i in range(150)]
    async with served(agent, api_key=None) as c:
        # one request each: a request with a choice over 100 options narrows every large choice
        r, one_pass = await post(
            c,
            URL,
            {
                "state": "x",
                "questions": {"q": {"type": "choice", "instructions": "Which?", "criteria": same_start}},
            },
        )
        assert r.status == 200
        r, narrowed = await post(
            c,
            URL,
            {
                "state": "x",
                "questions": {"q": {"type": "choice", "instructions": "Which?", "criteria": many}},
            },
        )
        assert r.status == 200
    spans = one_pass["usage"]["options"]["q"]
    assert spans["distinct"] < spans["total"] == 60 and isinstance(spans["tokens_per_option"], int)
    assert len(narrowed["answers"]["q"]["probabilities"]) == 150 and narrowed["answers"]["q"]["x_tournament"]
    assert_valid(doc, "DecisionResponse", one_pass)
    assert_valid(doc, "DecisionResponse", narrowed)


@aio
async def test_jev_profile_document_describes_its_own_bodies_answers_and_errors():
    async with served(jev_profile="typesafe") as c:
        doc = await (await c.get("/openapi.json")).json()
        replies = [
            await post(c, URL, BODY),
            await post(c, BATCH, {"states": [BODY["state"], "another"], "questions": BODY["questions"]}),
            await post(c, URL, {"state": "x", "questions": {}}),
            await post(c, URL, b"{not json"),
            await post(c, URL, {**BODY, "model": "englsh"}),
        ]
        docs = await (await c.get("/docs")).text()
    statuses = [r.status for r, _ in replies]
    answers = [body for _, body in replies]
    assert doc == json.loads(json.dumps(openapi_document(jev_profile=True)))
    assert doc != json.loads(json.dumps(openapi_document()))
    post_single = doc["paths"][URL]["post"]
    assert post_single["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/JevSystemOneRequest"
    )
    assert post_single["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/JevValidationError"
    )
    assert post_single["responses"]["503"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/JevError"
    )
    assert statuses == [200, 200, 422, 422, 200]
    assert "X-Model-Fallback" in post_single["responses"]["200"]["headers"]
    assert answers[4]["x_model_fallback"] == {"requested": "englsh", "answered_by": "english"}
    assert_valid(doc, "JevSystemOneResponse", answers[4])
    # the document can fail: a fallback that does not say what answered is not one
    broken = {**answers[4], "x_model_fallback": {"requested": "englsh"}}
    assert list(validator(doc, "JevSystemOneResponse").iter_errors(broken))
    assert_valid(doc, "JevSystemOneRequest", BODY)
    assert_valid(doc, "JevSystemOneResponse", answers[0])
    assert_valid(doc, "JevBatchResponse", answers[1])
    assert_valid(doc, "JevValidationError", answers[2])
    assert_valid(doc, "JevValidationError", answers[3])
    assert_valid(doc, "JevError", {"detail": {"error_type": "overloaded_error", "message": "busy"}})
    # the document can fail: a laya-profile error body is not a Jev one
    assert list(validator(doc, "JevError").iter_errors({"detail": "busy"}))
    assert "JevSystemOneRequest" in docs


def test_not_blank_means_what_the_handlers_strip():
    """The documents' "not blank" pattern refuses exactly the strings `str.strip()` empties: ECMA's
    `\\S` would accept U+001C..U+001F and U+0085, which the handlers refuse as blank."""
    import re
    import sys

    from laya_onnx.serve.schema import NOT_BLANK

    pattern = re.compile(NOT_BLANK)
    disagree = [
        hex(c) for c in range(sys.maxunicode + 1) if bool(pattern.search(chr(c))) != bool(chr(c).strip())
    ]
    assert not disagree
    for jev in (False, True):
        doc = openapi_document(jev_profile=jev)
        request = validator(doc, "JevSystemOneRequest" if jev else "DecisionRequest")
        assert "\\\\S" not in json.dumps(doc)
        for blank in ("\x1d", "\x85 ", "\u3000"):
            body = {**BODY, "questions": {blank: BODY["questions"][next(iter(BODY["questions"]))]}}
            assert not request.is_valid(body), (jev, repr(blank))
        assert request.is_valid(
            {**BODY, "questions": {"\x1dq": BODY["questions"][next(iter(BODY["questions"]))]}}
        )
