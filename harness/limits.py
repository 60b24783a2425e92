"""Process limits pdbench raises at start: the open-file limit of the proxy and the bench client.

Each connection takes a descriptor; thousands in flight pass a soft limit of 1,024 (a common
default) long before the hard limit, and the failure ("Too many open files") is then the
process's own, never the server's. The soft limit is raised to the hard one; children (the
proxy's workers, the client's load processes) inherit it."""

from __future__ import annotations

import errno
import resource

# The errors of this process running out of something of its own (descriptors, memory, buffers,
# local ports): never a backend's fault.
LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EADDRNOTAVAIL})


def raise_open_files() -> tuple[int, int]:
    """Raise RLIMIT_NOFILE's soft limit to its hard limit where allowed; (soft, hard) in force after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # e.g. an unlimited hard limit the kernel caps lower
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def local_cause(exc: BaseException | None) -> OSError | None:
    """The OSError of a local resource running out behind `exc` (itself, or its cause or context,
    or aiohttp's os_error), or None."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in LOCAL_ERRNOS:
            return exc
        inner = getattr(exc, "os_error", None)
        if isinstance(inner, OSError) and inner.errno in LOCAL_ERRNOS:
            return inner
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None
