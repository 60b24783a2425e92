"""The table of KV connectors (harness/kv_connectors/) is the one place connector knowledge lives:
the recipe schema, the proxy and its CLI, render and validity take their names and facts from
it, and a connector added to the table reaches every one of them without another edit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from harness import kv_connectors as connectors
from harness.config.schema import ConnectorSpec
from harness.proxy import proxy_command as proxy_cli
from harness.proxy.config import ProxyConfig
from harness.proxy.flows import FLOWS, make_flow

ROOT = Path(__file__).resolve().parents[2]
UNKNOWN = "no-such-connector"


def test_every_entry_is_whole_and_named_by_its_module() -> None:
    assert connectors.TABLE, "the table is empty"
    for name, entry in connectors.TABLE.items():
        assert entry.name == name
        assert (ROOT / "harness" / "kv_connectors" / f"{name}.py").is_file(), name
        assert entry.proxy.flow in FLOWS, f"{name}: flow {entry.proxy.flow!r} is not in harness.proxy.flows.FLOWS"
        assert entry.proxy.settings <= set(ProxyConfig.model_fields), name
        assert set(entry.proxy.required) <= set(ProxyConfig.model_fields), name
        # A connector that moves KV says what its servers export, even where that is nothing.
        assert (entry.evidence is not None) == entry.moves_kv, name


def test_the_recipe_takes_exactly_the_connectors_that_move_kv() -> None:
    moving = [n for n, e in connectors.TABLE.items() if e.vllm_class is not None]
    assert "none" in connectors.TABLE and "none" not in moving  # the baseline is no recipe connector
    assert ConnectorSpec.model_json_schema()["properties"]["name"]["enum"] == moving
    for name in moving:
        assert ConnectorSpec(name=name).name == name
    with pytest.raises(ValueError, match="none"):
        ConnectorSpec(name="none")
    reference = (ROOT / "docs" / "recipe-reference.md").read_text()
    row = next(line for line in reference.splitlines() if line.startswith("| `connector.name`"))
    assert all(f'"{n}"' in row for n in moving), row


def _proxy_cli() -> typer.Typer:
    app = typer.Typer()
    app.command("proxy")(proxy_cli.proxy_command)
    app.command("other")(lambda: None)
    return app


def _instances_args(entry: connectors.Connector) -> list[str]:
    """The fewest flags that give the proxy instances of this connector's kind."""
    if entry.proxy.instances == "aggregated":
        return ["--aggregated", "http://a:1"]
    if entry.proxy.instances == "registered":
        return [arg for s in entry.proxy.required for arg in (f"--{s.replace('_', '-')}", "36367")]
    return ["--prefill", "http://a:1", "--decode", "http://b:2"]


def test_the_proxy_takes_exactly_the_tables_names(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[ProxyConfig] = []
    monkeypatch.setattr(proxy_cli, "serve", seen.append)
    for name, entry in connectors.TABLE.items():
        result = CliRunner().invoke(_proxy_cli(), ["proxy", "--connector", name, *_instances_args(entry)])
        assert result.exit_code == 0, (name, result.output)
        assert seen[-1].connector == name
        assert type(make_flow(name)) is FLOWS[entry.proxy.flow]
    assert len(seen) == len(connectors.TABLE)
    result = CliRunner().invoke(_proxy_cli(), ["proxy", "--connector", UNKNOWN, *_instances_args(connectors.NONE)])
    assert result.exit_code == 2 and "connector" in result.output
    assert all(name in result.output for name in connectors.TABLE), result.output


def test_settings_of_one_connector_are_refused_for_the_others() -> None:
    for name, entry in connectors.TABLE.items():
        static = ["http://a:1"] if entry.proxy.instances == "static" else []
        base = {
            "connector": name,
            "prefill": static,
            "decode": static,
            "aggregated": ["http://c:3"] if entry.proxy.instances == "aggregated" else [],
            **dict.fromkeys(entry.proxy.required, 36367),
        }
        assert ProxyConfig(**base).connector == name  # the precondition: valid without the setting
        if "overlap" not in entry.proxy.settings:
            with pytest.raises(ValueError, match="overlap only applies to connector pdbench"):
                ProxyConfig(**base, overlap=True)


def test_an_unknown_name_is_named_with_the_known_ones() -> None:
    with pytest.raises(connectors.UnknownConnector) as err:
        connectors.get(UNKNOWN)
    assert f"'{UNKNOWN}'" in str(err.value) and all(n in str(err.value) for n in connectors.TABLE)
    # none is in the table but moves no KV: not a connector a recipe or validity can name.
    with pytest.raises(connectors.UnknownConnector) as err:
        connectors.get_kv("none")
    assert str(err.value).endswith("'none'; known: " + ", ".join(sorted(connectors.kv_names())))


# Run in a fresh interpreter: one entry added to the table before the consumers are imported,
# exactly as a new module listed in harness/kv_connectors/__init__.py would be.
_NEW_CONNECTOR = """
import dataclasses, json, sys, tempfile
from pathlib import Path
from harness import kv_connectors as connectors
from harness.kv_connectors import nixl
from harness.kv_connectors.entry import EnvVar, KvEvidence, Package, PortRange, ProxyUse, Setting, Value

connectors.TABLE["fakekv"] = dataclasses.replace(
    nixl.ENTRY,
    name="fakekv",
    title="FakeKV",
    summary="a test's connector",
    vllm_class="FakeKvConnector",
    module_path="fake_kv",
    extra_config={"peer": Setting(Value.PROXY_ADDR), "port": Setting(Value.NOTIFY_PORT, text=True)},
    env=(EnvVar("FAKE_KV_PORT", Setting(Value.NOTIFY_PORT, text=True), roles=("decode",)),),
    ports=(PortRange(Value.NOTIFY_PORT),),
    rdma=False,
    image_modules=("fake_kv",),
    packages=(Package("fake-kv", ("fake-kv",), "fake_kv"),),
    proxy=ProxyUse(flow="mooncake", settings=frozenset({"bootstrap_ports"}), bootstrap_port=7000),
    evidence=KvEvidence("fakekv", r"vllm:fake_recv_count", None, None),
)

from harness.bench.runtime_info import PACKAGE_KEYS
from harness.config import load_recipe
from harness.proxy.config import ProxyConfig
from harness.proxy.flows import make_flow
from harness.render import RenderContext, render_job
from harness.validity.kv_evidence import evidence_for

rr = load_recipe("dsr1-fp8-mi355x-moriio-1p2d", ["connector.name=fakekv", "connector.notify_port=7100"])
out = Path(tempfile.mkdtemp())
render_job(rr, out, RenderContext(run_dir="/runs/x", root="/opt/pdbench", python="python3", git_commit=None))
cfg = ProxyConfig(connector="fakekv", prefill=["http://a:1"], decode=["http://b:2"])
json.dump({
    "server": (out / "server.sh").read_text(),
    "container": (out / "container.sh").read_text(),
    "plan": json.loads((out / "plan.json").read_text()),
    "flow": type(make_flow("fakekv")).__name__,
    "bootstrap": cfg.bootstrap_port(0),
    "evidence": evidence_for("fakekv").received,
    "package_keys": PACKAGE_KEYS,
}, sys.stdout)
"""


def test_a_connector_added_to_the_table_reaches_every_consumer() -> None:
    r = subprocess.run([sys.executable, "-c", _NEW_CONNECTOR], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    server = got["server"]
    # render: vLLM's class, module path and extra config, the environment, the proxy's line.
    assert '"kv_connector":"FakeKvConnector"' in server.replace("\\", ""), server
    assert '"kv_connector_module_path":"fake_kv"' in server.replace("\\", "")
    assert '"port":"7100"' in server.replace("\\", "")  # the first worker's notify base
    assert "FAKE_KV_PORT=" in server
    assert "NixlConnector" not in server and "VLLM_NIXL" not in server  # nothing of the entry it copied
    assert "--connector fakekv" in server and "--bootstrap-port" in server
    # the image: the connector's module must import there before any server starts.
    assert "fake_kv" in got["container"] and "mooncake.engine" not in got["container"]
    # pre-flight: the entry's port range is checked free on the workers' nodes; no RDMA.
    spec = got["plan"]["preflight"]
    assert any(7100 in ports for ports in spec["ports"].values()), spec
    assert spec["rdma"] is False
    # proxy and validity
    assert got["flow"] == "MooncakeFlow" and got["bootstrap"] == 7000
    assert got["evidence"] == "vllm:fake_recv_count"
    # every result's runtime record asks each server's interpreter for the connector's package
    assert "fake-kv" in got["package_keys"]


def test_the_bench_client_takes_the_connector_names_from_the_table() -> None:
    from pydantic import ValidationError

    from harness.bench.client_config import ClientConfig

    fields = {"base_url": "http://127.0.0.1:1", "model": "m", "concurrency": [1], "isl": 8, "osl": 2}
    fields |= {"tokenizer": "t", "result_dir": "out"}
    for name in connectors.kv_names():
        assert ClientConfig(**fields, kv_connector=name).kv_connector == name
    with pytest.raises(ValidationError, match=rf"kv_connector\n.*unknown KV connector '{UNKNOWN}'; known: "):
        ClientConfig(**fields, kv_connector=UNKNOWN)
