"""No KV connector: aggregated servers, each serving whole requests (the baseline).

Not a recipe's connector.name (the baseline is topology.aggregated); the proxy runs it as
`--connector none` with --aggregated instances.
"""

from harness.kv_connectors.entry import Connector, ProxyUse

ENTRY = Connector(name="none", title="no KV connector", summary="", proxy=ProxyUse(flow="none", instances="aggregated"))
