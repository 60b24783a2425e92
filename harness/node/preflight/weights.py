"""The model the servers load is on this node: a local directory, or a snapshot in the Hugging Face cache."""

from __future__ import annotations

from pathlib import Path

from harness.node.preflight.model_dir import check_model_dir, missing_dir


def check_weights(
    path: str | None, *, hf_id: str | None = None, hf_cache: str | None = None, need_weights: bool = True
) -> list[str]:
    """The model the servers load is on this node and readable: a local directory (`path`), or
    `hf_id` in the Hugging Face hub cache `hf_cache` (the job runs with HF_HUB_OFFLINE=1, so
    nothing is downloaded). need_weights False (--load-format dummy) needs config.json only."""
    if path:
        return check_model_dir(Path(path), need_weights)
    if not hf_id or not hf_cache:
        return []  # nothing local to check: the model would come from the hub
    cache = Path(hf_cache)
    if not cache.is_dir():
        return [missing_dir(cache, "Hugging Face cache")]
    snapshot, why = _hf_snapshot(cache, hf_id)
    if snapshot is None:
        return [
            f"{hf_id} is not in the Hugging Face cache {cache} ({why}); HF_HUB_OFFLINE=1 is set, so vLLM would not "
            f"download it: download it first (HF_HUB_CACHE={cache} huggingface-cli download {hf_id})"
        ]
    return [f"{hf_id} in the Hugging Face cache: {p}" for p in check_model_dir(snapshot, need_weights)]


def _hf_snapshot(cache: Path, hf_id: str) -> tuple[Path | None, str]:
    """The snapshot vLLM would load offline, or (None, why not)."""
    repo_dir = f"models--{hf_id.replace('/', '--')}"
    snapshots = cache / repo_dir / "snapshots"
    ref = cache / repo_dir / "refs" / "main"
    if ref.is_file():
        try:
            rev = ref.read_text().strip()
        except OSError as e:
            return None, f"cannot read {ref} ({e.strerror or e})"
        if (snapshots / rev / "config.json").exists():
            return snapshots / rev, ""
        return None, f"{repo_dir}/refs/main names revision {rev}, but {repo_dir}/snapshots/{rev}/config.json is missing"
    try:
        found = [s for s in snapshots.iterdir() if (s / "config.json").exists()]
    except OSError:
        found = []
    if found:
        return max(found, key=lambda s: (s / "config.json").lstat().st_mtime), ""
    return None, f"no {repo_dir}/snapshots/*/config.json"
