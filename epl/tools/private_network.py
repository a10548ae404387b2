"""A private network for a one-machine job: its servers reachable by the job
only.

TensorFlow's gRPC server listens on every interface (`ss -ltn` shows
`*:port`), takes no credentials and runs whatever graph a client sends it.
The workers of a one-machine job need nothing beyond loopback to reach each
other, so `epl-launch` runs itself, and with it every process it starts,
in a new network namespace whose only interface is its own loopback: the
workers' ports exist there and nowhere else, not even on this machine's
loopback; the job cannot reach other hosts either.

The namespace comes from `unshare --user --map-root-user --net`
(util-linux): a user namespace makes it without privileges, mapping the
caller's user id to root inside (the processes keep the caller's rights on
files and devices). Where that fails (no `unshare`, user namespaces
disabled), `problem()` says why and the launcher runs the job on the
machine's network with a warning.
"""
import shutil
import subprocess
import sys

from epl.runtime import network_namespace

_UNSHARE = ("--user", "--map-root-user", "--net")


def command(line):
  """`line` run in a new private network namespace, its loopback still
  down: `line` brings it up (`network_namespace.bring_up_loopback`)."""
  return [shutil.which("unshare") or "unshare"] + list(_UNSHARE) + list(line)


def problem():
  """Why a private network namespace cannot be made here, or None: makes
  one and brings up its loopback, as the launcher would."""
  if shutil.which("unshare") is None:
    return "`unshare` (util-linux) is not installed"
  try:
    probe = subprocess.run(
        command([sys.executable, "-m", __name__]), capture_output=True,
        text=True, timeout=60, check=False)
  except (OSError, subprocess.SubprocessError) as error:
    return "`unshare %s` failed: %s" % (" ".join(_UNSHARE), error)
  if probe.returncode != 0:
    said = probe.stderr.strip().splitlines()
    return "`unshare %s` failed: %s" % (
        " ".join(_UNSHARE), said[-1] if said else "exit status %d" %
        probe.returncode)
  return None


def exposure_text(exposure, servers, power):
  """The launcher's line on what a one-machine job's `servers` expose:
  nothing beyond the job (`exposure` None), else a warning saying why
  (`exposure`), that they listen on every interface and that whoever
  reaches them can, without authentication, `power`."""
  if exposure is None:
    return ("private network: the job runs in a network namespace of its "
            "own (unshare %s), so %s are reachable from the job only; the "
            "job reaches no other host (one that reads data over the "
            "network needs --network host)" % (" ".join(_UNSHARE), servers))
  return ("WARNING %s: %s listen on every interface of this machine and "
          "any host that reaches it can connect without authentication and "
          "%s; run only on a trusted network (docs/security.md)" % (
              exposure, servers, power))


if __name__ == "__main__":
  network_namespace.bring_up_loopback()
