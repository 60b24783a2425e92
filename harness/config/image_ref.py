"""Container image references: the forms some runtime of the recipe's can pull or open.

docker and podman take a registry reference ([REGISTRY[:PORT]/]NAME[:TAG][@DIGEST], the
grammar of distribution/reference: the name is lower-case). enroot (pyxis) also takes
[USER@]REGISTRY#NAME and a squashfs file; apptainer a .sif file or directory, or a URI
(docker://, library://, oras://, shub://, http(s)://); podman its transports
(docker-archive:, oci-archive:, ...). A value in none of these forms fails on the nodes
once the job has waited in the queue, so the recipe is refused when it is loaded.
"""

from __future__ import annotations

import re

_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
REFERENCE = re.compile(rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?")
_URI = re.compile(r"(docker|library|oras|shub|https?)://(\S+)")
_TRANSPORT = re.compile(r"(?:docker-archive|oci-archive|oci|containers-storage|docker-daemon):\S+")

FORMS = (
    "[REGISTRY/]NAME[:TAG][@DIGEST] with a lower-case NAME (e.g. vllm/vllm-openai:v0.11.0), "
    "enroot's [USER@]REGISTRY#NAME[:TAG], a file path (/..., ./...), or a URI (docker://, library://, oras://)"
)


def _registry_reference(ref: str) -> bool:
    if "#" in ref:  # enroot: [USER@]REGISTRY#IMAGE
        registry, _, name = ref.partition("#")
        ref = f"{registry.rpartition('@')[2]}/{name}"
    return REFERENCE.fullmatch(ref) is not None


def is_image_reference(value: str) -> bool:
    """Whether some container runtime accepts `value` as an image."""
    if value.startswith(("/", "./", "../")):
        return True
    uri = _URI.fullmatch(value)
    if uri:
        return uri.group(1) != "docker" or _registry_reference(uri.group(2))
    return _TRANSPORT.fullmatch(value) is not None or _registry_reference(value)


def image_reference(value: str) -> str:
    """A schema check: `value` unchanged, or ValueError naming the accepted forms."""
    if not is_image_reference(value):
        raise ValueError(f"{value!r} is not an image any container runtime accepts: {FORMS}")
    return value
