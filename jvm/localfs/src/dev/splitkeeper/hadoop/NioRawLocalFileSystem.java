package dev.splitkeeper.hadoop;

import java.io.File;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system without a process per call.
 *
 * <p>Without Hadoop's native library, {@link RawLocalFileSystem} forks {@code chmod} for
 * every file it creates with a permission and {@code readlink} for every
 * {@link #getFileLinkStatus} (which {@code FileContext.rename} calls on source and target).
 * A Delta commit on a local table does both about twenty times: a process spawn each,
 * most of the commit's time. This class does the same two things with {@code java.nio}
 * and leaves everything else to Hadoop. Anything it cannot do the same way (sticky bits,
 * a file system without POSIX attributes, symbolic links) goes to Hadoop's own code.
 */
public class NioRawLocalFileSystem extends RawLocalFileSystem {

  private static final PosixFilePermission[] BITS = {
    PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
    PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
    PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ,
  };

  /** The POSIX permissions of {@code mode}'s nine rwx bits. */
  static Set<PosixFilePermission> posix(short mode) {
    Set<PosixFilePermission> wanted = EnumSet.noneOf(PosixFilePermission.class);
    for (int bit = 0; bit < BITS.length; bit++) {
      if ((mode & (1 << bit)) != 0) {
        wanted.add(BITS[bit]);
      }
    }
    return wanted;
  }

  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    short mode = permission.toShort();
    if ((mode & ~0777) != 0) {
      super.setPermission(p, permission); // sticky bit: Hadoop's chmod
      return;
    }
    File file = pathToFile(p);
    try {
      Files.setPosixFilePermissions(file.toPath(), posix(mode));
    } catch (NoSuchFileException e) {
      throw new FileNotFoundException("File " + p + " does not exist");
    } catch (UnsupportedOperationException e) {
      super.setPermission(p, permission);
    }
  }

  @Override
  public FileStatus getFileLinkStatus(Path f) throws IOException {
    File file = pathToFile(f);
    if (Files.isSymbolicLink(file.toPath())) {
      return super.getFileLinkStatus(f); // Hadoop builds the symlink status
    }
    return getFileStatus(f); // what Hadoop returns for anything but a link, without readlink
  }
}
