package dev.splitkeeper.hadoop;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFs;

/**
 * {@code fs.AbstractFileSystem.file.impl}: Hadoop's {@code LocalFs} (checksummed, for
 * {@code FileContext}: Delta's log store, Spark's checkpoint files) over
 * {@link NioRawLocalFs}.
 */
public class NioLocalFs extends ChecksumFs {
  public NioLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
    super(new NioRawLocalFs(uri, conf));
  }
}
