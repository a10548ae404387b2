"""The eager runtime as one worker of a multi-worker job.

A `tf.function` runs in the eager context, not in a `Session`, so its
collectives across processes use the eager context's own collective
executor, which knows the cluster only when the context is started with
it: `context.configure_collective_ops` (the group leader and this task's
device filter; only before the context starts) and
`context.enable_collective_ops(server_def)`, which makes the context start
a gRPC server of its own at this task's address and name its devices
`/job:<job>/replica:0/task:<k>/device:...` (as
`tf.distribute.MultiWorkerMirroredStrategy` sets a worker up). That
server takes the port a `tf.distribute.Server` of the same task would:
a process has one or the other.
"""
# First: checks the TensorFlow version before its internals are imported.
from epl.tf_compat import version_check  # noqa: F401  pylint: disable=unused-import
from tensorflow.core.protobuf import tensorflow_server_pb2
from tensorflow.python.eager import context


def started():
  """True once the eager context has started (an op ran, or it served)."""
  return context.context()._context_handle is not None  # pylint: disable=protected-access


def serve(cluster_spec, job, task, leader, device_filter):
  """Starts the eager context as task `task` of `job` in `cluster_spec`
  (a tf.train.ClusterSpec): its gRPC server listens at the task's address,
  collectives find their groups through `leader`, and the context sees
  only the devices of `device_filter` (this task's). Returns the names of
  its devices. Raises RuntimeError when the context already started."""
  ctx = context.context()
  if started():
    raise RuntimeError("the eager context already started")
  ctx.configure_collective_ops(
      collective_leader=leader, scoped_allocator_enabled_ops=(),
      device_filters=(device_filter,))
  # The context's own config: the logical devices set before, the leader
  # and the filter just configured.
  server_def = tensorflow_server_pb2.ServerDef(
      cluster=cluster_spec.as_cluster_def(), default_session_config=ctx.config,
      job_name=job, task_index=task, protocol="grpc")
  ctx.enable_collective_ops(server_def)
  ctx.ensure_initialized()
  return [device.name for device in ctx.list_logical_devices()]
