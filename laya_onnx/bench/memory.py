"""Peak memory and time of one long-state batch, each runtime in its own fresh process.

The scenario is the memory report's (`POST /v1/systemone/batch` with 2 states of
`"w{i} " * 7000`, one 3-option choice, `max_len` 8192) scaled down: `states` states of
`words` words, truncated at `tokens`. Every configuration runs in a new process so its VmHWM
is its own: idle RSS after loading and a warm-up request, peak RSS during `repeats` calls, RSS
after them, and the median call time.

    laya-onnx bench memory BUNDLE [--unfused BUNDLE] [--checkpoint CKPT] [--tokens 4096] [--arena]

Configurations: `after` (BUNDLE as the runtime now runs it: budgeted passes, arena released
after large calls), `before` (the `--unfused` bundle with no budget and the arena kept: the
runtime as it was), `unfused+release` (the unfused graph with the new runtime) and
`reference` (laya.Agent on `--checkpoint`, torch; needs the dev extra).

`--arena` adds the measurement the arena choice was made with (`run_arena_bench`).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from laya_onnx.bench.child import python_module
from laya_onnx.bench.sample import README_REQUEST

#: Every configuration, in the order they run (see the module doc).
CONFIGS = ("after", "before", "unfused+release", "reference")
#: The batch: states, words per state, the request's max_len; and timed calls per configuration.
DEFAULT_STATES = 2
DEFAULT_WORDS = 7000
DEFAULT_TOKENS = 4096
DEFAULT_REPEATS = 3

QUESTIONS = {
    "pick": {
        "type": "choice",
        "instructions": "Which colour is mentioned?",
        "criteria": {"red": "red", "green": "green", "blue": "blue"},
    }
}


def scenario(states: int, words: int) -> list[str]:
    return ["".join(f"w{i} " for i in range(words)) for _ in range(states)]


def _child(config: str, path: str, states: int, words: int, tokens: int, repeats: int) -> dict[str, Any]:
    from laya_onnx.core.memory import process_memory

    if config == "reference":
        from laya.agent import Agent

        agent: Any = Agent(path)
    else:
        import laya_onnx.core.agent as agent_mod
        from laya_onnx import ONNXAgent

        options: dict[str, Any] = {}
        if config == "before":
            agent_mod.ARENA_RELEASE_BYTES = 1 << 62  # the arena was never released
            options["max_pass_memory"] = 1 << 50  # and passes were never budgeted
        agent = ONNXAgent(path, **options)
    agent.predict("I was charged twice", QUESTIONS)
    idle = process_memory()["VmRSS"]
    batch = scenario(states, words)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = agent.predict_batch(batch, QUESTIONS, max_len=tokens)
        times.append(time.perf_counter() - started)
    after = process_memory()
    return {
        "config": config,
        "input_tokens": result[0]["usage"]["input_tokens"],
        "idle_mib": round(idle / 2**20, 1),
        "peak_mib": round(after["VmHWM"] / 2**20, 1),
        "after_mib": round(after["VmRSS"] / 2**20, 1),
        "median_s": round(statistics.median(times), 3),
    }


def run_memory_bench(
    bundle: os.PathLike | str,
    *,
    unfused: os.PathLike | str | None = None,
    checkpoint: os.PathLike | str | None = None,
    states: int = DEFAULT_STATES,
    words: int = DEFAULT_WORDS,
    tokens: int = DEFAULT_TOKENS,
    repeats: int = DEFAULT_REPEATS,
    only: list[str] | None = None,
    timeout: float = 900.0,
) -> dict[str, Any]:
    """Run every configuration that has what it needs (or those in `only`), one process each."""
    configs = [("after", bundle)]
    if unfused is not None:
        configs += [("before", unfused), ("unfused+release", unfused)]
    if checkpoint is not None:
        configs.append(("reference", checkpoint))
    if only is not None:
        unknown = sorted(set(only) - {name for name, _ in configs})
        if unknown:
            raise ValueError(f"bench memory: no configuration {unknown} with the bundles given")
        configs = [(name, path) for name, path in configs if name in only]
    rows = []
    for config, path in configs:
        cmd = python_module("laya_onnx.bench.memory", "--child", config, str(path))
        cmd += [str(states), str(words), str(tokens), str(repeats)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"bench memory {config} failed: {proc.stderr.strip()[-2000:]}")
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {
        "states": states,
        "words": words,
        "max_len": tokens,
        "repeats": repeats,
        "results": rows,
        **pass_model_of(bundle),
    }


def pass_model_of(bundle: os.PathLike | str) -> dict[str, Any]:
    """The bundle's per-pass memory model (`model`) and the export's probes it was fitted on
    (`probes`: rows, length, bytes; empty when the model is an estimate)."""
    from pathlib import Path

    from laya_onnx.core.bundle import read_manifest_quietly
    from laya_onnx.core.memory import PassMemoryModel

    manifest = read_manifest_quietly(Path(bundle))
    record = manifest.memory if manifest is not None else None
    return {
        "model": PassMemoryModel.for_bundle(manifest).as_dict(),
        "probes": list(record.samples or []) if record is not None else [],
    }


# -- the two attention graphs ---------------------------------------------------------------


def run_graph_speed(
    fused: os.PathLike | str, unfused: os.PathLike | str, repeats: int = 15
) -> dict[str, Any]:
    """CPU time per call (1 thread, median) of the two graphs, interleaved call by call in this
    process, on the README request and on one 2048-token row with the README's questions."""
    from laya_onnx import ONNXAgent

    agents = {"fused": ONNXAgent(fused, threads=1), "unfused": ONNXAgent(unfused, threads=1)}
    workloads = {
        "readme-1x3": ([README_REQUEST["state"]], None),
        "row-2048x3": (scenario(1, 3000), 2048),
    }
    out: dict[str, Any] = {}
    for name, (states, max_len) in workloads.items():
        times: dict[str, list[float]] = {k: [] for k in agents}
        for agent in agents.values():  # warm-up
            agent.predict_batch(states, README_REQUEST["questions"], max_len=max_len)
        for i in range(repeats):
            order = list(agents) if i % 2 == 0 else list(reversed(agents))
            for key in order:
                started = time.process_time()
                agents[key].predict_batch(states, README_REQUEST["questions"], max_len=max_len)
                times[key].append(time.process_time() - started)
        out[name] = {k: round(statistics.median(v) * 1000, 2) for k, v in times.items()}
    return out


# -- the arena choice -------------------------------------------------------------------------

#: Ways to run the CPU arena. "kept" is onnxruntime's default; "runtime" is `GraphSession` as
#: shipped: arena on, memory patterns off, arena shrunk and heap trimmed after a large pass only.
ARENA_CONFIGS = ("kept", "runtime", "release-every-pass", "arena-off")
ARENA_SHAPES = {"small": (3, 96), "large": (1, 2048)}


def _arena_child(config: str, graph: str, small_runs: int, large_runs: int) -> dict[str, Any]:
    import numpy as np
    import onnxruntime as ort

    from laya_onnx.core.bundle import GRAPH_OUTPUTS
    from laya_onnx.core.memory import probe_feeds, process_memory
    from laya_onnx.core.session import GraphSession, trim_heap

    if config in ("runtime", "release-every-pass"):
        session = GraphSession(graph, providers=["CPUExecutionProvider"], threads=1)

        def run(feeds, large):
            session.run(feeds, release_memory=large or config == "release-every-pass")
    else:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = 1
        if config == "arena-off":
            so.enable_cpu_mem_arena = False
        raw = ort.InferenceSession(graph, so, providers=["CPUExecutionProvider"])

        def run(feeds, large):
            raw.run(list(GRAPH_OUTPUTS), feeds)
            if config == "arena-off" and large:
                trim_heap()

    run(probe_feeds(1, 8), False)
    idle = process_memory()["VmRSS"]
    out: dict[str, Any] = {"config": config}
    for name, runs in (("small", small_runs), ("large", large_runs)):
        rows, length = ARENA_SHAPES[name]
        feeds = probe_feeds(rows, length)
        run(feeds, name == "large")  # first run of a shape: one-off costs
        cpu = []
        for _ in range(runs):
            started = time.process_time()
            run(feeds, name == "large")
            cpu.append(time.process_time() - started)
        out[f"{name}_cpu_ms"] = round(float(np.median(cpu)) * 1000, 2)
        out[f"{name}_rss_after_mib"] = round((process_memory()["VmRSS"] - idle) / 2**20, 1)
    out["peak_mib"] = round((process_memory()["VmHWM"] - idle) / 2**20, 1)
    return out


def run_arena_bench(
    graph: os.PathLike | str, small_runs: int = 200, large_runs: int = 8, timeout: float = 900.0
) -> dict[str, Any]:
    """CPU time per pass (1 thread, median; robust to a shared box) and RSS above idle after the
    passes, small and large, for each arena configuration in its own process."""
    rows = []
    for config in ARENA_CONFIGS:
        cmd = python_module("laya_onnx.bench.memory", "--arena-child", config, str(graph))
        cmd += [str(small_runs), str(large_runs)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"arena bench {config} failed: {proc.stderr.strip()[-2000:]}")
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {"graph": str(graph), "shapes": ARENA_SHAPES, "results": rows}


def format_arena_table(report: dict[str, Any]) -> str:
    small, large = report["shapes"]["small"], report["shapes"]["large"]
    lines = [
        f"arena configurations on {report['graph']} (1 thread; small = {small[0]}x{small[1]}, "
        f"large = {large[0]}x{large[1]} rows x tokens; MiB above idle)",
        f"{'configuration':<20} {'small ms':>9} {'RSS after':>10} {'large ms':>9} {'RSS after':>10} {'peak':>7}",
    ]
    for r in report["results"]:
        lines.append(
            f"{r['config']:<20} {r['small_cpu_ms']:>9} {r['small_rss_after_mib']:>10} "
            f"{r['large_cpu_ms']:>9} {r['large_rss_after_mib']:>10} {r['peak_mib']:>7}"
        )
    return "\n".join(lines)


def format_table(report: dict[str, Any]) -> str:
    lines = [
        f"{report['states']} states x {report['words']} words, max_len {report['max_len']}, "
        f"{report['repeats']} calls each (fresh process per configuration)",
        f"{'configuration':<16} {'tokens/row':>10} {'idle MiB':>9} {'peak MiB':>9} {'after MiB':>10} {'median s':>9}",
    ]
    for r in report["results"]:
        lines.append(
            f"{r['config']:<16} {r['input_tokens']:>10} {r['idle_mib']:>9} {r['peak_mib']:>9} "
            f"{r['after_mib']:>10} {r['median_s']:>9}"
        )
    return "\n".join(lines)


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    config, path, *numbers = sys.argv[2:]
    n_states, n_words, n_tokens, n_repeats = (int(x) for x in numbers)
    print(json.dumps(_child(config, path, n_states, n_words, n_tokens, n_repeats)))
elif __name__ == "__main__" and sys.argv[1:2] == ["--arena-child"]:
    config, path, small, large = sys.argv[2:]
    print(json.dumps(_arena_child(config, path, int(small), int(large))))
