"""The catalogue path of the importer tests: a temporary entry -> model_dir -> the loaded model."""

import os

from tpu_models import config as config_lib
from tpu_models import export
from tpu_models.weights import catalogue, importing


def import_entry(entry: catalogue.WeightsEntry, source: str, output: str):
  """Registers `entry` for the call, imports `source` into `output`, returns (task, model).

  The model is what `evaluate`, `export` and `predict` read (`export.load_model`);
  the data sources are synthetic so no dataset is needed.
  """
  catalogue.register_weights(entry)
  try:
    importing.import_weights(entry.name, source, output, say=lambda _: None,
                             overrides=["task.train_data.source=synthetic",
                                        "task.eval_data.source=synthetic",
                                        "runtime.strategy=cpu"])
  finally:
    del catalogue.WEIGHTS[entry.name]
  config = config_lib.load_config(os.path.join(output, "config.yaml"))
  return export.load_model(config, output)
