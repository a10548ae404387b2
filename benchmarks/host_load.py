"""How busy other processes kept this host's cores while a measurement
ran: the host's busy CPU time (Linux /proc/stat, all cores) less this
process's own, over the wall time.

On a host shared with other jobs a step's wall time depends on how many
cores were left to it: on 2 cores, a step that keeps both busy takes
about half its CPU time when nothing else runs and all of it when
another process holds a core. The load average trails by a minute and
counts this process too; this figure is the measurement's own interval
and excludes it, so two rows are comparable by wall time only where it
is alike.
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


class OtherProcesses:
  """Started at construction; `cores()` is the average number of cores
  other processes kept busy since then (None without /proc/stat)."""

  def __init__(self):
    self._available = os.path.exists(_STAT)
    self._host = _host_busy_seconds() if self._available else None
    self._own = time.process_time()
    self._wall = time.perf_counter()

  def cores(self):
    if not self._available:
      return None
    others = ((_host_busy_seconds() - self._host) -
              (time.process_time() - self._own))
    return max(others, 0.0) / (time.perf_counter() - self._wall)
