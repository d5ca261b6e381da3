package chpart.spark;

import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.TreeSet;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

/**
 * TEST PROGRAM (tests/spark/test_embedded_chpart.py), on the classpath with the connector's jar:
 * {@code <threads>} threads of this JVM, released together, each extract the jar's chpart into
 * {@code <dir>} (EmbeddedChpart.extractInto, what every task's first run does). Prints each
 * distinct path returned, one per line, then "<calls> calls, <n> extractions" (how many times
 * this JVM wrote the file); an error's message on stderr and exit 1.
 */
public final class ExtractConcurrently {
  public static void main(String[] args) throws Exception {
    Path dir = Path.of(args[0]);
    int threads = Integer.parseInt(args[1]);
    String sha = EmbeddedChpart.recordedSha256();
    if (sha == null) {
      System.err.println("the jar on the classpath carries no chpart binary for this platform");
      System.exit(1);
    }
    CyclicBarrier start = new CyclicBarrier(threads);
    ExecutorService pool = Executors.newFixedThreadPool(threads);
    List<Future<Path>> calls = new ArrayList<>();
    for (int i = 0; i < threads; i++) {
      calls.add(pool.submit(() -> {
        start.await();
        return EmbeddedChpart.extractInto(dir, sha);
      }));
    }
    TreeSet<String> paths = new TreeSet<>();
    try {
      for (Future<Path> call : calls) {
        paths.add(call.get().toString());
      }
    } catch (java.util.concurrent.ExecutionException e) {
      System.err.println(e.getCause().getMessage());
      System.exit(1);
    } finally {
      pool.shutdownNow();
    }
    paths.forEach(System.out::println);
    System.out.println(calls.size() + " calls, " + EmbeddedChpart.EXTRACTIONS.get() + " extractions");
  }
}
