"""Transformer (Vaswani et al. 2017): encoder-decoder for translation, decoder-only LM.

Registered builders (keyword arguments are the model config; `vocab_size` is
required):

  transformer          encoder-decoder with every knob (defaults = base).
  transformer_tiny     d 256, 3+3 layers, 4 heads, FFN 1024 (2 CPU cores).
  transformer_base     d 512, 6+6 layers, 8 heads, FFN 2048, dropout 0.1.
  transformer_big      d 1024, 6+6 layers, 16 heads, FFN 4096, dropout 0.3.
  transformer_lm       decoder-only language model with every knob.
  transformer_lm_tiny  d 256, 4 layers, 4 heads, FFN 1024.
  transformer_lm_small d 512, 6 layers, 8 heads, FFN 2048.

Vocabulary convention: id 0 is padding and also the decoder's start token
(there is no BOS), id 1 is EOS, id 2 UNK.

    model = create_model("transformer_base", vocab_size=32000)
    logits = model({"inputs": src, "targets": tgt}, training=True)   # [B, T, V] f32
    out = model.translate(src, beam_size=4, alpha=0.6)  # {"ids": [B, L], "scores": [B]}

    lm = create_model("transformer_lm_tiny", vocab_size=8000)
    logits = lm({"targets": ids})                        # [B, T, V] float32
    ids = lm.generate(prompt, max_new_tokens=20)         # [B, P + 20] int32

Features (int32, 0 = padding): "inputs" [B, S] and "targets" [B, T] (ids
ending in EOS). logits[:, t] predicts targets[:, t]: the decoder reads the
targets shifted right by one with 0 as the start token. Packed rows (several
examples per row) add "inputs_segment_ids", "targets_segment_ids" (1, 2, ...
per example, 0 = padding) and optionally "inputs_positions",
"targets_positions" (the position inside each example); then attention never
crosses examples, target example n attends to input example n, the shift
restarts at every example, and each example gets the logits it would get
alone.

Architecture (Tensor2Tensor / Model Garden `Seq2SeqTransformer`):
embeddings N(0, d^-1/2) scaled by sqrt(d), encoder padding embeddings zeroed;
sinusoidal positions (sin on the first half of the channels, cos on the
second); attention projections without bias; FFN dense -> activation ->
dense with biases; LayerNorm epsilon 1e-6. `pre_layer_norm=True` (default, the
current reference recipes) normalises each sublayer's input and each stack's
output; False is the paper's post-LN (normalise after each residual add, no
final norm). With `share_embeddings` one [V, d] matrix is the source
embedding, the target embedding and the softmax weights (logits = x E^T);
otherwise there are three matrices. Dropout: `dropout` on the embeddings and
on each sublayer output before its residual add, `attention_dropout` on the
attention probabilities, `activation_dropout` after the FFN activation.

Variables have fixed paths ("transformer/encoder_layer_0/self_attention/
qkv_kernel", ...). Self-attention keeps Q, K and V in one [d, 3d] kernel
(columns: Q | K | V, heads contiguous inside each); cross-attention has a
[d, d] query and a [d, 2d] key_value kernel (K | V). A Model Garden
[d, heads, depth] kernel is this matrix's block reshaped to [d, d].

Mixed precision: layers compute in the policy's compute dtype (bfloat16 /
float16); the attention softmax, LayerNorm statistics and the logits are
float32. LayerNorm and GELU are Keras' in value, with hand-written gradients
(`fused.py`: the step of a small model is bound by elementwise passes).

Decoding (`translate`, `generate`) is pure TF with static shapes: a
pre-allocated key/value cache [batch, heads, max_length, depth] per layer,
written one position per step with a select, and padded outputs. Both compile
inside `tf.function(jit_compile=True)` (eval steps, serving signatures).
"""

import dataclasses
import inspect
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import keras
import tensorflow as tf

from tpu_models.text import attention as attention_ops
from tpu_models.text import beam_search as beam_search_ops
from tpu_models.text import fused
from tpu_models.builders import preset
from tpu_models.text.inputs import EOS_ID, PAD_ID
from tpu_models.registry import register_model

LAYER_NORM_EPSILON = 1e-6
DEFAULT_EXTRA_DECODE_LENGTH = 50  # translate(): decode up to input length + this.
GENERATE_METHODS = ("greedy", "top_k")

# One decoder layer's key/value cache: {"key": [B, H, L, D], "value": [B, H, L, D]}.
LayerCache = Dict[str, tf.Tensor]


# ----------------------------------------------------------------------------
# Positions, shifting, small helpers.


def sinusoidal_position_encoding(positions: tf.Tensor, hidden_size: int,
                                 min_timescale: float = 1.0,
                                 max_timescale: float = 1.0e4) -> tf.Tensor:
  """Sinusoids of geometric wavelengths (Vaswani et al. 2017, Tensor2Tensor layout).

  Args:
    positions: int tensor of any shape [...] (token positions; with packing
      the position inside each example).
    hidden_size: number of channels; the first half are sines, the second
      half cosines (an odd size gets one zero channel at the end).
    min_timescale, max_timescale: the shortest and longest wavelengths / 2 pi.

  Returns:
    float32 [..., hidden_size].
  """
  num_timescales = hidden_size // 2
  log_increment = math.log(max_timescale / min_timescale) / max(num_timescales - 1, 1)
  inverse_timescales = min_timescale * tf.exp(
      tf.range(num_timescales, dtype=tf.float32) * -log_increment)
  # expand_dims, not [..., tf.newaxis]: tf2onnx cannot convert that slice of a scalar.
  scaled_time = tf.expand_dims(tf.cast(positions, tf.float32), -1) * inverse_timescales
  signal = tf.concat([tf.sin(scaled_time), tf.cos(scaled_time)], axis=-1)
  if hidden_size % 2:
    signal = tf.pad(signal, [[0, 0]] * (signal.shape.rank - 1) + [[0, 1]])
  return signal


def shift_right(targets: tf.Tensor, segment_ids: Optional[tf.Tensor] = None) -> tf.Tensor:
  """Decoder inputs: targets moved one step right with 0 (the start token) first.

  Args:
    targets: int [B, T].
    segment_ids: optional int [B, T] of packed rows; the shift then restarts
      at each example (its first position gets 0, never the previous
      example's last token).

  Returns:
    int [B, T] of the dtype of `targets`.
  """
  shifted = tf.pad(targets, [[0, 0], [1, 0]])[:, :-1]
  if segment_ids is not None:
    previous_segment = tf.pad(segment_ids, [[0, 0], [1, 0]])[:, :-1]
    shifted = tf.where(tf.equal(previous_segment, segment_ids), shifted,
                       tf.zeros_like(shifted))
  return shifted


def _default_positions(ids: tf.Tensor) -> tf.Tensor:
  return tf.range(tf.shape(ids)[1])[tf.newaxis, :]


def _cast(variable, dtype) -> tf.Tensor:
  """A variable read in `dtype` (explicit, so methods called outside
  `Layer.__call__`, like the decoding steps, honour mixed precision too)."""
  return tf.cast(tf.convert_to_tensor(variable), dtype)


def _dense(x: tf.Tensor, kernel: tf.Tensor) -> tf.Tensor:
  """x [..., in] @ kernel [in, out] as one 2-D matmul."""
  shape = tf.shape(x)
  out = tf.matmul(tf.reshape(x, [-1, kernel.shape[0]]), kernel)
  return tf.reshape(out, tf.concat([shape[:-1], [kernel.shape[1]]], 0))


def _write_block(cache: tf.Tensor, block: tf.Tensor, index) -> tf.Tensor:
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


def _mix32(h: tf.Tensor) -> tf.Tensor:
  """MurmurHash3's 32-bit finaliser: a bijective avalanche mix of uint32 values."""
  h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, 16))
  h = h * tf.constant(0x85EBCA6B, tf.uint32)
  h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, 13))
  h = h * tf.constant(0xC2B2AE35, tf.uint32)
  return tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, 16))


def _gumbel_noise(seed: tf.Tensor, step: tf.Tensor, shape: tf.Tensor) -> tf.Tensor:
  """Gumbel(0, 1) noise [B, V] from a counter hash of (seed, step, row, column).

  argmax(logits + noise) samples from softmax(logits). TF's stateless random
  ops give other numbers under XLA than in TF kernels for the same seed; this
  integer hash gives the same numbers eagerly, in graphs and compiled, so a
  seeded generation is reproducible on every device.
  """
  key = _mix32(tf.bitwise.bitwise_xor(
      tf.cast(seed, tf.uint32), _mix32(tf.cast(step, tf.uint32) + tf.constant(0x9E3779B9,
                                                                             tf.uint32))))
  counter = tf.range(shape[0])[:, tf.newaxis] * shape[1] + tf.range(shape[1])[tf.newaxis, :]
  bits = _mix32(_mix32(tf.bitwise.bitwise_xor(tf.cast(counter, tf.uint32), key)) + key)
  # 24 random bits -> a uniform in (0, 1), never 0 or 1.
  uniform = (tf.cast(tf.bitwise.right_shift(bits, 8), tf.float32) + 0.5) * (2.0 ** -24)
  return -tf.math.log(-tf.math.log(uniform))


# ----------------------------------------------------------------------------
# Layers. Each creates its variables in build(), which the model calls at
# construction, so variables exist (with nested paths) before the first call.


class _Layer(keras.layers.Layer):
  """A layer that casts its own inputs and variables.

  Keras would cast every float argument to the compute dtype, including the
  float32 attention biases (-1e9 is -inf in float16); these layers cast
  explicitly instead, which also makes their decoding methods (called outside
  `__call__`) correct under mixed precision.
  """

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self._convert_input_args = False


class TokenEmbedding(_Layer):
  """A [vocab, d] matrix used as an input embedding (scaled by sqrt(d)) and/or softmax."""

  def __init__(self, vocab_size: int, hidden_size: int, **kwargs):
    # No autocast: the gather reads the float32 rows, then casts only those.
    super().__init__(autocast=False, **kwargs)
    self.vocab_size = vocab_size
    self.hidden_size = hidden_size

  def build(self, input_shape=None):
    self.embeddings = self.add_weight(
        name="embeddings", shape=(self.vocab_size, self.hidden_size),
        initializer=keras.initializers.RandomNormal(stddev=self.hidden_size ** -0.5))

  def call(self, ids: tf.Tensor) -> tf.Tensor:
    """int [...] -> [..., d] in the compute dtype, times sqrt(d)."""
    # Gather first, cast after: only the rows used are converted.
    x = tf.cast(tf.gather(tf.convert_to_tensor(self.embeddings), ids), self.compute_dtype)
    return x * tf.cast(self.hidden_size ** 0.5, self.compute_dtype)

  def logits(self, x: tf.Tensor) -> tf.Tensor:
    """[..., d] -> float32 [..., vocab] = x E^T (matmul in the compute dtype)."""
    x = tf.cast(x, self.compute_dtype)
    shape = tf.shape(x)
    logits = tf.matmul(tf.reshape(x, [-1, self.hidden_size]),
                       _cast(self.embeddings, self.compute_dtype), transpose_b=True)
    logits = tf.reshape(logits, tf.concat([shape[:-1], [self.vocab_size]], 0))
    return tf.cast(logits, tf.float32)


class MultiHeadAttention(_Layer):
  """Multi-head attention; fused QKV (self) or Q + fused KV (cross).

  No biases by default (the Transformer's); `use_bias=True` adds one per
  projection ("qkv_bias" [3d] or "query_bias" [d] + "key_value_bias" [2d],
  and "output_bias" [d]), as the Vision Transformer has.
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
    out = _dense(x, _cast(kernel, self.compute_dtype))
    if name in self._biases:
      out += _cast(self._biases[name], self.compute_dtype)
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
    out = attention_ops.dot_product_attention(query, key, value, bias,
                                              self._dropout_fn(training))
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
    cache = {"key": _write_block(cache["key"], tf.cast(key, cache["key"].dtype), index),
             "value": _write_block(cache["value"], tf.cast(value, cache["value"].dtype), index)}
    out = attention_ops.dot_product_attention(
        query, tf.cast(cache["key"], query.dtype), tf.cast(cache["value"], query.dtype), bias)
    return self._combine_heads(out), cache

  def decode_cross(self, x: tf.Tensor, key: tf.Tensor, value: tf.Tensor, bias: tf.Tensor,
                   group: int = 1) -> tf.Tensor:
    """Cross-attention against pre-projected encoder keys/values (inference).

    Args:
      x: [B * group, n, d] queries; rows b * group .. b * group + group - 1
        (the beams of example b) share example b's memory.
      key, value: [B, H, S, head_size] from `project_memory`.
      bias: float32 [B, 1, 1, S].
      group: number of query rows per memory row (the beam size). The beams
        are folded into the query axis so the memory is never repeated.

    Returns:
      [B * group, n, d].
    """
    x = tf.cast(x, self.compute_dtype)
    n = x.shape[1]
    query = self._project(x, self.query_kernel, "query")  # [B*g, n, d]
    query = tf.reshape(query, [-1, group * n, self.num_heads, self.head_size])
    query = tf.transpose(query, [0, 2, 1, 3])  # [B, H, g*n, hs]
    out = attention_ops.dot_product_attention(query, key, value, bias)  # [B, H, g*n, hs]
    out = tf.reshape(tf.transpose(out, [0, 2, 1, 3]), [-1, n, self.hidden_size])
    return self._project(out, self.output_kernel, "output")


class FeedForward(_Layer):
  """dense(filter_size) -> activation -> dropout -> dense(hidden_size), with biases."""

  def __init__(self, hidden_size: int, filter_size: int, activation: str = "relu",
               activation_dropout: float = 0.0, **kwargs):
    super().__init__(**kwargs)
    self.hidden_size = hidden_size
    self.filter_size = filter_size
    self.activation_name = activation
    # The exact GELU with its one-pass gradient (tpu_models/text/fused.py).
    self.activation = fused.gelu if activation == "gelu" else keras.activations.get(activation)
    self.dropout = keras.layers.Dropout(activation_dropout, name="activation_dropout")
    self.activation_dropout = activation_dropout

  def build(self, input_shape=None):
    glorot = keras.initializers.GlorotUniform()
    self.inner_kernel = self.add_weight(name="inner_kernel",
                                        shape=(self.hidden_size, self.filter_size),
                                        initializer=glorot)
    self.inner_bias = self.add_weight(name="inner_bias", shape=(self.filter_size,),
                                      initializer="zeros")
    self.outer_kernel = self.add_weight(name="outer_kernel",
                                        shape=(self.filter_size, self.hidden_size),
                                        initializer=glorot)
    self.outer_bias = self.add_weight(name="outer_bias", shape=(self.hidden_size,),
                                      initializer="zeros")

  def call(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
    dtype = self.compute_dtype
    x = tf.cast(x, dtype)
    h = self.activation(_dense(x, _cast(self.inner_kernel, dtype)) + _cast(self.inner_bias, dtype))
    if training and self.activation_dropout > 0:
      h = self.dropout(h, training=True)
    return _dense(h, _cast(self.outer_kernel, dtype)) + _cast(self.outer_bias, dtype)


def norm_layer(name: str) -> keras.layers.LayerNormalization:
  """The family's LayerNorm (epsilon 1e-6, last axis; hand-written gradient, fused.py).

  Every block's and stack's norm, and ViT's, is built here.
  """
  return fused.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name=name)


class _Sublayer(_Layer):
  """Shared residual wiring: pre-LN x + f(LN(x)), or post-LN LN(x + f(x))."""

  def __init__(self, hidden_size: int, dropout: float, pre_layer_norm: bool, **kwargs):
    super().__init__(**kwargs)
    self.hidden_size = hidden_size
    self.pre_layer_norm = pre_layer_norm
    self.residual_dropout = keras.layers.Dropout(dropout, name="residual_dropout")
    self.dropout_rate = dropout

  def _build_norms(self, norms):
    for norm in norms:
      norm.build((None, self.hidden_size))

  def _residual(self, x, norm, fn, training):
    """Applies one sublayer `fn` around the residual `x` with its `norm`."""
    if self.pre_layer_norm:
      y = fn(norm(x))
    else:
      y = fn(x)
    if training and self.dropout_rate > 0:
      y = self.residual_dropout(y, training=True)
    x = x + tf.cast(y, x.dtype)
    return x if self.pre_layer_norm else norm(x)


class DecoderLayer(_Sublayer):
  """Causal self-attention, cross-attention (encoder-decoder only), FFN.

  `attention_bias` gives the attention projections biases (`MultiHeadAttention`'s
  `use_bias`; the Vision Transformer's); the Transformer's have none.
  """

  def __init__(self, hidden_size, num_heads, filter_size, dropout, attention_dropout,
               activation_dropout, activation, pre_layer_norm, cross_attention: bool = True,
               attention_bias: bool = False, **kwargs):
    super().__init__(hidden_size, dropout, pre_layer_norm, **kwargs)
    self.self_attention = MultiHeadAttention(hidden_size, num_heads, True, attention_dropout,
                                             use_bias=attention_bias, name="self_attention")
    self.self_attention_norm = norm_layer("self_attention_norm")
    self.has_cross_attention = cross_attention
    if cross_attention:
      self.cross_attention = MultiHeadAttention(hidden_size, num_heads, False, attention_dropout,
                                                use_bias=attention_bias, name="cross_attention")
      self.cross_attention_norm = norm_layer("cross_attention_norm")
    self.ffn = FeedForward(hidden_size, filter_size, activation, activation_dropout, name="ffn")
    self.ffn_norm = norm_layer("ffn_norm")

  def build(self, input_shape=None):
    self.self_attention.build()
    norms = [self.self_attention_norm, self.ffn_norm]
    if self.has_cross_attention:
      self.cross_attention.build()
      norms.append(self.cross_attention_norm)
    self.ffn.build()
    self._build_norms(norms)

  def call(self, x, self_bias, memory=None, cross_bias=None, training=False):
    x = self._residual(x, self.self_attention_norm,
                       lambda h: self.self_attention(h, self_bias, training=training), training)
    if self.has_cross_attention:
      x = self._residual(
          x, self.cross_attention_norm,
          lambda h: self.cross_attention(h, cross_bias, memory=memory, training=training),
          training)
    return self._residual(x, self.ffn_norm, lambda h: self.ffn(h, training=training), training)

  def decode(self, x, self_bias, cache: LayerCache, index, cross_key=None, cross_value=None,
             cross_bias=None, group: int = 1) -> Tuple[tf.Tensor, LayerCache]:
    """Inference on n new positions with the key/value cache (no dropout)."""
    new_cache = {}

    def self_attention(h):
      out, cache_out = self.self_attention.decode_self(h, self_bias, cache, index)
      new_cache.update(cache_out)
      return out

    x = self._residual(x, self.self_attention_norm, self_attention, False)
    if self.has_cross_attention:
      x = self._residual(
          x, self.cross_attention_norm,
          lambda h: self.cross_attention.decode_cross(h, cross_key, cross_value, cross_bias,
                                                      group), False)
    x = self._residual(x, self.ffn_norm, lambda h: self.ffn(h, training=False), False)
    return x, new_cache


class EncoderLayer(DecoderLayer):
  """Self-attention + FFN: a decoder layer without cross-attention (same variables and order).

  Whether attention is causal is the bias's business: the encoder passes a
  padding (or segment) bias, the decoder a causal one.
  """

  def __init__(self, *args, **kwargs):
    super().__init__(*args, cross_attention=False, **kwargs)

  def call(self, x, bias, training=False):
    return super().call(x, bias, training=training)


# ----------------------------------------------------------------------------
# Models.


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """The architecture both Transformers share: with the stack depths, the builders' arguments.

  Defaults are the base size. Attributes:
    vocab_size: shared source/target vocabulary size (0 = pad, 1 = EOS).
    hidden_size: model width d (embeddings, residual stream).
    num_heads: attention heads (must divide hidden_size).
    filter_size: FFN inner width.
    dropout: on the embeddings and on every sublayer output (residual dropout).
    attention_dropout: on the attention probabilities.
    activation_dropout: after the FFN activation (Tensor2Tensor's relu_dropout).
    activation: FFN activation, a Keras activation name ("relu", "gelu").
    share_embeddings: one matrix for the embeddings (source and target) and the
      softmax; False: a matrix each.
    pre_layer_norm: True = pre-LN (norm before each sublayer, plus a final
      norm per stack); False = post-LN (the paper).
    max_length: longest sequence the model decodes (`translate`'s and
      `generate`'s cap: prompt + generated tokens).
  """
  vocab_size: int
  hidden_size: int = 512
  num_heads: int = 8
  filter_size: int = 2048
  dropout: float = 0.1
  attention_dropout: float = 0.1
  activation_dropout: float = 0.1
  activation: str = "relu"
  share_embeddings: bool = True
  pre_layer_norm: bool = True
  max_length: int = 256

  def layer_kwargs(self) -> Dict[str, Any]:
    """The keyword arguments of `EncoderLayer` and `DecoderLayer`."""
    return {k: getattr(self, k) for k in ("hidden_size", "num_heads", "filter_size", "dropout",
                                          "attention_dropout", "activation_dropout",
                                          "activation", "pre_layer_norm")}


def _validate_config(config: Dict[str, Any]) -> None:
  for key in ("vocab_size", "hidden_size", "num_heads", "filter_size", "max_length"):
    value = config[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ValueError(f"Transformer {key} must be a positive int, got {value!r}.")
  for key in ("dropout", "attention_dropout", "activation_dropout"):
    if not 0.0 <= config[key] < 1.0:
      raise ValueError(f"Transformer {key} must be in [0, 1), got {config[key]!r}.")
  if config["hidden_size"] % config["num_heads"]:
    raise ValueError(f"Transformer hidden_size {config['hidden_size']} must be divisible by "
                     f"num_heads {config['num_heads']}.")
  if config["vocab_size"] <= EOS_ID:
    raise ValueError(f"vocab_size {config['vocab_size']} must include padding (0) and EOS (1).")


def _check_ids(features: Dict[str, tf.Tensor], key: str) -> tf.Tensor:
  if key not in features:
    raise KeyError(f"Transformer features need {key!r} (int32 [batch, length], 0 = padding); "
                   f"got keys {sorted(features)}.")
  ids = tf.convert_to_tensor(features[key])
  if ids.shape.rank != 2 or not ids.dtype.is_integer:
    raise ValueError(f"Feature {key!r} must be an int tensor [batch, length], got "
                     f"{ids.dtype.name} of shape {ids.shape}.")
  return ids


class _TransformerBase(keras.Model):
  """Pieces shared by the encoder-decoder and the language model."""

  def _init_config(self, architecture: TransformerConfig, **depths: int):
    """Checks and keeps the architecture and the stack depths (`get_config`)."""
    for key, value in depths.items():
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"Transformer {key} must be a positive int, got {value!r}.")
    config = dataclasses.asdict(architecture)
    config = {"vocab_size": config.pop("vocab_size"), **depths, **config}
    _validate_config(config)
    self._config = config
    self.vocab_size = config["vocab_size"]
    self.hidden_size = config["hidden_size"]
    self.num_heads = config["num_heads"]
    self.max_length = config["max_length"]
    self.pre_layer_norm = config["pre_layer_norm"]
    self.embedding_dropout = keras.layers.Dropout(config["dropout"], name="embedding_dropout")

  def get_config(self):
    return dict(self._config)

  # Layers are attributes named like the layers (never lists): TensorFlow's
  # checkpoint object graph does not follow Keras-tracked lists, so a list of
  # layers would silently be left out of `tf.train.Checkpoint(model=...)`.

  def _set_layers(self, prefix: str, layers) -> None:
    for i, layer in enumerate(layers):
      setattr(self, f"{prefix}_{i}", layer)

  def _get_layers(self, prefix: str, count: int) -> list:
    return [getattr(self, f"{prefix}_{i}") for i in range(count)]

  @property
  def decoder_layers(self) -> List["DecoderLayer"]:
    return self._get_layers("decoder_layer", self._num_decoder_layers)

  @property
  def _embeddings(self) -> List[TokenEmbedding]:
    """The distinct embedding matrices."""
    unique = []
    for name in ("source_embedding", "target_embedding", "softmax_embedding"):
      embedding = getattr(self, name, None)
      if embedding is not None and all(embedding is not e for e in unique):
        unique.append(embedding)
    return unique

  def _embed(self, embedding: TokenEmbedding, ids, positions, training, zero_padding=False):
    x = embedding(ids)
    if zero_padding:
      x *= tf.cast(tf.not_equal(ids, PAD_ID), x.dtype)[..., tf.newaxis]
    x += tf.cast(sinusoidal_position_encoding(positions, self.hidden_size), x.dtype)
    if training and self._config["dropout"] > 0:
      x = self.embedding_dropout(x, training=True)
    return x

  def _decoder_stack_full(self, layers, norm, x, self_bias, memory=None, cross_bias=None,
                          training=False):
    for layer in layers:
      x = layer(x, self_bias, memory, cross_bias, training=training)
    return norm(x) if self.pre_layer_norm else x

  def init_cache(self, batch_size, length: int) -> Dict[str, LayerCache]:
    """Zero key/value cache for the decoding steps: per layer [batch, heads, length,
    head_size] (`decode_step` of a TransformerModel, `decode` of a TransformerLM)."""
    return self._empty_cache(len(self.decoder_layers), batch_size, length)

  def _empty_cache(self, num_layers: int, batch_size, length: int) -> Dict[str, LayerCache]:
    shape = [batch_size, self.num_heads, length, self.hidden_size // self.num_heads]
    return {f"layer_{i}": {"key": tf.zeros(shape, self.compute_dtype),
                           "value": tf.zeros(shape, self.compute_dtype)}
            for i in range(num_layers)}

  def _decode_positions(self, layers, norm, cache, x, index, cache_length: int,
                        cross=None, group: int = 1):
    """Runs the decoder stack on x [B, n, d] at positions index.. with the cache."""
    n = x.shape[1]
    self_bias = attention_ops.mask_to_bias(attention_ops.causal_mask(n, cache_length, index))
    new_cache = {}
    for i, layer in enumerate(layers):
      cross_kwargs = {}
      if cross is not None:
        key, value, bias = cross[i]
        cross_kwargs = dict(cross_key=key, cross_value=value, cross_bias=bias, group=group)
      x, new_cache[f"layer_{i}"] = layer.decode(x, self_bias, cache[f"layer_{i}"], index,
                                                **cross_kwargs)
    return (norm(x) if self.pre_layer_norm else x), new_cache


def search(symbols_to_logits_fn: beam_search_ops.SymbolsToLogitsFn, batch_size, cache,
           vocab_size: int, *, beam_size: int, alpha: float, max_decode_length: int,
           eos_id: int = EOS_ID) -> Dict[str, tf.Tensor]:
  """`translate`'s search over any step function: beam search, or greedy for beam 1.

  Args:
    symbols_to_logits_fn: beam_search.py's step contract (a model's decoder, or a
      deployed decoder step run by its own runtime).
    batch_size: B, the number of inputs (int or int32 scalar).
    cache: the step function's initial cache, [B, ...] per tensor.
    vocab_size, beam_size, max_decode_length: Python ints; alpha: the GNMT length penalty.
    eos_id: the end-of-sequence id.

  Returns:
    `translate`'s {"ids": int32 [B, max_decode_length], "scores": float32 [B]}.
  """
  initial_ids = tf.fill([batch_size], PAD_ID)
  if beam_size == 1:
    ids, scores = beam_search_ops.greedy_search(
        symbols_to_logits_fn, initial_ids, cache, vocab_size, max_decode_length, eos_id,
        alpha=alpha)
  else:
    ids, scores = beam_search_ops.sequence_beam_search(
        symbols_to_logits_fn, initial_ids, cache, vocab_size, beam_size, alpha,
        max_decode_length, eos_id)
    ids, scores = ids[:, 0], scores[:, 0]
  ids = ids[:, 1:]
  after_eos = tf.cumsum(tf.cast(tf.equal(ids, eos_id), tf.int32), axis=1) > 0
  return {"ids": tf.where(after_eos, tf.zeros_like(ids), ids),
          "scores": tf.cast(scores, tf.float32)}


class TransformerModel(_TransformerBase):
  """Encoder-decoder Transformer; see the module docstring. Build it with `transformer*`."""

  def __init__(self, architecture: TransformerConfig, *, num_encoder_layers: int,
               num_decoder_layers: int, name: str = "transformer"):
    super().__init__(name=name)
    self._init_config(architecture, num_encoder_layers=num_encoder_layers,
                      num_decoder_layers=num_decoder_layers)
    vocab_size, hidden_size = architecture.vocab_size, architecture.hidden_size
    if architecture.share_embeddings:
      self.shared_embedding = TokenEmbedding(vocab_size, hidden_size, name="shared_embedding")
      self.source_embedding = self.target_embedding = self.softmax_embedding = \
          self.shared_embedding
    else:
      self.source_embedding = TokenEmbedding(vocab_size, hidden_size, name="source_embedding")
      self.target_embedding = TokenEmbedding(vocab_size, hidden_size, name="target_embedding")
      self.softmax_embedding = TokenEmbedding(vocab_size, hidden_size, name="softmax_embedding")
    layer_kwargs = architecture.layer_kwargs()
    self._num_encoder_layers = num_encoder_layers
    self._num_decoder_layers = num_decoder_layers
    self._set_layers("encoder_layer", [EncoderLayer(**layer_kwargs, name=f"encoder_layer_{i}")
                                       for i in range(num_encoder_layers)])
    self._set_layers("decoder_layer", [DecoderLayer(**layer_kwargs, name=f"decoder_layer_{i}")
                                       for i in range(num_decoder_layers)])
    self.encoder_norm = norm_layer("encoder_norm")
    self.decoder_norm = norm_layer("decoder_norm")
    self.build()

  @property
  def encoder_layers(self) -> List[EncoderLayer]:
    return self._get_layers("encoder_layer", self._num_encoder_layers)

  def build(self, input_shape=None):
    for embedding in self._embeddings:
      embedding.build()
    for layer in self.encoder_layers + self.decoder_layers:
      layer.build()
    if self.pre_layer_norm:  # Post-LN stacks end with a norm already.
      self.encoder_norm.build((None, self.hidden_size))
      self.decoder_norm.build((None, self.hidden_size))

  # -- Full forward pass.

  def encode(self, inputs: tf.Tensor, segment_ids: Optional[tf.Tensor] = None,
             positions: Optional[tf.Tensor] = None, training: bool = False) -> tf.Tensor:
    """Encoder output [B, S, d] (compute dtype) of int inputs [B, S]."""
    if positions is None:
      positions = _default_positions(inputs)
    x = self._embed(self.source_embedding, inputs, positions, training, zero_padding=True)
    if segment_ids is None:
      mask = attention_ops.padding_mask(inputs)
    else:
      mask = attention_ops.segment_mask(segment_ids, segment_ids)
    bias = attention_ops.mask_to_bias(mask)
    for layer in self.encoder_layers:
      x = layer(x, bias, training=training)
    return self.encoder_norm(x) if self.pre_layer_norm else x

  def call(self, features: Dict[str, tf.Tensor], training: bool = False) -> tf.Tensor:
    """Teacher-forced logits.

    Args:
      features: {"inputs": int [B, S], "targets": int [B, T]} plus the
        optional packing keys (module docstring).
      training: enables dropout.

    Returns:
      float32 [B, T, vocab_size]; [:, t] predicts targets[:, t].
    """
    inputs = _check_ids(features, "inputs")
    targets = _check_ids(features, "targets")
    inputs_segments = features.get("inputs_segment_ids")
    targets_segments = features.get("targets_segment_ids")
    if (inputs_segments is None) != (targets_segments is None):
      raise ValueError("Packed features need both 'inputs_segment_ids' and "
                       "'targets_segment_ids' (or neither); got only "
                       f"{'inputs' if targets_segments is None else 'targets'}_segment_ids.")
    memory = self.encode(inputs, inputs_segments, features.get("inputs_positions"), training)

    positions = features.get("targets_positions")
    if positions is None:
      positions = _default_positions(targets)
    x = self._embed(self.target_embedding, shift_right(targets, targets_segments), positions,
                    training)
    length = tf.shape(targets)[1]
    self_mask = attention_ops.causal_mask(length)
    if targets_segments is None:
      cross_mask = attention_ops.padding_mask(inputs)
    else:
      self_mask = tf.logical_and(self_mask,
                                 attention_ops.segment_mask(targets_segments, targets_segments))
      cross_mask = attention_ops.segment_mask(targets_segments, inputs_segments)
    x = self._decoder_stack_full(self.decoder_layers, self.decoder_norm, x,
                                 attention_ops.mask_to_bias(self_mask), memory,
                                 attention_ops.mask_to_bias(cross_mask), training)
    return self.softmax_embedding.logits(x)

  # -- Decoding.

  def default_decode_length(self, input_length: Optional[int]) -> int:
    """Input length + 50, capped at max_length (max_length when unknown)."""
    if input_length is None:
      return self.max_length
    return min(input_length + DEFAULT_EXTRA_DECODE_LENGTH, self.max_length)

  def make_decoding_fn(self, inputs: tf.Tensor, max_decode_length: int, beam_size: int = 1):
    """Encodes `inputs` once and returns the decoder as a search step function.

    Args:
      inputs: int32 [B, S] source ids.
      max_decode_length: Python int L, the length of the key/value cache.
      beam_size: Python int, how many query rows share one input row (the
        beams of `sequence_beam_search`; 1 for greedy or teacher forcing).

    Returns:
      (symbols_to_logits_fn, initial_cache) for `beam_search.py`:
      `symbols_to_logits_fn(ids [B * beam, 1], i, cache)` returns the float32
      logits [B * beam, vocab] of position i + 1 given the token at position
      i, and the cache with position i written; `initial_cache` holds the
      per-layer {"key", "value"} zeros [B, heads, L, head_size]. The encoder
      keys/values are computed here once and closed over (not in the cache, so
      the search never reorders or repeats them).
    """
    cross = self.cross_memory(inputs)
    cache = self.init_cache(tf.shape(inputs)[0], max_decode_length)

    def symbols_to_logits_fn(ids, i, cache):
      return self.decode_step(ids, i, cache, cross, group=beam_size)

    return symbols_to_logits_fn, cache

  def cross_memory(self, inputs: tf.Tensor) -> List[Tuple[tf.Tensor, tf.Tensor, tf.Tensor]]:
    """The encoder's output as each decoder layer attends to it, computed once per input.

    Args:
      inputs: int32 [B, S] source ids, 0-padded.

    Returns:
      Per decoder layer (key, value, bias): the cross-attention keys and values
      [B, heads, S, head_size] (compute dtype) and the padding bias float32
      [B, 1, 1, S] (0 on tokens, MASK_BIAS on padding).
    """
    memory = self.encode(inputs, training=False)
    cross_bias = attention_ops.mask_to_bias(attention_ops.padding_mask(inputs))
    return [layer.cross_attention.project_memory(memory) + (cross_bias,)
            for layer in self.decoder_layers]

  def decode_step(self, ids: tf.Tensor, i, cache: Dict[str, LayerCache],
                  cross: Sequence[Tuple[tf.Tensor, tf.Tensor, tf.Tensor]], group: int = 1
                  ) -> Tuple[tf.Tensor, Dict[str, LayerCache]]:
    """One decoding step: the logits of position i + 1 given the tokens at position i.

    Args:
      ids: int32 [B * group, 1], the token at position i of each sequence.
      i: int32 scalar (tensor or Python int), the position.
      cache: from `init_cache` (batch B * group, length L) or the previous step.
      cross: `cross_memory` of the B inputs; rows b * group .. b * group + group - 1
        of `ids` (the beams of input b) attend to input b.
      group: Python int, query rows per input row (the beam size; 1 for greedy).

    Returns:
      (float32 logits [B * group, vocab_size], the cache with position i written).
    """
    x = self.target_embedding(ids)
    x += tf.cast(sinusoidal_position_encoding(i, self.hidden_size), x.dtype)
    length = cache["layer_0"]["key"].shape[2]
    x, cache = self._decode_positions(self.decoder_layers, self.decoder_norm, cache, x, i,
                                      length, cross, group=group)
    return self.softmax_embedding.logits(x)[:, 0, :], cache

  def translate(self, inputs: tf.Tensor, beam_size: int = 4, alpha: float = 0.6,
                max_decode_length: Optional[int] = None, eos_id: int = EOS_ID
                ) -> Dict[str, tf.Tensor]:
    """Beam-search (beam_size 1: greedy) translation with fixed shapes.

    Args:
      inputs: int [B, S] source ids, 0-padded (B and S may be dynamic).
      beam_size: Python int; 1 runs `greedy_search` (argmax decoding).
      alpha: GNMT length-penalty strength.
      max_decode_length: Python int, number of decoded tokens L; default
        `default_decode_length(S)` (S + 50 capped at max_length).
      eos_id: the end-of-sequence id.

    Returns:
      {"ids": int32 [B, L]: the best sequence, EOS and everything after it
        replaced by 0 (EOS is excluded; a row without EOS used all L steps),
       "scores": float32 [B]: its log probability / length penalty (the raw
        log probability for a row that never produced EOS)}.
    """
    inputs = tf.convert_to_tensor(inputs)
    if inputs.shape.rank != 2 or not inputs.dtype.is_integer:
      raise ValueError(f"translate() needs int inputs [batch, length], got {inputs.dtype.name} "
                       f"of shape {inputs.shape}.")
    inputs = tf.cast(inputs, tf.int32)
    if max_decode_length is None:
      max_decode_length = self.default_decode_length(inputs.shape[1])
    if not isinstance(max_decode_length, int) or not 1 <= max_decode_length <= self.max_length:
      raise ValueError(f"max_decode_length must be an int in [1, max_length={self.max_length}], "
                       f"got {max_decode_length!r}.")
    if not isinstance(beam_size, int) or beam_size < 1:
      raise ValueError(f"beam_size must be a positive int, got {beam_size!r}.")

    symbols_to_logits_fn, cache = self.make_decoding_fn(inputs, max_decode_length, beam_size)
    return search(symbols_to_logits_fn, tf.shape(inputs)[0], cache, self.vocab_size,
                  beam_size=beam_size, alpha=alpha, max_decode_length=max_decode_length,
                  eos_id=eos_id)


class TransformerLM(_TransformerBase):
  """Decoder-only language model; see the module docstring. Build it with `transformer_lm*`."""

  def __init__(self, architecture: TransformerConfig, *, num_layers: int,
               name: str = "transformer_lm"):
    super().__init__(name=name)
    self._init_config(architecture, num_layers=num_layers)
    vocab_size, hidden_size = architecture.vocab_size, architecture.hidden_size
    if architecture.share_embeddings:
      self.shared_embedding = TokenEmbedding(vocab_size, hidden_size, name="shared_embedding")
      self.target_embedding = self.softmax_embedding = self.shared_embedding
    else:
      self.target_embedding = TokenEmbedding(vocab_size, hidden_size, name="target_embedding")
      self.softmax_embedding = TokenEmbedding(vocab_size, hidden_size, name="softmax_embedding")
    self._num_decoder_layers = num_layers
    self._set_layers("decoder_layer", [DecoderLayer(**architecture.layer_kwargs(),
                                                    cross_attention=False,
                                                    name=f"decoder_layer_{i}")
                                       for i in range(num_layers)])
    self.decoder_norm = norm_layer("decoder_norm")
    self.build()

  def build(self, input_shape=None):
    for embedding in self._embeddings:
      embedding.build()
    for layer in self.decoder_layers:
      layer.build()
    if self.pre_layer_norm:
      self.decoder_norm.build((None, self.hidden_size))

  def call(self, features: Dict[str, tf.Tensor], training: bool = False) -> tf.Tensor:
    """Next-token logits.

    Args:
      features: {"targets": int [B, T]} plus optional "targets_segment_ids"
        and "targets_positions" for packed rows.
      training: enables dropout.

    Returns:
      float32 [B, T, vocab_size]; [:, t] predicts targets[:, t] from
      targets[:, :t].
    """
    targets = _check_ids(features, "targets")
    segments = features.get("targets_segment_ids")
    positions = features.get("targets_positions")
    if positions is None:
      positions = _default_positions(targets)
    x = self._embed(self.target_embedding, shift_right(targets, segments), positions, training)
    mask = attention_ops.causal_mask(tf.shape(targets)[1])
    if segments is not None:
      mask = tf.logical_and(mask, attention_ops.segment_mask(segments, segments))
    x = self._decoder_stack_full(self.decoder_layers, self.decoder_norm, x,
                                 attention_ops.mask_to_bias(mask), training=training)
    return self.softmax_embedding.logits(x)

  def decode(self, ids: tf.Tensor, index, cache: Dict[str, LayerCache]
             ) -> Tuple[tf.Tensor, Dict[str, LayerCache]]:
    """Incremental decoding: n decoder-input ids at positions index .. index + n - 1.

    Args:
      ids: int [B, n] decoder inputs (the targets shifted right: the token
        before each position, 0 at position 0).
      index: int or int32 scalar, the position of ids[:, 0].
      cache: from `init_cache` or the previous `decode`; positions before
        `index` must hold this sequence's earlier keys/values.

    Returns:
      (float32 logits [B, n, vocab] predicting the tokens at those positions,
       the cache with those positions written).
    """
    n = ids.shape[1]
    x = self.target_embedding(ids)
    positions = tf.range(n) + tf.cast(index, tf.int32)
    x += tf.cast(sinusoidal_position_encoding(positions, self.hidden_size), x.dtype)
    length = cache["layer_0"]["key"].shape[2]
    x, cache = self._decode_positions(self.decoder_layers, self.decoder_norm, cache, x, index,
                                      length)
    return self.softmax_embedding.logits(x), cache

  def generate(self, prompt_ids: tf.Tensor, max_new_tokens: int, method: str = "greedy",
               top_k: int = 40, temperature: float = 1.0, seed: Optional[int] = None,
               eos_id: int = EOS_ID) -> tf.Tensor:
    """Continues each prompt by greedy or top-k sampling, with a key/value cache.

    The prompts are encoded in one pass (filling the cache), then one token
    per step is generated for every row, starting at the shortest prompt's
    end; a row keeps its prompt tokens until its own end. Everything has a
    static shape, so it compiles under `tf.function(jit_compile=True)`.

    Args:
      prompt_ids: int [B, P] prompts, right-padded with 0 (P static; a row
        may be empty). A row's length is the position after its last non-0 id.
      max_new_tokens: Python int N >= 1, tokens generated per row.
      method: "greedy" (argmax) or "top_k" (sample among the k most likely).
      top_k: k for "top_k" (capped at vocab_size).
      temperature: divides the logits before sampling ("top_k" only).
      seed: int for reproducible sampling; None draws a fresh seed per call.
      eos_id: generation stops for a row after it writes this id.

    Returns:
      int32 [B, P + N]: each row's prompt, then up to N generated tokens
      (EOS included when produced), then 0s.
    """
    if method not in GENERATE_METHODS:
      raise ValueError(f"generate() method must be one of {GENERATE_METHODS}, got {method!r}.")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
      raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}.")
    if method == "top_k" and (not isinstance(top_k, int) or top_k < 1):
      raise ValueError(f"top_k must be a positive int, got {top_k!r}.")
    prompt_ids = tf.convert_to_tensor(prompt_ids)
    if prompt_ids.shape.rank != 2 or prompt_ids.shape[1] is None:
      raise ValueError(f"prompt_ids must be int [batch, P] with a static P, got shape "
                       f"{prompt_ids.shape}.")
    prompt_ids = tf.cast(prompt_ids, tf.int32)
    prompt_length = prompt_ids.shape[1]
    total = prompt_length + max_new_tokens
    if total > self.max_length:
      raise ValueError(f"Prompt length {prompt_length} + max_new_tokens {max_new_tokens} = "
                       f"{total} exceeds the model's max_length {self.max_length}.")
    k = min(top_k, self.vocab_size)
    batch_size = tf.shape(prompt_ids)[0]
    positions = tf.range(1, prompt_length + 1)[tf.newaxis]
    lengths = tf.reduce_max(tf.where(prompt_ids != PAD_ID, positions, 0), axis=1)  # [B]
    sequences = tf.pad(prompt_ids, [[0, 0], [0, max_new_tokens]])
    cache = self.init_cache(batch_size, total)
    if prompt_length > 0:  # Prefill: the whole prompt in one pass (its logits are unused).
      _, cache = self.decode(shift_right(prompt_ids), 0, cache)
    if seed is None:
      base_seed = tf.random.uniform([], maxval=2 ** 31 - 1, dtype=tf.int32)
    else:
      base_seed = tf.constant(seed, tf.int32)
    stop = lengths + max_new_tokens  # A row writes positions lengths .. stop - 1.

    def keep_going(t, sequences, done, cache):
      del sequences, cache
      return tf.logical_and(t < total, tf.logical_not(tf.reduce_all(done | (t >= stop))))

    def step(t, sequences, done, cache):
      previous = tf.gather(sequences, tf.maximum(t - 1, 0), axis=1)
      ids = tf.where(t > 0, previous, tf.zeros_like(previous))[:, tf.newaxis]
      logits, cache = self.decode(ids, t, cache)
      logits = logits[:, 0, :]
      if method == "greedy":
        token = tf.argmax(logits, axis=-1, output_type=tf.int32)
      else:
        logits = logits / tf.cast(temperature, tf.float32)
        kth_best = tf.math.top_k(logits, k=k).values[:, -1:]
        logits = tf.where(logits < kth_best, tf.constant(-1e9, tf.float32), logits)
        token = tf.argmax(logits + _gumbel_noise(base_seed, t, tf.shape(logits)), axis=-1,
                          output_type=tf.int32)
      write = (t >= lengths) & (t < stop) & tf.logical_not(done)
      current = tf.gather(sequences, t, axis=1)
      column = tf.where(write, token, current)
      sequences = tf.where(tf.range(total) == t, column[:, tf.newaxis], sequences)
      done = done | (write & tf.equal(token, eos_id))
      return t + 1, sequences, done, cache

    start = tf.reduce_min(lengths) if prompt_length > 0 else tf.constant(0, tf.int32)
    done = tf.zeros([batch_size], tf.bool)
    _, sequences, _, _ = tf.while_loop(keep_going, step, (start, sequences, done, cache),
                                       maximum_iterations=total)
    return sequences


# ----------------------------------------------------------------------------
# Builders.


def _builder(model_class, name: str, depths: Dict[str, int], doc: str):
  """The registered builder `name` of `model_class`; see `transformer` and `transformer_lm`.

  Its keyword arguments (the model config's schema, in its signature and
  annotations) are vocab_size, the stack `depths` (with their defaults), the
  other `TransformerConfig` fields and the model name.
  """
  keyword = inspect.Parameter.KEYWORD_ONLY
  fields = {f.name: f for f in dataclasses.fields(TransformerConfig)}
  parameters = [inspect.Parameter("vocab_size", keyword, annotation=int)]
  parameters += [inspect.Parameter(k, keyword, default=v, annotation=int)
                 for k, v in depths.items()]
  parameters += [inspect.Parameter(f.name, keyword, default=f.default, annotation=f.type)
                 for f in fields.values() if f.name != "vocab_size"]
  parameters.append(inspect.Parameter("name", keyword, default=name, annotation=str))
  signature = inspect.Signature(parameters, return_annotation=model_class)

  def build(**kwargs):
    arguments = signature.bind(**kwargs)
    arguments.apply_defaults()
    values = dict(arguments.arguments)
    architecture = TransformerConfig(**{k: values[k] for k in fields})
    return model_class(architecture, **{k: values[k] for k in depths}, name=values["name"])

  build.__signature__ = signature
  build.__annotations__ = {**{p.name: p.annotation for p in parameters}, "return": model_class}
  build.__name__ = build.__qualname__ = name
  build.__doc__ = doc
  return register_model(name)(build)


transformer = _builder(TransformerModel, "transformer",
                       {"num_encoder_layers": 6, "num_decoder_layers": 6}, """\
Builds an encoder-decoder Transformer (defaults: the base size).

  Args:
    vocab_size, ..., max_length: the architecture (`TransformerConfig`).
    num_encoder_layers, num_decoder_layers: stack depths.
    name: model name (the root of the variable paths).

  Returns:
    A built `TransformerModel`.
  """)

transformer_lm = _builder(TransformerLM, "transformer_lm", {"num_layers": 6}, """\
Builds a decoder-only Transformer language model.

  Args: as `transformer` (one stack of `num_layers` decoder layers without
  cross-attention; `share_embeddings` ties the input embedding and the
  softmax; `max_length` caps prompt + generated tokens).

  Returns:
    A built `TransformerLM`.
  """)


def _preset(builder, name: str, **defaults):
  """`builder` with new defaults, registered as `name`; its signature shows them."""
  return register_model(name)(preset(builder, name, defaults={**defaults, "name": name}))


transformer_tiny = _preset(transformer, "transformer_tiny", num_encoder_layers=3,
                           num_decoder_layers=3, hidden_size=256, num_heads=4, filter_size=1024)
transformer_base = _preset(transformer, "transformer_base")
transformer_big = _preset(transformer, "transformer_big", hidden_size=1024, num_heads=16,
                          filter_size=4096, dropout=0.3)
transformer_lm_tiny = _preset(transformer_lm, "transformer_lm_tiny", num_layers=4,
                              hidden_size=256, num_heads=4, filter_size=1024)
transformer_lm_small = _preset(transformer_lm, "transformer_lm_small", num_layers=6,
                               hidden_size=512, num_heads=8, filter_size=2048)
