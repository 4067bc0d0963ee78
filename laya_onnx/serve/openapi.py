"""`/openapi.json` and `/docs`: the OpenAPI 3.1 document, generated from the models of
`schema.py` (and of the other routes' answers, below); and `GET /`, the short index of the routes
a server answers (`index_payload`).

laya-serve (FastAPI) serves `/openapi.json`, `/docs` and `/redoc` only when LAYA_API_KEY is unset
(docs/http-api.md, "Routes"); with a key they do not exist (404). This server does the same with `/openapi.json`
and `/docs`. `/docs` is one self-contained HTML page rendered on the server from the same
document — no script, no stylesheet or font from a CDN — so it works on a host with no
internet access.
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

# -- the error bodies (`contract.error_body`) ------------------------------------------------


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


# -- the other routes' answers (the decision routes' are in schema.py) -----------------------


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
    int8_kernels: dict[str, str] = s.absent_field(
        "The integer GEMM (u8s8 or u8u8) each loaded int8 checkpoint runs here"
    )


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
    x_int8_kernel: str = s.absent_field("An int8 bundle's integer GEMM here: u8s8 (CPUs with VNNI) or u8u8")


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
REF = "#/components/schemas/{model}"

#: The models the document names (each with the models they refer to), by profile: the Jev
#: profile's decision routes take and answer its own (LAYA_JEV_PROFILE=typesafe).
COMPONENTS = (
    s.DecisionRequest,
    s.BatchRequest,
    s.DecisionResponse,
    s.BatchResponse,
    Health,
    ModelList,
    Index,
    Probe,
    Error,
)
JEV_COMPONENTS = (
    s.JevSystemOneRequest,
    s.JevBatchRequest,
    s.JevSystemOneResponse,
    s.JevBatchResponse,
    JevError,
    JevValidationError,
)
#: The decision routes' (request, answer, 422, other errors) by profile.
_ROUTE_MODELS = {
    False: {
        "/v1/systemone": ("DecisionRequest", "DecisionResponse"),
        "/v1/systemone/batch": ("BatchRequest", "BatchResponse"),
    },
    True: {
        "/v1/systemone": ("JevSystemOneRequest", "JevSystemOneResponse"),
        "/v1/systemone/batch": ("JevBatchRequest", "JevBatchResponse"),
    },
}

_ANSWER_HEADERS = {
    "Server-Timing": {
        "description": "inference;dur=<ms>: the forward pass on the worker, queue wait excluded.",
        "required": True,
        "schema": {"type": "string", "pattern": r"^inference;dur=\d+\.\d{2}$"},
    },
    "X-Inference-Time-Ms": {
        "description": "The same milliseconds as Server-Timing.",
        "required": True,
        "schema": {"type": "string", "pattern": r"^\d+\.\d{2}$"},
    },
    "X-Model-Fallback": {
        "description": "Only when the body's `model` named no checkpoint this server knows (a typo, "
        "another provider's id; not `jev-latest`) and the request was answered anyway, as "
        "laya-serve answers it: the checkpoint(s) that answered, comma-separated (a batch may "
        "route states to different ones). The Jev profile also says it in `x_model_fallback`.",
        "required": False,
        "schema": {"type": "string"},
    },
}

_API_KEY = settings.API_KEY.env
#: What each refusal of a decision route means; the texts are the fixed ones where there is one.
_DECISION_ERRORS = {
    400: "Not JSON (%r), not an object with the required fields, a null state, or an unpaired "
    "surrogate escape." % INVALID_JSON,
    401: "%r: %s is set and Authorization is not exactly 'Bearer <key>'." % (UNAUTHORIZED, _API_KEY),
    408: "%r: the body took longer than %s." % (BODY_TIMEOUT, settings.BODY_READ_TIMEOUT.env),
    413: "%r (over 2 MiB, raw or decoded), or too many questions, options, score levels or "
    "states (the schemas' limits), a state over %d characters, a row over %s, or passes estimated "
    "to take longer than %s (the text gives the estimate)."
    % (BODY_TOO_LARGE, s.MAX_STATE_CHARS, settings.MAX_PASS_MEMORY.env, settings.MAX_REQUEST_SECONDS.env),
    415: "%r; or %r (a browser's request, which names its Origin, with another Content-Type)."
    % (UNSUPPORTED_ENCODING, NOT_JSON_FROM_A_PAGE),
    422: "A question the model cannot answer (its text names the question and the fix), a control "
    "out of range, a hook key, or a `model` this server does not serve.",
    500: "%r: the pass failed; the traceback is logged, never sent." % INFERENCE_FAILED,
    501: "%r" % UNSUPPORTED_TRANSFER,
    503: "%r: %s decision requests are already in flight, or the bodies being read already hold "
    "%s bytes." % (BUSY, settings.MAX_CONCURRENT.env, settings.BODY_BUFFER.env),
    504: "Not answered within %s of its admission, or its estimated passes cannot finish by then; "
    "no further pass of it runs." % settings.REQUEST_TIMEOUT.env,
}


def _json(ref: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": "#/components/schemas/" + ref}}}


def _error(status: int, why: str, profile: bool = False) -> dict[str, Any]:
    """One error response; in the Jev profile a 422 is the validation list, the rest
    `{"detail": {"error_type", "message"}}`."""
    name = ("JevValidationError" if status == 422 else "JevError") if profile else "Error"
    response: dict[str, Any] = {"description": why, "content": _json(name)}
    if status == 503:
        response["headers"] = {
            "Retry-After": {"required": True, "schema": {"type": "string", "enum": ["1"]}},
        }
    return response


def _decision(
    summary: str, description: str, request: str, response: str, op_id: str, profile: bool = False
) -> dict[str, Any]:
    responses: dict[str, Any] = {
        "200": {"description": "The answers.", "headers": _ANSWER_HEADERS, "content": _json(response)}
    }
    responses.update({str(code): _error(code, why, profile) for code, why in _DECISION_ERRORS.items()})
    return {
        "post": {
            "operationId": op_id,
            "summary": summary,
            "description": description,
            "requestBody": {"required": True, "content": _json(request)},
            "responses": responses,
            "security": [{}, {"bearer": []}],
        }
    }


def _get(
    op_id: str,
    summary: str,
    description: str,
    content: dict[str, Any],
    errors: dict[int, str] | None = None,
    not_ready: bool = False,
) -> dict[str, Any]:
    responses: dict[str, Any] = {"200": {"description": summary, "content": content}}
    responses.update({str(code): _error(code, why) for code, why in (errors or {}).items()})
    if not_ready:
        responses["503"] = {"description": "Not so (the status says why).", "content": content}
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
    """The models' JSON Schemas (2020-12), each named by its model; `max_len` and `head_max_len`
    capped at this server's token budget (a setting, read after the models are defined)."""
    models = COMPONENTS + (JEV_COMPONENTS if jev_profile else ())
    pairs = [(m, "validation" if m.__name__.endswith("Request") else "serialization") for m in models]
    _, doc = models_json_schema(pairs, ref_template=REF, schema_generator=_Schemas)  # type: ignore[arg-type]
    schemas = doc["$defs"]
    for model in models:
        for name, field in schemas[model.__name__].get("properties", {}).items():
            if name in ("max_len", "head_max_len"):
                for branch in field.get("anyOf", []):
                    if branch.get("type") == "integer":
                        branch["maximum"] = budget
    return schemas


@lru_cache(maxsize=8)
def openapi_document(
    root_path: str = "", jev_profile: bool = False, token_budget: int = settings.MAX_TOKEN_BUDGET.default
) -> dict[str, Any]:
    """The whole document, built once per process, root path, wire profile and token budget.

    `jev_profile` (LAYA_JEV_PROFILE=typesafe): the decision routes take and answer the Jev
    profile's types and its error shapes.

    With LAYA_ROOT_PATH (`/laya`) the document names it as its server, as laya-serve's FastAPI
    does (`"servers": [{"url": "/laya"}]`); the paths stay unprefixed, and both forms answer.
    """
    text_plain = {"schema": {"type": "string"}}
    servers = {"servers": [{"url": root_path}]} if root_path else {}
    return {
        "openapi": "3.1.0",
        "info": {"title": TITLE, "summary": SUMMARY, "version": __version__},
        **servers,
        "paths": {
            "/": _get(
                "index",
                "What answers here",
                "The server's name, its routes with a line each, and where this document is (the "
                f"version and the documentation links only without {_API_KEY}). Never 401.",
                _json("Index"),
            ),
            "/v1/systemone": _decision(
                "Answer questions about one state",
                "Every question is answered in one forward pass on the single inference worker.",
                *_ROUTE_MODELS[jev_profile]["/v1/systemone"],
                "systemone",
                jev_profile,
            ),
            "/v1/systemone/batch": _decision(
                "Answer one question set over many states",
                "States are answered in input order; long batches are split into passes that fit "
                f"{settings.MAX_BATCH_TOKENS.env}.",
                *_ROUTE_MODELS[jev_profile]["/v1/systemone/batch"],
                "systemone_batch",
                jev_profile,
            ),
            "/health": _get(
                "health",
                "Liveness and serving facts",
                f"Always 200, never 401, answered while a pass runs. With {_API_KEY} set, a caller "
                'without the right bearer gets {"status": "ok"} only.',
                _json("Health"),
            ),
            "/health/live": _get(
                "live",
                "Liveness",
                '{"status": "ok"}; 503 {"status": "unhealthy"} once a checkpoint\'s device keeps '
                "failing passes, which a restart is the remedy for. Never 401.",
                _json("Probe"),
                not_ready=True,
            ),
            "/health/ready": _get(
                "ready",
                "Readiness",
                '{"status": "ready"} once the warm-up ran (the speed probe and one pass per row '
                "length), while the checkpoints are healthy and the server is not draining; 503 with "
                '{"status": "warming up" | "draining" | "unhealthy"} otherwise. Never 401.',
                _json("Probe"),
                not_ready=True,
            ),
            "/v1/models": _get(
                "models",
                "The served checkpoint, in Jev's model-list shape",
                "Never 401. The x_ keys (aliases, digests, precision, providers) only without "
                f"{_API_KEY} or with the right bearer.",
                _json("ModelList"),
            ),
            "/metrics": _get(
                "metrics",
                "Prometheus metrics",
                "Prometheus text exposition (OpenMetrics when the Accept header asks for it). "
                f"With {_API_KEY} set it needs the bearer.",
                {"text/plain": text_plain, "application/openmetrics-text": text_plain},
                {401: "%r: %s is set and the bearer is missing or wrong." % (UNAUTHORIZED, _API_KEY)},
            ),
            "/openapi.json": _get(
                "openapi",
                "This document",
                f"Served only when {_API_KEY} is unset (404 otherwise), as laya-serve does.",
                {"application/json": {"schema": {"type": "object"}}},
            ),
            "/docs": _get(
                "docs",
                "This document as a self-contained HTML page",
                f"Served only when {_API_KEY} is unset (404 otherwise).",
                {"text/html": text_plain},
            ),
        },
        "components": {
            "schemas": _components(jev_profile, token_budget),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": f"Required on the decision routes only when {_API_KEY} is set.",
                }
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
    """`GET /`: the (method, path) `routes` a server answers, each with its summary from the
    document, under `root_path`. `public` (no API key): the version too, which the document
    also shows; `docs`: the links to `/docs` and `/openapi.json`, where they are served."""
    paths = openapi_document()["paths"]
    out: dict[str, Any] = {"name": TITLE, "summary": SUMMARY}
    if public:
        out["version"] = __version__
    out["routes"] = {
        "%s %s" % (method, (root_path + path).rstrip("/") or "/"): paths[path][method.lower()]["summary"]
        for method, path in routes
    }
    if docs:
        out["docs"] = root_path + "/docs"
        out["openapi"] = root_path + "/openapi.json"
    return out


# -- /docs ----------------------------------------------------------------------------------

_STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; }
h2 { border-bottom: 1px solid #ccc; padding-bottom: .2rem; margin-top: 2.5rem; }
code, pre { font: 13px/1.35 ui-monospace, monospace; }
pre { background: #f6f6f6; padding: .6rem; overflow-x: auto; }
.method { font-weight: bold; text-transform: uppercase; margin-right: .5rem; }
table { border-collapse: collapse; } td, th { text-align: left; padding: .2rem .6rem; vertical-align: top; }
"""


def _ref_name(content: dict[str, Any]) -> str | None:
    for media in content.values():
        ref = (media.get("schema") or {}).get("$ref", "")
        if ref:
            return ref.rsplit("/", 1)[-1]
    return None


def _anchor(name: str) -> str:
    return '<a href="#schema-%s">%s</a>' % (html.escape(name), html.escape(name))


@lru_cache(maxsize=1)
def docs_html(jev_profile: bool = False) -> str:
    """The document rendered as HTML: each route with its body and answers, then every schema.

    Links are in-page anchors only.
    """
    doc = openapi_document(jev_profile=jev_profile)
    e = html.escape
    out = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<title>%s %s</title><style>%s</style></head><body>" % (e(TITLE), e(doc["info"]["version"]), _STYLE),
        "<h1>%s <small>%s</small></h1><p>%s</p>" % (e(TITLE), e(doc["info"]["version"]), e(SUMMARY)),
        "<p>The machine-readable form of this page is <code>/openapi.json</code> (OpenAPI %s).</p>"
        % e(doc["openapi"]),
    ]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            out.append("<h2><span class='method'>%s</span><code>%s</code></h2>" % (e(method), e(path)))
            out.append("<p><b>%s.</b> %s</p>" % (e(op["summary"]), e(op.get("description", ""))))
            body = op.get("requestBody")
            if body:
                name = _ref_name(body["content"])
                out.append("<p>Request body: %s</p>" % (_anchor(name) if name else "JSON"))
            out.append("<table><tr><th>status</th><th>body</th><th>meaning</th></tr>")
            for status, response in op["responses"].items():
                content = response.get("content", {})
                name = _ref_name(content)
                body_cell = _anchor(name) if name else e(", ".join(content))
                out.append(
                    "<tr><td>%s</td><td>%s</td><td>%s</td></tr>"
                    % (e(status), body_cell, e(response.get("description", "")))
                )
            out.append("</table>")
    out.append("<h2>Schemas</h2>")
    for name, schema in doc["components"]["schemas"].items():
        out.append("<h3 id='schema-%s'>%s</h3>" % (e(name), e(name)))
        out.append("<pre>%s</pre>" % e(json.dumps(schema, indent=2, ensure_ascii=False)))
    out.append("</body></html>")
    return "\n".join(out)
