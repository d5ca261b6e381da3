package chpart.spark;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.channels.WritableByteChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Arrays;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowStreamReader;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * TEST PROGRAM (tests/spark/test_arrow_pipe.py), on the classpath with the connector's jar: drives
 * {@link ArrowPipe} (the connector's Arrow stream into chpart's stdin) against a file through a
 * channel that is slow (so the task's thread fills one batch while the writer thread writes the
 * other) or fails, and checks its guarantees by reading the bytes back with Arrow's own reader.
 *
 * <pre>
 *   order &lt;file&gt; &lt;batches&gt; &lt;rows&gt;    every row, in order, then the end-of-stream marker
 *   no-marker &lt;file&gt; &lt;batches&gt; &lt;rows&gt; every row in the file once drain() returns;
 *                                    closed without end(): no marker
 *   failure &lt;file&gt; &lt;batches&gt; &lt;rows&gt;   the channel fails: send()/drain() throw its error,
 *                                    nothing more is written, close() stops the thread
 * </pre>
 *
 * Prints "ok ..." and exits 0, or prints what broke on stderr and exits 1.
 */
public final class ArrowPipeContract {
  private static final int FAIL_AT = 20;
  private static final byte[] MARKER = {-1, -1, -1, -1, 0, 0, 0, 0};
  private static final StructType SCHEMA =
      new StructType().add("id", DataTypes.LongType, false).add("name", DataTypes.StringType, true);

  public static void main(String[] args) throws Exception {
    Path file = Path.of(args[1]);
    int batches = Integer.parseInt(args[2]);
    int rows = Integer.parseInt(args[3]);
    switch (args[0]) {
      case "order" -> order(file, batches, rows);
      case "no-marker" -> noMarker(file, batches, rows);
      case "failure" -> failure(file, batches, rows);
      default -> fail("unknown mode " + args[0]);
    }
  }

  private static void order(Path file, int batches, int rows) throws Exception {
    Slow out = new Slow(open(file), -1, 1);
    ArrowPipe pipe = new ArrowPipe(SCHEMA, out, "test pipe");
    pipe.start();
    fill(pipe, batches, rows);
    pipe.end();
    pipe.close();
    out.close();
    check(readBack(file) == (long) batches * rows, "rows read back");
    byte[] bytes = Files.readAllBytes(file);
    check(Arrays.equals(Arrays.copyOfRange(bytes, bytes.length - 8, bytes.length), MARKER),
        "the stream ends with the end-of-stream marker");
    System.out.println("ok " + batches + " batches of " + rows + " rows in order, then the marker");
  }

  private static void noMarker(Path file, int batches, int rows) throws Exception {
    Slow out = new Slow(open(file), -1, 20); // the last batch still on its way when drain() is called
    ArrowPipe pipe = new ArrowPipe(SCHEMA, out, "test pipe");
    pipe.start();
    fill(pipe, batches, rows);
    pipe.drain();
    check(readBack(file) == (long) batches * rows, "every row in the channel once drain() returns");
    pipe.close();
    out.close();
    byte[] bytes = Files.readAllBytes(file);
    check(!Arrays.equals(Arrays.copyOfRange(bytes, bytes.length - 8, bytes.length), MARKER),
        "no end-of-stream marker without end()");
    check(readBack(file) == (long) batches * rows, "rows read back");
    System.out.println("ok " + batches + " batches drained, no marker");
  }

  private static void failure(Path file, int batches, int rows) throws Exception {
    Slow out = new Slow(open(file), FAIL_AT, 1);
    ArrowPipe pipe = new ArrowPipe(SCHEMA, out, "test pipe");
    pipe.start();
    IOException thrown = null;
    int sent = 0;
    try {
      long id = 0;
      for (; sent < batches; sent++) {
        for (int r = 0; r < rows; r++, id++) {
          pipe.current().write(row(id));
        }
        pipe.send();
      }
      pipe.drain();
    } catch (IOException e) {
      thrown = e;
    }
    check(thrown != null && "the channel broke".equals(thrown.getMessage()),
        "send()/drain() throw the channel's error, got " + thrown);
    try {
      pipe.send();
      fail("send() after the failure returned");
    } catch (IOException e) {
      check("the channel broke".equals(e.getMessage()), "a later send() throws the same error");
    }
    pipe.close();
    check(out.calls == FAIL_AT + 1, "no write tried after the failed one (" + out.calls + " calls)");
    out.close();
    System.out.println("ok failed after " + sent + " batches sent");
  }

  private static void fill(ArrowPipe pipe, int batches, int rows) throws IOException {
    long id = 0;
    for (int b = 0; b < batches; b++) {
      for (int r = 0; r < rows; r++, id++) {
        pipe.current().write(row(id));
      }
      pipe.send();
    }
  }

  private static GenericInternalRow row(long id) {
    return new GenericInternalRow(
        new Object[] {id, id % 7 == 0 ? null : UTF8String.fromString("row " + id + " " + "x".repeat((int) (id % 50)))});
  }

  /** Reads the file as an Arrow stream; checks every row's values and order; returns the count. */
  private static long readBack(Path file) throws IOException {
    long id = 0;
    try (RootAllocator allocator = new RootAllocator();
        ArrowStreamReader reader = new ArrowStreamReader(Files.newInputStream(file), allocator)) {
      VectorSchemaRoot root = reader.getVectorSchemaRoot();
      while (reader.loadNextBatch()) {
        BigIntVector ids = (BigIntVector) root.getVector("id");
        VarCharVector names = (VarCharVector) root.getVector("name");
        for (int i = 0; i < root.getRowCount(); i++, id++) {
          check(ids.get(i) == id, "row " + id + " has id " + ids.get(i));
          GenericInternalRow expected = row(id);
          if (expected.isNullAt(1)) {
            check(names.isNull(i), "row " + id + ": name is null");
          } else {
            check(expected.getUTF8String(1).toString().equals(new String(names.get(i), "UTF-8")),
                "row " + id + ": name");
          }
        }
      }
    }
    return id;
  }

  private static WritableByteChannel open(Path file) throws IOException {
    return FileChannel.open(file, StandardOpenOption.CREATE, StandardOpenOption.TRUNCATE_EXISTING,
        StandardOpenOption.WRITE);
  }

  private static void check(boolean ok, String what) {
    if (!ok) {
      fail("broken: " + what);
    }
  }

  private static void fail(String message) {
    System.err.println(message);
    System.exit(1);
  }

  /**
   * A channel that sleeps per write (the task's thread then fills the other batch meanwhile)
   * and, after {@code failAt} writes (unless negative), throws.
   */
  private static final class Slow implements WritableByteChannel {
    private final WritableByteChannel out;
    private final int failAt;
    private final long sleepMillis;
    volatile int calls;

    Slow(WritableByteChannel out, int failAt, long sleepMillis) {
      this.out = out;
      this.failAt = failAt;
      this.sleepMillis = sleepMillis;
    }

    @Override
    public int write(ByteBuffer src) throws IOException {
      calls++;
      if (failAt >= 0 && calls > failAt) {
        throw new IOException("the channel broke");
      }
      try {
        Thread.sleep(sleepMillis);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IOException(e);
      }
      return out.write(src);
    }

    @Override
    public boolean isOpen() {
      return out.isOpen();
    }

    @Override
    public void close() throws IOException {
      out.close();
    }
  }
}
