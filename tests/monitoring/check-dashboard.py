#!/usr/bin/env python3
"""check-dashboard.py — checks a Grafana dashboard's queries without Grafana.

Debian 12 and PyPI offer no Grafana to load the dashboard into, so this
checks what can go wrong in its JSON short of rendering it:

  * the file is a provisioning-ready dashboard: a uid, a title, unique panel
    ids, a gridPos on every panel, every query panel and query variable on
    the $datasource variable (so it works with any Prometheus datasource);
  * every panel query and every query variable parses as PromQL: the
    expressions (Grafana's $variables replaced by stand-ins) are written as
    recording rules into a throwaway rules file that `promtool check rules`
    must accept;
  * every metric a query names is exported: it appears in the captured
    exposition of kiln's programs (tests/monitoring/*.prom), in the list of
    dcgm-exporter's names (services/monitoring/dcgm-exporter-metrics.txt), or
    is Prometheus's own `up`;
  * every label a matcher uses on a kiln metric is a label of that metric in
    the exposition, or one the scrape configuration adds (job, instance,
    node, model, cluster).

  check-dashboard.py [--promtool PATH] DASHBOARD.json NAMES.txt EXPOSITION...

Prints one line per problem and exits 1 when there is any, 0 otherwise.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

DATASOURCE = "${datasource}"
# labels Prometheus or kiln's rendered prometheus.yml put on every target
TARGET_LABELS = {"job", "instance", "node", "model", "cluster", "__name__"}
# metrics Prometheus makes up itself for every target
SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
    "unless", "bool", "offset", "atan2", "inf", "nan",
}
AGGREGATIONS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
    "count_values", "bottomk", "topk", "quantile",
}
LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}

TOKEN = re.compile(r"""
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<matchers>\{[^}]*\})
  | (?P<range>\[[^\]]*\])
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<open>\()
  | (?P<close>\))
  | (?P<space>\s+)
  | (?P<other>.)
""", re.X)
MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')\s*,?')


def substitute(expr):
    """Grafana's variables replaced by values PromQL accepts."""
    expr = re.sub(r"\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}", "5m", expr)
    expr = re.sub(r"\$\{[A-Za-z0-9_]+(:[a-z]+)?\}|\$[A-Za-z_][A-Za-z0-9_]*", "x", expr)
    return expr


def metrics_of(expr):
    """(metric, [label names in its matchers]) for every selector of expr."""
    toks = [(m.lastgroup, m.group()) for m in TOKEN.finditer(expr) if m.lastgroup != "space"]
    out = []
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1] if i + 1 < len(toks) else (None, None)
        if kind == "ident":
            low = text.lower()
            if low in LABEL_LISTS and nxt[0] == "open":
                # skip the label list: by (a, b)
                j = i + 2
                while j < len(toks) and toks[j][0] != "close":
                    j += 1
                i = j + 1
                continue
            if nxt[0] == "open" or low in KEYWORDS or low in AGGREGATIONS:
                i += 1
                continue
            labels = []
            if nxt[0] == "matchers":
                labels = [m.group(1) for m in MATCHER.finditer(nxt[1][1:-1])]
            out.append((text, labels))
        elif kind == "matchers" and (i == 0 or toks[i - 1][0] != "ident"):
            out.append(("", [m.group(1) for m in MATCHER.finditer(text[1:-1])]))
        i += 1
    return out


def read_exposition(paths):
    """{metric name: set of label names} from Prometheus text files."""
    names = {}  # an empty set: a family without samples, labels unknown
    sample = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s")
    for p in paths:
        with open(p, encoding="utf-8") as f:
            for line in f:
                if line.startswith("# TYPE "):
                    parts = line.split()
                    base = parts[2]
                    kinds = {"histogram": ["_bucket", "_sum", "_count"], "summary": ["_sum", "_count"]}
                    for suffix in [""] + kinds.get(parts[3] if len(parts) > 3 else "", []):
                        names.setdefault(base + suffix, set())
                    continue
                if line.startswith("#") or not line.strip():
                    continue
                m = sample.match(line)
                if not m:
                    continue
                labels = names.setdefault(m.group(1), set())
                for lm in MATCHER.finditer(m.group(3) or ""):
                    labels.add(lm.group(1))
    return names


def read_names(path):
    with open(path, encoding="utf-8") as f:
        return {l.strip() for l in f if l.strip() and not l.startswith("#")}


def walk_panels(panels):
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels", []))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--promtool", default="promtool")
    ap.add_argument("dashboard")
    ap.add_argument("names")
    ap.add_argument("exposition", nargs="+")
    a = ap.parse_args()

    problems = []
    with open(a.dashboard, encoding="utf-8") as f:
        try:
            dash = json.load(f)
        except json.JSONDecodeError as e:
            print(f"{a.dashboard}: not JSON: {e}")
            return 1
    for key in ("uid", "title", "panels", "schemaVersion"):
        if key not in dash:
            problems.append(f"dashboard: no {key}")
    if dash.get("id") is not None:
        problems.append("dashboard: id must be null (Grafana assigns it on import)")

    exported = read_exposition(a.exposition)
    dcgm = read_names(a.names)

    queries = []  # (where, expr)
    ids = set()
    for p in walk_panels(dash.get("panels", [])):
        where = f"panel {p.get('id')} \"{p.get('title', '')}\""
        if p.get("id") in ids:
            problems.append(f"{where}: duplicate panel id")
        ids.add(p.get("id"))
        if "gridPos" not in p:
            problems.append(f"{where}: no gridPos")
        if p.get("type") == "row":
            continue
        if (p.get("datasource") or {}).get("uid") != DATASOURCE:
            problems.append(f"{where}: datasource is not the $datasource variable")
        targets = p.get("targets") or []
        if not targets:
            problems.append(f"{where}: no query")
        for t in targets:
            expr = t.get("expr", "")
            if not expr.strip():
                problems.append(f"{where} {t.get('refId')}: empty query")
                continue
            if (t.get("datasource") or {}).get("uid", DATASOURCE) != DATASOURCE:
                problems.append(f"{where} {t.get('refId')}: datasource is not the $datasource variable")
            queries.append((f"{where} {t.get('refId')}", expr))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query", "") if isinstance(q, dict) else (q or "")
        where = f"variable ${v.get('name')}"
        if (v.get("datasource") or {}).get("uid") != DATASOURCE:
            problems.append(f"{where}: datasource is not the $datasource variable")
        m = re.fullmatch(r"\s*label_values\(\s*(.*?)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*", q)
        if m:
            queries.append((where, m.group(1)))
        elif re.fullmatch(r"\s*query_result\((.*)\)\s*", q):
            queries.append((where, re.fullmatch(r"\s*query_result\((.*)\)\s*", q).group(1)))
        else:
            problems.append(f"{where}: query {q!r} is neither label_values(...) nor query_result(...)")

    # 1. every expression parses: one recording rule per query
    with tempfile.TemporaryDirectory() as tmp:
        rules = os.path.join(tmp, "dashboard-rules.yml")
        with open(rules, "w", encoding="utf-8") as f:
            f.write("groups:\n")
            for n, (where, expr) in enumerate(queries):
                f.write(f"  - name: {json.dumps(where)}\n    rules:\n")
                f.write(f"      - record: dashboard:query{n}\n        expr: {json.dumps(substitute(expr))}\n")
        r = subprocess.run([a.promtool, "check", "rules", rules], capture_output=True, text=True)
        if r.returncode != 0:
            for line in (r.stdout + r.stderr).splitlines():
                if line.strip() and "Checking" not in line and "FAILED" not in line:
                    problems.append("promtool: " + line.strip())

    # 2. every metric is exported by kiln or dcgm-exporter; labels exist
    for where, expr in queries:
        for metric, labels in metrics_of(substitute(expr)):
            if not metric:
                continue
            if metric not in exported and metric not in dcgm and metric not in SYNTHETIC:
                problems.append(f"{where}: metric {metric} is exported neither by kiln nor by dcgm-exporter")
                continue
            if exported.get(metric):  # labels known: the capture has samples of it
                for lbl in labels:
                    if lbl not in exported[metric] and lbl not in TARGET_LABELS:
                        problems.append(f"{where}: {metric} has no label {lbl}")

    for p in problems:
        print(p)
    print(f"# {len(queries)} queries, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
