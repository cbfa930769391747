"""Run a model-written Python program in a throw-away, fenced-off interpreter.

The code checker runs text a 135M model wrote, so it must survive infinite
loops, memory blow-ups and the odd `open("/etc/...", "w")`. The fences, from
outside in:

1. a fresh interpreter (`python -I -S -B`: isolated mode, no site packages,
   no .pyc writes) whose working directory, HOME and TMPDIR are a new
   temporary directory that is deleted afterwards;
2. a wall-clock timeout; the child leads its own session so the whole
   process group is killed on expiry;
3. `resource` limits set by the child before the program runs (CPU seconds,
   address space, file size, open files, no core dumps), where the platform
   has the `resource` module;
4. a `sys.addaudithook` hook that refuses writes, deletes, renames and links
   outside the temporary directory and refuses subprocesses, sockets and
   ctypes.

This guards against accidents by a weak model, not against an adversary:
audit hooks are not a security boundary (see PEP 578). Run untrusted code
from people in a container or VM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

# Kept small so a runaway print loop cannot fill the parent's memory.
_MAX_OUTPUT_CHARS = 4000

# Runs inside the child. argv: [harness, root_dir, program_path, cpu_s, as_bytes].
# Written as a plain string (not a function here) because the child runs with
# -I -S and must not import fastmode.
_HARNESS = r"""
import os, sys
root = os.path.realpath(sys.argv[1])
with open(sys.argv[2], encoding="utf-8") as f:
    source = f.read()
code = compile(source, "solution.py", "exec")

try:
    import resource
except ImportError:  # not on this platform: the wall-clock timeout still applies
    resource = None
if resource is not None:
    cpu_s, as_bytes = int(sys.argv[3]), int(sys.argv[4])
    for name, value in (("RLIMIT_CPU", cpu_s), ("RLIMIT_AS", as_bytes),
                        ("RLIMIT_FSIZE", 16 << 20), ("RLIMIT_NOFILE", 64),
                        ("RLIMIT_CORE", 0)):
        limit = getattr(resource, name, None)
        if limit is None:
            continue
        _, hard = resource.getrlimit(limit)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        try:
            resource.setrlimit(limit, (value, value))
        except (ValueError, OSError):
            pass

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# event -> positions of path arguments that must stay inside root
PATH_EVENTS = {
    "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.chmod": (0,),
    "os.chown": (0,), "os.utime": (0,), "os.truncate": (0,), "os.chflags": (0,),
    "os.lchflags": (0,), "os.setxattr": (0,), "os.removexattr": (0,),
    "os.rename": (0, 1), "os.link": (0, 1), "os.symlink": (1,),
    "shutil.rmtree": (0,), "shutil.copyfile": (1,), "shutil.copymode": (1,),
    "shutil.copystat": (1,), "shutil.move": (0, 1), "shutil.chown": (0,),
}
BLOCKED = {
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
    "os.fork", "os.forkpty", "os.kill", "os.killpg", "pty.spawn",
    "socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "webbrowser.open",
}

def inside(path):
    if isinstance(path, int):  # an already-open descriptor
        return True
    path = os.path.realpath(os.fsdecode(path))
    return path == root or path.startswith(root + os.sep)

def hook(event, args):
    if event == "open":
        path, mode, flags = args
        writing = bool((flags or 0) & WRITE_FLAGS) or (
            isinstance(mode, str) and any(c in mode for c in "wax+"))
        if writing and not inside(path):
            raise PermissionError(f"sandbox: write outside {root}: {path!r}")
    elif event in PATH_EVENTS:
        for i in PATH_EVENTS[event]:
            if i < len(args) and args[i] is not None and not inside(args[i]):
                raise PermissionError(f"sandbox: {event} outside {root}: {args[i]!r}")
    elif event in BLOCKED:
        raise PermissionError(f"sandbox: {event} is not allowed")

sys.addaudithook(hook)
del hook
exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
"""


@dataclass(frozen=True)
class SandboxResult:
    """What happened to one program: `ok` means it exited 0 before the timeout."""

    returncode: int | None
    timed_out: bool
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def run_python(program: str, timeout_s: float = 5.0, memory_bytes: int = 1 << 30) -> SandboxResult:
    """Run `program` as `__main__` in a sandboxed child interpreter.

    Returns once the child exits or `timeout_s` of wall-clock time passes, in
    which case the child's process group is killed and `timed_out` is True.
    """
    with tempfile.TemporaryDirectory(prefix="fastmode-eval-") as root:
        program_path = os.path.join(root, "solution.py")
        with open(program_path, "w", encoding="utf-8") as f:
            f.write(program)
        # CPU limit slightly above the wall timeout: the wall clock is the
        # primary fence, RLIMIT_CPU the backstop if the parent is stalled.
        cpu_s = int(timeout_s) + 1
        argv = [sys.executable, "-I", "-S", "-B", "-c", _HARNESS, root, program_path, str(cpu_s), str(memory_bytes)]
        env = {"PATH": "/usr/bin:/bin", "HOME": root, "TMPDIR": root, "LANG": "C.UTF-8"}
        # Output goes to files, not pipes: a print loop then costs disk capped
        # by RLIMIT_FSIZE instead of the parent's memory.
        out_path, err_path = os.path.join(root, "stdout.txt"), os.path.join(root, "stderr.txt")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                argv,
                cwd=root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
            try:
                proc.wait(timeout=timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                proc.wait()
                timed_out = True
        stdout, stderr = _tail(out_path), _tail(err_path)
    return SandboxResult(
        returncode=proc.returncode,
        timed_out=timed_out,
        stdout=stdout,
        stderr=stderr,
    )


def _tail(path: str) -> str:
    """The last `_MAX_OUTPUT_CHARS` bytes of a file, decoded leniently."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - _MAX_OUTPUT_CHARS))
        return f.read().decode("utf-8", errors="replace")


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the child and anything it started (it leads its own process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        proc.kill()
