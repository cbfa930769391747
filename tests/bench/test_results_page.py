"""benchmarks/results.py: the README's results block is rewritten between its markers and nowhere else."""

from __future__ import annotations

from benchmarks.results import README_BEGIN, README_END, readme_block, table, write_readme

ROWS = [
    ["decode tok/s, 1 sequence", "70.8", "llama.cpp 59.2", "1.20x", "median of 3", "`cmd a`"],
    ["HTTP output tok/s", "-", "-", "-", "did not run", "`cmd b`"],
]


def test_the_readme_table_leaves_out_how_and_says_what_did_not_run():
    lines = table([list(r) for r in ROWS], with_how=False)
    assert lines[0] == "| measured | fastmode | peer, same run | fastmode / peer | command |"
    assert lines[2] == "| decode tok/s, 1 sequence | 70.8 | llama.cpp 59.2 | 1.20x | `cmd a` |"
    assert lines[3] == "| HTTP output tok/s | did not run | - | - | `cmd b` |"
    full = table([list(r) for r in ROWS], with_how=True)
    assert full[3] == "| HTTP output tok/s | - | - | - | did not run | `cmd b` |"


def test_write_readme_replaces_only_the_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\nbefore\n\n{README_BEGIN}\nold figures\n{README_END}\n\nafter\n")
    block = readme_block([list(r) for r in ROWS], "a test CPU", "2026-01-01")
    assert write_readme(readme, block)
    text = readme.read_text()
    assert text.startswith("# title\n\nbefore\n\n" + README_BEGIN)
    assert text.endswith(README_END + "\n\nafter\n")
    assert "old figures" not in text and "70.8" in text and "a test CPU" in text
    assert write_readme(readme, readme_block([], "another CPU", "2026-01-02"))
    assert "70.8" not in readme.read_text() and readme.read_text().count(README_BEGIN) == 1


def test_a_readme_without_markers_is_left_alone(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    assert not write_readme(readme, readme_block([], "cpu", "today"))
    assert readme.read_text() == "# no markers\n"
