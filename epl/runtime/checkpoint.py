"""Checkpoints in a multi-worker job: one worker writes, every worker reads.

Checkpoints hold each variable once, under the user's own name (replica 0's
copy), so a multi-worker checkpoint and a single-process one are the same
thing: either restores into the other.

- Writing: every worker may run the same `Saver.save` (directly or through
  MonitoredTrainingSession's CheckpointSaverHook); only worker 0 writes, and
  the others return the path worker 0 writes, without touching the files.
  Their replicas hold the same values, so nothing is lost.
- Reading: every worker restores (`Saver.restore`, or a
  MonitoredTrainingSession that finds a checkpoint), so the checkpoint
  directory must be visible to every worker (a shared file system); the
  restore group then broadcasts worker 0's values to the others
  (`epl.parallel.passes.variable_sync`).
- Shapes: before a restore, every variable the checkpoint restores whole
  must have the checkpoint's shape (`check_shapes`). TensorFlow assigns a
  resource variable whatever shape the checkpoint holds, so the mistake
  would otherwise surface steps later as a shape error far from its cause,
  or never, where the value broadcasts.
- Reading what was just saved: a worker other than 0 that asks for the
  latest checkpoint of a directory it saved to (the Estimator does before
  it evaluates) first waits until worker 0's copy of its last save is
  there (`wait_for_worker_zero`), so that it never reads an older one.
"""
import logging
import os
import time

import tensorflow as tf

from epl.parallel.ops import split_lowering

logger = logging.getLogger("epl")

_told = [False]
# Directory -> the path this worker's last Saver.save returned there
# (written by worker 0).
_reported = {}
_POLL_SECONDS = 0.2


def save(env, original, saver, sess, save_path, global_step=None, *args,
         **kwargs):
  """Saver.save: worker 0 writes; the others return its path."""
  cluster = env.cluster
  if not cluster.is_distributed or cluster.worker_index == 0:
    return original(saver, sess, save_path, global_step, *args, **kwargs)
  if not _told[0]:
    logger.info("Saver.save on worker %d: only worker 0 writes checkpoints "
                "in a multi-worker job.", cluster.worker_index)
    _told[0] = True
  if global_step is None:
    path = save_path
  else:
    if not isinstance(global_step, tf.compat.integral_types):
      global_step = tf.compat.v1.train.global_step(sess, global_step)
    path = "%s-%d" % (save_path, global_step)
  _reported[_directory(path)] = path
  return path


def check_shapes(saver, graph, save_path):
  """Raises ValueError naming every variable that `saver` would restore
  from `save_path` with another shape than its own (a split variable's:
  its full shape). Variables the Saver restores in slices (partitioned)
  are left to the slicing; a checkpoint that cannot be read, to
  Saver.restore."""
  try:
    stored = tf.train.load_checkpoint(save_path).get_variable_to_shape_map()
  except (tf.errors.OpError, ValueError):
    return
  filename = graph.get_tensor_by_name(saver.saver_def.filename_tensor_name)
  wrong = []
  for restore in filename.consumers():
    if restore.type != "RestoreV2":
      continue
    names = tf.get_static_value(restore.inputs[1])
    slices = tf.get_static_value(restore.inputs[2])
    if names is None or slices is None:
      continue
    for name, spec, value in zip(names, slices, restore.outputs):
      name = name.decode()
      if spec or name not in stored:
        continue
      for assign in _consumers_through_identities(value):
        if assign.type not in ("AssignVariableOp", "Assign"):
          continue
        variable = assign.inputs[0].op
        while variable.type == "Identity":
          variable = variable.inputs[0].op
        if "shape" not in variable.node_def.attr:
          continue
        shape = split_lowering.full_shape(graph, variable)
        if shape.is_fully_defined() and shape.as_list() != stored[name]:
          wrong.append("%s: %s in the checkpoint, %s in the model" % (
              name, stored[name], shape.as_list()))
  if wrong:
    raise ValueError(
        "Checkpoint %s does not fit this model: %s. Restore it into the "
        "model that saved it, or rebuild the variables with the "
        "checkpoint's shapes." % (save_path, "; ".join(sorted(set(wrong)))))


def _consumers_through_identities(tensor):
  """The ops that read `tensor`, directly or through Identity ops (the
  Saver puts one between RestoreV2 and each assign)."""
  for op in tensor.consumers():
    if op.type == "Identity":
      yield from _consumers_through_identities(op.outputs[0])
    else:
      yield op


def _directory(path):
  return os.path.normpath(os.path.dirname(path))


def _written(directory, path):
  state = tf.compat.v1.train.get_checkpoint_state(directory)
  if state is None:
    return False
  name = os.path.basename(path)
  return any(os.path.basename(p) == name
             for p in state.all_model_checkpoint_paths)


def wait_for_worker_zero(env, directory):
  """Returns once worker 0 has written the checkpoint whose path this
  worker's last `Saver.save` into `directory` returned (at once when it
  saved nothing there); raises after cluster.collective_timeout_seconds."""
  path = _reported.get(os.path.normpath(directory))
  if path is None:
    return
  timeout = env.config.cluster.collective_timeout_seconds
  deadline = time.monotonic() + timeout
  while not _written(directory, path):
    if time.monotonic() > deadline:
      raise RuntimeError(
          "EPL worker %d: worker 0's checkpoint %s is not in %s after %gs "
          "(cluster.collective_timeout_seconds). In a multi-worker job "
          "worker 0 alone writes checkpoints: put the checkpoint directory "
          "on a file system that every worker sees, and see worker 0's log "
          "if it failed." % (env.cluster.worker_index, path, directory,
                             timeout))
    time.sleep(_POLL_SECONDS)
