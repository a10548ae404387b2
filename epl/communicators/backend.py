"""The communicator the plan chose (`decisions.Communication`)."""
from epl.communicators.collective import CollectiveCommunicator
from epl.communicators.horovod import HorovodCommunicator
from epl.communicators.local import LocalCommunicator
from epl.parallel.plan.decisions import Communication

_CLASSES = {Communication.HOROVOD: HorovodCommunicator,
            Communication.LOCAL_SUMS: LocalCommunicator,
            Communication.COLLECTIVES: CollectiveCommunicator}


def communicator_class(ctx):
  """The Communicator class rewrite context `ctx` uses: the plan's
  decision (Horovod's with communication.backend "horovod"; local sums
  when every replica is a CPU device of this process and
  communication.local_cpu_reduce allows it; else TensorFlow
  collectives)."""
  return _CLASSES[ctx.plan.decisions.communication.value]


def new_communicator(ctx, devices, local_members, group=0):
  """A communicator over `devices` for rewrite context `ctx`, whose worker
  builds the ops of `local_members`. `group` picks one of the independent
  collective groups over the same devices (Horovod needs none: it matches
  its ops by name and runs them as they come)."""
  cls = communicator_class(ctx)
  if cls is HorovodCommunicator:
    return cls(devices, local_members, ctx.keys, ctx.cluster)
  return cls(devices, local_members, ctx.keys,
             ctx.config.cluster.collective_timeout_seconds,
             ctx.cluster.device_type, group=group)


def new_worker_communicator(ctx, devices, group):
  """A communicator over `devices`, all of this worker's (every member
  local), in collective group `group`: the plan's kind, but TensorFlow's
  collectives where the plan chose Horovod, which joins processes."""
  cls = communicator_class(ctx)
  if cls is HorovodCommunicator:
    cls = CollectiveCommunicator
  return cls(devices, list(range(len(devices))), ctx.keys,
             ctx.config.cluster.collective_timeout_seconds,
             ctx.cluster.device_type, group=group)
