package chpart.spark;

import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.ByteType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DateType;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.DoubleType;
import org.apache.spark.sql.types.FloatType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.ShortType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampNTZType;
import org.apache.spark.sql.types.TimestampType;

/**
 * The {@code CREATE TABLE} that save modes errorifexists and ignore run when the table does not
 * exist: columns from the Spark schema (the mapping below, documented in the README; every type
 * it produces is one chpart's input check accepts for the Arrow type Spark streams), engine and
 * keys from the options {@code engine}, {@code order_by}, {@code partition_by}, {@code
 * primary_key}, {@code settings}. Pure: tested through the real-Spark tests.
 */
final class TableDdl {
  private TableDdl() {}

  static String createTable(String database, String table, StructType schema, ChpartOptions options) {
    if (options.orderBy == null) {
      throw new IllegalArgumentException("chpart data source: the table " + database + "." + table
          + " does not exist and creating it needs option order_by (the ORDER BY expression, e.g. \"(kind, id)\""
          + " or \"tuple()\"); also engine (default MergeTree), partition_by, primary_key, settings");
    }
    if (schema.fields().length == 0) {
      throw new IllegalArgumentException("chpart data source: cannot create " + database + "." + table
          + " without columns");
    }
    List<String> columns = new ArrayList<>();
    List<String> problems = new ArrayList<>();
    for (StructField f : schema.fields()) {
      try {
        columns.add(ClickHouseHttp.quote(f.name()) + " " + column(f.dataType(), f.nullable()));
      } catch (IllegalArgumentException e) {
        problems.add("column " + f.name() + ": " + e.getMessage());
      }
    }
    if (!problems.isEmpty()) {
      throw new IllegalArgumentException("chpart data source: cannot create " + database + "." + table + ": "
          + String.join("; ", problems));
    }
    StringBuilder sql = new StringBuilder("CREATE TABLE ")
        .append(ClickHouseHttp.quote(database)).append('.').append(ClickHouseHttp.quote(table))
        .append(" (").append(String.join(", ", columns)).append(") ENGINE = ").append(options.engine);
    if (options.partitionBy != null) {
      sql.append(" PARTITION BY ").append(options.partitionBy);
    }
    if (options.primaryKey != null) {
      sql.append(" PRIMARY KEY ").append(options.primaryKey);
    }
    sql.append(" ORDER BY ").append(options.orderBy);
    if (options.settings != null) {
      sql.append(" SETTINGS ").append(options.settings);
    }
    return sql.toString();
  }

  /** A top-level column: Nullable(T) for a nullable scalar (ClickHouse has no Nullable(Array) etc.). */
  static String column(DataType type, boolean nullable) {
    String t = type(type);
    boolean composite = type instanceof ArrayType || type instanceof MapType || type instanceof StructType;
    return nullable && !composite ? "Nullable(" + t + ")" : t;
  }

  static String type(DataType type) {
    if (type instanceof LongType) {
      return "Int64";
    } else if (type instanceof IntegerType) {
      return "Int32";
    } else if (type instanceof ShortType) {
      return "Int16";
    } else if (type instanceof ByteType) {
      return "Int8";
    } else if (type instanceof DoubleType) {
      return "Float64";
    } else if (type instanceof FloatType) {
      return "Float32";
    } else if (type instanceof DecimalType) {
      DecimalType d = (DecimalType) type;
      return "Decimal(" + d.precision() + ", " + d.scale() + ")";
    } else if (type instanceof StringType || type instanceof BinaryType) {
      return "String";
    } else if (type instanceof BooleanType) {
      return "Bool";
    } else if (type instanceof DateType) {
      return "Date32";
    } else if (type instanceof TimestampType || type instanceof TimestampNTZType) {
      return "DateTime64(6, 'UTC')";
    } else if (type instanceof ArrayType) {
      ArrayType a = (ArrayType) type;
      return "Array(" + column(a.elementType(), a.containsNull()) + ")";
    } else if (type instanceof MapType) {
      MapType m = (MapType) type;
      return "Map(" + type(m.keyType()) + ", " + column(m.valueType(), m.valueContainsNull()) + ")";
    } else if (type instanceof StructType) {
      List<String> fields = new ArrayList<>();
      for (StructField f : ((StructType) type).fields()) {
        fields.add(ClickHouseHttp.quote(f.name()) + " " + column(f.dataType(), f.nullable()));
      }
      return "Tuple(" + String.join(", ", fields) + ")";
    }
    throw new IllegalArgumentException("Spark type " + type.simpleString()
        + " has no ClickHouse column type chpart loads (see the README's mapping)");
  }
}
