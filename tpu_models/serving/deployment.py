"""The Ray Serve deployment: every route, auth, the body cap, batching, live version swaps.

Each replica of `ModelServer` holds, per model name, a `ModelHost`: the versions of its
MODEL_BASE that are loaded (an immutable `Snapshot`) and a poller thread that looks at
MODEL_BASE every `poll_seconds`. A new version is checked, loaded and warmed up in that
thread while the current snapshot keeps serving; then one assignment puts the new
snapshot in place. A request takes the snapshot once, when it arrives, and holds its
`Servable`: requests in flight finish on the old version, later ones get the new one,
and a version is never seen half loaded. A refused version (repository.DamagedVersion)
is one logged line, and is looked at again only when its files change.

Concurrent requests are batched with `@serve.batch` (`max_batch_size`,
`batch_wait_timeout_s`): the rows of the requests for one version, signature and row
shape are concatenated into one call; a signature of static batch sizes gets them
padded to the nearest size it runs at (`Servable.run`), its answers sliced back. Model
calls run one at a time on a thread of their own, so the event loop keeps reading
requests (the next batch fills meanwhile).
TensorFlow's threads are the replica's CPU share (`ray_actor_options["num_cpus"]`),
set through `tf.config.threading` before anything runs.
"""

import asyncio
import concurrent.futures
import dataclasses
import functools
import hmac
import json
import os
import re
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from ray import serve
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from tpu_models.serving import protocol_rest, protocol_v2, repository
from tpu_models.serving.metrics import CONTENT_TYPE, ServingMetrics
from tpu_models.serving.servable import Servable
from tpu_models.serving.tensors import RequestError

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_VERSION = re.compile(r"^[0-9]{1,18}$")
_SEGMENT = r"[^/:]+"
_ROUTES = [  # (method, pattern, route label, handler name)
    ("GET", r"/", "/", "_page"),
    ("GET", r"/metrics", "/metrics", "_metrics"),
    ("GET", r"/v2/health/live", "/v2/health/live", "_live"),
    ("GET", r"/v2/health/ready", "/v2/health/ready", "_ready"),
    ("GET", r"/v2", "/v2", "_v2_server"),
    ("GET", r"/ui/models", "/ui/models", "_ui_models"),
    ("POST", rf"/v1/models/(?P<name>{_SEGMENT})(?:/versions/(?P<version>{_SEGMENT})|"
             rf"/labels/(?P<label>{_SEGMENT}))?:predict",
     "/v1/models/{name}:predict", "_predict"),
    ("GET", rf"/v1/models/(?P<name>{_SEGMENT})(?:/versions/(?P<version>{_SEGMENT})|"
            rf"/labels/(?P<label>{_SEGMENT}))?/metadata",
     "/v1/models/{name}/metadata", "_rest_metadata"),
    ("GET", rf"/v1/models/(?P<name>{_SEGMENT})(?:/versions/(?P<version>{_SEGMENT})|"
            rf"/labels/(?P<label>{_SEGMENT}))?", "/v1/models/{name}", "_rest_status"),
    ("POST", rf"/v2/models/(?P<name>{_SEGMENT})(?:/versions/(?P<version>{_SEGMENT}))?/infer",
     "/v2/models/{name}/infer", "_infer"),
    ("GET", rf"/v2/models/(?P<name>{_SEGMENT})(?:/versions/(?P<version>{_SEGMENT}))?/ready",
     "/v2/models/{name}/ready", "_model_ready"),
    ("GET", rf"/v2/models/(?P<name>{_SEGMENT})(?:/versions/(?P<version>{_SEGMENT}))?",
     "/v2/models/{name}", "_v2_metadata"),
]
_COMPILED = [(method, re.compile(f"^{pattern}$"), label, handler)
             for method, pattern, label, handler in _ROUTES]
_OPEN_ROUTES = ("/v2/health/live", "/v2/health/ready", "/")  # No token needed (the page is
# static: the data it shows comes from routes that need the token).


def say(line: str) -> None:
  """One line to the replica's stdout, which Ray forwards to `tpu-models serve`'s."""
  print(f"tpu-models serve: {line}", flush=True)


@dataclasses.dataclass(frozen=True)
class Snapshot:
  """What a model serves at one moment; replaced whole, never changed.

  Attributes:
    servables: {version: Servable} loaded.
    config: the serving.yaml in force.
    default: the version requests naming none get (None: nothing loaded).
  """
  servables: Dict[int, Servable]
  config: repository.ServingConfig
  default: Optional[int]


class ModelHost:
  """One model name: its MODEL_BASE, the snapshot served, the versions' states."""

  def __init__(self, name: str, base: str, threads: Optional[int], metrics: ServingMetrics):
    self.name, self.base, self.threads, self.metrics = name, base, threads, metrics
    self.snapshot = Snapshot({}, repository.ServingConfig(), None)
    self.states: Dict[int, Tuple[str, str]] = {}  # version -> (state, error message)
    self._refused: Dict[int, Any] = {}  # version -> fingerprint when refused
    self._config_error = ""

  def poll(self) -> None:
    """Looks at MODEL_BASE once: loads what is new or wanted, then swaps the snapshot in."""
    try:
      paths = repository.version_paths(self.base)
    except FileNotFoundError as e:
      self._once(f"model {self.name!r}: {e}")
      return
    config = self._read_config()
    current = dict(self.snapshot.servables)
    newest = None
    for version in sorted(paths, reverse=True):  # The newest version that loads.
      if version in current or self._load(version, paths[version], current):
        newest = version
        break
    wanted = {v for v in config.wanted() if v in paths} | ({newest} if newest else set())
    for version in sorted(wanted - set(current)):
      self._load(version, paths[version], current)
    servables = {v: current[v] for v in sorted(wanted) if v in current}
    default = self._default(config, servables, newest)
    snapshot = Snapshot(servables, config, default)
    previous = self.snapshot
    self.snapshot = snapshot  # The swap: one assignment; requests hold what they took.
    for version in set(previous.servables) - set(servables):
      self.states[version] = ("END", "")
      say(f"model {self.name!r}: version {version} unloaded (requests in flight on it finish).")
    if default != previous.default and default is not None:
      self.metrics.version_served(model=self.name).set(default)
      say(f"model {self.name!r}: serving version {default} "
          f"({servables[default].describe()}).")

  def _load(self, version: int, path: str, loaded: Dict[int, Servable]) -> bool:
    fingerprint = repository.fingerprint(path)
    if self._refused.get(version) == fingerprint:
      return False
    self.states[version] = ("LOADING", "")
    try:
      servable = Servable(version, path, threads=self.threads)
    except repository.DamagedVersion as e:
      self._refused[version] = fingerprint
      self.states[version] = ("END", str(e))
      self.metrics.refused(model=self.name).inc()
      say(f"model {self.name!r}: version {version} refused: {e}; still serving "
          f"{self.snapshot.default if self.snapshot.default is not None else 'nothing'}.")
      return False
    self._refused.pop(version, None)
    loaded[version] = servable
    self.states[version] = ("AVAILABLE", "")
    say(f"model {self.name!r}: version {version} loaded and warmed up in "
        f"{servable.load_seconds:.1f} s ({servable.describe()}).")
    return True

  def _read_config(self) -> repository.ServingConfig:
    try:
      config = repository.read_config(self.base)
    except ValueError as e:
      if str(e) != self._config_error:
        self._config_error = str(e)
        say(f"model {self.name!r}: {e}; keeping the previous {repository.CONFIG_FILE}.")
      return self.snapshot.config
    self._config_error = ""
    return config

  def _default(self, config: repository.ServingConfig, servables: Dict[int, Servable],
               newest: Optional[int]) -> Optional[int]:
    wanted = config.default
    if isinstance(wanted, str) and wanted != "latest":
      wanted = config.labels.get(wanted)
    if wanted == "latest" or wanted is None:
      return newest
    if wanted in servables:
      return wanted
    self._once(f"model {self.name!r}: {repository.CONFIG_FILE}'s default {config.default!r} "
               f"(version {wanted}) is not loaded; serving the newest, {newest}.")
    return newest

  def _once(self, line: str) -> None:
    if line != self._config_error:
      self._config_error = line
      say(line)

  def resolve(self, version: Optional[str], label: Optional[str]) -> Servable:
    """The Servable a request names (version, label or neither); a 404 RequestError if none."""
    snapshot = self.snapshot  # Once: the request keeps this version whatever swaps next.
    if label is not None:
      number = snapshot.config.labels.get(label)
      if number is None:
        raise RequestError(404, f"Model {self.name!r} has no label {label!r} (labels: "
                                f"{', '.join(sorted(snapshot.config.labels)) or 'none'}; "
                                f"{repository.CONFIG_FILE}).")
    elif version is not None:
      if not _VERSION.match(version):
        raise RequestError(404, f"Version {version!r} of model {self.name!r}: a version is a "
                                f"number.")
      number = int(version)
    else:
      number = snapshot.default
      if number is None:
        raise RequestError(404, f"Model {self.name!r} has no version loaded yet (MODEL_BASE "
                                f"{self.base}).")
    servable = snapshot.servables.get(number)
    if servable is None:
      raise RequestError(404, f"Servable not found for request: version {number} of model "
                              f"{self.name!r} is not loaded (loaded: "
                              f"{', '.join(map(str, sorted(snapshot.servables))) or 'none'}).")
    return servable


@dataclasses.dataclass
class _Call:
  model: str
  servable: Servable
  signature: str
  inputs: Dict[str, np.ndarray]

  def key(self):
    shapes = tuple((k, v.shape[1:], v.dtype.str) for k, v in sorted(self.inputs.items()))
    return id(self.servable), self.signature, shapes

  def rows(self) -> int:
    return len(next(iter(self.inputs.values())))


class ModelServer:
  """The ingress of `tpu-models serve`: one instance per replica (see the module's doc)."""

  def __init__(self, models: Dict[str, str], *, poll_seconds: float = 1.0,
               max_batch_size: int = 16, batch_timeout_ms: float = 5.0,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, auth_token: str = ""):
    """
    Args:
      models: {model name: MODEL_BASE directory}.
      poll_seconds: how often each MODEL_BASE is looked at.
      max_batch_size: most requests run as one model call (1 = no batching).
      batch_timeout_ms: how long a batch waits to fill.
      max_body_bytes: larger request bodies are answered 413.
      auth_token: when set, every route but health and the page needs `Authorization:
        Bearer TOKEN` (else 401).
    """
    self._threads = _set_tensorflow_threads()
    replica = _replica_name()
    self.metrics = ServingMetrics(replica)
    self._hosts = {name: ModelHost(name, base, self._threads, self.metrics)
                   for name, base in sorted(models.items())}
    self._max_body_bytes, self._auth_token = max_body_bytes, auth_token.encode()
    self._batching = max_batch_size > 1
    self._batched.set_max_batch_size(max(1, max_batch_size))
    self._batched.set_batch_wait_timeout_s(batch_timeout_ms / 1000.0)
    # One model call at a time: TensorFlow already uses the replica's threads inside it.
    self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="model")
    for host in self._hosts.values():
      host.poll()  # The first versions load before the replica takes requests.
    say(f"replica {replica} (pid {os.getpid()}) ready on Ray node {_node_id()}: "
        f"{len(self._hosts)} model(s), TensorFlow threads {self._threads}, "
        f"batching {'up to ' + str(max_batch_size) if self._batching else 'off'}.")
    self._stop = threading.Event()
    self._poller = threading.Thread(target=self._poll_loop, args=(poll_seconds,), daemon=True,
                                    name="version-poller")
    self._poller.start()

  def _poll_loop(self, seconds: float) -> None:
    while not self._stop.wait(seconds):
      for host in self._hosts.values():
        try:
          host.poll()
        except Exception as e:  # pylint: disable=broad-except
          say(f"model {host.name!r}: polling {host.base} failed ({type(e).__name__}: {e}).")

  def __del__(self):
    stop = getattr(self, "_stop", None)
    if stop is not None:
      stop.set()

  async def __call__(self, request: Request) -> Response:
    started = time.monotonic()
    route, response = "unmatched", None
    try:
      path = request.url.path.rstrip("/") or "/"
      method = request.method.upper()
      for want, pattern, label, handler in _COMPILED:
        match = pattern.match(path)
        if match:
          route = label
          if method != want and not (method == "HEAD" and want == "GET"):
            raise RequestError(405, f"{path} takes {want}, not {method}.")
          self._check_token(request, label)
          response = await getattr(self, handler)(request, **match.groupdict())
          break
      else:
        raise RequestError(404, f"No route {method} {path}: see docs/serving.md (TF Serving "
                                f"/v1/models/NAME..., v2 /v2/models/NAME..., /metrics).")
    except RequestError as e:
      response = _error(e.status, e.message)
      if e.status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    except Exception as e:  # pylint: disable=broad-except
      say(f"{request.method} {request.url.path}: {type(e).__name__}: {_one_line(e)}")
      response = _error(500, f"Internal error: {type(e).__name__}: {_one_line(e)}")
    self.metrics.observe(route, response.status_code, time.monotonic() - started)
    return response

  # -- Safety: token and body cap.

  def _check_token(self, request: Request, route: str) -> None:
    if not self._auth_token or route in _OPEN_ROUTES:
      return
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                             self._auth_token):
      raise RequestError(401, "Unauthorized: send the header \"Authorization: Bearer TOKEN\" "
                              "with the token of --auth-token-file.")

  async def _body(self, request: Request) -> bytes:
    """The request's body; a 413 RequestError past the cap, without reading further."""
    cap = self._max_body_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > cap:
      raise RequestError(413, f"The body ({int(declared)} bytes) is over the server's limit of "
                              f"{cap} bytes (--max-body-bytes).")
    chunks, size = [], 0
    async for chunk in request.stream():
      size += len(chunk)
      if size > cap:
        raise RequestError(413, f"The body is over the server's limit of {cap} bytes "
                                f"(--max-body-bytes).")
      chunks.append(chunk)
    return b"".join(chunks)

  async def _json_body(self, request: Request) -> Any:
    body = await self._body(request)
    try:
      return json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
      raise RequestError(400, f"The body is not valid JSON ({_one_line(e)}).") from None

  def _host(self, name: str) -> ModelHost:
    host = self._hosts.get(name) if _NAME.match(name) else None
    if host is None:
      raise RequestError(404, f"Model {name!r} is not served here (models: "
                              f"{', '.join(self._hosts)}).")
    return host

  # -- TF Serving's REST API.

  async def _predict(self, request, name, version=None, label=None):
    host = self._host(name)
    servable = host.resolve(version, label)
    body = await self._json_body(request)
    signature, inputs, row_format = protocol_rest.parse_predict(body, servable)
    outputs = await self._run(name, servable, signature, inputs)
    return JSONResponse(protocol_rest.predict_response(outputs, row_format))

  async def _rest_status(self, request, name, version=None, label=None):
    host = self._host(name)
    if version is not None or label is not None:
      number = host.resolve(version, label).version
      states = [(number, *host.states.get(number, ("AVAILABLE", "")))]
    else:
      states = [(v, state, error) for v, (state, error) in list(host.states.items())]
    return JSONResponse(protocol_rest.status_response(states))

  async def _rest_metadata(self, request, name, version=None, label=None):
    host = self._host(name)
    return JSONResponse(protocol_rest.metadata_response(name, host.resolve(version, label)))

  # -- The v2 protocol.

  async def _live(self, request):
    return JSONResponse({"live": True})

  async def _ready(self, request):
    ready = all(host.snapshot.default is not None for host in self._hosts.values())
    return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

  async def _v2_server(self, request):
    from tpu_models import __version__  # pylint: disable=g-import-not-at-top
    return JSONResponse({"name": "tpu-models", "version": __version__,
                         "extensions": ["binary_tensor_data"]})

  async def _v2_metadata(self, request, name, version=None):
    host = self._host(name)
    servable = host.resolve(version, None)
    return JSONResponse(protocol_v2.metadata_response(name, list(host.snapshot.servables),
                                                      servable))

  async def _model_ready(self, request, name, version=None):
    host = self._host(name)
    try:
      host.resolve(version, None)
    except RequestError:
      return JSONResponse({"name": name, "ready": False}, status_code=400)
    return JSONResponse({"name": name, "ready": True})

  async def _infer(self, request, name, version=None):
    host = self._host(name)
    servable = host.resolve(version, None)
    body = await self._body(request)
    infer = protocol_v2.parse_infer(body, request.headers.get(protocol_v2.HEADER_LENGTH),
                                    servable)
    outputs = await self._run(name, servable, infer.signature, infer.inputs)
    content, header_length = protocol_v2.infer_response(name, servable, infer, outputs)
    if header_length is None:
      return Response(content, media_type="application/json")
    return Response(content, media_type="application/octet-stream",
                    headers={"Inference-Header-Content-Length": str(header_length)})

  # -- The page and metrics.

  async def _page(self, request):
    from tpu_models.serving import page  # pylint: disable=g-import-not-at-top
    return HTMLResponse(page.HTML)

  async def _ui_models(self, request):
    models = []
    for name, host in self._hosts.items():
      snapshot = host.snapshot
      servable = snapshot.servables.get(snapshot.default)
      models.append({"name": name, "version": snapshot.default,
                     "task": _task_name(servable) if servable else None,
                     "input": _input_kind(servable) if servable else None,
                     "signatures": sorted(servable.signatures) if servable else [],
                     "picture": _picture_input(servable) if servable else None})
    return JSONResponse({"models": models})

  async def _metrics(self, request):
    return Response(self.metrics.text(), media_type=CONTENT_TYPE)

  # -- Running the model: batched.

  async def _run(self, model: str, servable: Servable, signature: str,
                 inputs: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    rows = {value.shape[0] if value.ndim else None for value in inputs.values()}
    if len(rows) != 1 or None in rows or 0 in rows:
      raise RequestError(400, f"Every input of {signature!r} must hold the same batch of at "
                              f"least one row (a first dimension); got shapes "
                              f"{ {key: list(value.shape) for key, value in inputs.items()} }.")
    self._check_images(servable, signature, inputs)
    call = _Call(model, servable, signature, inputs)
    if self._batching:
      outcome = await self._batched(call)
    else:
      outcome = (await asyncio.get_running_loop().run_in_executor(
          self._executor, self._run_calls, [call]))[0]
    if isinstance(outcome, BaseException):
      raise outcome
    return outcome

  @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
  async def _batched(self, calls: List[_Call]) -> List[Any]:
    return await asyncio.get_running_loop().run_in_executor(self._executor, self._run_calls,
                                                            calls)

  def _run_calls(self, calls: List[_Call]) -> List[Any]:
    """Each call's outputs (or the exception for it): calls of one version, signature and
    row shape run as one model call on their concatenated rows."""
    groups: Dict[Any, List[int]] = {}
    for i, call in enumerate(calls):
      groups.setdefault(call.key(), []).append(i)
    results: List[Any] = [None] * len(calls)
    for indices in groups.values():
      members = [calls[i] for i in indices]
      try:
        outputs = self._run_group(members)
      except Exception as e:  # pylint: disable=broad-except
        if len(members) == 1:
          outputs = [_refusal(e, members[0].signature)]
        else:  # One bad request must not fail the others batched with it: one by one.
          outputs = [self._run_one(member) for member in members]
      for i, output in zip(indices, outputs):
        results[i] = output
    return results

  def _run_group(self, members: List[_Call]) -> List[Dict[str, np.ndarray]]:
    first = members[0]
    inputs = (first.inputs if len(members) == 1 else
              {key: np.concatenate([m.inputs[key] for m in members]) for key in first.inputs})
    outputs = first.servable.run(
        first.signature, inputs,
        on_call=lambda rows, batch: self.metrics.model_call(first.model, rows, batch))
    split, at = [], 0
    for member in members:
      n = member.rows()
      split.append({key: value[at:at + n] for key, value in outputs.items()})
      at += n
    return split

  def _run_one(self, call: _Call) -> Any:
    try:
      return self._run_group([call])[0]
    except Exception as e:  # pylint: disable=broad-except
      return _refusal(e, call.signature)

  def _check_images(self, servable: Servable, signature: str,
                    inputs: Dict[str, np.ndarray]) -> None:
    """A 400 for encoded images the export would not decode, read from their headers only:
    over `task.max_image_pixels` (a decompression bomb), or not an image at all."""
    if servable.max_image_pixels is None:
      return
    strings = [key for key, spec in servable.signatures[signature].inputs.items()
               if spec.dtype == np.object_]
    if not strings:
      return
    check = _header_check(servable.max_image_pixels)
    for key in strings:
      for i, data in enumerate(inputs[key].reshape(-1)):
        reason = check(data).numpy().decode()
        if reason:
          raise RequestError(400, f"input {key!r} row {i}: {reason}.")


@functools.lru_cache(maxsize=None)
def _header_check(max_pixels: int):
  """`image.check_image_header` for one encoded picture, traced once per limit: run eagerly
  its few dozen string ops cost ~13 ms a request on the replica's event loop (2 vCPU EPYC,
  loaded), one graph call ~0.4 ms."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tpu_models.vision import image  # pylint: disable=g-import-not-at-top
  return tf.function(lambda data: image.check_image_header(data, max_pixels),
                     input_signature=[tf.TensorSpec([], tf.string)], autograph=False)


def _refusal(error: Exception, signature: str) -> Exception:
  """A model call's exception: a 400 naming the signature when the input was at fault
  (TensorFlow's InvalidArgumentError, a runtime's ValueError for a shape), else itself."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if isinstance(error, (tf.errors.InvalidArgumentError, ValueError, TypeError)) or \
      "INVALID_ARGUMENT" in str(error):
    return RequestError(400, f"Signature {signature!r} refused the input: {_why(error)}")
  return error


def _why(error: Exception) -> str:
  """The line of a runtime's error that says what was wrong: a graph's assertion message
  (TensorFlow wraps it in "Graph execution error: ... assertion failed: [MESSAGE] ...")."""
  text = getattr(error, "message", None) or str(error)
  found = re.search(r"assertion failed: \[(.*?)\](?: \[|$)", text, re.S)
  if found:
    return _one_line(found[1])
  lines = [line.strip() for line in text.splitlines()
           if line.strip() and not line.strip().startswith(("Graph execution error",
                                                             "Detected at node", "[["))]
  return _one_line(lines[0] if lines else type(error).__name__)


def _input_kind(servable) -> str:
  """"image" when a signature takes an input named for images (the page then offers an
  upload), else "text" (a text box)."""
  keys = [key for signature in servable.signatures.values() for key in signature.inputs]
  return "image" if any("image" in key for key in keys) else "text"


def _picture_input(servable) -> Optional[Dict[str, Any]]:
  """How the page sends a picture: its encoded bytes ({"b64": ...}, `"as": "b64"`) to a
  signature whose image input takes strings, serving_default first; else uint8 pixels
  [1, H, W, 3] (`"as": "pixels"`) to one whose image input takes them, with `height` and
  `width` the export's fixed size (None where any size runs: a LiteRT export without a bytes
  signature, e.g.). None when no signature takes pictures."""
  names = sorted(servable.signatures, key=lambda name: (name != "serving_default", name))
  for kind in ("b64", "pixels"):
    for name in names:
      for key, spec in servable.signatures[name].inputs.items():
        if "image" not in key:
          continue
        if kind == "b64" and spec.dtype == np.dtype(object):
          return {"signature": name, "input": key, "as": "b64"}
        if (kind == "pixels" and spec.dtype == np.uint8 and spec.shape is not None and
            len(spec.shape) == 4 and spec.shape[3] == 3):
          height, width = (size if size > 0 else None for size in spec.shape[1:3])
          return {"signature": name, "input": key, "as": "pixels", "height": height,
                  "width": width}
  return None


def _task_name(servable: Servable) -> Optional[str]:
  import yaml  # pylint: disable=g-import-not-at-top
  for candidate in (os.path.join(servable.path, "assets.extra", "config.yaml"),
                    os.path.join(servable.path, "config.yaml")):
    if os.path.isfile(candidate):
      with open(candidate, encoding="utf-8") as f:
        return ((yaml.safe_load(f) or {}).get("task") or {}).get("name")
  return None


def _set_tensorflow_threads() -> int:
  """TensorFlow's intra- and inter-op threads = this replica's CPUs (at least 1).

  Set through tf.config.threading, before TensorFlow runs anything in this process
  (never through the environment, which TensorFlow's threads may be reading).
  """
  import ray  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
  threads = max(1, int(round(cpus)))
  try:
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
  except RuntimeError as e:  # TensorFlow ran something already in this worker.
    say(f"TensorFlow threads left as they were ({e}).")
  return threads


def _node_id() -> str:
  import ray  # pylint: disable=g-import-not-at-top
  return ray.get_runtime_context().get_node_id()


def _replica_name() -> str:
  try:
    return serve.get_replica_context().replica_id.unique_id
  except Exception:  # pylint: disable=broad-except
    return f"pid{os.getpid()}"


def _error(status: int, message: str) -> JSONResponse:
  return JSONResponse({"error": message}, status_code=status)


def _one_line(value: Any) -> str:
  return " ".join(str(value).split())[:300]
