"""One measurement of a Transformer-base assembled from keras-hub layers; prints ONE JSON line.

Run by benchmarks/text/compare_transformer.py as a subprocess, in the main Python
environment with keras-hub beside it (`pip install -e ".[bench]"`). keras-hub
has no encoder-decoder translation model to build from scratch, so this is
what a keras-hub user assembles from its layers (the way its BART is built):

  one `keras_hub.layers.ReversibleEmbedding` (tie_weights: the source and
  target embedding and, reversed, the softmax), scaled by sqrt(d), plus
  `keras_hub.layers.SinePositionEncoding`, dropout 0.1; `--layers` x
  `TransformerEncoder` and `TransformerDecoder` (normalize_first=True = pre-LN,
  LayerNorm epsilon 1e-6, dropout 0.1) and a final LayerNormalization after
  each stack, as ours and Model Garden's. Its attention layers have biases
  (Keras' MultiHeadAttention), ours and Model Garden's do not: 4 x d more
  parameters per attention (36,864 at the base size; asserted). Its
  `dropout` covers attention probabilities and sublayer outputs; it has no
  dropout after the FFN activation (ours and Model Garden's have 0.1).

  train_step  GradientTape step, Keras 3's Adam, the stock Keras label-smoothed
              loss (`keras.losses.CategoricalCrossentropy(from_logits=True,
              label_smoothing=0.1)` on one-hot targets, summed over real tokens /
              their count), several steps per tf.function call, XLA off.
  decode      `keras_hub.samplers.BeamSampler` over the decoder with
              keras-hub's key/value caches (per layer [N, 2, L, heads, depth]
              self-attention cache, and the cross-attention cache filled once
              from the encoder output), the way keras-hub's BART generates.
              BeamSampler has no length penalty (alpha unused: with no beam
              finishing, every side ranks equal-length beams by log
              probability alone) and repeats/reorders the whole cache, the
              cross-attention cache included, with the beams. No stop token:
              it decodes exactly --decode-length steps.

    python benchmarks/text/keras_hub_worker.py --mode train_step --precision bfloat16
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import experiment as shared  # pylint: disable=g-import-not-at-top  (puts benchmarks/ on the path)
import harness

sys.path.insert(0, harness.REPO)  # This tree's tpu_models (its precision policy).


def build_model(args):
  """The keras-hub Transformer as a keras.Model with encode / decode_step methods."""
  import keras  # pylint: disable=g-import-not-at-top
  import keras_hub  # pylint: disable=g-import-not-at-top
  from keras import ops  # pylint: disable=g-import-not-at-top

  d = args.hidden

  class KerasHubTransformer(keras.Model):
    """Encoder-decoder from keras-hub layers; see the module docstring."""

    def __init__(self):
      super().__init__(name="keras_hub_transformer")
      self.embedding = keras_hub.layers.ReversibleEmbedding(
          args.vocab, d, tie_weights=True,
          embeddings_initializer=keras.initializers.RandomNormal(stddev=d ** -0.5),
          name="shared_embedding")
      self.positions = keras_hub.layers.SinePositionEncoding(name="positions")
      self.embedding_dropout = keras.layers.Dropout(shared.DROPOUT)
      layer = dict(intermediate_dim=args.filter, num_heads=args.heads, dropout=shared.DROPOUT,
                   normalize_first=True, layer_norm_epsilon=shared.LAYER_NORM_EPSILON)
      self.encoder_layers = [keras_hub.layers.TransformerEncoder(**layer, name=f"encoder_{i}")
                             for i in range(args.layers)]
      self.decoder_layers = [keras_hub.layers.TransformerDecoder(**layer, name=f"decoder_{i}")
                             for i in range(args.layers)]
      self.encoder_norm = keras.layers.LayerNormalization(epsilon=shared.LAYER_NORM_EPSILON)
      self.decoder_norm = keras.layers.LayerNormalization(epsilon=shared.LAYER_NORM_EPSILON)

    def embed(self, ids, start_index=0, training=False):
      x = self.embedding(ids) * ops.cast(d ** 0.5, self.compute_dtype)
      x = x + ops.cast(self.positions(x, start_index=start_index), x.dtype)
      return self.embedding_dropout(x, training=training)

    def encode(self, sources, training=False):
      mask = ops.not_equal(sources, 0)
      x = self.embed(sources, training=training)
      for layer in self.encoder_layers:
        x = layer(x, padding_mask=mask, training=training)
      return self.encoder_norm(x), mask

    def call(self, features, training=False):
      memory, mask = self.encode(features["inputs"], training)
      targets = features["targets"]
      shifted = ops.pad(targets, [[0, 0], [1, 0]])[:, :-1]  # 0 = start token, as the others.
      x = self.embed(shifted, training=training)
      for layer in self.decoder_layers:
        x = layer(x, memory, encoder_padding_mask=mask, training=training)
      return ops.cast(self.embedding(self.decoder_norm(x), reverse=True), "float32")

  model = KerasHubTransformer()
  sources, targets = shared.sources_and_targets(args)
  model({"inputs": sources[:1], "targets": targets[:1]})  # Builds the variables.
  return model


def train_step(args, model) -> dict:
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  optimizer = keras.optimizers.Adam(shared.LEARNING_RATE, beta_1=shared.ADAM_BETA_1,
                                    beta_2=shared.ADAM_BETA_2, epsilon=shared.ADAM_EPSILON)
  optimizer.build(model.trainable_variables)
  loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True,
                                                 label_smoothing=shared.LABEL_SMOOTHING,
                                                 reduction="sum")
  sources, targets = shared.sources_and_targets(args)
  dataset = tf.data.Dataset.from_tensors(
      {"inputs": tf.constant(sources), "targets": tf.constant(targets)}).repeat()

  def step(features):
    labels = features["targets"]
    weights = tf.cast(tf.not_equal(labels, 0), tf.float32)
    with tf.GradientTape() as tape:
      logits = model(features, training=True)
      loss = loss_fn(tf.one_hot(labels, args.vocab), logits, sample_weight=weights)
      loss = loss / tf.reduce_sum(weights)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  return shared.time_train_steps(harness.host_loop(step, dataset), args)


def decode(args, model) -> dict:
  import keras_hub  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from keras import ops  # pylint: disable=g-import-not-at-top
  sources, _ = shared.sources_and_targets(args)
  sources = tf.constant(sources)
  length = args.decode_length + 1  # The start token (0) at position 0, then the decoded ids.
  heads, depth = args.heads, args.hidden // args.heads
  sampler = keras_hub.samplers.BeamSampler(num_beams=args.beam)
  dtype = model.compute_dtype

  def generate(inputs):
    batch = ops.shape(inputs)[0]
    memory, mask = model.encode(inputs)
    start = ops.zeros([batch, 1], "int32")
    # Seed pass (as keras-hub's BART builds its cache): the start token through
    # every layer fills the cross-attention caches from the encoder output.
    x = model.embed(start)
    self_caches, cross_caches = [], []
    for layer in model.decoder_layers:
      x, self_cache, cross_cache = layer(
          x, memory, encoder_padding_mask=mask,
          self_attention_cache=ops.zeros([batch, 2, length, heads, depth], dtype),
          self_attention_cache_update_index=0,
          cross_attention_cache=ops.zeros([batch, 2, ops.shape(memory)[1], heads, depth],
                                          dtype),
          cross_attention_cache_update_index=0)
      self_caches.append(self_cache)
      cross_caches.append(cross_cache)

    def next_logits(prompt, cache, index):
      self_caches, cross_caches = cache
      rows = ops.shape(prompt)[0]
      beams = rows // batch
      # As BART's generate step: the encoder output and mask repeated to the beams
      # (the cross-attention reads its keys/values from the cache).
      beam_memory = ops.repeat(memory, beams, axis=0)
      beam_mask = ops.repeat(mask, beams, axis=0)
      x = model.embed(prompt[:, index - 1:index], start_index=index - 1)
      new_self, new_cross = [], []
      for layer, self_cache, cross_cache in zip(model.decoder_layers, self_caches, cross_caches):
        x, self_cache, cross_cache = layer(
            x, beam_memory, encoder_padding_mask=beam_mask, self_attention_cache=self_cache,
            self_attention_cache_update_index=index - 1, cross_attention_cache=cross_cache,
            cross_attention_cache_update_index=None)
        new_self.append(self_cache)
        new_cross.append(cross_cache)
      logits = model.embedding(model.decoder_norm(x), reverse=True)[:, 0, :]
      return ops.cast(logits, "float32"), None, (tuple(new_self), tuple(new_cross))

    prompt = ops.zeros([batch, length], "int32")
    return sampler(next_logits, prompt, cache=(tuple(self_caches), tuple(cross_caches)),
                   index=1, stop_token_ids=None)

  search = tf.function(generate, jit_compile=False)
  result, out = shared.time_searches(lambda: search(sources).numpy(), args)
  if out.shape != (args.batch, length):
    raise AssertionError(f"expected {args.batch} x {length} ids, got shape {out.shape}")
  return result


MODES = {"train_step": train_step, "decode": decode}


def main(argv=None):
  args = shared.parse_args("One measurement of the keras-hub Transformer side; prints one "
                           "JSON line.", argv)
  harness.require_keras_hub()
  from tpu_models.training import precision  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  with precision.precision_policy(args.precision):
    model = build_model(args)
  params = harness.trainable_parameters(model)
  result = MODES[args.mode](args, model)
  harness.print_result(result, args, start, packages=("tensorflow", "keras", "keras-hub"),
                       side="keras_hub", params=params,
                       attention_bias_params=shared.expected_keras_hub_extra_parameters(args),
                       policy=model.dtype_policy.name)


if __name__ == "__main__":
  main()
