"""`laya-onnx score`: one question set over every state of a file, one output row per input row.

Input: JSON Lines (`.jsonl`, `.ndjson`; one object per line with a `state` field, any JSON) or
Parquet (`.parquet`; a `state` column; pyarrow, the `score` extra). An optional `id` field/column
is copied to the output row.

Output: JSON Lines, one line per input row and in input order:
`{"row": i, "id": ..., "result": <ONNXAgent's answer>}` or `{"row": i, "id": ..., "error": "..."}`.
A row the agent refuses, or that cannot be read (not JSON, not an object, no `state`), is an
error row; the run goes on and nothing else is lost.

Resuming: `OUTPUT.meta.json` records the question set and the controls. A rerun with the same
ones checks that the output's lines are rows 0..k-1 (a torn last line from an interrupted run is
cut off), skips the first k input rows and appends; a rerun with other questions is refused.

Answering: rows go to the agent `batch_size` at a time (`core.grouping.run_group`: one
`predict_batch`, or row by row when that call fails), here in one process, or with `--ray`
through Ray Data (`laya_onnx/score/ray_data.py`: `map_batches` over an actor pool of agents).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laya_onnx.core.errors import UserError
from laya_onnx.core.grouping import run_group
from laya_onnx.core.protocol import DecisionAgent

JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
META_SUFFIX = ".meta.json"


class ScoreError(UserError, ValueError):
    """A score run that cannot start or continue as asked (bad input file, output mismatch)."""


@dataclass(frozen=True)
class Row:
    """One input row: its position, its state, and the reason it cannot be scored, if any."""

    index: int
    state: Any = None
    id: Any = None
    error: str | None = None

    def as_item(self) -> dict[str, Any]:
        """A flat record that survives a trip through Arrow (Ray Data): JSON text per field."""
        return {
            "row": self.index,
            "state": json.dumps(self.state, ensure_ascii=False),
            "id": json.dumps(self.id, ensure_ascii=False),
            "error": self.error or "",
        }

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> Row:
        return cls(int(item["row"]), json.loads(item["state"]), json.loads(item["id"]), item["error"] or None)


# -- input ---------------------------------------------------------------------------------


def _row_from_value(index: int, value: Any, where: str) -> Row:
    if not isinstance(value, dict):
        return Row(index, error="%s: a row must be a JSON object with a 'state' field" % where)
    if "state" not in value:
        return Row(index, id=value.get("id"), error="%s: the row has no 'state' field" % where)
    return Row(index, value["state"], value.get("id"))


def _jsonl_rows(path: Path) -> Iterator[Row]:
    with path.open("rb") as f:
        index = 0
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue  # blank lines are not rows
            where = "line %d" % lineno
            try:
                value = json.loads(raw)
            except (ValueError, RecursionError) as exc:
                yield Row(index, error="%s: not valid JSON (%s)" % (where, exc))
            else:
                yield _row_from_value(index, value, where)
            index += 1


def _parquet_rows(path: Path, chunk: int) -> Iterator[Row]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ScoreError(
            "reading Parquet needs pyarrow: pip install 'laya-onnx[score]' (or use a .jsonl input)"
        ) from None
    table = pq.ParquetFile(path)
    names = table.schema_arrow.names
    if "state" not in names:
        raise ScoreError("%s has no 'state' column (columns: %s)" % (path, ", ".join(names)))
    columns = ["state"] + (["id"] if "id" in names else [])
    index = 0
    for batch in table.iter_batches(batch_size=chunk, columns=columns):
        for record in batch.to_pylist():
            yield _row_from_value(index, record, "row %d" % index)
            index += 1


def _format(path: Path) -> str:
    if not path.is_file():
        raise ScoreError("input %s is not a file" % path)
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    raise ScoreError(
        "input %s: unknown format %r; give a JSON Lines (%s) or Parquet (%s) file"
        % (path, suffix, ", ".join(JSONL_SUFFIXES), ", ".join(PARQUET_SUFFIXES))
    )


def read_rows(path: str | os.PathLike, chunk: int = 4096) -> Iterator[Row]:
    """The input file's rows in order, each with its index (0-based, blank JSONL lines skipped),
    read as they are consumed."""
    path = Path(path)
    return _jsonl_rows(path) if _format(path) == "jsonl" else _parquet_rows(path, chunk)


def count_rows(path: str | os.PathLike) -> int:
    """How many rows `read_rows` yields, without parsing them (the progress bar's total)."""
    path = Path(path)
    if _format(path) == "parquet":
        return _parquet_count(path)
    with path.open("rb") as f:
        return sum(1 for raw in f if raw.strip())


def _parquet_count(path: Path) -> int:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ScoreError(
            "reading Parquet needs pyarrow: pip install 'laya-onnx[score]' (or use a .jsonl input)"
        ) from None
    return pq.ParquetFile(path).metadata.num_rows


# -- answering -----------------------------------------------------------------------------


def _error_text(exc: Exception) -> str:
    from laya_onnx.core.errors import LayaInputError

    # the agent's refusal of a request is already a sentence for the caller; anything else is named
    return str(exc) if isinstance(exc, LayaInputError) else "%s: %s" % (type(exc).__name__, exc)


def output_line(row: Row, outcome: dict[str, Any] | Exception | None) -> str:
    """The output line of `row`: its result, or its error (a read error, the agent's, or a
    result JSON cannot carry)."""
    head: dict[str, Any] = {"row": row.index}
    if row.id is not None:
        head["id"] = row.id
    if row.error is not None:
        return json.dumps({**head, "error": row.error}, ensure_ascii=False)
    if isinstance(outcome, Exception):
        return json.dumps({**head, "error": _error_text(outcome)}, ensure_ascii=False)
    try:
        return json.dumps({**head, "result": outcome}, ensure_ascii=False, allow_nan=False)
    except ValueError:
        return json.dumps({**head, "error": "the result holds a NaN or an infinity"}, ensure_ascii=False)


def score_rows(agent: DecisionAgent, rows: list[Row], questions: Any, controls: dict[str, Any]) -> list[str]:
    """The output lines of `rows`, in order: readable rows answered together (`run_group`, as
    the server's micro-batches: one `predict_batch`, or row by row when that call raised, so a
    row the agent refuses carries its own error), bad rows reported."""
    readable = [r for r in rows if r.error is None]
    ran = run_group(agent, [r.state for r in readable], questions, controls, 0) if readable else []
    outcomes = [o.error if o.error is not None else o.result for o in ran]
    by_index = {r.index: o for r, o in zip(readable, outcomes, strict=True)}
    return [output_line(r, by_index.get(r.index)) for r in rows]


# -- output and resuming -------------------------------------------------------------------


def run_meta(questions: Any, controls: dict[str, Any]) -> dict[str, Any]:
    """What an output was written for; a rerun must match it to append."""
    text = json.dumps([questions, sorted(controls.items())], sort_keys=True, ensure_ascii=False)
    return {"questions_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(), "controls": controls}


def _meta_path(output: Path) -> Path:
    return output.with_name(output.name + META_SUFFIX)


def resume_point(output: Path, meta: dict[str, Any]) -> int:
    """How many rows `output` already holds (0 for a new output), after checking it belongs to
    this run and cutting off a torn last line."""
    meta_path = _meta_path(output)
    if not output.exists():
        meta_path.write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
        return 0
    if not meta_path.is_file():
        raise ScoreError(
            "%s exists but has no %s beside it: not an output of laya-onnx score; move it or choose "
            "another -o" % (output, meta_path.name)
        )
    written = json.loads(meta_path.read_text(encoding="utf-8"))
    if written != meta:
        raise ScoreError(
            "%s was written for other questions or controls (%s); remove it and %s to start again, "
            "or choose another -o" % (output, meta_path.name, meta_path.name)
        )
    data = output.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]  # a line without its newline is a torn write
    count = 0
    for lineno, line in enumerate(complete.splitlines(), 1):
        try:
            row = json.loads(line)["row"]
        except (ValueError, KeyError, TypeError):
            row = None
        if row != lineno - 1:
            raise ScoreError(
                "%s line %d is not score row %d; the file was edited or mixed: remove it to start again"
                % (output, lineno, lineno - 1)
            )
        count = lineno
    if len(complete) != len(data):
        with output.open("r+b") as f:
            f.truncate(len(complete))
    return count


@dataclass
class Summary:
    rows: int = 0
    skipped: int = 0
    errors: int = 0

    def as_json(self) -> dict[str, int]:
        return {
            "rows": self.rows,
            "resumed_after": self.skipped,
            "written": self.rows - self.skipped,
            "errors": self.errors,
        }


def _batches(rows: Iterable[Row], size: int) -> Iterator[list[Row]]:
    batch: list[Row] = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


#: Given the rows to score (in order, read lazily), yields their output lines in the same order.
Scorer = Callable[[Iterable[Row]], Iterator[str]]


def local_scorer(agent: DecisionAgent, questions: Any, controls: dict[str, Any], batch_size: int) -> Scorer:
    """Score in this process, `batch_size` rows per call."""

    def run(rows: Iterable[Row]) -> Iterator[str]:
        for batch in _batches(rows, batch_size):
            yield from score_rows(agent, batch, questions, controls)

    return run


def score_file(
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    questions: Any,
    controls: dict[str, Any],
    scorer: Scorer,
    progress: bool = True,
) -> Summary:
    """Score every input row not yet in the output and append its line, flushed as it comes."""
    from tqdm import tqdm

    output = Path(output_path)
    if output.is_dir():
        raise ScoreError("output %s is a directory; give a file path" % output)
    output.parent.mkdir(parents=True, exist_ok=True)
    total = count_rows(input_path)
    done = resume_point(output, run_meta(questions, controls))
    if done > total:
        raise ScoreError(
            "%s holds %d rows but the input has %d: it was written for another input" % (output, done, total)
        )
    summary = Summary(rows=total, skipped=done)
    with (
        output.open("a", encoding="utf-8") as out,
        tqdm(total=total, initial=done, unit="row", disable=not progress, desc="score") as bar,
    ):
        for line in scorer(itertools.islice(read_rows(input_path), done, None)):
            out.write(line + "\n")
            if '"error":' in line and json.loads(line).get("error") is not None:
                summary.errors += 1
            bar.update(1)
            if bar.n % 256 == 0:
                out.flush()
    return summary
