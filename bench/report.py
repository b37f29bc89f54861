#!/usr/bin/env python3
"""Turns the JSON lines of `simba-bench --json` into tables and SVG charts.

    python3 bench/report.py --results DIR --markdown docs/benchmarks.md \
        --charts docs/bench [--command "..."]

DIR holds `<kind>-<run>.jsonl` (kind: memory, sqlite, redis, postgres, mysql,
zookeeper, etcd; run: 1..N), written by scripts/bench-report.sh, and
`machine.json` (the machine, the command, the server versions, which runs
failed, whether the peers ran). Lines that do not start with `{` are ignored
(bench-run.sh prints the machine on stdout too).

Beside them, `<kind>-peers-<run>.jsonl` holds the rows of
scripts/bench-peers.sh (the peer libraries of bench/peers/, run right after
simba-bench's run of that number): rows with a `peer` field, kept apart from
simba-bench's and compared with them in "Side by side with the peers".

The report replaces whatever lies between the lines
`<!-- simba-bench report: begin -->` and `<!-- simba-bench report: end -->`
of the markdown file (it appends both at the end when they are absent) and
never touches anything else. Every figure is the median across runs of one
row (store, scenario, case, and for contended rows also mode and contenders),
with the lowest and highest run in small print. Charts are hand-written SVG:
no library is needed, and the output is deterministic so that a rerun on the
same results diffs clean.

Python 3.11 standard library only.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape as xml_escape

BEGIN = "<!-- simba-bench report: begin -->"
END = "<!-- simba-bench report: end -->"

# Stores in report order, the file-name kind of each, and a fixed colour
# (Okabe-Ito, readable by the colour-blind) so charts compare across runs.
STORE_ORDER = ["memory", "sqlite", "redis", "postgresql", "mysql", "zookeeper", "etcd"]
KIND_TO_STORE = {"postgres": "postgresql"}
STORE_TO_KIND = {v: k for k, v in KIND_TO_STORE.items()}
COLOURS = {
    "memory": "#666666",
    "sqlite": "#56B4E9",
    "redis": "#D55E00",
    "postgresql": "#0072B2",
    "mysql": "#E69F00",
    "zookeeper": "#009E73",
    "etcd": "#CC79A7",
}
# Stores that push a release to the waiter (the "push" field overrides).
PUSH_STORES = {"redis", "postgresql", "zookeeper", "etcd"}

SCENARIOS = ["floor", "uncontended", "handoff", "contended", "failover", "scale"]
UNCONTENDED_TARGET = 3.0  # × floor
HANDOFF_TARGET = 5.0  # × floor, push stores only
SCALE_MAX_THREADS = 8
SCALE_MAX_SOCKETS = 2

CHART_FILES = [
    "latency-uncontended.svg",
    "latency-handoff.svg",
    "contended-throughput.svg",
    "failover.svg",
]

FILE_RE = re.compile(r"^([a-z0-9_]+)-(\d+)\.jsonl$")
PEER_FILE_RE = re.compile(r"^([a-z0-9_]+)-peers-(\d+)\.jsonl$")

# The kinds scripts/bench-peers.sh has peers for.
PEER_KINDS = ["redis", "postgres", "mysql", "zookeeper", "etcd"]
# Targets against the best peer of a store: ours ÷ peer.
PEER_LATENCY_TARGET = 1.0  # p50: at most the peer's
PEER_THROUGHPUT_TARGET = 1.0  # ops/s: at least the peer's
FAIRNESS_TARGET = 0.25  # the least-served process: at least ¼ of the mean


def store_of_kind(kind: str) -> str:
    return KIND_TO_STORE.get(kind, kind)


def store_rank(store: str) -> tuple[int, str]:
    return (STORE_ORDER.index(store) if store in STORE_ORDER else len(STORE_ORDER), store)


def colour(store: str) -> str:
    return COLOURS.get(store, "#000000")


# ---------------------------------------------------------------- loading


@dataclass
class Row:
    """One row (store, scenario, case[, mode, contenders]) across runs."""

    store: str
    scenario: str
    case: str
    mode: str = ""
    contenders: int = 0
    runs: dict[int, dict] = field(default_factory=dict)  # run number -> JSON object
    peer: str = ""  # a peer library's row (bench/peers/): its name; "" for simba-bench's

    def values(self, name: str) -> list[float]:
        out = []
        for run in sorted(self.runs):
            v = self.runs[run].get(name)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out.append(float(v))
        return out

    def median(self, name: str) -> float:
        v = self.values(name)
        return statistics.median(v) if v else 0.0

    def most(self, name: str) -> float:
        v = self.values(name)
        return max(v) if v else 0.0

    def last(self, name: str, default=None):
        for run in sorted(self.runs, reverse=True):
            if name in self.runs[run]:
                return self.runs[run][name]
        return default

    def median_run(self) -> dict:
        """The run whose p50 is the median (the lower middle for an even count)."""
        ordered = sorted(self.runs.items(), key=lambda item: (_num(item[1].get("p50_us")), item[0]))
        return ordered[(len(ordered) - 1) // 2][1]


def _num(v) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


@dataclass
class Results:
    runs: int
    kinds: list[str]
    machine: dict
    rows: list[Row]
    # kind -> run -> number of rows read (0: empty or missing)
    rows_per_run: dict[str, dict[int, int]]
    failed: set[tuple[str, int]]
    bad_lines: int
    # Scenarios taken from another directory (see apply_override), said in the report.
    overrides: list[str] = field(default_factory=list)
    # The peers' rows (from <kind>-peers-<run>.jsonl), apart from ours so that
    # no table or chart of simba-bench's mixes them in.
    peer_rows: list[Row] = field(default_factory=list)
    peer_rows_per_run: dict[str, dict[int, int]] = field(default_factory=dict)
    peer_failed: set[tuple[str, int]] = field(default_factory=set)


def read_json_lines(path: Path) -> tuple[list[dict], int]:
    """The row objects of one results file, and how many lines were unreadable."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        print(f"report.py: cannot read {path}: {error}", file=sys.stderr)
        return [], 0
    objs: list[dict] = []
    bad = 0
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if not isinstance(obj, dict) or not obj.get("scenario") or not obj.get("store"):
            bad += 1
            continue
        objs.append(obj)
    return objs, bad


def row_identity(obj: dict) -> tuple[str, str, str, int]:
    """(store, scenario, mode, contenders): mode and contenders only for contended rows."""
    scenario = str(obj["scenario"])
    if scenario != "contended":
        return str(obj["store"]), scenario, "", 0
    # A peer writes "mode": null where simba-bench leaves the field out.
    return str(obj["store"]), scenario, str(obj.get("mode") or "threads"), int(_num(obj.get("contenders")))


def load_results(directory: Path) -> Results:
    machine: dict = {}
    machine_path = directory / "machine.json"
    if machine_path.is_file():
        try:
            machine = json.loads(machine_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            print(f"report.py: ignoring {machine_path}: {error}", file=sys.stderr)
        if not isinstance(machine, dict):
            machine = {}

    files: list[tuple[str, int, Path]] = []
    peer_files: list[tuple[str, int, Path]] = []
    for path in sorted(directory.iterdir()) if directory.is_dir() else []:
        m = FILE_RE.match(path.name)
        if m and path.is_file():
            files.append((m.group(1), int(m.group(2)), path))
        m = PEER_FILE_RE.match(path.name)
        if m and path.is_file():
            peer_files.append((m.group(1), int(m.group(2)), path))

    kinds = [str(k) for k in machine.get("kinds", []) if isinstance(k, str)]
    for kind, _, _ in files:
        if kind not in kinds:
            kinds.append(kind)
    kinds.sort(key=lambda k: store_rank(store_of_kind(k)))

    runs = machine.get("runs") if isinstance(machine.get("runs"), int) else 0
    runs = max([runs] + [run for _, run, _ in files])

    failed: set[tuple[str, int]] = set()
    peer_failed: set[tuple[str, int]] = set()
    for item in machine.get("failed", []) or []:
        m = re.match(r"^([a-z0-9_]+)-(\d+)$", str(item))
        if m:
            failed.add((m.group(1), int(m.group(2))))
        m = re.match(r"^([a-z0-9_]+)-peers-(\d+)$", str(item))
        if m:
            peer_failed.add((m.group(1), int(m.group(2))))

    rows: dict[tuple, Row] = {}
    order: list[tuple] = []
    rows_per_run: dict[str, dict[int, int]] = {k: {} for k in kinds}
    bad_lines = 0
    # Sorted by run, then kind: the order of first appearance (which orders
    # the cases of one store) does not depend on the directory listing.
    for kind, run, path in sorted(files, key=lambda f: (f[1], store_rank(store_of_kind(f[0])))):
        objs, bad = read_json_lines(path)
        bad_lines += bad
        for obj in objs:
            store, scenario, mode, contenders = row_identity(obj)
            case = str(obj.get("case", ""))
            key = (store, scenario, case, mode, contenders)
            if key not in rows:
                rows[key] = Row(store, scenario, case, mode, contenders)
                order.append(key)
            rows[key].runs[run] = obj
        rows_per_run.setdefault(kind, {})[run] = len(objs)

    first_seen = {key: i for i, key in enumerate(order)}

    def row_sort(key: tuple):
        store, scenario, case, mode, contenders = key
        scenario_rank = SCENARIOS.index(scenario) if scenario in SCENARIOS else len(SCENARIOS)
        if scenario == "contended":
            mode_rank = {"threads": 0, "processes": 1}.get(mode, 2)
            return (scenario_rank, scenario, store_rank(store), mode_rank, mode, contenders, case)
        return (scenario_rank, scenario, store_rank(store), first_seen[key])

    ordered = [rows[key] for key in sorted(order, key=row_sort)]
    results = Results(runs, kinds, machine, ordered, rows_per_run, failed, bad_lines,
                      peer_failed=peer_failed)
    load_peer_rows(results, peer_files)
    return results


def load_peer_rows(results: Results, peer_files: list[tuple[str, int, Path]]) -> None:
    """The peers' rows, one Row per (store, scenario, peer[, mode, contenders]).

    A peer's row is told apart by its `peer` field (bench/peers/run.py), not
    by its case: the peers' contended case is spelled as simba-bench's keyed
    one. A row without it in a peers file is counted as unreadable."""
    rows: dict[tuple, Row] = {}
    for kind, run, path in sorted(peer_files, key=lambda f: (f[1], store_rank(store_of_kind(f[0])))):
        objs, bad = read_json_lines(path)
        peers = [obj for obj in objs if isinstance(obj.get("peer"), str) and obj["peer"]]
        results.bad_lines += bad + len(objs) - len(peers)
        for obj in peers:
            store, scenario, mode, contenders = row_identity(obj)
            key = (store, scenario, obj["peer"], mode, contenders)
            if key not in rows:
                rows[key] = Row(store, scenario, str(obj.get("case", "")), mode, contenders,
                                peer=obj["peer"])
            rows[key].runs[run] = obj
        results.peer_rows_per_run.setdefault(kind, {})[run] = len(peers)
        results.runs = max(results.runs, run)
    results.peer_rows = [rows[key] for key in sorted(rows, key=lambda k: (store_rank(k[0]), k))]


def apply_override(results: Results, override: Results, directory: Path, doc_dir: Path) -> None:
    """Replaces the rows of the scenarios `override` measured (not its floor,
    which every run measures anyway) and records where they came from."""
    replaced = {row.scenario for row in override.rows if row.scenario != "floor"}
    if not replaced:
        return
    keep = [row for row in results.rows if row.scenario not in replaced]
    new = [row for row in override.rows if row.scenario in replaced]
    # The peers of those scenarios come from the override's runs too (none if
    # it ran without them): a comparison holds within one set of runs.
    results.peer_rows[:] = [row for row in results.peer_rows if row.scenario not in replaced] + [
        row for row in override.peer_rows if row.scenario in replaced]
    rank = {name: i for i, name in enumerate(SCENARIOS)}
    # Stable: the main rows keep their order, the new ones go where their
    # scenario belongs.
    merged = sorted(keep + new, key=lambda row: rank.get(row.scenario, len(SCENARIOS)))
    results.rows[:] = merged
    command = override.machine.get("command") or "(not recorded)"
    failed = ", ".join(f"{k}-{r}" for k, r in sorted(override.failed)) or "none"
    results.overrides.append(
        f"{', '.join(sorted(replaced, key=lambda s: rank.get(s, 99)))}: from "
        f"{rel(directory, doc_dir)} ({override.runs} runs; failed: {failed}), made by "
        f"`{command}`")


# ---------------------------------------------------------------- formatting


def sig3(x: float) -> str:
    """Three significant digits at most, no exponent."""
    ax = abs(x)
    if ax >= 100:
        return f"{x:.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def latency_unit(us: float) -> tuple[str, float]:
    if us < 999.5:
        return "µs", 1.0
    if us < 999_500:
        return "ms", 1e3
    return "s", 1e6


def fmt_latency(us: float) -> str:
    if us <= 0:
        return "–"
    unit, div = latency_unit(us)
    return f"{sig3(us / div)} {unit}"


def fmt_ops(x: float) -> str:
    if x <= 0:
        return "–"
    return f"{x:,.0f}" if x >= 100 else sig3(x)


def fmt_count(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def fmt_ms(ms: float) -> str:
    """A configured duration (ttl, bound): '2 s', '1500 ms'."""
    return f"{ms / 1000:g} s" if ms >= 1000 and ms % 1000 == 0 else f"{ms:g} ms"


def fmt_ratio(x: float) -> str:
    return f"{x:.2f}×"


def spread(values: list[float], fmt_one) -> str:
    """`fmt_one(median)` plus the lowest–highest run in small print."""
    if not values:
        return "–"
    med = statistics.median(values)
    text = fmt_one(med)
    lo, hi = min(values), max(values)
    if len(values) > 1 and lo != hi:
        text += f" <small>({fmt_one(lo, bare=True)}–{fmt_one(hi, bare=True)})</small>"
    return text


def latency_cell(values: list[float]) -> str:
    positive = [v for v in values if v > 0]
    if not positive:
        return "–"
    unit, div = latency_unit(statistics.median(positive))

    def one(v: float, bare: bool = False) -> str:
        return sig3(v / div) if bare else f"{sig3(v / div)} {unit}"

    return spread(positive, one)


def ops_cell(values: list[float]) -> str:
    positive = [v for v in values if v > 0]
    if not positive:
        return "–"
    return spread(positive, lambda v, bare=False: fmt_ops(v))


def ratio_cell(values: list[float]) -> str:
    positive = [v for v in values if v > 0]
    if not positive:
        return "–"
    return spread(positive, lambda v, bare=False: f"{v:.2f}" if bare else fmt_ratio(v))


def number_cell(values: list[float], digits: int = 1) -> str:
    if not values:
        return "–"
    return spread(values, lambda v, bare=False: f"{v:,.{digits}f}")


def md(text: str) -> str:
    """Text for a markdown table cell."""
    # Only '<' could open an HTML tag; '->' stays readable in the source.
    return str(text).replace("<", "&lt;").replace("|", "\\|")


def table(header: list[str], align: str, body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("| " + " | ".join("---:" if a == "r" else "---" for a in align) + " |")
    for cells in body:
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# ---------------------------------------------------------------- SVG


def fnum(v: float) -> str:
    text = f"{v:.1f}"
    return "0.0" if text == "-0.0" else text


class Svg:
    FONT = "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\""

    def __init__(self, width: int, height: int, title: str):
        self.width = width
        self.height = height
        self.parts: list[str] = []
        self.text(width / 2, 24, title, size=15, anchor="middle", weight="bold")

    def line(self, x1, y1, x2, y2, stroke="#222", width=1.0, dash: str | None = None):
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(
            f'<line x1="{fnum(x1)}" y1="{fnum(y1)}" x2="{fnum(x2)}" y2="{fnum(y2)}" '
            f'stroke="{stroke}" stroke-width="{width}"{extra}/>'
        )

    def polyline(self, points, stroke, width=2.0, dash: str | None = None):
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        pts = " ".join(f"{fnum(x)},{fnum(y)}" for x, y in points)
        self.parts.append(
            f'<polyline points="{pts}" fill="none" stroke="{stroke}" stroke-width="{width}" '
            f'stroke-linejoin="round"{extra}/>'
        )

    def circle(self, x, y, r, fill, stroke="none"):
        self.parts.append(
            f'<circle cx="{fnum(x)}" cy="{fnum(y)}" r="{r}" fill="{fill}" stroke="{stroke}"/>'
        )

    def rect(self, x, y, w, h, fill, stroke="none", opacity: float | None = None):
        extra = f' fill-opacity="{opacity}"' if opacity is not None else ""
        self.parts.append(
            f'<rect x="{fnum(x)}" y="{fnum(y)}" width="{fnum(w)}" height="{fnum(h)}" '
            f'fill="{fill}" stroke="{stroke}"{extra}/>'
        )

    def polygon(self, points, fill, stroke="none"):
        pts = " ".join(f"{fnum(x)},{fnum(y)}" for x, y in points)
        self.parts.append(f'<polygon points="{pts}" fill="{fill}" stroke="{stroke}"/>')

    def text(self, x, y, s, size=12, anchor="start", weight=None, fill="#222", rotate=False):
        extra = f' font-weight="{weight}"' if weight else ""
        if rotate:
            extra += f' transform="rotate(-90 {fnum(x)} {fnum(y)})"'
        self.parts.append(
            f'<text x="{fnum(x)}" y="{fnum(y)}" font-size="{size}" text-anchor="{anchor}" '
            f'fill="{fill}"{extra}>{xml_escape(str(s))}</text>'
        )

    def render(self) -> str:
        head = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" '
            f'viewBox="0 0 {self.width} {self.height}" {self.FONT}>\n'
            f'<rect x="0" y="0" width="{self.width}" height="{self.height}" fill="#ffffff"/>\n'
        )
        return head + "\n".join(self.parts) + "\n</svg>\n"


class LogAxis:
    """log10 scale from decade `lo` to decade `hi` onto pixels p0..p1."""

    def __init__(self, values: list[float], p0: float, p1: float, pad: float = 1.0):
        positive = [v for v in values if v > 0] or [1.0]
        lo = min(positive) / pad
        hi = max(positive) * pad
        self.lo = 10 ** math.floor(math.log10(lo) + 1e-9)
        self.hi = 10 ** math.ceil(math.log10(hi) - 1e-9)
        if self.hi <= self.lo:
            self.hi = self.lo * 10
        self.p0, self.p1 = p0, p1

    def __call__(self, v: float) -> float:
        v = min(max(v, self.lo), self.hi)
        f = (math.log10(v) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        return self.p0 + f * (self.p1 - self.p0)

    def decades(self) -> list[float]:
        out = []
        e = round(math.log10(self.lo))
        while 10**e <= self.hi * 1.0001:
            out.append(float(10**e))
            e += 1
        return out

    def minor(self) -> list[float]:
        """2× and 5× ticks when the axis spans few decades."""
        decades = self.decades()
        if len(decades) > 4:
            return []
        return [d * m for d in decades[:-1] for m in (2, 5)]


def tick_latency(us: float) -> str:
    unit, div = latency_unit(us)
    v = us / div
    text = f"{v:g}" if v >= 1 else f"{v:.2g}"
    return f"{text} {unit}"


def tick_count(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:g}M"
    if v >= 1e3:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def nice_step(span: float, ticks: int = 6) -> float:
    raw = span / ticks
    if raw <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


# Dash patterns by the family of a case (the text before ':').
def case_family(case: str) -> str:
    return case.split(":", 1)[0].strip() if ":" in case else case


FAMILY_DASH = {"mutex": None, "keyed": "7 4"}
OTHER_DASHES = ["2 3", "9 3 2 3"]


def family_dashes(families: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    others = iter(OTHER_DASHES)
    for fam in families:
        if fam in FAMILY_DASH:
            out[fam] = FAMILY_DASH[fam]
        else:
            out[fam] = next(others, "1 2")
    return out


# Percentiles on y: the "nines" scale -log10(1 - p), so p99 and p99.9 get as
# much room as p0..p90; the maximum (p = 1) is drawn at NINES_TOP.
NINES_TOP = 3.5


def nines(q: float) -> float:
    if q >= 1:
        return NINES_TOP
    return min(-math.log10(1 - q), NINES_TOP - 0.2)


def legend(svg: Svg, x: float, y: float, stores: list[str], styles: list[tuple[str, str | None]]):
    """Store colours, then line styles (label, dash)."""
    svg.text(x, y, "store", size=12, weight="bold")
    y += 18
    for store in stores:
        svg.line(x, y - 4, x + 26, y - 4, stroke=colour(store), width=3)
        svg.text(x + 32, y, store)
        y += 18
    if styles:
        y += 8
        for label, dash in styles:
            svg.line(x, y - 4, x + 26, y - 4, stroke="#222", width=2, dash=dash)
            svg.text(x + 32, y, label)
            y += 18


def cdf_chart(rows: list[Row], title: str) -> str | None:
    curves = []  # (store, family, [(us, q)])
    for row in rows:
        run = row.median_run()
        pts = []
        for item in run.get("quantiles_us") or []:
            if isinstance(item, (list, tuple)) and len(item) == 2:
                q, v = _num(item[0]), _num(item[1])
                pts.append((v, q))
        if pts:
            curves.append((row.store, case_family(row.case), sorted(pts, key=lambda p: (p[1], p[0]))))
    if not curves:
        return None
    families = []
    for _, fam, _ in curves:
        if fam not in families:
            families.append(fam)
    dashes = family_dashes(families)
    stores = sorted({c[0] for c in curves}, key=store_rank)

    width, height = 820, 470
    x0, x1, y0, y1 = 80, 600, 50, 400  # plot area: y0 top, y1 bottom
    svg = Svg(width, height, title)
    xs = LogAxis([v for _, _, pts in curves for v, _ in pts], x0, x1)

    def ypos(q: float) -> float:
        return y1 - nines(q) / NINES_TOP * (y1 - y0)

    # Grid and ticks.
    for v in xs.minor():
        svg.line(xs(v), y0, xs(v), y1, stroke="#eeeeee")
    for v in xs.decades():
        svg.line(xs(v), y0, xs(v), y1, stroke="#d0d0d0")
        svg.text(xs(v), y1 + 18, tick_latency(v), anchor="middle")
    if len(xs.decades()) <= 3:
        for v in xs.minor():
            svg.text(xs(v), y1 + 18, tick_latency(v), size=10, anchor="middle", fill="#666")
    for q, label in [(0, "min"), (0.5, "p50"), (0.9, "p90"), (0.99, "p99"), (0.999, "p99.9"), (1, "max")]:
        svg.line(x0, ypos(q), x1, ypos(q), stroke="#d0d0d0")
        svg.text(x0 - 8, ypos(q) + 4, label, anchor="end")
    svg.line(x0, y1, x1, y1)
    svg.line(x0, y0, x0, y1)
    svg.text((x0 + x1) / 2, y1 + 42, "latency (log scale)", anchor="middle")
    svg.text(22, (y0 + y1) / 2, "percentile (log scale of 1 − p)", anchor="middle", rotate=True)

    for store, fam, pts in sorted(curves, key=lambda c: (store_rank(c[0]), families.index(c[1]))):
        svg.polyline([(xs(v), ypos(q)) for v, q in pts], colour(store), dash=dashes[fam])
    legend(svg, x1 + 30, y0 + 10, stores, [(fam, dashes[fam]) for fam in families])
    svg.text(x1 + 30, y1 + 42, "median run of each store", size=11, fill="#666")
    return svg.render()


def contended_chart(rows: list[Row]) -> str | None:
    lines: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for row in rows:
        ops = row.median("ops_per_s")
        if row.contenders > 0 and ops > 0:
            lines.setdefault((row.store, row.mode), []).append((float(row.contenders), ops))
    if not lines:
        return None
    width, height = 820, 470
    x0, x1, y0, y1 = 90, 600, 50, 400
    svg = Svg(width, height, "Contended: one hot key, ops/s by contenders (median of runs)")
    xvals = sorted({x for pts in lines.values() for x, _ in pts})
    xs = LogAxis(xvals, x0 + 20, x1 - 20)
    # Contenders sit exactly at their own ticks, not at decades.
    lx, hx = math.log10(xvals[0]), math.log10(xvals[-1])

    def xpos(v: float) -> float:
        if hx == lx:
            return (x0 + x1) / 2
        return x0 + 30 + (math.log10(v) - lx) / (hx - lx) * (x1 - x0 - 60)

    ys = LogAxis([y for pts in lines.values() for _, y in pts], y1, y0)
    for v in ys.decades():
        svg.line(x0, ys(v), x1, ys(v), stroke="#d0d0d0")
        svg.text(x0 - 8, ys(v) + 4, tick_count(v), anchor="end")
    if len(ys.decades()) <= 3:
        for v in ys.minor():
            svg.line(x0, ys(v), x1, ys(v), stroke="#eeeeee")
            svg.text(x0 - 8, ys(v) + 4, tick_count(v), size=10, anchor="end", fill="#666")
    for v in xvals:
        svg.line(xpos(v), y0, xpos(v), y1, stroke="#eeeeee")
        svg.text(xpos(v), y1 + 18, f"{v:g}", anchor="middle")
    svg.line(x0, y1, x1, y1)
    svg.line(x0, y0, x0, y1)
    svg.text((x0 + x1) / 2, y1 + 42, "contenders (log scale)", anchor="middle")
    svg.text(22, (y0 + y1) / 2, "acquisitions per second (log scale)", anchor="middle", rotate=True)

    modes = []
    for _, mode in lines:
        if mode not in modes:
            modes.append(mode)
    modes.sort(key=lambda m: ({"threads": 0, "processes": 1}.get(m, 2), m))
    mode_dash = {m: (None if m == "threads" else "7 4" if m == "processes" else "2 3") for m in modes}
    for (store, mode), pts in sorted(lines.items(), key=lambda item: (store_rank(item[0][0]), modes.index(item[0][1]))):
        pts = sorted(pts)
        svg.polyline([(xpos(x), ys(y)) for x, y in pts], colour(store), dash=mode_dash[mode])
        for x, y in pts:
            svg.circle(xpos(x), ys(y), 3.5, colour(store))
    stores = sorted({s for s, _ in lines}, key=store_rank)
    legend(svg, x1 + 30, y0 + 10, stores, [(m, mode_dash[m]) for m in modes])
    return svg.render()


def failover_chart(rows: list[Row]) -> str | None:
    bars = []  # (label, store, p50, worst, bound)
    multi = {}
    for row in rows:
        multi[row.store] = multi.get(row.store, 0) + 1
    for row in rows:
        p50 = row.median("p50_us")
        if p50 <= 0:
            continue
        label = row.store if multi[row.store] == 1 else f"{row.store} · {case_family(row.case)}"
        bars.append((label, row.store, p50, row.most("max_us"), row.most("bound_ms") * 1e3))
    if not bars:
        return None
    bar_h, gap = 18, 12
    x0, x1, y0 = 150, 640, 60
    y1 = y0 + len(bars) * (bar_h + gap) + gap
    width, height = 820, y1 + 100
    svg = Svg(width, height, "Failover: holder SIGKILLed → a waiter acquires (median takeover)")
    top = max(max(b[2], b[3], b[4]) for b in bars) * 1.05
    step = nice_step(top)
    top = math.ceil(top / step) * step

    def xpos(us: float) -> float:
        return x0 + us / top * (x1 - x0)

    ticks = []
    v = 0.0
    while v <= top + step / 2:
        ticks.append(v)
        v += step
    for v in ticks:
        svg.line(xpos(v), y0, xpos(v), y1, stroke="#d0d0d0")
        svg.text(xpos(v), y1 + 18, "0" if v == 0 else tick_latency(v), anchor="middle")
    svg.line(x0, y1, x1, y1)
    svg.line(x0, y0, x0, y1)
    svg.text((x0 + x1) / 2, y1 + 42, "time from SIGKILL to the new owner", anchor="middle")
    y = y0 + gap
    for label, store, p50, worst, bound in bars:
        mid = y + bar_h / 2
        svg.text(x0 - 8, mid + 4, label, anchor="end")
        svg.rect(x0, y, xpos(p50) - x0, bar_h, colour(store))
        if worst > p50:
            svg.line(xpos(p50), mid, xpos(worst), mid, stroke="#222", width=1)
            svg.line(xpos(worst), y + 3, xpos(worst), y + bar_h - 3, stroke="#222", width=2)
        if bound > 0:
            bx = xpos(bound)
            svg.polygon([(bx, y - 3), (bx + 5, mid), (bx, y + bar_h + 3), (bx - 5, mid)], "#C00000")
        y += bar_h + gap
    # Key, under the axis title.
    ky = y1 + 70
    svg.rect(x0, ky - 10, 22, 12, "#999999")
    svg.text(x0 + 28, ky, "median takeover")
    svg.line(x0 + 170, ky - 4, x0 + 192, ky - 4, stroke="#222", width=1)
    svg.line(x0 + 192, ky - 9, x0 + 192, ky + 1, stroke="#222", width=2)
    svg.text(x0 + 200, ky, "worst (all runs)")
    bx = x0 + 350
    svg.polygon([(bx, ky - 11), (bx + 5, ky - 4), (bx, ky + 3), (bx - 5, ky - 4)], "#C00000")
    svg.text(bx + 10, ky, "bound: ttl + transition + 1 s")
    return svg.render()


# ---------------------------------------------------------------- report


@dataclass
class Miss:
    store: str
    scenario: str
    case: str
    figure: str


def runs_note(row: Row, total: int) -> str:
    n = len(row.runs)
    return f" <small>({n} of {total} runs)</small>" if total > 1 and n < total else ""


def case_cell(row: Row, total: int) -> str:
    text = md(row.case)
    mechanism = row.last("mechanism")
    if mechanism:
        text += f" <small>({md(mechanism)})</small>"
    return text + runs_note(row, total)


def section_floor(rows: list[Row], total: int) -> list[str]:
    body = [
        [row.store, case_cell(row, total), latency_cell(row.values("p50_us")), latency_cell(row.values("p99_us"))]
        for row in rows
    ]
    return table(["store", "what it is", "p50", "p99"], "llrr", body)


def section_uncontended(rows: list[Row], total: int, misses: list[Miss]) -> list[str]:
    body = []
    for row in rows:
        ratio = row.median("floor_ratio")
        if ratio <= 0:
            verdict = "no floor"
        elif ratio <= UNCONTENDED_TARGET:
            verdict = "met"
        else:
            verdict = "**missed**"
            misses.append(Miss(row.store, row.scenario, row.case,
                               f"{fmt_ratio(ratio)} floor, target ≤ {UNCONTENDED_TARGET:g}×"))
        body.append([
            row.store, case_cell(row, total),
            latency_cell(row.values("p50_us")), latency_cell(row.values("p99_us")),
            latency_cell(row.values("p999_us")), ops_cell(row.values("ops_per_s")),
            ratio_cell(row.values("floor_ratio")), verdict,
        ])
    return table(["store", "case", "p50", "p99", "p99.9", "ops/s", "× floor",
                  f"target {UNCONTENDED_TARGET:g}×"], "llrrrrrl", body)


def is_push(row: Row) -> bool:
    push = row.last("push")
    return bool(push) if isinstance(push, bool) else row.store in PUSH_STORES


def section_handoff(rows: list[Row], total: int, misses: list[Miss]) -> list[str]:
    body = []
    for row in rows:
        push = is_push(row)
        ratio = row.median("floor_ratio")
        if not push:
            verdict = "polls (no target)"
        elif ratio <= 0:
            verdict = "no floor"
        elif ratio <= HANDOFF_TARGET:
            verdict = "met"
        else:
            verdict = "**missed**"
            misses.append(Miss(row.store, row.scenario, row.case,
                               f"{fmt_ratio(ratio)} floor, target ≤ {HANDOFF_TARGET:g}×"))
        body.append([
            row.store, case_cell(row, total),
            latency_cell(row.values("p50_us")), latency_cell(row.values("p99_us")),
            ratio_cell(row.values("floor_ratio")), "yes" if push else "no", verdict,
        ])
    return table(["store", "case", "p50", "p99", "× floor", "push",
                  f"target {HANDOFF_TARGET:g}× (push)"], "llrrrll", body)


CONTENDER_PREFIX = re.compile(r"^\s*\d+\s+(threads?|process(es)?)\s*:\s*")


def section_contended(rows: list[Row], total: int) -> list[str]:
    whats = []
    for row in rows:
        what = CONTENDER_PREFIX.sub("", row.case)
        if what not in whats:
            whats.append(what)
    out = []
    with_case = len(whats) > 1
    if len(whats) == 1 and whats[0]:
        out += [f"Each contender: {md(whats[0])}; the count is checked exact (the run fails otherwise).", ""]
    header = ["store", "mode", "contenders"] + (["case"] if with_case else []) + [
        "ops/s", "p50 wait", "p99 wait", "least / most (most ÷ least)", "count"]
    body = []
    for row in rows:
        least, most = row.values("least"), row.values("most")
        ratios = []
        for obj in row.runs.values():
            lo, hi = _num(obj.get("least")), _num(obj.get("most"))
            ratios.append(hi / lo if lo > 0 else math.inf)
        fair = "–"
        if least and most:
            r = statistics.median(ratios)
            fair = f"{fmt_count(statistics.median(least))} / {fmt_count(statistics.median(most))} "
            fair += "(∞)" if math.isinf(r) else f"({r:.2f}×)"
        cells = [row.store, md(row.mode), str(row.contenders)]
        if with_case:
            cells.append(md(row.case))
        cells += [
            ops_cell(row.values("ops_per_s")) + runs_note(row, total),
            latency_cell(row.values("p50_us")), latency_cell(row.values("p99_us")),
            fair, "exact",
        ]
        body.append(cells)
    return out + table(header, "llr" + ("l" if with_case else "") + "rrrrl", body)


def section_failover(rows: list[Row], total: int, misses: list[Miss]) -> list[str]:
    body = []
    for row in rows:
        worst = row.most("max_us")
        bound_ms = row.most("bound_ms")
        if bound_ms <= 0:
            verdict = "–"
        elif worst <= bound_ms * 1e3:
            verdict = "yes"
        else:
            verdict = "**no**"
            misses.append(Miss(row.store, row.scenario, row.case,
                               f"worst takeover {fmt_latency(worst)}, bound {fmt_ms(bound_ms)}"))
        ttl, transition = row.last("ttl_ms"), row.last("transition_ms")
        bound = fmt_ms(bound_ms) if bound_ms > 0 else "–"
        if isinstance(ttl, (int, float)) and isinstance(transition, (int, float)):
            bound += f" <small>(ttl {fmt_ms(ttl)} + transition {fmt_ms(transition)} + 1 s)</small>"
        body.append([
            row.store, case_cell(row, total), latency_cell(row.values("p50_us")),
            fmt_latency(worst), bound, verdict,
        ])
    return table(["store", "case", "p50", "max (all runs)", "bound", "within bound"], "llrrrl", body)


def section_scale(rows: list[Row], total: int, misses: list[Miss]) -> list[str]:
    body = []
    for row in rows:
        if row.values("keys") and not row.values("mutexes"):
            count = f"{fmt_count(row.median('keys'))} keys"
        else:
            count = f"{fmt_count(row.median('mutexes'))} mutexes"
        threads, sockets = row.most("threads"), row.most("sockets")
        if threads <= SCALE_MAX_THREADS and sockets <= SCALE_MAX_SOCKETS:
            verdict = "met"
        else:
            verdict = "**missed**"
            misses.append(Miss(row.store, row.scenario, row.case,
                               f"{fmt_count(threads)} threads, {fmt_count(sockets)} sockets; "
                               f"target ≤ {SCALE_MAX_THREADS} threads, ≤ {SCALE_MAX_SOCKETS} connections"))
        lost = row.most("lost")
        if lost > 0:
            # Not one of the scale targets, but a lease lost under load is
            # worse than any of them.
            misses.append(Miss(row.store, row.scenario, row.case,
                               f"{fmt_count(lost)} lease(s) lost in a run; expected none"))
        lag = row.values("renewal_lag_p99_ms")
        body.append([
            row.store, case_cell(row, total), count, fmt_count(threads), fmt_count(sockets),
            number_cell(row.values("rss_mib")), ops_cell(row.values("store_ops_per_s")),
            latency_cell([v * 1e3 for v in lag]) if any(v > 0 for v in lag) else ("0" if lag else "–"),
            fmt_count(row.most("lost")), verdict,
        ])
    return table(["store", "case", "mutexes / keys", "threads", "sockets", "RSS MiB",
                  "store ops/s", "renewal lag p99", "lost",
                  f"target ≤ {SCALE_MAX_THREADS} threads, ≤ {SCALE_MAX_SOCKETS} connections"],
                 "llrrrrrrrl", body)


def rel(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path.resolve(), start.resolve())).as_posix()


def log_links(results_dir: Path, doc_dir: Path, names: list[str]) -> str:
    """Links to the logs RESULTS/NAME.log that exist, or "the logs"."""
    return ", ".join(
        f"[{name}.log]({rel(results_dir / f'{name}.log', doc_dir)})"
        for name in names if (results_dir / f"{name}.log").is_file()
    ) or "the logs"


# ---------------------------------------------------------------- peers

# Our contended processes: simba-bench writes mode "processes" for keyed
# contenders and "locker processes" for a Locker per process; a peer writes
# "processes".
OUR_LOCKER_MODE = "locker processes"
OUR_KEYED_MODE = "processes"
PEER_MODE = "processes"


def run_values(row: Row, metric: str) -> dict[int, float]:
    """run -> the figure of that run; `fairness` is the least-served process's
    acquisitions ÷ the mean per process (count ÷ contenders)."""
    out: dict[int, float] = {}
    for run, obj in row.runs.items():
        if metric == "fairness":
            n = _num(obj.get("contenders")) or float(row.contenders)
            count, least = _num(obj.get("count")), obj.get("least")
            if n > 0 and count > 0 and isinstance(least, (int, float)) and not isinstance(least, bool):
                out[run] = float(least) / (count / n)
        else:
            v = _num(obj.get(metric))
            if v > 0:  # a peer writes null, simba-bench 0, where a figure does not apply
                out[run] = v
    return out


def in_runs(values: dict[int, float]) -> list[float]:
    return [values[run] for run in sorted(values)]


# A "peer" whose name ends so is a floor, not a competitor (bench/peers/
# *_fenced.py: the store's own lock plus a durable fencing token): never the
# best peer; a table of its own says how far the SQL mutex is above it.
FLOOR_SUFFIX = "+token"


def is_floor(row: Row) -> bool:
    return row.peer.endswith(FLOOR_SUFFIX)


def best_peer(peers: list[Row], metric: str) -> Row | None:
    """The peer with the best median in this cell: lowest latency, else highest."""
    scored = [(statistics.median(v), row.peer, row) for row in peers
              if (v := in_runs(run_values(row, metric)))]
    if not scored:
        return None
    if metric == "p50_us":
        return min(scored, key=lambda s: (s[0], s[1]))[2]
    return min(scored, key=lambda s: (-s[0], s[1]))[2]


def paired_ratios(ours: Row, peer: Row, metric: str) -> list[float]:
    """ours ÷ peer in each run that has both: the peers run right after ours
    with the same run number, so a slow spell of the machine weighs on both
    sides of a ratio. Without a common run, the ratio of the medians."""
    a, b = run_values(ours, metric), run_values(peer, metric)
    common = sorted(set(a) & set(b))
    if common:
        return [a[run] / b[run] for run in common]
    if a and b:
        return [statistics.median(a.values()) / statistics.median(b.values())]
    return []


def fmt_fraction(x: float) -> str:
    """Two decimals, and two significant digits below 0.1: a polling peer's
    hand-off is 0.010× ours, not 0.01×, and its least-served 0.0030, not 0.00."""
    if x <= 0 or x >= 0.1:
        return f"{x:.2f}"
    return f"{x:.{1 - math.floor(math.log10(x))}f}"


def fraction_cell(values: list[float], suffix: str = "") -> str:
    return spread(values, lambda v, bare=False: fmt_fraction(v) + ("" if bare else suffix))


def fairness_cell(row: Row, total: int) -> str:
    fractions = in_runs(run_values(row, "fairness"))
    if not fractions:
        return "–"
    means = [_num(obj.get("count")) / row.contenders for obj in row.runs.values()
             if row.contenders > 0 and _num(obj.get("count")) > 0]
    head = f"{fmt_count(row.median('least'))} of a mean {statistics.median(means):,.0f}: " if means else ""
    return head + fraction_cell(fractions) + runs_note(row, total)


def figure_cell(row: Row, metric: str, total: int) -> str:
    if metric == "fairness":
        return fairness_cell(row, total)
    values = in_runs(run_values(row, metric))
    cell = latency_cell(values) if metric == "p50_us" else ops_cell(values)
    return cell + runs_note(row, total) if values else cell


@dataclass
class PeerFigure:
    """One line of the side-by-side table: our row against the store's peers."""

    label: str
    metric: str  # p50_us (lower is better), ops_per_s, fairness
    ours: Row | None
    peers: list[Row]


def peer_figures(ours: list[Row], peers: list[Row]) -> list[PeerFigure]:
    """Ours and the peers' rows of one store, matched by scenario, mode and
    contenders; uncontended and hand-off rows have neither, so ours are told
    apart by the family of their case ("mutex: ...", "keyed: ...")."""

    def our_row(scenario: str, family: str = "", mode: str = "", contenders: int = 0) -> Row | None:
        for row in ours:
            if row.scenario != scenario:
                continue
            if scenario == "contended":
                if row.mode == mode and row.contenders == contenders:
                    return row
            elif case_family(row.case) == family:
                return row
        return None

    def their(scenario: str, contenders: int = 0) -> list[Row]:
        return [row for row in peers if row.scenario == scenario
                and (scenario != "contended" or (row.mode == PEER_MODE and row.contenders == contenders))]

    figures = [
        PeerFigure("uncontended p50: mutex (SPI pair)", "p50_us", our_row("uncontended", "mutex"),
                   their("uncontended")),
        PeerFigure("uncontended p50: keyed", "p50_us", our_row("uncontended", "keyed"),
                   their("uncontended")),
    ]
    counts = sorted({row.contenders for row in peers if row.scenario == "contended" and row.mode == PEER_MODE}
                    | {row.contenders for row in ours if row.scenario == "contended"
                       and row.mode in (OUR_LOCKER_MODE, OUR_KEYED_MODE)})
    for mode, what in ((OUR_LOCKER_MODE, "`Locker`"), (OUR_KEYED_MODE, "keyed")):
        for c in counts:
            figures.append(PeerFigure(f"ops/s, {c} process{'es' if c != 1 else ''}: {what}", "ops_per_s",
                                      our_row("contended", mode=mode, contenders=c), their("contended", c)))
    if counts and counts[-1] > 1:
        top = counts[-1]
        for mode, what in ((OUR_LOCKER_MODE, "`Locker`"), (OUR_KEYED_MODE, "keyed")):
            figures.append(PeerFigure(f"least-served of {top} processes: {what}", "fairness",
                                      our_row("contended", mode=mode, contenders=top), their("contended", top)))
    figures += [
        PeerFigure("hand-off p50: mutex", "p50_us", our_row("handoff", "mutex"), their("handoff")),
        PeerFigure("hand-off p50: keyed", "p50_us", our_row("handoff", "keyed"), their("handoff")),
    ]
    return [f for f in figures if f.ours is not None or f.peers]


def peer_line(store: str, figure: PeerFigure, total: int, misses: list[Miss]) -> list[str]:
    """The cells of one figure: ours, the best peer, ours ÷ peer, the target."""
    peer = best_peer(figure.peers, figure.metric)
    ours = figure_cell(figure.ours, figure.metric, total) if figure.ours else "–"
    theirs = f"{md(peer.peer)}: {figure_cell(peer, figure.metric, total)}" if peer else "–"
    ratio_text, verdict = "–", "–"
    if figure.metric == "fairness":
        fractions = in_runs(run_values(figure.ours, "fairness")) if figure.ours else []
        if fractions:
            mine = statistics.median(fractions)
            verdict = "met" if mine >= FAIRNESS_TARGET else "**missed**"
            if peer:
                theirs_fraction = statistics.median(in_runs(run_values(peer, "fairness")))
                verdict += f" <small>(peer: {'met' if theirs_fraction >= FAIRNESS_TARGET else 'missed'})</small>"
            if mine < FAIRNESS_TARGET:
                misses.append(Miss(store, "against the peers", figure.label,
                                   f"least-served process {fmt_fraction(mine)} of the mean, "
                                   f"target ≥ {FAIRNESS_TARGET:g}"))
        return [ours, theirs, ratio_text, f"≥ ¼ mean: {verdict}" if verdict != "–" else verdict]
    ratios = paired_ratios(figure.ours, peer, figure.metric) if figure.ours and peer else []
    if ratios:
        ratio_text = fraction_cell(ratios, "×")
        r = statistics.median(ratios)
        if figure.metric == "p50_us":
            met, target, what = r <= PEER_LATENCY_TARGET, f"≤ {PEER_LATENCY_TARGET:g}×", "p50"
        else:
            met, target, what = r >= PEER_THROUGHPUT_TARGET, f"≥ {PEER_THROUGHPUT_TARGET:g}×", "ops/s"
        verdict = f"{target}: " + ("met" if met else "**missed**")
        if not met:
            misses.append(Miss(store, "against the peers", figure.label,
                               f"{fmt_fraction(r)}× {peer.peer}'s {what}, target {target}"))
    return [ours, theirs, ratio_text, verdict]


def peer_notes(kind: str, peers: list[Row], results: Results, results_dir: Path, doc_dir: Path) -> list[str]:
    """What ran for a store: its peers' packages, failed or empty peer runs,
    a violated exclusion, or why no peer ran."""
    store = store_of_kind(kind)
    status = results.machine.get("peers")
    why = status.get(kind) if isinstance(status, dict) else None
    if not peers:
        reason = f" ({md(why)})" if why and why != "run" else ""
        per_run = results.peer_rows_per_run.get(kind, {})
        failed = sorted(r for r in per_run if (kind, r) in results.peer_failed or per_run[r] == 0)
        if failed:
            logs = log_links(results_dir, doc_dir, [f"{kind}-peers-{r}" for r in failed])
            reason += (f" (run{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))} "
                       f"failed or empty: see {logs})")
        return [f"* {store}: no peer run{reason}"]
    names: list[str] = []
    for row in peers:
        text = f"{md(row.peer)} ({md(row.last('package') or '?')}: {md(row.last('api') or '?')})"
        if text not in names:
            names.append(text)
    out = [f"* {store}: {', '.join(names)}"]
    total = results.runs
    per_run = results.peer_rows_per_run.get(kind, {})
    bad = [r for r in range(1, total + 1) if per_run.get(r, 0) == 0 or (kind, r) in results.peer_failed]
    if bad:
        logs = log_links(results_dir, doc_dir, [f"{kind}-peers-{r}" for r in bad])
        out.append(f"* {store}: peer run{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))} "
                   f"failed or empty (see {logs})")
    for row in peers:
        for run in sorted(row.runs):
            obj = row.runs[run]
            if _num(obj.get("violations")) > 0:
                out.append(f"* {store}: **{md(row.peer)} violated exclusion** in run {run} with "
                           f"{row.contenders} processes ({fmt_count(_num(obj.get('overlaps')))} overlaps, "
                           f"{fmt_count(_num(obj.get('lost_updates')))} increments lost)")
    return out


def section_peers(results: Results, results_dir: Path, doc_dir: Path, misses: list[Miss]) -> list[str]:
    total = results.runs
    kinds = [k for k in results.kinds if k in PEER_KINDS]
    for row in results.peer_rows:
        kind = STORE_TO_KIND.get(row.store, row.store)
        if kind not in kinds:
            kinds.append(kind)
    kinds.sort(key=lambda k: store_rank(store_of_kind(k)))
    if not kinds:
        return []
    out = ["#### Side by side with the peers (same run, same servers)", ""]
    if not results.peer_rows:
        out += ["No peer run in these results (scripts/bench-report.sh runs the peers after each "
                "store's run unless `--no-peers`; see \"Peers\" below).", ""]
        notes = [line for kind in kinds for line in peer_notes(kind, [], results, results_dir, doc_dir)]
        # Only worth a list when it says why.
        return out + (notes + [""] if any("(" in line for line in notes) else [])
    out += [
        "The peer libraries of each store (\"Peers\" below) ran right after simba-bench in every run, "
        "each on a private server of the same kind, with the same sizes. Each line is ours against "
        "the best of the store's peers in that line (named), both the median across runs; ours ÷ "
        "peer is the median of the runs' ratios (each run's figure against the same run's peer), "
        "the lowest–highest run in small print. Mutex: the Backend SPI pair (uncontended), a "
        "`Locker` per process (contended), two contend services (hand-off); keyed: "
        "`KeyedLockProvider`. Targets: p50 at most the peer's (≤ 1×), ops/s at least the peer's "
        "(≥ 1×), and the least-served of the processes at least ¼ of the mean (acquisitions ÷ "
        "processes).",
        "",
    ]
    body: list[list[str]] = []
    floor_body: list[list[str]] = []
    notes: list[str] = []
    for kind in kinds:
        store = store_of_kind(kind)
        rows = [row for row in results.peer_rows if row.store == store]
        notes += peer_notes(kind, rows, results, results_dir, doc_dir)
        peers = [row for row in rows if not is_floor(row)]
        floors = [row for row in rows if is_floor(row)]
        ours = [row for row in results.rows if row.store == store]
        for figure in peer_figures(ours, peers) if peers else []:
            body.append([store, figure.label] + peer_line(store, figure, total, misses))
        for figure in peer_figures(ours, floors) if floors else []:
            if figure.metric != "fairness" and ("mutex" in figure.label or "`Locker`" in figure.label):
                floor_body.append([store, figure.label] + floor_line(figure, total))
    if body:
        out += table(["store", "figure", "ours", "best peer", "ours ÷ peer", "target"], "llrrrl", body)
        out.append("")
    if floor_body:
        out += [
            "Against a lock with a durable fencing token: the same server lock as the peer plus one "
            "durable transaction that bumps a counter once the lock is held (bench/peers/*_fenced.py, "
            "named `+token`), the least a token that survives a crash of the server costs. A floor, "
            "not a peer: no target, and never the best peer above.",
            "",
        ]
        out += table(["store", "figure", "ours", "floor", "ours ÷ floor"], "llrrr", floor_body)
        out.append("")
    return out + notes + [""]


def floor_line(figure: PeerFigure, total: int) -> list[str]:
    """The cells of one figure against the durable-token floor: ours, the
    floor, ours ÷ floor (no target)."""
    floor = best_peer(figure.peers, figure.metric)
    ours = figure_cell(figure.ours, figure.metric, total) if figure.ours else "–"
    theirs = f"{md(floor.peer)}: {figure_cell(floor, figure.metric, total)}" if floor else "–"
    ratios = paired_ratios(figure.ours, floor, figure.metric) if figure.ours and floor else []
    return [ours, theirs, fraction_cell(ratios, "×") if ratios else "–"]


def build_report(results: Results, results_dir: Path, markdown: Path, charts_dir: Path,
                 command: str | None, charts: dict[str, str]) -> list[str]:
    doc_dir = markdown.parent
    m = results.machine
    total = results.runs
    out: list[str] = [
        "<!-- Generated by bench/report.py from the results in "
        f"{rel(results_dir, doc_dir)}; edit nothing between these markers: "
        "rerun scripts/bench-report.sh (or bench/report.py) instead. -->",
        "",
        "### Results (generated)",
        "",
    ]
    cmd = command if command is not None else m.get("command")
    out += ["Command:", "", "```sh", str(cmd) if cmd else "(not recorded)", "```", ""]
    for line in results.overrides:
        out += [f"* rows of {line}", ""]

    def get(name: str) -> str:
        v = m.get(name)
        return str(v) if v not in (None, "") else "?"

    if m:
        out += [
            f"* machine: {get('cpus')} CPUs, {md(get('cpu_model'))}, {md(get('kernel'))}",
            f"* load average before: {md(get('load_before'))}; after: {md(get('load_after'))}",
            f"* date: {md(get('date'))}",
        ]
    else:
        out.append("* machine: not recorded (no machine.json)")
    out.append(
        f"* runs: {total} of each store; every figure is the median across runs, the lowest–highest "
        "run in small print"
        + (" (`--quick`: small sizes, for a look, not for the record)" if m.get("quick") else "")
    )
    if results.bad_lines:
        out.append(f"* {results.bad_lines} unreadable JSON line(s) skipped")
    out.append("")

    # Stores: version and what came of each run.
    versions = m.get("versions") if isinstance(m.get("versions"), dict) else {}
    body = []
    for kind in results.kinds:
        store = store_of_kind(kind)
        version = versions.get(kind) or versions.get(store) or ("in process" if store == "memory" else "–")
        per_run = results.rows_per_run.get(kind, {})
        good = [r for r in range(1, total + 1) if per_run.get(r, 0) > 0 and (kind, r) not in results.failed]
        bad = [r for r in range(1, total + 1) if r not in good]
        logs = ", ".join(
            f"[{kind}-{r}.log]({rel(results_dir / f'{kind}-{r}.log', doc_dir)})"
            for r in bad if (results_dir / f"{kind}-{r}.log").is_file()
        ) or "the logs"
        if not any(per_run.get(r, 0) > 0 for r in range(1, total + 1)):
            note = f"no result (see {logs})"
        elif bad:
            note = f"run{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))} failed or empty (see {logs})"
        else:
            note = ""
        body.append([store, md(" ".join(str(version).split())), f"{len(good)} of {total}", note])
    if body:
        out += table(["store", "server", "runs ok", "note"], "llrl", body) + [""]

    by_scenario: dict[str, list[Row]] = {}
    for row in results.rows:
        by_scenario.setdefault(row.scenario, []).append(row)

    charts_rel = rel(charts_dir, doc_dir)

    def chart(name: str, alt: str) -> list[str]:
        return [f"![{alt}]({charts_rel}/{name})", ""] if name in charts else []

    misses: list[Miss] = []
    titles = {
        "floor": "Floor: the store's cheapest round trip",
        "uncontended": "Uncontended: acquire + release of a free mutex / key",
        "handoff": "Hand-off: the holder releases, a waiter acquires",
        "contended": "Contended: one hot key",
        "failover": "Failover: the holder is SIGKILLed",
        "scale": "Scale: many mutexes / keys in one process",
    }
    for scenario in SCENARIOS + sorted(set(by_scenario) - set(SCENARIOS)):
        rows = by_scenario.get(scenario)
        if not rows:
            continue
        out += [f"#### {titles.get(scenario, scenario)}", ""]
        if scenario == "floor":
            out += section_floor(rows, total)
        elif scenario == "uncontended":
            out += section_uncontended(rows, total, misses) + [""]
            out += chart("latency-uncontended.svg", "Uncontended latency CDF per store")
        elif scenario == "handoff":
            out += section_handoff(rows, total, misses) + [""]
            out += chart("latency-handoff.svg", "Hand-off latency CDF per store")
        elif scenario == "contended":
            out += section_contended(rows, total) + [""]
            out += chart("contended-throughput.svg", "Contended ops/s by contenders")
        elif scenario == "failover":
            out += section_failover(rows, total, misses) + [""]
            out += chart("failover.svg", "Failover takeover time against the bound")
        elif scenario == "scale":
            out += section_scale(rows, total, misses)
        else:
            out += table(["store", "case", "p50", "p99"], "llrr", [
                [r.store, case_cell(r, total), latency_cell(r.values("p50_us")),
                 latency_cell(r.values("p99_us"))] for r in rows])
        if out[-1] != "":
            out.append("")

    out += section_peers(results, results_dir, doc_dir, misses)

    out += ["#### Targets missed", ""]
    if misses:
        for miss in misses:
            out.append(f"* {miss.store}, {miss.scenario}, {md(miss.case)}: {miss.figure}")
    else:
        out.append("* none")
    out += [
        "",
        "Why a target is missed is explained, by hand, in the section \"Against the targets\" "
        "below.",
    ]
    return out


def replace_between_markers(markdown: Path, report_lines: list[str]) -> None:
    text = markdown.read_bytes().decode("utf-8") if markdown.exists() else ""
    lines = text.splitlines(keepends=True)
    begins = [i for i, line in enumerate(lines) if line.strip() == BEGIN]
    ends = [i for i, line in enumerate(lines) if line.strip() == END]
    newline = "\r\n" if "\r\n" in text else "\n"
    # A blank line after the begin marker and before the end marker.
    block = newline + newline.join([""] + report_lines + [""]) + newline
    if not begins and not ends:
        if text and not text.endswith("\n"):
            text += newline
        text += (newline if text else "") + BEGIN + block + END + newline
    elif len(begins) == 1 and len(ends) == 1 and begins[0] < ends[0]:
        b, e = begins[0], ends[0]
        begin_line = lines[b] if lines[b].endswith("\n") else lines[b] + newline
        text = "".join(lines[:b]) + begin_line.rstrip("\r\n") + block + "".join(lines[e:])
    else:
        raise SystemExit(
            f"report.py: {markdown}: expected one '{BEGIN}' line followed by one '{END}' line"
        )
    markdown.write_bytes(text.encode("utf-8"))


def write_charts(results: Results, charts_dir: Path) -> dict[str, str]:
    by_scenario: dict[str, list[Row]] = {}
    for row in results.rows:
        by_scenario.setdefault(row.scenario, []).append(row)
    made: dict[str, str | None] = {
        "latency-uncontended.svg": cdf_chart(
            by_scenario.get("uncontended", []), "Uncontended acquire + release: latency by percentile"),
        "latency-handoff.svg": cdf_chart(
            by_scenario.get("handoff", []), "Hand-off (release → waiter acquires): latency by percentile"),
        "contended-throughput.svg": contended_chart(by_scenario.get("contended", [])),
        "failover.svg": failover_chart(by_scenario.get("failover", [])),
    }
    charts = {name: svg for name, svg in made.items() if svg}
    charts_dir.mkdir(parents=True, exist_ok=True)
    for name in CHART_FILES:
        path = charts_dir / name
        if name in charts:
            path.write_bytes(charts[name].encode("utf-8"))
        elif path.exists():
            # A chart of a scenario these results lack would be stale.
            path.unlink()
    return charts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", required=True, type=Path, help="directory of <kind>-<run>.jsonl")
    parser.add_argument("--markdown", required=True, type=Path, help="markdown file to update")
    parser.add_argument("--charts", required=True, type=Path, help="directory for the SVG charts")
    parser.add_argument("--command", help="the command line that produced the results")
    parser.add_argument("--override", type=Path, action="append", default=[],
                        help="a directory like --results from a rerun of some scenarios (e.g. "
                             "scale with other sizes): its rows of those scenarios replace the "
                             "main directory's (its floor rows are ignored); repeatable")
    args = parser.parse_args(argv)
    for directory in [args.results] + args.override:
        if not directory.is_dir():
            print(f"report.py: {directory} is not a directory", file=sys.stderr)
            return 2
    results = load_results(args.results)
    for directory in args.override:
        apply_override(results, load_results(directory), directory, args.markdown.parent)
    charts = write_charts(results, args.charts)
    lines = build_report(results, args.results, args.markdown, args.charts, args.command, charts)
    replace_between_markers(args.markdown, lines)
    print(f"report.py: {len(results.rows)} rows from {args.results}; updated {args.markdown}, "
          f"{len(charts)} chart(s) in {args.charts}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
