#!/usr/bin/python3
"""Passthrough FUSE file system over a backing folder that answers reads with EIO while a control
file exists: a real kernel I/O error for the server's restore path (tests/check_serve_eio.sh).
  eio_fs.py BACKING MOUNTPOINT CONTROL [GLOB]
Reads of files whose name matches GLOB (default *) fail with EIO while CONTROL exists. Runs in
the foreground until unmounted (fusermount -u / umount MOUNTPOINT)."""
import errno, fnmatch, os, sys
from fusepy import FUSE, FuseOSError, Operations

class EioFs(Operations):
    def __init__(self, root, control, glob):
        self.root, self.control, self.glob = root, control, glob
        self.eio_reads = 0
    def _p(self, path): return os.path.join(self.root, path.lstrip('/'))
    def access(self, path, mode):
        if not os.access(self._p(path), mode): raise FuseOSError(errno.EACCES)
    def getattr(self, path, fh=None):
        try: st = os.lstat(self._p(path))
        except OSError as e: raise FuseOSError(e.errno)
        return {k: getattr(st, k) for k in ('st_atime', 'st_ctime', 'st_gid', 'st_mode', 'st_mtime',
                                             'st_nlink', 'st_size', 'st_uid', 'st_blocks')}
    def readdir(self, path, fh): return ['.', '..'] + os.listdir(self._p(path))
    def mkdir(self, path, mode): os.mkdir(self._p(path), mode)
    def rmdir(self, path): os.rmdir(self._p(path))
    def unlink(self, path): os.unlink(self._p(path))
    def rename(self, old, new): os.rename(self._p(old), self._p(new))
    def chmod(self, path, mode): os.chmod(self._p(path), mode)
    def chown(self, path, uid, gid): os.chown(self._p(path), uid, gid)
    def truncate(self, path, length, fh=None):
        with open(self._p(path), 'r+b') as f: f.truncate(length)
    def utimens(self, path, times=None): os.utime(self._p(path), times)
    def statfs(self, path):
        s = os.statvfs(self._p(path))
        return {k: getattr(s, k) for k in ('f_bavail', 'f_bfree', 'f_blocks', 'f_bsize', 'f_favail',
                                            'f_ffree', 'f_files', 'f_flag', 'f_frsize', 'f_namemax')}
    def open(self, path, flags): return os.open(self._p(path), flags & ~os.O_DIRECT)
    def create(self, path, mode, fi=None): return os.open(self._p(path), os.O_RDWR | os.O_CREAT, mode)
    def read(self, path, size, offset, fh):
        if os.path.exists(self.control) and fnmatch.fnmatch(os.path.basename(path), self.glob):
            self.eio_reads += 1
            with open(self.control + '.count', 'w') as f: f.write(str(self.eio_reads))
            raise FuseOSError(errno.EIO)
        return os.pread(fh, size, offset)
    def write(self, path, data, offset, fh): return os.pwrite(fh, data, offset)
    def flush(self, path, fh): return 0
    def release(self, path, fh): os.close(fh); return 0
    def fsync(self, path, datasync, fh): os.fsync(fh); return 0

if __name__ == '__main__':
    if len(sys.argv) < 4 or sys.argv[1] in ('-h', '--help'):
        print(__doc__); sys.exit(0 if len(sys.argv) > 1 else 2)
    FUSE(EioFs(sys.argv[1], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else '*'), sys.argv[2],
         foreground=True, nothreads=False)
