"""The communicator of the configured backend (communication.backend)."""
from epl.communicators.collective import CollectiveCommunicator


def new_communicator(ctx, devices, local_members):
  """A communicator over `devices` for rewrite context `ctx`, whose worker
  builds the ops of `local_members`: TensorFlow collectives or Horovod."""
  if ctx.config.communication.backend == "horovod":
    from epl.communicators.horovod import HorovodCommunicator  # pylint: disable=import-outside-toplevel
    return HorovodCommunicator(devices, local_members, ctx.keys, ctx.cluster)
  return CollectiveCommunicator(
      devices, local_members, ctx.keys,
      ctx.config.cluster.collective_timeout_seconds, ctx.cluster.device_type)
