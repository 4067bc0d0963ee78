"""Calibration files: the JSON `laya.Agent.save_calibration` writes, read with laya 0.4.15's rules.

A file holds the three per-type temperatures, the per-bucket temperatures and optionally a
histogram-binning map for `answer_confidence` (docs/semantics.md#calibration-files). Its *shape* is
checked strictly and refused naming the file and the field; its temperatures are forgiven (clamped,
with a warning) exactly as a checkpoint's are; a binning value out of [0, 1] is refused, since
nothing can stand in for it. Applying a file replaces the whole calibration state: a file without a
binning map clears one. Version 2 files record the checkpoint they were fitted for; a mismatch warns
and still loads.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laya_onnx.core.calibration import TEMP_MAX, TEMP_MIN, Calibration, clamp_temperatures
from laya_onnx.core.errors import SourceNotFound, UserError
from laya_onnx.core.manifest import Manifest

#: The calibration file inside a bundle (`laya-onnx export --calibration FILE` copies it there).
BUNDLE_CALIBRATION_FILE = "calibration.json"
#: The newest payload version (the one that records the checkpoint's identity).
CALIBRATION_VERSION = 2
N_QTYPES = 3
#: Config keys the identity comparison leaves out: the file itself carries them.
IDENTITY_SKIP = ("temperature", "temperature_by_options")


class CalibrationFileError(UserError, ValueError):
    """A calibration file that cannot be read; the text names the file and the fault."""


@dataclass(frozen=True)
class CalibrationPayload:
    """A checked calibration file: raw temperatures (clamped when applied), the binning map, and
    the checkpoint identity it records (version 2)."""

    version: int
    temperature: list[Any]
    temperature_by_options: dict[str, Any]
    binning_map: dict[str, Any] | None
    model_id_or_path: Any = None
    subfolder: Any = None
    config: Any = None


def _version(value: Any) -> int:
    if value is None:
        return 1
    bad = ValueError("calibration JSON version must be an integer, got %r" % (value,))
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise bad
    if isinstance(value, float) and not value.is_integer():
        raise bad  # int() would truncate 1.9 to 1 and skip the identity check
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        raise bad from None


def _finite(v: float) -> bool:
    try:
        return math.isfinite(v)
    except OverflowError:  # an int past float range
        return False


def _check_binning_map(binning: Any) -> None:
    if not isinstance(binning, dict):
        raise ValueError(
            "calibration JSON binning_map must be an object of bucket -> {bins, values}, got %s"
            % type(binning).__name__
        )
    for name, entry in binning.items():
        if not isinstance(entry, dict):
            raise ValueError(
                'calibration JSON binning_map[%r] must be an object with "bins" and "values", got %s'
                % (name, type(entry).__name__)
            )
        bins, values = entry.get("bins"), entry.get("values")
        if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
            raise ValueError(
                'calibration JSON binning_map[%r] must have an integer "bins" >= 1, got %r' % (name, bins)
            )
        if not isinstance(values, (list, tuple)) or len(values) != bins:
            raise ValueError(
                'calibration JSON binning_map[%r] must have "values" of length "bins" (%d)' % (name, bins)
            )
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
            raise ValueError(
                "calibration JSON binning_map[%r] values must be numbers, got %r" % (name, values)
            )
        for v in values:
            if not _finite(v):
                raise ValueError(
                    "calibration JSON binning_map[%r] values must be finite, got %r" % (name, values)
                )
            if not 0.0 <= v <= 1.0:
                raise ValueError(
                    "calibration JSON binning_map[%r] values must be in [0, 1], got %r" % (name, values)
                )


def parse_calibration(payload: Any) -> CalibrationPayload:
    """Check a decoded calibration JSON value; ValueError with laya's text for a bad shape."""
    if not isinstance(payload, dict):
        raise ValueError("calibration JSON must be an object, got %s" % type(payload).__name__)
    version = _version(payload.get("version", 1))
    temps = payload.get("temperature")
    if not isinstance(temps, (list, tuple)) or len(temps) != N_QTYPES:
        raise ValueError("calibration JSON must contain temperature: [3 floats]")
    by_options = payload.get("temperature_by_options")
    if by_options is None:  # absent or null: a file from before bucket temperatures
        by_options = {}
    if not isinstance(by_options, dict):
        raise ValueError(
            "calibration JSON temperature_by_options must be an object of bucket -> float, got %s"
            % type(by_options).__name__
        )
    binning = payload.get("binning_map")
    if binning is not None:
        _check_binning_map(binning)
    return CalibrationPayload(
        version=version,
        temperature=list(temps),
        temperature_by_options={str(k): v for k, v in by_options.items()},
        binning_map=binning,
        model_id_or_path=payload.get("model_id_or_path"),
        subfolder=payload.get("subfolder"),
        config=payload.get("config"),
    )


def load_calibration(path: str | os.PathLike) -> CalibrationPayload:
    """Read and check a calibration file; CalibrationFileError naming `path` and the fault
    (FileNotFoundError for a missing file)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SourceNotFound(f"calibration file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CalibrationFileError(f"calibration file {str(path)!r} cannot be read: {exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CalibrationFileError(f"calibration file {str(path)!r} is not valid JSON: {exc}") from None
    try:
        return parse_calibration(data)
    except ValueError as exc:
        raise CalibrationFileError(f"calibration file {str(path)!r}: {exc}") from None


def config_identity(cfg: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A checkpoint config without the temperature fields a calibration file itself stores."""
    if cfg is None:
        return None
    return {str(k): cfg[k] for k in cfg if k not in IDENTITY_SKIP}


def warn_if_other_checkpoint(
    payload: CalibrationPayload, model_id_or_path: Any, subfolder: Any, cfg: Mapping[str, Any] | None
) -> None:
    """Version 2+ files: warn (and still load) when the recorded checkpoint is not this one."""
    if payload.version < CALIBRATION_VERSION:
        return
    current_cfg = config_identity(cfg)
    recorded = (payload.model_id_or_path, payload.subfolder, payload.config)
    if recorded == (model_id_or_path, subfolder, current_cfg):
        return
    note = " Checkpoint config identity differs." if payload.config != current_cfg else ""
    warnings.warn(
        "calibration was fitted for model_id_or_path=%r subfolder=%r but this agent is "
        "model_id_or_path=%r subfolder=%r.%s Loading the temperatures anyway."
        % (payload.model_id_or_path, payload.subfolder, model_id_or_path, subfolder, note),
        UserWarning,
        stacklevel=4,
    )


def apply_calibration(calibration: Calibration, payload: CalibrationPayload) -> Calibration:
    """`calibration` with the file's temperatures (clamped, warning on what the clamp replaced)
    and binning map installed; language overrides stay as they were."""
    temps, by_options, replaced = clamp_temperatures(payload.temperature, payload.temperature_by_options)
    if replaced:
        warnings.warn(
            "laya: calibration temperatures are invalid or outside [%g, %g]; using %s. Treat "
            "confidence from the affected entries as uncalibrated." % (TEMP_MIN, TEMP_MAX, replaced),
            RuntimeWarning,
            stacklevel=4,
        )
    return dataclasses.replace(
        calibration, temperature=temps, temperature_by_options=by_options, binning_map=payload.binning_map
    )


def bundle_calibration(bundle_root: Path, manifest: Manifest) -> Path | None:
    """The calibration file a bundle's manifest names (`"calibration": {"file": ...}`), or None."""
    record = manifest.calibration
    if record is None or not record.file:
        return None
    return bundle_root / record.file
