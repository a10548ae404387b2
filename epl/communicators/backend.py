"""The communicator of the configured backend (communication.backend)."""
from epl.communicators.collective import CollectiveCommunicator
from epl.communicators.horovod import HorovodCommunicator
from epl.communicators.local import LocalCommunicator


def communicator_class(ctx):
  """The Communicator class rewrite context `ctx` uses: Horovod's with
  communication.backend "horovod"; else LocalCommunicator when every
  replica is a CPU device of this process and
  communication.local_cpu_reduce allows it; else TensorFlow collectives."""
  if ctx.config.communication.backend == "horovod":
    return HorovodCommunicator
  if (ctx.config.communication.local_cpu_reduce and
      ctx.cluster.device_type == "CPU" and
      len(ctx.replicas) == ctx.plan.num_replicas):
    return LocalCommunicator
  return CollectiveCommunicator


def new_communicator(ctx, devices, local_members, group=0):
  """A communicator over `devices` for rewrite context `ctx`, whose worker
  builds the ops of `local_members`. `group` picks one of the independent
  collective groups over the same devices (Horovod needs none: it matches
  its ops by name and runs them as they come)."""
  cls = communicator_class(ctx)
  if ctx.config.communication.backend == "horovod":
    return cls(devices, local_members, ctx.keys, ctx.cluster)
  return cls(devices, local_members, ctx.keys,
             ctx.config.cluster.collective_timeout_seconds,
             ctx.cluster.device_type, group=group)
