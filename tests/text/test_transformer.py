"""Tests of the Transformer family (tpu_models/text/transformer.py and the modules it builds on).

Tiny sizes (d 32, 2 heads, 2+2 layers, vocabulary 20) keep the file fast on
two CPU cores; dropout is off unless a test trains.
"""

import inspect
import typing

import keras
import numpy as np
import pytest
import tensorflow as tf

from tpu_models.layers.attention import MultiHeadAttention
from tpu_models.text import transformer as tr
from tpu_models.text import beam_search
from tpu_models.registry import MODELS
from tpu_models.text.inputs import EOS_ID
from tpu_models.text.model_base import shift_right

VOCAB = 20
TINY = dict(vocab_size=VOCAB, num_encoder_layers=2, num_decoder_layers=2, hidden_size=32,
            num_heads=2, filter_size=64, dropout=0.0, attention_dropout=0.0,
            activation_dropout=0.0, max_length=32)
TINY_LM = dict(vocab_size=VOCAB, num_layers=2, hidden_size=32, num_heads=2, filter_size=64,
               dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, max_length=32)
BUILDERS = ("transformer", "transformer_tiny", "transformer_base", "transformer_big",
            "transformer_lm", "transformer_lm_tiny", "transformer_lm_small")


def _model(**overrides):
  keras.utils.set_random_seed(0)
  return tr.transformer(**{**TINY, **overrides})


def _lm(**overrides):
  keras.utils.set_random_seed(0)
  return tr.transformer_lm(**{**TINY_LM, **overrides})


def _sequences(rng, batch, length, min_length=1):
  """Random ids in [3, VOCAB) of random lengths, then EOS, 0-padded to `length`."""
  ids = np.zeros([batch, length], np.int32)
  for row in range(batch):
    n = rng.integers(min_length, length)  # Leaves room for EOS.
    ids[row, :n] = rng.integers(3, VOCAB, n)
    ids[row, n] = EOS_ID
  return ids


# ----------------------------------------------------------------------------
# Builders and sizes.


def test_builders_are_registered_with_keyword_only_typed_arguments():
  for name in BUILDERS:
    builder = MODELS.get(name)
    assert builder is getattr(tr, name)
    hints = typing.get_type_hints(builder)
    params = inspect.signature(builder).parameters
    assert params["vocab_size"].default is inspect.Parameter.empty  # Required.
    for param in params.values():
      assert param.kind == inspect.Parameter.KEYWORD_ONLY, (name, param)
      assert param.name in hints, (name, param)
  base = inspect.signature(tr.transformer_base).parameters
  big = inspect.signature(tr.transformer_big).parameters
  tiny = inspect.signature(tr.transformer_tiny).parameters
  assert (base["hidden_size"].default, base["num_heads"].default, base["filter_size"].default,
          base["num_encoder_layers"].default) == (512, 8, 2048, 6)
  assert (big["hidden_size"].default, big["num_heads"].default,
          big["filter_size"].default) == (1024, 16, 4096)
  assert tiny["hidden_size"].default == 256 and tiny["num_decoder_layers"].default == 3
  assert base["pre_layer_norm"].default is True and base["share_embeddings"].default is True


def test_bad_arguments_are_rejected():
  with pytest.raises(ValueError, match="divisible"):
    tr.transformer(**{**TINY, "num_heads": 3})
  with pytest.raises(ValueError, match="dropout"):
    tr.transformer(**{**TINY, "dropout": 1.5})
  with pytest.raises(TypeError):
    tr.transformer_tiny(vocab_size=10, not_a_knob=1)
  model = _model()
  with pytest.raises(KeyError, match="targets"):
    model({"inputs": tf.ones([1, 3], tf.int32)})
  with pytest.raises(ValueError, match="segment_ids"):
    model({"inputs": tf.ones([1, 3], tf.int32), "targets": tf.ones([1, 3], tf.int32),
           "inputs_segment_ids": tf.ones([1, 3], tf.int32)})
  with pytest.raises(ValueError, match="max_decode_length"):
    model.translate(tf.ones([1, 3], tf.int32), max_decode_length=33)
  with pytest.raises(ValueError, match="max_length"):
    _lm().generate(tf.ones([1, 30], tf.int32), max_new_tokens=5)
  with pytest.raises(ValueError, match="method"):
    _lm().generate(tf.ones([1, 3], tf.int32), max_new_tokens=5, method="nucleus")


def _expected_params(vocab, d, ffn, encoder_layers, decoder_layers, shared=True, pre_ln=True):
  attention = 4 * d * d  # Q, K, V, output; no biases.
  feed_forward = d * ffn + ffn + ffn * d + d
  norm = 2 * d
  encoder_layer = attention + feed_forward + 2 * norm
  decoder_layer = 2 * attention + feed_forward + 3 * norm
  embeddings = vocab * d * (1 if shared else 3)
  final_norms = 2 * norm if pre_ln else 0
  return (embeddings + encoder_layers * encoder_layer + decoder_layers * decoder_layer +
          final_norms)


def _count(model):
  return sum(int(np.prod(v.shape)) for v in model.trainable_weights)


def test_transformer_base_parameter_count():
  model = tr.transformer_base(vocab_size=32000)
  expected = _expected_params(32000, 512, 2048, 6, 6)
  assert _count(model) == expected
  # 60.5M: the paper's 65M counts a 37k vocabulary; Model Garden's base at its
  # 33,708 vocabulary is 61.4M by the same formula.
  assert 60e6 < expected < 63e6
  assert _expected_params(33708, 512, 2048, 6, 6) == pytest.approx(61.36e6, rel=1e-3)


def test_unshared_embeddings_and_post_ln_parameter_count():
  model = _model(share_embeddings=False, pre_layer_norm=False)
  assert _count(model) == _expected_params(VOCAB, 32, 64, 2, 2, shared=False, pre_ln=False)
  lm = _lm(share_embeddings=False)
  d, ffn = 32, 64
  assert _count(lm) == (2 * VOCAB * d + 2 * (4 * d * d + 2 * d * ffn + ffn + d + 4 * d) + 2 * d)


def test_attention_biases_are_opt_in_and_every_path_applies_them():
  """`use_bias` (the Vision Transformer's) adds biases; without it nothing changes."""
  from tpu_models.layers import attention
  plain = MultiHeadAttention(8, 2, True, name="self_attention")
  plain.build()
  assert [w.name for w in plain.weights] == ["qkv_kernel", "output_kernel"]
  x = tf.random.stateless_normal([2, 5, 8], [1, 2])
  memory = tf.random.stateless_normal([2, 3, 8], [3, 4])
  causal = attention.mask_to_bias(attention.causal_mask(5))
  for self_attention in (True, False):
    layer = MultiHeadAttention(8, 2, self_attention, use_bias=True)
    layer.build()
    bias = causal if self_attention else None
    names = {w.name for w in layer.weights if w.name.endswith("_bias")}
    assert names == ({"qkv_bias", "output_bias"} if self_attention
                     else {"query_bias", "key_value_bias", "output_bias"})
    zero_bias = layer(x, bias, memory=memory).numpy()
    output_bias = next(w for w in layer.weights if w.name == "output_bias")
    output_bias.assign(tf.range(8, dtype=tf.float32))
    # The output bias shifts every output by itself.
    np.testing.assert_allclose(layer(x, bias, memory=memory).numpy(),
                               zero_bias + np.arange(8), rtol=1e-5, atol=1e-5)
    for w in layer.weights:
      if w.name.endswith("_bias"):
        w.assign(tf.random.stateless_normal(w.shape, [5, len(w.name)]))
    full = layer(x, bias, memory=memory).numpy()
    if self_attention:  # The cached decoding path applies the same biases.
      cache = {k: tf.zeros([2, 2, 5, 4]) for k in ("key", "value")}
      decoded, _ = layer.decode_self(x, causal, cache, 0)
    else:
      decoded = layer.decode_cross(x, *layer.project_memory(memory), None)
    np.testing.assert_allclose(decoded.numpy(), full, rtol=1e-5, atol=1e-5)


def test_attention_biases_round_trip_through_the_object_graph_checkpoint(tmp_path):
  """Resume, evaluate and export restore `tf.train.Checkpoint(model=...)`: biases included."""
  layer = MultiHeadAttention(8, 2, True, use_bias=True)
  layer.build()
  for w in layer.weights:
    w.assign(tf.random.stateless_normal(w.shape, [7, len(w.name)]))
  path = tf.train.Checkpoint(layer=layer).save(str(tmp_path / "ckpt"))
  restored = MultiHeadAttention(8, 2, True, use_bias=True)
  restored.build()
  tf.train.Checkpoint(layer=restored).restore(path).assert_existing_objects_matched()
  for ours, saved in zip(restored.weights, layer.weights):
    np.testing.assert_array_equal(ours.numpy(), saved.numpy())


def test_variable_paths_are_stable_and_unique():
  paths = [v.path for v in _model().trainable_weights]
  assert len(paths) == len(set(paths))
  assert "transformer/shared_embedding/embeddings" in paths
  assert "transformer/encoder_layer_1/self_attention/qkv_kernel" in paths
  assert "transformer/decoder_layer_0/cross_attention/key_value_kernel" in paths
  assert "transformer/decoder_norm/gamma" in paths


def test_checkpoint_saves_and_restores_every_variable(tmp_path):
  for build in (_model, _lm):
    source = build()
    keras.utils.set_random_seed(1)
    target = (tr.transformer(**TINY) if build is _model else tr.transformer_lm(**TINY_LM))
    path = tf.train.Checkpoint(model=source).save(str(tmp_path / build.__name__))
    saved = [name for name, _ in tf.train.list_variables(path)
             if name.startswith("model/") and name.endswith("VARIABLE_VALUE")]
    # Layers live in attributes, not lists, so TF's object graph reaches all of them.
    assert len(saved) == len(source.trainable_weights)
    status = tf.train.Checkpoint(model=target).restore(path)
    status.assert_consumed()
    features = {"inputs": tf.constant([[5, 6, 1]]), "targets": tf.constant([[7, 8, 1]])}
    np.testing.assert_array_equal(target(features).numpy(), source(features).numpy())


# ----------------------------------------------------------------------------
# Masks: padding, causality, packing.


def test_logits_shape_dtype_and_padding_invariance():
  model = _model()
  rng = np.random.default_rng(0)
  inputs, targets = _sequences(rng, 3, 7), _sequences(rng, 3, 6)
  logits = model({"inputs": inputs, "targets": targets})
  assert logits.shape == (3, 6, VOCAB) and logits.dtype == tf.float32
  # More padding on either side changes nothing at the real positions.
  longer = model({"inputs": np.pad(inputs, [[0, 0], [0, 5]]),
                  "targets": np.pad(targets, [[0, 0], [0, 3]])})
  np.testing.assert_allclose(longer[:, :6].numpy(), logits.numpy(), rtol=1e-5, atol=1e-5)


def test_decoder_is_causal():
  model = _model()
  rng = np.random.default_rng(1)
  inputs, targets = _sequences(rng, 2, 6), _sequences(rng, 2, 8, min_length=7)
  logits = model({"inputs": inputs, "targets": targets}).numpy()
  for t in (0, 3, 5):
    changed = targets.copy()
    changed[:, t + 1:] = rng.integers(3, VOCAB, changed[:, t + 1:].shape)
    other = model({"inputs": inputs, "targets": changed}).numpy()
    # logits[:, t] reads targets[:, :t] only, so targets after t cannot matter.
    np.testing.assert_allclose(other[:, :t + 1], logits[:, :t + 1], rtol=1e-5, atol=1e-5)
    assert not np.allclose(other[:, t + 2:], logits[:, t + 2:], atol=1e-3)


def test_shift_right_restarts_at_each_packed_example():
  targets = tf.constant([[5, 6, 1, 7, 1, 0]])
  segments = tf.constant([[1, 1, 1, 2, 2, 0]])
  np.testing.assert_array_equal(shift_right(targets).numpy(), [[0, 5, 6, 1, 7, 1]])
  np.testing.assert_array_equal(shift_right(targets, segments).numpy(), [[0, 5, 6, 0, 7, 0]])


def _pack(rows):
  """Packs [(ids, length), ...] into one row with segment ids and positions."""
  ids, segments, positions = [], [], []
  for segment, row in enumerate(rows, 1):
    n = int(np.sum(row != 0))
    ids += list(row[:n])
    segments += [segment] * n
    positions += list(range(n))
  return (np.array([ids], np.int32), np.array([segments], np.int32),
          np.array([positions], np.int32))


def test_packed_row_gives_each_example_its_own_logits():
  model = _model()
  rng = np.random.default_rng(2)
  inputs, targets = _sequences(rng, 2, 6), _sequences(rng, 2, 5)
  alone = model({"inputs": inputs, "targets": targets}).numpy()
  packed_inputs, inputs_segments, inputs_positions = _pack(inputs)
  packed_targets, targets_segments, targets_positions = _pack(targets)
  pad = lambda a, n: np.pad(a, [[0, 0], [0, n]])  # Trailing padding in the packed row too.
  packed = model({"inputs": pad(packed_inputs, 2), "inputs_segment_ids": pad(inputs_segments, 2),
                  "inputs_positions": pad(inputs_positions, 2),
                  "targets": pad(packed_targets, 3), "targets_segment_ids": pad(targets_segments, 3),
                  "targets_positions": pad(targets_positions, 3)}).numpy()
  start = 0
  for row in range(2):
    n = int(np.sum(targets[row] != 0))
    np.testing.assert_allclose(packed[0, start:start + n], alone[row, :n], rtol=1e-5, atol=1e-5)
    start += n


def test_packed_row_gives_each_example_its_own_lm_logits():
  lm = _lm()
  rng = np.random.default_rng(3)
  targets = _sequences(rng, 3, 6)
  alone = lm({"targets": targets}).numpy()
  packed_targets, segments, positions = _pack(targets)
  packed = lm({"targets": packed_targets, "targets_segment_ids": segments,
               "targets_positions": positions}).numpy()
  start = 0
  for row in range(3):
    n = int(np.sum(targets[row] != 0))
    np.testing.assert_allclose(packed[0, start:start + n], alone[row, :n], rtol=1e-5, atol=1e-5)
    start += n


# ----------------------------------------------------------------------------
# Incremental decoding with the key/value cache.


@pytest.mark.parametrize("pre_layer_norm", [True, False])
def test_cached_decoding_equals_the_full_forward_pass(pre_layer_norm):
  model = _model(pre_layer_norm=pre_layer_norm)
  rng = np.random.default_rng(4)
  inputs, targets = _sequences(rng, 2, 6), _sequences(rng, 2, 7, min_length=6)
  full = model({"inputs": inputs, "targets": targets}).numpy()
  step_fn, cache = model.make_decoding_fn(tf.constant(inputs), max_decode_length=10)
  decoder_inputs = shift_right(tf.constant(targets))
  for i in range(7):
    logits, cache = step_fn(decoder_inputs[:, i:i + 1], tf.constant(i), cache)
    np.testing.assert_allclose(logits.numpy(), full[:, i], rtol=1e-4, atol=1e-5)


def test_lm_prefill_and_steps_equal_the_full_forward_pass():
  lm = _lm()
  rng = np.random.default_rng(5)
  targets = _sequences(rng, 2, 8, min_length=7)
  full = lm({"targets": targets}).numpy()
  decoder_inputs = shift_right(tf.constant(targets))
  cache = lm.init_cache(2, 12)
  logits, cache = lm.decode(decoder_inputs[:, :3], 0, cache)  # Prefill 3 positions.
  np.testing.assert_allclose(logits.numpy(), full[:, :3], rtol=1e-4, atol=1e-5)
  for i in range(3, 8):
    logits, cache = lm.decode(decoder_inputs[:, i:i + 1], tf.constant(i), cache)
    np.testing.assert_allclose(logits[:, 0].numpy(), full[:, i], rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------
# translate() and generate().


def _reference_greedy_translation(model, inputs, length):
  """Argmax decoding by full forward passes (no cache): targets grow one token at a time."""
  targets = np.zeros([inputs.shape[0], length], np.int32)
  done = np.zeros(inputs.shape[0], bool)
  for t in range(length):
    logits = model({"inputs": inputs, "targets": targets}).numpy()
    token = np.where(done, 0, logits[:, t].argmax(-1))
    targets[:, t] = token
    done |= token == EOS_ID
  return np.where(targets == EOS_ID, 0, targets)


def test_translate_with_beam_one_is_greedy_decoding():
  model = _model()
  inputs = _sequences(np.random.default_rng(6), 3, 6)
  out = model.translate(tf.constant(inputs), beam_size=1, max_decode_length=8)
  assert out["ids"].shape == (3, 8) and out["ids"].dtype == tf.int32
  assert out["scores"].shape == (3,) and out["scores"].dtype == tf.float32
  np.testing.assert_array_equal(out["ids"].numpy(),
                                _reference_greedy_translation(model, inputs, 8))


def test_translate_beam_search_equals_search_over_full_forward_passes():
  model = _model()
  inputs = tf.constant(_sequences(np.random.default_rng(7), 2, 6))
  length, beam = 6, 3
  out = model.translate(inputs, beam_size=beam, alpha=0.6, max_decode_length=length)

  def full_forward_fn(ids, i, cache):  # Keeps the whole history; no key/value cache.
    history = tf.where(tf.range(length + 1) == i, ids, cache["history"])
    logits = model({"inputs": cache["inputs"], "targets": history[:, 1:]})
    return tf.gather(logits, i, axis=1), {"history": history, "inputs": cache["inputs"]}

  cache = {"history": tf.zeros([2, length + 1], tf.int32), "inputs": inputs}
  ids, scores = beam_search.sequence_beam_search(full_forward_fn, tf.zeros([2], tf.int32), cache,
                                                 VOCAB, beam, 0.6, length, EOS_ID)
  expected = ids[:, 0, 1:].numpy()
  expected[np.cumsum(expected == EOS_ID, axis=1) > 0] = 0
  np.testing.assert_array_equal(out["ids"].numpy(), expected)
  np.testing.assert_allclose(out["scores"].numpy(), scores[:, 0].numpy(), rtol=1e-4)


def _train_copy_model(pre_layer_norm, steps, seed=0):
  """Trains a tiny model (with dropout) on copying its input; returns (model, losses)."""
  keras.utils.set_random_seed(seed)
  model = tr.transformer(**{**TINY, "num_encoder_layers": 1, "num_decoder_layers": 1,
                            "pre_layer_norm": pre_layer_norm, "dropout": 0.1})
  optimizer = keras.optimizers.Adam(1e-2)
  rng = np.random.default_rng(seed)

  @tf.function
  def train_step(ids):
    with tf.GradientTape() as tape:
      logits = model({"inputs": ids, "targets": ids}, training=True)
      weights = tf.cast(ids != 0, tf.float32)
      loss = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(
          ids, logits, from_logits=True) * weights) / tf.reduce_sum(weights)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  losses = [float(train_step(_sequences(rng, 32, 6))) for _ in range(steps)]
  return model, losses


@pytest.mark.parametrize("pre_layer_norm", [True, False])
def test_pre_ln_and_post_ln_learn_a_copy_task(pre_layer_norm):
  _, losses = _train_copy_model(pre_layer_norm, steps=50)
  assert np.isfinite(losses).all()
  assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses


def test_translate_and_generate_compile_with_xla():
  # Beam search compiles in the bfloat16 test below; here the greedy path.
  model = _model()
  inputs = tf.constant(_sequences(np.random.default_rng(8), 2, 5))

  def translate(x):
    return model.translate(x, beam_size=1, max_decode_length=6)

  eager = translate(inputs)
  compiled = tf.function(translate, jit_compile=True)(inputs)
  np.testing.assert_array_equal(compiled["ids"].numpy(), eager["ids"].numpy())
  np.testing.assert_allclose(compiled["scores"].numpy(), eager["scores"].numpy(), rtol=1e-4)

  lm = _lm()
  prompts = tf.constant([[5, 6, 7], [8, 0, 0]])

  def generate(p):  # Seeded sampling gives the same tokens compiled and eagerly.
    return lm.generate(p, 5, method="top_k", top_k=4, seed=3)

  np.testing.assert_array_equal(tf.function(generate, jit_compile=True)(prompts).numpy(),
                                generate(prompts).numpy())


def _reference_lm_greedy(lm, prompts, new_tokens):
  """Per row: argmax continuation by full forward passes (no cache)."""
  out = np.zeros([prompts.shape[0], prompts.shape[1] + new_tokens], np.int32)
  for row, prompt in enumerate(prompts):
    sequence = list(prompt[prompt != 0])
    for _ in range(new_tokens):
      logits = lm({"targets": np.array([sequence + [0]], np.int32)}).numpy()
      sequence.append(int(logits[0, -1].argmax()))
      if sequence[-1] == EOS_ID:
        break
    out[row, :len(sequence)] = sequence
  return out


def test_generate_continues_each_prompt_after_its_own_length():
  lm = _lm()
  prompts = np.array([[5, 6, 7, 8], [9, 0, 0, 0], [0, 0, 0, 0]], np.int32)
  generated = lm.generate(tf.constant(prompts), max_new_tokens=5).numpy()
  assert generated.shape == (3, 9) and generated.dtype == np.int32
  np.testing.assert_array_equal(generated, _reference_lm_greedy(lm, prompts, 5))
  # top_k=1 sampling is greedy; a fixed seed is reproducible.
  np.testing.assert_array_equal(
      lm.generate(tf.constant(prompts), 5, method="top_k", top_k=1, seed=0).numpy(), generated)
  sampled = lm.generate(tf.constant(prompts), 5, method="top_k", top_k=5, seed=7).numpy()
  np.testing.assert_array_equal(
      lm.generate(tf.constant(prompts), 5, method="top_k", top_k=5, seed=7).numpy(), sampled)
  np.testing.assert_array_equal(sampled[0, :4], prompts[0])


def test_generate_stops_a_row_after_eos():
  lm = _lm()
  # Make EOS the most likely token everywhere: the final norm outputs a constant
  # vector along EOS's (enlarged) embedding row.
  embeddings = lm.shared_embedding.embeddings
  eos_row = embeddings[EOS_ID] * 3.0
  embeddings.assign(tf.tensor_scatter_nd_update(embeddings, [[EOS_ID]], [eos_row]))
  lm.decoder_norm.gamma.assign(tf.zeros_like(lm.decoder_norm.gamma))
  lm.decoder_norm.beta.assign(eos_row / tf.norm(eos_row))
  prompts = np.array([[5, 6, 0], [7, 0, 0]], np.int32)
  out = lm.generate(tf.constant(prompts), max_new_tokens=4).numpy()
  np.testing.assert_array_equal(out, [[5, 6, EOS_ID, 0, 0, 0, 0],
                                      [7, EOS_ID, 0, 0, 0, 0, 0]])


# ----------------------------------------------------------------------------
# Mixed precision.


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_keeps_logits_float32(policy):
  keras.mixed_precision.set_global_policy(policy)
  model = _model()
  assert model.shared_embedding.embeddings.dtype == "float32"
  rng = np.random.default_rng(10)
  inputs, targets = _sequences(rng, 2, 6), _sequences(rng, 2, 5)
  packed_inputs, inputs_segments, _ = _pack(inputs)
  packed_targets, targets_segments, _ = _pack(targets)
  # Trailing padding makes fully masked query rows: they must stay finite in fp16.
  logits = model({"inputs": np.pad(packed_inputs, [[0, 0], [0, 3]]),
                  "inputs_segment_ids": np.pad(inputs_segments, [[0, 0], [0, 3]]),
                  "targets": np.pad(packed_targets, [[0, 0], [0, 3]]),
                  "targets_segment_ids": np.pad(targets_segments, [[0, 0], [0, 3]])})
  assert logits.dtype == tf.float32
  assert np.isfinite(logits.numpy()).all()

  def translate(x):
    return model.translate(x, beam_size=3, max_decode_length=4)

  # The TPU case (bfloat16) compiles the whole beam search with XLA.
  if policy == "mixed_bfloat16":
    translate = tf.function(translate, jit_compile=True)
  out = translate(tf.constant(inputs))
  assert out["scores"].dtype == tf.float32 and out["ids"].shape == (2, 4)
  assert np.isfinite(out["scores"].numpy()).all()
  lm = _lm()
  assert lm({"targets": targets}).dtype == tf.float32
  assert lm.generate(tf.constant(targets[:, :2]), 3).shape == (2, 5)
