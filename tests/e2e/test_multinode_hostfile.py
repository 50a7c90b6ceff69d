"""Multi-node start_server without MPI: the hostfile built from POD_IPS / POD_0_IP / MP_NNODE (master
first, MP_NUM / MP_NNODE slots each), the mpirun command that uses it, and the one-line errors for
a bad node list.  (The real two-node run is tests/e2e/test_multinode_netns.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from spmd_serve.config import ConfigError, ServeConfig, load_config
from spmd_serve.launcher.hostfile import check_master_is_local, hostfile_text, node_order
from spmd_serve.launcher.start import _mpirun_command
from tests.support.launcher_process import launcher_env, run


def cfg(**env: str) -> ServeConfig:
    return load_config([], env)


def body(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if not ln.startswith("#")]


def test_master_first_and_slots_per_node():
    c = cfg(MP_NUM="8", MP_NNODE="2", POD_IPS="10.1.0.7,10.1.0.9", POD_0_IP="10.1.0.9")
    assert node_order(c) == ["10.1.0.9", "10.1.0.7"]
    assert body(hostfile_text(c)) == ["10.1.0.9 slots=4", "10.1.0.7 slots=4"]


def test_pod_0_ip_defaults_to_the_first_address():
    c = cfg(MP_NUM="3", MP_NNODE="3", POD_IPS="a,b,c")
    assert body(hostfile_text(c)) == ["a slots=1", "b slots=1", "c slots=1"]


@pytest.mark.parametrize(
    "env, message",
    [
        ({"MP_NUM": "2", "MP_NNODE": "2"}, "MP_NNODE=2 needs POD_IPS"),
        ({"MP_NUM": "2", "MP_NNODE": "2", "POD_IPS": "a,a"}, "POD_IPS=a,a is invalid: a listed more than once"),
    ],
)
def test_bad_node_lists_are_one_line_errors(env, message):
    with pytest.raises(ConfigError) as e:
        node_order(cfg(**env))
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "env, message",
    [  # already refused when the configuration is read
        ({"MP_NUM": "2", "MP_NNODE": "2", "POD_IPS": "a,b", "POD_0_IP": "c"}, "POD_0_IP=c is invalid"),
        ({"MP_NUM": "4", "MP_NNODE": "2", "POD_IPS": "a,b,c"}, "lists 3 node(s) but MP_NNODE=2"),
    ],
)
def test_config_refuses_inconsistent_pods(env, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        cfg(**env)


def test_master_must_be_this_machine():
    check_master_is_local(cfg(MP_NUM="2", MP_NNODE="2", POD_IPS="127.0.0.1,192.0.2.1"))
    with pytest.raises(ConfigError, match="POD_0_IP=192.0.2.1 is not an address of this machine"):
        check_master_is_local(cfg(MP_NUM="2", MP_NNODE="2", POD_IPS="192.0.2.1,127.0.0.1"))


def test_mpirun_command_uses_the_hostfile_and_forwards_the_settings(tmp_path):
    c = cfg(
        MP_NUM="4",
        MP_NNODE="2",
        POD_IPS="10.1.0.7,10.1.0.9",
        POD_0_IP="10.1.0.9",
        MODEL_DIR="/models/m",
        SERVICE_HTTP_PORT="9000",
        LOG_DIR=str(tmp_path),
    )
    env = {
        **c.to_environ(),
        "PATH": "/usr/bin",
        "PYTHONPATH": "/src",
        "VIRTUAL_ENV": "/venv",
        "OMPI_MCA_plm_rsh_agent": "/bin/myagent",
    }
    cmd = _mpirun_command(c, env, tmp_path)
    i = cmd.index("-hostfile")
    assert Path(cmd[i + 1]) == tmp_path / "hostfile"
    assert body((tmp_path / "hostfile").read_text()) == ["10.1.0.9 slots=2", "10.1.0.7 slots=2"]
    assert cmd[cmd.index("-n") + 1] == "4"
    forwarded = {cmd[k + 1] for k, a in enumerate(cmd) if a == "-x"}
    assert {
        "MODEL_DIR",
        "MP_NUM",
        "MP_NNODE",
        "POD_IPS",
        "POD_0_IP",
        "SERVICE_HTTP_PORT",
        "LOG_DIR",
        "PATH",
        "PYTHONPATH",
        "VIRTUAL_ENV",
    } <= forwarded
    # the launch agent is Open MPI's own setting, read by mpirun from the environment it is given
    assert "OMPI_MCA_plm_rsh_agent" not in forwarded


def test_single_node_has_no_hostfile(tmp_path):
    cmd = _mpirun_command(cfg(MP_NUM="2"), {"PATH": "/usr/bin"}, tmp_path)
    assert "-hostfile" not in cmd and not (tmp_path / "hostfile").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"MP_NNODE": "2"}, "MP_NNODE=2 needs POD_IPS"),
        ({"MP_NNODE": "2", "POD_IPS": "192.0.2.1,127.0.0.1"}, "POD_0_IP=192.0.2.1 is not an address of this machine"),
    ],
)
def test_start_server_refuses_bad_multinode_settings_in_one_line(tmp_path, extra, message):
    env = launcher_env(tmp_path / "log", MP_NUM="2", **extra)
    res = run("start_server", env=env, cwd=tmp_path, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [f"start_server: error: {res.stderr.split('error: ', 1)[1].strip()}"]
    assert message in res.stderr and not (tmp_path / "log" / "server.pid").exists()
