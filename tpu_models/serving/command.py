"""`tpu-models serve`'s arguments and entry; argparse only at import (the CLI builds its
parser before TensorFlow, Ray or Serve are imported)."""

import argparse
import math
import os
import re
import socket
import tempfile
from typing import Dict

DEFAULT_PORT = 8501  # TF Serving's REST port.


def add_arguments(parser: argparse.ArgumentParser) -> None:
  """The options of `tpu-models serve` (docs/serving.md)."""
  parser.add_argument("model_bases", nargs="+", metavar="MODEL_BASE",
                      help="a directory of numbered versions (MODEL_BASE/1/, 2/, ...: exports of "
                           "tpu-models export, written by export/sweep --to MODEL_BASE) or one "
                           "export; NAME=MODEL_BASE names it (default: the directory's name)")
  parser.add_argument("--name", default=None,
                      help="the model's name in the URLs, with one MODEL_BASE (default: its "
                           "directory's name)")
  parser.add_argument("--host", default="127.0.0.1",
                      help="address to listen on (default 127.0.0.1: this machine only; "
                           "0.0.0.0 for every interface)")
  parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                      help=f"HTTP port (default {DEFAULT_PORT}, TF Serving's REST port)")
  parser.add_argument("--address", default=None,
                      help="run on an existing Ray cluster: 'auto' (this machine is in it) or "
                           "ray://HOST:PORT (default: start Ray on this machine)")
  scale = parser.add_mutually_exclusive_group()
  scale.add_argument("--replicas", type=int, default=1,
                     help="replicas of the model server (default 1), each loading every model")
  scale.add_argument("--autoscale", default=None, metavar="MIN:MAX",
                     help="let Ray Serve scale the replicas between MIN and MAX by load")
  parser.add_argument("--replica-cpus", type=float, default=1.0,
                      help="CPUs each replica reserves; its TensorFlow threads (default 1)")
  parser.add_argument("--max-batch-size", type=int, default=16,
                      help="most concurrent requests run as one model call (default 16; 1 = "
                           "no batching)")
  parser.add_argument("--batch-timeout-ms", type=float, default=5.0,
                      help="how long a batch waits to fill (default 5 ms)")
  parser.add_argument("--max-ongoing-requests", type=int, default=128,
                      help="requests a replica holds at once; more wait in Ray Serve's queue "
                           "(default 128)")
  parser.add_argument("--poll-seconds", type=float, default=1.0,
                      help="how often MODEL_BASE is looked at for new versions and "
                           "serving.yaml (default 1, as TF Serving)")
  parser.add_argument("--auth-token-file", default=None,
                      help="a file holding a token: every route but health then needs "
                           "'Authorization: Bearer TOKEN' (else 401)")
  parser.add_argument("--max-body-bytes", type=int, default=64 * 1024 * 1024,
                      help="larger request bodies are refused with 413 (default 64 MiB)")
  parser.add_argument("--request-timeout-s", type=float, default=60.0,
                      help="Ray Serve's end-to-end timeout of one request (default 60)")
  parser.add_argument("--num-cpus", type=int, default=None,
                      help="without --address: CPUs of the local Ray (default: all)")
  parser.add_argument("--ingress", choices=("proxy", "haproxy"), default="proxy",
                      help="what takes the HTTP requests: Ray Serve's Python proxy (default), "
                           "or its HAProxy ingress (each replica serves HTTP itself behind "
                           "HAProxy: ~3x the requests/s on a small machine; HAProxy's stats "
                           "page and Prometheus exporter then also listen on every interface, "
                           "on ports printed at start). Not with --address")
  parser.set_defaults(environ=ray_environment)


# Ray Serve's own throughput settings (most of the set its RAY_SERVE_THROUGHPUT_OPTIMIZED
# turns on). User code and the router run on their process's event loop, not on a thread of
# their own (a hop per request); access-log lines are buffered rather than flushed per
# request; the garbage collector skips what existed at start-up. Left out: direct ingress
# (--ingress haproxy is that, with one endpoint) and gRPC between the proxy and the replicas
# (RAY_SERVE_USE_GRPC_BY_DEFAULT, which Ray's own constants call a testing switch).
# Measured in benchmarks/README.md ("Serving").
RAY_SERVE_SETTINGS = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1000",
    "RAY_SERVE_FREEZE_GC_ON_STARTUP": "1",
}


def ray_environment(args) -> Dict[str, str]:
  """The environment Ray's processes start with (set in this process before TensorFlow and
  Ray are imported; a variable the user set wins): RAY_SERVE_SETTINGS, and for `--ingress
  haproxy` Ray Serve's HAProxy ingress with ports and files of this server's own (Ray's
  defaults are fixed ports and /tmp paths every server on the machine would share).
  Records `args.haproxy_dir` and `args.haproxy_ports` for the server's messages and clean-up.
  """
  environ = dict(RAY_SERVE_SETTINGS)
  args.haproxy_dir, args.haproxy_ports = None, {}
  if getattr(args, "ingress", "proxy") != "haproxy" or args.address:
    return environ  # serve() refuses haproxy with --address (the cluster's Ray is set up).
  # Named by the port (whose server it is); short: Ray adds a 57-character folder, and a
  # socket's path may have 97 at most.
  folder = tempfile.mkdtemp(prefix=f"hap{args.port}_", dir="/tmp")
  ports = {"stats": _free_port(), "metrics": _free_port(), "fallback": _free_port()}
  args.haproxy_dir, args.haproxy_ports = folder, ports
  environ.update({
      "RAY_SERVE_ENABLE_HA_PROXY": "1",
      # Stopping drains each replica's own HTTP server this long (Ray's default 30 s).
      "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1",
      "RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S": str(math.ceil(args.request_timeout_s)),
      "RAY_SERVE_HAPROXY_STATS_PORT": str(ports["stats"]),
      "RAY_SERVE_HAPROXY_METRICS_PORT": str(ports["metrics"]),
      "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(ports["fallback"]),
      "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": os.path.join(folder, "haproxy.cfg"),
      "RAY_SERVE_HAPROXY_SOCKET_PATH": os.path.join(folder, "admin.sock"),
      "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": folder,
      "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": os.path.join(folder, "server-state"),
      "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": os.path.join(folder, "metrics.sock"),
  })
  return environ


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def models_of(args) -> dict:
  """{name: MODEL_BASE} of the arguments; a ConfigError for a bad or repeated name."""
  from tpu_models.errors import ConfigError  # pylint: disable=g-import-not-at-top
  if args.name and len(args.model_bases) > 1:
    raise ConfigError("--name names one model; with several MODEL_BASEs write NAME=MODEL_BASE "
                      "for each.")
  models = {}
  for text in args.model_bases:
    name, sep, base = text.partition("=")
    if not sep:
      name, base = args.name or os.path.basename(os.path.abspath(text)), text
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$", name):
      raise ConfigError(f"Model name {name!r} (from {text!r}) must be letters, digits, _ . - "
                        f"(it is a URL path segment); pass --name or NAME=MODEL_BASE.")
    if name in models:
      raise ConfigError(f"Two MODEL_BASEs are named {name!r}; name them: NAME=MODEL_BASE.")
    models[name] = os.path.abspath(base)
  return models


def run(args) -> int:
  """`tpu-models serve`: a one-line error (exit 2) without the `serve` extra."""
  from tpu_models.errors import MissingExtraError  # pylint: disable=g-import-not-at-top
  from tpu_models.serving import INSTALL_SERVE  # pylint: disable=g-import-not-at-top
  try:
    import ray.serve  # pylint: disable=g-import-not-at-top,unused-import
    import starlette  # pylint: disable=g-import-not-at-top,unused-import
    import prometheus_client  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise MissingExtraError(f"tpu-models serve runs on Ray Serve, which is not installed "
                            f"({e.name or e}): {INSTALL_SERVE}.") from None
  from tpu_models.serving import server  # pylint: disable=g-import-not-at-top
  return server.serve(models_of(args), args)
