"""The object of study: pure torch masking, no Lightning, no I/O."""

from mlmlab.masking.masker import BertMasker, MaskedBatch, make_generator, mask_once, mask_seed, telemetry
from mlmlab.masking.replacement import UniformSampler
from mlmlab.masking.schedules import Constant

__all__ = ["BertMasker", "MaskedBatch", "UniformSampler", "Constant", "make_generator", "mask_once", "mask_seed", "telemetry"]
