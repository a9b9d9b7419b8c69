"""Finding a learner's processes from outside: their pids mean nothing outside their own PID namespace, so a test
has them run something recognisable (`sleep <marker>`) and looks for that."""
import os


def running(marker: str) -> list[int]:
    """Pids (as this process sees them) of the processes whose command line holds `marker`."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(name))
        except (OSError, ValueError):
            pass
    return found


def alive(pid: int) -> bool:
    """Whether `pid` (a pid of this process's namespace) is running and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
