"""The cluster: workers and the devices of each, from TF_CONFIG and hardware,
or from Horovod's processes (communication.backend "horovod")."""
import json
import logging
import os

import tensorflow as tf

from epl.config import Config
from epl.env import Env
from epl.tf_compat.horovod import horovod_api

logger = logging.getLogger("epl")


def _parse_tf_config(raw):
  """(worker addresses, this worker's index) from a TF_CONFIG JSON string.

  Follows the tf.distribute conventions: a `chief` task, when present, is
  worker 0 and the `worker` tasks follow it. Everything is checked here,
  before `epl.init` starts a server on it.
  """
  try:
    tf_config = json.loads(raw)
  except ValueError as error:
    raise ValueError("TF_CONFIG is not valid JSON (%s): %r" % (error, raw))
  if not isinstance(tf_config, dict):
    raise ValueError("TF_CONFIG must be a JSON object with 'cluster' and "
                     "'task', got %r" % raw)
  cluster = tf_config.get("cluster") or {}
  if not isinstance(cluster, dict):
    raise ValueError("TF_CONFIG 'cluster' must be an object of task type: "
                     "['host:port', ...], got %r" % (cluster,))
  chief = _task_addresses(cluster, "chief")
  workers = _task_addresses(cluster, "worker")
  unknown = sorted(set(cluster) - {"chief", "worker", "evaluator", "ps"})
  if unknown or cluster.get("ps"):
    raise ValueError(
        "TF_CONFIG cluster has task types %s; EPL runs 'chief' and 'worker' "
        "tasks only (no parameter servers)." % (unknown or ["ps"]))
  if len(chief) > 1:
    raise ValueError("TF_CONFIG names %d chiefs; at most one is allowed." %
                     len(chief))
  addresses = chief + workers
  if not addresses:
    raise ValueError("TF_CONFIG has no 'chief' or 'worker' tasks: %r" % raw)
  twice = sorted({a for a in addresses if addresses.count(a) > 1})
  if twice:
    raise ValueError("TF_CONFIG names %s for several tasks; each task "
                     "listens on its own host:port." % ", ".join(twice))
  task = tf_config.get("task") or {}
  if not isinstance(task, dict):
    raise ValueError("TF_CONFIG 'task' must be an object like {\"type\": "
                     "\"worker\", \"index\": 0}, got %r" % (task,))
  task_type, task_index = task.get("type", "worker"), task.get("index", 0)
  if not str(task_index).isdigit() or isinstance(task_index, bool):
    raise ValueError("TF_CONFIG task index must be a whole number, got %r" %
                     (task_index,))
  task_index = int(task_index)
  if task_type == "chief":
    index = task_index
  elif task_type == "worker":
    index = len(chief) + task_index
  else:
    raise ValueError("TF_CONFIG task type %r is not run by EPL; use 'chief' "
                     "or 'worker'." % task_type)
  if not 0 <= index < len(addresses):
    raise ValueError("TF_CONFIG task %s:%d is not in the cluster %r." %
                     (task_type, task_index, cluster))
  return addresses, index


def _task_addresses(cluster, task_type):
  """The 'host:port' addresses TF_CONFIG lists for `task_type`."""
  addresses = cluster.get(task_type) or []
  if not isinstance(addresses, list):
    raise ValueError("TF_CONFIG cluster %r must be a list of 'host:port' "
                     "strings, got %r" % (task_type, addresses))
  for address in addresses:
    host, _, port = str(address).rpartition(":")
    if (not isinstance(address, str) or not host or not port.isdigit() or
        not 0 < int(port) < 65536):
      raise ValueError("TF_CONFIG cluster %r: %r is not 'host:port' (a "
                       "port in 1-65535)." % (task_type, address))
  return list(addresses)


def _visible_gpu_count(run_visible_devices):
  gpus = tf.config.list_physical_devices("GPU")
  if run_visible_devices:
    wanted = [int(i) for i in str(run_visible_devices).split(",") if i.strip()]
    missing = [i for i in wanted if i >= len(gpus)]
    if missing:
      raise ValueError(
          "cluster.run_visible_devices=%r names GPUs %s but this worker has "
          "%d GPUs." % (run_visible_devices, missing, len(gpus)))
    return len(wanted)
  return len(gpus)


# The VirtualDevices of the model being built in the default graph, one per
# stage, from its plan: (cluster) -> list, or None before any strategy
# scope. The model and its plan live above the cluster; epl.api sets it.
_layout_planner = None


def set_layout_planner(planner):
  """Lets `Cluster.virtual_devices` report the model's plan (epl.api)."""
  global _layout_planner
  _layout_planner = planner


def _check_layout(layout):
  """The original's layouts "all", "auto" and None are EPL's one layout:
  the planner's. Its "specific" and "aware_row" layouts are not built."""
  if layout is None or (isinstance(layout, str) and
                        layout.lower() in ("all", "auto")):
    return
  raise NotImplementedError(
      "epl.Cluster(layout=%r): EPL lays the stages and replicas out itself "
      "(one device per stage, a replica's stages on consecutive devices; "
      "cluster.device_place_prefer_intra_node False spreads a replica over "
      "the workers). Pass layout 'all', 'auto' or None, which all mean "
      "that; 'specific' and 'aware_row' layouts are not built." % (layout,))


def _split_hosts(hosts):
  if isinstance(hosts, str):
    return [h.strip() for h in hosts.split(",") if h.strip()]
  return list(hosts)


def _local_devices(config):
  """(device type, devices per worker) of this machine under `config`."""
  gpus = _visible_gpu_count(config.cluster.run_visible_devices)
  if gpus:
    return "GPU", gpus
  return "CPU", config.cluster.num_cpu_devices or 1


class Cluster:
  """Workers x devices. Every worker has the same number of devices.

  `epl.Cluster(worker_hosts=None, ps_hosts=None, job_name="worker",
  worker_index=0, layout="all")` builds one as the original EPL did: the
  workers of `worker_hosts` ('host:port' strings, a list or one
  comma-separated string), else of TF_CONFIG, else one local worker;
  devices counted as `epl.init` counts them. `with cluster:` makes it the
  cluster of `epl.Env.get()`.
  """

  def __init__(self, worker_hosts=None, ps_hosts=None, job_name="worker",
               worker_index=0, layout="all", config=None):
    if ps_hosts:
      raise ValueError(
          "epl.Cluster(ps_hosts=%r): EPL runs worker tasks only (no "
          "parameter servers); list every process in worker_hosts." %
          (ps_hosts,))
    _check_layout(layout)
    if worker_hosts:
      if job_name not in ("worker", "chief"):
        raise ValueError("epl.Cluster(job_name=%r): EPL runs 'worker' (or "
                         "'chief') tasks only." % (job_name,))
      addresses = _split_hosts(worker_hosts)
      if not 0 <= worker_index < len(addresses):
        raise ValueError("epl.Cluster(worker_index=%r) is not a worker of "
                         "%s." % (worker_index, addresses))
    else:
      raw = os.environ.get("TF_CONFIG", "").strip()
      addresses, worker_index = _parse_tf_config(raw) if raw else ([], 0)
    if config is None:
      config = Env.get().config if Env.initialised() else Config()
    self._set(addresses, worker_index, *_local_devices(config))

  def _set(self, worker_addresses, worker_index, device_type,
           devices_per_worker):
    self.worker_addresses = list(worker_addresses)
    self.worker_index = worker_index
    self.device_type = device_type
    self.devices_per_worker = devices_per_worker

  @classmethod
  def of(cls, worker_addresses, worker_index, device_type,
         devices_per_worker):
    """A cluster of the given workers and devices, nothing read from the
    environment."""
    cluster = cls.__new__(cls)
    cluster._set(worker_addresses, worker_index, device_type,
                 devices_per_worker)
    return cluster

  @classmethod
  def from_environment(cls, config):
    """Reads TF_CONFIG (absent: one local worker) and counts devices; with
    communication.backend "horovod", Horovod's processes are the workers."""
    if config.communication.backend == "horovod":
      return HorovodCluster.from_horovod(config)
    raw = os.environ.get("TF_CONFIG", "").strip()
    addresses, index = _parse_tf_config(raw) if raw else ([], 0)
    return cls.of(addresses, index, *_local_devices(config))

  def __enter__(self):
    """`with epl.Cluster(...):` makes this the cluster EPL plans on (the
    original's idiom); it stays so after the block, as there."""
    Env.get().cluster = self
    return self

  def __exit__(self, *exc_info):
    return False

  @property
  def worker_num(self):
    return max(1, len(self.worker_addresses))

  @property
  def is_distributed(self):
    """True when the job has several worker processes (TF_CONFIG)."""
    return len(self.worker_addresses) > 1

  @property
  def runs_tf_server(self):
    """True when workers talk through TensorFlow's gRPC runtime: each runs
    a tf.distribute.Server and device names carry the worker's task."""
    return self.is_distributed

  @property
  def total_devices(self):
    return self.worker_num * self.devices_per_worker

  def device_name(self, global_index):
    """The TF device of the `global_index`-th device, workers in order."""
    worker, local = divmod(global_index, self.devices_per_worker)
    device = "/device:%s:%d" % (self.device_type, local)
    if self.runs_tf_server:
      return "/job:worker/replica:0/task:%d%s" % (worker, device)
    return device

  def host_device(self, worker):
    """The CPU of `worker`, where input pipelines run."""
    if self.runs_tf_server:
      return "/job:worker/replica:0/task:%d/device:CPU:0" % worker
    return "/device:CPU:0"

  def worker_of(self, global_index):
    return global_index // self.devices_per_worker

  def check_plan(self, plan):
    """Returns `plan` when this cluster can run it, else raises."""
    return plan

  def require_devices(self, count, what):
    """Raises ValueError naming `what` when `count` devices are more than
    this cluster has."""
    if count > self.total_devices:
      raise ValueError(
          "%s needs %d device(s) but the cluster has only %d (%r). Use "
          "fewer or smaller strategy scopes, or more devices (without GPUs: "
          "the config key cluster.num_cpu_devices or "
          "EPL_CLUSTER_NUM_CPU_DEVICES)." % (what, count, self.total_devices,
                                             self))

  # The original EPL's names, read by its published scripts. They count
  # the devices EPL uses, GPUs or logical CPU devices.

  @property
  def gpu_num_per_worker(self):
    return self.devices_per_worker

  @property
  def total_gpu_num(self):
    return self.total_devices

  @property
  def available_devices(self):
    """Every device of the job, workers in order."""
    return [self.device_name(i) for i in range(self.total_devices)]

  @property
  def virtual_devices(self):
    """One VirtualDevice per stage of the model being built in the default
    graph (slice r: the devices of replica r), as the original's planned
    ("auto") layout; a split model's stages share one, and before any
    strategy scope it is the "all" layout: one of every device."""
    planned = _layout_planner(self) if _layout_planner else None
    if planned:
      return planned
    return [VirtualDevice([[d] for d in self.available_devices], self)]

  def worker_of_device(self, device):
    """The worker that holds `device` (one of `available_devices`)."""
    return self.worker_of(self.available_devices.index(device))

  @property
  def hosts(self):
    """The workers' addresses, comma-separated (the original's string)."""
    return ",".join(self.worker_addresses or ["localhost:0"])

  @property
  def cluster_spec(self):
    """The job as a tf.train.ClusterSpec (one local worker: localhost)."""
    return tf.train.ClusterSpec(
        {"worker": self.worker_addresses or ["localhost:0"]})

  def current_worker_cpu(self):
    return self.host_device(self.worker_index)

  def current_worker_chief_gpu(self):
    return self.device_name(self.worker_index * self.devices_per_worker)

  def __repr__(self):
    return ("Cluster(workers=%d, worker_index=%d, %d %s device(s) per worker,"
            " %d in total)" % (self.worker_num, self.worker_index,
                               self.devices_per_worker, self.device_type,
                               self.total_devices))


def _local_gpus(config, hvd):
  """The GPUs of this process: all visible ones, or with several processes
  on one machine and no cluster.run_visible_devices, an equal share each
  by local rank (written to cluster.run_visible_devices)."""
  gpus = _visible_gpu_count(config.cluster.run_visible_devices)
  local_size = hvd.local_size()
  if not gpus or config.cluster.run_visible_devices or local_size == 1:
    return gpus
  share = gpus // local_size
  if not share:
    raise ValueError(
        "horovod: %d processes on this machine share %d GPU(s); start at "
        "most one process per GPU (horovodrun -np)." % (local_size, gpus))
  first = hvd.local_rank() * share
  config.cluster.run_visible_devices = ",".join(
      str(first + i) for i in range(share))
  logger.info("horovod: local rank %d uses GPU(s) %s of this machine",
              hvd.local_rank(), config.cluster.run_visible_devices)
  return share


class HorovodCluster(Cluster):
  """The processes of a Horovod job, one worker each, every one with the
  same number of local devices."""

  def __init__(self, rank, size, device_type, devices_per_worker):
    # pylint: disable=super-init-not-called
    self._set([], rank, device_type, devices_per_worker)
    self.num_processes = size

  @classmethod
  def from_horovod(cls, config):
    """Initialises Horovod (hvd.init) and describes this process."""
    if os.environ.get("TF_CONFIG", "").strip():
      raise ValueError(
          "TF_CONFIG is set, but communication.backend is \"horovod\": "
          "horovodrun starts the workers of a Horovod job. Unset TF_CONFIG, "
          "or use communication.backend \"collective\" with TF_CONFIG.")
    hvd = horovod_api()
    hvd.init()
    gpus = _local_gpus(config, hvd)
    if gpus:
      return cls(hvd.rank(), hvd.size(), "GPU", gpus)
    return cls(hvd.rank(), hvd.size(), "CPU",
               config.cluster.num_cpu_devices or 1)

  @property
  def worker_num(self):
    return self.num_processes

  @property
  def is_distributed(self):
    return self.num_processes > 1

  @property
  def runs_tf_server(self):
    return False

  def check_plan(self, plan):
    """Raises for a plan whose replica spans processes (its stages on
    several processes) or that splits TaskGraphs across processes: a
    process's graph only holds its own devices."""
    for replica, workers in enumerate(plan.device_workers):
      if len(set(workers)) > 1:
        raise ValueError(
            "communication.backend \"horovod\": model replica %d puts its "
            "%d pipeline stages on processes %s, but each Horovod process "
            "builds only its own devices' ops; pipelines across processes "
            "are not built. Give every process at least %d device(s) "
            "(GPUs, or cluster.num_cpu_devices on CPU), keep "
            "cluster.device_place_prefer_intra_node on, or use the "
            "\"collective\" backend with TF_CONFIG." % (
                replica, len(workers), sorted(set(workers)), len(workers)))
    if plan.has_split and self.num_processes > 1:
      raise NotImplementedError(
          "communication.backend \"horovod\": epl.split across %d processes "
          "is not built (its shard groups exchange activations between "
          "processes). Run epl.split in one process, or use the "
          "\"collective\" backend with TF_CONFIG." % self.num_processes)
    return plan

  def __repr__(self):
    return ("HorovodCluster(processes=%d, rank=%d, %d %s device(s) per "
            "process, %d in total)" % (
                self.num_processes, self.worker_index,
                self.devices_per_worker, self.device_type,
                self.total_devices))


class VirtualDevice:
  """Device slices, as the original EPL's `cluster.virtual_devices` gave
  them: slice r holds the devices of model replica r."""

  def __init__(self, slices, cluster):
    self.slice_devices = [list(s) for s in slices]
    self._cluster = cluster

  @property
  def all_devices(self):
    return [d for s in self.slice_devices for d in s]

  @property
  def local_devices(self):
    """The devices of this worker."""
    return [d for d in self.all_devices
            if self._cluster.worker_of_device(d) == self._cluster.worker_index]

  @property
  def num_replicas(self):
    return len(self.slice_devices)

  def get_device(self, replica, device_index):
    return self.slice_devices[replica][device_index]

  def __repr__(self):
    return "VirtualDevice(%r)" % self.slice_devices
