package chpart.spark;

import java.io.File;
import java.io.Serializable;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.regex.Pattern;

/**
 * The options of a write, validated once on the driver before anything runs (an unknown option is
 * an error: a misspelt {@code visiblity} must not be ignored). Names mirror {@code
 * chpart_spark.write}'s arguments.
 *
 * <pre>
 *   table         db.table (required)
 *   config        a chpart config file on the driver (optional; see ChpartConfig)
 *   section.key   a chpart config key, e.g. clickhouse.url, staging.root, transport.kind,
 *                 clickhouse_local.command; wins over Spark conf spark.chpart.section.key,
 *                 which wins over the file (ChpartConfig). Secrets are refused.
 *   chpart        the chpart binary (default: $CHPART_BIN, else the one the jar carries, else
 *                 `chpart` on PATH; see {@link #chpart})
 *   load          the load id (default: new per write, see {@link #load})
 *   visibility    partition (default) | part
 *   verify        auto (default) | server | full | sizes
 *   winners_path  where the winners' manifests are written (default: a temp file)
 *   env.NAME      a variable added to the environment of every chpart run
 *   overwrite     partitions (default): mode("overwrite") replaces exactly the partitions written;
 *                 table: the whole table, swapped at once (chpart's overwrite mode, an Atomic
 *                 database)
 *   engine, order_by, partition_by, primary_key, settings
 *                 the CREATE TABLE of save modes errorifexists / ignore (TableDdl)
 *   layout        table (default: Spark clusters the rows by the table's partition key, Layout) | none
 *   target_part_bytes
 *                 with layout table: Spark's advisory size of each task's share of the shuffle,
 *                 in bytes (DSv2 advisoryPartitionSizeInBytes): adaptive execution splits a table
 *                 partition larger than this over several tasks (a part each) and coalesces small
 *                 ones (default: unset, every table partition in one task, one part)
 * </pre>
 */
final class ChpartOptions implements Serializable {
  private static final long serialVersionUID = 1L;

  static final Pattern ID = Pattern.compile("^(?!\\.|-)(?!.*\\.\\.)[A-Za-z0-9._-]{1,128}$");
  static final List<String> VISIBILITIES = List.of("partition", "part");
  static final List<String> VERIFIES = List.of("auto", "server", "full", "sizes");
  static final String ENV_PREFIX = "env.";
  static final Set<String> KNOWN =
      Set.of("table", "config", "chpart", "load", "visibility", "verify", "winners_path", "overwrite", "engine",
          "order_by", "partition_by", "primary_key", "settings", "layout", "target_part_bytes");
  static final List<String> LAYOUTS = List.of("table", "none");
  static final List<String> OVERWRITES = List.of("partitions", "table");
  /**
   * Keys Spark itself puts among a table's properties (a SQL table of the session catalog:
   * provider, owner, and its managed location as path); they are not chpart options. In a
   * write's own options they are refused like any unknown key (save("/some/path") writes nothing
   * to that path).
   */
  static final Set<String> SPARK_TABLE_KEYS =
      Set.of("provider", "owner", "location", "comment", "external", "path", "is_managed_location");
  /**
   * Options of Spark's DataStreamWriter itself ({@code option("checkpointLocation", ...)},
   * {@code queryName(...)}), which it passes to a streaming sink with the user's, both as the
   * table's properties and as the write's options; they are not chpart options.
   */
  static final Set<String> STREAM_WRITER_KEYS = Set.of("checkpointlocation", "queryname");

  final String table;
  /** The config file (absolute), or null. */
  final String config;
  /** Config keys from spark.chpart.* conf and dotted options (options win), by dotted name. */
  final Map<String, String> configKeys;
  /** Where each of {@link #configKeys} was given, for messages. */
  final Map<String, String> origins;
  /**
   * The chpart binary: a path or a name on PATH, or null when the jar's own is run ({@link
   * #embeddedSha256}). Precedence: option chpart, then $CHPART_BIN (both as given: a name is
   * looked up on PATH), then the binary the jar carries (when it carries one for this platform),
   * then `chpart` on PATH. The jar's binary comes before PATH because it is the one built and
   * tested with this connector, and because it is the same bytes on the driver and on every
   * executor, while a PATH can name another version on each host; asking for PATH's is one
   * option away ({@code chpart=chpart}).
   */
  final String chpart;
  /** The sha256 of the jar's chpart binary when it is the one run, else null. */
  final String embeddedSha256;
  /** Null: derived per write (see ChpartBatchWrite). */
  final String load;
  final String visibility;
  final String verify;
  final String winnersPath;
  final Map<String, String> env;
  /** partitions | table (refused when an overwrite is planned, ChpartWriteBuilder). */
  final String overwrite;
  /** The CREATE TABLE's clauses (TableDdl); engine defaults to MergeTree, the rest to none. */
  final String engine;
  final String orderBy;
  final String partitionBy;
  final String primaryKey;
  final String settings;
  /** table (ask Spark for the table's distribution, Layout) | none. */
  final String layout;
  /** Advisory bytes of each write task's shuffle share (0: unset). */
  final long targetPartBytes;

  private transient Chpart resolved;

  private ChpartOptions(Map<String, String> given, Map<String, String> conf) {
    List<String> problems = new ArrayList<>();
    Map<String, String> env = new LinkedHashMap<>();
    Map<String, String> plain = new LinkedHashMap<>();
    Map<String, String> configKeys = new TreeMap<>();
    Map<String, String> origins = new TreeMap<>();
    Map<String, String> secretLooking = new TreeMap<>();
    Set<String> unknown = new TreeSet<>();
    conf.forEach((key, value) -> {
      configKeys.put(key, value);
      origins.put(key, "spark conf " + ChpartConfig.CONF_PREFIX + key);
      secretLooking.put(key, "spark conf " + ChpartConfig.CONF_PREFIX + key);
    });
    for (Map.Entry<String, String> e : given.entrySet()) {
      String key = e.getKey();
      String lower = key.toLowerCase(Locale.ROOT);
      if (lower.startsWith(ENV_PREFIX)) {
        // The variable's name keeps its case (option maps are case-insensitive, names are not).
        String name = key.substring(ENV_PREFIX.length());
        if (!name.matches("[A-Za-z_][A-Za-z0-9_]*")) {
          problems.add("option " + key + ": not an environment variable name");
        }
        env.put(name, e.getValue());
        secretLooking.put(name, "option " + key);
      } else if (KNOWN.contains(lower)) {
        plain.put(lower, e.getValue());
      } else if (key.contains(".")) {
        // A config key: chpart's schema is what knows it (ChpartConfig).
        configKeys.put(key, e.getValue());
        origins.put(key, "option " + key);
        secretLooking.put(key, "option " + key);
      } else if (ChpartConfig.looksSecret(key)) {
        secretLooking.put(key, "option " + key);
      } else {
        unknown.add(key);
      }
    }
    ChpartConfig.refuseSecrets(secretLooking, problems);
    if (!unknown.isEmpty()) {
      problems.add(
          "unknown option(s) " + unknown + "; chpart's options are " + new TreeSet<>(KNOWN)
              + ", env.<NAME> and chpart config keys <section>.<key> (e.g. clickhouse.url)");
    }
    table = plain.get("table");
    if (table == null || !table.matches("[^.\\s]+\\.[^.\\s]+")) {
      problems.add("option table must be \"database.table\"; got " + quote(table));
    }
    this.configKeys = Collections.unmodifiableMap(configKeys);
    this.origins = Collections.unmodifiableMap(origins);
    String configGiven = plain.get("config");
    if (configGiven == null || configGiven.isBlank()) {
      config = null; // the config is the conf's and options' (chpart config says what is missing)
    } else {
      config = new File(configGiven).getAbsolutePath();
      if (!Files.isReadable(Path.of(config))) {
        problems.add("option config: " + config + " is not a readable file on the driver");
      }
    }
    String named = plain.get("chpart");
    if (named == null || named.isBlank()) {
      named = System.getenv("CHPART_BIN");
    }
    if (named != null && !named.isBlank()) {
      chpart = resolveBinary(named);
      embeddedSha256 = null;
    } else {
      embeddedSha256 = EmbeddedChpart.recordedSha256();
      chpart = embeddedSha256 == null ? resolveBinary("chpart") : null;
    }
    load = plain.get("load");
    if (load != null && !ID.matcher(load).matches()) {
      problems.add(
          "option load " + quote(load)
              + " must be 1-128 of [A-Za-z0-9._-], not starting with . or -, without ..");
    }
    visibility = choice("visibility", plain.getOrDefault("visibility", "partition"), VISIBILITIES, problems);
    verify = choice("verify", plain.getOrDefault("verify", "auto"), VERIFIES, problems);
    String winners = plain.get("winners_path");
    winnersPath = winners == null ? null : new File(winners).getAbsolutePath();
    this.env = Map.copyOf(env);
    overwrite = choice("overwrite", plain.getOrDefault("overwrite", "partitions"), OVERWRITES, problems);
    engine = plain.getOrDefault("engine", "MergeTree");
    orderBy = plain.get("order_by");
    partitionBy = plain.get("partition_by");
    primaryKey = plain.get("primary_key");
    settings = plain.get("settings");
    layout = choice("layout", plain.getOrDefault("layout", "table"), LAYOUTS, problems);
    targetPartBytes = positiveLong("target_part_bytes", plain.get("target_part_bytes"), problems);
    if (targetPartBytes > 0 && layout.equals("none")) {
      problems.add("option target_part_bytes needs layout=table (with layout=none Spark keeps the job's own tasks)");
    }
    if (!problems.isEmpty()) {
      throw new IllegalArgumentException("chpart data source: " + String.join("; ", problems));
    }
  }

  /**
   * Options of one write: the table's properties (SQL {@code OPTIONS (...)}, or the DataFrame
   * writer's options that made the table), overridden by the write's own options.
   */
  static ChpartOptions of(Map<String, String> tableProperties, Map<String, String> writeOptions) {
    Map<String, String> merged = new LinkedHashMap<>();
    Map<String, String> table = new LinkedHashMap<>(tableProperties);
    table.keySet().removeIf(k -> SPARK_TABLE_KEYS.contains(k.toLowerCase(Locale.ROOT)));
    putAll(merged, table);
    putAll(merged, writeOptions);
    merged.keySet().removeIf(k -> STREAM_WRITER_KEYS.contains(k.toLowerCase(Locale.ROOT)));
    return new ChpartOptions(merged, ChpartConfig.sparkConf());
  }

  /** As {@link #of(Map, Map)} with {@code conf} as the session's spark.chpart.* conf (tests). */
  static ChpartOptions of(Map<String, String> tableProperties, Map<String, String> writeOptions,
      Map<String, String> conf) {
    Map<String, String> merged = new LinkedHashMap<>();
    putAll(merged, tableProperties);
    putAll(merged, writeOptions);
    return new ChpartOptions(merged, conf);
  }

  /** Case-insensitive put (an option given twice in other cases counts once, the later wins). */
  private static void putAll(Map<String, String> into, Map<String, String> from) {
    for (Map.Entry<String, String> e : from.entrySet()) {
      String key = e.getKey();
      // The session catalog keeps a CREATE TABLE's OPTIONS as properties named option.<key>.
      if (key.toLowerCase(Locale.ROOT).startsWith("option.")) {
        key = key.substring("option.".length());
      }
      String finalKey = key;
      into.keySet().removeIf(k -> k.equalsIgnoreCase(finalKey));
      into.put(key, e.getValue());
    }
  }

  String database() {
    return table.substring(0, table.indexOf('.'));
  }

  String tableName() {
    return table.substring(table.indexOf('.') + 1);
  }

  ClickHouseHttp clickhouse() {
    return new ClickHouseHttp(cli());
  }

  /** The chpart of this write, with the config resolved on the driver (once; ChpartConfig). */
  synchronized Chpart cli() {
    if (resolved == null) {
      resolved = ChpartConfig.resolve(chpart, embeddedSha256, config, configKeys, origins, env);
    }
    return resolved;
  }

  /** A positive whole number of bytes, or 0 when not given. */
  private static long positiveLong(String name, String value, List<String> problems) {
    if (value == null) {
      return 0;
    }
    try {
      long n = Long.parseLong(value.strip());
      if (n > 0) {
        return n;
      }
    } catch (NumberFormatException e) {
      // reported below
    }
    problems.add("option " + name + " must be a positive number of bytes; got " + quote(value));
    return 0;
  }

  private static String choice(String name, String value, List<String> allowed, List<String> problems) {
    String v = value.toLowerCase(Locale.ROOT);
    if (!allowed.contains(v)) {
      problems.add("option " + name + " must be one of " + allowed + "; got " + quote(value));
    }
    return v;
  }

  private static String quote(String s) {
    return s == null ? "nothing" : "\"" + s + "\"";
  }

  /**
   * An absolute path for a path-like binary (tasks run in other working directories); a bare
   * name is looked up on the driver's PATH, and kept as a name if not found (executors may have
   * it on theirs).
   */
  static String resolveBinary(String name) {
    if (name.contains(File.separator)) {
      return new File(name).getAbsolutePath();
    }
    String path = System.getenv("PATH");
    if (path != null) {
      for (String dir : path.split(File.pathSeparator)) {
        File candidate = new File(dir, name);
        if (candidate.isFile() && candidate.canExecute()) {
          return candidate.getAbsolutePath();
        }
      }
    }
    return name;
  }
}
