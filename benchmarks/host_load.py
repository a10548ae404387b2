"""How busy other processes kept this host's cores while a measurement
ran: the host's busy CPU time (Linux /proc/stat, all cores) less this
process's own and its row processes' (children it names by pid), over the
wall time.

On a host shared with other jobs a step's wall time depends on how many
cores were left to it: on 2 cores, a step that keeps both busy takes
about half its CPU time when nothing else runs and all of it when
another process holds a core. The load average trails by a minute and
counts this process too; this figure is the measurement's own interval
and excludes it (and the processes that run the measured steps), so two
rows are comparable by wall time only where it is alike.
"""
import os
import time

_STAT = "/proc/stat"


def _host_busy_seconds():
  """CPU seconds all cores spent neither idle nor waiting for I/O since
  boot (the first line of /proc/stat)."""
  with open(_STAT) as stat:
    fields = [int(value) for value in stat.readline().split()[1:]]
  idle, iowait = fields[3], fields[4]
  return (sum(fields) - idle - iowait) / os.sysconf("SC_CLK_TCK")


def _process_seconds(pid):
  """CPU seconds (user + system) process `pid` has used, or None once it
  is gone (/proc/<pid>/stat: utime and stime, the 14th and 15th fields;
  the name, 2nd, may hold spaces, so fields are counted after its ')')."""
  try:
    with open("/proc/%d/stat" % pid) as stat:
      after_name = stat.read().rsplit(")", 1)[1].split()
  except (OSError, IndexError):
    return None
  return (int(after_name[11]) + int(after_name[12])) / os.sysconf(
      "SC_CLK_TCK")


class OtherProcesses:
  """Started at construction; `cores()` is the average number of cores
  other processes kept busy since then (None without /proc/stat): not
  this process nor the live processes `child_pids` (the row processes
  whose steps are measured)."""

  def __init__(self, child_pids=()):
    self._available = os.path.exists(_STAT)
    self._host = _host_busy_seconds() if self._available else None
    self._own = time.process_time()
    self._children = {pid: _process_seconds(pid) for pid in child_pids}
    self._wall = time.perf_counter()

  def _children_seconds(self):
    """CPU seconds the children used since the start; one gone meanwhile
    counts what it had used at the start (its last use is lost)."""
    total = 0.0
    for pid, start in self._children.items():
      now = _process_seconds(pid)
      if start is not None and now is not None:
        total += now - start
    return total

  def cores(self):
    if not self._available:
      return None
    others = ((_host_busy_seconds() - self._host) -
              (time.process_time() - self._own) - self._children_seconds())
    return max(others, 0.0) / (time.perf_counter() - self._wall)
