"""``dask-rl dashboard RUN_DIR``: the ``/rl`` page for a finished or running run, off-cluster.

A standalone Bokeh server (bound to 127.0.0.1 unless told otherwise) that follows the run's
``metrics.jsonl`` files (a population's members too; :class:`~dask_rl.dashboard.state.FileFollower`,
which skips and counts what it cannot use) and draws the same page as the Dask dashboard, with
the same JSON at ``/rl/metrics.json``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from bokeh.application import Application
from bokeh.application.handlers.function import FunctionHandler
from bokeh.server.server import Server
from tornado import web

from dask_rl.dashboard.page import build
from dask_rl.dashboard.state import FileFollower, RunViews

logger = logging.getLogger(__name__)


def make_server(run_dirs: list[str | Path], *, address: str = "127.0.0.1",
                port: int = 5006) -> Server:
    """A started-but-not-running Bokeh server for the runs (``server.io_loop.start()``)."""
    views = RunViews()
    follower = FileFollower([Path(d) for d in run_dirs], views)
    follower.poll()

    class MetricsJSON(web.RequestHandler):
        def get(self) -> None:
            self.set_header("Content-Type", "application/json")
            self.write(json.dumps(views.snapshot()))

    app = Application(FunctionHandler(lambda doc: build(doc, views.snapshot,
                                                        title="dask-rl: runs")))
    server = Server({"/rl": app}, address=address, port=port,
                    allow_websocket_origin=[f"{address}:{port}", f"localhost:{port}",
                                            f"127.0.0.1:{port}"],
                    extra_patterns=[(r"/rl/metrics.json", MetricsJSON),
                                    (r"/", web.RedirectHandler, {"url": "/rl"})])
    from tornado.ioloop import PeriodicCallback

    PeriodicCallback(follower.poll, 1000).start()
    return server


def serve(run_dirs: list[str | Path], *, address: str = "127.0.0.1", port: int = 5006) -> None:
    for d in run_dirs:
        if not Path(d).is_dir():
            raise FileNotFoundError(f"{d}: not a run directory")
    server = make_server(run_dirs, address=address, port=port)
    server.start()
    logger.info("dask-rl dashboard at http://%s:%d/rl", address, port)
    server.io_loop.start()
