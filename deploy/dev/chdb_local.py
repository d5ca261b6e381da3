"""A `clickhouse-local` command backed by the ClickHouse 26.9 engine of PyPI `chdb-core`.

No modern clickhouse-server/clickhouse-local package is reachable from this kind of machine, but
chdb-core compiles the same engine (MergeTree writer, SQL, formats) into a Python extension. This
script accepts the subset of the real clickhouse-local's command line that chpart uses, so chpart
shells out to a `clickhouse-local`-shaped command and works unchanged with the real binary in
production. The subset (keep README.md in step):

    --path DIR             persistent data directory (default: an in-memory session)
    --query SQL, -q SQL    one or more ';'-separated statements
    --queries-file FILE    statements read from FILE
    --structure S, -S S    column list of the input table, e.g. 'a UInt64, b String'
    --input-format F       format of the input data (default TabSeparated)
    --table NAME, -N NAME  name of the input table (default `table`)
    --file PATH, -F PATH   input file (default '-' = stdin)
    --output-format F      format of query results on stdout (default TabSeparated)
    --format F, -f F       sets both input and output format (as the real one does)
    --multiquery, -n       accepted for compatibility (multi-statement queries always work)
    --version, -V          prints the engine version
    --<setting>=<value>    any ClickHouse setting, applied with SET before the queries

An input table is created only when --structure, --file or --input-format is given, like the real
command. On error the server's message (`Code: N. DB::Exception: ...`) goes to stderr and the exit
status is N % 256 (1 when that would be 0), again like the real clickhouse-local.
"""

import os
import re
import sys

USAGE = "usage: clickhouse-local [--path DIR] [--structure S --input-format F --table T --file P] --query SQL"
VALUE_FLAGS = {
    "--path": "path",
    "--query": "query",
    "-q": "query",
    "--queries-file": "queries_file",
    "--structure": "structure",
    "-S": "structure",
    "--input-format": "input_format",
    "--table": "table",
    "-N": "table",
    "--file": "file",
    "-F": "file",
    "--output-format": "output_format",
    "--format": "format",
    "-f": "format",
}
SETTING = re.compile(r"^--([a-z][a-z0-9_]*)=(.*)$", re.S)


def fail(message, status=2):
    sys.stderr.write(f"clickhouse-local (chdb): {message}\n")
    sys.exit(status)


def parse(argv):
    opts = {"settings": []}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, inline = (arg.split("=", 1) + [None])[:2] if arg.startswith("--") else (arg, None)
        if name in VALUE_FLAGS:
            if inline is None:
                i += 1
                if i >= len(argv):
                    fail(f"option {name} needs a value\n{USAGE}")
                inline = argv[i]
            opts[VALUE_FLAGS[name]] = inline
        elif arg in ("--multiquery", "-n"):
            pass
        elif arg in ("--version", "-V"):
            opts["version"] = True
        elif arg in ("--help", "-h"):
            print(__doc__)
            sys.exit(0)
        elif SETTING.match(arg):
            key, value = SETTING.match(arg).groups()
            opts["settings"].append((key, value))
        else:
            fail(f"unsupported argument {arg!r}; this chdb-backed clickhouse-local supports the subset "
                 f"listed in deploy/dev/chdb_local.py\n{USAGE}")
        i += 1
    return opts


def quote(text):
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def engine():
    """chdb-core's engine extension (`chdb._chdb`), loaded on its own.

    `import chdb` costs three times what the engine does: its package imports numpy and pyarrow
    (through chdb.dbapi and chdb.state) and runs a version query in a throw-away session, about
    0.8 CPU s per start against 0.25 s for the extension alone. Every build runs this command
    (once per session; the version query runs first in the build's own session), so that
    start-up is most of a small build's cost. The extension is loaded the way chdb's own
    `__init__` loads it (pinned chdb-core 26.9.0): preloaded with RTLD_DEEPBIND from its
    directory, then imported. Its connection's `query(sql, format)` is what
    `chdb.connect(...).query` calls; errors are the same RuntimeError with the server's `Code: N`
    message. Where the layout differs (another chdb-core), the public package is used instead.
    """
    import importlib.machinery
    import importlib.util

    try:
        spec = importlib.util.find_spec("chdb")
        package_dir = os.path.dirname(spec.origin)
        library = os.path.join(package_dir, "_chdb.abi3.so")
        if not os.path.isfile(library):
            raise ImportError(library)
        cwd = os.getcwd()
        os.chdir(package_dir)
        try:
            if sys.platform == "linux":
                import ctypes

                ctypes.CDLL(library, mode=sys.getdlopenflags() | 0x8)  # RTLD_DEEPBIND
            loader = importlib.machinery.ExtensionFileLoader("chdb._chdb", library)
            module = importlib.util.module_from_spec(importlib.util.spec_from_loader("chdb._chdb", loader))
            loader.exec_module(module)
        finally:
            os.chdir(cwd)
        return module.connect
    except (ImportError, AttributeError, OSError):
        import chdb

        return chdb.connect


def main():
    opts = parse(sys.argv[1:])
    connect = engine()  # loaded after parsing so that usage errors are instant

    if opts.get("version"):
        conn = connect(":memory:")
        try:
            version = conn.query("SELECT version()", "TabSeparated").bytes().decode().strip()
        finally:
            conn.close()
        from importlib.metadata import version as package_version

        print(f"ClickHouse local version {version} (chdb-core {package_version('chdb-core')}).")
        return 0
    query = opts.get("query")
    if opts.get("queries_file"):
        with open(opts["queries_file"], encoding="utf-8") as f:
            query = f.read() if query is None else query + ";\n" + f.read()
    if not query:
        fail(f"no query given\n{USAGE}")

    fmt = opts.get("format")
    input_format = opts.get("input_format") or fmt or "TabSeparated"
    output_format = opts.get("output_format") or fmt or "TabSeparated"
    statements = [f"SET {key} = {quote(value)}" for key, value in opts["settings"]]
    if any(k in opts for k in ("structure", "file", "input_format")):
        source = opts.get("file") or "-"
        # stdin is the `stdin` keyword (the descriptor itself), as in the real clickhouse-local.
        # Note: the 26.9 engine's ArrowStream reader seeks in its input, which fails on a pipe
        # for multi-batch streams ("Cannot seek through file (fd = 0)"); chpart therefore
        # spools Arrow streams into its work dir and passes a file (crates/protocol build.rs).
        source = "stdin" if source in ("-", "stdin") else quote(os.path.abspath(source))
        columns = f"({opts['structure']})" if opts.get("structure") else ""
        table = opts.get("table") or "table"
        statements.append(
            f"CREATE TEMPORARY TABLE `{table}` {columns} ENGINE = File({input_format}, {source})"
        )

    path = opts.get("path")
    if path:
        os.makedirs(path, exist_ok=True)
    conn = connect(path if path else ":memory:")
    try:
        for statement in statements:
            conn.query(statement)
        result = conn.query(query, output_format)
        out = result.bytes() if hasattr(result, "bytes") else bytes(result)
        if out:
            sys.stdout.buffer.write(out)
            sys.stdout.buffer.flush()
    except Exception as e:  # chdb raises ChdbError carrying the server's "Code: N. DB::Exception: ..."
        message = str(e).strip()
        sys.stderr.write(message + "\n")
        code = re.search(r"Code: (\d+)", message)
        status = int(code.group(1)) % 256 if code else 1
        return status or 1
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
