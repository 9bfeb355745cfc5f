# Session 34 probe: one span vs one mapping per tensor run. Run: flock /tmp/mz-bench.lock nice -n -5 python3 probe-runs.py COPY_OF_llama3.2-1b-q8_0.gguf
# Populating 567 MiB of a model file: one span vs per-tensor runs (Llama-3.2-1B q8_0 layer: 9 tensors).
import os, mmap, time, resource, sys
p=sys.argv[1]; fd=os.open(p, os.O_RDONLY); size=os.fstat(fd).st_size
MADV_POPULATE_READ=22; W=4<<20
def cpu():
    r=resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime+r.ru_stime
def drop(): os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)
def populate(off, n):
    m=mmap.mmap(fd, n, mmap.MAP_PRIVATE, mmap.PROT_READ, offset=off)
    m.madvise(mmap.MADV_RANDOM)
    m.madvise(mmap.MADV_WILLNEED, 0, min(W,n))
    for o in range(0,n,W):
        k=min(W,n-o)
        if o+k<n: m.madvise(mmap.MADV_WILLNEED, o+k, min(W,n-o-k))
        m.madvise(MADV_POPULATE_READ, o, k)
    return m
KiB=1024; MiB=1<<20
q=4456448; kv=1114112; ffn=17825792; norm=8*KiB
layer=[norm,q,kv,kv,q,norm,ffn,ffn,ffn]
total=567*MiB; base=600*MiB
runs=[]; off=base
while off-base<total:
    for t in layer:
        runs.append((off,t)); off+=t
end=off
def one():
    drop(); t=time.time(); c=cpu(); m=populate(base, end-base); dt=time.time()-t; m.close(); return dt, cpu()-c
def per_run():
    drop(); t=time.time(); c=cpu(); ms=[populate(o,n) for o,n in runs]; dt=time.time()-t
    for m in ms: m.close()
    return dt, cpu()-c
for i in range(3):
    print("one span  %d MiB: %.3f s wall %.3f s cpu" % ((((end-base)>>20),)+one()))
    print("per run (%d runs): %.3f s wall %.3f s cpu" % ((len(runs),)+per_run()))
drop()
