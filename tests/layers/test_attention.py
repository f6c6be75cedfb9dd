"""Tests of the attention masks and scaled dot-product attention (tpu_models/layers/attention.py)."""

import numpy as np
import pytest
import tensorflow as tf

from tpu_models.layers import attention


def test_padding_mask_marks_real_keys():
  ids = tf.constant([[5, 3, 0, 0], [7, 0, 0, 0]])
  mask = attention.padding_mask(ids)
  assert mask.shape == (2, 1, 1, 4)
  np.testing.assert_array_equal(mask[:, 0, 0].numpy(),
                                [[True, True, False, False], [True, False, False, False]])


def test_causal_mask_full_and_with_offset():
  full = attention.causal_mask(3).numpy()
  assert full.shape == (1, 1, 3, 3)
  np.testing.assert_array_equal(full[0, 0], np.tril(np.ones((3, 3), bool)))
  # One decoding step at position 2 against a cache of 5: keys 0..2 visible.
  step = attention.causal_mask(1, 5, query_offset=tf.constant(2)).numpy()
  np.testing.assert_array_equal(step[0, 0], [[True, True, True, False, False]])
  # A block of 2 queries at positions 1 and 2.
  block = attention.causal_mask(2, 4, query_offset=1).numpy()
  np.testing.assert_array_equal(block[0, 0], [[True, True, False, False],
                                              [True, True, True, False]])


def test_segment_mask_blocks_other_examples_and_padding():
  query_segments = tf.constant([[1, 1, 2, 2, 0]])
  key_segments = tf.constant([[1, 2, 2, 0]])
  mask = attention.segment_mask(query_segments, key_segments).numpy()
  assert mask.shape == (1, 1, 5, 4)
  np.testing.assert_array_equal(mask[0, 0], [[True, False, False, False],
                                             [True, False, False, False],
                                             [False, True, True, False],
                                             [False, True, True, False],
                                             [False, False, False, False]])


def test_mask_to_bias_is_zero_or_large_negative():
  bias = attention.mask_to_bias(tf.constant([True, False])).numpy()
  assert bias.dtype == np.float32
  np.testing.assert_array_equal(bias, [0.0, attention.MASK_BIAS])


def _reference_attention(q, k, v, bias):
  scores = np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1]) + bias
  scores -= scores.max(-1, keepdims=True)
  weights = np.exp(scores)
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum("bhqk,bhkd->bhqd", weights, v)


def test_dot_product_attention_matches_numpy_and_ignores_masked_keys():
  rng = np.random.default_rng(0)
  q, k, v = (rng.normal(size=(2, 3, 4, 8)).astype(np.float32) for _ in range(3))
  mask = tf.logical_and(attention.causal_mask(4),
                        attention.padding_mask(tf.constant([[4, 5, 6, 0], [4, 5, 0, 0]])))
  bias = attention.mask_to_bias(mask)
  out = attention.dot_product_attention(q, k, v, bias).numpy()
  np.testing.assert_allclose(out, _reference_attention(q, k, v, bias.numpy()), rtol=1e-5,
                             atol=1e-5)
  # Garbage in masked keys/values changes nothing.
  k2, v2 = k.copy(), v.copy()
  k2[1, :, 2:] = 1e3
  v2[1, :, 2:] = -1e3
  out2 = attention.dot_product_attention(q, k2, v2, bias).numpy()
  np.testing.assert_allclose(out2[1, :, :2], out[1, :, :2], rtol=1e-6)


def test_fully_masked_row_is_finite():
  q = k = v = tf.ones([1, 1, 2, 4])
  bias = attention.mask_to_bias(tf.zeros([1, 1, 2, 2], tf.bool))
  out = attention.dot_product_attention(q, k, v, bias)
  assert np.isfinite(out.numpy()).all()


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16])
def test_half_precision_attention_keeps_the_softmax_in_float32(dtype):
  rng = np.random.default_rng(1)
  q, k, v = (rng.normal(size=(1, 2, 3, 8)).astype(np.float32) for _ in range(3))
  # The bias holds -1e9, which is -inf in float16: the softmax must not see it in fp16.
  bias = attention.mask_to_bias(attention.causal_mask(3))
  out = attention.dot_product_attention(tf.cast(q, dtype), tf.cast(k, dtype), tf.cast(v, dtype),
                                        bias)
  assert out.dtype == dtype
  assert np.isfinite(tf.cast(out, tf.float32).numpy()).all()
  tolerance = 5e-2 if dtype == tf.bfloat16 else 5e-3
  np.testing.assert_allclose(tf.cast(out, tf.float32).numpy(),
                             _reference_attention(q, k, v, bias.numpy()), atol=tolerance)
