"""How the command line reports an exception: an exit status and one line."""

from __future__ import annotations

import sys

from laya_onnx.cli.common import EXIT_FAILED, EXIT_USAGE, CommandFailed

#: The extra that brings each optional module, for the install line a missing import prints.
EXTRA_OF = {
    "torch": "export",
    "transformers": "export",
    "safetensors": "export",
    "onnx": "export",
    "onnxscript": "export",
    "onnx_ir": "export",
    "aiohttp": "serve",
    "pydantic": "serve",
    "prometheus_client": "serve",
    "pyarrow": "score",
    "ray": "ray",
    "laya": "dev",
}

# Paths a user names on the command line; their absence is the user's to fix, not a failure.
_BAD_PATH = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)


def install_hint(module: str | None) -> str:
    """`; install it with: pip install 'laya-onnx[EXTRA]'` for a module an extra brings."""
    extra = EXTRA_OF.get((module or "").split(".")[0])
    if extra is None:
        return ""
    return f"; install it with: pip install 'laya-onnx[{extra}]' (or -c lock/dev.txt -e '.[{extra}]' in a checkout)"


def with_notes(message: str, exc: BaseException) -> str:
    """The message and the exception's notes (`add_note`: what answers the refusal), one line."""
    notes = getattr(exc, "__notes__", None) or []
    return " ".join([message, *(str(n) for n in notes)])


def exit_status(exc: BaseException) -> tuple[int, str] | None:
    """(status, message) for an exception the CLI reports in one line; None: let it propagate."""
    from laya_onnx.core.bundle import OutputExistsError

    if isinstance(exc, CommandFailed):
        return EXIT_FAILED, f"failed: {exc}"
    if isinstance(exc, OutputExistsError):
        return EXIT_USAGE, f"error: {exc.advice('--force')}"  # the CLI's word for force=True
    if isinstance(exc, SystemExit):
        # The serve layer exits with its own message for a bundle it cannot load.
        return EXIT_USAGE, "error: " + str(exc.code).removeprefix("laya-onnx: ")
    if isinstance(exc, ImportError):
        return EXIT_USAGE, f"error: {exc}{install_hint(exc.name)}"
    hub_errors = sys.modules.get("huggingface_hub.errors")
    bad_hub_reference = hub_errors is not None and isinstance(
        exc, (hub_errors.RepositoryNotFoundError, hub_errors.RevisionNotFoundError)
    )
    # ValueError and TypeError cover the caller-mistake types (InvalidRequest, BundleError,
    # TokenizerError, ProviderError, UsageError, the exporter's refusals).
    if isinstance(exc, (ValueError, TypeError, *_BAD_PATH)) or bad_hub_reference:
        return EXIT_USAGE, with_notes(f"error: {exc}", exc)
    if isinstance(exc, (OSError, RuntimeError)) or type(exc).__module__.startswith("onnxruntime"):
        return EXIT_FAILED, f"failed: {type(exc).__name__}: {exc}"
    return None  # anything else is a bug: Python's traceback (and exit 1) says where
