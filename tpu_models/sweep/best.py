"""Ship the best trial of a sweep: pick by validation, export, score once on test.

    tpu-models sweep SWEEP.yaml --export-best --format litert
    tpu-models sweep SWEEP.yaml --export-best --to MODEL_BASE   # the next served version

The best trial is the one with the best validation value of the sweep's metric
among the trials that ended (done, or stopped by the scheduler); the test split
is never looked at to choose it. Its newest checkpoint (the one that value was
measured on) is exported by the ordinary export path with the config its
model_dir recorded, then scored once on the test split through the export's own
runtime. `export.json` names the trial, its parameters, its validation value and
the test result, next to what every export records.
"""

import json
import os
from typing import Any, Callable, Dict, Optional

from tpu_models.errors import ConfigError
from tpu_models.sweep import results

BEST_DIR = "best"


def export_best(directory: str, format_name: str = "saved_model", *,
                output: Optional[str] = None, to: Optional[str] = None,
                overwrite: bool = False, calibration_examples: int = 256,
                say: Callable[[str], None] = print) -> Dict[str, Any]:
  """Exports the best trial of the sweep in `directory`; returns what export.json records of it.

  Args:
    directory: the sweep directory.
    format_name: saved_model, litert, litert-int8 or onnx.
    output: the export directory (default SWEEP_DIR/best/<format>).
    to: instead of `output`, a MODEL_BASE: the export (scored on test first) becomes its
      next numbered version, renamed into place complete (serving/repository.publish),
      where a running `tpu-models serve MODEL_BASE` picks it up.
    overwrite: replace an existing `output` (by default refused).
    calibration_examples: litert-int8's calibration examples.
    say: receives the export's lines.

  Raises:
    ConfigError: no trial has ended with a validation value yet.
  """
  if to:
    if output:
      raise ConfigError("--output and --to both name where the export goes; pass one.")
    from tpu_models.serving import repository
    kept = {}

    def write(staging: str) -> None:
      kept["provenance"] = export_best(directory, format_name, output=staging,
                                       calibration_examples=calibration_examples, say=say)

    repository.publish(to, write, say=say)
    return kept["provenance"]
  from tpu_models import config as config_lib
  from tpu_models.training import model_dir as model_dir_lib
  rows, record = results.collect(directory)
  best = results.best_trial(rows)
  if best is None:
    raise ConfigError(f"No trial of the sweep in {directory} has ended with a validation "
                      f"{record['metric']} yet ({len(rows)} trials); let the sweep run, then "
                      f"export its best.")
  config = config_lib.load_config(os.path.join(best.model_dir, model_dir_lib.CONFIG_FILE))
  output = (output or os.path.join(directory, BEST_DIR, format_name)).rstrip("/")
  values = ", ".join(f"{k}={results._format(v)}" for k, v in sorted(best.params.items()))  # pylint: disable=protected-access
  say(f"Best trial by validation {record['metric']}: {best.trial} ({best.value:.4f} at step "
      f"{best.step}, {best.state}; {values}).")
  if format_name == "saved_model":
    from tpu_models import export
    export.export_saved_model(config, best.model_dir, output, overwrite=overwrite, say=say)
  else:
    from tpu_models import export
    export.export_deployment(config, best.model_dir, output, format_name=format_name,
                             calibration_examples=calibration_examples, overwrite=overwrite,
                             say=say)
  test = _score_test(output, config, best.model_dir, say)
  provenance = {"sweep_directory": directory, "sweep_file": record.get("sweep_file"),
                "trial": best.trial, "model_dir": best.model_dir, "params": best.params,
                "metric": record["metric"], "mode": record["mode"],
                "validation": best.value, "validation_step": best.step, "state": best.state,
                "test": test, "ranked_trials": len(rows)}
  path = _export_json(output)
  with open(path) as f:
    written = json.load(f)
  written["sweep"] = provenance
  model_dir_lib.write_text_atomically(path, json.dumps(written, indent=1))
  if test:
    shown = ", ".join(f"{k} {v:.4f}" for k, v in test["metrics"].items() if k != "examples")
    say(f"Test split, once, through {test['runtime']}: {shown} "
        f"({int(test['metrics'].get('examples', 0))} examples). Recorded in {path}.")
  return provenance


def _score_test(output: str, config, model_dir: str,
                say: Callable[[str], None]) -> Optional[Dict[str, Any]]:
  """The test split's metrics through the export's runtime (None when there is no test split)."""
  if config.task.test_data is None:
    say("The experiment has no task.test_data: the export is not scored on a test split.")
    return None
  from tpu_models.task import Deployable, create_task
  if isinstance(create_task(config.task), Deployable):
    from tpu_models import export
    result = export.evaluate_export(output, config, "test", say=say)
    return {"runtime": result["runtime"], "metrics": result["metrics"]}
  from tpu_models.training.trainer import Trainer  # The checkpoint itself, by the Trainer.
  trainer = Trainer(config, model_dir)
  try:
    return {"runtime": "Trainer.evaluate (the checkpoint)", "metrics": trainer.evaluate("test")}
  finally:
    trainer.close()


def _export_json(output: str) -> str:
  for candidate in (os.path.join(output, "export.json"),
                    os.path.join(output, "assets.extra", "export.json")):
    if os.path.exists(candidate):
      return candidate
  raise FileNotFoundError(f"{output} holds no export.json after the export.")
