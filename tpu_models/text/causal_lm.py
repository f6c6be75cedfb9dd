"""The decoder-only Transformer language model (`TransformerLM`): logits, `decode`, `generate`.

See transformer.py for the features, the architecture and the decoding; the
registered builders (`transformer_lm*`) are there too.
"""

from typing import Dict, Optional, Tuple

import tensorflow as tf

from tpu_models.layers import attention
from tpu_models.layers.attention import LayerCache
from tpu_models.layers.blocks import DecoderLayer, norm_layer
from tpu_models.text import sampling
from tpu_models.text.inputs import EOS_ID, PAD_ID
from tpu_models.text.model_base import (TokenEmbedding, TransformerBase, TransformerConfig,
                                        check_ids, default_positions, shift_right,
                                        sinusoidal_position_encoding)


class TransformerLM(TransformerBase):
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
    targets = check_ids(features, "targets")
    segments = features.get("targets_segment_ids")
    positions = features.get("targets_positions")
    if positions is None:
      positions = default_positions(targets)
    x = self._embed(self.target_embedding, shift_right(targets, segments), positions, training)
    mask = attention.causal_mask(tf.shape(targets)[1])
    if segments is not None:
      mask = tf.logical_and(mask, attention.segment_mask(segments, segments))
    x = self._decoder_stack_full(self.decoder_layers, self.decoder_norm, x,
                                 attention.mask_to_bias(mask), training=training)
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
    if method not in sampling.GENERATE_METHODS:
      raise ValueError(f"generate() method must be one of {sampling.GENERATE_METHODS}, got {method!r}.")
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
      token = sampling.next_token(logits[:, 0, :], method, k, temperature, base_seed, t)
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
