"""Kubernetes manifests for a pipeline (the dask-kubernetes operator's resources).

A pipeline's cluster on Kubernetes is one ``DaskCluster`` whose default worker group holds the
rollout workers (the group the operator's ``DaskAutoscaler`` scales), plus two
``DaskWorkerGroup`` s: GPU learners (``--resources GPU=<n>``, so learner tasks asking for
``GPU`` land there) and a small fixed parameter group (``--resources parameter=1``) that hosts
the parameter actors and is never scaled down. The scheduler runs with the dask-rl preloads:
the ``/rl`` dashboard page and the RL-aware adaptive target. ``render_job`` wraps the cluster
in a ``DaskJob`` whose pod runs ``dask-rl train`` on a pipeline mounted from a ``ConfigMap``.

Everything here returns plain dicts (no Kubernetes client): ``dask-rl k8s render PIPELINE``
prints them as YAML, and the tests validate them against the CRD schemas shipped inside
``dask-kubernetes``.
"""

from __future__ import annotations

from typing import Any

import yaml

from dask_rl.config import PipelineConfig, public_dict

API = "kubernetes.dask.org/v1"
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


def _env(cfg: PipelineConfig) -> list[dict]:
    """Pod environment: ours, then ``cluster.kubernetes.env`` — a literal value, or
    ``{secretKeyRef: {name, key}}`` / ``{configMapKeyRef: ...}`` read by Kubernetes in the pod
    (the secret itself never appears in a manifest, a metrics record or a checkpoint)."""
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
SCHEDULER_ROUTES = ["distributed.http.scheduler.prometheus", "distributed.http.scheduler.info",
                    "distributed.http.scheduler.json", "distributed.http.health",
                    "distributed.http.proxy", "distributed.http.statics",
                    "distributed.http.scheduler.api"]


def _tls_env(cfg: PipelineConfig) -> list[dict]:
    """Dask's TLS settings from the mounted Secret (every role: scheduler, worker, client)."""
    if cfg.cluster.kubernetes.tls_secret is None:
        return []
    env = {"DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "true",
           "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": f"{TLS_DIR}/ca.crt",
           # the operator asks the scheduler over HTTP (/api/v1) when it cannot speak TLS
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
            "--dashboard", "--dashboard-address", "8788"]
    if dask_resources:
        args += ["--resources", dask_resources]
    return _pod([{
        "name": "worker", "image": k.image, "args": args,
        "env": _env(cfg) + _scheduler_address(cfg), "resources": resources,
        "ports": [{"name": "http-dashboard", "containerPort": 8788, "protocol": "TCP"}],
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
                "ports": [{"name": "tcp-comm", "containerPort": 8786, "protocol": "TCP"},
                          {"name": "http-dashboard", "containerPort": 8787, "protocol": "TCP"}],
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
                "ports": [{"name": "tcp-comm", "protocol": "TCP", "port": 8786,
                           "targetPort": "tcp-comm"},
                          {"name": "http-dashboard", "protocol": "TCP", "port": 8787,
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


def render(cfg: PipelineConfig) -> list[dict]:
    """DaskCluster, worker groups and (with ``cluster.adapt``) a DaskAutoscaler."""
    k = cfg.cluster.kubernetes
    docs = [{"apiVersion": API, "kind": "DaskCluster",
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
    """A ConfigMap with the pipeline and a DaskJob that trains it on its own cluster."""
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
    return [config_map, *_job_rbac(cfg, account), job]


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
