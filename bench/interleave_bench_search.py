"""Two builds of bench_search alternated, for a before/after comparison on a shared host.

    python3 bench/interleave_bench_search.py OLD NEW ROUNDS [bench_search arguments...]

runs OLD, then NEW, ROUNDS times, each with the same arguments (for example `--only mtnlg
resnet chain --mtnlg-graph G`), so that load from other processes falls on both alike. It
prints every invocation's figures per case and then, per case, the median over the rounds of
what each invocation printed (bench_search's own median of its repeats): wall and CPU seconds,
the CPU ratio NEW / OLD and the evaluation counts, which do not depend on load.
"""
import re
import statistics
import subprocess
import sys


def run(binary, args):
    out = subprocess.run([binary] + args, capture_output=True, text=True, check=True).stdout
    cases, name = [], None
    for line in out.splitlines():
        if line.startswith("== ") or line.startswith("-- "):
            name = line.strip("=- ").split(",")[0]
        m = re.match(r"wall ([\d.]+) s, cpu ([\d.]+) s .*?, (\d+) evaluations", line)
        if m:
            cases.append((name, float(m.group(1)), float(m.group(2)), int(m.group(3))))
    return cases


def main():
    old, new, rounds, args = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    runs = {old: [], new: []}
    for r in range(rounds):
        for binary in (old, new):
            cases = run(binary, args)
            runs[binary].append(cases)
            print(f"round {r + 1} {binary}: " + "; ".join(
                f"{c[0]}: wall {c[1]:.4f} cpu {c[2]:.4f} evaluations {c[3]}" for c in cases), flush=True)
    print()
    print("| case | wall before | wall after | CPU before | CPU after | CPU ratio | evaluations |")
    print("|---|---|---|---|---|---|---|")
    for i, case in enumerate(runs[old][0]):
        med = lambda b, k: statistics.median(x[i][k] for x in runs[b])
        print(f"| {case[0]} | {med(old, 1):.4f} | {med(new, 1):.4f} | {med(old, 2):.4f} | "
              f"{med(new, 2):.4f} | {med(new, 2) / med(old, 2):.2f} | "
              f"{runs[old][0][i][3]} -> {runs[new][0][i][3]} |")


if __name__ == "__main__":
    main()
