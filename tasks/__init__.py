"""Declarative task specs (YAML), installed as the package `transferbench.tasks`.

One file per task: datasets, splits, protocol hyper-parameters, sweeps and suites. Adding a dataset is
an edit here; adding a task is one YAML file plus one adapter module registered as an entry point.
"""
