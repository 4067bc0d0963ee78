"""The benches' figures as pictures: `--plot FILE` writes one PNG (the `plot` extra, matplotlib).

Each function takes the report its measurement returns (the same dict `--json` writes) and a
path, and draws one figure of `SIZE_PX` pixels:

  * `plot_agent`   speed against accuracy: each runtime's speed-up over laya torch f32 against
                   its largest printed |Δp|, per workload and overall (`bench agent`);
  * `plot_load`    answers per second and p50/p99 latency against concurrent clients
                   (`bench http`, `bench saturate`);
  * `plot_soak`    the server's RSS, open file descriptors and /health latency over time
                   (`bench soak`);
  * `plot_memory`  the bundle's per-pass memory model against the passes measured: the export's
                   probes and the bench's own batch (`bench memory`);
  * `plot_parity`  the |Δp| of every probability against the tolerance, and how many requests
                   decided, tokenized and printed as the reference did (`parity`).

matplotlib is imported only when a figure is drawn, with the Agg backend (no display needed).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Every figure's size in pixels (width, height), at `DPI`.
SIZE_PX = (1000, 600)
DPI = 100
#: Printed probabilities have 4 decimals: a printed |Δp| under this is 0.
PRINT_UNIT = 1e-4
#: The palette of every figure (matplotlib's first colours): ours blue, laya torch grey, its bf16 orange.
BLUE, GREY, ORANGE, GREEN, RED = "#1f77b4", "#444444", "#ff7f0e", "#2ca02c", "#d62728"


def require() -> None:
    """Raise ImportError (naming matplotlib, which the `plot` extra brings) when it is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError(
            "drawing a figure needs matplotlib, which the plot extra brings", name="matplotlib"
        ) from None


def _pyplot() -> Any:
    require()
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    return plt


def _figure(rows: int = 1, cols: int = 1, **kwargs: Any) -> tuple[Any, Any]:
    plt = _pyplot()
    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(SIZE_PX[0] / DPI, SIZE_PX[1] / DPI),
        dpi=DPI,
        layout="constrained",
        squeeze=False,
        **kwargs,
    )
    return fig, axes


def _save(fig: Any, path: os.PathLike[str] | str) -> Path:
    """Write `fig` as a PNG of exactly `SIZE_PX` (no tight bounding box: the size is the contract)."""
    plt = _pyplot()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(out, format="png", dpi=DPI)
    finally:
        plt.close(fig)
    return out


def _count(n: int, noun: str) -> str:
    return "%d %s%s" % (n, noun, "" if n == 1 else "s")


def _short(label: str) -> str:
    """A bundle's label without its folders: `models/x-int8 [u8s8]` -> `x-int8 [u8s8]`."""
    head, bracket, tail = label.partition(" [")
    return Path(head).name + (bracket + tail if bracket else "")


def _plain_log_labels(axis: Any) -> None:
    """A log axis labelled 2, 5, 10, 50 rather than 2×10⁰, 5×10¹."""
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(ScalarFormatter())
    axis.set_minor_formatter(NullFormatter())


# -- bench agent ----------------------------------------------------------------------------


def _agent_points(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One point per runtime: speed-up over the reference (median, min and max over workloads)
    and the largest printed |Δp| against it over all workloads."""
    from laya_onnx.bench.agent import REFERENCE, REFERENCE_BF16

    workloads = list(report["workloads"].values())
    points = [{"label": "laya torch f32", "speedups": [1.0] * len(workloads), "gap": 0.0, "role": REFERENCE}]
    if any("reference_bf16" in w for w in workloads):
        points.append(
            {
                "label": "laya torch bf16",
                "speedups": [w["reference_bf16"]["speedup"] for w in workloads if "reference_bf16" in w],
                "gap": max(w["reference_bf16"]["agreement"]["max_printed_gap"] for w in workloads),
                "role": REFERENCE_BF16,
            }
        )
    for label, meta in report["bundles"].items():
        runs = [w["bundles"][label] for w in workloads if label in w["bundles"]]
        if not runs:
            continue
        points.append(
            {
                "label": "%s (%s)" % (_short(label), meta.get("precision") or "?"),
                "speedups": [r["speedup_vs_reference"] for r in runs],
                "gap": max(r["agreement"]["max_printed_gap"] for r in runs),
                "differ": not all(r["agreement"]["decisions_identical"] for r in runs),
                "role": "ours",
            }
        )
    return points


def plot_agent(report: dict[str, Any], path: os.PathLike[str] | str) -> Path:
    """Speed-up over laya torch f32 (median over workloads, bar: min to max) against the largest
    printed |Δp| from it, one point per runtime: the precision choice in one picture."""
    from laya_onnx.bench.agent import REFERENCE, REFERENCE_BF16

    fig, axes = _figure()
    ax = axes[0][0]
    colours = {REFERENCE: GREY, REFERENCE_BF16: ORANGE, "ours": BLUE}
    for point in _agent_points(report):
        median = statistics.median(point["speedups"])
        low, high = min(point["speedups"]), max(point["speedups"])
        marker = "X" if point.get("differ") else ("s" if point["role"] != "ours" else "o")
        ax.errorbar(
            [point["gap"]],
            [median],
            yerr=[[median - low], [high - median]],
            fmt=marker,
            markersize=9,
            capsize=4,
            color=colours[point["role"]],
        )
        ax.annotate(
            point["label"],
            (point["gap"], median),
            textcoords="offset points",
            xytext=(8, 6),
            fontsize=9,
        )
    ax.set_xscale("symlog", linthresh=PRINT_UNIT, linscale=0.5)
    ax.set_xlim(left=-PRINT_UNIT * 0.3, right=max(1e-1, ax.get_xlim()[1]))
    ax.set_ylim(bottom=0)
    ax.axhline(1.0, color=GREY, linewidth=0.8, linestyle=":")
    ax.set_xlabel("largest |Δp| against laya torch f32, printed values (0 = identical to 4 decimals)")
    ax.set_ylabel("speed-up over laya torch f32 (× its time)")
    first: dict[str, Any] = next(iter(report["workloads"].values()), {})
    ax.set_title(
        "Speed against accuracy: %s; %d threads; median over %s, bar = min to max%s"
        % (
            first.get("cpu", "CPU unknown"),
            report.get("threads", 0),
            _count(len(report["workloads"]), "workload"),
            "; X = a decision differs" if any(p.get("differ") for p in _agent_points(report)) else "",
        ),
        fontsize=10,
    )
    ax.grid(True, alpha=0.3)
    return _save(fig, path)


# -- bench http / saturate -----------------------------------------------------------------


def load_runs_of_http(report: dict[str, Any]) -> list[dict[str, Any]]:
    """`bench http`'s runs, one per client count, in the shape `plot_load` draws."""
    return [_load_run(run["clients"], run) for run in report["runs"].values()]


def load_runs_of_saturate(report: dict[str, Any]) -> list[dict[str, Any]]:
    """`bench saturate`'s two phases (one client, then the saturating count) for `plot_load`."""
    runs = []
    for phase in ("sequential", "saturated"):
        if phase in report:
            client = report[phase]["client"]
            run = _load_run(client["clients"], client)
            health = report[phase].get("health", {}).get("latency_ms", {}).get("p99")
            if health is not None:
                run["health_p99"] = health
            runs.append(run)
    return runs


def _load_run(clients: int, figures: dict[str, Any]) -> dict[str, Any]:
    latency = figures.get("latency_ms_200", {})
    return {
        "clients": int(clients),
        "answered_per_s": figures.get("answered_per_s", 0.0),
        "p50": latency.get("p50"),
        "p99": latency.get("p99"),
        "refused": sum(v for k, v in figures.get("statuses", {}).items() if k != "200"),
    }


def plot_load(runs: Sequence[dict[str, Any]], path: os.PathLike[str] | str, title: str) -> Path:
    """Answers per second (left) and latency p50/p99 of the answered requests (right) against
    concurrent clients; /health's p99 where it was polled."""
    runs = sorted(runs, key=lambda r: r["clients"])
    clients = [r["clients"] for r in runs]
    fig, axes = _figure(1, 2)
    left, right = axes[0]
    left.plot(clients, [r["answered_per_s"] for r in runs], "o-", color=BLUE)
    for r in runs:
        if r["refused"]:
            left.annotate(
                "%d refused" % r["refused"],
                (r["clients"], r["answered_per_s"]),
                textcoords="offset points",
                xytext=(-8, -16),
                ha="right",
                fontsize=8,
                color=RED,
            )
    left.set_ylabel("answers per second")
    left.set_ylim(bottom=0)
    for key, style, colour in (("p50", "o-", BLUE), ("p99", "s--", RED), ("health_p99", "^:", GREEN)):
        xs = [r["clients"] for r in runs if r.get(key) is not None]
        if xs:
            name = "/health p99" if key == "health_p99" else key
            right.plot(xs, [r[key] for r in runs if r.get(key) is not None], style, color=colour, label=name)
    right.set_ylabel("latency, ms (answered requests)")
    right.set_ylim(bottom=0)
    right.legend()
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(clients, [str(c) for c in clients])
        ax.minorticks_off()
        ax.set_xlabel("concurrent clients")
        ax.grid(True, alpha=0.3)
    fig.suptitle(title, fontsize=11)
    return _save(fig, path)


# -- bench soak -----------------------------------------------------------------------------


def plot_soak(report: dict[str, Any], path: os.PathLike[str] | str) -> Path:
    """The server process over the soak: RSS, open file descriptors, and /health's latency in
    each sampling window (p50, max), with the idle figures before and after as dashed lines."""
    samples = report.get("samples") or report.get("samples_every_30s") or []
    minutes = [s["t_s"] / 60.0 for s in samples]
    fig, axes = _figure(3, 1, sharex=True)
    rss, fds, health = (row[0] for row in axes)
    rss.plot(minutes, [s.get("rss_mib") for s in samples], "-", color=BLUE, label="RSS")
    fds.plot(minutes, [s.get("fds") for s in samples], "-", color=BLUE, label="open fds")
    for ax, key in ((rss, "rss_mib"), (fds, "fds")):
        for when, style in (("idle_before", "--"), ("idle_after", ":")):
            value = report.get(key, {}).get(when)
            if value is not None:
                ax.axhline(value, color=GREY, linestyle=style, linewidth=1, label=when.replace("_", " "))
        ax.legend(loc="lower right", fontsize=8, ncol=3)
        ax.set_ylim(0, max([v for v in (s.get(key) for s in samples) if v is not None] or [1]) * 1.2)
        ax.grid(True, alpha=0.3)
    rss.set_ylabel("RSS, MiB")
    fds.set_ylabel("open fds")
    timed = [(m, s) for m, s in zip(minutes, samples, strict=True) if "health_max_ms" in s]
    if timed:
        xs = [m for m, _ in timed]
        health.plot(xs, [s["health_p50_ms"] for _, s in timed], "-", color=BLUE, label="p50")
        health.plot(xs, [s["health_max_ms"] for _, s in timed], "-", color=RED, label="max")
        health.set_yscale("log")
        _plain_log_labels(health.yaxis)
        health.legend(loc="upper right", fontsize=8, ncol=2)
    health.set_ylabel("/health, ms")
    health.set_xlabel("minutes")
    health.grid(True, alpha=0.3)
    fig.suptitle(
        "Soak of %s for %g min (%s): %d answered; /health p99 %s ms"
        % (
            report.get("bundle", "?"),
            report.get("minutes", 0),
            report.get("cpu", "CPU unknown"),
            report.get("honest", {}).get("answered", 0),
            report.get("health_ms", {}).get("p99"),
        ),
        fontsize=11,
    )
    return _save(fig, path)


# -- bench memory ---------------------------------------------------------------------------


def plot_memory(report: dict[str, Any], path: os.PathLike[str] | str) -> Path:
    """The per-pass memory model's curve (bytes above idle against padded tokens per row, one
    line per row count) with the passes measured: the export's probes (circles) and the bench's
    batch per configuration (stars: peak above idle)."""
    from laya_onnx.core.memory import PassMemoryModel

    model = PassMemoryModel.from_dict(report["model"])
    probes = report.get("probes") or []
    results = report.get("results") or []
    mib = 2.0**20
    rows_seen = sorted({int(p["rows"]) for p in probes} | {int(report.get("states", 1))})
    lengths = [int(p["length"]) for p in probes] + [int(r["input_tokens"]) for r in results]
    top = max(lengths + [int(report.get("max_len", 512))])
    xs = sorted({round(8 * (top * 1.5 / 8) ** (i / 63)) for i in range(64)})
    fig, axes = _figure()
    ax = axes[0][0]
    cmap = _pyplot().get_cmap("viridis")
    colour = {rows: cmap(i / max(1, len(rows_seen) - 1) * 0.85) for i, rows in enumerate(rows_seen)}
    for rows in rows_seen:
        ax.plot(
            xs,
            [model.estimate(rows, x) / mib for x in xs],
            "-",
            color=colour[rows],
            label="model, %s" % _count(rows, "row"),
        )
        measured = [p for p in probes if int(p["rows"]) == rows]
        if measured:
            ax.plot(
                [p["length"] for p in measured],
                [p["bytes"] / mib for p in measured],
                "o",
                color=colour[rows],
                markeredgecolor="black",
                label="export probe, %s" % _count(rows, "row"),
            )
    for r in results:
        if r.get("config") == "reference":
            continue
        ax.plot(
            [r["input_tokens"]],
            [max(r["peak_mib"] - r["idle_mib"], 0.1)],
            "*",
            markersize=14,
            color=RED,
            markeredgecolor="black",
            label="bench batch: %s (%s, peak above idle)"
            % (r["config"], _count(report.get("states", 1), "state")),
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("padded tokens per row")
    ax.set_ylabel("one pass, MiB above idle")
    source = "fitted at export" if model.source == "measured" else model.source
    ax.set_title("Per-pass memory: the model (%s) against measured passes" % source, fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="both", alpha=0.3)
    return _save(fig, path)


# -- parity ---------------------------------------------------------------------------------


def plot_parity(report: dict[str, Any], path: os.PathLike[str] | str) -> Path:
    """Left: every probability's |Δp| against the reference (log bins; those equal to the bit
    counted apart), the tolerance as a line. Right: requests whose tokens, decisions, refusals and
    printed JSON matched the reference's, against those that did not."""
    cases = report["cases"]
    summary = report["summary"]
    dps = [d for c in cases for d in c.get("abs_dps") or [c["max_abs_dp"]]]
    exact = sum(1 for d in dps if d == 0.0)
    positive = [d for d in dps if d > 0.0]
    fig, axes = _figure(1, 2, width_ratios=[2.2, 1])
    left, right = axes[0]
    tolerance = float(summary["tolerance"])
    if positive:
        low = min(min(positive), tolerance) / 2
        high = max(max(positive), tolerance) * 2
        edges = [low * (high / low) ** (i / 40) for i in range(41)]
        left.hist(positive, bins=edges, color=BLUE)
        left.set_xscale("log")
    left.axvline(tolerance, color=RED, linestyle="--", label="tolerance %g" % tolerance)
    left.set_xlabel("|Δp| of one probability, unrounded")
    left.set_ylabel("probabilities")
    left.set_title(
        "%d probabilities: %d equal to the bit, largest |Δp| %.2g" % (len(dps), exact, max(dps, default=0.0)),
        fontsize=10,
    )
    left.legend(fontsize=8)
    left.grid(True, alpha=0.3)
    checks = (("tokens", "tokens"), ("decision", "decisions"), ("refusal", "refusals"), ("json", "JSON"))
    names = [name for _, name in checks]
    same = [sum(1 for c in cases if category not in c["failed"]) for category, _ in checks]
    differ = [len(cases) - s for s in same]
    right.barh(names, same, color=GREEN, label="as the reference")
    right.barh(names, differ, left=same, color=RED, label="differ")
    for y, (s, d) in enumerate(zip(same, differ, strict=True)):
        right.text(s / 2, y, str(s), ha="center", va="center", color="white", fontsize=9)
        if d:
            right.text(s + d / 2, y, str(d), ha="center", va="center", color="white", fontsize=9)
    right.invert_yaxis()
    right.set_xlabel("requests")
    flips = _count(summary["rounding_flips"], "rounding flip")
    right.set_title("%s, %s" % (_count(len(cases), "request"), flips), fontsize=10)
    right.legend(fontsize=8, loc="lower right")
    fig.suptitle(
        "Parity of %s against laya (suite %s): %s"
        % (
            _short(str(report.get("bundle", "?"))),
            Path(summary["suite"]).stem,
            "passed" if summary["passed"] else "FAILED",
        ),
        fontsize=11,
    )
    return _save(fig, path)
