"""The thread pools of logical CPU devices (epl.runtime.cpu_threads): the
plan epl.init decides, what TensorFlow then makes, and that training is
unchanged. The scripts run in fresh processes: TensorFlow decides between
one pool and a pool per device once per process."""
import math
import os
import types

import pytest
import tensorflow as tf

import epl
from epl.runtime import cpu_threads
from epl.runtime import session as epl_session
from epl.tf_compat import thread_pools
from tests import training

CORES = len(os.sched_getaffinity(0))
# What epl.init gives each of 4 logical CPU devices on this machine.
THREADS_OF_4 = max(1, math.ceil(CORES / 4))


def _cluster(devices, device_type="CPU"):
  return types.SimpleNamespace(device_type=device_type,
                               devices_per_worker=devices)


def _decide(devices=4, wanted=None, cores=2, environment=None,
            eager_started=False, device_type="CPU"):
  config = epl.Config({"cluster.cpu_device_threads": wanted})
  return cpu_threads.decide(config, _cluster(devices, device_type), cores,
                            environment, eager_started)


@pytest.mark.parametrize("cores,devices,threads", [
    (2, 4, 1), (16, 4, 4), (6, 4, 2), (3, 2, 2), (64, 8, 8)])
def test_each_device_gets_the_cores_over_the_devices(cores, devices,
                                                     threads):
  plan = _decide(devices=devices, cores=cores)
  assert plan.threads_per_device == threads
  assert plan.devices == devices
  assert "side by side" in plan.describe()


def test_a_setting_of_threads_wins_over_the_cores():
  plan = _decide(wanted=3, cores=2)
  assert plan.threads_per_device == 3
  assert plan.configured
  assert not _decide().configured


@pytest.mark.parametrize("why,arguments", [
    ("one CPU device", {"devices": 1}),
    ("one CPU device", {"device_type": "GPU"}),
    ("cluster.cpu_device_threads is 0", {"wanted": 0}),
    ("TF_OVERRIDE_GLOBAL_THREADPOOL is false", {"environment": False}),
    ("eager runtime started before epl.init", {"eager_started": True}),
])
def test_one_shared_pool_and_why(why, arguments):
  plan = _decide(**arguments)
  assert plan.threads_per_device is None
  assert why in plan.describe()


def test_eager_runtime_started_with_pools_asked_keeps_them():
  # An earlier epl.init of this process asked before the runtime started.
  assert _decide(environment=True, eager_started=True).threads_per_device


def test_a_session_config_of_the_users_own_threads_is_kept():
  epl.init(epl.Config({"cluster.num_cpu_devices": 4}))
  env = epl.Env.get()
  # What epl.init decided depends on what ran before in this process (an
  # eager op of an earlier test): the plan is set here.
  env.cpu_threads = cpu_threads.ThreadPlan(2, 4, "the test's")
  _, merged = epl_session.session_settings(
      env, "", tf.compat.v1.ConfigProto(intra_op_parallelism_threads=3))
  assert merged.intra_op_parallelism_threads == 3
  _, merged = epl_session.session_settings(env, "", None)
  assert merged.intra_op_parallelism_threads == 2


_TRAIN_AGAINST_ONE_DEVICE = """
import os
import sys
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
import epl
from tests import training

def threads_a_session_starts():
  before = len(os.listdir("/proc/self/task"))
  session = tf.compat.v1.Session()
  started = len(os.listdir("/proc/self/task")) - before
  session.close()
  return started

if sys.argv[1].startswith("session_first"):
  threads_a_session_starts()
config = {"cluster.num_cpu_devices": 4}
if sys.argv[1] == "one_pool":
  config["cluster.cpu_device_threads"] = 0
if sys.argv[1] == "session_first_two_threads":
  config["cluster.cpu_device_threads"] = 2
epl.init(epl.Config(config))
print("THREADS_STARTED", threads_a_session_starts())
print("ASKED", os.environ.get("TF_OVERRIDE_GLOBAL_THREADPOOL"))
# 4 replicas of 4 rows against one device's 16.
parallel, _, _ = training.train(config=config, optimizer="adam", steps=3,
                                batch_size=4)
parallel_again, _, _ = training.train(config=config, optimizer="adam",
                                      steps=3, batch_size=4)
epl.shutdown()
single, _, _ = training.train(with_epl=False, optimizer="adam", steps=3,
                              batch_size=16)
training.assert_close(parallel, single)
training.assert_close(parallel_again, single)
print("EQUAL_TO_ONE_DEVICE")
"""


@pytest.fixture(name="fresh_environment", autouse=True)
def _fresh_environment(monkeypatch):
  """The scripts' processes start without the variable an epl.init of this
  process may have set (children inherit it)."""
  monkeypatch.delenv(thread_pools.POOL_PER_DEVICE_VARIABLE, raising=False)


def _run(tmp_path, case):
  script = tmp_path / "threads.py"
  script.write_text(_TRAIN_AGAINST_ONE_DEVICE)
  out = training.run_client(script, case)
  assert "EQUAL_TO_ONE_DEVICE" in out, out
  started = int(out.split("THREADS_STARTED", 1)[1].split()[0])
  return out, started


@pytest.mark.timeout(300)
def test_each_cpu_device_runs_on_a_pool_of_its_own(tmp_path):
  out, started = _run(tmp_path, "init_first")
  assert ("CPU threads: a pool of %d thread(s) for each of the 4 CPU "
          "devices" % THREADS_OF_4) in out
  # The first session also starts TensorFlow's inter-op pool.
  assert started >= 4 * THREADS_OF_4, out
  assert "share one pool" not in out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case,level", [
    # EPL's default: a script comparing plain TF first is told at INFO.
    ("session_first", "[EPL INFO]"),
    # Threads the configuration asked for: a warning.
    ("session_first_two_threads", "[EPL WARNING]")])
def test_a_session_opened_before_init_is_said_once_and_trains_the_same(
    tmp_path, case, level):
  out, started = _run(tmp_path, case)
  assert started == 0, out
  assert out.count("share one pool") == 1, out
  assert "%s EPL asked TensorFlow" % level in out, out


@pytest.mark.timeout(300)
def test_zero_threads_keeps_tensorflows_one_pool(tmp_path):
  out, _ = _run(tmp_path, "one_pool")
  assert ("CPU threads: one pool shared by the CPU devices, because "
          "cluster.cpu_device_threads is 0") in out
  assert "ASKED None" in out
  assert "share one pool" not in out


_EAGER = """
import sys
import tensorflow as tf
import epl
if sys.argv[1] == "started":
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
  tf.constant(1.0)
epl.init(epl.Config({"cluster.num_cpu_devices": 4}))
print("INTRA", tf.config.threading.get_intra_op_parallelism_threads())
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case,intra,line", [
    ("fresh", THREADS_OF_4, "a pool of %d thread(s)" % THREADS_OF_4),
    ("started", 0, "eager runtime started before epl.init")])
def test_the_eager_runtime_gets_the_plan_before_it_starts(tmp_path, case,
                                                          intra, line):
  script = tmp_path / "eager.py"
  script.write_text(_EAGER)
  out = training.run_client(script, case)
  assert "INTRA %d" % intra in out, out
  assert line in out, out
