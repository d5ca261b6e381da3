"""The end-to-end benchmark's chart (e2e.py's result, drawn with matplotlib): moved out of
e2e.py as it is, with the variants' tags ("(a)", ...) passed in."""


def draw_chart(result, path, tags):
    """Per shape (a column), the three targets of (a) (a row each), every variant beside it:
    server CPU s per uncompressed GB of each load (solid) with the merges until the table is at
    rest stacked on top (hatched), both net of the idle server's, the raw figures in the labels;
    wall time against INSERT's; the executors' CPU s per GB against the Python tasks'. Each
    panel's title carries its ratio, target and PASS/MISS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = result["params"]
    shapes = list(result["shapes"].items())
    colors = {"chpart": "#2b7bba", "chpart_py": "#5a9bd0", "chpart1": "#9cc4e4", "insert": "#d9622b"}
    fig, axes = plt.subplots(3, len(shapes), figsize=(7.5 * len(shapes), 17.5), squeeze=False)
    mark = lambda ok: "PASS" if ok else "MISS"  # noqa: E731
    for col, (shape, r) in enumerate(shapes):
        v = r["variants"]
        names = list(v)
        labels = []
        for name in names:
            f = v[name]
            if name == "chpart":
                short = f"(a) chpart, connector\nlayout: {f['tasks_with_parts']} of {f['spark_tasks']} tasks built"
            elif name == "chpart_py":
                short = f"(a-py) chpart, Python\n{f['spark_tasks']} tasks"
            elif name == "chpart1":
                short = "(a1) chpart, Python\n1 task per partition"
            else:
                short = f"(b) HTTP INSERT\n{p['insert_batch_rows'] // 1000}k-row POSTs"
            labels.append(short)
        cs = [colors[n] for n in names]
        t = r["targets"]["chpart"]
        head = f"{shape}: {r['rows'] / 1e6:g}M events, {r['days']} day partition(s), {r['spark_partitions']} tasks\n"

        ax = axes[0][col]
        load = [v[n]["server_cpu_secs_per_gb_net"] for n in names]
        merge = [v[n]["merge_server_cpu_secs_per_gb_net"] for n in names]
        ax.bar(labels, load, color=cs, width=0.55, label="during the load, net of idle")
        ax.bar(labels, merge, bottom=load, color=cs, alpha=0.3, hatch="//", edgecolor="#444444", width=0.55,
               label="merges until at rest (one part per table partition), net of idle")
        for i, n in enumerate(names):
            f = v[n]
            ax.annotate(f"{f['server_cpu_secs_per_gb_with_merge_net']:.2f} s/GB net\nload {load[i]:.2f} + merges "
                        f"{merge[i]:.2f}\nraw {f['server_cpu_secs_per_gb_with_merge']:.2f}\n"
                        f"{f['parts_after_load']} parts -> {f['parts_after_merge']}",
                        (i, load[i] + merge[i]), xytext=(0, 4), textcoords="offset points", ha="center",
                        va="bottom", fontsize=9)
        ax.set_ylim(0, max(x + y for x, y in zip(load, merge)) * 1.45)
        ax.set_ylabel("server CPU s per uncompressed GB, net of idle\n(lower is better)")
        c = t["cpu_ratio_with_merges"]
        title = (head + f"server CPU with merges, INSERT / (a): {c['value']:.1f}x (raw {c['raw_value']:.1f}x; target "
                 f">= {c['target']:.0f}x: {mark(c['pass'])})")
        others = [f"{tags[n]} {alt['cpu_ratio_with_merges']['value']:.1f}x"
                  for n, alt in r["targets"].items() if n != "chpart"]
        if others:
            title += "\nalternatives: " + ", ".join(others)
        ax.set_title(title, fontsize=10.5)
        ax.legend(loc="upper left", fontsize=8.5, frameon=False)

        ax = axes[1][col]
        wall = [v[n]["wall_secs"] for n in names]
        ax.bar(labels, wall, color=cs, width=0.55)
        for i, w in enumerate(wall):
            ax.annotate(f"{w:.1f} s", (i, w), xytext=(0, 4), textcoords="offset points", ha="center", fontsize=9)
        ax.axhline(v["insert"]["wall_secs"], color=colors["insert"], linestyle="--", linewidth=1)
        ax.set_ylim(0, max(wall) * 1.25)
        ax.set_ylabel("wall time of the load, s (lower is better)")
        sp = t["speedup"]
        ax.set_title(f"{shape}: wall time, INSERT / (a): {sp['value']:.2f}x (target >= {sp['target']:.1f}x: "
                     f"{mark(sp['pass'])})", fontsize=10.5)

        ax = axes[2][col]
        cpu = [v[n]["executor_cpu_secs_per_gb"] for n in names]
        ax.bar(labels, cpu, color=cs, width=0.55)
        for i, x in enumerate(cpu):
            ax.annotate(f"{x:.1f} s/GB", (i, x), xytext=(0, 4), textcoords="offset points", ha="center", fontsize=9)
        ax.set_ylim(0, max(cpu) * 1.25)
        ax.set_ylabel("executors' CPU s per uncompressed GB\n(Spark, Python, chpart, clickhouse-local)")
        e = t.get("executor_cpu_vs_python")
        if e:
            ax.axhline(v["chpart_py"]["executor_cpu_secs_per_gb"] * e["target"], color="#444444", linestyle="--",
                       linewidth=1, label=f"{e['target']:.1f}x (a-py)")
            ax.legend(loc="upper left", fontsize=8.5, frameon=False)
            ax.set_title(f"{shape}: executors' CPU per GB, (a) / (a-py): {e['value']:.2f}x (target <= "
                         f"{e['target']:.1f}x: {mark(e['pass'])})", fontsize=10.5)
        for row in range(3):
            a = axes[row][col]
            a.spines[["top", "right"]].set_visible(False)
            a.grid(axis="y", alpha=0.3)
            a.set_axisbelow(True)
    fig.suptitle(f"chpart end to end, (a) through the connector's default: {p['spark_master']} on "
                 f"{result['machine']['cpus']} CPUs, ClickHouse {result['server_version']}, best of {p['repeat']} "
                 f"round(s) ({result['date'][:10]})", fontsize=11)
    idle = result["server_idle"]
    fig.text(0.01, 0.005, f"Server CPU is the server process's utime+stime, net of its idle rate "
             f"({idle['cpu_per_sec']:.4f} CPU s/s, the lower of {idle['start']['cpu_per_sec']:.4f} after the warm-up and "
             f"{idle['end']['cpu_per_sec']:.4f} at the end) x each window's wall time; the machine is shared, so wall "
             f"times are noisy. Details: crates/bench/e2e/README.md", fontsize=8, color="#555555")
    fig.tight_layout(rect=(0, 0.01, 1, 0.98))
    fig.savefig(path, dpi=100)
    plt.close(fig)
