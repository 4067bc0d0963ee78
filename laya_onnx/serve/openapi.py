"""`/openapi.json` and `/docs` (one self-contained HTML page), generated from the models of `schema.py`
and of the other routes' answers (below), and `GET /`, the index of the routes a server answers.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic.json_schema import GenerateJsonSchema, models_json_schema

from laya_onnx import __version__
from laya_onnx.core import settings
from laya_onnx.serve import schema as s
from laya_onnx.serve.body import UNSUPPORTED_ENCODING, UNSUPPORTED_TRANSFER
from laya_onnx.serve.errors import (
    BODY_TIMEOUT,
    BODY_TOO_LARGE,
    BUSY,
    INFERENCE_FAILED,
    INVALID_JSON,
    NOT_JSON_FROM_A_PAGE,
    UNAUTHORIZED,
)


class Error(BaseModel):
    """laya-serve's refusal."""

    detail: str


class JevValidationErrorItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class JevValidationError(BaseModel):
    """The Jev profile's 422: one entry per fault of the body."""

    detail: list[JevValidationErrorItem]


class JevErrorDetail(BaseModel):
    error_type: str
    message: str


class JevError(BaseModel):
    """The Jev profile's other refusals."""

    detail: JevErrorDetail


class FallbackCount(BaseModel):
    count: s.Count
    last_reason: str | None


class Health(BaseModel):
    """Always `status`; the rest only without LAYA_API_KEY or with the right bearer."""

    model_config = s.OPEN
    status: Literal["ok"]
    loaded: list[str] = s.absent_field()
    revisions: dict[str, str | None] = s.absent_field()
    device: str = s.absent_field()
    device_is_preference: bool = s.absent_field()
    checkpoint_devices: dict[str, str] = s.absent_field()
    cpu_fallbacks: dict[str, FallbackCount] = s.absent_field()
    providers: dict[str, list[str]] = s.absent_field()
    provider_fallbacks: dict[str, dict[str, dict[str, Any]]] = s.absent_field()
    int8_kernels: dict[str, str] = s.absent_field("Each int8 checkpoint's integer GEMM (u8s8 or u8u8)")


class Probe(BaseModel):
    """`/health/live` and `/health/ready`: one word."""

    status: Literal["ok", "ready", "warming up", "draining", "unhealthy"]


class ModelCard(BaseModel):
    """One served checkpoint: Jev's three keys, then ours (x_, only for an authorized caller)."""

    model_config = s.OPEN
    name: str
    description: str
    release_date: str
    x_aliases: list[str] = s.absent_field("Other `model` values this checkpoint answers to.")
    x_revision: str | None = s.absent_field()
    x_repo: str = s.absent_field()
    x_graph_sha256: str | None = s.absent_field("sha256 of laya.onnx, from the bundle manifest")
    x_manifest_sha256: str | None = s.absent_field("sha256 of manifest.json (pins every file)")
    x_precision: str = s.absent_field()
    x_providers: list[str] = s.absent_field()
    x_int8_kernel: str = s.absent_field("An int8 bundle's integer GEMM here: u8s8 or u8u8")


class ModelList(BaseModel):
    models: list[ModelCard]


class Index(BaseModel):
    """`GET /`: what answers here and where (LAYA_ROOT_PATH included in every path)."""

    name: str
    summary: str
    version: str = s.absent_field(f"Only without {settings.API_KEY.env}.")
    routes: dict[str, str] = Field(description='"METHOD /path" -> what the route does')
    docs: str = s.absent_field("The HTML API page, where it is served.")
    openapi: str = s.absent_field("The OpenAPI document, where it is served.")


TITLE = "laya-onnx"
SUMMARY = "Laya System-1 decisions over the TypeSafe Jev /v1/systemone protocol, on ONNX Runtime"
_KEY = settings.API_KEY.env

#: By profile: the decision routes' request and answer models (single, then batch), the 422's
#: body and the other refusals' (LAYA_JEV_PROFILE=typesafe: the Jev profile's own).
_PROFILES: dict[bool, tuple[type[BaseModel], ...]] = {
    False: (s.DecisionRequest, s.DecisionResponse, s.BatchRequest, s.BatchResponse, Error, Error),
    True: (s.JevSystemOneRequest, s.JevSystemOneResponse, s.JevBatchRequest, s.JevBatchResponse)
    + (JevValidationError, JevError),
}
_OTHER_ANSWERS = (Health, ModelList, Index, Probe)


def _header(description: str, pattern: str | None = None, required: bool = True) -> dict[str, Any]:
    schema = {"type": "string"} | ({"pattern": pattern} if pattern else {})
    return {"description": description, "required": required, "schema": schema}


_ANSWER_HEADERS = {
    "Server-Timing": _header(
        "inference;dur=<ms>: the forward pass on the worker, queue wait excluded.",
        r"^inference;dur=\d+\.\d{2}$",
    ),
    "X-Inference-Time-Ms": _header("The same milliseconds as Server-Timing.", r"^\d+\.\d{2}$"),
    "X-Model-Fallback": _header(
        "The checkpoint(s) that answered a `model` named nowhere here (docs/http-api.md#the-model-field).",
        required=False,
    ),
}
#: What each refusal of a decision route means (docs/http-api.md#refusals-in-order).
_DECISION_ERRORS = {
    400: "%r, no required fields, a null state, or an unpaired surrogate escape." % INVALID_JSON,
    401: "%r: %s is set and Authorization is not exactly 'Bearer <key>'." % (UNAUTHORIZED, _KEY),
    408: "%r: the body took longer than %s." % (BODY_TIMEOUT, settings.BODY_READ_TIMEOUT.env),
    413: "%r, or over a limit of docs/http-api.md#limits." % BODY_TOO_LARGE,
    415: "%r; or %r." % (UNSUPPORTED_ENCODING, NOT_JSON_FROM_A_PAGE),
    422: "A question the model cannot answer, a control out of range, a hook key, or an unserved `model`.",
    500: "%r: the pass failed; the traceback is logged, never sent." % INFERENCE_FAILED,
    501: "%r" % UNSUPPORTED_TRANSFER,
    503: "%r: %s requests in flight, or %s bytes of bodies being read."
    % (BUSY, settings.MAX_CONCURRENT.env, settings.BODY_BUFFER.env),
    504: "Not answered within %s of its admission." % settings.REQUEST_TIMEOUT.env,
}


def _json(model: type[BaseModel]) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": "#/components/schemas/" + model.__name__}}}


def _response(description: str, content: dict[str, Any], headers: Any = None) -> dict[str, Any]:
    return {"description": description, **({"headers": headers} if headers else {}), "content": content}


def _post(op_id: str, summary: str, description: str, models: Any, jev_profile: bool) -> dict[str, Any]:
    """A decision route: its body, its answer with the timing headers, and every refusal."""
    *_, invalid, other = _PROFILES[jev_profile]
    retry = {"Retry-After": {"required": True, "schema": {"type": "string", "enum": ["1"]}}}
    responses = {"200": _response("The answers.", _json(models[1]), _ANSWER_HEADERS)}
    for status, why in _DECISION_ERRORS.items():
        body = _json(invalid if status == 422 else other)
        responses[str(status)] = _response(why, body, retry if status == 503 else None)
    request = {"required": True, "content": _json(models[0])}
    op = {"operationId": op_id, "summary": summary, "description": description, "requestBody": request}
    return {"post": {**op, "responses": responses, "security": [{}, {"bearer": []}]}}


def _get(op_id: str, summary: str, description: str, content: Any, not_ready: bool = False) -> dict[str, Any]:
    """A GET route: its answer (a model, or content by media type); 503 with it when `not_ready`."""
    content = _json(content) if isinstance(content, type) else content
    responses = {"200": _response(summary, content)}
    if not_ready:
        responses["503"] = _response("Not so (the status says why).", content)
    return {
        "get": {"operationId": op_id, "summary": summary, "description": description, "responses": responses}
    }


class _Schemas(GenerateJsonSchema):
    """pydantic's JSON Schema, with a map whose keys follow a pattern written as `propertyNames`:
    pydantic's `patternProperties` would let a key that breaks the pattern through."""

    def dict_schema(self, schema: Any) -> dict[str, Any]:
        out = super().dict_schema(schema)
        patterns = out.pop("patternProperties", None)
        if patterns:
            ((pattern, values),) = patterns.items()
            out["propertyNames"] = {"pattern": pattern}
            out["additionalProperties"] = values
        return out


def _components(jev_profile: bool, budget: int) -> dict[str, Any]:
    """The models' JSON Schemas, named by model; `max_len` and `head_max_len` capped at `budget`."""
    models: tuple[type[BaseModel], ...] = (*_PROFILES[False][:4], *_OTHER_ANSWERS, Error)
    models += (*_PROFILES[True][:4], JevError, JevValidationError) if jev_profile else ()
    pairs = [(m, "validation" if m.__name__.endswith("Request") else "serialization") for m in models]
    ref = "#/components/schemas/{model}"
    _, doc = models_json_schema(pairs, ref_template=ref, schema_generator=_Schemas)  # type: ignore[arg-type]
    schemas = doc["$defs"]
    for model in models:
        for name in ("max_len", "head_max_len"):
            for branch in schemas[model.__name__].get("properties", {}).get(name, {}).get("anyOf", []):
                if branch.get("type") == "integer":
                    branch["maximum"] = budget
    return schemas


@lru_cache(maxsize=8)
def openapi_document(
    root_path: str = "", jev_profile: bool = False, token_budget: int = settings.MAX_TOKEN_BUDGET.default
) -> dict[str, Any]:
    """The whole document in a wire profile; LAYA_ROOT_PATH is its server, as laya-serve's FastAPI
    has it (the paths stay unprefixed: both forms answer)."""
    single, batch = _PROFILES[jev_profile][:2], _PROFILES[jev_profile][2:4]
    text = {"schema": {"type": "string"}}
    never_401 = "Never 401; the full payload only without %s or with the right bearer." % _KEY
    keyless = "Served only when %s is unset (404 otherwise), as laya-serve does." % _KEY
    metrics = _get(
        "metrics",
        "Prometheus metrics",
        "Text exposition (OpenMetrics when Accept asks for it); with %s set it needs the bearer." % _KEY,
        {"text/plain": text, "application/openmetrics-text": text},
    )
    why = "%r: %s is set and the bearer is missing or wrong." % (UNAUTHORIZED, _KEY)
    metrics["get"]["responses"]["401"] = _response(why, _json(Error))
    paths = {
        "/": _get("index", "What answers here", "The routes, a line each (docs/http-api.md#routes).", Index),
        "/v1/systemone": _post(
            "systemone", "Answer questions about one state", "One forward pass.", single, jev_profile
        ),
        "/v1/systemone/batch": _post(
            "systemone_batch",
            "Answer one question set over many states",
            "In input order (docs/http-api.md#batch).",
            batch,
            jev_profile,
        ),
        "/health": _get("health", "Liveness and serving facts", never_401, Health),
        "/health/live": _get("live", "Liveness", "docs/http-api.md#health; never 401.", Probe, True),
        "/health/ready": _get("ready", "Readiness", "Warmed up and not draining; never 401.", Probe, True),
        "/v1/models": _get(
            "models", "The served checkpoint, in Jev's model-list shape", never_401, ModelList
        ),
        "/metrics": metrics,
        "/openapi.json": _get(
            "openapi", "This document", keyless, {"application/json": {"schema": {"type": "object"}}}
        ),
        "/docs": _get("docs", "This document as a self-contained HTML page", keyless, {"text/html": text}),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": TITLE, "summary": SUMMARY, "version": __version__},
        **({"servers": [{"url": root_path}]} if root_path else {}),
        "paths": paths,
        "components": {
            "schemas": _components(jev_profile, token_budget),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "Only when %s is set." % _KEY}
            },
        },
    }


def openapi_json(
    root_path: str = "", jev_profile: bool = False, token_budget: int = settings.MAX_TOKEN_BUDGET.default
) -> bytes:
    document = openapi_document(root_path, jev_profile, token_budget)
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def index_payload(
    routes: Iterable[tuple[str, str]], root_path: str = "", public: bool = True, docs: bool = True
) -> dict[str, Any]:
    """`GET /`: the (method, path) `routes` under `root_path` with their summaries; `public` (no API
    key): the version too; `docs`: the links to `/docs` and `/openapi.json`."""
    paths = openapi_document()["paths"]
    return {
        "name": TITLE,
        "summary": SUMMARY,
        **({"version": __version__} if public else {}),
        "routes": {
            "%s %s" % (method, (root_path + path).rstrip("/") or "/"): paths[path][method.lower()]["summary"]
            for method, path in routes
        },
        **({"docs": root_path + "/docs", "openapi": root_path + "/openapi.json"} if docs else {}),
    }


_STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; }
code, pre { font: 13px/1.35 ui-monospace, monospace; }
pre { background: #f6f6f6; padding: .6rem; overflow-x: auto; }
td, th { text-align: left; padding: .2rem .6rem; vertical-align: top; }
"""


def _schema_link(content: dict[str, Any]) -> str:
    """A link to the schema an answer or body names, else its media types."""
    refs = [
        media["schema"]["$ref"].rsplit("/", 1)[-1] for media in content.values() if "$ref" in media["schema"]
    ]
    return "<a href='#schema-%s'>%s</a>" % (refs[0], refs[0]) if refs else html.escape(", ".join(content))


@lru_cache(maxsize=2)
def docs_html(jev_profile: bool = False) -> str:
    """The document as one HTML page, each route then each schema; its links are in-page anchors."""
    doc, e = openapi_document(jev_profile=jev_profile), html.escape
    title = "%s %s" % (TITLE, doc["info"]["version"])
    out = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<title>%s</title><style>%s</style></head><body><h1>%s</h1>" % (e(title), _STYLE, e(title)),
        "<p>%s. Machine-readable: <code>/openapi.json</code> (OpenAPI %s).</p>"
        % (e(SUMMARY), doc["openapi"]),
    ]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            out.append("<h2>%s <code>%s</code></h2>" % (method.upper(), e(path)))
            out.append("<p><b>%s.</b> %s</p>" % (e(op["summary"]), e(op["description"])))
            if "requestBody" in op:
                out.append("<p>Request body: %s</p>" % _schema_link(op["requestBody"]["content"]))
            out.append("<table><tr><th>status</th><th>body</th><th>meaning</th></tr>")
            for status, answer in op["responses"].items():
                cells = (status, _schema_link(answer["content"]), e(answer["description"]))
                out.append("<tr><td>%s</td><td>%s</td><td>%s</td></tr>" % cells)
            out.append("</table>")
    out.append("<h2>Schemas</h2>")
    for name, schema in doc["components"]["schemas"].items():
        text = e(json.dumps(schema, indent=2, ensure_ascii=False))
        out.append("<h3 id='schema-%s'>%s</h3><pre>%s</pre>" % (name, name, text))
    out.append("</body></html>")
    return "\n".join(out)
