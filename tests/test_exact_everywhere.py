"""The parts that keep the nightly exact on every runner: an arithmetic the code chose is code, machines compare by
what both record, the acceptance ledger, caches of other arithmetic, the shipped pretraining profile's precision,
the rolling baseline's replacement, and the nightly workflow against GitHub's schema."""

import copy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_regress import exact_suite, noise

from transferbench.arithmetic import cell_differences, machine_differences
from transferbench.errors import UserError
from transferbench.gate import ledger
from transferbench.gate.decide import decide as _decide
from transferbench.reporting.regress import decision_report as _verdict


def decide(*a, **kw):  # the synthetic suites' own noise model (test_regress.MODEL), not the package's
    from test_regress import MODEL

    kw.setdefault("noise", MODEL)
    return _decide(*a, **kw)


def verdict(*a, **kw):
    from test_regress import MODEL

    kw.setdefault("noise", MODEL)
    return _verdict(*a, **kw)


ROOT = Path(__file__).resolve().parent.parent


def machine(**over) -> dict:
    parts = {
        "cpu": {"vendor": "AuthenticAMD", "flags": ["avx2"]},
        "threads": {"intra_op": 1},
        "libraries": {"torch": "2"},
    }
    parts.update(over)
    from transferbench.hashing import digest

    return {"digest": digest(parts, 16), **parts}


def with_cell(records, precision, code, outputs):
    """Copies of `records` on one machine whose cells ran in `precision`, computed by `code`, giving `outputs`."""
    out = copy.deepcopy(records)
    for r in out:
        cell = {"precision": [precision], "micro_batch": [0], "compile": False, "workers": 0, "device": "cpu"}
        r["arithmetic"] = {"digest": f"{precision}", "machine": machine(), "cell": cell, "caches": {}}
        r["fingerprint"] = {"digest": code, "modules": {"transferbench.adapters.fewshot": code}, "libraries": {}}
        r["outputs"] = outputs
    return out


# --- item 3: an arithmetic the code chose is code ---------------------------------------------------------------


def test_a_precision_flipped_by_code_fails_on_one_machine_unless_accepted():
    base = with_cell(exact_suite(noise()), "bf16", "v1", "o1")
    # the code changed and so did its cells' precision: no longer a change of machine, a change of code
    cur = with_cell(base, "fp32", "v2", "o2")
    for r in cur:
        r["metrics"]["test"]["accuracy"] -= 0.2
    text, code = verdict(base, cur)
    assert code == 1
    assert text.split("\n")[2].startswith(
        "**REGRESSION** (48 arithmetic changed by code (bf16 → fp32)): all 48 cells judged exactly (0 bit-identical, "
        "48 arithmetic changed by code"
    )
    assert 'arithmetic changed by code: cell.precision ["bf16"] -> ["fp32"]' in text
    assert verdict(base, cur, accept_code=["adapters.fewshot"])[1] == 0
    # the same flip with the same code was chosen by the command or a probe: the statistical tier, as before
    same = with_cell(base, "fp32", "v1", "o2")
    g = decide(base, same).gate
    assert g.exact.statistical == 48 and not g.exact.changed
    assert any("same code: chosen by the command or a probe" in why for why in g.exact.why)


def test_a_model_read_from_a_cache_is_not_an_arithmetic_changed_by_code():
    """A warm home reads a trained classifier that a cold one trains: the cell's own arithmetic lists fewer steps
    (its training never ran). That is the cache's state, not the code: the statistical tier, counted."""
    base = with_cell(exact_suite(noise()), "bf16", "v1", "o1")
    cur = with_cell(base, "fp32", "v2", "o2")
    for r in base:
        r["caches"] = {"classifiers": {"computed": 1, "read": 0}}
    for r in cur:
        r["caches"] = {"classifiers": {"computed": 0, "read": 1}}
    g = decide(base, cur).gate
    assert not g.exact.changed and g.exact.statistical == 48
    assert g.exact.why == {"a cache entry computed on one side and read on the other (classifiers)": 48}
    assert g.exact.by_declaration == 48


def test_machines_compare_by_what_both_record():
    a = {"digest": "x", "machine": machine()}
    # a field that later code added to the machine, and a library only one side lists: the same machine
    later = machine(pools={"blas": {"num_threads": 1}}, libraries={"torch": "2", "newlib": "1"})
    assert machine_differences(a, {"digest": "y", "machine": later}) == []
    other = machine(cpu={"vendor": "GenuineIntel", "flags": ["avx2"]})
    assert machine_differences(a, {"digest": "y", "machine": other}) == ["cpu.vendor AuthenticAMD -> GenuineIntel"]
    assert machine_differences(a, None) == ["no arithmetic recorded"]
    # a library both sides list at other versions parts them (a library release is another arithmetic)
    newer = machine(libraries={"torch": "3"})
    assert machine_differences(a, {"digest": "y", "machine": newer}) == ["libraries.torch 2 -> 3"]
    assert cell_differences({"cell": {"precision": ["bf16"]}}, {"cell": {"precision": ["fp32"]}}) == [
        'cell.precision ["bf16"] -> ["fp32"]'
    ]


# --- item 2: the acceptance ledger --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, message",
    [
        ("accepted: [", "not a readable YAML ledger"),
        ("accepted: 3", "give `accepted:` a list"),
        ("accepted:\n  - {commit: abcdef1, code: [a], why: b}", "names what changed, not a commit"),
        ("accepted:\n  - {code: {backbones.dtn: zz}, why: b}", "is not a code fingerprint"),
        ("accepted:\n  - {code: [backbones.dtn], why: b}", "map each module to its code fingerprint"),
        ("accepted:\n  - {why: b}", "name what changes"),
        ("accepted:\n  - {code: {backbones.dtn: 0123456789abcdef}}", "say why"),
        ("accepted:\n  - {protocol: {fewshot: tok}, why: b}", "TASK:SETTING"),
        ("accepted:\n  - {code: {backbones.dtn: 0123456789abcdef}, why: b, when: c}", "nothing else"),
    ],
)
def test_a_bad_ledger_is_one_line_naming_the_entry(tmp_path, text, message):
    (tmp_path / "ACCEPTED.yaml").write_text(text)
    with pytest.raises(UserError, match=message) as e:
        ledger.load(tmp_path)
    assert "\n" not in str(e.value)


def test_accept_writes_each_modules_current_fingerprint_and_a_setting_at_its_value(tmp_path, capsys):
    from transferbench.cli import main
    from transferbench.fingerprint import closure

    ledger.empty(tmp_path)
    assert main(["accept", "--anchor", str(tmp_path), "--code", "backbones.dtn", "--why", "one Gram product"]) == 0
    assert main(["accept", "--anchor", str(tmp_path), "--protocol", "fewshot:pool=tok", "--why", "the paper's"]) == 0
    book = ledger.load(tmp_path)
    h = closure(("transferbench.backbones.dtn",))["transferbench.backbones.dtn"]
    assert [e.code for e in book.entries] == [(("transferbench.backbones.dtn", h),), ()]
    assert book.entries[1].protocol == (("fewshot:pool", "tok"),)
    protocol, code, lines = book.accepts()
    assert protocol == ["fewshot:pool=tok"] and code == [f"transferbench.backbones.dtn@{h}"]
    assert lines[0] == f"- transferbench.backbones.dtn@{h} (one Gram product)"
    assert main(["accept", "--anchor", str(tmp_path), "--code", "backbones.nothing", "--why", "x"]) == 2
    assert main(["accept", "--anchor", str(tmp_path), "--protocol", "fewshot:pool", "--why", "x"]) == 2
    ledger.empty(tmp_path)
    assert ledger.load(tmp_path).entries == []


def test_regress_honours_the_ledger_at_the_accepted_fingerprint_only(tmp_path, capsys):
    """The entry accepts adapters.fewshot at the fingerprint tonight's records hold: a second change of the module
    (another fingerprint) fails again, whatever the baseline, and no commit is named (squash merges change
    nothing); an entry that matched nothing is listed."""
    from conftest import write_records

    from transferbench.cli import main

    base = with_cell(exact_suite(noise()), "fp32", "v1", "o1")
    cur = with_cell(base, "fp32", "v2", "o2")
    for r in cur:
        r["fingerprint"]["modules"]["transferbench.adapters.fewshot"] = "aaaaaaaaaaaaaaaa"
    for r in base:
        r["fingerprint"]["modules"]["transferbench.adapters.fewshot"] = "bbbbbbbbbbbbbbbb"
    write_records(base, tmp_path / "base")
    write_records(cur, tmp_path / "cur")
    args = ["regress", "--baseline", str(tmp_path / "base"), "--current", str(tmp_path / "cur")]
    assert main(args) == 1 and "(48 changed by code)" in capsys.readouterr().out
    (tmp_path / "base" / "ACCEPTED.yaml").write_text(
        "accepted:\n  - {code: {adapters.fewshot: aaaaaaaaaaaaaaaa}, why: float64 scores}\n"
        "  - {code: {backbones.dtn: cccccccccccccccc}, why: an older change}\n"
    )
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "- transferbench.adapters.fewshot@aaaaaaaaaaaaaaaa (float64 scores)" in out
    assert "- matching nothing in this comparison:" in out and "backbones.dtn@cccccccccccccccc" in out
    for r in cur:  # a second change of the same module
        r["fingerprint"]["modules"]["transferbench.adapters.fewshot"] = "dddddddddddddddd"
    write_records(cur, tmp_path / "cur2")
    assert main([*args[:-1], str(tmp_path / "cur2")]) == 1
    assert main([*args, "--ledger", str(tmp_path / "none.yaml")]) == 2


# --- item 5: caches of other arithmetic ---------------------------------------------------------------------------


def test_a_cache_entry_of_other_arithmetic_is_computed_again_never_read(tmp_path, monkeypatch):
    from transferbench.paths import entries
    from transferbench.paths.home import cache

    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path))
    entry = cache("features") / "e.npy"
    entry.parent.mkdir(parents=True)
    monkeypatch.setattr(entries, "_computing_arithmetic", lambda: "another-runner")
    with entries.sealed(entry) as tmp:
        tmp.write_bytes(b"theirs")
    monkeypatch.setattr(entries, "_computing_arithmetic", lambda: "this-runner")
    assert entries.verified(entry) is False  # whole, but of other arithmetic: a miss
    with entries.sealed(entry) as tmp:
        tmp.write_bytes(b"mine")
    assert entries.verified(entry) is True and entry.read_bytes() == b"mine"
    # a timing cache is machine-specific by its key, and is read whoever wrote it
    probe = cache("bf16-probe") / "p.json"
    probe.parent.mkdir(parents=True)
    monkeypatch.setattr(entries, "_computing_arithmetic", lambda: "another-runner")
    with entries.sealed(probe) as tmp:
        tmp.write_text("{}")
    monkeypatch.setattr(entries, "_computing_arithmetic", lambda: "this-runner")
    assert entries.verified(probe) is True


# --- item 4: the shipped pretraining profile trains in the precision it shipped in ------------------------------


def test_the_shipped_profile_pins_fp32_whatever_the_probe_says(monkeypatch, tmp_path):
    from transferbench import arithmetic
    from transferbench.adapters.pretrain import _pretrain_cell, shipped_precision
    from transferbench.engine import precision

    monkeypatch.setenv("TRANSFERBENCH_HOME", str(tmp_path))
    _, _, cell, _ = _pretrain_cell("mu4", "embedded")
    assert shipped_precision(cell, "auto") is False and shipped_precision(cell, "on") is None
    # the nightly's probe suite ships nothing: the probe decides there
    from transferbench.adapters import prepare_task

    task = prepare_task("pretrain", suite="nightly")
    nightly = next(c for c in task.adapter.plan(task, cell_ref(), results()) if c.stage == "final")
    assert shipped_precision(nightly, "auto") is None
    # the adapter itself, up to its first training step, on a machine whose probe says bf16 is far faster: the
    # shipped cell trains in fp32 (delete the adapter's pin and this fails)
    from transferbench.engine import train
    from transferbench.engine.compute import CellContext

    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: True)
    monkeypatch.setattr(precision, "probe", lambda step: {"fp32_ms": 100.0, "bf16_ms": 10.0})  # bf16 far faster
    chosen = []
    real = precision._resolve

    def spy(*a, **k):
        chosen.append(real(*a, **k))
        return chosen[-1]

    class Stop(Exception):
        pass

    def stop(*a, **k):
        raise Stop

    monkeypatch.setattr(precision, "_resolve", spy)
    monkeypatch.setattr(train, "_accumulate", stop)
    task, _, cell, _ = _pretrain_cell("mu4", "embedded")
    arithmetic.begin()
    try:
        with pytest.raises(Stop):
            task.adapter.run(cell, CellContext(device="cpu", show_progress=False))
        assert [c.bf16 for c in chosen] == [False] and arithmetic._TRACE.precision == ["fp32"]
        assert chosen[0].info["decided_by"].startswith("the shipped profile") and chosen[0].info["probe_bf16"] is True
    finally:
        arithmetic.end()


def cell_ref():
    from transferbench.cell import RANDOM_INIT, BackboneRef

    return BackboneRef("mu4", "mu4", None, RANDOM_INIT)


def results():
    from transferbench.engine.runner import Results
    from transferbench.records.store import RecordStore

    return Results(RecordStore(Path("/nonexistent-records")))


# --- item 6: the rolling baseline ---------------------------------------------------------------------------------


def test_a_passing_night_replaces_a_larger_rolling_baseline(tmp_path):
    import kit
    from conftest import write_records

    from transferbench.night import keep_rolling
    from transferbench.records.store import load_records

    roll, night = tmp_path / "rolling" / "k", tmp_path / "night"
    write_records([kit.record("toy", "alpha", "mu4", s, {"test": {"accuracy": 1.0}}) for s in range(3)], roll)
    write_records([kit.record("toy", "alpha", "mu4", 0, {"test": {"accuracy": 2.0}})], night)
    keep_rolling(night, roll)  # a suite that shrank on purpose: tonight, with every expected cell, replaces it
    assert [r["metrics"]["test"]["accuracy"] for r in load_records([roll])] == [2.0]


# --- item 7: the workflow ------------------------------------------------------------------------------------------


def test_the_nightly_workflow_validates_against_githubs_schema():
    if shutil.which("check-jsonschema") is None:
        pytest.fail("check-jsonschema is missing: pip install -e '.[dev]'")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.github-workflows",
            str(ROOT / ".github/workflows/nightly.yml"),
            str(ROOT / ".github/workflows/tests.yml"),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = (ROOT / ".github/workflows/nightly.yml").read_text()
    # the anchor's commit must be in the clone, and every cache key holds the runner's arithmetic
    assert "fetch-depth: 0" in text
    assert "tbhome-${{ steps.arith.outputs.digest }}-" in text
    assert "nightly-rolling-${{ steps.arith.outputs.digest }}-" in text


# --- item 1: the anchor's rerun feeds the noise model as a measured variant ------------------------------------


def test_an_anchor_rerun_is_a_measured_variant_of_the_noise_model(tmp_path):
    """`python -m benchmarks.noise_model --measured ANCHOR:RERUN`: the committed anchor and its rerun on another
    runner (the same code in that runner's arithmetic) join the model as a pair of their own."""
    from conftest import shifted
    from test_regress import suite

    from transferbench.gate.noise import measure

    base = with_cell(suite(noise()), "fp32", "v1", "o1")  # both sides record the precision each step ran in
    rerun = shifted(base, lambda r: 0.1 if r["seed"] == 0 else -0.1)  # arithmetic moves each cell by 0.1 either way
    model = measure(base, [("rerun:x", "the anchor's rerun", "cpu", (base, rerun))], suite="embedded", commit="abc")
    entry = model["tasks"]["fewshot"]["test"]["accuracy"]["cpu"]
    # every (cell, seed)'s change is +-0.1: its mean square around 0 is 0.01, over 2 backbones x 4 sets x 2 shots x 3
    # seeds; two seeds of three went worse
    assert entry["ms"] == pytest.approx(0.01) and entry["df"] == 48 and entry["worse"] == pytest.approx(2 / 3)
    assert model["variants"][0]["name"] == "rerun:x"
