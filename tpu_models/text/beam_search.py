"""Beam search and greedy decoding with fixed shapes (XLA / TPU compilable).

Both searches drive a model through `symbols_to_logits_fn`, the contract of
TF Model Garden's `sequence_beam_search` (its `padded_decode=True` mode), so
the two implementations can be compared on the same function:

    def symbols_to_logits_fn(ids, i, cache):
      # ids:   int32 [batch * beam, 1], the token at position i of each sequence
      #        (position 0 holds `initial_ids`).
      # i:     int32 scalar tensor, the decoding step (0, 1, ...).
      # cache: nested structure of tensors [batch * beam, ...] (e.g. a
      #        pre-allocated key/value cache), as returned by the previous step.
      return logits, new_cache  # logits: float [batch * beam, vocab_size]

Every tensor in the loop has a static shape: the sequences are pre-allocated
as [batch, beam, max_decode_length + 1] and written one column per step with
a select, the cache keeps its shape, and the loop is a `tf.while_loop` that
stops at `max_decode_length` steps or as soon as no alive beam can beat the
finished ones (a data-dependent trip count, which XLA supports). The whole
search compiles under `tf.function(jit_compile=True)`.

Scoring is GNMT's: a finished sequence of length n (its EOS included, the
initial id not) scores log P / ((5 + n) / 6) ** alpha. As in Model Garden
(and Tensor2Tensor), each step extends the alive beams to their 2 * beam best
candidates, so up to `beam` of them may end with EOS and still leave `beam`
alive ones; those ending with EOS compete with the earlier finished
sequences. A consequence is that beam size 1 is *not* greedy decoding: with
beam 1 an EOS that is the runner-up token still produces a finished
candidate, and with alpha > 0 a longer sequence can outscore a shorter one.
`greedy_search` is the argmax decoder; use it for "beam size 1".
"""

from typing import Any, Callable, Tuple

import numpy as np
import tensorflow as tf

SymbolsToLogitsFn = Callable[[tf.Tensor, tf.Tensor, Any], Tuple[tf.Tensor, Any]]


def large_negative(dtype) -> float:
  """A finite stand-in for -infinity in `dtype` (finite so that 0 * it is 0)."""
  dtype = tf.as_dtype(dtype)
  if dtype == tf.float16:
    return -float(np.finfo(np.float16).max)
  if dtype in (tf.float32, tf.bfloat16, tf.float64):
    return -1e7
  raise ValueError(f"Unsupported score dtype {dtype.name}; expected float32, bfloat16 or float16.")


def length_penalty(length, alpha: float, dtype=tf.float32) -> tf.Tensor:
  """GNMT length normalisation ((5 + length) / 6) ** alpha (Wu et al. 2016)."""
  return tf.pow((5.0 + tf.cast(length, dtype)) / 6.0, tf.cast(alpha, dtype))


def _batch_size(initial_ids: tf.Tensor):
  """Static batch size when known, else the dynamic one (serving with batch None)."""
  static = initial_ids.shape[0]
  return static if static is not None else tf.shape(initial_ids)[0]


def _expand_to_beam(tensor: tf.Tensor, beam_size: int) -> tf.Tensor:
  """[batch, ...] -> [batch, beam, ...] by repeating each row."""
  tensor = tf.convert_to_tensor(tensor)
  multiples = [1, beam_size] + [1] * (tensor.shape.rank - 1)
  return tf.tile(tensor[:, tf.newaxis], multiples)


def _merge_beam(tensor: tf.Tensor) -> tf.Tensor:
  """[batch, beam, ...] -> [batch * beam, ...]."""
  if tensor.shape[2:].is_fully_defined():
    return tf.reshape(tensor, [-1] + tensor.shape[2:].as_list())
  return tf.reshape(tensor, tf.concat([[-1], tf.shape(tensor)[2:]], 0))


def _split_beam(tensor: tf.Tensor, beam_size: int) -> tf.Tensor:
  """[batch * beam, ...] -> [batch, beam, ...]."""
  if tensor.shape[1:].is_fully_defined():
    return tf.reshape(tensor, [-1, beam_size] + tensor.shape[1:].as_list())
  return tf.reshape(tensor, tf.concat([[-1, beam_size], tf.shape(tensor)[1:]], 0))


def _gather_beams(nested, beam_indices: tf.Tensor):
  """Picks beams: every [batch, beam, ...] tensor -> [batch, len(indices), ...].

  Args:
    nested: nested structure of tensors [batch, old_beam, ...].
    beam_indices: int32 [batch, new_beam], values in [0, old_beam).
  """
  return tf.nest.map_structure(lambda t: tf.gather(t, beam_indices, axis=1, batch_dims=1),
                               nested)


def _write_column(sequences: tf.Tensor, column, values: tf.Tensor) -> tf.Tensor:
  """sequences[..., column] = values, as a select (fixed shape, no scatter)."""
  length = sequences.shape[-1]
  at_column = tf.equal(tf.range(length, dtype=tf.int32), column)
  return tf.where(at_column, values[..., tf.newaxis], sequences)


def _log_softmax(logits: tf.Tensor, dtype) -> tf.Tensor:
  logits = tf.cast(logits, dtype)
  return logits - tf.reduce_logsumexp(logits, axis=-1, keepdims=True)


def _check_args(vocab_size: int, beam_size: int, max_decode_length: int) -> None:
  for name, value in (("vocab_size", vocab_size), ("beam_size", beam_size),
                      ("max_decode_length", max_decode_length)):
    if not isinstance(value, (int, np.integer)) or value < 1:
      raise ValueError(f"{name} must be a positive Python int (a static shape), got {value!r}.")


def sequence_beam_search(symbols_to_logits_fn: SymbolsToLogitsFn,
                         initial_ids: tf.Tensor,
                         initial_cache: Any,
                         vocab_size: int,
                         beam_size: int,
                         alpha: float,
                         max_decode_length: int,
                         eos_id: int,
                         dtype=tf.float32) -> Tuple[tf.Tensor, tf.Tensor]:
  """Beam search for the sequences with the best length-normalised log probability.

  Args:
    symbols_to_logits_fn: see the module docstring.
    initial_ids: int32 [batch], the first token of every sequence (the
      decoder's start token).
    initial_cache: nested structure of tensors [batch, ...]; each is repeated
      per beam, flattened to [batch * beam, ...] for `symbols_to_logits_fn`
      and reordered with the beams every step. Shapes must stay fixed.
    vocab_size: Python int, the size of the logits' last axis.
    beam_size: Python int, number of beams.
    alpha: length-penalty strength (0 = plain log probability).
    max_decode_length: Python int, number of decoding steps (tokens after the
      initial id).
    eos_id: id that finishes a sequence.
    dtype: dtype of the scores (float32 unless scores must be half precision).

  Returns:
    ids: int32 [batch, beam, max_decode_length + 1], best first; position 0 is
      the initial id, then the tokens up to and including EOS, then 0s.
    scores: [batch, beam] of `dtype`: log P / length_penalty of each finished
      sequence. A batch row with no finished sequence after
      `max_decode_length` steps returns its alive beams and their raw
      (unnormalised) log probabilities instead, as Model Garden does.
  """
  _check_args(vocab_size, beam_size, max_decode_length)
  dtype = tf.as_dtype(dtype)
  neg = large_negative(dtype)
  initial_ids = tf.cast(initial_ids, tf.int32)
  batch_size = _batch_size(initial_ids)
  length = max_decode_length + 1

  alive_seq = tf.zeros([batch_size, beam_size, length], tf.int32)
  alive_seq = _write_column(alive_seq, 0, _expand_to_beam(initial_ids, beam_size))
  # Only beam 0 is alive at the start, so the first step does not pick the
  # same candidate from `beam` identical beams.
  first_beam = tf.constant([0.0] + [-np.inf] * (beam_size - 1), dtype)
  alive_log_probs = tf.tile(first_beam[tf.newaxis], [batch_size, 1])
  alive_cache = tf.nest.map_structure(lambda t: _expand_to_beam(t, beam_size), initial_cache)
  finished_seq = tf.zeros([batch_size, beam_size, length], tf.int32)
  finished_scores = tf.fill([batch_size, beam_size], tf.constant(neg, dtype))
  finished_flags = tf.zeros([batch_size, beam_size], tf.bool)
  max_penalty = length_penalty(max_decode_length, alpha, dtype)

  def keep_searching(i, alive_seq, alive_log_probs, alive_cache, finished_seq,
                     finished_scores, finished_flags):
    del alive_seq, alive_cache, finished_seq
    # Stop when even the best alive beam, given the most generous length
    # penalty, cannot beat the worst finished sequence, in every batch row.
    best_alive = alive_log_probs[:, 0] / max_penalty
    worst_finished = tf.reduce_min(
        tf.where(finished_flags, finished_scores, tf.zeros_like(finished_scores)), axis=1)
    worst_finished = tf.where(tf.reduce_any(finished_flags, axis=1), worst_finished,
                              tf.constant(neg, dtype))
    done = tf.reduce_all(worst_finished > best_alive)
    return tf.logical_and(i < max_decode_length, tf.logical_not(done))

  def step(i, alive_seq, alive_log_probs, alive_cache, finished_seq, finished_scores,
           finished_flags):
    # 1. Extend every alive beam by every token; keep the 2 * beam best.
    ids = tf.reshape(tf.gather(alive_seq, i, axis=2), [-1, 1])
    flat_cache = tf.nest.map_structure(_merge_beam, alive_cache)
    logits, flat_cache = symbols_to_logits_fn(ids, i, flat_cache)
    log_probs = _log_softmax(_split_beam(logits, beam_size), dtype)
    log_probs += alive_log_probs[:, :, tf.newaxis]
    log_probs = tf.reshape(log_probs, [-1, beam_size * vocab_size])
    candidate_log_probs, candidate_index = tf.math.top_k(log_probs, k=2 * beam_size)
    candidate_beam = candidate_index // vocab_size
    candidate_id = candidate_index % vocab_size
    candidate_seq = _write_column(_gather_beams(alive_seq, candidate_beam), i + 1, candidate_id)
    candidate_finished = tf.equal(candidate_id, eos_id)

    # 2. The `beam` best candidates that did not end with EOS stay alive. The
    # cache is gathered once, through the composed indices.
    alive_rank = candidate_log_probs + tf.cast(candidate_finished, dtype) * neg
    _, alive_index = tf.math.top_k(alive_rank, k=beam_size)
    alive_seq, alive_log_probs, alive_beam = _gather_beams(
        [candidate_seq, alive_rank, candidate_beam], alive_index)
    alive_cache = _gather_beams(
        tf.nest.map_structure(lambda t: _split_beam(t, beam_size), flat_cache), alive_beam)

    # 3. Candidates ending with EOS join the finished sequences; keep the best.
    candidate_scores = candidate_log_probs / length_penalty(i + 1, alpha, dtype)
    candidate_scores += (1.0 - tf.cast(candidate_finished, dtype)) * neg
    all_seq = tf.concat([finished_seq, candidate_seq], axis=1)
    all_scores = tf.concat([finished_scores, candidate_scores], axis=1)
    all_flags = tf.concat([finished_flags, candidate_finished], axis=1)
    _, finished_index = tf.math.top_k(all_scores, k=beam_size)
    finished_seq, finished_scores, finished_flags = _gather_beams(
        [all_seq, all_scores, all_flags], finished_index)
    return (i + 1, alive_seq, alive_log_probs, alive_cache, finished_seq, finished_scores,
            finished_flags)

  state = (tf.constant(0, tf.int32), alive_seq, alive_log_probs, alive_cache, finished_seq,
           finished_scores, finished_flags)
  state = tf.while_loop(keep_searching, step, state, maximum_iterations=max_decode_length)
  _, alive_seq, alive_log_probs, _, finished_seq, finished_scores, finished_flags = state

  # A batch row with no finished sequence returns its alive beams.
  any_finished = tf.reduce_any(finished_flags, axis=1)
  ids = tf.where(any_finished[:, tf.newaxis, tf.newaxis], finished_seq, alive_seq)
  scores = tf.where(any_finished[:, tf.newaxis], finished_scores, alive_log_probs)
  return tf.stop_gradient(ids), tf.stop_gradient(scores)


def greedy_search(symbols_to_logits_fn: SymbolsToLogitsFn,
                  initial_ids: tf.Tensor,
                  initial_cache: Any,
                  vocab_size: int,
                  max_decode_length: int,
                  eos_id: int,
                  alpha: float = 0.0,
                  dtype=tf.float32) -> Tuple[tf.Tensor, tf.Tensor]:
  """Argmax decoding: the most likely token at every step, until EOS.

  Same contract as `sequence_beam_search` with one beam (the cache is
  [batch, ...] and `symbols_to_logits_fn` sees [batch, 1] ids). The loop stops
  after `max_decode_length` steps or when every row has produced EOS.

  Args:
    symbols_to_logits_fn: see the module docstring.
    initial_ids: int32 [batch], the first token of every sequence.
    initial_cache: nested structure of tensors [batch, ...].
    vocab_size: Python int, the size of the logits' last axis (checked).
    max_decode_length: Python int, number of decoding steps.
    eos_id: id that finishes a sequence.
    alpha: length-penalty strength for the scores (0 = log probability).
    dtype: dtype of the scores.

  Returns:
    ids: int32 [batch, max_decode_length + 1]; position 0 is the initial id,
      then the tokens up to and including EOS, then 0s.
    scores: [batch] of `dtype`: log P / length_penalty for rows that produced
      EOS, the raw log P of the max_decode_length tokens otherwise (the
      `sequence_beam_search` convention).
  """
  _check_args(vocab_size, 1, max_decode_length)
  dtype = tf.as_dtype(dtype)
  initial_ids = tf.cast(initial_ids, tf.int32)
  batch_size = _batch_size(initial_ids)
  length = max_decode_length + 1

  sequences = _write_column(tf.zeros([batch_size, length], tf.int32), 0, initial_ids)
  log_probs = tf.zeros([batch_size], dtype)
  finished = tf.zeros([batch_size], tf.bool)
  lengths = tf.fill([batch_size], max_decode_length)

  def keep_searching(i, sequences, log_probs, finished, lengths, cache):
    del sequences, log_probs, lengths, cache
    return tf.logical_and(i < max_decode_length, tf.logical_not(tf.reduce_all(finished)))

  def step(i, sequences, log_probs, finished, lengths, cache):
    ids = tf.gather(sequences, i, axis=1)[:, tf.newaxis]
    logits, cache = symbols_to_logits_fn(ids, i, cache)
    if logits.shape[-1] is not None and logits.shape[-1] != vocab_size:
      raise ValueError(f"symbols_to_logits_fn returned logits with {logits.shape[-1]} classes; "
                       f"vocab_size is {vocab_size}.")
    step_log_probs = _log_softmax(logits, dtype)
    token = tf.argmax(step_log_probs, axis=-1, output_type=tf.int32)
    token_log_prob = tf.gather(step_log_probs, token, axis=1, batch_dims=1)
    # Finished rows write padding and add nothing.
    token = tf.where(finished, 0, token)
    log_probs += tf.where(finished, tf.zeros_like(token_log_prob), token_log_prob)
    sequences = _write_column(sequences, i + 1, token)
    newly_finished = tf.logical_and(tf.logical_not(finished), tf.equal(token, eos_id))
    lengths = tf.where(newly_finished, i + 1, lengths)
    return i + 1, sequences, log_probs, tf.logical_or(finished, newly_finished), lengths, cache

  state = (tf.constant(0, tf.int32), sequences, log_probs, finished, lengths, initial_cache)
  _, sequences, log_probs, finished, lengths, _ = tf.while_loop(
      keep_searching, step, state, maximum_iterations=max_decode_length)
  scores = tf.where(finished, log_probs / length_penalty(lengths, alpha, dtype), log_probs)
  return tf.stop_gradient(sequences), tf.stop_gradient(scores)
