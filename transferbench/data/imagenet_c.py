"""ImageNet-C's protocol constants (hendrycks/robustness; AlexNet's errors from google-research/augmix), in one
home for the generator (data.corruptions), the adapter and the robustness report, with the paper's formulas of
CE, mCE and relative mCE. Importing it loads neither torch nor an image library."""

from collections.abc import Mapping, Sequence

import numpy as np

# the 15 corruptions, in the paper's order, and its four families (brightness is a weather corruption)
CORRUPTIONS = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "defocus_blur",
    "glass_blur",
    "motion_blur",
    "zoom_blur",
    "snow",
    "frost",
    "fog",
    "brightness",
    "contrast",
    "elastic_transform",
    "pixelate",
    "jpeg_compression",
)
FAMILIES = {
    "noise": CORRUPTIONS[0:3],
    "blur": CORRUPTIONS[3:7],
    "weather": CORRUPTIONS[7:11],
    "digital": CORRUPTIONS[11:15],
}
SEVERITIES = (1, 2, 3, 4, 5)
# AlexNet's top-1 error on ImageNet-C per corruption, mean over the 5 severities (hendrycks/robustness,
# google-research/augmix)
ALEXNET_ERRORS = dict(
    zip(
        CORRUPTIONS,
        (
            0.886428,
            0.894468,
            0.922640,
            0.819880,
            0.826268,
            0.785948,
            0.798360,
            0.866816,
            0.826572,
            0.819324,
            0.564592,
            0.853204,
            0.646056,
            0.717840,
            0.606500,
        ),
    )
)
# AlexNet's clean top-1 error on the ImageNet validation set: torchvision's AlexNet (acc@1 56.522), the model
# the errors above were measured with (hendrycks/robustness ImageNet-C/test.py); the paper's Table 1 rounds
# it to 43.5
ALEXNET_CLEAN_ERROR = 0.43478


# --- corruption errors (Hendrycks & Dietterich, ICLR 2019; hendrycks/robustness) ----------------------------


def _mean_error(e) -> float:
    """A corruption's errors: a sequence over severities (their mean) or that mean already."""
    a = np.asarray(e, dtype=np.float64)
    if a.size == 0:
        raise ValueError("no errors given for a corruption")
    return float(a.mean())


def _check(errors: Mapping, baseline_errors: Mapping) -> None:
    missing = [c for c in errors if c not in baseline_errors]
    if missing:
        raise ValueError(f"no baseline errors for {', '.join(missing)}")


def mce(errors: Mapping[str, Sequence[float] | float], baseline_errors: Mapping[str, Sequence[float] | float]) -> dict:
    """Corruption errors and their mean. `errors` and `baseline_errors` map a corruption to its top-1 errors
    at the severities (or their mean), in the same units (fractions or percent). Σ_s E / Σ_s E_base equals the
    ratio of the means when both have all severities. Returns {"ce": {corruption: CE}, "mce": mean CE},
    CEs in percent of the baseline (AlexNet's own errors give 100 everywhere)."""
    _check(errors, baseline_errors)
    ce = {c: 100.0 * _mean_error(e) / _mean_error(baseline_errors[c]) for c, e in errors.items()}
    return {"ce": ce, "mce": float(np.mean(list(ce.values()))) if ce else float("nan")}


def relative_mce(errors: Mapping, clean_error: float, baseline_errors: Mapping, baseline_clean_error: float) -> dict:
    """Relative CEs: 100 · Σ_s (E(s, c) − E_clean) / Σ_s (E_base(s, c) − E_base,clean), and their mean. A
    corruption whose baseline error does not exceed the baseline's clean error has no relative CE (NaN) and is
    left out of the mean."""
    _check(errors, baseline_errors)
    rel = {}
    for c, e in errors.items():
        gap = _mean_error(baseline_errors[c]) - baseline_clean_error
        rel[c] = 100.0 * (_mean_error(e) - clean_error) / gap if gap > 0 else float("nan")
    defined = [v for v in rel.values() if np.isfinite(v)]
    return {"relative_ce": rel, "relative_mce": float(np.mean(defined)) if defined else float("nan")}
