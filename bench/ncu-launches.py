#!/usr/bin/env python3
"""Prints ncu's raw CSV pages (`ncu -i REPORT --csv --page raw --print-units base`) as one line per
launch in launch order, then the median time of each kernel per grid size: what a chain of launches
is made of, kernel by kernel, as `bench/gpu-proof.sh chains` records it.

    bench/ncu-launches.py FILE.csv...
"""
import csv
import statistics
import sys

TIME = "gpu__time_duration.sum"


def launches(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # ncu prints its own lines (==PROF== ...) before the table; the header is the row naming ID.
    start = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
    if start is None:
        return []
    head, units = rows[start], rows[start + 1]
    col = {name: i for i, name in enumerate(head)}
    # `--print-units base` writes "ns"; ncu's default units are spelled out ("nsecond", "usecond").
    scale = {
        "ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
    }.get(units[col[TIME]], None)
    if scale is None:
        raise SystemExit(f"{path}: unknown unit {units[col[TIME]]!r} for {TIME}")
    # The metrics when collected, else ncu's own launch columns.
    grid = col["launch__grid_size"] if "launch__grid_size" in col else col["Grid Size"]
    block = col["launch__block_size"] if "launch__block_size" in col else col["Block Size"]
    out = []
    for r in rows[start + 2:]:
        if len(r) != len(head):
            continue
        out.append({
            "name": r[col["Kernel Name"]].split("(")[0],
            "us": float(r[col[TIME]].replace(",", "")) * scale,
            "grid": r[grid],
            "block": r[block],
        })
    return out


def main(paths):
    for path in paths:
        ls = launches(path)
        print(f"== {path}: {len(ls)} launches")
        for i, l in enumerate(ls):
            print(f"{i:4d} {l['name']:32s} {l['us']:9.1f} us  grid {l['grid']:>6s} block {l['block']:>5s}")
        by = {}
        for l in ls:
            by.setdefault((l["name"], l["grid"]), []).append(l["us"])
        print("  median per kernel and grid:")
        for (name, grid), us in by.items():
            print(f"  {name:32s} grid {grid:>6s}  {statistics.median(us):9.1f} us  ({len(us)} launches)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        sys.exit(0 if len(sys.argv) > 1 else 2)
    sys.exit(main(sys.argv[1:]))
