"""Loading checkpoints of other model zoos into tpu_models models.

`tpu_models.migration.model_garden`: TF Model Garden (tf-models-official)
ResNet classifier, RetinaNet and Seq2SeqTransformer checkpoints.
"""
