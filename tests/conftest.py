"""Session-wide fixtures and the test tiers.

    checkpoint_factory(preset="tiny-english", seed=0) -> Path   (make_checkpoint, cached; torch)
    lowered(preset, precision) -> Path                           (a gated fp16/int8 export, cached; torch)
    bundle_factory(preset="tiny-english") -> Path                (export_bundle, cached)

Tiers: a test that needs more than the runtime core (`laya-onnx[cpu]` + pytest) carries a marker
(registered in pyproject.toml) naming what it needs: `torch` (the export extra: torch,
transformers, onnx; every test using checkpoint_factory), `reference` (the reference `laya`
package), `serve` (the serve extra) and `ray` (the ray extra). A marked test whose dependency is
not importable is skipped with the reason. The `runtime` marker picks the tests that tests/run
runs again in its torch-free venv (those of them not marked `torch` or `reference`). Test modules
import torch and laya lazily, so every module collects in that venv; a module built on a tool it
lacks (schemathesis, jsonschema-rs) skips itself with pytest.importorskip.

Bundles: bundle_factory exports each preset once per session, from checkpoint_factory's
checkpoint, into a session folder, or into `$LAYA_ONNX_TEST_BUNDLES/<preset>` when that is set:
there a bundle already present is used as it is, and without torch only those are (tests/run's
full tier exports into models/ci-bundles/, and its torch-free tiers reuse them). Only
tiny-english is exported with its per-pass memory measured (`MEASURED_PRESETS`: the memory tests
use it); the probes cost six processes per export and nothing else reads the measurement.

Everything else is generated locally under pytest's tmp_path_factory; nothing touches the network
(HF_HUB_OFFLINE is forced on for the whole session).
"""

from __future__ import annotations

import importlib.util
import os
import threading
from functools import cache
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TINY_PRESETS = ("tiny-english", "tiny-multilingual", "tiny-typed-decisions")
# the presets whose session bundle carries a measured memory model (tests/core/test_memory.py's)
MEASURED_PRESETS = ("tiny-english",)
PREBUILT_BUNDLES_ENV = "LAYA_ONNX_TEST_BUNDLES"
#: The modules that take the full tier longest, longest first by their time there (`--durations`
#: of `bash tests/run`), except the second: it needs no bundle at first, so one worker starts
#: without waiting for the other's first export. pytest_collection_modifyitems runs them before
#: every other module.
LONGEST_MODULES = (
    "tests/core/test_structured.py",
    "tests/export/test_export_all.py",
    "tests/export/test_export.py",
    "tests/bench/test_bench_agent.py",
    "tests/core/test_long.py",
    "tests/serve/test_serve_hostile.py",
    "tests/serve/test_serve_fuzz.py",
    "tests/export/test_precision.py",
    "tests/bench/test_plot.py",
    "tests/core/test_tournament.py",
    "tests/serve/test_serve_reference.py",
    "tests/core/test_calibration_file.py",
    "tests/export/test_constant_shapes.py",
    "tests/bench/test_device_check.py",
    "tests/serve/test_serve_drain.py",
    "tests/core/test_hub_server.py",
    "tests/core/test_memory.py",
    "tests/checkpoints/test_checkpoints.py",
)
# Read once, here: the serve tests' no_laya_env fixture unsets every LAYA_* variable per test.
PREBUILT_BUNDLES = os.environ.get(PREBUILT_BUNDLES_ENV)

# marker -> (the modules it needs, where they come from)
TIER_NEEDS = {
    "torch": (
        ("torch", "transformers", "safetensors", "onnx"),
        "the export extra: pip install 'laya-onnx[export]'",
    ),
    "reference": (("laya",), "the dev extra, which brings laya==0.4.15: pip install 'laya-onnx[dev]'"),
    "serve": (
        ("aiohttp", "prometheus_client", "pydantic"),
        "the serve extra: pip install 'laya-onnx[serve]'",
    ),
    "ray": (("ray",), "the ray extra: pip install 'laya-onnx[ray]'; tests/run's ray tier has it"),
}


@cache
def _missing(modules: tuple[str, ...]) -> tuple[str, ...]:
    """The modules that cannot be imported here (found without importing them: torch is slow)."""
    return tuple(m for m in modules if importlib.util.find_spec(m) is None)


def pytest_collection_modifyitems(config, items):
    # the longest modules first (a stable sort: every other test keeps its place, and each module
    # its own order): tests/run's full tier hands whole modules to its pytest-xdist workers in this
    # order (--dist loadfile), so the last ones handed out are short and no worker waits long
    # for the other at the end
    longest_first = {module: rank for rank, module in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: longest_first.get(item.nodeid.split("::")[0], len(longest_first)))
    unmarked = [
        item.nodeid
        for item in items
        if "checkpoint_factory" in getattr(item, "fixturenames", ())
        and item.get_closest_marker("torch") is None
    ]
    if unmarked:
        # checkpoint_factory always needs torch; an unmarked user would fail in the runtime tier
        # instead of being deselected there.
        raise pytest.UsageError(
            "these tests use checkpoint_factory (torch) but carry no @pytest.mark.torch:\n  "
            + "\n  ".join(unmarked)
        )
    for item in items:
        for marker, (modules, source) in TIER_NEEDS.items():
            if item.get_closest_marker(marker) is None:
                continue
            missing = _missing(modules)
            if missing:
                reason = f"[{marker}] needs {', '.join(missing)}, not importable here ({source})"
                item.add_marker(pytest.mark.skip(reason=reason))


def _shared_dir(tmp_path_factory, name: str) -> Path:
    """A session folder for exports. Under pytest-xdist (tests/run's full tier runs on every core)
    it is one folder for all the workers, beside their own basetemps, so each export is made once
    (under _across_workers) and not once per worker."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / name
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp(name)


def _across_workers(out: Path):
    """A lock held by one process at a time around making `out` (an export into a folder that
    other pytest-xdist workers may be making or reading too)."""
    from filelock import FileLock

    return FileLock(f"{out}.lock")


def _export_once(lock, out: Path, checkpoint_factory, preset: str, **options) -> Path:
    """`out`, exported from checkpoint_factory(preset) with `options` unless it is there already
    (export_bundle stages a bundle: whole or absent), by one thread and one worker at a time."""
    from laya_onnx.export import export_bundle

    with lock, _across_workers(out):
        if not (out / "manifest.json").is_file():
            export_bundle(checkpoint_factory(preset), out, verbose=False, name=preset, **options)
    return out


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory):
    """Callable preset[, seed] -> checkpoint directory; each (preset, seed) is written once."""
    root = _shared_dir(tmp_path_factory, "checkpoints")
    lock = threading.Lock()

    def make(preset: str = "tiny-english", seed: int = 0) -> Path:
        from laya_onnx.checkpoints import make_checkpoint

        out = root / f"{preset}-seed{seed}"
        with lock, _across_workers(out):
            if not out.is_dir():  # make_checkpoint stages it: whole or absent
                make_checkpoint(preset, out, seed=seed)
            return out

    return make


def _prebuilt_bundles(root: Path):
    def find(preset: str = "tiny-english") -> Path:
        bundle = root / preset
        if not (bundle / "manifest.json").is_file():
            raise FileNotFoundError(
                f"{PREBUILT_BUNDLES_ENV}={root} has no bundle for preset {preset!r} "
                f"(no {bundle / 'manifest.json'}) and exporting one needs torch; export it there "
                f"(tests/run's full tier does), or unset {PREBUILT_BUNDLES_ENV}"
            )
        return bundle

    return find


@pytest.fixture(scope="session")
def bundle_factory(request, tmp_path_factory):
    """Callable preset -> bundle directory: exported (and validated) from checkpoint_factory(preset)
    once per session, or found in $LAYA_ONNX_TEST_BUNDLES (see the module's docstring)."""
    modules, source = TIER_NEEDS["torch"]
    if _missing(modules):
        if PREBUILT_BUNDLES:
            return _prebuilt_bundles(Path(PREBUILT_BUNDLES))
        pytest.skip(
            f"no bundles: {PREBUILT_BUNDLES_ENV} is unset and exporting needs "
            f"{', '.join(_missing(modules))} ({source})"
        )
    # Asked for here, not as a parameter: tests that only need bundles must not appear to use
    # checkpoint_factory (see pytest_collection_modifyitems).
    checkpoint_factory = request.getfixturevalue("checkpoint_factory")
    root = Path(PREBUILT_BUNDLES) if PREBUILT_BUNDLES else _shared_dir(tmp_path_factory, "bundles")
    lock = threading.Lock()

    def make(preset: str = "tiny-english") -> Path:
        return _export_once(
            lock, root / preset, checkpoint_factory, preset, measure_memory=preset in MEASURED_PRESETS
        )

    return make


@pytest.fixture(scope="session")
def lowered(checkpoint_factory, tmp_path_factory):
    """Callable (preset, precision) -> bundle exported (and gated) at that precision, once per
    session: the precision tests and the server's micro-batching test share the exports."""
    root = _shared_dir(tmp_path_factory, "precision")
    lock = threading.Lock()

    def make(preset: str, precision: str) -> Path:
        out = root / f"{preset}-{precision}"
        return _export_once(lock, out, checkpoint_factory, preset, precision=precision, measure_memory=False)

    return make


@pytest.fixture
def no_laya_env(monkeypatch):
    """Unset every LAYA_* variable for one test, so the developer's shell cannot change it."""
    for key in list(os.environ):
        if key.startswith("LAYA_"):
            monkeypatch.delenv(key)


@pytest.fixture(scope="module")
def tiny_english(bundle_factory) -> Path:
    """The tiny-english bundle (bundle_factory's), for modules that use one bundle throughout."""
    return bundle_factory("tiny-english")


@pytest.fixture(scope="module")
def tiny_english_agent(tiny_english):
    """An ONNXAgent on the tiny-english bundle, on CPU, shared by a module's tests."""
    from laya_onnx import ONNXAgent

    return ONNXAgent(tiny_english, providers=["CPUExecutionProvider"])
