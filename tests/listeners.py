"""The listening TCP sockets of a test's processes: local runs and the tests' process groups listen
on loopback only (the host's other addresses are reachable from outside it)."""

from __future__ import annotations

import ipaddress
import socket
import threading

import psutil


class ListenerWatch:
    """Samples the listening TCP sockets of this process and all its descendants (the Ray
    processes a run starts) while a run is going."""

    def __init__(self, period_s: float = 0.5) -> None:
        self.period_s = period_s
        self.seen: set[tuple[str, str, int]] = set()
        #: (ip, port) -> "pid N (this test process | a child): command line", to name a stray listener
        self.owners: dict[tuple[str, int], str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            for proc in [me, *me.children(recursive=True)]:
                try:
                    for conn in proc.net_connections(kind="inet"):
                        if conn.status == psutil.CONN_LISTEN:
                            self.seen.add((proc.name(), conn.laddr.ip, conn.laddr.port))
                            whose = "this test process" if proc.pid == me.pid else "a child"
                            self.owners.setdefault((conn.laddr.ip, conn.laddr.port),
                                                   f"pid {proc.pid} ({whose}): {' '.join(proc.cmdline())[:300]}")
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
            self._stop.wait(self.period_s)

    def __enter__(self) -> ListenerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def is_loopback(ip: str) -> bool:
    """Whether ``ip`` (IPv4, IPv6 or IPv4-mapped IPv6) is a loopback address."""
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is IPv4 loopback too
    return (mapped or address).is_loopback


def outward_interface() -> str | None:
    """The name of a network interface with an IPv4 address outside 127.0.0.0/8 (``eth0`` here), or
    None: with ``GLOO_SOCKET_IFNAME`` set to it, a gloo group that does not pin ``lo`` listens there."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and not is_loopback(a.address) for a in addresses):
            return name
    return None
