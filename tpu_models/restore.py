"""Reading checkpoints: the newest readable one of a model_dir, and variables restored by path.

A leaf: it depends on TensorFlow and `tpu_models.errors` only, so the model
factory (`create_model(name, weights=MODEL_DIR)`), the trainer, the exporters
and the weights importers all restore through it without importing each other.

Finding. `find_resume(model_dir)` lists every checkpoint with a file in the
model_dir (the `checkpoint` state file, `ckpt-N.index`, `ckpt-N.data-*`, and
the `ckpt-N_temp/` of a save that was killed), newest first, and reads each
one in full (every tensor, checksums included) until one is readable; it only
reads (moving unreadable ones aside is tpu_models/training/checkpoints.py's).

Restoring by path. The Trainer saves every model variable twice-reachable:
through the model's object graph (for resuming) and by its variable path under
"weights/". `warm_start` restores a model's variables by those paths, so a
model that differs (a new head, a backbone inside a larger model) takes what
matches and reports the rest.
"""

import dataclasses
import os
import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tpu_models.errors import ConfigError, DataError

CHECKPOINT_NAME = "ckpt"  # tf.train.CheckpointManager's default prefix: ckpt-<step>.
STATE_FILE = "checkpoint"
CHECKPOINT_FILE_RE = re.compile(rf"^{CHECKPOINT_NAME}-(\d+)(\.index|\.data-\d+-of-\d+|_temp)$")

WEIGHTS_PREFIX = "weights/"
_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


def weights_checkpoint(variables) -> tf.train.Checkpoint:
  """A checkpoint object holding `variables` by their paths (saved under "weights/")."""
  return tf.train.Checkpoint(**{v.path: v for v in variables})


def resolve(path: str) -> str:
  """A checkpoint prefix from a prefix or a directory (its newest readable checkpoint)."""
  if tf.io.gfile.isdir(path):
    found = find_resume(path).path
    if not found:
      raise FileNotFoundError(f"trainer.init_checkpoint: no checkpoint in directory {path!r}.")
    return found
  return path


@dataclasses.dataclass
class Resume:
  """What `find_resume` found in a model_dir.

  Attributes:
    path: the newest readable checkpoint's prefix (".../ckpt-20"), or None.
    step: its number (the training step it was saved at), 0 without one.
    unreadable: (prefix, reason) of every newer checkpoint that could not be
      read, newest first.
    partial: prefixes of killed saves that left only a `ckpt-N_temp/` directory.
  """
  path: Optional[str] = None
  step: int = 0
  unreadable: List[Tuple[str, str]] = dataclasses.field(default_factory=list)
  partial: List[str] = dataclasses.field(default_factory=list)

  def report(self) -> List[str]:
    """One line per skipped checkpoint, for the log."""
    lines = [f"Checkpoint {path} is unreadable ({reason}); skipped."
             for path, reason in self.unreadable]
    lines += [f"{path}_temp/ holds a save that never finished (the process was killed while "
              f"writing it); skipped." for path in self.partial]
    if lines and self.path:
      lines.append(f"Using the newest readable checkpoint, {self.path} (step {self.step}).")
    return lines


def list_checkpoints(model_dir: str) -> List[Tuple[int, str, List[str]]]:
  """(number, prefix, file names) of every checkpoint with a file in `model_dir`, newest first.

  Found from the files themselves (`ckpt-N.index`, `ckpt-N.data-*`,
  `ckpt-N_temp/`) and from the state file, so a checkpoint whose index was
  deleted, or one written by a run killed before it updated the state file,
  is still seen.
  """
  found: Dict[int, List[str]] = {}
  if not tf.io.gfile.isdir(model_dir):
    return []
  for name in tf.io.gfile.listdir(model_dir):
    match = CHECKPOINT_FILE_RE.match(name.rstrip("/"))
    if match:
      found.setdefault(int(match.group(1)), []).append(name.rstrip("/"))
  for path in _state_paths(model_dir):
    match = re.match(rf"^{CHECKPOINT_NAME}-(\d+)$", os.path.basename(path))
    if match:
      found.setdefault(int(match.group(1)), [])
  return [(n, os.path.join(model_dir, f"{CHECKPOINT_NAME}-{n}"), sorted(found[n]))
          for n in sorted(found, reverse=True)]


def unreadable_reason(prefix: str) -> Optional[str]:
  """None if every tensor of the checkpoint at `prefix` reads back (checksums verified); else why."""
  if not tf.io.gfile.exists(prefix + ".index"):
    data = tf.io.gfile.glob(prefix + ".data-*")
    return (f"{os.path.basename(prefix)}.index is missing" +
            (f" (its data file {os.path.basename(data[0])} is there)" if data else
             " and so are its data files"))
  try:
    # The reader of the prefix itself: tf.train.load_checkpoint first asks whether the path
    # is a directory, which on some filesystems (ram://) is true for any prefix of a file.
    reader = tf.compat.v1.train.NewCheckpointReader(prefix)
    for key in reader.get_variable_to_shape_map():
      reader.get_tensor(key)
  except (tf.errors.OpError, IndexError, ValueError, RuntimeError) as e:
    return _one_line(getattr(e, "message", None) or str(e) or type(e).__name__)
  return None


# Characters tf.io.gfile.glob (and so tf.train.latest_checkpoint) reads as a pattern.
GLOB_CHARACTERS = "[]*?"


def check_model_dir_name(model_dir: str) -> None:
  """ConfigError when `model_dir` holds a glob character.

  TensorFlow finds a model_dir's checkpoints by globbing under it, so in a name
  such as `runs/exp[1]` its own healthy checkpoints would not be found (and a
  resume would start over them). Refused before anything is written.
  """
  found = sorted({c for c in model_dir if c in GLOB_CHARACTERS})
  if found:
    raise ConfigError(f"model_dir {model_dir!r} contains {' '.join(found)}: TensorFlow reads "
                      f"those as a file pattern when it looks for checkpoints, so this run "
                      f"could not find its own. Choose a name without {GLOB_CHARACTERS}.")


def find_resume(model_dir: str) -> Resume:
  """The newest readable checkpoint in `model_dir` and the newer ones that are not; read-only.

  Raises:
    DataError: checkpoints exist but none is readable (resuming would start
      from scratch over them); names each one and why.
  """
  check_model_dir_name(model_dir)
  result = Resume()
  checkpoints = list_checkpoints(model_dir)
  for number, prefix, files in checkpoints:
    if files and all(f.endswith("_temp") for f in files):
      result.partial.append(prefix)
      continue
    reason = unreadable_reason(prefix)
    if reason is None:
      result.path, result.step = prefix, number
      return result
    result.unreadable.append((prefix, reason))
  if result.unreadable:
    listed = "; ".join(f"{p}: {r}" for p, r in result.unreadable)
    raise DataError(
        f"{model_dir} holds checkpoints but none is readable ({listed}). Not starting from "
        f"scratch over them: restore the files, or move them away (or use another "
        f"--model-dir) to start a new run.")
  return result


def _state_paths(model_dir: str) -> List[str]:
  try:
    state = tf.train.get_checkpoint_state(model_dir)
  except Exception:  # pylint: disable=broad-except  A damaged state file lists nothing.
    return []
  if state is None:
    return []
  return list(state.all_model_checkpoint_paths) + [state.model_checkpoint_path]


def _one_line(text: str) -> str:
  text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", text)
  return " ".join(text.split()).split(" [Op:")[0]


@dataclasses.dataclass
class WarmStartReport:
  """What a warm start took from the checkpoint, what it initialised here, what it left.

  Attributes:
    path: the checkpoint read.
    restored: (our variable path, stored name) per variable loaded.
    new: (our variable path, why) per variable that keeps the value it was
      initialised with here (absent from the checkpoint, or re-initialised).
    dropped: (stored name, why) per stored weight no variable took.
  """
  path: str
  restored: List[Tuple[str, str]] = dataclasses.field(default_factory=list)
  new: List[Tuple[str, str]] = dataclasses.field(default_factory=list)
  dropped: List[Tuple[str, str]] = dataclasses.field(default_factory=list)

  def lines(self, listed: int = 12) -> List[str]:
    """The log block: counts, then the new and dropped variables (the first `listed` each)."""
    lines = [f"Warm start from {self.path}: {len(self.restored)} variables from the checkpoint, "
             f"{len(self.new)} new (initialised here), {len(self.dropped)} stored weights "
             f"dropped."]
    for title, items in (("new", self.new), ("dropped", self.dropped)):
      for name, why in items[:listed]:
        lines.append(f"  {title}: {name} ({why})")
      if len(items) > listed:
        lines.append(f"  {title}: ... and {len(items) - listed} more")
    return lines

  def to_json(self) -> Dict[str, object]:
    return {"init_checkpoint": self.path,
            "restored": [{"variable": o, "stored": t} for o, t in self.restored],
            "new": [{"variable": o, "why": w} for o, w in self.new],
            "dropped": [{"stored": t, "why": w} for t, w in self.dropped]}


def stored_weights(path: str) -> Dict[str, List[int]]:
  """{variable path: shape} of the weights a checkpoint holds by path (under "weights/")."""
  try:
    return {_unescape(key[len(WEIGHTS_PREFIX):-len(_VALUE_SUFFIX)]): list(shape)
            for key, shape in tf.train.list_variables(path)
            if key.startswith(WEIGHTS_PREFIX) and key.endswith(_VALUE_SUFFIX)}
  except (tf.errors.NotFoundError, tf.errors.DataLossError) as e:
    raise FileNotFoundError(f"trainer.init_checkpoint {path!r} is not a readable "
                            f"checkpoint: {e.message}") from None


def warm_start(model, path: str, mapping: Optional[Dict[str, str]] = None,
               say: Callable[[str], None] = print, reinitialize: Sequence[str] = (),
               strict: bool = False) -> WarmStartReport:
  """Loads `model`'s weights by variable path from the checkpoint (or model_dir) at `path`.

  Args:
    model: a built Keras model.
    path: a checkpoint prefix, or a directory (its newest readable checkpoint).
    mapping: regexes over our variable paths -> their names in the checkpoint
      (e.g. {"^my_model/encoder/": ""}), applied in order.
    say: where the report block goes.
    reinitialize: regexes over our variable paths that may differ in shape
      from the checkpoint (a new output layer); they keep their initial values.
    strict: every variable must be in the checkpoint with its shape (loading a
      model_dir's own weights); a difference raises before anything is assigned.

  Variables absent from the checkpoint keep their initial values; stored
  weights no variable takes are reported as dropped. Optimizer state and the
  step are not loaded.

  Returns:
    The `WarmStartReport` (also given to `say` as a block of lines).

  Raises:
    ConfigError: a variable not listed in `reinitialize` has another shape in
      the checkpoint (names it and both shapes), or nothing matches at all.
  """
  path = resolve(path)
  available = stored_weights(path)
  report = WarmStartReport(path=path)
  targets, taken, mismatched = {}, set(), []
  for variable in model.variables:
    source = variable.path
    for pattern, replacement in (mapping or {}).items():
      source = re.sub(pattern, replacement, source)
    ours = list(variable.shape)
    if source not in available:
      report.new.append((variable.path, f"not in the checkpoint (looked for {source})"
                         if source != variable.path else "not in the checkpoint"))
    elif available[source] != ours:
      taken.add(source)
      if not strict and any(re.search(p, variable.path) for p in reinitialize):
        report.new.append((variable.path, f"re-initialised: shape {ours} here, "
                                          f"{available[source]} in the checkpoint"))
        report.dropped.append((source, f"shape {available[source]}; {variable.path} is {ours} "
                                       f"here"))
      else:
        mismatched.append(f"{variable.path} {ours} (the checkpoint's {source} is "
                          f"{available[source]})")
    else:
      targets[source] = variable
      taken.add(source)
      report.restored.append((variable.path, source))
  if mismatched or (strict and report.new):
    what = mismatched[0] if mismatched else report.new[0][0] + " is " + report.new[0][1]
    raise ConfigError(
        f"{'' if strict else 'trainer.init_checkpoint '}{path}: {what}; {len(mismatched)} "
        f"variables of another "
        f"shape, {len(report.new)} absent" + (
            "." if strict else
            f". Only the task's label-dependent layers and trainer.fine_tune.reinitialize "
            f"are re-initialised on a shape change: build the model with the checkpoint's "
            f"params, or list the variables there.") +
        (f" Also: {'; '.join(mismatched[1:4])}{'; ...' if len(mismatched) > 4 else ''}."
         if len(mismatched) > 1 else ""))
  if not targets:
    raise ConfigError(
        f"trainer.init_checkpoint {path!r} has none of this model's variables "
        f"(e.g. {model.variables[0].path!r}); it holds e.g. "
        f"{sorted(available)[:3]}. Set trainer.init_checkpoint_map to map our names to its names.")
  report.dropped += [(name, "no variable of this model" + (
      " after trainer.init_checkpoint_map" if mapping else "")) for name in sorted(available)
                     if name not in taken]
  tf.train.Checkpoint(weights=tf.train.Checkpoint(**targets)).restore(path).expect_partial()
  for line in report.lines():
    say(line)
  return report


def saved_step(path: str) -> int:
  """The training step stored in the checkpoint at `path` (0 if it has none)."""
  try:
    # The prefix's own reader, not tf.train.load_variable: see `unreadable_reason`.
    return int(tf.compat.v1.train.NewCheckpointReader(path).get_tensor(
        "step/.ATTRIBUTES/VARIABLE_VALUE"))
  except (tf.errors.NotFoundError, ValueError):
    return 0


def _unescape(name: str) -> str:
  # tf.train.Checkpoint escapes "/" as ".S" and "." as "..".
  return re.sub(r"\.(.)", lambda m: "/" if m.group(1) == "S" else m.group(1), name)
