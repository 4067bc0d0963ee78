"""The Router's loaded checkpoints: built on first use, at most `max_loaded` resident.

One load runs at a time (peak memory), and callers of a name that is loading wait for that load
instead of building it twice. The least recently used agent is evicted past `max_loaded`.
`notify(event, name, agent)` is told of every `on_load` and `on_evict`, after the tables are
consistent and outside every lock, so a hook may call back into the Router.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from laya_onnx.core.errors import InvalidRequestType

DEFAULT_MAX_LOADED = 2


class _Build:
    """One in-flight load of a checkpoint: concurrent callers wait on it instead of building twice."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None


class Pool:
    """{name: agent} with single-flight loading and LRU eviction; `build(name)` makes an agent."""

    def __init__(
        self,
        build: Callable[[str], Any],
        notify: Callable[[str, str, Any], None],
        max_loaded: int = DEFAULT_MAX_LOADED,
    ):
        if isinstance(max_loaded, bool) or not isinstance(max_loaded, int):
            raise InvalidRequestType("max_loaded must be an integer, got %r" % (max_loaded,))
        self.max_loaded = max(1, max_loaded)
        self._build = build
        self._notify = notify
        self._agents: dict[str, Any] = {}
        self._order: list[str] = []  # least recently used first
        # `_lock` guards the tables and is never held while a bundle loads; `_build_lock` lets
        # one bundle load at a time; `_loading` lets callers of the same name wait.
        self._lock = threading.RLock()
        self._build_lock = threading.Lock()
        self._loading: dict[str, _Build] = {}
        #: Seconds the last load of each name took (what a server logs as its cold start).
        self.load_seconds: dict[str, float] = {}

    def get(self, key: str) -> Any:
        """The agent serving `key`, built on first use (one build per name at a time)."""
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
        self._evicted(evicted)
        self._notify("on_load", key, agent)
        return agent

    def peek(self, key: str) -> Any:
        """The resident agent of `key`, or None; the LRU order is left as it is."""
        with self._lock:
            return self._agents.get(key)

    def attach(self, key: str, agent: Any) -> None:
        """Make `agent` resident under `key`, raising `max_loaded` to keep everything resident."""
        with self._lock:
            self._agents[key] = agent
            self._touch(key)
            self.max_loaded = max(self.max_loaded, len(self._agents))

    def hold(self, keys: Iterable[str]) -> None:
        """Raise `max_loaded` so `keys` and whatever is resident fit together."""
        with self._lock:
            self.max_loaded = max(self.max_loaded, len(set(keys) | set(self._agents)))

    def unload(self, key: str) -> None:
        """Free `key` (after a load of it in flight finishes)."""
        while True:
            with self._lock:
                build = self._loading.get(key)
                if build is None:
                    agent = self._agents.pop(key, None)
                    if key in self._order:
                        self._order.remove(key)
                    break
            build.done.wait()
        self._evicted([key] if agent is not None else [])

    def unload_all(self) -> None:
        """Free every checkpoint (after the loads in flight finish)."""
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
        self._evicted(freed)

    @property
    def loaded(self) -> list[str]:
        """Resident names, least recently used first."""
        with self._lock:
            return list(self._order)

    def resident(self) -> dict[str, Any]:
        """{name: agent} for the resident checkpoints, without touching the LRU order."""
        with self._lock:
            return {name: self._agents[name] for name in self._order if name in self._agents}

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

    def _evicted(self, names: list[str]) -> None:
        for name in names:
            self._notify("on_evict", name, None)
