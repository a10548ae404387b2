"""IO slicing: each worker reads its share of the input files."""
import json
import logging
import os

import pytest
import tensorflow as tf

import epl
from epl import hooks
from epl.capture import io_slicing
from epl.cluster import Cluster
from epl.env import Env
from tests import multiworker

FILES = ["f%d" % i for i in range(7)]


def test_files_are_dealt_round_robin_over_equal_workers():
  shares = {0: 1, 1: 1}
  files = FILES[:6]
  assert io_slicing.slice_files(files, shares, 0) == ["f0", "f2", "f4"]
  assert io_slicing.slice_files(files, shares, 1) == ["f1", "f3", "f5"]
  # Weights in proportion to replicas: worker 0 holds twice as many.
  shares = {0: 4, 1: 2}
  assert io_slicing.slice_files(files, shares, 0) == ["f0", "f1", "f3", "f4"]
  assert io_slicing.slice_files(files, shares, 1) == ["f2", "f5"]
  # One reader reads everything; a worker without replicas nothing.
  assert io_slicing.slice_files(files, {0: 3}, 0) == files
  assert io_slicing.slice_files(files, {0: 1}, 1) == []


def test_uneven_counts_need_a_setting():
  shares = {0: 1, 1: 1, 2: 1}
  with pytest.raises(ValueError, match=r"7 input files do not split evenly "
                     r"over 3 reader.*io.drop_last_files.*"
                     r"io.unbalanced_io_slicing"):
    io_slicing.slice_files(FILES, shares, 0)
  dropped = [io_slicing.slice_files(FILES, shares, w, drop_last=True)
             for w in range(3)]
  assert dropped == [["f0", "f3"], ["f1", "f4"], ["f2", "f5"]]
  unbalanced = [io_slicing.slice_files(FILES, shares, w, unbalanced=True)
                for w in range(3)]
  assert unbalanced == [["f0", "f3", "f6"], ["f1", "f4"], ["f2", "f5"]]


@pytest.mark.parametrize("unbalanced", [False, True])
def test_too_few_files_is_a_clear_error(unbalanced):
  with pytest.raises(ValueError, match=r"io.slicing: 2 input file\(s\) cannot "
                     r"be split over 3 reader\(s\).*at least 3 files"):
    io_slicing.slice_files(FILES[:2], {0: 1, 1: 1, 2: 1}, 0,
                           unbalanced=unbalanced)


def _fake_worker(worker, config, workers=2):
  """EPL set up as worker `worker` of a job, without starting a server."""
  addresses = ["127.0.0.1:%d" % (1 + w) for w in range(workers)]
  Env._instance = Env(epl.Config(config),  # pylint: disable=protected-access
                      Cluster.of(addresses, worker, "CPU", 1))
  hooks.install()


def _write_records(tmp_path, count):
  paths = []
  for i in range(count):
    path = str(tmp_path / ("part-%d.tfrecord" % i))
    with tf.io.TFRecordWriter(path) as writer:
      for j in range(2):
        writer.write(b"file%d-record%d" % (i, j))
    paths.append(path)
  return paths


def _read_all(dataset):
  """Every record of `dataset`, read by a plain session (EPL shut down
  first: a session of a fake multi-worker EPL would start a server)."""
  record = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
  epl.shutdown()
  values = []
  with tf.compat.v1.Session() as session:
    while True:
      try:
        values.append(session.run(record).decode())
      except tf.errors.OutOfRangeError:
        return values


@pytest.mark.parametrize("kind", ["tfrecord", "text", "list_files"])
def test_datasets_from_file_lists_are_sliced(tmp_path, kind):
  paths = _write_records(tmp_path, 4)
  texts = []
  for i in range(4):
    texts.append(str(tmp_path / ("part-%d.txt" % i)))
    with open(texts[-1], "w") as f:
      f.write("file%d-line0\nfile%d-line1\n" % (i, i))
  seen = []
  for worker in range(2):
    _fake_worker(worker, {"io.slicing": True})
    with tf.Graph().as_default():
      if kind == "tfrecord":
        dataset = tf.data.TFRecordDataset(paths)
      elif kind == "text":
        dataset = tf.compat.v1.data.TextLineDataset(filenames=texts)
      else:
        dataset = tf.data.Dataset.list_files(
            str(tmp_path / "part-*.tfrecord"), shuffle=False).interleave(
                tf.data.TFRecordDataset, cycle_length=1)
      seen.append(_read_all(dataset))
    epl.shutdown()
  assert [sorted({r.split("-")[0] for r in s}) for s in seen] == [
      ["file0", "file2"], ["file1", "file3"]]


def _iterator_warnings(caplog, worker, workers, build):
  """What making an iterator of `build()` logs on `worker` of `workers`."""
  _fake_worker(worker, {}, workers=workers)
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="epl"):
    logger = logging.getLogger("epl")
    logger.addHandler(caplog.handler)
    try:
      with tf.Graph().as_default():
        tf.compat.v1.data.make_one_shot_iterator(build())
    finally:
      logger.removeHandler(caplog.handler)
  epl.shutdown()
  return caplog.text


def test_workers_reading_identical_in_memory_batches_are_warned(caplog):
  def in_memory():
    return tf.data.Dataset.from_tensor_slices(
        tf.range(16)).repeat().batch(4)
  text = _iterator_warnings(caplog, 1, 2, in_memory)
  assert "every one of the 2 workers reads the same batches" in text
  assert "TensorSliceDataset (built at %s:" % __file__ in text
  assert "dataset.shard(epl.Env.get().cluster.worker_num" in text
  assert "io.slicing" in text
  # Sharded, or one worker: nothing to say.
  assert not _iterator_warnings(
      caplog, 1, 2, lambda: in_memory().shard(2, 1))
  assert not _iterator_warnings(caplog, 0, 1, in_memory)


def test_slicing_off_or_one_worker_reads_everything(tmp_path):
  paths = _write_records(tmp_path, 3)
  for config, workers in (({}, 2), ({"io.slicing": True}, 1)):
    _fake_worker(0, config, workers=workers)
    with tf.Graph().as_default():
      assert len(_read_all(tf.data.TFRecordDataset(paths))) == 6
    epl.shutdown()


def test_too_few_files_fail_when_the_dataset_is_built(tmp_path):
  paths = _write_records(tmp_path, 1)
  _fake_worker(1, {"io.slicing": True})
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match="1 input file"):
      tf.data.TFRecordDataset(paths)


def test_two_workers_read_disjoint_shares(tmp_path):
  multiworker.require_namespaces()
  paths = _write_records(tmp_path, 4)
  out = tmp_path / "out"
  out.mkdir()
  script = os.path.join(multiworker.ROOT, "tests", "workers", "read_files.py")
  job = multiworker.launch(["--num_workers", "2", "--gpu_per_worker", "1",
                            "--cpu", script, str(out), "pattern",
                            str(tmp_path / "part-*.tfrecord")], timeout=120)
  assert job.returncode == 0, job.output[-6000:]
  shares = [json.loads((out / ("worker_%d.json" % w)).read_text())
            for w in range(2)]
  assert shares[0] == ["file0-record0", "file0-record1", "file2-record0",
                       "file2-record1"]
  assert shares[1] == ["file1-record0", "file1-record1", "file3-record0",
                       "file3-record1"]
  assert "io.slicing: worker 1 reads 2 of 4 file(s)" in job.output
