"""How the command line reports an exception: an exit status and one line.

The package's own error types are listed here, and only here, by what they mean for the user:

  * `USER_ERRORS` (exit 2, "error: ..."): input the user can fix, a bad option, request, file,
    setting, bundle or checkpoint: every type derived from `laya_onnx.core.errors.UserError`;
  * `FAILURES` (exit 1, "failed: ..."): the command ran and could not succeed, a mismatch it
    measured or the machine it ran on (a full disk, a port in use, an onnxruntime failure).

Anything else is a bug in laya-onnx: exit 1 and one line that says so and how to see where it
happened (`laya-onnx --traceback COMMAND ...` prints Python's traceback as well). A type is
named by its module and name, matched along the exception's classes, so classifying imports
nothing: a command that never loaded torch does not load it to report an error.
"""

from __future__ import annotations

import sys

from laya_onnx.cli.common import EXIT_FAILED, EXIT_USAGE, invocation

#: Input the user can fix: exit 2. Every such type derives from `UserError` (InvalidRequest and the
#: other request mistakes, ConfigError, BundleError, ManifestError, OutputExistsError,
#: TokenizerError, ProviderError, Int8KernelError, CalibrationFileError, ExportError, ScoreError,
#: UsageError, ...), so a new one needs no entry here.
USER_ERRORS = ("laya_onnx.core.errors.UserError",)

#: The command ran and could not succeed: exit 1.
FAILURES = (
    "laya_onnx.export.errors.ValidationError",
    "laya_onnx.core.session.ProviderUnavailable",
    "laya_onnx.score.ray_data.RayStartError",
    "builtins.OSError",
    "builtins.MemoryError",
)

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
    "matplotlib": "plot",
    "opentelemetry": "otel",
    "onnxruntime": "cpu",
    "openvino": "openvino",
}
#: laya-onnx's own dependencies: missing, the command runs under a Python it was not installed into.
OWN_DEPENDENCIES = ("numpy", "tokenizers", "huggingface_hub", "tqdm")


def install_hint(module: str | None) -> str:
    """What to install for a missing module: the extra that brings it (`pip install
    'laya-onnx[EXTRA]'`, onnxruntime's is `cpu` or `gpu`), or, for one of laya-onnx's own
    dependencies or any other module outside the package, that this Python lacks it; "" for a
    module of laya-onnx itself (a bug)."""
    top = (module or "").split(".")[0]
    if not top or top == "laya_onnx":
        return ""
    extra = EXTRA_OF.get(top)
    if extra is not None:
        also = " or [gpu]" if extra == "cpu" else ""
        return (
            f"; install it with: pip install 'laya-onnx[{extra}]'{also} "
            f"(or -c lock/dev.txt -e '.[{extra}]' in a checkout)"
        )
    what = "one of laya-onnx's own dependencies" if top in OWN_DEPENDENCIES else "a module it needs"
    return (
        f"; {what} is not installed for this Python ({sys.executable}): run the laya-onnx of the "
        "environment it was installed into, or install it here: pip install 'laya-onnx[cpu]'"
    )


def with_notes(message: str, exc: BaseException) -> str:
    """The message and the exception's notes (`add_note`: what answers the refusal), one line."""
    notes = getattr(exc, "__notes__", None) or []
    if not notes:
        return message
    # The message is laya's own text (no closing stop); the notes are sentences of their own.
    ends = "" if message.rstrip().endswith((".", "!", "?")) else "."
    return " ".join([message.rstrip() + ends, *(str(n) for n in notes)])


def listed_status(exc: BaseException) -> int | None:
    """The exit status the first of `exc`'s classes that is listed means (its most specific
    listed type decides: ValidationError is an ExportError, SourceNotFound a FileNotFoundError)."""
    for cls in type(exc).__mro__:
        name = f"{cls.__module__}.{cls.__qualname__}"
        if name in USER_ERRORS:
            return EXIT_USAGE
        if name in FAILURES:
            return EXIT_FAILED
    return None


def exit_status(exc: BaseException) -> tuple[int, str] | None:
    """(status, message) for an error the package reports in one line; None: a bug."""
    from laya_onnx.core.bundle import OutputExistsError  # torch-free, and small

    status = listed_status(exc)
    if status == EXIT_FAILED or type(exc).__module__.startswith("onnxruntime"):
        own = type(exc).__module__.startswith("laya_onnx")
        return EXIT_FAILED, "failed: " + (str(exc) if own else f"{type(exc).__name__}: {exc}")
    if isinstance(exc, OutputExistsError):
        return EXIT_USAGE, f"error: {exc.advice('--force')}"  # the CLI's word for force=True
    if status == EXIT_USAGE:
        return EXIT_USAGE, with_notes(f"error: {exc}", exc)
    if isinstance(exc, SystemExit) and isinstance(exc.code, str):
        # The serve layer exits with its own message for a bundle it cannot load.
        return EXIT_USAGE, "error: " + exc.code.removeprefix("laya-onnx: ")
    if isinstance(exc, ImportError) and install_hint(exc.name):
        return EXIT_USAGE, f"error: {exc}{install_hint(exc.name)}"  # an extra not installed
    return None


def bug_message(exc: BaseException, prog: str) -> str:
    """The one line for an exception the package does not report as an error of its own."""
    again = prog.replace("laya-onnx", f"{invocation()} --traceback", 1)
    return (
        f"internal error, a bug in laya-onnx: {type(exc).__name__}: {exc} "
        f"(run '{again} ...' again to see where it happened)"
    )
