package chpart.spark;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;
import org.apache.spark.sql.RuntimeConfig;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.analysis.NoSuchFunctionException;
import org.apache.spark.sql.catalyst.analysis.NoSuchTableException;
import org.apache.spark.sql.catalyst.analysis.TableAlreadyExistsException;
import org.apache.spark.sql.connector.catalog.FunctionCatalog;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCatalog;
import org.apache.spark.sql.connector.catalog.TableChange;
import org.apache.spark.sql.connector.catalog.TableInfo;
import org.apache.spark.sql.connector.catalog.functions.UnboundFunction;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * ClickHouse tables as a Spark catalog ({@code spark.sql.catalog.chpart = chpart.spark.ChpartCatalog}
 * with {@code spark.sql.catalog.chpart.config = /etc/chpart/chpart.toml}): identifiers are {@code
 * database.table}. It is what gives {@code format("chpart")} Spark's create save modes (the data
 * source names it through {@code SupportsCatalogOptions}, registering one per config if the user
 * did not) and {@code df.writeTo("chpart.db.events")}.
 *
 * <p>Spark decides the save mode from {@link #tableExists}: errorifexists on an existing table
 * fails and ignore does nothing, before the query runs; otherwise {@link #createTable} is asked.
 * The CREATE TABLE needs the write's options (engine, order_by, ...), which Spark's DataFrameWriter
 * does not pass to createTable, so unless they are among its properties the table is created by
 * the write itself, on the driver, before {@code chpart begin} (ChpartWriteBuilder). A table is
 * never dropped: Spark drops a table whose CTAS failed, and chpart's failed load leaves nothing
 * visible in it (or, if its commit began, must be resumed, not dropped).
 *
 * <p>It is also a {@code FunctionCatalog} of ClickHouse's partition-key functions ({@link
 * PartitionFunction}: {@code chpart_toyyyymmdd}, ...): Spark resolves the functions a write's
 * required distribution names in the catalog the table came from, which is how a write into a
 * table of this catalog gets clustered by {@code toYYYYMMDD(ts)} itself (see {@link Layout}).
 */
public final class ChpartCatalog implements TableCatalog, FunctionCatalog {
  private static final Logger LOG = LoggerFactory.getLogger(ChpartCatalog.class);
  private static final String PREFIX = "spark.sql.catalog.";

  private String name;
  private Map<String, String> options;

  @Override
  public void initialize(String name, CaseInsensitiveStringMap options) {
    this.name = name;
    this.options = new LinkedHashMap<>(options.asCaseSensitiveMap());
    options("db.t"); // validated now: a catalog without config fails when it is first used
  }

  @Override
  public String name() {
    return name;
  }

  /**
   * The catalog {@code format("chpart")} uses for these options: {@code chpart_<12 hex>} of the
   * config file, binary, env.* and config-key options, registered in the session's conf unless it is there.
   */
  static String register(SparkSession session, ChpartOptions o) {
    TreeMap<String, String> conf = new TreeMap<>();
    if (o.config != null) {
      conf.put("config", o.config);
    }
    if (o.chpart != null) { // else the jar's own binary, which the catalog's options resolve to again
      conf.put("chpart", o.chpart);
    }
    // Config keys given as options (spark.chpart.* conf reaches the catalog by itself).
    o.origins.forEach((key, origin) -> {
      if (origin.startsWith("option ")) {
        conf.put(key, o.configKeys.get(key));
      }
    });
    o.env.forEach((k, v) -> conf.put(ChpartOptions.ENV_PREFIX + k, v));
    String name = "chpart_" + sha256(conf.toString()).substring(0, 12);
    RuntimeConfig runtime = session.conf();
    if (!runtime.contains(PREFIX + name)) {
      conf.forEach((k, v) -> runtime.set(PREFIX + name + "." + k, v));
      runtime.set(PREFIX + name, ChpartCatalog.class.getName());
    }
    return name;
  }

  private ChpartOptions options(String table) {
    Map<String, String> given = new LinkedHashMap<>(options);
    given.put("table", table);
    return ChpartOptions.of(Map.of(), given);
  }

  private static String table(Identifier ident) {
    if (ident.namespace().length != 1) {
      throw new IllegalArgumentException("chpart catalog: a table is database.table; got " + ident);
    }
    return ident.namespace()[0] + "." + ident.name();
  }

  private Map<String, String> properties(String table) {
    Map<String, String> props = new LinkedHashMap<>(options);
    props.put("table", table);
    return props;
  }

  @Override
  public Table loadTable(Identifier ident) throws NoSuchTableException {
    String table = table(ident);
    ChpartOptions o = options(table);
    if (!o.clickhouse().tableExists(o.database(), o.tableName())) {
      throw new NoSuchTableException(ident);
    }
    return ChpartTable.ofCatalog(properties(table), false);
  }

  /** The query's nullability, not all-nullable columns (a Nullable column cannot be in ORDER BY). */
  @Override
  public boolean useNullableQuerySchema() {
    return false;
  }

  @Override
  public Table createTable(Identifier ident, TableInfo info) throws TableAlreadyExistsException {
    String table = table(ident);
    Transform[] partitions = info.partitions();
    Map<String, String> properties = info.properties();
    if (partitions.length > 0) {
      throw new IllegalArgumentException("chpart catalog: Spark partitioning (partitionBy, PARTITIONED BY) is not"
          + " ClickHouse's: give option partition_by (a ClickHouse expression, e.g. \"toYYYYMMDD(ts)\")");
    }
    Map<String, String> props = properties(table);
    // Spark's own keys (provider, owner) among the properties are not options: of() drops them.
    Map<String, String> given = new LinkedHashMap<>(props);
    given.putAll(properties);
    ChpartOptions o = ChpartOptions.of(given, Map.of());
    if (o.orderBy == null) {
      // The DataFrameWriter's CTAS: its options reach the write only (see the class comment).
      LOG.info("chpart catalog: {} will be created by the write, from its options", table);
      return ChpartTable.ofCatalog(props, true);
    }
    create(o, info.schema());
    return ChpartTable.ofCatalog(props, false);
  }

  /** CREATE TABLE (never IF NOT EXISTS: a table made meanwhile by someone else is an error). */
  static void create(ChpartOptions o, StructType schema) {
    String ddl = TableDdl.createTable(o.database(), o.tableName(), schema, o);
    LOG.info("chpart: creating the ClickHouse table {}: {}", o.table, ddl);
    o.clickhouse().query(ddl);
  }

  @Override
  public Identifier[] listTables(String[] namespace) {
    if (namespace.length != 1) {
      return new Identifier[0];
    }
    ChpartOptions o = options(namespace[0] + ".t");
    String out = o.clickhouse().query("SELECT name FROM system.tables WHERE database = '"
        + namespace[0].replace("\\", "\\\\").replace("'", "\\'") + "' ORDER BY name");
    List<Identifier> ids = new ArrayList<>();
    for (String line : out.split("\n")) {
      if (!line.isBlank()) {
        ids.add(Identifier.of(namespace, line.strip()));
      }
    }
    return ids.toArray(new Identifier[0]);
  }

  @Override
  public Table alterTable(Identifier ident, TableChange... changes) {
    throw new UnsupportedOperationException("chpart catalog: ALTER TABLE is not supported; alter " + ident
        + " in ClickHouse");
  }

  @Override
  public boolean dropTable(Identifier ident) {
    LOG.warn("chpart catalog: not dropping {} (chpart never drops ClickHouse tables; a failed load left nothing"
        + " visible in it, or its commit must be resumed)", ident);
    return false;
  }

  @Override
  public void renameTable(Identifier oldIdent, Identifier newIdent) {
    throw new UnsupportedOperationException("chpart catalog: RENAME is not supported; rename " + oldIdent
        + " in ClickHouse");
  }

  @Override
  public Identifier[] listFunctions(String[] namespace) {
    if (namespace.length != 0) {
      return new Identifier[0];
    }
    return PartitionFunction.BY_SPARK_NAME.keySet().stream().sorted().map(n -> Identifier.of(namespace, n))
        .toArray(Identifier[]::new);
  }

  @Override
  public UnboundFunction loadFunction(Identifier ident) throws NoSuchFunctionException {
    PartitionFunction.Kind kind = ident.namespace().length == 0
        ? PartitionFunction.BY_SPARK_NAME.get(ident.name().toLowerCase(Locale.ROOT)) : null;
    if (kind == null) {
      throw new NoSuchFunctionException(ident);
    }
    return new PartitionFunction(kind);
  }

  static String sha256(String text) {
    try {
      return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(text.getBytes(StandardCharsets.UTF_8)));
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }
}
