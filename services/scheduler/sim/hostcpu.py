"""The host's CPU, read from /proc, for the calibration's host-load probe (meshprobe.py): how much
CPU the mesh costs the host outside the decode workers' engines (per request, per busy worker's
engine step and per token: MeshCost.host_cpu_s_per_request, _per_step, _per_token).

It only means something when the mesh runs on the calibrating machine, as `kvmesh up` runs it: every
busy tick on the host counts (the gateway, the scheduler, the workers' RPC loops, the KV store, NATS,
and the calibration's own client, as a trace replay's client on the same host counts), less the
engines' own. An engine is found by what it is: a process whose command line runs a worker's
`*.enginehost` module (the default `engine_process` layout), or a thread named `*-engine` (the
in-process layout). With no engine found, the mesh is elsewhere and nothing is measured.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # /proc/stat cpu line: user nice system (idle iowait) irq softirq steal


@dataclass(frozen=True, slots=True)
class CpuReading:
    host_s: float     # busy CPU seconds of every core since boot
    engines_s: float  # CPU seconds the engines found used, in all
    engines: int      # how many engines were found


def host_busy_s(stat_text: str, ticks_per_s: float) -> float:
    """Busy CPU seconds in a /proc/stat text's `cpu` line (every core; idle and iowait left out)."""
    for line in stat_text.splitlines():
        if line.startswith("cpu "):
            values = [float(v) for v in line.split()[1:]]
            return sum(values[i] for i in _BUSY_FIELDS if i < len(values)) / ticks_per_s
    raise ValueError("no cpu line in /proc/stat")


def task_cpu_s(stat_text: str, ticks_per_s: float) -> float:
    """utime + stime of a /proc/<pid>/stat or /proc/<pid>/task/<tid>/stat text, in seconds."""
    # NOTE: the command name (field 2) is in parentheses and may hold spaces; fields count on from its ')'
    fields = stat_text[stat_text.rindex(")") + 2:].split()
    return (float(fields[11]) + float(fields[12])) / ticks_per_s


def is_engine_process(cmdline: list[str]) -> bool:
    return any(arg.endswith(".enginehost") for arg in cmdline)


def is_engine_thread(comm: str) -> bool:
    return comm.strip().endswith("-engine")


def read(proc: Path = PROC) -> CpuReading:
    """The host's busy CPU time and its engines' now."""
    ticks = float(os.sysconf("SC_CLK_TCK"))
    host = host_busy_s((proc / "stat").read_text(), ticks)
    engines_s, engines = 0.0, 0
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            cmdline = (pid_dir / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if is_engine_process(cmdline):
                engines_s += task_cpu_s((pid_dir / "stat").read_text(), ticks)
                engines += 1
                continue
            for task in (pid_dir / "task").iterdir():
                if is_engine_thread((task / "comm").read_text()):
                    engines_s += task_cpu_s((task / "stat").read_text(), ticks)
                    engines += 1
        except (OSError, ValueError, IndexError):
            continue  # NOTE: a process that ended while being read
    return CpuReading(host, engines_s, engines)


def outside_engines_s(before: CpuReading, after: CpuReading) -> float | None:
    """The host's CPU seconds outside the engines between two readings; None when no engine was found
    in both (the mesh is not on this host, or an engine came or went)."""
    if not before.engines or after.engines != before.engines:
        return None
    return max(0.0, (after.host_s - before.host_s) - (after.engines_s - before.engines_s))
