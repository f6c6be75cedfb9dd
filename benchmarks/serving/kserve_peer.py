"""The peer of `tpu-models serve` in benchmarks/serving/compare_serving.py: KServe's
`ModelServer` serving one SavedModel export through a small `kserve.Model`, v2 protocol.
Runs in the venv of benchmarks/serving/setup_kserve_venv.sh (kserve is never a dependency
of tpu_models):

    benchmarks/.venv-kserve/bin/python benchmarks/serving/kserve_peer.py EXPORT_DIR \
        [--name bench] [--port 8080]

EXPORT_DIR is one version (`MODEL_BASE/1`): loaded with `tf.saved_model.load`, its
`serving_default` called once per request on the request's rows (KServe's Python server
has no batcher of its own; in a cluster its batcher is a sidecar of the pod). The request:

    POST /v2/models/NAME/infer
    {"inputs": [{"name": "image_bytes", "shape": [N], "datatype": "BYTES",
                 "data": ["<base64 of an encoded JPEG/PNG>", ...]}]}

The pictures travel as base64 text because kserve 0.21's REST parser turns every BYTES
element into a UTF-8 string (`InferInput.set_data_from_numpy(..., binary_data=False)` in
`InferRequest.from_bytes`), which encoded images are not: a binary-extension BYTES input
of a PNG is refused. The answer: every output of the signature, as JSON.
"""

import argparse
import base64
import sys

import kserve
import numpy as np
import tensorflow as tf
from kserve.utils.numpy_codec import from_np_dtype


class SavedModelPeer(kserve.Model):
  """serving_default of the SavedModel at `path` as model `name` (one input: BYTES [N],
  base64 text of encoded pictures -> each output [N, ...])."""

  def __init__(self, name: str, path: str):
    super().__init__(name)
    self.path = path
    self.function = None
    self.load()

  def load(self) -> bool:
    self.function = tf.saved_model.load(self.path).signatures["serving_default"]
    (self.input_name,) = self.function.structured_input_signature[1]
    self.ready = True
    return self.ready

  def predict(self, payload: kserve.InferRequest, headers=None) -> kserve.InferResponse:
    rows = payload.inputs[0].as_numpy().reshape(-1)
    pictures = [base64.b64decode(row) for row in rows]
    answer = self.function(**{self.input_name: tf.constant(pictures)})
    outputs = []
    for name, tensor in sorted(answer.items()):
      array = np.asarray(tensor.numpy())
      output = kserve.InferOutput(name=name, shape=list(array.shape),
                                  datatype=from_np_dtype(array.dtype))
      output.set_data_from_numpy(array, binary_data=False)
      outputs.append(output)
    return kserve.InferResponse(response_id=payload.id or "", model_name=self.name,
                                infer_outputs=outputs)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("export_dir")
  parser.add_argument("--name", default="bench")
  parser.add_argument("--port", type=int, default=8080)
  args = parser.parse_args()
  model = SavedModelPeer(args.name, args.export_dir)
  kserve.ModelServer(http_port=args.port, enable_grpc=False,
                     enable_latency_logging=False).start([model])
  return 0


if __name__ == "__main__":
  sys.exit(main())
