"""The encoder-decoder Transformer (`TransformerModel`): teacher-forced logits and `translate`.

See transformer.py for the features, the architecture and the decoding; the
registered builders (`transformer*`) are there too.
"""

from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tpu_models.layers import attention
from tpu_models.layers.attention import LayerCache
from tpu_models.layers.blocks import DecoderLayer, EncoderLayer, norm_layer
from tpu_models.text.inputs import EOS_ID
from tpu_models.text.model_base import (TokenEmbedding, TransformerBase, TransformerConfig,
                                        check_ids, default_positions, shift_right,
                                        sinusoidal_position_encoding)
from tpu_models.text.sampling import search

DEFAULT_EXTRA_DECODE_LENGTH = 50  # translate(): decode up to input length + this.


class TransformerModel(TransformerBase):
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
      positions = default_positions(inputs)
    x = self._embed(self.source_embedding, inputs, positions, training, zero_padding=True)
    if segment_ids is None:
      mask = attention.padding_mask(inputs)
    else:
      mask = attention.segment_mask(segment_ids, segment_ids)
    bias = attention.mask_to_bias(mask)
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
    inputs = check_ids(features, "inputs")
    targets = check_ids(features, "targets")
    inputs_segments = features.get("inputs_segment_ids")
    targets_segments = features.get("targets_segment_ids")
    if (inputs_segments is None) != (targets_segments is None):
      raise ValueError("Packed features need both 'inputs_segment_ids' and "
                       "'targets_segment_ids' (or neither); got only "
                       f"{'inputs' if targets_segments is None else 'targets'}_segment_ids.")
    memory = self.encode(inputs, inputs_segments, features.get("inputs_positions"), training)

    positions = features.get("targets_positions")
    if positions is None:
      positions = default_positions(targets)
    x = self._embed(self.target_embedding, shift_right(targets, targets_segments), positions,
                    training)
    length = tf.shape(targets)[1]
    self_mask = attention.causal_mask(length)
    if targets_segments is None:
      cross_mask = attention.padding_mask(inputs)
    else:
      self_mask = tf.logical_and(self_mask,
                                 attention.segment_mask(targets_segments, targets_segments))
      cross_mask = attention.segment_mask(targets_segments, inputs_segments)
    x = self._decoder_stack_full(self.decoder_layers, self.decoder_norm, x,
                                 attention.mask_to_bias(self_mask), memory,
                                 attention.mask_to_bias(cross_mask), training)
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
    cross_bias = attention.mask_to_bias(attention.padding_mask(inputs))
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
