#!/usr/bin/env python3
"""hack/orderfile.sh's helper: uprobes on a binary's functions, and the order file they give.

  orderfile.py add TRACEFS GROUP BINARY PROBES   a uprobe per function entry; PROBES lists them
  orderfile.py remove TRACEFS GROUP              removes the group's uprobes
  orderfile.py write TRACEFS PROBES OUT          functions called at least once, in address order
  orderfile.py coverage BINARY ORDER             how many of ORDER's names BINARY still has
"""

import os
import subprocess
import sys


def functions(binary):
    """(address, file offset, mangled name) of each function, one name per address."""
    text = None
    for line in subprocess.run(["readelf", "-SW", binary], capture_output=True, text=True, check=True).stdout.splitlines():
        if " .text " in line:
            fields = line.split("]", 1)[1].split()
            text = (int(fields[2], 16), int(fields[3], 16))
    if text is None:
        sys.exit(f"{binary}: no .text section")
    seen, found = set(), []
    nm = subprocess.run(["nm", "--defined-only", binary], capture_output=True, text=True, check=True)
    for line in nm.stdout.splitlines():
        address, kind, name = line.split(" ", 2)
        address = int(address, 16)
        if kind in "tT" and address not in seen:
            seen.add(address)
            found.append((address, address - text[0] + text[1], name))
    return sorted(found)


EVENT = "calls"


def add(tracefs, group, binary, probes):
    """One trace event holding every probe: enabling and disabling it waits out one RCU grace
    period, where an event per probe would wait out one each (tens of minutes)."""
    listed = functions(binary)
    # One write per probe: the kernel parses uprobe_events a write at a time.
    fd = os.open(os.path.join(tracefs, "uprobe_events"), os.O_WRONLY | os.O_APPEND)
    try:
        for _, offset, _ in listed:
            os.write(fd, f"p:{group}/{EVENT} {binary}:0x{offset:x}\n".encode())
    finally:
        os.close(fd)
    with open(probes, "w") as f:
        f.write(binary + "\n")
        f.writelines(name + "\n" for _, _, name in listed)
    print(f"{len(listed)} uprobes")


def remove(tracefs, group):
    """Removes the event and its probes. Written as `add` writes: Python's append mode seeks to
    the end on open, which uprobe_events refuses (EINVAL), so a cleanup through it left every
    probe in place for the next run's counts to mix with."""
    events = os.path.join(tracefs, "uprobe_events")
    with open(events) as f:
        if not any(line.startswith(f"p:{group}/{EVENT} ") for line in f):
            return
    fd = os.open(events, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, f"-:{group}/{EVENT}\n".encode())
    finally:
        os.close(fd)


def write(tracefs, probes, out):
    with open(probes) as f:
        binary, *names = f.read().splitlines()
    # uprobe_profile lists the event's probes in the order they were added, with their hits.
    hits = []
    with open(os.path.join(tracefs, "uprobe_profile")) as f:
        for line in f:
            fields = line.split()
            if len(fields) == 3 and fields[0] == binary and fields[1] == EVENT:
                hits.append(int(fields[2]))
    if len(hits) != len(names):
        sys.exit(f"uprobe_profile lists {len(hits)} probes on {binary}, {len(names)} were added")
    # `names` is in address order: functions keep the neighbours rustc gave them.
    kept = [name for name, n in zip(names, hits) if n > 0]
    with open(out, "w") as f:
        f.writelines(name + "\n" for name in kept)
    print(f"{len(kept)} of {len(names)} functions called: {out}")


def coverage(binary, order):
    have = {name for _, _, name in functions(binary)}
    with open(order) as f:
        wanted = f.read().split()
    known = sum(1 for name in wanted if name in have)
    print(f"{order}: {known} of its {len(wanted)} functions are in {binary}")


if __name__ == "__main__":
    commands = {"add": add, "remove": remove, "write": write, "coverage": coverage}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    commands[sys.argv[1]](*sys.argv[2:])
