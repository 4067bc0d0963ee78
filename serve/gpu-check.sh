#!/usr/bin/env bash
# The CUDA check of a GPU machine, end to end, at full size (serve/README.md, "On a GPU").
#
#   serve/gpu-check.sh OUT_DIR
#
# 1. writes the full-size random checkpoint and exports its fp32 and fp16 bundles (needs the
#    export extra: torch, which only these two steps import);
# 2. runs `python -m laya_onnx.bench.device` on them: agreement with the fp32 bundle on the CPU
#    (TF32 off and on, fp16 against its gate), p50/p99 latency with IOBinding on and off, GPU
#    memory, an injected device failure, nodes placed on the CPU; it checks torch stays unloaded;
# 3. serves the fp16 bundle on CUDA with micro-batching and drives it with 1, 8 and 32 clients.
#
# Every step writes its report into OUT_DIR as it ends, so a run cut short keeps what it measured.
# Environment: PYTHON (default python3), PROVIDER (cuda; cpu is a dry run of the script itself,
# whose figures say nothing about a GPU), PRESET (random-english-large; tiny-english for a dry
# run), WORK (scratch folder, default a new temporary one), SECONDS_PER_COUNT (bench http, 5).
set -uo pipefail

out=${1:?usage: serve/gpu-check.sh OUT_DIR}
py=${PYTHON:-python3}
provider=${PROVIDER:-cuda}
preset=${PRESET:-random-english-large}
work=${WORK:-$(mktemp -d)}
seconds=${SECONDS_PER_COUNT:-5}
port=${PORT:-8187}
mkdir -p "$out" "$work"
cd "$(dirname "$0")/.." || exit 2

say() { echo "[$(date -u +%T)] $*"; }
gpu_memory() { command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader; }
# Runs a step with its wall time and peak RSS (GNU time when present) in OUT_DIR/steps.tsv.
step() {
    local name=$1
    shift
    local start=$SECONDS rc
    if [ -x /usr/bin/time ]; then
        /usr/bin/time -f "%M" -o "$work/$name.rss" "$@" >"$out/$name.log" 2>&1
        rc=$?
    else
        "$@" >"$out/$name.log" 2>&1
        rc=$?
    fi
    local rss_kib
    rss_kib=$(tail -1 "$work/$name.rss" 2>/dev/null || echo "?")
    printf '%s\t%s\t%ss\t%s KiB\n' "$name" "$rc" "$((SECONDS - start))" "$rss_kib" | tee -a "$out/steps.tsv"
    return "$rc"
}

say "machine: $(nproc) CPUs; GPU: $(gpu_memory || echo none)"
"$py" -c 'import onnxruntime as o, sys; print("onnxruntime", o.__version__, o.get_available_providers(), "torch loaded:", "torch" in sys.modules)' | tee "$out/runtime.txt"

ck=$work/checkpoint
step checkpoint "$py" -m laya_onnx make-checkpoint --preset "$preset" -o "$ck" --force || exit 1
# The two exports are independent: run them side by side, half the CPUs each.
threads=$(($(nproc) / 2 > 0 ? $(nproc) / 2 : 1))
OMP_NUM_THREADS=$threads step export-fp32 "$py" -m laya_onnx export "$ck" -o "$work/fp32" --no-memory-probe --force &
OMP_NUM_THREADS=$threads step export-fp16 "$py" -m laya_onnx export "$ck" -o "$work/fp16" --precision fp16 --no-memory-probe --force &
wait
[ -f "$work/fp32/manifest.json" ] && [ -f "$work/fp16/manifest.json" ] || { say "an export failed: see $out/export-*.log"; exit 1; }

say "device check ($provider) before: $(gpu_memory || echo -)"
step device-check "$py" -m laya_onnx.bench.device "$work/fp32" "$work/fp16" --provider "$provider" \
    --repeats "${REPEATS:-30}" --json "$out/device-check.json"
say "device check after: $(gpu_memory || echo -)"

say "serving the fp16 bundle on $provider with micro-batching"
LAYA_BATCH_WINDOW_MS=${LAYA_BATCH_WINDOW_MS:-2} "$py" -m laya_onnx serve "$work/fp16" --providers "$provider" \
    --strict-providers --port "$port" >"$out/serve.log" 2>&1 &
server=$!
for _ in $(seq 240); do
    curl -fs "http://127.0.0.1:$port/health/ready" >/dev/null 2>&1 && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.5
done
say "server ready: $(curl -s "http://127.0.0.1:$port/health/ready")"
step bench-http "$py" -m laya_onnx bench http "http://127.0.0.1:$port" --clients 1,8,32 \
    --seconds "$seconds" --json "$out/bench-http.json"
curl -s "http://127.0.0.1:$port/health" >"$out/health.json"
say "after serving: $(gpu_memory || echo -); server RSS $(ps -o rss= -p $server) KiB"
kill -TERM "$server"
wait "$server"
say "done"
