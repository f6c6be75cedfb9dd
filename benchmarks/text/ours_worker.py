"""One measurement of OUR side of the Transformer comparison; prints ONE JSON line.

Run by benchmarks/text/compare_transformer.py as a subprocess (a fresh process per
measurement), in the main Python environment (TF 2.21, Keras 3). Modes:

  train_step  our `transformer` model (the `transformer_base` shape by default)
              and `translation` task through the real Trainer, via
              `tpu_models.training.benchmark.train_throughput`: the task's
              synthetic batch (packing off, every token real), its
              label-smoothed loss summed over real target tokens, the
              Trainer's AdamW with weight decay 0 (= Adam), constant lr.
  decode      `TransformerModel.translate` (encoder once, the decoder with its
              pre-allocated key/value cache, `tpu_models.text.beam_search`) in
              one tf.function (XLA off, as every side) on the fixed source batch.

    python benchmarks/text/ours_worker.py --mode train_step --precision bfloat16
    python benchmarks/text/ours_worker.py --mode decode --layers 1 --vocab 1000
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import experiment as shared  # pylint: disable=g-import-not-at-top  (puts benchmarks/ on the path)
import harness

sys.path.insert(0, harness.REPO)  # This tree's tpu_models.


def model_params(args) -> dict:
  """Our `transformer` builder's arguments for the comparison's shape."""
  return {"vocab_size": args.vocab, "num_encoder_layers": args.layers,
          "num_decoder_layers": args.layers, "hidden_size": args.hidden,
          "num_heads": args.heads, "filter_size": args.filter, "dropout": shared.DROPOUT,
          "attention_dropout": shared.DROPOUT, "activation_dropout": shared.DROPOUT,
          "share_embeddings": True, "pre_layer_norm": True,
          "max_length": max(256, args.decode_length, args.source_length, args.target_length)}


def experiment(args) -> dict:
  """The translation experiment measured by train_step (benchmarks/README.md)."""
  return harness.our_experiment(
      {"name": "translation",
       "model": {"name": "transformer", **model_params(args)},
       "max_input_length": args.source_length, "max_target_length": args.target_length,
       "packing": False,  # Every row one pair of full length: all tokens real.
       "label_smoothing": shared.LABEL_SMOOTHING, "eval_bleu": False,
       "train_data": {"global_batch_size": args.batch}},
      optimizer={"name": "adamw", "weight_decay": 0.0, "beta_1": shared.ADAM_BETA_1,
                 "beta_2": shared.ADAM_BETA_2, "epsilon": shared.ADAM_EPSILON},
      learning_rate=shared.LEARNING_RATE, precision=args.precision)


def train_step(args) -> dict:
  _, result = harness.our_train_throughput(experiment(args), args, peak=False)
  # train_throughput does not hand the model out; its parameter count is the builder's.
  from tpu_models.registry import create_model  # pylint: disable=g-import-not-at-top
  params = harness.trainable_parameters(create_model("transformer", **model_params(args)))
  tokens = args.batch * args.target_length  # Real target tokens per step (no padding).
  return {
      "tokens_per_second": result["examples_per_second"] * args.target_length,
      "step_seconds": result["step_seconds"],
      "tokens_per_step": tokens,
      "page_faults_per_step": result["page_faults_per_step"],
      "params": params,
      "device": result["device"],
  }


def decode(args) -> dict:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tpu_models.registry import create_model  # pylint: disable=g-import-not-at-top
  from tpu_models.training import precision  # pylint: disable=g-import-not-at-top
  with precision.precision_policy(args.precision):
    model = create_model("transformer", **model_params(args))
  sources, _ = shared.sources_and_targets(args)
  sources = tf.constant(sources)
  eos = shared.unreachable_eos(args)

  @tf.function(autograph=False, jit_compile=False)
  def search(inputs):
    return model.translate(inputs, beam_size=args.beam, alpha=args.alpha,
                           max_decode_length=args.decode_length, eos_id=eos)

  result, out = shared.time_searches(lambda: search(sources)["ids"].numpy(), args)
  if out.shape != (args.batch, args.decode_length) or (out == 0).any():
    raise AssertionError(f"expected {args.batch} x {args.decode_length} decoded ids without "
                         f"EOS/padding, got shape {out.shape}, {(out == 0).sum()} zeros")
  return {**result, "params": harness.trainable_parameters(model),
          "policy": model.dtype_policy.name}


MODES = {"train_step": train_step, "decode": decode}


def main(argv=None):
  args = shared.parse_args("One measurement of our Transformer side; prints one JSON line.",
                           argv)
  start = time.perf_counter()
  result = MODES[args.mode](args)
  harness.print_result(result, args, start, side="ours")


if __name__ == "__main__":
  main()
