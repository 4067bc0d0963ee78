"""The tool versions a parity report or golden file was made with (read without importing them)."""

from __future__ import annotations

import platform
from importlib import metadata

from laya_onnx import __version__ as LAYA_ONNX_VERSION

#: label -> distributions that provide it (the first one installed wins).
TOOLS = {
    "laya": ("laya",),
    "torch": ("torch",),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
    "onnx": ("onnx",),
    "numpy": ("numpy",),
    "transformers": ("transformers",),
    "tokenizers": ("tokenizers",),
}


def _installed(dists: tuple[str, ...]) -> str | None:
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def tool_versions() -> dict[str, str | None]:
    """{tool: version or None when not installed}, plus the Python version."""
    # laya_onnx from the code that runs, not from whichever checkout pip last installed
    versions: dict[str, str | None] = {"laya_onnx": LAYA_ONNX_VERSION}
    versions.update((name, _installed(dists)) for name, dists in TOOLS.items())
    versions["python"] = platform.python_version()
    return versions
