package chpart.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.List;
import java.util.Map;
import java.util.function.Consumer;
import java.util.regex.Pattern;

/**
 * Runs the {@code chpart} binary, as ripgrep runs its children: stdout and stderr are drained on
 * threads of their own (the child never blocks on a full pipe), the tail of stderr and the exit
 * status go into the error. The same binary, config document (in {@code CHPART_CONFIG_TOML}, see
 * {@link ChpartConfig}) and environment are used on the driver ({@code begin}, {@code status},
 * {@code commit}, {@code abort}) and in every task ({@code build}).
 */
final class Chpart implements Serializable {
  private static final long serialVersionUID = 1L;
  static final ObjectMapper JSON = new ObjectMapper();
  static final int STDERR_TAIL_LINES = 40;
  private static final Pattern ANSI = Pattern.compile("\u001b\\[[0-9;]*[A-Za-z]");

  /** The variable every run gets the resolved config document in (chpart's CONFIG_TOML_ENV). */
  static final String CONFIG_TOML_ENV = "CHPART_CONFIG_TOML";

  private final String binary;
  private final String embeddedSha256;
  /** The resolved config (TOML), or null (only while resolving it: ChpartConfig). */
  private final String configToml;
  private final Map<String, String> extraEnv;
  /** Where the driver's runs start (ChpartConfig#driverDir); null in a task: its working directory. */
  private final transient File driverDir;

  /**
   * @param binary the chpart binary, a path valid on the driver and every executor or a name on
   *     their PATH; null: the one the jar carries
   * @param embeddedSha256 with binary null, the sha256 of the jar's binary the driver chose: each
   *     JVM extracts its own jar's ({@link EmbeddedChpart}) and refuses another one
   * @param configToml the config document {@code chpart config} resolved on the driver, handed to
   *     every run in {@code CHPART_CONFIG_TOML}
   * @param extraEnv variables added to every run's environment (the {@code env.*} options)
   * @param driverDir the working directory of the driver's runs
   */
  Chpart(String binary, String embeddedSha256, String configToml, Map<String, String> extraEnv,
      File driverDir) {
    if ((binary == null) == (embeddedSha256 == null)) {
      throw new IllegalArgumentException("a chpart binary, or the sha256 of the jar's, and not both");
    }
    this.binary = binary;
    this.embeddedSha256 = embeddedSha256;
    this.configToml = configToml;
    this.extraEnv = Map.copyOf(extraEnv);
    this.driverDir = driverDir;
  }

  /** The binary to run in this JVM (the jar's is extracted on first use). */
  String binary() {
    return binary != null ? binary : EmbeddedChpart.path(embeddedSha256).toString();
  }

  /** The sha256 of the jar's binary when it is the one run, else null. */
  String embeddedSha256() {
    return embeddedSha256;
  }

  String configToml() {
    return configToml;
  }

  File driverDir() {
    return driverDir;
  }

  Map<String, String> extraEnv() {
    return extraEnv;
  }

  /** {@code chpart <command> <args...>} with the config in its environment, not started yet. */
  ProcessBuilder processBuilder(String command, List<String> args) {
    ProcessBuilder pb = new ProcessBuilder(argv(command, args));
    Map<String, String> env = pb.environment();
    env.put("NO_COLOR", "1"); // plain log lines on stderr: they end up in exception messages
    env.putAll(extraEnv);
    if (configToml != null) {
      // The document holds the file's keys already; a file named in this host's environment
      // must not be read again (an executor need not have it).
      env.remove("CHPART_CONFIG");
      env.put(CONFIG_TOML_ENV, configToml);
    }
    if (driverDir != null) {
      pb.directory(driverDir);
    }
    return pb;
  }

  List<String> argv(String command, List<String> args) {
    List<String> argv = new ArrayList<>();
    argv.add(binary());
    argv.add(command);
    argv.addAll(args);
    return argv;
  }

  /** Runs a driver command to its end with no input; its stdout, or a ChpartException. */
  String run(String command, List<String> args, String context) {
    ProcessBuilder pb = processBuilder(command, args);
    Process proc;
    try {
      proc = pb.start();
    } catch (IOException e) {
      throw new ChpartException(
          command, 127, "cannot run " + pb.command().get(0) + ": " + e.getMessage(), pb.command(), context);
    }
    try {
      proc.getOutputStream().close();
    } catch (IOException ignored) {
      // it does not read stdin
    }
    Drain out = Drain.all(proc.getInputStream(), "chpart " + command + " stdout");
    Drain err = Drain.tail(proc.getErrorStream(), "chpart " + command + " stderr", null);
    int code = waitFor(proc);
    String stdout = out.text();
    if (code != 0) {
      throw new ChpartException(command, code, err.text(), pb.command(), context);
    }
    return stdout;
  }

  /** {@link #run} with {@code --json}: the last stdout line, parsed. */
  JsonNode runJson(String command, List<String> args, String context) {
    List<String> withJson = new ArrayList<>(args);
    withJson.add("--json");
    String out = run(command, withJson, context);
    String line = lastLine(out);
    try {
      return JSON.readTree(line);
    } catch (IOException e) {
      throw new ChpartException(
          command,
          0,
          "expected one JSON line on stdout, got: " + tailOf(out, 2000),
          argv(command, withJson),
          context);
    }
  }

  /** Waits for a child; if this thread is interrupted (Spark kills the task), the child is killed. */
  static int waitFor(Process proc) {
    try {
      return exitCode(proc.waitFor());
    } catch (InterruptedException e) {
      proc.destroyForcibly();
      Thread.currentThread().interrupt();
      throw new IllegalStateException("interrupted while waiting for chpart (pid " + proc.pid() + "); killed it", e);
    }
  }

  /** Java reports a child killed by signal N as 128 + N; chpart's contract (and Python's) is -N. */
  static int exitCode(int status) {
    return status > 128 && status < 160 ? -(status - 128) : status;
  }

  static String lastLine(String text) {
    String last = "";
    for (String line : text.split("\n")) {
      if (!line.isBlank()) {
        last = line.strip();
      }
    }
    return last;
  }

  static String tailOf(String text, int chars) {
    return text.length() <= chars ? text : text.substring(text.length() - chars);
  }

  static String stripAnsi(String line) {
    return ANSI.matcher(line).replaceAll("");
  }

  /** Reads a child's stream on a daemon thread: all of it, or its last lines. */
  static final class Drain extends Thread {
    private final InputStream in;
    private final ByteArrayOutputStream all;
    private final Deque<String> lines;
    private final Consumer<String> onLine;
    private volatile IOException failure;

    private Drain(InputStream in, String name, boolean keepAll, Consumer<String> onLine) {
      super(name);
      this.in = in;
      this.all = keepAll ? new ByteArrayOutputStream() : null;
      this.lines = keepAll ? null : new ArrayDeque<>();
      this.onLine = onLine;
      setDaemon(true);
      start();
    }

    /** Keeps everything (stdout: the manifest or JSON summary is its last line). */
    static Drain all(InputStream in, String name) {
      return new Drain(in, name, true, null);
    }

    /** Keeps the last {@link #STDERR_TAIL_LINES} lines; {@code onLine} sees every line. */
    static Drain tail(InputStream in, String name, Consumer<String> onLine) {
      return new Drain(in, name, false, onLine);
    }

    @Override
    public void run() {
      try (InputStream stream = in) {
        if (all != null) {
          stream.transferTo(all);
          return;
        }
        ByteArrayOutputStream line = new ByteArrayOutputStream();
        int b;
        while ((b = stream.read()) != -1) {
          if (b == '\n') {
            addLine(line.toString(StandardCharsets.UTF_8));
            line.reset();
          } else {
            line.write(b);
          }
        }
        if (line.size() > 0) {
          addLine(line.toString(StandardCharsets.UTF_8));
        }
      } catch (IOException e) {
        failure = e;
      }
    }

    private void addLine(String raw) {
      String line = stripAnsi(raw);
      if (onLine != null) {
        onLine.accept(line);
      }
      synchronized (lines) {
        lines.addLast(line);
        while (lines.size() > STDERR_TAIL_LINES) {
          lines.removeFirst();
        }
      }
    }

    /** What was read; waits (at most 10 s) for the stream to end. */
    String text() {
      try {
        join(10_000);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
      String suffix = failure == null ? "" : "\n(reading it failed: " + failure + ")";
      if (all != null) {
        synchronized (all) {
          return all.toString(StandardCharsets.UTF_8) + suffix;
        }
      }
      synchronized (lines) {
        return String.join("\n", lines) + suffix;
      }
    }
  }
}
