"""A bundle's graph prepared for this machine: optimized, weights prepacked, saved once, mapped after.

Most of loading a full-size graph is onnxruntime's own work on it, repeated by every new
process: graph optimization and, above all, prepacking every GEMM's weights into the layout its
CPU kernels read (docs/coldstart.md has the figures). onnxruntime can save the optimized graph
with the prepacked weights beside it (`optimized_model_filepath` with
`session.save_external_prepacked_constant_initializers`), and a later session maps them from that
file instead of packing them again.

That saved graph is specific to this machine: the optimizer at its highest level and the packed
layouts depend on the CPU's kernels and on the onnxruntime version. So it is never part of a
bundle; it lives in a local cache folder (`$LAYA_SESSION_CACHE`, off by default), keyed by the
graph's sha256, the onnxruntime version and this CPU's model and features. It is made the first
time a bundle loads there, and kept only if it answers bit for bit as the graph it came from on
a few passes of different shapes; otherwise the graph runs as shipped, with a warning.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from laya_onnx.core import settings
from laya_onnx.core.manifest import Manifest

PREPARED_GRAPH = "prepared.onnx"
PREPARED_DATA = "prepared.onnx.data"
CPU_PROVIDER = "CPUExecutionProvider"
#: The passes a prepared graph must answer bit for bit as its source does: (rows, length).
CHECK_SHAPES: tuple[tuple[int, int], ...] = ((1, 24), (3, 57))


class PreparedGraphWarning(UserWarning):
    """The prepared graph could not be made or kept; the bundle's graph runs as shipped."""


def cache_key(identity: str) -> str:
    """What a prepared graph depends on: the source graph's bytes (`graph_identity`),
    onnxruntime's version, this CPU."""
    import onnxruntime as ort

    from laya_onnx.core.machine import read_cpu

    cpu = read_cpu()
    parts = [identity, ort.__version__, cpu.model, " ".join(sorted(cpu.flags))]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _check_feeds(rows: int, length: int) -> dict[str, np.ndarray]:
    """Inputs of varied tokens (ids below 100, which every vocabulary has) and per-row lengths."""
    from laya_onnx.core.bundle import GRAPH_INPUTS

    ids = (np.arange(rows * length, dtype=np.int64).reshape(rows, length) * 7 + 5) % 97 + 3
    mask = np.ones((rows, length), np.int64)
    for r in range(1, rows):
        mask[r, length - 5 * r :] = 0  # shorter rows, padded
    feeds = {
        "input_ids": ids * mask,
        "attention_mask": mask,
        "marker_pos": np.tile(np.array([[1, 3, 6]], np.int64), (rows, 1)),
        "marker_mask": np.ones((rows, 3), bool),
        "qtype": np.arange(rows, dtype=np.int64) % 3,
    }
    return {name: feeds[name] for name in GRAPH_INPUTS}


def _make(source: Path, folder: Path, threads: int | None) -> None:
    """Save the optimized, prepacked graph of `source` into `folder`; refuse it unless it answers
    as `source` does, bit for bit."""
    import onnxruntime as ort

    from laya_onnx.core.session import session_options

    so = session_options(threads)
    # onnxruntime warns that a graph saved at this level suits only this machine: it is keyed so
    so.log_severity_level = 3
    so.optimized_model_filepath = str(folder / PREPARED_GRAPH)
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name", PREPARED_DATA)
    so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    so.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
    shipped = ort.InferenceSession(str(source), so, providers=[CPU_PROVIDER])
    prepared = ort.InferenceSession(
        str(folder / PREPARED_GRAPH), session_options(threads), providers=[CPU_PROVIDER]
    )
    for rows, length in CHECK_SHAPES:
        feeds = _check_feeds(rows, length)
        want, got = shipped.run(None, feeds), prepared.run(None, feeds)
        if any(not np.array_equal(a, b) for a, b in zip(want, got, strict=True)):
            raise ValueError(f"its answers differ from the shipped graph's on a {rows} x {length} pass")


def prepared_graph(
    graph: Path, identity: str, threads: int | None, cache: str, verified: Callable[[], None] | None = None
) -> Path | None:
    """The prepared form of `graph` in the cache folder `cache`, made now if missing; None (with a
    `PreparedGraphWarning`) when it cannot be made or does not answer as `graph` does.
    `verified` is called before one is made and raises when the graph's files are not the ones
    `identity` names: a prepared graph is made only from verified bytes, as its key says."""
    target = Path(cache).expanduser() / cache_key(identity)
    if (target / PREPARED_GRAPH).is_file():
        return target / PREPARED_GRAPH
    if verified is not None:
        verified()
    work: Path | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".prepare-", dir=target.parent))
        _make(graph, work, threads)
        os.chmod(work, 0o755)  # mkdtemp makes it 0700
        os.replace(work, target)  # whole or absent: a reader never sees half of one
        work = None
    except Exception as exc:  # a full disk, an onnxruntime without the option, a mismatch
        warnings.warn(
            f"laya-onnx: no prepared graph of {str(graph)!r} in {cache!r} ({type(exc).__name__}: {exc}); "
            "running the bundle's graph as shipped",
            PreparedGraphWarning,
            stacklevel=3,
        )
        return None
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    return target / PREPARED_GRAPH


def graph_identity(manifest: Manifest, graph_name: str) -> str | None:
    """The sha256 of the graph file and of the external data it reads, as the manifest lists
    them; None when one is not listed."""
    digests = [manifest.digest(name) for name in (graph_name, *manifest.external_data)]
    return None if None in digests else "+".join(str(d) for d in digests)


def session_graph(
    graph: Path,
    manifest: Manifest,
    precision: str,
    providers: Sequence[Any] | Any | None,
    threads: int | None,
    verified: Callable[[], None] | None = None,
) -> Path:
    """The graph file a session should open: the prepared one when `$LAYA_SESSION_CACHE` names a
    folder and the session runs on onnxruntime's CPU provider alone, else `graph` itself
    (`verified`: see `prepared_graph`)."""
    cache = settings.SESSION_CACHE.read()
    identity = graph_identity(manifest, graph.name) if cache else None
    if not cache or identity is None or precision == "bf16":
        return graph
    names = [
        p if isinstance(p, str) else p[0]
        for p in ([providers] if isinstance(providers, str) else providers or [])
    ]
    if names != [CPU_PROVIDER]:
        import onnxruntime as ort

        if names or [
            p for p in ort.get_available_providers() if p not in (CPU_PROVIDER, "AzureExecutionProvider")
        ]:
            return graph  # an accelerator may run it: its graph is not the CPU's
    return prepared_graph(graph, identity, threads, cache, verified) or graph
