"""The bundle's manifest, typed: parsed once when a bundle is opened, built by the export from the
records its steps return.

Each section is a frozen record whose fields are the keys this version knows. A manifest is a
file someone may have edited, and one written by another version of laya-onnx:

- a key this version does not know is kept in the record's `extra` and written back (forward
  compatible); the keys keep the order they were read in;
- a section or value of the wrong shape is not believed: the field takes its default (None for
  what an older export did not write; a graph without a precision record is fp32), and the value
  is kept, as written, in `extra`;
- what guards the files a bundle runs is strict (`ManifestError`): the hashed `files` and the
  graph's `external_data`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union

from laya_onnx.core.errors import UserError

FORMAT = "laya-onnx-bundle"
FORMAT_VERSION = 1
#: What a graph computes in when its manifest says nothing else (every export before precisions).
FP32 = "fp32"

_R = TypeVar("_R", bound="Record")
_MISSING: Any = object()


class ManifestError(UserError, ValueError):
    """A manifest whose file list or graph data cannot be believed."""


def _convert(value: Any, hint: Any) -> Any:
    """`value` as the annotation `hint` describes it (records parsed), else _MISSING."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None:
            return None if type(None) in args else _MISSING
        for arg in args:
            got = _MISSING if arg is type(None) else _convert(value, arg)
            if got is not _MISSING:
                return got
        return _MISSING
    if hint is Any:
        return value
    if isinstance(hint, type) and issubclass(hint, Record):
        return hint.parse(value) if isinstance(value, Mapping) else _MISSING
    if origin is dict:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            return _MISSING
        items = {k: _convert(v, args[1]) for k, v in value.items()}
        return _MISSING if _MISSING in items.values() else items
    if origin is list:
        if not isinstance(value, list):
            return _MISSING
        converted = [_convert(v, args[0]) for v in value]
        return _MISSING if any(v is _MISSING for v in converted) else converted
    if hint in (int, float) and isinstance(value, bool):
        return _MISSING
    if hint is float:
        return value if isinstance(value, (int, float)) else _MISSING
    return value if isinstance(value, hint) else _MISSING


def _json(value: Any) -> Any:
    if isinstance(value, Record):
        return value.as_json()
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json(v) for v in value]
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def _hints(cls: type) -> dict[str, Any]:
    """A record's field annotations, resolved once per class."""
    if cls not in _HINTS:
        known = typing.get_type_hints(cls)
        _HINTS[cls] = {
            f.name: known[f.name] for f in dataclasses.fields(cls) if f.name not in ("extra", "order")
        }
    return _HINTS[cls]


@dataclass(frozen=True)
class Record:
    """A manifest section: typed fields, `extra` (keys kept as read) and the order keys were read in.

    A None field is a key the section does not have, except those declared with `NULLABLE`, which
    the export writes as null. A section that was read is written back with the keys it had."""

    extra: dict[str, Any] = field(default_factory=dict, kw_only=True)
    order: tuple[str, ...] = field(default=(), kw_only=True, repr=False, compare=False)

    @classmethod
    def parse(cls: type[_R], data: Mapping[str, Any]) -> _R:
        hints = _hints(cls)
        known: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in data.items():
            got = _convert(value, hints[key]) if key in hints else _MISSING
            if got is _MISSING:
                extra[key] = value
            else:
                known[key] = got
        return cls(**known, extra=extra, order=tuple(data))

    def as_json(self) -> dict[str, Any]:
        """The section as JSON: keys in the order read (else as declared), then the new ones."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name in ("extra", "order"):
                continue
            value = getattr(self, f.name)
            if self.order and f.name not in self.order and value == _default(f):
                continue  # read without the key: written back without it
            if value is not None or f.metadata.get("nullable"):
                out[f.name] = _json(value)
        out.update(self.extra)
        first = [k for k in self.order if k in out]
        return {k: out[k] for k in [*first, *(k for k in out if k not in self.order)]}


NULLABLE = {"nullable": True}


@dataclass(frozen=True)
class SourceRecord(Record):
    """The checkpoint the bundle was exported from (`laya_onnx.core.hub`'s located checkpoint)."""

    name: str | None = field(default=None, metadata=NULLABLE)
    path: str | None = field(default=None, metadata=NULLABLE)
    repo: str | None = field(default=None, metadata=NULLABLE)
    subfolder: str | None = field(default=None, metadata=NULLABLE)
    revision: str | None = field(default=None, metadata=NULLABLE)
    weights_sha256: str | None = None


@dataclass(frozen=True)
class ExportRecord(Record):
    """How the graph was written: the exporter, its opset, timings, the attention kind and the
    layer shapes the pass memory estimate needs when a bundle has no measurement."""

    opset: int | None = None
    exporter: str | None = None
    seconds: float | None = None
    total_seconds: float | None = None
    peak_rss_mb: float | None = None
    attention: str | None = None
    #: How the encoder layers were traced (export/constant_shapes.py): "constant-shape", the same
    #: with RoPE as one op (int8), or "transformers" (as written).
    layers: str | None = None
    architecture: dict[str, Any] | None = None
    #: The CPU class the export's timings were measured on (`machine.Cpu.label`, cores).
    cpu: str | None = None


@dataclass(frozen=True)
class GraphRecord(Record):
    file: str | None = None
    #: The files the graph reads its weights from (ONNX external data); strict, see `Manifest`.
    external_data: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class AnswersRecord(Record):
    """The decoded answers of both sides judged by the parity rule (`laya_onnx.core.judge`)."""

    rule: str | None = None
    tolerance: float | None = None
    act_tolerance: float | None = None
    max_abs_dp: float | None = None
    max_abs_dact: float | None = None
    rounding_flips: int | None = None
    differences: list[str] = field(default_factory=list)
    passed: bool | None = None


@dataclass(frozen=True)
class ValidationRecord(Record):
    """ONNX Runtime against torch on the export's built-in requests."""

    cases: int | None = None
    rows: int | None = None
    max_abs_logit_diff: float | None = None
    max_abs_act_diff: float | None = None
    tolerance: float | None = None
    passed: bool | None = None
    answers: AnswersRecord | None = None
    seconds: dict[str, float] | None = None


@dataclass(frozen=True)
class OptimizationRecord(Record):
    """`--optimize`: the fusions applied, and whether the fused graph validated and was kept."""

    tool: str | None = None
    nodes_before: int | None = None
    nodes_after: int | None = None
    fusions: dict[str, int] | None = None
    optimizer_statistics: dict[str, Any] | None = None
    op_types_before: dict[str, int] | None = None
    op_types_after: dict[str, int] | None = None
    validation: dict[str, Any] | None = None
    kept: bool | None = None
    reason: str | None = None


@dataclass(frozen=True)
class PrecisionRecord(Record):
    """What the graph computes in and, below fp32, its gate and the agreement with fp32 torch
    measured at export (per suite); the rewrite's own description is kept in `extra`."""

    precision: str = FP32
    #: int8: the weight codes' bits, and the graph file of each integer GEMM form (`int8_kernel`)
    weight_bits: int | None = None
    kernels: dict[str, str] | None = None
    kernels_identical: bool | str | None = None
    measured_on: str | None = None
    cpu_ep: dict[str, dict[str, Any]] | None = None
    reference: str | None = None
    gate: dict[str, float | None] | None = None
    suites: dict[str, dict[str, Any]] | None = None
    passed: bool | None = None

    def describe(self) -> str:
        """One line: the precision and, per suite, the agreement with fp32 torch measured at export."""
        if self.precision == FP32:
            return FP32
        measured = "; ".join(
            f"{suite}: {m.get('agreeing')}/{m.get('decisions')} decisions agree with fp32 torch, "
            f"max |dp| {float(m.get('max_abs_dp', float('nan'))):.2g}"
            for suite, m in (self.suites or {}).items()
        )
        return f"{self.precision} (not fp32; {measured or 'no agreement measured'})"


@dataclass(frozen=True)
class MemoryRecord(Record):
    """The per-pass memory model fitted at export (`laya_onnx.core.memory`) and its samples."""

    model: dict[str, Any] | None = None
    samples: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class CalibrationRecord(Record):
    """The calibration file the bundle carries (applied by an agent on it) and where it came from."""

    file: str | None = None
    source: str | None = None


@dataclass(frozen=True)
class FileEntry(Record):
    sha256: str = ""
    bytes: int | None = None


@dataclass(frozen=True)
class Manifest(Record):
    """manifest.json: format, the export's records, the graph's I/O and every file's digest."""

    format: str | None = FORMAT
    format_version: int | None = FORMAT_VERSION
    source: SourceRecord | None = None
    tools: dict[str, str | None] | None = None
    export: ExportRecord | None = None
    graph: GraphRecord | None = None
    validation: ValidationRecord | None = None
    optimization: OptimizationRecord | None = None
    precision: PrecisionRecord | None = None
    memory: MemoryRecord | None = None
    calibration: CalibrationRecord | None = None
    io: dict[str, Any] | None = None
    files: dict[str, FileEntry] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> Manifest:
        files = data.get("files", {})
        if not isinstance(files, Mapping):
            raise ManifestError("bundle manifest: files must be an object of file name -> digest")
        graph = data.get("graph")
        names = graph.get("external_data") if isinstance(graph, Mapping) else None
        if names is not None and (not isinstance(names, list) or not all(isinstance(n, str) for n in names)):
            raise ManifestError("bundle manifest: graph.external_data must be a list of file names")
        # A bare digest is an entry too (verified like the others); anything else is a digest
        # that matches no file, so verification refuses it.
        entries = {
            name: FileEntry.parse(entry) if isinstance(entry, Mapping) else FileEntry(sha256=str(entry or ""))
            for name, entry in files.items()
        }
        parsed = super().parse({k: v for k, v in data.items() if k != "files"})
        return dataclasses.replace(parsed, files=entries, order=tuple(data))

    @property
    def graph_precision(self) -> PrecisionRecord:
        """The precision record; fp32's for manifests without one (exported before precisions)."""
        return self.precision or PrecisionRecord()

    @property
    def external_data(self) -> list[str]:
        """The external data files the graph reads its weights from (maybe none)."""
        return self.graph.external_data if self.graph is not None else []

    def digest(self, name: str) -> str | None:
        """The sha256 the manifest lists for the bundle file `name`, else None."""
        entry = self.files.get(name)
        return entry.sha256 if entry is not None and entry.sha256 else None
