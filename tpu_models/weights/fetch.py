"""Downloading one weights file into the cache: verified, resumable, locked, mirrored, offline.

    path = fetch_file(RemoteFile(url=..., name=..., sha256=..., size=...), label="ENTRY")

Guarantees:
  * The file goes to `<name>.part` in the cache's downloads directory and is
    renamed to `<name>` only when whole and verified (SHA-256, or the prefix
    the source publishes, and size): a killed download never leaves a file
    under the final name; a mismatch deletes the download and raises one line
    naming the entry, the expected and the actual hash.
  * A `.part` left by an earlier attempt continues with an HTTP Range request;
    a server that answers 200 instead of 206 restarts from byte 0 (with a note).
  * One process downloads an entry at a time (an exclusive lock on
    `<name>.lock`); another waits, then finds the verified file and reuses it.
  * TPU_MODELS_WEIGHTS_MIRROR (a URL or a local directory) replaces every
    location's scheme and host: `https://host/path` is read from
    `MIRROR/host/path`. TPU_MODELS_OFFLINE=1 never touches the network: a file
    not cached is an error that says what to fetch, from where, and where to put it.
  * `hf-hub:REPO/FILE` locations resolve to `{HF_ENDPOINT}/REPO/resolve/main/FILE`
    (HF_HUB_OFFLINE=1 counts as offline); Hugging Face publishes an LFS file's
    SHA-256 as its `X-Linked-Etag`, which verifies the file when the catalogue
    records none.

Standard library only (urllib honours http_proxy/https_proxy/no_proxy); no
TensorFlow, so two processes can fetch at once without importing it.
"""

import contextlib
import dataclasses
import fcntl
import hashlib
import http.client
import json
import os
import shutil
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable, Dict, Optional

from tpu_models.errors import ConfigError, DataError

DEFAULT_HOME = os.path.join("~", ".cache", "tpu_models")
HF_DEFAULT_ENDPOINT = "https://huggingface.co"
_CHUNK = 1 << 16
_DEFAULT_TIMEOUT_S = 60.0


class WeightsDownloadError(DataError):
  """A download failed (unreachable, 404, stalled) or its file is not the one published."""


class OfflineError(DataError):
  """Offline and not cached: says which file to fetch from where and where to put it."""


@dataclasses.dataclass(frozen=True)
class RemoteFile:
  """Where one weights file is published and how to know it is the right one.

  url: `https://...`, `hf-hub:OWNER/REPO/FILE`, `kaggle://HANDLE` (a preset
    directory, fetched with kagglehub), or "" when nothing is published.
  name: the file's name in the cache (default: the URL's last part).
  sha256: the full SHA-256 (64 hex digits), a published prefix of it (e.g.
    torch.hub's file names carry the first 8+), or None.
  size: bytes; None when not published. size_tolerance: allowed difference in
    bytes (a size published rounded, e.g. in MiB to 3 decimals).
  published: what the source publishes and where (or why no hash is recorded).
  archive: "tar.gz": the file is an archive extracted after verification.
  """
  url: str
  name: str = ""
  sha256: Optional[str] = None
  size: Optional[int] = None
  size_tolerance: int = 0
  published: str = ""
  archive: Optional[str] = None

  @property
  def file_name(self) -> str:
    return self.name or self.url.rstrip("/").rsplit("/", 1)[-1]

  @property
  def hash_kind(self) -> str:
    """"full", "prefix" or "none"."""
    if not self.sha256:
      return "none"
    return "full" if len(self.sha256) == 64 else "prefix"


def home(environ=None) -> str:
  """The cache directory: TPU_MODELS_HOME, default ~/.cache/tpu_models."""
  environ = os.environ if environ is None else environ
  return os.path.expanduser(environ.get("TPU_MODELS_HOME") or DEFAULT_HOME)


def downloads_dir(environ=None) -> str:
  return os.path.join(home(environ), "downloads")


def model_dir_of(name: str, environ=None) -> str:
  """Where catalogue entry `name`'s imported model_dir is cached."""
  return os.path.join(home(environ), "models", name)


def offline(environ=None) -> bool:
  environ = os.environ if environ is None else environ
  return environ.get("TPU_MODELS_OFFLINE", "").strip().lower() in ("1", "true", "yes")


def resolve_url(url: str, environ=None) -> str:
  """The https URL of a location (`hf-hub:` through HF_ENDPOINT), before any mirror."""
  environ = os.environ if environ is None else environ
  if url.startswith("hf-hub:"):
    repo_file = url[len("hf-hub:"):]
    owner, repo, file_name = repo_file.split("/", 2)
    endpoint = (environ.get("HF_ENDPOINT") or HF_DEFAULT_ENDPOINT).rstrip("/")
    return f"{endpoint}/{owner}/{repo}/resolve/main/{file_name}"
  return url


def mirrored(url: str, environ=None) -> str:
  """`url` on TPU_MODELS_WEIGHTS_MIRROR when set (same layout: MIRROR/host/path), else `url`."""
  environ = os.environ if environ is None else environ
  mirror = environ.get("TPU_MODELS_WEIGHTS_MIRROR", "").strip()
  if not mirror:
    return url
  parts = urllib.parse.urlsplit(url)
  return f"{mirror.rstrip('/')}/{parts.netloc}{parts.path}"


def sha256_of(path: str) -> str:
  """The file's SHA-256, hex."""
  with open(path, "rb") as f:
    return hashlib.file_digest(f, "sha256").hexdigest()


def record_path(path: str) -> str:
  """The sidecar recording how `path` was verified (`<file>.verified.json`)."""
  return path + ".verified.json"


def read_record(path: str) -> Optional[Dict[str, object]]:
  try:
    with open(record_path(path)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


@contextlib.contextmanager
def locked(path: str, say: Callable[[str], None] = print, label: str = ""):
  """An exclusive lock on `path` (created); says so once when another process holds it."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "a+") as handle:
    try:
      fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      say(f"{label}: another process is fetching it; waiting for it ({path}).")
      fcntl.flock(handle, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(handle, fcntl.LOCK_UN)


def _check(remote: RemoteFile, path: str, label: str, location: str,
           server_sha256: Optional[str], trust_unverified: bool) -> Dict[str, object]:
  """Verifies the whole download at `path`; deletes it and raises one line when it is wrong."""
  size = os.path.getsize(path)
  actual = sha256_of(path)
  problem = None
  if remote.size is not None and abs(size - remote.size) > remote.size_tolerance:
    problem = (f"size {size} bytes, expected {remote.size}"
               + (f" +- {remote.size_tolerance}" if remote.size_tolerance else ""))
  expected, against = remote.sha256, "catalogue"
  if not expected and server_sha256:
    expected, against = server_sha256, "published by the server (X-Linked-Etag)"
  if problem is None and expected and not actual.startswith(expected.lower()):
    problem = f"SHA-256 {actual}, expected {expected.lower()}"
  if problem is None and not expected and not trust_unverified:
    problem = ("no published SHA-256 to check it against (pass --trust-unverified / "
               "trust_unverified=True to record the hash of what arrived)")
  if problem is not None:
    os.remove(path)
    raise WeightsDownloadError(f"{label}: the download from {location} was refused and "
                               f"deleted: {problem}.")
  if not expected:
    against = "trust on first use: no hash published, recorded from this download"
  return {"sha256": actual, "size": size, "verified_against": against,
          "expected": expected or None, "location": location}


def _adopt(remote: RemoteFile, path: str, label: str, trust_unverified: bool) -> None:
  """Records a file the user put at `path` once it matches the published hash (never deleted)."""
  actual = sha256_of(path)
  if remote.sha256 and not actual.startswith(remote.sha256.lower()):
    raise WeightsDownloadError(f"{label}: {path} is not the published file: SHA-256 {actual}, "
                               f"expected {remote.sha256.lower()} (remove it or replace it).")
  if not remote.sha256 and not trust_unverified:
    raise WeightsDownloadError(f"{label}: {path} has no published SHA-256 to check it against; "
                               f"pass --trust-unverified to record its hash.")
  against = "catalogue" if remote.sha256 else "trust on first use: placed by hand"
  with open(record_path(path), "w") as f:
    json.dump({"sha256": actual, "size": os.path.getsize(path), "verified_against": against,
               "expected": remote.sha256, "location": path}, f, indent=1)


def hf_cache_file(url: str, environ=None) -> Optional[str]:
  """The `hf-hub:` file in huggingface_hub's cache (HF_HUB_CACHE, else HF_HOME/hub, else
  ~/.cache/huggingface/hub) at the revision its refs/main names, or None."""
  environ = os.environ if environ is None else environ
  owner, repo, file_name = url[len("hf-hub:"):].split("/", 2)
  hub = environ.get("HF_HUB_CACHE") or os.path.join(
      os.path.expanduser(environ.get("HF_HOME") or os.path.join("~", ".cache", "huggingface")),
      "hub")
  repo_dir = os.path.join(hub, f"models--{owner}--{repo}")
  try:
    with open(os.path.join(repo_dir, "refs", "main")) as f:
      revision = f.read().strip()
  except OSError:
    return None
  candidate = os.path.join(repo_dir, "snapshots", revision, file_name)
  return candidate if os.path.isfile(candidate) else None


def _from_hf_cache(remote: RemoteFile, path: str, label: str, environ) -> Optional[str]:
  """Reuses a file huggingface_hub (timm) already downloaded: verified against the catalogue's
  hash, else the SHA-256 its blob is named by (the hub's LFS id), then linked into our cache."""
  source = hf_cache_file(remote.url, environ)
  if source is None:
    return None
  blob = os.path.basename(os.path.realpath(source))
  expected = remote.sha256 or (blob if len(blob) == 64 else None)
  actual = sha256_of(source)
  if expected is None or not actual.startswith(expected.lower()):
    return None  # Not verifiable, or not the published file: fetch it instead.
  os.makedirs(os.path.dirname(path), exist_ok=True)
  part = path + ".part"
  if os.path.exists(part):
    os.remove(part)
  try:
    os.link(os.path.realpath(source), part)
  except OSError:
    shutil.copyfile(source, part)
  os.replace(part, path)
  with open(record_path(path), "w") as f:
    json.dump({"sha256": actual, "size": os.path.getsize(path), "expected": expected,
               "verified_against": "catalogue" if remote.sha256 else
               "Hugging Face cache (blob named by its SHA-256)", "location": source}, f, indent=1)
  return path


def weights_path(remote: RemoteFile, path: str) -> str:
  """What an importer reads: the downloaded file, or the TF checkpoint directory inside the
  archive it is (extracted once, next to it; no absolute paths or escaping links)."""
  if remote.archive != "tar.gz":
    return path
  import tarfile
  extracted = path + ".extracted"
  if not os.path.isdir(extracted):
    temporary = extracted + ".tmp"
    shutil.rmtree(temporary, ignore_errors=True)
    with tarfile.open(path) as archive:
      archive.extractall(temporary, filter="data")
    os.replace(temporary, extracted)
  for root, _, files in os.walk(extracted):
    if "checkpoint" in files:
      return root
  raise ConfigError(f"The archive {path} holds no TF checkpoint directory (no 'checkpoint' "
                    f"file).")


class _Progress:
  """Bytes, rate and ETA on a terminal (one updated line); one line per 10% otherwise."""

  def __init__(self, label: str, total: Optional[int], start: int, stream=None):
    self.label, self.total, self.done = label, total, start
    self.stream = stream or sys.stderr
    self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
    self.began, self.start = time.monotonic(), start
    self.next_tenth = (start * 10 // total + 1) if total else None

  def update(self, n: int) -> None:
    self.done += n
    rate = (self.done - self.start) / max(time.monotonic() - self.began, 1e-6)
    if self.tty:
      eta = f", ETA {(self.total - self.done) / rate:.0f} s" if self.total and rate else ""
      of = f"/{self.total / 1e6:.1f}" if self.total else ""
      self.stream.write(f"\r{self.label}: {self.done / 1e6:.1f}{of} MB, "
                        f"{rate / 1e6:.1f} MB/s{eta}   ")
      self.stream.flush()
    elif self.total and self.next_tenth is not None and self.done * 10 >= self.next_tenth * self.total:
      tenth = min(10, self.done * 10 // self.total)
      self.stream.write(f"{self.label}: {tenth * 10}% ({self.done} of {self.total} bytes, "
                        f"{rate / 1e6:.1f} MB/s)\n")
      self.next_tenth = tenth + 1

  def close(self) -> None:
    if self.tty:
      self.stream.write("\n")


class _KeepLinkedEtag(urllib.request.HTTPRedirectHandler):
  """Follows redirects (keeping Range) and remembers the first X-Linked-Etag on the way."""

  linked_etag = None

  def redirect_request(self, req, fp, code, msg, headers, newurl):
    self.linked_etag = self.linked_etag or headers.get("X-Linked-Etag")
    return super().redirect_request(req, fp, code, msg, headers, newurl)


def _download(url: str, part: str, label: str, timeout: float,
              say: Callable[[str], None]) -> Dict[str, object]:
  """Appends `url`'s bytes to `part`, from where it stops (Range); returns what the server said."""
  have = os.path.getsize(part) if os.path.exists(part) else 0
  request = urllib.request.Request(url, headers={"User-Agent": "tpu_models"})
  if have:
    request.add_header("Range", f"bytes={have}-")
  redirects = _KeepLinkedEtag()
  try:
    response = urllib.request.build_opener(redirects).open(request, timeout=timeout)
  except urllib.error.HTTPError as e:
    if e.code == 416 and have:  # Range past the end: the part is the whole file.
      return {"transferred": 0, "server_sha256": None, "resumed_from": have}
    raise WeightsDownloadError(f"{label}: {url} answered HTTP {e.code} {e.reason}.") from None
  except (urllib.error.URLError, socket.timeout, OSError) as e:
    reason = getattr(e, "reason", e)
    raise WeightsDownloadError(f"{label}: {url} cannot be reached ({reason}).") from None
  with response:
    # The hub answers an LFS file with a redirect to its CDN: the hash is on the redirect.
    linked = response.headers.get("X-Linked-Etag") or redirects.linked_etag or ""
    server_sha256 = linked.strip('"').lower() if len(linked.strip('"')) == 64 else None
    if have and response.status != 206:
      say(f"{label}: the server does not resume (no Range support): starting over from byte 0 "
          f"({have} bytes downloaded before are discarded).")
      have = 0
    length = response.headers.get("Content-Length")
    total = have + int(length) if length is not None else None
    progress = _Progress(label, total, have)
    transferred = 0
    try:
      with open(part, "ab" if have else "wb") as out:
        while True:
          try:
            block = response.read(_CHUNK)
          except (socket.timeout, TimeoutError):
            raise WeightsDownloadError(
                f"{label}: {url} stalled (no data for {timeout:g} s) after {have + transferred} "
                f"bytes; the partial file is kept and the next attempt resumes it.") from None
          except (OSError, http.client.HTTPException) as e:  # Connection reset, IncompleteRead.
            raise WeightsDownloadError(f"{label}: {url} broke off after {have + transferred} "
                                       f"bytes ({e}); the next attempt resumes.") from None
          if not block:
            break
          out.write(block)
          transferred += len(block)
          progress.update(len(block))
    finally:
      progress.close()
    if total is not None and have + transferred < total:
      raise WeightsDownloadError(f"{label}: {url} broke off after {have + transferred} of "
                                 f"{total} bytes; the next attempt resumes.")
  return {"transferred": transferred, "server_sha256": server_sha256, "resumed_from": have}


def offline_message(remote: RemoteFile, label: str, destination: str, environ=None) -> str:
  url = mirrored(resolve_url(remote.url, environ), environ)
  check = (f"SHA-256 {remote.sha256}{' (prefix)' if remote.hash_kind == 'prefix' else ''}"
           if remote.sha256 else "no published SHA-256")
  size = f", {remote.size} bytes" if remote.size is not None else ""
  return (f"{label}: offline (TPU_MODELS_OFFLINE/HF_HUB_OFFLINE) and not cached: fetch {url} "
          f"({check}{size}) and put it at {destination}.")


def fetch_file(remote: RemoteFile, *, label: str, environ=None, timeout: Optional[float] = None,
               trust_unverified: bool = False, say: Callable[[str], None] = print,
               stats: Optional[Dict[str, object]] = None) -> str:
  """The verified cached copy of `remote`, downloaded when missing; returns its path.

  Args:
    remote: the published file.
    label: what to name in messages (the catalogue entry).
    environ: the environment to read (default os.environ; never written).
    timeout: seconds without data before a download counts as stalled
      (default TPU_MODELS_DOWNLOAD_TIMEOUT or 60).
    trust_unverified: accept a file no hash is published for, recording its hash.
    say: where notes go.
    stats: filled with "transferred" (bytes this call read from the network),
      "resumed_from", "cached" (True: nothing downloaded).

  Raises:
    WeightsDownloadError: unreachable, HTTP error, stalled, cut, or not the published file.
    OfflineError: offline and not cached.
  """
  environ = os.environ if environ is None else environ
  stats = {} if stats is None else stats
  stats.update(transferred=0, resumed_from=0, cached=False)
  if not remote.url:
    raise WeightsDownloadError(f"{label}: no public download location ({remote.published}).")
  if timeout is None:
    timeout = float(environ.get("TPU_MODELS_DOWNLOAD_TIMEOUT") or _DEFAULT_TIMEOUT_S)
  directory = downloads_dir(environ)
  path = os.path.join(directory, remote.file_name)
  if os.path.exists(path) and read_record(path):
    stats["cached"] = True
    return path
  if os.path.isfile(path):  # Put there by hand (an air-gapped machine): verified, not fetched.
    with locked(path + ".lock", say, label):
      if not read_record(path):
        _adopt(remote, path, label, trust_unverified)
    stats["cached"] = True
    return path
  if remote.url.startswith("hf-hub:"):
    found = _from_hf_cache(remote, path, label, environ)
    if found:
      stats["cached"] = True
      return found
  is_offline = offline(environ) or (remote.url.startswith("hf-hub:") and
                                    environ.get("HF_HUB_OFFLINE", "") not in ("", "0"))
  if is_offline:
    raise OfflineError(offline_message(remote, label, path, environ))
  if not remote.sha256 and not trust_unverified and remote.url.startswith(("http", "file")):
    raise WeightsDownloadError(f"{label}: {remote.url} has no published SHA-256 "
                               f"({remote.published}); pass --trust-unverified / "
                               f"trust_unverified=True to fetch it and record its hash.")
  os.makedirs(directory, exist_ok=True)
  if remote.url.startswith("kaggle://"):
    return _fetch_kaggle(remote, path, label, trust_unverified, say)
  with locked(path + ".lock", say, label):
    if os.path.exists(path) and read_record(path):  # Another process fetched it meanwhile.
      stats["cached"] = True
      return path
    url = mirrored(resolve_url(remote.url, environ), environ)
    part = path + ".part"
    if "://" not in url or url.startswith("file://"):  # A local mirror directory.
      source = url[len("file://"):] if url.startswith("file://") else url
      if not os.path.exists(source):
        raise WeightsDownloadError(f"{label}: the mirror has no {source}.")
      shutil.copyfile(source, part)
      stats["transferred"] = os.path.getsize(part)
      server_sha256 = None
    else:
      said = _download(url, part, label, timeout, say)
      stats.update(transferred=said["transferred"], resumed_from=said["resumed_from"])
      server_sha256 = said["server_sha256"]
    record = _check(remote, part, label, url, server_sha256, trust_unverified)
    if record["verified_against"].startswith("trust"):
      say(f"{label}: NOT VERIFIED: no SHA-256 is published for {url}; recorded "
          f"{record['sha256']} from this download (trust on first use).")
    os.replace(part, path)
    with open(record_path(path), "w") as f:
      json.dump(record, f, indent=1)
  return path


def _fetch_kaggle(remote: RemoteFile, path: str, label: str, trust_unverified: bool,
                  say: Callable[[str], None]) -> str:
  """A keras-hub preset directory through kagglehub (its cache, KAGGLE_API_ENDPOINT and
  credentials); `path` becomes a link to it with every file's hash recorded."""
  if not trust_unverified:
    raise WeightsDownloadError(f"{label}: {remote.url} has no published SHA-256 "
                               f"({remote.published}); pass --trust-unverified to fetch it "
                               f"and record each file's hash.")
  try:
    import kagglehub
  except ImportError:
    raise ConfigError(f'{label}: {remote.url} is fetched with kagglehub: pip install '
                      f'"tpu_models[weights]" (or kagglehub).') from None
  with locked(path + ".lock", say, label):
    if os.path.exists(path) and read_record(path):
      return path
    directory = kagglehub.model_download(remote.url[len("kaggle://"):])
    files = {os.path.relpath(os.path.join(root, f), directory):
             sha256_of(os.path.join(root, f)) for root, _, fs in os.walk(directory) for f in fs}
    say(f"{label}: NOT VERIFIED: no SHA-256 is published for {remote.url}; recorded the "
        f"hashes of its {len(files)} files (trust on first use).")
    if os.path.lexists(path):
      os.remove(path)
    os.symlink(directory, path)
    with open(record_path(path), "w") as f:
      json.dump({"files": files, "verified_against": "trust on first use",
                 "location": remote.url}, f, indent=1)
  return path


def verify_cached(path: str) -> Optional[str]:
  """None when the cached file at `path` still has its recorded hash, else what is wrong."""
  record = read_record(path)
  if record is None:
    return "no verification record"
  if not os.path.exists(path):
    return "file missing"
  if "files" in record:  # A directory: every file as recorded.
    for name, expected in record["files"].items():
      file_path = os.path.join(path, name)
      if not os.path.exists(file_path):
        return f"{name} missing"
      if sha256_of(file_path) != expected:
        return f"{name}: SHA-256 {sha256_of(file_path)}, recorded {expected}"
    return None
  actual = sha256_of(path)
  if actual != record["sha256"]:
    return f"SHA-256 {actual}, recorded {record['sha256']}"
  return None
