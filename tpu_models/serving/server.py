"""Starts (or joins) Ray, starts Serve's HTTP proxy, runs the ModelServer application, and
waits for SIGTERM / Ctrl-C, then shuts Serve (and a Ray it started) down.

Without `--address` Ray is started in this process on this machine only (127.0.0.1,
no dashboard, a small object store: requests pass through the proxy, not the object
store). With `--address auto|ray://HOST:PORT` the replicas go where the cluster has
room and the proxy runs on the head node, one endpoint for all of them.
"""

import os
import shutil
import signal
import sys
import threading
import time
from typing import Dict

from tpu_models.errors import ConfigError
from tpu_models.serving import repository
from tpu_models.serving.command import RAY_SERVE_SETTINGS

APP_NAME = "tpu_models"
_OBJECT_STORE_BYTES = 256 * 1024 * 1024


def say(line: str) -> None:
  print(f"tpu-models serve: {line}", flush=True)


def serve(models: Dict[str, str], args) -> int:
  """Serves `models` ({name: MODEL_BASE}) as `args` (command.add_arguments) say; returns 0
  after a SIGTERM or Ctrl-C."""
  try:
    return _serve(models, args)
  finally:
    if getattr(args, "haproxy_dir", None):  # HAProxy's files (command.ray_environment).
      shutil.rmtree(args.haproxy_dir, ignore_errors=True)


def _serve(models: Dict[str, str], args) -> int:
  for name, base in models.items():
    versions = repository.version_paths(base)  # FileNotFoundError: one line, exit 2.
    say(f"model {name!r}: {base} ({len(versions)} version(s) there: "
        f"{', '.join(map(str, sorted(versions))) or 'none yet'}).")
  token = _read_token(args.auth_token_file) if args.auth_token_file else ""
  options = _deployment_options(args)
  if getattr(args, "ingress", "proxy") == "haproxy" and args.address:
    raise ConfigError("--ingress haproxy needs the Ray this command starts (Ray Serve reads its "
                      "HAProxy settings when its processes start); on a cluster start Ray with "
                      "RAY_SERVE_ENABLE_HA_PROXY=1 in `ray start`'s environment and leave "
                      "--ingress out.")
  import ray  # pylint: disable=g-import-not-at-top
  from ray import serve  # pylint: disable=g-import-not-at-top
  from tpu_models.serving.deployment import ModelServer  # pylint: disable=g-import-not-at-top
  # Workers get their settings through Ray: this process's environment is written only
  # before TensorFlow starts (command.ray_environment, which a local Ray's processes
  # inherit); on a cluster (--address) this is how the replicas get Ray Serve's settings.
  runtime_env = {"env_vars": {"TF_CPP_MIN_LOG_LEVEL": "2",
                              **{key: os.environ.get(key, value)
                                 for key, value in RAY_SERVE_SETTINGS.items()}}}
  started = time.monotonic()
  if args.address:
    ray.init(address=args.address, runtime_env=runtime_env, log_to_driver=True)
  else:
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
             object_store_memory=_OBJECT_STORE_BYTES, runtime_env=runtime_env,
             log_to_driver=True)
  stop = threading.Event()

  def on_signal(signum, frame):  # pylint: disable=unused-argument
    stop.set()

  previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    serve.start(http_options={"host": args.host, "port": args.port,
                              "request_timeout_s": args.request_timeout_s},
                proxy_location="HeadOnly")
    application = serve.deployment(ModelServer, name="ModelServer", **options).bind(
        models, poll_seconds=args.poll_seconds, max_batch_size=args.max_batch_size,
        batch_timeout_ms=args.batch_timeout_ms, max_body_bytes=args.max_body_bytes,
        auth_token=token)
    serve.run(application, name=APP_NAME, route_prefix="/")
    nodes = len([n for n in ray.nodes() if n.get("Alive")])
    say(f"ready in {time.monotonic() - started:.1f} s: http://{args.host}:{args.port}/ "
        f"({', '.join(models)}; {_scale_text(args)}; {nodes} Ray node(s); "
        f"{_ingress_text(args)}). "
        f"TF Serving REST /v1/models/NAME:predict, v2 /v2/models/NAME/infer, /metrics.")
    while not stop.wait(0.5):
      pass
    say("stopping (signal received).")
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)
    try:
      serve.delete(APP_NAME)
      if not args.address:
        serve.shutdown()
    finally:
      ray.shutdown()
  return 0


def _ingress_text(args) -> str:
  # The environment says what Ray's processes got (command.ray_environment sets it only
  # before TensorFlow starts: not in a process that already runs it).
  if not getattr(args, "haproxy_dir", None) or os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") != "1":
    return "Ray Serve's proxy"
  ports = args.haproxy_ports
  return (f"HAProxy ingress; its stats page :{ports['stats']}/stats and Prometheus exporter "
          f":{ports['metrics']}/metrics listen on every interface")


def _deployment_options(args) -> dict:
  """Ray Serve's deployment options from the arguments; a ConfigError for bad values."""
  if args.max_batch_size < 1:
    raise ConfigError(f"--max-batch-size must be >= 1; got {args.max_batch_size}.")
  if args.batch_timeout_ms < 0 or args.poll_seconds <= 0 or args.max_body_bytes < 1:
    raise ConfigError("--batch-timeout-ms must be >= 0, --poll-seconds > 0 and "
                      "--max-body-bytes >= 1.")
  if args.replica_cpus <= 0:
    raise ConfigError(f"--replica-cpus must be > 0; got {args.replica_cpus}.")
  options = {"ray_actor_options": {"num_cpus": args.replica_cpus},
             # Batching needs at least a batch's worth of requests inside the replica.
             "max_ongoing_requests": max(args.max_ongoing_requests, args.max_batch_size),
             "graceful_shutdown_timeout_s": 5}
  if args.autoscale:
    low, sep, high = args.autoscale.partition(":")
    if not (sep and low.isdigit() and high.isdigit() and 0 < int(low) <= int(high)):
      raise ConfigError(f"--autoscale must be MIN:MAX with 1 <= MIN <= MAX; got "
                        f"{args.autoscale!r}.")
    options["autoscaling_config"] = {"min_replicas": int(low), "max_replicas": int(high)}
  else:
    if args.replicas < 1:
      raise ConfigError(f"--replicas must be >= 1; got {args.replicas}.")
    options["num_replicas"] = args.replicas
  return options


def _scale_text(args) -> str:
  replicas = (f"{args.autoscale} replicas (autoscaled)" if args.autoscale
              else f"{args.replicas} replica(s)")
  batching = (f"batches up to {args.max_batch_size} within {args.batch_timeout_ms:g} ms"
              if args.max_batch_size > 1 else "no batching")
  return f"{replicas} of {args.replica_cpus:g} CPU, {batching}"


def _read_token(path: str) -> str:
  try:
    with open(path, encoding="utf-8") as f:
      token = f.read().strip()
  except OSError as e:
    raise ConfigError(f"--auth-token-file {path!r} cannot be read ({e.strerror}).") from None
  if not token or any(c.isspace() for c in token):
    raise ConfigError(f"--auth-token-file {path!r} must hold one token (no spaces); it is "
                      f"{'empty' if not token else 'several words'}.")
  if os.stat(path).st_mode & 0o077:
    print(f"tpu-models serve: warning: {path} is readable by other users (chmod 600 it).",
          file=sys.stderr)
  return token
