#!/bin/bash
# The GPU measurements in one command, for a GPU host with no network (its image lacks some dependencies: begin with
# the install line that `bash ../shared/device/pack.sh` prints here, and take .whl/ along).
#
#   bash benchmarks/device_check.sh measure [OUT]   every row of benchmarks/paper_step.py in under 8 minutes: the DTN
#                                                   block (fused kernels and the torch formulation), the step and its
#                                                   MFU, the data share, a paper-scale cell and the study's cost, the
#                                                   README's main command and where its time goes, the MFU and data
#                                                   levers; the markdown table and the raw figures into OUT
#   bash benchmarks/device_check.sh tests [OUT]     the whole test suite, 16 workers, within 10 minutes
#
# OUT defaults to $OUT (the device tool's return folder), else ./device-out.
set -uo pipefail
what=${1:-measure}
out=${2:-${OUT:-device-out}}
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "no nvidia-smi" > "$out/nvidia-smi.txt"
case "$what" in
  measure)
    rm -rf "$out/embedded"
    timeout 470 python3 -m benchmarks.paper_step --seconds 0.5 --budget 420 --embedded "$out/embedded" \
      --json "$out/paper_step.json" > "$out/paper_step.md" 2> "$out/paper_step.err"
    rc=$?
    rm -rf "$out/embedded/home"  # the run's caches: large, and not figures
    cat "$out/paper_step.md"
    echo "paper_step exit $rc (its rows as they finished: $out/paper_step.err)"
    exit $rc ;;
  tests)
    timeout 590 python3 -m pytest -q -n 16 -p no:cacheprovider > "$out/pytest.txt" 2>&1
    rc=$?
    tail -40 "$out/pytest.txt"
    echo "pytest exit $rc"
    exit $rc ;;
  *)
    echo "device_check.sh: unknown step '$what': use measure or tests" >&2
    exit 2 ;;
esac
