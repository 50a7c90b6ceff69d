"""The one place a rank's runner is chosen (`make_runner`): the CPU runner (worker/model_runner.py, what
serves today) or the GPU runner (worker/gpu_runner.py: a skeleton that refuses, docs/gpu.md), by what
Paddle was compiled with, unless `SPMD_DEVICE` says otherwise.

    SPMD_DEVICE=auto  the GPU runner when Paddle is built with CUDA, else the CPU runner
    SPMD_DEVICE=cpu   the CPU runner, whatever Paddle was built with (paddlepaddle-gpu serves on the CPU)
    SPMD_DEVICE=gpu   the GPU runner; refused on a Paddle built without CUDA

Both runners take the same arguments and provide the engine's `Runner` interface (engine/interfaces.py).
`make_draft_runner` is the same choice for speculative decoding's draft model (SPECULATE_METHOD=
draft_model): a second runner on every rank over the draft's export, with a KV pool of its own.
"""

from __future__ import annotations

from typing import Any

from spmd_serve.config import ConfigError

DEVICES = ("auto", "cpu", "gpu")


def paddle_with_cuda() -> bool:
    """Whether the installed Paddle was built with CUDA (paddlepaddle-gpu)."""
    import paddle

    return bool(paddle.is_compiled_with_cuda())


def runner_kind(device: str, with_cuda: bool) -> str:
    """`cpu` or `gpu` for a SPMD_DEVICE value and a Paddle build; a ConfigError for what cannot run."""
    if device not in DEVICES:
        raise ConfigError(f"SPMD_DEVICE={device} is invalid: must be one of {', '.join(DEVICES)}")
    if device == "gpu" and not with_cuda:
        raise ConfigError("SPMD_DEVICE=gpu: this Paddle is built without CUDA; install paddlepaddle-gpu")
    if device == "auto":
        return "gpu" if with_cuda else "cpu"
    return device


def make_runner(device: str, *args: Any, **kwargs: Any) -> Any:
    """The rank's runner: `device` is the SPMD_DEVICE value, the rest ModelRunner's arguments
    (model_dir, rank, comm, num_blocks, block_size, num_threads, kv_int8=, malloc_tuning=, huge_pages=)."""
    if runner_kind(device, paddle_with_cuda()) == "gpu":
        from spmd_serve.worker.gpu_runner import GpuModelRunner

        return GpuModelRunner(*args, **kwargs)
    from spmd_serve.worker.model_runner import ModelRunner

    return ModelRunner(*args, **kwargs)


def make_draft_runner(
    device: str, draft_dir: Any, rank: int, comm: Any, num_blocks: int, block_size: int, num_threads: int
) -> Any:
    """The rank's draft runner: `num_blocks` is engine/draft_model.draft_pool_blocks (the target's
    block ids mirrored, then scratch); its pool is float32 whatever USE_CACHE_KV_INT8 says (a draft's
    K/V only steer its proposals), and the heap tuning is the target runner's, already done.  Rank 0's
    keeps its hidden rows where its graphs output them (an MTP draft, SPECULATE_METHOD=mtp)."""
    args = (draft_dir, rank, comm, num_blocks, block_size, num_threads)
    return make_runner(device, *args, malloc_tuning=False, keep_hidden=rank == 0)  # (an MTP draft chains on them)
