"""Data sources: tfds data_source, image folders (VTAB export, embedded suite), transforms, label rules."""
