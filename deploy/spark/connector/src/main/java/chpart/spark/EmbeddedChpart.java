package chpart.spark;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.AtomicMoveNotSupportedException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.security.SecureRandom;
import java.util.HexFormat;
import java.util.Locale;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentMap;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.spark.SparkEnv;
import org.apache.spark.util.Utils;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The chpart binary the jar carries (deploy/spark/build-portable.sh builds it, build-connector.sh
 * puts it at {@link #RESOURCE} with its sha256 and version beside it), made runnable on the host
 * of this JVM, the driver's or an executor's.
 *
 * <p>It is extracted once per JVM into Spark's local directory under a name made of its digest
 * ({@code chpart-<first 16 hex of sha256>}): written to a temp file of its own, fsynced, checked
 * against the recorded sha256, made executable and renamed onto that name in one step, so a
 * reader never sees a partial file, concurrent tasks of one JVM extract it once (one lock per
 * directory), and other JVMs on the host (another executor, the driver) that race it rename the
 * same bytes onto the same name. A file already there is used only if its sha256 is the
 * recorded one; otherwise the run fails naming the file (changed on disk: delete it). A checked
 * file is re-hashed when its size or modification time changes.
 */
final class EmbeddedChpart {
  private static final Logger LOG = LoggerFactory.getLogger(EmbeddedChpart.class);
  /** The platform the embedded binary is built for (the only one build-portable.sh makes). */
  static final String PLATFORM = "linux-x86_64";
  static final String RESOURCE = "chpart/" + PLATFORM + "/chpart";
  static final String SHA256_RESOURCE = RESOURCE + ".sha256";
  static final String VERSION_RESOURCE = RESOURCE + ".version";

  /** Checked files by directory: the process-wide "extracted once" and its lock. */
  private static final ConcurrentMap<Path, Extracted> BY_DIR = new ConcurrentHashMap<>();
  /** How many times this JVM wrote the binary out (tests: once per directory, however many tasks). */
  static final AtomicInteger EXTRACTIONS = new AtomicInteger();

  private EmbeddedChpart() {}

  /** A binary checked at a path, with what it looked like when it was hashed. */
  private static final class Extracted {
    Path path;
    long size;
    long modifiedMillis;
  }

  /**
   * The sha256 (hex) the jar recorded for its binary, or null when this jar carries none or this
   * host cannot run it (not Linux on x86_64): then PATH is looked at instead.
   */
  static String recordedSha256() {
    if (!runnableHere()) {
      return null;
    }
    String text = resourceText(SHA256_RESOURCE);
    if (text == null || EmbeddedChpart.class.getClassLoader().getResource(RESOURCE) == null) {
      return null;
    }
    return text.strip().toLowerCase(Locale.ROOT);
  }

  /** {@code chpart --version} of the embedded binary as recorded at build time, or null. */
  static String recordedVersion() {
    String text = resourceText(VERSION_RESOURCE);
    return text == null ? null : text.strip();
  }

  static boolean runnableHere() {
    String os = System.getProperty("os.name", "").toLowerCase(Locale.ROOT);
    String arch = System.getProperty("os.arch", "").toLowerCase(Locale.ROOT);
    return os.equals("linux") && (arch.equals("amd64") || arch.equals("x86_64"));
  }

  /**
   * The path of the embedded binary in Spark's local directory of this JVM ({@code
   * Utils.getLocalDir}: spark.local.dir, or the directories YARN or a standalone worker give the
   * executor), extracted if needed.
   *
   * @param expectedSha256 the digest the driver chose: this JVM's jar must carry the same binary
   */
  static Path path(String expectedSha256) {
    SparkEnv env = SparkEnv.get();
    if (env == null) {
      throw new IllegalStateException("chpart data source: the embedded chpart binary is extracted into Spark's local"
          + " directory, and this JVM has no SparkEnv (" + host() + ")");
    }
    return extractInto(Path.of(Utils.getLocalDir(env.conf())), expectedSha256);
  }

  /** {@link #path}, into {@code dir} (tests call this without Spark). */
  static Path extractInto(Path dir, String expectedSha256) {
    String recorded = recordedSha256();
    if (recorded == null) {
      throw new IllegalStateException("chpart data source: the driver runs the chpart binary embedded in the"
          + " connector's jar (sha256 " + expectedSha256 + "), but the chpart-spark jar on " + host()
          + " carries none for this platform (os " + System.getProperty("os.name") + ", arch "
          + System.getProperty("os.arch") + "): ship the same jar with --jars, or give option chpart");
    }
    if (!recorded.equals(expectedSha256)) {
      throw new IllegalStateException("chpart data source: the chpart binary embedded in the jar on " + host()
          + " (sha256 " + recorded + ", " + recordedVersion() + ") is not the driver's (sha256 " + expectedSha256
          + "): another chpart-spark jar is on this executor's classpath; ship the driver's with --jars");
    }
    Path directory = dir.toAbsolutePath().normalize();
    Extracted extracted = BY_DIR.computeIfAbsent(directory, d -> new Extracted());
    synchronized (extracted) {
      if (extracted.path != null && unchanged(extracted)) {
        return extracted.path;
      }
      Path target = directory.resolve("chpart-" + recorded.substring(0, 16));
      try {
        if (!Files.exists(target)) {
          extract(directory, target, recorded);
        }
        String actual = sha256(target);
        if (!actual.equals(recorded)) {
          throw new IllegalStateException("chpart data source: " + target + " on " + host() + " has sha256 " + actual
              + ", the jar recorded " + recorded + " for its chpart binary: the file was changed after it was"
              + " extracted; delete it (the next task extracts it again)");
        }
        if (!Files.isExecutable(target)) {
          throw new IllegalStateException("chpart data source: " + target + " on " + host() + " is not executable");
        }
        extracted.path = target;
        extracted.size = Files.size(target);
        extracted.modifiedMillis = Files.getLastModifiedTime(target).toMillis();
        return target;
      } catch (IOException e) {
        throw new IllegalStateException("chpart data source: cannot extract the jar's chpart binary into " + directory
            + " on " + host() + ": " + e, e);
      }
    }
  }

  private static boolean unchanged(Extracted e) {
    try {
      return Files.size(e.path) == e.size && Files.getLastModifiedTime(e.path).toMillis() == e.modifiedMillis;
    } catch (IOException gone) {
      return false;
    }
  }

  /** Stage to a temp file of this JVM, check, then publish by one rename. */
  private static void extract(Path directory, Path target, String recorded) throws IOException {
    Files.createDirectories(directory);
    String nonce = HexFormat.of().formatHex(new SecureRandom().generateSeed(6));
    Path tmp = directory.resolve(".chpart-" + ProcessHandle.current().pid() + "-" + nonce + ".tmp");
    try {
      try (InputStream in = EmbeddedChpart.class.getClassLoader().getResourceAsStream(RESOURCE);
           FileChannel channel = FileChannel.open(tmp, StandardOpenOption.CREATE_NEW, StandardOpenOption.WRITE);
           OutputStream out = java.nio.channels.Channels.newOutputStream(channel)) {
        if (in == null) {
          throw new NoSuchFileException(RESOURCE + " (in the connector's jar)");
        }
        in.transferTo(out);
        channel.force(true);
      }
      String actual = sha256(tmp);
      if (!actual.equals(recorded)) {
        throw new IllegalStateException("chpart data source: the chpart binary extracted from the jar to " + tmp + " on "
            + host() + " has sha256 " + actual + ", the jar recorded " + recorded + ": the jar is damaged");
      }
      EXTRACTIONS.incrementAndGet();
      Files.setPosixFilePermissions(tmp, PosixFilePermissions.fromString("r-xr-xr-x"));
      try {
        Files.move(tmp, target, StandardCopyOption.ATOMIC_MOVE);
      } catch (AtomicMoveNotSupportedException e) {
        throw new IOException("cannot rename " + tmp + " onto " + target + " atomically", e);
      }
      LOG.info("chpart data source: extracted the jar's {} (sha256 {}) to {}", recordedVersion(), recorded, target);
    } finally {
      Files.deleteIfExists(tmp);
    }
  }

  static String sha256(Path file) throws IOException {
    MessageDigest digest;
    try {
      digest = MessageDigest.getInstance("SHA-256");
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
    byte[] buffer = new byte[1 << 16];
    try (InputStream in = Files.newInputStream(file)) {
      int n;
      while ((n = in.read(buffer)) > 0) {
        digest.update(buffer, 0, n);
      }
    }
    return HexFormat.of().formatHex(digest.digest());
  }

  private static String resourceText(String name) {
    try (InputStream in = EmbeddedChpart.class.getClassLoader().getResourceAsStream(name)) {
      return in == null ? null : new String(in.readAllBytes(), StandardCharsets.UTF_8);
    } catch (IOException e) {
      throw new IllegalStateException("chpart data source: cannot read " + name + " from the connector's jar: " + e, e);
    }
  }

  static String host() {
    try {
      return "host " + InetAddress.getLocalHost().getHostName();
    } catch (IOException e) {
      return "host (unknown: " + e.getMessage() + ")";
    }
  }
}
