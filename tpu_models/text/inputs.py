"""Text inputs: SentencePiece vocabularies, in-graph tokenization, padding, filtering, packing.

Token conventions used by every text model here: pad id 0, EOS id 1, UNK id 2,
no BOS. A token sequence is its ids followed by EOS, then 0-padding.

    train_sentencepiece(sentences, "vocab/de_en", vocab_size=8000)   # offline, once
    vocab = SentencePieceVocab("vocab/de_en.model")                  # in-graph
    dataset = tokenize_dataset(source_dataset, vocab)   # {"inputs", "targets"}: int32 [n]
    dataset = filter_by_length(dataset, {"inputs": 64, "targets": 64})
    dataset = pack_dataset(dataset, {"inputs": 64, "targets": 64})  # or pad_to_length

As the task's data hook (`build_dataset(..., transform=...)`, which sees the
decoded `(features, labels)` pairs), packing training data looks like

    def transform(dataset):
      features = dataset.map(lambda features, labels: features)
      rows = pack_dataset(filter_by_length(features, lengths), lengths)
      return rows.map(lambda row: (row, row["targets"]))

Everything after tokenization is pure TensorFlow (no py_function), so it runs
in tf.data on every host of a TPU pod and inside a SavedModel. `pack_dataset`
and `pad_to_length` produce static shapes, which is what a TPU needs.

Counting what is dropped or truncated: `filter_by_length` (and
`pad_to_length(truncate=True)`) carry a running count through the stream with
`tf.data.Dataset.scan` and print it with `tf.print` to stderr when 1,000,
10,000, 100,000, ... examples have been read, and once more at the end of a
finite dataset, e.g.

    filter_by_length(inputs<=64, targets<=64): dropped 12 of 10000 examples (0.12%) so far

No variable, no host callback: it works unchanged in any input pipeline, and
each input pipeline reports its own share.
"""

import os
import sys
from typing import Dict, Iterable, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from tpu_models.errors import ConfigError, DataError, MissingExtraError

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
# Piece names the ids above must carry (SentencePiece's defaults for them).
_SPECIAL_PIECES = {PAD_ID: "<pad>", EOS_ID: "</s>", UNK_ID: "<unk>"}
SEGMENT_SUFFIX = "_segment_ids"
POSITION_SUFFIX = "_positions"

# ----------------------------------------------------------------------------
# Vocabulary: offline training.


def train_sentencepiece(sentences: Iterable[str],
                        model_prefix: str,
                        vocab_size: int,
                        *,
                        model_type: str = "unigram",
                        character_coverage: float = 0.9995,
                        max_sentences: int = 2_000_000,
                        seed: int = 0,
                        num_threads: int = 2) -> str:
  """Trains a SentencePiece model with this project's special ids; returns the .model path.

  Args:
    sentences: training text, one sentence per item (for translation, both
      sides, so one shared vocabulary serves the tied embeddings).
    model_prefix: writes `{prefix}.model` (the serialized proto the tokenizer
      loads) and `{prefix}.vocab` (pieces and scores, for reading).
    vocab_size: number of pieces, including pad/EOS/UNK.
    model_type: "unigram" or "bpe" (also "char", "word").
    character_coverage: share of characters covered; the rest map to UNK.
    max_sentences: a reproducible random sample of at most this many
      sentences is used (SentencePiece's `input_sentence_size`).
    seed: SentencePiece's random seed, for a reproducible vocabulary.
    num_threads: trainer threads.

  Raises:
    DataError: no sentences. ConfigError: a vocabulary too large for the text.
  """
  try:
    import sentencepiece as spm  # Optional extra: only to train vocabularies.
  except ImportError:
    raise MissingExtraError('Training a vocabulary needs the optional package sentencepiece: '
                            'pip install "tpu_models[text]"') from None

  used = [0]  # Sentences given to the trainer.

  def iterate():
    for sentence in sentences:
      sentence = " ".join(str(sentence).split())  # Newlines would split a sentence.
      if sentence:
        used[0] += 1
        yield sentence

  directory = os.path.dirname(model_prefix)
  if directory:
    os.makedirs(directory, exist_ok=True)
  spm.set_random_generator_seed(seed)
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iterate(), model_prefix=model_prefix, vocab_size=vocab_size,
        model_type=model_type, character_coverage=character_coverage,
        pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
        input_sentence_size=max_sentences, shuffle_input_sentence=True,
        num_threads=num_threads, minloglevel=2)
  except RuntimeError as e:
    if not used[0]:
      raise DataError(f"No sentences to train the vocabulary {model_prefix!r} on.") from None
    raise ConfigError(f"SentencePiece could not train {model_prefix!r} (vocab_size "
                     f"{vocab_size}, model_type {model_type!r}): {str(e).rstrip('.')}. A "
                     f"vocabulary larger than the text supports needs a smaller "
                     f"--vocab-size.") from None
  return model_prefix + ".model"


def train_vocab_from_dataset(dataset: tf.data.Dataset,
                             model_prefix: str,
                             vocab_size: int,
                             *,
                             keys: Sequence[str] = ("inputs", "targets"),
                             **kwargs) -> str:
  """Trains a SentencePiece model on the string features `keys` of a finite dataset.

  Args:
    dataset: elements are dicts with tf.string [] features (e.g. a text source
      from tpu_models.text.sources, before the shared reader).
    model_prefix, vocab_size, kwargs: see `train_sentencepiece`.
    keys: which features to read; each contributes one sentence per element.

  Returns:
    The `.model` path.
  """
  missing = [k for k in keys if k not in dataset.element_spec]
  if missing:
    raise ConfigError(f"The dataset has no feature(s) {missing}; it has "
                     f"{sorted(dataset.element_spec)}.")

  def sentences():
    for batch in dataset.batch(4096).as_numpy_iterator():
      for key in keys:
        for text in batch[key]:
          yield text.decode("utf-8")

  return train_sentencepiece(sentences(), model_prefix, vocab_size, **kwargs)


# Splits a vocabulary must never see (held-out data would leak into the model).
_HELD_OUT_SPLITS = ("test", "validation", "valid", "dev", "eval")


def train_vocab_from_source(data_config, model_prefix: str, vocab_size: int, *,
                            keys: Sequence[str] = ("inputs", "targets"), **kwargs) -> str:
  """Trains a vocabulary on a registered text source's split (what `tpu-models vocab` runs).

  Args:
    data_config: a DataConfig naming the source, its path and split, e.g.
      DataConfig(source="de_en_dictionary", split="train") or
      DataConfig(source="tsv", path="/data/mine/*.tsv").
    model_prefix, vocab_size, kwargs: see `train_sentencepiece`.
    keys: features to learn from (both sides of a translation pair by default).

  Raises:
    ConfigError: for a held-out split ("test", "validation", ...): a vocabulary
      trained on it would leak the evaluation data into the model.
  """
  import tpu_models.text.sources  # noqa: F401  Registers the text sources.
  from tpu_models.registry import DATASETS

  split = data_config.split.split("[")[0].strip().lower()
  if split in _HELD_OUT_SPLITS:
    raise ConfigError(f"Refusing to train a vocabulary on the held-out split "
                     f"{data_config.split!r} of {data_config.source!r}: train it on training "
                     f"data only (e.g. split 'train').")
  dataset = DATASETS.get(data_config.source)(data_config, False, None)
  if data_config.num_examples:
    dataset = dataset.take(data_config.num_examples)
  return train_vocab_from_dataset(dataset, model_prefix, vocab_size, keys=keys, **kwargs)


# ----------------------------------------------------------------------------
# Vocabulary: in-graph tokenizer.


class SentencePieceVocab(tf.Module):
  """In-graph SentencePiece tokenizer/detokenizer (tensorflow_text), SavedModel-friendly.

  Built from the model proto bytes, which become part of the graph: attach the
  vocab to the exported module and the SavedModel carries its tokenizer.

      vocab = SentencePieceVocab("vocab/de_en.model")
      ids = vocab.encode("Guten Morgen.")        # int32 [n + 1], ends in EOS
      text = vocab.decode(ids)                   # tf.string []
  """

  def __init__(self, model: Union[str, bytes], name: Optional[str] = None):
    """Args: model: path of a `.model` file, or its serialized bytes."""
    super().__init__(name=name)
    import tensorflow_text as tf_text  # Heavy: only for text models.

    source = "the given model bytes"
    if isinstance(model, str):
      source = model
      if not tf.io.gfile.exists(model):
        raise FileNotFoundError(f"SentencePiece model {model!r} not found; train one with "
                                f"`tpu-models vocab ... --output PREFIX` (writes PREFIX.model).")
      with tf.io.gfile.GFile(model, "rb") as f:
        model = f.read()
    self.model_proto: bytes = bytes(model)
    try:
      self._tokenizer = tf_text.SentencepieceTokenizer(
          model=self.model_proto, out_type=tf.int32, add_eos=True)
      self.vocab_size = int(self._tokenizer.vocab_size())
      pieces = self._tokenizer.id_to_string(tf.constant(sorted(_SPECIAL_PIECES))).numpy()
    except (tf.errors.OpError, ValueError) as e:
      raise DataError(f"{source} is not a SentencePiece model: {e}") from None
    found = {i: p.decode() for i, p in zip(sorted(_SPECIAL_PIECES), pieces)}
    if found != _SPECIAL_PIECES:
      raise DataError(
          f"SentencePiece model {source} has special pieces {found}; tpu_models expects "
          f"{_SPECIAL_PIECES} (pad 0, EOS 1, UNK 2, no BOS). Train it with `tpu-models vocab` "
          f"or train_sentencepiece().")

  def encode(self, text: tf.Tensor) -> Union[tf.Tensor, tf.RaggedTensor]:
    """Strings -> token ids ending in EOS.

    Args:
      text: tf.string [] or [batch].

    Returns:
      int32 [n + 1] for a scalar, int32 ragged [batch, (n + 1)] for a vector.
    """
    return self._tokenizer.tokenize(tf.convert_to_tensor(text, tf.string))

  def decode(self, ids: Union[tf.Tensor, tf.RaggedTensor]) -> tf.Tensor:
    """Token ids -> strings, reading each row up to its first EOS.

    Padding, EOS and anything after the first EOS are dropped (a decoder's
    fixed-length output is fine as it is); ids outside the vocabulary read as
    UNK rather than failing.

    Args:
      ids: int [length], [batch, length], or ragged [batch, (length)].

    Returns:
      tf.string [] for 1-D ids, [batch] otherwise.
    """
    if isinstance(ids, tf.RaggedTensor):
      ids = ids.to_tensor(default_value=PAD_ID)
    ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
    scalar = ids.shape.rank == 1
    if scalar:
      ids = ids[tf.newaxis]
    ids = tf.where((ids < 0) | (ids >= self.vocab_size), UNK_ID, ids)
    is_eos = tf.equal(ids, EOS_ID)
    length = tf.where(tf.reduce_any(is_eos, axis=1),
                      tf.argmax(tf.cast(is_eos, tf.int32), axis=1, output_type=tf.int32),
                      tf.shape(ids)[1])
    ids = tf.RaggedTensor.from_tensor(ids, lengths=length)
    ids = tf.ragged.boolean_mask(ids, tf.not_equal(ids, PAD_ID))
    text = self._tokenizer.detokenize(ids)
    return text[0] if scalar else text

  def id_to_piece(self, ids: tf.Tensor) -> tf.Tensor:
    """int ids -> tf.string pieces (for inspection)."""
    return self._tokenizer.id_to_string(ids)


def tokenize_dataset(dataset: tf.data.Dataset,
                     vocab: SentencePieceVocab,
                     keys: Sequence[str] = ("inputs", "targets")) -> tf.data.Dataset:
  """{k: tf.string []} -> {k: int32 [n_k + 1]} (ids then EOS) for each k in `keys`.

  Other features pass through unchanged.
  """

  def tokenize(example):
    example = dict(example)
    for key in keys:
      example[key] = vocab.encode(example[key])
    return example

  return dataset.map(tokenize, num_parallel_calls=tf.data.AUTOTUNE)


# ----------------------------------------------------------------------------
# Counting dropped / truncated examples inside tf.data.


def _sentinel(spec) -> Dict[str, tf.Tensor]:
  """An element of `spec`'s structure with every unknown dimension 0."""

  def zeros(s):
    if not isinstance(s, tf.TensorSpec):
      raise ValueError(f"Only dense tensors can be counted here, got {s}.")
    return tf.zeros([d if d is not None else 0 for d in s.shape.as_list()], s.dtype)

  return tf.nest.map_structure(zeros, spec)


def _count_and_report(dataset: tf.data.Dataset, is_event, description: str,
                      verb: str) -> tf.data.Dataset:
  """Elements -> (element, event: bool []), printing the running count of events.

  The count is printed to stderr when 10^3, 10^4, ... elements have been read,
  and at the end of a finite dataset (a sentinel element, removed here, marks
  it). A stream that never ends reports only at the milestones.
  """
  tagged = dataset.map(lambda e: (e, is_event(e), False))
  sentinel = tf.data.Dataset.from_tensors((_sentinel(dataset.element_spec), False, True))
  tagged = tagged.concatenate(sentinel)

  def report(seen, events, when: str):
    percent = tf.strings.as_string(
        100.0 * tf.cast(events, tf.float64) / tf.cast(tf.maximum(seen, 1), tf.float64),
        precision=2)
    message = tf.strings.join([
        f"{description}: {verb} ", tf.strings.as_string(events), " of ",
        tf.strings.as_string(seen), " examples (", percent, f"%) {when}"])
    printed = tf.print(message, output_stream=sys.stderr)
    with tf.control_dependencies([printed]):
      return tf.constant(True)

  def step(state, inputs):
    seen, events, next_report = state
    element, event, is_end = inputs
    seen += tf.cast(tf.logical_not(is_end), tf.int64)
    events += tf.cast(event, tf.int64)
    milestone = tf.equal(seen, next_report) & tf.logical_not(is_end)
    if_report = tf.cond(milestone, lambda: report(seen, events, "so far"),
                        lambda: tf.constant(False))
    final = tf.cond(is_end, lambda: report(seen, events, "in total"), lambda: tf.constant(False))
    with tf.control_dependencies([if_report, final]):
      next_report = tf.where(milestone, next_report * 10, next_report)
    return (seen, events, next_report), (element, event, is_end)

  initial = (tf.constant(0, tf.int64), tf.constant(0, tf.int64), tf.constant(1000, tf.int64))
  def not_end(element, event, is_end):
    return tf.logical_not(is_end)

  def drop_end_flag(element, event, is_end):
    return element, event

  return tagged.scan(initial, step).filter(not_end).map(drop_end_flag)


def _lengths_description(name: str, lengths: Dict[str, int], op: str) -> str:
  return f"{name}({', '.join(f'{k}{op}{v}' for k, v in lengths.items())})"


def _check_keys(dataset: tf.data.Dataset, lengths: Dict[str, int], what: str) -> None:
  spec = dataset.element_spec
  if not isinstance(spec, dict):
    raise ValueError(f"{what} needs dict elements of 1-D token sequences, got {spec}.")
  missing = [k for k in lengths if k not in spec]
  if missing:
    raise ValueError(f"{what}: the examples have no feature(s) {missing}; they have "
                     f"{sorted(spec)}.")
  for key in lengths:
    if spec[key].shape.rank != 1 or not spec[key].dtype.is_integer:
      raise ValueError(f"{what}: feature {key!r} must be a 1-D integer token sequence, got "
                       f"{spec[key]}.")
    if lengths[key] < 1:
      raise ConfigError(f"{what}: length of {key!r} must be >= 1, got {lengths[key]}.")


# ----------------------------------------------------------------------------
# Length filter and padding.


def filter_by_length(dataset: tf.data.Dataset, max_lengths: Dict[str, int]) -> tf.data.Dataset:
  """Drops examples with any sequence longer than its maximum, counting them in the log.

  Args:
    dataset: dict elements; `max_lengths` keys are int [n] token sequences
      (EOS included in n).
    max_lengths: feature -> longest allowed length.

  Returns:
    The same elements minus the dropped ones. How many were dropped is
    printed to stderr at 10^3, 10^4, ... examples read and at the end of a
    finite dataset (see the module docstring). Filter training data only:
    dropping evaluation examples would bias the metric.
  """
  _check_keys(dataset, max_lengths, "filter_by_length")

  def too_long(example):
    checks = [tf.size(example[k]) > v for k, v in max_lengths.items()]
    return tf.reduce_any(tf.stack(checks))

  description = _lengths_description("filter_by_length", max_lengths, "<=")
  def keep(example, dropped):
    return tf.logical_not(dropped)

  def untag(example, dropped):
    return example

  return _count_and_report(dataset, too_long, description, "dropped").filter(keep).map(untag)


def pad_to_length(dataset: tf.data.Dataset, lengths: Dict[str, int], *,
                  truncate: bool = False) -> tf.data.Dataset:
  """Pads each token sequence with 0 to a fixed length (static shapes for TPU).

  Args:
    dataset: dict elements; `lengths` keys are int [n] token sequences.
    lengths: feature -> padded length L.
    truncate: cut longer sequences to L, keeping EOS as their last token, and
      report how many were cut (as `filter_by_length` does). When False, a
      longer sequence is an error naming the feature.

  Returns:
    Elements with `lengths` keys int32 [L]; other features unchanged.
  """
  _check_keys(dataset, lengths, "pad_to_length")

  def pad(example):
    example = dict(example)
    for key, length in lengths.items():
      ids = tf.cast(example[key], tf.int32)
      if truncate:
        ids = tf.cond(tf.size(ids) > length,
                      lambda ids=ids, length=length: tf.concat([ids[:length - 1], [EOS_ID]], 0),
                      lambda ids=ids: ids)
      else:
        check = tf.debugging.assert_less_equal(
            tf.size(ids), length, message=f"pad_to_length: feature {key} has a sequence longer "
            f"than {length} tokens; filter_by_length first or pass truncate=True")
        with tf.control_dependencies([check]):  # Fail here, not with tf.pad's message.
          ids = tf.identity(ids)
      ids = tf.pad(ids, [[0, length - tf.size(ids)]])
      example[key] = tf.ensure_shape(ids, [length])
    return example

  if truncate:
    def too_long(example):
      return tf.reduce_any(tf.stack([tf.size(example[k]) > v for k, v in lengths.items()]))

    def untag(example, truncated):
      return example

    description = _lengths_description("pad_to_length", lengths, "<=")
    dataset = _count_and_report(dataset, too_long, description, "truncated").map(untag)
  return dataset.map(pad, num_parallel_calls=tf.data.AUTOTUNE)


# ----------------------------------------------------------------------------
# Sequence packing.


def pack_dataset(dataset: tf.data.Dataset, lengths: Dict[str, int], *,
                 window_size: int = 128) -> tf.data.Dataset:
  """Packs several examples into each fixed-length row, with segment ids and positions.

  Greedy first-fit over windows of `window_size` consecutive examples: each
  example goes into the first row of its window where every one of its
  sequences still fits, so an example's inputs and targets always share a row
  and a segment id. Deterministic, pure TF ops, no example lost or repeated.

  Args:
    dataset: dict elements {k: int [n_k]} for each k in `lengths` (and no
      other features); each sequence already ends in EOS and n_k <= L_k
      (filter_by_length first), n_k >= 1.
    lengths: feature k -> row length L_k.
    window_size: examples considered together; larger packs tighter and costs
      more host time per window.

  Returns:
    Rows with, for each k, int32 [L_k] features:
      k: the tokens of the packed examples, then 0-padding;
      k + "_segment_ids": 1, 2, ... for the 1st, 2nd, ... example in the row,
        0 on padding;
      k + "_positions": 0-based position of the token within its example.
  """
  _check_keys(dataset, lengths, "pack_dataset")
  extra = sorted(set(dataset.element_spec) - set(lengths))
  if extra:
    raise ValueError(f"pack_dataset packs only token sequences; the examples also have "
                     f"{extra}. Remove them or give them a length.")
  if window_size < 1:
    raise ValueError(f"pack_dataset: window_size must be >= 1, got {window_size}.")
  keys = list(lengths)
  capacity = tf.constant([lengths[k] for k in keys], tf.int32)  # [K]

  def with_lengths(example):
    out = {}
    for key in keys:
      ids = tf.cast(example[key], tf.int32)
      check = tf.debugging.assert_less_equal(
          tf.size(ids), lengths[key], message=f"pack_dataset: feature {key} has a sequence longer "
          f"than its row length {lengths[key]}; filter_by_length first")
      with tf.control_dependencies([check]):
        out[key] = tf.identity(ids)
      out[key + "_length"] = tf.size(ids)
    return out

  windows = dataset.map(with_lengths).padded_batch(
      window_size,
      padded_shapes={**{k: [lengths[k]] for k in keys}, **{k + "_length": [] for k in keys}})

  def pack_window(window):
    # [W, K]: every sequence length of every example in the window.
    example_lengths = tf.stack([window[k + "_length"] for k in keys], axis=1)
    num_examples = tf.shape(example_lengths)[0]

    def place(i, fill, count, rows, offsets, segments):
      # fill: [W, K] tokens used per row and feature; count: [W] examples per row.
      need = example_lengths[i]
      fits = tf.reduce_all(fill + need[tf.newaxis] <= capacity[tf.newaxis], axis=1)
      row = tf.argmax(tf.cast(fits, tf.int32), output_type=tf.int32)  # First row that fits.
      rows = rows.write(i, row)
      offsets = offsets.write(i, fill[row])
      segments = segments.write(i, count[row] + 1)
      one_hot = tf.one_hot(row, num_examples, dtype=tf.int32)
      return (i + 1, fill + one_hot[:, tf.newaxis] * need[tf.newaxis], count + one_hot,
              rows, offsets, segments)

    _, _, _, rows, offsets, segments = tf.while_loop(
        lambda i, *_: i < num_examples, place,
        (tf.constant(0), tf.zeros([num_examples, len(keys)], tf.int32),
         tf.zeros([num_examples], tf.int32),
         tf.TensorArray(tf.int32, size=num_examples),
         tf.TensorArray(tf.int32, size=num_examples, element_shape=[len(keys)]),
         tf.TensorArray(tf.int32, size=num_examples)))
    rows, offsets, segments = rows.stack(), offsets.stack(), segments.stack()
    num_rows = tf.reduce_max(rows) + 1

    packed = {}
    for k_index, key in enumerate(keys):
      length = lengths[key]
      position = tf.range(length)[tf.newaxis]  # [1, L]
      valid = position < window[key + "_length"][:, tf.newaxis]  # [W, L]
      target_row = tf.broadcast_to(rows[:, tf.newaxis], tf.shape(valid))
      target_col = offsets[:, k_index][:, tf.newaxis] + position
      index = tf.boolean_mask(tf.stack([target_row, target_col], axis=-1), valid)
      shape = [num_examples, length]

      def scatter(values, index=index, valid=valid, shape=shape):
        return tf.scatter_nd(index, tf.boolean_mask(values, valid), shape)[:num_rows]

      packed[key] = scatter(window[key])
      packed[key + SEGMENT_SUFFIX] = scatter(
          tf.broadcast_to(segments[:, tf.newaxis], tf.shape(valid)))
      packed[key + POSITION_SUFFIX] = scatter(tf.broadcast_to(position, tf.shape(valid)))
    return packed

  packed = windows.map(pack_window, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  packed = packed.unbatch()
  return packed.map(lambda row: {k: tf.ensure_shape(v, [lengths[_base_key(k, keys)]])
                                 for k, v in row.items()})


def _base_key(key: str, keys: Sequence[str]) -> str:
  for suffix in (SEGMENT_SUFFIX, POSITION_SUFFIX):
    if key.endswith(suffix) and key[:-len(suffix)] in keys:
      return key[:-len(suffix)]
  return key


def _flatten_with_paths(element, path: str = ""):
  if isinstance(element, dict):
    for key in sorted(element):
      yield from _flatten_with_paths(element[key], f"{path}/{key}")
  elif isinstance(element, (tuple, list)):
    for i, item in enumerate(element):
      yield from _flatten_with_paths(item, f"{path}/{i}")
  else:
    yield path, element


def packing_efficiency(dataset: tf.data.Dataset, num_batches: int) -> float:
  """Share of real (non-pad) tokens in the first `num_batches` elements.

  Works on packed or padded rows or batches of them: every integer feature that
  is not a segment id or position counts, and pad id 0 marks padding. Compare
  `pad_to_length` and `pack_dataset` on the same data to see what packing buys.

  Args:
    dataset: dict elements (or tuples of dicts) of fixed-shape token tensors.
    num_batches: elements to read.

  Returns:
    Real tokens / all token slots, in [0, 1].
  """
  real = total = 0
  for element in dataset.take(num_batches).as_numpy_iterator():
    for path, value in _flatten_with_paths(element):
      value = np.asarray(value)
      if (path.endswith(SEGMENT_SUFFIX) or path.endswith(POSITION_SUFFIX)
          or not np.issubdtype(value.dtype, np.integer)):
        continue
      real += int(np.count_nonzero(value != PAD_ID))
      total += value.size
  if not total:
    raise ValueError("packing_efficiency: the dataset yielded no integer token features.")
  return real / total
