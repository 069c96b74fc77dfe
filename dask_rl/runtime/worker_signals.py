"""Worker preload of embedded clusters: Ctrl-C belongs to the driver.

A terminal's Ctrl-C goes to every process of its foreground group, which includes the
embedded ``LocalCluster``'s worker processes. Left alone they would die with it (the parameter
actor first), and the driver's graceful stop (a final checkpoint and summary) would find no
cluster. With this preload they ignore SIGINT; the driver alone decides how the run ends, and
closes them.
"""

from __future__ import annotations

import signal
import threading


def dask_setup(worker) -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
