"""Fakes of huggingface_hub for tests without a network."""


def fake_snapshot_download(sizes, folder, fail_after=None):
    """Drives `tqdm_class` as huggingface_hub 2's snapshot_download does: a network-transfer
    bar and a bytes-written bar (totals raised per file, then refreshed), a files bar."""
    def download(repo_id, allow_patterns, tqdm_class):
        transfer = tqdm_class(desc="Downloading bytes", total=0, unit="B", unit_scale=True)
        written = tqdm_class(desc="Reconstructing (incomplete total...)", total=0, unit="B")
        files = tqdm_class(total=len(sizes), desc=f"Fetching {len(sizes)} files")
        for i, size in enumerate(sizes):
            written.total += size
            transfer.total += size
            written.refresh()
            for _ in range(4):
                written.update(size // 4)
                transfer.update(size // 4)
            if fail_after == i:
                raise ConnectionError("reset by peer")
            files.update(1)
        return folder
    return download
