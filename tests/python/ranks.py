"""Runs a function on N ranks, each a real process (multiprocessing, spawn).

    run(n, fn, *args, timeout=60, init="id")

Each rank calls fn(comm, *args) with a brigade.Communicator built from a
unique id that the parent made (init="id"), from a torchrun-style
environment (init="env"), or with no communicator at all (init=None: fn(rank,
n, *args)). A rank fails by raising; the parent waits with a deadline, kills
every rank still alive after it, and fails naming each rank that failed or
hung, with its traceback.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import random
import socket
import sys
import traceback
from typing import Any, Callable


def free_port() -> int:
    """A port free now, below the kernel's ephemeral range: a port the
    kernel hands out (bind to 0) may be taken again as some connection's
    source port before the ranks (interpreters still starting) bind it."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low // 2), low)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(fn: Callable, rank: int, n: int, init: Any, uid: Any, env: dict, args: tuple,
               q: Any) -> None:
    os.environ.update(env)
    try:
        if init is None:
            fn(rank, n, *args)
        else:
            import brigade

            if init == "id":
                comm = brigade.Communicator(n, uid, rank)
            else:
                os.environ.update(RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank))
                comm = brigade.Communicator.from_env()
            try:
                fn(comm, *args)
            finally:
                comm.close()
        result = None
    except BaseException:  # noqa: BLE001 - reported to the parent
        result = traceback.format_exc()
    q.put((rank, result))
    q.close()
    q.join_thread()
    # Skip the interpreter's teardown: torch 1.13 can deadlock there (the
    # main thread, holding the GIL, joins a Gloo worker that waits for the
    # GIL to free a tensor), which would hold the test until its deadline.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if result is None else 1)


def run(n: int, fn: Callable, *args: Any, timeout: float = 60, init: Any = "id",
        env: dict | None = None, may_die: tuple = ()) -> None:
    """Ranks in may_die may end without a result (a test kills them)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    uid = None
    env = dict(env or {})
    env.setdefault("BRIGADE_TIMEOUT_MS", "20000")
    if init == "id":
        import brigade

        uid = brigade.get_unique_id()
    elif init == "env":
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    procs = [ctx.Process(target=_rank_main, args=(fn, r, n, init, uid, env, args, q))
             for r in range(n)]
    for p in procs:
        p.start()
    import time

    deadline = time.monotonic() + timeout
    results: dict[int, Any] = {}
    while len(results) < n - len(may_die) and time.monotonic() < deadline:
        try:
            r, err = q.get(timeout=0.2)
            results[r] = err
        except Exception:  # queue.Empty
            if all(not p.is_alive() for p in procs) and q.empty():
                break
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()) if len(results) >= n - len(may_die)
               else 0.5)
        if p.is_alive():
            p.kill()
            p.join()
    problems = []
    for r, p in enumerate(procs):
        if r not in results and r in may_die:
            continue
        if r not in results:
            problems.append(f"rank {r}: no result (exit code {p.exitcode}; hung past "
                            f"{timeout} s or died)")
        elif results[r] is not None:
            problems.append(f"rank {r} failed:\n{results[r]}")
    if problems:
        raise AssertionError("\n".join(problems))
