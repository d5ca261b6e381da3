package chpart.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.spark.sql.connector.distributions.Distribution;
import org.apache.spark.sql.connector.distributions.Distributions;
import org.apache.spark.sql.connector.distributions.OrderedDistribution;
import org.apache.spark.sql.connector.expressions.Expression;
import org.apache.spark.sql.connector.expressions.Expressions;
import org.apache.spark.sql.connector.expressions.SortDirection;
import org.apache.spark.sql.connector.expressions.SortOrder;
import org.apache.spark.sql.types.StructType;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The distribution and ordering a write asks Spark for (DSv2 RequiresDistributionAndOrdering), so
 * that each task holds few table partitions and builds one part per partition, and the server has
 * little to merge. From the table's keys, which only ClickHouse knows ({@code chpart plan --json}:
 * {@code partition_key}, {@code sorting_key}):
 *
 * <pre>
 *   PARTITION BY plain columns (a, (a, b))  clustered by them: every partition in exactly one task
 *   PARTITION BY f(columns) (toYYYYMMDD(ts)) ordered (range-partitioned) by the columns it uses:
 *                                           Spark cannot evaluate f, and hashing ts would scatter
 *                                           each day over every task; ranges keep a day in one
 *                                           task or two neighbours
 * </pre>
 *
 * No ordering is asked for: clickhouse-local sorts every part by the table's ORDER BY whatever
 * order its rows arrive in, so a sort in Spark would be paid twice (measured in the end-to-end
 * benchmark, docs/benchmarks.md: the same one part per partition, 1.6x the wall time for the
 * hourly shape). Option {@code layout=none} asks for nothing (Spark's own partitioning is kept).
 */
final class Layout {
  private static final Logger LOG = LoggerFactory.getLogger(Layout.class);
  private static final Pattern IDENT = Pattern.compile("`([^`]+)`|([A-Za-z_][A-Za-z0-9_]*)(?!\\s*[(A-Za-z0-9_])");

  static final Layout NONE = new Layout(Distributions.unspecified(), "none");

  final Distribution distribution;
  final String description;

  private Layout(Distribution distribution, String description) {
    this.distribution = distribution;
    this.description = description;
  }

  /**
   * The layout for the table, asked from `chpart plan --keys` on the driver; none if it cannot say.
   *
   * @param catalogFunctions whether Spark resolves this write's functions in a ChpartCatalog (the
   *     table came from one): only then can a key of functions be clustered by
   */
  static Layout of(ChpartOptions options, StructType schema, boolean catalogFunctions) {
    if (options.layout.equals("none")) {
      return NONE;
    }
    JsonNode plan;
    try {
      // --keys: the keys alone (a few statements, no host's filesystem reached), on every write.
      plan = options.cli().runJson("plan", List.of("--table", options.table, "--keys"), "table " + options.table);
    } catch (ChpartException e) {
      LOG.warn("chpart: no layout for {} (chpart plan failed; chpart begin will say more): {}", options.table,
          e.getMessage());
      return NONE;
    }
    String partitionKey = plan.path("partition_key").asText("");
    Functions functions;
    if (!catalogFunctions) {
      functions = Functions.unavailable("the table is not one of a chpart catalog, so Spark cannot resolve the"
          + " connector's functions for this write (e.g. SQL INSERT INTO a session-catalog table USING chpart;"
          + " df.write.format(\"chpart\") and df.writeTo through a chpart catalog can)");
    } else if (plainColumns(partitionKey, Set.of(schema.fieldNames())) != null) {
      functions = Functions.unavailable("not needed");
    } else {
      functions = Functions.of(options, plan);
    }
    Layout layout = of(partitionKey, schema, functions);
    if (layout.distribution instanceof OrderedDistribution) {
      // A partition may span two tasks, so get two parts: worth a warning, with the reason.
      LOG.warn("chpart: layout of the write into {}: {}", options.table, layout.description);
    } else {
      LOG.info("chpart: layout of the write into {}: {}", options.table, layout.description);
    }
    return layout;
  }

  /**
   * What a key of functions is evaluated with: the ClickHouse columns' types (for their time
   * zones) and the server's time zone (of DateTime columns without one, as chpart's build uses
   * it); or why functions cannot be used.
   */
  record Functions(Map<String, String> types, String serverTimeZone, String unavailable) {
    static Functions unavailable(String why) {
      return new Functions(Map.of(), null, why);
    }

    /**
     * From {@code plan}'s {@code columns} and {@code timezone} (chpart reads them with the keys,
     * in the same statement); asked from ClickHouse only if the plan has none (an older chpart
     * configured as the binary): the table named (a Distributed table has its local table's
     * columns).
     */
    static Functions of(ChpartOptions options, JsonNode plan) {
      if (plan.path("columns").isArray() && plan.path("timezone").isTextual()) {
        Map<String, String> types = new LinkedHashMap<>();
        for (JsonNode column : plan.path("columns")) {
          types.put(column.path("name").asText(), column.path("type").asText());
        }
        return new Functions(types, plan.path("timezone").asText(), null);
      }
      try {
        ClickHouseHttp ch = options.clickhouse();
        Map<String, String> types = new LinkedHashMap<>();
        String out = ch.query("SELECT name, type FROM system.columns WHERE database = " + literal(options.database())
            + " AND table = " + literal(options.tableName()) + " FORMAT TabSeparatedRaw"); // TabSeparated would escape the quotes of DateTime('UTC')
        for (String line : out.split("\n")) {
          int tab = line.indexOf('\t');
          if (tab > 0) {
            types.put(line.substring(0, tab), line.substring(tab + 1).strip());
          }
        }
        return new Functions(types, ch.query("SELECT timezone() FORMAT TabSeparated").strip(), null);
      } catch (RuntimeException e) {
        return unavailable("the columns' time zones could not be read from ClickHouse: " + e.getMessage());
      }
    }

    private static String literal(String s) {
      return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'";
    }
  }

  static Layout of(String partitionKey, StructType schema, Functions functions) {
    Set<String> columns = Set.of(schema.fieldNames());
    List<String> plain = plainColumns(partitionKey, columns);
    Distribution distribution = null;
    String what = null;
    if (plain != null && !plain.isEmpty()) {
      distribution = Distributions.clustered(plain.stream().map(Expressions::column).toArray(Expression[]::new));
      what = "clustered by " + plain;
    } else if (plain == null) {
      String why = functions.unavailable();
      if (why == null) {
        KeyMapping mapped = KeyMapping.of(partitionKey, schema, functions.types(), functions.serverTimeZone());
        if (mapped.clustering != null) {
          distribution = Distributions.clustered(mapped.clustering);
          what = "clustered by partition key " + partitionKey + " as " + mapped.describe();
        } else {
          why = mapped.why;
        }
      }
      if (distribution == null) {
        Set<String> used = new LinkedHashSet<>();
        Matcher m = IDENT.matcher(partitionKey);
        while (m.find()) {
          String name = m.group(1) != null ? m.group(1) : m.group(2);
          if (columns.contains(name)) {
            used.add(name);
          }
        }
        if (!used.isEmpty()) {
          distribution = Distributions.ordered(ascending(new ArrayList<>(used)));
          what = "range-partitioned by " + used + " (partition key " + partitionKey + " not clustered by: " + why
              + ")";
        }
      }
    }
    if (distribution == null) {
      distribution = Distributions.unspecified();
      what = "no distribution (partition key \"" + partitionKey + "\" uses no column of the rows)";
    }
    return new Layout(distribution, what);
  }

  /** The key's columns if it is nothing but plain columns of the rows; else null. */
  static List<String> plainColumns(String key, Set<String> columns) {
    String k = key.strip();
    if (k.isEmpty() || k.equals("tuple()")) {
      return List.of();
    }
    List<String> out = new ArrayList<>();
    for (String part : splitTopLevel(stripParens(k))) {
      String name = unquote(part.strip());
      if (!columns.contains(name)) {
        return null;
      }
      out.add(name);
    }
    return out;
  }

  private static SortOrder[] ascending(List<String> names) {
    return names.stream().map(n -> Expressions.sort(Expressions.column(n), SortDirection.ASCENDING))
        .toArray(SortOrder[]::new);
  }

  private static String stripParens(String s) {
    String t = s.strip();
    if (t.startsWith("(") && t.endsWith(")") && splitTopLevel(t.substring(1, t.length() - 1)).size() >= 1
        && balanced(t.substring(1, t.length() - 1))) {
      return t.substring(1, t.length() - 1);
    }
    return t;
  }

  private static boolean balanced(String s) {
    int depth = 0;
    for (char c : s.toCharArray()) {
      depth += c == '(' ? 1 : c == ')' ? -1 : 0;
      if (depth < 0) {
        return false;
      }
    }
    return depth == 0;
  }

  private static List<String> splitTopLevel(String s) {
    List<String> parts = new ArrayList<>();
    int depth = 0;
    int start = 0;
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      if (c == '(') {
        depth++;
      } else if (c == ')') {
        depth--;
      } else if (c == ',' && depth == 0) {
        parts.add(s.substring(start, i));
        start = i + 1;
      }
    }
    if (!s.isBlank()) {
      parts.add(s.substring(start));
    }
    return parts;
  }

  private static String unquote(String s) {
    return s.length() >= 2 && s.startsWith("`") && s.endsWith("`") ? s.substring(1, s.length() - 1) : s;
  }
}
