"""The script's own default process group (``torch.distributed``), read as it stands, without importing
torch.distributed where the script has not."""

from __future__ import annotations

import sys


def default_group() -> tuple[int, int, str] | None:
    """(rank, world size, backend) of the script's default process group; None where it has none. Raises what
    torch.distributed raises where the group cannot be read (a group torn down halfway): each caller decides what
    that means for it."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist.get_rank(), dist.get_world_size(), str(dist.get_backend())
