# Session 34 probe: how long populating 567 MiB of a GGUF copy takes, page cache dropped, as Env::PopulateMapped does it.
# Run: flock /tmp/mz-bench.lock nice -n -5 python3 probe-populate.py COPY_OF_llama3.2-1b-q8_0.gguf 600 567  (offset and length in MiB)
import os, mmap, time, resource, sys
p=sys.argv[1]; off=int(sys.argv[2])<<20; n=int(sys.argv[3])<<20
fd=os.open(p, os.O_RDONLY)
def cpu():
    r=resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime+r.ru_stime
def drop():
    os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)
MADV_POPULATE_READ=22
def populate(chunk=4<<20):
    m=mmap.mmap(fd, n, mmap.MAP_PRIVATE, mmap.PROT_READ, offset=off)
    t=time.time(); c=cpu()
    for o in range(0,n,chunk):
        m.madvise(mmap.MADV_WILLNEED, o, min(2*chunk, n-o))
        m.madvise(MADV_POPULATE_READ, o, min(chunk,n-o))
    dt=time.time()-t; dc=cpu()-c
    m.close(); return dt, dc
drop()
print("cold  populate 4MiB windows: %.3f s wall, %.3f s cpu" % populate())
print("warm  populate (cached)    : %.3f s wall, %.3f s cpu" % populate())
drop()
t=time.time(); c=cpu(); os.posix_fadvise(fd,off,n,os.POSIX_FADV_WILLNEED); t1=time.time()-t
# wait until cached by reading with pread
buf=bytearray(4<<20)
t=time.time()
o=off
while o<off+n:
    os.preadv(fd,[buf],o); o+=len(buf)
print("fadvise WILLNEED whole: %.3f s submit, then pread all %.3f s; cpu %.3f" % (t1, time.time()-t, cpu()-c))
print("then populate (cached) : %.3f s wall, %.3f s cpu" % populate())
drop()
