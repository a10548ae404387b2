"""Turning a lost peer into one clear error instead of a hang.

Every collective EPL builds carries `cluster.collective_timeout_seconds`: a
collective whose peers do not all arrive in time fails with
DeadlineExceeded, and one whose peer's process is gone fails at once (the
gRPC connection closes). In a multi-worker job `Session.run` re-raises such
errors as `WorkerFailureError`, naming the worker, the timeout and what to
do. It is not an AbortedError or UnavailableError, so that
MonitoredTrainingSession does not try to "recover" by re-creating its
session (its init would wait for the dead peer once more).

On one worker, where `epl.runtime.collective_groups` already put every
member of each group in the run, a collective can still time out when a
member it waits for is stopped by something else (a cond branch not
taken, a blocked input); `CollectiveTimeoutError` then names the
collective, its group and the devices of its members, and speaks of no
other worker.
"""
import tensorflow as tf

from epl.ir import collectives
from epl.ir.op_types import COLLECTIVE_TYPES
from epl.runtime import collective_groups

_PEER_ERRORS = (tf.errors.DeadlineExceededError, tf.errors.UnavailableError,
                tf.errors.AbortedError, tf.errors.CancelledError)
_PEER_WORDS = ("socket closed", "failed to connect", "connection reset",
               "timed out", "connection refused")
# Lines of TensorFlow's error text that say nothing about the cause.
_NOISE = ("graph execution error", "detected at node", "node:", "from /job:",
          "additional grpc error", ":{", "original stack trace", "[[")


class WorkerFailureError(tf.errors.OpError):
  """A step of a multi-worker job failed because a peer worker was lost."""

  def __init__(self, node_def, op, message):
    super().__init__(node_def, op, message, tf.errors.UNAVAILABLE)


def is_peer_failure(error):
  if isinstance(error, WorkerFailureError):
    return False
  if isinstance(error, _PEER_ERRORS):
    return True
  text = str(error.message).lower()
  return any(word in text for word in _PEER_WORDS)


def _cause(message):
  """The line of TensorFlow's message that says what went wrong."""
  lines = [l.strip() for l in message.splitlines() if l.strip()]
  for line in lines:
    if not line.lower().startswith(_NOISE) and not line.startswith("File "):
      return line
  return lines[0] if lines else ""


class CollectiveTimeoutError(tf.errors.DeadlineExceededError):
  """A collective of a one-worker job did not complete in time."""


def _collective_timeout(env, error):
  """A CollectiveTimeoutError for a one-worker collective that timed out,
  else None."""
  op = error.op
  if (not isinstance(error, tf.errors.DeadlineExceededError) or op is None or
      op.type not in COLLECTIVE_TYPES):
    return None
  group_key, instance_key = collectives.instance_of(op)
  members = collective_groups.members_of(op)
  # TensorFlow's own text speaks of "other workers" even on one worker.
  message = (
      "EPL: collective %r (%s, group key %s, instance key %s, %s members) "
      "did not complete within its timeout of %g s: not every member of "
      "its group ran in this step. Members in this graph: %s. A member "
      "that waits on a blocked input, a cond branch not taken or a "
      "collective of another order never joins; every member must run in "
      "every step that runs one (%s)." % (
          op.name, op.type, group_key, instance_key,
          collectives.group_size_of(op), op.get_attr("timeout_seconds"),
          ", ".join("%r on %s" % (m.name, m.device or "no device")
                    for m in members), type(error).__name__))
  return CollectiveTimeoutError(error.node_def, op, message)


def explain(env, error):
  """A WorkerFailureError for `error` when it means a lost peer, a
  CollectiveTimeoutError for a collective that timed out on one worker,
  else None."""
  cluster = env.cluster
  if not isinstance(error, tf.errors.OpError):
    return None
  if not cluster.is_distributed:
    return _collective_timeout(env, error)
  if not is_peer_failure(error):
    return None
  cause = _cause(str(error.message))
  message = (
      "EPL worker %d of %d: a step across workers failed because another "
      "worker stopped answering: it exited or was killed, or it did not "
      "reach the same step within cluster.collective_timeout_seconds=%g. "
      "Every worker must run the same steps (and fetch the same merged "
      "tensors). Check the other workers' logs; restart the job to resume "
      "from the last checkpoint. TensorFlow said: %s: %s" % (
          cluster.worker_index, cluster.worker_num,
          env.config.cluster.collective_timeout_seconds,
          type(error).__name__, cause))
  return WorkerFailureError(error.node_def, error.op, message)
