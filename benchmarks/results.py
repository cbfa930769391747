"""One current results table: rerun the peer, HTTP and speculation benchmarks, write docs/results.md
and the README's performance table.

    .venv/bin/python benchmarks/results.py            # the full runs (~25 min on 2 vCPUs)
    .venv/bin/python benchmarks/results.py --quick    # one round each, shorter loads (~8 min; figures noisier)
    .venv/bin/python benchmarks/results.py --only peers --render-only   # rewrite the page from saved JSON

Every row of the page comes from a benchmark run by this script and gives the command that
produced it, the figure, the peer measured in the same run, and the machine's CPU flags; rows
of a benchmark that did not run (a peer not built, a failure) say so instead of keeping an
older figure. Each benchmark writes its full JSON under --runs-dir (default runs/results/):

- peers:  benchmarks/peers.py, decode tok/s at batch 1 and 16 against llama.cpp
  (llama-batched-bench), rounds alternating the engines, DRAM bandwidth and the memory
  roofline measured in the same run;
- http:   benchmarks/peers_http.py, 16 clients over HTTP against llama-server, and the fast
  tier's per-request speed under a saturating standard load;
- speculative: benchmarks/speculative.py, the fast tier's n-gram speculation against the same
  requests with speculation off, end to end through one server, at 1 and 4 clients, tuning and
  held-out prompts reported apart.

Targets printed beside the figures are the project's (docs/results.md says which). The README's
table is the same rows without the "how" column, written between its `<!-- results:begin -->`
and `<!-- results:end -->` markers (--readme '' leaves the README alone).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BENCHMARKS = ("peers", "http", "speculative")
TARGETS = {  # figure / peer in the same run
    ("peers", 1): 1.15,
    ("peers", 16): 2.0,
    ("http", 16): 2.0,
    ("fast-tier", 0): 2.5,
}


def commands(args: argparse.Namespace) -> dict[str, list[str]]:
    py, runs = sys.executable, Path(args.runs_dir)
    t = ["--threads", str(args.threads)]
    llama = ["--llama-cpp-dir", args.llama_cpp_dir] if args.llama_cpp_dir else []
    peers = [
        py,
        "benchmarks/peers.py",
        "--batches",
        "1,16",
        "--skip",
        "transformers,llama-cpp-python",
        *t,
        *llama,
        "--wait-load",
        str(args.wait_load),
        "--out",
        str(runs / "peers.json"),
    ]
    http = [py, "benchmarks/peers_http.py", "--rounds", "3", *t, *llama, "--out", str(runs / "peers_http.json")]
    spec = [
        py,
        "benchmarks/speculative.py",
        "--batches",
        "1,4",
        "--threads",
        str(args.threads),
        "--out",
        str(runs / "speculative.json"),
    ]
    if args.quick:
        peers += ["--rounds", "1"]
        http[http.index("--rounds") + 1] = "1"
        http += ["--num-requests", "32", "--fast-tier-duration-s", "45", "--fast-requests", "4"]
        spec += ["--quick", "--repeats", "1"]
    return {"peers": peers, "http": http, "speculative": spec}


def run(name: str, cmd: list[str], timeout_s: float) -> dict:
    print(f"== {name}: {shlex.join(cmd)}", flush=True)
    Path(ROOT / cmd[cmd.index("--out") + 1]).unlink(missing_ok=True)  # a failed run must not leave an old figure
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, timeout=timeout_s, check=False)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    return {"command": shlex.join(cmd), "rc": rc, "wall_s": round(time.perf_counter() - t, 1)}


def _load(path: Path) -> dict | None:
    """A benchmark's JSON, with `_when`: when it was written and the commit it measured (a row from an
    earlier invocation says so)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    commit = (data.get("machine") or {}).get("commit")
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))
    data["_when"] = f"{when}, commit {commit}" if commit else f"{when}, commit not recorded"
    return data


def _cmd(c: str) -> str:
    """The command as a reader reruns it: the repo's venv python, repo-relative paths."""
    parts = shlex.split(c)
    if parts and "python" in Path(parts[0]).name:
        parts[0] = ".venv/bin/python"
    return shlex.join(parts)


def _ratio(x: float | None, target: float | None = None) -> str:
    if x is None:
        return "-"
    mark = "" if target is None else (" (target met)" if x >= target else f" (target {target:g}x: missed)")
    return f"{x:.2f}x{mark}"


def rows_peers(data: dict | None, cmd: str) -> list[list[str]]:
    if not data:
        return [["decode tok/s, in process", "-", "-", "-", "did not run", f"`{cmd}`"]]
    by = {e["engine"]: {r["batch"]: r for r in e["rows"]} for e in data["results"]}
    fm, ll = by.get("fastmode", {}), by.get("llama.cpp", {})
    rounds = data["settings"].get("rounds", 1)
    out = []
    for batch in sorted(fm):
        r, peer = fm[batch], ll.get(batch)
        each = ", ".join("-" if x is None else f"{x:.2f}" for x in r.get("vs_llama_cpp_by_round", []))
        roof = r.get("roofline_fraction")
        peer_roof = peer.get("roofline_fraction") if peer else None
        what = f"decode tok/s, {batch} sequence{'s' if batch > 1 else ''}, in process"
        fig = f"{r['decode_tok_s']:.1f}" + (f" ({100 * roof:.0f}% of roofline)" if roof else "")
        pfig = (
            (f"llama.cpp {peer['decode_tok_s']:.1f}" + (f" ({100 * peer_roof:.0f}%)" if peer_roof else ""))
            if peer
            else f"llama.cpp: {data['skipped'].get('llama.cpp', 'not measured')}"
        )
        ratio = _ratio(r.get("vs_llama_cpp"), TARGETS.get(("peers", batch)))
        if each and rounds > 1:
            ratio += f"; rounds {each}"
        loads = ", ".join(f"{r['load_1min']:.1f}" for r in data.get("rounds", []) if r.get("load_1min") is not None)
        out.append(
            [
                what,
                fig,
                pfig,
                ratio,
                (
                    f"median of {rounds} round(s), order alternating; 1-min load at the rounds' start {loads}; "
                    f"{data['_when']}"
                ),
                f"`{cmd}`",
            ]
        )
    return out


def rows_http(data: dict | None, cmd: str) -> list[list[str]]:
    if not data:
        return [["HTTP output tok/s", "-", "-", "-", "did not run", f"`{cmd}`"]]
    peers = {p["server"]: p for p in data.get("peers", [])}
    clients = data["settings"]["concurrency"]
    out = []
    fm, ll = peers.get("fastmode"), peers.get("llama-server")
    if fm:
        f = fm["summary"]["output_tok_s"]
        lv = ll["summary"]["output_tok_s"] if ll else None
        ratio = f / lv if f and lv else None
        rounds = len(fm.get("rounds", []))
        out.append(
            [
                f"HTTP output tok/s, {clients} clients",
                "-" if f is None else f"{f:.1f}",
                f"llama-server {lv:.1f}" if lv else f"llama-server: {data['skipped'].get('llama-server', '-')}",
                _ratio(ratio, TARGETS.get(("http", clients))),
                f"{rounds} round(s), order alternating; {data['_when']}",
                f"`{cmd}`",
            ]
        )
    ft = data.get("fast_tier")
    if ft:
        fast, std = ft["fast"]["summary"]["tok_s_per_request_p50"], ft["standard"]["summary"]["tok_s_per_request_p50"]
        ratio = fast / std if fast and std else None
        note = (
            "saturated throughout" if ft.get("saturated_throughout") else "NOT saturated throughout"
        ) + f"; {data['_when']}"
        out.append(
            [
                f"fast tier: tok/s per request (p50) under {clients} saturating standard clients",
                "-" if fast is None else f"{fast:.1f}",
                "-" if std is None else f"standard tier {std:.1f}",
                _ratio(ratio, TARGETS[("fast-tier", 0)]),
                note,
                f"`{cmd}`",
            ]
        )
    return out or [["HTTP", "-", "-", "-", "no figures", f"`{cmd}`"]]


def rows_speculative(data: dict | None, cmd: str) -> list[list[str]]:
    """Per client count and prompt split: all workloads together, with the lowest workload and
    the code edits beside it (the floor and the gain speculation is held to)."""
    if not data:
        return [["speculation, end to end", "-", "-", "-", "did not run", f"`{cmd}`"]]
    out = []
    rows = data.get("rows", [])
    for batch in sorted({r.get("batch") for r in rows}):
        for split in ("tune", "heldout"):
            group = [r for r in rows if r.get("batch") == batch and r.get("split") == split]
            total = next((r for r in group if r.get("workload") == "all"), None)
            if not total:
                continue
            each = [r for r in group if r.get("workload") != "all" and r.get("speedup")]
            low = min(each, key=lambda r: r["speedup"], default=None)
            edits = next((r for r in each if r.get("workload") == "code-edit"), None)
            notes = []
            if low:
                notes.append(f"lowest: {low['workload']} {low['speedup']:.2f}x (floor 0.95x)")
            if edits:
                notes.append(f"code edits {edits['speedup']:.2f}x (target 1.5x)")
            plain, spec = total.get("plain_tok_s"), total.get("spec_tok_s")
            out.append(
                [
                    f"fast tier, n-gram speculation on vs off, {batch} client{'s' if batch > 1 else ''}, "
                    f"{'held-out' if split == 'heldout' else 'tuning'} prompts, end to end through the server",
                    "-" if spec is None else f"{spec:.1f} tok/s",
                    "-" if plain is None else f"speculation off {plain:.1f}",
                    _ratio(spec / plain if spec and plain else None) + ("; " + "; ".join(notes) if notes else ""),
                    f"median of rounds, sides alternating; outputs identical: {all(r.get('identical') for r in group)}; "
                    f"load {total.get('load_average', '?')}; {data['_when']}",
                    f"`{cmd}`",
                ]
            )
    return out or [["speculation", "-", "-", "-", "no rows", f"`{cmd}`"]]


def table(rows: list[list[str]], with_how: bool) -> list[str]:
    """The rows as a markdown table; without `with_how`, the "how" column is left out."""
    head = ["measured", "fastmode", "peer, same run", "fastmode / peer", "how", "command"]
    keep = [i for i in range(len(head)) if with_how or head[i] != "how"]
    lines = ["| " + " | ".join(head[i] for i in keep) + " |", "|" + "---|" * len(keep)]
    for r in rows:
        if not with_how and r[1] == "-" and r[4] in ("did not run", "no figures", "no rows"):
            r = [r[0], r[4], *r[2:]]  # the reason stands in for the missing figure
        lines.append("| " + " | ".join(r[i].replace("|", "\\|") for i in keep) + " |")
    return lines


README_BEGIN, README_END = "<!-- results:begin -->", "<!-- results:end -->"


def readme_block(rows: list[list[str]], cpu_text: str, when: str) -> str:
    """The README's performance table: the current rows, the machine, where the details are."""
    return "\n".join(
        [
            README_BEGIN,
            f"Measured {when} on {cpu_text}, each peer in the same run (written by `make bench`; details, rounds and",
            "load in [docs/results.md](docs/results.md)):",
            "",
            *table(rows, with_how=False),
            README_END,
        ]
    )


def write_readme(path: Path, block: str) -> bool:
    """Replace the README's block between the markers; False (and the README untouched) without them."""
    text = path.read_text()
    start, end = text.find(README_BEGIN), text.find(README_END)
    if start < 0 or end < start:
        return False
    path.write_text(text[:start] + block + text[end + len(README_END) :])
    return True


def render(args: argparse.Namespace, ran: dict[str, dict]) -> tuple[str, str]:
    from benchmarks.kernels import cpu_description, cpu_line

    runs = Path(args.runs_dir)
    cmds = {k: _cmd(v["command"]) for k, v in ran.items()}
    for k, c in commands(args).items():
        cmds.setdefault(k, _cmd(shlex.join(c)))
    peers = _load(runs / "peers.json")
    http = _load(runs / "peers_http.json")
    spec = _load(runs / "speculative.json")
    rows = (
        rows_peers(peers, cmds["peers"]) + rows_http(http, cmds["http"]) + rows_speculative(spec, cmds["speculative"])
    )
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit = "?"
    cpu = cpu_description()
    lines = [
        "# Current results",
        "",
        (
            f"Written by `{_cmd(shlex.join([sys.executable, 'benchmarks/results.py', *args.argv]))}` on "
            f"{time.strftime('%Y-%m-%d')} at commit {commit}. Every row comes from the run of the command beside it, "
            "with the peer measured in that same run, and names when it ran and the commit it measured; "
            "nothing here is kept from older machines."
        ),
        "",
        f"Machine: {cpu_line(cpu)}.",
    ]
    if peers:
        bw = peers.get("dram_read_gbs")
        llama = next((e for e in peers["results"] if e["engine"] == "llama.cpp"), None)
        if bw:
            lines.append(
                f"DRAM read bandwidth measured in the peers run: {bw:.1f} GB/s "
                f"({peers['settings']['threads']} threads). The roofline of a decode step is that bandwidth "
                "over the bytes the step must read (every weight once, and each sequence's f16 K/V)."
            )
        if llama and llama.get("system_info"):
            lines.append(f"llama.cpp as built here: `{llama['system_info']}`.")
    lines += ["", *table(rows, with_how=True)]
    lines += [
        "",
        (
            "Targets (ratio to the peer in the same run, median of 3 runs): batch 1 at least 1.15x llama.cpp, "
            "16 sequences at least 2.0x, HTTP with 16 clients at least 2.0x llama-server, the fast tier at least "
            "2.5x the standard tier's per-request tok/s under saturating load. A `--quick` run measures one round: "
            "its rows are a smoke test of the figures, not a result."
        ),
        "",
        (
            "How each benchmark measures: benchmarks/README.md and benchmarks/peers/README.md. The kernels "
            "(which ISA path runs, and why): docs/kernels.md."
        ),
        "",
    ]
    return "\n".join(lines), readme_block(rows, cpu_line(cpu), time.strftime("%Y-%m-%d"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one round each and shorter loads (a smoke run)")
    p.add_argument("--only", default=",".join(BENCHMARKS), help=f"comma-separated subset of {','.join(BENCHMARKS)}")
    p.add_argument("--render-only", action="store_true", help="run nothing: rewrite the page from the saved JSON")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--llama-cpp-dir", help="passed to the peer benchmarks (default: theirs)")
    p.add_argument("--runs-dir", default="runs/results")
    p.add_argument(
        "--wait-load",
        type=float,
        default=1.3,
        help="peers: wait for a 1-minute load average below this before measuring (default 1.3)",
    )
    p.add_argument("--timeout-s", type=float, default=3600.0, help="limit on each benchmark")
    p.add_argument("--out", default="docs/results.md")
    p.add_argument("--readme", default="README.md", help="the README whose results block to rewrite ('' for none)")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    if set(only) - set(BENCHMARKS):
        p.error(f"--only: unknown {sorted(set(only) - set(BENCHMARKS))}; choose from {', '.join(BENCHMARKS)}")
    Path(args.runs_dir).mkdir(parents=True, exist_ok=True)
    ran = {}
    if not args.render_only:
        cmds = commands(args)
        for name in only:
            ran[name] = run(name, cmds[name], args.timeout_s)
    page, block = render(args, ran)
    out = ROOT / args.out
    out.write_text(page)
    print(page)
    print(f"wrote {out}")
    if args.readme:
        readme = ROOT / args.readme
        if write_readme(readme, block):
            print(f"wrote the results block of {readme}")
        else:
            print(f"{readme} has no {README_BEGIN} ... {README_END} markers: left as it is")
    return 0


if __name__ == "__main__":
    sys.exit(main())
