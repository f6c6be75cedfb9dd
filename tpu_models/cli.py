"""`tpu-models`: list, config, train, evaluate, export, predict, check, benchmark, convert, ...

    tpu-models train CONFIG --model-dir runs/mine    # CONFIG: an experiment YAML (official/)
    tpu-models train CONFIG --set trainer.train_steps=100 --set runtime.mixed_precision=bfloat16
    tpu-models evaluate CONFIG --model-dir runs/mine [--continuous]
    tpu-models check CONFIG          # TPU-readiness on the CPU; exit 1 when not ready
    tpu-models predict CONFIG --model-dir runs/mine a.jpg b.png --output-dir pictures
    tpu-models export CONFIG --model-dir runs/mine --output out --format litert-int8
    tpu-models evaluate-export out --split test     # its metrics through its own runtime
    tpu-models migrate model-garden CONFIG --checkpoint MG_CKPT --output runs/from_mg
    tpu-models weights list; tpu-models weights import NAME FILE_OR_DIR --output MODEL_DIR
    tpu-models sweep SWEEP.yaml [--address auto] [--export-best --format litert] [--report]
    tpu-models serve MODEL_BASE [--port 8501]        # TF Serving REST + v2 on Ray Serve

This module holds the generic commands only. Every family (tpu_models/registry.py:
`Family.cli`) contributes the rest from its own CLI module, which may define

    add_commands(subparsers)            whole commands; each parser sets
                                        `set_defaults(run=FUNCTION)` (FUNCTION(args) -> exit code)
    add_convert_sources(sources)        `convert` sources, the same way
    add_options(command, parser)        options of a generic command (e.g. `predict`); their
                                        values reach the task as `options` (dest -> value)
    add_parser(subparsers), run(args)   one command (e.g. `migrate`)

Those modules are imported while the parser is built (before TensorFlow), so
they import only argparse at module level and the rest inside their run
functions; `add_config_args` and `load_experiment` are theirs to use.
"""

import argparse
import importlib
import os
import sys
from typing import Any, Callable, Dict, List, Optional

from tpu_models import startup

# The generic commands whose options families may extend (`add_options`).
EXTENSIBLE_COMMANDS = ("train", "evaluate", "export", "predict", "check", "benchmark")


def add_config_args(parser: argparse.ArgumentParser, model_dir_required: bool = False) -> None:
  """CONFIG, --model-dir, --set and --import: what every experiment command takes."""
  parser.add_argument("config", help="experiment YAML (see official/)")
  parser.add_argument("--model-dir", required=model_dir_required,
                      help="checkpoints, config.yaml, metrics.jsonl and TensorBoard summaries "
                           "(default: runs/<config name>)")
  add_override_args(parser)


def add_override_args(parser: argparse.ArgumentParser,
                      set_help: str = "override a config value, e.g. --set "
                                      "trainer.train_steps=100 (repeatable)",
                      import_help: str = "") -> None:
  """--set KEY=VALUE (into `args.overrides`) and --import MODULE (into `args.imports`)."""
  parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help=set_help)
  parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                      help="import a module that registers your own models, tasks or datasets "
                           f"(repeatable; the current directory is on the path{import_help})")


class _OptionRecorder:
  """An argument group that remembers the dests a family added (they become `args.options`)."""

  def __init__(self, group, dests: List[str]):
    self._group, self._dests = group, dests

  def add_argument(self, *args, **kwargs):
    action = self._group.add_argument(*args, **kwargs)
    self._dests.append(action.dest)
    return action


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="tpu-models", description="Train, evaluate, check and export tpu_models experiments.",
      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  parser.add_argument("--version", action="version", version=_version())
  sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
  generic = {}

  p = generic["list"] = sub.add_parser("list", help="registered models, tasks and datasets")
  p.add_argument("kind", nargs="?", choices=("models", "tasks", "datasets"), default=None)
  p.add_argument("--pattern", help="glob over names, e.g. 'my_*'")

  p = generic["config"] = sub.add_parser(
      "config", help="print the effective config (after --set overrides)")
  add_config_args(p)

  p = generic["train"] = sub.add_parser("train", help="train (and evaluate) an experiment")
  add_config_args(p)
  p.add_argument("--mode", choices=("train", "train_and_evaluate"), default="train_and_evaluate")
  p.add_argument("--allow-model-change", action="store_true",
                 help="resume a model_dir whose config.yaml names another model (e.g. a changed "
                      "dropout rate); by default that is refused")

  p = generic["evaluate"] = sub.add_parser(
      "evaluate", help="evaluate the latest checkpoint of a model_dir")
  add_config_args(p, model_dir_required=True)
  p.add_argument("--continuous", action="store_true",
                 help="evaluate every new checkpoint until the run's last step")
  p.add_argument("--timeout", type=float, default=None,
                 help="with --continuous: stop after this many seconds without a new checkpoint")

  p = generic["export"] = sub.add_parser(
      "export", help="write a SavedModel with serving signatures")
  add_config_args(p, model_dir_required=True)
  target = p.add_mutually_exclusive_group(required=True)
  target.add_argument("--output",
                      help="directory to write (a SavedModel, or the artefact of --format with "
                           "its export.json and config.yaml)")
  target.add_argument("--to", metavar="MODEL_BASE",
                      help="write the export as the next numbered version MODEL_BASE/N, "
                           "atomically (tpu-models serve MODEL_BASE picks it up; "
                           "docs/serving.md)")
  p.add_argument("--overwrite", action="store_true",
                 help="replace an existing --output (by default that is refused)")
  p.add_argument("--format", dest="export_format", default="saved_model",
                 choices=("saved_model", "litert", "litert-int8", "onnx"),
                 help="saved_model (default: the serving signatures, preprocessing inside), "
                      "litert (float32), litert-int8 (full-integer, calibrated on the training "
                      "data) or onnx (needs the deploy extra); docs/deploy.md")
  p.add_argument("--calibration-examples", type=int, default=256,
                 help="litert-int8: training examples calibrating the int8 ranges "
                      "(default 256)")
  p.add_argument("--min-agreement", type=float, default=None,
                 help="litert/litert-int8/onnx: the least share (0..1) of evaluation examples "
                      "on which the new file must answer as the SavedModel path does, or the "
                      "export is refused and the previous one kept (default: 0.995 for float "
                      "formats, the task's int8 floor for litert-int8)")
  p.add_argument("--agreement-examples", type=int, default=200,
                 help="how many evaluation examples that check compares (default 200)")

  p = sub.add_parser(
      "evaluate-export", help="the task's own metrics of an export (--format any) through "
                              "its own runtime (LiteRT interpreter, onnxruntime, TensorFlow)")
  p.add_argument("export", metavar="EXPORT", help="an export directory (tpu-models export)")
  p.add_argument("--config", default=None,
                 help="experiment YAML whose data is evaluated (default: the export's own "
                      "config.yaml)")
  add_override_args(p, set_help="override a config value, e.g. --set "
                                 "task.test_data.path=... (repeatable)")
  p.add_argument("--split", default="test", choices=("eval", "test"),
                 help="the split evaluated (default test)")
  p.add_argument("--threads", type=int, default=None,
                 help="runtime threads (default: the runtime's own choice)")
  p.add_argument("--json", dest="json_output", default=None,
                 help="also write the result to this JSON file")
  p.set_defaults(run=_evaluate_export, option_dests=[])

  p = generic["predict"] = sub.add_parser(
      "predict", help="run a trained model on input files and write what it predicts (the "
                      "task says what: e.g. pictures of its predictions)")
  add_config_args(p, model_dir_required=True)
  p.add_argument("inputs", nargs="+", metavar="FILE", help="input files, e.g. JPEG/PNG images")
  p.add_argument("--output-dir", required=True, help="where the results go (created)")

  p = generic["check"] = sub.add_parser(
      "check", help="TPU-readiness: compile the train step with XLA on the CPU")
  add_config_args(p)
  p.add_argument("--batch-size", type=int, default=2, help="per-replica batch used for the check")

  p = generic["benchmark"] = sub.add_parser(
      "benchmark", help="train-step throughput of an experiment on synthetic data (the run goes "
                        "to --model-dir if given, else a temporary directory)")
  add_config_args(p)
  p.add_argument("--steps", type=int, default=20, help="timed steps")
  p.add_argument("--warmup", type=int, default=5, help="untimed steps (compilation)")
  p.add_argument("--real-data", action="store_true", help="use the config's data, not synthetic")

  p = sub.add_parser(
      "sweep", help="train variants of an experiment on Ray Tune (this machine or a Ray "
                    "cluster), rank them, export the best (docs/sweeps.md)")
  p.add_argument("sweep_file", metavar="SWEEP",
                 help="sweep YAML: an experiment with a 'sweep:' section (search space, "
                      "trials, scheduler); run again to resume it")
  p.add_argument("--address", default=None,
                 help="run the trials on an existing Ray cluster: 'auto' (this machine is in "
                      "it) or ray://HOST:PORT (default: start Ray on this machine)")
  p.add_argument("--report", action="store_true",
                 help="print the leaderboard of the sweep as it stands and write "
                      "leaderboard.csv and curves.png, without running it")
  p.add_argument("--export-best", action="store_true",
                 help="export the best trial by the validation metric and score it once on "
                      "the test split (after the sweep, or with --report as it stands)")
  p.add_argument("--format", dest="export_format", default="saved_model",
                 choices=("saved_model", "litert", "litert-int8", "onnx"),
                 help="with --export-best: the export format (default saved_model)")
  p.add_argument("--output", default=None,
                 help="with --export-best: the export directory (default SWEEP_DIR/best/FORMAT)")
  p.add_argument("--to", default=None, metavar="MODEL_BASE",
                 help="with --export-best: write the export as the next numbered version "
                      "MODEL_BASE/N instead (tpu-models serve MODEL_BASE picks it up)")
  p.add_argument("--overwrite", action="store_true",
                 help="with --export-best: replace an existing --output")
  add_override_args(p, set_help="override a key of every trial's experiment, or of the sweep "
                                 "section (sweep.trials=4); repeatable",
                    import_help="; every trial imports it too")
  from tpu_models.sweep import DRIVER_ENVIRON  # Light: the package's docstring and this dict.
  # The driver runs no TensorFlow work: the oneDNN default goes to each trial for its own
  # CPU share (sweep/driver.py), not to this process.
  p.set_defaults(run=_sweep, option_dests=[], environ=DRIVER_ENVIRON, onednn_default=False)

  from tpu_models.serving import command as serve_command  # argparse only.
  p = sub.add_parser("serve", help="serve exports over HTTP on Ray Serve: TF Serving's REST API "
                                   "and the v2 protocol, new versions swapped in live "
                                   "(docs/serving.md; the serve extra)")
  serve_command.add_arguments(p)
  p.set_defaults(run=serve_command.run, option_dests=[])

  p = sub.add_parser("convert", help="write TFRecords from other formats (sources: see "
                                     "`tpu-models convert --help`)")
  convert_sources = p.add_subparsers(dest="source", required=True, metavar="SOURCE")

  for command, run in _GENERIC_COMMANDS.items():
    generic[command].set_defaults(run=run, option_dests=[])
  _add_family_commands(sub, convert_sources, generic)
  return parser


def _add_family_commands(sub, convert_sources, generic: Dict[str, argparse.ArgumentParser]
                         ) -> None:
  """Lets every family's CLI module add its commands, `convert` sources and options."""
  from tpu_models import registry  # Light: finding families imports only their family.py.
  for family in registry.families():
    if not family.cli:
      continue
    try:
      module = importlib.import_module(family.cli)
    except ModuleNotFoundError as e:
      if e.name is None or not family.cli.startswith(e.name):
        raise  # Something the CLI module imports is missing: its own error.
      raise registry.FamilyError(f"Family {family.name!r} declares CLI module {family.cli!r}, "
                                 f"which does not exist; fix the family's declaration.") from None
    try:
      if hasattr(module, "add_parser"):
        module.add_parser(sub).set_defaults(run=module.run)
      if hasattr(module, "add_commands"):
        module.add_commands(sub)
      if hasattr(module, "add_convert_sources"):
        module.add_convert_sources(convert_sources)
      if hasattr(module, "add_options"):
        for command in EXTENSIBLE_COMMANDS:
          parser = generic[command]
          dests = parser.get_default("option_dests")
          group = parser.add_argument_group(f"{family.name} options")
          module.add_options(command, _OptionRecorder(group, dests))
    except argparse.ArgumentError as e:  # E.g. two families adding one command.
      raise argparse.ArgumentError(None, f"{family.cli} (family {family.name!r}): {e}") from e


def options(args) -> Dict[str, Any]:
  """The values of the options families added to this command (`add_options`): dest -> value."""
  return {dest: getattr(args, dest) for dest in getattr(args, "option_dests", [])}


def _version() -> str:
  """tpu-models X (Python, TensorFlow and Keras versions), without importing TensorFlow."""
  import platform
  from importlib import metadata
  from tpu_models import __version__

  def installed(name):
    try:
      return metadata.version(name)
    except metadata.PackageNotFoundError:
      return "not installed"

  return (f"tpu-models {__version__} (Python {platform.python_version()}, TensorFlow "
          f"{installed('tensorflow')}, Keras {installed('keras')})")


def load_experiment(args):
  """(config, model_dir) of an experiment command's args, after its --import modules."""
  from tpu_models import config as config_lib
  from tpu_models import registry
  registry.import_modules(args.imports)
  config = config_lib.load_config(args.config, args.overrides)
  model_dir = args.model_dir or os.path.join(
      "runs", os.path.splitext(os.path.basename(args.config))[0])
  return config, model_dir


def main(argv: Optional[List[str]] = None) -> int:
  args = _parser().parse_args(argv)
  # Environment variables only before TensorFlow starts (startup.py says why); a command's
  # own (`environ` of its parser) too, e.g. the sweep driver's Ray Tune settings.
  environ = getattr(args, "environ", {})
  startup.set_defaults_before_tensorflow(
      {"TF_CPP_MIN_LOG_LEVEL": "2", **(environ(args) if callable(environ) else environ)})
  if getattr(args, "onednn_default", True):
    from tpu_models import onednn
    onednn.default_on()  # Before TensorFlow is imported, which reads it once.
  startup.import_tensorflow_quietly()
  from tpu_models.errors import user_error_behind
  try:
    return args.run(args)
  except Exception as e:  # pylint: disable=broad-except
    wrong_input = user_error_behind(e)
    if wrong_input is None:  # Anything but wrong input is a bug: its traceback.
      raise
    print(f"tpu-models {args.command}: error: {wrong_input}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:  # Ctrl-C outside the training loop (which saves and stops itself).
    print(f"tpu-models {args.command}: interrupted (Ctrl-C).", file=sys.stderr)
    return 130


def _list(args) -> int:
  from tpu_models import registry
  kinds = [args.kind] if args.kind else ["models", "tasks", "datasets"]
  for kind in kinds:
    names = {"models": registry.list_models, "tasks": registry.list_tasks,
             "datasets": registry.list_datasets}[kind](args.pattern)
    print(f"{kind}: {', '.join(names) if names else '(none)'}")
  return 0


def _config(args) -> int:
  from tpu_models.config import config_warnings, dump_config
  config, _ = load_experiment(args)
  print(dump_config(config), end="")
  for line in config_warnings(config):
    print(f"tpu-models config: warning: {line}", file=sys.stderr)
  return 0


def _train(args) -> int:
  from tpu_models.training.progress import write_unless_unread
  from tpu_models.training.trainer import NonFiniteLoss, Preempted, Trainer
  from tpu_models.weights import cache
  config, model_dir = load_experiment(args)
  # trainer.init_checkpoint: NAME of a weights catalogue entry = its cached model_dir.
  config = cache.resolve_init_checkpoint(config)
  print(f"model_dir: {model_dir}", flush=True)
  trainer = Trainer(config, model_dir, allow_model_change=args.allow_model_change)
  print(trainer.describe(), flush=True)
  try:
    if args.mode == "train":
      trainer.train()
    else:
      metrics = trainer.train_and_evaluate()
      print(f"final eval: {_summary(metrics)}", flush=True)
      if config.task.test_data is not None:
        # The held-out test split, once, after training: never used to pick anything.
        test = (trainer.finished_rows or {}).get("test")  # A finished run: its own row.
        print(f"final test: {_summary(test or trainer.evaluate_and_report('test'))}",
              flush=True)
  except Preempted as e:  # SIGTERM (143) or Ctrl-C (130): a checkpoint was saved.
    write_unless_unread(sys.stderr, f"{e}\n")  # The exit code says it if nobody reads stderr.
    return e.exit_code
  except NonFiniteLoss as e:
    print(f"tpu-models train: error: {e}", file=sys.stderr)
    return 1
  finally:
    trainer.close()
  return 0


def _summary(metrics) -> str:
  counts = ("skipped_records", "damaged_files")  # on_corrupt=skip's counts: integers.
  parts = [f"{k} {int(v)}" if k in counts else f"{k} {v:.4f}"
           for k, v in metrics.items() if k != "examples"]
  return f"{', '.join(parts)} ({int(metrics.get('examples', 0))} examples)"


def _evaluate(args) -> int:
  from tpu_models.training import checkpoints
  from tpu_models.training.trainer import Trainer
  config, model_dir = load_experiment(args)
  if not args.continuous and not checkpoints.find_resume(model_dir).path:
    raise FileNotFoundError(f"No checkpoint in {model_dir!r}; train first or pass --continuous.")
  trainer = Trainer(config, model_dir)
  try:
    if args.continuous:
      trainer.continuous_evaluate(timeout=args.timeout)
    else:
      trainer.evaluate_and_report("eval")
  finally:
    trainer.close()
  return 0


def _export(args) -> int:
  config, model_dir = load_experiment(args)
  if args.to:  # The next version of a MODEL_BASE, renamed into place once complete.
    from tpu_models.serving import repository
    repository.publish(args.to, lambda output: _write_export(args, config, model_dir, output),
                       say=lambda line: print(line, flush=True))
  else:
    _write_export(args, config, model_dir, args.output)
  return 0


def _write_export(args, config, model_dir: str, output: str) -> None:
  from tpu_models import export
  if args.export_format == "saved_model":
    if args.min_agreement is not None:  # Was ignored: the SavedModel is the path compared to.
      from tpu_models.errors import ConfigError
      raise ConfigError(f"--min-agreement {args.min_agreement} applies to litert, litert-int8 "
                        f"and onnx exports, which are checked against the SavedModel path; a "
                        f"saved_model export is that path itself. Leave it out, or pass "
                        f"--format litert or onnx.")
    export.export_saved_model(config, model_dir, output, overwrite=args.overwrite, say=print)
    return
  export.export_deployment(config, model_dir, output, format_name=args.export_format,
                           calibration_examples=args.calibration_examples,
                           overwrite=args.overwrite, agreement_examples=args.agreement_examples,
                           min_agreement=args.min_agreement,
                           say=lambda line: print(line, flush=True))


def _evaluate_export(args) -> int:
  import json
  from tpu_models import config as config_lib
  from tpu_models import export
  from tpu_models import registry
  registry.import_modules(args.imports)  # The export's model may be the user's own.
  config_path = args.config or export.export_config_path(args.export)
  config = config_lib.load_config(config_path, args.overrides)
  result = export.evaluate_export(args.export, config, args.split, threads=args.threads,
                                  say=lambda line: print(line, flush=True))
  metrics = ", ".join(f"{k} {int(v)}" if k == "examples" else f"{k} {v:.4f}"
                      for k, v in result["metrics"].items())
  print(f"{args.split} through {result['runtime']} ({result['format']}): {metrics} "
        f"({result['seconds']} s)", flush=True)
  if result.get("agreement"):
    print(result["agreement"]["text"], flush=True)
  if args.json_output:
    with open(args.json_output, "w") as f:
      json.dump(result, f, indent=1)
  return 0


def _predict(args) -> int:
  from tpu_models import export
  from tpu_models import task as task_lib
  from tpu_models.paths import check_directory
  config, model_dir = load_experiment(args)
  task_lib.require(config.task.name, task_lib.FilePredictor)  # Before loading weights.
  check_directory(args.output_dir, "--output-dir")
  task, model = export.load_model(config, model_dir)
  task_lib.require(task, task_lib.FilePredictor)
  failed = task.predict_files(model, args.inputs, args.output_dir, options=options(args),
                              say=lambda line: print(line, flush=True))
  if failed:
    print(f"tpu-models predict: {len(failed)} of {len(args.inputs)} input(s) failed: "
          f"{', '.join(failed)}", file=sys.stderr)
    return 1
  return 0


def _check(args) -> int:
  from tpu_models.training import tpu_check
  config, _ = load_experiment(args)
  report = tpu_check.check_config(config, per_replica_batch=args.batch_size)
  print(report.format())
  return 0 if report.ready else 1


def _benchmark(args) -> int:
  from tpu_models.training import benchmark
  config, model_dir = load_experiment(args)
  # Without --model-dir the run goes to a temporary directory (not runs/<config name>).
  result = benchmark.train_throughput(config, steps=args.steps, warmup=args.warmup,
                                      synthetic=not args.real_data, model_dir=args.model_dir)
  print(benchmark.format_result(result))
  return 0


def _sweep(args) -> int:
  from tpu_models.sweep import results, spec
  sweep = spec.load_sweep(args.sweep_file, args.overrides, extra_imports=args.imports)
  if not args.report:
    try:
      from tpu_models.sweep import driver
    except ImportError as e:
      if not (e.name or "").startswith("ray"):
        raise
      from tpu_models.errors import MissingExtraError
      raise MissingExtraError("tpu-models sweep runs its trials on Ray Tune, which is not "
                              "installed: pip install 'tpu-models[sweep]' (or 'ray[tune]').") from None
    try:
      driver.run_sweep(sweep, address=args.address)
    except driver.SweepStopped as e:  # SIGTERM: Tune's state saved, trials stopped.
      print(f"tpu-models sweep: {e}", file=sys.stderr)
      return e.exit_code
  ended = _sweep_report(sweep.directory)
  if args.export_best:
    from tpu_models.sweep import best
    best.export_best(sweep.directory, args.export_format, output=args.output, to=args.to,
                     overwrite=args.overwrite, say=lambda line: print(line, flush=True))
  if not ended and not args.report:  # Every trial failed: the sweep did not do its job.
    print("tpu-models sweep: error: no trial of the sweep ended (each failed: their errors are "
          "listed above); fix the cause and run the same command again.", file=sys.stderr)
    return 1
  return 0


def _sweep_report(directory: str) -> int:
  """Prints the leaderboard and the overhead; writes leaderboard.csv and curves.png.

  Returns how many trials ended (done or stopped)."""
  from tpu_models.sweep import files, results
  rows, record = results.collect(directory)
  print(results.leaderboard_text(rows, record), end="", flush=True)
  written = [results.write_csv(rows, record, os.path.join(directory, files.LEADERBOARD_CSV))]
  png = results.plot_curves(rows, record, os.path.join(directory, files.CURVES_PNG))
  written += [png] if png else []
  cost = results.overhead(directory, rows)
  if cost.get("training_seconds"):
    print(f"Sweep machinery {cost['machinery_seconds']:.0f} s (Ray start-up "
          f"{cost['ray_start_seconds']:.0f} s, idle slots while trials waited, reporting "
          f"{cost['report_seconds']:.1f} s) = {cost['fraction']:.1%} of the trials' "
          f"{cost['training_seconds'] / 60:.1f} min of training; wall "
          f"{cost['wall_seconds'] / 60:.1f} min.")
  print(f"Wrote {', '.join(written)}.", flush=True)
  return sum(row.state in ("done", "stopped") for row in rows)


_GENERIC_COMMANDS: Dict[str, Callable[[Any], int]] = {
    "list": _list, "config": _config, "train": _train, "evaluate": _evaluate, "export": _export,
    "predict": _predict, "check": _check, "benchmark": _benchmark}


if __name__ == "__main__":
  sys.exit(main())
