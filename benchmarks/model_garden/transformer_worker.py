"""One measurement of TF Model Garden's Transformer (Seq2SeqTransformer); prints ONE JSON line.

Runs INSIDE benchmarks/.venv-model-garden (see setup_venv.sh): Model Garden
needs Keras 2 (`tf_keras`). The model is what their `TranslationTask.build_model`
builds (`official.nlp.modeling.models.Seq2SeqTransformer` around their
`TransformerEncoder` / `TransformerDecoder`: pre-LN, attention without biases,
one shared embedding for both sides and the softmax, sinusoidal positions),
with the sizes and dropout of the comparison (benchmarks/text/experiment.py).
Their task itself needs a SentencePiece model of the vocabulary size, so the
steps are written out here, following `TranslationTask.train_step`:

  train_step  GradientTape over `model(inputs, training=True)` and the loss
              of their translation task computed as their
              `_padded_cross_entropy_loss` does (one-hot soft targets,
              label smoothing 0.1, summed over real tokens / their count),
              `tf_keras.optimizers.Adam`, several steps per tf.function call,
              the mixed precision policy set as their trainer sets it
              (`performance.set_mixed_precision_policy`). XLA off.
  decode      `model({"inputs": sources})` in inference mode: their
              `ops.beam_search.sequence_beam_search` with their decoder cache,
              `padded_decode=False` (their default off TPU), decode_max_length
              = the comparison's decode length, EOS id = vocab (unreachable).

    benchmarks/.venv-model-garden/bin/python benchmarks/model_garden/transformer_worker.py \\
        --mode train_step --precision bfloat16
"""

import math
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The shared flags and batch live in benchmarks/text (standard library + NumPy only).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "text"))
import experiment as shared  # pylint: disable=g-import-not-at-top
import harness

import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tf_keras

from official.modeling import performance
from official.nlp.modeling import models


def seq2seq_transformer(args, eos_id: int):
  """Seq2SeqTransformer as TranslationTask.build_model assembles it, at the comparison's size."""
  layer_kwargs = dict(num_layers=args.layers, num_attention_heads=args.heads,
                      intermediate_size=args.filter, activation="relu",
                      dropout_rate=shared.DROPOUT, attention_dropout_rate=shared.DROPOUT,
                      intermediate_dropout=shared.DROPOUT, use_bias=False, norm_first=True,
                      norm_epsilon=shared.LAYER_NORM_EPSILON)
  model = models.Seq2SeqTransformer(
      vocab_size=args.vocab, embedding_width=args.hidden, dropout_rate=shared.DROPOUT,
      padded_decode=False, decode_max_length=args.decode_length, beam_size=args.beam,
      alpha=args.alpha, encoder_layer=models.TransformerEncoder(**layer_kwargs),
      decoder_layer=models.TransformerDecoder(**layer_kwargs), eos_id=eos_id)
  sources, targets = shared.sources_and_targets(args)
  model({"inputs": sources[:1], "targets": targets[:1]})  # Builds the variables.
  return model


def padded_cross_entropy_loss(logits, labels, smoothing, vocab_size):
  """Their translation loss, computed the way `_padded_cross_entropy_loss` computes it.

  official/nlp/tasks/translation.py cannot be imported in this venv (its import
  chain reaches tensorflow_hub, which needs setuptools' pkg_resources), so the
  same computation is written here: a one-hot soft-target tensor [B, T, V]
  (1 - s on the label, s / (V - 1) elsewhere), `softmax_cross_entropy_with_logits`,
  minus the entropy of the soft targets, weighted by label != 0.

  Returns:
    (float32 [B, T] per-token losses, float32 [B, T] weights).
  """
  confidence = 1.0 - smoothing
  low = smoothing / float(vocab_size - 1)
  soft_targets = tf.one_hot(tf.cast(labels, tf.int32), depth=vocab_size, on_value=confidence,
                            off_value=low)
  xentropy = tf.nn.softmax_cross_entropy_with_logits(logits=logits, labels=soft_targets)
  entropy = -(confidence * math.log(confidence) + (vocab_size - 1) * low * math.log(low + 1e-20))
  weights = tf.cast(tf.not_equal(labels, 0), tf.float32)
  return (xentropy - entropy) * weights, weights


def train_step(args) -> dict:
  model = seq2seq_transformer(args, eos_id=1)
  optimizer = tf_keras.optimizers.Adam(shared.LEARNING_RATE, beta_1=shared.ADAM_BETA_1,
                                       beta_2=shared.ADAM_BETA_2, epsilon=shared.ADAM_EPSILON)
  sources, targets = shared.sources_and_targets(args)
  dataset = tf.data.Dataset.from_tensors(
      {"inputs": tf.constant(sources), "targets": tf.constant(targets)}).repeat()

  def step(inputs):
    # TranslationTask.train_step (one replica, bfloat16 needs no loss scaling).
    with tf.GradientTape() as tape:
      logits = model(inputs, training=True)
      xentropy, weights = padded_cross_entropy_loss(logits, inputs["targets"],
                                                    shared.LABEL_SMOOTHING, args.vocab)
      loss = tf.reduce_sum(xentropy) / tf.reduce_sum(weights)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(list(zip(grads, model.trainable_variables)))
    return loss

  # Several steps per call, like their orbit trainer and our Trainer.
  result = shared.time_train_steps(harness.host_loop(step, dataset), args)
  return dict(result, params=harness.trainable_parameters(model),
              optimizer=type(optimizer).__name__)


def decode(args) -> dict:
  model = seq2seq_transformer(args, eos_id=shared.unreachable_eos(args))
  sources, _ = shared.sources_and_targets(args)
  sources = tf.constant(sources)

  @tf.function
  def search(inputs):
    return model({"inputs": inputs}, training=False)

  result, out = shared.time_searches(lambda: search(sources)["outputs"].numpy(), args)
  if out.shape != (args.batch, args.decode_length):
    raise AssertionError(f"expected {args.batch} x {args.decode_length} decoded ids, got "
                         f"shape {out.shape}")
  return {**result, "params": harness.trainable_parameters(model)}


MODES = {"train_step": train_step, "decode": decode}


def main(argv=None):
  args = shared.parse_args(
      "One measurement of Model Garden's Transformer side; prints one JSON line.", argv)
  # As their trainer: the policy is set before the model is built.
  performance.set_mixed_precision_policy(args.precision)
  start = time.perf_counter()
  result = MODES[args.mode](args)
  harness.print_result(result, args, start, packages=harness.MODEL_GARDEN_PACKAGES,
                       side="model_garden",
                       policy=tf_keras.mixed_precision.global_policy().name)


if __name__ == "__main__":
  main()
