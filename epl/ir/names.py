"""Names of the ops EPL builds, formatted in one place.

Names are for people: TensorBoard, timelines, error messages, and the
user's op names recognisable in every copy. No decision is taken from a
name; what an op is and where it came from is in `epl.ir.provenance`.
"""

_REPLICA = "EPL_REPLICA_%d/"
_MICRO_BATCH = "EPL_MICRO_BATCH_%d/"
_AMP = "_EPL_AMP_"


def replica_prefix(replica):
  """The scope of replica `replica`'s copies: `EPL_REPLICA_<replica>/`."""
  return _REPLICA % replica


def micro_batch_prefix(micro_batch):
  """The scope of micro-batch `micro_batch`'s copies:
  `EPL_MICRO_BATCH_<micro_batch>/`."""
  return _MICRO_BATCH % micro_batch


def in_replica(scope, replica, *parts):
  """`<scope>/replica_<replica>/<parts...>`: an op a pass builds for one
  replica under its own scope (ZeRO's copies, the schedule's NoOps)."""
  return "/".join(("%s/replica_%d" % (scope, replica),) + parts)


def half_precision(name, what):
  """`<name>_EPL_AMP_<what>`: mixed precision's copy of op `name` (`what`
  its dtype) or a cast made for it."""
  return name + _AMP + what
