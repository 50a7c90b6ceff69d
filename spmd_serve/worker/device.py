"""Which GPU a rank uses (CONTRACT §2 `CUDA_VISIBLE_DEVICES`): the rank with local index k on its node
uses the k-th device the process sees, and a rank whose device is missing stops start-up with one line
saying which rank, which device and what the node shows.

The choice is pure (`select_device`: the local rank, the node's rank count, the variable's entries and
the driver's device count in, a `DeviceChoice` or a `DeviceError` out), so it is tested without a GPU;
`rank_device` reads those four from the MPI launcher's environment and the CUDA driver (ops/device.py).
Used by the GPU runner (worker/gpu_runner.py, docs/gpu.md); the CPU runner needs no device.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from spmd_serve.config import ConfigError

# Where each MPI launcher puts a rank's index among the ranks of its node (Open MPI, MPICH/Hydra, Slurm).
LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")
LOCAL_SIZE_VARS = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE")


class DeviceError(ConfigError):
    """A rank has no GPU to run on: the one line start-up prints."""


@dataclass(frozen=True)
class DeviceChoice:
    """`ordinal`: the device's index inside the process (what Paddle's `gpu:<n>`, `enable_use_gpu(_, n)`
    and cuDeviceGet take: CUDA renumbers the visible devices from 0); `visible`: its CUDA_VISIBLE_DEVICES
    entry (an index, a GPU-/MIG- UUID), or the ordinal when the variable is unset."""

    local_rank: int
    ordinal: int
    visible: str

    def __str__(self) -> str:
        return f"gpu:{self.ordinal} (CUDA_VISIBLE_DEVICES entry {self.visible})"


def visible_entries(env: Mapping[str, str]) -> tuple[str, ...] | None:
    """CUDA_VISIBLE_DEVICES as its entries; None when unset (every device is visible).  CUDA stops at
    the first invalid entry (`-1`, `none`): what follows is hidden, as here."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    entries: list[str] = []
    for entry in (e.strip() for e in raw.split(",")):
        if not entry or entry.startswith("-") or entry.lower() == "none":
            break
        entries.append(entry)
    return tuple(entries)


def _env_int(env: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    for name in names:
        if env.get(name, "").strip().isdigit():
            return int(env[name])
    return default


def select_device(local_rank: int, local_size: int, visible: tuple[str, ...] | None, device_count: int) -> DeviceChoice:
    """The device of the rank with index `local_rank` among the `local_size` ranks of its node, given
    CUDA_VISIBLE_DEVICES' entries (`visible_entries`) and the number of devices the driver shows this
    process (already filtered by the variable).  Every rank of a node gets the same error when the node
    has too few devices, so the job stops with one message rather than one rank's."""
    shown = "unset" if visible is None else ",".join(visible) or "(empty)"
    if visible is not None and len(set(visible)) != len(visible):
        raise DeviceError(f"CUDA_VISIBLE_DEVICES={shown} lists a device twice; list each GPU once")
    if visible is not None and not visible:
        raise DeviceError(f"CUDA_VISIBLE_DEVICES={shown} hides every GPU; the GPU runner needs one per rank")
    if device_count <= 0:
        raise DeviceError(
            f"no CUDA device visible (CUDA_VISIBLE_DEVICES={shown}; no NVIDIA driver, or no GPU in the "
            "container: docker run --gpus all); the GPU runner needs one per rank"
        )
    if visible is not None and device_count < len(visible):
        raise DeviceError(
            f"CUDA_VISIBLE_DEVICES={shown} lists {len(visible)} devices but the driver shows {device_count}: "
            f"entry {visible[device_count]!r} is not a GPU on this node"
        )
    if local_size > device_count:
        raise DeviceError(
            f"{local_size} ranks on this node but {device_count} GPU(s) visible (CUDA_VISIBLE_DEVICES={shown}): "
            f"local rank {local_rank} and up have no device; run at most {device_count} ranks per node "
            "(MP_NUM / MP_NNODE) or make more GPUs visible"
        )
    if not 0 <= local_rank < device_count:
        raise DeviceError(f"local rank {local_rank} has no device: {device_count} GPU(s) visible")
    return DeviceChoice(local_rank, local_rank, visible[local_rank] if visible is not None else str(local_rank))


def driver_device_count() -> int:
    """Devices the CUDA driver shows this process (0 without a driver, cuda-python or a GPU)."""
    from ops import device

    if not device.gpu_available():
        return 0
    return int(device._check(device.driver.cuDeviceGetCount(), "cuDeviceGetCount"))


def rank_device(env: Mapping[str, str], device_count: int | None = None) -> DeviceChoice:
    """This process's device from the launcher's environment and the driver (`device_count` overrides
    the driver's answer: tests)."""
    count = driver_device_count() if device_count is None else device_count
    local_rank = _env_int(env, LOCAL_RANK_VARS, 0)  # a single process without mpirun is local rank 0
    local_size = max(_env_int(env, LOCAL_SIZE_VARS, 1), local_rank + 1)
    return select_device(local_rank, local_size, visible_entries(env), count)
