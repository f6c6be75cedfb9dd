"""Transformer-base train step and beam search: ours vs TF Model Garden vs keras-hub.

Each measurement is a fresh subprocess printing one JSON line:

  ours          benchmarks/text/ours_worker.py, main Python (TF 2.21, Keras 3):
                train_step through our real Trainer (`translation` task,
                `transformer` model at the base size, synthetic batch);
                decode = `TransformerModel.translate` (key/value cache,
                tpu_models.text.beam_search).
  model_garden  benchmarks/model_garden/transformer_worker.py in
                benchmarks/.venv-model-garden (tf-models-official, tf_keras):
                `Seq2SeqTransformer` built as their TranslationTask builds it,
                their task's train step and loss; decode = the model's
                inference call (their sequence_beam_search and decoder cache).
  keras_hub     benchmarks/text/keras_hub_worker.py, main Python with
                keras-hub: TransformerEncoder/TransformerDecoder + a tied
                ReversibleEmbedding + SinePositionEncoding at the same size,
                plain GradientTape step; decode = keras_hub.samplers.BeamSampler
                with keras-hub's key/value caches.

Same experiment on every side (benchmarks/text/experiment.py): d 512,
6+6 layers, 8 heads, FFN 2048, a shared 32k vocabulary (one embedding matrix,
also the softmax), pre-LN, dropout 0.1, Adam, label smoothing 0.1; one fixed
batch of 16 x 64 source and 64 target tokens, all real, so tokens/step = 1024
target tokens on every side; beam 4, alpha 0.6, 16 sentences, exactly 64
decoded tokens per sentence (the EOS id is one past the vocabulary, so no beam
finishes early; keras-hub: no stop token). XLA off everywhere (CPU), float32
or the mixed_bfloat16 policy. The sides run ALTERNATELY (the order rotates
every round); report medians and per-round ratios (ours / side) of the same run.

    python benchmarks/text/compare_transformer.py                     # everything, 3 rounds
    python benchmarks/text/compare_transformer.py --modes decode --precisions bfloat16
    python benchmarks/text/compare_transformer.py --layers 1 --hidden 64 --heads 4 --filter 128 \\
        --vocab 1000 --batch 4 --source-length 16 --target-length 16 --decode-length 16 \\
        --rounds 1 --steps 2 --warmup 1                          # smoke test, ~2 min

Needs the Model Garden venv (bash benchmarks/model_garden/setup_venv.sh) and
keras-hub (pip install -e ".[bench]"), unless --sides leaves them out.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

import experiment as shared  # pylint: disable=g-import-not-at-top  (puts benchmarks/ on the path)
import harness
from harness import fmt, median

SIDES = ("ours", "model_garden", "keras_hub")
MODES = shared.MODES
LABELS = {"ours": "ours (tpu_models, Keras 3)", "model_garden": "Model Garden (tf_keras)",
          "keras_hub": "keras-hub layers (Keras 3)"}
WORKERS = {"ours": [sys.executable, os.path.join(HERE, "ours_worker.py")],
           "keras_hub": [sys.executable, os.path.join(HERE, "keras_hub_worker.py")],
           "model_garden": [None, os.path.join(harness.BENCHMARKS, "model_garden",
                                               "transformer_worker.py")]}
# Flags passed unchanged to every worker (the experiment's shape).
SHAPE_FLAGS = ("batch", "source_length", "target_length", "vocab", "layers", "hidden", "heads",
               "filter", "beam", "alpha", "decode_length")


def worker_command(side: str, mode: str, precision: str, args):
  command = list(WORKERS[side])
  if side == "model_garden":
    command[0] = args.mg_python
  command += ["--mode", mode, "--precision", precision]
  for key in SHAPE_FLAGS:
    command += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
  if mode == "decode":
    command += ["--steps", str(args.decode_steps), "--warmup", str(args.decode_warmup)]
  else:
    command += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
  return command


def compare(args):
  """{(mode, precision): {side: [result or None per round]}}, the sides alternating."""
  return {(mode, precision): harness.measure(
      f"{mode} {precision}", args.sides, args.rounds,
      lambda side, m=mode, p=precision: worker_command(side, m, p, args), args.timeout,
      rate="tokens_per_second", unit="tokens/s")
          for mode in args.modes for precision in args.precisions}


def results_table(results, sides) -> str:
  lines = ["| mode | precision | side | median tokens/s | per round | ours / side "
           "(median of rounds) | per-round ratios |",
           "|---|---|---|---:|---|---:|---|"]
  for (mode, precision), by_side in results.items():
    ours = by_side.get("ours", [])
    for side in sides:
      runs = by_side[side]
      tps = [r["tokens_per_second"] if r else None for r in runs]
      ratios = (harness.per_round_ratios(ours, runs, "tokens_per_second")
                if side != "ours" else [])
      ratio = f"**{median(ratios):.2f}x**" if ratios else "-"
      lines.append(f"| {mode} | {precision} | {LABELS[side]} | {fmt(median(tps), '.1f')} | "
                   f"{', '.join(fmt(v, '.1f') for v in tps)} | {ratio} | "
                   f"{', '.join(f'{v:.2f}' for v in ratios) or '-'} |")
  return "\n".join(lines)


def parameter_check(results, args):
  """(markdown lines, ok): the parameter counts side by side, checked."""
  counts = harness.parameter_counts(results)
  lines, ok = [], True
  for side in SIDES:
    if side in counts:
      values = counts[side]
      ok &= len(values) == 1
      lines.append(f"{LABELS[side]}: {', '.join(f'{v:,}' for v in values)} trainable parameters")
  ours = counts.get("ours")
  if ours and len(ours) == 1:
    (ours,) = ours
    if "model_garden" in counts and counts["model_garden"] != [ours]:
      ok = False
      lines.append("MISMATCH: Model Garden's count differs from ours.")
    extra = shared.expected_keras_hub_extra_parameters(args)
    if "keras_hub" in counts:
      if counts["keras_hub"] != [ours + extra]:
        ok = False
        lines.append(f"MISMATCH: keras-hub should have ours + {extra:,} (attention biases).")
      else:
        lines.append(f"keras-hub = ours + {extra:,}: the biases of its attention projections "
                     f"(4 x d per attention, 3 attentions per encoder+decoder layer pair); ours "
                     f"and Model Garden's attention has none. Everything else is equal, one "
                     f"shared [vocab, d] embedding/softmax on every side.")
  return lines, ok


def main(argv=None):
  parser = harness.driver_parser(__doc__, SIDES, batch=16, steps=6, warmup=2, timeout=1800.0,
                                 rounds_per="side, mode and precision",
                                 batch_help="Sentences per step / search.")
  parser.add_argument("--modes", default=",".join(MODES),
                      help=f"Comma-separated subset of {', '.join(MODES)}.")
  parser.add_argument("--source-length", type=int, default=64)
  parser.add_argument("--target-length", type=int, default=64)
  parser.add_argument("--vocab", type=int, default=32000, help="Shared vocabulary size.")
  parser.add_argument("--layers", type=int, default=6, help="Encoder and decoder layers each.")
  parser.add_argument("--hidden", type=int, default=512)
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--filter", type=int, default=2048)
  parser.add_argument("--beam", type=int, default=4)
  parser.add_argument("--alpha", type=float, default=0.6)
  parser.add_argument("--decode-length", type=int, default=64,
                      help="Tokens decoded per sentence (all of them, on every side).")
  parser.add_argument("--decode-steps", type=int, default=2,
                      help="Timed beam searches per measurement.")
  parser.add_argument("--decode-warmup", type=int, default=1,
                      help="Untimed beam searches first (tracing).")
  args = harness.parse_driver_args(parser, argv, SIDES)
  args.modes = harness.comma_list(parser, "--modes", args.modes, MODES)
  # The workers validate the shape flags too; fail here, before any process starts.
  shared.parse_args("check", ["--mode", "decode"] + [
      a for key in SHAPE_FLAGS for a in (f"--{key.replace('_', '-')}", str(getattr(args, key)))])

  return harness.run_comparison(args, SIDES, True, lambda machine: sections(args, machine))


def sections(args, machine: str):
  """(The report's sections, whether a measurement or the parameter check failed)."""
  results = compare(args)
  params, params_ok = parameter_check(results, args)
  shape = (f"d {args.hidden}, {args.layers}+{args.layers} layers, {args.heads} heads, FFN "
           f"{args.filter}, vocab {args.vocab:,} (shared)")
  report = [
      f"# Transformer comparison\n\n{machine}.",
      f"{shape}. Train step: batch {args.batch} x {args.source_length} source / "
      f"{args.target_length} target tokens ({args.batch * args.target_length} target tokens "
      f"per step), {args.warmup} warm-up + {args.steps} timed steps per measurement. Decode: "
      f"beam {args.beam}, alpha {args.alpha}, {args.batch} sentences x {args.decode_length} "
      f"tokens, {args.decode_warmup} warm-up + {args.decode_steps} timed searches. "
      f"{args.rounds} rounds, sides alternating. Tokens/s: real target tokens (train) or "
      f"decoded tokens of the best beam (decode) per second; higher is better.",
      results_table(results, args.sides),
      "Parameters: " + "; ".join(params) + ("" if params_ok else " (CHECK FAILED)")]
  return report, harness.failed(results) or not params_ok


if __name__ == "__main__":
  sys.exit(main())
