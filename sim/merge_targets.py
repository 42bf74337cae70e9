#!/usr/bin/env python3
"""Merges `kvroute-sim targets` outputs of one workload each (sim/report.sh runs
them in parallel) into the output one run over all of them prints: the text of
the first, each markdown table's header once followed by every run's rows in
the order given, then every run's JSON lines in that order."""
import sys


def segments(path):
    """The output as [(is_table, lines)], tables and text alternating; JSON lines apart."""
    segs, json = [], []
    for line in open(path).read().splitlines():
        if line.startswith('{'):
            json.append(line)
            continue
        table = line.startswith('|')
        if not segs or segs[-1][0] != table:
            segs.append((table, []))
        segs[-1][1].append(line)
    return segs, json


def main(paths):
    runs = [segments(p) for p in paths]
    first = runs[0][0]
    for path, (segs, _) in zip(paths[1:], runs[1:]):
        if [t for t, _ in segs] != [t for t, _ in first]:
            sys.exit('merge_targets: %s is not shaped like %s' % (path, paths[0]))
    out = []
    for i, (table, lines) in enumerate(first):
        if not table:
            out.extend(lines)
            continue
        out.extend(lines[:2])  # header and separator
        for segs, _ in runs:
            out.extend(segs[i][1][2:])
    for _, json in runs:
        out.extend(json)
    print('\n'.join(out))


if __name__ == '__main__':
    main(sys.argv[1:])
