#define _GNU_SOURCE
#include <sys/mman.h>
#include <fcntl.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/resource.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static double cpu(){struct rusage r;getrusage(RUSAGE_SELF,&r);return r.ru_utime.tv_sec+r.ru_stime.tv_sec+1e-6*(r.ru_utime.tv_usec+r.ru_stime.tv_usec);}
static char*P; static size_t N;
static void* scan(void*a){ long h=(long)a; size_t lo=h*(N/2)&~4095UL, hi=h?N:(N/2&~4095UL); uint64_t s=0; for(size_t i=lo;i<hi;i+=64) s+=*(volatile uint64_t*)(P+i); return (void*)s;}
static long pmd(){ FILE*f=fopen("/proc/self/smaps_rollup","r"); char b[256]; long v=0; while(fgets(b,256,f)) if(!strncmp(b,"FilePmdMapped:",14)) v=atol(b+14); fclose(f); return v;}
int main(int c,char**v){ if(c<5){fprintf(stderr,"probe FILE MODE(0 lib,1 readahead) SKEW(0 aligned,1 4K off) FLUSH(0/1)\n");return 2;}
 int fd=open(v[1],O_RDONLY);struct stat st;fstat(fd,&st); int mode=atoi(v[2]), skew=atoi(v[3]), flush=atoi(v[4]);
 size_t off=2<<20; N=(st.st_size-off-(4<<20))&~((size_t)(2<<20)-1);
 posix_fadvise(fd,0,st.st_size,POSIX_FADV_DONTNEED);
 char*area=mmap(0,N+(4<<20),PROT_READ,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
 P=(char*)(((uintptr_t)area+(2<<20)-1)&~(uintptr_t)((2<<20)-1)) + (skew?4096:0);
 mmap(P,N,PROT_READ,MAP_PRIVATE|MAP_FIXED,fd,off);
 double t=now(),c0=cpu();
 if(mode==0){ size_t W=4<<20; madvise(P,N,MADV_RANDOM); for(size_t o=0;o<W;o+=128<<10) madvise(P+o,128<<10,MADV_WILLNEED);
   for(size_t o=0;o<N;o+=W){ size_t k=N-o<W?N-o:W; if(o+k<N) for(size_t q=o+k;q<o+k+W&&q<N;q+=128<<10) madvise(P+q,128<<10,MADV_WILLNEED); madvise(P+o,k,22);} }
 else if(mode==1){ madvise(P,N,MADV_NORMAL); madvise(P,N,MADV_WILLNEED); madvise(P,N,22);}
 else if(mode==2){ madvise(P,N,MADV_RANDOM); madvise(P,N,MADV_WILLNEED); madvise(P,N,22);}
 else if(mode==3){ madvise(P,N,MADV_HUGEPAGE); madvise(P,N,MADV_RANDOM); madvise(P,N,22);}
 else if(mode==6){ madvise(P,N,MADV_HUGEPAGE); madvise(P,N,MADV_NORMAL); madvise(P,N,22);}
 else if(mode==4){ madvise(P,N,MADV_HUGEPAGE); madvise(P,N,MADV_RANDOM); size_t W=8<<20; for(size_t o=0;o<N;o+=W){ if(o+W<N) madvise(P+o+W,(N-o-W)<W?(N-o-W):W,MADV_WILLNEED); madvise(P+o,W<N-o?W:N-o,22);} }
 else if(mode==5){ madvise(P,N,MADV_RANDOM); size_t W=8<<20; for(size_t o=0;o<N;o+=W){ if(o+W<N) madvise(P+o+W,(N-o-W)<W?(N-o-W):W,MADV_WILLNEED); madvise(P+o,W<N-o?W:N-o,22);} }
 double tp=now()-t, cp=cpu()-c0; t=now(); c0=cpu();
 {uint8_t a=0; for(size_t i=0;i<N;i+=4096) a^=*(volatile uint8_t*)(P+i); (void)a;}
 double tt=now()-t, ct=cpu()-c0;
 printf("mode %d skew %d flush %d: %zu MiB populate %.3f s (cpu %.3f), touch %.3f s (cpu %.3f), FilePmdMapped %ld kB\n",mode,skew,flush,N>>20,tp,cp,tt,ct,pmd());
 double ts[12];
 for(int r=0;r<12;r++){
   if(flush){ char*q=mmap(0,64<<20,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); memset(q,1,64<<20); munmap(q,64<<20);}
   t=now(); pthread_t th[2]; for(long h=0;h<2;h++) pthread_create(&th[h],0,scan,(void*)h); for(int h=0;h<2;h++) pthread_join(th[h],0); ts[r]=now()-t; }
 printf("  scans (2 threads):"); for(int r=0;r<12;r++) printf(" %.3f",ts[r]); printf("\n");
 system("grep FileHugePages /proc/meminfo");
 return 0; }
