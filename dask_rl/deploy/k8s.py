"""Kubernetes manifests for a pipeline (the dask-kubernetes operator's resources).

A pipeline's cluster on Kubernetes is one ``DaskCluster`` whose default worker group holds the
rollout workers (the group the operator's ``DaskAutoscaler`` scales), plus two
``DaskWorkerGroup`` s: GPU learners (``--resources GPU=<n>``, so learner tasks asking for
``GPU`` land there) and a small fixed parameter group (``--resources parameter=1``) that hosts
the parameter actors and is never scaled down. The scheduler runs with the dask-rl preloads:
the ``/rl`` dashboard page and the RL-aware adaptive target. ``render_job`` wraps the cluster
in a ``DaskJob`` whose pod runs ``dask-rl train`` on a pipeline mounted from a ``ConfigMap``.

Both come with ``NetworkPolicy`` s (:func:`render_network_policies`): the run's own pods reach
each other's Dask ports and nothing else reaches them, but for the operator, which reaches the
scheduler only. Credentials reach pods only through ``secretKeyRef`` (a literal that looks like
one is refused), and TLS mode keeps Dask's unauthenticated HTTP API (``/api/v1``) closed.

Everything here returns plain dicts (no Kubernetes client): ``dask-rl k8s render PIPELINE``
prints them as YAML, and the tests validate them against the CRD schemas shipped inside
``dask-kubernetes``.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from dask_rl.config import ConfigError, PipelineConfig, public_dict

API = "kubernetes.dask.org/v1"
NETWORKING_API = "networking.k8s.io/v1"
PRELOADS = ("dask_rl.runtime.dashboard", "dask_rl.runtime.adaptive")
PIPELINE_DIR = "/etc/dask-rl"


#: Every pod runs as the image's unprivileged user (k8s/Dockerfile: uid 1000) with no
#: capabilities and no privilege escalation.
RUN_AS = 1000
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS,
                "fsGroup": RUN_AS, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "privileged": False,
                      "capabilities": {"drop": ["ALL"]}}
VALUE_FROM = ("secretKeyRef", "configMapKeyRef")

#: The ports of the run's pods: the scheduler's comm and dashboard, and each worker's dashboard,
#: comm and nanny (pinned, where Dask would pick random ones, so that a NetworkPolicy can name
#: them; every worker has a pod and an address of its own, so they never collide).
SCHEDULER_PORT, DASHBOARD_PORT = 8786, 8787
WORKER_DASHBOARD_PORT, WORKER_PORT, NANNY_PORT = 8788, 8789, 8790
#: The parameter actor's direct channel (``dask_rl.runtime.channel``): the first free port of
#: this range on the actor's worker (a few actors may share a worker: PBT's population).
CHANNEL_PORTS = tuple(range(8791, 8799))
DASK_PORTS = (SCHEDULER_PORT, DASHBOARD_PORT, WORKER_DASHBOARD_PORT, WORKER_PORT, NANNY_PORT)

#: The labels the dask-kubernetes operator puts on the pods it creates for a DaskCluster or a
#: DaskJob (``build_scheduler_deployment_spec``, ``build_worker_deployment_spec`` and
#: ``build_job_pod_spec`` in ``dask_kubernetes/operator/controller/controller.py``); a DaskJob's
#: cluster is named as the job.
CLUSTER_LABEL, COMPONENT_LABEL = "dask.org/cluster-name", "dask.org/component"
RUN_COMPONENTS = ("scheduler", "worker", "job-runner")

#: Where k8s/README.md installs the operator (``helm install -n dask-operator``) and the label
#: its Helm chart gives the operator's pod. The operator must reach the scheduler: scaling a
#: worker group down asks it which workers to retire, over HTTP (8787) and then the Dask comm
#: (8786), and the DaskAutoscaler polls it the same way.
OPERATOR_NAMESPACE = "dask-operator"
OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "dask-kubernetes-operator"}

# Names split into words (AWS_SECRET_ACCESS_KEY, mlflowTrackingToken): any of these words
# makes the variable a credential. Values: a URL with a password or a token in its query, or an
# AWS access key id.
_CREDENTIAL_WORDS = frozenset({"SECRET", "SECRETS", "TOKEN", "TOKENS", "PASSWORD", "PASSWD",
                               "PASS", "KEY", "KEYS", "APIKEY", "ACCESSKEY", "CREDENTIAL",
                               "CREDENTIALS", "COOKIE", "DSN"})
_CREDENTIAL_VALUE = re.compile(
    r"://[^/@\s:]*:[^/@\s]+@"
    r"|[?&][^=&#\s]*(?:token|key|secret|password|passwd|sig|signature|credential)[^=&#\s]*="
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b", re.IGNORECASE)


def looks_like_credential(name: str, value: object = "") -> bool:
    """Whether an environment variable ``name=value`` is a credential (by its name's words, or
    by a value that carries a password, a token or an AWS key id)."""
    words = re.split(r"[^A-Z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).upper())
    return bool(_CREDENTIAL_WORDS.intersection(words)) or \
        (isinstance(value, str) and bool(_CREDENTIAL_VALUE.search(value)))


def _check_env(cfg: PipelineConfig) -> None:
    """``cluster.kubernetes.env``: references of the two kinds Kubernetes resolves in the pod,
    credentials only from a Secret (a literal would be written into the manifests, which live
    in files, in ``kubectl get -o yaml`` and in the API server's store, readable by whoever may
    read pods), and in TLS mode nothing that would undo the TLS settings."""
    reserved = {e["name"] for e in _tls_env(cfg) + _scheduler_address(cfg)}
    for name, value in cfg.cluster.kubernetes.env.items():
        name = str(name)
        key = f"cluster.kubernetes.env.{name}"
        if name in reserved:
            raise ConfigError(f"{key}: set by cluster.kubernetes.tls_secret; TLS mode does not "
                              f"take it from the pipeline")
        if isinstance(value, dict):
            kind, ref = next(iter(value.items())) if len(value) == 1 else (None, None)
            if kind not in VALUE_FROM or not isinstance(ref, dict) \
                    or not all(isinstance(ref.get(f), str) for f in ("name", "key")):
                raise ConfigError(f"{key}: expected a value or {{secretKeyRef: {{name: ..., "
                                  f"key: ...}}}} / {{configMapKeyRef: ...}}, got a mapping "
                                  f"with {sorted(map(str, value))}")
            if looks_like_credential(name) and kind != "secretKeyRef":
                raise ConfigError(f"{key}: a credential comes from a Secret: {{secretKeyRef: "
                                  f"{{name: ..., key: ...}}}}, not a ConfigMap")
        elif looks_like_credential(name, value):
            # the value stays out of the message: it is the credential
            raise ConfigError(f"{key}: looks like a credential; give it as {{secretKeyRef: "
                              f"{{name: <Secret>, key: <key>}}}} (k8s/README.md), not a "
                              f"literal value, which would be written into the manifests")


def _env(cfg: PipelineConfig) -> list[dict]:
    """Pod environment: ours, then ``cluster.kubernetes.env`` — a literal value, or
    ``{secretKeyRef: {name, key}}`` / ``{configMapKeyRef: ...}`` read by Kubernetes in the pod
    (the secret itself never appears in a manifest, a metrics record or a checkpoint).
    Credentials must be ``secretKeyRef`` s (:func:`_check_env`)."""
    _check_env(cfg)
    base: dict[str, object] = {
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
        # as on embedded clusters: the profiler's history costs ~110 MB per worker
        "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": str(cfg.cluster.profile).lower()}
    base.update({str(k): v for k, v in cfg.cluster.kubernetes.env.items()})
    out = []
    for name, value in base.items():
        if isinstance(value, dict):
            out.append({"name": name, "valueFrom": value})
        else:
            out.append({"name": name, "value": str(value)})
    return out


TLS_DIR = "/etc/dask-tls"
#: The scheduler's HTTP routes in TLS mode: distributed's defaults, pinned so that no Dask
#: config baked into an image adds ``distributed.http.scheduler.api``. That API answers anyone
#: who reaches the dashboard port, with no certificate (the dashboard's own TLS does not ask
#: clients for one), and ``POST /api/v1/retire_workers`` retires workers: a TLS cluster would
#: be open to whoever reaches 8787. Without it the operator cannot reach a TLS scheduler
#: (it speaks plain HTTP and TCP), so TLS mode has no DaskAutoscaler (:func:`render`).
SCHEDULER_ROUTES = ["distributed.http.scheduler.prometheus", "distributed.http.scheduler.info",
                    "distributed.http.scheduler.json", "distributed.http.health",
                    "distributed.http.proxy", "distributed.http.statics"]


def _tls_env(cfg: PipelineConfig) -> list[dict]:
    """Dask's TLS settings from the mounted Secret (every role: scheduler, worker, client)."""
    if cfg.cluster.kubernetes.tls_secret is None:
        return []
    env = {"DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "true",
           "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": f"{TLS_DIR}/ca.crt",
           "DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES": str(SCHEDULER_ROUTES)}
    for role in ("SCHEDULER", "WORKER", "CLIENT"):
        env[f"DASK_DISTRIBUTED__COMM__TLS__{role}__CERT"] = f"{TLS_DIR}/tls.crt"
        env[f"DASK_DISTRIBUTED__COMM__TLS__{role}__KEY"] = f"{TLS_DIR}/tls.key"
    return [{"name": k, "value": v} for k, v in env.items()]


def _scheduler_address(cfg: PipelineConfig) -> list[dict]:
    """With TLS, where workers and the job find the scheduler (the operator would say tcp://;
    it keeps an address the pod already sets)."""
    k = cfg.cluster.kubernetes
    if k.tls_secret is None:
        return []
    return [{"name": "DASK_SCHEDULER_ADDRESS",
             "value": f"tls://{k.name}-scheduler.{k.namespace}.svc.cluster.local:8786"}]


def _pod(containers: list[dict], cfg: PipelineConfig, **extra) -> dict:
    secret = cfg.cluster.kubernetes.tls_secret
    for c in containers:
        c["securityContext"] = dict(CONTAINER_SECURITY)
        if secret is not None:
            c["env"] = c["env"] + _tls_env(cfg)
            c["volumeMounts"] = [*c.get("volumeMounts", []),
                                 {"name": "dask-tls", "mountPath": TLS_DIR, "readOnly": True}]
    if secret is not None:
        extra["volumes"] = [*extra.get("volumes", []),
                            {"name": "dask-tls", "secret": {"secretName": secret}}]
    return {"securityContext": dict(POD_SECURITY), **extra, "containers": containers}


def _resources(cpu: str | None, memory: str, gpus: int = 0) -> dict:
    limits: dict[str, str] = {"memory": memory}
    requests: dict[str, str] = {"memory": memory}
    if cpu is not None:
        limits["cpu"] = requests["cpu"] = str(cpu)
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    return {"limits": limits, "requests": requests}


def _worker_pod(cfg: PipelineConfig, *, resources: dict, dask_resources: str | None,
                threads: int) -> dict:
    k = cfg.cluster.kubernetes
    args = ["dask", "worker", "--name", "$(DASK_WORKER_NAME)", "--nthreads", str(threads),
            "--dashboard", "--dashboard-address", str(WORKER_DASHBOARD_PORT),
            "--worker-port", str(WORKER_PORT), "--nanny-port", str(NANNY_PORT)]
    if dask_resources:
        args += ["--resources", dask_resources]
    channel = {"name": "DASK_RL_CHANNEL_PORTS",
               "value": f"{CHANNEL_PORTS[0]}-{CHANNEL_PORTS[-1]}"}
    return _pod([{
        "name": "worker", "image": k.image, "args": args,
        "env": [*_env(cfg), channel, *_scheduler_address(cfg)], "resources": resources,
        "ports": [{"name": "http-dashboard", "containerPort": WORKER_DASHBOARD_PORT,
                   "protocol": "TCP"},
                  {"name": "tcp-worker", "containerPort": WORKER_PORT, "protocol": "TCP"},
                  {"name": "tcp-nanny", "containerPort": NANNY_PORT, "protocol": "TCP"},
                  *({"name": f"tcp-channel-{i}", "containerPort": port, "protocol": "TCP"}
                    for i, port in enumerate(CHANNEL_PORTS))],
    }], cfg, automountServiceAccountToken=False)


def render_cluster_spec(cfg: PipelineConfig) -> dict:
    """The ``spec`` of the DaskCluster (shared by the cluster and the job)."""
    k = cfg.cluster.kubernetes
    scheduler_args = ["dask", "scheduler", "--host", "0.0.0.0"]
    if k.tls_secret is not None:
        scheduler_args += ["--protocol", "tls"]
    for module in PRELOADS:
        scheduler_args += ["--preload", module]
    return {
        "idleTimeout": 0,
        "worker": {
            "replicas": k.rollout_workers,
            "spec": _worker_pod(cfg, resources=_resources(k.rollout_cpu, k.rollout_memory),
                                dask_resources=None, threads=cfg.cluster.threads_per_worker),
        },
        "scheduler": {
            "spec": _pod([{
                "name": "scheduler", "image": k.image, "args": scheduler_args,
                "env": _env(cfg), "resources": _resources(None, k.scheduler_memory),
                "ports": [{"name": "tcp-comm", "containerPort": SCHEDULER_PORT,
                           "protocol": "TCP"},
                          {"name": "http-dashboard", "containerPort": DASHBOARD_PORT,
                           "protocol": "TCP"}],
                "readinessProbe": {"httpGet": {"port": "http-dashboard", "path": "/health"},
                                   "initialDelaySeconds": 0, "periodSeconds": 1,
                                   "timeoutSeconds": 300},
                "livenessProbe": {"httpGet": {"port": "http-dashboard", "path": "/health"},
                                  "initialDelaySeconds": 15, "periodSeconds": 20},
            }], cfg, automountServiceAccountToken=False),
            "service": {
                "type": "ClusterIP",
                "selector": {"dask.org/cluster-name": k.name,
                             "dask.org/component": "scheduler"},
                "ports": [{"name": "tcp-comm", "protocol": "TCP", "port": SCHEDULER_PORT,
                           "targetPort": "tcp-comm"},
                          {"name": "http-dashboard", "protocol": "TCP", "port": DASHBOARD_PORT,
                           "targetPort": "http-dashboard"}],
            },
        },
    }


def render_worker_groups(cfg: PipelineConfig) -> list[dict]:
    """The learner (GPU) and parameter groups, as DaskWorkerGroup resources."""
    k = cfg.cluster.kubernetes
    groups = [{
        "apiVersion": API, "kind": "DaskWorkerGroup",
        "metadata": {"name": f"{k.name}-parameter", "namespace": k.namespace,
                     "labels": {"dask-rl/group": "parameter"}},
        "spec": {"cluster": k.name, "worker": {
            "replicas": k.parameter_workers,
            "spec": _worker_pod(cfg, resources=_resources("1", k.parameter_memory),
                                dask_resources="parameter=1", threads=1)}},
    }]
    if k.learner_workers:
        groups.append({
            "apiVersion": API, "kind": "DaskWorkerGroup",
            "metadata": {"name": f"{k.name}-learner", "namespace": k.namespace,
                         "labels": {"dask-rl/group": "learner"}},
            "spec": {"cluster": k.name, "worker": {
                "replicas": k.learner_workers,
                "spec": _worker_pod(cfg, resources=_resources("4", k.learner_memory,
                                                              k.learner_gpus),
                                    dask_resources=f"GPU={k.learner_gpus}", threads=1)}},
        })
    return groups


def render_network_policies(cfg: PipelineConfig) -> list[dict]:
    """Ingress to the run's pods (scheduler, workers, the job's pod) from the run's own pods
    only, on the Dask ports; the operator's pod may reach the scheduler's two ports. Everything
    else is denied (egress is left open: object stores, DNS, trackers). The kubelet's probes
    and ``kubectl port-forward`` are not stopped by a NetworkPolicy. Applied before the
    cluster, so that no pod of the run starts unprotected."""
    k = cfg.cluster.kubernetes

    def run_pods() -> dict:
        return {"matchLabels": {CLUSTER_LABEL: k.name},
                "matchExpressions": [{"key": COMPONENT_LABEL, "operator": "In",
                                      "values": list(RUN_COMPONENTS)}]}

    def policy(name: str, pods: dict, peer: dict, ports: tuple) -> dict:  # a port or a range
        return {"apiVersion": NETWORKING_API, "kind": "NetworkPolicy",
                "metadata": {"name": name, "namespace": k.namespace,
                             "labels": {"app.kubernetes.io/part-of": "dask-rl"}},
                "spec": {"podSelector": pods, "policyTypes": ["Ingress"],
                         "ingress": [{"from": [peer],
                                      "ports": [{"protocol": "TCP", "port": p[0], "endPort": p[1]}
                                                if isinstance(p, tuple) else
                                                {"protocol": "TCP", "port": p}
                                                for p in ports]}]}}

    operator = {"namespaceSelector": {"matchLabels": {
                    "kubernetes.io/metadata.name": OPERATOR_NAMESPACE}},
                "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)}}
    channel = (CHANNEL_PORTS[0], CHANNEL_PORTS[-1])
    return [policy(f"{k.name}-pods", run_pods(), {"podSelector": run_pods()},
                   (*DASK_PORTS, channel)),
            policy(f"{k.name}-operator",
                   {"matchLabels": {CLUSTER_LABEL: k.name, COMPONENT_LABEL: "scheduler"}},
                   operator, (SCHEDULER_PORT, DASHBOARD_PORT))]


def render(cfg: PipelineConfig) -> list[dict]:
    """NetworkPolicies, DaskCluster, worker groups and (with ``cluster.adapt``) a
    DaskAutoscaler."""
    k = cfg.cluster.kubernetes
    if cfg.cluster.adapt is not None and k.tls_secret is not None:
        raise ConfigError("cluster.adapt: the operator's DaskAutoscaler reaches the scheduler "
                          "over plain HTTP and TCP, which a TLS cluster "
                          "(cluster.kubernetes.tls_secret) does not serve; set cluster.adapt "
                          "to null or drop tls_secret")
    docs = render_network_policies(cfg)
    docs += [{"apiVersion": API, "kind": "DaskCluster",
             "metadata": {"name": k.name, "namespace": k.namespace,
                          "labels": {"app.kubernetes.io/part-of": "dask-rl"}},
              "spec": render_cluster_spec(cfg)}]
    docs += render_worker_groups(cfg)
    if cfg.cluster.adapt is not None:
        docs.append({"apiVersion": API, "kind": "DaskAutoscaler",
                     "metadata": {"name": k.name, "namespace": k.namespace},
                     "spec": {"cluster": k.name, "minimum": cfg.cluster.adapt.minimum,
                              "maximum": cfg.cluster.adapt.maximum}})
    return docs


def render_job(cfg: PipelineConfig, pipeline_name: str = "pipeline.yaml") -> list[dict]:
    """A ConfigMap with the pipeline, the job's ServiceAccount and NetworkPolicies, and a
    DaskJob that trains the pipeline on its own cluster."""
    k = cfg.cluster.kubernetes
    job_cfg = public_dict(cfg)  # --address below makes the job pod join the job's own cluster
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": f"{k.name}-pipeline", "namespace": k.namespace},
                  "data": {pipeline_name: yaml.safe_dump(job_cfg, sort_keys=False)}}
    account = f"{k.name}-job"
    job = {
        "apiVersion": API, "kind": "DaskJob",
        "metadata": {"name": k.name, "namespace": k.namespace},
        "spec": {
            "job": {"spec": _pod([{
                "name": "job", "image": k.image,
                "args": ["dask-rl", "train", f"{PIPELINE_DIR}/{pipeline_name}",
                         "--address", "$(DASK_SCHEDULER_ADDRESS)", "--run-dir",
                         "/runs/job", "--no-progress"],
                "env": _env(cfg) + _scheduler_address(cfg),
                "volumeMounts": [{"name": "pipeline", "mountPath": PIPELINE_DIR},
                                 {"name": "runs", "mountPath": "/runs"}],
            }], cfg, restartPolicy="Never", serviceAccountName=account,
                automountServiceAccountToken=False,
                volumes=[{"name": "pipeline", "configMap": {"name": f"{k.name}-pipeline"}},
                         {"name": "runs", "emptyDir": {}}])},
            "cluster": {"spec": render_cluster_spec(cfg)},
        },
    }
    return [config_map, *_job_rbac(cfg, account), *render_network_policies(cfg), job]


def _job_rbac(cfg: PipelineConfig, account: str) -> list[dict]:
    """The job pod's own ServiceAccount, with no token and no role: the job only talks to its
    scheduler (``--address``); the operator, not the job, creates and scales the cluster. Least
    privilege is none (instead of the namespace's ``default`` account and whatever it may
    hold)."""
    k = cfg.cluster.kubernetes
    meta = {"name": account, "namespace": k.namespace,
            "labels": {"app.kubernetes.io/part-of": "dask-rl"}}
    return [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta,
             "automountServiceAccountToken": False}]


def dump(docs: list[dict]) -> str:
    """Manifests as one multi-document YAML string (no nulls: the API server drops them)."""
    return yaml.safe_dump_all([_strip_nulls(d) for d in docs], sort_keys=False)


def _strip_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value
