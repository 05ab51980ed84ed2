"""What the Python tests of live jobs share (test_status.py, test_schemas.py): a free port, and
ending a job (`braid run` started in a session of its own) and its ranks, stopped ones too."""
import os
import signal
import socket


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def end_job(proc, pids):
    """Kills the ranks `pids` (continued first, if stopped) and the launcher's session, and reaps it."""
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait(timeout=30)
