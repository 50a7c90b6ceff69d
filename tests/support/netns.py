"""Test helper: two "nodes" on one machine.  Two network namespaces joined by a veth pair
(iproute2), each with its own address, and an Open MPI launch agent that enters the namespace of
the host it is asked to reach (`ip netns exec <ns> sh -c CMD`) where mpirun would call ssh.

    with TwoNodes(tmp_path) as nodes:
        nodes.run_in(0, ["mpirun", "-hostfile", ..., *nodes.mca_args(), ...])

mpirun itself runs in node 0's namespace, so rank 0 and its ports live there; node 1's ranks
are started through the agent and reach rank 0 over the veth pair only.  Everything is removed
on exit: processes still inside the namespaces (all of them started by the test) are killed, and
deleting a namespace deletes its end of the veth pair (and so the pair).
"""

from __future__ import annotations

import os
import secrets
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

# 10.213.0.0/16 is unlikely to be in use; the third byte is random per run so concurrent runs
# (and a leftover from a killed run) do not collide.
SUBNET = "10.213"

AGENT = """#!/bin/sh
# Open MPI launch agent for namespace "nodes": called like ssh, `agent [options] HOST COMMAND...`.
# Runs COMMAND with sh inside HOST's network namespace instead of logging in somewhere, with an
# environment as bare as an ssh login's: the ranks there get only what mpirun -x forwards.
while [ $# -gt 0 ]; do
  case "$1" in
    -*) shift ;;
    *) break ;;
  esac
done
host="$1"; shift
case "$host" in
{cases}
  *) echo "netns agent: unknown host $host" >&2; exit 255 ;;
esac
exec env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME="$HOME" \
  ip netns exec "$ns" sh -c "$*"
"""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


class TwoNodes:
    def __init__(self, workdir: Path) -> None:
        tag = secrets.token_hex(3)
        self.ns = [f"spmdA{tag}", f"spmdB{tag}"]
        self.veth = [f"vsA{tag}", f"vsB{tag}"]  # interface names: at most 15 characters
        third = int(tag[:2], 16) % 250 + 2
        self.ips = [f"{SUBNET}.{third}.1", f"{SUBNET}.{third}.2"]
        self.agent = workdir / "netns_agent.sh"
        self._made: list[str] = []

    def __enter__(self) -> TwoNodes:
        try:
            for ns in self.ns:
                _ip("netns", "add", ns)
                self._made.append(ns)
        except (OSError, subprocess.SubprocessError) as e:
            self.close()
            detail = getattr(e, "stderr", "") or str(e)
            pytest.skip(f"cannot create network namespaces here: {detail.strip()}")
        try:
            _ip(
                "link",
                "add",
                self.veth[0],
                "netns",
                self.ns[0],
                "type",
                "veth",
                "peer",
                "name",
                self.veth[1],
                "netns",
                self.ns[1],
            )
            for ns, dev, addr in zip(self.ns, self.veth, self.ips):
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                _ip("-n", ns, "link", "set", dev, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
            cases = "\n".join(f"  {addr}) ns={ns} ;;" for ns, addr in zip(self.ns, self.ips))
            self.agent.write_text(AGENT.replace("{cases}", cases))
            self.agent.chmod(self.agent.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        except BaseException:
            self.close()
            raise
        return self

    def mca_args(self) -> list[str]:
        """mpirun flags: launch through the agent, one hop (no tree spawn), TCP over the veth."""
        return [
            "--mca",
            "plm_rsh_agent",
            str(self.agent),
            "--mca",
            "plm_rsh_no_tree_spawn",
            "1",
            "--mca",
            "btl_tcp_if_include",
            f"{SUBNET}.0.0/16",
            "--mca",
            "oob_tcp_if_include",
            f"{SUBNET}.0.0/16",
        ]

    def mca_environ(self) -> dict[str, str]:
        """The same settings as environment variables (how an operator sets them for start_server)."""
        a = self.mca_args()
        return {f"OMPI_MCA_{a[i + 1]}": a[i + 2] for i in range(0, len(a), 3)}

    def in_ns(self, node: int, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns[node], *cmd]

    def pids(self) -> list[int]:
        found = []
        for ns in self._made:
            out = _ip("netns", "pids", ns, check=False).stdout
            found += [int(p) for p in out.split()]
        return found

    def kill_all(self) -> None:
        """SIGKILL every process still inside the namespaces (all started by this test)."""
        for _ in range(20):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)

    def close(self) -> None:
        self.kill_all()
        for ns in self._made:
            _ip("netns", "delete", ns, check=False)
        self._made.clear()

    def __exit__(self, *exc) -> None:
        self.close()
