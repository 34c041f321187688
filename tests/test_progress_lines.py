"""Progress that reaches a log file: with stderr redirected to a file, `transferbench run` writes one line per
finished cell and no per-step bars."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d fewshot mini_digits mu4 final shots=(\d+) seed 0: "
    r"accuracy ([\d.]+) \(test\) \| (\d+)/4 cells, \d+:\d\d:\d\d elapsed, ETA \d+:\d\d:\d\d$"
)


CLI = [sys.executable, "-c", "import sys; from transferbench.cli import main; sys.exit(main())"]


@pytest.mark.slow
def test_one_line_per_cell_when_stderr_is_a_file(suite_home, tmp_path):
    err = tmp_path / "run.log"
    argv = [*CLI, *"run fewshot --suite embedded --datasets mini_digits --backbone mu4 --seeds 0".split()]
    argv += ["--out", str(tmp_path / "runs")]
    with open(err, "w") as f:
        proc = subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=f,
            text=True,
            env={**os.environ, "TRANSFERBENCH_HOME": str(suite_home)},
            timeout=600,
        )
    assert proc.returncode == 0, err.read_text()
    text = err.read_text()
    assert "\r" not in text and "it/s" not in text  # no tqdm bar, no per-step output
    cells = [m for m in map(LINE.match, text.splitlines()) if m]
    assert sorted(int(m.group(1)) for m in cells) == [1, 5, 10, 25]
    assert [int(m.group(3)) for m in cells] == [1, 2, 3, 4]  # done / planned, in finishing order
    # the line's metric is the record's
    from transferbench.records.store import load_records

    recs = load_records([tmp_path / "runs"])
    by_shots = {r["hparams"]["shots"]: r["metrics"]["test"]["accuracy"] for r in recs}
    for m in cells:
        assert float(m.group(2)) == float(f"{by_shots[int(m.group(1))]:.4g}")
    # a rerun finds every cell finished: nothing computed, no cell lines
    with open(err, "w") as f:
        subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=f,
            env={**os.environ, "TRANSFERBENCH_HOME": str(suite_home)},
            timeout=600,
            check=True,
        )
    assert not [ln for ln in err.read_text().splitlines() if LINE.match(ln)]
