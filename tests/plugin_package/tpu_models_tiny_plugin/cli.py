"""The family's CLI contribution: `tpu-models tiny-plugin-weights` (argparse only at import)."""


def add_commands(subparsers) -> None:
  p = subparsers.add_parser("tiny-plugin-weights",
                            help="tiny_plugin: print the weights w the regression learns")
  p.set_defaults(run=_weights)


def _weights(args) -> int:
  from tpu_models_tiny_plugin import tasks  # TensorFlow: only when the command runs.
  print("w =", " ".join(f"{w:g}" for w in tasks.WEIGHTS))
  return 0
