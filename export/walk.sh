#!/usr/bin/env bash
# The full-size walk: a full-size bundle from export to a torch-free machine through a Hub, each
# step timed (wall seconds, peak RSS). Not part of the test tiers: it takes minutes and gigabytes.
#
#   bash export/walk.sh [WORK]          (default WORK: work/walk; run from the repository root)
#
# Steps: make a full-size random checkpoint and export it (skipped when WORK/bundle holds one;
# BUNDLE=path uses another), plan the push up to what huggingface_hub would send (no server
# here accepts uploads), publish the bundle into a local git repository served by olah (the dev
# extra), then in a fresh torch-free venv (lock/runtime-cpu.txt): pull and verify by id, answer
# one request (predict), serve it and answer one request over HTTP, score a small file; and, when
# RAY_VENV names a venv with the ray extra, score it on Ray Data and serve it on Ray Serve (one
# replica, the bundle by Hub id) for one request. Needs the dev venv in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-work/walk}
DEV=.venv/bin
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
BUNDLE=${BUNDLE:-$WORK/bundle}
REPO=acme/laya-large
TABLE="$WORK/walk.tsv"
printf 'step\twall s\tpeak RSS MiB\n' >"$TABLE"

step() {  # name, command...: run it under /usr/bin/time, append its figures to the table
    local name=$1
    shift
    echo "== $name" >&2
    /usr/bin/time -f "%e %M" -o "$WORK/.time" "$@"
    read -r wall kib <"$WORK/.time"
    printf '%s\t%s\t%d\n' "$name" "$wall" $((kib / 1024)) >>"$TABLE"
}

if [ ! -f "$BUNDLE/manifest.json" ]; then
    step "make-checkpoint" "$DEV/laya-onnx" make-checkpoint --preset random-english-large -o "$WORK/ckpt" --force
    step "export fp32" "$DEV/laya-onnx" export "$WORK/ckpt" -o "$BUNDLE" --force
fi

step "push (to the network boundary)" "$DEV/python" -c "
import sys
from laya_onnx.core.publish import plan_push
plan = plan_push(sys.argv[1], sys.argv[2], allow_random_weights=True)
size = sum(op.upload_info.size for op in plan.operations)
print(f'{len(plan.operations)} operations, {size / 2**20:.0f} MiB, card {len(plan.card)} chars')
" "$BUNDLE" "$REPO"

step "publish into the local hub" "$DEV/python" -c "
import sys; sys.path.insert(0, '.')
from pathlib import Path
from tests.hub_server_support import LocalHub
print(LocalHub(Path(sys.argv[1]) / 'mirrors').commit(sys.argv[2], Path(sys.argv[3]), message='full size'))
" "$WORK" "$REPO" "$BUNDLE"

# olah in the background, for the steps below (it writes its address once it listens)
rm -f "$WORK/endpoint"
"$DEV/python" -c "
import signal, sys, time; sys.path.insert(0, '.')
from pathlib import Path
from tests.hub_server_support import LocalHub
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # leave the with block: olah is stopped too
with LocalHub(Path(sys.argv[1]) / 'mirrors').serving() as endpoint:
    Path(sys.argv[1], 'endpoint').write_text(endpoint)
    while True:
        time.sleep(60)
" "$WORK" &
HUB_PID=$!
trap 'kill $HUB_PID 2>/dev/null || true' EXIT
for _ in $(seq 120); do [ -s "$WORK/endpoint" ] && break; sleep 0.5; done
export HF_ENDPOINT=$(cat "$WORK/endpoint") HF_HUB_CACHE="$WORK/hf-cache" HF_HUB_OFFLINE=0
rm -rf "$HF_HUB_CACHE"

RT="$WORK/venv-runtime"
if [ ! -x "$RT/bin/laya-onnx" ]; then
    "$DEV/uv" venv -q "$RT" --python python3
    "$DEV/uv" pip install -q --python "$RT/bin/python" -c lock/runtime-cpu.txt -e '.[cpu,serve]'
fi
"$RT/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is not None)" \
    || { echo "walk: $RT has torch" >&2; exit 1; }

step "pull + verify (torch-free)" "$RT/bin/python" -c "
import sys
from laya_onnx.core.hub import fetch_bundle
got = fetch_bundle(sys.argv[1])
print(got.path, got.revision, 'verified' if got.verified else 'NOT verified')
" "$REPO"

REQUEST='{"state": "I was charged twice this month, I want my money back", "questions": {"refund": {"type": "noul", "instructions": "Does the user ask for a refund?"}, "urgency": {"type": "score", "instructions": "How urgent is this?", "criteria": ["not urgent", "soon", "blocking"]}}}'
step "predict (torch-free)" "$RT/bin/laya-onnx" predict "$REPO" --request "$REQUEST"

PORT=${PORT:-18765}
echo "== serve (load + 1 request, torch-free)" >&2
/usr/bin/time -f "%e %M" -o "$WORK/.time" "$RT/bin/laya-onnx" serve "$REPO" --port "$PORT" &
TIME_PID=$!
for _ in $(seq 600); do curl -fs "http://127.0.0.1:$PORT/health/ready" >/dev/null 2>&1 && break; sleep 0.5; done
curl -fsS -X POST "http://127.0.0.1:$PORT/v1/systemone" -d "$REQUEST" >"$WORK/served.json"
echo "served: $(head -c 300 "$WORK/served.json")" >&2
pkill -INT -P "$TIME_PID" || true  # the server: the only child of that /usr/bin/time
wait "$TIME_PID" || true
read -r wall kib <"$WORK/.time"
printf '%s\t%s\t%d\n' "serve (load + 1 request, torch-free)" "$wall" $((kib / 1024)) >>"$TABLE"

printf '{"state": "I was charged twice"}\n{"state": "The app crashes at login"}\n' >"$WORK/states.jsonl"
printf '%s' '{"refund": {"type": "noul", "instructions": "Does the user ask for a refund?"}}' >"$WORK/questions.json"
# a run scores every row again: an output left by the last run would be resumed, not scored
rm -f "$WORK/scored.jsonl" "$WORK/scored-ray.jsonl"
step "score 2 rows (torch-free)" "$RT/bin/laya-onnx" score "$WORK/states.jsonl" -o "$WORK/scored.jsonl" \
    --questions "$WORK/questions.json" --bundle "$REPO" --no-progress

if [ -n "${RAY_VENV:-}" ]; then
    step "score 2 rows on Ray Data" "$RAY_VENV/bin/laya-onnx" score "$WORK/states.jsonl" \
        -o "$WORK/scored-ray.jsonl" --questions "$WORK/questions.json" --bundle "$REPO" --ray --actors 1 --no-progress

    # Ray Serve: the shipped config with the bundle by Hub id, one model replica. Ray's own
    # processes are not children /usr/bin/time waits for, so the RSS column sums every Ray
    # process's RSS at the first answer.
    RAY_PORT=${RAY_PORT:-18766}
    sed -e "s|bundle: .*|bundle: $REPO|" -e "s|port: 8000|port: $RAY_PORT|" -e "s|num_replicas: 2|num_replicas: 1|" \
        -e "s|env_vars: {}.*|env_vars: {HF_ENDPOINT: \"$HF_ENDPOINT\", HF_HUB_CACHE: \"$HF_HUB_CACHE\"}|" \
        serve/ray/serve-config.yaml >"$WORK/ray-config.yaml"
    echo "== serve on Ray Serve (start + 1 request)" >&2
    started=$(date +%s.%N)
    setsid "$RAY_VENV/bin/laya-onnx" serve --ray "$WORK/ray-config.yaml" >"$WORK/ray-serve.log" 2>&1 &
    RAY_PID=$!
    for _ in $(seq 600); do curl -fs "http://127.0.0.1:$RAY_PORT/health/ready" >/dev/null 2>&1 && break; sleep 0.5; done
    curl -fsS -X POST "http://127.0.0.1:$RAY_PORT/v1/systemone" -d "$REQUEST" >"$WORK/served-ray.json"
    wall=$(echo "$(date +%s.%N) - $started" | bc)
    kib=$(ps -eo rss=,args= | awk '/ray::|raylet|gcs_server|laya-onnx serve --ray/ && !/awk/ {s += $1} END {print s + 0}')
    echo "served on Ray: $(head -c 300 "$WORK/served-ray.json")" >&2
    kill -INT "$RAY_PID" 2>/dev/null || true  # as Ctrl-C: Ray Serve shuts the application down
    for _ in $(seq 120); do kill -0 "$RAY_PID" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- "-$RAY_PID" 2>/dev/null || true
    printf '%s\t%.2f\t%d\n' "serve on Ray Serve (start + 1 request)" "$wall" $((kib / 1024)) >>"$TABLE"
else
    echo "== Ray: skipped (RAY_VENV unset)" >&2
fi

column -t -s $'\t' "$TABLE"
