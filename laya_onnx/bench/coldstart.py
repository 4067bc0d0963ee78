"""`laya-onnx bench coldstart`: process start to first answer, each runtime in fresh processes.

What an autoscaler pays for every new replica: a new interpreter imports the runtime, loads the
model and answers one 3-question request (the README's). Each run is its own process, timed from
just before it is spawned:

  * import: spawn to the runtime imported (the interpreter's own start included);
  * load: the model loaded (`ONNXAgent(BUNDLE)`, or the reference `laya.Agent(CHECKPOINT)`);
  * first: the first answer;
  * peak RSS at the first answer (the child's VmHWM, so its own and nothing else's).

With `--checkpoint` the reference (torch) runs beside each bundle, interleaved: each repeat runs
every runtime once, in an order that rotates, and the ratios are taken within a repeat (so the
machine's drift over minutes cancels), reported as their median and range.

With `--session-cache DIR` each bundle also runs from its graph prepared for this machine
(`$LAYA_SESSION_CACHE`, `laya_onnx.core.prepared`), made once before the timed runs.

    laya-onnx bench coldstart BUNDLE [BUNDLE ...] [--checkpoint CKPT] [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from laya_onnx.bench.child import PACKAGE_ROOT
from laya_onnx.bench.sample import README_REQUEST
from laya_onnx.core import settings

DEFAULT_REPEATS = 3
DEFAULT_THREADS = 2
REFERENCE = "reference"
#: The label suffix of a bundle loaded from its prepared graph (`laya_onnx.core.prepared`).
PREPARED = "(prepared)"
STEPS = ("import_s", "load_s", "first_s", "total_s", "peak_rss_mb")

# The child: no laya_onnx import before the clock starts but the runtime's own. Times are wall
# clock (time.time), comparable with the parent's spawn time.
_CHILD = r"""
import json, sys, time, warnings
sys.path.insert(0, sys.argv[5])
warnings.simplefilter("ignore")
runtime, path, threads, request = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
if runtime == "reference":
    import torch
    from laya.agent import Agent
    torch.set_num_threads(threads)
    imported = time.time()
    agent = Agent(path, device="cpu")
else:
    from laya_onnx import ONNXAgent
    imported = time.time()
    agent = ONNXAgent(path, threads=threads, providers=["CPUExecutionProvider"])
loaded = time.time()
agent.predict(request["state"], request["questions"])
answered = time.time()
peak = 0
with open("/proc/self/status") as f:
    for line in f:
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1]) / 1024
print(json.dumps({"imported": imported, "loaded": loaded, "answered": answered, "peak_rss_mb": peak}))
"""


def run_once(runtime: str, path: str, threads: int, session_cache: str | None = None) -> dict[str, float]:
    """One fresh process: its steps' seconds and its peak RSS (MiB) at the first answer. With
    `session_cache` the bundle loads its prepared graph from there ($LAYA_SESSION_CACHE), made
    beforehand; without, the variable is unset for the child."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop(settings.SESSION_CACHE.env, None)
    if session_cache:
        env[settings.SESSION_CACHE.env] = session_cache
    request = json.dumps(README_REQUEST)
    spawned = time.time()
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, runtime, path, str(threads), request, PACKAGE_ROOT],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"cold start of {path!r} failed: {done.stderr.strip()[-2000:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "import_s": got["imported"] - spawned,
        "load_s": got["loaded"] - got["imported"],
        "first_s": got["answered"] - got["loaded"],
        "total_s": got["answered"] - spawned,
        "peak_rss_mb": got["peak_rss_mb"],
    }


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run_coldstart(
    bundles: list[str],
    checkpoint: str | None = None,
    repeats: int = DEFAULT_REPEATS,
    threads: int = DEFAULT_THREADS,
    progress: bool = True,
    session_cache: str | None = None,
) -> dict[str, Any]:
    """Cold starts of each bundle (and the reference on `checkpoint`; with `session_cache`, each
    bundle again from its prepared graph there), interleaved; see the module doc."""
    from laya_onnx.core.machine import read_cpu

    runtimes: list[tuple[str, str, str | None]] = [(REFERENCE, checkpoint, None)] if checkpoint else []
    runtimes += [(b, b, None) for b in bundles]
    if session_cache:
        runtimes += [(f"{b} {PREPARED}", b, session_cache) for b in bundles]
        for b in bundles:  # made once, outside the timed runs
            run_once("ours", b, threads, session_cache)
    runs: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in runtimes}
    for r in range(repeats):
        order = runtimes[r % len(runtimes) :] + runtimes[: r % len(runtimes)]
        for label, path, cache in order:
            got = run_once(REFERENCE if label == REFERENCE else "ours", str(path), threads, cache)
            runs[label].append(got)
            if progress:
                print(
                    f"  repeat {r + 1}/{repeats} {label}: "
                    + ", ".join(f"{k} {v:.2f}" for k, v in got.items()),
                    file=sys.stderr,
                    flush=True,
                )
    cpu = read_cpu()
    report: dict[str, Any] = {
        "cpu": f"{cpu.label}, {cpu.cores} cores",
        "threads": threads,
        "repeats": repeats,
        "runtimes": {
            label: {k: _summary([run[k] for run in got]) for k in STEPS} for label, got in runs.items()
        },
    }
    if checkpoint:
        ratios = {}
        for label in [label for label, _, _ in runtimes if label != REFERENCE]:
            ratios[label] = {
                k: _summary(
                    [ours[k] / ref[k] for ours, ref in zip(runs[label], runs[REFERENCE], strict=True)]
                )
                for k in ("total_s", "peak_rss_mb")
            }
        report["vs_reference"] = ratios
    return report


def format_report(report: dict[str, Any]) -> str:
    """The report as a table: each runtime's median (min-max) per step, then the ratios."""
    lines = [f"cold start, {report['threads']} threads, {report['repeats']} repeats, CPU: {report['cpu']}"]
    head = ["runtime", "import s", "load s", "first answer s", "total s", "peak RSS MiB"]
    lines.append(" | ".join(head))
    for label, steps in report["runtimes"].items():
        cells = [f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})" for s in (steps[k] for k in STEPS[:4])]
        rss = steps["peak_rss_mb"]
        cells.append(f"{rss['median']:.0f} ({rss['min']:.0f}-{rss['max']:.0f})")
        lines.append(" | ".join([label, *cells]))
    for label, ratio in report.get("vs_reference", {}).items():
        t, m = ratio["total_s"], ratio["peak_rss_mb"]
        lines.append(
            f"{label} / reference: time to first answer {t['median']:.2f}x ({t['min']:.2f}-{t['max']:.2f}), "
            f"peak RSS {m['median']:.2f}x ({m['min']:.2f}-{m['max']:.2f})"
        )
    return "\n".join(lines)
