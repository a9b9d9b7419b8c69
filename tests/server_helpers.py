"""Helpers the server's test modules share."""
import time


def wait_until(cond, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.005)


def idle(server) -> bool:
    """No request in the server's engine and every KV block free."""
    _, free, requests = server.aengine.snapshot
    return requests == 0 and free == server.engine.num_blocks
