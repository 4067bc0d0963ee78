"""The export's error types (shared by every export step)."""

from __future__ import annotations

from laya_onnx.core.errors import UserError


class ExportError(UserError, ValueError):
    """The export could not produce a bundle (nothing was written)."""


class ValidationError(ExportError):
    """ONNX Runtime disagrees with torch beyond the tolerance; nothing was written."""


class CheckpointError(ExportError):
    """A checkpoint that is not a readable Laya checkpoint (configs, weights, their shapes)."""


class ExportOptionError(ExportError):
    """An export option with a value it cannot take (checked before anything is read or written)."""
