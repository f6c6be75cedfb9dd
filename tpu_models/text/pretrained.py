"""The text family's importers and catalogue entries (Model Garden's WMT Transformer)."""

from tpu_models.text import model_garden  # noqa: F401 (registers its importer)
from tpu_models.weights.catalogue import LabelSet, RemoteFile, WeightsEntry, register_weights

register_weights(WeightsEntry(
    name="model_garden_wmt_transformer_base", family="transformer", source_format="model_garden",
    download="Model Garden official/nlp (translation task, wmt_transformer/large experiment "
             "family): a Seq2SeqTransformer TF2 checkpoint directory and its SentencePiece "
             "model; see docs/migrating_from_model_garden.md",
    files=("a TF2 checkpoint directory: checkpoint + ckpt-N.index + ckpt-N.data-*",), model="transformer_base",
    remote=RemoteFile(url="", published="nothing to hash: Model Garden publishes no checkpoint "
                                        "of this experiment (its own training's checkpoint "
                                        "imports with `tpu-models weights import`)"),
    params={"pre_layer_norm": True, "share_embeddings": True},
    task={"name": "translation"},
    labels=LabelSet("sentencepiece vocabulary", 0,
                    needed="the checkpoint's own SentencePiece .model (task.vocab_path); "
                           "task.model.vocab_size must equal its size"),
    notes="Only Model Garden's translation defaults map (norm_first=True, use_bias=False, "
          "norm_epsilon=1e-6); pass --set task.vocab_path=... and the vocab_size. Published "
          "BLEU: none (official/nlp/MODEL_GARDEN.md lists wmt_transformer/large as a "
          "from-scratch WMT14 en-de experiment with its SentencePiece model, no score); "
          "score yours with `tpu-models evaluate` on newstest2014."))
