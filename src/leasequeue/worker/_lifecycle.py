"""Starting and stopping a run: the SIGTERM/SIGINT handlers (the first
stops claiming and drains, a second forces), installed only where Python
allows (the main thread), and restored afterwards."""

from __future__ import annotations

import asyncio
import signal
import threading
import warnings
from typing import TYPE_CHECKING, Any, List, Optional, Tuple

if TYPE_CHECKING:
    from ._worker import Worker

__all__ = ["install_signals", "remove_signals", "warn_signals_off_main"]


def warn_signals_off_main(signals: Optional[bool], stacklevel: int) -> None:
    """``signals=True`` off the main thread: a ``RuntimeWarning`` (once per run)."""
    if signals and threading.current_thread() is not threading.main_thread():
        warnings.warn("Worker(signals=True) runs off the main thread, where Python cannot install signal "
                      "handlers: SIGTERM/SIGINT will not stop it; stop it with worker.stop() (see docs/worker.md, "
                      "'A worker inside an application')", RuntimeWarning, stacklevel=stacklevel + 1)


def install_signals(worker: "Worker", loop: asyncio.AbstractEventLoop) -> List[Tuple[int, Any]]:
    want = worker._signals
    if want is None:
        want = threading.current_thread() is threading.main_thread()
    if not want:
        return []
    installed: List[Tuple[int, Any]] = []

    def on_signal(signum: int) -> None:
        if worker.stopping:
            worker.logger.warning("second signal %s: exiting", signal.Signals(signum).name)
            worker.stop(force=True)
        else:
            worker.logger.info("signal %s: stopping", signal.Signals(signum).name)
            worker.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            old = signal.getsignal(sig)
            loop.add_signal_handler(sig, on_signal, int(sig))
        except (ValueError, RuntimeError, NotImplementedError):  # not the main thread, or Windows
            continue
        installed.append((sig, old))
    return installed


def remove_signals(loop: asyncio.AbstractEventLoop, installed: List[Tuple[int, Any]]) -> None:
    for sig, old in installed:
        try:
            loop.remove_signal_handler(sig)
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        except (ValueError, RuntimeError):
            pass
