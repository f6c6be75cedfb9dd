"""MODEL_BASE without a server: which directories are versions, what refuses one (one line
naming it), serving.yaml, and `publish`: writers running at once each get their own N."""

import json
import multiprocessing
import os

import pytest

from tpu_models.serving import repository


def _fake_export(path: str, marker: str = "") -> None:
  """A LiteRT-shaped export directory (not loadable; enough for the checks here)."""
  os.makedirs(path)
  with open(os.path.join(path, "model.tflite"), "w") as f:
    f.write(f"model {marker}")
  with open(os.path.join(path, "export.json"), "w") as f:
    json.dump({"format": "litert", "file": "model.tflite", "marker": marker}, f)


def test_numbered_directories_are_versions_and_an_export_alone_is_version_1(tmp_path):
  base = tmp_path / "base"
  for name in ("1", "12", ".incoming-1-ab", "latest", "3.partial"):
    (base / name).mkdir(parents=True)
  (base / "7").write_text("a file, not a directory")
  assert repository.version_paths(str(base)) == {1: str(base / "1"), 12: str(base / "12")}
  _fake_export(str(tmp_path / "one"))
  assert repository.version_paths(str(tmp_path / "one")) == {1: str(tmp_path / "one")}
  with pytest.raises(FileNotFoundError, match="is not a directory"):
    repository.version_paths(str(tmp_path / "missing"))


def test_damaged_or_incomplete_versions_are_refused_naming_the_file(tmp_path):
  path = str(tmp_path / "v")
  with pytest.raises(repository.DamagedVersion, match="has no export.json"):
    os.makedirs(path)
    repository.check_version(path)
  os.rmdir(path)
  _fake_export(path)
  repository.record_checksums(path)
  assert repository.check_version(path)["sha256"]["model.tflite"]
  with open(os.path.join(path, "model.tflite"), "a") as f:
    f.write("!")
  with pytest.raises(repository.DamagedVersion,
                     match=r"model.tflite is damaged: its sha256 is not the one export.json"):
    repository.check_version(path)
  open(os.path.join(path, "model.tflite"), "w").close()
  with pytest.raises(repository.DamagedVersion, match=r"model.tflite is empty \(0 bytes\)"):
    repository.check_version(path)
  os.remove(os.path.join(path, "model.tflite"))
  with pytest.raises(repository.DamagedVersion, match=r"model.tflite is missing"):
    repository.check_version(path)
  with open(os.path.join(path, "export.json"), "w") as f:
    f.write("{\"format\": ")
  with pytest.raises(repository.DamagedVersion, match="is not readable JSON"):
    repository.check_version(path)
  with open(os.path.join(path, "export.json"), "w") as f:
    json.dump({"format": "litert", "sha256": {"../../etc/passwd": "0"}}, f)
  with open(os.path.join(path, "model.tflite"), "w") as f:
    f.write("x")
  with pytest.raises(repository.DamagedVersion, match="outside the export"):
    repository.check_version(path)


@pytest.mark.parametrize("text, words", [
    ("default: 3\nlabels: {stable: 2, canary: 3}\n", None),
    ("default: stable\nlabels: {stable: 2}\n", None),
    ("labels: {stable: two}\n", "must name a version number"),
    ("default: nightly\n", "default must be latest, a version number or one of the labels"),
    ("pin: 3\n", "expected {default"),
    ("labels: [1, 2]\n", "labels must be a mapping"),
    ("default: [\n", "is not readable YAML"),
])
def test_serving_yaml(tmp_path, text, words):
  (tmp_path / "serving.yaml").write_text(text)
  if words is None:
    config = repository.read_config(str(tmp_path))
    assert config.labels["stable"] == 2 and 2 in config.wanted()
    return
  with pytest.raises(ValueError, match=words):
    repository.read_config(str(tmp_path))


def test_no_serving_yaml_serves_the_latest(tmp_path):
  assert repository.read_config(str(tmp_path)) == repository.ServingConfig("latest", {})


def _publish(base: str, marker: str, start) -> int:
  start.wait()
  version, _ = repository.publish(base, lambda path: _fake_export(path, marker))
  return version


def test_writers_at_once_each_get_their_own_version_number(tmp_path):
  base = str(tmp_path / "base")
  _fake_export(os.path.join(base, "1"), "first")
  writers = 6
  context = multiprocessing.get_context("spawn")  # Fresh processes: no TensorFlow forked.
  with context.Manager() as manager:
    start = manager.Barrier(writers)
    with context.Pool(writers) as pool:
      versions = pool.starmap(_publish, [(base, f"w{i}", start) for i in range(writers)])
  assert sorted(versions) == list(range(2, 2 + writers))
  for i, version in enumerate(versions):  # Each number holds its own writer's export, whole.
    record = repository.check_version(os.path.join(base, str(version)))
    assert record["marker"] == f"w{i}"
  assert sorted(os.listdir(base)) == sorted(str(v) for v in range(1, 2 + writers))


def test_a_failed_write_leaves_no_version(tmp_path):
  base = str(tmp_path / "base")

  def fail(path):
    _fake_export(path)
    raise RuntimeError("disk gone")

  with pytest.raises(RuntimeError, match="disk gone"):
    repository.publish(base, fail)
  assert os.listdir(base) == []
