"""Multi-node `start_server`: the Open MPI hostfile built from POD_IPS, POD_0_IP and MP_NNODE.

One line per node, `<address> slots=<MP_NUM / MP_NNODE>`, POD_0_IP first: mpirun maps ranks by
slot in file order, so ranks 0..k-1 (rank 0 serves HTTP) land on the master and the next k on the
next node.  POD_0_IP defaults to the first address of POD_IPS.  The file is written into LOG_DIR
(`LOG_DIR/hostfile`) so the operator can see what was launched.

How mpirun reaches the other nodes is Open MPI's business: ssh by default (password-less, same
paths on every node), or any ssh-like command named by `OMPI_MCA_plm_rsh_agent` in the
environment (mpirun reads `OMPI_MCA_*` itself, and start_server passes the environment on).
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path

from spmd_serve.config import ConfigError, ServeConfig

HOSTFILE_NAME = "hostfile"


def node_order(cfg: ServeConfig) -> list[str]:
    """The nodes in launch order, master first; validated (clear one-line ConfigError)."""
    if not cfg.pod_ips:
        raise ConfigError(
            f"MP_NNODE={cfg.mp_nnode} needs POD_IPS (the {cfg.mp_nnode} node addresses, "
            "comma-separated) and POD_0_IP (the master's, where rank 0 serves)"
        )
    ips = ",".join(cfg.pod_ips)
    if len(cfg.pod_ips) != cfg.mp_nnode:
        raise ConfigError(f"POD_IPS={ips} is invalid: lists {len(cfg.pod_ips)} node(s) but MP_NNODE={cfg.mp_nnode}")
    dups = sorted({a for a in cfg.pod_ips if cfg.pod_ips.count(a) > 1})
    if dups:
        raise ConfigError(f"POD_IPS={ips} is invalid: {','.join(dups)} listed more than once")
    master = cfg.pod_0_ip or cfg.pod_ips[0]
    if master not in cfg.pod_ips:
        raise ConfigError(f"POD_0_IP={master} is invalid: must be one of POD_IPS={ips}")
    return [master, *(a for a in cfg.pod_ips if a != master)]


def hostfile_text(cfg: ServeConfig) -> str:
    slots = cfg.ranks_per_node
    lines = [
        f"# written by start_server: MP_NUM={cfg.mp_num} over MP_NNODE={cfg.mp_nnode} nodes, "
        f"{slots} rank(s) each; the first node (POD_0_IP) runs rank 0"
    ]
    lines += [f"{addr} slots={slots}" for addr in node_order(cfg)]
    return "\n".join(lines) + "\n"


def write_hostfile(cfg: ServeConfig, log_dir: Path) -> Path:
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / HOSTFILE_NAME
    path.write_text(hostfile_text(cfg))
    return path


def check_master_is_local(cfg: ServeConfig) -> None:
    """start_server must run on the master: its port checks, pid file and readiness wait are local."""
    master = node_order(cfg)[0]
    try:
        infos = socket.getaddrinfo(master, None, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ConfigError(f"POD_0_IP={master} is invalid: cannot resolve it ({e.strerror})") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((addr[0], 0))
        except OSError as e:
            if e.errno == errno.EADDRNOTAVAIL:
                raise ConfigError(
                    f"POD_0_IP={master} is not an address of this machine: run start_server on the master node"
                ) from None
            raise
