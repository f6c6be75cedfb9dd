"""The deployment API under its earlier module name; it lives in the `tpu_models.export` package.

Kept so that code importing `tpu_models.deploy` (`deploy.export_deployment`,
`deploy.ExportRunner`, ...) keeps working; new code imports `tpu_models.export`.
"""

from tpu_models.export import (CONFIG_FILE, DEFAULT_AGREEMENT_EXAMPLES,  # noqa: F401
                               DEFAULT_CALIBRATION_EXAMPLES, EXPORT_JSON, FLOAT_AGREEMENT_FLOOR,
                               FORMATS, LITERT_FILE, ONNX_OPSET, ExportRunner, NoRuntimeError,
                               SavedModelPath, check_format, evaluate_export, export_config_path,
                               export_deployment, litert_runtime, litert_runtime_label,
                               read_export)
