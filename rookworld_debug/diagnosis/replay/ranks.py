"""The ranks of a distributed loop behind a replay's disagreement: the rows a check names, mapped through the
recorded step's `rows_by_rank` (a fault on one rank shows as rows of that rank only)."""
from __future__ import annotations

import dataclasses
import re

from rookworld_debug.diagnosis.findings import Evidence


def named_rows(where: str) -> list:
    """The rows a check's `where` names, in its order: "… rows [4, 6]" or "… (row, t) [(4, 0), (6, 2)]"."""
    m = re.search(r"rows \[([\d, ]*)\]", where or "")
    if m:
        return [int(v) for v in m.group(1).split(",") if v.strip()]
    m = re.search(r"\(row, t\) \[(.*)\]", where or "")
    rows = [int(v) for v in re.findall(r"\((\d+), \d+\)", m.group(1))] if m else []
    return list(dict.fromkeys(rows))


def _runs(rows: list) -> str:
    """[4, 5, 6, 7, 9] → "4–7, 9"."""
    rows, out = sorted(set(rows)), []
    for r in rows:
        if out and r == out[-1][1] + 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in out)


def by_rank(rows: list, spans) -> dict:
    """{rank: its rows among `rows`} for spans ((start, stop), ...) in rank order."""
    out: dict = {}
    for r in rows:
        rank = next((k for k, (a, b) in enumerate(spans) if a <= r < b), None)
        if rank is not None:
            out.setdefault(rank, []).append(r)
    return dict(sorted(out.items()))


def with_ranks(finding, check, spans):
    """`finding` with the ranks that hold the rows its check names: a sentence in its cause and an Evidence
    "replay/<phase>/ranks" (value: how many ranks); unchanged when the step is not distributed or names no rows."""
    rows = named_rows(check.where)
    ranks = by_rank(rows, spans or ())
    if not ranks:
        return finding
    said = "; ".join(f"rows {_runs(v)} (rank {k})" for k, v in ranks.items())
    m = re.match(r"(\d+) of \d+ rows", check.where or "")
    every = m is not None and int(m.group(1)) <= len(rows)
    owner = f"rank {next(iter(ranks))}'s" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}'"
    sentence = (f" The disagreeing rows are {owner}: {said}." if every else
                f" The rows it differs most at are {owner}: {said}.")
    ev = Evidence(name=f"replay/{check.phase}/ranks", value=float(len(ranks)),
                  definition=f"the ranks of the distributed loop holding the rows {check.phase} disagrees at "
                             f"({'all of them' if every else 'the worst named'}; rows by rank "
                             f"{[tuple(s) for s in spans]})", batch="the recorded step", where=said)
    return dataclasses.replace(finding, cause=finding.cause + sentence, evidence=finding.evidence + (ev,))
