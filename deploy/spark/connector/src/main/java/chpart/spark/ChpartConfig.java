package chpart.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;
import java.util.regex.Pattern;
import org.apache.spark.SparkFiles;
import org.apache.spark.sql.SparkSession;

/**
 * The chpart config of a write, without files on executors. Its keys come from, lowest
 * precedence first: the config file (option {@code config}, optional), Spark conf {@code
 * spark.chpart.<section>.<key>}, and the write's options of the same dotted names
 * ({@code option("clickhouse.url", ...)}). The driver hands them to {@code chpart config} (the file
 * as {@code --config}, the rest as a TOML document in {@code CHPART_CONFIG_TOML}), which merges,
 * validates (reading the password from its file or variable) and prints the resolved document;
 * that document is what every chpart run of the write gets in {@code CHPART_CONFIG_TOML}, on the
 * driver and in every task (never on argv). chpart's schema is the only list of keys: an unknown
 * one is refused by {@code chpart config}, whose message names it and the valid keys.
 *
 * <p>No secret travels in conf or options (Spark shows both in its UI and event log): a key that
 * looks like one is refused here, before anything runs. The password comes from a file shipped
 * with {@code --files} ({@code clickhouse.password_file = pw.txt}: relative, it resolves in the
 * executor's working directory), an executor environment variable named by {@code
 * clickhouse.password_env}, or {@code CHPART_CLICKHOUSE_PASSWORD}; SSH keys and known_hosts are
 * files too.
 *
 * <p>On the driver, relative paths resolve in its working directory; if a relative file key given
 * in conf or options is not there but is among the files Spark fetched for the driver ({@code
 * SparkFiles}, e.g. {@code --files} in client mode), the driver's chpart runs start in {@link
 * SparkFiles#getRootDirectory()} instead.
 */
final class ChpartConfig {
  static final String CONF_PREFIX = "spark.chpart.";
  /** chpart's SECRET_KEY_PATTERN (crates/config): a test keeps this copy equal to it. */
  static final Pattern SECRET = Pattern.compile("(?i)secret|password(?!_file|_env)|token|access.?key|private.?key");
  static final String SECRET_ALTERNATIVES =
      "Spark shows conf and options in its UI and event log, so chpart takes no secret there. Give the password as"
          + " a file shipped with --files (clickhouse.password_file = pw.txt: a relative path resolves in each"
          + " executor's working directory, and on the driver in its working directory or among SparkFiles), as an"
          + " executor environment variable (spark.executorEnv.CH_PASSWORD=... and clickhouse.password_env ="
          + " CH_PASSWORD; the driver needs it in its own environment too), or as CHPART_CLICKHOUSE_PASSWORD in the"
          + " environment; SSH keys and known_hosts are files shipped with --files (ssh.identity_file,"
          + " ssh.known_hosts)";
  /** Keys naming a file that a task reads from its working directory when relative. */
  static final List<String> FILE_KEYS = List.of("clickhouse.password_file", "ssh.identity_file", "ssh.known_hosts");

  private ChpartConfig() {}

  /** Whether a key (or an env.* option's variable) names a secret. */
  static boolean looksSecret(String key) {
    return SECRET.matcher(key).find();
  }

  /** The session's {@code spark.chpart.*} conf, prefix removed (empty without a session). */
  static Map<String, String> sparkConf() {
    Map<String, String> out = new TreeMap<>();
    SparkSession session = SparkSession.getActiveSession().getOrElse(() -> null);
    if (session == null) {
      session = SparkSession.getDefaultSession().getOrElse(() -> null);
    }
    if (session == null) {
      return out;
    }
    scala.jdk.javaapi.CollectionConverters.asJava(session.conf().getAll()).forEach((k, v) -> {
      if (k.startsWith(CONF_PREFIX)) {
        out.put(k.substring(CONF_PREFIX.length()), v);
      }
    });
    return out;
  }

  /**
   * The settings as a TOML document of dotted keys, each segment quoted; a value that reads as an
   * integer or a boolean is one (as chpart reads {@code CHPART_<SECTION>_<KEY>} variables).
   */
  static String toml(Map<String, String> settings) {
    StringBuilder out = new StringBuilder();
    for (Map.Entry<String, String> e : settings.entrySet()) {
      List<String> segments = new ArrayList<>();
      for (String segment : e.getKey().split("\\.", -1)) {
        segments.add(quote(segment));
      }
      out.append(String.join(".", segments)).append(" = ").append(value(e.getValue())).append('\n');
    }
    return out.toString();
  }

  private static String value(String v) {
    if (v.matches("[+-]?[0-9]+") && v.length() < 19) {
      return v;
    }
    if (v.equals("true") || v.equals("false")) {
      return v;
    }
    return quote(v);
  }

  static String quote(String s) {
    StringBuilder out = new StringBuilder("\"");
    for (char c : s.toCharArray()) {
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\n' -> out.append("\\n");
        case '\r' -> out.append("\\r");
        case '\t' -> out.append("\\t");
        default -> {
          if (c < 0x20 || c == 0x7f) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
        }
      }
    }
    return out.append('"').toString();
  }

  /**
   * Where the driver's chpart runs start: its working directory, unless a relative file key of
   * {@code settings} is missing there and present among SparkFiles.
   */
  static File driverDir(Map<String, String> settings) {
    File cwd = new File("").getAbsoluteFile();
    for (String key : FILE_KEYS) {
      String value = settings.get(key);
      if (value == null || new File(value).isAbsolute() || new File(cwd, value).exists()) {
        continue;
      }
      String root;
      try {
        root = SparkFiles.getRootDirectory();
      } catch (RuntimeException e) { // no SparkEnv: not in a Spark driver
        return cwd;
      }
      if (root != null && new File(root, value).exists()) {
        return new File(root).getAbsoluteFile();
      }
    }
    return cwd;
  }

  /**
   * Runs {@code chpart config} on the driver: the resolved TOML document, or an error naming the
   * sources and, for each given key chpart's message names, where it was given.
   *
   * @param origins each setting's origin, e.g. {@code spark conf spark.chpart.clickhouse.url}
   */
  static Chpart resolve(String binary, String embeddedSha256, String configFile, Map<String, String> settings, Map<String, String> origins,
      Map<String, String> extraEnv) {
    File dir = driverDir(settings);
    Map<String, String> env = new LinkedHashMap<>(extraEnv);
    if (!settings.isEmpty()) {
      env.put(Chpart.CONFIG_TOML_ENV, toml(settings));
    }
    Chpart resolver = new Chpart(binary, embeddedSha256, null, env, dir);
    List<String> args = new ArrayList<>(List.of("--toml"));
    if (configFile != null) {
      args.addAll(List.of("--config", configFile));
    }
    String sources = (configFile == null ? "" : "config file " + configFile + ", ")
        + (settings.isEmpty() ? "no spark.chpart.* conf or config options" : "spark.chpart.* conf and options");
    String document;
    try {
      document = resolver.run("config", args, "the chpart config from " + sources);
    } catch (ChpartException e) {
      StringBuilder given = new StringBuilder();
      for (Map.Entry<String, String> o : new TreeMap<>(origins).entrySet()) {
        // The key as a word of chpart's message (clickhouse.url is not named by clickhouse.urll).
        Pattern named = Pattern.compile("(^|[\\s(])" + Pattern.quote(o.getKey()) + "([\\s,)]|$)", Pattern.MULTILINE);
        if (named.matcher(e.stderrTail()).find()) {
          given.append("\n").append(o.getKey()).append(" was given as ").append(o.getValue());
        }
      }
      throw new IllegalArgumentException("chpart data source: the config is not valid (conf keys are spark.chpart."
          + "<section>.<key>, options <section>.<key>, e.g. spark.chpart.clickhouse.url or option clickhouse.url): "
          + e.getMessage() + given, e);
    }
    return new Chpart(binary, embeddedSha256, document, extraEnv, dir);
  }

  /** {@code chpart config --json} of the resolved document: what the driver's catalog queries read. */
  static JsonNode json(Chpart cli) {
    return cli.runJson("config", List.of(), "the resolved chpart config");
  }

  /** The ClickHouse password the config names, read on the driver; empty if none. */
  static String password(JsonNode clickhouse, Map<String, String> env, File dir) {
    String file = clickhouse.path("password_file").asText(null);
    String variable = clickhouse.path("password_env").asText(null);
    if (file != null) {
      Path path = dir.toPath().resolve(file);
      try {
        String text = Files.readString(path);
        return text.replaceAll("[\r\n]+$", "");
      } catch (IOException e) {
        throw new IllegalArgumentException("chpart data source: cannot read clickhouse.password_file " + path + ": "
            + e.getMessage(), e);
      }
    }
    String name = variable != null ? variable : "CHPART_CLICKHOUSE_PASSWORD";
    return env.getOrDefault(name, "");
  }

  /** A problem for each secret-looking key among {@code keys} (their origins). */
  static void refuseSecrets(Map<String, String> keysToOrigin, List<String> problems) {
    for (Map.Entry<String, String> e : new TreeMap<>(keysToOrigin).entrySet()) {
      if (looksSecret(e.getKey())) {
        problems.add(e.getValue() + " looks like a secret and is refused: " + SECRET_ALTERNATIVES);
      }
    }
  }

  static String lower(String s) {
    return s.toLowerCase(Locale.ROOT);
  }
}
