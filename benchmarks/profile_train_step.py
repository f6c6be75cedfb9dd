"""Where a train step's time goes: TensorFlow's profiler around the Trainer's own step.

    python benchmarks/profile_train_step.py official/efficientnet/fashion_mnist_efficientnet_b0.yaml \
        --steps 10 --warmup 5 [--set runtime.mixed_precision=bfloat16] [--top 25]

Runs `--warmup` steps of the config's real train step (`Trainer`, synthetic inputs, as
`tpu-models benchmark`), then traces `--steps` more with `tf.profiler` and sums the time
of every TensorFlow op the host executed, by op type (Conv2D, DepthwiseConv2dNative,
its two backprops, MatMul, Mul, ...; oneDNN's kernels keep their own names, e.g.
`_MklNativeDepthwiseConv2dNativeBackpropFilter`) and by the layer that owns it (the
component of the op's name after the model's, e.g. `block2a_dwconv`; a gradient,
`gradient_tape/<model>/<layer>/...`, counts with its layer; ops outside the model by
their scope, e.g. `sgd`). Prints two Markdown tables: milliseconds per step and share
of the summed op time. Independent ops of a step run at the same time on the cores and
each one's duration stretches, so the shares are of op time, not of wall time; the wall
time per step is printed beside them. The trace is left in --trace-dir for
TensorBoard's profile plugin.
"""

import argparse
import collections
import glob
import os
import re
import sys
import tempfile
import time

# An executed op's trace event is "<op name>:<OpType>", e.g.
# "model/block2a_dwconv_1/depthwise:_MklNativeDepthwiseConv2dNative" (oneDNN's ops start with "_").
_OP_EVENT = re.compile(r"^(?P<name>[\w./-]+):(?P<type>_?[A-Z][A-Za-z0-9_]*)$")
_CALL_SUFFIX = re.compile(r"_\d+$")  # Keras and TensorFlow number repeated scopes: dense_1, Mul_163.
# With a bare number ("_1", a loop body's), the scopes of the host loop around the step.
_LOOP_SCOPES = ("while", "body", "cond", "StatefulPartitionedCall", "PartitionedCall")


def layer_of(op_name: str, model_name: str) -> str:
  """The layer an op belongs to, or the scope of an op outside the model (e.g. "sgd").

  "gradient_tape/<model>_1/block2a_dwconv_1/depthwise/DepthwiseConv2dNativeBackpropFilter"
  -> "block2a_dwconv": a gradient counts with its layer. The host loop's scopes in
  front ("while/body/_1/while/StatefulPartitionedCall/...": the step runs inside
  the Trainer's `tf.range` loop, as a function call) are not layers.
  """
  parts = [p for p in op_name.split("/") if p]
  while len(parts) > 1 and (parts[0] in _LOOP_SCOPES or _CALL_SUFFIX.fullmatch(parts[0])):
    parts = parts[1:]
  if parts and parts[0] == "gradient_tape":
    parts = parts[1:]
  if len(parts) > 1 and model_name in (parts[0], _CALL_SUFFIX.sub("", parts[0])):
    parts = parts[1:]
  return _CALL_SUFFIX.sub("", parts[0]) if parts else op_name


def op_times(trace_dir: str, model_name: str):
  """{(op type, layer): picoseconds} summed over the host plane's op events in trace_dir."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2
  paths = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
  if not paths:
    raise SystemExit(f"No *.xplane.pb under {trace_dir}: the profiler wrote no trace.")
  totals = collections.Counter()
  for path in paths:
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
      space.ParseFromString(f.read())
    for plane in space.planes:
      if not plane.name.startswith("/host:"):
        continue
      names = {i: m.name for i, m in plane.event_metadata.items()}
      for line in plane.lines:
        for event in line.events:
          match = _OP_EVENT.match(names.get(event.metadata_id, ""))
          if match:
            totals[(match["type"], layer_of(match["name"], model_name))] += event.duration_ps
  return totals


def table(title: str, counter: collections.Counter, steps: int, top: int) -> str:
  total = sum(counter.values()) or 1
  shown = counter.most_common(top)
  rows = [f"| {title} | ms per step | share of op time |", "|---|---:|---:|"]
  for key, ps in shown:
    rows.append(f"| {key} | {ps / 1e9 / steps:.2f} | {100 * ps / total:.1f}% |")
  rest = total - sum(ps for _, ps in shown)
  if rest > 0:
    rows.append(f"| (the rest) | {rest / 1e9 / steps:.2f} | {100 * rest / total:.1f}% |")
  rows.append(f"| **all ops** | {total / 1e9 / steps:.2f} | 100% |")
  return "\n".join(rows)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("config")
  parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
  parser.add_argument("--import", dest="imports", action="append", default=[])
  parser.add_argument("--steps", type=int, default=10, help="traced steps")
  parser.add_argument("--warmup", type=int, default=5, help="untraced steps first (tracing)")
  parser.add_argument("--top", type=int, default=20, help="rows per table")
  parser.add_argument("--trace-dir", default=None, help="where the trace goes (default: a temp dir)")
  args = parser.parse_args(argv)

  import tensorflow as tf
  from tpu_models.cli import load_experiment
  from tpu_models.training.benchmark import measurement_config
  from tpu_models.training.trainer import Trainer

  args.model_dir = None
  config, _ = load_experiment(args)  # The CLI's own: --import modules, then the YAML and --set.
  config = measurement_config(config, args.warmup + args.steps)  # As `tpu-models benchmark`.
  trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="profile_")
  with tempfile.TemporaryDirectory() as run_dir:
    trainer = Trainer(config, run_dir, stream=open(os.devnull, "w"), synthetic_inputs=True)
    model_name = trainer.model.name
    trainer.train(steps=args.warmup)
    tf.profiler.experimental.start(trace_dir)
    start = time.perf_counter()
    trainer.train(steps=args.steps)
    wall = time.perf_counter() - start
    tf.profiler.experimental.stop()
    precision, device = trainer.mixed_precision, trainer.device
    trainer.close()

  totals = op_times(trace_dir, model_name)
  by_type, by_layer = collections.Counter(), collections.Counter()
  for (op_type, layer), ps in totals.items():
    by_type[op_type] += ps
    by_layer[layer] += ps
  print(f"{args.config} {' '.join(args.overrides)}: {args.steps} traced steps, {precision}, {device}; "
        f"wall {1000 * wall / args.steps:.0f} ms per step (profiler on); trace in {trace_dir}\n")
  print(table("op type", by_type, args.steps, args.top) + "\n")
  print(table("layer", by_layer, args.steps, args.top))
  return 0


if __name__ == "__main__":
  sys.exit(main())
