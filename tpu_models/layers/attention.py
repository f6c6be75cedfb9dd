"""Attention: masks, scaled dot-product attention and the multi-head attention layer.

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

import math
from typing import Callable, Dict, List, Optional, Tuple

import keras
import tensorflow as tf

from tpu_models.layers.base import CastingLayer, dense, read_as

# Added to the scores of masked keys. Finite so that a fully masked row gives a
# uniform softmax, not NaN (NaN would poison the gradients even when masked).
MASK_BIAS = -1e9

# One decoding layer's key/value cache: {"key": [B, H, L, D], "value": [B, H, L, D]}.
LayerCache = Dict[str, tf.Tensor]


def padding_mask(ids: tf.Tensor, pad_id: int = 0) -> tf.Tensor:
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


def write_block(cache: tf.Tensor, block: tf.Tensor, index) -> tf.Tensor:
  """cache[:, :, index:index + n] = block, with a fixed-shape select.

  Args:
    cache: [B, H, L, D].
    block: [B, H, n, D] with a static n <= L.
    index: Python int or int32 scalar tensor, the first position written.
  """
  length, n = cache.shape[2], block.shape[2]
  if n == length:
    return block
  positions = tf.range(length)
  if n == 1:  # One decoding step: broadcast the new entry over the select.
    return tf.where((positions == index)[:, tf.newaxis], block, cache)
  block = tf.pad(block, [[0, 0], [0, 0], [0, length - n], [0, 0]])
  if not (isinstance(index, int) and index == 0):
    block = tf.roll(block, shift=index, axis=2)
  inside = tf.logical_and(positions >= index, positions < index + n)
  return tf.where(inside[:, tf.newaxis], block, cache)


class MultiHeadAttention(CastingLayer):
  """Multi-head attention; fused QKV (self) or Q + fused KV (cross).

  No biases by default (as Vaswani et al. 2017); `use_bias=True` adds one per
  projection ("qkv_bias" [3d] or "query_bias" [d] + "key_value_bias" [2d],
  and "output_bias" [d]), as ViT has.
  """

  def __init__(self, hidden_size: int, num_heads: int, self_attention: bool,
               attention_dropout: float = 0.0, use_bias: bool = False, **kwargs):
    super().__init__(**kwargs)
    self.use_bias = use_bias
    if hidden_size % num_heads:
      raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}.")
    self.hidden_size = hidden_size
    self.num_heads = num_heads
    self.head_size = hidden_size // num_heads
    self.self_attention = self_attention
    self.dropout = keras.layers.Dropout(attention_dropout, name="attention_dropout")
    self.attention_dropout = attention_dropout

  def build(self, input_shape=None):
    d = self.hidden_size
    # Glorot-uniform limit of one [d, d] projection, also for the fused kernels.
    init = keras.initializers.RandomUniform(-math.sqrt(3.0 / d), math.sqrt(3.0 / d))
    if self.self_attention:
      self.qkv_kernel = self.add_weight(name="qkv_kernel", shape=(d, 3 * d), initializer=init)
    else:
      self.query_kernel = self.add_weight(name="query_kernel", shape=(d, d), initializer=init)
      self.key_value_kernel = self.add_weight(name="key_value_kernel", shape=(d, 2 * d),
                                              initializer=init)
    self.output_kernel = self.add_weight(name="output_kernel", shape=(d, d), initializer=init)
    # Bias name -> variable; empty without biases (see `_project`). Each is also an
    # attribute ("qkv_bias", ...): a variable only inside a dict is not in the
    # layer's TF object graph, so tf.train.Checkpoint(model=...) (resume,
    # evaluate, export) would neither save nor restore it.
    self._biases = {}
    if self.use_bias:
      widths = ({"qkv": 3 * d} if self.self_attention else {"query": d, "key_value": 2 * d})
      for name, width in {**widths, "output": d}.items():
        bias = self.add_weight(name=f"{name}_bias", shape=(width,), initializer="zeros")
        setattr(self, f"{name}_bias", bias)
        self._biases[name] = bias

  def _project(self, x: tf.Tensor, kernel, name: str) -> tf.Tensor:
    """x [..., in] @ kernel (+ the bias `name` when the layer has biases), compute dtype."""
    out = dense(x, read_as(kernel, self.compute_dtype))
    if name in self._biases:
      out += read_as(self._biases[name], self.compute_dtype)
    return out

  # [B, T, n * d] -> n tensors [B, H, T, head_size].
  def _split_heads(self, x: tf.Tensor, n: int) -> List[tf.Tensor]:
    shape = tf.shape(x)
    x = tf.reshape(x, [shape[0], shape[1], n, self.num_heads, self.head_size])
    x = tf.transpose(x, [2, 0, 3, 1, 4])
    return tf.unstack(x, num=n, axis=0)

  def _combine_heads(self, x: tf.Tensor) -> tf.Tensor:
    """[B, H, T, head_size] -> output projection -> [B, T, d]."""
    shape = tf.shape(x)
    x = tf.reshape(tf.transpose(x, [0, 2, 1, 3]), [shape[0], shape[2], self.hidden_size])
    return self._project(x, self.output_kernel, "output")

  def _dropout_fn(self, training):
    if not training or self.attention_dropout == 0:
      return None
    return lambda p: self.dropout(p, training=True)

  def project_memory(self, memory: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """Cross-attention keys and values of the encoder output, each [B, H, S, head_size]."""
    memory = tf.cast(memory, self.compute_dtype)
    key, value = self._split_heads(self._project(memory, self.key_value_kernel, "key_value"), 2)
    return key, value

  def _query(self, x: tf.Tensor) -> tf.Tensor:
    return self._split_heads(self._project(x, self.query_kernel, "query"), 1)[0]

  def call(self, x: tf.Tensor, bias: Optional[tf.Tensor], memory: Optional[tf.Tensor] = None,
           training: bool = False) -> tf.Tensor:
    """Full-sequence attention.

    Args:
      x: [B, T, d] queries (and keys/values for self-attention).
      bias: additive float32 bias broadcastable to [B, H, T, S].
      memory: [B, S, d] encoder output (cross-attention only).
      training: enables attention dropout.

    Returns:
      [B, T, d] in the compute dtype.
    """
    x = tf.cast(x, self.compute_dtype)
    if self.self_attention:
      query, key, value = self._split_heads(self._project(x, self.qkv_kernel, "qkv"), 3)
    else:
      query = self._query(x)
      key, value = self.project_memory(memory)
    out = dot_product_attention(query, key, value, bias, self._dropout_fn(training))
    return self._combine_heads(out)

  def decode_self(self, x: tf.Tensor, bias: tf.Tensor, cache: LayerCache, index
                  ) -> Tuple[tf.Tensor, LayerCache]:
    """Self-attention of n new positions against the key/value cache (inference).

    Args:
      x: [B, n, d], the inputs at positions index .. index + n - 1.
      bias: float32 bias broadcastable to [B, H, n, L] (causal over the cache).
      cache: {"key", "value"}: [B, H, L, head_size], written at those positions.
      index: int or int32 scalar, position of x[:, 0].

    Returns:
      ([B, n, d], the updated cache).
    """
    x = tf.cast(x, self.compute_dtype)
    query, key, value = self._split_heads(self._project(x, self.qkv_kernel, "qkv"), 3)
    cache = {"key": write_block(cache["key"], tf.cast(key, cache["key"].dtype), index),
             "value": write_block(cache["value"], tf.cast(value, cache["value"].dtype), index)}
    out = dot_product_attention(
        query, tf.cast(cache["key"], query.dtype), tf.cast(cache["value"], query.dtype), bias)
    return self._combine_heads(out), cache

  def decode_cross(self, x: tf.Tensor, key: tf.Tensor, value: tf.Tensor, bias: tf.Tensor,
                   group: int = 1) -> tf.Tensor:
    """Cross-attention against pre-projected encoder keys/values (inference).

    Args:
      x: [B * group, n, d] queries; rows b * group .. b * group + group - 1
        (a search's candidates for example b) share example b's memory.
      key, value: [B, H, S, head_size] from `project_memory`.
      bias: float32 [B, 1, 1, S].
      group: number of query rows per memory row (a search's width). The
        candidates are folded into the query axis so the memory is never repeated.

    Returns:
      [B * group, n, d].
    """
    x = tf.cast(x, self.compute_dtype)
    n = x.shape[1]
    query = self._project(x, self.query_kernel, "query")  # [B*g, n, d]
    query = tf.reshape(query, [-1, group * n, self.num_heads, self.head_size])
    query = tf.transpose(query, [0, 2, 1, 3])  # [B, H, g*n, hs]
    out = dot_product_attention(query, key, value, bias)  # [B, H, g*n, hs]
    out = tf.reshape(tf.transpose(out, [0, 2, 1, 3]), [-1, n, self.hidden_size])
    return self._project(out, self.output_kernel, "output")
