"""Translation sources: Ding de-en dictionary (fixture and real file), TSV, TFRecord, WMT14."""

import os
import random
import time

import pytest
import tensorflow as tf

from tpu_models.config import DataConfig
from tpu_models.errors import DataError
from tpu_models.text import sources as ts

requires_ding = pytest.mark.skipif(
    not os.path.isfile(ts.DEBIAN_DE_EN),
    reason=f"{ts.DEBIAN_DE_EN} is absent: `apt-get install trans-de-en` to run this test.")


def _pipelines(n):
  return [tf.distribute.InputContext(num_input_pipelines=n, input_pipeline_id=i,
                                     num_replicas_in_sync=n) for i in range(n)]


def _pairs(dataset):
  return [(e["inputs"].decode(), e["targets"].decode()) for e in dataset.as_numpy_iterator()]


# ----------------------------------------------------------------------------
# Ding dictionary: parsing a fixture.

FIXTURE = """\
# Version :: devel 2023-01-30
# License :: GPL Version 2 or later
Aal {m} (auf der Speisekarte) [cook.] | Aale {pl} :: eel (on a menu) | eels
Hund {m}; Köter {m} [ugs.] <Hundi> | Hunde {pl} :: dog; cur [coll.] | dogs
Es geht nicht. :: It won't work.
Ich bin es selbst [humor.] | Er kam (höchst)persönlich. :: It's me in the flesh. | He came.
 | leeres Feld {n} :: {adj} | empty field
eins | zwei | drei :: one | two
ohne Trenner
Hund {m}; Köter {m} [ugs.] :: dog; cur
"""


def test_parse_de_en_fixture():
  parse = ts.parse_de_en(FIXTURE.splitlines(keepends=True))
  assert parse.comment_lines == 2
  assert parse.lines == 8
  assert parse.malformed_lines == 1  # "ohne Trenner"
  assert parse.mismatched_lines == 1 and parse.mismatched_pairs == 2  # 3 vs 2 fields.
  assert parse.empty_pairs == 1  # The empty first field and its partner "{adj}" (empty too).
  assert parse.duplicate_pairs == 1  # The repeated Hund/dog line.
  assert parse.pairs == (
      ("Aal", "eel"), ("Aale", "eels"),
      ("Hund; Köter", "dog; cur"), ("Hunde", "dogs"),
      ("Es geht nicht.", "It won't work."),
      ("Ich bin es selbst", "It's me in the flesh."), ("Er kam persönlich.", "He came."),
      ("leeres Feld", "empty field"),
      ("eins", "one"))  # Mismatched line: only the first field pair is trusted.
  assert ts.clean_de_en_text("Bugger off (coll.)!  [Br.]") == "Bugger off!"
  assert ts.clean_de_en_text("x (a (b) c) y") == "x y"


def test_whole_sentence_rule():
  yes = ["It won't work today.", "Say it with flowers!", "What day is it today?",
         "200 people turned out to welcome them.", "\u201cNo\u201d, he said, quite firmly."]
  no = ["It won't work.",  # 3 words
        "the town soon developed into a city.",  # lower case start
        "to be a drag on sb.", "He wants to talk to sb.", "They gave it to sth.",
        "I have a notion that \u2026", "He came in the flesh", ""]
  assert all(ts.is_whole_sentence(s) for s in yes)
  assert not any(ts.is_whole_sentence(s) for s in no)


def _synthetic_dictionary(num_sentences=1800):
  """Ding-format lines: sentences, phrases, and entries sharing a side with a sentence."""
  lines = ["# synthetic Ding file"]
  for i in range(num_sentences):
    lines.append(f"Satz {{m}} | Das ist Satz Nummer {i}. :: sentence | This is sentence "
                 f"number {i}.")
    if i % 3 == 0:  # Same German sentence, another translation: must leave train if held out.
      lines.append(f"Das ist Satz Nummer {i}. :: Here is sentence no. {i}.")
    if i % 3 == 1:  # Same English side without the final stop, case changed.
      lines.append(f"Dies ist der Satz {i}. :: THIS IS SENTENCE NUMBER {i}")
    if i % 3 == 2:  # The English sentence as one ";" alternative of a longer side.
      lines.append(f"Satz {i}; Satz Nr. {i} :: This is sentence number {i}.; Sentence {i}.")
  for i in range(500):
    lines.append(f"Wort{i} {{n}} [ugs.] | Wörter{i} {{pl}} :: word{i} | words{i}")
  return lines


def test_held_out_split_is_deterministic_and_never_leaks(tmp_path):
  lines = _synthetic_dictionary()
  splits = ts.split_de_en(ts.parse_de_en(lines))
  assert len(splits.test) == 1000 and len(splits.validation) == 500
  assert not set(splits.test) & set(splits.validation)
  assert all(ts.is_whole_sentence(en) for _, en in splits.test + splits.validation)

  # Independent of file order.
  shuffled = lines[:]
  random.Random(1).shuffle(shuffled)
  again = ts.split_de_en(ts.parse_de_en(shuffled))
  assert set(again.test) == set(splits.test)
  assert set(again.validation) == set(splits.validation)
  assert set(again.train) == set(splits.train)

  # No held-out pair or side in train, exactly or up to case/final stop/alternatives.
  def keys(side):
    return set(ts._side_keys(side))

  held_de = set().union(*(keys(de) for de, _ in splits.test + splits.validation))
  held_en = set().union(*(keys(en) for _, en in splits.test + splits.validation))
  for de, en in splits.train:
    assert not keys(de) & held_de and not keys(en) & held_en, (de, en)
  exact_de = {de for de, _ in splits.test + splits.validation}
  exact_en = {en for _, en in splits.test + splits.validation}
  assert not any(de in exact_de or en in exact_en for de, en in splits.train)
  # Each held-out sentence took its one sharing entry with it (1,500 of them).
  assert splits.dropped_from_train == 1500
  total = len(splits.parse.pairs)
  assert len(splits.train) + 1500 + splits.dropped_from_train == total
  assert set(splits.train_sentences) == {p for p in splits.train if ts.is_whole_sentence(p[1])}
  assert ("Wort7", "word7") in splits.train and ("Wörter7", "words7") in splits.train
  assert "test 1000" in splits.summary()


def test_de_en_dictionary_source(tmp_path, monkeypatch, environ, capfd):
  path = tmp_path / "de-en"
  path.write_text("\n".join(_synthetic_dictionary()) + "\n", encoding="utf-8")
  # Found through $TPU_MODELS_DATA as well as by an explicit path.
  monkeypatch.setenv("TPU_MODELS_DATA", str(tmp_path))
  assert ts.find_de_en() == str(path)
  splits = ts.de_en_splits(str(path))
  assert ts.de_en_splits(str(tmp_path)) is splits  # Parsed once per process.
  for split in ts.DE_EN_SPLITS:
    config = DataConfig(source="de_en_dictionary", path=str(path), split=split)
    pairs = _pairs(ts.de_en_dictionary_source(config, True, None))
    assert pairs == list(getattr(splits, split))
  assert capfd.readouterr().out.count("validation 500, test 1000") == 1  # Printed once.
  # Two input pipelines: disjoint, together everything.
  config = DataConfig(source="de_en_dictionary", path=str(path), split="test")
  shards = [_pairs(ts.de_en_dictionary_source(config, True, c)) for c in _pipelines(2)]
  assert not set(shards[0]) & set(shards[1])
  assert sorted(shards[0] + shards[1]) == sorted(splits.test)
  with pytest.raises(ValueError, match="Unknown de_en_dictionary split 'dev'"):
    ts.load_de_en("dev", str(path))


def test_de_en_missing_file_says_how_to_install(tmp_path, monkeypatch, environ):
  monkeypatch.setattr(ts, "DEBIAN_DE_EN", str(tmp_path / "nowhere" / "de-en"))
  monkeypatch.setenv("TPU_MODELS_DATA", str(tmp_path))
  with pytest.raises(FileNotFoundError, match="apt-get install trans-de-en") as error:
    ts.find_de_en(str(tmp_path / "missing"))
  assert str(tmp_path / "missing") in str(error.value)
  bad = tmp_path / "bad"
  bad.write_bytes(b"\xff\xfe not utf-8 :: x\n")
  with pytest.raises(ValueError, match="not UTF-8"):
    ts.de_en_splits(str(bad))


@requires_ding
def test_real_ding_dictionary():
  ts._load_de_en_splits.cache_clear()
  start = time.process_time()  # CPU time: robust to a busy machine (the wall time is not).
  splits = ts.de_en_splits(ts.DEBIAN_DE_EN)
  seconds = time.process_time() - start
  assert seconds < 15, f"parsing took {seconds:.1f}s of CPU"  # ~3.5 s here.
  parse = splits.parse
  assert 385_000 < parse.raw_pairs < 400_000 and parse.mismatched_lines == 0
  assert 19_000 < splits.sentences < 20_000
  assert len(splits.test) == 1000 and len(splits.validation) == 500
  assert len(splits.train) > 385_000 and len(splits.train_sentences) > 17_000
  held_de = {de for de, _ in splits.test + splits.validation}
  held_en = {en for _, en in splits.test + splits.validation}
  leaks = [p for p in splits.train if p[0] in held_de or p[1] in held_en]
  assert not leaks
  # A few parsed entries (variables, not the 390k-pair set, in assertion messages).
  expected = [("Aalsuppe", "eel soup"),  # "Aalsuppe {f} [cook.] | Aalsuppen {pl} :: ..."
              ("Aalsuppen", "eel soups"),
              ("Aal", "Eel"),  # "Aal {m} (auf der Speisekarte) [cook.] | ... :: Eel (on a menu)"
              ("das A und O", "the nuts and bolts"),
              ("Es geht nicht.", "It won't work.")]
  everywhere = set(splits.train + splits.test + splits.validation)
  missing = [p for p in expected if p not in everywhere]
  assert not missing
  assert all(ts.is_whole_sentence(en) for _, en in splits.test)
  annotated = [p for p in splits.test if any(c in p[0] + p[1] for c in "{}[]<>()")]
  assert not annotated


# ----------------------------------------------------------------------------
# TSV and TFRecord files.


def _write_tsv_files(directory, num_files=4, per_file=5):
  pairs = []
  for f in range(num_files):
    lines = []
    for i in range(per_file):
      pair = (f"Quelle {f}-{i} äöü", f"target {f}-{i}")
      pairs.append(pair)
      lines.append("\t".join(pair))
    ending = "\r\n" if f == 0 else "\n"  # Windows line ends are fine too.
    (directory / f"part-{f}.tsv").write_text(ending.join(lines) + ending + "\n",
                                             encoding="utf-8")
  return pairs


def test_tsv_source_and_sharding(tmp_path):
  pairs = _write_tsv_files(tmp_path)
  config = DataConfig(source="tsv", path=str(tmp_path / "*.tsv"))
  once = _pairs(ts.tsv_source(config, False, None))
  assert sorted(once) == sorted(pairs)
  assert _pairs(ts.tsv_source(config, False, None)) == once  # Deterministic when not training.
  assert sorted(_pairs(ts.tsv_source(config, True, None))) == sorted(pairs)
  shards = [_pairs(ts.tsv_source(config, False, c)) for c in _pipelines(2)]
  assert not set(shards[0]) & set(shards[1]) and len(shards[0]) == len(shards[1]) == 10
  assert sorted(shards[0] + shards[1]) == sorted(pairs)
  # Each pipeline reads whole files.
  assert {p[1].split()[1].split("-")[0] for p in shards[0]} == {"0", "2"}


def test_tsv_errors(tmp_path):
  (tmp_path / "bad.tsv").write_text("a\tb\nno tab here\n", encoding="utf-8")
  config = DataConfig(source="tsv", path=str(tmp_path / "bad.tsv"))
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"bad.tsv:2 has 1 tab-separated"):
    _pairs(ts.tsv_source(config, False, None))
  with pytest.raises(FileNotFoundError, match="source<TAB>target"):
    ts.tsv_source(DataConfig(source="tsv", path=str(tmp_path / "none*.tsv")), False, None)
  with pytest.raises(ValueError, match="needs a path"):
    ts.tsv_source(DataConfig(source="tsv"), False, None)
  with pytest.raises(ValueError, match="2 input pipelines"):
    ts.tsv_source(config, False, _pipelines(2)[0])


def test_text_tfrecord_source_and_sharding(tmp_path):
  pairs = [(f"Satz {i} mit Ümlaut", f"sentence {i}") for i in range(10)]
  paths = ts.write_text_tfrecords(pairs, str(tmp_path / "records" / "train"), num_shards=2)
  assert [os.path.basename(p) for p in paths] == ["train-00000-of-00002", "train-00001-of-00002"]
  config = DataConfig(source="text_tfrecord", path=str(tmp_path / "records" / "train-*"))
  assert sorted(_pairs(ts.text_tfrecord_source(config, True, None))) == sorted(pairs)
  shards = [_pairs(ts.text_tfrecord_source(config, False, c)) for c in _pipelines(2)]
  assert shards[0] == pairs[0::2] and shards[1] == pairs[1::2]  # Round-robin shards.
  # A record without the "targets" feature is an error naming it.
  with tf.io.TFRecordWriter(str(tmp_path / "broken")) as writer:
    example = ts.text_example("nur", "x")
    del example.features.feature["targets"]
    writer.write(example.SerializeToString())
  broken = DataConfig(source="text_tfrecord", path=str(tmp_path / "broken"))
  with pytest.raises(tf.errors.InvalidArgumentError, match="targets"):
    _pairs(ts.text_tfrecord_source(broken, False, None))


def test_text_tfrecord_damaged_file_counted_with_on_corrupt_skip(tmp_path):
  """The shared TFRecord reader: a truncated file stops the run, or is counted and cut short."""
  from tpu_models.data import pipeline
  pairs = [(f"Satz {i}", f"sentence {i}") for i in range(6)]
  (path,) = ts.write_text_tfrecords(pairs, str(tmp_path / "train"), num_shards=1)
  os.truncate(path, os.path.getsize(path) - 10)  # Cuts the last record.
  config = DataConfig(source="text_tfrecord", path=path)
  with pytest.raises(DataError, match="cut short"):  # Told by the shard set's marker.
    ts.text_tfrecord_source(config, False, None)
  os.remove(str(tmp_path / "train.shards.json"))
  with pytest.raises(tf.errors.DataLossError):
    _pairs(ts.text_tfrecord_source(config, False, None))
  skip = DataConfig(source="text_tfrecord", path=path, on_corrupt="skip")
  with pipeline.collect_skips() as report:
    dataset = ts.text_tfrecord_source(skip, False, None)
  assert _pairs(dataset) == pairs[:5]
  assert report.counts() == {"skipped_records": 0, "damaged_files": 1}


def test_sources_are_registered():
  from tpu_models.registry import DATASETS
  for name in ("de_en_dictionary", "tsv", "text_tfrecord", "wmt14_de_en"):
    assert name in DATASETS


def test_wmt14_missing_says_how_to_prepare(tmp_path):
  config = DataConfig(source="wmt14_de_en", path=str(tmp_path / "tfds"), split="train")
  with pytest.raises(FileNotFoundError, match="tfds build wmt14_translate/de-en"):
    ts.wmt14_de_en_source(config, True, None)
