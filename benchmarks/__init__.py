"""Speed benchmarks against peers; `python -m benchmarks` runs them all and rewrites RESULTS.md."""
