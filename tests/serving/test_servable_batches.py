"""Static batch sizes in `Servable.run` (no server): a signature built for batch 4, or an
export.json declaring the sizes it runs at, gets N rows padded to the nearest allowed size
(the last row repeated), one runtime call per chunk, and exactly N answers back, equal to
those of each row run alone."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import tiny_exports
from tpu_models.serving import repository
from tpu_models.serving.servable import Servable


def _pictures(count):
  return np.stack([tiny_exports.band_picture(k % tiny_exports.CLASSES, 200 + k)
                   for k in range(count)])


def _run(servable, pixels):
  calls = []
  outputs = servable.run("serving_default", {"images": pixels},
                         on_call=lambda rows, batch: calls.append((rows, batch)))
  return outputs, calls


@pytest.fixture(scope="module")
def static4(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("static") / "1")
  tiny_exports.write_batch_export(path, batch=4)
  return path


def test_a_static_batch_signature_pads_runs_once_and_slices_back(static4):
  servable = Servable(1, static4)
  signature = servable.signatures["serving_default"]
  assert signature.batch_sizes == (4,)
  assert signature.inputs["images"].shape == (-1, 16, 16, 3)  # Requests send any batch.
  assert signature.outputs["logits"].shape == (-1, tiny_exports.CLASSES)
  saved = tf.saved_model.load(static4).signatures["serving_default"]
  pixels = _pictures(3)
  outputs, calls = _run(servable, pixels)
  assert calls == [(3, 4)]  # Three rows, one call at batch 4.
  assert outputs["logits"].shape == (3, tiny_exports.CLASSES) and outputs["classes"].shape == (3,)
  padded = np.concatenate([pixels, pixels[-1:]])  # The padding: the last row repeated.
  expected = saved(images=tf.constant(padded))
  np.testing.assert_array_equal(outputs["logits"], expected["logits"].numpy()[:3])
  for i in range(3):  # Row by row: each row alone, padded to 4 with itself.
    alone, alone_calls = _run(servable, pixels[i:i + 1])
    assert alone_calls == [(1, 4)]
    np.testing.assert_allclose(alone["logits"][0], outputs["logits"][i], rtol=1e-6, atol=1e-6)
    assert alone["classes"][0] == outputs["classes"][i]
  six, calls = _run(servable, _pictures(6))  # More rows than the size: chunks of 4.
  assert calls == [(4, 4), (2, 4)] and six["logits"].shape == (6, tiny_exports.CLASSES)
  np.testing.assert_allclose(six["logits"][:3], outputs["logits"], rtol=1e-6, atol=1e-6)


def test_a_litert_export_of_batch_4_is_padded_too(tmp_path, static4):
  path = str(tmp_path / "1")
  tiny_exports.write_batch_export(path, batch=4, format_name="litert")
  servable = Servable(1, path)
  assert servable.format == "litert"
  assert servable.signatures["serving_default"].batch_sizes == (4,)
  pixels = _pictures(3)
  outputs, calls = _run(servable, pixels)
  assert calls == [(3, 4)]
  reference, _ = _run(Servable(1, static4), pixels)  # The SavedModel it was converted from.
  np.testing.assert_allclose(outputs["logits"], reference["logits"], rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(outputs["classes"], reference["classes"])
  assert _run(servable, _pictures(5))[1] == [(4, 4), (1, 4)]


def test_declared_batch_sizes_pad_to_the_nearest(tmp_path):
  path = str(tmp_path / "1")
  tiny_exports.write_batch_export(path, batch=None, declared=[4, 1, 2])
  servable = Servable(1, path)
  assert servable.signatures["serving_default"].batch_sizes == (1, 2, 4)
  pixels = _pictures(7)
  outputs, calls = _run(servable, pixels)
  assert calls == [(4, 4), (3, 4)]
  one_call = tf.saved_model.load(path).signatures["serving_default"](images=tf.constant(pixels))
  np.testing.assert_allclose(outputs["logits"], one_call["logits"].numpy(), rtol=1e-6, atol=1e-6)
  assert _run(servable, pixels[:2])[1] == [(2, 2)]
  assert _run(servable, pixels[:1])[1] == [(1, 1)]


@pytest.mark.parametrize("batch, declared, words", [
    (None, [0, 2], "must be a non-empty list of sizes >= 1"),
    (None, "4", "must be a non-empty list of sizes >= 1"),
    (None, {"nope": [2]}, "names signature 'nope'"),
    (4, [2, 4], "differ from the graph's static batch [4]"),
])
def test_a_bad_batch_sizes_declaration_refuses_the_version(tmp_path, batch, declared, words):
  path = str(tmp_path / "1")
  tiny_exports.write_batch_export(path, batch=batch, declared=declared)
  with pytest.raises(repository.DamagedVersion, match=None) as refused:
    Servable(1, path)
  assert words in str(refused.value) and "\n" not in str(refused.value)
  with open(os.path.join(path, "assets.extra", "export.json")) as f:
    assert json.load(f)["batch_sizes"] == declared
