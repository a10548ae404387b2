"""The cluster from TF_CONFIG (chief first), without starting servers."""
import json

import pytest

import epl
from epl.cluster import Cluster
from epl.runtime import cpu_threads
from epl.runtime import failures
from epl.runtime import server


def _cluster(monkeypatch, tf_config, devices=2):
  monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
  return Cluster.from_environment(
      epl.Config({"cluster.num_cpu_devices": devices}))


def test_chief_is_worker_zero_and_workers_follow(monkeypatch):
  spec = {"chief": ["h0:1000"], "worker": ["h1:1000", "h2:1000"]}
  chief = _cluster(monkeypatch, {"cluster": spec,
                                 "task": {"type": "chief", "index": 0}})
  second = _cluster(monkeypatch, {"cluster": spec,
                                  "task": {"type": "worker", "index": 1}})
  assert chief.worker_addresses == ["h0:1000", "h1:1000", "h2:1000"]
  assert (chief.worker_num, chief.worker_index) == (3, 0)
  assert second.worker_index == 2
  assert second.device_name(5) == "/job:worker/replica:0/task:2/device:CPU:1"
  assert server.task_filter(2) == "/job:worker/task:2"
  assert server.GROUP_LEADER == "/job:worker/replica:0/task:0"


def test_bad_tf_config_says_what_is_wrong(monkeypatch):
  with pytest.raises(ValueError, match="no parameter servers"):
    _cluster(monkeypatch, {"cluster": {"worker": ["a:1"], "ps": ["b:1"]}})
  with pytest.raises(ValueError, match="not in the cluster"):
    _cluster(monkeypatch, {"cluster": {"worker": ["a:1"]},
                           "task": {"type": "worker", "index": 3}})


def test_server_config_carries_devices_and_leader(monkeypatch):
  cluster = _cluster(monkeypatch, {"cluster": {"worker": ["a:1", "b:1"]},
                                   "task": {"type": "worker", "index": 1}},
                     devices=3)
  threads = cpu_threads.ThreadPlan(2, 3, "the test's")
  proto = server.base_config(cluster, epl.Config(), threads)
  assert proto.device_count["CPU"] == 3
  assert proto.experimental.collective_group_leader == server.GROUP_LEADER
  # The server makes this worker's devices: each gets its own pool.
  assert proto.intra_op_parallelism_threads == 2


def test_lost_peer_errors_become_worker_failures(monkeypatch):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  cluster = _cluster(monkeypatch, {"cluster": {"worker": ["a:1", "b:1"]},
                                   "task": {"type": "worker", "index": 0}})
  env = epl.Env(epl.Config({"cluster.collective_timeout_seconds": 7}),
                cluster)
  lost = tf.errors.UnavailableError(
      None, None, "Graph execution error:\n\nDetected at node 'x'\n"
      "Collective ops is aborted by: Socket closed\n")
  error = failures.explain(env, lost)
  assert isinstance(error, epl.WorkerFailureError)
  assert not isinstance(error, tf.errors.UnavailableError)
  assert "worker 0 of 2" in error.message
  assert "collective_timeout_seconds=7" in error.message
  assert error.message.endswith(
      "UnavailableError: Collective ops is aborted by: Socket closed")
  # Errors of the model itself pass through unchanged.
  assert failures.explain(env, tf.errors.InvalidArgumentError(
      None, None, "Shape mismatch in the collective instance 6")) is None
