"""Rows of a benchmark appended to its CSV under ``results/``: the header written once, and a file
whose columns differ refused (name another file)."""
import csv
import os


def append(path: str, rows: list) -> None:
    new = not os.path.exists(path)
    if not new:
        with open(path, newline="") as f:
            if next(csv.reader(f), []) != list(rows[0]):
                raise SystemExit(f"{path} has other columns; name another file with --out")
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            writer.writeheader()
        writer.writerows(rows)
