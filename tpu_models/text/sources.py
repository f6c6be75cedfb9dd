"""Translation dataset sources: the Ding German-English dictionary, TSV, TFRecord, WMT14.

Every source returns this input pipeline's share of undecoded elements
`{"inputs": tf.string [], "targets": tf.string []}` (source and target
sentence; see pipeline.py for the source contract). Tokenization, length
filtering and packing happen later, in the task's decode function and data hook
(tpu_models/text/inputs.py).

de_en_dictionary: the Ding dictionary (Debian package `trans-de-en`, one UTF-8
  file of ~206k lines `DE | DE2 :: EN | EN2`), parsed into ~390k aligned
  German->English pairs. Splits (DataConfig.split):
    "test"             1,000 whole sentences, held out: never trained on and
                       never used for the vocabulary or model selection.
    "validation"       500 further whole sentences for evaluation during training.
    "train"            every other pair, dictionary phrases included.
    "train_sentences"  only the whole sentences of "train" (for oversampling).
  See `parse_de_en` for the parsing and `split_de_en` for how the held-out
  sentences are chosen and kept out of training.
tsv: lines `source<TAB>target` from the files in DataConfig.path.
text_tfrecord: tf.Example records with bytes features "inputs" and "targets".
wmt14_de_en: TFDS `wmt14_translate/de-en` when it is already prepared locally.
"""

import collections
import dataclasses
import functools
import hashlib
import logging
import os
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tpu_models.config import DataConfig
from tpu_models.data import pipeline
from tpu_models.data.pipeline import AUTOTUNE
from tpu_models.data.sources import DATA_ENV
from tpu_models.errors import ConfigError, DataError, MissingExtraError
from tpu_models.registry import register_dataset

log = logging.getLogger(__name__)

Pair = Tuple[str, str]  # (German, English)

DEBIAN_DE_EN = "/usr/share/trans/de-en"
DE_EN_URL = "https://dict.tu-chemnitz.de/"
DE_EN_SPLITS = ("train", "train_sentences", "validation", "test")
DE_EN_TEST_SIZE = 1000
DE_EN_VALIDATION_SIZE = 500
# Changing this salt (or the sentence rule) changes the held-out split: don't.
_HELD_OUT_SALT = b"tpu_models/de_en_dictionary/held_out/v1"

# ----------------------------------------------------------------------------
# The Ding dictionary: parsing.

# Annotations: grammar {m} {pl} {vt} {+Gen.}, usage [ugs.] [Am.] [geol.],
# alternative spellings <...> and glosses "(of a person)", "(zoologische
# Ordnung)". Parentheses in example sentences hold optional words ("fertig
# (gestellt) sein"), so dropping them leaves a sentence without the option.
# "|" is excluded so that an unbalanced bracket can never swallow a field boundary.
_ANNOTATION_RE = re.compile(r"\{[^{}|]*\}|\[[^\[\]|]*\]|<[^<>|]*>|\([^()|]*\)")
_SPACE_BEFORE_PUNCT_RE = re.compile(r" +(?=[,.;:!?])")
_SENTENCE_START = "\"'\u201c\u201e\u2018\u201a\u00ab\u00bb"  # Quotes a sentence may open with.


def _remove_annotations(text: str) -> str:
  previous = None
  while previous != text:  # Again for nested ones: "(a (b) c)".
    previous, text = text, _ANNOTATION_RE.sub(" ", text)
  return _SPACE_BEFORE_PUNCT_RE.sub("", text)


def _normalise(field: str) -> str:
  # "A {n}; B {n}" leaves "A; B"; a trailing annotation can leave "A;".
  return " ".join(field.split()).strip(" ;,")


def clean_de_en_text(text: str) -> str:
  """One field of a dictionary entry without its annotations, whitespace normalised.

  >>> clean_de_en_text("Aal {m} (auf der Speisekarte) [cook.] <Aale>")
  'Aal'
  >>> clean_de_en_text("A {n}; Ais {n} [mus.]")
  'A; Ais'
  """
  return _normalise(_remove_annotations(text))


def is_whole_sentence(english: str) -> bool:
  """The issue's sentence rule, applied to the cleaned English side.

  Starts with a capital letter, a digit or a quote; at least 4 words; ends in
  ".", "!" or "?"; and is not a phrase entry ending in "sb." or "sth.".
  """
  if not english:
    return False
  first = english[0]
  if not (first.isupper() or first.isdigit() or first in _SENTENCE_START):
    return False
  if english[-1] not in ".!?" or english.endswith(("sb.", "sth.")):
    return False
  return len(english.split()) >= 4


@dataclasses.dataclass(frozen=True)
class DeEnParse:
  """All pairs of a dictionary file, in file order, and what parsing skipped."""
  pairs: Tuple[Pair, ...]  # Cleaned, exact duplicates removed (first kept).
  lines: int  # Entry lines read (comments and blank lines excluded).
  comment_lines: int
  raw_pairs: int  # Aligned pairs before cleaning and de-duplication.
  duplicate_pairs: int
  empty_pairs: int  # A side was empty after removing annotations.
  malformed_lines: int  # No " :: " separator.
  mismatched_lines: int  # Different numbers of " | " fields on the two sides.
  mismatched_pairs: int  # Fields lost on those lines (the unaligned remainder).


def parse_de_en(lines: Iterable[str]) -> DeEnParse:
  """Parses Ding dictionary lines into aligned, cleaned (German, English) pairs.

  A line is `DE | DE2 | ... :: EN | EN2 | ...`; field k of one side translates
  field k of the other. Lines starting with "#" are comments. When the two
  sides have different numbers of fields, the alignment is uncertain beyond
  the first field: only the first pair is kept and the rest is counted in
  `mismatched_pairs`. Annotations are removed (see `clean_de_en_text`); a pair
  with an empty side afterwards is dropped and counted.
  """
  seen = set()
  pairs: List[Pair] = []
  counts = collections.Counter()
  for line in lines:
    line = line.rstrip("\r\n")  # Not strip(): a line may open with " | " (empty field).
    if not line.strip():
      continue
    if line.startswith("#"):
      counts["comment_lines"] += 1
      continue
    counts["lines"] += 1
    german, sep, english = line.partition(" :: ")
    if not sep:
      counts["malformed_lines"] += 1
      continue
    # Annotations are removed per side, not per field: 2 regex passes a line, not ~4.
    german_fields = _remove_annotations(german).split(" | ")
    english_fields = _remove_annotations(english).split(" | ")
    if len(german_fields) != len(english_fields):
      counts["mismatched_lines"] += 1
      counts["mismatched_pairs"] += max(len(german_fields), len(english_fields)) - 1
      german_fields, english_fields = german_fields[:1], english_fields[:1]
    for de, en in zip(german_fields, english_fields):
      counts["raw_pairs"] += 1
      pair = (_normalise(de), _normalise(en))
      if not pair[0] or not pair[1]:
        counts["empty_pairs"] += 1
      elif pair in seen:
        counts["duplicate_pairs"] += 1
      else:
        seen.add(pair)
        pairs.append(pair)
  fields = [f.name for f in dataclasses.fields(DeEnParse) if f.name != "pairs"]
  return DeEnParse(pairs=tuple(pairs), **{f: counts[f] for f in fields})


# ----------------------------------------------------------------------------
# The Ding dictionary: held-out split.


def _side_keys(text: str) -> List[str]:
  """Comparison keys of a cleaned side: the whole side and each ";"-alternative.

  Case-folded, final ".", "!", "?" dropped (whitespace is already normalised).
  """
  folded = text.casefold()
  keys = [folded.rstrip(" .!?")]
  if "; " in folded:
    keys += [part.rstrip(" .!?") for part in folded.split("; ")]
  return [k for k in keys if k]


def _stable_hash(pair: Pair) -> bytes:
  return hashlib.sha256(_HELD_OUT_SALT + pair[0].encode() + b"\t" + pair[1].encode()).digest()


@dataclasses.dataclass(frozen=True)
class DeEnSplits:
  """The four splits of the dictionary and the counts behind them."""
  train: Tuple[Pair, ...]
  train_sentences: Tuple[Pair, ...]
  validation: Tuple[Pair, ...]
  test: Tuple[Pair, ...]
  sentences: int  # Whole-sentence pairs in the whole file.
  dropped_from_train: int  # Pairs sharing a side with a held-out sentence.
  parse: DeEnParse

  def summary(self) -> str:
    p = self.parse
    return (f"{len(p.pairs)} unique pairs ({p.raw_pairs} aligned, {p.duplicate_pairs} duplicates, "
            f"{p.empty_pairs} empty after cleaning, {p.mismatched_lines} lines with mismatched "
            f"'|' fields losing {p.mismatched_pairs} pairs, {p.malformed_lines} lines without "
            f"' :: '), {self.sentences} whole sentences -> train {len(self.train)} "
            f"(train_sentences {len(self.train_sentences)}), validation {len(self.validation)}, "
            f"test {len(self.test)}; {self.dropped_from_train} pairs sharing a side with a "
            f"held-out sentence dropped from train")


def split_de_en(parse: DeEnParse, test_size: int = DE_EN_TEST_SIZE,
                validation_size: int = DE_EN_VALIDATION_SIZE) -> DeEnSplits:
  """Fixed held-out sentences and the training pairs that never touch them.

  The candidates are the unique whole-sentence pairs (`is_whole_sentence`).
  They are ordered by SHA-256 of a fixed salt + "German\\tEnglish", so the
  choice depends only on the pairs themselves, not on file order, Python's
  hash seed or the platform. Walking that order, the first `test_size`
  candidates become "test" and the next `validation_size` "validation",
  skipping any candidate that shares a side with one already chosen (so no
  sentence is held out twice). Sides are compared by `_side_keys`: case-
  and whitespace-insensitive, final punctuation ignored, and each
  ";"-separated alternative counted as a side of its own. Every pair with a
  side matching any held-out side is removed from training: stricter than
  exact equality, so a held-out sentence cannot reach the model or the
  vocabulary through a near-identical dictionary entry.
  """
  sentences = [p for p in parse.pairs if is_whole_sentence(p[1])]
  candidates = sorted(sentences, key=lambda p: (_stable_hash(p), p))
  held_de: set = set()
  held_en: set = set()
  chosen: List[Pair] = []
  for pair in candidates:
    if len(chosen) == test_size + validation_size:
      break
    de_keys, en_keys = _side_keys(pair[0]), _side_keys(pair[1])
    if held_de.intersection(de_keys) or held_en.intersection(en_keys):
      continue
    held_de.update(de_keys)
    held_en.update(en_keys)
    chosen.append(pair)
  if len(chosen) < test_size + validation_size:
    raise DataError(f"The dictionary has only {len(chosen)} distinct whole sentences; "
                     f"{test_size} test + {validation_size} validation are needed. Is it the "
                     f"full Ding de-en file?")
  held = set(chosen)
  train = []
  for pair in parse.pairs:
    if pair in held:
      continue
    if held_de.intersection(_side_keys(pair[0])) or held_en.intersection(_side_keys(pair[1])):
      continue
    train.append(pair)
  dropped = len(parse.pairs) - len(held) - len(train)
  return DeEnSplits(
      train=tuple(train),
      train_sentences=tuple(p for p in train if is_whole_sentence(p[1])),
      validation=tuple(chosen[test_size:]),
      test=tuple(chosen[:test_size]),
      sentences=len(sentences), dropped_from_train=dropped, parse=parse)


# ----------------------------------------------------------------------------
# The Ding dictionary: files and the source.


def find_de_en(path: str = "") -> str:
  """The Ding dictionary file.

  Searched in order: `path` (a file, or a directory holding `de-en`),
  `$TPU_MODELS_DATA/de-en`, `$TPU_MODELS_DATA/trans/de-en`, and
  /usr/share/trans/de-en (Debian package `trans-de-en`).

  Raises:
    FileNotFoundError: naming every place searched and how to get the file.
  """
  candidates = []
  if path:
    candidates += [path, os.path.join(path, "de-en")]
  root = os.environ.get(DATA_ENV)
  if root:
    candidates += [os.path.join(root, "de-en"), os.path.join(root, "trans", "de-en")]
  candidates.append(DEBIAN_DE_EN)
  for candidate in candidates:
    if os.path.isfile(candidate):
      return candidate
  where = "\n".join(f"  - {c}" for c in candidates)
  raise FileNotFoundError(
      f"The German-English dictionary (Ding, file 'de-en') was not found. Searched:\n{where}\n"
      f"Install it with `apt-get install trans-de-en` (Debian/Ubuntu; installs "
      f"{DEBIAN_DE_EN}), or download the de-en file from {DE_EN_URL} into ${DATA_ENV}/ "
      f"(or point data.path at it).")


@functools.lru_cache(maxsize=4)
def _load_de_en_splits(filename: str, size: int, mtime_ns: int) -> DeEnSplits:
  del size, mtime_ns  # Cache keys only: a changed file is parsed again.
  try:
    with open(filename, encoding="utf-8") as f:
      parse = parse_de_en(f)
  except UnicodeDecodeError as e:
    raise DataError(f"{filename} is not UTF-8 text ({e}); is it the Ding de-en dictionary?") \
        from None
  if not parse.pairs:
    raise DataError(f"{filename} holds no 'German :: English' lines; is it the Ding de-en "
                     f"dictionary?")
  splits = split_de_en(parse)
  log.info("de_en_dictionary %s: %s", filename, splits.summary())
  return splits


def de_en_splits(path: str = "") -> DeEnSplits:
  """All splits of the dictionary found by `find_de_en(path)`, parsed once per process."""
  filename = os.path.realpath(find_de_en(path))
  stat = os.stat(filename)
  return _load_de_en_splits(filename, stat.st_size, stat.st_mtime_ns)


def load_de_en(split: str, path: str = "") -> Tuple[Pair, ...]:
  """(German, English) pairs of one split: "train", "train_sentences", "validation", "test"."""
  if split not in DE_EN_SPLITS:
    raise ConfigError(f"Unknown de_en_dictionary split {split!r}; use one of "
                     f"{', '.join(DE_EN_SPLITS)}.")
  return getattr(de_en_splits(path), split)


def _pairs_dataset(pairs: Sequence[Pair],
                   input_context: Optional[tf.distribute.InputContext]) -> tf.data.Dataset:
  """{"inputs", "targets"} strings from memory; pipeline i of n gets pairs i, i + n, ..."""
  if input_context is not None and input_context.num_input_pipelines > 1:
    pairs = pairs[input_context.input_pipeline_id::input_context.num_input_pipelines]
  inputs = np.array([p[0] for p in pairs], dtype=object)
  targets = np.array([p[1] for p in pairs], dtype=object)
  return tf.data.Dataset.from_tensor_slices({
      "inputs": tf.constant(inputs, tf.string, shape=[len(pairs)]),
      "targets": tf.constant(targets, tf.string, shape=[len(pairs)])})


_reported_de_en: set = set()  # Files whose split sizes were already printed.


@register_dataset("de_en_dictionary")
def de_en_dictionary_source(config: DataConfig, training: bool,
                            input_context: Optional[tf.distribute.InputContext]
                            ) -> tf.data.Dataset:
  """German -> English pairs of the Ding dictionary (see the module docstring for splits).

  `config.path` may name the file or its directory; by default it is searched
  (see `find_de_en`). Split sizes are printed once per file and process.
  """
  del training  # The shared reader shuffles and repeats.
  pairs = load_de_en(config.split, config.path)
  filename = os.path.realpath(find_de_en(config.path))
  if filename not in _reported_de_en:
    _reported_de_en.add(filename)
    print(f"de_en_dictionary {filename}: {de_en_splits(config.path).summary()}", flush=True)
  return _pairs_dataset(pairs, input_context)


# ----------------------------------------------------------------------------
# Files: TSV and TFRecord.


def _read_tsv(filename: tf.Tensor) -> tf.data.Dataset:
  """One TSV file -> {"inputs", "targets"}; a line without exactly one tab is an error."""
  lines = tf.data.TextLineDataset(filename, buffer_size=1 << 20)
  lines = lines.enumerate(start=1).filter(lambda _, line: tf.strings.length(
      tf.strings.strip(line)) > 0)  # Blank lines (e.g. a trailing one) are not examples.

  def split(number, line):
    fields = tf.strings.split(tf.strings.regex_replace(line, "\r$", ""), "\t")
    where = tf.strings.join([
        "TSV line ", filename, ":", tf.strings.as_string(number), " has ",
        tf.strings.as_string(tf.size(fields)), " tab-separated fields, expected 2 "
        "(source<TAB>target): ", tf.strings.substr(line, 0, 200, unit="UTF8_CHAR")])
    check = tf.debugging.Assert(tf.equal(tf.size(fields), 2), [where])
    with tf.control_dependencies([check]):
      return {"inputs": tf.identity(fields[0]), "targets": tf.identity(fields[1])}

  return lines.map(split)


@register_dataset("tsv")
def tsv_source(config: DataConfig, training: bool,
               input_context: Optional[tf.distribute.InputContext]) -> tf.data.Dataset:
  """{"inputs", "targets"} from UTF-8 lines `source<TAB>target` in the files at `config.path`.

  Files are sharded per input pipeline (every n-th file; see `pipeline.read_files`).
  Blank lines are skipped; a line with no tab or more than one is an error
  naming the file and line (or skipped and logged with data.on_corrupt=skip).
  """
  return pipeline.read_files(config, _read_tsv, training=training, input_context=input_context,
                             expected="text files of source<TAB>target lines")


TEXT_FEATURES = ("inputs", "targets")


def text_example(inputs: str, targets: str) -> tf.train.Example:
  """A tf.Example with bytes features "inputs" and "targets" (UTF-8)."""
  feature = {k: tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode("utf-8")]))
             for k, v in zip(TEXT_FEATURES, (inputs, targets))}
  return tf.train.Example(features=tf.train.Features(feature=feature))


def write_text_tfrecords(pairs: Iterable[Pair], output_prefix: str,
                         num_shards: int = 1) -> List[str]:
  """Writes (source, target) pairs round-robin into `{prefix}-0000i-of-0000n` TFRecords.

  Returns:
    The shard paths (read them back with source `text_tfrecord`).
  """
  from tpu_models.data.records import ShardedRecordWriter
  with ShardedRecordWriter(output_prefix, num_shards) as writer:
    for inputs, targets in pairs:
      writer.write(text_example(inputs, targets))
  return writer.paths


def _parse_text_example(serialized: tf.Tensor) -> Dict[str, tf.Tensor]:
  spec = {k: tf.io.FixedLenFeature([], tf.string) for k in TEXT_FEATURES}
  return tf.io.parse_single_example(serialized, spec)


@register_dataset("text_tfrecord")
def text_tfrecord_source(config: DataConfig, training: bool,
                         input_context: Optional[tf.distribute.InputContext]) -> tf.data.Dataset:
  """{"inputs", "targets"} from tf.Examples with bytes features "inputs" and "targets".

  Files at `config.path` are sharded per input pipeline. A record missing
  either feature is an error naming it (see `write_text_tfrecords`).
  """
  records = pipeline.read_tfrecords(
      config, training=training, input_context=input_context,
      expected="TFRecord files of tf.Examples with bytes features 'inputs' and 'targets' "
               "(see tpu_models.text.sources.write_text_tfrecords)")
  return records.map(_parse_text_example, num_parallel_calls=AUTOTUNE,
                     deterministic=config.deterministic or not training)


# ----------------------------------------------------------------------------
# WMT14 through TFDS, local only.

WMT14_BUILDER = "wmt14_translate/de-en"


@register_dataset("wmt14_de_en")
def wmt14_de_en_source(config: DataConfig, training: bool,
                       input_context: Optional[tf.distribute.InputContext]) -> tf.data.Dataset:
  """German -> English pairs of TFDS `wmt14_translate/de-en`, if prepared locally.

  The TFDS data_dir is `config.path`, else $TFDS_DATA_DIR, else
  ~/tensorflow_datasets. Splits: "train" (~4.5M pairs), "validation"
  (newstest2013), "test" (newstest2014), and TFDS slices of them. Nothing is
  ever downloaded: a missing dataset raises FileNotFoundError saying how to
  prepare it elsewhere.
  """
  data_dir = config.path or os.environ.get("TFDS_DATA_DIR") or os.path.expanduser(
      "~/tensorflow_datasets")
  how = (f"Data is never downloaded at run time. On a machine with internet run\n"
         f"  tfds build {WMT14_BUILDER} --data_dir {data_dir}\n"
         f"(needs `pip install tensorflow-datasets` and internet), then copy that "
         f"data_dir here and point data.path (or $TFDS_DATA_DIR) at it.")
  try:
    import tensorflow_datasets as tfds  # Heavy: only when this source is used.
  except ImportError:
    raise MissingExtraError(f"Data source 'wmt14_de_en' reads TFDS {WMT14_BUILDER}: "
                            f"`pip install tensorflow-datasets`. {how}") from None
  try:
    builder = tfds.builder(WMT14_BUILDER, data_dir=data_dir, try_gcs=False)
    prepared = builder.is_prepared()
  except Exception as e:  # TFDS raises several kinds when no data is found.
    raise FileNotFoundError(f"TFDS {WMT14_BUILDER} is not available under {data_dir} "
                            f"({type(e).__name__}: {e}). {how}") from None
  if not prepared:
    raise FileNotFoundError(f"TFDS {WMT14_BUILDER} is not prepared under {data_dir}. {how}")
  read_config = tfds.ReadConfig(input_context=input_context, shuffle_seed=config.seed,
                                interleave_cycle_length=config.cycle_length,
                                try_autocache=False)
  dataset = builder.as_dataset(split=config.split, shuffle_files=training,
                               read_config=read_config)
  return dataset.map(lambda e: {"inputs": e["de"], "targets": e["en"]},
                     num_parallel_calls=AUTOTUNE)
