"""`Router`: several bundles behind one `predict`, each request sent to the checkpoint that fits.

laya 0.4.15's `laya.Router` semantics (core.md §8) over ONNX bundles instead of Hub checkpoints:

* Names. `english`, `multilingual` and `typed-decisions` always exist, with laya's aliases
  (`laya_onnx.core.names`); more may be registered (`[a-z0-9][a-z0-9._-]*`, never `auto`). A name is
  served by a bundle: a directory `laya-onnx export` wrote, or a bundle on the Hub
  (`org/name[/subfolder]`). `Router("models/")` registers every bundle folder of a models
  directory under its folder's name (`laya-onnx export --all -o models/` writes one).
* Routing, first match wins: `model=` > `task=` > the typed-decisions workflow of the question
  ids (only with `auto_task_detection=True`) > `lang=` > `lang_guess` (per call, then the
  Router's) > language detection (`laya_onnx.core.lang.analyse`) > `default`. The decision is the
  `routing` block of every answer, keys in laya's order, reasons in laya's words.
* Lifecycle. Bundles load on first use; at most `max_loaded` stay resident (least recently used
  evicted); `preload` raises the cap to hold what it loads; `on_load` / `on_evict` / `on_route`
  hooks see it happen.

Torch-free: the agents are `ONNXAgent`s; nothing here imports torch, transformers or aiohttp.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from laya_onnx.core.bundle import GRAPH_FILE, bundle_origin, read_manifest_quietly
from laya_onnx.core.errors import InvalidRequest, InvalidRequestType
from laya_onnx.core.gate import apply_confidence_gate, check_min_confidence
from laya_onnx.core.hooks import (
    HookRegistry,
    PredictContext,
    aggregate_usage,
    call_lifecycle,
    compose_hooks,
    dispatch,
    normalise_hooks,
    skipping_default_hooks,
    validate_timeout,
)
from laya_onnx.core.lang import analyse, english_from_code, route_detection
from laya_onnx.core.names import ALIASES, BUNDLE_REPO, PUBLISHED_CHECKPOINTS, canonical_name

BUILTIN_NAMES = tuple(PUBLISHED_CHECKPOINTS)
ENGLISH, MULTILINGUAL, TYPED_DECISIONS = BUILTIN_NAMES
DEFAULT_CHECKPOINT = MULTILINGUAL
DEFAULT_MAX_LOADED = 2

#: Question-id sets of the four workflows typed-decisions was fine-tuned on (laya router.py).
TYPED_DECISION_WORKFLOWS: dict[str, frozenset[str]] = {
    "agent_trace_observability": frozenset({"action", "needs_review", "outcome", "risk", "urgency"}),
    "customer_service": frozenset({"action", "category", "churn_risk", "needs_human", "urgency"}),
    "invoice_processing": frozenset(
        {"discrepancy_severity", "disposition", "duplicate", "matches_order", "urgency"}
    ),
    "security_incidents": frozenset(
        {"credential_compromise", "disposition", "severity", "true_positive", "urgency"}
    ),
}

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
Source = str | os.PathLike | tuple | list | None


class RouteDecision(dict):
    """Which checkpoint answers and why; a dict, so it serialises into the answer as it is."""

    @property
    def model(self) -> str:
        return self["model"]

    @property
    def reason(self) -> str:
        return self["reason"]

    def __repr__(self) -> str:
        return "RouteDecision(model=%r, reason=%r)" % (self["model"], self["reason"])


def published_location(name: str) -> str:
    """Where laya publishes a built-in checkpoint, as its Router names it (`org/repo[/sub]`)."""
    repo, sub = PUBLISHED_CHECKPOINTS[name][0]
    return "%s/%s" % (repo, sub) if sub else repo


def match_typed_decisions_workflow(questions: Any) -> str | None:
    """The workflow whose question ids are exactly these, else None (a lone 'urgency' is not one)."""
    ids = set(questions or {})
    for workflow, signature in TYPED_DECISION_WORKFLOWS.items():
        if ids == signature:
            return workflow
    return None


def question_schema(questions: Any) -> str:
    """Order-sensitive text of a question set: requests with equal text share a forward pass
    (options are positional, so the same options in another order must not)."""
    return json.dumps(questions, sort_keys=False, ensure_ascii=False, default=str)


def _osa_distance(a: str, b: str) -> int:
    """Edits from `a` to `b`: insert, delete, substitute, or swap two adjacent letters."""
    prev2: list[int] | None = None
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i]
        for j in range(1, len(b) + 1):
            best = min(cur[j - 1] + 1, prev[j] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if prev2 is not None and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                best = min(best, prev2[j - 2] + 1)
            cur.append(best)
        prev2, prev = prev, cur
    return prev[-1]


def near_builtin(key: str) -> str | None:
    """The built-in name one edit from `key` (a likely typo), else None."""
    for name in BUILTIN_NAMES:
        if abs(len(key) - len(name)) <= 1 and _osa_distance(key, name) == 1:
            return name
    return None


def is_bundle_dir(path: Path) -> bool:
    return (path / GRAPH_FILE).is_file()


def bundles_in(models_dir: str | os.PathLike) -> dict[str, Path]:
    """{name: bundle folder} for every bundle folder directly under `models_dir`, by folder name
    (trimmed, lowercased, alias resolved); folders that hold no bundle are not checkpoints."""
    root = Path(models_dir)
    if not root.is_dir():
        raise FileNotFoundError("models directory %r does not exist" % os.fspath(models_dir))
    found: dict[str, Path] = {}
    for child in sorted(root.iterdir()):
        if not (child.is_dir() and is_bundle_dir(child)):
            continue
        key = canonical_name(child.name)
        if key in found:
            raise InvalidRequest(
                "models directory %r has two bundles for %r: %r and %r"
                % (os.fspath(root), key, found[key].name, child.name)
            )
        found[key] = child
    if not found:
        raise FileNotFoundError(
            "models directory %r holds no bundle (a folder with %s); write one with "
            "'laya-onnx export --all -o %s'" % (os.fspath(root), GRAPH_FILE, os.fspath(root))
        )
    return found


def _source_text(source: Source) -> str | None:
    if source is None:
        return None
    if isinstance(source, (tuple, list)):
        repo, sub = (list(source) + [None])[:2]
        return "%s/%s" % (repo, sub) if sub else str(repo)
    return os.fspath(source)


class _Build:
    """One in-flight load of a checkpoint: concurrent callers wait on it instead of building twice."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None


class Router(HookRegistry):
    """Load bundles lazily and send each request to the one that fits (module docstring).

    >>> router = Router("models/")                                    # doctest: +SKIP
    >>> router.predict({"message": "Mein Konto wurde zweimal belastet"}, questions)  # doctest: +SKIP

    `models`: a models directory, or {name: bundle} (a folder, a Hub id of a bundle, or a
    `(repo, subfolder)` pair). `agent_kwargs` reach every `ONNXAgent` built (e.g.
    `lang_temperatures`, `threads`, `max_pass_memory`); `providers`, `revision`/`revisions` and
    `token` are the Router's own. `agent_factory(source, name, **kwargs)` replaces `ONNXAgent`.
    """

    hooks_raise = True
    hooks_timeout: float | None = None
    _hooks_lock: Any = None

    def __init__(
        self,
        models: str | os.PathLike | Mapping[str, Source] | None = None,
        *,
        providers: Sequence[Any] | None = None,
        token: str | None = None,
        revision: str | None = None,
        revisions: Mapping[str, str | None] | None = None,
        max_loaded: int = DEFAULT_MAX_LOADED,
        default: str = DEFAULT_CHECKPOINT,
        auto_task_detection: bool = False,
        preload: bool | Sequence[str] = False,
        lang_guess: Any = None,
        hooks: Any = None,
        on_predict_start: Any = None,
        on_predict_end: Any = None,
        hooks_raise: bool = True,
        hooks_concurrent: bool = True,
        hooks_timeout: float | None = None,
        agent_kwargs: Mapping[str, Any] | None = None,
        agent_factory: Callable[..., Any] | None = None,
    ):
        self.hooks = normalise_hooks(hooks, on_predict_start, on_predict_end)
        self.hooks_raise = bool(hooks_raise)
        self.hooks_timeout = validate_timeout(hooks_timeout)
        self._hooks_lock = None if hooks_concurrent else threading.RLock()
        self._hooks_mutex = threading.Lock()
        #: name -> bundle source; the built-in names exist even without one (then they cannot load).
        self.models: dict[str, Source] = dict.fromkeys(BUILTIN_NAMES)
        if isinstance(models, (str, os.PathLike)):
            models = bundles_in(models)
        for name, source in (models or {}).items():
            self._add(name, source)
        self.providers = list(providers) if providers is not None else None
        self.token = token
        self.revision = revision
        self.revisions = {self.resolve(k): v for k, v in (revisions or {}).items()}
        self.agent_kwargs = dict(agent_kwargs or {})
        self._factory = agent_factory
        if isinstance(max_loaded, bool) or not isinstance(max_loaded, int):
            raise InvalidRequestType("max_loaded must be an integer, got %r" % (max_loaded,))
        self.max_loaded = max(1, max_loaded)
        self.default = self.resolve(default)
        self.auto_task_detection = bool(auto_task_detection)
        self.lang_guess = lang_guess
        self._agents: dict[str, Any] = {}
        self._order: list[str] = []  # least recently used first
        # `_lock` guards the tables and is never held while a bundle loads; `_build_lock` lets
        # one bundle load at a time (peak memory); `_loading` lets callers of the same name wait.
        self._lock = threading.RLock()
        self._build_lock = threading.Lock()
        self._loading: dict[str, _Build] = {}
        #: Seconds the last load of each name took (what a server logs as its cold start).
        self.load_seconds: dict[str, float] = {}
        if preload:
            self.preload(None if preload is True else list(preload))

    # -- names ----------------------------------------------------------------------------------
    def resolve(self, name: Any) -> str:
        """The canonical name of a checkpoint this Router knows (built-in, alias or registered)."""
        key = canonical_name(name)
        if key in self.models:
            return key
        raise InvalidRequest(
            "unknown model %r; choose one of %s (or an alias: %s)"
            % (name, sorted(self.models), sorted(ALIASES))
        )

    def _add(self, name: Any, source: Source) -> str:
        key = canonical_name(name)
        if key not in BUILTIN_NAMES:
            if not isinstance(name, str) or not _NAME_RE.match(key):
                raise InvalidRequest(
                    "invalid checkpoint name %r: use lowercase letters, digits, '.', '_' or '-', "
                    "starting with a letter or digit" % (name,)
                )
            if key == "auto":
                raise InvalidRequest(
                    "invalid checkpoint name %r: 'auto' means automatic routing in every model= argument"
                    % (name,)
                )
        if source is not None and not isinstance(source, (str, os.PathLike, tuple, list)):
            raise InvalidRequestType(
                "checkpoint source for %r must be a bundle directory, a Hub id or a (repo, subfolder) "
                "pair, got %s" % (name, type(source).__name__)
            )
        if isinstance(source, str) and source.startswith("~"):
            source = os.path.expanduser(source)
        if key not in BUILTIN_NAMES:
            near = near_builtin(key)
            if near is not None:
                warnings.warn(
                    "laya: checkpoint name %r is one edit from the built-in %r; it is registered "
                    "as a separate checkpoint and %r is unchanged." % (key, near, near),
                    RuntimeWarning,
                    stacklevel=3,
                )
        self.models[key] = source
        return key

    def register(self, name: str, source: Source) -> str:
        """Serve `source` under `name` (replacing and unloading what that name served)."""
        with self._lock:
            before = self.models.get(canonical_name(name), _MISSING)
            key = self._add(name, source)
        if before is not _MISSING and before != source:
            self._dispatch_lifecycle("on_evict", self._unload_key(key))
        return key

    def repo(self, name: str) -> str | None:
        """What `routing.repo` says for `name`: its bundle's Hub origin, else its folder's name
        (never an absolute path), else laya's published location of a built-in without a bundle."""
        with self._lock:
            source = self.models.get(name)
            agent = self._agents.get(name)
        bundle = getattr(agent, "bundle", None)
        if bundle is not None:
            return bundle_origin(bundle.manifest, bundle.root)
        if source is None:
            return published_location(name) if name in BUILTIN_NAMES else None
        text = _source_text(source) or ""
        if os.path.isdir(text):
            return bundle_origin(read_manifest_quietly(Path(text)), Path(text))
        return text

    # -- lifecycle ------------------------------------------------------------------------------
    def load(self, name: str) -> Any:
        """The agent serving `name`, loading its bundle on first use (one load per name at a time)."""
        key = self.resolve(name)
        while True:
            with self._lock:
                if key in self._agents:
                    self._touch(key)
                    return self._agents[key]
                build = self._loading.get(key)
                if build is None:
                    build = self._loading[key] = _Build()
                    break
            build.done.wait()
            if build.error is not None:
                raise build.error
        evicted: list[str] = []
        try:
            with self._build_lock:
                with self._lock:
                    agent = self._agents.get(key)
                if agent is None:
                    started = time.perf_counter()
                    built = self._build(key)
                    self.load_seconds[key] = time.perf_counter() - started
                    with self._lock:
                        agent = self._agents.setdefault(key, built)
                        self._touch(key)
                        evicted = self._evict_locked()
        except BaseException as exc:
            build.error = exc
            raise
        finally:
            with self._lock:
                if self._loading.get(key) is build:
                    del self._loading[key]
            build.done.set()
        self._dispatch_lifecycle("on_evict", evicted)
        self._dispatch(
            compose_hooks(self.hooks),
            "on_load",
            PredictContext(states=[], questions={}, model=key, agent=agent, router=self),
        )
        return agent

    def _build(self, key: str) -> Any:
        with self._lock:
            source = self.models.get(key)
            if source is None:
                raise InvalidRequest(
                    "checkpoint %r has no bundle to load from; export one "
                    "('laya-onnx export --all -o MODELS_DIR') or register it with a bundle path" % key
                )
            kwargs: dict[str, Any] = dict(self.agent_kwargs)
            if self.providers is not None:
                kwargs["providers"] = self.providers
            revision = _pin(self.revisions.get(key)) or _pin(self.revision)
            if revision is not None:
                kwargs["revision"] = revision
            if self.token is not None:
                kwargs["token"] = self.token
        where = os.fspath(source) if isinstance(source, (str, os.PathLike)) else str(_source_text(source))
        if self._factory is not None:
            return self._factory(where, name=key, **kwargs)
        from laya_onnx.core.agent import ONNXAgent

        return ONNXAgent(where, name=key, **kwargs)

    def _touch(self, key: str) -> None:
        if key in self._order:
            self._order.remove(key)
        self._order.append(key)

    def _evict_locked(self) -> list[str]:
        evicted = []
        while len(self._order) > self.max_loaded:
            victim = self._order.pop(0)
            if self._agents.pop(victim, None) is not None:
                evicted.append(victim)
        return evicted

    def _dispatch(self, hooks: list[Any], event: str, ctx: PredictContext, raise_errors=None, timeout=None):
        dispatch(
            hooks,
            event,
            ctx,
            raise_errors=self.hooks_raise if raise_errors is None else raise_errors,
            lock=self._hooks_lock,
            timeout=self.hooks_timeout if timeout is None else timeout,
        )

    def _dispatch_lifecycle(self, event: str, names: list[str]) -> None:
        for name in names:
            self._dispatch(
                compose_hooks(self.hooks),
                event,
                PredictContext(states=[], questions={}, model=name, router=self),
            )

    def attach(self, name: str, agent: Any) -> Any:
        """Serve an agent built elsewhere under `name` (registered without a source if new)."""
        with self._lock:
            try:
                key = self.resolve(name)
            except InvalidRequest:
                key = self._add(name, None)
            self._agents[key] = agent
            self._touch(key)
            self.max_loaded = max(self.max_loaded, len(self._agents))
        return agent

    def preload(self, names: Sequence[str] | None = None) -> Router:
        """Load `names` (default: every name with a bundle) now, raising `max_loaded` to hold them
        and whatever is resident already."""
        with self._lock:
            if names is None:
                names = [n for n, source in self.models.items() if source is not None]
            keys = [self.resolve(n) for n in names]
            self.max_loaded = max(self.max_loaded, len(set(keys) | set(self._agents)))
        for key in keys:
            self.load(key)
        return self

    def _unload_key(self, key: str) -> list[str]:
        while True:
            with self._lock:
                build = self._loading.get(key)
                if build is None:
                    agent = self._agents.pop(key, None)
                    if key in self._order:
                        self._order.remove(key)
                    return [key] if agent is not None else []
            build.done.wait()

    def unload(self, name: str | None = None) -> None:
        """Free one checkpoint, or every one (waiting for a load of it in flight)."""
        if name is not None:
            freed = self._unload_key(self.resolve(name))
        else:
            while True:
                with self._lock:
                    pending = list(self._loading.values())
                    if not pending:
                        freed = list(self._order)
                        self._agents.clear()
                        self._order.clear()
                        break
                for build in pending:
                    build.done.wait()
        self._dispatch_lifecycle("on_evict", freed)

    @property
    def loaded(self) -> list[str]:
        """Resident names, least recently used first."""
        with self._lock:
            return list(self._order)

    def resident(self) -> dict[str, Any]:
        """{name: agent} for the resident checkpoints, without touching the LRU order."""
        with self._lock:
            return {name: self._agents[name] for name in self._order if name in self._agents}

    @property
    def loaded_revisions(self) -> dict[str, str | None]:
        return {name: getattr(agent, "revision", None) for name, agent in self.resident().items()}

    # -- routing --------------------------------------------------------------------------------
    def _hint(self, hint: Any, state: Any) -> bool | None:
        if hint is None:
            return None
        if callable(hint):
            hint = hint(state)
        return english_from_code(hint)

    def _decision(self, model: str, reason: str, detection: Any, workflow: Any) -> RouteDecision:
        return RouteDecision(
            model=model, repo=self.repo(model), reason=reason, detection=detection, workflow=workflow
        )

    def _route(
        self, state: Any, questions: Any, model=None, task=None, lang=None, lang_guess=None, explain=False
    ) -> RouteDecision:
        """The decision alone: nothing is loaded or run (precedence in the module docstring)."""
        if model is not None:
            return self._decision(self.resolve(model), "explicit model=%r" % (model,), None, None)
        if task is not None:
            typed = str(task).lower().replace("-", "_") == "typed_decisions"
            key = self.resolve(TYPED_DECISIONS if typed else task)
            return self._decision(key, "explicit task=%r" % (task,), None, None)
        workflow = match_typed_decisions_workflow(questions)
        if workflow and self.auto_task_detection:
            reason = "question ids match the %r typed-decisions workflow" % workflow
            return self._decision(TYPED_DECISIONS, reason, None, workflow)
        if lang is not None:
            english = english_from_code(lang)
            if english is not None:
                key = ENGLISH if english else MULTILINGUAL
                return self._decision(key, "explicit lang=%r" % (lang,), None, workflow)
        for where, hint in (("lang_guess", lang_guess), ("Router(lang_guess=...)", self.lang_guess)):
            english = self._hint(hint, state)
            if english is not None:
                reason = "%s: the caller identified this as %s text" % (
                    where,
                    "English" if english else "non-English",
                )
                return self._decision(ENGLISH if english else MULTILINGUAL, reason, None, workflow)
        det = analyse(state, explain=True) if explain else analyse(state)
        key, reason = route_detection(det, self.default)
        return self._decision(key, reason, det, workflow)

    def route(
        self,
        state: Any,
        questions: Any = None,
        model: Any = None,
        task: Any = None,
        lang: Any = None,
        lang_guess: Any = None,
        hooks: Any = None,
        hooks_raise: bool | None = None,
        hooks_timeout: float | None = None,
        *,
        explain: bool = False,
    ) -> Any:
        """Decide the checkpoint; `on_route` hooks see `ctx.decision` and may replace it."""
        if questions is not None and not isinstance(questions, dict):
            raise InvalidRequestType(
                "questions must be a dict of question id -> definition, got %s" % type(questions).__name__
            )
        decision = self._route(state, questions, model, task, lang, lang_guess, explain)
        ctx = PredictContext(states=[state], questions=questions or {}, decision=decision, router=self)
        self._dispatch(
            compose_hooks(self.hooks, hooks),
            "on_route",
            ctx,
            raise_errors=hooks_raise,
            timeout=None if hooks_timeout is None else validate_timeout(hooks_timeout),
        )
        return ctx.decision

    def route_batch(
        self,
        requests: Sequence[dict[str, Any]],
        hooks_timeout: float | None = None,
        *,
        hooks: Any = None,
        hooks_raise: bool | None = None,
        explain: bool = False,
    ) -> list[Any]:
        """Route every request of a batch (in order) without loading anything."""
        if not isinstance(requests, Sequence) or isinstance(requests, (str, bytes)):
            raise InvalidRequestType("requests must be a sequence of request dictionaries")
        decisions = []
        for i, request in enumerate(requests):
            if not isinstance(request, dict):
                raise InvalidRequestType("request %d must be a dict, got %s" % (i, type(request).__name__))
            if "state" not in request:
                raise InvalidRequest("request %d is missing required key 'state'" % i)
            if request["state"] is None:
                raise InvalidRequestType(
                    "request %d 'state' must not be None; pass a string, dict, or list" % i
                )
            if "questions" not in request:
                raise InvalidRequest("request %d is missing required key 'questions'" % i)
            if not isinstance(request["questions"], dict):
                raise InvalidRequestType(
                    "request %d 'questions' must be a dict, got %s" % (i, type(request["questions"]).__name__)
                )
            decisions.append(
                self.route(
                    request["state"],
                    request["questions"],
                    model=request.get("model"),
                    task=request.get("task"),
                    lang=request.get("lang"),
                    lang_guess=request.get("lang_guess"),
                    hooks=hooks,
                    hooks_raise=hooks_raise,
                    hooks_timeout=hooks_timeout,
                    explain=explain,
                )
            )
        return decisions

    # -- answering ------------------------------------------------------------------------------
    def predict(
        self,
        state: Any,
        questions: dict[Any, Any],
        model: Any = None,
        task: Any = None,
        lang: Any = None,
        lang_guess: Any = None,
        hooks: Any = None,
        on_predict_start: Any = None,
        on_predict_end: Any = None,
        hooks_raise: bool | None = None,
        hooks_timeout: float | None = None,
        max_len: int | None = None,
        head_max_len: int | None = None,
        min_confidence: Any = None,
    ) -> dict[str, Any]:
        """Route, then answer on the chosen checkpoint; the result gains `routing` (last key).

        Router-level start/end hooks wrap route + inference and see `ctx.decision`.
        """
        return self._answer(
            state,
            questions,
            dict(model=model, task=task, lang=lang, lang_guess=lang_guess),
            compose_hooks(self.hooks, hooks, on_predict_start, on_predict_end),
            hooks,
            hooks_raise,
            hooks_timeout,
            max_len=max_len,
            head_max_len=head_max_len,
            min_confidence=min_confidence,
        )

    system_one = predict

    def _answer(
        self,
        state: Any,
        questions: Any,
        routing: dict[str, Any],
        active: list[Any],
        call_hooks: Any,
        hooks_raise: bool | None,
        hooks_timeout: float | None,
        *,
        max_len: int | None = None,
        head_max_len: int | None = None,
        min_confidence: Any = None,
        scan: Callable[[PredictContext, Any], dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """`predict`'s body; `scan(ctx, lang)` replaces the one-window answer (`predict_long`)."""
        if state is None:
            raise InvalidRequestType("state must not be None; pass a string, dict, or list")
        if not isinstance(questions, dict):
            raise InvalidRequestType(
                "questions must be a dict of question id -> definition, got %s" % type(questions).__name__
            )
        mc = check_min_confidence(min_confidence) if min_confidence is not None else None
        raise_errors = self.hooks_raise if hooks_raise is None else bool(hooks_raise)
        timeout = self.hooks_timeout if hooks_timeout is None else validate_timeout(hooks_timeout)
        ctx = PredictContext(
            states=[state], questions=questions, router=self, max_len=max_len, head_max_len=head_max_len
        )

        def fire(event: str) -> None:
            self._dispatch(active, event, ctx, raise_errors=raise_errors, timeout=timeout)

        with call_lifecycle(ctx, fire, partial(apply_confidence_gate, mc=mc)):
            decision = self.route(
                state,
                questions,
                **routing,
                hooks=call_hooks,
                hooks_raise=hooks_raise,
                hooks_timeout=hooks_timeout,
            )
            ctx.decision = dict(decision)
            ctx.model = decision["model"]
            ctx.agent = agent = self.load(decision["model"])
            lang = routing["lang"]
            if lang is None:
                lang = (decision.get("detection") or {}).get("language") or None
            ctx.started_at = time.perf_counter()
            fire("on_predict_start")
            if ctx.results is None:
                with skipping_default_hooks():
                    if scan is not None:
                        result = scan(ctx, lang)
                    else:
                        budgets = {
                            k: v
                            for k, v in (("max_len", ctx.max_len), ("head_max_len", ctx.head_max_len))
                            if v is not None
                        }
                        result = agent.predict(ctx.states[0], ctx.questions, lang=lang, **budgets)
                if scan is not None:
                    result.setdefault("routing", dict(decision))
                else:
                    result["routing"] = dict(decision)
                ctx.results = [result]
            else:  # a start hook answered: the answer still says where it was routed
                for result in ctx.results:
                    if isinstance(result, dict):
                        result.setdefault("routing", dict(decision))
        return ctx.results[0]

    def predict_long(
        self,
        state: Any,
        questions: dict[Any, Any],
        model: Any = None,
        task: Any = None,
        lang: Any = None,
        lang_guess: Any = None,
        window: int | None = None,
        stride: int | None = None,
        aggregate: str = "auto",
        batch_size: int | None = None,
        hooks: Any = None,
        on_predict_start: Any = None,
        on_predict_end: Any = None,
        hooks_raise: bool | None = None,
        hooks_timeout: float | None = None,
    ) -> dict[str, Any]:
        """Route as `predict` does, then scan every window of the state with the routed agent's
        `predict_long`; the scan runs after the start hooks, so a hook that answers wins."""

        def scan(ctx: PredictContext, detected_lang: Any) -> dict[str, Any]:
            long = getattr(ctx.agent, "predict_long", None)
            if long is None:
                raise InvalidRequestType(
                    "%s has no predict_long, so a state longer than its window cannot be scanned; "
                    "the PyTorch Agent and ONNXAgent implement it, and an agent attached by hand needs "
                    "it too" % type(ctx.agent).__name__
                )
            return long(
                ctx.states[0],
                ctx.questions,
                window=window,
                stride=stride,
                aggregate=aggregate,
                batch_size=batch_size,
                lang=detected_lang,
            )

        per_call = normalise_hooks(hooks, on_predict_start, on_predict_end)
        return self._answer(
            state,
            questions,
            dict(model=model, task=task, lang=lang, lang_guess=lang_guess),
            compose_hooks(self.hooks, per_call),
            per_call,
            hooks_raise,
            hooks_timeout,
            scan=scan,
        )

    def decide(
        self,
        state: Any,
        schema: Any = None,
        *,
        questions: dict[Any, Any] | None = None,
        return_details: bool = False,
        min_confidence: Any = None,
        **predict_kwargs: Any,
    ) -> Any:
        """Typed values for `state` against a JSON schema or pydantic model (`laya_onnx.core.structured`),
        routed as `predict` routes (`model=`, `task=`, `lang=`... are forwarded to it)."""
        from laya_onnx.core.structured import decide

        return decide(
            self,
            state,
            schema,
            questions=questions,
            return_details=return_details,
            min_confidence=min_confidence,
            **predict_kwargs,
        )

    def decide_batch(
        self,
        states: Sequence[Any],
        schema: Any = None,
        *,
        questions: dict[Any, Any] | None = None,
        return_details: bool = False,
        min_confidence: Any = None,
        **predict_kwargs: Any,
    ) -> list[Any]:
        from laya_onnx.core.structured import decide_batch

        return decide_batch(
            self,
            states,
            schema,
            questions=questions,
            return_details=return_details,
            min_confidence=min_confidence,
            **predict_kwargs,
        )

    def predict_batch(
        self,
        requests: Sequence[dict[str, Any]],
        batch_size: int | None = None,
        hooks_timeout: float | None = None,
        min_confidence: Any = None,
        sort_by_length: bool = False,
        *,
        hooks: Any = None,
        on_predict_start: Any = None,
        on_predict_end: Any = None,
        hooks_raise: bool | None = None,
    ) -> list[dict[str, Any]]:
        """Route a heterogeneous batch; run it grouped by checkpoint, then by question set, token
        budgets and (for an agent with per-language temperatures) language; results in input order.

        Each request is `{"state", "questions"}` plus optional `model`, `task`, `lang`,
        `lang_guess`, `max_len`, `head_max_len`. Start hooks run per request before grouping, end
        hooks in reverse start order per checkpoint group.
        """
        mc = check_min_confidence(min_confidence) if min_confidence is not None else None
        decisions = self.route_batch(requests, hooks_timeout, hooks=hooks, hooks_raise=hooks_raise)
        groups: dict[str, list[int]] = {}
        for i, decision in enumerate(decisions):
            groups.setdefault(self.resolve(decision["model"]), []).append(i)
        active = compose_hooks(self.hooks, hooks, on_predict_start, on_predict_end)
        raise_errors = self.hooks_raise if hooks_raise is None else bool(hooks_raise)
        timeout = self.hooks_timeout if hooks_timeout is None else validate_timeout(hooks_timeout)
        results: list[Any] = [None] * len(decisions)
        for name, indices in groups.items():
            agent = self.load(name)
            started: list[PredictContext] = []
            try:
                for i in indices:
                    ctx = PredictContext(
                        states=[requests[i]["state"]],
                        questions=requests[i]["questions"],
                        decision=dict(decisions[i]),
                        model=name,
                        agent=agent,
                        router=self,
                        max_len=requests[i].get("max_len"),
                        head_max_len=requests[i].get("head_max_len"),
                    )
                    started.append(ctx)
                    self._dispatch(
                        active, "on_predict_start", ctx, raise_errors=raise_errors, timeout=timeout
                    )
                for items, kwargs in self._passes(agent, indices, started, requests, decisions):
                    if sort_by_length:
                        kwargs["sort_by_length"] = True
                    with skipping_default_hooks():
                        answers = agent.predict_batch(
                            [ctx.states[0] for _, ctx in items],
                            items[0][1].questions,
                            batch_size=batch_size,
                            **kwargs,
                        )
                    if len(answers) != len(items):
                        raise RuntimeError(
                            "internal error: predict_batch returned %d results for %d states"
                            % (len(answers), len(items))
                        )
                    for (i, ctx), result in zip(items, answers, strict=True):
                        result["routing"] = dict(decisions[i])
                        ctx.results = [result]
                for ctx in started:
                    ctx.usage = aggregate_usage(ctx.results or [])
            except BaseException as exc:
                for ctx in started:
                    if ctx.results:
                        apply_confidence_gate(ctx.results, mc)
                self._end(active, started, raise_errors, timeout, exc)
                raise
            for ctx in started:
                if ctx.results:
                    apply_confidence_gate(ctx.results, mc)
            self._end(active, started, raise_errors, timeout)
            for i, ctx in zip(indices, started, strict=True):
                results[i] = ctx.results[0] if ctx.results else None
        return results

    predict_many = predict_batch

    @staticmethod
    def _passes(agent, indices, started, requests, decisions):
        """[(items, kwargs)]: the started requests no hook answered, grouped by what one
        `agent.predict_batch` call shares (question set, token budgets, language)."""
        per_language = bool(getattr(getattr(agent, "calibration", None), "lang_temperatures", None))
        groups: dict[tuple, tuple[list, dict]] = {}
        for i, ctx in zip(indices, started, strict=True):
            if ctx.results is not None:  # answered by a start hook
                for result in ctx.results:
                    if isinstance(result, dict):
                        result.setdefault("routing", dict(decisions[i]))
                continue
            kwargs = {
                k: v
                for k, v in (("max_len", ctx.max_len), ("head_max_len", ctx.head_max_len))
                if v is not None
            }
            lang = None
            if per_language:
                lang = requests[i].get("lang")
                if lang is None:
                    lang = (decisions[i].get("detection") or {}).get("language")
                if lang is not None:
                    kwargs["lang"] = lang
            key = (question_schema(ctx.questions), ctx.max_len, ctx.head_max_len, lang)
            groups.setdefault(key, ([], kwargs))[0].append((i, ctx))
        return list(groups.values())

    def _end(self, active, contexts, raise_errors, timeout, error: BaseException | None = None) -> None:
        """End a checkpoint group's requests in reverse start order; each gets its end hook even
        when another's raises (the first such failure is raised afterwards)."""
        now = time.perf_counter()
        for ctx in contexts:
            ctx.elapsed_ms = (now - ctx.started_at) * 1000.0
            if error is not None:
                ctx.error = error
        first: BaseException | None = None
        for ctx in reversed(contexts):
            events = ("on_error", "on_predict_end") if ctx.error is not None else ("on_predict_end",)
            for event in events:
                try:
                    self._dispatch(active, event, ctx, raise_errors=raise_errors, timeout=timeout)
                except BaseException as hook_exc:
                    if ctx.error is not None:
                        ctx.error.__context__ = hook_exc
                    elif first is None:
                        first = hook_exc
        if first is not None:
            raise first

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.unload()

    def __repr__(self) -> str:
        return "Router(loaded=%s, max_loaded=%d, default=%r)" % (self.loaded, self.max_loaded, self.default)


_MISSING = object()


def _pin(value: Any) -> str | None:
    return value if value is not None and str(value).strip() else None


__all__ = [
    "BUILTIN_NAMES",
    "BUNDLE_REPO",
    "DEFAULT_CHECKPOINT",
    "RouteDecision",
    "Router",
    "TYPED_DECISION_WORKFLOWS",
    "bundles_in",
    "match_typed_decisions_workflow",
    "question_schema",
]
