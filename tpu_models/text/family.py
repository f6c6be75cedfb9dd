"""The text family (Transformer translation and language models): what it registers and where,
read without importing it."""

from tpu_models.registry import Family, Module

FAMILY = Family(
    "text",
    modules=(
        Module("tpu_models.text.transformer", models=("transformer*",)),
        Module("tpu_models.text.translation", tasks=("translation",)),
        Module("tpu_models.text.language_modeling", tasks=("language_modeling",),
               datasets=("text_lines",)),
        Module("tpu_models.text.sources",
               datasets=("de_en_dictionary", "tsv", "text_tfrecord", "wmt14_de_en")),
    ),
    cli="tpu_models.text.cli",
    extra="text", extra_packages=("sentencepiece", "sacrebleu"),
    weights=("tpu_models.text.pretrained",))
