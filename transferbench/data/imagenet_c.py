"""ImageNet-C's protocol constants (hendrycks/robustness; AlexNet's errors from google-research/augmix), in one
home for the generator (data.corruptions), the adapter and the robustness report. Plain data: importing it
loads neither torch nor an image library."""

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
