"""What the text tasks share: vocabulary, token losses, data mixing, and a base task.

`TextTask` is the base of `translation` and `language_modeling`: it loads the
SentencePiece vocabulary named by `task.vocab_path`, builds the model with the
vocabulary's size, checks the config fields both tasks have, oversamples a
second split, turns decoded token ids into static-shape training rows (length
filter, then packing or padding), and gives the token-level loss
(a (sum, real tokens) pair: padding and packing never change it) and metrics.
"""

import dataclasses
import inspect
from typing import Dict, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

from tpu_models.config import DataConfig, ModelConfig, TaskConfig
from tpu_models.data import pipeline
from tpu_models.text import inputs as text_lib
from tpu_models.errors import ConfigError
from tpu_models.factory import create_model
from tpu_models.registry import DATASETS, model_signature
from tpu_models.task import HIGHER, LOWER, LossResult, Task

VOCAB_COMMAND = "tpu-models vocab SOURCE --output PREFIX --vocab-size N"


def _dictionary_data(split: str, shuffle_buffer: Optional[int] = None) -> DataConfig:
  extra = {} if shuffle_buffer is None else {"shuffle_buffer": shuffle_buffer}
  return DataConfig(source="de_en_dictionary", split=split, global_batch_size=64, **extra)


@dataclasses.dataclass
class TextTaskConfig(TaskConfig):
  """The keys both text tasks read (`TextTask`): data, vocabulary, packing, oversampling.

  The defaults train on the German-English dictionary's splits (64 rows a batch).
  """
  # vocab_size may be left out: it is read from the vocabulary at vocab_path.
  train_data: DataConfig = dataclasses.field(default_factory=lambda: _dictionary_data("train"))
  eval_data: DataConfig = dataclasses.field(
      default_factory=lambda: _dictionary_data("validation", shuffle_buffer=0))
  # Evaluated once after training (`tpu-models train`), never for model selection.
  test_data: Optional[DataConfig] = None
  vocab_path: str = ""  # SentencePiece .model written by `tpu-models vocab`.
  packing: bool = True  # Several training rows per packed row (segment ids, positions).
  pack_window: int = 256  # Rows considered together by the first-fit packer.
  # Share of training rows drawn from `sentences_split` of the same source (0 = off),
  # the rest from train_data.split: oversamples the whole sentences of the dictionary.
  oversample_sentences: float = 0.0
  sentences_split: str = "train_sentences"


_VOCABS: Dict[str, text_lib.SentencePieceVocab] = {}


def _load_vocab(path: str) -> text_lib.SentencePieceVocab:
  """One vocabulary per path and process, re-created when its tokenizer resource died.

  tensorflow_text's SentencePiece resource is owned by an eager kernel, which
  `tf.random.set_seed` (e.g. a second Trainer's seeding) destroys; a cached
  vocabulary would then fail inside the next input pipeline.
  """
  vocab = _VOCABS.get(path)
  if vocab is not None:
    try:
      vocab.id_to_piece(tf.constant([text_lib.EOS_ID]))
      return vocab
    except tf.errors.NotFoundError:
      pass
  vocab = _VOCABS[path] = text_lib.SentencePieceVocab(path)
  return vocab


def load_vocab(vocab_path: str, config_key: str = "task.vocab_path"
               ) -> text_lib.SentencePieceVocab:
  """The in-graph SentencePiece vocabulary at `vocab_path` (loaded once per process).

  Raises:
    FileNotFoundError: naming the config key and the `tpu-models vocab` command.
  """
  if not vocab_path:
    raise FileNotFoundError(f"{config_key} is not set: point it at a SentencePiece model "
                            f"trained with `{VOCAB_COMMAND}` (writes PREFIX.model).")
  if not tf.io.gfile.exists(vocab_path):
    raise FileNotFoundError(f"{config_key} {vocab_path!r} does not exist. Train the vocabulary "
                            f"first: `{VOCAB_COMMAND}` (writes PREFIX.model; see "
                            f"official/transformer/README.md for the exact command).")
  return _load_vocab(vocab_path)


def model_with_vocab_size(model: ModelConfig, vocab_path: str) -> ModelConfig:
  """`model` with `vocab_size` filled in from the vocabulary, or checked against it.

  A config may leave `vocab_size` out (it is read from `vocab_path`), or give it
  (needed to build the model where the vocabulary file is absent, e.g. for
  `tpu-models check` of a TPU recipe); when both exist they must agree.
  """
  params = dict(model.params)
  given = params.get("vocab_size")
  if vocab_path and tf.io.gfile.exists(vocab_path):
    actual = load_vocab(vocab_path).vocab_size
    if given is not None and int(given) != actual:
      raise ConfigError(f"task.model.vocab_size is {given} but the vocabulary {vocab_path!r} "
                        f"has {actual} pieces; remove vocab_size from the model config or make "
                        f"them agree.")
    params["vocab_size"] = actual
  elif given is None:
    load_vocab(vocab_path)  # Raises the missing-vocabulary error.
  return ModelConfig(model.name, params)


def model_param(model: ModelConfig, key: str):
  """A model builder argument: the config's value or the builder's default."""
  if key in model.params:
    return model.params[key]
  parameter = model_signature(model.name).parameters.get(key)
  if parameter is None or parameter.default is inspect.Parameter.empty:
    raise ConfigError(f"task.model {model.name!r} has no {key!r} argument.")
  return parameter.default


def token_losses(logits: tf.Tensor, targets: tf.Tensor, label_smoothing: float = 0.0):
  """Per-token (label-smoothed) cross-entropy and the unsmoothed negative log-likelihood.

  Label smoothing as in Tensor2Tensor / Model Garden: the target distribution
  puts 1 - s on the true token and s / (V - 1) on each other one, and the
  entropy of that distribution is subtracted, so a perfect prediction costs 0.

  Args:
    logits: float [B, T, V] (computed in float32).
    targets: int [B, T] true ids.
    label_smoothing: s in [0, 1).

  Returns:
    (loss float32 [B, T], nll float32 [B, T]); the caller masks the padding.
  """
  logits = tf.cast(logits, tf.float32)
  vocab_size = logits.shape[-1]
  # From logsumexp and two reductions: no [B, T, V] log-probabilities kept for the gradient.
  log_normaliser = tf.reduce_logsumexp(logits, axis=-1)
  true_logit = tf.gather(logits, tf.cast(targets, tf.int32), axis=-1, batch_dims=2)
  nll = log_normaliser - true_logit
  if not label_smoothing:
    return nll, nll
  confidence = 1.0 - label_smoothing
  low = label_smoothing / (vocab_size - 1)
  sum_log_probs = tf.reduce_sum(logits, axis=-1) - vocab_size * log_normaliser
  cross_entropy = confidence * nll - low * (sum_log_probs + nll)
  entropy = -(confidence * np.log(confidence) + (vocab_size - 1) * low * np.log(low))
  return cross_entropy - float(entropy), nll


def token_sums(targets: tf.Tensor, logits: tf.Tensor, label_smoothing: float):
  """(loss sum, number of real tokens, nll sum, correct tokens) over targets != 0, float32."""
  weights = tf.cast(tf.not_equal(targets, text_lib.PAD_ID), tf.float32)
  loss, nll = token_losses(logits, targets, label_smoothing)
  correct, _ = token_accuracy(targets, logits)
  return (tf.reduce_sum(loss * weights), tf.reduce_sum(weights), tf.reduce_sum(nll * weights),
          correct)


def token_accuracy(targets: tf.Tensor, logits: tf.Tensor):
  """(correct argmax predictions, real tokens) over targets != 0, float32 scalars."""
  weights = tf.cast(tf.not_equal(targets, text_lib.PAD_ID), tf.float32)
  correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32),
                             tf.cast(targets, tf.int32)), tf.float32)
  return tf.reduce_sum(correct * weights), tf.reduce_sum(weights)


def tokens_per_step(num_tokens: tf.Tensor):
  """A metric pair whose mean over steps is the GLOBAL real tokens per step."""
  context = tf.distribute.get_replica_context()
  replicas = context.num_replicas_in_sync if context is not None else 1
  return num_tokens, tf.constant(1.0 / replicas)


def source_dataset(data: DataConfig, training: bool, input_context, split: Optional[str] = None
                   ) -> tf.data.Dataset:
  """Undecoded elements of `data`'s source (optionally another split), this pipeline's share."""
  if split is not None:
    data = dataclasses.replace(data, split=split)
  return DATASETS.get(data.source)(data, training, input_context)


def mixed_source(data: DataConfig, input_context, second_split: str, share: float
                 ) -> tf.data.Dataset:
  """`data.split` and `second_split` of the same source, each shuffled and repeated, mixed.

  A share `share` of the elements comes from `second_split` (e.g. the whole
  sentences of the dictionary, oversampled), the rest from `data.split`.
  """
  def endless(dataset):
    # Shuffled in full before mixing: text sources are often sorted (the dictionary is).
    size = int(dataset.cardinality())
    buffer = size if size > 0 else max(data.shuffle_buffer, 1)
    return dataset.shuffle(min(buffer, 1_000_000), seed=data.seed,
                           reshuffle_each_iteration=True).repeat()

  main = endless(source_dataset(data, True, input_context))
  try:
    second = endless(source_dataset(data, True, input_context, second_split))
  except ValueError as e:
    raise ConfigError(f"task.oversample_sentences needs split {second_split!r} "
                      f"(task.sentences_split) of source {data.source!r}: {e}") from None
  return tf.data.Dataset.sample_from_datasets([main, second], weights=[1.0 - share, share],
                                              seed=data.seed)


class TextTask(Task):
  """The part of a token-level text task that translation and language modeling share.

  The config has `vocab_path`, `model`, `packing`, `pack_window`,
  `label_smoothing`, `oversample_sentences` and `sentences_split`.
  """

  def check_config(self, positive_keys: Sequence[str]) -> None:
    """ConfigError unless every `task.<key>` in positive_keys is >= 1 and the shares are valid."""
    cfg = self.config
    for key in positive_keys:
      if getattr(cfg, key) < 1:
        raise ConfigError(f"task.{key} must be >= 1, got {getattr(cfg, key)}.")
    if not 0.0 <= cfg.label_smoothing < 1.0:
      raise ConfigError(f"task.label_smoothing must be in [0, 1), got {cfg.label_smoothing}.")
    if not 0.0 <= cfg.oversample_sentences < 1.0:
      raise ConfigError(f"task.oversample_sentences is the share of training texts drawn from "
                        f"task.sentences_split, in [0, 1); got {cfg.oversample_sentences}.")

  @property
  def vocab(self) -> text_lib.SentencePieceVocab:
    return load_vocab(self.config.vocab_path)

  def required_files(self) -> Dict[str, str]:
    """The vocabulary: ids mean nothing with another one (fingerprinted in the model_dir)."""
    return {"task.vocab_path": self.config.vocab_path}

  def build_model(self) -> keras.Model:
    model = model_with_vocab_size(self.config.model, self.config.vocab_path)
    return create_model(model.name, **model.params)

  def model_vocab_size(self) -> int:
    """The model's vocabulary size (from the config, else from the vocabulary file)."""
    if "vocab_size" in self.config.model.params:
      return int(self.config.model.params["vocab_size"])
    return self.vocab.vocab_size

  # Inputs.

  def training_source(self, data: DataConfig, input_context) -> Optional[tf.data.Dataset]:
    """The undecoded training stream with `oversample_sentences` mixed in (None: plain reader)."""
    cfg = self.config
    if cfg.oversample_sentences <= 0:
      return None
    return mixed_source(data, input_context, cfg.sentences_split, cfg.oversample_sentences)

  def training_rows(self, dataset: tf.data.Dataset, lengths: Dict[str, int]) -> tf.data.Dataset:
    """Decoded id sequences -> (features, {"targets"}) rows of static lengths.

    Sequences longer than `lengths` are dropped (counted in the log); the rest
    are packed several to a row (segment ids, positions) or padded.
    """
    cfg = self.config
    dataset = text_lib.filter_by_length(dataset, lengths)
    if cfg.packing:
      dataset = text_lib.pack_dataset(dataset, lengths, window_size=cfg.pack_window)
    else:
      dataset = text_lib.pad_to_length(dataset, lengths)
    return dataset.map(lambda f: (f, {"targets": f["targets"]}))

  def token_dataset(self, data: DataConfig, decode, lengths: Dict[str, int], training: bool,
                    eval_row, input_context) -> tf.data.Dataset:
    """The batched rows of `data`: each element decoded to id sequences by `decode`, then
    training rows (`training_rows`, with `oversample_sentences` mixed in) or, for
    evaluation, every sequence padded or cut to `lengths` and made a row by `eval_row`
    (features dict -> (features, labels))."""
    def transform(dataset):
      if training:
        return self.training_rows(dataset, lengths)
      # Evaluation: every row, truncated if it must be (counted in the log).
      return text_lib.pad_to_length(dataset, lengths, truncate=True).map(eval_row)

    source = self.training_source(data, input_context) if training else None
    return pipeline.build_dataset(data, decode, training=training, input_context=input_context,
                                  dataset=source, transform=transform)

  def synthetic_ids(self, length: int, seed: int, real: int) -> tf.Tensor:
    """int32 [length]: `real` random ids ending in EOS, then padding."""
    values = tf.random.stateless_uniform([length], [seed, 7], 3, self.model_vocab_size(),
                                         tf.int32)
    values = tf.where(tf.range(length) == real - 1, text_lib.EOS_ID, values)
    return tf.where(tf.range(length) < real, values, 0)

  def synthetic_train(self, features: Dict[str, tf.Tensor], split: str, input_context
                      ) -> tf.data.Dataset:
    """Training batches of `features` (one row each), as packing lays two texts in a row."""
    if self.config.packing:
      for key in list(features):
        length = int(features[key].shape[0])
        first = tf.range(length) < length // 2
        features[key + text_lib.SEGMENT_SUFFIX] = tf.where(first, 1, 2)
        features[key + text_lib.POSITION_SUFFIX] = tf.where(
            first, tf.range(length), tf.range(length) - length // 2)
    batch = pipeline.per_replica_batch_size(self.data_config(split), input_context)
    return pipeline.synthetic_dataset((features, {"targets": features["targets"]}), batch)

  def synthetic_eval(self, element: Tuple, split: str, input_context) -> tf.data.Dataset:
    """Evaluation batches of (features, labels): the split's count of real ones, then padding."""
    data = self.data_config(split)
    batch = pipeline.per_replica_batch_size(data, input_context)
    dataset = pipeline.synthetic_dataset(element + (tf.constant(1.0),), batch)
    count = max(1, (data.num_examples or batch) // batch)
    padding = tf.nest.map_structure(tf.zeros_like, next(iter(dataset)))
    return dataset.take(count).concatenate(tf.data.Dataset.from_tensors(padding).repeat())

  # Loss and metrics.

  def loss(self, labels, outputs) -> LossResult:
    """((label-smoothed) cross-entropy summed over real target tokens, number of them).

    The aux {"correct", "tokens"} (float32 scalars, from the same pass) is what
    `metrics` reports.
    """
    loss_sum, tokens, _, correct = token_sums(labels["targets"], outputs,
                                              self.config.label_smoothing)
    return LossResult((loss_sum, tokens), {"correct": correct, "tokens": tokens})

  def metrics(self, labels, outputs, weights, aux=None):
    """Token accuracy and the global real tokens per step (from `aux` when given)."""
    del weights  # Padding examples have all-zero targets: no tokens count.
    if aux is None:
      correct, tokens = token_accuracy(labels["targets"], outputs)
    else:
      correct, tokens = aux["correct"], aux["tokens"]
    return {"accuracy": (correct, tokens), "tokens_per_step": tokens_per_step(tokens)}

  def metric_directions(self):
    """Token losses and perplexities lower, accuracy higher."""
    return dict(super().metric_directions(), accuracy=HIGHER, nll=LOWER, perplexity=LOWER)
