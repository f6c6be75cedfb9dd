"""Exports of a trained model: SavedModel, LiteRT (float32, int8) and ONNX, and running them.

    tpu-models export CONFIG --model-dir D --output O [--format saved_model|litert|litert-int8|onnx]
    tpu-models evaluate-export O [--config CONFIG] [--split test]

Which module owns what:

    loading.py      the newest readable checkpoint of a model_dir, restored into the task's model
    saved_model.py  the SavedModel exporter (the task's serving signatures)
    freezing.py     a deploy function frozen into one plain graph (LiteRT and ONNX read it)
    litert.py       the LiteRT exporter (float32, int8 with calibration) and its interpreter
    onnx.py         the ONNX exporter (tf2onnx) and its load check
    staging.py      an export written beside its output, then put in place complete
    record.py       formats, export.json and config.yaml: what an export directory holds
    runtime.py      ExportRunner: an export run through its own runtime
    agreement.py    a LiteRT/ONNX export against the SavedModel path of the same weights
    deployment.py   the `export --format litert|litert-int8|onnx` and `evaluate-export` flows

The names below are the public API (`from tpu_models import export`), looked up when
used: nothing is imported eagerly, so `export.record` (no TensorFlow) serves the serving
repository and the sweep driver without loading TensorFlow.
"""

_LAZY = {
    "load_model": "loading", "newest_checkpoint": "loading", "uses_average": "loading",
    "refuse_existing_output": "staging", "staged_output": "staging",
    "export_saved_model": "saved_model", "saved_model_digests": "saved_model",
    "CONFIG_FILE": "record", "EXPORT_JSON": "record", "FORMATS": "record",
    "check_format": "record", "export_config_path": "record", "read_export": "record",
    "LITERT_FILE": "litert", "litert_runtime": "litert", "litert_runtime_label": "litert",
    "ONNX_OPSET": "onnx",
    "ExportRunner": "runtime", "NoRuntimeError": "runtime",
    "DEFAULT_AGREEMENT_EXAMPLES": "agreement", "FLOAT_AGREEMENT_FLOOR": "agreement",
    "SavedModelPath": "agreement",
    "DEFAULT_CALIBRATION_EXAMPLES": "deployment", "evaluate_export": "deployment",
    "export_deployment": "deployment",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
  if name in _LAZY:
    import importlib
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
