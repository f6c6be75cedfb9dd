"""Files and sharding: list a path's files, check them, share them out per input pipeline, read.

`read_files` is the one file reader every file-backed source goes through (list ->
shard per input pipeline -> [shuffle files] -> interleave); `read_tfrecords` is it
for TFRecord files, counting damaged files under `on_corrupt: skip`. Shard sets
written by `tpu-models convert` are checked against their completion markers
(data/records.py) before anything is read.
"""

import glob as _glob
import logging
import os
from typing import Callable, Dict, List, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from tpu_models.config import DataConfig
from tpu_models.data import records
from tpu_models.data.skipping import active_report, read_counting_damage
from tpu_models.errors import ConfigError, DataError

_LOG = logging.getLogger("tpu_models")


def match_files(path: str) -> List[str]:
  """Sorted files matching a glob, a list of comma-separated globs or a directory."""
  files = []
  for pattern in [p.strip() for p in path.split(",") if p.strip()]:
    try:
      if tf.io.gfile.isdir(pattern):
        pattern = os.path.join(pattern, "*")
      files.extend(tf.io.gfile.glob(pattern) if "://" in pattern else _glob.glob(pattern))
    except tf.errors.OpError as e:  # e.g. a gs:// bucket with no network or no credentials.
      raise FileNotFoundError(f"Cannot list {pattern!r}: {e.message.strip()}") from None
  return sorted(set(files))


def shard_files(files: List[str],
                input_context: Optional[tf.distribute.InputContext]) -> List[str]:
  """This input pipeline's files: every `num_input_pipelines`-th, no overlap or loss."""
  if input_context is None or input_context.num_input_pipelines == 1:
    return files
  n, i = input_context.num_input_pipelines, input_context.input_pipeline_id
  if len(files) < n:
    raise DataError(
        f"{len(files)} file(s) cannot be split across {n} input pipelines without "
        f"reading some twice; write at least {n} shards (e.g. tpu-models convert "
        f"--num-shards {n}).")
  return files[i::n]


def read_files(config: DataConfig,
               read_fn: Callable[..., tf.data.Dataset],
               *,
               training: bool,
               input_context: Optional[tf.distribute.InputContext],
               expected: str,
               path: Union[str, Sequence[str], None] = None,
               with_sizes: bool = False) -> tf.data.Dataset:
  """The one file reader: list -> shard per input pipeline -> [shuffle files] -> interleave.

  Every file-backed source calls this with a per-file read function, e.g.
  `lambda f: tf.data.TFRecordDataset(f)` or `tf.data.TextLineDataset`.

  Args:
    config: `config.path` (unless `path` is given), `split`, `seed`,
      `cycle_length`, `deterministic`; `config.source` names the source in errors.
    read_fn: path (tf.string []) -> dataset of one file's elements; with
      `with_sizes`, (path, size in bytes tf.int64 []) -> dataset.
    training: shuffle the file order (seeded by `config.seed`, reshuffled each epoch).
    input_context: from `distribute_datasets_from_function`; None = one pipeline.
    expected: what the files hold, for errors ("TFRecord files of tf.Examples").
    path: a glob, comma-separated globs, a directory, or a list of those;
      default `config.path`.
    with_sizes: also pass each file's size to `read_fn` (to tell a damaged file
      from a whole one).

  Returns:
    The elements of this input pipeline's files, interleaved `config.cycle_length`
    files at a time.

  Raises:
    ConfigError: no path is configured.
    FileNotFoundError: nothing matches the path (or it cannot be listed).
    DataError: every matching file is empty (0 bytes), or there are fewer files
      than input pipelines.
  """
  files = list_files(config, input_context, expected=expected, path=path)
  if with_sizes:
    sizes = np.array([tf.io.gfile.stat(f).length for f in files], np.int64)
    dataset = tf.data.Dataset.from_tensor_slices((files, sizes))
  else:
    dataset = tf.data.Dataset.from_tensor_slices(files)
  if training:
    dataset = dataset.shuffle(len(files), seed=config.seed, reshuffle_each_iteration=True)
  return dataset.interleave(
      read_fn,
      cycle_length=max(1, min(config.cycle_length, len(files))),
      num_parallel_calls=tf.data.AUTOTUNE,
      deterministic=config.deterministic or not training)


def list_files(config: DataConfig,
               input_context: Optional[tf.distribute.InputContext],
               *,
               expected: str,
               path: Union[str, Sequence[str], None] = None) -> List[str]:
  """This input pipeline's share of the files at `path` (default `config.path`), checked.

  See `read_files` for the arguments and errors.
  """
  if path is None:
    path = config.path
  if not isinstance(path, str):
    path = ",".join(path)
  if not path:
    raise ConfigError(f"Data source {config.source!r} needs a path (split {config.split!r}): "
                      f"set task.<split>_data.path to {expected} (a glob, comma-separated "
                      f"globs or a directory).")
  files = match_files(path)
  if not files:
    raise FileNotFoundError(f"No files match {path!r} for data source {config.source!r} "
                            f"(split {config.split!r}); expected {expected}.")
  files = _check_shard_sets(files, path, config)
  _check_not_all_empty(files, path, config)
  return shard_files(files, input_context)


def _check_shard_sets(files: List[str], path: str, config: DataConfig) -> List[str]:
  """`files` without completion markers, checked against them (see data/records.py).

  Raises:
    DataError: a file is a shard still being written (or left by a killed
      converter), or a shard disagrees with its set's marker (not listed there:
      another conversion's; another size: changed or cut short, which
      on_corrupt=skip only warns about).
  """
  where = f"{path!r} (split {config.split!r})"
  partial = [f for f in files if f.endswith(records.PARTIAL_SUFFIX)]
  if partial:
    raise DataError(
        f"{where} matches {len(partial)} unfinished shard(s), e.g. {partial[0]}: a conversion "
        f"was killed or is still running. Run it again (it replaces them), or delete the "
        f"*{records.PARTIAL_SUFFIX} files.")
  files = [f for f in files if not f.endswith(records.MARKER_SUFFIX)]
  sets: Dict[str, List[str]] = {}
  for f in files:
    parsed = records.parse_shard_path(f)
    if parsed is not None:
      sets.setdefault(parsed[0], []).append(f)
  for prefix, shards in sets.items():
    try:
      marker = records.read_marker(prefix)
    except ValueError as e:
      raise DataError(f"{where}: {e}") from None
    if marker is None:
      continue  # Written before markers existed, or by another tool: nothing to check.
    listed = {s["name"]: s for s in marker["shards"]}
    marker_file = records.marker_path(prefix)
    for f in shards:
      entry = listed.get(os.path.basename(f))
      if entry is None:
        raise DataError(
            f"{where} matches {f}, which is not one of the {marker['num_shards']} shard(s) "
            f"{marker_file} lists: it is left from another conversion (another shard count?). "
            f"Delete it, or convert again.")
      size = tf.io.gfile.stat(f).length
      if size != entry["bytes"]:
        problem = (f"{f} has {size} bytes but {marker_file} records {entry['bytes']}: the "
                   f"shard was cut short or changed after it was written")
        if config.on_corrupt != "skip":
          raise DataError(f"{problem}. Convert again, or set on_corrupt=skip to read what "
                          f"is readable of it.")
        # on_corrupt=skip reads what it can and counts a damaged file (read_tfrecords).
        _LOG.warning("%s; on_corrupt=skip: reading what is readable.", problem)
  return files


def _check_not_all_empty(files: List[str], path: str, config: DataConfig) -> None:
  """An input whose files are all empty (0 bytes) is an error before anything runs."""
  for f in files:
    if tf.io.gfile.stat(f).length > 0:
      return
  raise DataError(
      f"All {len(files)} file(s) matching {path!r} (split {config.split!r}) are empty "
      f"(0 bytes), e.g. {files[0]}: there is nothing to read. Were they converted from empty "
      f"folders?")


def read_tfrecords(config: DataConfig, *, training: bool,
                   input_context: Optional[tf.distribute.InputContext],
                   expected: str = "TFRecord files") -> tf.data.Dataset:
  """Serialized records of the TFRecord files at `config.path`, via `read_files`.

  With `on_corrupt=skip`, a file that a damaged record ends early is counted in
  the `SkipReport` (see `read_counting_damage`) instead of stopping the run.
  """
  if config.on_corrupt == "skip":
    report = active_report()
    return read_files(config, lambda f, size: read_counting_damage(f, size, report),
                      training=training, input_context=input_context, expected=expected,
                      with_sizes=True)
  return read_files(config, lambda f: tf.data.TFRecordDataset(f, buffer_size=8 << 20),
                    training=training, input_context=input_context, expected=expected)

