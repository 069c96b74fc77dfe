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

from dask_rl.config import PipelineConfig, to_dict

API = "kubernetes.dask.org/v1"
PRELOADS = ("dask_rl.runtime.dashboard", "dask_rl.runtime.adaptive")
PIPELINE_DIR = "/etc/dask-rl"


def _env(cfg: PipelineConfig) -> list[dict]:
    base = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            # as on embedded clusters: the profiler's history costs ~110 MB per worker
            "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": str(cfg.cluster.profile).lower()}
    base.update({str(k): str(v) for k, v in cfg.cluster.kubernetes.env.items()})
    return [{"name": k, "value": v} for k, v in base.items()]


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
    return {"containers": [{
        "name": "worker", "image": k.image, "args": args, "env": _env(cfg),
        "resources": resources,
        "ports": [{"name": "http-dashboard", "containerPort": 8788, "protocol": "TCP"}],
    }]}


def render_cluster_spec(cfg: PipelineConfig) -> dict:
    """The ``spec`` of the DaskCluster (shared by the cluster and the job)."""
    k = cfg.cluster.kubernetes
    scheduler_args = ["dask", "scheduler", "--host", "0.0.0.0"]
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
            "spec": {"containers": [{
                "name": "scheduler", "image": k.image, "args": scheduler_args,
                "env": _env(cfg), "resources": _resources(None, k.scheduler_memory),
                "ports": [{"name": "tcp-comm", "containerPort": 8786, "protocol": "TCP"},
                          {"name": "http-dashboard", "containerPort": 8787, "protocol": "TCP"}],
                "readinessProbe": {"httpGet": {"port": "http-dashboard", "path": "/health"},
                                   "initialDelaySeconds": 0, "periodSeconds": 1,
                                   "timeoutSeconds": 300},
                "livenessProbe": {"httpGet": {"port": "http-dashboard", "path": "/health"},
                                  "initialDelaySeconds": 15, "periodSeconds": 20},
            }]},
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
    job_cfg = to_dict(cfg)  # --address below makes the job pod join the job's own cluster
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": f"{k.name}-pipeline", "namespace": k.namespace},
                  "data": {pipeline_name: yaml.safe_dump(job_cfg, sort_keys=False)}}
    job = {
        "apiVersion": API, "kind": "DaskJob",
        "metadata": {"name": k.name, "namespace": k.namespace},
        "spec": {
            "job": {"spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "job", "image": k.image,
                    "args": ["dask-rl", "train", f"{PIPELINE_DIR}/{pipeline_name}",
                             "--address", "$(DASK_SCHEDULER_ADDRESS)", "--run-dir",
                             "/runs/job", "--no-progress"],
                    "env": _env(cfg),
                    "volumeMounts": [{"name": "pipeline", "mountPath": PIPELINE_DIR}],
                }],
                "volumes": [{"name": "pipeline",
                             "configMap": {"name": f"{k.name}-pipeline"}}],
            }},
            "cluster": {"spec": render_cluster_spec(cfg)},
        },
    }
    return [config_map, job]


def dump(docs: list[dict]) -> str:
    """Manifests as one multi-document YAML string (no nulls: the API server drops them)."""
    return yaml.safe_dump_all([_strip_nulls(d) for d in docs], sort_keys=False)


def _strip_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value
