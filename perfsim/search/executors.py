"""Where a search's sweep runs: in process, a local process pool (the default), Dask
(a scheduler address or a LocalCluster) or Ray (optional; imported only when asked for).

Every executor maps a picklable top-level function over tasks and returns the results
in task order, so the search's answer does not depend on the executor. ``progress``
(done, total) is called in the calling process as tasks finish; Ctrl-C cancels what has
not started and re-raises ``KeyboardInterrupt``.
"""

import logging
import multiprocessing
import os
import signal
from collections.abc import Callable

from perfsim.errors import ConfigError

log = logging.getLogger(__name__)
Progress = Callable[[int, int], None] | None
CONNECT_TIMEOUT_S = 5.0  # how long a remote scheduler may take to answer before the search gives up
EXECUTORS = "local, local-spawn, serial, dask-local, dask://HOST:PORT, ray, ray://HOST:PORT"


def _tick(progress: Progress, done: int, total: int) -> None:
    if progress is not None:
        progress(done, total)


class SerialExecutor:
    name = "serial"
    workers = 1

    def map(self, fn, tasks: list, progress: Progress = None) -> list:
        out = []
        for i, task in enumerate(tasks):
            out.append(fn(task))
            _tick(progress, i + 1, len(tasks))
        return out

    def close(self) -> None:
        pass


def _ignore_sigint() -> None:
    """Pool workers leave Ctrl-C to the parent, which terminates them; SIGTERM is reset to
    its default, so a forked worker that inherited a host's handler (Streamlit installs
    one) still dies on ``Pool.terminate`` instead of blocking the join forever."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _indexed(item: tuple):
    fn, i, task = item
    return i, fn(task)


class PoolExecutor:
    """A multiprocessing pool on this machine (terminated at once on Ctrl-C). ``start``
    is the multiprocessing start method: None for the platform default (fork on Linux),
    "spawn" for fresh interpreters (what a threaded host such as the planner needs)."""

    def __init__(self, workers: int | None, start: str | None = None):
        self.workers = workers or os.cpu_count() or 1
        self.name = "local" if start is None else f"local-{start}"
        context = multiprocessing.get_context(start)
        self.pool = context.Pool(self.workers, initializer=_ignore_sigint)

    def map(self, fn, tasks: list, progress: Progress = None) -> list:
        out = [None] * len(tasks)
        try:
            results = self.pool.imap_unordered(_indexed, [(fn, i, task) for i, task in enumerate(tasks)])
            done = 0
            while done < len(tasks):
                try:  # a timeout keeps the wait interruptible by Ctrl-C
                    i, result = results.next(timeout=0.2)
                except multiprocessing.TimeoutError:
                    continue
                out[i], done = result, done + 1
                _tick(progress, done, len(tasks))
        except BaseException:
            self.pool.terminate()
            raise
        return out

    def close(self) -> None:
        self.pool.terminate()
        self.pool.join()


class DaskExecutor:
    """A dask.distributed Client: to a running scheduler, or on a LocalCluster of
    ``workers`` processes (one worker runs in-process threads: nothing to spawn)."""

    def __init__(self, address: str | None, workers: int | None):
        try:
            from dask.distributed import Client, LocalCluster
        except ImportError:
            raise ConfigError("executor: dask is not installed (pip install 'perfsim[distributed]')") from None
        self.cluster = None
        if address is None:
            self.workers = workers or os.cpu_count() or 1
            self.cluster = LocalCluster(n_workers=self.workers, threads_per_worker=1, processes=self.workers > 1,
                                        dashboard_address=None)
            self.client = Client(self.cluster)
            self.name = "dask-local"
        else:
            try:  # fail fast: an unreachable scheduler is one line within CONNECT_TIMEOUT_S, not a 30 s traceback
                self.client = Client(address, timeout=CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError) as exc:
                raise ConfigError(f"executor: cannot reach the Dask scheduler at {address} within "
                                  f"{CONNECT_TIMEOUT_S:g} s ({type(exc).__name__})") from None
            self.workers = max(1, len(self.client.scheduler_info().get("workers", {})))
            self.name = f"dask {address}"

    def map(self, fn, tasks: list, progress: Progress = None) -> list:
        from dask.distributed import as_completed as dask_completed

        futures = [self.client.submit(fn, task, pure=False) for task in tasks]
        index = {f.key: i for i, f in enumerate(futures)}
        out = [None] * len(tasks)
        try:
            for done, future in enumerate(dask_completed(futures), 1):
                out[index[future.key]] = future.result()
                _tick(progress, done, len(tasks))
        except BaseException:
            self.client.cancel(futures)
            raise
        return out

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


class RayExecutor:
    """Ray tasks, on a cluster at ``address`` (ray://HOST:PORT) or a local Ray."""

    def __init__(self, address: str | None):
        try:
            import ray
        except ImportError:
            raise ConfigError("executor: ray is not installed (pip install 'perfsim[ray]')") from None
        self.ray = ray
        try:
            ray.init(address=address, ignore_reinit_error=True, logging_level=logging.WARNING)
        except (ConnectionError, OSError, TimeoutError, RuntimeError) as exc:
            raise ConfigError(f"executor: cannot start or reach Ray at {address or 'local'} "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.name = f"ray {address or 'local'}"

    def map(self, fn, tasks: list, progress: Progress = None) -> list:
        remote = self.ray.remote(fn)
        refs = [remote.remote(task) for task in tasks]
        index = {ref: i for i, ref in enumerate(refs)}
        out, pending = [None] * len(tasks), list(refs)
        try:
            while pending:
                ready, pending = self.ray.wait(pending, num_returns=1)
                out[index[ready[0]]] = self.ray.get(ready[0])
                _tick(progress, len(tasks) - len(pending), len(tasks))
        except BaseException:
            for ref in pending:
                self.ray.cancel(ref)
            raise
        return out

    def close(self) -> None:
        self.ray.shutdown()


def make_executor(spec: str = "local", workers: int | None = None):
    """An executor from its name: see ``EXECUTORS``."""
    if not isinstance(spec, str):
        raise ConfigError(f"executor: must be a name ({EXECUTORS}), got {spec!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"workers: must be a positive integer, got {workers!r}")
    if spec == "serial" or (spec == "local" and workers == 1):
        return SerialExecutor()
    if spec == "local":
        return PoolExecutor(workers)
    if spec == "local-spawn":
        return PoolExecutor(workers, start="spawn")
    if spec == "dask-local":
        return DaskExecutor(None, workers)
    if spec.startswith(("dask://", "tcp://")):
        return DaskExecutor("tcp://" + spec.split("://", 1)[1], workers)
    if spec == "ray" or spec.startswith("ray://"):
        return RayExecutor(None if spec == "ray" else spec)
    raise ConfigError(f"executor: {spec!r} is not one of {EXECUTORS}")
