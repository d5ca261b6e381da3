package chpart.spark;

import java.io.BufferedOutputStream;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.io.OutputStream;
import java.nio.ByteBuffer;
import java.nio.channels.WritableByteChannel;
import java.util.Iterator;
import java.util.List;
import java.util.Locale;
import org.apache.spark.TaskContext;
import org.apache.spark.util.TaskInterruptListener;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.metric.CustomTaskMetric;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.execution.arrow.ArrowWriter;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One task attempt: its rows go as an Arrow IPC stream into the stdin of one {@code chpart build
 * --input -} process, started with the first row (or at commit for an empty partition).
 *
 * <p>The task's thread converts the rows into Arrow batches; a thread of the stream's own writes
 * them into chpart's stdin ({@link ArrowPipe}), so the conversion and the writes use two cores.
 *
 * <p>The stream's end-of-stream marker is written only in {@link #commit()}, which Spark calls
 * after the commit coordinator allowed this attempt to commit. chpart builds, uploads and
 * publishes only once it has read that marker (a stream that ends without it is refused), so an
 * attempt that is denied, fails or is killed before then publishes nothing: {@link #abort()} kills
 * the process before its stdin is closed. The Arrow stream writer is never closed (its close()
 * would write the marker), only its buffers are released.
 */
final class ChpartDataWriter implements DataWriter<InternalRow> {
  private static final Logger LOG = LoggerFactory.getLogger(ChpartDataWriter.class);
  private static final int BATCH_ROWS = 8192;
  private static final long BATCH_BYTES = 16L << 20;

  private final ChpartWriterFactory job;
  private final int partition;
  private final String attempt;
  private final String context;
  private final TaskContext task;

  private Process proc;
  private List<String> argv;
  private Chpart.Drain stdout;
  private Chpart.Drain stderr;
  private volatile String timingsLine;
  private CountingStream pipe;
  private ArrowPipe stream;
  private long rows;
  private int batchRows;
  private boolean finished;
  // Where the stream's time went (logged at commit): since the first row, and the rows'
  // conversion to Arrow, timed on every 16th row.
  private long streamStartNanos;
  private long sampledConvertNanos;

  ChpartDataWriter(ChpartWriterFactory job, int partition, long taskAttemptId) {
    this.job = job;
    this.partition = partition;
    // taskAttemptId is the only per-attempt number unique within an application attempt; the
    // prefix (application id, application attempt, the write's nonce) makes it unique across
    // application attempts and writes.
    this.attempt = job.attemptPrefix + "." + taskAttemptId;
    this.task = TaskContext.get();
    this.context =
        "load " + job.load + ", partition " + partition + ", attempt " + attempt + " (attempt number "
            + (task == null ? "?" : task.attemptNumber()) + ")";
    if (task != null) {
      // Spark kills a task (a speculative loser, a zombie at the end of its job): its build goes
      // with it, before its input is complete.
      task.addTaskInterruptListener((TaskInterruptListener) (ctx, reason) -> killBuild());
    }
  }

  @Override
  public void write(InternalRow row) throws IOException {
    if (job.nothingToBuild) {
      return; // the load was committed or planned by an earlier run: these rows are not needed
    }
    start();
    ArrowWriter arrow = stream.current();
    if ((rows & 15) == 0) {
      long t0 = System.nanoTime();
      arrow.write(row);
      sampledConvertNanos += System.nanoTime() - t0;
    } else {
      arrow.write(row);
    }
    rows++;
    batchRows++;
    if (batchRows >= BATCH_ROWS || (batchRows % 1024 == 0 && arrow.sizeInBytes() >= BATCH_BYTES)) {
      flush();
    }
  }

  /**
   * Spark 4.3 writes a task's rows through this, then reads the metrics one last time, then asks
   * the commit coordinator and calls commit(): the last batch goes out here (without the
   * end-of-stream marker) so that the metrics count every row and byte streamed.
   */
  @Override
  public void writeAll(Iterator<InternalRow> records) throws IOException {
    while (records.hasNext()) {
      write(records.next());
    }
    if (stream != null) {
      if (batchRows > 0) {
        flush();
      }
      drain(); // every batch in chpart's stdin before Spark reads the metrics
    }
  }

  @Override
  public WriterCommitMessage commit() throws IOException {
    if (job.nothingToBuild) {
      return ChpartCommitMessage.nothingBuilt(partition);
    }
    start(); // an empty partition still builds: its manifest (no parts) is the partition's winner
    if (batchRows > 0) {
      flush();
    }
    drain();
    LOG.info("chpart build ({}): streamed {} rows, {} MB of Arrow in {}", context, rows,
        String.format(Locale.ROOT, "%.1f", (pipe == null ? 0 : pipe.count) / 1e6), streamTimes());
    try {
      stream.end(); // the end-of-stream marker: the input is complete, chpart may publish
      pipe.close();
    } catch (IOException e) {
      throw failed(e);
    }
    int code = Chpart.waitFor(proc);
    finished = true;
    String out = stdout.text();
    String err = stderr.text(); // also waits for the drain to have seen every line (timingsLine)
    if (code != 0) {
      throw new ChpartException("build", code, err, argv, context);
    }
    ChpartCommitMessage message;
    try {
      message = ChpartCommitMessage.ofBuild(partition, job.load, attempt, Chpart.lastLine(out), timingsLine);
    } catch (IllegalStateException e) {
      throw new ChpartException("build", code, e.getMessage() + "\nstderr:\n" + err, argv, context);
    }
    LOG.info("chpart build published: {}", message);
    return message;
  }

  @Override
  public void abort() {
    killBuild();
    if (proc != null) {
      Chpart.waitFor(proc);
      finished = true;
      try {
        proc.getOutputStream().close(); // only now: chpart is gone, it cannot take this for an end
      } catch (IOException ignored) {
        // a pipe nobody reads any more
      }
    }
  }

  @Override
  public void close() {
    if (proc != null && !finished) {
      abort(); // commit() did not finish: whatever went wrong, this attempt must not publish
    }
    release();
  }

  @Override
  public CustomTaskMetric[] currentMetricsValues() {
    return new CustomTaskMetric[] {
      ChpartMetrics.value(ChpartMetrics.ROWS_STREAMED, rows),
      ChpartMetrics.value(ChpartMetrics.ARROW_BYTES, pipe == null ? 0 : pipe.count),
    };
  }

  private void killBuild() {
    Process p = proc;
    if (p != null && p.isAlive()) {
      LOG.warn("chpart build ({}): Spark killed the task, killing its build (pid {})", context, p.pid());
      p.destroyForcibly();
    }
  }

  /** Starts chpart build and the Arrow stream into its stdin (once). */
  private void start() throws IOException {
    if (proc != null) {
      return;
    }
    List<String> args =
        List.of(
            "--load", job.load,
            "--partition", String.valueOf(partition),
            "--attempt", attempt,
            "--stage", String.valueOf(task == null ? 0 : task.stageId()),
            "--stage-attempt", String.valueOf(task == null ? 0 : task.stageAttemptNumber()),
            "--attempt-number", String.valueOf(task == null ? 0 : task.attemptNumber()),
            "--input", "-",
            "--die-with-parent");
    Chpart cli = job.cli;
    ProcessBuilder pb = cli.processBuilder("build", args);
    argv = pb.command();
    try {
      // From this (the task's) thread: --die-with-parent ties chpart's life to it.
      proc = pb.start();
    } catch (IOException e) {
      throw new ChpartException(
          "build", 127, "cannot run " + cli.binary() + " on this executor: " + e.getMessage(), argv, context);
    }
    stdout = Chpart.Drain.all(proc.getInputStream(), "chpart build stdout " + attempt);
    stderr =
        Chpart.Drain.tail(
            proc.getErrorStream(),
            "chpart build stderr " + attempt,
            line -> {
              if (ChpartCommitMessage.TIMINGS.matcher(line).find()) {
                timingsLine = line;
              }
            });
    pipe = new CountingStream(new BufferedOutputStream(proc.getOutputStream(), 1 << 16));
    // Spark's own Arrow conversion, as chpart_spark.write streams the rows (ArrowPipe).
    stream = new ArrowPipe(job.schema, pipe, "chpart build stdin " + attempt);
    streamStartNanos = System.nanoTime();
    try {
      stream.start();
    } catch (IOException e) {
      throw failed(e);
    }
  }

  private void flush() throws IOException {
    batchRows = 0;
    try {
      stream.send();
    } catch (IOException e) {
      throw streamFailed(e);
    }
  }

  private void drain() throws IOException {
    try {
      stream.drain();
    } catch (IOException e) {
      throw streamFailed(e);
    }
  }

  /**
   * The stream's error as the task should see it: an interrupt as itself (Spark is killing the
   * task, its listener killed the build, abort() follows), anything else as chpart's failure.
   */
  private ChpartException streamFailed(IOException e) throws InterruptedIOException {
    if (e instanceof InterruptedIOException interrupted) {
      throw interrupted;
    }
    return failed(e);
  }

  /**
   * "4.10 s; the task's thread: about 1.90 s converting rows to Arrow, 0.20 s waiting for the
   * stream's writer thread, 2.00 s in Spark (reading the rows); the writer thread: 1.10 s
   * serializing batches and writing them into chpart's stdin".
   */
  private String streamTimes() {
    double total = (System.nanoTime() - streamStartNanos) / 1e9;
    double wait = stream.waitSecs();
    double convert = Math.min(sampledConvertNanos * 16 / 1e9, Math.max(0, total - wait));
    return String.format(Locale.ROOT,
        "%.2f s; the task's thread: about %.2f s converting rows to Arrow, %.2f s waiting for the stream's"
            + " writer thread, %.2f s in Spark (reading the rows); the writer thread: %.2f s serializing"
            + " batches and writing them into chpart's stdin",
        total, convert, wait, Math.max(0, total - wait - convert), stream.writeSecs());
  }

  /**
   * Writing to chpart's stdin failed: chpart stopped reading (it failed, e.g. a schema mismatch or
   * a fenced load). Its exit status and stderr say why.
   */
  private ChpartException failed(IOException e) {
    int code = Chpart.waitFor(proc);
    finished = true;
    String tail = stderr.text();
    if (code == 0) {
      tail = "chpart build stopped reading its input (" + e + ") but exited 0\n" + tail;
      code = 4;
    }
    return new ChpartException("build", code, tail, argv, context);
  }

  private void release() {
    if (stream != null) {
      stream.close();
      stream = null;
    }
  }

  /**
   * chpart's stdin as a channel that a thread interrupt does not close (the JDK's
   * Channels.newChannel would), counting the bytes written.
   */
  private static final class CountingStream implements WritableByteChannel {
    private final OutputStream out;
    private final byte[] chunk = new byte[1 << 16]; // a direct buffer's bytes on their way out
    private boolean open = true;
    volatile long count;

    CountingStream(OutputStream out) {
      this.out = out;
    }

    @Override
    public int write(ByteBuffer src) throws IOException {
      int n = src.remaining();
      if (src.hasArray()) {
        out.write(src.array(), src.arrayOffset() + src.position(), n);
        src.position(src.limit());
      } else {
        while (src.hasRemaining()) {
          int len = Math.min(chunk.length, src.remaining());
          src.get(chunk, 0, len);
          out.write(chunk, 0, len);
        }
      }
      count += n;
      return n;
    }

    @Override
    public boolean isOpen() {
      return open;
    }

    @Override
    public void close() throws IOException {
      if (open) {
        open = false;
        out.close(); // flushes, then closes chpart's stdin
      }
    }
  }
}
