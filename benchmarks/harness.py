"""What every benchmark driver and worker shares, written once.

Drivers (compare_*.py in each family folder) run each measurement in a fresh
process with the sides alternating, then print tables of medians and per-round
ratios (ours / side). Workers (one measurement, one JSON line) take the same
flags on every side. This module is standard library only at import time (it
imports TensorFlow inside the functions that need it): the Model Garden
workers import it too, inside benchmarks/.venv-model-garden.

  scripts   script_parser
  drivers   driver_parser, add_pipeline_flags, parse_driver_args, comma_list;
            peer_versions, peers_and_machine, machine_description, cpu_description,
            ours_versions, onednn_setting; measure (a fresh
            process per run, the order rotating), run_worker, failed; fmt, median,
            per_round_ratios, ratio, cpu_ratio, mfu_per_round, train_rows, peak_note, train_flops,
            parameter_counts; run_comparison, write_report
  workers   worker_parser, add_input_pipeline_flags, parse_worker_args,
            require_keras_hub; time_calls, timed_steps, time_iterator, host_loop;
            trainable_parameters; our_experiment, our_train_throughput, our_train_row,
            our_train_step; recipe_train_step, set_flags; print_result, run_mode
  recipes   add_recipe_flags, recipe_worker_command (drivers timing recipes' train steps in
            fresh processes: benchmarks/onednn.py, recipe_variants.py)
"""

import argparse
import datetime
import importlib.metadata as metadata
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Optional

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCHMARKS)
MG_VENV = os.path.join(BENCHMARKS, ".venv-model-garden")
MG_PYTHON = os.path.join(MG_VENV, "bin", "python")
SETUP_COMMAND = f"bash {os.path.relpath(os.path.join(BENCHMARKS, 'model_garden', 'setup_venv.sh'))}"
KERAS_HUB_INSTALL = "pip install -e \".[bench]\""
PRECISIONS = ("float32", "bfloat16")
# TensorFlow reads it once, at import: set in the driver, every worker inherits it.
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
ONEDNN_CHOICES = ("on", "off", "tensorflow")


def log(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------
# Drivers: flags.


def script_parser(doc: str) -> argparse.ArgumentParser:
  """A benchmark script's parser: `doc`, its module docstring, is the help, shown as written."""
  return argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)


def driver_parser(doc: str, sides, *, batch: int, steps: int, warmup: int, timeout: float,
                  rounds_per: str = "side (and precision)",
                  batch_help: str = "Global batch size.") -> argparse.ArgumentParser:
  """The flags of every comparison driver; `doc` is its module docstring (help and epilog).

  --rounds --batch --steps --warmup --precisions --sides --timeout --mg-python
  --output, with the driver's defaults. The driver adds its own flags, then
  calls `parse_driver_args`.
  """
  parser = argparse.ArgumentParser(
      description=doc.split("\n")[0], epilog=doc.split("\n", 2)[2],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rounds", type=int, default=3,
                      help=f"Measurements per {rounds_per}; medians are reported.")
  parser.add_argument("--batch", type=int, default=batch, help=batch_help)
  parser.add_argument("--steps", type=int, default=steps, help="Timed train steps per measurement.")
  parser.add_argument("--warmup", type=int, default=warmup, help="Untimed train steps first.")
  parser.add_argument("--precisions", default=",".join(PRECISIONS),
                      help="Comma-separated: float32 and/or bfloat16 (mixed_bfloat16 policy).")
  parser.add_argument("--sides", default=",".join(sides),
                      help=f"Comma-separated subset of {', '.join(sides)}.")
  parser.add_argument("--timeout", type=float, default=timeout,
                      help="Seconds before one measurement is abandoned.")
  parser.add_argument("--mg-python", default=MG_PYTHON, help="Python of the Model Garden venv.")
  parser.add_argument("--onednn", choices=ONEDNN_CHOICES, default="on",
                      help="TensorFlow's oneDNN CPU kernels for every side alike: on (as the "
                           "tpu-models CLI runs on x86-64), off, or tensorflow (its own "
                           "per-CPU default, TF_ENABLE_ONEDNN_OPTS as this shell has it).")
  parser.add_argument("--output", default="", help="Also write the markdown report here.")
  return parser


def add_pipeline_flags(parser: argparse.ArgumentParser, num_images: int, images_help: str) -> None:
  """--pipeline-only, --pipeline-seconds, --num-images: the input pipeline comparisons' flags."""
  parser.add_argument("--pipeline-only", action="store_true",
                      help="Only the input pipeline comparison.")
  parser.add_argument("--pipeline-seconds", type=float, default=20.0,
                      help="Measured seconds per input pipeline run.")
  parser.add_argument("--num-images", type=int, default=num_images, help=images_help)


def parse_driver_args(parser: argparse.ArgumentParser, argv, sides):
  """Parses; --precisions and --sides become lists (an unknown entry is a parser error).

  --onednn on/off sets TF_ENABLE_ONEDNN_OPTS in this process's environment, which
  every side's worker inherits."""
  args = parser.parse_args(argv)
  args.precisions = comma_list(parser, "--precisions", args.precisions, PRECISIONS)
  args.sides = comma_list(parser, "--sides", args.sides, sides)
  if args.onednn != "tensorflow":
    os.environ[ONEDNN_ENV] = "1" if args.onednn == "on" else "0"
  return args


def onednn_setting() -> str:
  """What every worker gets: 'oneDNN on for every side (TF_ENABLE_ONEDNN_OPTS=1)', ..."""
  value = os.environ.get(ONEDNN_ENV)
  if value is None:
    return "oneDNN as each TensorFlow decides for this CPU"
  state = "off" if value.strip().lower() in ("0", "false") else "on"
  return f"oneDNN {state} for every side ({ONEDNN_ENV}={value})"


def comma_list(parser: argparse.ArgumentParser, flag: str, value: str, allowed) -> list:
  """`value` of `flag` split on commas; an entry not in `allowed` is a parser error."""
  items = [v.strip() for v in value.split(",") if v.strip()]
  for item in items:
    if item not in allowed:
      parser.error(f"{flag}: unknown value {item!r}; use {', '.join(allowed)}.")
  return items


# ----------------------------------------------------------------------------
# Drivers: the peers.


def model_garden_version(mg_python: str):
  """'tf-models-official X (tensorflow Y, tf-keras Z)', or None when the venv is unusable."""
  if not os.path.exists(mg_python):
    return None
  code = ("import importlib.metadata as m, official.vision.modeling.factory; "
          "print(f\"tf-models-official {m.version('tf-models-official')} (tensorflow "
          "{m.version('tensorflow')}, tf-keras {m.version('tf-keras')})\")")
  done = subprocess.run([mg_python, "-c", code], capture_output=True, text=True)
  lines = done.stdout.strip().splitlines()
  return lines[-1] if done.returncode == 0 and lines else None


def keras_hub_version():
  """'keras-hub X' when it imports in this Python, else None."""
  code = "import importlib.metadata as m, keras_hub; print('keras-hub', m.version('keras-hub'))"
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  lines = done.stdout.strip().splitlines()
  return lines[-1] if done.returncode == 0 and lines else None


def require_model_garden(mg_python: str) -> None:
  """Exits with the setup command when there is no Model Garden venv at `mg_python`."""
  if not os.path.exists(mg_python):
    sys.exit(f"No Model Garden venv at {mg_python}; create it with {SETUP_COMMAND}")


def peer_versions(args, all_sides, keras_hub_needed: bool):
  """(Model Garden version, keras-hub version) of the sides in `args.sides`, "not used" for
  the others; None, after saying how to install it, when a needed peer is missing."""
  mg_version = kh_version = "not used"
  if "model_garden" in args.sides:
    mg_version = model_garden_version(args.mg_python)
    if mg_version is None:
      print(f"The Model Garden venv ({args.mg_python}) is missing or cannot import "
            f"official.vision. Set it up first (~5 minutes, ~3.5 GB):\n\n  {SETUP_COMMAND}\n",
            file=sys.stderr)
      return None
  if "keras_hub" in args.sides and keras_hub_needed:
    kh_version = keras_hub_version()
    if kh_version is None:
      others = ",".join(side for side in all_sides if side != "keras_hub")
      print("keras-hub does not import in this Python. Install the benchmark extra (it keeps "
            f"TensorFlow and Keras as they are):\n\n  {KERAS_HUB_INSTALL}\n\nor leave it "
            f"out: --sides {others}", file=sys.stderr)
      return None
  return mg_version, kh_version


def peers_and_machine(args, all_sides, keras_hub_needed: bool):
  """The report's machine line (`machine_description` with the peers' versions), or None
  after saying how to install a needed peer that is missing (see `peer_versions`)."""
  versions = peer_versions(args, all_sides, keras_hub_needed)
  return None if versions is None else machine_description(*versions)


def machine_description(mg_version: str, keras_hub: str) -> str:
  """Date, CPU (and its bfloat16 units), cores and every side's versions, for the report."""
  return (f"{cpu_description()}, ours: {ours_versions()}; Model Garden: {mg_version}; "
          f"keras-hub: {keras_hub}; {onednn_setting()}")


def cpu_description() -> str:
  """Date, CPU model, cores and its bfloat16 units: '2026-12-04, AMD EPYC, 2 cores (no AMX)'."""
  cpu = platform.processor() or "unknown CPU"
  flags = ""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          cpu = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
          flags = line
          break
  except OSError:
    pass
  amx = "AMX-BF16" if "amx_bf16" in flags else "no AMX"
  avx512bf16 = ", AVX512-BF16" if "avx512_bf16" in flags else ""
  return (f"{datetime.date.today().isoformat()}, {cpu}, {os.cpu_count()} cores ({amx}"
          f"{avx512bf16})")


def ours_versions() -> str:
  """'tensorflow X, keras Y' of this Python."""
  versions = []
  for package in ("tensorflow", "keras"):
    try:
      versions.append(f"{package} {metadata.version(package)}")
    except metadata.PackageNotFoundError:
      pass
  return ", ".join(versions)


# ----------------------------------------------------------------------------
# Drivers: measuring.


def run_worker(command, timeout: float):
  """Runs one measurement; returns its JSON result, or None (with the error logged)."""
  start = time.perf_counter()
  try:
    # env=os.environ: what Python sees, also when a caller keeps it in Python
    # (tpu_models.startup.environ_kept_in_python) rather than in the process environment.
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=dict(os.environ))
  except subprocess.TimeoutExpired:
    log(f"  TIMEOUT after {timeout:.0f}s: {' '.join(command)}")
    return None
  lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
  if done.returncode != 0 or not lines:
    log(f"  FAILED (exit {done.returncode}): {' '.join(command)}\n" +
        "\n".join(done.stderr.strip().splitlines()[-15:]))
    return None
  result = json.loads(lines[-1])
  result["wall_seconds"] = time.perf_counter() - start
  return result


def rotated(sides, round_index: int):
  """The sides in the order of this round: each side takes each position in turn."""
  k = round_index % len(sides)
  return list(sides[k:]) + list(sides[:k])


def measure(label: str, sides, rounds: int, command, timeout: float,
            rate: str = "images_per_second", unit: str = "images/s"):
  """{side: [result or None per round]}: `command(side)` run once per side and round, each
  in a fresh process, the sides' order rotating every round so a shared machine's load
  falls on all of them alike."""
  results = {side: [] for side in sides}
  for r in range(rounds):
    for side in rotated(sides, r):
      log(f"[{label} round {r + 1}/{rounds}] {side} ...")
      result = run_worker(command(side), timeout)
      if result:
        params = f", {result['params']:,} parameters" if "params" in result else ""
        log(f"  {result[rate]:.2f} {unit} ({result['wall_seconds']:.0f}s wall{params})")
      results[side].append(result)
  return results


def failed(results) -> bool:
  """True when any measurement in {key: {side: [result or None]}} or {side: [...]} failed."""
  groups = results.values()
  if any(isinstance(g, dict) for g in groups):
    return any(failed(g) for g in groups)
  return any(r is None for runs in groups for r in runs)


# ----------------------------------------------------------------------------
# Drivers: tables.


def fmt(value, spec=".2f", empty="-"):
  return empty if value is None else format(value, spec)


def median(values):
  values = [v for v in values if v is not None]
  return statistics.median(values) if values else None


def per_round_ratios(ours, runs, rate: str = "images_per_second") -> list:
  """ours / side of each round where both ran: each compares runs seconds apart."""
  return [o[rate] / r[rate] for o, r in zip(ours, runs) if o and r]


def ratio(ours, runs, rate: str = "images_per_second", rounds: bool = False) -> str:
  """The median of the per-round ratios, "1.05x"; with `rounds`, bold and the rounds' own."""
  per_round = per_round_ratios(ours, runs, rate)
  if not per_round:
    return "-"
  if not rounds:
    return f"{median(per_round):.2f}x"
  return f"**{median(per_round):.2f}x** ({', '.join(f'{v:.2f}' for v in per_round)})"


def cpu_ratio(ours, runs) -> str:
  """The median over rounds of side's / ours' CPU seconds per step ("1.05x" = ours costs
  less), or "-" where a side did not report its CPU time."""
  per_round = [r["cpu_seconds_per_step"] / o["cpu_seconds_per_step"] for o, r in zip(ours, runs)
               if o and r and o.get("cpu_seconds_per_step") and r.get("cpu_seconds_per_step")]
  return f"{median(per_round):.2f}x ({', '.join(f'{v:.2f}' for v in per_round)})" if per_round else "-"


def mfu_per_round(runs, ours) -> list:
  """MFU of each round of a side: its images/s x OUR training FLOPs per image / OUR matmul
  peak, both measured by our worker in the same round (one yardstick for every side); empty
  where our worker could not count the FLOPs (train_flops_per_example None)."""
  return [r["images_per_second"] * o["train_flops_per_example"] / (o["peak_tflops"] * 1e12)
          for r, o in zip(runs, ours) if r and o and o.get("train_flops_per_example")]


def train_rows(results, sides):
  """Yields, per row of a train-step table over {precision: {side: [result or None]}}:
  (precision, side, the side's runs, ours' runs, images/s per round, MFU per round)."""
  for precision, by_side in results.items():
    ours = by_side.get("ours", [])
    for side in sides:
      runs = by_side[side]
      yield (precision, side, runs, ours, [r["images_per_second"] if r else None for r in runs],
             mfu_per_round(runs, ours))


def peak_note(results) -> str:
  """'Matmul peak measured by our worker (median): float32 X GFLOP/s, ...' or ''."""
  peaks = []
  for precision, by_side in results.items():
    values = [r["peak_tflops"] for r in by_side.get("ours", []) if r]
    if values:
      peaks.append(f"{precision} {median(values) * 1000:.0f} GFLOP/s")
  return f"Matmul peak measured by our worker (median): {', '.join(peaks)}." if peaks else ""


def train_flops(results):
  """Our training FLOPs per example (the first of our results), or None."""
  return next((r["train_flops_per_example"] for by_side in results.values()
               for r in by_side.get("ours", []) if r), None)


def parameter_counts(results) -> dict:
  """{side: sorted distinct trainable parameter counts} over {key: {side: [result]}}."""
  counts = {}
  for by_side in results.values():
    for side, runs in by_side.items():
      for r in runs:
        if r and "params" in r:
          counts.setdefault(side, set()).add(r["params"])
  return {side: sorted(values) for side, values in counts.items()}


def run_comparison(args, all_sides, keras_hub_needed: bool, sections) -> int:
  """A driver's run: checks the peers, measures and reports; returns the exit status.

  `sections(machine)` runs the measurements and returns (the report's markdown
  sections, whether anything failed); `machine` is the machine line. The wall time
  is added, the report printed (and written to `args.output`). Exit status: 2 when a
  needed peer is missing (and how to install it said), 1 when a measurement or a
  check failed, else 0.
  """
  machine = peers_and_machine(args, all_sides, keras_hub_needed)
  if machine is None:
    return 2
  start = time.perf_counter()
  report, failed_any = sections(machine)
  report.append(f"Wall time: {(time.perf_counter() - start) / 60:.1f} min.")
  write_report(report, args.output)
  return 1 if failed_any else 0


def write_report(sections, output: str = "") -> None:
  """Prints the markdown sections (one blank line apart); also writes them to `output`."""
  report = "\n\n".join(sections) + "\n"
  print(report)
  if output:
    with open(output, "w") as f:
      f.write(report)


# ----------------------------------------------------------------------------
# Workers.


def worker_parser(description: str, modes, *, batch: int, steps: int, warmup: int,
                  precision_help: str = "", steps_help: str = "Timed train steps.",
                  warmup_help: str = "Untimed train steps first (tracing, allocator warm-up).",
                  batch_help: str = "Global batch size.") -> argparse.ArgumentParser:
  """--mode --batch --precision --steps --warmup, the flags every worker takes."""
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--mode", choices=sorted(modes), required=True)
  parser.add_argument("--batch", type=int, default=batch, help=batch_help)
  parser.add_argument("--precision", choices=PRECISIONS, default="float32",
                      help="float32, or bfloat16 = the mixed_bfloat16 policy" +
                      (f" ({precision_help})." if precision_help else "."))
  parser.add_argument("--steps", type=int, default=steps, help=steps_help)
  parser.add_argument("--warmup", type=int, default=warmup, help=warmup_help)
  return parser


def add_input_pipeline_flags(parser: argparse.ArgumentParser) -> None:
  """--data and --seconds of a worker's input_pipeline mode (see parse_worker_args)."""
  parser.add_argument("--data", default="", help="input_pipeline: TFRecord glob.")
  parser.add_argument("--seconds", type=float, default=20.0, help="input_pipeline: measured time.")


def parse_worker_args(parser: argparse.ArgumentParser, argv=None):
  """Parses; --mode input_pipeline without --data is a parser error."""
  args = parser.parse_args(argv)
  if getattr(args, "mode", "") == "input_pipeline" and not args.data:
    parser.error("--mode input_pipeline needs --data (a TFRecord glob).")
  return args


def require_keras_hub() -> None:
  """Exits with the install command when keras-hub does not import."""
  try:
    import keras_hub  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    sys.exit(f"keras-hub is not installed ({e}); install the benchmark extra: {KERAS_HUB_INSTALL}")


def time_calls(run, count: int, cpu: Optional[dict] = None):
  """(seconds, last result, minor page faults per call) of `count` calls of `run()`.

  Minor page faults count memory freshly mapped during the calls (POSIX only).
  With `cpu` (a dict), cpu["seconds"] is set to the CPU time this process spent in
  the calls, all threads (the load-independent cost on a shared machine).
  """
  import resource  # pylint: disable=g-import-not-at-top  (POSIX only)
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  start, cpu_start = time.perf_counter(), time.process_time()
  value = None
  for _ in range(count):
    value = run()
  seconds = time.perf_counter() - start
  if cpu is not None:
    cpu["seconds"] = time.process_time() - cpu_start
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
  return seconds, value, faults / count


def timed_steps(run, batch: int, steps: int):
  """Calls `run(steps)` once and times it.

  Returns ({"images_per_second", "step_seconds", "cpu_seconds_per_step",
  "page_faults_per_step"}, run's result).
  """
  cpu = {}
  seconds, value, faults = time_calls(lambda: run(steps), 1, cpu)
  return {"images_per_second": batch * steps / seconds, "step_seconds": seconds / steps,
          "cpu_seconds_per_step": cpu["seconds"] / steps,
          "page_faults_per_step": faults / steps}, value


def time_iterator(iterator, seconds: float, warmup_batches: int = 5):
  """Pulls `warmup_batches` (shuffle buffer, prefetch, AUTOTUNE), then batches for `seconds`.

  Returns (batches, elapsed seconds, the last batch).
  """
  element = None
  for _ in range(warmup_batches):
    element = next(iterator)
  batches, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    element = next(iterator)
    batches += 1
  return batches, time.perf_counter() - start, element


def host_loop(step, dataset):
  """`run(n)`: n calls of `step(batch)` on `dataset`'s batches in ONE tf.function call (a
  while-loop, as our Trainer's host loop and Model Garden's orbit run their steps); returns
  the last step's loss as a float. TensorFlow only, so the Model Garden venv uses it too."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  iterator = iter(dataset)

  @tf.function
  def loop(n):
    loss = tf.constant(0.0)
    for _ in tf.range(n):
      loss = step(next(iterator))
    return loss

  return lambda n: float(loop(tf.constant(n)))


def trainable_parameters(model) -> int:
  """The trainable parameter count of a Keras 3 or tf_keras model."""
  return int(sum(math.prod(v.shape) for v in model.trainable_variables))


MODEL_GARDEN_PACKAGES = ("tensorflow", "tf-keras", "tf-models-official")  # A Model Garden worker's.


def package_versions(*packages) -> dict:
  """{key: installed version} of `packages`, for a worker's JSON line: the name with "_" for
  "-", tf-models-official as "model_garden"."""
  return {"model_garden" if p == "tf-models-official" else p.replace("-", "_"):
          metadata.version(p) for p in packages}


def our_experiment(task: dict, optimizer: dict, learning_rate: float, precision: str) -> dict:
  """Our experiment config (a dict) for `task`: `optimizer` at a constant `learning_rate`,
  no TensorBoard, on the CPU in `precision`."""
  return {"task": task,
          "trainer": {"optimizer": optimizer,
                      "schedule": {"name": "constant", "base_lr": learning_rate},
                      "tensorboard": False},
          "runtime": {"strategy": "cpu", "mixed_precision": precision}}


def our_train_throughput(experiment: dict, args, peak: bool):
  """(config, result) of `tpu_models.training.benchmark.train_throughput` on `experiment`:
  `args.warmup` untimed, then `args.steps` timed steps through our real Trainer."""
  from tpu_models import config as config_lib  # pylint: disable=g-import-not-at-top
  from tpu_models.training import benchmark  # pylint: disable=g-import-not-at-top
  config = config_lib.experiment_from_dict(experiment)
  return config, benchmark.train_throughput(config, steps=args.steps, warmup=args.warmup,
                                            peak=peak)


def recipe_train_step(config_path: str, overrides, steps: int, warmup: int) -> dict:
  """A recipe YAML's train step through our Trainer (`train_throughput`: synthetic
  inputs, the recipe's batch and precision; `warmup` untimed, then `steps` timed):
  steps_per_second, step_seconds, cpu_seconds_per_step, faults_per_step, precision."""
  from tpu_models import config as config_lib  # pylint: disable=g-import-not-at-top
  from tpu_models.training import benchmark  # pylint: disable=g-import-not-at-top
  result = benchmark.train_throughput(config_lib.load_config(config_path, overrides),
                                      steps=steps, warmup=warmup, peak=False)
  return {"steps_per_second": 1.0 / result["step_seconds"],
          "step_seconds": result["step_seconds"],
          "cpu_seconds_per_step": result["cpu_seconds_per_step"],
          "faults_per_step": result["page_faults_per_step"],
          "precision": result["precision"]}


def add_recipe_flags(parser: argparse.ArgumentParser, *, steps: int, warmup: int,
                     set_help: str) -> None:
  """--rounds --steps --warmup --timeout --set: the flags of a driver timing recipes' train
  steps (recipe_train_step) in fresh worker processes, with its defaults."""
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--steps", type=int, default=steps)
  parser.add_argument("--warmup", type=int, default=warmup)
  parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per measurement")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=set_help)


def recipe_worker_command(script: str, config: str, args, *flags: str) -> list:
  """A recipe driver's worker: `script` (the driver's own file) run again on `config` with
  --worker, the driver's --steps and --warmup, then `flags`."""
  return [sys.executable, os.path.abspath(script), os.path.abspath(config), "--worker",
          "--steps", str(args.steps), "--warmup", str(args.warmup), *flags]


def set_flags(overrides) -> list:
  """`--set KEY=VALUE` for each override, to pass them on to a worker's command line."""
  return [item for value in overrides for item in ("--set", value)]


def our_train_row(result: dict) -> dict:
  """A worker's train-step row from `our_train_throughput`'s result: its rate as
  images_per_second, plus the timing, MFU, device, page-fault and CPU-time fields."""
  row = {"images_per_second": result["examples_per_second"]}
  for key in ("step_seconds", "train_flops_per_example", "achieved_tflops", "peak_tflops",
              "mfu", "device", "page_faults_per_step", "cpu_seconds_per_step"):
    row[key] = result[key]
  return row


def our_train_step(experiment: dict, args) -> dict:
  """A worker's train-step row (`our_train_row`) of `experiment` through our Trainer
  (`our_train_throughput`, the peak measured), plus "params": the trainable parameter count
  of its task's model."""
  from tpu_models.task import create_task  # pylint: disable=g-import-not-at-top
  config, result = our_train_throughput(experiment, args, peak=True)
  params = trainable_parameters(create_task(config.task).build_model())
  return {**our_train_row(result), "params": params}


def print_result(result: dict, args, start: float, packages=("tensorflow", "keras"),
                 **fields) -> None:
  """Prints a worker's ONE JSON line: `result` plus the run's settings (mode, batch,
  precision, steps, warmup), `fields`, the packages' versions and the process time since
  `start`."""
  result.update(mode=args.mode, batch=args.batch, precision=args.precision, steps=args.steps,
                warmup=args.warmup, **fields, **package_versions(*packages),
                process_seconds=time.perf_counter() - start)
  print(json.dumps(result), flush=True)


def run_mode(args, modes, **fields) -> None:
  """A worker's one measurement: `modes[args.mode](args)`, printed as its ONE JSON line by
  `print_result` (`fields`: its packages and extra fields), timed from this call."""
  start = time.perf_counter()
  print_result(modes[args.mode](args), args, start, **fields)
