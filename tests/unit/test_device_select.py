"""Device selection (worker/device.py) and the runner factory (worker/runners.py), without a GPU:
the local rank picks the k-th visible device, a missing device is one clear line, and a Paddle built
with CUDA gets the GPU runner, which refuses at start-up (it is not built yet: docs/gpu.md)."""

from __future__ import annotations

import pytest

from spmd_serve.config import ConfigError, load_config
from spmd_serve.worker import runners
from spmd_serve.worker.device import DeviceChoice, DeviceError, rank_device, select_device, visible_entries


@pytest.mark.parametrize(
    ("raw", "entries"),
    [
        (None, None),
        ("0,1", ("0", "1")),
        (" 2 , 3 ", ("2", "3")),
        ("GPU-8a1b,MIG-5c", ("GPU-8a1b", "MIG-5c")),
        ("", ()),
        ("-1", ()),
        ("1,-1,2", ("1",)),  # CUDA stops at the first invalid entry
        ("none", ()),
    ],
)
def test_visible_entries(raw, entries):
    assert visible_entries({} if raw is None else {"CUDA_VISIBLE_DEVICES": raw}) == entries


def test_local_rank_takes_kth_visible_device():
    assert select_device(0, 2, ("3", "5"), 2) == DeviceChoice(0, 0, "3")
    assert select_device(1, 2, ("3", "5"), 2) == DeviceChoice(1, 1, "5")
    assert select_device(1, 2, None, 8) == DeviceChoice(1, 1, "1")  # unset: every device, in order
    assert str(select_device(1, 2, ("3", "5"), 2)) == "gpu:1 (CUDA_VISIBLE_DEVICES entry 5)"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((0, 1, None, 0), "no CUDA device visible (CUDA_VISIBLE_DEVICES=unset"),
        ((0, 1, (), 0), "CUDA_VISIBLE_DEVICES=(empty) hides every GPU"),
        ((0, 2, ("0", "0"), 1), "lists a device twice"),
        ((0, 2, ("0", "7"), 1), "lists 2 devices but the driver shows 1: entry '7' is not a GPU"),
        ((0, 4, ("0", "1"), 2), "4 ranks on this node but 2 GPU(s) visible (CUDA_VISIBLE_DEVICES=0,1)"),
        ((2, 3, None, 2), "3 ranks on this node but 2 GPU(s) visible"),
    ],
)
def test_missing_device_is_one_clear_line(args, words):
    with pytest.raises(DeviceError) as e:
        select_device(*args)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_every_rank_of_a_crowded_node_gets_the_error():
    """Rank 0 has a device, but the node has too few for all: it fails too (one message for the job)."""
    with pytest.raises(DeviceError, match="run at most 1 ranks per node"):
        select_device(0, 2, None, 1)


def test_rank_device_reads_the_launchers_environment():
    env = {"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "CUDA_VISIBLE_DEVICES": "4,6"}
    assert rank_device(env, device_count=2) == DeviceChoice(1, 1, "6")
    assert rank_device({"MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "3"}, device_count=4).ordinal == 2
    assert rank_device({}, device_count=1) == DeviceChoice(0, 0, "0")  # no launcher: local rank 0
    with pytest.raises(DeviceError, match="no CUDA device visible"):
        rank_device({})  # this machine's driver: no GPU


@pytest.mark.parametrize(
    ("device", "cuda", "kind"),
    [("auto", False, "cpu"), ("auto", True, "gpu"), ("cpu", True, "cpu"), ("cpu", False, "cpu"), ("gpu", True, "gpu")],
)
def test_runner_kind(device, cuda, kind):
    assert runners.runner_kind(device, cuda) == kind


def test_gpu_on_a_cpu_paddle_is_refused():
    with pytest.raises(ConfigError, match="SPMD_DEVICE=gpu: this Paddle is built without CUDA"):
        runners.runner_kind("gpu", False)
    assert runners.paddle_with_cuda() is False  # this machine's Paddle: the CPU wheel


def test_spmd_device_setting():
    assert load_config([], {}).device == "auto"
    assert load_config(["--device", "cpu"], {}).device == "cpu"
    with pytest.raises(ConfigError, match="SPMD_DEVICE"):
        load_config([], {"SPMD_DEVICE": "tpu"})


def test_factory_on_a_cuda_paddle_picks_the_gpu_runner_which_refuses(monkeypatch, tmp_path):
    """paddlepaddle-gpu (faked): the GPU runner is chosen; with no GPU it names the missing device, with
    one it says it is not built and how to serve on the CPU — it never starts as if it worked."""
    monkeypatch.setattr(runners, "paddle_with_cuda", lambda: True)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(DeviceError, match="no CUDA device visible"):
        runners.make_runner("auto", tmp_path, 0, None, 8, 16, 1, kv_int8=False)
    from spmd_serve.worker import device

    monkeypatch.setattr(device, "driver_device_count", lambda: 1)
    with pytest.raises(ConfigError) as e:
        runners.make_runner("auto", tmp_path, 0, None, 8, 16, 1, kv_int8=False)
    msg = str(e.value)
    assert "GPU runner is not built yet" in msg and "SPMD_DEVICE=cpu" in msg and "gpu:0" in msg
    assert not isinstance(e.value, DeviceError)


def test_factory_cpu_runner_is_todays_model_runner(monkeypatch, tmp_path):
    """SPMD_DEVICE=cpu on a CUDA Paddle (faked) builds the CPU runner: here it reads the manifest and
    fails on the empty directory exactly as ModelRunner does."""
    monkeypatch.setattr(runners, "paddle_with_cuda", lambda: True)
    with pytest.raises(ConfigError, match="manifest"):
        runners.make_runner("cpu", tmp_path, 0, None, 8, 16)
