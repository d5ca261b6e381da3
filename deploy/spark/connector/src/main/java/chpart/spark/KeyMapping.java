package chpart.spark;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.spark.sql.connector.expressions.Expression;
import org.apache.spark.sql.connector.expressions.Expressions;
import org.apache.spark.sql.connector.expressions.Literal;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DateType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampType;

/**
 * A ClickHouse {@code PARTITION BY} (as {@code system.tables.partition_key} prints it) as the
 * Spark expressions that compute the same partition value, for {@link Layout} to cluster by. Pure:
 * from the key's text, the rows' Spark schema, the ClickHouse columns' types and the server's time
 * zone.
 *
 * <pre>
 *   toYYYYMMDD(ts)             [chpart_toyyyymmdd(ts, 'UTC')]   ts DateTime64(6, 'UTC')
 *   (kind, toYYYYMM(ts))       [kind, chpart_toyyyymm(ts, 'Europe/Berlin')]   ts DateTime, server in Berlin
 *   intDiv(id, 1000), id % 16  [chpart_intdiv(id, 1000L)], [chpart_modulo(id, 16L)]
 * </pre>
 *
 * Anything else (another function, a column the rows lack, a TIMESTAMP_NTZ) is not mapped; {@link
 * #why} says why and the write keeps the range layout.
 */
final class KeyMapping {
  private static final Pattern TOKEN =
      Pattern.compile("\\s*(?:`((?:[^`\\\\]|\\\\.)*)`|([A-Za-z_][A-Za-z0-9_]*)|(-?[0-9]+)|'((?:[^'\\\\]|\\\\.)*)'|([(),%]))");
  private static final Pattern TIME_ZONE = Pattern.compile("DateTime(?:64)?\\((?:\\s*\\d+\\s*,)?\\s*'([^']+)'\\s*\\)");

  /** The expressions to cluster by, or null. */
  final Expression[] clustering;
  /** Why the key is not mapped, or null. */
  final String why;

  private KeyMapping(Expression[] clustering, String why) {
    this.clustering = clustering;
    this.why = why;
  }

  String describe() {
    List<String> out = new ArrayList<>();
    for (Expression e : clustering) {
      out.add(e.describe());
    }
    return out.toString();
  }

  /**
   * @param types the ClickHouse columns' types ({@code system.columns}), for their time zones
   * @param serverTimeZone the server's, for a DateTime column without one
   */
  static KeyMapping of(String key, StructType schema, Map<String, String> types, String serverTimeZone) {
    try {
      Parser p = new Parser(key);
      List<Node> elements = p.key();
      List<Expression> out = new ArrayList<>();
      for (Node n : elements) {
        if (n.literal == null) { // a constant element does not tell partitions apart
          out.add(new Mapper(schema, types, serverTimeZone).map(n).expression);
        }
      }
      if (out.isEmpty()) {
        return new KeyMapping(null, "the partition key uses no column");
      }
      return new KeyMapping(out.toArray(new Expression[0]), null);
    } catch (IllegalArgumentException e) {
      return new KeyMapping(null, e.getMessage());
    }
  }

  /** A parsed key element: a column, a constant, or a function of elements. */
  private record Node(String column, Object literal, String function, List<Node> args) {}

  /** The tokens of the key, parsed by recursive descent. */
  private static final class Parser {
    private final List<String[]> tokens = new ArrayList<>(); // {kind, text}: i(dent), n(umber), s(tring), p(unct)
    private int at;

    Parser(String key) {
      Matcher m = TOKEN.matcher(key);
      int pos = 0;
      while (pos < key.length()) {
        if (key.substring(pos).isBlank()) {
          break;
        }
        if (!m.find(pos) || m.start() != pos) {
          throw new IllegalArgumentException("cannot read the partition key " + key + " at \"" + key.substring(pos).strip()
              + "\"");
        }
        if (m.group(1) != null) {
          tokens.add(new String[] {"i", m.group(1).replace("\\`", "`")});
        } else if (m.group(2) != null) {
          tokens.add(new String[] {"i", m.group(2)});
        } else if (m.group(3) != null) {
          tokens.add(new String[] {"n", m.group(3)});
        } else if (m.group(4) != null) {
          tokens.add(new String[] {"s", m.group(4).replaceAll("\\\\(.)", "$1")});
        } else {
          tokens.add(new String[] {"p", m.group(5)});
        }
        pos = m.end();
      }
    }

    List<Node> key() {
      List<Node> elements;
      if (peek("p", "(")) {
        at++;
        elements = list();
      } else if (peek("i", "tuple") && at + 1 < tokens.size() && tokens.get(at + 1)[1].equals("(")) {
        at += 2;
        elements = peek("p", ")") ? new ArrayList<>() : list();
      } else {
        elements = List.of(element());
      }
      if (at != tokens.size()) {
        throw new IllegalArgumentException("cannot read the partition key: unexpected " + tokens.get(at)[1]);
      }
      return elements;
    }

    /** elements up to and including the closing parenthesis */
    private List<Node> list() {
      List<Node> out = new ArrayList<>();
      out.add(element());
      while (peek("p", ",")) {
        at++;
        out.add(element());
      }
      expect(")");
      return out;
    }

    private Node element() {
      Node left = primary();
      while (peek("p", "%")) {
        at++;
        left = new Node(null, null, "modulo", List.of(left, primary()));
      }
      return left;
    }

    private Node primary() {
      if (at >= tokens.size()) {
        throw new IllegalArgumentException("cannot read the partition key: it ends early");
      }
      String[] t = tokens.get(at++);
      switch (t[0]) {
        case "n":
          return new Node(null, Long.parseLong(t[1]), null, null);
        case "s":
          return new Node(null, t[1], null, null);
        case "i":
          if (peek("p", "(")) {
            at++;
            return new Node(null, null, t[1], peek("p", ")") ? closeEmpty() : list());
          }
          return new Node(t[1], null, null, null);
        default:
          if (t[1].equals("(")) {
            Node inner = element();
            expect(")");
            return inner;
          }
          throw new IllegalArgumentException("cannot read the partition key: unexpected " + t[1]);
      }
    }

    private List<Node> closeEmpty() {
      at++;
      return List.of();
    }

    private boolean peek(String kind, String text) {
      return at < tokens.size() && tokens.get(at)[0].equals(kind) && tokens.get(at)[1].equals(text);
    }

    private void expect(String punct) {
      if (!peek("p", punct)) {
        throw new IllegalArgumentException("cannot read the partition key: expected " + punct);
      }
      at++;
    }
  }

  /** An element's Spark expression, its Spark type, and (time values) its time zone. */
  private record Mapped(Expression expression, DataType type, String timeZone) {}

  private record Mapper(StructType schema, Map<String, String> types, String serverTimeZone) {
    Mapped map(Node n) {
      if (n.column != null) {
        StructField f = field(n.column);
        String type = types.get(n.column);
        String zone = serverTimeZone;
        if (type != null) {
          Matcher m = TIME_ZONE.matcher(type);
          if (m.find()) {
            zone = m.group(1);
          }
        }
        return new Mapped(Expressions.column(n.column), f.dataType(), zone);
      }
      if (n.literal != null) {
        throw new IllegalArgumentException("a constant " + n.literal + " where a column was expected");
      }
      PartitionFunction.Kind kind = PartitionFunction.BY_CLICKHOUSE_NAME.get(n.function);
      if (kind == null) {
        throw new IllegalArgumentException("the connector does not compute ClickHouse's " + n.function + "()");
      }
      if (kind.arithmetic()) {
        if (n.args.size() != 2 || !(n.args.get(1).literal instanceof Long divisor) || divisor == 0) {
          throw new IllegalArgumentException(n.function + "() by other than a nonzero integer constant");
        }
        Mapped arg = map(n.args.get(0));
        if (!PartitionFunction.integral(arg.type)) {
          throw new IllegalArgumentException(n.function + "() of a Spark " + arg.type.simpleString()
              + ", not an integer");
        }
        Literal<Long> d = Expressions.literal(divisor);
        return new Mapped(Expressions.apply(kind.sparkName(), arg.expression, d), kind.result, null);
      }
      if (n.args.isEmpty() || n.args.size() > 2) {
        throw new IllegalArgumentException(n.function + "() with " + n.args.size() + " arguments");
      }
      Mapped arg = map(n.args.get(0));
      if (!(arg.type instanceof TimestampType || arg.type instanceof DateType)) {
        throw new IllegalArgumentException(n.function + "() of a Spark " + arg.type.simpleString()
            + ", not a timestamp or date");
      }
      String zone = arg.timeZone;
      if (n.args.size() == 2) {
        if (!(n.args.get(1).literal instanceof String z)) {
          throw new IllegalArgumentException(n.function + "()'s second argument is not a time zone");
        }
        zone = z;
      }
      if (zone == null || zone.isEmpty()) {
        throw new IllegalArgumentException("no time zone for " + n.function + "() (the server did not say its own)");
      }
      try {
        java.time.ZoneId.of(zone);
      } catch (java.time.DateTimeException e) {
        throw new IllegalArgumentException("time zone " + zone + " is unknown to Java: " + e.getMessage());
      }
      return new Mapped(Expressions.apply(kind.sparkName(), arg.expression, Expressions.literal(zone)), kind.result,
          zone);
    }

    private StructField field(String name) {
      for (StructField f : schema.fields()) {
        if (f.name().equals(name)) {
          return f;
        }
      }
      throw new IllegalArgumentException("the rows have no column " + name);
    }
  }
}
