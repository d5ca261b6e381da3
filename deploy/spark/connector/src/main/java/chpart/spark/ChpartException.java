package chpart.spark;

import java.util.List;
import java.util.Map;

/**
 * A {@code chpart} command exited with a non-zero status (or could not be run).
 *
 * <p>The message names the command, what it was doing (load, partition, attempt), the exit code
 * with its class from chpart's contract (2 usage or configuration, 3 retryable, 4 permanent,
 * 5 fenced: the load is no longer open; negative: killed by that signal) and the last lines chpart
 * wrote to stderr, so a failed Spark task or write shows chpart's own explanation.
 */
public class ChpartException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** What the documented exit codes mean (README "Exit codes"). */
  static final Map<Integer, String> EXIT_MEANINGS =
      Map.of(
          2, "usage or configuration error",
          3, "retryable failure",
          4, "permanent failure",
          5, "the load is no longer open: this attempt was fenced");

  private final String command;
  private final int exitCode;
  private final String stderrTail;
  private final List<String> argv;

  ChpartException(String command, int exitCode, String stderrTail, List<String> argv, String context) {
    this(command, exitCode, stderrTail, argv, context, "");
  }

  ChpartException(
      String command, int exitCode, String stderrTail, List<String> argv, String context, String more) {
    super(message(command, exitCode, stderrTail, context) + more);
    this.command = command;
    this.exitCode = exitCode;
    this.stderrTail = stderrTail;
    this.argv = List.copyOf(argv);
  }

  private static String message(String command, int exitCode, String stderrTail, String context) {
    String meaning =
        exitCode < 0
            ? "killed by signal " + (-exitCode)
            : EXIT_MEANINGS.getOrDefault(exitCode, "unexpected exit code");
    String where = context.isEmpty() ? "" : " (" + context + ")";
    String tail = stderrTail.strip().isEmpty() ? "(no stderr output)" : stderrTail.strip();
    return "chpart " + command + where + " exited with code " + exitCode + " (" + meaning
        + "); stderr tail:\n" + tail;
  }

  /** {@code build}, {@code begin}, {@code commit}, ... */
  public String command() {
    return command;
  }

  /** The exit code; negative: killed by that signal; 127: the binary could not be run. */
  public int exitCode() {
    return exitCode;
  }

  /** The last lines chpart wrote to stderr. */
  public String stderrTail() {
    return stderrTail;
  }

  /** The command line (never holds a secret: those come from the config file or the environment). */
  public List<String> argv() {
    return argv;
  }

  /** Exit code 3 (network, server busy, timeouts): retrying may help. */
  public boolean retryable() {
    return exitCode == 3;
  }

  /** Exit code 5: the load is committed or aborted. */
  public boolean fenced() {
    return exitCode == 5;
  }

  /**
   * {@code chpart commit} failed. The load is not aborted (the commit may already have made rows
   * visible and it is resumable): the winners file is kept and the message says how to finish it.
   */
  public static final class CommitException extends ChpartException {
    private static final long serialVersionUID = 1L;
    private final String winnersPath;
    private final String resumeHint;

    CommitException(ChpartException cause, String context, String winnersPath, String resumeHint) {
      super(
          cause.command(),
          cause.exitCode(),
          cause.stderrTail(),
          cause.argv(),
          context,
          winnersPath == null
              ? "\nFinish the load with:\n  " + resumeHint
              : "\nThe winners are kept in " + winnersPath + "; finish the load with:\n  "
                  + resumeHint
                  + "\n(once `chpart status --load` shows its plan, `chpart commit --load` alone"
                  + " finishes it on any machine, without the file)");
      this.winnersPath = winnersPath;
      this.resumeHint = resumeHint;
    }

    /** The winners file kept for a re-run (null when the commit resumed from the ledger). */
    public String winnersPath() {
      return winnersPath;
    }

    /** The {@code chpart commit} command that finishes the load. */
    public String resumeHint() {
      return resumeHint;
    }
  }
}
