"""What the Transformer comparison workers share: flags, the fixed batch, the decode contract.

Standard library and NumPy only: it is imported by our worker, the keras-hub
worker and, inside benchmarks/.venv-model-garden, Model Garden's worker, so
every side takes the same flags and trains on the very same token ids.

The experiment (benchmarks/README.md, "Transformer-base"):

  train_step  Transformer-base (or --layers/--hidden/... for smoke tests),
              shared source/target/softmax embedding, pre-LN, dropout 0.1,
              Adam (beta2 0.98, epsilon 1e-9, constant lr), cross-entropy with
              label smoothing 0.1 over the real target tokens. One fixed batch
              of --batch rows x --source-length / --target-length tokens, every
              token real (no padding, no packing): tokens/step = batch x
              target length on every side.
  decode      beam search (--beam, --alpha) of --batch source rows for exactly
              --decode-length steps per row. No beam can finish early: the
              end-of-sequence id is set to `vocab` (one past the last id, so no
              step can produce it; Keras-hub: no stop tokens), so every side
              runs the same number of decoder steps whatever its random
              weights predict. Tokens/s = batch x decode length / seconds.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # pylint: disable=g-import-not-at-top

MODES = ("train_step", "decode")
LABEL_SMOOTHING = 0.1
DROPOUT = 0.1
LEARNING_RATE = 1e-4  # Constant; the value does not change the cost of a step.
ADAM_BETA_1, ADAM_BETA_2, ADAM_EPSILON = 0.9, 0.98, 1e-9  # The paper's Adam.
LAYER_NORM_EPSILON = 1e-6


def parse_args(description, argv=None):
  """The flags every Transformer worker takes (the driver passes the same to each side)."""
  parser = harness.worker_parser(
      description, MODES, batch=16, steps=5, warmup=2,
      batch_help="Sentences (rows) per step / search.",
      steps_help="Timed train steps, or timed beam searches (decode).",
      warmup_help="Untimed train steps / searches first (tracing, allocator warm-up).")
  parser.add_argument("--source-length", type=int, default=64, help="Source tokens per row.")
  parser.add_argument("--target-length", type=int, default=64, help="Target tokens per row.")
  parser.add_argument("--vocab", type=int, default=32000, help="Shared vocabulary size.")
  parser.add_argument("--layers", type=int, default=6, help="Encoder and decoder layers each.")
  parser.add_argument("--hidden", type=int, default=512, help="Model width d.")
  parser.add_argument("--heads", type=int, default=8, help="Attention heads.")
  parser.add_argument("--filter", type=int, default=2048, help="FFN inner width.")
  parser.add_argument("--beam", type=int, default=4, help="decode: beam size.")
  parser.add_argument("--alpha", type=float, default=0.6, help="decode: GNMT length penalty.")
  parser.add_argument("--decode-length", type=int, default=64,
                      help="decode: tokens decoded per row (every row runs them all).")
  args = parser.parse_args(argv)
  for key in ("batch", "source_length", "target_length", "vocab", "layers", "hidden", "heads",
              "filter", "beam", "decode_length", "steps"):
    if getattr(args, key) < 1:
      parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}.")
  if args.hidden % args.heads:
    parser.error(f"--hidden {args.hidden} must be divisible by --heads {args.heads}.")
  if args.vocab < 4:
    parser.error(f"--vocab must be >= 4 (0 pad, 1 EOS, 2 UNK, words), got {args.vocab}.")
  return args


def token_batch(batch: int, length: int, vocab: int, seed: int) -> np.ndarray:
  """int32 [batch, length]: random word ids in [3, vocab), EOS (1) last, no padding.

  One row tiled over the batch, as our task's synthetic inputs are; the same
  seed gives the same ids on every side.
  """
  row = np.random.default_rng(seed).integers(3, vocab, size=length).astype(np.int32)
  row[-1] = 1
  return np.tile(row[None], [batch, 1])


def sources_and_targets(args):
  """The fixed (source, target) batch of the comparison: int32 [B, S], [B, T]."""
  return (token_batch(args.batch, args.source_length, args.vocab, seed=1),
          token_batch(args.batch, args.target_length, args.vocab, seed=2))


def unreachable_eos(args) -> int:
  """The EOS id given to the searches: `vocab`, which no step can produce."""
  return args.vocab


def expected_keras_hub_extra_parameters(args) -> int:
  """keras-hub's attention has biases (q, k, v, output: 4 x d per attention); ours and
  Model Garden's have none. Encoder: 1 attention per layer, decoder: 2."""
  return 4 * args.hidden * 3 * args.layers


def time_train_steps(run_steps, args) -> dict:
  """`args.warmup` untimed steps (tracing), then `args.steps` timed ones, as one JSON result.

  `run_steps(n)` runs n train steps (in one call, as a host loop would) and
  returns the last loss as a float.
  """
  run_steps(args.warmup)
  seconds, loss, faults = harness.time_calls(lambda: run_steps(args.steps), 1)
  tokens = args.batch * args.target_length
  return {"tokens_per_second": tokens * args.steps / seconds,
          "step_seconds": seconds / args.steps, "tokens_per_step": tokens,
          "page_faults_per_step": faults / args.steps, "loss": loss}


def time_searches(search, args):
  """`args.warmup` untimed calls of `search()` (tracing), then `args.steps` timed ones.

  `search()` decodes the fixed source batch and returns its ids as a NumPy array.
  Returns (the decode result fields: tokens/s of `args.batch` x `args.decode_length`
  decoded tokens per search, s/search, page faults/search; the last ids).
  """
  for _ in range(args.warmup):
    search()
  seconds, ids, faults = harness.time_calls(search, args.steps)
  decoded = args.batch * args.decode_length
  return {"tokens_per_second": decoded * args.steps / seconds,
          "search_seconds": seconds / args.steps, "tokens_per_search": decoded,
          "page_faults_per_search": faults}, ids
