"""The Horovod backend (communication.backend = "horovod").

One job, `epl-launch --backend horovod` (horovodrun -np 2, Gloo) x 2
logical CPU devices per process, runs every case of
tests/workers/horovod_worker.py in turn inside a private network and PID
namespace (tests/multiworker.py); the tests compare each case with plain
single-device TensorFlow on the same global batch of 32 rows.
"""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import epl
from epl import cluster
from epl.cluster import HorovodCluster
from epl.ir.taskgraph import TaskGraph
from epl.parallel.plan import planner
from epl.tools import horovod_launch
from epl.tools import launcher
from tests import tolerance
from tests import multiworker
from tests import tf_versions
from tests import training
from tests.workers import horovod_worker

WORKER_SCRIPT = os.path.join(multiworker.ROOT, "tests", "workers",
                             "horovod_worker.py")
FILES = 4


def _write_files(directory):
  paths = []
  for index in range(FILES):
    path = str(directory / ("part_%d.tfrecord" % index))
    with tf.io.TFRecordWriter(path) as writer:
      for record in range(2):
        writer.write(("part_%d-%d" % (index, record)).encode())
    paths.append(path)
  return paths


@pytest.fixture(scope="module")
def job(tmp_path_factory):
  """Runs the Horovod job once; (results of rank 0, of rank 1, out dir)."""
  tf_versions.require_horovod()
  multiworker.require_namespaces()
  out = tmp_path_factory.mktemp("horovod")
  files = _write_files(out)
  run = multiworker.launch(
      ["--backend", "horovod", "--num_workers", "2", "--gpu_per_worker", "2",
       "--cpu", WORKER_SCRIPT, "--out", str(out), "--files",
       ",".join(files)], timeout=400)
  import json  # pylint: disable=import-outside-toplevel
  results = []
  for rank in range(2):
    path = out / ("rank_%d.json" % rank)
    assert run.returncode == 0 and path.exists(), run.output[-8000:]
    results.append(json.loads(path.read_text()))
  return results, out


def _plain_graph(case):
  """The plain single-device graph of `case` on the global batch."""
  model_name, optimizer, _ = horovod_worker.CASES[case]
  x, y = training.input_batch(horovod_worker.GLOBAL_BATCH)
  loss = tf.reduce_mean(tf.square(horovod_worker.MODELS[model_name](x) - y))
  step = tf.compat.v1.train.get_or_create_global_step()
  train_op = training.OPTIMIZERS[optimizer]().minimize(loss, global_step=step)
  return train_op, loss, y


def _plain_run(case):
  """(variables, losses, labels of each step) of plain TensorFlow."""
  graph = tf.Graph()
  with graph.as_default():
    train_op, loss, labels = _plain_graph(case)
    names = [v.op.name for v in tf.compat.v1.trainable_variables()]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      steps = [session.run([train_op, loss, labels])[1:]
               for _ in range(horovod_worker.STEPS)]
      values = training.read_variables(session, graph, names)
  return values, [s[0] for s in steps], [s[1].reshape([-1]) for s in steps]


def _arrays(values):
  return {k: np.asarray(v) for k, v in values.items()}


@pytest.mark.parametrize("case", ["dense_momentum", "dense_adam",
                                  "sparse_momentum", "sparse_adam",
                                  "pipeline", "zero_v1", "zero_v2",
                                  "zero_v3"])
def test_two_processes_match_single_device(job, case):
  results, _ = job
  plain, losses, labels = _plain_run(case)
  for rank in range(2):
    result = results[rank][case]
    training.assert_close(_arrays(result["variables"]), plain)
    assert result["global_step"] == horovod_worker.STEPS
    # Merged fetches: the mean loss and every row's label, from every
    # replica of both processes.
    tolerance.assert_equivalent(result["merged_losses"], losses)
    np.testing.assert_allclose(np.asarray(result["labels"]),
                               np.asarray(labels))
    # The graph of each process only names its own devices.
    assert not [d for d in result["devices"] if "/job:" in d]


def test_fp16_overflow_falls_back_to_float32_on_every_rank(job):
  results, _ = job
  plain, _, _ = _plain_run("fp16_overflow")
  for rank in range(2):
    variables = _arrays(results[rank]["fp16_overflow"]["variables"])
    assert all(np.isfinite(v).all() for v in variables.values())
    training.assert_close(variables, plain)


def test_checkpoint_of_rank_zero_restores_into_single_device(job):
  results, out = job
  assert not os.listdir(out / "ckpt_1")
  checkpoint = results[0]["dense_momentum"]["checkpoint"]
  assert results[1]["dense_momentum"]["checkpoint"] == checkpoint.replace(
      "ckpt_0", "ckpt_1")
  plain, _, _ = _plain_run("dense_momentum")
  graph = tf.Graph()
  with graph.as_default():
    _plain_graph("dense_momentum")
    names = [v.op.name for v in tf.compat.v1.trainable_variables()]
    with tf.compat.v1.Session() as session:
      tf.compat.v1.train.Saver().restore(session, checkpoint)
      restored = training.read_variables(session, graph, names)
      step = session.run(tf.compat.v1.train.get_global_step())
  training.assert_close(restored, plain)
  assert step == horovod_worker.STEPS


def test_io_slicing_gives_each_rank_its_files(job):
  results, _ = job
  for rank in range(2):
    expected = ["part_%d-%d" % (part, record)
                for part in range(rank, FILES, 2) for record in range(2)]
    assert results[rank]["sliced_records"] == expected


def test_pipeline_across_processes_is_an_error_at_plan_time():
  stages = [TaskGraph(i, epl.replicate(device_count=1, name="stage_%d" % i))
            for i in range(2)]
  one_device_each = HorovodCluster(0, 2, "CPU", 1)
  with pytest.raises(ValueError, match="pipelines across processes"):
    planner.make_plan(one_device_each, stages, epl.Config())
  plan = planner.make_plan(HorovodCluster(1, 2, "CPU", 2), stages,
                           epl.Config())
  assert plan.local_replicas == [1]
  assert plan.devices[1] == ["/device:CPU:0", "/device:CPU:1"]


def test_make_test_builds_horovod_of_the_extra_with_gloo(tmp_path):
  if shutil.which("make") is None:
    pytest.skip("make is not installed")
  plan = subprocess.run(
      ["make", "-n", "test", "VENV=%s" % (tmp_path / "venv")],
      cwd=multiworker.ROOT, capture_output=True, text=True, timeout=60,
      check=True).stdout
  build = [line for line in plan.splitlines() if "--no-build-isolation" in line]
  assert build, plan
  for flag in ("HOROVOD_WITH_TENSORFLOW=1", "HOROVOD_WITH_GLOO=1",
               "HOROVOD_WITHOUT_MPI=1", "HOROVOD_WITHOUT_PYTORCH=1",
               "HOROVOD_WITHOUT_MXNET=1"):
    assert flag in build[0]
  assert "'horovod==0.28.1'" in plan
  # The version built is the one of setup.py's `horovod` extra.
  setup = open(os.path.join(multiworker.ROOT, "setup.py")).read()
  assert '"horovod": ["horovod==0.28.1"]' in setup
  assert plan.index("import horovod.tensorflow") < plan.index("-m pytest")


def test_backend_without_horovod_says_how_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "horovod.tensorflow", None)
  with pytest.raises(ImportError, match="make horovod"):
    epl.init(epl.Config({"communication.backend": "horovod"}))


def test_backend_with_tf_config_is_an_error(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1", "b:1"]}}')
  with pytest.raises(ValueError, match="horovodrun starts the workers"):
    epl.init(epl.Config({"communication.backend": "horovod"}))


def test_epl_launch_horovod_runs_horovodrun_over_every_machine():
  def command(*extra):
    args = launcher._parser().parse_args(  # pylint: disable=protected-access
        ["--backend", "horovod", "--num_workers", "4"] + list(extra) +
        ["train.py"])
    return horovod_launch.horovodrun_command(args, ["python", "train.py"])
  assert command("--machine_list", "h1,h2:99", "--log_dir", "logs")[1:] == [
      "-m", "horovod.runner.launch", "-np", "4", "-H", "h1:2,h2:2", "--gloo",
      "--output-filename", "logs", "python", "train.py"]
  assert command()[5:8] == ["-H", "localhost:4", "--gloo"]
  with pytest.raises(ValueError, match="first machine"):
    command("--machine_list", "h1,h2", "--machine_rank", "1")


def test_processes_of_one_machine_share_its_gpus_by_local_rank(monkeypatch):
  class FakeHorovod:
    @staticmethod
    def local_size():
      return 2

    @staticmethod
    def local_rank():
      return 1

  monkeypatch.setattr(cluster, "_visible_gpu_count", lambda devices: 4)
  config = epl.Config()
  assert cluster._local_gpus(config, FakeHorovod) == 2  # pylint: disable=protected-access
  assert config.cluster.run_visible_devices == "2,3"
  chosen = epl.Config({"cluster.run_visible_devices": "0,1,2,3"})
  assert cluster._local_gpus(chosen, FakeHorovod) == 4  # pylint: disable=protected-access
