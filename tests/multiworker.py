"""Running multi-worker jobs in tests: epl-launch in a private namespace.

Each job runs `python -m epl.tools.launcher ...` under
`unshare -rn --pid --fork --kill-child`: a private network namespace (its
own loopback, so servers on 127.0.0.1 ports meet nothing outside) and a
private PID namespace whose first process is the launcher, so that when
the launcher ends, or the test stops it, the kernel ends every worker too.
Every job has a time limit. (A one-machine launcher then puts its workers
in a network namespace of their own inside that one: see
tests/test_job_exposure.py.)
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER_SCRIPT = os.path.join(ROOT, "tests", "workers", "train_worker.py")


def namespace_problem():
  """Why private namespaces cannot be made here, or None."""
  for tool in ("unshare", "ip"):
    if shutil.which(tool) is None:
      return "%s is not installed (util-linux / iproute2)" % tool
  probe = subprocess.run(
      ["unshare", "-rn", "--pid", "--fork", "--kill-child", "sh", "-c",
       "ip link set lo up && echo ok"], capture_output=True, text=True,
      timeout=60, check=False)
  if probe.returncode != 0 or "ok" not in probe.stdout:
    return "unshare -rn cannot make a private network namespace: %s" % (
        probe.stderr.strip() or probe.returncode)
  return None


def require_namespaces():
  problem = namespace_problem()
  if problem:
    pytest.skip("multi-worker tests need private namespaces: " + problem)


class Job:
  def __init__(self, returncode, output, seconds):
    self.returncode = returncode
    self.output = output
    self.seconds = seconds

  def lines(self, worker):
    prefix = "[worker %d] " % worker
    return [l[len(prefix):] for l in self.output.splitlines()
            if l.startswith(prefix)]


def listening():
  """[address, port] of every TCP socket listening in this network
  namespace, from /proc/net/tcp and tcp6 (what `ss -ltn` shows); the
  address in the kernel's hex ('00000000': every IPv4 interface)."""
  found = []
  for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    with open(table) as rows:
      for row in list(rows)[1:]:
        fields = row.split()
        if fields[3] == "0A":  # TCP_LISTEN
          address, port = fields[1].split(":")
          found.append([address, int(port, 16)])
  return found


def _environment(env):
  full_env = dict(os.environ)
  full_env["PYTHONPATH"] = ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
  full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  full_env.pop("TF_CONFIG", None)
  full_env.update(env or {})
  return full_env


def run_in_namespace(command, timeout=240, env=None, setup=""):
  """Runs `command` in private network and PID namespaces, after bringing
  up their loopback and running the shell commands `setup`; returns a
  Job."""
  # unshare found here, not on `env`'s PATH (a test may shadow it there).
  line = [shutil.which("unshare"), "-rn", "--pid", "--fork", "--kill-child", "sh", "-c",
          'ip link set lo up && %s exec "$0" "$@"' % (
              setup + " &&" if setup else "")] + list(command)
  start = time.monotonic()
  process = subprocess.Popen(  # pylint: disable=consider-using-with
      line, cwd=ROOT, env=_environment(env), stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True, start_new_session=True)
  try:
    output, _ = process.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(process.pid, signal.SIGKILL)
    output, _ = process.communicate()
    pytest.fail("the job ran past %ds:\n%s" % (timeout, output[-6000:]))
  return Job(process.returncode, output, time.monotonic() - start)


def launch(launcher_args, timeout=240, env=None):
  """Runs epl-launch with `launcher_args`; returns a Job."""
  return run_in_namespace(
      [sys.executable, "-m", "epl.tools.launcher"] + list(launcher_args),
      timeout=timeout, env=env)


def train_job(tmp_path, name, num_workers=2, devices=2, launcher=(),
              limit=240, env=None, processes_per_worker=1,
              script=WORKER_SCRIPT, **options):
  """Runs `script` (tests/workers/train_worker.py, or another worker
  script taking --out and `options`) on `num_workers` workers of
  `devices` devices, each worker as `processes_per_worker` processes (with
  `env` added to their environment); returns (job, [each process's result
  dict or None], in TF_CONFIG order)."""
  out = tmp_path / name
  out.mkdir()
  args = ["--num_workers", str(num_workers), "--gpu_per_worker",
          str(devices), "--processes_per_worker", str(processes_per_worker),
          "--cpu"] + list(launcher) + [script, "--out", str(out)]
  for key, value in options.items():
    if value is True:
      args.append("--" + key)
    elif value is not None and value is not False:
      args += ["--" + key, str(value)]
  job = launch(args, timeout=limit, env=env)
  results = []
  for worker in range(num_workers * processes_per_worker):
    path = out / ("worker_%d.json" % worker)
    results.append(json.loads(path.read_text()) if path.exists() else None)
  return job, results
