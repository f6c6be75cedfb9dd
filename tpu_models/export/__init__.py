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

The names below are the public API (`from tpu_models import export`).
"""

from tpu_models.export.loading import load_model, newest_checkpoint, uses_average
from tpu_models.export.staging import refuse_existing_output, staged_output
from tpu_models.export.saved_model import export_saved_model, saved_model_digests
from tpu_models.export.record import (CONFIG_FILE, EXPORT_JSON, FORMATS, check_format,
                                      export_config_path, read_export)
from tpu_models.export.litert import LITERT_FILE, litert_runtime, litert_runtime_label
from tpu_models.export.onnx import ONNX_OPSET
from tpu_models.export.runtime import ExportRunner, NoRuntimeError
from tpu_models.export.agreement import (DEFAULT_AGREEMENT_EXAMPLES, FLOAT_AGREEMENT_FLOOR,
                                         SavedModelPath)
from tpu_models.export.deployment import (DEFAULT_CALIBRATION_EXAMPLES, evaluate_export,
                                          export_deployment)

__all__ = [
    "CONFIG_FILE", "DEFAULT_AGREEMENT_EXAMPLES", "DEFAULT_CALIBRATION_EXAMPLES", "EXPORT_JSON",
    "ExportRunner", "FLOAT_AGREEMENT_FLOOR", "FORMATS", "LITERT_FILE", "NoRuntimeError",
    "ONNX_OPSET", "SavedModelPath", "check_format", "evaluate_export", "export_config_path",
    "export_deployment", "export_saved_model", "litert_runtime", "litert_runtime_label",
    "load_model", "newest_checkpoint", "read_export", "refuse_existing_output",
    "saved_model_digests", "staged_output", "uses_average",
]
