"""Fault injection on `tpu-models export --overwrite`: a failure while saving (a full disk,
injected; one line naming the free space), retried; a SIGKILL right after the swap; a partial
directory of a dead export. The output is always one complete export, and no partial
directory outlives its export."""

import json
import os
import subprocess

import pytest

from faults import driver_command, error_line, tiny_experiment
from in_process import run_batch_here


def _listing(tmp):
  return sorted(name for name in os.listdir(tmp) if name.startswith("exported"))


def _step(export_dir):
  with open(os.path.join(export_dir, "assets.extra", "export.json")) as f:
    return json.load(f)["step"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("export_faults")
  config, _, flags = tiny_experiment(tmp)
  output = tmp / "exported"
  common = [*flags, "--output", output]
  fail = {"FAULT_EXPORT": "fail-saving"}
  first = run_batch_here(tmp, [
      ["train", config, *flags],
      ["export", config, *common],
      ["train", config, *flags, "--set", "trainer.train_steps=6"],
      {"argv": ["export", config, *common, "--overwrite"], "env": fail},
      {"argv": ["export", config, *common, "--overwrite"], "env": fail},
  ])
  after_failures = {"listing": _listing(tmp), "step": _step(output)}

  # A partial export of a process that is gone (a pid that was just used and has ended).
  dead = subprocess.Popen(["true"])
  dead.wait()
  (tmp / f"exported.partial-{dead.pid}").mkdir()
  (tmp / f"exported.partial-{dead.pid}" / "saved_model.pb").write_bytes(b"half")

  cmd, env = driver_command(["export", config, *common, "--overwrite"],
                            ("kill-after-export-swap", 0))
  killed = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
  killed_out, killed_err = killed.communicate(timeout=600)
  after_kill = {"listing": _listing(tmp), "step": _step(output)}

  last = run_batch_here(tmp, [["export", config, *common, "--overwrite"]])
  return {"first": first, "after_failures": after_failures, "killed": killed,
          "killed_err": killed_err, "killed_out": killed_out, "dead_pid": dead.pid,
          "after_kill": after_kill,
          "last": last, "after_last": {"listing": _listing(tmp), "step": _step(output)},
          "tmp": tmp}


def test_a_failed_export_removes_its_partial_directory_and_keeps_the_old_one(results):
  first = results["first"]
  for step in first[:3]:
    assert step["code"] == 0, step["stderr"] + step["traceback"]
  output = results["tmp"] / "exported"
  for failed in first[3:5]:  # Each retry fails the same way and leaves nothing behind.
    assert failed["code"] == 2, failed["stderr"] + failed["traceback"]
    line = error_line(failed)  # One line, no traceback: the path, the free space, what is kept.
    assert line.startswith(f"tpu-models export: error: No space left on device while exporting "
                           f"to {output} ("), line
    assert " free of " in line
    assert f"the partial export was removed and {output} is unchanged" in line
  assert results["after_failures"] == {"listing": ["exported"], "step": 4}


def test_overwrite_swaps_in_one_step_and_leftovers_of_dead_exports_are_removed(results):
  killed, tmp = results["killed"], results["tmp"]
  assert killed.returncode == -9, results["killed_err"][-3000:]
  # Killed right after the swap: the new export is in place, complete; the old one is in
  # the killed export's partial directory (exchanged in one step: never no export).
  assert results["after_kill"] == {"listing": ["exported", f"exported.partial-{killed.pid}"],
                                   "step": 6}
  # Each export first removes what dead exports left: the killed one removed the dead
  # pid's directory, the last one the killed one's.
  (last,) = results["last"]
  assert last["code"] == 0, last["stderr"] + last["traceback"]
  for pid, stdout in ((results["dead_pid"], results["killed_out"]), (killed.pid, last["stdout"])):
    assert (f"Removed {tmp / f'exported.partial-{pid}'}, left by an export (pid {pid} on "
            in stdout and "no longer runs." in stdout), stdout
  assert results["after_last"] == {"listing": ["exported"], "step": 6}
  assert f"Exported checkpoint {tmp / 'run' / 'ckpt-6'} (step 6)" in last["stdout"]
