"""The model card a published bundle carries (the repo's README.md), written from its manifest.

YAML metadata the Hub reads (library_name, tags, base_model where the checkpoint came from the
Hub, license when given), rendered by huggingface_hub's `ModelCardData`; then what a user needs
before loading it: the precision and its gate record, the parity check against the checkpoint's
torch model, the sha256 of every file, the timings measured at export with their CPU class, and
how to load it. Everything is read from the manifest, so the card says what the bundle holds.
"""

from __future__ import annotations

from typing import Any

from laya_onnx.core.bundle import Bundle
from laya_onnx.core.manifest import FP32, Manifest
from laya_onnx.core.names import random_weights_preset

LIBRARY_NAME = "onnx"
BASE_TAGS = ("onnx", "onnxruntime", "laya", "laya-onnx", "decision-model")


def card_metadata(bundle: Bundle, license: str | None = None) -> dict[str, Any]:
    """The card's YAML metadata as a dict (what `ModelCardData` renders)."""
    manifest = bundle.manifest
    tags = [*BASE_TAGS, manifest.graph_precision.precision]
    meta: dict[str, Any] = {"library_name": LIBRARY_NAME, "tags": tags}
    source = bundle.source
    if source.repo:  # the Hub links a base model by repo id; a subfolder is named in the text
        meta["base_model"] = source.repo
    if license:
        meta["license"] = license
    if random_weights_preset(bundle.config):
        tags.append("random-weights")
    return meta


def _fmt(value: Any, spec: str = ".3g") -> str:
    return "n/a" if value is None else format(value, spec) if isinstance(value, float) else str(value)


def _precision_section(manifest: Manifest) -> list[str]:
    record = manifest.graph_precision
    lines = [
        "## Precision",
        "",
        f"`{record.precision}`" + (" (as traced)" if record.precision == FP32 else ""),
    ]
    if record.precision == FP32:
        return lines + [""]
    # a gate with a null entry (no tie margin) does not parse as numbers: the manifest keeps it as written
    gate = record.gate or record.extra.get("gate") or {}
    lines += [
        "",
        "Gate at export: "
        + ", ".join(f"{k} {_fmt(v)}" for k, v in gate.items())
        + f"; passed: {record.passed}",
        "",
        "| suite | decisions | agreeing with fp32 torch | decisive agreement | max abs dp |",
        "|---|---|---|---|---|",
    ]
    for suite, m in (record.suites or {}).items():
        lines.append(
            f"| {suite} | {m.get('decisions')} | {m.get('agreeing')} | {_fmt(m.get('decisive_agreement'))} "
            f"| {_fmt(m.get('max_abs_dp'))} |"
        )
    if record.measured_on:
        lines += ["", f"Measured on {record.measured_on}."]
    return lines + [""]


def _parity_section(manifest: Manifest) -> list[str]:
    v = manifest.validation
    if v is None:
        return ["## Parity with the checkpoint", "", "No validation record in the manifest.", ""]
    answers = v.answers
    lines = [
        "## Parity with the checkpoint",
        "",
        f"Checked at export against the checkpoint's torch model on {v.cases} requests ({v.rows} rows):",
        "",
        f"- max abs logit difference {_fmt(v.max_abs_logit_diff)}, act logits {_fmt(v.max_abs_act_diff)} "
        f"(tolerance {_fmt(v.tolerance)}); passed: {v.passed}",
    ]
    if answers is not None:
        lines.append(
            f"- answers: max abs probability difference {_fmt(answers.max_abs_dp)}, act "
            f"{_fmt(answers.max_abs_dact)}, decisions differing: {len(answers.differences)}; "
            f"passed: {answers.passed}"
        )
    return lines + [""]


def _timing_section(manifest: Manifest) -> list[str]:
    export, v = manifest.export, manifest.validation
    lines = ["## Timings measured at export", ""]
    cpu = export.cpu if export is not None and export.cpu else "CPU class not recorded"
    lines.append(f"CPU: {cpu}.")
    lines.append("")
    if v is not None and v.seconds:
        runs = ", ".join(f"{k} {_fmt(s)} s" for k, s in v.seconds.items())
        lines.append(f"- the validation requests ({v.cases} requests, {v.rows} rows), once each: {runs}")
    if export is not None:
        lines.append(
            f"- export: {_fmt(export.total_seconds)} s in all, peak RSS {_fmt(export.peak_rss_mb, '.0f')} MiB"
        )
    return lines + [""]


def _files_section(manifest: Manifest) -> list[str]:
    lines = ["## Files", "", "| file | bytes | sha256 |", "|---|---|---|"]
    for name, entry in sorted(manifest.files.items()):
        lines.append(f"| `{name}` | {entry.bytes if entry.bytes is not None else 'n/a'} | `{entry.sha256}` |")
    lines += [
        "",
        "`manifest.json` lists these digests; `ONNXAgent` and `laya-onnx serve` pull exactly these "
        "files and refuse any whose sha256 differs.",
        "",
    ]
    return lines


def model_card(bundle: Bundle, repo_id: str, license: str | None = None) -> str:
    """The README.md text for `bundle` published as `repo_id` (`org/name[/subfolder]`)."""
    from huggingface_hub import ModelCardData

    manifest = bundle.manifest
    meta = card_metadata(bundle, license)
    data = ModelCardData(**meta)
    source = bundle.source
    title = repo_id.rsplit("/", 1)[-1]
    about = f"A laya-onnx bundle (ONNX Runtime, torch-free) of the Laya decision model `{title}`"
    if source.repo:
        about += f", exported from `{source.repo}`" + (
            f" (`{source.subfolder}/`)" if source.subfolder else ""
        )
    about += f" at revision `{source.revision}`." if source.revision else "."
    lines = [f"# {title}", "", about, ""]
    preset = random_weights_preset(bundle.config)
    if preset:
        lines += [
            f"**Random test weights** (preset `{preset}`, `laya-onnx make-checkpoint`): its answers "
            "carry no meaning. For tests, demos and benchmarks only.",
            "",
        ]
    lines += _precision_section(manifest)
    lines += _parity_section(manifest)
    lines += _timing_section(manifest)
    lines += _files_section(manifest)
    lines += [
        "## How to load it",
        "",
        "```python",
        "from laya_onnx import ONNXAgent",
        "",
        f'agent = ONNXAgent("{repo_id}")  # pin a commit with revision="<sha>"',
        'agent.predict("I was charged twice", {"refund": {"type": "noul", "instructions": "Refund?"}})',
        "```",
        "",
        "```bash",
        "pip install 'laya-onnx[cpu,serve]'",
        f"laya-onnx serve {repo_id}",
        "```",
        "",
    ]
    return f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines)
