"""Variants of one recipe's train step against each other, in the same run, on this CPU.

    python benchmarks/recipe_variants.py official/maskrcnn/pasted_objects_maskrcnn.yaml \
        --variant "as committed:" \
        --variant "64-ch mask head on 32 RoIs:task.model.mask_head_channels=64,task.model.num_mask_rois=32" \
        --rounds 2 [--steps 12] [--warmup 4] [--set KEY=VALUE ...]

Each `--variant "NAME:KEY=VALUE,KEY=VALUE"` is the recipe with those overrides
(none after the colon: the recipe as it is); `--set` goes to every variant. Each
measurement is a fresh process timing the variant's train step through the Trainer
(`training.benchmark.train_throughput`: synthetic inputs, the recipe's own batch and
precision; `harness.recipe_train_step`), the variants' order rotating every round
(`harness.measure`), so a drift of the machine's speed falls on all of them; oneDNN as
the `tpu-models` CLI sets it (TF_ENABLE_ONEDNN_OPTS=1 on x86-64 unless set). Prints
s/step and CPU s/step per variant and round, and each variant's median step time
against the first variant's. Decides what a cheaper recipe buys before a
convergence run tells what it costs (official/*/README.md).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # harness, beside this file
import harness  # pylint: disable=g-import-not-at-top


def parse_variant(text: str):
  """'NAME:K=V,K=V' -> (NAME, ['K=V', 'K=V']); an empty list for 'NAME:'."""
  name, sep, overrides = text.partition(":")
  if not sep or not name.strip():
    raise argparse.ArgumentTypeError(
        f"--variant {text!r} must look like 'NAME:key.sub=value,key.sub=value' (or 'NAME:' "
        f"for the recipe as it is).")
  return name.strip(), [o.strip() for o in overrides.split(",") if o.strip()]


def main(argv=None) -> int:
  parser = harness.script_parser(__doc__)
  parser.add_argument("config")
  parser.add_argument("--variant", type=parse_variant, action="append", default=[],
                      help="NAME:KEY=VALUE,... (repeatable; the first is the baseline)")
  harness.add_recipe_flags(parser, steps=12, warmup=4,
                           set_help="override for every variant (repeatable)")
  parser.add_argument("--import", dest="imports", action="append", default=[],
                      help="module registering the recipe's task or model (as the CLI's)")
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    from tpu_models import registry  # pylint: disable=g-import-not-at-top
    registry.import_modules(args.imports)
    print(json.dumps(harness.recipe_train_step(args.config, args.set, args.steps, args.warmup)))
    return 0
  if len(args.variant) < 2:
    parser.error("give at least two --variant to compare")
  names = [name for name, _ in args.variant]
  if len(set(names)) != len(names):
    parser.error(f"--variant names must differ, got {names}")
  overrides = dict(args.variant)
  from tpu_models import onednn  # pylint: disable=g-import-not-at-top
  onednn.default_on()  # As the `tpu-models` CLI: every worker inherits it.

  def command(name):
    return harness.recipe_worker_command(
        __file__, args.config, args,
        *[flag for module in args.imports for flag in ("--import", module)],
        *harness.set_flags(args.set + overrides[name]))

  print(f"{harness.cpu_description()}; {harness.ours_versions()}; {harness.onednn_setting()}")
  results = harness.measure(os.path.basename(args.config), names, args.rounds, command,
                            args.timeout, rate="steps_per_second", unit="steps/s")
  if harness.failed(results):
    return 1
  baseline = harness.median(r["step_seconds"] for r in results[names[0]])
  print(f"\n{os.path.relpath(args.config)}, {args.steps} timed steps after {args.warmup}, "
        f"{results[names[0]][0]['precision']}, synthetic inputs\n")
  print("| variant | overrides | s/step (rounds) | CPU s/step (rounds) | median s/step "
        "against the first |\n|---|---|---|---|---|")
  for name in names:
    runs = results[name]
    step = harness.median(r["step_seconds"] for r in runs)
    print(f"| {name} | {', '.join(f'`{o}`' for o in overrides[name]) or '-'} | "
          f"{', '.join(harness.fmt(r['step_seconds'], '.3f') for r in runs)} | "
          f"{', '.join(harness.fmt(r['cpu_seconds_per_step']) for r in runs)} | "
          f"{step / baseline:.2f}x |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
