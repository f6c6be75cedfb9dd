"""ShardedRecordWriter: shards appear complete with their marker, or not at all."""

import json
import os

import pytest
import tensorflow as tf

from tpu_models.data import records


def _read(paths):
  return [r.numpy() for p in paths for r in tf.data.TFRecordDataset(p)]


def test_shards_are_renamed_in_when_complete_and_the_marker_lists_them(tmp_path):
  prefix = str(tmp_path / "d" / "train")
  with records.ShardedRecordWriter(prefix, 3) as writer:
    for i in range(7):
      writer.write(b"r%d" % i)
      assert not any(os.path.exists(p) for p in writer.paths)  # Only .partial until the end.
    assert all(os.path.exists(p) for p in writer.partial_paths)
  assert sorted(os.listdir(tmp_path / "d")) == [
      "train-00000-of-00003", "train-00001-of-00003", "train-00002-of-00003",
      "train.shards.json"]
  marker = records.read_marker(prefix)
  assert marker == json.loads((tmp_path / "d" / "train.shards.json").read_text())
  assert marker["num_shards"] == 3 and marker["records"] == 7
  assert [(s["name"], s["records"], s["bytes"]) for s in marker["shards"]] == [
      (os.path.basename(p), n, os.path.getsize(p)) for p, n in zip(writer.paths, [3, 2, 2])]
  assert sorted(_read(writer.paths)) == sorted(b"r%d" % i for i in range(7))


def test_an_error_while_writing_keeps_the_earlier_set_and_leaves_nothing_partial(tmp_path):
  prefix = str(tmp_path / "train")
  with records.ShardedRecordWriter(prefix, 2) as writer:
    writer.write(b"old")
  before = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)}
  with pytest.raises(RuntimeError, match="boom"):
    with records.ShardedRecordWriter(prefix, 4) as writer:
      writer.write(b"new")
      raise RuntimeError("boom")
  assert {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)} == before


def test_another_shard_count_is_removed_with_a_notice_and_other_prefixes_kept(tmp_path):
  said = []
  for prefix in ("train", "train_extra", "validation"):
    with records.ShardedRecordWriter(str(tmp_path / prefix), 3) as writer:
      writer.write(b"x")
  (tmp_path / "train-00000-of-00002.partial").write_bytes(b"killed")  # A killed run's.
  with records.ShardedRecordWriter(str(tmp_path / "train"), 2, say=said.append) as writer:
    writer.write(b"y")
  names = sorted(os.listdir(tmp_path))
  assert [n for n in names if n.startswith("train-")] == [
      "train-00000-of-00002", "train-00001-of-00002"]
  assert len([n for n in names if n.startswith("train_extra-")]) == 3
  assert len([n for n in names if n.startswith("validation-")]) == 3
  (notice,) = said
  assert notice.startswith(f"Removed 3 shard(s) of an earlier conversion with another shard "
                           f"count ({tmp_path / 'train'}-*-of-00003)")


def test_works_through_gfile_filesystems():
  prefix = "ram://records_test/train"
  with records.ShardedRecordWriter(prefix, 2) as writer:
    for i in range(3):
      writer.write(b"%d" % i)
  assert sorted(tf.io.gfile.glob(prefix + "*")) == [
      prefix + "-00000-of-00002", prefix + "-00001-of-00002", prefix + ".shards.json"]
  assert records.read_marker(prefix)["records"] == 3
