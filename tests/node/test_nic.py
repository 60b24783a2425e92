"""RDMA NIC detection over fake sysfs trees (harness.node.nic, harness.node.nic_cli)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
import typer
from helpers.nic_fakes import LINK_LOCAL, add_device, roce_port, v4_gid
from typer.testing import CliRunner

from harness.node.nic import (
    NicEnv,
    NicError,
    detect,
    ipv4_from_gid,
    parse_nicctl_qos,
    render_exports,
    vendor_of,
)
from harness.node.nic_cli import nic_command

ROUTE = (
    "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
    "eth1\t00000000\t0101A8C0\t0003\t0\t0\t200\t00000000\t0\t0\t0\n"
    "eth0\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
    "eth0\t0000000A\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n"
)

NICCTL_QOS = """\
NIC  : 42424650-4c32-3531-3130-303033303430 (0000:05:00.0)

Port : 04908130-a7c0-4242-4242-000011010000

  Classification type            : DSCP

  DSCP-to-priority :
    DSCP bitmap                  : 0xffffffffbbffffff ==> priority : 0
    DSCP                         : 0-25, 27-45, 47-63 ==> priority : 0
    DSCP bitmap                  : 0x0000000004000000 ==> priority : 3
    DSCP                         : 26 ==> priority : 3
    DSCP bitmap                  : 0x0000400000000000 ==> priority : 6
    DSCP                         : 46 ==> priority : 6

  PFC :
    PFC priority bitmap          : 0x8
    PFC no-drop priorities       : 3

  Scheduling :
    --------------------------------------------
    Priority  Scheduling  Bandwidth  Rate-limit
              Type        (in %age)  (in Gbps)
    --------------------------------------------
    0         DWRR        10         N/A
    3         DWRR        90         N/A
    6         strict      N/A        10
"""


def no_runner(argv: Sequence[str], timeout: float) -> str:
    raise AssertionError(f"unexpected command {argv}")


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    root.mkdir()
    return root


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has no nicctl (tests add one when they want it)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    return {"PATH": str(bindir)}


def fake_nicctl(env: dict[str, str]) -> None:
    exe = Path(env["PATH"]) / "nicctl"
    exe.write_text("#!/bin/sh\nexit 1\n")  # never run: tests inject the runner
    exe.chmod(0o755)


# --------------------------------------------------------------------------- detection


def test_mlx5_roce_two_devices(sysfs: Path, env: dict[str, str]) -> None:
    add_device(sysfs, "mlx5_0", {1: roce_port("10.1.0.5", "ens1np0")})
    add_device(sysfs, "mlx5_1", {1: roce_port("10.1.1.5", "ens2np0")})
    result = detect(sysfs, env, fallback_addr="192.168.0.9", runner=no_runner)
    assert result.transport == "rdma"
    # Index 3 is the lowest RoCE v2 GID that is IPv4-mapped (1 is RoCE v2 but link-local).
    assert result.env == {
        "IBDEVICES": "mlx5_0,mlx5_1",
        "UCX_NET_DEVICES": "mlx5_0:1,mlx5_1:1",
        "NCCL_IB_HCA": "mlx5_0,mlx5_1",
        "MORI_RDMA_DEVICES": "mlx5_0,mlx5_1",  # MoRI gets the same NICs, not its own pick
        "UCX_IB_GID_INDEX": "3",
        "NCCL_IB_GID_INDEX": "3",
        "MORI_IB_GID_INDEX": "3",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "10.1.0.5",
    }
    assert list(result.env)[:3] == ["IBDEVICES", "UCX_NET_DEVICES", "NCCL_IB_HCA"]
    assert result.notices == []


def test_natural_device_order(sysfs: Path, env: dict[str, str]) -> None:
    for i in (10, 2, 1):
        add_device(sysfs, f"mlx5_{i}", {1: roce_port(f"10.0.0.{i}", f"eth{i}")})
    result = detect(sysfs, env, runner=no_runner)
    assert result.env["IBDEVICES"] == "mlx5_1,mlx5_2,mlx5_10"
    assert result.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.1"


def test_ionic_roce_v2_netdev_from_device_dir(sysfs: Path, env: dict[str, str]) -> None:
    # AMD ionic: IPv4 GID at index 1, no gid_attrs/ndevs entries.
    add_device(
        sysfs,
        "ionic_0",
        {1: {"gids": {0: (LINK_LOCAL, "RoCE v2", ""), 1: (v4_gid("172.16.3.7"), "RoCE v2", "")}}},
        netdevs=["enp9s0"],
    )
    result = detect(sysfs, env, runner=no_runner)
    assert result.env["UCX_NET_DEVICES"] == "ionic_0:1"
    assert result.env["UCX_IB_GID_INDEX"] == result.env["NCCL_IB_GID_INDEX"] == "1"
    assert result.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "172.16.3.7"
    from harness.node.nic import read_device

    dev = read_device(sysfs, "ionic_0")
    assert dev.vendor == "amd"
    assert dev.ports[0].netdev == "enp9s0"


def test_bnxt_re_without_ipv4_falls_back_to_roce_v2_ipv6(sysfs: Path, env: dict[str, str]) -> None:
    add_device(sysfs, "bnxt_re0", {1: roce_port(None, "ens5f0np0")})
    result = detect(sysfs, env, fallback_addr="192.168.0.9", runner=no_runner)
    assert result.env["UCX_NET_DEVICES"] == "bnxt_re0:1"
    assert result.env["UCX_IB_GID_INDEX"] == "1"
    assert result.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "192.168.0.9"
    assert any("no IPv4-mapped RoCE v2 GID" in n for n in result.notices)
    assert any("side channel uses 192.168.0.9" in n for n in result.notices)
    assert vendor_of("bnxt_re0") == "broadcom"


def test_infiniband_uses_gid_index_0(sysfs: Path, env: dict[str, str]) -> None:
    ib = {"link_layer": "InfiniBand", "gids": {0: ("fe80:0000:0000:0000:b83f:d203:006a:e617", "", "")}}
    add_device(sysfs, "mlx5_0", {1: ib})
    add_device(sysfs, "mlx5_1", {1: ib})
    result = detect(sysfs, env, fallback_addr="10.9.9.9", runner=no_runner)
    assert result.env == {
        "IBDEVICES": "mlx5_0,mlx5_1",
        "UCX_NET_DEVICES": "mlx5_0:1,mlx5_1:1",
        "NCCL_IB_HCA": "mlx5_0,mlx5_1",
        "MORI_RDMA_DEVICES": "mlx5_0,mlx5_1",
        "UCX_IB_GID_INDEX": "0",
        "NCCL_IB_GID_INDEX": "0",
        "MORI_IB_GID_INDEX": "0",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "10.9.9.9",
    }


def test_down_port_left_out(sysfs: Path, env: dict[str, str]) -> None:
    add_device(sysfs, "mlx5_0", {1: roce_port("10.1.0.5", "eth0")})
    add_device(sysfs, "mlx5_1", {1: roce_port("10.1.1.5", "eth1", state="1: DOWN")})
    add_device(sysfs, "mlx5_2", {1: roce_port("10.1.2.5", "eth2"), 2: roce_port(None, "eth3", state="2: INIT")})
    result = detect(sysfs, env, runner=no_runner)
    assert result.env["IBDEVICES"] == "mlx5_0,mlx5_2"
    assert result.env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_2:1"
    assert result.env["NCCL_IB_HCA"] == "mlx5_0,mlx5_2"
    assert result.notices == ["mlx5_1 port 1 is DOWN; left out", "mlx5_2 port 2 is INIT; left out"]


def test_nccl_hca_exact_match_when_prefix_would_catch_left_out_device(sysfs: Path, env: dict[str, str]) -> None:
    add_device(sysfs, "mlx5_1", {1: roce_port("10.0.0.1", "eth1")})
    add_device(sysfs, "mlx5_10", {1: roce_port("10.0.0.10", "eth10", state="1: DOWN")})
    result = detect(sysfs, env, runner=no_runner)
    assert result.env["NCCL_IB_HCA"] == "=mlx5_1"
    assert result.env["IBDEVICES"] == "mlx5_1"


def test_gid_index_disagreement_uses_majority(sysfs: Path, env: dict[str, str]) -> None:
    add_device(sysfs, "mlx5_0", {1: roce_port("10.0.0.1", "eth0")})
    add_device(sysfs, "mlx5_1", {1: roce_port("10.0.0.2", "eth1")})
    add_device(sysfs, "mlx5_2", {1: {"gids": {0: (v4_gid("10.0.0.3"), "RoCE v2", "eth2")}}})
    result = detect(sysfs, env, runner=no_runner)
    assert result.env["UCX_IB_GID_INDEX"] == "3"
    assert any("mlx5_2:1=0" in n for n in result.notices)


def test_unknown_vendor_kept(sysfs: Path, env: dict[str, str]) -> None:
    add_device(sysfs, "qedr0", {1: roce_port("10.0.0.1", "eth0")})
    add_device(sysfs, "rdma3", {1: roce_port("10.0.0.2", "eth1")})
    result = detect(sysfs, env, runner=no_runner)
    assert result.env["IBDEVICES"] == "qedr0,rdma3"
    assert (vendor_of("qedr0"), vendor_of("rdma3"), vendor_of("mlx5_0")) == ("unknown", "generic", "nvidia")


# --------------------------------------------------------------------------- IBDEVICES


def test_ibdevices_override(sysfs: Path, env: dict[str, str]) -> None:
    for i in range(3):
        add_device(sysfs, f"mlx5_{i}", {1: roce_port(f"10.0.{i}.1", f"eth{i}")})
    result = detect(sysfs, {**env, "IBDEVICES": "mlx5_2, mlx5_1"}, runner=no_runner)
    assert result.env["IBDEVICES"] == "mlx5_2,mlx5_1"  # the user's order
    assert result.env["UCX_NET_DEVICES"] == "mlx5_2:1,mlx5_1:1"
    assert result.env["NCCL_IB_HCA"] == "mlx5_2,mlx5_1"
    assert result.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.2.1"


def test_ibdevices_override_unknown_device(sysfs: Path, env: dict[str, str]) -> None:
    add_device(sysfs, "mlx5_0", {1: roce_port("10.0.0.1", "eth0")})
    with pytest.raises(NicError, match=r"not on this node: mlx5_7 \(present: mlx5_0\)"):
        detect(sysfs, {**env, "IBDEVICES": "mlx5_0,mlx5_7"}, runner=no_runner)


def test_ibdevices_override_all_down_is_an_error(sysfs: Path, env: dict[str, str]) -> None:
    add_device(sysfs, "mlx5_0", {1: roce_port("10.0.0.1", "eth0", state="1: DOWN")})
    with pytest.raises(NicError, match="none of its ports is ACTIVE"):
        detect(sysfs, {**env, "IBDEVICES": "mlx5_0"}, runner=no_runner)


def test_ibdevices_override_with_port(sysfs: Path, env: dict[str, str]) -> None:
    add_device(sysfs, "mlx5_0", {1: roce_port("10.0.0.1", "eth0"), 2: roce_port("10.0.0.2", "eth1")})
    result = detect(sysfs, {**env, "IBDEVICES": "mlx5_0:2"}, runner=no_runner)
    assert result.env["UCX_NET_DEVICES"] == "mlx5_0:2"
    assert result.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.2"
    with pytest.raises(NicError, match="no port 3"):
        detect(sysfs, {**env, "IBDEVICES": "mlx5_0:3"}, runner=no_runner)


# --------------------------------------------------------------------------- TCP


def test_no_rdma_uses_tcp(sysfs: Path, env: dict[str, str], tmp_path: Path) -> None:
    route = tmp_path / "route"
    route.write_text(ROUTE)
    result = detect(sysfs, env, fallback_addr="10.0.0.42", route_path=route, runner=no_runner)
    assert result.transport == "tcp"
    assert result.env == {
        "UCX_TLS": "tcp,self,sm",
        "UCX_NET_DEVICES": "eth0",  # lowest-metric default route
        "NCCL_IB_DISABLE": "1",
        "NCCL_SOCKET_IFNAME": "eth0",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.42",
    }
    assert result.notices == ["no active RDMA device found; using TCP"]


def test_no_rdma_without_route_or_fallback(sysfs: Path, env: dict[str, str], tmp_path: Path) -> None:
    (sysfs / "module" / "nvidia").mkdir(parents=True)
    result = detect(sysfs, env, route_path=tmp_path / "missing", runner=no_runner)
    assert result.env == {"UCX_TLS": "tcp,self,sm,cuda_copy,cuda_ipc", "NCCL_IB_DISABLE": "1"}
    assert result.notices[0] == "no active RDMA device found; using TCP"


def test_all_ports_down_uses_tcp(sysfs: Path, env: dict[str, str], tmp_path: Path) -> None:
    add_device(sysfs, "mlx5_0", {1: roce_port("10.0.0.1", "eth0", state="1: DOWN")})
    result = detect(sysfs, env, route_path=tmp_path / "missing", runner=no_runner)
    assert result.transport == "tcp"
    assert result.notices[:2] == ["mlx5_0 port 1 is DOWN; left out", "no active RDMA device found; using TCP"]


# --------------------------------------------------------------------------- QoS


def test_nicctl_qos(sysfs: Path, env: dict[str, str]) -> None:
    add_device(sysfs, "ionic_0", {1: roce_port("10.0.0.1", "eth0")})
    fake_nicctl(env)
    calls: list[tuple[list[str], float]] = []

    def runner(argv: Sequence[str], timeout: float) -> str:
        calls.append((list(argv), timeout))
        return NICCTL_QOS

    result = detect(sysfs, env, runner=runner)
    assert calls == [([str(Path(env["PATH"]) / "nicctl"), "show", "qos"], 5.0)]
    # Priority 3 is the no-drop one; DSCP 26 << 2 = 104.
    assert {k: result.env[k] for k in ("UCX_IB_TRAFFIC_CLASS", "UCX_IB_SL", "NCCL_IB_TC", "NCCL_IB_SL")} == {
        "UCX_IB_TRAFFIC_CLASS": "104",
        "UCX_IB_SL": "3",
        "NCCL_IB_TC": "104",
        "NCCL_IB_SL": "3",
    }
    # MoRI-IO and MoRI EP read their own QoS variables: the same class and level.
    assert {k: result.env[k] for k in ("MORI_IO_TC", "MORI_RDMA_TC", "MORI_IO_SL", "MORI_RDMA_SL")} == {
        "MORI_IO_TC": "104",
        "MORI_RDMA_TC": "104",
        "MORI_IO_SL": "3",
        "MORI_RDMA_SL": "3",
    }
    assert list(result.env)[-1] == "VLLM_NIXL_SIDE_CHANNEL_HOST"


@pytest.mark.parametrize(
    "exc",
    [
        subprocess.TimeoutExpired(["nicctl"], 5.0),
        subprocess.CalledProcessError(1, ["nicctl"]),
        PermissionError("denied"),
    ],
)
def test_nicctl_failure_is_a_notice(sysfs: Path, env: dict[str, str], exc: Exception) -> None:
    add_device(sysfs, "ionic_0", {1: roce_port("10.0.0.1", "eth0")})
    fake_nicctl(env)

    def runner(argv: Sequence[str], timeout: float) -> str:
        raise exc

    result = detect(sysfs, env, runner=runner)
    assert not {"UCX_IB_TRAFFIC_CLASS", "UCX_IB_SL", "NCCL_IB_TC", "NCCL_IB_SL"} & set(result.env)
    assert len(result.notices) == 1 and result.notices[0].startswith("nicctl show qos failed")
    assert result.env["UCX_IB_GID_INDEX"] == "3"


def test_nicctl_unparseable_output(sysfs: Path, env: dict[str, str]) -> None:
    add_device(sysfs, "ionic_0", {1: roce_port("10.0.0.1", "eth0")})
    fake_nicctl(env)
    result = detect(sysfs, env, runner=lambda argv, timeout: "Error: permission denied\n")
    assert "UCX_IB_SL" not in result.env
    assert result.notices and "could not read a PFC no-drop priority" in result.notices[0]


def test_qos_env_overrides(sysfs: Path, env: dict[str, str]) -> None:
    add_device(sysfs, "mlx5_0", {1: roce_port("10.0.0.1", "eth0")})
    fake_nicctl(env)
    result = detect(sysfs, {**env, "PDBENCH_IB_TRAFFIC_CLASS": "106", "PDBENCH_IB_SL": "5"}, runner=no_runner)
    assert (result.env["UCX_IB_TRAFFIC_CLASS"], result.env["NCCL_IB_TC"]) == ("106", "106")
    assert (result.env["UCX_IB_SL"], result.env["NCCL_IB_SL"]) == ("5", "5")
    # One override set: nicctl fills the other.
    result = detect(sysfs, {**env, "PDBENCH_IB_SL": "1"}, runner=lambda a, t: NICCTL_QOS)
    assert (result.env["UCX_IB_TRAFFIC_CLASS"], result.env["UCX_IB_SL"]) == ("104", "1")
    with pytest.raises(NicError, match="PDBENCH_IB_SL"):
        detect(sysfs, {**env, "PDBENCH_IB_SL": "16"}, runner=no_runner)


def test_no_nicctl_no_qos(sysfs: Path, env: dict[str, str]) -> None:
    add_device(sysfs, "mlx5_0", {1: roce_port("10.0.0.1", "eth0")})
    result = detect(sysfs, env, runner=no_runner)
    assert "UCX_IB_SL" not in result.env and result.notices == []


def test_parse_nicctl_qos_variants() -> None:
    assert parse_nicctl_qos(NICCTL_QOS) is not None
    two = NICCTL_QOS.replace("no-drop priorities       : 3", "no-drop priorities       : 1,3")
    qos = parse_nicctl_qos(two)  # priority 1 has no DSCP mapped, so 3 is used
    assert qos is not None and (qos.traffic_class, qos.service_level) == (104, 3)
    ranged = "PFC no-drop priorities : 2\n  DSCP : 10, 24-30 ==> priority : 2\n"
    qos = parse_nicctl_qos(ranged)
    assert qos is not None and (qos.traffic_class, qos.service_level) == (104, 2)
    assert parse_nicctl_qos("PFC no-drop priorities : 2\n  DSCP : 10 ==> priority : 2\n").traffic_class == 40
    assert parse_nicctl_qos("") is None
    assert parse_nicctl_qos("PFC no-drop priorities : 4\n") is None


# --------------------------------------------------------------------------- helpers


def test_ipv4_from_gid() -> None:
    assert ipv4_from_gid("0000:0000:0000:0000:0000:ffff:0a00:0001") == "10.0.0.1"
    assert ipv4_from_gid(LINK_LOCAL) is None
    assert ipv4_from_gid("garbage") is None


BASH = shutil.which("bash") or "/bin/bash"


def bash_eval(script: str, tmp_path: Path, var: str) -> str:
    f = tmp_path / "exports.sh"
    f.write_text(script)
    bash = BASH
    # The CLI tests empty PATH (no host nicctl); bash still needs cat.
    out = subprocess.run(
        [bash, "-c", f'eval "$(cat {f})"; echo "${var}"'],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    return out.stdout.rstrip("\n")


def test_render_exports_quotes(tmp_path: Path) -> None:
    nic = NicEnv(env={"A": "plain", "B": "it's $HOME; `x`", "UCX_NET_DEVICES": "mlx5_0:1,mlx5_1:1"})
    text = render_exports(nic)
    assert text.splitlines()[0] == "export A=plain"
    assert text.splitlines()[2] == "export UCX_NET_DEVICES=mlx5_0:1,mlx5_1:1"
    assert bash_eval(text, tmp_path, "B") == "it's $HOME; `x`"


# --------------------------------------------------------------------------- CLI


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> typer.Typer:
    for key in ("IBDEVICES", "PDBENCH_IB_TRAFFIC_CLASS", "PDBENCH_IB_SL"):
        monkeypatch.delenv(key, raising=False)
    bindir = tmp_path / "clibin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))  # no nicctl from the host
    app = typer.Typer()
    app.command()(nic_command)
    return app


def test_cli_export_evals_in_bash(cli: typer.Typer, sysfs: Path, tmp_path: Path) -> None:
    add_device(sysfs, "mlx5_0", {1: roce_port("10.1.0.5", "eth0")})
    add_device(sysfs, "mlx5_1", {1: roce_port("10.1.1.5", "eth1", state="1: DOWN")})
    result = CliRunner().invoke(cli, ["--sysfs", str(sysfs), "--export"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "export IBDEVICES=mlx5_0",
        "export UCX_NET_DEVICES=mlx5_0:1",
        "export NCCL_IB_HCA=mlx5_0",
        "export MORI_RDMA_DEVICES=mlx5_0",
        "export UCX_IB_GID_INDEX=3",
        "export NCCL_IB_GID_INDEX=3",
        "export MORI_IB_GID_INDEX=3",
        "export VLLM_NIXL_SIDE_CHANNEL_HOST=10.1.0.5",
    ]
    assert "# pdbench nic: mlx5_1 port 1 is DOWN; left out" in result.stderr
    assert bash_eval(result.stdout, tmp_path, "UCX_IB_GID_INDEX") == "3"
    assert bash_eval(result.stdout, tmp_path, "UCX_NET_DEVICES") == "mlx5_0:1"


def test_cli_json(cli: typer.Typer, sysfs: Path, tmp_path: Path) -> None:
    route = tmp_path / "route"
    route.write_text(ROUTE)
    result = CliRunner().invoke(
        cli, ["--sysfs", str(sysfs), "--json", "--fallback-addr", "10.0.0.42", "--route-file", str(route)]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["transport"] == "tcp"
    assert data["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.42"
    assert data["env"]["NCCL_SOCKET_IFNAME"] == "eth0"
    assert data["notices"] == ["no active RDMA device found; using TCP"]


def test_cli_bad_ibdevices_exits_2(cli: typer.Typer, sysfs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    add_device(sysfs, "mlx5_0", {1: roce_port("10.0.0.1", "eth0")})
    monkeypatch.setenv("IBDEVICES", "mlx5_9")
    result = CliRunner().invoke(cli, ["--sysfs", str(sysfs)])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "error: IBDEVICES names RDMA device(s) not on this node: mlx5_9" in result.stderr
