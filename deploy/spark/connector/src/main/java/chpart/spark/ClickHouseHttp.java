package chpart.spark;

import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The driver's few catalog queries (does the table exist, CREATE TABLE) over the ClickHouse HTTP
 * interface that the chpart config names. Only the {@code [clickhouse]} section's {@code url},
 * {@code user}, {@code password_file} and {@code password_env} are read (as {@code key = "value"}
 * lines), with chpart's overrides {@code CHPART_CLICKHOUSE_URL}, {@code _USER}, {@code
 * _PASSWORD_FILE}, {@code _PASSWORD_ENV} and {@code _PASSWORD} from the driver's environment and the
 * {@code env.*} options; the password is sent as a header, never logged. Loads never go this way:
 * they are chpart's.
 */
final class ClickHouseHttp {
  private static final Duration TIMEOUT = Duration.ofSeconds(120);
  private final String url;
  private final String user;
  private final String password;
  private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(30)).build();

  ClickHouseHttp(String config, Map<String, String> extraEnv) {
    Map<String, String> section = clickhouseSection(Path.of(config));
    Map<String, String> env = new HashMap<>(System.getenv());
    env.putAll(extraEnv);
    String u = env.getOrDefault("CHPART_CLICKHOUSE_URL", section.get("url"));
    if (u == null || u.isBlank()) {
      throw new IllegalArgumentException("chpart data source: " + config + " has no [clickhouse] url");
    }
    url = u.endsWith("/") ? u : u + "/";
    user = env.getOrDefault("CHPART_CLICKHOUSE_USER", section.getOrDefault("user", "default"));
    String passwordFile = env.getOrDefault("CHPART_CLICKHOUSE_PASSWORD_FILE", section.get("password_file"));
    String passwordEnv = env.getOrDefault("CHPART_CLICKHOUSE_PASSWORD_ENV", section.get("password_env"));
    if (env.containsKey("CHPART_CLICKHOUSE_PASSWORD")) {
      password = env.get("CHPART_CLICKHOUSE_PASSWORD");
    } else if (passwordFile != null) {
      try {
        password = Files.readString(Path.of(passwordFile), StandardCharsets.UTF_8).strip();
      } catch (IOException e) {
        throw new IllegalArgumentException("chpart data source: cannot read the ClickHouse password_file "
            + passwordFile + ": " + e.getMessage(), e);
      }
    } else if (passwordEnv != null) {
      password = env.getOrDefault(passwordEnv, "");
    } else {
      password = "";
    }
  }

  /** The {@code [clickhouse]} section's {@code key = "value"} lines (comments and other sections skipped). */
  static Map<String, String> clickhouseSection(Path config) {
    List<String> lines;
    try {
      lines = Files.readAllLines(config, StandardCharsets.UTF_8);
    } catch (IOException e) {
      throw new IllegalArgumentException("chpart data source: cannot read " + config + ": " + e.getMessage(), e);
    }
    Map<String, String> section = new HashMap<>();
    boolean inside = false;
    for (String raw : lines) {
      String line = raw.strip();
      if (line.startsWith("[")) {
        inside = line.equals("[clickhouse]");
        continue;
      }
      int eq = line.indexOf('=');
      if (!inside || line.startsWith("#") || eq < 0) {
        continue;
      }
      String value = line.substring(eq + 1).strip();
      if (value.length() >= 2 && (value.charAt(0) == '"' || value.charAt(0) == '\'')) {
        int end = value.indexOf(value.charAt(0), 1);
        value = end > 0 ? value.substring(1, end) : value;
      }
      section.put(line.substring(0, eq).strip(), value);
    }
    return section;
  }

  /** Runs one statement; its output (TabSeparated), or an exception naming the server's reply. */
  String query(String sql) {
    HttpRequest.Builder request = HttpRequest.newBuilder(URI.create(url))
        .timeout(TIMEOUT)
        .header("X-ClickHouse-User", user)
        .POST(HttpRequest.BodyPublishers.ofString(sql, StandardCharsets.UTF_8));
    if (!password.isEmpty()) {
      request.header("X-ClickHouse-Key", password);
    }
    HttpResponse<String> response;
    try {
      response = http.send(request.build(), HttpResponse.BodyHandlers.ofString(StandardCharsets.UTF_8));
    } catch (IOException e) {
      throw new ChpartCatalogException("ClickHouse at " + url + " did not answer " + sql + ": " + e, e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("interrupted while querying ClickHouse", e);
    }
    if (response.statusCode() != 200) {
      throw new ChpartCatalogException("ClickHouse at " + url + " refused " + sql + " (HTTP " + response.statusCode()
          + "): " + response.body().strip(), null);
    }
    return response.body();
  }

  boolean tableExists(String database, String table) {
    return query("EXISTS TABLE " + quote(database) + "." + quote(table)).strip().equals("1");
  }

  static String quote(String identifier) {
    return "`" + identifier.replace("\\", "\\\\").replace("`", "\\`") + "`";
  }

  /** A ClickHouse HTTP failure of a catalog query (CREATE TABLE, EXISTS). */
  static final class ChpartCatalogException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    ChpartCatalogException(String message, Throwable cause) {
      super("chpart data source: " + message, cause);
    }
  }
}
