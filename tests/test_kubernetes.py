"""deploy/kubernetes/: the core resources validate offline (kubernetes-validate, strict) for the Kubernetes
versions we target; KEDA's resources against the facts of KEDA's own schema vendored below; and the pieces
agree with each other and with the service (names, the scaling route, capacity, grace periods, secrets)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

from settings import BY_NAME, default
from settings.placeholders import is_placeholder
from stepwise_cli.main import COMMANDS
from tests.support.routes import ROUTES
from tests.support.servers import child_env

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "deploy" / "kubernetes"
# The oldest Kubernetes we target and the newest kubernetes-validate knows: the manifests hold for both.
TARGET_VERSIONS = ("1.33.0", "1.37.0")

# KEDA v2.20.2 (kedacore/keda): from config/crd/bases/keda.sh_scaledobjects.yaml and
# keda.sh_triggerauthentications.yaml (the spec fields, their types and bounds; every spec field the CRD
# has is named, so a misspelt one is caught here instead of being pruned by the API server), and from
# pkg/scalers/metrics_api_scaler.go and pkg/scalers/authentication/authentication_types.go (the metrics-api
# trigger's metadata keys, and the bearer token's parameter name).
KEDA_API_VERSION = "keda.sh/v1alpha1"
INT32_FROM_0 = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
SCALED_OBJECT_SPEC = {
    "type": "object",
    "required": ["scaleTargetRef", "triggers"],
    "additionalProperties": False,
    "properties": {
        "advanced": {"type": "object"},
        "cooldownPeriod": INT32_FROM_0,
        "fallback": {"type": "object", "required": ["failureThreshold", "replicas"]},
        "idleReplicaCount": INT32_FROM_0,
        "initialCooldownPeriod": INT32_FROM_0,
        "maxReplicaCount": {**INT32_FROM_0, "minimum": 1},
        "minReplicaCount": INT32_FROM_0,
        "pollingInterval": {**INT32_FROM_0, "minimum": 1},
        "scaleTargetRef": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {
                "apiVersion": {"type": "string"},
                "envSourceContainerName": {"type": "string"},
                "kind": {"type": "string"},
                "name": {"type": "string", "minLength": 1},
            },
        },
        "triggers": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["metadata", "type"],
                "additionalProperties": False,
                "properties": {
                    "authenticationRef": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {
                            "kind": {"enum": ["TriggerAuthentication", "ClusterTriggerAuthentication"]},
                            "name": {"type": "string"},
                        },
                    },
                    "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                    "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                    "name": {"type": "string"},
                    "type": {"type": "string", "minLength": 1},
                    "useCachedMetrics": {"type": "boolean"},
                },
            },
        },
    },
}
TRIGGER_AUTHENTICATION_SPEC = {
    "type": "object",
    "properties": {
        "secretTargetRef": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["key", "name", "parameter"],
                "properties": {"key": {"type": "string"}, "name": {"type": "string"}, "parameter": {"type": "string"}},
            },
        },
    },
}
METRICS_API_METADATA = {  # name -> what it takes ("number", "bool", or the allowed words); url, valueLocation needed
    "url": "text",
    "valueLocation": "text",
    "targetValue": "number",
    "activationTargetValue": "number",
    "format": ("prometheus", "json", "xml", "yaml"),
    "unsafeSsl": "bool",
    "aggregateFromKubeServiceEndpoints": "bool",
    "aggregationType": ("average", "sum", "max", "min"),
    "timeout": "text",
    "authMode": ("apiKey", "basic", "tls", "bearer", "custom", "oauth"),
}
BEARER_TOKEN_PARAMETERS = ("bearerToken", "token")


def documents() -> list[dict]:
    found = []
    for path in sorted(FOLDER.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            found += [document for document in yaml.safe_load_all(path.read_text()) if document]
    return found


DOCUMENTS = documents()


def of_kind(kind: str) -> list[dict]:
    return [document for document in DOCUMENTS if document["kind"] == kind]


def named(kind: str, name: str) -> dict:
    (found,) = [document for document in of_kind(kind) if document["metadata"]["name"] == name]
    return found


def component(name: str) -> list[dict]:
    return [d for d in of_kind("Deployment") if d["metadata"]["labels"]["app.kubernetes.io/component"] == name]


def container_env(deployment: dict) -> dict[str, str]:
    """The container's variables: its ConfigMap's, then its own `env` (which win, as in Kubernetes)."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    values: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            values.update(named("ConfigMap", source["configMapRef"]["name"])["data"])
    values.update({item["name"]: item["value"] for item in container.get("env", [])})
    return values


def test_the_kustomization_applies_every_file_of_the_folder():
    listed = yaml.safe_load((FOLDER / "kustomization.yaml").read_text())["resources"]

    assert sorted(listed) == sorted(path.name for path in FOLDER.glob("*.yaml") if path.name != "kustomization.yaml")


@pytest.mark.parametrize("version", TARGET_VERSIONS)
@pytest.mark.parametrize(
    "document",
    [d for d in DOCUMENTS if not d["apiVersion"].startswith("keda.sh/")],
    ids=lambda d: f"{d['kind']}/{d['metadata']['name']}",
)
def test_each_core_resource_is_valid_for_the_kubernetes_versions_we_target(document, version):
    kubernetes_validate.validate(document, version, strict=True)


@pytest.mark.parametrize(
    ("kind", "spec_schema"),
    [("ScaledObject", SCALED_OBJECT_SPEC), ("TriggerAuthentication", TRIGGER_AUTHENTICATION_SPEC)],
)
def test_kedas_resources_follow_kedas_schema(kind, spec_schema):
    assert of_kind(kind)
    for document in of_kind(kind):
        assert document["apiVersion"] == KEDA_API_VERSION
        assert set(document) == {"apiVersion", "kind", "metadata", "spec"}
        jsonschema.validate(document["spec"], spec_schema)


def test_each_scaled_object_reads_the_scaling_route_as_kedas_metrics_api_scaler_takes_it():
    for scaled in of_kind("ScaledObject"):
        spec = scaled["spec"]
        assert spec.get("minReplicaCount", 0) <= spec["maxReplicaCount"]
        for trigger in spec["triggers"]:
            metadata = trigger["metadata"]
            assert trigger["type"] == "metrics-api" and {"url", "valueLocation", "targetValue"} <= set(metadata)
            for key, value in metadata.items():
                takes = METRICS_API_METADATA[key]
                if takes == "number":
                    assert float(value) >= 0, (key, value)
                elif takes == "bool":
                    assert value in ("true", "false"), (key, value)
                elif isinstance(takes, tuple):
                    assert value in takes, (key, value)
            assert float(metadata["targetValue"]) > 0  # KEDA refuses a trigger without one
            auth = named("TriggerAuthentication", trigger["authenticationRef"]["name"])
            assert metadata["authMode"] == "bearer"
            assert [ref["parameter"] for ref in auth["spec"]["secretTargetRef"]][0] in BEARER_TOKEN_PARAMETERS


def test_every_gpu_worker_has_one_scaled_object_on_its_own_models_load_per_its_capacity():
    scaled_by_target = {s["spec"]["scaleTargetRef"]["name"]: s for s in of_kind("ScaledObject")}
    served = container_env(component("api")[0])["STEPWISE_MODELS"].split(",")
    api_service = named("Service", "stepwise-api")

    assert set(scaled_by_target) == {worker["metadata"]["name"] for worker in component("worker")}
    for worker in component("worker"):
        env = container_env(worker)
        (trigger,) = scaled_by_target[worker["metadata"]["name"]]["spec"]["triggers"]
        url = urlsplit(trigger["metadata"]["url"])
        assert ("/v1/admin/scaling", "get") in ROUTES and url.path == "/v1/admin/scaling"
        assert url.hostname.split(".")[:2] == [api_service["metadata"]["name"], api_service["metadata"]["namespace"]]
        assert url.port == api_service["spec"]["ports"][0]["port"]
        assert parse_qs(url.query) == {"model": [env["STEPWISE_MODEL"]]}
        assert trigger["metadata"]["valueLocation"] == "jobs"
        assert float(trigger["metadata"]["targetValue"]) == float(env["STEPWISE_MAX_NUM_SEQS"])
        assert scaled_by_target[worker["metadata"]["name"]]["spec"]["minReplicaCount"] == 0
        assert env["STEPWISE_MODEL"] in served  # its jobs are accepted, and wait, while it has no worker


def test_a_worker_gets_longer_to_stop_than_its_drain_which_fits_kubernetes_default_grace():
    assert default("STEPWISE_DRAIN_SECONDS") < 30  # a pod stopped without a grace of its own still drains
    for worker in component("worker"):
        env = container_env(worker)
        grace = worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        names = ("STEPWISE_DRAIN_SECONDS", "STEPWISE_SHUTDOWN_GRACE")
        stops = [float(env.get(name, default(name)) or 0) for name in names]
        assert grace >= max(stops) + 5, (worker["metadata"]["name"], grace, stops)


def test_a_worker_requests_a_gpu_and_keeps_its_models_on_a_shared_volume():
    claims = {claim["metadata"]["name"] for claim in of_kind("PersistentVolumeClaim")}
    for worker in component("worker"):
        pod = worker["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
        cache = container_env(worker)["STEPWISE_CACHE_DIR"]
        (mount,) = [path for path in mounts if cache.startswith(path + "/")]
        assert volumes[mounts[mount]]["persistentVolumeClaim"]["claimName"] in claims


def test_the_api_is_probed_on_healthz_and_readyz_and_its_service_reaches_it():
    (api,) = component("api")
    (container,) = api["spec"]["template"]["spec"]["containers"]
    service = named("Service", "stepwise-api")

    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert service["spec"]["selector"].items() <= api["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["targetPort"] in [port["name"] for port in container["ports"]]


def test_each_container_runs_a_stepwise_command_from_the_right_image():
    images = {"api": "stepwise-api:", "webhooks": "stepwise-api:", "worker": "stepwise-worker:"}
    for deployment in of_kind("Deployment"):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        kind = deployment["metadata"]["labels"]["app.kubernetes.io/component"]
        assert container["image"].startswith(images[kind]) and container["command"][0] == "stepwise"
        assert container["command"][1] in COMMANDS
    (webhooks,) = component("webhooks")
    assert webhooks["spec"]["template"]["spec"]["containers"][0]["command"][2:4] == ["--queues", "stepwise.webhooks"]


def test_the_secret_holds_every_secret_as_a_placeholder_the_services_refuse_and_kedas_token_is_an_admin_key():
    (secret,) = of_kind("Secret")
    values = secret["stringData"]
    auth = named("TriggerAuthentication", "stepwise-scaler")
    admin_keys = [pair.partition(":")[2] for pair in values["STEPWISE_ADMIN_API_KEYS"].split(",")]

    assert [ref["name"] for ref in auth["spec"]["secretTargetRef"]] == [secret["metadata"]["name"]]
    assert values[auth["spec"]["secretTargetRef"][0]["key"]] in admin_keys
    for name in ("STEPWISE_API_KEYS", "STEPWISE_ADMIN_API_KEYS", "STEPWISE_WEBHOOK_SECRET"):
        assert BY_NAME[name].is_secret and is_placeholder(values[name]), name  # applied unchanged: refused


def test_every_stepwise_variable_the_manifests_set_is_declared():
    text = "\n".join(path.read_text() for path in FOLDER.glob("*.yaml"))

    assert set(re.findall(r"\bSTEPWISE_[A-Z0-9_]+", text)) - set(BY_NAME) == set()


OVERLAY = FOLDER / "overlays" / "ingress-tls"
OVERLAY_DOCUMENTS = [
    document
    for path in sorted(OVERLAY.glob("*.yaml"))
    if path.name != "kustomization.yaml"
    for document in yaml.safe_load_all(path.read_text())
    if document
]


def env_of(container: dict) -> dict[str, dict]:
    return {item["name"]: item for item in container.get("env", [])}


@pytest.mark.parametrize("version", TARGET_VERSIONS)
def test_the_ingress_overlay_is_valid_and_applies_the_base_with_its_own_files(version):
    kustomization = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())
    own_files = sorted(path.name for path in OVERLAY.glob("*.yaml") if path.name != "kustomization.yaml")

    assert kustomization["resources"] == ["../..", *own_files]
    assert (OVERLAY / "../..").resolve() == FOLDER
    for document in OVERLAY_DOCUMENTS:
        kubernetes_validate.validate(document, version, strict=True)


def test_the_ingress_serves_the_api_over_tls_at_the_public_url_and_leaves_event_streams_unbuffered():
    (ingress,) = [document for document in OVERLAY_DOCUMENTS if document["kind"] == "Ingress"]
    service = named("Service", "stepwise-api")
    public_url = urlsplit(named("ConfigMap", "stepwise-config")["data"]["STEPWISE_PUBLIC_URL"])
    (rule,) = ingress["spec"]["rules"]
    (path,) = rule["http"]["paths"]
    (tls,) = ingress["spec"]["tls"]

    assert public_url.scheme == "https" and rule["host"] == public_url.hostname and tls["hosts"] == [rule["host"]]
    assert tls["secretName"]
    assert path["backend"]["service"]["name"] == service["metadata"]["name"]
    assert path["backend"]["service"]["port"]["name"] in [port["name"] for port in service["spec"]["ports"]]
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 600  # Prefer: wait, streams
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-body-size"].rstrip("m")) * 2**20 > default(
        "STEPWISE_MAX_BODY_BYTES"
    )  # the API, not the proxy, refuses a large body (a 413 naming the limit)


def test_the_shared_volumes_ask_for_read_write_many_on_a_storage_class_the_operator_sets():
    for claim in of_kind("PersistentVolumeClaim"):
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"], claim["metadata"]["name"]
        assert is_placeholder(claim["spec"]["storageClassName"]), claim["metadata"]["name"]  # a value to set


def test_workers_tolerate_the_gpu_taint_serve_offline_and_keep_their_spool_on_a_shared_volume():
    claims = {claim["metadata"]["name"] for claim in of_kind("PersistentVolumeClaim")}
    for worker in component("worker"):
        pod = worker["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = container_env(worker)
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        assert env["HF_HUB_OFFLINE"] == "1"
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
        (spool_mount,) = [path for path in mounts if env["STEPWISE_SPOOL_DIR"].startswith(path + "/")]
        spool_claim = volumes[mounts[spool_mount]]["persistentVolumeClaim"]["claimName"]
        assert spool_claim in claims and spool_claim != "stepwise-model-cache"


def fetch_jobs() -> dict[str, dict]:
    """The model-fetch Jobs by the repo each fetches."""
    jobs = {}
    for job in of_kind("Job"):
        (container,) = job["spec"]["template"]["spec"]["containers"]
        jobs[env_of(container)["MODEL_REPO"]["value"]] = job
    return jobs


def test_each_checkpoint_a_worker_serves_is_fetched_by_a_job_into_the_cache_that_worker_loads_from():
    jobs = fetch_jobs()
    (secret,) = of_kind("Secret")
    checkpoints = [w for w in component("worker") if not container_env(w)["STEPWISE_MODEL"].startswith("builtin:")]

    assert checkpoints, "an example of a worker serving real weights"
    for worker in checkpoints:
        env = container_env(worker)
        job = jobs[env["STEPWISE_MODEL"]]
        pod = job["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        job_env = env_of(container)
        assert job_env["HF_HOME"]["value"] == env["HF_HOME"]
        worker_pod = worker["spec"]["template"]["spec"]
        claim_of = {
            mount["mountPath"]: volume["persistentVolumeClaim"]["claimName"]
            for spec in (pod, worker_pod)
            for mount in spec["containers"][0]["volumeMounts"]
            for volume in spec["volumes"]
            if volume["name"] == mount["name"]
        }
        (cache_path,) = [path for path in claim_of if env["HF_HOME"].startswith(path + "/")]
        job_claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]]
        assert job_claims == [claim_of[cache_path]]  # the same volume, mounted at the same path
        assert pod["securityContext"]["runAsUser"] == worker_pod["securityContext"]["runAsUser"]  # files it can read
        assert "nvidia.com/gpu" not in str(container["resources"])
        token = job_env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert token["name"] == secret["metadata"]["name"] and token["key"] in secret["stringData"]
        assert container["image"].startswith("stepwise-worker:")  # huggingface_hub comes with diffusers there


def test_the_fetch_jobs_command_runs_as_written_and_finds_a_snapshot_the_cache_already_holds(tmp_path):
    """No hub can be reached from here: the command runs offline against a cache laid out as huggingface_hub
    lays one out, so the code itself (imports, call, arguments) runs; the download is huggingface_hub's own."""
    (job,) = fetch_jobs().values()
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = {name: item["value"] for name, item in env_of(container).items() if "value" in item}
    repo_cache = tmp_path / "hub" / f"models--{env['MODEL_REPO'].replace('/', '--')}"
    commit = "0" * 40
    (repo_cache / "refs").mkdir(parents=True)
    (repo_cache / "refs" / env["MODEL_REVISION"]).write_text(commit)
    (repo_cache / "snapshots" / commit).mkdir(parents=True)
    (repo_cache / "snapshots" / commit / "model_index.json").write_text("{}")
    assert container["command"][:2] == ["python", "-c"]

    result = subprocess.run(
        [sys.executable, "-c", container["command"][2]],
        env={**child_env(), **env, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"fetched {env['MODEL_REPO']} into {repo_cache / 'snapshots' / commit}"
