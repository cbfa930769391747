"""The code checker runs model code safely: timeouts, failing asserts, no escape."""

from __future__ import annotations

import time
from pathlib import Path

from fastmode.evals.checkers import check
from fastmode.evals.sandbox import run_python

PROMPT = 'def add(a: int, b: int) -> int:\n    """Return the sum of a and b."""\n'
ARGS = {"tests": ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"], "reference": "    return a + b\n"}


def test_right_body_passes_and_wrong_body_fails() -> None:
    assert check("code_exec", "    return a + b\n", ARGS, PROMPT)
    assert not check("code_exec", "    return a - b\n", ARGS, PROMPT)
    assert not check("code_exec", "    return a +\n", ARGS, PROMPT)  # syntax error


def test_body_joins_a_prompt_with_or_without_trailing_newline() -> None:
    bare = PROMPT.rstrip("\n")
    assert check("code_exec", "\n    return a + b\n", ARGS, bare)  # model starts with newline
    assert check("code_exec", "    return a + b\n", ARGS, bare)
    assert check("code_exec", "\n    return a + b\n", ARGS, PROMPT)
    assert not check("code_exec", "```\n    return a + b\n", ARGS, bare)  # not a body


def test_trailing_junk_after_the_body_is_ignored() -> None:
    completion = "    return a + b\n\nprint(add(1, 2))\nthis is not python\n"
    assert check("code_exec", completion, ARGS, PROMPT)


def test_infinite_loop_is_killed_by_the_timeout() -> None:
    args = dict(ARGS, timeout_s=1)
    start = time.monotonic()
    assert not check("code_exec", "    while True:\n        pass\n", args, PROMPT)
    assert time.monotonic() - start < 5


def test_timeout_is_reported() -> None:
    result = run_python("import time\ntime.sleep(30)\n", timeout_s=0.5)
    assert result.timed_out and not result.ok


def test_cannot_write_outside_its_temp_dir(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    for body in (
        f"    open({str(target)!r}, 'w').write('x')\n    return a + b\n",
        f"    import pathlib\n    pathlib.Path({str(target)!r}).write_text('x')\n    return a + b\n",
        f"    import os\n    os.close(os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT))\n    return a + b\n",
        f"    import os\n    os.symlink({str(target)!r}, 'link')\n    open('link', 'w').write('x')\n    return a + b\n",
    ):
        assert not check("code_exec", body, ARGS, PROMPT)
        assert not target.exists()


def test_cannot_delete_or_spawn(tmp_path: Path) -> None:
    victim = tmp_path / "keep.txt"
    victim.write_text("keep")
    assert not run_python(f"import os\nos.remove({str(victim)!r})\n").ok
    assert victim.exists()
    assert not run_python(f"import os\nos.system('rm {victim}')\n").ok
    assert not run_python(f"import subprocess\nsubprocess.run(['rm', {str(victim)!r}])\n").ok
    assert victim.exists()


def test_can_use_its_own_temp_dir() -> None:
    result = run_python("open('scratch.txt', 'w').write('ok')\nprint(open('scratch.txt').read())\n")
    assert result.ok and result.stdout.strip() == "ok"


def test_output_flood_is_bounded() -> None:
    result = run_python("while True:\n    print('x' * 1000)\n", timeout_s=3)
    assert not result.ok
    assert len(result.stdout) <= 4000
