"""Building a registered model, optionally with the weights of a model_dir.

    model = create_model("my_mlp", num_classes=3)
    model = create_model("my_mlp", weights="runs/imported", num_classes=3)
    model = create_model("my_model", weights="CATALOGUE_ENTRY", **entry_params)

The registry (tpu_models/registry.py) holds names only; building and loading
live here, one layer above it, so that looking a name up never imports
TensorFlow or the checkpoint code. `tpu_models.create_model` and
`tpu_models.registry.create_model` are this function.
"""

import os
from typing import Any, Optional

from tpu_models.registry import MODELS


def create_model(name: str, weights: Optional[str] = None, **kwargs) -> Any:
  """Builds the registered model `name` with keyword arguments `kwargs`.

  weights: a model_dir (e.g. written by `tpu-models weights import`) whose
    latest checkpoint holds every variable of this model, loaded by path; or a
    weights catalogue entry (`tpu-models weights list`): its cached model_dir,
    else its file, fetched and verified into the cache (TPU_MODELS_HOME) when
    missing, loaded through the entry's importer. Pass the entry's params.
  """
  model = MODELS.get(name)(**kwargs)
  if weights is not None:
    if os.path.isdir(weights) or os.sep in weights:
      load_model_dir_weights(model, weights)
    else:
      load_catalogue_weights(model, weights)
  return model


def load_catalogue_weights(model, entry_name: str):
  """Loads catalogue entry `entry_name`'s weights into `model` (cached model_dir, else its
  verified downloaded file); returns the load report."""
  from tpu_models.weights import catalogue, fetch
  entry = catalogue.get_weights(entry_name)
  model_dir = fetch.model_dir_of(entry.name)
  if os.path.exists(os.path.join(model_dir, "config.yaml")):
    return load_model_dir_weights(model, model_dir)
  if entry.remote is None or not entry.remote.url:
    raise fetch.WeightsDownloadError(
        f"{entry.name}: no public download location "
        f"({entry.remote.published if entry.remote else 'none recorded'}); import a file you "
        f"have with `tpu-models weights import {entry.name} FILE --output DIR` and pass "
        f"weights=DIR.")
  path = fetch.fetch_file(entry.remote, label=entry.name)
  return catalogue.load_entry_file(model, entry, fetch.weights_path(entry.remote, path))


def load_model_dir_weights(model, model_dir: str):
  """Loads a model_dir's weights into `model` by variable path; every variable must be there.

  Returns the `restore.WarmStartReport`; raises `WeightsMismatchError` (a
  ConfigError) naming the first variable that is missing or of another shape.
  """
  # TensorFlow and the checkpoint reader only when weights are asked for.
  from tpu_models import restore
  from tpu_models.errors import ConfigError
  from tpu_models.weights.mapping import WeightsMismatchError
  try:
    return restore.warm_start(model, model_dir, say=lambda _: None, strict=True)
  except ConfigError as e:
    raise WeightsMismatchError(
        f"{model_dir} does not hold every variable of model {model.name!r} with its shape: "
        f"{e}; build the model with the params of {model_dir}/config.yaml.") from None
