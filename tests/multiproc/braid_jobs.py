"""What the Python tests of live jobs share (test_status.py, test_schemas.py): a free port, and
ending a job (`braid run` started in a session of its own) and its ranks, stopped ones too."""
import os
import signal
import socket


def free_port():
    """A free port whose next one is free too: braid run's launcher hosts the store on MASTER_PORT + 1."""
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        try:
            t = socket.socket()
            t.bind(("127.0.0.1", port + 1))
            t.close()
            return port
        except OSError:
            continue


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
