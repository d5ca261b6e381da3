package chpart.spark;

import java.io.IOException;
import java.io.InterruptedIOException;
import java.nio.channels.WritableByteChannel;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.VectorUnloader;
import org.apache.arrow.vector.ipc.ArrowStreamWriter;
import org.apache.arrow.vector.ipc.message.ArrowRecordBatch;
import org.apache.spark.sql.execution.arrow.ArrowWriter;
import org.apache.spark.sql.types.StructType;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * An Arrow IPC stream whose record batches are serialized and written by a thread of their own:
 * the task's thread converts rows into one batch while this thread writes the previous one into
 * the channel (chpart's stdin). Two batches in all, handed back and forth, so the task's thread
 * waits only when the channel is slower than Spark's rows.
 *
 * <p>Guarantees: the batches reach the channel in the order they were sent; the writer thread
 * writes record batches only, never the schema or the end-of-stream marker, which only {@link
 * #start()} and {@link #end()} write, on the caller's thread, once every batch sent is written. A
 * failure of the writer thread is thrown by the next {@link #send()}, {@link #drain()} or {@link
 * #end()}, and the batches sent after it are dropped. {@link #close()} stops the thread without
 * writing the marker and releases the batches' memory (left to the JVM if the thread cannot be
 * stopped, e.g. blocked in a write: kill the reader first).
 */
final class ArrowPipe implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(ArrowPipe.class);
  private static final Object STOP = new Object();

  private final ArrowWriter first;
  private final ArrowWriter second;
  private final Framing stream;
  private final BlockingQueue<Object> full = new LinkedBlockingQueue<>();
  private final BlockingQueue<ArrowWriter> free = new LinkedBlockingQueue<>();
  private final Thread writer;
  private volatile IOException failure;
  private volatile long writeNanos;
  private long waitNanos;
  private ArrowWriter current;
  private boolean stopped;

  /**
   * Spark's own Arrow conversion of {@code schema}: every TimestampType as Timestamp(us, "UTC")
   * (an instant), TimestampNTZType as a zone-less Timestamp(us).
   */
  ArrowPipe(StructType schema, WritableByteChannel out, String threadName) {
    first = ArrowWriter.create(schema, "UTC", true, false);
    second = ArrowWriter.create(schema, "UTC", true, false);
    stream = new Framing(first.root(), out);
    current = first;
    free.add(second);
    writer = new Thread(this::writeBatches, threadName);
    writer.setDaemon(true);
    writer.start();
  }

  /** The batch the caller fills: valid until the next {@link #send()}. */
  ArrowWriter current() {
    return current;
  }

  /** Writes the stream's schema message (caller's thread, before any {@link #send()}). */
  void start() throws IOException {
    stream.start();
  }

  /** Hands the current batch to the writer thread; returns with an empty one to fill. */
  void send() throws IOException {
    throwIfFailed();
    current.finish();
    full.add(current);
    current = takeFree();
    throwIfFailed();
  }

  /** Waits until every batch sent is in the channel. */
  void drain() throws IOException {
    ArrowWriter other = takeFree();
    free.add(other);
    throwIfFailed();
  }

  /**
   * Waits for the batches sent, stops the writer thread, then writes the end-of-stream marker on
   * this thread.
   */
  void end() throws IOException {
    drain();
    stop();
    if (writer.isAlive()) {
      throw new IOException("the Arrow stream's writer thread did not stop");
    }
    stream.end();
  }

  /** Time the caller waited for the writer thread in {@link #send()} and {@link #drain()}. */
  double waitSecs() {
    return waitNanos / 1e9;
  }

  /** Time the writer thread spent serializing batches and writing them. */
  double writeSecs() {
    return writeNanos / 1e9;
  }

  @Override
  public void close() {
    stop();
    if (writer.isAlive()) {
      LOG.warn("{} did not stop: its Arrow buffers are left to the JVM", writer.getName());
      return;
    }
    first.root().close();
    second.root().close();
  }

  private void stop() {
    if (!stopped) {
      stopped = true;
      full.add(STOP);
    }
    boolean interrupted = false;
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
    while (writer.isAlive() && System.nanoTime() < deadline) {
      try {
        writer.join(1000);
      } catch (InterruptedException e) {
        interrupted = true; // still wait: the buffers must not be released under a write
      }
    }
    if (interrupted) {
      Thread.currentThread().interrupt();
    }
  }

  private ArrowWriter takeFree() throws IOException {
    long t0 = System.nanoTime();
    try {
      return free.take();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new InterruptedIOException("interrupted while waiting for the Arrow stream's writer thread");
    } finally {
      waitNanos += System.nanoTime() - t0;
    }
  }

  private void throwIfFailed() throws IOException {
    IOException e = failure;
    if (e != null) {
      throw e;
    }
  }

  private void writeBatches() {
    while (true) {
      Object next;
      try {
        next = full.take();
      } catch (InterruptedException e) {
        return; // nobody interrupts this thread but the JVM's shutdown
      }
      if (next == STOP) {
        return;
      }
      ArrowWriter batch = (ArrowWriter) next;
      if (failure == null) {
        long t0 = System.nanoTime();
        try {
          stream.write(batch.root());
        } catch (IOException e) {
          failure = e;
        } catch (RuntimeException e) {
          failure = new IOException(e);
        }
        writeNanos += System.nanoTime() - t0;
      }
      batch.reset();
      free.add(batch);
    }
  }

  /** The stream's framing (schema, end-of-stream marker), and record batches of any root. */
  private static final class Framing extends ArrowStreamWriter {
    Framing(VectorSchemaRoot schemaRoot, WritableByteChannel out) {
      super(schemaRoot, null, out);
    }

    void write(VectorSchemaRoot root) throws IOException {
      try (ArrowRecordBatch batch = new VectorUnloader(root).getRecordBatch()) {
        writeRecordBatch(batch);
      }
    }
  }
}
