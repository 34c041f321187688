"""What a run knows of the cache entries it met in one process (`Ledger`): how many it read and computed per cache
folder (each cell's outcome carries its counts, `caches` in its record, and the run's summary line adds them up),
which entries it found whole (each is hashed once while its files keep their size and mtime) and the machine
arithmetic that computed each (`paths.entries`).

A ledger lives as long as a run in a process. The runner holds the run's ledger in its own process while the run
lasts (`engine.runner`: the inline executor computes its cells there); a pool worker holds one from its start, and
the pool lives for one run (`engine.executors`); a cell computed anywhere else (a Ray task, whose worker outlives
the run, or a `compute_cell` called alone) holds its own (`engine.compute.compute_cell`). Outside a held ledger,
`current()` is a new one at each call: nothing is remembered or counted from one call to the next."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from .home import cache_of

_HELD: list[Ledger] = []  # the ledgers held in this process, the innermost last (`Ledger.held`, `Ledger.hold`)


class Ledger:
    """The cache entries met in one process while a run lasts: their counts, and what their checks found."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()  # (cache folder, 'read' | 'computed') -> entries
        self.whole: dict = {}  # path -> what each of its files' size and mtime were when it was last found whole
        self.computed_in: dict = {}  # path -> the machine arithmetic digest its digest records (None: none recorded)

    def count(self, path, what: str) -> None:
        """Count one cache entry read (`verified` found it whole) or computed (`sealed` put it in place), by the cache
        folder it lies in (none outside the home's caches)."""
        kind = cache_of(path)
        if kind is not None:
            self.counts[(kind, what)] += 1

    def snapshot(self) -> Counter:
        """The counts now, for `since`."""
        return self.counts.copy()

    def since(self, before: Counter) -> dict:
        """{cache folder: {'read': n, 'computed': m}} counted since the `snapshot` `before`."""
        out: dict = {}
        for (kind, what), n in (self.counts - before).items():
            out.setdefault(kind, {"read": 0, "computed": 0})[what] = n
        return out

    def hold(self) -> Ledger:
        """This ledger held in this process until the process ends (a worker that serves one run)."""
        _HELD.append(self)
        return self

    @contextmanager
    def held(self) -> Iterator[Ledger]:
        """This ledger held in this process for the body of the with-statement, the one held before it again after."""
        _HELD.append(self)
        try:
            yield self
        finally:
            _HELD.pop()


def held_ledger() -> Ledger:
    """The ledger held in this process (the innermost); outside any, a new one."""
    return _HELD[-1] if _HELD else Ledger()
