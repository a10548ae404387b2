"""Multi-worker jobs over gRPC, started by epl-launch in private namespaces.

Each job runs tests/workers/train_worker.py on 2 workers x 2 logical CPU
devices (4 replicas, 8 rows each: a global batch of 32), each worker
reading its own half of every global batch. See tests/multiworker.py for
how jobs are isolated and bounded.
"""
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from tests import tolerance
from tests import multiworker
from tests import training

pytestmark = pytest.mark.usefixtures("_namespaces")

GLOBAL_BATCH = 32


@pytest.fixture(scope="module")
def _namespaces():
  multiworker.require_namespaces()


def _plain_run(steps, ckpt_dir=None, save_at=None):
  """Single-device TF on the global batch: (losses, variables by name)."""
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(GLOBAL_BATCH)
    loss = tf.reduce_mean(tf.square(training.layers_model(x) - y))
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = training.OPTIMIZERS["momentum"]().minimize(loss,
                                                          global_step=step)
    saver = tf.compat.v1.train.Saver()
    names = [v.op.name for v in tf.compat.v1.trainable_variables()]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      losses = []
      for i in range(steps):
        losses.append(session.run([train_op, loss])[1])
        if save_at == i + 1:
          saver.save(session, os.path.join(ckpt_dir, "model"),
                     global_step=step)
      values = training.read_variables(session, graph, names)
  return losses, values


def _restore_plain(checkpoint):
  """Variables of a checkpoint restored into the plain single-device graph."""
  graph = tf.Graph()
  with graph.as_default():
    x, y = training.input_batch(GLOBAL_BATCH)
    loss = tf.reduce_mean(tf.square(training.layers_model(x) - y))
    step = tf.compat.v1.train.get_or_create_global_step()
    training.OPTIMIZERS["momentum"]().minimize(loss, global_step=step)
    names = [v.op.name for v in tf.compat.v1.trainable_variables()]
    with tf.compat.v1.Session() as session:
      tf.compat.v1.train.Saver().restore(session, checkpoint)
      values = training.read_variables(session, graph, names)
      values["global_step"] = session.run(step)
  return values


def _arrays(values):
  return {k: np.asarray(v) for k, v in values.items()}


def _assert_ok(job, results):
  assert job.returncode == 0, job.output[-8000:]
  assert all(r is not None for r in results), job.output[-8000:]


def test_two_workers_match_one_process_and_single_device(tmp_path):
  job, results = multiworker.train_job(tmp_path, "dp", steps=5)
  _assert_ok(job, results)
  plain_losses, plain = _plain_run(5)
  one_process, one_process_losses, _ = training.train(
      batch_size=8, config={"cluster.num_cpu_devices": 4})
  one_process.pop("global_step")
  worker0, worker1 = results
  # Worker 1 initialized with other seeds: the init broadcast gave it
  # worker 0's weights.
  training.assert_close(_arrays(worker1["initial"]),
                        _arrays(worker0["initial"]), atol=0)
  for result in results:
    training.assert_close(_arrays(result["variables"]), plain)
    training.assert_close(_arrays(result["variables"]), one_process)
    assert result["global_step"] == 5
    # Merged fetches span both workers: the mean loss of the global batch,
    # the labels of all 32 rows in replica order, and their count.
    tolerance.assert_equivalent(result["merged"], plain_losses)
    _, y = training.dataset_arrays()
    for step, labels in enumerate(result["labels"]):
      np.testing.assert_allclose(
          labels, y[step * GLOBAL_BATCH:(step + 1) * GLOBAL_BATCH, 0])
    assert result["rows"] == [GLOBAL_BATCH] * 5
  # `loss` itself is replica 0's, as in one process.
  tolerance.assert_equivalent(worker0["losses"], one_process_losses)
  assert "[worker 0] worker 0 done" in job.output
  assert "[worker 1] worker 1 done" in job.output


def test_checkpoints_kill_and_resume(tmp_path):
  # A single-process checkpoint after 2 steps of the global batch ...
  single = tmp_path / "single"
  single.mkdir()
  plain_losses, plain = _plain_run(8, ckpt_dir=str(single), save_at=2)
  uninterrupted_dir = tmp_path / "ckpt_full"
  interrupted_dir = tmp_path / "ckpt_cut"
  shutil.copytree(single, uninterrupted_dir)
  shutil.copytree(single, interrupted_dir)

  # ... restores into both workers, which train on to step 8, saving every
  # 2 steps (worker 0 writes).
  job, full = multiworker.train_job(tmp_path, "full", steps=8,
                                    ckpt_dir=uninterrupted_dir,
                                    collective_timeout=20)
  _assert_ok(job, full)
  for result in full:
    assert result["start"] == 2
    tolerance.assert_equivalent(result["merged"], plain_losses[2:])
    training.assert_close(_arrays(result["variables"]), plain)
  assert sum("saved" in l for l in job.lines(0)) == 3
  # The multi-worker checkpoint restores into a single-device graph.
  restored = _restore_plain(str(uninterrupted_dir / "model-8"))
  assert restored.pop("global_step") == 8
  training.assert_close(restored, plain)

  # Worker 1 dies before step 5: worker 0 stops on its own, fast, with a
  # clear error (the launcher would wait 60s before stopping it).
  job, cut = multiworker.train_job(
      tmp_path, "cut", steps=8, ckpt_dir=interrupted_dir, kill_at_step=5,
      collective_timeout=20, launcher=["--grace_period", "60"])
  assert job.returncode != 0
  assert cut == [None, None]
  worker0 = "\n".join(job.lines(0))
  assert "WorkerFailureError: EPL worker 0 of 2" in worker0
  assert "another worker stopped answering" in worker0
  assert "[epl-launch] worker 0 exited with status 1" in job.output
  assert "stopping the workers still running" not in job.output
  assert job.seconds < 60, job.seconds
  assert tf.train.latest_checkpoint(str(interrupted_dir)).endswith("model-4")

  # The restarted job resumes from step 4 and continues the loss curve.
  job, resumed = multiworker.train_job(tmp_path, "resumed", steps=8,
                                       ckpt_dir=interrupted_dir,
                                       collective_timeout=20)
  _assert_ok(job, resumed)
  for before, after in zip(full, resumed):
    assert after["start"] == 4
    tolerance.assert_equivalent(after["losses"], before["losses"][2:])
    tolerance.assert_equivalent(after["merged"], before["merged"][2:])
    training.assert_close(_arrays(after["variables"]),
                          _arrays(before["variables"]))


def _crashed_while_aborting(job):
  """TensorFlow sometimes crashes while aborting the timed-out collectives,
  instead of raising: signal 11 on 2.15, signal 6 on 2.21 (abseil's
  "Mutex corrupt: both reader and writer lock held") (docs/multi_worker.md,
  "Failures")."""
  return (("worker 0 exited with signal 11" in job.output or
           "worker 0 exited with signal 6" in job.output) and
          "Aborting Ring" in job.output)


def test_a_hung_worker_becomes_an_error_after_the_timeout(tmp_path):
  # One collective group makes TensorFlow's crash rarer (1 of 9 runs on a
  # loaded machine with two groups); the job runs again (up to 3 times) if
  # it still happened, so that the test checks EPL's error, not TF's fault.
  for attempt in range(3):
    (tmp_path / str(attempt)).mkdir()
    job, results = multiworker.train_job(
        tmp_path / str(attempt), "hung", steps=4, devices=1,
        kill_at_step=2, stop=True, collective_timeout=4,
        launcher=["--grace_period", "1"],
        env={"EPL_COMMUNICATION_NUM_COMMUNICATORS": "1"})
    if not _crashed_while_aborting(job):
      break
  assert job.returncode == 1, job.output[-6000:]
  assert results == [None, None]
  worker0 = "\n".join(job.lines(0))
  assert "collective_timeout_seconds=4" in worker0
  assert "DeadlineExceededError" in worker0
  # Worker 0 failed on its own; the launcher then stopped worker 1.
  assert "[epl-launch] worker 0 exited with status 1" in job.output
  assert "stopping the workers still running" in job.output
  assert job.seconds < 60, job.seconds


def test_pipeline_stages_on_two_workers_match_single_device(tmp_path):
  # 2 workers x 1 device, 2 stages: one replica, stage 0 on worker 0 and
  # stage 1 on worker 1, 4 micro-batches of 8 (1F1B). Worker 0 runs it
  # in-graph (activations and gradients cross over gRPC); worker 1 serves
  # its device, then exits.
  job, results = multiworker.train_job(
      tmp_path, "pipeline", devices=1, steps=5, pipeline=True,
      micro_batches=4, collective_timeout=30)
  assert job.returncode == 0, job.output[-8000:]
  worker0, worker1 = results
  assert worker1 is None
  assert "holds no replica's first stage: it serves its devices" in (
      "\n".join(job.lines(1)))
  assert "[epl-launch] worker 1 exited with status 0" in job.output
  assert worker0["devices"]["dense/kernel"].startswith(
      "/job:worker/replica:0/task:0/")
  assert worker0["devices"]["dense_1/kernel"].startswith(
      "/job:worker/replica:0/task:1/")
  plain, plain_losses, _ = training.train(batch_size=GLOBAL_BATCH,
                                          with_epl=False)
  plain.pop("global_step")
  training.assert_close(_arrays(worker0["variables"]), plain)
  tolerance.assert_equivalent(worker0["merged"], plain_losses)
  assert worker0["global_step"] == 5


def test_pipelines_data_parallel_across_workers_match_single_device(tmp_path):
  # 2 workers x 2 devices, 2 stages: a 2-stage replica on each worker,
  # 2 micro-batches each; gradients of each stage all-reduced across them.
  job, results = multiworker.train_job(
      tmp_path, "pipelines", devices=2, steps=5, pipeline=True,
      micro_batches=2, collective_timeout=30)
  _assert_ok(job, results)
  plain, plain_losses, _ = training.train(batch_size=GLOBAL_BATCH,
                                          with_epl=False)
  plain.pop("global_step")
  for worker, result in enumerate(results):
    assert result["devices"]["dense_1/kernel"] == (
        "/job:worker/replica:0/task:%d/device:CPU:1" % worker)
    training.assert_close(_arrays(result["variables"]), plain)
    tolerance.assert_equivalent(result["merged"], plain_losses)


def test_monitored_training_sessions_save_once_and_resume(tmp_path):
  ckpt = tmp_path / "ckpt"
  plain_losses, plain = _plain_run(6)
  job, first = multiworker.train_job(tmp_path, "first", steps=4,
                                     monitored=True, ckpt_dir=ckpt,
                                     collective_timeout=30)
  _assert_ok(job, first)
  assert "only worker 0 writes checkpoints" in "\n".join(job.lines(1))
  assert tf.train.latest_checkpoint(str(ckpt)).endswith("model.ckpt-4")
  job, second = multiworker.train_job(tmp_path, "second", steps=6,
                                      monitored=True, ckpt_dir=ckpt,
                                      collective_timeout=30)
  _assert_ok(job, second)
  for before, after in zip(first, second):
    assert (before["start"], after["start"]) == (0, 4)
    tolerance.assert_equivalent(before["merged"] + after["merged"],
                               plain_losses)
    assert after["global_step"] == 6
    training.assert_close(_arrays(after["variables"]), plain)


@pytest.mark.parametrize("savers, micro_batches", [
    ({"EPL_ZERO_LEVEL": "v0", "EPL_OFFLOAD_LEVEL": "v0"}, 1),
    ({"EPL_ZERO_LEVEL": "v1", "EPL_OPTIMIZER_NUM_APPLY_GROUP": "2"}, 1),
    ({"EPL_ZERO_LEVEL": "v2"}, 2),
    ({"EPL_ZERO_LEVEL": "v3", "EPL_ZERO_MIN_PARTITION_SIZE": "0"}, 1),
    ({"EPL_ZERO_LEVEL": "v3", "EPL_ZERO_MIN_PARTITION_SIZE": "0"}, 2)])
def test_memory_savers_across_workers_match_single_device(
    tmp_path, monkeypatch, savers, micro_batches):
  """ZeRO: each worker partitions the optimizer state over its own
  replicas; v0 all-reduces gradients over every worker's replicas, v1
  reduces them on the owners, which then all-reduce across workers; v2
  (2 micro-batches of 4 rows) sums every micro-batch on the owners, which
  then all-reduce across workers; v3 shards the weights within each
  worker, and the same shard of each worker all-reduces its gradient."""
  for key, value in savers.items():
    monkeypatch.setenv(key, value)
  job, results = multiworker.train_job(
      tmp_path, "savers", steps=5, micro=GLOBAL_BATCH // 4 // micro_batches,
      micro_batches=micro_batches)
  _assert_ok(job, results)
  _, plain = _plain_run(5)
  for result in results:
    training.assert_close(_arrays(result["variables"]), plain)
    assert result["global_step"] == 5
  assert "ZeRO %s" % savers["EPL_ZERO_LEVEL"] in job.output


@pytest.mark.parametrize("num_workers, processes", [(1, 2), (2, 2)])
def test_one_process_per_device_matches_single_device(tmp_path, num_workers,
                                                      processes):
  # epl-launch --processes_per_worker: each worker of 2 logical CPU devices
  # runs as 2 processes of 1 device, each an EPL worker building only its
  # own replica; the global batch of 32 is split over all of them.
  tasks = num_workers * processes
  job, results = multiworker.train_job(
      tmp_path, "per_device", num_workers=num_workers, devices=processes,
      processes_per_worker=processes, steps=5, micro=GLOBAL_BATCH // tasks)
  _assert_ok(job, results)
  assert "WARNING --processes_per_worker %d" % processes in job.output
  plain_losses, plain = _plain_run(5)
  for task, result in enumerate(results):
    assert result["worker"] == task
    assert result["devices"]["dense/kernel"] == (
        "/job:worker/replica:0/task:%d/device:CPU:0" % task)
    training.assert_close(_arrays(result["variables"]), plain)
    tolerance.assert_equivalent(result["merged"], plain_losses)
    assert result["global_step"] == 5
