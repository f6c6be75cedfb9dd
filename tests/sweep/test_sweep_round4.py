"""Sweep faults of reliability round 4 (docs/reliability.md, the sweeps table S7-): each on a
real `tpu-models sweep` process with its own local Ray (sweep_helpers.ray_sandbox)."""

import ipaddress
import os

import psutil

from sweep_helpers import (TOY_SWEEP, ray_sandbox, start_sweep, trial_records, wait_for)


def _sandbox_processes(ray_tmp: str):
  """The processes started under this sandbox's RAY_TMPDIR: the driver, Ray's, the trials'."""
  found = []
  for process in psutil.process_iter(["pid"]):
    try:
      with open(f"/proc/{process.pid}/environ", "rb") as f:
        if f"RAY_TMPDIR={ray_tmp}".encode() in f.read():
          found.append(process)
    except OSError:
      pass
  return found


def _listening(processes):
  """{(name, address)} of every TCP socket the processes listen on."""
  sockets = set()
  for process in processes:
    try:
      for connection in process.net_connections(kind="tcp"):
        if connection.status == psutil.CONN_LISTEN:
          sockets.add((process.name(), connection.laddr.ip))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
      pass
  return sockets


def _loopback(address: str) -> bool:
  ip = ipaddress.ip_address(address.split("%")[0])
  mapped = getattr(ip, "ipv4_mapped", None)
  return (mapped or ip).is_loopback


def test_a_local_sweep_listens_on_loopback_only(tmp_path):
  """Before: Ray's GCS, raylet, workers and agents listened on every interface or the
  machine's network address (192.0.2.2 here): anyone reaching the machine could run code in
  the sweep. Every socket of the driver, Ray and the trial is on 127.0.0.1 now."""
  directory = str(tmp_path / "sweep")
  args = [TOY_SWEEP, "--set", f"sweep.directory={directory}", "--set", "sweep.trials=2",
          "--set", "sweep.concurrency=1", "--set", "sweep.space.task.model.hidden={grid: [4, 8]}",
          "--set", "task.batch_delay_seconds=0.2"]
  log = str(tmp_path / "driver.log")
  with ray_sandbox() as ray_tmp:
    driver = start_sweep(ray_tmp, *args, log_path=log)
    try:
      wait_for(lambda: any(r.get("state") == "running" for r in trial_records(directory).values()),
               240, "a running trial", process=driver, log_path=log)
      sockets = _listening(_sandbox_processes(ray_tmp))
    finally:
      driver.kill()
      driver.wait()
  names = {name for name, _ in sockets}
  assert any("gcs_server" in n for n in names) and any("raylet" in n for n in names), sockets
  exposed = sorted((name, address) for name, address in sockets if not _loopback(address))
  assert not exposed, exposed
