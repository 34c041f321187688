"""What an executor's future holds (engine.executors, engine.ray_executor): a cell's outcome, or `WorkerLost` where the
process computing it died; `chained` translates the inner future's failure into the runner's terms."""

from __future__ import annotations

from concurrent.futures import Future


class WorkerLost(RuntimeError):
    """The process computing a cell died before returning its outcome."""


def chained(inner: Future, translate, settle=lambda: None) -> Future:
    """A future with `inner`'s result, or `translate(exception)` raised in its place; `settle()` runs first (the
    executor frees what the cell held, so that the runner may submit the next cell as soon as it sees this one)."""
    outer: Future = Future()

    def done(f):
        try:
            result, error = f.result(), None
        except BaseException as e:  # noqa: BLE001 - handed to the runner through the future
            result, error = None, translate(e)
        settle()
        outer.set_result(result) if error is None else outer.set_exception(error)

    inner.add_done_callback(done)
    return outer
