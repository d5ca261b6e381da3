package chpart.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.File;
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;

/**
 * The driver's few catalog queries (does the table exist, CREATE TABLE) over the ClickHouse HTTP
 * interface of the write's resolved chpart config ({@code chpart config --json}: {@code [clickhouse]}
 * url and user; the password from its {@code password_file}, read in the driver's working
 * directory of chpart runs, or the variable {@code password_env} names, or {@code
 * CHPART_CLICKHOUSE_PASSWORD}, from the driver's environment and the {@code env.*} options). The
 * password is sent as a header, never logged. Loads never go this way: they are chpart's.
 */
final class ClickHouseHttp {
  private static final Duration TIMEOUT = Duration.ofSeconds(120);
  /**
   * How these statements name themselves in the server's {@code system.query_log}
   * ({@code http_user_agent}), beside chpart's own {@code chpart-<command>/<version>}: the
   * connector's version is the chpart it carries.
   */
  static final String USER_AGENT = "chpart-spark/" + carriedVersion();
  private final String url;
  private final String user;
  private final String password;
  private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(30)).build();

  ClickHouseHttp(Chpart cli) {
    JsonNode clickhouse = ChpartConfig.json(cli).path("clickhouse");
    Map<String, String> env = new HashMap<>(System.getenv());
    env.putAll(cli.extraEnv());
    String u = clickhouse.path("url").asText();
    url = u.endsWith("/") ? u : u + "/";
    user = clickhouse.path("user").asText("default");
    File dir = cli.driverDir() != null ? cli.driverDir() : new File("").getAbsoluteFile();
    password = ChpartConfig.password(clickhouse, env, dir);
  }

  /** Runs one statement; its output (TabSeparated), or an exception naming the server's reply. */
  String query(String sql) {
    HttpRequest.Builder request = HttpRequest.newBuilder(URI.create(url))
        .timeout(TIMEOUT)
        .header("User-Agent", USER_AGENT)
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

  /**
   * The version of the chpart this jar carries ({@code chpart 0.1.0} -> {@code 0.1.0}), or
   * "unknown".
   */
  private static String carriedVersion() {
    String recorded = EmbeddedChpart.recordedVersion();
    if (recorded == null || recorded.isBlank()) {
      return "unknown";
    }
    String[] words = recorded.strip().split("\\s+");
    return words[words.length - 1];
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
