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
                host="127.0.0.1", machine_list=None, machine_rank=None,
                processes_per_worker=1)
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


def test_addresses_others_can_reach_and_repeated_machines_are_refused(
    capsys):
  for host in ("localhost", "127.0.0.2"):
    launcher.worker_addresses(_args(host=host, base_port=7000))
  for host in ("0.0.0.0", "10.0.0.1", "myhost", "::"):
    with pytest.raises(ValueError, match=(
        r"--host %s: the workers of a one-machine job reach each other "
        r"over loopback .* accept connections without authentication .* "
        r"give --machine_list" % host)):
      launcher.worker_addresses(_args(host=host, base_port=7000))
  with pytest.raises(SystemExit):
    launcher.main(["--num_workers", "2", "--host", "0.0.0.0", "train.py"])
  assert "--host 0.0.0.0: the workers of a one-machine job" in (
      capsys.readouterr().err)
  with pytest.raises(ValueError, match=(
      r"--machine_list names 10.0.0.1 twice \('10.0.0.1' and "
      r"'10.0.0.1:23457'\): both would run a worker listening on "
      r"10.0.0.1:23457")):
    launcher.worker_addresses(_args(
        num_workers=4, machine_list="10.0.0.1,10.0.0.1:23457",
        machine_rank=0))
  # One host twice with ports apart is two sets of workers, as asked.
  addresses, _ = launcher.worker_addresses(_args(
      num_workers=4, machine_list="h:9000,h:9002", machine_rank=1))
  assert addresses == ["h:9000", "h:9001", "h:9002", "h:9003"]
  with pytest.raises(ValueError, match="'h:x' is not 'host' or "
                     "'host:base_port'"):
    launcher.worker_addresses(_args(machine_list="h:x,g", machine_rank=0))
  with pytest.raises(SystemExit):
    launcher.main(["--num_workers", "2", "--machine_list", "a,b",
                   "--machine_rank", "0", "--network", "private", "t.py"])
  assert "--network private is for a one-machine job" in (
      capsys.readouterr().err)


def test_processes_per_worker_are_tasks_with_a_share_of_the_devices():
  # 2 workers x 2 processes: 4 tasks, process p of worker w is task 2w + p.
  args = _args(gpu_per_worker=4, processes_per_worker=2, base_port=7000)
  addresses, mine = launcher.worker_addresses(args)
  assert addresses == ["127.0.0.1:%d" % p for p in range(7000, 7004)]
  assert mine == [0, 1, 2, 3]
  for local, index in enumerate(mine):
    gpu = launcher.worker_env(addresses, index, local, args, gpus=8)
    assert json.loads(gpu["TF_CONFIG"]) == {
        "cluster": {"worker": addresses},
        "task": {"type": "worker", "index": index}}
    assert gpu["CUDA_VISIBLE_DEVICES"] == "%d,%d" % (2 * local, 2 * local + 1)
    cpu = launcher.worker_env(addresses, index, local, args, gpus=0)
    assert cpu["CUDA_VISIBLE_DEVICES"] == ""
    assert cpu["EPL_CLUSTER_NUM_CPU_DEVICES"] == "2"
  # On 2 machines each runs its worker's 2 processes, from its base port.
  addresses, mine = launcher.worker_addresses(_args(
      gpu_per_worker=2, processes_per_worker=2,
      machine_list="10.0.0.1,10.0.0.2:9000", machine_rank=1))
  assert addresses == ["10.0.0.1:23456", "10.0.0.1:23457", "10.0.0.2:9000",
                       "10.0.0.2:9001"]
  assert mine == [2, 3]
  env = launcher.worker_env(addresses, 3, 1, _args(
      gpu_per_worker=2, processes_per_worker=2), gpus=2)
  assert env["CUDA_VISIBLE_DEVICES"] == "1"


def test_processes_per_worker_errors(capsys):
  with pytest.raises(ValueError, match=(
      r"--gpu_per_worker 3 is not a multiple of --processes_per_worker 2.*"
      r"--processes_per_worker 3 gives one process per device")):
    launcher.worker_addresses(_args(gpu_per_worker=3, processes_per_worker=2))
  with pytest.raises(ValueError, match="--processes_per_worker must be at "
                     "least 1, got 0"):
    launcher.worker_addresses(_args(processes_per_worker=0))
  with pytest.raises(SystemExit):
    launcher.main(["--num_workers", "2", "--gpu_per_worker", "4",
                   "--processes_per_worker", "4", "--backend", "horovod",
                   "train.py"])
  assert ("--processes_per_worker is for the collective backend: under "
          "horovodrun each process is a worker of its own, so give "
          "--num_workers 8 --gpu_per_worker 1 instead") in (
              capsys.readouterr().err)


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


def test_processes_of_workers_get_tasks_devices_and_a_warning():
  multiworker.require_namespaces()
  job = multiworker.launch(
      ["--num_workers", "2", "--gpu_per_worker", "2", "--cpu",
       "--processes_per_worker", "2", "--", sys.executable, "-c", _REPORT],
      timeout=60)
  assert job.returncode == 0, job.output
  assert ("[epl-launch] 2 worker(s) x 2 processes on this machine, 1 logical "
          "CPU device(s) per process (CUDA_VISIBLE_DEVICES='', "
          "EPL_CLUSTER_NUM_CPU_DEVICES=1): 4 EPL workers in TF_CONFIG") in (
              job.output)
  assert ("[epl-launch] WARNING --processes_per_worker 2: a pipeline replica "
          "or split group needing more than 1 device(s) spans processes") in (
              job.output)
  for task in range(4):
    line, = job.lines(task)
    assert line.startswith("task %d 4 cpu 1 pid" % task)
  assert "[epl-launch] all 4 worker(s) succeeded" in job.output


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
