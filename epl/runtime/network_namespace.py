"""This process's network namespace: which interfaces are up, and bringing
up its loopback.

TensorFlow's gRPC server listens on every interface of its network
namespace, whatever address TF_CONFIG names. Whether anything outside the
job can reach it therefore depends on the namespace: one whose only
interface up is loopback (as `epl-launch` makes for a one-machine job) is
reachable by its own processes only.
"""
import fcntl
import socket
import struct

# ioctl requests and flags of <linux/sockios.h> and <net/if.h>: read and
# write an interface's flags; the interface is up; it is loopback.
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8
_IFREQ = "16sH"


def _flags(sock, name):
  request = struct.pack(_IFREQ, name.encode(), 0)
  return struct.unpack(_IFREQ, fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]


def exposed_interfaces():
  """Names of the interfaces up in this namespace other than loopback: the
  ways other hosts may reach a server listening on every interface."""
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
    return [name for _, name in socket.if_nameindex()
            if _flags(sock, name) & (_IFF_UP | _IFF_LOOPBACK) == _IFF_UP]


def bring_up_loopback():
  """Brings up the loopback interface, down in a new network namespace
  (`ip link set lo up` without iproute2; needs CAP_NET_ADMIN there)."""
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
    fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack(
        _IFREQ, b"lo", _flags(sock, "lo") | _IFF_UP))
