"""Kubernetes manifests validate against the CRD schemas inside dask-kubernetes."""

from pathlib import Path

import pytest
import yaml

from dask_rl.config import load_pipeline
from dask_rl.deploy import k8s

jsonschema = pytest.importorskip("jsonschema")
dask_kubernetes = pytest.importorskip("dask_kubernetes")

ROOT = Path(__file__).resolve().parents[2]
CRDS = (Path(dask_kubernetes.__file__).parent / "operator" / "deployment" / "helm"
        / "dask-kubernetes-operator" / "crds")


def _schemas() -> dict:
    schemas = {}
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        kind = crd["spec"]["names"]["kind"]
        [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        schemas[kind] = version["schema"]["openAPIV3Schema"]
    return schemas


SCHEMAS = _schemas()
VALIDATORS = {kind: jsonschema.validators.validator_for(schema)(schema)
              for kind, schema in SCHEMAS.items()}


def _validate(doc: dict) -> None:
    if doc["apiVersion"] == "v1":  # core resources: the job's ConfigMap and ServiceAccount
        assert doc["kind"] in ("ConfigMap", "ServiceAccount"), doc["kind"]
        assert doc["metadata"]["name"] and doc["metadata"]["namespace"]
        assert doc["kind"] != "ConfigMap" or doc["data"]
        return
    if doc["apiVersion"] == "rbac.authorization.k8s.io/v1":
        assert doc["kind"] in ("Role", "RoleBinding")
        if doc["kind"] == "Role":
            for rule in doc["rules"]:
                assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule  # read only
        else:
            assert doc["roleRef"]["kind"] == "Role" and doc["subjects"]
        return
    VALIDATORS[doc["kind"]].validate(doc)


def _pods(doc: dict) -> list[dict]:
    """The pod specs inside a Dask resource."""
    spec = doc.get("spec", {})
    out = []
    if doc["kind"] == "DaskJob":
        out.append(spec["job"]["spec"])
        spec = spec["cluster"]["spec"]
    if doc["kind"] in ("DaskCluster", "DaskJob"):
        out += [spec["worker"]["spec"], spec["scheduler"]["spec"]]
    if doc["kind"] == "DaskWorkerGroup":
        out.append(spec["worker"]["spec"])
    return out


def test_all_four_crds_are_there():
    assert {"DaskCluster", "DaskWorkerGroup", "DaskJob", "DaskAutoscaler"} <= set(SCHEMAS)


@pytest.mark.parametrize("name", ["cluster.yaml", "job.yaml"])
def test_committed_manifests_validate_and_are_current(name):
    docs = list(yaml.safe_load_all((ROOT / "k8s" / name).read_text()))
    assert docs
    for doc in docs:
        _validate(doc)
    cfg = load_pipeline(ROOT / "k8s" / "pipeline.yaml")
    fresh = k8s.render_job(cfg, "pipeline.yaml") if name == "job.yaml" else k8s.render(cfg)
    assert (ROOT / "k8s" / name).read_text() == k8s.dump(fresh), \
        f"k8s/{name} is stale: re-render it with dask-rl k8s render"


@pytest.mark.parametrize("pipeline", sorted((ROOT / "pipelines").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_every_pipeline_renders_valid_manifests(pipeline):
    cfg = load_pipeline(pipeline, ["cluster.kind=kubernetes", "cluster.adapt.maximum=8",
                                   "cluster.kubernetes.learner_workers=1"])
    docs = yaml.safe_load_all(k8s.dump(k8s.render(cfg) + k8s.render_job(cfg)))
    kinds = []
    for doc in docs:
        _validate(doc)
        kinds.append(doc["kind"])
    assert kinds == ["DaskCluster", "DaskWorkerGroup", "DaskWorkerGroup", "DaskAutoscaler",
                     "ConfigMap", "ServiceAccount", "DaskJob"]


def test_every_pod_runs_unprivileged_and_without_an_api_token():
    cfg = load_pipeline(ROOT / "k8s" / "pipeline.yaml")
    docs = k8s.render(cfg) + k8s.render_job(cfg)
    pods = [(d["kind"], p) for d in docs for p in _pods(d)]
    assert len(pods) == 2 + 2 + 3  # cluster (scheduler, workers), 2 groups, job (+ its cluster)
    for kind, pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == \
                ["ALL"]
        assert pod["automountServiceAccountToken"] is False
        if "serviceAccountName" in pod:  # the job's own account, not the namespace default
            assert pod["serviceAccountName"] == "dask-rl-hopper-job"
    dockerfile = (ROOT / "k8s" / "Dockerfile").read_text()
    assert f"USER {k8s.RUN_AS}" in dockerfile  # the image's user is the one pods run as


def test_env_values_can_come_from_secrets_and_never_reach_the_manifests_as_text():
    ref = {"secretKeyRef": {"name": "s3-credentials", "key": "secret"}}
    cfg = load_pipeline(ROOT / "k8s" / "pipeline.yaml",
                        ["cluster.kubernetes.env={AWS_SECRET_ACCESS_KEY: {secretKeyRef: "
                         "{name: s3-credentials, key: secret}}, REGION: eu-west-1}"])
    text = k8s.dump(k8s.render(cfg) + k8s.render_job(cfg))
    for doc in yaml.safe_load_all(text):
        _validate(doc)
        for pod in _pods(doc):
            env = {e["name"]: e for e in pod["containers"][0]["env"]}
            assert env["AWS_SECRET_ACCESS_KEY"] == {"name": "AWS_SECRET_ACCESS_KEY",
                                                    "valueFrom": ref}
            assert env["REGION"]["value"] == "eu-west-1"


def test_a_broken_manifest_is_caught():
    doc = k8s.render(load_pipeline(ROOT / "k8s" / "pipeline.yaml"))[0]
    doc["spec"]["worker"]["replicas"] = "four"
    with pytest.raises(jsonschema.ValidationError):
        VALIDATORS["DaskCluster"].validate(doc)


def test_groups_carry_the_resources_the_runtime_places_by():
    cfg = load_pipeline(ROOT / "k8s" / "pipeline.yaml")
    docs = {(d["kind"], d["metadata"]["name"]): d for d in k8s.render(cfg)}
    group = ("DaskWorkerGroup", "dask-rl-hopper-")
    param = docs[(group[0], group[1] + "parameter")]["spec"]["worker"]["spec"]["containers"][0]
    learner = docs[(group[0], group[1] + "learner")]["spec"]["worker"]["spec"]["containers"][0]
    assert param["args"][-2:] == ["--resources", "parameter=1"]
    assert learner["args"][-2:] == ["--resources", "GPU=1"]
    assert learner["resources"]["limits"]["nvidia.com/gpu"] == "1"
    sched = docs[("DaskCluster", "dask-rl-hopper")]["spec"]["scheduler"]["spec"]["containers"]
    sched = sched[0]["args"]
    assert "dask_rl.runtime.adaptive" in sched and "dask_rl.runtime.dashboard" in sched
