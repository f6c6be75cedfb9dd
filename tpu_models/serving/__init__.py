"""`tpu-models serve MODEL_BASE`: exports behind TF Serving's REST API and the v2 protocol,
on Ray Serve (docs/serving.md).

    tpu-models serve runs/served/fm [NAME=MODEL_BASE ...] [--port 8501] [--address auto]

One job per module:

    repository.py     MODEL_BASE: numbered versions, their validation (export.json, the
                      sha256 of every recorded file), serving.yaml (labels, the default
                      version), and writing the next version atomically (`--to`)
    servable.py       one loaded version: its signatures' tensor specs, a batched call,
                      the warm-up
    protocol_rest.py  TF Serving's REST API: predict bodies, status and metadata JSON
    protocol_v2.py    the Open Inference Protocol (KServe v2, Triton's HTTP/REST)
    metrics.py        the Prometheus text of /metrics
    page.py           the HTML page of GET /
    deployment.py     the Ray Serve deployment: routes, auth, body cap, @serve.batch, the
                      poller that swaps versions live
    server.py         Ray and Serve started (or joined), the application run until SIGTERM

Only `repository` (no TensorFlow, no Ray) is imported by `export --to` and the sweep;
the rest is imported by `tpu-models serve`, which needs the `serve` extra.
"""

INSTALL_SERVE = "pip install 'tpu-models[serve]' (or 'ray[serve]')"
