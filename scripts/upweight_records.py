"""Write repeats of the rare A: records (game ends, illegal attempts late in a game) so that a training mix
reads them often enough (game ends were 1-4 % of the A: records of games played to their end).

    python scripts/upweight_records.py DATA.jsonl [...] --out UP.jsonl --end-share 0.15 --late-illegal-repeat 1

The repeats are exact copies of train-split records; ``train-tiny --data`` concatenates its files, so a record
written here k times is drawn k+1 times as often as before.
"""
import argparse
import json
import math


def _fullmove(fen: str) -> int:
    return int(fen.split()[5])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--end-share", type=float, default=0.15, help="target share of game-end records among A:")
    ap.add_argument("--late-illegal-repeat", type=int, default=1, help="extra copies of illegal attempts past move 40")
    args = ap.parse_args()
    n_a, ends, late_illegal = 0, [], []
    for path in args.data:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r.get("task") != "A" or r.get("split", "train") != "train":
                    continue
                n_a += 1
                if r.get("terminated") == 1:
                    ends.append(line)
                elif r.get("outcome") == "illegal_move" and _fullmove(r["fen"]) > 40:
                    late_illegal.append(line)
    # k copies of each end record: (len(ends)(1+k)) / (n_a + k len(ends)) = share
    s = args.end_share
    k = max(0, math.ceil((s * n_a - len(ends)) / (len(ends) * (1 - s)))) if ends else 0
    with open(args.out, "w") as f:
        for _ in range(k):
            f.writelines(ends)
        for _ in range(args.late_illegal_repeat):
            f.writelines(late_illegal)
    print(f"A: records {n_a}, game ends {len(ends)} x{k + 1}, late illegal {len(late_illegal)} "
          f"x{args.late_illegal_repeat + 1} -> {args.out}")


if __name__ == "__main__":
    main()
