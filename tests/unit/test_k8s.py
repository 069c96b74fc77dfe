"""Kubernetes manifests validate against the CRD schemas inside dask-kubernetes; their
NetworkPolicies admit exactly the run's pods (as the operator labels them); TLS mode keeps
Dask's HTTP API closed; credentials reach pods only through ``secretKeyRef``.

dask-kubernetes and distributed are read as files (CRDs, the operator's source, Dask's default
config), never imported: unit tests import no Dask.
"""

import ast
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from dask_rl.config import ConfigError, load_pipeline
from dask_rl.deploy import k8s

jsonschema = pytest.importorskip("jsonschema")


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # finds a top-level package without importing it
    if spec is None or spec.origin is None:
        pytest.skip(f"{name} is not installed", allow_module_level=True)
    return Path(spec.origin).parent


ROOT = Path(__file__).resolve().parents[2]
OPERATOR = _package_dir("dask_kubernetes") / "operator"
CRDS = OPERATOR / "deployment" / "helm" / "dask-kubernetes-operator" / "crds"
DISTRIBUTED = _package_dir("distributed")
PIPELINE = ROOT / "k8s" / "pipeline.yaml"


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


# NetworkPolicy (networking.k8s.io/v1) as the API defines it, closed at every level, so a
# misspelt or misplaced field fails (no schema for it ships with dask-kubernetes).
_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
    "matchExpressions": {"type": "array", "items": {
        "type": "object", "additionalProperties": False, "required": ["key", "operator"],
        "properties": {"key": {"type": "string"},
                       "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                       "values": {"type": "array", "items": {"type": "string"}}}}}}}
_PORTS = {"type": "array", "items": {
    "type": "object", "additionalProperties": False, "required": ["port"],
    "properties": {"protocol": {"enum": ["TCP", "UDP", "SCTP"]},
                   "port": {"type": ["integer", "string"]}, "endPort": {"type": "integer"}}}}
_PEERS = {"type": "array", "items": {
    "type": "object", "additionalProperties": False, "minProperties": 1,
    "properties": {"podSelector": _SELECTOR, "namespaceSelector": _SELECTOR,
                   "ipBlock": {"type": "object"}}}}
NETWORK_POLICY = {
    "type": "object", "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "networking.k8s.io/v1"}, "kind": {"const": "NetworkPolicy"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {"type": "object", "additionalProperties": False,
                 "required": ["podSelector", "policyTypes"],
                 "properties": {
                     "podSelector": _SELECTOR,
                     "policyTypes": {"type": "array", "items": {"enum": ["Ingress", "Egress"]}},
                     "ingress": {"type": "array", "items": {
                         "type": "object", "additionalProperties": False,
                         "properties": {"from": _PEERS, "ports": _PORTS}}},
                     "egress": {"type": "array"}}}}}


def _validate(doc: dict) -> None:
    if doc["apiVersion"] == "networking.k8s.io/v1":
        jsonschema.validators.validator_for(NETWORK_POLICY)(NETWORK_POLICY).validate(doc)
        return
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
    cfg = load_pipeline(PIPELINE)
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
    assert kinds == ["NetworkPolicy", "NetworkPolicy", "DaskCluster", "DaskWorkerGroup",
                     "DaskWorkerGroup", "DaskAutoscaler", "ConfigMap", "ServiceAccount",
                     "NetworkPolicy", "NetworkPolicy", "DaskJob"]


def test_every_pod_runs_unprivileged_and_without_an_api_token():
    cfg = load_pipeline(PIPELINE)
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
    cfg = load_pipeline(PIPELINE,
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
    docs = k8s.render(load_pipeline(PIPELINE))
    [doc] = [d for d in docs if d["kind"] == "DaskCluster"]
    doc["spec"]["worker"]["replicas"] = "four"
    with pytest.raises(jsonschema.ValidationError):
        VALIDATORS["DaskCluster"].validate(doc)
    policy = docs[0]
    policy["spec"]["ingres"] = policy["spec"].pop("ingress")
    with pytest.raises(jsonschema.ValidationError):
        _validate(policy)


def test_groups_carry_the_resources_the_runtime_places_by():
    cfg = load_pipeline(PIPELINE)
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


# --- NetworkPolicies ---------------------------------------------------------------------------

def _operator_pod_labels() -> dict[str, dict]:
    """The labels the installed operator gives each kind of pod, read from its source:
    ``labels = dict(labels) | {...}`` in its pod builders, a name in a value standing for that
    argument (``cluster_name``, ``worker_group_name``)."""
    builders = {"build_scheduler_deployment_spec": "scheduler",
                "build_worker_deployment_spec": "worker", "build_job_pod_spec": "job-runner"}
    tree = ast.parse((OPERATOR / "controller" / "controller.py").read_text())
    found = {}
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name in builders:
            [merged] = [n.value.right for n in ast.walk(fn) if isinstance(n, ast.Assign)
                        and isinstance(n.value, ast.BinOp) and isinstance(n.value.op, ast.BitOr)
                        and isinstance(n.value.right, ast.Dict)]
            found[builders[fn.name]] = {
                k.value: (("arg", v.id) if isinstance(v, ast.Name) else v.value)
                for k, v in zip(merged.keys, merged.values, strict=True)}
    assert set(found) == set(builders.values()), found
    return found


OPERATOR_LABELS = _operator_pod_labels()


@dataclass
class Pod:
    name: str
    namespace: str
    labels: dict
    spec: dict = field(default_factory=lambda: {"containers": []})

    @property
    def ports(self) -> set[int]:
        """Where it listens: its declared container ports and the ports in its Dask args."""
        ports = set()
        for c in self.spec["containers"]:
            ports |= {p["containerPort"] for p in c.get("ports", [])}
            for flag in ("--worker-port", "--nanny-port", "--dashboard-address", "--port"):
                if flag in c["args"]:
                    ports.add(int(c["args"][c["args"].index(flag) + 1].rsplit(":", 1)[-1]))
            if c["args"][:2] == ["dask", "scheduler"] and "--port" not in c["args"]:
                ports.add(8786)  # dask scheduler's default
        return ports


def _labels(component: str, **args: str) -> dict:
    return {k: (args[v[1]] if isinstance(v, tuple) else v)
            for k, v in OPERATOR_LABELS[component].items()}


def _run_pods(docs: list[dict]) -> list[Pod]:
    """The pods the operator creates for these resources, labelled as its source says."""
    pods = []
    for d in docs:
        ns, name, spec = d["metadata"]["namespace"], d["metadata"]["name"], d.get("spec", {})
        if d["kind"] == "DaskJob":  # the job's cluster is named as the job
            pods.append(Pod(f"{name}-runner", ns, _labels("job-runner", cluster_name=name),
                            spec["job"]["spec"]))
            spec = spec["cluster"]["spec"]
        if d["kind"] in ("DaskCluster", "DaskJob"):
            pods.append(Pod(f"{name}-scheduler", ns, _labels("scheduler", cluster_name=name),
                            spec["scheduler"]["spec"]))
            pods.append(Pod(f"{name}-default-worker", ns,
                            _labels("worker", cluster_name=name,
                                    worker_group_name=f"{name}-default"),
                            spec["worker"]["spec"]))
        if d["kind"] == "DaskWorkerGroup":
            pods.append(Pod(f"{name}-worker", ns,
                            _labels("worker", cluster_name=spec["cluster"],
                                    worker_group_name=name),
                            spec["worker"]["spec"]))
    return pods


def _selects(selector: dict, labels: dict) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        has, value, values = e["key"] in labels, labels.get(e["key"]), e.get("values", [])
        if not {"In": has and value in values, "NotIn": not has or value not in values,
                "Exists": has, "DoesNotExist": not has}[e["operator"]]:
            return False
    return True


def _admitted(policies: list[dict], src: Pod, dst: Pod, port: int) -> bool:
    """NetworkPolicy semantics: a pod no Ingress policy selects takes everything; otherwise a
    connection needs one rule of one selecting policy that admits its source and port."""
    selecting = [p for p in policies if p["metadata"]["namespace"] == dst.namespace
                 and "Ingress" in p["spec"]["policyTypes"]
                 and _selects(p["spec"]["podSelector"], dst.labels)]
    if not selecting:
        return True
    for p in selecting:
        for rule in p["spec"].get("ingress", []):
            if "ports" in rule and not any(
                    r.get("protocol", "TCP") == "TCP"
                    and r["port"] <= port <= r.get("endPort", r["port"]) for r in rule["ports"]):
                continue
            for peer in rule.get("from") or [{"namespaceSelector": {}}]:  # no from: anyone
                if "ipBlock" in peer:
                    return True  # an address range: anyone could hold such an address
                if "namespaceSelector" in peer:
                    ns_ok = _selects(peer["namespaceSelector"],
                                     {"kubernetes.io/metadata.name": src.namespace})
                else:
                    ns_ok = src.namespace == p["metadata"]["namespace"]
                if ns_ok and _selects(peer.get("podSelector", {}), src.labels):
                    return True
    return False


def _rendered(job: bool, overrides=()) -> list[dict]:
    cfg = load_pipeline(PIPELINE, list(overrides))
    text = k8s.dump(k8s.render_job(cfg) if job else k8s.render(cfg))
    return list(yaml.safe_load_all(text))  # as kubectl would read them


def test_the_policies_select_pods_by_the_labels_the_operator_gives_them():
    """Every label a policy selects the run's pods by is one the installed operator puts on
    each of them, and the components named are the operator's."""
    assert set(k8s.RUN_COMPONENTS) == set(OPERATOR_LABELS)
    on_every_pod = set.intersection(*(set(v) for v in OPERATOR_LABELS.values()))
    selected = set()
    for policy in k8s.render_network_policies(load_pipeline(PIPELINE)):
        selector = policy["spec"]["podSelector"]
        selected |= set(selector.get("matchLabels", {}))
        selected |= {e["key"] for e in selector.get("matchExpressions", [])}
        for e in selector.get("matchExpressions", []):
            assert set(e["values"]) <= set(OPERATOR_LABELS), e
    assert selected and selected <= on_every_pod, selected


@pytest.mark.parametrize("job", [False, True], ids=["cluster", "job"])
@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
def test_network_policies_admit_exactly_the_runs_own_pods(job, tls):
    overrides = ["cluster.kubernetes.tls_secret=dask-tls", "cluster.adapt=null"] if tls else []
    docs = _rendered(job, overrides)
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert policies and all(d["apiVersion"] == "networking.k8s.io/v1" for d in policies)
    for d in docs:
        _validate(d)
    run = _run_pods(docs)
    ns = run[0].namespace
    # scheduler and default workers, with the runner (job) or the two other groups (cluster)
    assert len(run) == (3 if job else 4)
    for pod in run:
        assert not _admitted(policies, Pod("outsider", ns, {}), pod, 1), pod.name  # isolated
        for c in pod.spec["containers"]:
            if c["args"][:2] == ["dask", "worker"]:  # random ports could be named by no policy
                assert "--worker-port" in c["args"] and "--nanny-port" in c["args"]
    servers = [p for p in run if p.ports]
    assert {8786, 8787} <= next(p for p in run if "scheduler" in p.name).ports
    for dst in servers:
        for port in dst.ports:
            for src in run:
                assert _admitted(policies, src, dst, port), (src.name, dst.name, port)
            assert not _admitted(policies, Pod("x", ns, {}), dst, port)
    name = run[0].labels[k8s.CLUSTER_LABEL]
    outsiders = [
        Pod("other-run", ns, _labels("worker", cluster_name="other",
                                     worker_group_name="other-default")),
        Pod("same-labels-elsewhere", "elsewhere", _labels("worker", cluster_name=name,
                                                          worker_group_name=f"{name}-default")),
        Pod("no-component", ns, {k8s.CLUSTER_LABEL: name}),
        Pod("web", ns, {"app": "web"}),
        Pod("operator-lookalike", ns, {"app.kubernetes.io/name": "dask-kubernetes-operator"}),
    ]
    operator = Pod("operator", "dask-operator",
                   {"app.kubernetes.io/name": "dask-kubernetes-operator",
                    "app.kubernetes.io/instance": "dask-kubernetes-operator-1700000000"})
    for dst in run:
        for port in sorted(dst.ports | {22, 80, 443, 8080}):
            for src in outsiders:
                assert not _admitted(policies, src, dst, port), (src.name, dst.name, port)
            is_scheduler = dst.labels[k8s.COMPONENT_LABEL] == "scheduler"
            assert _admitted(policies, operator, dst, port) == \
                (is_scheduler and port in (8786, 8787)), (dst.name, port)
        for port in (22, 443, 8080, 9000):
            for src in run:
                assert not _admitted(policies, src, dst, port), (src.name, dst.name, port)


def test_the_evaluator_catches_an_open_policy():
    """The semantics above can fail: a policy without a from, or with an address range,
    admits anyone."""
    docs = _rendered(False)
    run = _run_pods(docs)
    for opening in ({}, {"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}):
        policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
        policies[0]["spec"]["ingress"].append(opening)
        assert _admitted(policies, Pod("x", "elsewhere", {}), run[0], 8786)
        policies[0]["spec"]["ingress"].pop()
    assert not _admitted(policies, Pod("x", "elsewhere", {}), run[0], 8786)


# --- TLS: Dask's HTTP API stays closed ---------------------------------------------------------

API_ROUTE = "distributed.http.scheduler.api"


def _default_scheduler_routes() -> list[str]:
    conf = yaml.safe_load((DISTRIBUTED / "distributed.yaml").read_text())
    return conf["distributed"]["scheduler"]["http"]["routes"]


def _effective_routes(env: list[dict]) -> list[str]:
    """What ``distributed.scheduler.http.routes`` a pod with this environment gets: an
    environment variable overrides the default (Dask parses its value as a Python literal)."""
    for e in env:
        if e["name"] == "DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES":
            assert "value" in e, e
            return ast.literal_eval(e["value"])
    return _default_scheduler_routes()


@pytest.mark.parametrize("job", [False, True], ids=["cluster", "job"])
def test_tls_mode_does_not_open_dasks_unauthenticated_http_api(job):
    assert API_ROUTE not in _default_scheduler_routes()  # distributed keeps it off by default
    docs = _rendered(job, ["cluster.kubernetes.tls_secret=dask-tls", "cluster.adapt=null"])
    containers = [c for d in docs for p in _pods(d) for c in p["containers"]]
    assert containers
    for c in containers:
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"] == "true"  # TLS mode it is
        routes = _effective_routes(c["env"])
        assert API_ROUTE not in routes, c["name"]
        assert set(routes) <= set(_default_scheduler_routes())  # nothing beyond Dask's own


def test_tls_mode_refuses_what_would_reopen_the_api_or_cannot_reach_the_scheduler():
    tls = "cluster.kubernetes.tls_secret=dask-tls"
    routes = str(_default_scheduler_routes() + [API_ROUTE])
    cfg = load_pipeline(PIPELINE, [tls, "cluster.adapt=null", _env_override(
        {"DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES": routes})])
    for render in (k8s.render, k8s.render_job):
        with pytest.raises(ConfigError, match=r"^cluster\.kubernetes\.env\.DASK_DISTRIBUTED__"
                                              r"SCHEDULER__HTTP__ROUTES: "):
            render(cfg)
    # the operator's DaskAutoscaler reaches the scheduler only over that API or plain TCP
    with pytest.raises(ConfigError, match=r"^cluster\.adapt: .*tls_secret"):
        k8s.render(load_pipeline(PIPELINE, [tls]))


# --- Credentials only by secretKeyRef ----------------------------------------------------------

CREDENTIALS = {  # name: a literal that must never be written into a manifest
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
    "AWS_SESSION_TOKEN": "FwoGZXIvYXdzEXAMPLE",
    "MLFLOW_TRACKING_TOKEN": "mlflow-tok-123",
    "MLFLOW_TRACKING_PASSWORD": "hunter2",
    "WANDB_API_KEY": "0123456789abcdef",
    "HF_TOKEN": "hf_example",
    "mlflowTrackingToken": "tok-camel",
    "MLFLOW_TRACKING_URI": "https://alice:hunter2@mlflow.example.org",
    "TRACKER_URL": "https://mlflow.example.org/?token=abc123",
    "S3_ENDPOINT_HINT": "AKIAIOSFODNN7EXAMPLE",
}
# the test's own notion, independent of the renderer's
_CREDENTIAL_NAME = re.compile(r"SECRET|TOKEN|PASSW|(^|_)(API_?)?KEYS?(_|$)|CREDENTIAL", re.I)
PLAIN = {"AWS_REGION": "eu-west-1", "MLFLOW_TRACKING_URI": "https://mlflow.example.org:5000",
         "KEYBOARD_LAYOUT": "us", "MONKEY_PATCH": "0", "LOG_LEVEL": "INFO"}


def _env_override(env: dict) -> str:
    return "cluster.kubernetes.env=" + yaml.safe_dump(env, default_flow_style=True).strip()


def test_only_credentials_are_refused_as_literal_env_values():
    """A credential-looking literal: one line naming the variable, without the value, from
    every renderer (the cluster, the job, and the specs KubeCluster uses); plain settings
    stay literal."""
    for name, value in CREDENTIALS.items():
        cfg = load_pipeline(PIPELINE, [_env_override({name: value})])
        for render in (k8s.render, k8s.render_job, k8s.render_cluster_spec,
                       k8s.render_worker_groups):
            with pytest.raises(ConfigError) as err:
                render(cfg)
            message = str(err.value)
            assert message.startswith(f"cluster.kubernetes.env.{name}: ") and \
                "secretKeyRef" in message and "\n" not in message, message
            assert value not in message and "hunter2" not in message
    cfg = load_pipeline(PIPELINE, [_env_override(PLAIN)])
    for d in k8s.render(cfg) + k8s.render_job(cfg):
        for pod in _pods(d):
            env = {e["name"]: e for e in pod["containers"][0]["env"]}
            for name, value in PLAIN.items():
                assert env[name] == {"name": name, "value": value}


def test_credentials_come_from_secrets_not_configmaps_or_other_references():
    bad = [{"AWS_SECRET_ACCESS_KEY": {"configMapKeyRef": {"name": "s3", "key": "secret"}}},
           {"REGION": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
           {"AWS_SECRET_ACCESS_KEY": {"secretKeyRef": {"name": "s3"}}},
           {"AWS_SECRET_ACCESS_KEY": {"secretKeyRef": {"name": "s3", "key": "k"},
                                      "configMapKeyRef": {"name": "s3", "key": "k"}}}]
    for env in bad:
        [name] = env
        with pytest.raises(ConfigError, match=rf"^cluster\.kubernetes\.env\.{name}: "):
            k8s.render(load_pipeline(PIPELINE, [_env_override(env)]))
    ok = {"REGION": {"configMapKeyRef": {"name": "settings", "key": "region"}}}
    k8s.render(load_pipeline(PIPELINE, [_env_override(ok)]))


def _secret_mounts(pod: dict) -> list[str]:
    secrets = {v["name"] for v in pod.get("volumes", []) if "secret" in v}
    return [m["mountPath"] for c in pod["containers"] for m in c.get("volumeMounts", [])
            if m["name"] in secrets]


def _credential_env(docs: list[dict]) -> list[dict]:
    """Every credential-looking environment entry of these manifests; a literal one must be a
    path into a Secret the pod mounts (TLS keys), nothing else."""
    found = []
    for d in docs:
        for pod in _pods(d):
            for c in pod["containers"]:
                for e in c["env"]:
                    if not (_CREDENTIAL_NAME.search(e["name"]) or e["name"] in CREDENTIALS
                            or e.get("value") in CREDENTIALS.values()):
                        continue
                    if "value" in e:
                        assert any(e["value"].startswith(m + "/") for m in _secret_mounts(pod)), e
                    else:
                        assert set(e["valueFrom"]) == {"secretKeyRef"}, e
                        found.append(e)
    return found


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
def test_the_shipped_example_gets_its_credentials_only_from_secrets(tls):
    """k8s/pipeline.yaml checkpoints to S3: its pods get the S3 keys, and only by reference,
    in the committed manifests and in fresh renders."""
    committed = [d for name in ("cluster.yaml", "job.yaml")
                 for d in yaml.safe_load_all((ROOT / "k8s" / name).read_text())]
    overrides = ["cluster.kubernetes.tls_secret=dask-tls", "cluster.adapt=null"] if tls else []
    for docs in (committed, _rendered(False, overrides), _rendered(True, overrides)):
        names = {e["name"] for e in _credential_env(docs)}
        assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= names
    assert load_pipeline(PIPELINE).checkpoint.path.startswith("s3://")


def test_the_readme_suggests_credentials_only_as_secret_references():
    """Every YAML example in k8s/README.md that sets pod environment gives credentials as
    secretKeyRef, and renders; prose and shell suggest no literal either."""
    text = (ROOT / "k8s" / "README.md").read_text()
    envs = []
    for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
        doc = yaml.safe_load(_dedent(block))
        env = ((doc or {}).get("cluster") or {}).get("kubernetes", {}).get("env")
        if env is not None:
            envs.append(env)
    assert envs, "k8s/README.md shows no cluster.kubernetes.env example"
    for env in envs:
        assert any(_CREDENTIAL_NAME.search(n) for n in env)  # it is about credentials
        for name, value in env.items():
            if _CREDENTIAL_NAME.search(name):
                assert set(value) == {"secretKeyRef"}, (name, value)
        cfg = load_pipeline(PIPELINE, [_env_override(env)])
        assert _credential_env(k8s.render(cfg))
    assert "credentials in `cluster.kubernetes.env`" not in text
    assert "--from-literal" not in text  # a secret on a command line stays in shell history


def _dedent(block: str) -> str:
    lines = block.splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines)
