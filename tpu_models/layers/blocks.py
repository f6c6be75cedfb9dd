"""The residual attention blocks of Vaswani et al. (2017): EncoderLayer and DecoderLayer.

An encoder layer is self-attention then the feed-forward sublayer; a decoder layer
adds cross-attention to an encoder's output between them (optional: a decoder-only
model has none) and decodes incrementally against a key/value cache. Both share the
residual wiring of `AttentionBlock`: pre-LN (`x + f(LN(x))`, the current reference
recipes) or post-LN (`LN(x + f(x))`, the paper), dropout on each sublayer's output
before its residual add.

Variables have fixed paths under the layer's name: "self_attention/qkv_kernel",
"self_attention_norm/gamma", "cross_attention/query_kernel", "ffn/inner_kernel",
"ffn_norm/beta", ... (checkpoints and the weight importers rely on them).
"""

from typing import Tuple

import keras
import tensorflow as tf

from tpu_models.layers import fused
from tpu_models.layers.attention import LayerCache, MultiHeadAttention
from tpu_models.layers.base import CastingLayer
from tpu_models.layers.feed_forward import FeedForward

LAYER_NORM_EPSILON = 1e-6


def norm_layer(name: str) -> keras.layers.LayerNormalization:
  """The blocks' LayerNorm (epsilon 1e-6, last axis; hand-written gradient, fused.py).

  Every block's and stack's norm, and ViT's, is built here.
  """
  return fused.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name=name)


class AttentionBlock(CastingLayer):
  """Self-attention, optional cross-attention and the feed-forward around a residual stream.

  The base of EncoderLayer and DecoderLayer; `attention_bias` gives the attention
  projections biases (`MultiHeadAttention`'s `use_bias`, as ViT has).
  """

  def __init__(self, hidden_size, num_heads, filter_size, dropout, attention_dropout,
               activation_dropout, activation, pre_layer_norm, *, cross_attention: bool,
               attention_bias: bool = False, **kwargs):
    super().__init__(**kwargs)
    self.hidden_size = hidden_size
    self.pre_layer_norm = pre_layer_norm
    self.residual_dropout = keras.layers.Dropout(dropout, name="residual_dropout")
    self.dropout_rate = dropout
    # Created in this order: the order of the block's variables.
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

  def _forward(self, x, self_bias, memory=None, cross_bias=None, training=False):
    """The full-sequence pass: [B, T, d] -> [B, T, d]."""
    x = self._residual(x, self.self_attention_norm,
                       lambda h: self.self_attention(h, self_bias, training=training), training)
    if self.has_cross_attention:
      x = self._residual(
          x, self.cross_attention_norm,
          lambda h: self.cross_attention(h, cross_bias, memory=memory, training=training),
          training)
    return self._residual(x, self.ffn_norm, lambda h: self.ffn(h, training=training), training)


class EncoderLayer(AttentionBlock):
  """Self-attention + FFN.

  Whether attention is causal is the bias's business: an encoder passes a padding
  (or segment) bias; ViT none.
  """

  def __init__(self, hidden_size, num_heads, filter_size, dropout, attention_dropout,
               activation_dropout, activation, pre_layer_norm, attention_bias: bool = False,
               **kwargs):
    super().__init__(hidden_size, num_heads, filter_size, dropout, attention_dropout,
                     activation_dropout, activation, pre_layer_norm, cross_attention=False,
                     attention_bias=attention_bias, **kwargs)

  def call(self, x, bias, training=False):
    """x [B, T, d], bias float32 broadcastable to [B, H, T, T] (or None) -> [B, T, d]."""
    return self._forward(x, bias, training=training)


class DecoderLayer(AttentionBlock):
  """Causal self-attention, cross-attention (encoder-decoder only), FFN; cached decoding."""

  def __init__(self, hidden_size, num_heads, filter_size, dropout, attention_dropout,
               activation_dropout, activation, pre_layer_norm, cross_attention: bool = True,
               attention_bias: bool = False, **kwargs):
    super().__init__(hidden_size, num_heads, filter_size, dropout, attention_dropout,
                     activation_dropout, activation, pre_layer_norm,
                     cross_attention=cross_attention, attention_bias=attention_bias, **kwargs)

  def call(self, x, self_bias, memory=None, cross_bias=None, training=False):
    """x [B, T, d] with a causal `self_bias`; `memory` [B, S, d] and `cross_bias` for
    cross-attention -> [B, T, d]."""
    return self._forward(x, self_bias, memory, cross_bias, training)

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
