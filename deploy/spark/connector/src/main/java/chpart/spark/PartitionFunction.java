package chpart.spark;

import java.time.DayOfWeek;
import java.time.Instant;
import java.time.LocalDate;
import java.time.ZoneId;
import java.time.ZonedDateTime;
import java.time.temporal.ChronoUnit;
import java.time.temporal.TemporalAdjusters;
import java.util.Arrays;
import java.util.Locale;
import java.util.Map;
import java.util.function.Function;
import java.util.stream.Collectors;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.functions.BoundFunction;
import org.apache.spark.sql.connector.catalog.functions.ScalarFunction;
import org.apache.spark.sql.connector.catalog.functions.UnboundFunction;
import org.apache.spark.sql.types.ByteType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.DateType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.ShortType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * ClickHouse's partition-key functions as Spark functions, so that a write can ask Spark to
 * cluster its rows by the table's partition value itself ({@code Distributions.clustered} over
 * {@code chpart_toYYYYMMDD(ts, 'UTC')}), which puts each table partition in exactly one task.
 * Spark finds them through the table's catalog ({@link ChpartCatalog} is a {@code
 * FunctionCatalog}), see {@link Layout}.
 *
 * <p>What a layout needs is that two rows get the same value here exactly when ClickHouse gives
 * them the same partition value; the values themselves mirror ClickHouse's (toYYYYMMDD 20260101,
 * toDate a DATE, toStartOfHour the hour's first instant as a TIMESTAMP). Time functions take the
 * time zone ClickHouse applies (the column type's, else the server's) as a string argument;
 * {@code intDiv} and {@code modulo} take the constant divisor. Inputs: Spark TIMESTAMP (an
 * instant, as chpart loads it into DateTime and DateTime64) and DATE for the time functions,
 * integers for the arithmetic ones; NULL gives NULL.
 */
final class PartitionFunction implements UnboundFunction {
  /** The prefix of the functions' names in the catalog, so they never shadow anyone's. */
  static final String PREFIX = "chpart_";

  enum Kind {
    TO_YYYYMMDD("toYYYYMMDD", DataTypes.IntegerType),
    TO_YYYYMM("toYYYYMM", DataTypes.IntegerType),
    TO_YEAR("toYear", DataTypes.IntegerType),
    TO_DATE("toDate", DataTypes.DateType),
    TO_MONDAY("toMonday", DataTypes.DateType),
    TO_START_OF_MONTH("toStartOfMonth", DataTypes.DateType),
    TO_START_OF_DAY("toStartOfDay", DataTypes.TimestampType),
    TO_START_OF_HOUR("toStartOfHour", DataTypes.TimestampType),
    INT_DIV("intDiv", DataTypes.LongType),
    MODULO("modulo", DataTypes.LongType);

    final String clickhouse;
    final DataType result;

    Kind(String clickhouse, DataType result) {
      this.clickhouse = clickhouse;
      this.result = result;
    }

    boolean arithmetic() {
      return this == INT_DIV || this == MODULO;
    }

    String sparkName() {
      return PREFIX + clickhouse.toLowerCase(Locale.ROOT);
    }
  }

  /** By ClickHouse name (as written in a key, case-sensitive as ClickHouse's are). */
  static final Map<String, Kind> BY_CLICKHOUSE_NAME =
      Arrays.stream(Kind.values()).collect(Collectors.toUnmodifiableMap(k -> k.clickhouse, Function.identity()));
  /** By catalog name ({@code chpart_toyyyymmdd}; Spark may hand identifiers over lowercased). */
  static final Map<String, Kind> BY_SPARK_NAME =
      Arrays.stream(Kind.values()).collect(Collectors.toUnmodifiableMap(Kind::sparkName, Function.identity()));

  private final Kind kind;

  PartitionFunction(Kind kind) {
    this.kind = kind;
  }

  @Override
  public String name() {
    return kind.sparkName();
  }

  @Override
  public String description() {
    return kind.arithmetic()
        ? "ClickHouse's " + kind.clickhouse + "(integer, constant): the partition value, as the table computes it"
        : "ClickHouse's " + kind.clickhouse + "(timestamp or date, time zone): the partition value, as the table"
            + " computes it";
  }

  @Override
  public BoundFunction bind(StructType input) {
    if (input.fields().length != 2) {
      throw new UnsupportedOperationException(name() + " takes 2 arguments; got " + input.simpleString());
    }
    DataType arg = input.fields()[0].dataType();
    DataType second = input.fields()[1].dataType();
    if (kind.arithmetic()) {
      if (!(integral(arg) && second instanceof LongType)) {
        throw new UnsupportedOperationException(name() + " takes (integer, bigint); got " + input.simpleString());
      }
    } else if (!((arg instanceof TimestampType || arg instanceof DateType) && second instanceof StringType)) {
      throw new UnsupportedOperationException(name() + " takes (timestamp or date, string); got "
          + input.simpleString());
    }
    return new Bound(kind, arg, second);
  }

  static boolean integral(DataType t) {
    return t instanceof ByteType || t instanceof ShortType || t instanceof IntegerType || t instanceof LongType;
  }

  /** The function over one input type. */
  static final class Bound implements ScalarFunction<Object> {
    private static final long serialVersionUID = 1L;
    private final Kind kind;
    private final DataType arg;
    private final DataType second;
    private transient UTF8String zoneName;
    private transient ZoneId zone;

    Bound(Kind kind, DataType arg, DataType second) {
      this.kind = kind;
      this.arg = arg;
      this.second = second;
    }

    @Override
    public DataType[] inputTypes() {
      return new DataType[] {arg, second};
    }

    @Override
    public DataType resultType() {
      return kind.result;
    }

    @Override
    public String name() {
      return kind.sparkName();
    }

    @Override
    public String canonicalName() {
      return "chpart." + kind.sparkName() + "(" + arg.typeName() + ")";
    }

    @Override
    public Object produceResult(InternalRow row) {
      if (row.isNullAt(0) || row.isNullAt(1)) {
        return null;
      }
      if (kind.arithmetic()) {
        long value = arg instanceof LongType ? row.getLong(0)
            : arg instanceof IntegerType ? row.getInt(0)
            : arg instanceof ShortType ? row.getShort(0) : row.getByte(0);
        return arithmetic(kind, value, row.getLong(1));
      }
      UTF8String name = row.getUTF8String(1);
      if (!name.equals(zoneName)) {
        zone = ZoneId.of(name.toString());
        zoneName = name.clone();
      }
      return arg instanceof TimestampType ? ofInstant(kind, row.getLong(0), zone) : ofDate(kind, row.getInt(0), zone);
    }
  }

  /** ClickHouse's intDiv and modulo of integers: both truncate towards zero, as C does. */
  static Object arithmetic(Kind kind, long value, long divisor) {
    if (divisor == 0) {
      return null; // ClickHouse refuses the table; never asked for (Layout maps nonzero constants)
    }
    return kind == Kind.INT_DIV ? value / divisor : value % divisor;
  }

  /** The function of a Spark TIMESTAMP (microseconds since the epoch) in time zone {@code zone}. */
  static Object ofInstant(Kind kind, long micros, ZoneId zone) {
    ZonedDateTime t = Instant.ofEpochSecond(Math.floorDiv(micros, 1_000_000L)).atZone(zone);
    if (kind == Kind.TO_START_OF_HOUR) {
      // The hour's first instant: in an hour repeated by a DST change each pass is its own hour.
      return t.truncatedTo(ChronoUnit.HOURS).toEpochSecond() * 1_000_000L;
    }
    return ofLocalDate(kind, t.toLocalDate(), zone);
  }

  /** The function of a Spark DATE (days since the epoch). */
  static Object ofDate(Kind kind, int days, ZoneId zone) {
    LocalDate d = LocalDate.ofEpochDay(days);
    if (kind == Kind.TO_START_OF_HOUR) {
      return d.atStartOfDay(zone).toEpochSecond() * 1_000_000L;
    }
    return ofLocalDate(kind, d, zone);
  }

  private static Object ofLocalDate(Kind kind, LocalDate d, ZoneId zone) {
    switch (kind) {
      case TO_YYYYMMDD:
        return d.getYear() * 10000 + d.getMonthValue() * 100 + d.getDayOfMonth();
      case TO_YYYYMM:
        return d.getYear() * 100 + d.getMonthValue();
      case TO_YEAR:
        return d.getYear();
      case TO_DATE:
        return (int) d.toEpochDay();
      case TO_MONDAY:
        return (int) d.with(TemporalAdjusters.previousOrSame(DayOfWeek.MONDAY)).toEpochDay();
      case TO_START_OF_MONTH:
        return (int) d.withDayOfMonth(1).toEpochDay();
      case TO_START_OF_DAY:
        return d.atStartOfDay(zone).toEpochSecond() * 1_000_000L;
      default:
        throw new IllegalStateException("not a time function: " + kind);
    }
  }
}
