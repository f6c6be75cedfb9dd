"""What the encoder-decoder and the language model share: config, embeddings, positions, stacks.

`TransformerConfig` is the architecture both builders take; `TokenEmbedding` the
[vocab, d] matrix used as an embedding and as the softmax; `TransformerBase` the
model pieces both use (embedding with positions, the decoder stack over a full
sequence or against the key/value cache). The models are seq2seq.py's
`TransformerModel` and causal_lm.py's `TransformerLM`; the blocks are in
tpu_models/layers/.
"""

import dataclasses
import math
from typing import Annotated, Any, Dict, List, Optional

import keras
import tensorflow as tf

from tpu_models.config import SIZE
from tpu_models.layers import attention
from tpu_models.layers.attention import LayerCache
from tpu_models.layers.base import CastingLayer, read_as
from tpu_models.layers.blocks import DecoderLayer
from tpu_models.text.inputs import EOS_ID, PAD_ID


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


def default_positions(ids: tf.Tensor) -> tf.Tensor:
  return tf.range(tf.shape(ids)[1])[tf.newaxis, :]


class TokenEmbedding(CastingLayer):
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
                       read_as(self.embeddings, self.compute_dtype), transpose_b=True)
    logits = tf.reshape(logits, tf.concat([shape[:-1], [self.vocab_size]], 0))
    return tf.cast(logits, tf.float32)


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
  vocab_size: Annotated[int, SIZE]
  hidden_size: Annotated[int, SIZE] = 512
  num_heads: Annotated[int, SIZE] = 8
  filter_size: Annotated[int, SIZE] = 2048
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


def validate_config(config: Dict[str, Any]) -> None:
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


def check_ids(features: Dict[str, tf.Tensor], key: str) -> tf.Tensor:
  if key not in features:
    raise KeyError(f"Transformer features need {key!r} (int32 [batch, length], 0 = padding); "
                   f"got keys {sorted(features)}.")
  ids = tf.convert_to_tensor(features[key])
  if ids.shape.rank != 2 or not ids.dtype.is_integer:
    raise ValueError(f"Feature {key!r} must be an int tensor [batch, length], got "
                     f"{ids.dtype.name} of shape {ids.shape}.")
  return ids


class TransformerBase(keras.Model):
  """Pieces shared by the encoder-decoder and the language model."""

  def _init_config(self, architecture: TransformerConfig, **depths: int):
    """Checks and keeps the architecture and the stack depths (`get_config`)."""
    for key, value in depths.items():
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"Transformer {key} must be a positive int, got {value!r}.")
    config = dataclasses.asdict(architecture)
    config = {"vocab_size": config.pop("vocab_size"), **depths, **config}
    validate_config(config)
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
    self_bias = attention.mask_to_bias(attention.causal_mask(n, cache_length, index))
    new_cache = {}
    for i, layer in enumerate(layers):
      cross_kwargs = {}
      if cross is not None:
        key, value, bias = cross[i]
        cross_kwargs = dict(cross_key=key, cross_value=value, cross_bias=bias, group=group)
      x, new_cache[f"layer_{i}"] = layer.decode(x, self_bias, cache[f"layer_{i}"], index,
                                                **cross_kwargs)
    return (norm(x) if self.pre_layer_norm else x), new_cache
