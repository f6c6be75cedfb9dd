"""Translation: label-smoothed token cross-entropy, beam search on device, sacreBLEU on the host.

    tpu-models vocab de_en_dictionary --output vocab/de_en_8k --vocab-size 8000
    tpu-models train official/transformer/de_en_dictionary.yaml --model-dir runs/de_en

Inputs are `{"inputs": tf.string, "targets": tf.string}` pairs from a text source
(tpu_models/text/sources.py: de_en_dictionary, tsv, text_tfrecord,
wmt14_de_en), tokenized in the input pipeline by a SentencePiece model
(`task.vocab_path`, pad 0 / EOS 1 / UNK 2) and given static shapes by the
shared reader's transform hook:

  train  drop pairs longer than max_input_length / max_target_length (counted
         in the log), then pack several pairs per row (`packing: true`, with
         segment ids and positions; attention never crosses pairs) or pad
         each pair to its own row. `oversample_sentences` mixes in a second
         split (the whole sentences of the dictionary) at a given share.
  eval   every pair once, padded (a longer one is truncated and counted),
         plus the reference text as UTF-8 bytes for BLEU.

Loss: label-smoothed cross-entropy summed over real target tokens, returned
as a (sum, number of real tokens) pair, so padding and packing never change
it and the Trainer normalises over all replicas. Metrics: token accuracy;
in evaluation also the unsmoothed token negative log-likelihood "nll" and
its perplexity.

Evaluation translates each batch by beam search inside the compiled eval step
(fixed shapes, XLA-compilable); the token ids and the reference bytes are
gathered to the host, where the hypotheses are detokenised and scored with
sacreBLEU (corpus BLEU and chrF on detokenised text; the signature is printed
once). Padding examples never reach the host metric.

Serving (`tpu-models export`): `serving_default(sentences: tf.string [N])`
returns `{"translations": tf.string [N], "scores": float32 [N]}`; the
tokenizer, the beam search and the detokenizer are all in the graph.
"""

import dataclasses
import sys
from typing import Any, Dict, List, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from tpu_models.config import DataConfig, ModelConfig, TaskConfig
from tpu_models.data import pipeline
from tpu_models.text import inputs as text_lib
from tpu_models.errors import ConfigError
from tpu_models.registry import register_task
from tpu_models.task import HIGHER, Sampler, Servable
from tpu_models.text.task import TextTask, model_param, token_sums


@dataclasses.dataclass
class TranslationConfig(TaskConfig):
  name: str = "translation"
  # vocab_size may be left out: it is read from the vocabulary at vocab_path.
  model: ModelConfig = dataclasses.field(default_factory=lambda: ModelConfig("transformer_tiny"))
  train_data: DataConfig = dataclasses.field(
      default_factory=lambda: DataConfig(source="de_en_dictionary", split="train",
                                         global_batch_size=64))
  eval_data: DataConfig = dataclasses.field(
      default_factory=lambda: DataConfig(source="de_en_dictionary", split="validation",
                                         global_batch_size=64, shuffle_buffer=0))
  # Evaluated once after training (`tpu-models train`), never for model selection.
  test_data: Optional[DataConfig] = None
  vocab_path: str = ""  # SentencePiece .model written by `tpu-models vocab`.
  max_input_length: int = 64  # Tokens, EOS included. Longer training pairs are dropped.
  max_target_length: int = 64
  # Evaluation rows (inputs and targets); longer pairs are cut, counted. 0 = the lengths above.
  eval_max_length: int = 0
  packing: bool = True  # Several training pairs per row (segment ids, positions).
  pack_window: int = 256  # Pairs considered together by the first-fit packer.
  label_smoothing: float = 0.1
  # Share of training pairs drawn from `sentences_split` of the same source (0 = off),
  # the rest from train_data.split: oversamples the whole sentences of the dictionary.
  oversample_sentences: float = 0.0
  sentences_split: str = "train_sentences"
  eval_bleu: bool = True  # Beam search + BLEU/chrF in every evaluation.
  beam_size: int = 4  # 1 = greedy.
  alpha: float = 0.6  # GNMT length penalty.
  # Decoded tokens; 0 = the eval input length + 50 (the paper's and Model Garden's
  # extra decode length), capped at the model's max_length.
  max_decode_length: int = 0
  reference_max_bytes: int = 512  # UTF-8 bytes of a reference carried to the host.
  bleu_tokenize: str = "13a"  # sacrebleu tokenizer (the WMT standard).


def text_to_bytes(text: tf.Tensor, max_bytes: int) -> tf.Tensor:
  """tf.string [] -> int32 [max_bytes]: the UTF-8 bytes, 0-padded (cut at max_bytes).

  Strings cannot be all-gathered across replicas and hosts; bytes can.
  """
  raw = tf.strings.substr(text, 0, max_bytes)
  codes = tf.cast(tf.io.decode_raw(raw, tf.uint8), tf.int32)
  codes = tf.pad(codes, [[0, max_bytes - tf.size(codes)]])
  return tf.ensure_shape(codes, [max_bytes])


def bytes_to_text(codes: np.ndarray) -> str:
  """int [n] UTF-8 byte codes (0-padded) -> str."""
  codes = np.asarray(codes)
  codes = codes[:np.argmax(codes == 0)] if (codes == 0).any() else codes
  return codes.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


def encode_batch(vocab: text_lib.SentencePieceVocab, texts: tf.Tensor, length: int) -> tf.Tensor:
  """tf.string [N] -> int32 [N, length]: ids ending in EOS, 0-padded.

  A sequence longer than `length` is cut, keeping EOS as its last token.
  """
  ids = vocab.encode(texts)  # Ragged [N, (n + 1)], EOS last.
  dense = ids.to_tensor(default_value=text_lib.PAD_ID, shape=[None, length])
  cut = (ids.row_lengths() > length)[:, tf.newaxis] & tf.equal(tf.range(length), length - 1)
  return tf.cast(tf.where(cut, text_lib.EOS_ID, dense), tf.int32)


# ----------------------------------------------------------------------------
# The task.


@register_task("translation")
class TranslationTask(TextTask, Servable, Sampler):
  """Sequence-to-sequence translation with a `transformer*` model; see the module docstring."""

  config_class = TranslationConfig

  def __init__(self, config: TranslationConfig):
    super().__init__(config)
    self.check_config(("max_input_length", "max_target_length", "beam_size",
                       "reference_max_bytes", "pack_window"))
    for key in ("eval_max_length", "max_decode_length"):
      if getattr(config, key) < 0:
        raise ConfigError(f"task.{key} must be >= 0 (0: the default), got "
                          f"{getattr(config, key)}.")
    max_length = int(model_param(config.model, "max_length"))
    self.eval_input_length = config.eval_max_length or config.max_input_length
    self.eval_target_length = config.eval_max_length or config.max_target_length
    self.max_decode_length = (config.max_decode_length or
                              min(self.eval_input_length + 50, max_length))
    if self.max_decode_length > max_length:
      raise ConfigError(f"task.max_decode_length {self.max_decode_length} exceeds the model's "
                        f"max_length {max_length}; raise task.model.max_length or lower it.")
    self._signature_printed = False

  # Inputs.

  def build_inputs(self, split: str,
                   input_context: Optional[tf.distribute.InputContext] = None) -> tf.data.Dataset:
    """Per-replica batches; see the module docstring.

    Train: (features, labels) with features {"inputs" int32 [B, S], "targets"
    int32 [B, T]} (+ "*_segment_ids", "*_positions" int32 when packing) and
    labels {"targets": int32 [B, T]}. Eval/test: (features, labels, mask) with
    unpacked features and labels {"targets", "reference": int32 [B, R] UTF-8
    bytes of the reference text}. Source "synthetic": `synthetic_inputs`.
    """
    cfg = self.config
    data = self.data_config(split)
    if data.source == "synthetic":
      return self.synthetic_inputs(split, input_context)
    training = split == "train"
    vocab = self.vocab  # Fails early, with the `tpu-models vocab` hint.
    if training:
      lengths = {"inputs": cfg.max_input_length, "targets": cfg.max_target_length}
    else:
      lengths = {"inputs": self.eval_input_length, "targets": self.eval_target_length}

    def decode(element):
      out = {"inputs": vocab.encode(element["inputs"]),
             "targets": vocab.encode(element["targets"])}
      if not training:
        out["reference"] = text_to_bytes(element["targets"], cfg.reference_max_bytes)
      return out

    def transform(dataset):
      if training:
        return self.training_rows(dataset, lengths)
      # Evaluation: every pair, truncated if it must be (counted in the log).
      dataset = text_lib.pad_to_length(dataset, lengths, truncate=True)
      return dataset.map(lambda f: ({"inputs": f["inputs"], "targets": f["targets"]},
                                    {"targets": f["targets"], "reference": f["reference"]}))

    source = self.training_source(data, input_context) if training else None
    return pipeline.build_dataset(data, decode, training=training, input_context=input_context,
                                  dataset=source, transform=transform)

  def synthetic_inputs(self, split: str,
                       input_context: Optional[tf.distribute.InputContext] = None
                       ) -> tf.data.Dataset:
    """Batches of the configured shapes from random ids: no vocabulary or data needed."""
    cfg = self.config
    if split == "train":
      S, T = cfg.max_input_length, cfg.max_target_length
      features = {"inputs": self.synthetic_ids(S, 1, S), "targets": self.synthetic_ids(T, 2, T)}
      return self.synthetic_train(features, split, input_context)
    S, T = self.eval_input_length, self.eval_target_length
    features = {"inputs": self.synthetic_ids(S, 1, S // 2),
                "targets": self.synthetic_ids(T, 2, T // 2)}
    labels = {"targets": features["targets"],
              "reference": tf.fill([cfg.reference_max_bytes], 97)}
    return self.synthetic_eval((features, labels), split, input_context)

  # Metrics (the token loss, accuracy and tokens_per_step come from TextTask).

  # Plain TF inside (no Python control flow on tensors): autograph would spend
  # tens of seconds converting the model and the beam search for nothing.
  @tf.autograph.experimental.do_not_convert
  def eval_step(self, model, features, labels, weights):
    """Teacher-forced loss, accuracy and nll; with eval_bleu, beam search for the host."""
    cfg = self.config
    logits = model(features, training=False)
    loss_sum, tokens, nll_sum, correct = token_sums(labels["targets"], logits,
                                                    cfg.label_smoothing)
    sums = {"loss": (loss_sum, tokens), "accuracy": (correct, tokens), "nll": (nll_sum, tokens)}
    if not cfg.eval_bleu:
      return sums, None
    decoded = model.translate(features["inputs"], beam_size=cfg.beam_size, alpha=cfg.alpha,
                              max_decode_length=self.max_decode_length)
    return sums, {"hypotheses": decoded["ids"], "references": labels["reference"]}

  def aggregate(self, state, step_outputs, *, split):
    del split  # Every split is scored against its own references.
    state = state or {"hypotheses": [], "references": []}
    state["hypotheses"].append(step_outputs["hypotheses"])
    state["references"].append(step_outputs["references"])
    return state

  def finalize(self, state, *, split) -> Dict[str, float]:
    """sacreBLEU and chrF of the detokenised hypotheses against the reference texts."""
    if not state:
      return {}
    from tpu_models.text import bleu as bleu_lib
    hypotheses = self.detokenize(np.concatenate(state["hypotheses"]))
    references = np.concatenate(state["references"])
    cut = int(np.count_nonzero(references[:, -1]))
    references = [bytes_to_text(r) for r in references]
    result = bleu_lib.corpus_bleu(hypotheses, references, tokenize=self.config.bleu_tokenize)
    chrf = bleu_lib.corpus_chrf(hypotheses, references)
    if not self._signature_printed:
      self._signature_printed = True
      print(f"sacreBLEU signature: {result.signature}; chrF: {chrf.signature}", flush=True)
    if cut:
      print(f"Warning: {cut} of {len(references)} references were longer than "
            f"task.reference_max_bytes={self.config.reference_max_bytes} and were cut for BLEU.",
            file=sys.stderr, flush=True)
    return {"bleu": result.score, "chrf": chrf.score}

  def eval_metric_names(self) -> List[str]:
    names = ["loss", "accuracy", "nll", "examples", "perplexity"]
    return names + (["bleu", "chrf"] if self.config.eval_bleu else [])

  def metric_directions(self):
    return dict(super().metric_directions(), bleu=HIGHER, chrf=HIGHER)

  def derived_metrics(self, metrics: Dict[str, float]) -> Dict[str, float]:
    if "nll" in metrics:
      return {"perplexity": float(np.exp(min(metrics["nll"], 50.0)))}
    return {}

  # Text in, text out.

  def detokenize(self, ids: np.ndarray) -> List[str]:
    """int [N, L] ids (0-padded, EOS optional) -> N strings."""
    if len(ids) == 0:
      return []
    return [t.decode("utf-8") for t in self.vocab.decode(tf.constant(ids, tf.int32)).numpy()]

  def translate_texts(self, model: keras.Model, sentences: Sequence[str], batch_size: int = 32
                      ) -> List[str]:
    """Translates Python strings with beam search (the configured beam and alpha)."""
    translate = self._translate_fn(model)
    out = []
    for start in range(0, len(sentences), batch_size):
      chunk = tf.constant(list(sentences[start:start + batch_size]), tf.string)
      out += [t.decode("utf-8") for t in translate(chunk)["translations"].numpy()]
    return out

  def sample(self, model: keras.Model, prompts: Sequence[str], **unused) -> List[str]:
    """`tpu-models sample` on a translation model: the translations of the prompts."""
    del unused
    return self.translate_texts(model, prompts)

  def _translate_fn(self, model: keras.Model):
    cfg = self.config
    vocab = self.vocab

    def translate(sentences):
      # Bytes that are not UTF-8 become U+FFFD before the tokenizer (whose behaviour on
      # them is undefined); a blank sentence translates to "" (score 0), never to the
      # model's guess for an empty input.
      sentences = tf.strings.unicode_transcode(sentences, "UTF-8", "UTF-8", errors="replace")
      blank = tf.equal(tf.strings.length(tf.strings.strip(sentences)), 0)
      inputs = encode_batch(vocab, sentences, self.eval_input_length)
      decoded = model.translate(inputs, beam_size=cfg.beam_size, alpha=cfg.alpha,
                                max_decode_length=self.max_decode_length)
      translations = tf.strings.unicode_transcode(vocab.decode(decoded["ids"]), "UTF-8", "UTF-8",
                                                  errors="replace")
      return {"translations": tf.where(blank, "", translations),
              "scores": tf.where(blank, 0.0, decoded["scores"])}

    return tf.function(translate, autograph=False, input_signature=[
        tf.TensorSpec([None], tf.string, name="sentences")])

  def serving_signatures(self, model: keras.Model) -> Dict[str, Any]:
    """`serving_default(sentences: tf.string [N])` -> {"translations": tf.string [N],
    "scores": float32 [N]}: tokenizer, beam search and detokenizer in the graph.

    Sentences longer than the eval input length (eval_max_length, else
    max_input_length) tokens are cut. No input fails the batch: an empty or
    whitespace-only sentence translates to "" (score 0); bytes that are not
    UTF-8 are read as U+FFFD, and garbage (emoji, punctuation only) gets a
    best-effort translation. Translations are always valid UTF-8. An empty
    batch returns empty outputs. See docs/predict.md.
    """
    model.serving_vocab = self.vocab  # Tracked with the model: the SavedModel carries it.
    return {"serving_default": self._translate_fn(model).get_concrete_function()}
