// The local file system of the analytics job's Spark driver (issue 19; docs/analytics.md).
//
// Without Hadoop's native library (pip's pyspark has none), Hadoop sets the mode of every file
// and directory it creates on the local file system by running `chmod` in a child process:
// about three children for each (day, queue) partition that compaction writes, some 9,000 for
// 30 days of 100 queues, 19 s of a 138 s first run (docs/benchmarks.md).  This file system is
// Hadoop's own (LocalFileSystem: the .crc checksum files stay) with one change: a mode of plain
// rwx bits is set by the JVM itself (java.nio); anything else goes to Hadoop's code as before.
//
// rq/analytics/localfs.py compiles this file once per JDK into the user's cache, and
// rq/analytics/session.py names the class in spark.hadoop.fs.file.impl for local masters only.
package rq.analytics;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

public class RqLocalFileSystem extends LocalFileSystem {
    public RqLocalFileSystem() {
        super(new Raw());
    }

    /** RawLocalFileSystem with setPermission done in the JVM. */
    public static class Raw extends RawLocalFileSystem {
        // Bit i of a Unix mode (0 = others' execute ... 8 = owner's read).
        private static final PosixFilePermission[] BITS = {
            PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE,
            PosixFilePermission.OTHERS_READ, PosixFilePermission.GROUP_EXECUTE,
            PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
            PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE,
            PosixFilePermission.OWNER_READ,
        };

        @Override
        public void setPermission(Path p, FsPermission permission) throws IOException {
            int mode = permission.toShort();
            if ((mode & ~0777) != 0) {  // sticky bit: not expressible in java.nio
                super.setPermission(p, permission);
                return;
            }
            Set<PosixFilePermission> set = EnumSet.noneOf(PosixFilePermission.class);
            for (int i = 0; i < BITS.length; i++) {
                if ((mode & (1 << i)) != 0) {
                    set.add(BITS[i]);
                }
            }
            try {
                Files.setPosixFilePermissions(pathToFile(p).toPath(), set);
            } catch (NoSuchFileException e) {
                throw new FileNotFoundException("File " + p + " does not exist");
            } catch (UnsupportedOperationException e) {  // a file system without POSIX modes
                super.setPermission(p, permission);
            }
        }
    }
}
