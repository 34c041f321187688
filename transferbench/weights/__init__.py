"""Checkpoints of the `pretrain` task's embedded profile that ship with transferbench (see README.md
here): `NAME@embedded` uses them when their cell key matches the current profile."""
