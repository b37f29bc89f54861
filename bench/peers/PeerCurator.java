// Peer: Apache Curator's InterProcessMutex (Debian's libcurator-recipes-java),
// with its defaults and the retry policy of Curator's own getting-started
// example (ExponentialBackoffRetry(1000, 3)): the ZooKeeper lock recipe (an
// ephemeral sequential node per acquire; a waiter watches the node ahead of
// it, so a release is pushed). A worker of bench/peers/run.py: it speaks the
// protocol at the top of run.py (the same as peerlib.py's).
//
// Built and run by scripts/bench-peers.sh, with the classpath
// /usr/share/java/{curator-recipes,curator-framework,curator-client,zookeeper,
// zookeeper-jute,guava,slf4j-api,slf4j-nop}.jar (javac -cp ... -d DIR).
//
// Times are System.nanoTime(), which OpenJDK reads from CLOCK_MONOTONIC on
// Linux: the clock the other workers read, one for every process.

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.net.URI;
import java.nio.ByteOrder;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.ExponentialBackoffRetry;

public final class PeerCurator {
  private final InterProcessMutex mutex;

  // Connects to zookeeper://HOST:PORT; the mutex is /bench-peers/KEY.
  private PeerCurator(String uri, String key) {
    CuratorFramework client = CuratorFrameworkFactory.newClient(
        URI.create(uri).getAuthority(), new ExponentialBackoffRetry(1000, 3));
    client.start();
    // Connected before the worker says it is ready (start() connects in the
    // background, and the first acquire would wait for it).
    try {
      client.blockUntilConnected();
    } catch (InterruptedException e) {
      throw new IllegalStateException(e);
    }
    mutex = new InterProcessMutex(client, "/bench-peers/" + key);
  }

  private void acquire() throws Exception {
    mutex.acquire();
  }

  private void release() throws Exception {
    mutex.release();
  }

  private static void say(String line) {
    System.out.println(line);
    System.out.flush();
  }

  private static String join(String word, List<Long> xs) {
    StringBuilder b = new StringBuilder(word);
    for (long x : xs) b.append(' ').append(x);
    return b.toString();
  }

  private void uncontended(int n) throws Exception {
    int warm = n / 10;
    List<Long> samples = new ArrayList<>();
    for (int i = 0; i < n + warm; i++) {
      long start = System.nanoTime();
      acquire();
      release();
      if (i >= warm) samples.add(System.nanoTime() - start);
    }
    say(join("samples", samples));
    say("done " + samples.size() + " 0 0");
  }

  private void contend(String sharedPath, long seconds) throws Exception {
    Path marker = Paths.get(sharedPath + ".held");
    MappedByteBuffer shared;
    try (FileChannel ch = FileChannel.open(Paths.get(sharedPath), StandardOpenOption.READ,
                                           StandardOpenOption.WRITE)) {
      shared = ch.map(FileChannel.MapMode.READ_WRITE, 0, 16);
    }
    shared.order(ByteOrder.LITTLE_ENDIAN);
    say("ready");
    while (shared.getLong(0) == 0) Thread.sleep(1);
    long end = shared.getLong(0) + seconds * 1_000_000_000L;
    long count = 0, errors = 0, overlaps = 0;
    List<Long> waits = new ArrayList<>();
    while (System.nanoTime() < end) {
      long asked = System.nanoTime();
      try {
        acquire();
      } catch (Exception e) {
        errors++;
        System.err.println("acquire: " + e);
        continue;
      }
      waits.add(System.nanoTime() - asked);
      boolean mine = false;
      try {
        Files.createFile(marker);
        mine = true;
      } catch (FileAlreadyExistsException e) {
        overlaps++;
      }
      long seen = shared.getLong(8);
      shared.putLong(8, seen + 1);
      count++;
      if (mine) Files.delete(marker);
      try {
        release();
      } catch (Exception e) {
        errors++;
        System.err.println("release: " + e);
      }
    }
    say(join("waits", waits));
    say("done " + count + " " + errors + " " + overlaps);
  }

  private void handoff() throws Exception {
    say("ready");
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
    for (String line; (line = in.readLine()) != null;) {
      switch (line.trim()) {
        case "acquire":
          say("waiting");
          acquire();
          say("acquired " + System.nanoTime());
          break;
        case "release":
          long t = System.nanoTime();
          release();
          say("released " + t);
          break;
        case "quit":
          return;
        default:
          break;
      }
    }
  }

  public static void main(String[] a) throws Exception {
    if (a.length == 4 && a[0].equals("uncontended")) {
      new PeerCurator(a[1], a[2]).uncontended(Integer.parseInt(a[3]));
    } else if (a.length == 5 && a[0].equals("contend")) {
      new PeerCurator(a[1], a[2]).contend(a[3], Long.parseLong(a[4]));
    } else if (a.length == 3 && a[0].equals("handoff")) {
      new PeerCurator(a[1], a[2]).handoff();
    } else {
      System.err.println("usage: PeerCurator uncontended URI KEY N | contend URI KEY SHARED_FILE"
                         + " SECONDS | handoff URI KEY");
      System.exit(2);
    }
    // Curator's threads are not daemons: leave without waiting for them.
    System.exit(0);
  }
}
