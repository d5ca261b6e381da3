"""An order-independent checksum of a table's rows, computed the same way over Arrow data
from Spark (`spark_checksum`) and from ClickHouse (`clickhouse_checksum`), for tests and the
quickstart's proof of exactly-once.

Every value is reduced to 64 bits by its *logical* value, so the two engines' Arrow types may
differ in width or flavour: integers of any width (signed/unsigned, also booleans, dates as
days) by value, floating point by its float64 bits (one NaN), strings and binaries by their
bytes, timestamps by microseconds since the epoch (any unit, any zone), decimals by their
text. NULL is its own value. A row hashes its columns with their positions; the checksum is
the row count and the sum of the row hashes modulo 2^64, so row order and partitioning do not
matter, while a missing, duplicated or changed row does. Nested types are not supported.
"""

import urllib.parse
import urllib.request

import numpy as np

_M64 = (1 << 64) - 1
_NULL = np.uint64(0x6A09E667F3BCC908)
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(x):
    """splitmix64's finalizer over a uint64 array (wrapping arithmetic)."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x += np.uint64(_GOLDEN)
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def _bytes_hash(arr):
    """Per-row hash of a (large_)binary array by its bytes and length."""
    import pyarrow as pa

    arr = arr.cast(pa.large_binary())
    n = len(arr)
    _, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[arr.offset:arr.offset + n + 1]
    first, last = int(offsets[0]), int(offsets[-1])
    data = np.frombuffer(data_buf, dtype=np.uint8)[first:last] if data_buf is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    starts = offsets[:-1] - first
    # byte value with its position inside its row, mixed, then summed per row
    positions = np.arange(len(data), dtype=np.int64) - np.repeat(starts, lengths)
    v = _mix(data.astype(np.uint64) | (positions.astype(np.uint64) << np.uint64(8)))
    cums = np.concatenate([np.zeros(1, np.uint64), np.cumsum(v, dtype=np.uint64)])
    with np.errstate(over="ignore"):
        sums = cums[starts + lengths] - cums[starts]
        return _mix(sums ^ _mix(lengths.astype(np.uint64)))


def _column_hash(arr):
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.types as t

    if t.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    typ = arr.type
    nulls = arr.is_null().to_numpy(zero_copy_only=False) if arr.null_count else None
    if t.is_null(typ):
        return np.full(len(arr), _NULL, dtype=np.uint64)
    if t.is_string(typ) or t.is_large_string(typ) or t.is_binary(typ) or t.is_large_binary(typ) \
            or t.is_fixed_size_binary(typ) or getattr(t, "is_string_view", lambda _: False)(typ) \
            or getattr(t, "is_binary_view", lambda _: False)(typ):
        h = _bytes_hash(arr.cast(pa.large_binary()) if not t.is_large_binary(typ) else arr)
    elif t.is_decimal(typ):
        h = _bytes_hash(pc.cast(arr, pa.large_string()).cast(pa.large_binary()))
    elif t.is_timestamp(typ):
        micros = arr.cast(pa.timestamp("us", typ.tz)).cast(pa.int64())
        h = _mix(pc.fill_null(micros, 0).to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64))
    elif t.is_floating(typ):
        values = pc.fill_null(arr.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False).astype(np.float64)
        values = np.where(np.isnan(values), np.nan, values)
        h = _mix(values.view(np.uint64))
    elif t.is_boolean(typ) or t.is_integer(typ) or t.is_date(typ):
        if t.is_date64(typ):
            arr = arr.cast(pa.date32())
        if t.is_date(typ):
            arr = arr.cast(pa.int32())
        if t.is_boolean(typ):
            arr = arr.cast(pa.int8())
        values = pc.fill_null(arr, 0).to_numpy(zero_copy_only=False)
        if t.is_unsigned_integer(arr.type):
            h = _mix(values.astype(np.uint64))
        else:
            h = _mix(values.astype(np.int64).view(np.uint64))
    else:
        raise TypeError(f"checksum: unsupported Arrow type {typ}")
    if nulls is not None:
        h = np.where(nulls, _NULL, h)
    return h


def batch_checksum(batch):
    """(rows, sum of row hashes mod 2^64) of one Arrow RecordBatch (or Table)."""
    n = batch.num_rows
    if n == 0:
        return 0, 0
    acc = np.zeros(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i, column in enumerate(batch.columns):
            if hasattr(column, "combine_chunks"):
                column = column.combine_chunks()
            acc += _mix(_column_hash(column) + np.uint64((i + 1) * 0x100000001B3 & _M64))
        row_hashes = _mix(acc)
    return n, int(row_hashes.sum(dtype=np.uint64))


class Checksum:
    """Rows and the order-independent sum; combine with ``+``; compare with ``==``."""

    def __init__(self, rows=0, total=0):
        self.rows = rows
        self.total = total & _M64

    def __add__(self, other):
        return Checksum(self.rows + other.rows, self.total + other.total)

    def __eq__(self, other):
        return isinstance(other, Checksum) and (self.rows, self.total) == (other.rows, other.total)

    def __hash__(self):
        return hash((self.rows, self.total))

    def __repr__(self):
        return f"Checksum(rows={self.rows}, sum={self.hex})"

    @property
    def hex(self):
        return f"{self.total:016x}"


def batches_checksum(batches):
    total = Checksum()
    for batch in batches:
        total = total + Checksum(*batch_checksum(batch))
    return total


def spark_checksum(df):
    """The checksum of a Spark DataFrame's rows (all columns, in the DataFrame's order), by
    one Spark job (mapInArrow)."""
    import warnings

    def partial(batches):
        import pyarrow as pa

        c = batches_checksum(batches)
        yield pa.RecordBatch.from_pylist([{"rows": c.rows, "total": str(c.total)}],
                                         schema=pa.schema([("rows", pa.int64()), ("total", pa.string())]))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        parts = df.mapInArrow(partial, "rows LONG, total STRING").collect()
    result = Checksum()
    for row in parts:
        result = result + Checksum(row.rows, int(row.total))
    return result


def clickhouse_checksum(url, query, user=None, password=None, timeout=300):
    """The checksum of a ClickHouse query's result (e.g. ``SELECT id, ts, ... FROM db.t``:
    name the columns in the Spark DataFrame's order), read as an Arrow stream over HTTP."""
    import pyarrow as pa

    params = {"query": query + " FORMAT ArrowStream", "output_format_arrow_string_as_string": "1",
              "output_format_arrow_low_cardinality_as_dictionary": "0"}
    request = urllib.request.Request(url.rstrip("/") + "/?" + urllib.parse.urlencode(params), method="POST", data=b"")
    if user:
        request.add_header("X-ClickHouse-User", user)
    if password:
        request.add_header("X-ClickHouse-Key", password)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read()  # whole: the IPC reader needs full reads (fine for test sizes)
    if not body:
        return Checksum()
    return batches_checksum(pa.ipc.open_stream(pa.BufferReader(body)))
