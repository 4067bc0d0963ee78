"""The bundle on disk: its layout, the graph's I/O contract and the manifest.

A bundle is what `laya-onnx export` writes and what `ONNXAgent` loads:

    BUNDLE/
      laya.onnx              the traced DecisionModel (one graph)
      laya.onnx.data         its weights, for graphs exported with external data (large ones)
      rl_agent_config.json   budgets, temperatures (copied from the checkpoint)
      tokenizer/             tokenizer.json + tokenizer_config.json + special_tokens_map.json
      manifest.json          format version, sha256 of every file, source, tools, I/O, validation

The I/O signature lives here, in the torch-free core, so the exporter that writes the graph and
the runtime that feeds it read one declaration (optimum-style: names, dtypes, dynamic axes).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laya_onnx.core.errors import InvalidRequest

GRAPH_FILE = "laya.onnx"
#: The graph's weights when they are stored as ONNX external data (large graphs), beside GRAPH_FILE.
GRAPH_DATA_FILE = "laya.onnx.data"
#: Weights above this many bytes are exported as external data. Protobuf's hard limit is 2 GiB;
#: an inline graph is also the costlier one to write and to load (the whole message is serialised
#: and parsed in memory, where external data is streamed and read tensor by tensor).
DEFAULT_EXTERNAL_DATA_THRESHOLD = 1 << 30
CONFIG_FILE = "rl_agent_config.json"
#: The checkpoint's weights: read by the exporter, never part of a bundle.
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_DIR = "tokenizer"
MANIFEST_FILE = "manifest.json"
FORMAT = "laya-onnx-bundle"
FORMAT_VERSION = 1

#: Inputs in the order the graph declares them: name -> (numpy dtype, dynamic axes).
#: This is the contract laya's own ONNXAgent feeds, so either runtime can run our graph.
GRAPH_INPUTS: dict[str, tuple] = {
    "input_ids": ("int64", ("batch", "sequence")),
    "attention_mask": ("int64", ("batch", "sequence")),
    "marker_pos": ("int64", ("batch", "markers")),
    "marker_mask": ("bool", ("batch", "markers")),
    "qtype": ("int64", ("batch",)),
}
GRAPH_OUTPUTS: dict[str, tuple] = {
    "logits": ("float32", ("batch", "markers")),
    "act_logits": ("float32", ("batch", "actions")),
}
#: The traced head always takes topk(2) of the option probabilities, so a run needs >= 2 marker
#: columns even when every question in it has one option (the extra column is masked).
MIN_MARKER_COLUMNS = 2


class BundleError(ValueError):
    """A bundle that is missing, incomplete, or does not match its manifest."""


def read_json_object(path: Path, owner: str, error: type[ValueError] = ValueError) -> dict[str, Any]:
    """The JSON object in `path`; `error` naming `owner` (e.g. "bundle 'b'") and the file otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:  # UnicodeDecodeError included
        raise error(f"{owner}: {path.name} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise error(f"{owner}: {path.name} must be a JSON object")
    return data


def sha256_file(path: os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def bundle_files(root: Path) -> list[str]:
    """Every file of a bundle except the manifest, as sorted POSIX paths relative to `root`."""
    out = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != MANIFEST_FILE:
            out.append(path.relative_to(root).as_posix())
    return out


def file_digests(root: Path, names: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    names = bundle_files(root) if names is None else names
    return {n: {"sha256": sha256_file(root / n), "bytes": (root / n).stat().st_size} for n in names}


def io_signature() -> dict[str, Any]:
    """The declared graph I/O as JSON (written into the manifest)."""

    def block(spec):
        return [{"name": n, "dtype": d, "axes": list(a)} for n, (d, a) in spec.items()]

    return {
        "inputs": block(GRAPH_INPUTS),
        "outputs": block(GRAPH_OUTPUTS),
        "min_marker_columns": MIN_MARKER_COLUMNS,
    }


class OutputExistsError(ValueError):
    """An output directory that holds something and may not be replaced (nothing was written)."""

    def __init__(self, path: os.PathLike, option: str = "force=True"):
        self.path = Path(path)
        super().__init__(self.advice(option))

    def advice(self, option: str) -> str:
        """The message, telling the caller to pass `option` (the API's force=True, the CLI's --force)."""
        return f"output {str(self.path)!r} is not empty; pass {option} to replace it"


def check_output_dir(out_dir: os.PathLike, force: bool) -> None:
    """Refuse an output that is a file, or a non-empty directory unless `force` (then it is replaced)."""
    out = Path(out_dir)
    if out.exists():
        if not out.is_dir():
            raise InvalidRequest(f"output {str(out)!r} exists and is not a directory")
        if not force and any(out.iterdir()):
            raise OutputExistsError(out)


@contextmanager
def staged_directory(out_dir: Path) -> Iterator[Path]:
    """Write a directory atomically: yield a sibling temp dir, then swap it in on success.

    A failure (or an interrupt) removes the temp dir and leaves `out_dir` as it was, so a reader
    never sees half an artefact and a refused export never leaves one behind.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".partial", dir=out_dir.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            os.replace(out_dir, old)
            os.replace(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_manifest(root: Path, **sections: Any) -> dict[str, Any]:
    """Hash every file under `root` and write manifest.json; `sections` are merged in as given."""
    manifest: dict[str, Any] = {"format": FORMAT, "format_version": FORMAT_VERSION}
    manifest.update(sections)
    manifest.setdefault("io", io_signature())
    manifest["files"] = file_digests(root)
    tmp = root / (MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, root / MANIFEST_FILE)
    return manifest


class ReducedPrecisionWarning(UserWarning):
    """A bundle whose graph is not fp32 (laya-onnx export --precision fp16|int8|bf16) was loaded."""


class RandomWeightsWarning(UserWarning):
    """A bundle of a test checkpoint (`laya-onnx make-checkpoint`: random weights) was loaded."""


def precision_record(manifest: dict[str, Any] | None) -> dict[str, Any]:
    """The manifest's `precision` record; {"precision": "fp32"} for fp32 and pre-ladder bundles."""
    record = (manifest or {}).get("precision")
    if not isinstance(record, dict) or not isinstance(record.get("precision"), str):
        return {"precision": "fp32"}
    return record


def describe_precision(record: dict[str, Any]) -> str:
    """One line: the precision and, per suite, the agreement with fp32 torch measured at export."""
    name = record["precision"]
    if name == "fp32":
        return "fp32"
    suites = record.get("suites") or {}
    measured = "; ".join(
        f"{suite}: {m.get('agreeing')}/{m.get('decisions')} decisions agree with fp32 torch, "
        f"max |dp| {float(m.get('max_abs_dp', float('nan'))):.2g}"
        for suite, m in suites.items()
        if isinstance(m, dict)
    )
    return f"{name} (not fp32; {measured or 'no agreement measured'})"


@dataclass(frozen=True)
class Bundle:
    """A bundle directory, checked: graph, config and tokenizer present, manifest consistent."""

    root: Path
    manifest: dict[str, Any] | None
    config: dict[str, Any]

    @property
    def graph_path(self) -> Path:
        return self.root / GRAPH_FILE

    @property
    def tokenizer_dir(self) -> Path:
        return self.root / TOKENIZER_DIR

    @property
    def precision(self) -> dict[str, Any]:
        """What the graph computes in (manifest `precision`) and its gate's measurements."""
        return precision_record(self.manifest)

    @classmethod
    def open(cls, root: os.PathLike, verify: bool = True) -> Bundle:
        """Open a bundle. `verify=True` checks every sha256 the manifest lists before any file is
        parsed, so a corrupted or swapped graph is refused instead of answering wrongly."""
        root = Path(root)
        if not root.is_dir():
            raise BundleError(f"bundle {str(root)!r} is not a directory")
        manifest = None
        mpath = root / MANIFEST_FILE
        if not mpath.exists() and (root / GRAPH_FILE).exists():
            # Every file is verified against the manifest's hashes before it is parsed: without it
            # nothing could be, so a bundle that lost it is refused rather than run unchecked.
            raise BundleError(
                f"bundle {str(root)!r} has no {MANIFEST_FILE}, so its files cannot be verified; "
                "re-export it (laya-onnx export CHECKPOINT -o BUNDLE) or copy the whole bundle folder"
            )
        if mpath.exists():
            manifest = read_json_object(mpath, f"bundle {str(root)!r}", BundleError)
            if manifest.get("format") != FORMAT:
                raise BundleError(f"bundle {str(root)!r}: {MANIFEST_FILE} is not a {FORMAT} manifest")
            if manifest.get("format_version") != FORMAT_VERSION:
                raise BundleError(
                    f"bundle {str(root)!r}: manifest format_version {manifest.get('format_version')!r} "
                    f"is not supported by this laya-onnx (expects {FORMAT_VERSION}); re-export it"
                )
            check_graph_data(root, manifest)
            if verify:
                verify_files(root, manifest.get("files") or {})
        for need in (GRAPH_FILE, CONFIG_FILE, TOKENIZER_DIR + "/tokenizer.json"):
            if not (root / need).exists():
                raise BundleError(f"bundle {str(root)!r} has no {need}; is it a laya-onnx export?")
        config = read_json_object(root / CONFIG_FILE, f"bundle {str(root)!r}", BundleError)
        return cls(root=root, manifest=manifest, config=config)


def read_manifest_quietly(root: Path) -> dict[str, Any]:
    """The manifest of the bundle at `root` as a dict, or {} when it is missing or unreadable."""
    try:
        data = json.loads((root / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def bundle_origin(manifest: dict[str, Any] | None, root: Path) -> str | None:
    """Where a bundle came from: its Hub checkpoint (`org/repo[/subfolder]`, the manifest's
    `source`), else the bundle folder's name. Never an absolute path (that would publish the
    host's filesystem layout). The manifest is a file someone may have edited: read defensively."""
    source = (manifest or {}).get("source")
    repo = source.get("repo") if isinstance(source, dict) else None
    if isinstance(source, dict) and isinstance(repo, str) and repo:
        sub = source.get("subfolder")
        return "%s/%s" % (repo, sub) if isinstance(sub, str) and sub else repo
    return root.name or None


def graph_data_files(manifest: dict[str, Any]) -> list[str]:
    """The external data files the manifest says the graph reads its weights from (maybe none)."""
    graph = manifest.get("graph") or {}
    names = graph.get("external_data") if isinstance(graph, dict) else None
    if names is None:
        return []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise BundleError("bundle manifest: graph.external_data must be a list of file names")
    return names


def check_graph_data(root: Path, manifest: dict[str, Any]) -> None:
    """The graph's external data must be listed (so hashed) by the manifest, and a data file the
    manifest does not list must not sit beside the graph: it would be read unverified."""
    files = manifest.get("files") or {}
    for name in graph_data_files(manifest):
        if name not in files:
            raise BundleError(
                f"bundle {str(root)!r}: the graph's external data {name!r} is not hashed in {MANIFEST_FILE}; re-export it"
            )
    if (root / GRAPH_DATA_FILE).exists() and GRAPH_DATA_FILE not in files:
        raise BundleError(
            f"bundle {str(root)!r} holds {GRAPH_DATA_FILE}, which its manifest does not list (left by another "
            "export?); re-export the bundle into an empty directory"
        )


def verify_files(root: Path, files: dict[str, Any]) -> None:
    """Check each listed file's sha256; names must stay inside `root`."""
    base = root.resolve()
    for name, entry in files.items():
        path = (root / name).resolve()
        if base not in path.parents:
            raise BundleError(f"bundle manifest lists an unsafe path {name!r}")
        if not path.is_file():
            raise BundleError(f"bundle {str(root)!r} is missing {name!r}, which its manifest lists")
        want = (entry.get("sha256") if isinstance(entry, dict) else entry) or ""
        got = sha256_file(path)
        if got.lower() != str(want).lower():
            raise BundleError(
                f"bundle {str(root)!r}: sha256 mismatch for {name!r} (manifest {want}, file {got}); "
                "the bundle was modified or corrupted, re-export it"
            )
