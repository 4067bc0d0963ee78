"""`laya-onnx bench agent`: speed against the reference, as ratios measured in one run, interleaved.

Absolute times drift 20-30% on shared machines within minutes; alternating ours and the
reference call by call and reporting the ratio of medians cancels most of that drift. Every
call goes through the public API (`predict` for one state, `predict_batch` for many), as a
user's would. Beside the times:

  * the ratio's range over the repeats (each repeat's reference time over its bundle time);
  * our per-call Python part (validation, tokenization, rows, decoding, gate) against the
    session run, from a timer around `session.run`;
  * peak RSS: the bench process's own high-water mark (both runtimes loaded), and, unless
    `rss=False`, each runtime's peak alone on that workload in a fresh child process (that
    child imports only its runtime: ours never loads torch);
  * whether ours answered as the reference did: identical decisions, the largest difference
    between printed values.

On a CPU with bf16 instructions (AVX512-BF16, AMX) the reference also runs in its bf16 mode
(`LAYA_CPU_AMP=bf16`, torch autocast) as a second column; every bundle's ratio is given against
both. An int8 bundle runs once per kernel asked for (`int8_kernels`: auto, u8s8, u8u8), labelled
`BUNDLE [kernel]` when forced. Every report names the CPU and the flags its figures depend on:
the report's `cpu`, each workload's `cpu` and the first line printed per workload.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from laya_onnx.bench.child import python_module
from laya_onnx.bench.sample import README_REQUEST
from laya_onnx.core import settings
from laya_onnx.core.int8_kernel import AUTO

STATE = README_REQUEST["state"]
QUESTIONS = README_REQUEST["questions"]
SHORT_QUESTION = {"refund": QUESTIONS["refund"]}
#: ~80 tokens: a support message with some history.
STATE_80 = (
    STATE + ". I ordered the annual plan on the 3rd and the card statement shows two payments of "
    "the same amount on the 4th. Support chat closed my ticket without an answer. Please refund "
    "the duplicate payment to the original card."
)

#: name -> (states, questions, what it is). One state is sent with `predict`, more with
#: `predict_batch`.
WORKLOADS: dict[str, tuple[list[Any], dict[str, Any], str]] = {
    "readme-1x3": ([STATE], QUESTIONS, "the README request: one short state, 3 questions"),
    "state80-1x3": ([STATE_80], QUESTIONS, "one ~80-token state, 3 questions"),
    "short-1x1": ([STATE], SHORT_QUESTION, "one short state, one noul question"),
    "batch-32x3": (
        [STATE + " " + "More context. " * (i % 8) for i in range(32)],
        QUESTIONS,
        "32 states of 16-65 tokens x 3 questions, one predict_batch",
    ),
    "batch-8x3": (
        [STATE + " " + "More context. " * (5 * i) for i in range(8)],
        QUESTIONS,
        "8 states x 3 questions, one predict_batch",
    ),
    "long-1x3": (
        ["The invoice was paid twice by the customer. " * 120],
        QUESTIONS,
        "one 512-token state (cut at max_len), 3 questions",
    ),
}
DEFAULT_WORKLOADS = ("readme-1x3", "state80-1x3", "short-1x1", "batch-32x3")
#: Timed calls per runtime and workload.
DEFAULT_REPEATS = 10
#: Calls each runtime makes alone in its child process before its peak RSS is read.
DEFAULT_RSS_CALLS = 3
REFERENCE = "reference"
#: The reference in its CPU bf16 mode (`settings.REFERENCE_CPU_AMP`, read when an Agent is built).
REFERENCE_BF16 = "reference-bf16"


def peak_rss_mib() -> float:
    """This process's peak resident set so far, MiB: /proc's VmHWM (Linux; getrusage's maxrss
    survives exec, so a child would report its parent's), else getrusage."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024.0, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


def call_for(agent: Any, name: str) -> Callable[[], Any]:
    states, questions, _ = WORKLOADS[name]
    if len(states) == 1:
        return partial(agent.predict, states[0], questions)
    return partial(agent.predict_batch, states, questions)


class SessionTimer:
    """Wraps an ONNXAgent's `session.run` to time the forward passes of each call."""

    def __init__(self, agent: Any):
        self.seconds = 0.0
        run = agent.session.run

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return run(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        agent.session.run = timed


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def _numbers(result: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten a result's answers to {path: value} (numbers and decisions)."""
    out: dict[str, Any] = {}
    if isinstance(result, dict):
        for k, v in result.items():
            if k in ("usage", "model", "legend"):
                continue
            out.update(_numbers(v, f"{prefix}/{k}"))
    elif isinstance(result, list):
        for i, v in enumerate(result):
            out.update(_numbers(v, f"{prefix}/{i}"))
    else:
        out[prefix] = result
    return out


def agreement(ours: Any, reference: Any) -> dict[str, Any]:
    """The same answer keys and the same non-numeric values (choice labels, types), and the
    largest gap between printed numbers (rounded to 1e-4 by both). A quick check of a timed
    run; `laya-onnx parity` is the proof."""
    a, b = _numbers(ours), _numbers(reference)
    shared = a.keys() & b.keys()
    gaps = [abs(a[k] - b[k]) for k in shared if isinstance(a[k], float) and isinstance(b[k], float)]
    return {
        "same_keys": a.keys() == b.keys(),
        "decisions_identical": all(a[k] == b[k] for k in shared if not isinstance(a[k], float)),
        "max_printed_gap": round(max(gaps, default=0.0), 6),
    }


def time_workload(
    runtimes: dict[str, Any], name: str, repeats: int, timers: dict[str, SessionTimer]
) -> dict[str, Any]:
    """Interleave every runtime's call `repeats` times (order alternating) after one warm-up."""
    calls = {label: call_for(agent, name) for label, agent in runtimes.items()}
    answers = {label: fn() for label, fn in calls.items()}  # warm-up: first-call allocations, caches
    times: dict[str, list[float]] = {label: [] for label in calls}
    python: dict[str, list[float]] = {label: [] for label in timers}
    session: dict[str, list[float]] = {label: [] for label in timers}
    for i in range(repeats):
        order = list(calls) if i % 2 == 0 else list(reversed(calls))
        for label in order:
            timer = timers.get(label)
            if timer is not None:
                timer.seconds = 0.0
            start = time.perf_counter()
            calls[label]()
            ms = (time.perf_counter() - start) * 1000.0
            times[label].append(ms)
            if timer is not None:
                session[label].append(timer.seconds * 1000.0)
                python[label].append(ms - timer.seconds * 1000.0)
    out: dict[str, Any] = {
        "what": WORKLOADS[name][2],
        "ms": {label: _spread(v) for label, v in times.items()},
        "bundles": {},
        "process_peak_rss_mib": peak_rss_mib(),
    }
    if REFERENCE_BF16 in times:
        out["reference_bf16"] = {
            **_ratio(times[REFERENCE], times[REFERENCE_BF16]),
            "agreement": agreement(answers[REFERENCE_BF16], answers[REFERENCE]),
        }
    for label in timers:
        ratio = _ratio(times[REFERENCE], times[label])
        auto = forced_from(label)
        out["bundles"][label] = {
            "speedup_vs_reference": ratio["speedup"],
            "speedup_range": ratio["range"],
            **(
                {"speedup_vs_reference_bf16": _ratio(times[REFERENCE_BF16], times[label])}
                if REFERENCE_BF16 in times
                else {}
            ),
            "python_ms": _spread(python[label]),
            "session_ms": _spread(session[label]),
            "agreement": agreement(answers[label], answers[REFERENCE]),
            # a forced int8 kernel computes the same integers as the bundle's own choice
            **(
                {"same_answers_as": auto, "same_answers": answers[label] == answers[auto]}
                if auto in answers
                else {}
            ),
        }
    return out


def forced_from(label: str) -> str:
    """The label of the bundle a forced-kernel run (`BUNDLE [kernel]`) forces, else ''."""
    return label.rsplit(" [", 1)[0] if label.endswith("]") else ""


def _ratio(base: Sequence[float], times: Sequence[float]) -> dict[str, Any]:
    """`base`'s median over `times`' median, and the range of the per-repeat ratios."""
    ratios = [b / t for b, t in zip(base, times, strict=True)]
    return {
        "speedup": round(statistics.median(base) / statistics.median(times), 3),
        "range": [round(min(ratios), 3), round(max(ratios), 3)],
    }


def child_peak_rss(
    runtime: str,
    checkpoint: str,
    bundle: str,
    workload: str,
    threads: int | None,
    calls: int = 3,
    int8_kernel: str | None = None,
) -> dict[str, Any]:
    """One runtime alone on one workload in a fresh process: idle and peak RSS (MiB) after `calls`."""
    cmd = python_module("laya_onnx.bench.agent", runtime, checkpoint, bundle, workload)
    cmd += [str(threads or 0), str(calls), int8_kernel or AUTO]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-500:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def load_reference_bf16(checkpoint: str | Path) -> Any:
    """The reference with `LAYA_CPU_AMP=bf16` (torch autocast on CPU), read as its Agent is built."""
    from laya_onnx.parity.runner import load_reference

    env = settings.REFERENCE_CPU_AMP.env
    before = os.environ.get(env)
    os.environ[env] = "bf16"
    try:
        return load_reference(checkpoint)
    finally:
        if before is None:
            del os.environ[env]
        else:
            os.environ[env] = before


def bundle_runs(paths: Sequence[str], int8_kernels: Sequence[str]) -> list[tuple[str, str, str | None]]:
    """(label, bundle, int8 kernel) per timed runtime: an int8 bundle once per kernel asked for
    (labelled `BUNDLE [kernel]` unless auto), any other bundle once."""
    from laya_onnx.core.bundle import read_manifest_quietly

    runs: list[tuple[str, str, str | None]] = []
    for path in paths:
        manifest = read_manifest_quietly(Path(path))
        if manifest is None or manifest.graph_precision.precision != "int8":
            runs.append((path, path, None))
            continue
        for kernel in int8_kernels:
            runs.append((path if kernel == AUTO else f"{path} [{kernel}]", path, kernel))
    return runs


def run_bench(
    checkpoint: str | Path,
    bundles: str | Path | Sequence[str | Path],
    repeats: int = DEFAULT_REPEATS,
    threads: int | None = None,
    workloads: Sequence[str] | None = None,
    rss: bool = True,
    progress: Callable[[str], None] | None = None,
    int8_kernels: Sequence[str] = (AUTO,),
    reference_bf16: bool | None = None,
    rss_calls: int = DEFAULT_RSS_CALLS,
) -> dict[str, Any]:
    """Time the reference and each bundle on each workload, interleaved; see the module doc.

    `reference_bf16`: time the reference's bf16 mode too (None: where the CPU has bf16 instructions;
    forcing it on a CPU without them can kill the process); the report's `reference_bf16` says
    what the reference's Agent then computes in (its autocast dtype). `rss_calls`: calls per
    runtime in each peak-RSS child (one of the 32-state batch takes torch tens of seconds)."""
    import torch

    from laya_onnx.core.agent import ONNXAgent
    from laya_onnx.core.int8_kernel import cpu_info, requested_kernel
    from laya_onnx.parity.runner import load_reference
    from laya_onnx.parity.versions import tool_versions

    paths = [str(bundles)] if isinstance(bundles, (str, Path)) else [str(b) for b in bundles]
    names = list(workloads or DEFAULT_WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise ValueError(
            "unknown workload(s) %s; choose from %s" % (", ".join(unknown), ", ".join(WORKLOADS))
        )
    kernels = [requested_kernel(k) for k in int8_kernels]
    cpu = cpu_info()
    if reference_bf16 is None:  # without bf16 instructions torch's autocast may die of SIGILL
        reference_bf16 = cpu.bf16
    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    runtimes: dict[str, Any] = {REFERENCE: load_reference(checkpoint)}
    if reference_bf16:
        runtimes[REFERENCE_BF16] = load_reference_bf16(checkpoint)
    runs = bundle_runs(paths, kernels)
    with warnings.catch_warnings():  # clamped-temperature warnings at load, as the reference's
        warnings.simplefilter("ignore", RuntimeWarning)
        for label, path, kernel in runs:
            runtimes[label] = ONNXAgent(path, threads=threads, int8_kernel=kernel)
    timers = {label: SessionTimer(runtimes[label]) for label, _, _ in runs}
    out: dict[str, Any] = {
        "checkpoint": str(checkpoint),
        "cpu": cpu.as_dict(),
        "bundles": {
            label: {
                "providers": runtimes[label].providers,
                "precision": runtimes[label].precision,
                "int8_kernel": runtimes[label].int8_kernel,
            }
            for label, _, _ in runs
        },
        "threads": threads,
        "repeats": repeats,
        **({"reference_bf16": autocast_of(runtimes[REFERENCE_BF16])} if reference_bf16 else {}),
        "tools": tool_versions(),
        "workloads": {},
    }
    for name in names:
        figures = time_workload(runtimes, name, repeats, timers)
        figures["cpu"] = cpu.label
        out["workloads"][name] = figures
        if progress:
            progress(format_workload(name, figures))
    if rss:
        for name in names:
            child = partial(child_peak_rss, checkpoint=str(checkpoint), workload=name, threads=threads)
            peaks = {REFERENCE: child(REFERENCE, bundle=paths[0], calls=rss_calls)}
            if reference_bf16:
                peaks[REFERENCE_BF16] = child(REFERENCE_BF16, bundle=paths[0], calls=rss_calls)
            for label, path, kernel in runs:
                peaks[label] = child("ours", bundle=path, calls=rss_calls, int8_kernel=kernel)
            out["workloads"][name]["peak_rss_alone_mib"] = peaks
            out["workloads"][name]["rss_calls"] = rss_calls
            if progress:
                progress(
                    "  %-12s peak RSS alone (%d calls, %s): %s"
                    % (name, rss_calls, cpu.label, json.dumps(peaks))
                )
    return out


def autocast_of(reference: Any) -> dict[str, Any]:
    """What a reference Agent computes its forward in: `amp_enabled` and `dtype` as it reports them."""
    return {
        "env": "%s=bf16" % settings.REFERENCE_CPU_AMP.env,
        "amp_enabled": bool(getattr(reference, "amp_enabled", False)),
        "dtype": str(getattr(reference, "dtype", None)),
    }


def format_workload(name: str, figures: dict[str, Any]) -> str:
    lines = [
        "%-12s reference %8.2f ms (%.2f-%.2f)  process peak RSS %.0f MiB  [%s]"
        % (
            name,
            *(figures["ms"][REFERENCE][k] for k in ("median", "min", "max")),
            figures["process_peak_rss_mib"],
            figures["cpu"],
        )
    ]
    bf16 = figures.get("reference_bf16")
    if bf16 is not None:
        ms = figures["ms"][REFERENCE_BF16]
        lines.append(
            "  %s: %.2f ms (%.2f-%.2f)  %.2fx (range %.2f-%.2f)  decisions %s, max printed gap %.4f"
            % (
                REFERENCE_BF16,
                ms["median"],
                ms["min"],
                ms["max"],
                bf16["speedup"],
                *bf16["range"],
                _decided(bf16),
                bf16["agreement"]["max_printed_gap"],
            )
        )
    for label, b in figures["bundles"].items():
        ms = figures["ms"][label]
        lines.append(
            "  %s: %.2f ms (%.2f-%.2f)  %.2fx (range %.2f-%.2f)%s  python %.3f ms (min %.3f) + session %.2f ms"
            "  decisions %s, max printed gap %.4f%s"
            % (
                label,
                ms["median"],
                ms["min"],
                ms["max"],
                b["speedup_vs_reference"],
                *b["speedup_range"],
                (
                    ", %.2fx bf16 (range %.2f-%.2f)"
                    % (b["speedup_vs_reference_bf16"]["speedup"], *b["speedup_vs_reference_bf16"]["range"])
                    if "speedup_vs_reference_bf16" in b
                    else ""
                ),
                b["python_ms"]["median"],
                b["python_ms"]["min"],
                b["session_ms"]["median"],
                _decided(b),
                b["agreement"]["max_printed_gap"],
                (
                    "; answers %s %s's"
                    % ("identical to" if b["same_answers"] else "DIFFER from", b["same_answers_as"])
                    if "same_answers" in b
                    else ""
                ),
            )
        )
    return "\n".join(lines)


def format_summary(report: dict[str, Any]) -> str:
    """The run as one short table: each runtime's median per workload, its ratio to the
    reference (and that ratio's range over the repeats), whether it decided as the reference
    did, and its peak RSS alone (where measured)."""
    first: dict[str, Any] = next(iter(report["workloads"].values()), {})
    lines = [
        "%s; %d threads, %d interleaved calls per runtime; x ref = reference median / this median"
        % (first.get("cpu", "CPU unknown"), report["threads"], report["repeats"]),
        "%-12s %-28s %10s %6s %13s %10s %9s"
        % ("workload", "runtime", "median ms", "x ref", "x ref range", "decisions", "peak MiB"),
    ]
    for name, figures in report["workloads"].items():
        peaks = figures.get("peak_rss_alone_mib", {})
        # (runtime, its ratio to the reference, the ratio's range, its decisions against the reference's)
        rows: list[tuple[str, float, list[float] | None, str]] = [(REFERENCE, 1.0, None, "-")]
        bf16 = figures.get("reference_bf16")
        if bf16 is not None:
            rows.append((REFERENCE_BF16, bf16["speedup"], bf16["range"], _decided(bf16)))
        for label, b in figures["bundles"].items():
            rows.append((label, b["speedup_vs_reference"], b["speedup_range"], _decided(b)))
        for label, speedup, spread, decided in rows:
            peak = peaks.get(label)
            lines.append(
                "%-12s %-28s %10.2f %6.2f %13s %10s %9s"
                % (
                    name,
                    label,
                    figures["ms"][label]["median"],
                    speedup,
                    "%.2f-%.2f" % tuple(spread) if spread else "",
                    decided,
                    "%.0f" % peak if isinstance(peak, (int, float)) else "",
                )
            )
    return "\n".join(lines)


def _decided(figures: dict[str, Any]) -> str:
    return "identical" if figures["agreement"]["decisions_identical"] else "DIFFER"


def _rss_now_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024.0, 1)
    return float("nan")


def _child(argv: list[str]) -> int:
    """`python -m laya_onnx.bench.agent RUNTIME CHECKPOINT BUNDLE WORKLOAD THREADS CALLS INT8_KERNEL`."""
    runtime, checkpoint, bundle, workload, threads_arg, calls_arg, kernel = argv
    threads = int(threads_arg) or None
    if runtime in (REFERENCE, REFERENCE_BF16):
        import torch

        from laya_onnx.parity.runner import load_reference

        if threads:
            torch.set_num_threads(threads)
        agent: Any = (load_reference_bf16 if runtime == REFERENCE_BF16 else load_reference)(checkpoint)
    else:
        from laya_onnx.core.agent import ONNXAgent

        agent = ONNXAgent(bundle, threads=threads, int8_kernel=kernel)
    idle = _rss_now_mib()
    fn = call_for(agent, workload)
    for _ in range(int(calls_arg)):
        fn()
    print(json.dumps({"idle_rss_mib": idle, "peak_rss_mib": peak_rss_mib()}))
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
