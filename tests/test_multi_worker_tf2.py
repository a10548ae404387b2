"""A TF2 script (eager execution on, an eager loop over a `@tf.function`
step with a Keras model and optimizer) in a multi-worker job: 2 workers x
2 logical CPU devices, started by epl-launch in private namespaces
(tests/multiworker.py), each running tests/workers/tf2_worker.py and
calling the step with its half of every global batch of 32 rows. The
step trains data parallel over the 4 replicas, equal to the same loop
without EPL on the whole global batch (computed by each worker after
epl.shutdown(), from worker 0's initial weights)."""
import json
import os

import numpy as np
import pytest

from tests import multiworker
from tests import tf_versions
from tests import tolerance
from tests.clients import tf2_scripts

pytestmark = pytest.mark.usefixtures("_namespaces")

WORKER_SCRIPT = os.path.join(multiworker.ROOT, "tests", "workers",
                             "tf2_worker.py")


@pytest.fixture(scope="module")
def _namespaces():
  multiworker.require_namespaces()


def _job(tmp_path, name, **options):
  return multiworker.train_job(tmp_path, name, script=WORKER_SCRIPT,
                               limit=240, **options)


def _assert_close(actual, expected, atol):
  if atol is None:
    tolerance.assert_equivalent(np.array(actual), np.array(expected))
  else:
    np.testing.assert_allclose(np.array(actual), np.array(expected),
                               atol=atol)


def _assert_equal_to_plain(job, results, devices=None, atol=None):
  """Every worker's weights after the steps and the losses the step
  returned equal plain TF's on the whole global batch (within the suite's
  tolerance, or `atol`); its variables live on `devices` (by default each
  on its own task: the eager context serves the worker)."""
  assert job.returncode == 0, job.output[-8000:]
  for result in results:
    assert result is not None, job.output[-8000:]
    for actual, expected in zip(result["variables"],
                                result["plain_variables"]):
      _assert_close(actual, expected, atol)
    # The step returns the mean loss of the whole global batch (merged
    # over the 4 replicas of both workers).
    _assert_close(result["losses"], result["plain_losses"], atol)
  assert [r["device"] for r in results] == (devices or [
      "/job:worker/replica:0/task:%d/device:CPU:0" % w for w in range(2)])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("optimizer", ["adam", "legacy"])
def test_traced_step_trains_data_parallel_across_two_workers(tmp_path,
                                                             optimizer):
  # Worker 1 initialised other weights: the first call gave it worker 0's.
  job, results = _job(tmp_path, "dp_" + optimizer, optimizer=optimizer)
  _assert_equal_to_plain(job, results)
  assert "serves at 127.0.0.1" in job.output
  assert "through the eager context" in job.output


@pytest.mark.timeout(300)
def test_traced_step_with_a_loop_of_micro_batches_across_two_workers(
    tmp_path):
  # 4 replicas x 4 micro-batches of 2 rows: each worker's 16 rows.
  job, results = _job(tmp_path, "micro", micro_batches=4)
  _assert_equal_to_plain(job, results)
  assert "micro-batches: loop" in job.output


@pytest.mark.timeout(300)
def test_traced_step_trains_data_parallel_over_horovod(tmp_path):
  # horovodrun -np 2 (Gloo), no TF_CONFIG: each process's step all-reduces
  # its 2 replicas' gradients, then Horovod across the processes.
  tf_versions.require_horovod()
  job, results = _job(tmp_path, "horovod", launcher=["--backend", "horovod"])
  _assert_equal_to_plain(job, results, devices=[
      "/job:localhost/replica:0/task:0/device:CPU:0"] * 2)
  assert ('communication: Horovod, because communication.backend is '
          '"horovod"') in job.output


@pytest.mark.timeout(300)
def test_pipeline_stages_in_each_worker_across_two_workers(tmp_path):
  # 2 stages x 2 replicas (one a worker) x 4 micro-batches of 4 rows.
  job, results = _job(tmp_path, "pipeline", scenario="pipeline",
                      micro_batches=4)
  _assert_equal_to_plain(job, results)
  assert "2 model replica(s) x 2 TaskGraph(s), 4 micro-batch(es)" in (
      job.output)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("saver", ["recompute", "zero_v1", "zero_v2", "amp"])
def test_memory_savers_in_a_traced_step_across_two_workers(tmp_path, saver):
  # The one-worker scenarios' settings (tests/clients/tf2_scripts.py):
  # ZeRO deals the optimizer state out over each worker's 2 replicas; AMP
  # O1 is within the suite's AMP tolerance of float32.
  config, says, atol = tf2_scripts._DATA_PARALLEL_SAVERS[saver]  # pylint: disable=protected-access
  job, results = _job(tmp_path, saver, config=json.dumps(config))
  _assert_equal_to_plain(job, results, atol=atol)
  if saver.startswith("zero"):
    says = "variables dealt to 2 replicas"
  assert says in job.output


@pytest.mark.timeout(300)
def test_keras_fit_across_two_workers(tmp_path):
  # Each worker fits on its rows of every global batch: the weights and
  # each epoch's loss equal plain fit on the whole batches.
  job, results = _job(tmp_path, "fit", scenario="fit")
  assert job.returncode == 0, job.output[-8000:]
  for result in results:
    for actual, expected in zip(result["variables"],
                                result["plain_variables"]):
      tolerance.assert_equivalent(np.array(actual), np.array(expected))
    assert sorted(result["history"]) == ["loss"]
    tolerance.assert_equivalent(np.array(result["history"]["loss"]),
                                np.array(result["plain_history"]["loss"]))


@pytest.mark.timeout(300)
def test_keras_fit_metrics_of_the_targets_across_workers_are_refused(
    tmp_path):
  job, results = _job(tmp_path, "fit_mae", scenario="fit_mae")
  assert job.returncode == 0, job.output[-8000:]
  for result in results:
    error, = result["errors"]
    assert error.startswith(
        "NotSupportedInTracedStep: tf.function train_step: 1 op(s) outside "
        "the part EPL divides over replicas"), error
    assert "EPL does not gather a batch across workers" in error


@pytest.mark.timeout(300)
def test_zero_v3_in_a_traced_step_across_workers_is_refused(tmp_path):
  job, results = _job(tmp_path, "zero_v3", config=json.dumps(
      {"zero.level": "v3", "zero.min_partition_size": 16}))
  assert job.returncode != 0 and results == [None, None]
  assert ("NotSupportedInTracedStep: tf.function train_step: zero.level "
          "'v3' in a traced step of a multi-worker job is not built yet") in (
              job.output), job.output[-6000:]


@pytest.mark.timeout(300)
def test_stages_and_split_across_workers_are_refused(tmp_path):
  # 1 device a worker: the one replica's 2 stages would span both workers,
  # and so would a head split over all devices.
  job, results = _job(tmp_path, "refused", devices=1, scenario="refused")
  assert job.returncode == 0, job.output[-8000:]
  for result in results:
    stages, split = result["errors"]
    assert stages.startswith("NotSupportedInTracedStep: "), stages
    assert ("model replica 0 puts its 2 pipeline stages on workers [0, 1]"
            in stages), stages
    assert split.startswith("NotSupportedInTracedStep: tf.function "
                            "train_step: epl.split in a traced step of a "
                            "multi-worker job is not built yet"), split


@pytest.mark.timeout(300)
def test_a_worker_that_exits_fails_the_other_at_once(tmp_path):
  # Worker 1 exits before step 3; worker 0 raises EPL's error without
  # waiting for the collective timeout (60 s) or the launcher's grace.
  job, results = _job(tmp_path, "exits", kill_at_step=3,
                      collective_timeout=60,
                      launcher=["--grace_period", "90"])
  assert job.returncode != 0
  assert results == [None, None]
  worker0 = "\n".join(job.lines(0))
  assert "WorkerFailureError: EPL worker 0 of 2" in worker0, worker0[-4000:]
  assert "[epl-launch] worker 0 exited with status 1" in job.output
  assert job.seconds < 60, job.seconds
