"""The committed results keep their promise: the shipped checkpoints against random init of their own architecture,
read from `results/runs` as the leaderboard's "Sanity targets" section reads them (the same paired differences over
the 3 shared seeds, the same 95% intervals; `transferbench.reporting.targets`)."""

from pathlib import Path

from transferbench.records.store import load_records
from transferbench.reporting.leaderboard import task_tables
from transferbench.reporting.targets import TARGETS, sanity_targets

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("mu4@embedded", "mu4_dpn@embedded", "mu4_dtn@embedded")

# The targets the committed records reach: a regeneration that loses one fails here. One reached anew is added.
# Not reached yet: few-shot at 25 shots for mu4 (+5.2) and mu4_dtn (+5.6), at 10 shots for mu4 (+4.4), LiT zero-shot
# for mu4 (+9.8), LiT retrieval for mu4_dpn (+1.3) and mu4_dtn (+4.6).
REACHED = {
    ("few-shot mean, 25 shots", "mu4_dpn@embedded"),
    ("few-shot mean, 10 shots", "mu4_dpn@embedded"),
    ("few-shot mean, 10 shots", "mu4_dtn@embedded"),
    ("LiT zero-shot mean", "mu4_dpn@embedded"),
    ("LiT zero-shot mean", "mu4_dtn@embedded"),
    ("LiT retrieval mean", "mu4@embedded"),
    *(("ADE20K mIoU, full fraction", b) for b in SHIPPED),
    *(("VTAB-1k mean", b) for b in SHIPPED),
}
# The sets significantly below random init on the committed records, as (task, setting, column, checkpoint): a
# regeneration may lose one of them, never add one. All but LiT's photographs are the CLEVR-style few-shot sets.
WORSE = {
    ("fewshot", "shots=1", "mini_clevr_dist", "mu4@embedded"),
    ("fewshot", "shots=5", "mini_clevr_dist", "mu4@embedded"),
    ("fewshot", "shots=5", "mini_clevr_dist", "mu4_dpn@embedded"),
    ("fewshot", "shots=5", "mini_clevr_dist", "mu4_dtn@embedded"),
    ("fewshot", "shots=10", "mini_clevr_count", "mu4@embedded"),
    ("fewshot", "shots=10", "mini_clevr_dist", "mu4@embedded"),
    ("fewshot", "shots=10", "mini_clevr_dist", "mu4_dtn@embedded"),
    ("fewshot", "shots=25", "mini_clevr_count", "mu4_dpn@embedded"),
    ("fewshot", "shots=25", "mini_clevr_count", "mu4_dtn@embedded"),
    ("fewshot", "shots=25", "mini_clevr_dist", "mu4@embedded"),
    ("fewshot", "shots=25", "mini_clevr_dist", "mu4_dtn@embedded"),
    ("lit", "", "mini_photos", "mu4@embedded"),
}


def test_the_committed_checkpoints_keep_the_sanity_targets_they_reach():
    """Every target of the embedded world for every shipped checkpoint is read from the committed records; those
    in REACHED must hold, and no other may (add it). The targets not reached yet, and every set below random init,
    are the embedded world's open questions; the leaderboard prints them all."""
    checks, worse = sanity_targets(task_tables(load_records([ROOT / "results" / "runs"], strict=True)))
    by = {(c.measure, c.backbone): c for c in checks}
    assert set(by) == {(t.measure, b) for t in TARGETS for b in SHIPPED}
    assert all(c.gain is not None for c in checks), "every target has its records"
    lost = sorted(k for k in REACHED if not by[k].ok)
    assert not lost, f"targets lost: {[(k, round(by[k].gain, 1)) for k in lost]}"
    assert {k for k, c in by.items() if c.ok} == REACHED, "a target reached anew: add it to REACHED"
    added = {(w.task, w.setting, w.column, w.backbone) for w in worse} - WORSE
    assert not added, f"sets newly below random init: {sorted(added)}"
