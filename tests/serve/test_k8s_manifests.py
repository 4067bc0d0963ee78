"""serve/k8s/: the Kubernetes manifests are valid, agree with each other and with the server, and the
pod they describe behaves as they promise when it is run as a process.

No cluster here, so three layers:
  * schema: every object the kustomization renders validates, strictly, against the Kubernetes
    OpenAPI schemas that `kubernetes-validate` ships (offline);
  * consistency: the numbers one manifest relies on in another (probe port and path, the grace
    arithmetic, the memory limit vs the pass budget, threads vs the CPU request, selectors, names
    of the server's own variables);
  * the pod as a process: the container's entrypoint (from serve/Dockerfile.cpu), its args with
    the kubelet's $(VAR) expansion and its environment (the ConfigMap from server.env + env) run
    against a tiny bundle in a copy of the bundles volume; the startup probe's budget, a decision,
    the preStop + SIGTERM drain inside terminationGracePeriodSeconds, the bundle left untouched,
    and a tampered bundle that never becomes Ready.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

from laya_onnx.core.memory import parse_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "serve" / "k8s"
PACKAGE = ROOT / "laya_onnx"
DOCKERFILE = ROOT / "serve" / "Dockerfile.cpu"
# A version the kubernetes-validate schemas cover; the manifests use nothing newer than 1.25 APIs.
KUBERNETES_VERSION = "1.31.0"


# -- rendering (what `kubectl apply -k serve/k8s` would send, for the parts these files use) -----


def read_env_file(path: Path) -> dict[str, str]:
    """kustomize's `envs` format: KEY=VALUE lines, # comments, blank lines ignored."""
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not KEY=VALUE: {line!r}"
        values[key.strip()] = value
    return values


def render(folder: Path = K8S) -> list[dict]:
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    objects = []
    for resource in kustomization["resources"]:
        objects.extend(doc for doc in yaml.safe_load_all((folder / resource).read_text()) if doc)
    for generator in kustomization.get("configMapGenerator", []):
        data: dict[str, str] = {}
        for env_file in generator["envs"]:
            data.update(read_env_file(folder / env_file))
        objects.append(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}, "data": data}
        )
    return objects


@pytest.fixture(scope="module")
def objects():
    return render()


def one(objects, kind: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def container(deployment: dict) -> dict:
    (found,) = deployment["spec"]["template"]["spec"]["containers"]
    return found


def pod_environment(objects) -> dict[str, str]:
    """The container's environment as the kubelet builds it (envFrom first, then env wins);
    an optional secret that does not exist leaves its variable unset."""
    spec = container(one(objects, "Deployment"))
    configmaps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in spec.get("envFrom", []):
        env.update(configmaps[source["configMapRef"]["name"]])
    for item in spec.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            assert item["valueFrom"]["secretKeyRef"]["optional"] is True, item
    return env


def expand(arg: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion in command/args."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), arg)


def preStop_seconds(spec: dict) -> int:
    command = spec["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep", command
    return int(command[1])


# -- schema --------------------------------------------------------------------------------------


def test_every_rendered_object_validates_against_the_kubernetes_schemas(objects):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(
        [
            "ConfigMap",
            "Deployment",
            "HorizontalPodAutoscaler",
            "PersistentVolumeClaim",
            "PodDisruptionBudget",
            "Service",
        ]
    )
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_schema_check_can_fail(objects):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    deployment = json.loads(json.dumps(one(objects, "Deployment")))
    container(deployment)["readinesProbe"] = container(deployment).pop("readinessProbe")  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


# -- consistency ---------------------------------------------------------------------------------


def test_selectors_and_targets_name_the_pods_and_the_deployment(objects):
    deployment = one(objects, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert one(objects, "Service")["spec"]["selector"].items() <= labels.items()
    assert one(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    target = one(objects, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    claim = one(objects, "PersistentVolumeClaim")["metadata"]["name"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["bundles"]["persistentVolumeClaim"] == {"claimName": claim, "readOnly": True}


def test_probes_hit_liveness_and_readiness_on_the_port_the_server_binds(objects):
    spec = container(one(objects, "Deployment"))
    env = pod_environment(objects)
    (port,) = spec["ports"]
    assert env["LAYA_HOST"] == "0.0.0.0"  # reachable from the kubelet and the Service
    assert int(env["LAYA_PORT"]) == port["containerPort"]
    paths = {
        "startupProbe": "/health/live",
        "readinessProbe": "/health/ready",
        "livenessProbe": "/health/live",
    }
    for probe, path in paths.items():
        assert spec[probe]["httpGet"] == {"path": path, "port": port["name"]}, probe
    service_port = one(objects, "Service")["spec"]["ports"][0]
    assert service_port["targetPort"] == port["name"]


def test_the_grace_period_covers_the_preStop_sleep_and_the_drain(objects):
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    grace = float(pod_environment(objects)["LAYA_SHUTDOWN_GRACE_SECONDS"])
    # the server exits within its grace of the SIGTERM; 5 s at least for interpreter teardown
    assert pod["terminationGracePeriodSeconds"] >= preStop_seconds(pod["containers"][0]) + grace + 5


def test_a_rollout_never_drops_below_capacity(objects):
    deployment = one(objects, "Deployment")["spec"]
    assert deployment["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert deployment["strategy"]["rollingUpdate"]["maxSurge"] >= 1
    assert one(objects, "PodDisruptionBudget")["spec"]["minAvailable"] >= 1
    assert one(objects, "HorizontalPodAutoscaler")["spec"]["minReplicas"] >= 2


def test_the_memory_limit_holds_a_full_pass_above_the_request(objects):
    spec = container(one(objects, "Deployment"))
    env = pod_environment(objects)
    request = parse_bytes(spec["resources"]["requests"]["memory"].replace("i", ""))
    limit = parse_bytes(spec["resources"]["limits"]["memory"].replace("i", ""))
    pass_budget = parse_bytes(env["LAYA_MAX_PASS_MEMORY"])
    # the request is the measured steady RSS of a loaded full-size bundle (README "Sizing"): a
    # pass budget on top of it must still be under the limit, or a legal request could OOM the pod
    assert limit >= request + pass_budget


def test_threads_match_the_cpu_request(objects):
    spec = container(one(objects, "Deployment"))
    assert int(pod_environment(objects)["LAYA_THREADS"]) == int(spec["resources"]["requests"]["cpu"])


def test_every_variable_set_is_one_the_package_reads(objects):
    read = set()
    for path in PACKAGE.rglob("*.py"):
        read.update(re.findall(r"\bLAYA_[A-Z0-9_]+\b", path.read_text()))
    env = pod_environment(objects)
    names = set(env) | {item["name"] for item in container(one(objects, "Deployment")).get("env", [])}
    # LAYA_BUNDLE is the manifests' own: it only picks the args' directory
    unknown = sorted(names - read - {"LAYA_BUNDLE"})
    assert not unknown, f"not read anywhere in laya_onnx/ (a typo?): {unknown}"


def test_the_gpu_overlay_patches_the_base_container():
    overlay = K8S / "gpu"
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    assert kustomization["resources"] == [".."]
    (patch_ref,) = kustomization["patches"]
    patch = yaml.safe_load((overlay / patch_ref["path"]).read_text())
    base = one(render(), "Deployment")
    assert (patch["kind"], patch["metadata"]["name"]) == ("Deployment", base["metadata"]["name"])
    (patched,) = patch["spec"]["template"]["spec"]["containers"]
    assert patched["name"] == container(base)["name"]
    assert patched["args"][: len(container(base)["args"])] == container(base)["args"]
    assert patched["args"][-3:] == ["--providers", "cuda", "--strict-providers"]
    assert patched["resources"]["limits"]["nvidia.com/gpu"] == 1
    threads = {item["name"]: item["value"] for item in patched["env"]}["LAYA_THREADS"]
    assert int(threads) == int(patched["resources"]["requests"]["cpu"])


# -- the pod, run as a process -------------------------------------------------------------------


def entrypoint() -> list[str]:
    """The image's ENTRYPOINT, with its `laya-onnx` console script as this interpreter's module."""
    (line,) = [line for line in DOCKERFILE.read_text().splitlines() if line.startswith("ENTRYPOINT")]
    command = json.loads(line.removeprefix("ENTRYPOINT"))
    assert command[0] == "laya-onnx", command
    return [sys.executable, "-m", "laya_onnx", *command[1:]]


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def start_pod(objects, volume: Path, port: int, log_path: Path):
    """The container as the kubelet starts it, with /bundles mapped to `volume` and LAYA_PORT to a
    free port (the only two changes: the test machine is shared)."""
    spec = container(one(objects, "Deployment"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}
    env.update(pod_environment(objects))
    env["LAYA_HOST"], env["LAYA_PORT"] = "127.0.0.1", str(port)
    args = [expand(arg, env).replace("/bundles/", f"{volume}/", 1) for arg in spec["args"]]
    with open(log_path, "wb") as log:
        return subprocess.Popen(entrypoint() + args, stdout=log, stderr=subprocess.STDOUT, env=env)


def probe(port: int, timeout: float) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout) as response:
            return response.status
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def wait_for_startup(proc, spec: dict, port: int) -> float:
    """Poll as the startup probe does; return the seconds it took, fail past its budget."""
    startup = spec["startupProbe"]
    budget = startup["periodSeconds"] * startup["failureThreshold"]
    start = time.monotonic()
    while time.monotonic() - start < budget:
        if proc.poll() is not None:
            pytest.fail(f"the server exited with {proc.returncode} before its startup probe passed")
        if probe(port, startup["timeoutSeconds"]) == 200:
            return time.monotonic() - start
        time.sleep(0.2)
    pytest.fail(f"the startup probe did not pass within its {budget} s budget")


def bundles_volume(tmp_path: Path, bundle: Path, objects) -> Path:
    volume = tmp_path / "bundles"
    shutil.copytree(bundle, volume / pod_environment(objects)["LAYA_BUNDLE"])
    return volume


@pytest.mark.serve
def test_the_pod_starts_answers_and_drains_inside_its_grace_period(objects, bundle_factory, tmp_path):
    from tests.serve_support import BODY, free_port

    spec = container(one(objects, "Deployment"))
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    volume = bundles_volume(tmp_path, bundle_factory("tiny-english"), objects)
    before = snapshot(volume)
    port = free_port()
    log_path = tmp_path / "pod.log"
    proc = start_pod(objects, volume, port, log_path)
    try:
        wait_for_startup(proc, spec, port)
        assert probe(port, spec["readinessProbe"]["timeoutSeconds"]) == 200
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/systemone",
            data=json.dumps(BODY).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.loads(response.read())
        assert set(answer["answers"]) == set(BODY["questions"])
        # the kubelet: preStop runs to its end, then SIGTERM, then SIGKILL at the grace period
        stop = time.monotonic()
        time.sleep(preStop_seconds(spec) if os.environ.get("LAYA_K8S_REAL_PRESTOP") else 0)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(pod["terminationGracePeriodSeconds"] - preStop_seconds(spec))
        assert time.monotonic() - stop < pod["terminationGracePeriodSeconds"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    log = log_path.read_text()
    assert code == 0, log
    assert json.loads(next(line for line in log.splitlines() if line.startswith("{")))["type"] == "access"
    assert snapshot(volume) == before, "the server wrote into its read-only bundles volume"


@pytest.mark.serve
def test_a_tampered_bundle_never_becomes_ready(objects, bundle_factory, tmp_path):
    from tests.serve_support import free_port

    spec = container(one(objects, "Deployment"))
    volume = bundles_volume(tmp_path, bundle_factory("tiny-english"), objects)
    (bundle,) = volume.iterdir()
    tokenizer = bundle / "tokenizer" / "tokenizer.json"
    tokenizer.write_bytes(tokenizer.read_bytes().replace(b'"', b"'", 1))  # one byte changed
    port = free_port()
    log_path = tmp_path / "pod.log"
    proc = start_pod(objects, volume, port, log_path)
    try:
        budget = spec["startupProbe"]["periodSeconds"] * spec["startupProbe"]["failureThreshold"]
        code = proc.wait(budget)
        assert probe(port, 1) is None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    log = log_path.read_text()
    assert code == 2  # a bundle it cannot serve is bad input, as for `laya-onnx serve` itself
    assert "sha256 mismatch for 'tokenizer/tokenizer.json'" in log and "Traceback" not in log, log


# -- the KubeRay RayService ----------------------------------------------------------------------

RAY_CONFIG = ROOT / "serve" / "ray" / "serve-config.yaml"
RAY_SERVICE = K8S / "ray" / "rayservice.yaml"


def ray_service() -> dict:
    return yaml.safe_load(RAY_SERVICE.read_text())


def serve_config_v2() -> dict:
    return yaml.safe_load(ray_service()["spec"]["serveConfigV2"])


def test_the_ray_service_deploys_the_same_application_as_the_serve_config():
    cluster, laptop = serve_config_v2(), yaml.safe_load(RAY_CONFIG.read_text())
    assert (cluster["proxy_location"], cluster["http_options"]["host"]) == ("EveryNode", "0.0.0.0")
    assert cluster["http_options"]["port"] == laptop["http_options"]["port"]
    (app,), (local,) = cluster["applications"], laptop["applications"]
    for key in ("name", "route_prefix", "import_path"):
        assert app[key] == local[key], key
    assert {k: v for k, v in app["args"].items() if k != "bundle"} == {
        k: v for k, v in local["args"].items() if k != "bundle"
    }
    assert app["args"]["bundle"].startswith("/bundles/")
    deployments = {d["name"]: d for d in app["deployments"]}
    assert deployments.keys() == {d["name"] for d in local["deployments"]}
    for d in local["deployments"]:
        mine = deployments[d["name"]]
        for key in ("ray_actor_options", "max_ongoing_requests", "user_config"):
            assert mine.get(key) == d.get(key), (d["name"], key)
    # every Ray pod mounts the plain server's bundles volume read-only, where args.bundle points
    cluster_spec = ray_service()["spec"]["rayClusterConfig"]
    claim = one(render(), "PersistentVolumeClaim")["metadata"]["name"]
    pods = [cluster_spec["headGroupSpec"]["template"]["spec"]] + [
        group["template"]["spec"] for group in cluster_spec["workerGroupSpecs"]
    ]
    for pod in pods:
        (volume,) = pod["volumes"]
        assert volume["persistentVolumeClaim"] == {"claimName": claim, "readOnly": True}
        (mount,) = pod["containers"][0]["volumeMounts"]
        assert (mount["mountPath"], mount["readOnly"]) == ("/bundles", True)
    # no model replica on the head; a worker's CPUs hold whole LayaModel replicas
    assert cluster_spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    per_replica = deployments["LayaModel"]["ray_actor_options"]["num_cpus"]
    for group in cluster_spec["workerGroupSpecs"]:
        cpus = int(group["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"])
        assert cpus % per_replica == 0 and cpus >= per_replica


def test_the_ray_image_and_version_match_the_lock():
    pinned = next(
        line.split("==")[1]
        for line in (ROOT / "lock" / "dev.txt").read_text().splitlines()
        if line.startswith("ray==")
    )
    assert ray_service()["spec"]["rayClusterConfig"]["rayVersion"] == pinned
    base = next(
        line
        for line in (ROOT / "serve" / "Dockerfile.ray").read_text().splitlines()
        if line.startswith("FROM")
    )
    assert base == f"FROM rayproject/ray:{pinned}-py311-cpu"


@pytest.mark.ray
def test_the_ray_service_config_is_one_ray_serve_accepts(tmp_path, bundle_factory):
    """Ray's own config schema, and the application's `build` on its args (bundle mapped to a
    tiny one): what `serve deploy` checks before it starts any replica."""
    schema = pytest.importorskip("ray.serve.schema")
    from laya_onnx.serve import ray_app

    config = serve_config_v2()
    schema.ServeDeploySchema.parse_obj(config)
    (app,) = config["applications"]
    assert app["import_path"] == "laya_onnx.serve.ray_app:build"
    args = dict(app["args"], bundle=str(bundle_factory("tiny-english")))
    ray_app.build(args)  # refuses unknown args and bad settings before any replica starts
    with pytest.raises(ValueError, match="unknown args"):
        ray_app.build(dict(args, bundel="x"))
