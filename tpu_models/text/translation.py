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

Deployment (`tpu-models export --format litert|onnx`, tpu_models/export/): two float32
signatures with fixed shapes, the search and the tokenizer outside.
`encode(inputs: int32 [1, S])` returns the cross-attention keys and values of
every decoder layer and the padding bias; `decode_step(ids [R, 1], position [1],
the key/value cache [R, heads, L, head_size] per layer, encode's outputs)`
returns the logits [R, vocab] of the next position and the cache with this one
written (R = beam_size rows, L = the decode length). `evaluate_deployed` runs
the task's own beam search (sampling.search, as in the eval step) on the
host around `decode_step`, one sentence at a time, and scores it with the same
sacreBLEU as evaluation.
"""

import dataclasses
import sys
from typing import Annotated, Any, Dict, List, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from tpu_models.config import SIZE, ModelConfig
from tpu_models.data import pipeline
from tpu_models.text import inputs as text_lib
from tpu_models.errors import ConfigError
from tpu_models.registry import register_task
from tpu_models.errors import DataError
from tpu_models.task import HIGHER, Agreement, Deployable, DeployFunction, Sampler, Servable
from tpu_models.text.task import TextTask, TextTaskConfig, model_param, token_sums


@dataclasses.dataclass
class TranslationConfig(TextTaskConfig):
  name: str = "translation"
  model: ModelConfig = dataclasses.field(default_factory=lambda: ModelConfig("transformer_tiny"))
  max_input_length: int = 64  # Tokens, EOS included. Longer training pairs are dropped.
  max_target_length: int = 64
  # Evaluation rows (inputs and targets); longer pairs are cut, counted. 0 = the lengths above.
  eval_max_length: int = 0
  label_smoothing: float = 0.1
  eval_bleu: bool = True  # Beam search + BLEU/chrF in every evaluation.
  beam_size: Annotated[int, SIZE] = 4  # 1 = greedy.
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


# The export's agreement check compares at most this many sentences (`deployed_agreement`).
MAX_AGREEMENT_SENTENCES = 50


@register_task("translation")
class TranslationTask(TextTask, Servable, Sampler, Deployable):
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

    def eval_row(f):
      return ({"inputs": f["inputs"], "targets": f["targets"]},
              {"targets": f["targets"], "reference": f["reference"]})

    return self.token_dataset(data, decode, lengths, training, eval_row, input_context)

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
    return self._score(self.detokenize(np.concatenate(state["hypotheses"])),
                       np.concatenate(state["references"]))

  def _score(self, hypotheses: List[str], references: np.ndarray) -> Dict[str, float]:
    """sacreBLEU and chrF of N hypothesis strings against int [N, R] reference bytes."""
    from tpu_models.text import bleu as bleu_lib
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

  # Deployment: the encoder and one decoder step; the search and the tokenizer outside.

  def _deploy_shapes(self) -> Dict[str, int]:
    cfg = self.config
    return {"input_length": self.eval_input_length, "decode_length": self.max_decode_length,
            "rows": cfg.beam_size}

  def deploy_functions(self, model: keras.Model) -> Dict[str, DeployFunction]:
    """`encode` and `decode_step` (the module docstring), float32, fixed shapes.

    encode: inputs int32 [1, S] (S = eval input length) -> cross_key_<i>,
      cross_value_<i> float32 [1, heads, S, head_size] per decoder layer i and
      cross_bias float32 [1, 1, 1, S].
    decode_step: ids int32 [R, 1], position int32 [1], cache_key_<i> and
      cache_value_<i> float32 [R, heads, L, head_size], and encode's outputs ->
      logits float32 [R, vocab] and new_cache_key_<i>, new_cache_value_<i>.
    """
    shapes = self._deploy_shapes()
    length, decode_length, rows = (shapes["input_length"], shapes["decode_length"],
                                   shapes["rows"])
    layers = len(model.decoder_layers)
    heads, head_size = model.num_heads, model.hidden_size // model.num_heads
    memory_shape = f"[1, {heads}, {length}, {head_size}]"
    cache_shape = f"[{rows}, {heads}, {decode_length}, {head_size}]"
    cross_names = [f"cross_{kind}_{i}" for i in range(layers) for kind in ("key", "value")]
    cache_names = [f"cache_{kind}_{i}" for i in range(layers) for kind in ("key", "value")]

    def encode(inputs):
      cross = model.cross_memory(inputs)
      out = {"cross_bias": cross[0][2]}
      for i, (key, value, _) in enumerate(cross):
        out[f"cross_key_{i}"], out[f"cross_value_{i}"] = key, value
      return out

    cross_specs = [tf.TensorSpec([1, heads, length, head_size], tf.float32, name=name)
                   for name in cross_names]
    step_specs = ([tf.TensorSpec([rows, 1], tf.int32, name="ids"),
                   tf.TensorSpec([1], tf.int32, name="position")] +
                  [tf.TensorSpec([rows, heads, decode_length, head_size], tf.float32, name=name)
                   for name in cache_names] + cross_specs +
                  [tf.TensorSpec([1, 1, 1, length], tf.float32, name="cross_bias")])

    def decode_step(*tensors):
      named = dict(zip([spec.name for spec in step_specs], tensors))
      cache = {f"layer_{i}": {"key": named[f"cache_key_{i}"], "value": named[f"cache_value_{i}"]}
               for i in range(layers)}
      cross = [(named[f"cross_key_{i}"], named[f"cross_value_{i}"], named["cross_bias"])
               for i in range(layers)]
      logits, cache = model.decode_step(named["ids"], named["position"][0], cache, cross,
                                        group=rows)
      out = {"logits": logits}
      for i in range(layers):
        out[f"new_cache_key_{i}"] = cache[f"layer_{i}"]["key"]
        out[f"new_cache_value_{i}"] = cache[f"layer_{i}"]["value"]
      return out

    outside = (f"tokenization: SentencePiece ({self.config.vocab_path}) on the host: "
               f"ids ending in EOS (1), 0-padded or cut to {length}; padding (id 0) is "
               f"masked inside encode",
               f"the search: the host runs the task's beam search (beam_size "
               f"{self.config.beam_size}, alpha {self.config.alpha}; 1 = greedy) for up "
               f"to {decode_length} steps around decode_step, starting from id 0 at "
               f"position 0 with a zero cache, feeding each step's new_cache_* back as "
               f"cache_* (reordered with the beams)",
               "detokenization: SentencePiece on the host")
    no_int8 = ("the translator is exported in float32 only: an int8 decode_step (its key/value "
               "cache fed back and re-quantized at every step, the position encoding's SIN/COS) "
               "is not built")
    cross_text = {name: f"float32 {memory_shape}" for name in cross_names}
    cross_text["cross_bias"] = f"float32 [1, 1, 1, {length}]: 0 on tokens, -1e9 on padding"
    return {
        "encode": DeployFunction(
            function=tf.function(encode, autograph=False, input_signature=[
                tf.TensorSpec([1, length], tf.int32, name="inputs")]).get_concrete_function(),
            inputs={"inputs": f"int32 [1, {length}] SentencePiece ids, EOS (1) last, 0-padded"},
            outputs=cross_text, outside_graph=outside, no_int8=no_int8),
        "decode_step": DeployFunction(
            function=tf.function(decode_step, autograph=False,
                                 input_signature=step_specs).get_concrete_function(),
            inputs={"ids": f"int32 [{rows}, 1] the token at `position` of each beam",
                    "position": "int32 [1] the step, 0 first",
                    **{name: f"float32 {cache_shape} key/value cache" for name in cache_names},
                    **cross_text},
            outputs={"logits": f"float32 [{rows}, {model.vocab_size}] of position + 1",
                     **{f"new_{name}": f"float32 {cache_shape}, `position` written"
                        for name in cache_names}},
            outside_graph=outside, no_int8=no_int8),
    }

  def calibration_inputs(self, examples: int):
    """Never reached: deploy_functions' no_int8 refuses an int8 export before calibration."""
    raise ConfigError("task translation exports float32 only (--format litert or onnx).")

  def prepare_to_load_export(self) -> None:
    """The SavedModel's tokenizer ops (tensorflow_text's SentencePiece) get registered."""
    import tensorflow_text  # pylint: disable=g-import-not-at-top,unused-import

  def evaluate_deployed(self, run, split: str, *, say=None) -> Dict[str, float]:
    """BLEU and chrF of `split` through `run("encode" / "decode_step", ...)`.

    The evaluation pipeline's token ids and references, the task's own search
    (`sampling.search`: beam_size, alpha, max_decode_length as in evaluation)
    driving the exported decoder step one sentence at a time, and `finalize`'s
    sacreBLEU. A SavedModel export (`serving_default`, strings in and out) is
    given the split's sentences and scored the same way. `say` gets a line every
    100 sentences.
    """
    if "decode_step" not in getattr(run, "signatures", lambda: ["decode_step"])():
      return self._evaluate_serving(run, split, say)
    state, examples = None, 0
    for features, labels, mask in pipeline.until_padding(self.build_inputs(split)):
      real = mask.numpy() > 0
      inputs = features["inputs"].numpy()[real]
      hypotheses = np.stack([self._deployed_search(run, row) for row in inputs])
      state = self.aggregate(state, {"hypotheses": hypotheses,
                                     "references": labels["reference"].numpy()[real]},
                             split=split)
      before, examples = examples, examples + len(inputs)
      if say and examples // 100 > before // 100:
        say(f"{examples} sentences")
    if not examples:
      raise DataError(f"task.{split}_data yielded no examples to evaluate.")
    return dict(self.finalize(state, split=split), examples=float(examples))

  def deployed_agreement(self, reference, exported, examples: int,
                         split: str = "eval") -> Agreement:
    """Sentences of `split` whose searched token ids are the same through both.

    The task's own search (`_deployed_search`) drives `encode` / `decode_step` of each;
    the reference runs the unconverted functions in TensorFlow (the SavedModel holds
    the whole search under serving_default, not these steps). At most
    MAX_AGREEMENT_SENTENCES: each sentence is a whole search through each runtime.
    """
    examples = min(examples, MAX_AGREEMENT_SENTENCES)
    agreeing = total = 0
    for features, _, mask in pipeline.until_padding(self.build_inputs(split)):
      for row in features["inputs"].numpy()[mask.numpy() > 0][:examples - total]:
        ours, theirs = self._deployed_search(exported, row), self._deployed_search(reference, row)
        agreeing += int(np.array_equal(ours, theirs))
        total += 1
      if total >= examples:
        break
    if not total:
      raise DataError(f"task.{split}_data yielded no sentences to compare the export on.")
    return Agreement(agreeing, total, f"sentences' tokens of {split}")

  def _evaluate_serving(self, run, split: str, say) -> Dict[str, float]:
    """BLEU and chrF of `split` through `run("serving_default", {"sentences": ...})`."""
    cfg = self.config

    def decode(element):
      return ({"sentences": element["inputs"]},
              {"reference": text_to_bytes(element["targets"], cfg.reference_max_bytes)})

    hypotheses, references = [], []
    batches = pipeline.build_dataset(self.data_config(split), decode, training=False)
    for features, labels, mask in pipeline.until_padding(batches):
      real = mask.numpy() > 0
      out = run("serving_default", {"sentences": features["sentences"].numpy()[real]})
      hypotheses += [t.decode("utf-8") for t in out["translations"]]
      references.append(labels["reference"].numpy()[real])
      if say and len(hypotheses) // 100 > (len(hypotheses) - int(real.sum())) // 100:
        say(f"{len(hypotheses)} sentences")
    if not hypotheses:
      raise DataError(f"task.{split}_data yielded no examples to evaluate.")
    return dict(self._score(hypotheses, np.concatenate(references)),
                examples=float(len(hypotheses)))

  def _deployed_search(self, run, inputs: np.ndarray) -> np.ndarray:
    """int [S] source ids -> int32 [L] the search's best ids through the exported steps."""
    from tpu_models.text import sampling  # pylint: disable=g-import-not-at-top
    cfg = self.config
    cross = run("encode", {"inputs": np.asarray(inputs, np.int32)[np.newaxis]})
    layers = sum(name.startswith("cross_key_") for name in cross)
    _, heads, _, head_size = np.shape(cross["cross_key_0"])
    cache_shape = [1, heads, self.max_decode_length, head_size]
    cache = {f"cache_{kind}_{i}": tf.zeros(cache_shape, tf.float32)
             for i in range(layers) for kind in ("key", "value")}

    def step(ids, i, cache):
      out = run("decode_step", {"ids": ids.numpy().astype(np.int32),
                                "position": np.array([int(i)], np.int32),
                                **{name: value.numpy() for name, value in cache.items()},
                                **cross})
      return (tf.constant(out["logits"], tf.float32),
              {name: tf.constant(out[f"new_{name}"]) for name in cache})

    # Eager: the search's tf.while_loop runs as a Python loop calling the runtime.
    decoded = sampling.search(step, 1, cache, self.vocab.vocab_size,
                              beam_size=cfg.beam_size, alpha=cfg.alpha,
                              max_decode_length=self.max_decode_length)
    return decoded["ids"].numpy()[0]
