"""What the tests ask of a worker process about its task threads (run there with ``Client.run``)."""


def task_threads_used() -> int:
    """The most threads a pool of :func:`dufs.scheduling.each_in_threads` has had in this process (1: none)."""
    from dufs import scheduling

    return max((p._max_workers for p in scheduling._TASK_POOLS.values()), default=1)
