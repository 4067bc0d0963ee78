"""`Router`: several bundles behind one `predict`, each request sent to the checkpoint that fits.

laya 0.4.15's `laya.Router` semantics (docs/semantics.md#routing) over ONNX bundles instead of Hub
checkpoints, in four jobs, one module each: the names (`registry`), the loaded checkpoints (`pool`),
the routing policy (`policy`) and the answers with their hook lifecycle (`answering`). This class is
their public face, with laya's signatures.

Lifecycle: bundles load on first use; at most `max_loaded` stay resident (least recently used
evicted); `preload` raises the cap to hold what it loads; `on_load` / `on_evict` / `on_route`
hooks see it happen.

Torch-free: the agents are `ONNXAgent`s; nothing here imports torch, transformers or aiohttp.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from laya_onnx.core.errors import InvalidRequest
from laya_onnx.core.hooks import HookRegistry, PredictContext
from laya_onnx.core.options import CallOptions
from laya_onnx.core.router import answering, policy
from laya_onnx.core.router.pool import DEFAULT_MAX_LOADED, Pool
from laya_onnx.core.router.registry import DEFAULT_CHECKPOINT, Registry, Source, source_text


class Router(HookRegistry):
    """Load bundles lazily and send each request to the one that fits (module docstring).

    >>> router = Router("models/")                                    # doctest: +SKIP
    >>> router.predict({"message": "Mein Konto wurde zweimal belastet"}, questions)  # doctest: +SKIP

    `models`: a models directory, or {name: bundle} (a folder, a Hub id of a bundle, or a
    `(repo, subfolder)` pair). `agent_kwargs` reach every `ONNXAgent` built (e.g.
    `lang_temperatures`, `threads`, `max_pass_memory`); `providers`, `revision`/`revisions` and
    `token` are the Router's own. `agent_factory(source, name, **kwargs)` replaces `ONNXAgent`.
    """

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
        self._install_hooks(
            hooks, on_predict_start, on_predict_end, hooks_raise, hooks_concurrent, hooks_timeout
        )
        self._names = Registry()
        self._names.add_all(models, stacklevel=2)
        self.providers = list(providers) if providers is not None else None
        self.token = token
        self.revision = revision
        self.revisions = {self.resolve(k): v for k, v in (revisions or {}).items()}
        self.agent_kwargs = dict(agent_kwargs or {})
        self._factory = agent_factory
        self._pool = Pool(self._build, self._notify, max_loaded)
        self.default = self.resolve(default)
        self.auto_task_detection = bool(auto_task_detection)
        self.lang_guess = lang_guess
        if preload:
            self.preload(None if preload is True else list(preload))

    # -- names ----------------------------------------------------------------------------------
    @property
    def models(self) -> dict[str, Source]:
        """name -> bundle source (None: a built-in name with no bundle to load)."""
        return self._names.models

    def resolve(self, name: Any) -> str:
        """The canonical name of a checkpoint this Router knows (built-in, alias or registered)."""
        return self._names.resolve(name)

    def register(self, name: str, source: Source) -> str:
        """Serve `source` under `name` (replacing and unloading what that name served)."""
        key, replaced = self._names.add(name, source, stacklevel=2)
        if replaced:
            self._pool.unload(key)
        return key

    def repo(self, name: str) -> str | None:
        """What `routing.repo` says for `name`: its bundle's Hub origin, else its folder's name
        (never an absolute path), else laya's published location of a built-in without a bundle."""
        return self._names.origin(name, self._pool.peek(name))

    # -- loaded checkpoints ---------------------------------------------------------------------
    @property
    def max_loaded(self) -> int:
        return self._pool.max_loaded

    @max_loaded.setter
    def max_loaded(self, value: int) -> None:
        self._pool.max_loaded = value

    @property
    def load_seconds(self) -> dict[str, float]:
        """Seconds the last load of each name took (what a server logs as its cold start)."""
        return self._pool.load_seconds

    def load(self, name: str) -> Any:
        """The agent serving `name`, loading its bundle on first use (one load per name at a time)."""
        return self._pool.get(self.resolve(name))

    def _build(self, key: str) -> Any:
        source = self._names.source(key)
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
        where = os.fspath(source) if isinstance(source, (str, os.PathLike)) else str(source_text(source))
        if self._factory is not None:
            return self._factory(where, name=key, **kwargs)
        from laya_onnx.core.agent import ONNXAgent

        return ONNXAgent(where, name=key, **kwargs)

    def _notify(self, event: str, name: str, agent: Any) -> None:
        """`on_load` / `on_evict` for the installed hooks (and the process defaults)."""
        ctx = PredictContext(states=[], questions={}, model=name, agent=agent, router=self)
        CallOptions.resolve(self).fire(event, ctx)

    def attach(self, name: str, agent: Any) -> Any:
        """Serve an agent built elsewhere under `name` (registered without a source if new)."""
        try:
            key = self.resolve(name)
        except InvalidRequest:
            key, _ = self._names.add(name, None, stacklevel=2)
        self._pool.attach(key, agent)
        return agent

    def preload(self, names: Sequence[str] | None = None) -> Router:
        """Load `names` (default: every name with a bundle) now, raising `max_loaded` to hold them
        and whatever is resident already."""
        keys = [self.resolve(n) for n in (self._names.with_bundles() if names is None else names)]
        self._pool.hold(keys)
        for key in keys:
            self._pool.get(key)
        return self

    def unload(self, name: str | None = None) -> None:
        """Free one checkpoint, or every one (waiting for a load of it in flight)."""
        if name is not None:
            self._pool.unload(self.resolve(name))
        else:
            self._pool.unload_all()

    @property
    def loaded(self) -> list[str]:
        """Resident names, least recently used first."""
        return self._pool.loaded

    def resident(self) -> dict[str, Any]:
        """{name: agent} for the resident checkpoints, without touching the LRU order."""
        return self._pool.resident()

    @property
    def loaded_revisions(self) -> dict[str, str | None]:
        return {name: getattr(agent, "revision", None) for name, agent in self.resident().items()}

    # -- routing --------------------------------------------------------------------------------
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
        policy.check_questions(questions)
        call = CallOptions.resolve(self, hooks=hooks, hooks_raise=hooks_raise, hooks_timeout=hooks_timeout)
        routing = dict(model=model, task=task, lang=lang, lang_guess=lang_guess)
        return policy.route(self, state, questions, routing, call, explain)

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
        policy.check_batch(requests)
        if not requests:  # nothing routes, so no hook argument is read (laya's)
            return []
        call = CallOptions.resolve(self, hooks=hooks, hooks_raise=hooks_raise, hooks_timeout=hooks_timeout)
        return policy.route_all(self, requests, call, explain)

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
        answering.check_call(state, questions)
        call = CallOptions.resolve(
            self,
            hooks=hooks,
            on_predict_start=on_predict_start,
            on_predict_end=on_predict_end,
            hooks_raise=hooks_raise,
            hooks_timeout=hooks_timeout,
            min_confidence=min_confidence,
        )
        routing = dict(model=model, task=task, lang=lang, lang_guess=lang_guess)
        return answering.answer(
            self, state, questions, routing, call, max_len=max_len, head_max_len=head_max_len
        )

    system_one = predict

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
        answering.check_call(state, questions)
        call = CallOptions.resolve(
            self,
            hooks=hooks,
            on_predict_start=on_predict_start,
            on_predict_end=on_predict_end,
            hooks_raise=hooks_raise,
            hooks_timeout=hooks_timeout,
        )
        routing = dict(model=model, task=task, lang=lang, lang_guess=lang_guess)
        scan = answering.window_scan(window, stride, aggregate, batch_size)
        return answering.answer(self, state, questions, routing, call, scan=scan)

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
        call = CallOptions.resolve(
            self,
            hooks=hooks,
            on_predict_start=on_predict_start,
            on_predict_end=on_predict_end,
            hooks_raise=hooks_raise,
            hooks_timeout=hooks_timeout,
            min_confidence=min_confidence,
        )
        return answering.answer_batch(self, requests, call, batch_size, sort_by_length)

    predict_many = predict_batch

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.unload()

    def __repr__(self) -> str:
        return "Router(loaded=%s, max_loaded=%d, default=%r)" % (self.loaded, self.max_loaded, self.default)


def _pin(value: Any) -> str | None:
    return value if value is not None and str(value).strip() else None
