"""Where transferbench writes besides --out, one module per job:

- `paths.home`: $TRANSFERBENCH_HOME and every cache folder under it (`CACHES`), named there once;
- `paths.portable`: a file's path as a record keeps it, never one machine's absolute path, and back;
- `paths.writes`: the one way a file or folder is written (aside, then renamed into place), the probe that a folder
  takes writes, the temporaries of killed writers, and the one-line error of a write that the filesystem refused;
- `paths.entries`: how a cache entry is trusted: each carries its size and checksum, checked before it is read; a
  damaged one is set aside, never read;
- `paths.ledger`: what a run knows of the cache entries it met in a process: how many it read and computed, which
  it found whole, and which arithmetic computed them.

Each name is imported from its module; this one holds none."""
