"""What this machine can hold: an allocation a command's options size is estimated first and
refused in one line when it cannot fit, instead of a MemoryError traceback (or the kernel's OOM
killer) after minutes of loading.

    need_memory(cache_bytes, "the KV cache for --cache-len 1000000")
    # migrate: error: the KV cache for --cache-len 1000000 needs at least 58.2 TiB; this machine has
    # 19.1 GiB of memory available

The estimates are lower bounds of what the command allocates (the one big array an option sizes,
not the model beside it), and the line says so: a refusal is never wrong, and a request just under
the line may still fail later.
"""
from __future__ import annotations

from migrate.errors import MigrateError

__all__ = ["available_bytes", "need_memory", "human_bytes"]


def available_bytes() -> int:
    """Memory available to a new allocation now (psutil's `available`: free plus reclaimable cache)."""
    import psutil

    return int(psutil.virtual_memory().available)


def human_bytes(n: float) -> str:
    for unit, scale in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def need_memory(need: float, what: str, available: int | None = None) -> None:
    """Refuse (MigrateError) when `need` bytes, a lower bound of the allocation, exceed the memory available now."""
    available = available_bytes() if available is None else available
    if need > available:
        raise MigrateError(f"{what} needs at least {human_bytes(need)}; this machine has {human_bytes(available)} "
                           f"of memory available")
