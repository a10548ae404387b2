"""epl-launch: TF_CONFIG, devices, prefixed output, failures and Ctrl-C."""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from epl.tools import launcher
from tests import multiworker

# Each worker prints its TF_CONFIG task, its device settings and its pid.
_REPORT = ("import json, os; c = json.loads(os.environ['TF_CONFIG']); "
           "print('task', c['task']['index'], len(c['cluster']['worker']), "
           "'cpu', os.environ.get('EPL_CLUSTER_NUM_CPU_DEVICES'), "
           "'pid', os.getpid(), flush=True)")


def _args(**kwargs):
  values = dict(num_workers=2, gpu_per_worker=1, base_port=None,
                host="127.0.0.1", machine_list=None, machine_rank=None)
  values.update(kwargs)
  return argparse.Namespace(**values)


def test_addresses_for_one_and_several_machines():
  addresses, mine = launcher.worker_addresses(_args(base_port=7000))
  assert addresses == ["127.0.0.1:7000", "127.0.0.1:7001"]
  assert mine == [0, 1]
  addresses, mine = launcher.worker_addresses(_args(
      num_workers=4, machine_list="10.0.0.1,10.0.0.2:9000", machine_rank=1))
  assert addresses == ["10.0.0.1:23456", "10.0.0.1:23457", "10.0.0.2:9000",
                       "10.0.0.2:9001"]
  assert mine == [2, 3]
  with pytest.raises(ValueError, match="multiple of the 2 machines"):
    launcher.worker_addresses(_args(num_workers=3, machine_list="a,b",
                                    machine_rank=0))
  with pytest.raises(ValueError, match="--machine_rank must be in"):
    launcher.worker_addresses(_args(machine_list="a,b"))


def test_commands_by_kind():
  assert launcher.command_line(["run.sh", "x"]) == ["bash", "run.sh", "x"]
  assert launcher.command_line(["t.py"]) == [sys.executable, "t.py"]
  assert launcher.command_line(["--", "python", "-m", "m"]) == [
      "python", "-m", "m"]


def test_workers_get_tf_config_devices_and_prefixed_output(tmp_path):
  multiworker.require_namespaces()
  job = multiworker.launch(
      ["--num_workers", "2", "--gpu_per_worker", "3", "--cpu", "--log_dir",
       str(tmp_path), "--", sys.executable, "-c", _REPORT], timeout=60)
  assert job.returncode == 0, job.output
  assert ("[epl-launch] no GPU used: each of the 2 worker(s) on this "
          "machine gets 3 logical CPU device(s) "
          "(EPL_CLUSTER_NUM_CPU_DEVICES=3)") in job.output
  for worker in range(2):
    line, = job.lines(worker)
    assert line.startswith("task %d 2 cpu 3 pid" % worker)
    logged = (tmp_path / ("worker_%d.log" % worker)).read_text()
    assert logged == line + "\n"
  assert "[epl-launch] all 2 worker(s) succeeded" in job.output


def test_a_failed_worker_stops_the_others_and_the_job_fails():
  multiworker.require_namespaces()
  code = ("import json, os, sys, time; "
          "w = json.loads(os.environ['TF_CONFIG'])['task']['index']; "
          "print('up', flush=True); time.sleep(0.5) if w else None; "
          "sys.exit(3) if w else time.sleep(120)")
  job = multiworker.launch(["--num_workers", "2", "--cpu", "--grace_period",
                            "0.5", "--", sys.executable, "-c", code],
                           timeout=60)
  assert job.returncode == 3, job.output
  assert "[epl-launch] worker 1 exited with status 3" in job.output
  assert "[epl-launch] stopping the workers still running" in job.output
  assert job.seconds < 30


def test_ctrl_c_stops_every_worker():
  # No servers here (the workers only sleep), so no namespace is needed:
  # the launcher itself must stop its workers, by process group.
  code = _REPORT + "; import time; time.sleep(120)"
  process = subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, "-m", "epl.tools.launcher", "--num_workers", "2",
       "--cpu", "--base_port", "45000", "--", sys.executable, "-c", code],
      cwd=multiworker.ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True, start_new_session=True)
  pids = []
  try:
    for line in process.stdout:
      if " pid " in line and line.startswith("[worker"):
        pids.append(int(line.split()[-1]))
      if len(pids) == 2:
        break
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=30)
  finally:
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)
  assert process.returncode == 128 + signal.SIGINT
  assert "stopping every worker" in rest
  time.sleep(0.2)
  for pid in pids:
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)
