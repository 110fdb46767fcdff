"""``make demo`` from a fresh clone, install included, phase by phase.

    python -m benchmarks.bench_demo                                  # HEAD, one round
    python -m benchmarks.bench_demo --rev 153099d --rev HEAD --rounds 3   # old and new, alternating
    python -m benchmarks.bench_demo --count 100000 --cache warm

Each round clones this repository (``git clone``, then the revision checked out) into a
temporary folder and runs ``make demo DEMO_COUNT=...`` there (a revision
whose Makefile has no DEMO_COUNT runs its own count), as a newcomer would, reading its output
line by line as it comes: the commands make echoes and the lines the demo prints mark the
phases (creating the venv, installing the installer, the lock, the project; then the demo's
start-up up to "recorder ready", the run up to its last progress line, and stopping the recorder
plus the checked summary). ``--cache cold`` (the default) gives pip and uv an empty cache each
round (downloads included, as on a new machine); ``warm`` shares one cache across the rounds.
Revisions alternate within a round. Besides the wall times: the CPU time of the whole ``make``
tree (pip, uv, the demo and its recorder; not PostgreSQL or RabbitMQ), the 1-minute load average
before and after each run (the machine may be shared), the demo's own figures, and its checks.
A round whose demo fails its checks is reported as failed, never timed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.support.env import REPO
from benchmarks.support.stats import Stat, emit, progress, save_json, table

# A phase starts at the first line matching its pattern; phases missing from a revision's
# Makefile (the installer step) are simply absent.
PHASES: list[tuple[str, re.Pattern[str]]] = [
    ("venv", re.compile(r"-m venv ")),
    ("installer (uv)", re.compile(r"-r requirements-uv\.lock")),
    ("lock", re.compile(r"-r requirements\.lock")),
    ("project (-e .)", re.compile(r"--no-deps -e \.")),
    ("demo start-up", re.compile(r"bulk-recorder demo ")),
    ("publish + drain", re.compile(r"^recorder ready")),
    ("stop + checks", re.compile(r"^published .*dead-lettered .* s$")),
]
INSTALL = ("venv", "installer (uv)", "lock", "project (-e .)")
DEMO = ("demo start-up", "publish + drain", "stop + checks")


@dataclass
class Run:
    rev: str
    wall_s: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    cpu_s: float = 0.0
    load_before: float = 0.0
    load_after: float = 0.0
    ok: bool = False
    summary: list[str] = field(default_factory=list)

    def part(self, names: tuple[str, ...]) -> float:
        return sum(self.phases.get(n, 0.0) for n in names)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _stamps(lines: list[tuple[float, str]], end: float) -> dict[str, float]:
    """Seconds in each phase: from its first marker line to the next phase's (or the end)."""
    starts: list[tuple[str, float]] = []
    for name, pattern in PHASES:
        # the last progress line before the summary ends the run, the first marks the others
        hits = [t for t, line in lines if pattern.search(line)]
        if not hits:
            continue
        if name == "stop + checks":
            summary_at = [t for t, line in lines if line.startswith("== bulk-recorder demo")]
            hits = [t for t in hits if not summary_at or t < summary_at[0]][-1:]
        if hits:
            starts.append((name, hits[0]))
    starts.sort(key=lambda s: s[1])
    out: dict[str, float] = {}
    for i, (name, at) in enumerate(starts):
        nxt = starts[i + 1][1] if i + 1 < len(starts) else end
        out[name] = nxt - at
    if starts:  # make's own start (reading the Makefile) goes with the first phase
        out[starts[0][0]] += starts[0][1]
    return out


def one_run(rev: str, count: int, workdir: Path, cache: Path | None, log: Path) -> Run:
    clone = workdir / "clone"
    shutil.rmtree(clone, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", "--detach", rev], check=True)
    cache_root = cache or workdir / "cache-cold"
    if cache is None:
        shutil.rmtree(cache_root, ignore_errors=True)
    env = {
        **os.environ,
        "PIP_CACHE_DIR": str(cache_root / "pip"),
        "UV_CACHE_DIR": str(cache_root / "uv"),
        "PYTHONUNBUFFERED": "1",  # the demo's lines as they are printed, for the phases
    }
    env.pop("VIRTUAL_ENV", None)
    run = Run(rev, load_before=os.getloadavg()[0])
    cpu0 = _children_cpu()
    lines: list[tuple[float, str]] = []
    started = time.perf_counter()
    with subprocess.Popen(
        ["make", "demo", f"DEMO_COUNT={count}"],
        cwd=clone,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.perf_counter() - started, line.rstrip("\n")))
    run.wall_s = time.perf_counter() - started
    run.cpu_s = _children_cpu() - cpu0
    run.load_after = os.getloadavg()[0]
    run.phases = _stamps(lines, run.wall_s)
    text = [line for _, line in lines]
    with log.open("a") as f:
        f.write(f"\n# {rev} ({run.wall_s:.1f} s)\n" + "\n".join(text) + "\n")
    checks = [line for line in text if line.startswith("check ")]
    run.ok = proc.returncode == 0 and bool(checks) and not any("FAIL" in c for c in checks)
    run.summary = [
        line for line in text if line.startswith(("pace ", "elapsed ", "flushes ", "recorder "))
    ]
    shutil.rmtree(clone, ignore_errors=True)
    return run


def _report(runs: list[Run], revs: list[str]) -> str:
    names = [n for n, _ in PHASES if any(n in r.phases for r in runs)]
    rows = []
    for rev in revs:
        mine = [r for r in runs if r.rev == rev and r.ok]
        stat = {n: Stat([r.phases.get(n, 0.0) for r in mine]) for n in names}
        rows.append(
            [
                rev,
                Stat([r.wall_s for r in mine]).fmt(1),
                Stat([r.part(INSTALL) for r in mine]).fmt(1),
                Stat([r.part(DEMO) for r in mine]).fmt(1),
                *(stat[n].fmt(1) for n in names),
                Stat([r.cpu_s for r in mine]).fmt(0),
                Stat([r.load_before for r in mine]).fmt(1),
                f"{len(mine)}/{len([r for r in runs if r.rev == rev])}",
            ]
        )
    headers = ["rev", "wall s", "install s", "demo s", *names, "make CPU s", "load", "ok runs"]
    return table(headers, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", action="append", help="revision to clone (repeat; default HEAD)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--count", type=int, default=300_000)
    parser.add_argument("--cache", choices=("cold", "warm"), default="cold")
    parser.add_argument("--json", help="write the raw runs here")
    args = parser.parse_args()
    revs: list[str] = args.rev or ["HEAD"]
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="bench-demo-") as tmp:
        workdir = Path(tmp)
        log = workdir.parent / f"bench-demo-{os.getpid()}.log"
        cache = workdir / "cache-warm" if args.cache == "warm" else None
        progress(f"full output of every run: {log}")
        for round_no in range(args.rounds):
            order = revs if round_no % 2 == 0 else revs[::-1]
            for rev in order:
                run = one_run(rev, args.count, workdir, cache, log)
                runs.append(run)
                phases = ", ".join(f"{k} {v:.1f}" for k, v in run.phases.items())
                progress(
                    f"round {round_no + 1} {rev}: {'OK' if run.ok else 'FAILED'} "
                    f"{run.wall_s:.1f} s wall (load {run.load_before:.1f} -> "
                    f"{run.load_after:.1f}, make CPU {run.cpu_s:.0f} s): {phases}"
                )
                for line in run.summary:
                    progress(f"    {line}")
    emit(
        f"make demo from a fresh clone, --count {args.count:,}, {args.cache} cache, "
        f"median (min-max) of {args.rounds} round(s)",
        _report(runs, revs),
    )
    save_json(args.json, [run.__dict__ for run in runs])
    if not all(r.ok for r in runs):
        raise SystemExit(json.dumps({"failed": [r.rev for r in runs if not r.ok]}))


if __name__ == "__main__":
    main()
