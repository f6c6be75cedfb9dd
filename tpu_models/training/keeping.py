"""Checkpoint keeping: restoring or warm-starting at start, putting the model_dir in order, saving,
and cleaning up after a full disk (the `Trainer`'s part that owns its checkpoints).

Reading checkpoints (the newest readable one, restoring by variable path) is
tpu_models/restore.py; moving unreadable ones aside and the state file are
training/checkpoints.py. This part decides when and what the Trainer restores
and saves, and leaves a model_dir as it found it when a save fails for space.
"""

import os
import shutil
from typing import Dict, Optional

import tensorflow as tf

from tpu_models.config import to_dict
from tpu_models.data import pipeline
from tpu_models.errors import ConfigError, DiskFullError
from tpu_models.training import checkpoints
from tpu_models.training import ema as ema_lib
from tpu_models.training import model_dir as model_dir_lib
from tpu_models.training.progress import METRICS_FILE


# What a training run writes on starting, before any step: all `_undo_start` may remove.
_START_RECORDS = frozenset((model_dir_lib.CONFIG_FILE, model_dir_lib.FINGERPRINTS_FILE,
                            checkpoints.WARM_START_FILE))


class CheckpointKeeping:
  """The Trainer's checkpoint keeping (a part of `Trainer`; it uses the Trainer's state)."""

  def _check_same_model(self, latest: str) -> None:
    """Refuses to resume a run of another model (its config.yaml says which)."""
    saved = (model_dir_lib.read_config_record(self.model_dir) or {}).get("task")
    saved = saved if isinstance(saved, dict) else {}
    ours = to_dict(self.config.task)
    for key in ("name", "model"):
      if key in saved and key in ours and saved[key] != ours[key]:
        raise ConfigError(
            f"{self.model_dir} holds a run of task.{key} = {saved[key]} (checkpoint {latest}); "
            f"this config has task.{key} = {ours[key]}. Use another --model-dir, or pass "
            f"--allow-model-change (Trainer(allow_model_change=True)) to resume it anyway.")

  def _restore_or_warm_start(self, latest: Optional[str]) -> None:
    for line in self._config_warnings:
      self._say_at_start(f"Warning: {line}")
    for line in self._fine_tune_lines:
      self._say_at_start(line)
    for line in self._resume.report():
      self._say_at_start(line)
    if self._resume.unreadable or self._resume.partial:
      self._say_at_start(f"Skipped checkpoint files are moved to "
                f"{os.path.join(self.model_dir, checkpoints.UNREADABLE_DIR)}/ when training "
                f"starts (never deleted).")
    if latest:
      # Before restoring: a refused run restores nothing (TensorFlow would log a warning
      # for every variable of a restore left unfinished).
      model_dir_lib.check_fingerprints(self.model_dir, self.task.required_files())
      try:
        fresh_average = self._restore(latest)
      except (AssertionError, ValueError) as e:
        raise ConfigError(
            f"Checkpoint {latest} does not match this model: "
            f"{pipeline.error_summary(str(e)).splitlines()[0][:300]}. It was written by another "
            f"model or config; use another --model-dir.") from None
      self._saved_steps.add(self._resume.step)
      self._elapsed_at_start = float(self.elapsed_seconds.numpy())
      self._say_at_start(f"Resumed from {latest} at step {self.current_step}.")
      if fresh_average:
        self._say_at_start(f"trainer.ema: {latest} holds no moving average of the weights; it starts "
                  f"from the restored weights.")
    elif self.config.trainer.init_checkpoint:
      self.warm_start(self.config.trainer.init_checkpoint,
                      self.config.trainer.init_checkpoint_map)

  def _restore(self, path: str) -> bool:
    """Restores the training state from `path`; True if the moving average had to start afresh.

    A checkpoint written without `trainer.ema` has no shadows: they start from its weights.
    """
    fresh_average = self.ema is not None and not ema_lib.in_checkpoint(path)
    target = self._restore_without_ema if fresh_average else self._restore_target
    target.restore(path).assert_existing_objects_matched()
    if fresh_average:
      self.ema.reset()
    return fresh_average

  def _prepare_model_dir(self) -> None:
    """Before the first save of a training run: put the model_dir in order (chief only).

    Unreadable checkpoints newer than the restored one and the leftovers of killed
    saves are moved aside, the state file points at the restored checkpoint, and
    metrics.jsonl is rewound to the restored step.
    """
    if self._model_dir_ready:
      return
    self._model_dir_ready = True
    if self.chief:
      reasons = dict(self._resume.unreadable)
      reasons.update({p: "a save that never finished" for p in self._resume.partial})
      checkpoints.move_aside(self.model_dir, list(reasons), say=self._say, reasons=reasons)
      checkpoints.write_state(self.model_dir, self._resume.path)
      reporter = self._open_reporter(self.config.trainer.train_steps)
      cut = reporter.repair()  # A last line cut short by a kill or a full disk.
      if cut:
        self._say(f"metrics.jsonl: {cut} line(s) cut short (by a kill or a full disk) moved to "
                  f"metrics.rewound.jsonl.")
      rewound = reporter.rewind(self.current_step)
      if rewound:
        self._say(f"metrics.jsonl: {rewound} row(s) past step {self.current_step} (from work "
                  f"that was not checkpointed) moved to metrics.rewound.jsonl.")
      if self._warm_start_report is not None:  # Written once training starts, not by evaluate.
        checkpoints.write_warm_start_report(self.model_dir, self._warm_start_report)
      if self._resume.path:
        self._reporter.record("resume", self.current_step, {},
                              checkpoint=os.path.basename(self._resume.path),
                              rewound_rows=rewound)
    self.manager = tf.train.CheckpointManager(
        self.checkpoint, self._checkpoint_dir, max_to_keep=self.config.trainer.max_checkpoints,
        step_counter=self.step)

  def warm_start(self, path: str, mapping: Optional[Dict[str, str]] = None
                 ) -> checkpoints.WarmStartReport:
    """Loads model weights by variable path from another run; see `checkpoints.warm_start`.

    The task's label-dependent layers and `trainer.fine_tune.reinitialize` are
    re-initialised when their shape differs; the report is logged and, when
    training starts, written to model_dir/warm_start.json.
    """
    self._warm_start_report = checkpoints.warm_start(
        self.model, path, mapping, say=self._say, reinitialize=self.fine_tune.reinitialize)
    if self.ema is not None:
      self.ema.reset()  # The average starts from the loaded weights.
    return self._warm_start_report

  def save_checkpoint(self) -> str:
    """Saves model, optimizer and step as `ckpt-<step>`; returns its path."""
    self._announce_start()
    self._prepare_model_dir()
    step = self.current_step
    prefix = os.path.join(self.model_dir, f"{checkpoints.CHECKPOINT_NAME}-{step}")
    if self.chief and step not in self._saved_steps and tf.io.gfile.glob(prefix + ".*"):
      # Never overwrite a checkpoint this run did not restore or write (e.g. another
      # run's in the same model_dir): keep it aside.
      checkpoints.move_aside(self.model_dir, [prefix], say=self._say,
                             reasons={prefix: "it would have been overwritten by a run that "
                                              "did not restore it"})
    new = step not in self._saved_steps
    self._saved_steps.add(step)
    self._save_begun = True  # From here on, the model_dir holds this run's work (_undo_start).
    self.elapsed_seconds.assign(self._elapsed())
    try:
      path = self.manager.save(checkpoint_number=self.step)
    except (OSError, tf.errors.OpError) as e:
      if not model_dir_lib.is_disk_full(e):
        raise
      raise self._disk_full(prefix, remove_unfinished=new and self.chief) from None
    if not self.chief:  # Other workers write only because saving is collective.
      shutil.rmtree(self._checkpoint_dir, ignore_errors=True)
      path = prefix  # Where the chief writes this step (it may not be done yet).
    self._last_saved = (step, path)
    return path

  def _disk_full(self, prefix: str, remove_unfinished: bool) -> DiskFullError:
    """The error of a checkpoint save that ran out of space; removes what the save left.

    Unless the state file already names it (the space ran out afterwards, deleting old
    checkpoints) or it is complete and reads back (the state file could not be written),
    the save is unfinished and the earlier checkpoints are as they were:
    its files (`ckpt-N_temp/`, a cut-off `ckpt-N.*`) are removed, which also frees their
    space, so the next run does not take them for a killed save.
    """
    # TensorFlow writes the state file through a temporary `checkpoint.tmp<uuid>`, which a
    # full disk leaves behind (empty or cut short); nothing ever reads it.
    for temp in tf.io.gfile.glob(os.path.join(self.model_dir, checkpoints.STATE_FILE + ".tmp*")):
      try:
        tf.io.gfile.remove(temp)
      except tf.errors.OpError:
        pass
    latest = tf.train.latest_checkpoint(self.model_dir)
    if latest and os.path.basename(latest) == os.path.basename(prefix):
      return DiskFullError(
          f"No space left on device after saving checkpoint {prefix} "
          f"({model_dir_lib.free_space(self.model_dir)}); it is complete and recorded. Free "
          f"some space and run the same command again to resume from it.")
    if (tf.io.gfile.exists(prefix + ".index") and
        checkpoints.unreadable_reason(prefix) is None):
      # Complete, but the state file could not be updated: the next run finds it by its files.
      return DiskFullError(
          f"No space left on device after saving checkpoint {prefix} "
          f"({model_dir_lib.free_space(self.model_dir)}); it is complete and reads back, though "
          f"the state file does not name it yet. Free some space and run the same command "
          f"again to resume from it.")
    if remove_unfinished:
      for leftover in tf.io.gfile.glob(prefix + ".*") + tf.io.gfile.glob(prefix + "_temp"):
        try:
          if tf.io.gfile.isdir(leftover):
            tf.io.gfile.rmtree(leftover)
          else:
            tf.io.gfile.remove(leftover)
        except tf.errors.OpError:
          pass  # Reported by the next run as an unfinished save; nothing is lost.
    kept = (f"The earlier checkpoints are intact (the newest is {latest}); run the same "
            f"command again once there is space and it resumes from there." if latest else
            "There is no earlier checkpoint; the run starts from scratch when run again.")
    return DiskFullError(
        f"No space left on device while saving checkpoint {prefix} "
        f"({model_dir_lib.free_space(self.model_dir)}); the unfinished save was removed. "
        f"{kept}")

  def _undo_start(self, before: set) -> None:
    """Removes the start records of a run that never began a save (see `_run`).

    Only what starting wrote goes, and only if it appeared since the lock was taken
    (config.yaml, fingerprints.json, warm_start.json; metrics.jsonl if it is new and
    empty), then the model_dir itself if this Trainer made it and it is then empty.
    Anything else, a checkpoint, a metrics row or a summary, is the run's work and is
    kept: a cleanup must never be what loses it.
    """
    for name in set(tf.io.gfile.listdir(self.model_dir)) - before:
      name = name.rstrip("/")
      if name in _START_RECORDS:
        tf.io.gfile.remove(os.path.join(self.model_dir, name))
    if self._lock is not None:
      self._lock.release()
      self._lock = None
    self._remove_empty_leftovers()

  def _remove_empty_leftovers(self) -> None:
    """Removes an empty metrics.jsonl that is new (opening the progress reporter makes it),
    then the model_dir if this Trainer made it and it is empty."""
    if self._reporter is not None:
      self._reporter.close()
      self._reporter = None
    if not tf.io.gfile.isdir(self.model_dir):
      return
    metrics = os.path.join(self.model_dir, METRICS_FILE)
    if (METRICS_FILE not in (self._listing_at_init or set()) and
        tf.io.gfile.exists(metrics) and not tf.io.gfile.stat(metrics).length):
      tf.io.gfile.remove(metrics)
    if self._listing_at_init is None and not tf.io.gfile.listdir(self.model_dir):
      tf.io.gfile.rmtree(self.model_dir)

  def _disk_full_at_start(self, what: str) -> DiskFullError:
    """The one line of a disk that is full before training starts (writing `what`)."""
    return DiskFullError(
        f"No space left on device in {self.model_dir} while writing {what} before training "
        f"({model_dir_lib.free_space(self.model_dir)}): nothing was trained, no checkpoint was "
        f"changed and nothing written by this run was left. Free some space and run the same "
        f"command again.")
