"""The torch peer's tiny detector fixtures as the torchvision import tests read them.

tests/fixtures/torch holds what benchmarks/torch/write_tiny_fixtures.py wrote in the torch
venv: per detector `stem`.safetensors (torchvision's own state dict), the same weights in the
pre-0.13 key layout (`stem`_legacy_keys.safetensors) and torchvision's outputs on two photos
(`stem`_reference.npz: float32/int64 arrays named `{photo}/...`, e.g. `{photo}/transformed_nhwc`
[1, Hp, Wp, 3], the input at its padded size).
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from tpu_models.weights import importing

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures",
                        "torch")


class TinyDetector:
  """One detector's files in FIXTURES (`weights`, `legacy`, the reference arrays) and `narrow`:
  our model's params at the fixture's narrow widths (no image size)."""

  def __init__(self, stem: str, narrow: dict):
    self.weights = os.path.join(FIXTURES, f"{stem}.safetensors")
    self.legacy = os.path.join(FIXTURES, f"{stem}_legacy_keys.safetensors")
    self.reference_path = os.path.join(FIXTURES, f"{stem}_reference.npz")
    self.narrow = narrow

  def reference_fixture(self):
    """A module-scoped pytest fixture named `reference`: the reference arrays, a dict."""
    @pytest.fixture(scope="module")
    def reference():
      return dict(np.load(self.reference_path))
    return reference

  def params(self, reference, photo: str) -> dict:
    """`narrow` at `photo`'s padded size (as torchvision's transform padded it)."""
    return dict(self.narrow, image_size=list(reference[f"{photo}/transformed_nhwc"].shape[1:3]))


def assert_legacy_layout_loads_the_same(model, weights: str, legacy: str):
  """Loads `weights` into `model`, zeroes every variable, then loads `legacy` (the same state
  dict in torchvision's pre-0.13 key layout) and asserts every variable is as before.
  Returns the legacy load's report."""
  importing.load_weights(model, weights, "torchvision")
  current = [v.numpy() for v in model.variables]
  for v in model.variables:
    v.assign(tf.zeros_like(v))
  report = importing.load_weights(model, legacy, "torchvision")
  for ours, theirs in zip(current, model.variables):
    np.testing.assert_array_equal(ours, theirs.numpy())
  return report
