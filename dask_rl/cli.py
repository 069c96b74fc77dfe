"""The ``dask-rl`` command: train, evaluate and validate pipelines.

Exit codes: 0 on success, 1 when a run fails, 2 on bad input (a pipeline, an override, a run
directory), reported as one line on stderr before any cluster starts.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from dask_rl.config import ConfigError
from dask_rl.data import Progress

EXIT_BAD_INPUT = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dask-rl", description=__doc__.splitlines()[0])
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="log more (-v: progress details, -vv: debug)")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a pipeline")
    t.add_argument("pipeline", help="pipeline YAML file")
    t.add_argument("--address", help="scheduler address of an existing Dask cluster")
    t.add_argument("--workers", type=int, help="worker processes of the embedded cluster")
    t.add_argument("--run-dir", help="where summary.json, metrics.jsonl and checkpoints go")
    t.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint in --run-dir")
    t.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY.PATH=VALUE", help="override a pipeline field (repeatable)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")

    e = sub.add_parser("evaluate", help="greedy evaluation of a run's latest checkpoint")
    e.add_argument("run_dir", help="a run directory, its checkpoint store or one checkpoint")
    e.add_argument("--episodes", type=int, default=10, help="episodes to play (default 10)")
    e.add_argument("--seed", type=int, default=12345, help="evaluation seed")
    x = sub.add_parser("export", help="write a run's policy as TorchScript or ONNX")
    for cmd in (e, x):
        cmd.add_argument("--pipeline", metavar="PIPELINE.yaml",
                         help="the run's pipeline: its environment is used (a checkpoint is "
                              "data; without this, only a Gymnasium id it names is made)")
        cmd.add_argument("--trust-checkpoint", action="store_true",
                         help="make the environment the checkpoint's config names, code "
                              "included (only for checkpoints you wrote)")
    e.add_argument("--video", metavar="FILE.mp4",
                   help="also record one greedy episode as a video (needs imageio-ffmpeg)")

    x.add_argument("run", help="a run directory, its checkpoints/ or one checkpoint")
    x.add_argument("--format", choices=("torchscript", "onnx"), default="torchscript")
    x.add_argument("-o", "--output", required=True, help="the file to write")

    d = sub.add_parser("dashboard", help="serve the /rl page for run directories")
    d.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    d.add_argument("--address", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    d.add_argument("--port", type=int, default=5006, help="port (default 5006)")

    pl = sub.add_parser("plot", help="learning curves of runs as an image")
    pl.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    pl.add_argument("-o", "--output", default="curves.png", help="image file (default "
                                                                  "curves.png)")
    pl.add_argument("--title", help="figure title")

    k = sub.add_parser("k8s", help="Kubernetes manifests (dask-kubernetes operator)")
    ksub = k.add_subparsers(dest="k8s_command", required=True)
    r = ksub.add_parser("render", help="print the manifests of a pipeline's cluster")
    r.add_argument("pipeline", help="pipeline YAML file")
    r.add_argument("--job", action="store_true",
                   help="a DaskJob that trains the pipeline (with its ConfigMap) instead")
    r.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY.PATH=VALUE", help="override a pipeline field (repeatable)")
    r.add_argument("-o", "--output", help="write to this file instead of stdout")

    w = sub.add_parser("sweep", help="an Optuna hyperparameter sweep, trials run on the cluster")
    w.add_argument("pipeline", help="pipeline YAML file")
    w.add_argument("--space", required=True, help="YAML: pipeline keys to distributions")
    w.add_argument("--trials", type=int, default=16, help="trials to finish (default 16)")
    w.add_argument("--parallel", type=int, default=2, help="trials at once (default 2)")
    w.add_argument("--sweep-dir", help="where the trials' run directories and the study go")
    w.add_argument("--resume", action="store_true", help="finish the sweep in --sweep-dir")
    w.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    w.add_argument("--sampler", choices=("tpe", "random"), default="tpe",
                   help="Optuna's sampler (default tpe)")
    w.add_argument("--prune-warmup", type=int, default=3,
                   help="evaluations a trial makes before it may be pruned (default 3)")
    w.add_argument("--address", help="scheduler address of an existing Dask cluster")
    w.add_argument("--workers", type=int, help="worker processes of the embedded cluster")
    w.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY.PATH=VALUE", help="override a pipeline field (repeatable)")

    m = sub.add_parser("emulate", help="train on a virtual-time cluster of any size, in one "
                                       "process (dask_rl.virtual)")
    m.add_argument("pipeline", help="pipeline YAML file")
    m.add_argument("--slots", type=int, required=True, help="rollout slots of the cluster")
    m.add_argument("--learners", type=int, help="learners at once (default: the pipeline's "
                                                "learner.max_learners)")
    m.add_argument("--rollout-s", required=True, metavar="MEAN[:SIGMA]",
                   help="a rollout task's time in virtual seconds (log-normal shape SIGMA)")
    m.add_argument("--learn-s", required=True, metavar="MEAN[:SIGMA]",
                   help="a learner task's time in virtual seconds (log-normal shape SIGMA)")
    m.add_argument("--seed", type=int, default=0, help="the task times' seed (default 0)")
    m.add_argument("--out", metavar="FILE.json", help="write the results (config, cluster, "
                                                      "summary, every push) here")
    m.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY.PATH=VALUE", help="override a pipeline field (repeatable)")

    v = sub.add_parser("validate", help="check a pipeline without running it")
    v.add_argument("pipeline", help="pipeline YAML file")
    v.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY.PATH=VALUE", help="override a pipeline field (repeatable)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.verbose < 2:
        logging.getLogger("distributed").setLevel(logging.ERROR)
    try:
        commands = {"train": _train, "evaluate": _evaluate, "validate": _validate,
                    "dashboard": _dashboard, "plot": _plot, "k8s": _k8s, "export": _export,
                    "sweep": _sweep, "emulate": _emulate}
        return commands[args.command](args)
    except ConfigError as e:
        print(f"dask-rl: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RuntimeError as e:  # the run could not go on (cluster, resources, repeated failures)
        logging.getLogger(__name__).debug("run failed", exc_info=True)
        print(f"dask-rl: failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("dask-rl: interrupted", file=sys.stderr)
        return 130


def _validate(args: argparse.Namespace) -> int:
    from dask_rl.config import load_pipeline

    cfg = load_pipeline(args.pipeline, args.overrides)
    print(f"ok: {cfg.algo.name} on {cfg.env.name}, aggregation {cfg.aggregation.strategy}, "
          f"stop at {cfg.stop.env_steps} env steps")
    return 0


def _train(args: argparse.Namespace) -> int:
    if args.address is None:   # an embedded cluster's workers: imported while we read
        from dask_rl.runtime.worker_start import warm_start

        warm_start()
    from dask_rl.api import default_run_dir, preflight, resolve, train

    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers: must be >= 1, got {args.workers}")
    cfg = resolve(args.pipeline, args.overrides)  # bad input fails here, before any cluster
    if args.resume:
        if not args.run_dir:
            raise ConfigError("--resume: needs --run-dir naming the run to continue")
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(cfg)
    preflight(cfg, run_dir, resume=args.resume, address=args.address, workers=args.workers)
    from dask_rl.runtime.cluster import quiet_dask_logging

    # Dask's own log lines (errors come with tracebacks) only when asked for (-v, -vv): a run
    # that cannot go on ends with dask-rl's one line
    quiet_dask_logging([logging.CRITICAL, logging.ERROR, logging.DEBUG][min(args.verbose, 2)])
    bar = _Progress(enabled=not args.no_progress, total=cfg.stop.env_steps)
    print(f"dask-rl: training {cfg.algo.name} on {cfg.env.name} -> {run_dir}", file=sys.stderr)
    try:
        result = train(cfg, run_dir=run_dir, resume=args.resume, address=args.address,
                       workers=args.workers, progress=bar.update)
    finally:
        bar.close()
    s = result.summary
    print(json.dumps(s, indent=2))
    if s["stop_reason"] == "interrupted":
        print(f"dask-rl: interrupted after {s['env_steps']} env steps; checkpoint and summary "
              f"in {result.run_dir} (--resume continues)", file=sys.stderr)
        return 130
    verdict = "solved" if s["solved"] else "not solved"
    conf = s.get("confirmation")
    over = f" over {conf['episodes']} confirming episodes" if conf else ""
    print(f"dask-rl: {verdict}: greedy return {s['final_return']:.1f}{over} after "
          f"{s['env_steps']} env "
          f"steps in {s['wall_s']:.1f} s ({s['stop_reason']}); summary in "
          f"{result.run_dir / 'summary.json'}", file=sys.stderr)
    return 0


def _emulate(args: argparse.Namespace) -> int:
    from dask_rl.api import resolve
    from dask_rl.virtual import TaskTime, VirtualCluster

    overrides = list(args.overrides)
    if args.learners is not None:
        if args.learners < 1:
            raise ConfigError(f"--learners: must be >= 1, got {args.learners}")
        overrides.append(f"learner.max_learners={args.learners}")
    cfg = resolve(args.pipeline, overrides)
    rollout, learn = TaskTime.parse(args.rollout_s), TaskTime.parse(args.learn_s)
    out = Path(args.out) if args.out else None
    if out is not None and not out.parent.is_dir():
        raise ConfigError(f"--out: no directory {out.parent}")

    def progress(s: dict) -> None:
        stale = s["staleness"] or {"mean": 0.0}
        print(f"dask-rl: virtual {s['virtual_s']:.1f} s, {s['env_steps']}/{cfg.stop.env_steps} "
              f"env steps, {s['updates']} updates, staleness mean {stale['mean']:.2f}",
              file=sys.stderr)

    cluster = VirtualCluster(cfg, slots=args.slots, rollout_time=rollout, learn_time=learn,
                             seed=args.seed, progress=progress)   # refuses what it cannot run
    print(f"dask-rl: emulating {cfg.algo.name} on {cfg.env.name}, {args.slots} slots, "
          f"{cfg.learner.max_learners} learners, {cfg.aggregation.strategy}", file=sys.stderr)
    result = cluster.run()
    if out is not None:
        out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=2))
    return 0


def _k8s(args: argparse.Namespace) -> int:
    from dask_rl.config import load_pipeline
    from dask_rl.deploy import k8s

    cfg = load_pipeline(args.pipeline, args.overrides)
    docs = k8s.render_job(cfg, Path(args.pipeline).name) if args.job else k8s.render(cfg)
    text = k8s.dump(docs)
    if args.output:
        Path(args.output).write_text(text)
        print(f"dask-rl: wrote {len(docs)} manifests to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    from dask_rl.dashboard.server import serve

    for d in args.run_dirs:
        if not Path(d).is_dir():
            raise ConfigError(f"{d}: not a run directory")
    print(f"dask-rl: dashboard at http://{args.address}:{args.port}/rl (Ctrl-C stops it)",
          file=sys.stderr)
    serve(args.run_dirs, address=args.address, port=args.port)
    return 0


def _plot(args: argparse.Namespace) -> int:
    from dask_rl.dashboard.plot import plot_runs

    for d in args.run_dirs:
        if not (Path(d) / "metrics.jsonl").exists():
            raise ConfigError(f"{d}: no metrics.jsonl here; is it a run directory?")
    out = plot_runs(args.run_dirs, args.output, title=args.title)
    print(f"dask-rl: wrote {out}", file=sys.stderr)
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from dask_rl.checkpoint import CheckpointError, CheckpointStore
    from dask_rl.config import check_environment, load_pipeline
    from dask_rl.data import PolicySnapshot
    from dask_rl.roles.evaluation import evaluate

    if args.episodes < 1:
        raise ConfigError(f"--episodes: must be >= 1, got {args.episodes}")
    if args.video:
        from dask_rl.policy import require

        require("imageio_ffmpeg", "video", "--video")
        # MuJoCo renders off-screen; without a display, EGL is the backend that works
        os.environ.setdefault("MUJOCO_GL", "egl")
    from dask_rl.policy import checkpoint_config, find_store, require_env_trust

    store_dir, name = find_store(Path(args.run_dir))
    try:
        store = CheckpointStore(store_dir)
        if name is None:
            state, meta, name = store.load_latest_good()
        else:
            state, meta = store.load(name)
    except CheckpointError as e:
        raise ConfigError(str(e)) from None
    pipeline = load_pipeline(args.pipeline) if args.pipeline else None
    cfg = checkpoint_config(meta, pipeline)
    require_env_trust(cfg.env, args.trust_checkpoint or pipeline is not None,
                      f"{store_dir}/{name}: evaluating makes the checkpoint's environment")
    if args.trust_checkpoint and pipeline is None:
        check_environment(cfg)   # vouched for: now its code may run
    actor = state["actor"]
    snapshot = PolicySnapshot(int(actor["version"]), actor["params"], actor.get("moments"))
    import torch

    # one thread, as on the workers: a small policy's batch of 16 gains nothing from more, and
    # on a busy machine the threads' contention made 100 CartPole episodes 10x slower (30 s)
    torch.set_num_threads(1)
    result = evaluate(cfg, snapshot, episodes=args.episodes, seed=args.seed).record()
    result.update({"checkpoint": name, "env_id": cfg.env.name, "algorithm": cfg.algo.name,
                   "env_steps": meta.get("env_steps")})
    if args.video:
        from dask_rl.policy import load_policy, record_video

        policy = load_policy(f"{store_dir}/{name}", pipeline=pipeline,
                             trust=args.trust_checkpoint)
        result.update(record_video(policy, args.video, seed=args.seed))
    print(json.dumps(result, indent=2))
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from dask_rl.api import resolve
    from dask_rl.sweeps import check_installed, load_space, sweep, table

    check_installed()
    cfg = resolve(args.pipeline, args.overrides)
    load_space(args.space, cfg)   # bad input fails here, before any cluster
    if args.resume and not args.sweep_dir:
        raise ConfigError("--resume: needs --sweep-dir naming the sweep to continue")
    sweep_dir = Path(args.sweep_dir or f"sweeps/{cfg.algo.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    from dask_rl.runtime.cluster import quiet_dask_logging

    # as for `train`: Dask's own log lines only when asked for (-v, -vv)
    quiet_dask_logging([logging.CRITICAL, logging.ERROR, logging.DEBUG][min(args.verbose, 2)])
    print(f"dask-rl: sweep of {args.trials} trials, {args.parallel} at once -> {sweep_dir}",
          file=sys.stderr)

    def report(row: dict) -> None:
        value = "-" if row.get("value") is None else f"{row['value']:.1f}"
        params = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in row["params"].items())
        print(f"dask-rl: trial {row['trial']} {row['state'].lower()}: {value} ({params}; "
              f"{row['wall_s']:.0f} s)", file=sys.stderr, flush=True)

    result = sweep(args.pipeline, args.space, trials=args.trials, parallel=args.parallel,
                   sweep_dir=sweep_dir, resume=args.resume, address=args.address,
                   workers=args.workers, seed=args.seed, overrides=args.overrides,
                   prune_warmup=args.prune_warmup, sampler=args.sampler, on_trial=report)
    print(table(result))
    if result.best is not None:
        best = result.best
        params = ", ".join(f"{k}={v!r}" for k, v in best["params"].items())
        print(f"\nbest: trial {best['trial']}, return {best['value']:.1f}: {params}")
        print(f"dask-rl: the best trial's whole pipeline is in {sweep_dir / 'best.yaml'}; every "
              f"trial in {sweep_dir / 'results.json'} and results.md", file=sys.stderr)
    if result.interrupted:   # exits as an interrupted `dask-rl train` does
        stopped = (f"trials {', '.join(map(str, sorted(result.stopped)))} stopped, each with a "
                   f"final checkpoint and summary" if result.stopped else "no trial was running")
        print(f"dask-rl: sweep interrupted: {stopped}; results in "
              f"{sweep_dir / 'results.json'} (--resume --sweep-dir {sweep_dir} continues, "
              f"running them again)", file=sys.stderr)
        return 130
    return 0


def _export(args: argparse.Namespace) -> int:
    from dask_rl.policy import export, load_policy

    policy = load_policy(args.run, pipeline=args.pipeline, trust=args.trust_checkpoint)
    out = export(policy, args.output, args.format)
    print(f"dask-rl: wrote {out} ({args.format}) and {out}.json", file=sys.stderr)
    return 0


class _Progress:
    """A tqdm bar on a terminal; a log line every 10 s otherwise."""

    def __init__(self, *, enabled: bool, total: int):
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.total = total
        self.last = 0
        self.last_print = 0.0
        self.bar = None
        self.announced = False
        if enabled and self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="step", unit_scale=True, dynamic_ncols=True,
                            desc="env steps")

    def update(self, p: Progress) -> None:
        if not self.enabled:
            return
        if p.dashboard and not self.announced:
            self.announced = True
            message = f"dask-rl: live dashboard at {p.dashboard}"
            print(message, file=sys.stderr) if self.bar is None else self.bar.write(message)
        ret = "-" if p.recent_return is None else f"{p.recent_return:.1f}"
        ev = "" if p.eval_return is None else f" eval={p.eval_return:.1f}"
        text = f"return={ret}{ev} updates={p.updates} {p.steps_per_s:.0f} steps/s"
        if self.bar is not None:
            self.bar.update(min(p.env_steps, self.total) - self.last)
            self.last = min(p.env_steps, self.total)
            self.bar.set_postfix_str(text, refresh=False)
        elif time.time() - self.last_print >= 10:
            self.last_print = time.time()
            print(f"dask-rl: {p.env_steps}/{self.total} env steps, {text}",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


if __name__ == "__main__":
    sys.exit(main())
