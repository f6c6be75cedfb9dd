"""Attention masks and scaled dot-product attention, shared by every model.

Masks are boolean, True where a query may attend to a key, with shape
[batch or 1, 1, query_length, key_length] so they broadcast over the heads of
[batch, heads, query_length, key_length] scores. Combine them with
`tf.logical_and` (broadcasting does the rest) and turn the result into an
additive float32 bias once per forward pass with `mask_to_bias`:

    mask = tf.logical_and(causal_mask(length), segment_mask(segments, segments))
    bias = mask_to_bias(mask)                                 # [B, 1, T, T] float32
    out = dot_product_attention(query, key, value, bias)      # [B, H, T, D]

Token conventions: id 0 is padding; segment id 0 is padding and segments
1, 2, ... are the examples packed into one row. A row whose every key is masked
(a padding query under a segment mask) gets a uniform softmax over the masked
keys instead of NaN, because the bias is a large finite negative number; such
rows are padding and never reach a loss.
"""

from typing import Callable, Optional

import tensorflow as tf

from tpu_models.text.inputs import PAD_ID

# Added to the scores of masked keys. Finite so that a fully masked row gives a
# uniform softmax, not NaN (NaN would poison the gradients even when masked).
MASK_BIAS = -1e9


def padding_mask(ids: tf.Tensor, pad_id: int = PAD_ID) -> tf.Tensor:
  """Keys that are not padding.

  Args:
    ids: int [batch, key_length] token ids of the keys.
    pad_id: the padding id.

  Returns:
    bool [batch, 1, 1, key_length]: True where ids != pad_id.
  """
  return tf.not_equal(ids, pad_id)[:, tf.newaxis, tf.newaxis, :]


def causal_mask(query_length: int, key_length: Optional[int] = None,
                query_offset=0) -> tf.Tensor:
  """Each query sees the keys at its own position and before.

  Query j sits at absolute position `query_offset + j`, key k at position k,
  so the same function masks a full sequence (offset 0, key_length =
  query_length) and an incremental decoding step against a key/value cache
  (query_length 1, key_length = cache length, offset = the step).

  Args:
    query_length: number of queries (static int or scalar int tensor).
    key_length: number of keys; defaults to `query_length`.
    query_offset: int or scalar int32 tensor, position of the first query.

  Returns:
    bool [1, 1, query_length, key_length].
  """
  key_length = query_length if key_length is None else key_length
  query_positions = tf.range(query_length, dtype=tf.int32) + tf.cast(query_offset, tf.int32)
  key_positions = tf.range(key_length, dtype=tf.int32)
  mask = key_positions[tf.newaxis, :] <= query_positions[:, tf.newaxis]
  return mask[tf.newaxis, tf.newaxis]


def segment_mask(query_segment_ids: tf.Tensor, key_segment_ids: tf.Tensor) -> tf.Tensor:
  """Queries see only keys of the same packed example, never padding.

  Args:
    query_segment_ids: int [batch, query_length], 0 = padding, 1, 2, ... =
      the examples packed in the row.
    key_segment_ids: int [batch, key_length], same convention (for
      cross-attention, the encoder's segment ids: example n of the targets
      attends to example n of the inputs).

  Returns:
    bool [batch, 1, query_length, key_length]: True where the segments are
    equal and the key is not padding.
  """
  same = tf.equal(query_segment_ids[:, :, tf.newaxis], key_segment_ids[:, tf.newaxis, :])
  real_key = tf.not_equal(key_segment_ids, 0)[:, tf.newaxis, :]
  return tf.logical_and(same, real_key)[:, tf.newaxis]


def mask_to_bias(mask: tf.Tensor, dtype=tf.float32) -> tf.Tensor:
  """Boolean mask -> additive bias: 0 where True, `MASK_BIAS` where False.

  Args:
    mask: bool tensor (any shape, usually [B or 1, 1, Tq, Tk]).
    dtype: dtype of the bias; keep float32 (the softmax runs in float32).

  Returns:
    A `dtype` tensor shaped like `mask`.
  """
  return tf.where(mask, tf.constant(0.0, dtype), tf.constant(MASK_BIAS, dtype))


def dot_product_attention(query: tf.Tensor, key: tf.Tensor, value: tf.Tensor,
                          bias: Optional[tf.Tensor] = None,
                          dropout: Optional[Callable[[tf.Tensor], tf.Tensor]] = None
                          ) -> tf.Tensor:
  """softmax(query key^T / sqrt(depth) + bias) value, the softmax in float32.

  Args:
    query: [batch, heads, query_length, depth], float (the compute dtype).
    key: [batch, heads, key_length, depth], same dtype.
    value: [batch, heads, key_length, value_depth], same dtype.
    bias: optional additive bias broadcastable to
      [batch, heads, query_length, key_length] (float32, see `mask_to_bias`).
    dropout: optional function applied to the attention probabilities
      (attention dropout, e.g. a bound `keras.layers.Dropout`).

  Returns:
    [batch, heads, query_length, value_depth] in the dtype of `query`.
  """
  depth = query.shape[-1]
  # Scale the smaller operand (the queries) before the product.
  query = query * tf.cast(depth ** -0.5, query.dtype)
  scores = tf.matmul(query, key, transpose_b=True)
  # Softmax in float32 under mixed precision: bf16/fp16 scores lose the
  # differences between large logits and the masked bias overflows fp16.
  scores = tf.cast(scores, tf.float32)
  if bias is not None:
    scores += tf.cast(bias, tf.float32)
  probabilities = tf.cast(tf.nn.softmax(scores, axis=-1), value.dtype)
  if dropout is not None:
    probabilities = dropout(probabilities)
  return tf.matmul(probabilities, value)
