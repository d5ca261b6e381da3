"""Prints the scenario x mutant table from the JUnit XML files run.sh wrote (TEST CODE).

usage: summarize.py RESULTS_DIR baseline MUTANT...

A cell is `caught` when the scenario's test failed (or errored) with the mutant active,
`NOT caught` when it passed; for the baseline, `pass` / `FAIL`. Below the table, the first
assertion message of each failure. "(equivalent)": in that scenario the mutant chose exactly
the winners collect() chose (and attached no other part), so no test could tell it apart;
"(no change!)": the test failed although the mutant changed nothing there (look at the log). Also reads RESULTS_DIR/<mutant>.events.jsonl (what the
mutant changed: winners before/after, parts attached) to say whether the mutant actually
changed the winners in that run. Exit status 1 if a baseline cell is not `pass`.
"""

import json
import os
import re
import sys
import xml.etree.ElementTree as ET

SCENARIOS = [  # (name, file, test, the loads it runs)
    ("task-retry", "test_spark_load.py", "test_task_retry_after_publish_loads_exactly_once", ["retry-load"]),
    ("replace-reload", "test_spark_load.py", "test_replace_reload_of_existing_partitions",
     ["history-v1", "history-v2-day1"]),
    ("driver-killed", "test_spark_load.py", "test_driver_killed_during_commit_then_rerun", ["crash-load"]),
    ("stage-retry-zombies", "test_spark_failures.py", "test_stage_retry_with_zombies_that_publish_late",
     ["zombie-load"]),
    ("executor-killed", "test_spark_failures.py", "test_executor_killed_while_writing", ["executor-loss-load"]),
    ("speculation", "test_spark_failures.py", "test_speculative_copy_beats_straggler", ["speculation-load"]),
]


def outcomes(xml_path):
    """{test name: (outcome, message)} from one JUnit XML file."""
    out = {}
    if not os.path.exists(xml_path):
        return out
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        name = case.get("name")
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is not None:
            out[name] = ("failed", first_message(failure.get("message") or "", failure.text or ""))
        elif case.find("skipped") is not None:
            out[name] = ("skipped", case.find("skipped").get("message") or "")
        else:
            out[name] = ("passed", "")
    return out


def _clean(text):
    """The failure report's lines without pytest's `E   ` markers."""
    return [re.sub(r"^E\s{1,}", "", line).rstrip() for line in text.splitlines()]


def first_message(message, text):
    """The failure's first meaningful line: for a chpart command that failed, the exception
    line with chpart's own error and first problem line; else the assertion message (with
    pytest's `assert <left> == <right>` explanation, and the failing source line for a bare
    assert)."""
    lines = _clean(text)
    for i, line in enumerate(lines):
        m = re.search(r"(chpart_spark\._cli\.\w*Error: .*)", line)
        if not m:
            continue
        out = m.group(1).replace("; stderr tail:", "")
        rest = lines[i + 1:i + 12]
        err = next((j for j, l in enumerate(rest) if l.strip().startswith(("chpart: error:", "chpart: CHPART_TEST"))), None)
        if err is not None:
            out += " | " + rest[err].strip()
            problem = next((l.strip() for l in rest[err + 1:err + 3] if l.strip().startswith("- ")), None)
            if problem:
                out += " " + problem
        return out
    msg = [line.rstrip() for line in message.splitlines() if line.strip()]
    if not msg:
        return "(no message)"
    first = msg[0]
    if first.startswith("assert "):  # a bare assert: say which one
        source = next((l[1:].strip() for l in lines if l.startswith(">")), None)
        return f"{source} -> {first}" if source else first
    explanation = next((l.strip() for l in msg[1:] if l.strip().startswith("assert ")), None)
    if explanation and explanation not in first:
        first = (first[:200] + " ...") if len(first) > 200 else first
        first += " | " + explanation
    return first


def changed(events_path):
    """Per load: did the mutant change the winners / attach a part that was not a winner."""
    out = {}
    if not os.path.exists(events_path):
        return out
    with open(events_path) as f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") in ("commit-selection", "write-winners-selection"):
                if e.get("changed"):
                    diff = sorted({tuple(x[:2]) for x in e["after"]} - {tuple(x[:2]) for x in e["before"]})
                    out.setdefault(e.get("load") or "?", set()).update(f"p{p}:{a}" for p, a in diff)
            elif e.get("event") == "naive-commit":
                winners = {tuple(x[:2]) for x in e["collected"]}
                extra = [f"p{p}:{a}" for p, a, _ in e["attached"] if (p, a) not in winners]
                out.setdefault(e.get("load") or "?", set()).update(extra)
    return out


def main(argv):
    results, names = argv[0], argv[1:]
    table = {name: outcomes(os.path.join(results, f"{name}.xml")) for name in names}
    width = max(len(s[0]) for s in SCENARIOS)
    cols = [max(len(n), 24) for n in names]
    effects = {name: changed(os.path.join(results, f"{name}.events.jsonl")) for name in names if name != "baseline"}
    print("| scenario".ljust(width + 2) + " | " + " | ".join(n.ljust(c) for n, c in zip(names, cols)) + " |")
    print("|" + "-" * (width + 2) + "|" + "|".join("-" * (c + 2) for c in cols) + "|")
    baseline_ok = True
    notes = []
    for scenario, _, test, loads in SCENARIOS:
        cells = []
        for name, c in zip(names, cols):
            outcome, message = table[name].get(test, ("missing", "the test did not run"))
            if name == "baseline":
                cell = "pass" if outcome == "passed" else "FAIL"
                baseline_ok &= outcome == "passed"
            else:
                cell = {"failed": "caught", "passed": "NOT caught"}.get(outcome, outcome)
                did = sorted(x for load in loads for x in effects[name].get(load, ()))
                if not did:
                    # the mutant chose exactly what collect() chose (attached no other part) here
                    cell += " (equivalent)" if outcome == "passed" else " (no change!)"
            if outcome != "passed":
                notes.append((scenario, name, message))
            cells.append(cell.ljust(c))
        print("| " + scenario.ljust(width) + " | " + " | ".join(cells) + " |")
    print()
    for scenario, name, message in notes:
        print(f"- {scenario} x {name}: {message[:400]}")
    print()
    for name in names:
        if name == "baseline":
            continue
        ch = effects[name]
        summary = "; ".join(f"{k}: {', '.join(sorted(v)) or '-'}" for k, v in sorted(ch.items())) or "nothing changed"
        print(f"- {name}: winners/parts it put in that collect() did not choose: {summary}")
    return 0 if baseline_ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
