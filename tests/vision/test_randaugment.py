"""RandAugment (vision/image/augment.py): each operation against NumPy or PIL, seeds, XLA.

16x16 images keep every test to seconds; PIL (a dependency of the image
converters' tests) is the reference of equalize and autocontrast.
"""

import numpy as np
import pytest
import tensorflow as tf

from tpu_models.errors import ConfigError
from tpu_models.vision import image as image_lib

OPS = image_lib.RANDAUGMENT_OPS
# Operations whose strength is the magnitude: the identity at magnitude 0.
SCALED_OPS = tuple(op for op in OPS if op not in ("identity", "autocontrast", "equalize"))


def _image(channels, seed=0, size=16, low=0, high=256):
  rng = np.random.default_rng(seed)
  return rng.integers(low, high, size=(size, size, channels)).astype(np.uint8)


def _op(image, op, magnitude, sign=1.0):
  return image_lib.randaugment_op(tf.constant(image, tf.float32), op, magnitude, sign).numpy()


def test_the_standard_list_of_operations():
  assert sorted(OPS) == sorted([
      "identity", "autocontrast", "equalize", "rotate", "solarize", "color", "posterize",
      "contrast", "brightness", "sharpness", "shear_x", "shear_y", "translate_x", "translate_y"])


@pytest.mark.parametrize("channels", [1, 3])
def test_every_op_keeps_shape_dtype_and_range_and_magnitude_0_changes_nothing(channels):
  image = _image(channels, low=20, high=230)  # Not touching 0 / 255: clipping shows.
  for op in OPS:
    for sign in (1.0, -1.0):
      out = image_lib.randaugment_op(tf.constant(image, tf.float32), op, 20.0, sign)
      assert out.shape == image.shape and out.dtype == tf.float32, op
      assert 0.0 <= out.numpy().min() and out.numpy().max() <= 255.0, op
  for op in SCALED_OPS:
    np.testing.assert_array_equal(_op(image, op, 0.0), image, err_msg=op)
  for op in SCALED_OPS:  # ... and every one of them does something at magnitude 10.
    if not (op == "color" and channels == 1):  # No colour to take out of gray.
      assert np.abs(_op(image, op, 10.0) - image).max() > 0, op


def test_solarize_posterize_brightness_against_numpy():
  image = _image(3)
  x = image.astype(np.float32)
  # Magnitude 5: threshold 256 (1 - 0.5) = 128.
  np.testing.assert_array_equal(_op(image, "solarize", 5.0), np.where(x < 128, x, 255 - x))
  # Magnitude 10: 8 - 4 = 4 bits kept, as uint8 & 0xF0.
  np.testing.assert_array_equal(_op(image, "posterize", 10.0), image & 0xF0)
  np.testing.assert_array_equal(_op(image, "posterize", 15.0), image & 0xC0)  # 2 bits.
  # Magnitude 5: factor 1 +- 0.45.
  np.testing.assert_allclose(_op(image, "brightness", 5.0), np.clip(x * 1.45, 0, 255), rtol=1e-6)
  np.testing.assert_allclose(_op(image, "brightness", 5.0, -1.0), x * 0.55, rtol=1e-6)


def test_geometric_ops_against_numpy():
  image = _image(3)
  # Magnitude 30: 90 degrees; a square image turns exactly (counter-clockwise, as PIL).
  np.testing.assert_array_equal(_op(image, "rotate", 30.0), np.rot90(image, 1))
  np.testing.assert_array_equal(_op(image, "rotate", 30.0, -1.0), np.rot90(image, -1))
  # Magnitude 5: 0.225 of 16 px = 3.6 -> output x reads input x + 4 (nearest), gray beyond.
  shifted = np.full_like(image, 128)
  shifted[:, :-4] = image[:, 4:]
  np.testing.assert_array_equal(_op(image, "translate_x", 5.0), shifted)
  shifted = np.full_like(image, 128)
  shifted[4:] = image[:-4]
  np.testing.assert_array_equal(_op(image, "translate_y", 5.0, -1.0), shifted)


@pytest.mark.parametrize("channels", [1, 3])
def test_equalize_and_autocontrast_against_pil(channels):
  from PIL import Image, ImageOps
  image = _image(channels, low=40, high=180)
  image[0, 0] = 60  # Channel 0 of the first pixel repeats a value: uneven histogram.
  pil = Image.fromarray(image[..., 0] if channels == 1 else image)
  as_array = lambda p: np.asarray(p).reshape(image.shape).astype(np.float32)
  np.testing.assert_array_equal(_op(image, "equalize", 0.0), as_array(ImageOps.equalize(pil)))
  # PIL truncates the stretched values to integers; ours are exact.
  np.testing.assert_allclose(_op(image, "autocontrast", 0.0),
                             as_array(ImageOps.autocontrast(pil)), atol=1.0)
  flat = np.full_like(image, 77)
  np.testing.assert_array_equal(_op(flat, "equalize", 0.0), flat)
  np.testing.assert_array_equal(_op(flat, "autocontrast", 0.0), flat)


def test_randaugment_keeps_dtype_and_is_deterministic_under_a_seed():
  image = _image(3)
  for dtype in (tf.uint8, tf.float32):
    out = image_lib.randaugment(tf.constant(image, dtype), 2, 9.0, seed=tf.constant([1, 2]))
    assert out.dtype == dtype and out.shape == image.shape
  run = lambda seed: image_lib.randaugment(tf.constant(image), 3, 9.0, seed=tf.constant(seed))
  np.testing.assert_array_equal(run([5, 6]), run([5, 6]))
  results = [run([s, 0]).numpy() for s in range(6)]
  assert any(not np.array_equal(results[0], r) for r in results[1:])


@pytest.mark.parametrize("channels", [1, 3])
def test_randaugment_compiles_with_xla(channels):
  # One operation: the program holds every operation's branch all the same, in half the
  # compile time of two.
  augment = tf.function(lambda x, seed: image_lib.randaugment(x, 1, 15.0, seed=seed),
                        jit_compile=True)
  image = tf.constant(_image(channels))
  out = augment(image, tf.constant([3, 4]))
  assert out.dtype == tf.uint8 and out.shape == image.shape
  np.testing.assert_array_equal(out, augment(image, tf.constant([3, 4])))


def test_bad_settings_are_config_errors():
  with pytest.raises(ConfigError, match="task.randaugment_num_ops"):
    image_lib.check_randaugment(0, 9.0)
  with pytest.raises(ConfigError, match=r"task.randaugment_magnitude .* \[0, 30\]"):
    image_lib.check_randaugment(2, 31.0)
  with pytest.raises(ValueError, match="static shape"):
    image_lib.randaugment(tf.zeros([4, 4, 2]), 2, 9.0)
