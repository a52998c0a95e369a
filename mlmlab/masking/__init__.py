"""The object of study: pure torch masking, no Lightning, no I/O."""

from mlmlab.masking.masker import (
    GeneratorSource,
    KeyedSource,
    MaskedBatch,
    Masker,
    MaskingRecipe,
    make_generator,
    mask_once,
    mask_seed,
    telemetry,
)
from mlmlab.masking.schedules import Constant, Cosine, Linear, Piecewise, Step

__all__ = ["GeneratorSource", "KeyedSource", "MaskedBatch", "Masker", "MaskingRecipe", "make_generator", "mask_once", "mask_seed",
           "telemetry", "Constant", "Cosine", "Linear", "Piecewise", "Step"]
