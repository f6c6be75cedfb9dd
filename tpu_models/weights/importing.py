"""Importing weights: into a model, into a new model_dir, and from a catalogue entry.

    report = load_weights(model, "downloads/model.safetensors", "timm")
    import_weights("CATALOGUE_NAME", "downloads/", "runs/imported")
    model = create_model("MODEL", weights="runs/imported")   # tpu_models.create_model

A model_dir written here is what `tpu-models train` writes at step 0: `ckpt-0`
(model, optimizer in its initial state, step, and the weights by variable
path), `config.yaml` (the model params and the task keys that go with the
weights: image size, crop, normalisation) and `weights_import.json` (the
report). So `tpu-models evaluate/export/predict MODEL_DIR/config.yaml
--model-dir MODEL_DIR` read it as it is, `tpu-models train` there continues
from it, and `trainer.init_checkpoint: MODEL_DIR` warm-starts another run.
"""

import json
import os
import shutil
from typing import Any, Callable, Iterable, Optional

from tpu_models.errors import ConfigError, DataError
from tpu_models.weights import catalogue
from tpu_models.weights import mapping
from tpu_models.weights import stores

REPORT_FILE = "weights_import.json"


class MissingWeightsError(DataError):
  """The weights file of a catalogue entry is not where the user said; says where to get it."""


def load_weights(model, path: str, source_format: str, *, family: Optional[str] = None,
                 store_format: Optional[str] = None, model_name: Optional[str] = None,
                 **options) -> mapping.ImportReport:
  """Assigns the weights file at `path` (written by `source_format`'s library) to `model`.

  Args:
    model: our built model of the same architecture.
    path: the file or directory (see `tpu_models.weights.stores`).
    source_format: the importer's source format ("torchvision", "model_garden", ...).
    family: the importer's family; None = the importer serving `model_name`.
    store_format: the tensor-store format; None = the importer's, else detected.
    model_name: our registered model name (default: `model.name`).
    **options: the importer's options.

  Returns:
    The `ImportReport`; raises `WeightsMismatchError` when the file does not fit.
  """
  importer = catalogue.get_importer(source_format, family, model_name or model.name)
  store = stores.open_store(path, store_format or importer.store_format)
  name_map = importer.build(model, store, **options)
  return mapping.assign_name_map(model, name_map, store,
                                 source=f"{source_format} {importer.family}")


def write_model_dir(config, output_dir: str, load: Callable[[Any], mapping.ImportReport], *,
                    say: Callable[[str], None] = print) -> str:
  """Builds `config`'s model, fills it with `load(model)` and writes a model_dir at step 0.

  Args:
    config: an `ExperimentConfig` (its model is the one loaded).
    output_dir: the new model_dir; must not hold checkpoints yet.
    load: fills the model, returns the `ImportReport` (written to weights_import.json).
    say: where progress lines go.

  Returns:
    The path of the written checkpoint.
  """
  from tpu_models import config as config_lib
  from tpu_models import restore
  from tpu_models.training.trainer import Trainer
  if restore.find_resume(output_dir).path or restore.list_checkpoints(output_dir):
    raise ConfigError(f"Output directory {output_dir!r} already holds checkpoints; choose a "
                      f"new one.")
  existing = set(os.listdir(output_dir)) if os.path.isdir(output_dir) else None
  os.makedirs(output_dir, exist_ok=True)
  try:
    trainer = Trainer(config, output_dir)
    try:
      report = load(trainer.model)
      config_lib.dump_config(config, os.path.join(output_dir, "config.yaml"))
      path = trainer.save_checkpoint()
    finally:
      trainer.close()
  except BaseException:
    _remove_new(output_dir, existing)  # A refused import leaves nothing behind.
    raise
  with open(os.path.join(output_dir, REPORT_FILE), "w") as f:
    json.dump(report.to_json(), f, indent=1)
  say(report.summary())
  say(f"Wrote {path} (and config.yaml): tpu-models evaluate/export/predict "
      f"{os.path.join(output_dir, 'config.yaml')} --model-dir {output_dir}, or "
      f"trainer.init_checkpoint: {output_dir}.")
  return path


def _remove_new(directory: str, existing) -> None:
  """Removes `directory` if it did not exist (`existing` None), else what is new in it."""
  if existing is None:
    shutil.rmtree(directory, ignore_errors=True)
    return
  for name in set(os.listdir(directory)) - existing:
    path = os.path.join(directory, name)
    if os.path.isdir(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      os.remove(path)


# ----------------------------------------------------------------------------
# Catalogue entries.


def locate(entry: catalogue.WeightsEntry, path: str) -> str:
  """The weights file of `entry` at `path` (the file itself, or a directory holding it).

  Raises `MissingWeightsError` naming the download location and the expected
  file name(s) when it is not there.
  """
  if os.path.isdir(path):
    found = [os.path.join(path, name) for name in entry.files
             if os.path.exists(os.path.join(path, name))]
    if len(found) > 1:
      raise ConfigError(f"{path!r} holds {len(found)} candidate weights files of "
                        f"{entry.name!r} ({', '.join(os.path.basename(f) for f in found)}); "
                        f"pass the one to import as the path itself, e.g. {found[0]}.")
    if found:
      return found[0]
    if any(os.path.exists(os.path.join(path, f)) for f in ("config.json", "checkpoint")):
      return path  # A preset or checkpoint directory is the weights itself.
  elif os.path.exists(path) or os.path.exists(path + ".index"):
    return path
  raise MissingWeightsError(
      f"No weights for {entry.name!r} at {path!r}: expected {' or '.join(entry.files)}; "
      f"download it from {entry.download} (nothing is downloaded here).")


def entry_config(entry: catalogue.WeightsEntry, overrides: Iterable[str] = ()):
  """The `ExperimentConfig` of an entry: its model and params, its task keys, CPU runtime."""
  from tpu_models import config as config_lib
  task = dict(entry.task)
  task["model"] = {"name": entry.model, **entry.params}
  return config_lib.experiment_from_dict({"task": task}, overrides)


def import_weights(name: str, path: str, output_dir: str, *, overrides: Iterable[str] = (),
                   say: Callable[[str], None] = print) -> str:
  """`tpu-models weights import NAME PATH --output OUTPUT_DIR`; returns the checkpoint path.

  Raises:
    ConfigError: the entry is refused (the reason) or the file does not fit.
    MissingWeightsError: the file is not at `path` (where to download it).
  """
  entry = catalogue.get_weights(name)
  if entry.refused:
    raise ConfigError(f"{entry.name} cannot be imported: {entry.refused}")
  weights_path = locate(entry, path)
  config = entry_config(entry, overrides)

  def load(model):
    return load_weights(model, weights_path, entry.source_format, family=entry.family,
                        model_name=entry.model, **entry.importer_options)

  return write_model_dir(config, output_dir, load, say=say)

