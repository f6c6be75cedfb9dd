"""Language modeling: next-token cross-entropy and perplexity; sampling from a prompt.

    tpu-models train official/transformer/de_en_dictionary_lm.yaml --model-dir runs/lm
    tpu-models sample official/transformer/de_en_dictionary_lm.yaml --model-dir runs/lm \\
        --prompt "The weather" --top-k 40

The text is one string feature of a text source: one side of a parallel corpus
(`text_feature: targets`, the English side of de_en_dictionary) or the lines
of plain text files (source `text_lines`, feature "text"). It is tokenized in
the input pipeline by the SentencePiece model at `task.vocab_path` (no BOS:
position 0 predicts the first token from the start id 0; EOS ends each text).

  train  texts longer than max_length tokens are dropped (counted in the log);
         several texts are packed per row (`packing: true`; segment ids and
         positions, attention never crosses texts) or each is padded.
  eval   every text once, padded (a longer one is cut and counted).

Loss: token cross-entropy summed over real tokens, as a (sum, tokens) pair.
Metrics: token accuracy; in evaluation "perplexity" = exp(loss), and with
`unigram_baseline: true` the perplexity of a unigram model of the training
split under the same tokenizer ("unigram_perplexity", add-one smoothed), on
exactly the same tokens.

Serving (`tpu-models export`): `serving_default(prompts: tf.string [N])`
continues each prompt greedily and `sample_top_k(prompts)` by top-k sampling;
both return {"texts": prompt + continuation, "continuations": tf.string [N]}.
"""

import dataclasses
import sys
from typing import Any, Dict, List, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from tpu_models.config import DataConfig, ModelConfig
from tpu_models.data import pipeline
from tpu_models.text import inputs as text_lib
from tpu_models.errors import ConfigError
from tpu_models.registry import register_dataset, register_task
from tpu_models.text import task as text_task
from tpu_models.task import LOWER, Sampler, Servable
from tpu_models.text.task import TextTask

SAMPLE_METHODS = ("greedy", "top_k")


@dataclasses.dataclass
class LanguageModelingConfig(text_task.TextTaskConfig):
  name: str = "language_modeling"
  model: ModelConfig = dataclasses.field(
      default_factory=lambda: ModelConfig("transformer_lm_tiny"))
  # The string feature modelled: "targets" / "inputs" of a parallel source, "text" of text_lines.
  text_feature: str = "targets"
  max_length: int = 64  # Tokens per row, EOS included. Longer training texts are dropped.
  label_smoothing: float = 0.0
  unigram_baseline: bool = False  # Also report a unigram model's perplexity (see docstring).
  # Sampling defaults (`tpu-models sample`, exported signatures).
  prompt_max_length: int = 32  # Prompt tokens kept (the last ones).
  sample_max_new_tokens: int = 32
  sample_top_k: int = 40
  sample_temperature: float = 1.0


@register_dataset("text_lines")
def text_lines_source(config: DataConfig, training: bool,
                      input_context: Optional[tf.distribute.InputContext]) -> tf.data.Dataset:
  """{"text": tf.string []}: the non-blank lines of the UTF-8 text files at `config.path`.

  Files are sharded per input pipeline (every n-th file).
  """
  lines = pipeline.read_files(
      config, lambda f: tf.data.TextLineDataset(f, buffer_size=1 << 20), training=training,
      input_context=input_context, expected="UTF-8 text files, one text a line")
  lines = lines.filter(lambda line: tf.strings.length(tf.strings.strip(line)) > 0)
  return lines.map(lambda line: {"text": line})


@register_task("language_modeling")
class LanguageModelingTask(TextTask, Servable, Sampler):
  """Decoder-only language modeling with a `transformer_lm*` model; see the module docstring."""

  config_class = LanguageModelingConfig

  def __init__(self, config: LanguageModelingConfig):
    super().__init__(config)
    self.check_config(("max_length", "pack_window", "prompt_max_length",
                       "sample_max_new_tokens", "sample_top_k"))
    model_max = int(text_task.model_param(config.model, "max_length"))
    if config.prompt_max_length + config.sample_max_new_tokens > model_max:
      raise ConfigError(f"task.prompt_max_length + task.sample_max_new_tokens = "
                        f"{config.prompt_max_length + config.sample_max_new_tokens} exceeds the "
                        f"model's max_length {model_max}.")
    self._unigram = None
    self._generate_fns = {}

  # Inputs.

  def _text(self, element) -> tf.Tensor:
    feature = self.config.text_feature
    if not isinstance(element, dict) or feature not in element:
      have = sorted(element) if isinstance(element, dict) else type(element).__name__
      raise ConfigError(f"task.text_feature {feature!r} is not a feature of the source; it has "
                        f"{have}.")
    return element[feature]

  def build_inputs(self, split: str,
                   input_context: Optional[tf.distribute.InputContext] = None) -> tf.data.Dataset:
    """Per-replica batches: ({"targets": int32 [B, L]} (+ packing keys), {"targets"})
    for 'train', plus a mask [B] otherwise. Source "synthetic": `synthetic_inputs`."""
    cfg = self.config
    data = self.data_config(split)
    if data.source == "synthetic":
      return self.synthetic_inputs(split, input_context)
    training = split == "train"
    vocab = self.vocab
    lengths = {"targets": cfg.max_length}

    @tf.autograph.experimental.do_not_convert  # A wrong text_feature raises ConfigError as is.
    def decode(element):
      return {"targets": vocab.encode(self._text(element))}

    return self.token_dataset(data, decode, lengths, training,
                              lambda f: (f, {"targets": f["targets"]}), input_context)

  def synthetic_inputs(self, split: str,
                       input_context: Optional[tf.distribute.InputContext] = None
                       ) -> tf.data.Dataset:
    """Batches of the configured shapes from random ids: no vocabulary or data needed."""
    length = self.config.max_length
    if split == "train":
      return self.synthetic_train({"targets": self.synthetic_ids(length, 3, length)}, split,
                                  input_context)
    ids = self.synthetic_ids(length, 3, length // 2)
    return self.synthetic_eval(({"targets": ids}, {"targets": ids}), split, input_context)

  # Loss, accuracy and tokens_per_step come from TextTask.

  @tf.autograph.experimental.do_not_convert  # Plain TF inside; see translation.eval_step.
  def eval_step(self, model, features, labels, weights):
    """Loss and accuracy; with unigram_baseline also the unigram model's loss on the same tokens."""
    del weights
    targets = labels["targets"]
    logits = model(features, training=False)
    loss_sum, tokens, nll_sum, correct = text_task.token_sums(
        targets, logits, self.config.label_smoothing)
    sums = {"loss": (loss_sum, tokens), "accuracy": (correct, tokens)}
    if self.config.label_smoothing:
      sums["nll"] = (nll_sum, tokens)
    if self.config.unigram_baseline:
      real = tf.cast(tf.not_equal(targets, text_lib.PAD_ID), tf.float32)
      unigram_nll = -tf.gather(tf.constant(self.unigram_log_probs()), targets)
      sums["unigram_nll"] = (tf.reduce_sum(unigram_nll * real), tokens)
    return sums, None

  def eval_metric_names(self) -> List[str]:
    names = ["loss", "accuracy", "examples", "perplexity"]
    if self.config.label_smoothing:
      names.append("nll")
    if self.config.unigram_baseline:
      names += ["unigram_nll", "unigram_perplexity"]
    return names

  def metric_directions(self):
    return dict(super().metric_directions(), unigram_nll=LOWER, unigram_perplexity=LOWER)

  def derived_metrics(self, metrics: Dict[str, float]) -> Dict[str, float]:
    out = {}
    nll = metrics.get("nll", metrics.get("loss"))
    if nll is not None:
      out["perplexity"] = float(np.exp(min(nll, 50.0)))
    if "unigram_nll" in metrics:
      out["unigram_perplexity"] = float(np.exp(min(metrics["unigram_nll"], 50.0)))
    return out

  @tf.autograph.experimental.do_not_convert
  def unigram_log_probs(self) -> np.ndarray:
    """float32 [V]: add-one smoothed unigram log-probabilities of the training split's tokens.

    Counted once per task over `train_data.split` (not oversampled), with the
    same tokenizer and feature as the model sees, EOS included.
    """
    if self._unigram is None:
      with tf.init_scope():  # Counted eagerly, also when first asked inside the eval step.
        self._unigram = self._count_unigrams()
    return self._unigram

  def _count_unigrams(self) -> np.ndarray:
    vocab = self.vocab
    data = self.config.train_data
    dataset = text_task.source_dataset(data, False, None)
    if data.num_examples:
      dataset = dataset.take(data.num_examples)
    counts = np.zeros([vocab.vocab_size], np.int64)
    texts = dataset.map(self._text).batch(4096)
    for ids in texts.map(lambda t: vocab.encode(t).flat_values).as_numpy_iterator():
      counts += np.bincount(ids, minlength=vocab.vocab_size)
    counts[text_lib.PAD_ID] = 0  # Never a target; no probability mass.
    smoothed = (counts + 1.0) * (np.arange(vocab.vocab_size) != text_lib.PAD_ID)
    with np.errstate(divide="ignore"):
      log_probs = np.log(smoothed / smoothed.sum())
    print(f"unigram baseline: {int(counts.sum()):,} tokens of {data.source} split "
          f"{data.split!r} ({self.config.text_feature}) counted.", file=sys.stderr, flush=True)
    return np.where(np.isfinite(log_probs), log_probs, 0.0).astype(np.float32)

  # Sampling.

  def _generate_fn(self, model: keras.Model, max_new_tokens: int, method: str, top_k: int,
                   temperature: float, seed: Optional[int]):
    """tf.function: prompts tf.string [N] -> {"texts", "continuations"} tf.string [N]."""
    if method not in SAMPLE_METHODS:
      raise ValueError(f"method must be one of {SAMPLE_METHODS}, got {method!r}.")
    cfg = self.config
    vocab = self.vocab
    length = cfg.prompt_max_length

    def generate(prompts):
      ids = vocab.encode(prompts)[:, :-1]  # No EOS: the text goes on.
      ids = ids[:, -length:]  # The last tokens of a long prompt.
      prompt_ids = tf.cast(ids.to_tensor(default_value=text_lib.PAD_ID, shape=[None, length]),
                           tf.int32)
      prompt_lengths = tf.cast(ids.row_lengths(), tf.int32)
      sequences = model.generate(prompt_ids, max_new_tokens=max_new_tokens, method=method,
                                 top_k=top_k, temperature=temperature, seed=seed)
      generated = tf.range(length + max_new_tokens)[tf.newaxis] >= prompt_lengths[:, tf.newaxis]
      continuation = tf.ragged.boolean_mask(sequences, generated)
      # Prompt ids are left-aligned: drop the padding between prompt and continuation.
      whole = tf.ragged.boolean_mask(sequences, generated | (sequences != text_lib.PAD_ID))
      return {"texts": vocab.decode(whole), "continuations": vocab.decode(continuation)}

    return tf.function(generate, autograph=False, input_signature=[tf.TensorSpec([None], tf.string,
                                                                name="prompts")])

  def sample(self, model: keras.Model, prompts: Sequence[str], max_new_tokens: Optional[int] = None,
             top_k: Optional[int] = None, temperature: Optional[float] = None,
             seed: Optional[int] = None) -> List[str]:
    """Each prompt continued: greedy when top_k is None, else top-k sampling.

    Args:
      model: a `transformer_lm*` model.
      prompts: Python strings.
      max_new_tokens: tokens to generate (default task.sample_max_new_tokens).
      top_k, temperature: top-k sampling (None: greedy decoding).
      seed: for reproducible sampling.

    Returns:
      The prompts followed by their continuations, detokenised.
    """
    cfg = self.config
    max_new_tokens = max_new_tokens or cfg.sample_max_new_tokens
    method = "greedy" if top_k is None else "top_k"
    key = (id(model), max_new_tokens, method, top_k or cfg.sample_top_k,
           cfg.sample_temperature if temperature is None else temperature, seed)
    if key not in self._generate_fns:  # One trace per setting.
      self._generate_fns[key] = self._generate_fn(model, *key[1:])
    fn = self._generate_fns[key]
    texts = fn(tf.constant(list(prompts), tf.string))["texts"].numpy()
    return [t.decode("utf-8") for t in texts]

  def serving_signatures(self, model: keras.Model) -> Dict[str, Any]:
    """Prompts in, prompt + continuation out: greedy (serving_default) and top-k (sample_top_k)."""
    cfg = self.config
    model.serving_vocab = self.vocab  # Tracked with the model: the SavedModel carries it.
    greedy = self._generate_fn(model, cfg.sample_max_new_tokens, "greedy", 1, 1.0, None)
    top_k = self._generate_fn(model, cfg.sample_max_new_tokens, "top_k", cfg.sample_top_k,
                              cfg.sample_temperature, None)
    return {"serving_default": greedy.get_concrete_function(),
            "sample_top_k": top_k.get_concrete_function()}
