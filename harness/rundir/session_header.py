"""The request header that names a session, shared by the client that sends it (harness.bench)
and the proxy that routes on it (harness.proxy, policy `session`): every turn of one
conversation carries the same value, so the proxy keeps the session on the same prefill and
decode instances, whose prefix caches hold its earlier turns."""

SESSION_HEADER = "X-Session-Id"
