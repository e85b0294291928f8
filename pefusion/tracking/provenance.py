"""Where a sweep's records came from: the git commit of the code that ran, and the command that started it, as a
user would paste it again (asking the interpreter on PATH which one it runs: other processes).
"""
from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from pefusion.storage import redact


@functools.cache
def git_commit() -> str:
    """The commit of the code that ran (empty outside a git checkout); asked once per driver (a subprocess)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def command_line(argv: Sequence[str] | None = None, program: str = "", *, absolute: bool = False) -> str:
    """The command that started this process, quoted so that pasted in the same folder it runs again: the
    interpreter as the user would type it (`_interpreter`) and the script's path as given (`absolute`: its
    absolute path, so that it runs from any folder), or an installed command (an entry point) by its name when
    PATH finds it, else by its path; then the arguments.

    `argv` replaces this process's arguments; `program` names the command that takes them when they are not this
    process's own (a main called in-process: this process's command line is then another program's).

    A URI's credentials in it are replaced by `***` (`pefusion.storage.redact`): the line is printed and tagged.
    """
    args = [redact(a) for a in (sys.argv[1:] if argv is None else argv)]
    if program:
        return shlex.join([program, *args])
    script = os.path.abspath(sys.argv[0]) if absolute else sys.argv[0]
    if not script.endswith(".py") and os.access(script, os.X_OK):  # an entry point, started by its #! line
        name = os.path.basename(script)
        found = shutil.which(name)
        return shlex.join([name if found and os.path.samefile(found, script) else script, *args])
    return shlex.join([_interpreter(), script, *args])


@functools.lru_cache(maxsize=1)
def _interpreter() -> str:
    """This interpreter as the user would type it: the name typed, `python` or `python3` when that name on PATH
    runs this interpreter, else its full path. A name on PATH may be a launcher (pyenv's shims are shell
    scripts that exec the real one), so it is asked which interpreter it runs."""
    typed = sys.orig_argv[0] if sys.orig_argv else ""
    if typed and os.sep not in typed and _is_this_interpreter(shutil.which(typed) or ""):
        return typed
    for name in ("python", "python3"):
        if shutil.which(name) is None:
            continue
        try:
            out = subprocess.run([name, "-S", "-c", "import sys; print(sys.executable)"], capture_output=True,
                                 text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if _is_this_interpreter(out.stdout.strip()):
            return name
    return sys.executable


def _is_this_interpreter(path: str) -> bool:
    """Same binary in the same folder: a virtual environment's python links to the system's, but runs with its
    own packages (found from its folder)."""
    if not path:
        return False
    here, there = os.path.abspath(sys.executable), os.path.abspath(path)
    return os.path.dirname(here) == os.path.dirname(there) and os.path.realpath(here) == os.path.realpath(there)
