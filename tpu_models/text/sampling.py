"""Choosing tokens: the search `translate` runs, and greedy / top-k choice for `generate`.

Top-k sampling adds Gumbel noise from a counter hash (`gumbel_noise`) rather than
TF's stateless random ops, which give other numbers under XLA than in TF kernels for
the same seed: a seeded generation is the same eagerly, in graphs and compiled.
"""

from typing import Dict

import tensorflow as tf

from tpu_models.text import beam_search as beam_search_ops
from tpu_models.text.inputs import EOS_ID, PAD_ID

GENERATE_METHODS = ("greedy", "top_k")


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


def _mix32(h: tf.Tensor) -> tf.Tensor:
  """MurmurHash3's 32-bit finaliser: a bijective avalanche mix of uint32 values."""
  h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, 16))
  h = h * tf.constant(0x85EBCA6B, tf.uint32)
  h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, 13))
  h = h * tf.constant(0xC2B2AE35, tf.uint32)
  return tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, 16))


def gumbel_noise(seed: tf.Tensor, step: tf.Tensor, shape: tf.Tensor) -> tf.Tensor:
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


def next_token(logits: tf.Tensor, method: str, k: int, temperature: float, seed: tf.Tensor,
               step: tf.Tensor) -> tf.Tensor:
  """The token each row writes next: int32 [B] of float32 logits [B, V].

  "greedy": the argmax. "top_k": a sample of softmax(logits / temperature) among the
  `k` most likely, drawn with `gumbel_noise(seed, step, ...)`.
  """
  if method == "greedy":
    return tf.argmax(logits, axis=-1, output_type=tf.int32)
  logits = logits / tf.cast(temperature, tf.float32)
  kth_best = tf.math.top_k(logits, k=k).values[:, -1:]
  logits = tf.where(logits < kth_best, tf.constant(-1e9, tf.float32), logits)
  return tf.argmax(logits + gumbel_noise(seed, step, tf.shape(logits)), axis=-1,
                   output_type=tf.int32)
