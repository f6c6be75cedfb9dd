"""Dataset sources that know no task: where local data lives, and prepared TFDS builders.

Loaders look in local places first: an explicit path, then `$TPU_MODELS_DATA`,
then known system paths; nothing is downloaded at run time.
"""

from typing import Optional

import tensorflow as tf

from tpu_models.config import DataConfig
from tpu_models.errors import DataError
from tpu_models.registry import register_dataset

DATA_ENV = "TPU_MODELS_DATA"  # Root of local datasets, searched after an explicit path.


@register_dataset("tfds")
def tfds_source(config: DataConfig, training: bool,
                input_context: Optional[tf.distribute.InputContext]) -> tf.data.Dataset:
  """A prepared TFDS builder's split: dict elements as TFDS decodes them.

  `config.tfds_name` names the builder (e.g. "cifar10", "my_dataset:1.0.2"),
  `config.path` is the TFDS data_dir (default ~/tensorflow_datasets), and
  `config.split` any TFDS split string ("train[:90%]"). Files are sharded per
  input pipeline by TFDS (`ReadConfig.input_context`).
  """
  if not config.tfds_name:
    raise DataError(f"Data source 'tfds' needs data.tfds_name (split {config.split!r}), the "
                     f"TFDS builder name such as 'cifar10' or 'my_dataset:1.0.2'.")
  import tensorflow_datasets as tfds  # Heavy: only when this source is used.

  data_dir = config.path or None
  try:
    builder = tfds.builder(config.tfds_name, data_dir=data_dir)
  except tfds.core.DatasetNotFoundError:
    raise DataError(
        f"TFDS has no builder named {config.tfds_name!r} and no prepared data for it under "
        f"{data_dir or '~/tensorflow_datasets'}. Check the name "
        f"(`tfds.list_builders()`).") from None
  if not builder.is_prepared():
    raise FileNotFoundError(
        f"TFDS dataset {config.tfds_name!r} is not prepared in {builder.data_dir}. Data is "
        f"never downloaded at run time: on a machine with internet run\n"
        f"  tfds build {config.tfds_name} --data_dir {data_dir or '~/tensorflow_datasets'}\n"
        f"(datasets that need a manual download also need --manual_dir), then copy "
        f"the data_dir here or point data.path at it.")
  read_config = tfds.ReadConfig(
      input_context=input_context,
      shuffle_seed=config.seed,
      interleave_cycle_length=config.cycle_length,
      try_autocache=False)  # The shared reader caches when data.cache is set.
  return builder.as_dataset(split=config.split, shuffle_files=training, read_config=read_config)
