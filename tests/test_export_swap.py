"""export/staging.py's _put_in_place: the new export replaces the old without a moment with neither."""

import os

import pytest
import tensorflow as tf

from tpu_models.export import staging as staging_lib


def _make(path, text):
  tf.io.gfile.makedirs(path)
  with tf.io.gfile.GFile(f"{path}/saved_model.pb", "w") as f:
    f.write(text)


def _read(path):
  with tf.io.gfile.GFile(f"{path}/saved_model.pb") as f:
    return f.read()


@pytest.mark.parametrize("exchange", [True, False])
def test_local_swap_by_exchange_or_by_renaming_aside(tmp_path, monkeypatch, exchange):
  if not exchange:
    monkeypatch.setattr(staging_lib, "_exchange", lambda a, b: False)
  output, staging = str(tmp_path / "out"), str(tmp_path / "out.partial-1")
  _make(output, "old")
  _make(staging, "new")
  staging_lib._put_in_place(staging, output)
  assert _read(output) == "new"
  if exchange:  # The old export is where the new one was; the caller removes it.
    assert _read(staging) == "old"
  else:
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_exchange_is_refused_for_non_local_paths():
  assert staging_lib._exchange("ram://a", "ram://b") is False


def test_an_output_at_a_filesystem_root_has_that_root_as_its_parent():
  # os.path.dirname("ram://exp") is "ram:", which export once created as a local directory.
  assert staging_lib._parent("ram://exp") == "ram://"
  assert staging_lib._beside("ram://exp", staging_lib._PARTIAL) == f"ram://.exp.partial-{os.getpid()}"
  assert staging_lib._parent("gs://bucket/runs/exp") == "gs://bucket/runs"
  assert staging_lib._parent("exp") == "." and staging_lib._parent("/tmp/exp") == "/tmp"


def test_a_failed_rename_in_puts_the_old_export_back(tmp_path, monkeypatch):
  monkeypatch.setattr(staging_lib, "_exchange", lambda a, b: False)
  output, staging = str(tmp_path / "out"), str(tmp_path / "out.partial-1")
  _make(output, "old")
  _make(staging, "new")
  rename = tf.io.gfile.rename

  def fail_moving_the_new_one_in(source, target, overwrite=False):
    if source == staging:
      raise OSError("injected")
    return rename(source, target, overwrite)

  monkeypatch.setattr(tf.io.gfile, "rename", fail_moving_the_new_one_in)
  with pytest.raises(OSError, match="injected"):
    staging_lib._put_in_place(staging, output)
  assert _read(output) == "old" and _read(staging) == "new"


def test_leftovers_of_dead_exports_are_removed_or_restored_and_live_ones_kept(tmp_path):
  import subprocess
  dead = subprocess.Popen(["true"])
  dead.wait()
  output = str(tmp_path / "out")
  _make(f"{output}.old-{dead.pid}", "old")  # Killed between renaming aside and in.
  _make(f"{output}.partial-{dead.pid}", "half")
  _make(f"{output}.partial-{os.getpid()}", "being written")  # A live export's.
  _make(str(tmp_path / "other.partial-1"), "another output's")
  said = []
  staging_lib._remove_abandoned(output, said.append)
  assert _read(output) == "old"
  assert sorted(os.listdir(tmp_path)) == ["other.partial-1", "out", f"out.partial-{os.getpid()}"]
  assert said[0].startswith(f"Restored {output} from {output}.old-{dead.pid}")
  assert said[1].startswith(f"Removed {output}.partial-{dead.pid}, left by an export "
                            f"(pid {dead.pid} on ")


def _make_with_variables(path, text):
  _make(path, text)
  tf.io.gfile.makedirs(f"{path}/variables")
  with tf.io.gfile.GFile(f"{path}/variables/variables.index", "w") as f:
    f.write(text)


def test_on_ram_the_swap_moves_file_by_file_with_saved_model_pb_last(monkeypatch):
  """ram:// (like gs://) cannot rename a directory: each file is renamed, and a failure
  moving the new export in puts the old one back whole."""
  import uuid
  root = f"ram://{uuid.uuid4().hex}"
  output = f"{root}/out"
  staging = staging_lib._beside(output, staging_lib._PARTIAL)
  assert staging == f"{root}/.out.partial-{os.getpid()}"  # Not a name that extends OUTPUT's.
  _make_with_variables(output, "old")
  _make_with_variables(staging, "new")
  moved = []
  rename = tf.io.gfile.rename

  def record(source, target, overwrite=False):
    moved.append(source)
    return rename(source, target, overwrite)

  monkeypatch.setattr(tf.io.gfile, "rename", record)
  staging_lib._put_in_place(staging, output)
  assert _read(output) == "new" and tf.io.gfile.listdir(root) == ["out"]
  with tf.io.gfile.GFile(f"{output}/variables/variables.index") as f:
    assert f.read() == "new"
  # The old export's saved_model.pb left first; the new one's arrived last.
  assert moved[0] == f"{output}/saved_model.pb" and moved[-1] == f"{staging}/saved_model.pb"

  _make_with_variables(staging, "newer")

  def fail_at_the_new_saved_model(source, target, overwrite=False):
    if source == f"{staging}/saved_model.pb":
      raise OSError("injected")
    return rename(source, target, overwrite)

  monkeypatch.setattr(tf.io.gfile, "rename", fail_at_the_new_saved_model)
  with pytest.raises(OSError, match="injected"):
    staging_lib._put_in_place(staging, output)
  assert _read(output) == "new"
  with tf.io.gfile.GFile(f"{output}/variables/variables.index") as f:
    assert f.read() == "new"
