"""Preloaded by the corruption process pool's fork server: imports the generator and compiles glass_blur's
numba kernel once, so that every worker forked from the server starts warm."""

import numpy as np

try:
    from imagecorruptions import corrupt

    corrupt(np.zeros((32, 32, 3), np.uint8), severity=1, corruption_name="glass_blur", seed=0)
except ImportError:  # the parent reports the missing package with its fix
    pass
