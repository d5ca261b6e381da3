package chpart.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.spark.sql.connector.distributions.Distribution;
import org.apache.spark.sql.connector.distributions.Distributions;
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
 *   ORDER BY                                each task sorted by the key's leading plain columns
 * </pre>
 *
 * Option {@code layout=none} asks for nothing (Spark's own partitioning is kept).
 */
final class Layout {
  private static final Logger LOG = LoggerFactory.getLogger(Layout.class);
  private static final Pattern IDENT = Pattern.compile("`([^`]+)`|([A-Za-z_][A-Za-z0-9_]*)(?!\\s*[(A-Za-z0-9_])");

  static final Layout NONE = new Layout(Distributions.unspecified(), new SortOrder[0], "none");

  final Distribution distribution;
  final SortOrder[] ordering;
  final String description;

  private Layout(Distribution distribution, SortOrder[] ordering, String description) {
    this.distribution = distribution;
    this.ordering = ordering;
    this.description = description;
  }

  /** The layout for the table, asked from `chpart plan` on the driver; none if it cannot say. */
  static Layout of(ChpartOptions options, StructType schema) {
    if (options.layout.equals("none")) {
      return NONE;
    }
    JsonNode plan;
    try {
      plan = options.cli().runJson("plan", List.of("--table", options.table), "table " + options.table);
    } catch (ChpartException e) {
      LOG.warn("chpart: no layout for {} (chpart plan failed; chpart begin will say more): {}", options.table,
          e.getMessage());
      return NONE;
    }
    Layout layout = of(plan.path("partition_key").asText(""), plan.path("sorting_key").asText(""), schema);
    LOG.info("chpart: layout of the write into {}: {}", options.table, layout.description);
    return layout;
  }

  static Layout of(String partitionKey, String sortingKey, StructType schema) {
    Set<String> columns = Set.of(schema.fieldNames());
    List<String> plain = plainColumns(partitionKey, columns);
    Distribution distribution;
    String what;
    if (plain != null && !plain.isEmpty()) {
      distribution = Distributions.clustered(plain.stream().map(Expressions::column).toArray(Expression[]::new));
      what = "clustered by " + plain;
    } else {
      Set<String> used = new LinkedHashSet<>();
      Matcher m = IDENT.matcher(partitionKey);
      while (m.find()) {
        String name = m.group(1) != null ? m.group(1) : m.group(2);
        if (columns.contains(name)) {
          used.add(name);
        }
      }
      if (used.isEmpty()) {
        distribution = Distributions.unspecified();
        what = "no distribution (partition key \"" + partitionKey + "\" uses no column of the rows)";
      } else {
        distribution = Distributions.ordered(ascending(new ArrayList<>(used)));
        what = "range-partitioned by " + used + " (partition key " + partitionKey + ")";
      }
    }
    List<String> sorting = new ArrayList<>();
    for (String part : splitTopLevel(stripParens(sortingKey))) {
      String name = unquote(part.strip());
      if (!columns.contains(name)) {
        break; // an expression: the rest of the key cannot be sorted by in Spark
      }
      sorting.add(name);
    }
    return new Layout(distribution, ascending(sorting), what + ", each task sorted by " + sorting);
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
