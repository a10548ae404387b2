"""What a multi-worker job exposes (docs/security.md), seen from outside it.

Every test runs in private network and PID namespaces of its own
(tests/multiworker.py): "outside the job" is the namespace that started
`epl-launch`. TensorFlow's gRPC servers listen on every interface and run
any graph sent to them, so a one-machine job must listen nowhere there, or
say so; a multi-machine job's worker 0 says what it opens; bad input is an
error before anything listens.
"""
import json
import os
import stat
import sys

import pytest

from epl.tools import private_network
from tests import multiworker

pytestmark = pytest.mark.usefixtures("_namespaces")

EXPOSURE = os.path.join(multiworker.ROOT, "tests", "workers",
                        "job_exposure.py")
BAD_INPUT = os.path.join(multiworker.ROOT, "tests", "workers",
                         "bad_input.py")
_EVERY_INTERFACE = ("00000000", "00000000000000000000000000000000")


@pytest.fixture(scope="module")
def _namespaces():
  multiworker.require_namespaces()


def _exposure(tmp_path, workers, jobs, env=None, setup=""):
  """Runs job_exposure.py in the test's namespace; its report."""
  command = [sys.executable, EXPOSURE, str(workers),
             str(tmp_path / "release")]
  for job in jobs:
    command += ["--"] + job
  run = multiworker.run_in_namespace(command, timeout=240, env=env,
                                     setup=setup)
  assert run.returncode == 0, run.output[-6000:]
  report = json.loads(run.output.strip().splitlines()[-1])
  assert report["returncodes"] == [0] * len(jobs), report["outputs"]
  return report


def _warnings(output):
  """The launcher's and EPL's warning lines (not TensorFlow's own)."""
  return [l for l in output.splitlines()
          if "[epl-launch] WARNING" in l or "[EPL WARNING]" in l]


def _ports(report):
  """The cluster's ports, in TF_CONFIG order."""
  return [int(p) for p in report["connects"]]


def test_one_machine_job_listens_nowhere_outside_it(tmp_path):
  problem = private_network.problem()
  if problem:
    pytest.skip("no private network namespace for the job here (%s): "
                "test_without_a_private_network_the_launcher_warns checks "
                "the warning instead" % problem)
  report = _exposure(tmp_path, 2, [["--num_workers", "2", "--cpu"]])
  output, = report["outputs"]
  ports = _ports(report)
  assert len(ports) == 2, output
  # The servers run (inside the job's namespace) ...
  assert "[worker 0] serving 0" in output and "[worker 1] serving 1" in output
  assert ("[epl-launch] private network: the job runs in a network "
          "namespace of its own (unshare --user --map-root-user --net), so "
          "the workers' gRPC servers (ports %d, %d) are reachable from the "
          "job only" % tuple(ports)) in output
  # ... and outside it nothing listens on their ports, not even loopback.
  assert not [l for l in report["listening"] if l[1] in ports], report
  assert report["connects"] == {str(p): False for p in ports}
  assert _warnings(output) == []


def test_without_a_private_network_the_launcher_warns(tmp_path):
  # An `unshare` that fails as it does where user namespaces are disabled.
  tools = tmp_path / "tools"
  tools.mkdir()
  fake = tools / "unshare"
  fake.write_text("#!/bin/sh\necho 'unshare: write failed /proc/self/"
                  "uid_map: Operation not permitted' >&2\nexit 1\n")
  fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
  report = _exposure(
      tmp_path, 2, [["--num_workers", "2", "--cpu"]],
      env={"PATH": "%s:%s" % (tools, os.environ["PATH"])})
  output, = report["outputs"]
  ports = _ports(report)
  assert _warnings(output) == [
      "[epl-launch] WARNING no private network namespace here (`unshare "
      "--user --map-root-user --net` failed: unshare: write failed "
      "/proc/self/uid_map: Operation not permitted): the workers' gRPC "
      "servers (ports %d, %d) listen on every interface of this machine "
      "and any host that reaches it can connect without authentication "
      "and run any graph it sends (reading and writing this user's "
      "files); run only on a trusted network (docs/security.md)" %
      tuple(ports)], output
  # What the warning says is so: the ports listen on every interface.
  for port in ports:
    assert [a for a, p in report["listening"] if p == port and
            a in _EVERY_INTERFACE], report["listening"]
  assert report["connects"] == {str(p): True for p in ports}
  assert "[epl-launch] all 2 worker(s) succeeded" in output


def test_multi_machine_job_worker_zero_says_what_it_opens(tmp_path):
  # Two "machines" in one namespace: addresses on a veth pair, so the
  # namespace has interfaces besides loopback, as a real machine does.
  setup = ("ip link add v0 type veth peer name v1 && "
           "ip addr add 10.9.0.1/24 dev v0 && ip addr add 10.9.0.2/24 dev v1 "
           "&& ip link set v0 up && ip link set v1 up")
  machines = "10.9.0.1:23456,10.9.0.2:23457"
  report = _exposure(tmp_path, 2, [
      ["--num_workers", "2", "--cpu", "--machine_list", machines,
       "--machine_rank", str(rank)] for rank in (0, 1)], setup=setup)
  first, second = report["outputs"]
  said = ("[worker 0] [EPL WARNING] epl.init: the job's 2 gRPC servers "
          "listen on every interface of their machines (here v0, v1 besides "
          "loopback), at 10.9.0.1:23456, 10.9.0.2:23457; they accept connections from "
          "any host that reaches them, without authentication, and run the "
          "graphs it sends: keep these ports closed to all but the job's "
          "machines (docs/security.md)")
  assert _warnings(first) == [said], first
  assert _warnings(second) == [], second


_CLUSTER = {"cluster": {"worker": ["127.0.0.1:24690", "127.0.0.1:24691"]},
            "task": {"type": "worker", "index": 0}}


def test_bad_tf_config_and_epl_values_fail_before_anything_listens():
  good = json.dumps(_CLUSTER)
  cases = [
      ({"TF_CONFIG": "{'cluster': {}}"}, "ValueError: TF_CONFIG is not "
       "valid JSON"),
      ({"TF_CONFIG": json.dumps({"cluster": {
          "worker": "127.0.0.1:24690,127.0.0.1:24691"}})},
       "ValueError: TF_CONFIG cluster 'worker' must be a list of "
       "'host:port' strings, got '127.0.0.1:24690,127.0.0.1:24691'"),
      ({"TF_CONFIG": json.dumps({"cluster": {"worker": ["127.0.0.1"]}})},
       "ValueError: TF_CONFIG cluster 'worker': '127.0.0.1' is not "
       "'host:port' (a port in 1-65535)."),
      ({"TF_CONFIG": json.dumps({"cluster": {"worker": [
          "127.0.0.1:24690", "127.0.0.1:24690"]}})},
       "ValueError: TF_CONFIG names 127.0.0.1:24690 for several tasks; "
       "each task listens on its own host:port."),
      ({"TF_CONFIG": json.dumps(dict(_CLUSTER, task={"index": "first"}))},
       "ValueError: TF_CONFIG task index must be a whole number, got "
       "'first'"),
      ({"TF_CONFIG": json.dumps([_CLUSTER])}, "ValueError: TF_CONFIG must "
       "be a JSON object"),
      ({"TF_CONFIG": good, "EPL_PIPELINE_NUM_MICRO_BATCH": "four"},
       "EPL_PIPELINE_NUM_MICRO_BATCH"),
      ({"TF_CONFIG": good, "EPL_CLUSTER_COLLECTIVE_TIMEOUT_SECONDS": "-5"},
       "EPL_CLUSTER_COLLECTIVE_TIMEOUT_SECONDS"),
      ({"TF_CONFIG": good, "EPL_PIPELINE_NUM_MICROBATCH": "4"},
       "EPL_PIPELINE_NUM_MICROBATCH"),
  ]
  run = multiworker.run_in_namespace(
      [sys.executable, BAD_INPUT, json.dumps([env for env, _ in cases])],
      timeout=240)
  assert run.returncode == 0, run.output[-6000:]
  results = json.loads(run.output.strip().splitlines()[-1])
  for (env, expected), result in zip(cases, results):
    assert result["error"] is not None and expected in result["error"], (
        env, result)
    assert result["listening"] == [], (env, result)
