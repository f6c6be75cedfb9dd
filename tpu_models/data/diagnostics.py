"""Explaining input failures: one sentence naming the data config, the damaged file, the fix."""

import re
import time
from typing import List, Optional

import tensorflow as tf

from tpu_models.config import DataConfig
from tpu_models.data.files import match_files
from tpu_models.data.skipping import INVALID_VALUE, NO_EXAMPLES, SkipReport


def describe_input_error(error: tf.errors.OpError, config: Optional[DataConfig], key: str,
                         report: Optional[SkipReport] = None) -> str:
  """A user-facing sentence for a failure raised inside an input pipeline.

  Args:
    error: what the iterator raised (InvalidArgumentError from a decoder or an
      `assert_allowed` check, DataLossError from a damaged TFRecord,
      OutOfRangeError from an input with no examples).
    config: the data config read (None if unknown), `key` its config key
      ("task.train_data").
    report: what `on_corrupt=skip` dropped so far.
  """
  summary = error_summary(error.message)
  where = (f" ({key}: source {config.source!r}, path {config.path!r}, split {config.split!r})"
           if config is not None else "")
  skipped = (f" on_corrupt=skip {report.describe()}." if report is not None and report.enabled
             else "")
  if INVALID_VALUE in error.message:
    # "assertion failed: [<INVALID_VALUE>: message] [value]" -> "message value".
    text = summary.split(f"{INVALID_VALUE}: ", 1)[-1]
    detail = " ".join(part.strip() for part in re.split(r"\]\s*\[?", text) if part.strip())
    return (f"The {key} data holds a value the config does not allow{where}: {detail}. This "
            f"is not a corrupt record (on_corrupt=skip does not skip it): fix the data or the "
            f"config.")
  if isinstance(error, tf.errors.OutOfRangeError) or NO_EXAMPLES in error.message:
    return (f"The {key} input produced no examples{where}.{skipped} Check the path and the "
            f"split; a converter given empty class folders writes empty shards.")
  hint = (f" Fix or remove it, or set {key}.on_corrupt=skip to skip unreadable records and "
          f"count them in the log." if config is not None and config.on_corrupt != "skip" else "")
  if isinstance(error, tf.errors.DataLossError):
    damaged = None
    if config is not None and config.source == "tfrecord":
      damaged = find_damaged_tfrecord(match_files(config.path), error.message)
    what = (f"TFRecord file {damaged} is damaged" if damaged else
            "a TFRecord file is damaged (searching the files for it took too long)")
    return f"Reading the {key} input failed{where}: {what}: {summary}.{hint}"
  return f"Reading the {key} input failed{where}: {summary}.{hint}{skipped}"


def error_summary(message: str) -> str:
  """TF's runtime error without its boilerplate ("Graph execution error", node lists)."""
  skip = ("Graph execution error", "Detected at node", "<stack traces", "[[")
  lines = [line.strip() for line in message.splitlines()]
  kept = [line for line in lines if line and not line.startswith(skip)]
  text = " ".join(kept).split(" [Op:")[0] or message.strip()
  text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", text)
  text = re.sub(r"Error in user-defined function passed to \S+ transformation with "
                r"iterator: \S+: ", "", text)
  return text.replace("' failed with ", ": ").strip().rstrip(".")


def find_damaged_tfrecord(files: List[str], message: str, seconds: float = 30.0) -> Optional[str]:
  """The first of `files` whose reading fails like `message` ("corrupted record at 363").

  Reads whole files (C++ reader, checksums verified) until one fails at the
  same byte offset, for at most `seconds`; None if none is found in time.
  """
  offset = re.search(r"record at (\d+)", message)
  deadline = time.time() + seconds
  for f in files:
    if time.time() > deadline:
      return None
    if offset and tf.io.gfile.stat(f).length <= int(offset.group(1)):
      continue
    try:
      for _ in tf.data.TFRecordDataset(f):
        if time.time() > deadline:
          return None
    except tf.errors.DataLossError as e:
      if offset is None or f"record at {offset.group(1)}" in e.message:
        return f
  return None
