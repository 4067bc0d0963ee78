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
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from laya_onnx.core.errors import InvalidRequest, UserError
from laya_onnx.core.manifest import (
    FORMAT,
    FORMAT_VERSION,
    FileEntry,
    Manifest,
    ManifestError,
    PrecisionRecord,
    SourceRecord,
)
from laya_onnx.core.verified import VerifiedFiles

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


class BundleError(UserError, ValueError):
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


def file_digests(root: Path, names: Iterable[str] | None = None) -> dict[str, FileEntry]:
    names = bundle_files(root) if names is None else names
    return {n: FileEntry(sha256=sha256_file(root / n), bytes=(root / n).stat().st_size) for n in names}


def io_signature() -> dict[str, Any]:
    """The declared graph I/O as JSON (written into the manifest)."""

    def block(spec):
        return [{"name": n, "dtype": d, "axes": list(a)} for n, (d, a) in spec.items()]

    return {
        "inputs": block(GRAPH_INPUTS),
        "outputs": block(GRAPH_OUTPUTS),
        "min_marker_columns": MIN_MARKER_COLUMNS,
    }


def not_a_bundle(root: Path) -> str:
    """Why folder `root`, which has neither a manifest nor a graph, is not a bundle: it is empty,
    it holds bundles (a models folder), or it holds something else."""
    entries = sorted(p.name for p in root.iterdir() if not p.name.startswith("."))
    if not entries:
        return (
            f"{str(root)!r} is an empty folder, not a bundle: export one into it "
            f"(laya-onnx export CHECKPOINT -o {root}), or export --all -o {root} for a models folder"
        )
    held = [name for name in entries if (root / name / MANIFEST_FILE).is_file()]
    if held:
        return (
            f"{str(root)!r} is a models folder holding {len(held)} bundle(s) ({', '.join(held[:5])}), not a "
            f"bundle: name one of them ({str(root / held[0])!r}), or serve the whole folder"
        )
    return f"bundle {str(root)!r} has no {GRAPH_FILE}; is it a laya-onnx export?"


#: What laya-onnx writes into an output folder besides the manifest's files: a bundle's config,
#: tokenizer and manifest (its graphs are `laya*.onnx[.data]`), a test checkpoint's weights and
#: encoder config (`laya-onnx make-checkpoint`).
WRITTEN_NAMES = frozenset({MANIFEST_FILE, CONFIG_FILE, TOKENIZER_DIR, WEIGHTS_FILE, "encoder"})


def unexported_entries(out: Path) -> list[str]:
    """The entries directly under folder `out` that laya-onnx did not write: neither listed by its
    manifest nor named as an export or make-checkpoint names what it writes (`WRITTEN_NAMES`)."""
    written = set(WRITTEN_NAMES)
    try:
        listed = json.loads((out / MANIFEST_FILE).read_text(encoding="utf-8"))["files"]
        written |= {str(name).split("/")[0] for name in listed}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return sorted(
        p.name
        for p in out.iterdir()
        if p.name not in written
        and not (p.name.startswith("laya") and p.name.endswith((".onnx", ".onnx.data")))
    )


class OutputExistsError(UserError, ValueError):
    """An output directory that holds something and may not be replaced (nothing was written)."""

    def __init__(self, path: os.PathLike, option: str = "force=True"):
        self.path = Path(path)
        super().__init__(self.advice(option))

    def advice(self, option: str) -> str:
        """The message, telling the caller to pass `option` (the API's force=True, the CLI's --force)."""
        return f"output {str(self.path)!r} is not empty; pass {option} to replace it"


def check_output_dir(out_dir: os.PathLike, force: bool) -> None:
    """Refuse an output that is a file, or a non-empty directory unless `force` and it holds only
    what an earlier export or make-checkpoint wrote (then it is replaced): `force` never deletes a
    file laya-onnx did not write."""
    out = Path(out_dir)
    if out.exists():
        if not out.is_dir():
            raise InvalidRequest(f"output {str(out)!r} exists and is not a directory")
        if not any(out.iterdir()):
            return
        if not force:
            raise OutputExistsError(out)
        foreign = unexported_entries(out)
        if foreign:
            shown = ", ".join(repr(name) for name in foreign[:3]) + (", ..." if len(foreign) > 3 else "")
            raise InvalidRequest(
                f"output {str(out)!r} holds {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} "
                f"laya-onnx did not write ({shown}); replacing it would delete them, so nothing was "
                "written: write into a new or empty folder, or move them out first"
            )


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


def write_manifest(root: Path, manifest: Manifest) -> Manifest:
    """Hash every file under `root` and write `manifest` listing them (with the graph I/O when it
    has none) as manifest.json, atomically; returns what was written."""
    written = replace(manifest, io=manifest.io or io_signature(), files=file_digests(root))
    tmp = root / (MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps(written.as_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, root / MANIFEST_FILE)
    return written


class ReducedPrecisionWarning(UserWarning):
    """A bundle whose graph is not fp32 (laya-onnx export --precision fp16|int8|bf16) was loaded."""


class RandomWeightsWarning(UserWarning):
    """A bundle of a test checkpoint (`laya-onnx make-checkpoint`: random weights) was loaded."""


@dataclass(frozen=True)
class Bundle:
    """A bundle directory, checked: graph, config and tokenizer present, manifest consistent."""

    root: Path
    #: manifest.json, parsed once, when the bundle is opened.
    manifest: Manifest
    config: dict[str, Any]

    @property
    def graph_path(self) -> Path:
        return self.root / GRAPH_FILE

    @property
    def tokenizer_dir(self) -> Path:
        return self.root / TOKENIZER_DIR

    @property
    def precision(self) -> PrecisionRecord:
        """What the graph computes in (manifest `precision`) and its gate's measurements."""
        return self.manifest.graph_precision

    @property
    def source(self) -> SourceRecord:
        """The checkpoint the bundle was exported from, as far as its manifest says."""
        return self.manifest.source or SourceRecord()

    @classmethod
    def open(cls, root: os.PathLike, verify: bool = True, *, defer_weights: bool = False) -> Bundle:
        """Open a bundle. `verify=True` checks every sha256 the manifest lists before any file is
        parsed, so a corrupted or swapped graph is refused instead of answering wrongly (with
        `$LAYA_SESSION_CACHE` set, a file unchanged since a load verified it is not hashed again:
        `laya_onnx.core.verified`).

        `defer_weights=True` leaves out the graph's external data (raw tensor bytes, which nothing
        parses: the verified graph says where each tensor lies): the caller checks it with
        `verify_weights` (or `weights_verified`) before anything answers."""
        root = Path(root)
        if not root.is_dir():
            raise BundleError(f"bundle {str(root)!r} is not a directory")
        mpath = root / MANIFEST_FILE
        if not mpath.exists():
            if not (root / GRAPH_FILE).exists():
                raise BundleError(not_a_bundle(root))
            # Every file is verified against the manifest's hashes before it is parsed: without it
            # nothing could be, so a bundle that lost it is refused rather than run unchecked.
            raise BundleError(
                f"bundle {str(root)!r} has no {MANIFEST_FILE}, so its files cannot be verified; "
                "re-export it (laya-onnx export CHECKPOINT -o BUNDLE) or copy the whole bundle folder"
            )
        data = read_json_object(mpath, f"bundle {str(root)!r}", BundleError)
        if data.get("format") != FORMAT:
            raise BundleError(f"bundle {str(root)!r}: {MANIFEST_FILE} is not a {FORMAT} manifest")
        if data.get("format_version") != FORMAT_VERSION:
            raise BundleError(
                f"bundle {str(root)!r}: manifest format_version {data.get('format_version')!r} "
                f"is not supported by this laya-onnx (expects {FORMAT_VERSION}); re-export it"
            )
        try:
            manifest = Manifest.parse(data)
        except ManifestError as exc:
            raise BundleError(str(exc)) from None
        check_graph_data(root, manifest)
        if verify:
            later = set(manifest.external_data) if defer_weights else set()
            listed = {name: e for name, e in manifest.files.items() if name not in later}
            verify_files(root, listed, VerifiedFiles.from_settings())
        for need in (GRAPH_FILE, CONFIG_FILE, TOKENIZER_DIR + "/tokenizer.json"):
            if not (root / need).exists():
                raise BundleError(f"bundle {str(root)!r} has no {need}; is it a laya-onnx export?")
        config = read_json_object(root / CONFIG_FILE, f"bundle {str(root)!r}", BundleError)
        return cls(root=root, manifest=manifest, config=config)

    def verify_weights(self) -> None:
        """Check the graph's external data against the manifest (what `open(defer_weights=True)`
        left unchecked)."""
        external = {name: self.manifest.files[name] for name in self.manifest.external_data}
        verify_files(self.root, external, VerifiedFiles.from_settings())


@contextmanager
def weights_verified(bundle: Bundle | None) -> Iterator[Callable[[], None]]:
    """For the time of the block, hash `bundle`'s external data in a thread (`verify_weights`;
    hashing and onnxruntime's session set-up both release the GIL, so opening a session inside
    the block overlaps them). Yields `wait`, which blocks until the hash is checked and raises
    its `BundleError`. Leaving the block always waits, and a mismatch is raised in place of what
    the block raised: a session that failed on a corrupted file names the file. None: no-op."""
    if bundle is None or not bundle.manifest.external_data:
        yield lambda: None
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="laya-verify") as pool:
        checked = pool.submit(bundle.verify_weights)
        try:
            yield checked.result
        except BaseException:
            checked.result()  # a BundleError replaces the block's failure (chained to it)
            raise
        checked.result()


def read_manifest_quietly(root: Path) -> Manifest | None:
    """The manifest of the bundle at `root`, or None when it is missing, unreadable or not one."""
    try:
        data = json.loads((root / MANIFEST_FILE).read_text(encoding="utf-8"))
        return Manifest.parse(data) if isinstance(data, dict) else None
    except (OSError, ValueError):  # ManifestError and JSON errors included
        return None


def bundle_origin(manifest: Manifest | None, root: Path) -> str | None:
    """Where a bundle came from: its Hub checkpoint (`org/repo[/subfolder]`, the manifest's
    `source`), else the bundle folder's name. Never an absolute path (that would publish the
    host's filesystem layout)."""
    source = manifest.source if manifest is not None else None
    if source is not None and source.repo:
        return "%s/%s" % (source.repo, source.subfolder) if source.subfolder else source.repo
    return root.name or None


def check_graph_data(root: Path, manifest: Manifest) -> None:
    """The graph's external data must be listed (so hashed) by the manifest, and a data file the
    manifest does not list must not sit beside the graph: it would be read unverified."""
    files = manifest.files
    for name in manifest.external_data:
        if name not in files:
            raise BundleError(
                f"bundle {str(root)!r}: the graph's external data {name!r} is not hashed in {MANIFEST_FILE}; re-export it"
            )
    if (root / GRAPH_DATA_FILE).exists() and GRAPH_DATA_FILE not in files:
        raise BundleError(
            f"bundle {str(root)!r} holds {GRAPH_DATA_FILE}, which its manifest does not list (left by another "
            "export?); re-export the bundle into an empty directory"
        )


def is_safe_name(name: str) -> bool:
    """A manifest's file name that stays inside its bundle: relative, POSIX, no `.`/`..` parts.
    Judged by its text, not by resolving it: a bundle pulled from the Hub is a snapshot whose
    files are links into the cache's blob store, outside the bundle's folder."""
    return (
        bool(name)
        and "\\" not in name
        and not name.startswith("/")
        and not any(part in ("", ".", "..") for part in name.split("/"))
    )


def verify_files(root: Path, files: dict[str, FileEntry], records: VerifiedFiles | None = None) -> None:
    """Check each listed file's sha256; names must stay inside `root`. A file `records` holds as
    verified, unchanged since, is not hashed again; one that matches is recorded there."""
    for name, entry in files.items():
        if not is_safe_name(name):
            raise BundleError(f"bundle manifest lists an unsafe path {name!r}")
        path = root / name
        if not path.is_file():
            raise BundleError(f"bundle {str(root)!r} is missing {name!r}, which its manifest lists")
        want = entry.sha256
        if records is not None and records.holds(path, want):
            continue
        stat = path.stat()
        got = sha256_file(path)
        if got.lower() != want.lower():
            raise BundleError(
                f"bundle {str(root)!r}: sha256 mismatch for {name!r} (manifest {want}, file {got}); "
                "the bundle was modified or corrupted, re-export it"
            )
        if records is not None:
            records.add(path, stat, got)
