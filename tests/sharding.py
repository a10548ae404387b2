"""Reading a split variable back as one tensor, in the tests."""
import numpy as np

from tests import tolerance
from tests import training


def replica_name(replica, name):
  return name if replica == 0 else "EPL_REPLICA_%d/%s" % (replica, name)


def full_variable(session, graph, name, devices, split_count, axis):
  """The shards of shard group 0 side by side on `axis`; checks that the
  other groups hold the same shards."""
  copies = training.read_variables(
      session, graph, [replica_name(r, name) for r in range(devices)])
  shards = [copies[replica_name(r, name)] for r in range(devices)]
  for replica in range(split_count, devices):
    tolerance.assert_equivalent(shards[replica], shards[replica % split_count])
  return np.concatenate(shards[:split_count], axis=axis)
