"""Tests of beam search and greedy decoding (tpu_models/text/beam_search.py).

The reference below is an independent NumPy beam search over whole
sequences (no cache, float64), written from the algorithm's description
(Tensor2Tensor / Model Garden: 2 * beam candidates per step, alive beams
never end in EOS, finished ones scored by log P / ((5 + n) / 6) ** alpha, the
same stopping rule and top-k tie order). The step functions read the last
token from `ids` but the previous token and the batch row only from the
cache, so a cache that is not reordered with its beam gives other results.
"""

import numpy as np
import pytest
import tensorflow as tf

from tpu_models.text import beam_search

EOS = 1
NEG = 1e7


# ----------------------------------------------------------------------------
# A deterministic model: logits = table[step, last] + history[prev] + rows[row].


class TableModel:
  """Random logits indexed by (step, last token), (previous token) and (batch row)."""

  def __init__(self, vocab_size, steps, batch_size, seed, eos_scale=1.0):
    rng = np.random.default_rng(seed)
    self.vocab_size = vocab_size
    self.table = rng.normal(size=(steps, vocab_size, vocab_size)).astype(np.float32) * 2
    self.table[:, :, EOS] *= eos_scale
    self.history = rng.normal(size=(vocab_size + 1, vocab_size)).astype(np.float32)
    self.rows = rng.normal(size=(batch_size, vocab_size)).astype(np.float32)

  def initial_cache(self, batch_size):
    # Float entries, as Model Garden's search requires its cache in the score dtype.
    return {"previous": -tf.ones([batch_size, 1]),
            "row": tf.cast(tf.range(batch_size), tf.float32)[:, tf.newaxis]}

  def symbols_to_logits_fn(self, ids, i, cache):
    last = ids[:, 0]
    previous = tf.cast(cache["previous"][:, 0], tf.int32)
    previous = tf.where(previous < 0, self.vocab_size, previous)
    row = tf.cast(cache["row"][:, 0], tf.int32)
    logits = (tf.gather(tf.gather(tf.constant(self.table), i), last) +
              tf.gather(tf.constant(self.history), previous) +
              tf.gather(tf.constant(self.rows), row))
    cache = {"previous": tf.cast(ids, tf.float32), "row": cache["row"]}
    return logits, cache

  def numpy_logits(self, row, sequence, i):
    """Logits of step i from the whole sequence (positions 0..i)."""
    previous = sequence[i - 1] if i >= 1 else self.vocab_size
    return (self.table[i, sequence[i]].astype(np.float64) + self.history[previous] +
            self.rows[row])


def _log_softmax(x):
  x = x - x.max()
  return x - np.log(np.exp(x).sum())


def _top(values, k):
  """Indices of the k largest values, ties to the lower index (tf.math.top_k's order)."""
  return sorted(range(len(values)), key=lambda j: (-values[j], j))[:k]


def reference_beam_search(model, batch_size, beam_size, alpha, length):
  penalty = lambda n: ((5.0 + n) / 6.0) ** alpha
  alive = [[([0], 0.0)] + [([0], -np.inf)] * (beam_size - 1) for _ in range(batch_size)]
  finished = [[([0], -NEG, False)] * beam_size for _ in range(batch_size)]
  i = 0
  while i < length:
    stop = True
    for b in range(batch_size):
      best_alive = alive[b][0][1] / penalty(length)
      flags = [f for _, _, f in finished[b]]
      worst = min(s if f else 0.0 for _, s, f in finished[b]) if any(flags) else -NEG
      stop = stop and worst > best_alive
    if stop:
      break
    for b in range(batch_size):
      candidates = []
      for seq, log_prob in alive[b]:
        step_log_probs = _log_softmax(model.numpy_logits(b, seq, i))
        candidates += [(seq + [v], log_prob + step_log_probs[v])
                       for v in range(model.vocab_size)]
      top = [candidates[j] for j in _top([c[1] for c in candidates], 2 * beam_size)]
      is_eos = [seq[-1] == EOS for seq, _ in top]
      ranks = [lp - NEG * e for (_, lp), e in zip(top, is_eos)]
      alive[b] = [(top[j][0], ranks[j]) for j in _top(ranks, beam_size)]
      new = [(seq, lp / penalty(i + 1) - NEG * (not e), e) for (seq, lp), e in zip(top, is_eos)]
      pool = finished[b] + new
      finished[b] = [pool[j] for j in _top([p[1] for p in pool], beam_size)]
    i += 1
  ids = np.zeros([batch_size, beam_size, length + 1], np.int32)
  scores = np.zeros([batch_size, beam_size])
  for b in range(batch_size):
    use_finished = any(f for _, _, f in finished[b])
    for k in range(beam_size):
      seq, score = ((finished[b][k][0], finished[b][k][1]) if use_finished else alive[b][k])
      ids[b, k, :len(seq)] = seq
      scores[b, k] = score
  return ids, scores


def _search(model, batch_size, beam_size, alpha, length, jit=False):
  def run():
    return beam_search.sequence_beam_search(
        model.symbols_to_logits_fn, tf.zeros([batch_size], tf.int32),
        model.initial_cache(batch_size), model.vocab_size, beam_size, alpha, length, EOS)
  if jit:
    return tf.function(run, jit_compile=True)()
  return run()


@pytest.mark.parametrize("batch_size,beam_size,alpha,length,vocab_size,eos_scale,seed", [
    (2, 3, 0.6, 6, 7, 1.0, 0),
    (3, 2, 0.0, 5, 6, 1.0, 1),
    (2, 4, 1.0, 7, 9, 1.5, 2),   # EOS likely: many finished beams, early stop.
    (2, 2, 0.6, 6, 8, 0.0, 3),   # EOS logit only from the history/row terms.
    (1, 1, 0.6, 5, 5, 1.0, 4),
])
def test_beam_search_matches_numpy_reference(batch_size, beam_size, alpha, length, vocab_size,
                                             eos_scale, seed):
  model = TableModel(vocab_size, length, batch_size, seed, eos_scale)
  ids, scores = _search(model, batch_size, beam_size, alpha, length)
  assert ids.shape == (batch_size, beam_size, length + 1) and ids.dtype == tf.int32
  assert scores.shape == (batch_size, beam_size) and scores.dtype == tf.float32
  ref_ids, ref_scores = reference_beam_search(model, batch_size, beam_size, alpha, length)
  np.testing.assert_array_equal(ids.numpy(), ref_ids)
  np.testing.assert_allclose(scores.numpy(), ref_scores, rtol=1e-5)


def test_beam_search_compiles_with_xla_and_matches_eager():
  model = TableModel(8, 6, 2, seed=5)
  eager = _search(model, 2, 3, 0.6, 6)
  compiled = _search(model, 2, 3, 0.6, 6, jit=True)
  np.testing.assert_array_equal(compiled[0].numpy(), eager[0].numpy())
  np.testing.assert_allclose(compiled[1].numpy(), eager[1].numpy(), rtol=1e-5)


def test_dynamic_batch_size_in_a_graph():
  model = TableModel(6, 4, 3, seed=6)

  @tf.function(input_signature=[tf.TensorSpec([None], tf.int32)])
  def run(initial_ids):
    batch = tf.shape(initial_ids)[0]
    cache = {"previous": -tf.ones([batch, 1]),
             "row": tf.cast(tf.range(batch), tf.float32)[:, tf.newaxis]}
    return beam_search.sequence_beam_search(model.symbols_to_logits_fn, initial_ids, cache,
                                            6, 2, 0.6, 4, EOS)

  ids, scores = run(tf.zeros([3], tf.int32))
  ref_ids, ref_scores = reference_beam_search(model, 3, 2, 0.6, 4)
  np.testing.assert_array_equal(ids.numpy(), ref_ids)
  np.testing.assert_allclose(scores.numpy(), ref_scores, rtol=1e-5)


# ----------------------------------------------------------------------------
# Hand-made models with known answers.


def _markov_fn(log_probs):
  """symbols_to_logits_fn whose next-token log probabilities depend on the last token only."""
  table = tf.constant(np.log(np.maximum(log_probs, 1e-9)), tf.float32)
  return lambda ids, i, cache: (tf.gather(table, ids[:, 0]), cache)


# Tokens: 0 start, 1 EOS, 2 "A", 3 "B". Greedy takes A (0.55) and then has
# only weak continuations; B (0.45) is followed by EOS with 0.99.
KNOWN = np.array([[0.0, 0.0, 0.55, 0.45],    # after the start token
                  [1.0, 0.0, 0.0, 0.0],      # after EOS (never used)
                  [0.0, 0.34, 0.33, 0.33],   # after A
                  [0.0, 0.99, 0.005, 0.005]])  # after B


def test_beam_search_finds_the_best_sequence_where_greedy_does_not():
  fn = _markov_fn(KNOWN)
  ids, scores = beam_search.sequence_beam_search(fn, tf.zeros([1], tf.int32), {}, 4, 2, 0.6,
                                                 5, EOS)
  np.testing.assert_array_equal(ids[0, 0].numpy(), [0, 3, 1, 0, 0, 0])
  expected = np.log(0.45 * 0.99) / ((5.0 + 2) / 6.0) ** 0.6
  np.testing.assert_allclose(scores[0, 0].numpy(), expected, rtol=1e-5)
  greedy_ids, greedy_scores = beam_search.greedy_search(fn, tf.zeros([1], tf.int32), {}, 4, 5,
                                                        EOS, alpha=0.6)
  np.testing.assert_array_equal(greedy_ids[0].numpy(), [0, 2, 1, 0, 0, 0])
  np.testing.assert_allclose(greedy_scores[0].numpy(),
                             np.log(0.55 * 0.34) / ((5.0 + 2) / 6.0) ** 0.6, rtol=1e-5)


def test_eos_first_finishes_at_once_and_pads_with_zeros():
  probs = np.full((4, 4), 0.1)
  probs[:, EOS] = 0.7
  ids, scores = beam_search.sequence_beam_search(_markov_fn(probs), tf.zeros([2], tf.int32), {},
                                                 4, 2, 0.6, 6, EOS)
  np.testing.assert_array_equal(ids[:, 0].numpy(), [[0, 1, 0, 0, 0, 0, 0]] * 2)
  np.testing.assert_allclose(scores[:, 0].numpy(), [np.log(0.7) / (1.0 ** 0.6)] * 2, rtol=1e-5)


def test_no_finished_sequence_returns_alive_beams_with_raw_log_probs():
  # EOS (and 0) get ~0 probability and 4 other tokens fill the 2 * beam candidates.
  probs = np.array([[0, 0, 0.5, 0.3, 0.15, 0.05],
                    [0, 0, 0.25, 0.25, 0.25, 0.25],
                    [0, 0, 0.2, 0.7, 0.05, 0.05],    # after 2
                    [0, 0, 0.9, 0.04, 0.03, 0.03],   # after 3
                    [0, 0, 0.25, 0.25, 0.25, 0.25],
                    [0, 0, 0.25, 0.25, 0.25, 0.25]])
  ids, scores = beam_search.sequence_beam_search(_markov_fn(probs), tf.zeros([1], tf.int32), {},
                                                 6, 2, 0.6, 2, EOS)
  np.testing.assert_array_equal(ids[0].numpy(), [[0, 2, 3], [0, 3, 2]])
  np.testing.assert_allclose(scores[0].numpy(), np.log([0.5 * 0.7, 0.3 * 0.9]), rtol=1e-5)


def _eos_never_runner_up_table(vocab_size, seed):
  """Random log-probability table where EOS is either the best token or the worst."""
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(vocab_size, vocab_size))
  top = logits.max(axis=1)
  low = logits.min(axis=1)
  eos_first = rng.random(vocab_size) < 0.3
  logits[:, EOS] = np.where(eos_first, top + 1.0, low - 1.0)
  return np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_size_one_equals_greedy_when_eos_is_never_the_runner_up(seed):
  fn = _markov_fn(_eos_never_runner_up_table(6, seed))
  initial = tf.zeros([3], tf.int32)
  beam_ids, beam_scores = beam_search.sequence_beam_search(fn, initial, {}, 6, 1, 0.0, 8, EOS)
  greedy_ids, greedy_scores = beam_search.greedy_search(fn, initial, {}, 6, 8, EOS)
  np.testing.assert_array_equal(beam_ids[:, 0].numpy(), greedy_ids.numpy())
  np.testing.assert_allclose(beam_scores[:, 0].numpy(), greedy_scores.numpy(), rtol=1e-5)


def test_beam_size_one_is_not_greedy_when_eos_is_the_runner_up():
  # Documented: 2 * beam candidates per step, so an EOS in second place finishes.
  probs = np.array([[0.0, 0.4, 0.6, 0.0],    # start: A 0.6, EOS 0.4
                    [1.0, 0.0, 0.0, 0.0],
                    [0.0, 0.1, 0.1, 0.8],    # after A: B 0.8
                    [0.0, 0.1, 0.0, 0.9]])   # after B: B 0.9 (EOS 0.1)
  fn = _markov_fn(probs)
  beam_ids, _ = beam_search.sequence_beam_search(fn, tf.zeros([1], tf.int32), {}, 4, 1, 0.0, 4,
                                                 EOS)
  greedy_ids, _ = beam_search.greedy_search(fn, tf.zeros([1], tf.int32), {}, 4, 4, EOS)
  np.testing.assert_array_equal(beam_ids[0, 0].numpy(), [0, 1, 0, 0, 0])
  np.testing.assert_array_equal(greedy_ids[0].numpy(), [0, 2, 3, 3, 3])


def test_greedy_search_stops_rows_at_eos_and_compiles_with_xla():
  probs = _eos_never_runner_up_table(7, seed=4)
  fn = _markov_fn(probs)
  initial = tf.constant([0, 2, 3], tf.int32)
  run = lambda: beam_search.greedy_search(fn, initial, {}, 7, 6, EOS, alpha=0.6)
  ids, scores = run()
  compiled_ids, compiled_scores = tf.function(run, jit_compile=True)()
  np.testing.assert_array_equal(compiled_ids.numpy(), ids.numpy())
  np.testing.assert_allclose(compiled_scores.numpy(), scores.numpy(), rtol=1e-5)
  for row, start in enumerate([0, 2, 3]):  # NumPy argmax decoding.
    sequence, log_prob, token = [start], 0.0, start
    for _ in range(6):
      token = int(np.argmax(probs[token]))
      sequence.append(token)
      log_prob += np.log(probs[sequence[-2], token])
      if token == EOS:
        break
    expected = np.zeros(7, np.int32)
    expected[:len(sequence)] = sequence
    np.testing.assert_array_equal(ids[row].numpy(), expected)
    if token == EOS:
      log_prob /= ((5.0 + len(sequence) - 1) / 6.0) ** 0.6
    np.testing.assert_allclose(scores[row].numpy(), log_prob, rtol=1e-4)


def test_bad_arguments_are_rejected():
  fn = _markov_fn(KNOWN)
  with pytest.raises(ValueError, match="beam_size"):
    beam_search.sequence_beam_search(fn, tf.zeros([1], tf.int32), {}, 4, 0, 0.6, 5, EOS)
  with pytest.raises(ValueError, match="max_decode_length"):
    beam_search.sequence_beam_search(fn, tf.zeros([1], tf.int32), {}, 4, 2, 0.6, None, EOS)
  with pytest.raises(ValueError, match="vocab_size"):
    beam_search.greedy_search(fn, tf.zeros([1], tf.int32), {}, 5, 3, EOS)
