"""The values that settings take, as names: the settings models (and `transferbench list tasks --show`) read them
without importing the modules that implement them (torch). Each implementing module imports its names from here, and
a test pins every registry of functions to its names (tests/test_settings.py)."""

BF16_SETTINGS = ("auto", "on", "off", True, False)  # engine.precision
LOSSES = ("sigmoid", "softmax")  # engine.losses.LOSSES: the classification losses
AUGMENTATIONS = ("none", "crop", "flip", "crop_flip", "inception_flip")  # data.transforms
POSEMB_METHODS = ("big_vision", "scenic", "timm")  # backbones.checkpoint: position-embedding resampling
ATTN_STD_TOKENS = ("patches", "all")  # backbones.measures
SCHEDULES = ("cosine", "poly")  # engine.train: learning-rate schedules after warm-up
IMAGE_SAMPLES = ("random", "first")  # adapters.diagnose: which images the forward measures see
DECODER_TOKENS = ("prenorm", "norm")  # adapters.seg: the tokens the linear decoder reads
COMPILE = ("auto", "on", "off")  # engine.compute: --compile, whether training steps run through torch.compile

# engine.augreg: App. C's named augmentation strengths
# big_vision configs/vit_i1k.py RANDAUG_DEF / MIXUP_DEF: randaug(num_ops, magnitude) and the mixup concentration
RANDAUG = {
    "none": None,
    "light1": (2, 0),
    "light2": (2, 10),
    "medium1": (2, 15),
    "medium2": (2, 15),
    "strong1": (2, 20),
    "strong2": (2, 20),
}
MIXUP = {"none": 0.0, "light1": 0.0, "light2": 0.2, "medium1": 0.2, "medium2": 0.5, "strong1": 0.5, "strong2": 0.8}

# adapters.lit
LIT_IMAGE_HEADS = ("none", "linear")  # towers: the image embedding as it is, or through a trainable linear head
LIT_LOSSES = ("clip", "siglip")  # towers: open_clip's ClipLoss | SigLipLoss
LIT_DECAY = ("big_vision", "open_clip")  # towers: which tensors weight decay reaches, and how
LIT_PROMPTS = ("big_vision", "open_clip")  # zeroshot: class names and templates
