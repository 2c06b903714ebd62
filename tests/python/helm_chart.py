"""Helm v4, as a library (pip helm-python-sdk), on tollgate's chart: no helm binary, no
cluster.

    helm_chart.py CHART VALUES_JSON
    helm_chart.py --values-table CHART

Lints the chart strictly with those values and renders it offline (release "tollgate" in
namespace "tollgate"), then prints one JSON object: the lint report, every rendered object
with the template it came from, and the rendered NOTES.txt.

With --values-table, prints the Markdown table of the chart's values that its README holds:
one row per key that values.yaml describes with a `# --` comment, with its default.
"""

import json
import sys

import helm_python as helm
import yaml


def described_keys(values_yaml):
    """(dotted key, description) for each key that a `# --` comment describes."""
    path, pending, found = [], None, []
    for line in values_yaml.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if pending is not None:
                pending.append(stripped[1:].strip())
            continue
        if not stripped or stripped.startswith("- ") or ":" not in stripped:
            continue
        depth = (len(line) - len(line.lstrip())) // 2
        path = path[:depth] + [stripped.split(":", 1)[0]]
        if pending is not None:
            found.append((".".join(path), " ".join(pending)))
            pending = None
    return found


def leaf_keys(values, prefix=""):
    """Dotted keys whose value is a scalar, a list or an empty map."""
    for key, value in values.items():
        dotted = prefix + key
        if isinstance(value, dict) and value:
            yield from leaf_keys(value, dotted + ".")
        else:
            yield dotted


def values_table(chart):
    text = open(chart + "/values.yaml").read()
    values = yaml.safe_load(text)
    described = described_keys(text)
    names = [key for key, _ in described]
    for leaf in leaf_keys(values):
        if not any(leaf == key or leaf.startswith(key + ".") for key in names):
            sys.exit(f"values.yaml: {leaf} has no `# --` description")
    rows = ["| key | default | meaning |", "| --- | --- | --- |"]
    for key, description in described:
        value = values
        for part in key.split("."):
            value = value[part]
        default = json.dumps(value) if not isinstance(value, str) or "\n" not in value else "(see values.yaml)"
        rows.append(f"| `{key}` | `{default}` | {description} |")
    return "\n".join(rows)


def main():
    if sys.argv[1] == "--values-table":
        print(values_table(sys.argv[2]))
        return
    chart, values = sys.argv[1], json.loads(sys.argv[2])
    report = helm.lint(chart, values, strict=True)
    rendered = helm.Chart.load(chart).render(
        values, name="tollgate", namespace="tollgate", is_install=True
    )
    objects, notes = [], ""
    for template, text in sorted(rendered.items()):
        if template.endswith("NOTES.txt"):
            notes = text
            continue
        for document in yaml.safe_load_all(text):
            if document is not None:
                objects.append({"template": template, "object": document})
    print(json.dumps({"lint": report, "objects": objects, "notes": notes}))


if __name__ == "__main__":
    main()
