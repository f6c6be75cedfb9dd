"""`GET /metrics`: the replica's counters in Prometheus' text format.

    tpu_models_requests_total{route, code}          requests answered, by route and status
    tpu_models_request_errors_total{route, code}    those answered with a status >= 400
    tpu_models_request_seconds{route}               latency histogram (inside the replica)
    tpu_models_batch_size{model}                    requests' rows per model call (histogram)
    tpu_models_model_calls_total{model}             calls of the model's runtime
    tpu_models_padding_rows_total{model}            rows added to reach a static batch size
    tpu_models_version_served{model}                the version unnamed requests get
    tpu_models_versions_refused_total{model}        versions refused (damaged, incomplete)

`route` is the route's pattern (e.g. `/v1/models/{name}:predict`), never the URL, so
a client cannot grow the label set. Each replica counts its own requests; a scrape is
answered by one replica (label `replica`), so with several replicas scrape each, or
sum what Ray's own metrics export.
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServingMetrics:
  """The counters of one replica, in a registry of their own (not the process's default)."""

  def __init__(self, replica: str):
    self.registry = CollectorRegistry()
    labels = {"replica": replica}
    self.requests = Counter("tpu_models_requests", "Requests answered, by route and status code.",
                            ["route", "code"], registry=self.registry).labels
    self.errors = Counter("tpu_models_request_errors",
                          "Requests answered with a status >= 400, by route and code.",
                          ["route", "code"], registry=self.registry).labels
    self.latency = Histogram("tpu_models_request_seconds", "Seconds from request to answer "
                             "inside the replica, by route.", ["route"],
                             buckets=_LATENCY_BUCKETS, registry=self.registry).labels
    self.batch_size = Histogram("tpu_models_batch_size", "Requests' rows per model call "
                                "(batched requests together, padding not counted).", ["model"],
                                buckets=_BATCH_BUCKETS, registry=self.registry).labels
    self.model_calls = Counter("tpu_models_model_calls", "Calls of the model's runtime.",
                               ["model"], registry=self.registry).labels
    self.padding_rows = Counter("tpu_models_padding_rows", "Rows added (the last row repeated) "
                                "to reach a batch size a static-shape export runs at.",
                                ["model"], registry=self.registry).labels
    self.version_served = Gauge("tpu_models_version_served", "The version a request naming no "
                                "version gets.", ["model"], registry=self.registry).labels
    self.refused = Counter("tpu_models_versions_refused", "Versions refused (damaged or "
                           "incomplete).", ["model"], registry=self.registry).labels
    self.replica = Gauge("tpu_models_replica_info", "This replica.", ["replica"],
                         registry=self.registry).labels(**labels)
    self.replica.set(1)

  def observe(self, route: str, code: int, seconds: float) -> None:
    """Counts one answered request."""
    self.requests(route=route, code=str(code)).inc()
    if code >= 400:
      self.errors(route=route, code=str(code)).inc()
    self.latency(route=route).observe(seconds)

  def model_call(self, model: str, rows: int, batch: int) -> None:
    """Counts one call of a model's runtime: `rows` of requests run as a batch of `batch`."""
    self.model_calls(model=model).inc()
    self.batch_size(model=model).observe(rows)
    if batch > rows:
      self.padding_rows(model=model).inc(batch - rows)

  def text(self) -> bytes:
    return generate_latest(self.registry)
