package icecdc.fs;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermissions;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system (with its checksum files), setting a file's permissions through Java's own file
 * API instead of a {@code chmod} process.
 *
 * <p>Why: without Hadoop's native library (PyPI's PySpark ships none) every file Hadoop creates on a local
 * disk is followed by {@code chmod} run as a child process, with a thread to read its output: for each data,
 * delete, manifest and metadata file and for each one's {@code .crc}. An ingest batch into a partitioned table
 * started ~50 of them (Java Flight Recorder's process events). The permissions set are the same.
 */
public final class LocalFileSystem extends org.apache.hadoop.fs.LocalFileSystem {
    public LocalFileSystem() {
        super(new Raw());
    }

    static final class Raw extends RawLocalFileSystem {
        @Override
        public void setPermission(Path p, FsPermission permission) throws IOException {
            String mode = permission.toString();  // rwxr-x--- (a sticky bit or ACLs: Hadoop's own way)
            if (mode.length() != 9 || permission.getStickyBit()) {
                super.setPermission(p, permission);
                return;
            }
            try {
                Files.setPosixFilePermissions(pathToFile(p).toPath(), PosixFilePermissions.fromString(mode));
            } catch (UnsupportedOperationException notPosix) {  // a file system without POSIX permissions
                super.setPermission(p, permission);
            }
        }
    }
}
