"""Adaptive scaling with the scheduler-side policy; existing schedulers over TCP and TLS."""

import datetime
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import dask_rl
from dask_rl.data.metrics import read_metrics

pytestmark = pytest.mark.timeout(900)
ROOT = Path(__file__).resolve().parents[2]
PIPELINES = ROOT / "pipelines"
PRELOAD = {"preload": ["dask_rl.runtime.adaptive"]}


def test_scheduler_policy_answers_the_adaptive_target_rpc():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None,
                      scheduler_kwargs=PRELOAD, silence_logs=50) as cluster, \
            Client(cluster) as client:
        assert client.sync(client.scheduler.adaptive_target) <= 2  # idle: Dask's own estimate
        client.log_event("dask-rl-load", {"run": "a", "rollouts": 6, "ready": 0, "learners": 1,
                                          "max_learners": 2, "rollout_s": 0.0,
                                          "learner_s": 0.0, "gpu": False})
        client.log_event("dask-rl-load", {"run": "b", "rollouts": 1, "ready": 5, "learners": 1,
                                          "max_learners": 2, "rollout_s": 1.0,
                                          "learner_s": 4.0, "gpu": False})
        time.sleep(0.5)
        # a: 6 actors + 1 learner; b: learner-bound, 1 actor + 2 learners -> 10 threads
        assert client.sync(client.scheduler.adaptive_target) == 10
        state = client.sync(client.scheduler.rl_adaptive_state)
        assert list(state["runs"]) == ["a", "b"] and state["reason"] == "backlog,learner-bound"

        class Holder:
            def ping(self):
                return 1

        actor = client.submit(Holder, actor=True).result()
        holder = actor._address
        for _ in range(3):
            closable = client.sync(client.scheduler.workers_to_close, n=2)
            assert holder not in closable


@pytest.mark.slow
def test_adaptive_local_cluster_grows_under_load_and_spares_the_actor(tmp_path):
    from distributed import Client, LocalCluster

    samples = []
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None,
                      scheduler_kwargs=PRELOAD, silence_logs=50) as cluster, \
            Client(cluster) as client:
        cluster.adapt(minimum=1, maximum=4, interval="500ms", wait_count=2)
        stop = threading.Event()

        def watch():
            grown = None
            while not stop.is_set():
                actors = client.run_on_scheduler(
                    lambda dask_scheduler: [w.address for w in dask_scheduler.workers.values()
                                            if w.actors])
                samples.append((time.time(), len(client.scheduler_info()["workers"]), actors))
                if grown is None and samples[-1][1] >= 3:
                    grown = time.time()
                if grown is not None and time.time() - grown > 8:
                    # it grew and the actor stayed put while it ran on more workers: the rest
                    # of the budget is not needed
                    dask_rl.api.interrupt_running(run_dir=tmp_path / "adaptive")
                time.sleep(0.5)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        result = dask_rl.train({"rollout": {"slots": 6}, "learner": {"max_learners": 2},
                                "stop": {"env_steps": 150_000, "solve_on_target": False},
                                "checkpoint": {"every_s": 5}},
                               client=client, run_dir=tmp_path / "adaptive")
        ended = time.time()
        deadline = ended + 90
        while len(client.scheduler_info()["workers"]) > 1:
            assert time.time() < deadline, "the cluster did not shrink after the run"
            time.sleep(0.5)
        stop.set()
        watcher.join()
    during = [n for t, n, _ in samples if t < ended]
    assert max(during) >= 3, samples
    assert result.summary["recoveries"] == 0
    holders = [a[0] for t, _, a in samples if t < ended and a]
    assert holders and len(set(holders)) == 1  # the actor never moved: its worker was spared
    assert all(a == holders[:1] for t, _, a in samples if t < ended and a)


def test_gpu_learners_without_a_gpu_worker_fail_fast(local_client, tmp_path):
    with pytest.raises(RuntimeError, match="learner.gpus is 1 but no worker offers a GPU"):
        dask_rl.train({"learner": {"gpus": 1}}, client=local_client, run_dir=tmp_path / "gpu")
    metrics = tmp_path / "gpu" / "metrics.jsonl"
    kinds = {r["kind"] for r in read_metrics(metrics)} if metrics.exists() else set()
    assert not kinds & {"learner", "round"}, kinds  # failed before any work was launched


def _start_cluster(tmp_path, *, tls: dict | None = None):
    sched_file = tmp_path / "scheduler.json"
    extra = []
    if tls:
        extra = ["--tls-ca-file", tls["ca"], "--tls-cert", tls["cert"], "--tls-key", tls["key"]]
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "dask", "scheduler", "--scheduler-file", str(sched_file),
         "--no-dashboard", "--host", "127.0.0.1",
         *(["--protocol", "tls"] if tls else []), *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while not sched_file.exists():
        assert time.time() < deadline, "the scheduler did not start"
        time.sleep(0.2)
    address = json.loads(sched_file.read_text())["address"]
    workers = [subprocess.Popen(
        [sys.executable, "-m", "dask", "worker", address, "--nthreads", "1",
         "--no-dashboard", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(2)]
    return address, [scheduler, *workers]


def _stop(procs):
    for p in procs[::-1]:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


@pytest.mark.slow
def test_the_pipeline_runs_against_a_separate_scheduler(tmp_path):
    address, procs = _start_cluster(tmp_path)
    try:
        run_dir = tmp_path / "run"
        proc = subprocess.run(
            [sys.executable, "-m", "dask_rl.cli", "train", str(PIPELINES / "ppo_cartpole.yaml"),
             "--run-dir", str(run_dir), "--no-progress", "--set", "cluster.kind=address",
             "--set", f"cluster.address={address}", "--set", "stop.env_steps=8192",
             "--set", "stop.solve_on_target=false"],
            capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        # the run is the separate cluster's (its two workers), to its budget: that it learns
        # is the solve tests' business
        assert summary["stop_reason"] == "env_steps" and summary["updates"] > 0, summary
        assert summary["worker_threads"] == 2 and summary["recoveries"] == 0, summary
    finally:
        _stop(procs)


def _certificates(tmp_path) -> dict:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    def key():
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dask-rl test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    node_key = key()
    import ipaddress

    node = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dask-rl node")]))
            .issuer_name(ca_name).public_key(node_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = {"ca": tmp_path / "ca.pem", "cert": tmp_path / "node.pem",
             "key": tmp_path / "node.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(node.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(node_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption()))
    return {k: str(v) for k, v in paths.items()}


@pytest.mark.slow
def test_the_pipeline_runs_over_tls(tmp_path):
    tls = _certificates(tmp_path)
    address, procs = _start_cluster(tmp_path, tls=tls)
    assert address.startswith("tls://")
    try:
        result = dask_rl.train(PIPELINES / "ppo_cartpole.yaml", run_dir=tmp_path / "tls",
                               overrides=["cluster.kind=address", f"cluster.address={address}",
                                          f"cluster.security.tls_ca_file={tls['ca']}",
                                          f"cluster.security.tls_client_cert={tls['cert']}",
                                          f"cluster.security.tls_client_key={tls['key']}",
                                          "stop.env_steps=20000", "stop.solve_on_target=false"])
        assert result.summary["env_steps"] >= 20000 and result.summary["worker_threads"] == 2
        # without the certificates the scheduler cannot be reached
        import dask

        with dask.config.set({"distributed.comm.timeouts.connect": "5s"}), \
                pytest.raises(Exception):
            dask_rl.train(PIPELINES / "ppo_cartpole.yaml", run_dir=tmp_path / "plain",
                          overrides=["cluster.kind=address", f"cluster.address={address}",
                                     "stop.env_steps=1000"])
    finally:
        _stop(procs)


@pytest.mark.slow
def test_rendered_tls_settings_make_a_real_scheduler_and_worker_talk_tls_only(tmp_path):
    """The TLS environment the manifests give each pod (cluster.kubernetes.tls_secret),
    with the Secret's files in a local directory: a real scheduler, worker and client
    configured by that environment alone talk over TLS; a client without it is refused."""
    from dask_rl.config import load_pipeline
    from dask_rl.deploy import k8s

    tls = _certificates(tmp_path)
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir()
    for src, name in (("ca", "ca.crt"), ("cert", "tls.crt"), ("key", "tls.key")):
        (secret_dir / name).write_bytes(Path(tls[src]).read_bytes())
    cfg = load_pipeline(ROOT / "k8s" / "pipeline.yaml", ["cluster.kubernetes.tls_secret=dask-tls",
                                                         "cluster.adapt=null"])
    [cluster] = [d for d in k8s.render(cfg) if d["kind"] == "DaskCluster"]
    sched = cluster["spec"]["scheduler"]["spec"]["containers"][0]
    worker = cluster["spec"]["worker"]["spec"]["containers"][0]
    assert "--protocol" in sched["args"] and "tls" in sched["args"]
    assert {"name": "dask-tls", "mountPath": k8s.TLS_DIR, "readOnly": True} in \
        worker["volumeMounts"]

    def env_of(container):
        out = {e["name"]: e["value"].replace(k8s.TLS_DIR, str(secret_dir))
               for e in container["env"] if "value" in e}
        return {k: v for k, v in out.items() if k.startswith("DASK_DISTRIBUTED__COMM")}

    from browser import free_port

    port = free_port()  # a fixed port once landed on 8787, which another process held
    sched_env = {**os.environ, **env_of(sched)}
    worker_env = {**os.environ, **env_of(worker)}
    assert any(e["name"] == "DASK_SCHEDULER_ADDRESS" and e["value"].startswith("tls://")
               for e in worker["env"])
    procs = [subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1",
                               "--port", str(port), "--no-dashboard", "--protocol", "tls"],
                              env=sched_env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)]
    address = f"tls://127.0.0.1:{port}"
    procs.append(subprocess.Popen([sys.executable, "-m", "dask", "worker", address,
                                   "--nthreads", "1", "--no-dashboard"], env=worker_env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        client_code = ("from distributed import Client\n"
                       f"c = Client('{address}', timeout='60s')\n"
                       "c.wait_for_workers(1, timeout=60)\n"
                       "print(c.submit(lambda x: x + 1, 41).result())\n")
        ok = subprocess.run([sys.executable, "-c", client_code], env=worker_env,
                            capture_output=True, text=True, timeout=120)
        assert ok.returncode == 0 and ok.stdout.strip().endswith("42"), ok.stderr[-2000:]
        plain = subprocess.run(
            [sys.executable, "-c", f"from distributed import Client; Client('{address}', "
                                   f"timeout='5s')"], capture_output=True, text=True,
            timeout=120)
        assert plain.returncode != 0  # no certificates, no connection
    finally:
        _stop(procs)
