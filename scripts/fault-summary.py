#!/usr/bin/env python3
"""Turns the reports of scripts/fault-runs.sh into one Markdown table.

    scripts/fault-summary.py OUT_DIR STORE...
    scripts/fault-summary.py --matrix OUT_DIR TOPOLOGY[:FAULT]...

Reads OUT_DIR/STORE/report.txt (written by simba-fault-run) and prints a
table for docs/reliability.md: what was injected and how often, what the
workers did, the worst times, and what the checker found. With --matrix,
one row per topology and fault (docs/reliability.md, "Replicated stores"):
how often it was injected, the run's violations, how often the holder kept
the mutex through it, and the time from the fault to the next owner
otherwise, and from its healing to an owner against the bound the run
checked; TOPOLOGY:FAULT is a run of one fault alone (fault-runs.sh
--per-fault), its row only. Standard library only.
"""
import os
import re
import sys


def parse(report):
    row = {}
    m = re.search(r"(\d+) acquisitions, (\d+) losses signalled, (\d+) releases; "
                  r"(\d+) writes accepted, (\d+) stale writes rejected", report)
    if m:
        (row["acquisitions"], row["losses"], row["releases"], row["accepted"],
         row["rejected"]) = m.groups()
    m = re.search(r"^faults: (.*)$", report, re.M)
    # "kill=8 pause=7; 15 of 15 aimed at a worker found it holding the mutex"
    row["faults"] = dict(kv.split("=") for kv in m.group(1).split(";")[0].split()) if m else {}
    m = re.search(r"\(([^)]*)\); worst ownership overlap \(paused holders\): ([\d.]+) ms", report)
    row["takeover"] = {}
    if m:
        for part in m.group(1).split(", "):
            kind, value, _ = part.split(" ")
            row["takeover"][kind] = float(value)
        row["overlap"] = float(m.group(2))
    row["recovery"] = {}
    for kind, kept, rest in re.findall(
            r"^recovery from ([a-z-]+): the holder kept the mutex (\d+) time\(s\)(.*)$", report,
            re.M):
        m = re.search(r"a new owner (\d+) time\(s\), after median ([\d.]+) ms, worst ([\d.]+) ms",
                      rest)
        row["recovery"][kind] = (int(kept), (int(m.group(1)), float(m.group(2)),
                                             float(m.group(3))) if m else None)
    m = re.search(r"^bound: a new owner within ([\d.]+) ms", report, re.M)
    row["bound"] = float(m.group(1)) if m else None
    m = re.search(r"^checker: (.*)$", report, re.M)
    row["checker"] = m.group(1) if m else "(no verdict)"
    row["violations"] = re.findall(r"^  \[([a-z-]+)\]", report, re.M)
    return row


def seconds(ms):
    return "%.2f s" % (ms / 1000.0)


def matrix(out, topologies):
    print("| Topology | Fault | Injected | Violations (whole run) | Holder kept it | New owner after "
          "the fault: median / worst (n) | Worst after healing / bound |")
    print("|---|---|---:|---|---:|---|---|")
    for entry in topologies:
        # "TOPOLOGY:FAULT": a run of that fault alone (fault-runs.sh --per-fault).
        topology, _, only = entry.partition(":")
        path = os.path.join(out, entry, "report.txt")
        try:
            with open(path) as f:
                row = parse(f.read())
        except OSError:
            print("| %s | %s | (no report) | | | | |" % (topology, only or "(all)"))
            continue
        verdict = "0" if not row["violations"] else "%d: %s" % (
            len(row["violations"]), ", ".join(sorted(set(row["violations"]))))
        for kind, count in sorted(row["faults"].items()):
            if only and kind != only:
                continue
            kept, owner = row["recovery"].get(kind, (0, None))
            after = ("%s / %s (%d)" % (seconds(owner[1]), seconds(owner[2]), owner[0])
                     if owner else "–")
            healed = row["takeover"].get(kind)
            bound = row["bound"]
            print("| %s | %s | %s | %s | %d | %s | %s / %s |" % (
                topology, kind, count, verdict, kept, after,
                seconds(healed) if healed is not None else "–",
                seconds(bound) if bound is not None else "?"))
    return 0


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--matrix":
        return matrix(sys.argv[2], sys.argv[3:])
    if len(sys.argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out, stores = sys.argv[1], sys.argv[2:]
    print("| Store | Faults injected | Acquisitions | Losses signalled | Writes accepted "
          "| Stale writes rejected | Worst kill → new owner | Worst overlap (paused) | Checker |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for store in stores:
        path = os.path.join(out, store, "report.txt")
        try:
            with open(path) as f:
                row = parse(f.read())
        except OSError:
            print("| %s | (no report) | | | | | | | |" % store)
            continue
        faults = ", ".join("%s %s" % (k, v) for k, v in sorted(row["faults"].items()))
        takeover = row["takeover"]
        kill = takeover.get("kill", takeover.get("crash"))
        verdict = "OK" if not row["violations"] else "%d: %s" % (
            len(row["violations"]), ", ".join(sorted(set(row["violations"]))))
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            store, faults, row.get("acquisitions", "?"), row.get("losses", "?"),
            row.get("accepted", "?"), row.get("rejected", "?"),
            seconds(kill) if kill is not None else "–",
            seconds(row["overlap"]) if "overlap" in row else "–", verdict))
    return 0


if __name__ == "__main__":
    sys.exit(main())
