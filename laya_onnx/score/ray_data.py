"""`laya-onnx score --ray`: the rows through Ray Data, `map_batches` over an actor pool of agents.

Each actor loads one `ONNXAgent` once and answers whole batches with the same `score_rows` the
local path uses; the dataset keeps the input order (`preserve_order`), so the driver writes the
lines as they stream back, in order, and `score.score_file` stays the one place that writes and
resumes. The rows to score are handed to Ray from the driver (`from_items`): the reader, the
bad-row reporting and the resume skip are the local path's, not a second copy in Ray's readers.

Needs the `ray` extra (`ray[data]`); `ray.init()` joins `RAY_ADDRESS` when set, else starts a
local instance.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from laya_onnx.score.scorer import Row, Scorer, score_rows


class RayStartError(RuntimeError):
    """Ray could not start a local instance or join `RAY_ADDRESS`: the machine, not the input."""


def join_ray(**init_options: Any) -> None:
    """Connect this process to Ray (`ray.init`) unless it is already; a failure is `RayStartError`."""
    import ray

    if ray.is_initialized():
        return
    try:
        ray.init(**init_options)
    except Exception as exc:  # Ray raises bare Exception, ConnectionError, RuntimeError, ...
        where = (
            f"join RAY_ADDRESS={os.environ['RAY_ADDRESS']!r}" if os.environ.get("RAY_ADDRESS") else "start"
        )
        raise RayStartError(f"Ray could not {where}: {exc}") from exc


class _AgentActor:
    """One agent per actor; `__call__` answers one batch of rows (as Arrow-safe JSON fields)."""

    def __init__(
        self,
        bundle: str,
        questions: Any,
        controls: dict[str, Any],
        providers: Sequence[str] | None = None,
        threads: int | None = None,
    ):
        from laya_onnx import ONNXAgent

        self.agent = ONNXAgent(bundle, providers=providers, threads=threads)
        self.questions = questions
        self.controls = controls

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        keys = ("row", "state", "id", "error")
        rows = [
            Row.from_item(dict(zip(keys, values, strict=True)))
            for values in zip(*(batch[k] for k in keys), strict=True)
        ]
        return {"line": score_rows(self.agent, rows, self.questions, self.controls)}


def ray_scorer(
    bundle: str,
    questions: Any,
    controls: dict[str, Any],
    batch_size: int,
    actors: int,
    cpus_per_actor: float = 1.0,
    gpus_per_actor: float = 0.0,
    providers: Sequence[str] | None = None,
    threads: int | None = None,
) -> Scorer:
    """A `score.Scorer` that runs the rows on a pool of `actors` agents through Ray Data."""
    import ray

    def run(rows: Iterable[Row]) -> Iterator[str]:
        items = [r.as_item() for r in rows]  # handed to Ray from the driver: held here once
        if not items:
            return
        join_ray(log_to_driver=False)
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True
        context.enable_progress_bars = False  # score_file draws the one bar, per row written
        blocks = max(1, min(len(items), actors * 4, math.ceil(len(items) / batch_size)))
        dataset = ray.data.from_items(items, override_num_blocks=blocks)
        answered = dataset.map_batches(
            _AgentActor,
            fn_constructor_kwargs={
                "bundle": bundle,
                "questions": questions,
                "controls": controls,
                "providers": list(providers) if providers else None,
                "threads": threads,
            },
            batch_size=batch_size,
            batch_format="numpy",
            concurrency=actors,
            num_cpus=cpus_per_actor,
            num_gpus=gpus_per_actor,
        )
        for batch in answered.iter_batches(batch_size=batch_size, batch_format="numpy"):
            yield from (str(line) for line in batch["line"])

    return run
