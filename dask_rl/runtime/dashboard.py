"""The ``/rl`` page on the Dask dashboard: a scheduler preload.

Load it into a scheduler — ``dask scheduler --preload dask_rl.runtime.dashboard``, or
``LocalCluster(scheduler_kwargs={"preload": ["dask_rl.runtime.dashboard"]})`` as dask-rl does for
its embedded clusters — and the dashboard gains an ``RL`` page in its navigation (``/rl``) and a
JSON endpoint ``/rl/metrics.json``. Both read the ``dask-rl`` events that the runtime logs; a
scheduler plugin collects them as they arrive, so the page has the whole run, not only the last
1,000 events the scheduler keeps per topic.

At import (inside ``Scheduler.__init__``, before its HTTP server is built) the module registers
the Bokeh application, adds ``rl`` to the navigation and the JSON route; at ``dask_setup`` it
installs the collecting plugin on the scheduler. dask-rl's embedded cluster starts its
scheduler without Bokeh (importing it is ~0.4 s, a quarter of the cluster's start) and
:func:`attach` starts the dashboard once the run's first tasks are out
(:func:`dask_rl.runtime.cluster.attach_dashboard`).
"""

from __future__ import annotations

import json
import logging

import dask
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.http.utils import RequestHandler

from dask_rl.dashboard.state import RunViews
from dask_rl.data.metrics import TOPIC

logger = logging.getLogger(__name__)

PLUGIN = "dask-rl-dashboard"
ROUTES_MODULE = __name__


class Collector(SchedulerPlugin):
    """Feeds every ``dask-rl`` event into the scheduler's :class:`RunViews`."""

    name = PLUGIN

    def __init__(self):
        self.views = RunViews()

    def log_event(self, topic, msg) -> None:
        if topic == TOPIC:
            self.views.add(msg)


def views_of(scheduler) -> RunViews:
    plugin = scheduler.plugins.get(PLUGIN)
    if plugin is None:  # the page was opened before dask_setup ran, or without it
        plugin = Collector()
        scheduler.add_plugin(plugin, name=PLUGIN)
        for _, msg in scheduler.get_events(TOPIC):
            plugin.views.add(msg)
    return plugin.views


def rl_doc(scheduler, extra, doc) -> None:
    """The Bokeh document of ``/rl``, in Dask's template and theme."""
    from distributed.dashboard.components.scheduler import BOKEH_THEME, env

    from dask_rl.dashboard.page import build

    views = views_of(scheduler)
    build(doc, views.snapshot, title="Dask: RL", template=env.get_template("simple.html"),
          template_variables=extra, theme=BOKEH_THEME)


class MetricsJSON(RequestHandler):
    """``/rl/metrics.json``: the same data as the page."""

    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.write(json.dumps(views_of(self.server).snapshot()))


routes = [("rl/metrics.json", MetricsJSON, {})]


# dask config set by dask_rl.runtime.cluster.connect (DEFERRED_DASHBOARD): it attaches later
DEFERRED = "dask-rl.dashboard-deferred"


def _install() -> None:
    modules = list(dask.config.get("distributed.scheduler.http.routes"))
    if ROUTES_MODULE not in modules:
        dask.config.set({"distributed.scheduler.http.routes": [*modules, ROUTES_MODULE]})
    if not dask.config.get(DEFERRED, False):
        register_page()


def register_page() -> bool:
    """Add ``/rl`` to the Bokeh applications and the navigation of schedulers whose dashboard
    starts from now on; False without Bokeh."""
    try:
        import distributed.dashboard.scheduler as dashboard
    except ImportError:  # no bokeh: only the JSON endpoint
        return False
    if "/rl" not in dashboard.applications:
        dashboard.applications["/rl"] = rl_doc
        original = dashboard.template_variables

        def template_variables(scheduler):
            variables = original(scheduler)
            if "rl" not in variables["pages"]:
                variables["pages"].append("rl")
            return variables

        dashboard.template_variables = template_variables
    return True


def attach(scheduler) -> None:
    """Start the Bokeh dashboard (with ``/rl``) on a running scheduler that was started without
    it (``dashboard=False``, its HTTP server up): Bokeh is imported on this thread, the
    applications are added on the scheduler's event loop."""
    if not register_page():
        return
    import distributed.dashboard.scheduler as dashboard

    def connect() -> None:
        if scheduler.status.name in ("running", "init"):   # not one already closing
            dashboard.connect(scheduler.http_application, scheduler.http_server, scheduler,
                              prefix="/")
    try:
        scheduler.loop.add_callback(connect)
    except RuntimeError:   # the run ended, and its cluster closed, before Bokeh was imported
        logger.debug("the scheduler closed before its dashboard was attached")


_install()


def dask_setup(scheduler) -> None:
    """Called by Dask when the scheduler starts with this preload."""
    if PLUGIN not in scheduler.plugins:
        scheduler.add_plugin(Collector(), name=PLUGIN)
