"""Text inputs: SentencePiece vocabulary, in-graph tokenizer, length filter, padding, packing."""

import itertools
import os

import numpy as np
import pytest
import tensorflow as tf

from tpu_models.text import inputs as text

SUBJECTS = [("Der Hund", "The dog"), ("Die Katze", "The cat"), ("Mein Bruder", "My brother"),
            ("Unsere Lehrerin", "Our teacher"), ("Das Kind", "The child"),
            ("Der alte Mann", "The old man")]
VERBS = [("sieht", "sees"), ("mag", "likes"), ("findet", "finds"), ("sucht", "looks for"),
         ("malt", "paints")]
OBJECTS = [("den Ball", "the ball"), ("das Haus", "the house"), ("einen Vogel", "a bird"),
           ("die Blume", "the flower"), ("den Garten", "the garden"),
           ("das rote Auto", "the red car"), ("einen grünen Apfel", "a green apple")]
ENDINGS = [(".", "."), ("!", "!"), (" heute.", " today."), (" jeden Tag.", " every day."),
           (" im Winter?", " in winter?")]


def _sentence_pairs():
  """A few hundred small German/English sentence pairs."""
  pairs = []
  for (sd, se), (vd, ve), (od, oe), (ed, ee) in itertools.product(SUBJECTS, VERBS, OBJECTS,
                                                                  ENDINGS):
    pairs.append((f"{sd} {vd} {od}{ed}", f"{se} {ve} {oe}{ee}"))
  return pairs[::3]  # 350 pairs.


@pytest.fixture(scope="module")
def vocab_path(tmp_path_factory):
  pairs = _sentence_pairs()
  sentences = [s for pair in pairs for s in pair]
  prefix = str(tmp_path_factory.mktemp("spm") / "tiny")
  return text.train_sentencepiece(sentences, prefix, vocab_size=96, character_coverage=1.0)


@pytest.fixture(scope="module")
def vocab(vocab_path):
  return text.SentencePieceVocab(vocab_path)


# ----------------------------------------------------------------------------
# Vocabulary and tokenizer.


def test_vocab_special_ids_and_round_trip(vocab_path, vocab):
  assert os.path.isfile(vocab_path) and os.path.isfile(vocab_path[:-len(".model")] + ".vocab")
  assert vocab.vocab_size == 96
  pieces = vocab.id_to_piece(tf.constant([0, 1, 2])).numpy().tolist()
  assert pieces == [b"<pad>", b"</s>", b"<unk>"]
  assert (text.PAD_ID, text.EOS_ID, text.UNK_ID) == (0, 1, 2)
  for de, en in _sentence_pairs()[:20]:
    for sentence in (de, en):
      ids = vocab.encode(sentence).numpy()
      assert ids.dtype == np.int32 and ids[-1] == text.EOS_ID
      assert text.EOS_ID not in ids[:-1] and text.PAD_ID not in ids
      assert vocab.decode(ids).numpy().decode() == sentence
  # Characters never seen in training map to UNK (there is no BOS: id 1 is EOS).
  ids = vocab.encode("Der Hund sieht ξ").numpy()
  assert text.UNK_ID in ids and ids[-1] == text.EOS_ID
  # A batch gives ragged ids.
  batch = vocab.encode(["Die Katze mag den Ball.", "Das Kind malt."])
  assert isinstance(batch, tf.RaggedTensor) and batch.shape[0] == 2


def test_decode_stops_at_eos_and_tolerates_garbage(vocab):
  sentences = ["The cat likes the ball.", "Our teacher paints a bird!"]
  ids = [vocab.encode(s).numpy().tolist() for s in sentences]
  width = max(map(len, ids)) + 4
  # What a fixed-length decoder returns: ids, EOS, then anything (pad or junk).
  rows = [ids[0] + [0] * (width - len(ids[0])),
          ids[1] + [7, 9999, -3][:width - len(ids[1])] + [0] * max(0, width - len(ids[1]) - 3)]
  decoded = vocab.decode(tf.constant(rows)).numpy()
  assert [d.decode() for d in decoded] == sentences
  # No EOS at all: the whole row is read; ids outside the vocabulary read as UNK.
  no_eos = vocab.decode(tf.constant([ids[0][:-1] + [5000]])).numpy()[0].decode()
  assert no_eos.startswith("The cat likes the ball.") and len(no_eos) > len(sentences[0])
  assert vocab.decode(tf.constant([text.EOS_ID, 5, 6])).numpy() == b""
  ragged = tf.ragged.constant(ids)
  assert [d.decode() for d in vocab.decode(ragged).numpy()] == sentences


def test_tokenizer_inside_tf_data_and_tf_function(vocab):
  pairs = _sentence_pairs()[:16]
  dataset = tf.data.Dataset.from_tensor_slices(
      {"inputs": [p[0] for p in pairs], "targets": [p[1] for p in pairs], "id": range(16)})
  tokenized = list(text.tokenize_dataset(dataset, vocab).as_numpy_iterator())
  assert [int(e["id"]) for e in tokenized] == list(range(16))  # Other features pass through.
  for example, (de, en) in zip(tokenized, pairs):
    np.testing.assert_array_equal(example["inputs"], vocab.encode(de).numpy())
    np.testing.assert_array_equal(example["targets"], vocab.encode(en).numpy())

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
  def round_trip(sentences):
    ids = vocab.encode(sentences).to_tensor(default_value=text.PAD_ID)
    return vocab.decode(ids)

  out = round_trip(tf.constant([p[1] for p in pairs])).numpy()
  assert [o.decode() for o in out] == [p[1] for p in pairs]


def test_tokenizer_lives_in_a_saved_model(vocab, tmp_path):
  module = tf.Module()
  module.vocab = vocab
  module.round_trip = tf.function(
      lambda s: vocab.decode(vocab.encode(s).to_tensor()),
      input_signature=[tf.TensorSpec([None], tf.string)])
  tf.saved_model.save(module, str(tmp_path / "saved"))
  loaded = tf.saved_model.load(str(tmp_path / "saved"))
  sentences = ["Der Hund sucht das Haus.", "The old man finds a green apple today."]
  assert [o.decode() for o in loaded.round_trip(tf.constant(sentences)).numpy()] == sentences


def test_vocab_errors(tmp_path):
  import sentencepiece as spm
  with pytest.raises(FileNotFoundError, match="tpu-models vocab"):
    text.SentencePieceVocab(str(tmp_path / "missing.model"))
  with pytest.raises(ValueError, match="not a SentencePiece model"):
    text.SentencePieceVocab(b"definitely not a model proto")
  # SentencePiece's default ids (unk 0, bos 1, eos 2) are not ours.
  sentences = [s for pair in _sentence_pairs() for s in pair]
  spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences),
                                 model_prefix=str(tmp_path / "default"), vocab_size=60,
                                 minloglevel=2)
  with pytest.raises(ValueError, match="pad 0, EOS 1, UNK 2"):
    text.SentencePieceVocab(str(tmp_path / "default.model"))
  with pytest.raises(ValueError, match="smaller --vocab-size"):
    text.train_sentencepiece(sentences[:20], str(tmp_path / "big"), vocab_size=5000)
  with pytest.raises(ValueError, match="No sentences"):
    text.train_sentencepiece(["", " "], str(tmp_path / "empty"), vocab_size=50)


def test_train_vocab_from_dataset(tmp_path):
  pairs = _sentence_pairs()
  dataset = tf.data.Dataset.from_tensor_slices(
      {"inputs": [p[0] for p in pairs], "targets": [p[1] for p in pairs]})
  path = text.train_vocab_from_dataset(dataset, str(tmp_path / "v" / "pairs"), 90)
  vocab = text.SentencePieceVocab(path)
  assert vocab.vocab_size == 90
  for sentence in ("Der Hund malt den Garten.", "The dog paints the garden."):
    ids = vocab.encode(sentence).numpy()
    assert text.UNK_ID not in ids  # Both languages were in the training text.
  english_only = text.train_vocab_from_dataset(dataset, str(tmp_path / "en"), 50,
                                               keys=("targets",))
  assert text.UNK_ID in text.SentencePieceVocab(english_only).encode("Grüße").numpy()
  with pytest.raises(ValueError, match="no feature"):
    text.train_vocab_from_dataset(dataset, str(tmp_path / "x"), 60, keys=("source",))


def test_vocab_command_on_a_tsv_file(tmp_path, capsys):
  from tpu_models import cli
  lines = ["\t".join(pair) for pair in _sentence_pairs()]
  (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
  prefix = str(tmp_path / "vocab" / "mine")
  code = cli.main(["vocab", "tsv", "--path", str(tmp_path / "train.tsv"), "--vocab-size", "80",
                   "--output", prefix])
  assert code == 0
  assert f"Wrote {prefix}.model" in capsys.readouterr().out
  vocab = text.SentencePieceVocab(prefix + ".model")
  assert vocab.vocab_size == 80
  assert vocab.decode(vocab.encode("Die Katze malt den Garten.")).numpy() == (
      b"Die Katze malt den Garten.")
  # Held-out splits are refused, with a clear message and exit code 2.
  code = cli.main(["vocab", "de_en_dictionary", "--split", "test", "--vocab-size", "80",
                   "--output", str(tmp_path / "never")])
  assert code == 2 and "held-out split 'test'" in capsys.readouterr().err
  assert not os.path.exists(str(tmp_path / "never.model"))


def test_vocab_command_character_coverage(tmp_path, capsys):
  """--character-coverage is SentencePiece's: 1.0 keeps a character seen once, less drops it."""
  from tpu_models import cli
  lines = ["\t".join(pair) for pair in _sentence_pairs()] + ["Ein Qu\u00e4ker.\tA Quaker."]
  (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
  unknown = {}
  for coverage in ("1.0", "0.995"):
    prefix = str(tmp_path / f"coverage_{coverage}")
    assert cli.main(["vocab", "tsv", "--path", str(tmp_path / "train.tsv"), "--vocab-size", "80",
                     "--output", prefix, "--character-coverage", coverage]) == 0
    assert f"character coverage {float(coverage):g}" in capsys.readouterr().out
    ids = text.SentencePieceVocab(prefix + ".model").encode("\u00e4").numpy().tolist()
    unknown[coverage] = text.UNK_ID in ids
  assert unknown == {"1.0": False, "0.995": True}, unknown
  assert cli.main(["vocab", "tsv", "--path", str(tmp_path / "train.tsv"), "--output",
                   str(tmp_path / "never"), "--character-coverage", "1.5"]) == 2
  assert "--character-coverage 1.5: expected a share in (0, 1]" in capsys.readouterr().err


# ----------------------------------------------------------------------------
# Length filter and padding.


def _token_dataset(lengths, start=3):
  """Examples {"inputs": [n_i], "targets": [m_i]}; tokens are unique per example, EOS last."""
  examples = []
  for i, (n, m) in enumerate(lengths):
    base = start + 100 * i
    examples.append({"inputs": np.r_[np.arange(base, base + n - 1), 1].astype(np.int32),
                     "targets": np.r_[np.arange(base + 50, base + 50 + m - 1), 1].astype(
                         np.int32)})
  spec = {k: tf.TensorSpec([None], tf.int32) for k in ("inputs", "targets")}
  dataset = tf.data.Dataset.from_generator(lambda: iter(examples), output_signature=spec)
  return dataset, examples


def _mixed_lengths(count, seed=0, max_inputs=12, max_targets=16):
  rng = np.random.default_rng(seed)
  # Mostly short, some long: like dictionary phrases next to sentences.
  short = rng.random(count) < 0.7
  inputs = np.where(short, rng.integers(1, 5, count), rng.integers(5, max_inputs + 1, count))
  targets = np.where(short, rng.integers(1, 5, count), rng.integers(5, max_targets + 1, count))
  return list(zip(inputs.tolist(), targets.tolist()))


def test_filter_by_length_counts_what_it_drops(capfd):
  lengths = _mixed_lengths(2500, max_inputs=14, max_targets=20)
  dataset, examples = _token_dataset(lengths)
  capfd.readouterr()
  kept = list(text.filter_by_length(dataset, {"inputs": 10, "targets": 12}).as_numpy_iterator())
  expected = [e for e in examples if len(e["inputs"]) <= 10 and len(e["targets"]) <= 12]
  dropped = len(examples) - len(expected)
  assert 0 < dropped < len(examples)
  assert len(kept) == len(expected)
  for got, want in zip(kept, expected):
    np.testing.assert_array_equal(got["inputs"], want["inputs"])
    np.testing.assert_array_equal(got["targets"], want["targets"])
  log = capfd.readouterr().err
  first_1000 = sum(1 for n, m in lengths[:1000] if n > 10 or m > 12)
  pct = 100 * dropped / 2500
  assert (f"filter_by_length(inputs<=10, targets<=12): dropped {first_1000} of 1000 examples "
          f"({100 * first_1000 / 1000:.2f}%) so far") in log
  assert f"dropped {dropped} of 2500 examples ({pct:.2f}%) in total" in log
  # An endless stream reports at the milestones only and never stops.
  endless = text.filter_by_length(dataset.repeat(), {"inputs": 10, "targets": 12})
  assert len(list(endless.take(1200).as_numpy_iterator())) == 1200
  assert "so far" in capfd.readouterr().err
  with pytest.raises(ValueError, match="no feature"):
    text.filter_by_length(dataset, {"source": 4})


def test_pad_to_length(capfd):
  dataset, examples = _token_dataset([(3, 5), (8, 2), (1, 9)])
  padded = list(text.pad_to_length(dataset, {"inputs": 8, "targets": 10}).as_numpy_iterator())
  for got, want in zip(padded, examples):
    assert got["inputs"].shape == (8,) and got["targets"].shape == (10,)
    n = len(want["inputs"])
    np.testing.assert_array_equal(got["inputs"][:n], want["inputs"])
    assert not got["inputs"][n:].any()
  spec = text.pad_to_length(dataset, {"inputs": 8, "targets": 10}).element_spec
  assert spec["inputs"].shape == [8] and spec["targets"].shape == [10]
  # Too long without truncate: an error naming the feature.
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="feature targets has a sequence longer than 6"):
    list(text.pad_to_length(dataset, {"inputs": 8, "targets": 6}).as_numpy_iterator())
  # With truncate: cut, EOS kept last, and counted.
  capfd.readouterr()
  cut = list(text.pad_to_length(dataset, {"inputs": 8, "targets": 6}, truncate=True)
             .as_numpy_iterator())
  np.testing.assert_array_equal(cut[2]["targets"], np.r_[examples[2]["targets"][:5], 1])
  np.testing.assert_array_equal(cut[0]["targets"], np.r_[examples[0]["targets"], 0])
  assert "truncated 1 of 3 examples (33.33%) in total" in capfd.readouterr().err


# ----------------------------------------------------------------------------
# Packing.


def _unpack(rows, keys=("inputs", "targets")):
  """Packed rows -> examples, checking segment ids and positions on the way."""
  examples = []
  for row in rows:
    segments = {k: row[k + "_segment_ids"] for k in keys}
    count = max(int(s.max()) for s in segments.values())
    for key in keys:
      seg, pos, tokens = segments[key], row[key + "_positions"], row[key]
      # Padding: segment 0, token 0, position 0, and only at the end.
      np.testing.assert_array_equal(tokens[seg == 0], 0)
      np.testing.assert_array_equal(pos[seg == 0], 0)
      used = int(np.count_nonzero(seg))
      assert (seg[:used] > 0).all()
      # Segments are 1, 2, ... in order, each contiguous, positions 0-based within each.
      assert (np.diff(seg[:used]) >= 0).all()
      for s in np.unique(seg[:used]):
        np.testing.assert_array_equal(pos[seg == s], np.arange(np.count_nonzero(seg == s)))
    for s in range(1, count + 1):
      examples.append({k: row[k][segments[k] == s] for k in keys})
  return examples


def _key(example):
  return tuple(tuple(example[k].tolist()) for k in sorted(example))


def test_pack_dataset_loses_nothing_and_marks_segments():
  lengths = _mixed_lengths(600, seed=1)
  dataset, examples = _token_dataset(lengths)
  row_lengths = {"inputs": 16, "targets": 20}
  packed_dataset = text.pack_dataset(dataset, row_lengths, window_size=32)
  spec = packed_dataset.element_spec
  for key, length in row_lengths.items():
    for suffix in ("", "_segment_ids", "_positions"):
      assert spec[key + suffix].shape == [length] and spec[key + suffix].dtype == tf.int32
  rows = list(packed_dataset.as_numpy_iterator())
  assert len(rows) < len(examples) / 2  # Several examples per row.
  unpacked = _unpack(rows)
  # The same examples, each exactly once (tokens are unique per example), and an
  # example's inputs and targets came out of the same row and segment.
  assert sorted(map(_key, unpacked)) == sorted(map(_key, examples))
  for example in unpacked:  # Same example id (token // 100) on both sides.
    ids = {int(t) // 100 for k in example for t in example[k] if t != 1}
    assert len(ids) <= 1
  # Deterministic.
  again = list(text.pack_dataset(dataset, row_lengths, window_size=32).as_numpy_iterator())
  assert all(_key(a) == _key(b) for a, b in zip(rows, again)) and len(rows) == len(again)


def test_packing_beats_padding():
  lengths = _mixed_lengths(800, seed=2)
  dataset, _ = _token_dataset(lengths)
  row_lengths = {"inputs": 16, "targets": 20}
  packed = text.pack_dataset(dataset, row_lengths).batch(8)
  padded = text.pad_to_length(dataset, row_lengths).batch(8)
  packed_efficiency = text.packing_efficiency(packed, 20)
  padded_efficiency = text.packing_efficiency(padded, 20)
  real_tokens = sum(n + m for n, m in lengths[:160])
  assert padded_efficiency == pytest.approx(real_tokens / (160 * 36))
  assert packed_efficiency > 0.75 > 2 * padded_efficiency


def test_pack_single_feature_and_errors():
  spec = {"targets": tf.TensorSpec([None], tf.int32)}
  sequences = [np.r_[np.arange(10 * i + 3, 10 * i + 3 + n), 1].astype(np.int32)
               for i, n in enumerate([7, 0, 3, 5, 7, 2, 1])]
  dataset = tf.data.Dataset.from_generator(lambda: ({"targets": s} for s in sequences),
                                           output_signature=spec)
  rows = list(text.pack_dataset(dataset, {"targets": 8}, window_size=4).as_numpy_iterator())
  assert all(r["targets"].shape == (8,) for r in rows)
  unpacked = _unpack(rows, keys=("targets",))
  assert sorted(_key(e) for e in unpacked) == sorted(_key({"targets": s}) for s in sequences)
  # First fit within a window of 4: [8] [1+4] [6] | [8] [3+2]
  assert [int(r["targets_segment_ids"].max()) for r in rows] == [1, 2, 1, 1, 2]
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="feature targets has a sequence longer than its row length 6"):
    list(text.pack_dataset(dataset, {"targets": 6}).as_numpy_iterator())
  extra = dataset.map(lambda e: {**e, "id": tf.constant(0)})
  with pytest.raises(ValueError, match=r"also have \['id'\]"):
    text.pack_dataset(extra, {"targets": 8})


def test_packing_as_the_shared_readers_transform(vocab, tmp_path):
  from tpu_models.config import DataConfig
  from tpu_models.data.pipeline import build_dataset
  pairs = _sentence_pairs()[:40]
  (tmp_path / "train.tsv").write_text("".join(f"{de}\t{en}\n" for de, en in pairs),
                                      encoding="utf-8")
  config = DataConfig(source="tsv", path=str(tmp_path / "train.tsv"), global_batch_size=4,
                      shuffle_buffer=0, deterministic=True)
  lengths = {"inputs": 32, "targets": 32}

  def decode(example):
    features = {k: vocab.encode(example[k]) for k in ("inputs", "targets")}
    return features, features["targets"]

  def transform(dataset):
    features = dataset.map(lambda features, labels: features)
    rows = text.pack_dataset(text.filter_by_length(features, lengths), lengths, window_size=16)
    return rows.map(lambda row: (row, row["targets"]))

  dataset = build_dataset(config, decode, training=True, transform=transform)
  for spec in tf.nest.flatten(dataset.element_spec):
    assert spec.shape.is_fully_defined() and spec.shape[0] == 4  # Static for XLA/TPU.
  features, labels = next(iter(dataset))
  assert features["inputs_segment_ids"].shape == (4, 32)
  np.testing.assert_array_equal(features["targets"].numpy(), labels.numpy())
  row = {k: v[0].numpy() for k, v in features.items()}
  first = _unpack([row])[0]
  assert vocab.decode(first["inputs"]).numpy().decode() == pairs[0][0]
  assert vocab.decode(first["targets"]).numpy().decode() == pairs[0][1]
  assert int(row["targets_segment_ids"].max()) > 1  # Several sentences share the row.
